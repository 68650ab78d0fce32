/**
 * Per-relation batches (src/apply/batch.ts): changes to different tables inside one target
 * transaction may go out in another order than the stream's, changes to one table never
 * do, repeated updates of a row coalesce, and a table with a trigger that fires in
 * replica mode sees every change in the stream's order. Checked on a backlog applied in
 * groups (the fast path) against the source, and through such a trigger's trace.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, spawnPgsub, startCluster, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `
  CREATE TABLE public.acct (id int PRIMARY KEY, balance bigint NOT NULL, note text);
  CREATE TABLE public.teller (id int PRIMARY KEY, balance bigint NOT NULL);
  CREATE TABLE public.hist (id bigserial PRIMARY KEY, acct int NOT NULL, delta int NOT NULL);
  CREATE TABLE public."trace d ""t""" (id int PRIMARY KEY, v text);
  CREATE TYPE public.mood AS ENUM ('sad', 'ok');
  CREATE TABLE public."bulk ü" (id bigint PRIMARY KEY, n numeric, t text, ts timestamptz, a int[], b bytea, j jsonb);
  CREATE TABLE public.bulk_enum (id bigint PRIMARY KEY, m public.mood, t text);`;
let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'bord-pub' }), startCluster({ major: 18, name: 'bord-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(
    `${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.acct, public.teller, public.hist, public."trace d ""t""", public."bulk ü", public.bulk_enum;`,
    [],
    'src',
  );
  // Target only: an ALWAYS trigger on the quoted table records the order it sees changes
  // in, together with the state of acct at that moment.
  await target.query(
    `${SCHEMA}
     CREATE TABLE public.seen (seq bigserial PRIMARY KEY, op text, id int, acct_rows bigint);
     CREATE FUNCTION public.note_seen() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       INSERT INTO public.seen (op, id, acct_rows) VALUES (TG_OP, COALESCE(NEW.id, OLD.id), (SELECT count(*) FROM public.acct));
       RETURN COALESCE(NEW, OLD);
     END $$;
     CREATE TRIGGER note_seen AFTER INSERT OR UPDATE OR DELETE ON public."trace d ""t""" FOR EACH ROW EXECUTE FUNCTION public.note_seen();
     ALTER TABLE public."trace d ""t""" ENABLE ALWAYS TRIGGER note_seen;`,
    [],
    'dst',
  );
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, env: Record<string, string> = {}): PgsubProcess {
  child = spawnPgsub({
    ...env,
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
  });
  return child;
}

async function stop(): Promise<void> {
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-2000));
  child = null;
}

test('interleaved changes to several tables, repeated updates, deletes and re-inserts: the target equals the source', async () => {
  start('bord');
  await child!.waitForLog('streaming started');
  await stop();
  // A pgbench-like backlog (pgsub stopped, so it is applied in groups), plus the cases
  // where a table's own order matters: delete then re-insert of a key, an update after an
  // insert in the same transaction, a key change, updates of a hot row with and without a
  // column left out (different shapes).
  const statements = [`INSERT INTO public.teller SELECT g, 0 FROM generate_series(1, 5) g;`];
  for (let i = 1; i <= 600; i++) {
    const a = (i * 37) % 97;
    statements.push(`BEGIN;
      INSERT INTO public.acct VALUES (${a}, 0, 'n${i}') ON CONFLICT (id) DO UPDATE SET balance = acct.balance + 1, note = EXCLUDED.note;
      UPDATE public.teller SET balance = balance + ${i} WHERE id = ${(i % 5) + 1};
      INSERT INTO public.hist (acct, delta) VALUES (${a}, ${i});
      ${i % 7 === 0 ? `DELETE FROM public.acct WHERE id = ${a}; INSERT INTO public.acct VALUES (${a}, ${i}, NULL);` : ''}
      ${i % 11 === 0 ? `UPDATE public.acct SET id = id + 1000 WHERE id = ${a}; UPDATE public.acct SET id = id - 1000 WHERE id = ${a + 1000};` : ''}
      ${i % 13 === 0 ? `UPDATE public.teller SET balance = 0 WHERE id = 1;` : ''}
      COMMIT;`);
  }
  await publisher.query(statements.join('\n'), [], 'src');
  start('bord');
  await waitForCatchUp(publisher, 'src', 'bord', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await stop();
  const diff = await compareTables(publisher, 'src', target, 'dst', ['public.acct', 'public.teller', 'public.hist']);
  assert.ok(diff.equal, JSON.stringify(diff));
});

test('a table with a trigger firing in replica mode sees its changes in the stream order, after the earlier changes of other tables', async () => {
  start('bord2');
  await child!.waitForLog('streaming started');
  await stop();
  await target.query(`TRUNCATE public.seen, public."trace d ""t"""; TRUNCATE public.acct`, [], 'dst');
  await publisher.query(`TRUNCATE public.acct, public."trace d ""t"""`, [], 'src');
  const statements = [];
  for (let i = 1; i <= 200; i++) {
    statements.push(`BEGIN;
      INSERT INTO public.acct VALUES (${10_000 + i}, 0, NULL);
      INSERT INTO public."trace d ""t""" VALUES (${i}, 'x');
      UPDATE public."trace d ""t""" SET v = 'y' WHERE id = ${i};
      ${i % 3 === 0 ? `DELETE FROM public."trace d ""t""" WHERE id = ${i};` : ''}
      COMMIT;`);
  }
  await publisher.query(statements.join('\n'), [], 'src');
  start('bord2');
  await waitForCatchUp(publisher, 'src', 'bord2', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const out = child!.output();
  await stop();
  const seen = await target.query(`SELECT op, id, acct_rows::int AS acct_rows FROM public.seen ORDER BY seq`, [], 'dst');
  const expected = [];
  for (let i = 1; i <= 200; i++) {
    // The acct row inserted just before in the same source transaction is visible to the trigger.
    expected.push({ op: 'INSERT', id: i, acct_rows: i }, { op: 'UPDATE', id: i, acct_rows: i });
    if (i % 3 === 0) expected.push({ op: 'DELETE', id: i, acct_rows: i });
  }
  assert.deepEqual(seen, expected, JSON.stringify(seen.slice(0, 12)) + out.slice(0, 3000));
});

test('binary mode: runs of inserts go to COPY as sent, beside short runs, NULLs, an enum table (decoded), deletes and re-inserts', async () => {
  start('bord_bin', { PGSUB_BINARY: 'true' });
  await child!.waitForLog('streaming started');
  await stop();
  // Backlog: transactions of 1 to 301 rows (short runs take the INSERT path, longer ones
  // COPY straight from the Insert messages), every type in binary, NULLs in most columns,
  // a table whose enum column the target reads through a Parse type (never as sent), and a
  // delete and re-insert of rows inside a run.
  const statements: string[] = [];
  let id = 0;
  for (let k = 1; k <= 40; k++) {
    const rows = k % 5 === 0 ? 300 : k % 3;
    const first = id + 1;
    id += rows + 1;
    statements.push(`BEGIN;
      INSERT INTO public."bulk ü" SELECT g, CASE WHEN g % 9 = 0 THEN NULL ELSE g * 1.5 END, CASE WHEN g % 7 = 0 THEN NULL ELSE 'ünï ' || repeat('x', (g % 50)::int) END,
        '2024-02-29 12:00:00+00'::timestamptz + g * interval '1 second', ARRAY[g::int, NULL, -g::int], decode(lpad(to_hex(g), 8, '0'), 'hex'), jsonb_build_object('g', g)
        FROM generate_series(${first}::bigint, ${first + rows}) g;
      INSERT INTO public.bulk_enum SELECT g, CASE WHEN g % 2 = 0 THEN 'ok' ELSE 'sad' END::public.mood, 'e' || g FROM generate_series(${first}::bigint, ${first + rows}) g;
      ${k % 4 === 0 ? `DELETE FROM public."bulk ü" WHERE id = ${first}; INSERT INTO public."bulk ü" (id, t) VALUES (${first}, 'again'); INSERT INTO public."bulk ü" (id) VALUES (${id + 1000000});` : ''}
      COMMIT;`);
  }
  await publisher.query(statements.join('\n'), [], 'src');
  start('bord_bin', { PGSUB_BINARY: 'true' });
  await waitForCatchUp(publisher, 'src', 'bord_bin', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await stop();
  const diff = await compareTables(publisher, 'src', target, 'dst', ['public."bulk ü"', 'public.bulk_enum']);
  assert.ok(diff.equal, JSON.stringify(diff));
  const [count] = await target.query<{ n: string }>(`SELECT count(*) AS n FROM public."bulk ü"`, [], 'dst');
  assert.ok(Number(count!.n) > 2400, `rows: ${count!.n}`);
});
