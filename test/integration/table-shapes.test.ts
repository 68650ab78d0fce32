/**
 * Published tables of unusual shape (issue 16): a table with no columns (its rows copied,
 * inserted one at a time and in batches, deleted by REPLICA IDENTITY FULL, truncated); generated columns published by PG18's publish_generated_columns = stored
 * or named in a column list, copied with COPY (SELECT …) into regular target columns and
 * streamed; and a partition published both on its own and through an ancestor whose
 * publication has publish_via_partition_root, which PostgreSQL publishes only through the
 * root (pg_get_publication_tables). Each ends with the target equal to the source.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'shape-pub' }), startCluster({ major: 18, name: 'shape-tgt' })]);
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function start(db: string, sub: string, extra: Record<string, string> = {}): PgsubProcess {
  const child = spawnPgsub({
    PGSUB_SOURCE: publisher.url(db),
    PGSUB_TARGET: target.url(db),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    ...extra,
  });
  children.push(child);
  return child;
}

async function stop(p: PgsubProcess): Promise<void> {
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
}

async function database(db: string, sourceSql: string, targetSql: string): Promise<void> {
  await publisher.createDatabase(db);
  await target.createDatabase(db);
  await publisher.query(sourceSql, [], db);
  await target.query(targetSql, [], db);
}

async function equal(db: string, tables: string[], p: PgsubProcess): Promise<void> {
  const cmp = await compareTables(publisher, db, target, db, tables);
  assert.ok(cmp.equal, `${JSON.stringify(cmp)}\n${p.output().slice(-3000)}`);
}

const count = async (db: string, table: string) => Number((await target.query(`SELECT count(*) AS n FROM ${table}`, [], db))[0].n);

for (const [name, extra] of [
  ['defaults', {}],
  ['binary, no batches', { PGSUB_BINARY: 'true', PGSUB_BATCH_ROWS: '1' }],
] as const) {
  test(`a table with no columns: copied, inserted, deleted (REPLICA IDENTITY FULL), truncated (${name})`, async () => {
    const db = `empty${Object.keys(extra).length}`;
    const schema = `CREATE TABLE public.nothing (); ALTER TABLE public.nothing REPLICA IDENTITY FULL; CREATE TABLE public.other (id int PRIMARY KEY);`;
    await database(
      db,
      `${schema} INSERT INTO public.nothing DEFAULT VALUES; INSERT INTO public.nothing DEFAULT VALUES; CREATE PUBLICATION pub FOR TABLE public.nothing, public.other;`,
      schema,
    );
    const p = start(db, db, extra);
    await p.waitForLog('streaming started');
    await waitForCatchUp(publisher, db, db);
    assert.equal(await count(db, 'public.nothing'), 2, p.output().slice(-3000));
    // One at a time, a run of them in one transaction (a batch), beside another table.
    await publisher.query(`INSERT INTO public.nothing DEFAULT VALUES`, [], db);
    await publisher.query(
      `BEGIN; INSERT INTO public.nothing SELECT FROM generate_series(1, 20); INSERT INTO public.other VALUES (1); INSERT INTO public.nothing DEFAULT VALUES; COMMIT;`,
      [],
      db,
    );
    await waitForCatchUp(publisher, db, db);
    assert.equal(await count(db, 'public.nothing'), 24, p.output().slice(-3000));
    // (No UPDATE can name a column of it.) A DELETE removes one target row per source row.
    await publisher.query(`DELETE FROM public.nothing WHERE ctid IN (SELECT ctid FROM public.nothing LIMIT 5)`, [], db);
    await waitForCatchUp(publisher, db, db);
    assert.equal(await count(db, 'public.nothing'), 19, p.output().slice(-3000));
    await equal(db, ['public.nothing', 'public.other'], p);
    await publisher.query(`TRUNCATE public.nothing`, [], db);
    await publisher.query(`INSERT INTO public.nothing DEFAULT VALUES`, [], db);
    await waitForCatchUp(publisher, db, db);
    assert.equal(await count(db, 'public.nothing'), 1);
    await equal(db, ['public.nothing', 'public.other'], p);
    assert.doesNotMatch(p.output(), /"level":50/, p.output().slice(-3000));
    await stop(p);
  });
}

test('generated columns published by PG18 (publish_generated_columns = stored, or a column list naming one): copied through a query into regular target columns, and streamed', async () => {
  const db = 'gen';
  await database(
    db,
    `CREATE TABLE public.g1 (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a * 2) STORED);
     CREATE TABLE public.g2 (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a + 100) STORED, c text);
     INSERT INTO public.g1 (id, a) SELECT g, g FROM generate_series(1, 50) g;
     INSERT INTO public.g2 (id, a, c) SELECT g, g, 'c' || g FROM generate_series(1, 50) g;
     CREATE PUBLICATION pub FOR TABLE public.g1, public.g2 (id, b) WITH (publish_generated_columns = stored);`,
    // The target holds the generated values as plain data (native requires that: a generated target column is an error).
    `CREATE TABLE public.g1 (id int PRIMARY KEY, a int, b int); CREATE TABLE public.g2 (id int PRIMARY KEY, b int);`,
  );
  const p = start(db, db);
  await p.waitForLog('streaming started');
  await publisher.query(`INSERT INTO public.g1 (id, a) VALUES (51, 51); UPDATE public.g1 SET a = 0 WHERE id = 1; INSERT INTO public.g2 (id, a, c) VALUES (51, 7, 'x');`, [], db);
  await waitForCatchUp(publisher, db, db);
  await equal(db, ['public.g1'], p);
  // g2 publishes (id, b) only: those columns equal the source's.
  const [src] = await publisher.query(`SELECT md5(string_agg(id || ':' || b, ',' ORDER BY id)) AS h, count(*)::int AS n FROM public.g2`, [], db);
  const [dst] = await target.query(`SELECT md5(string_agg(id || ':' || b, ',' ORDER BY id)) AS h, count(*)::int AS n FROM public.g2`, [], db);
  assert.deepEqual(dst, src);
  assert.equal(src.n, 51);
  await stop(p);
});

test('a partition published on its own and through its root (publish_via_partition_root): copied and streamed only through the root', async () => {
  const db = 'parts';
  const schema = `CREATE TABLE public.m (id int, region text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
     CREATE TABLE public.m_eu PARTITION OF public.m FOR VALUES IN ('eu');
     CREATE TABLE public.m_us PARTITION OF public.m FOR VALUES IN ('us');`;
  await database(
    db,
    `${schema} INSERT INTO public.m SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 100) g;
     CREATE PUBLICATION pub FOR TABLE public.m WITH (publish_via_partition_root = true);
     CREATE PUBLICATION pub2 FOR TABLE public.m_eu;`,
    schema,
  );
  const p = start(db, db, { PGSUB_PUBLICATION: 'pub,pub2' });
  await p.waitForLog('streaming started');
  await publisher.query(`INSERT INTO public.m VALUES (101, 'eu'), (102, 'us'); DELETE FROM public.m WHERE id = 2;`, [], db);
  await waitForCatchUp(publisher, db, db);
  await equal(db, ['public.m', 'public.m_eu', 'public.m_us'], p);
  const tables = (await target.query(`SELECT table_name FROM pgsub.subscription_rel WHERE subscription = $1 ORDER BY 1`, [db], db)).map((r) => r.table_name);
  assert.deepEqual(tables, ['m']);
  await stop(p);
});

test('a target table missing a column at the initial copy: the error names it (no FREEZE preface), and the copy succeeds once the column is added', async () => {
  const db = 'missing';
  await database(
    db,
    `CREATE TABLE public.w (id int PRIMARY KEY, extra text); INSERT INTO public.w SELECT g, 'x' FROM generate_series(1, 10) g; CREATE PUBLICATION pub FOR TABLE public.w;`,
    `CREATE TABLE public.w (id int PRIMARY KEY);`,
  );
  const p = start(db, db);
  await waitFor(async () => /table copy failed; will retry/.test(p.output()), { timeoutMs: 60_000, what: 'the copy failure' });
  const failure = p
    .output()
    .split('\n')
    .find((l) => l.includes('table copy failed; will retry'))!;
  assert.match(failure, /column \\"extra\\" of relation \\"w\\" does not exist/);
  assert.doesNotMatch(p.output(), /COPY FREEZE refused/);
  await target.query(`ALTER TABLE public.w ADD COLUMN extra text`, [], db);
  await p.waitForLog('streaming started', 60_000);
  await waitForCatchUp(publisher, db, db);
  await equal(db, ['public.w'], p);
  await stop(p);
});

test('an apply error names the relation, the column at fault, the change kind and the remote transaction (single INSERT, COPY batch, batched UPDATE)', async () => {
  const db = 'named';
  // The target takes an integer where the source sends text.
  await database(db, `CREATE TABLE public.v (id int PRIMARY KEY, n text); CREATE PUBLICATION pub FOR TABLE public.v;`, `CREATE TABLE public.v (id int PRIMARY KEY, n int);`);
  const p = start(db, db, { PGSUB_COPY_DATA: 'false' });
  await p.waitForLog('streaming started');
  const failures = () =>
    p
      .output()
      .split('\n')
      .filter((l) => l.includes('"msg":"apply failed; retrying"'))
      .map((l) => JSON.parse(l) as { err: { message: string; relation?: string; column?: string; command?: string }; xid?: number; finishLsn?: string });
  const expectFailure = async (what: string, command: string, message: RegExp) => {
    await waitFor(async () => failures().some((f) => message.test(f.err.message)), { timeoutMs: 30_000, what });
    const f = failures()
      .reverse()
      .find((x) => message.test(x.err.message))!;
    assert.deepEqual({ relation: f.err.relation, column: f.err.column, command: f.err.command }, { relation: 'public.v', column: 'n', command }, JSON.stringify(f));
    assert.ok(f.xid && f.finishLsn, JSON.stringify(f));
    const skip = spawnPgsub({ PGSUB_SOURCE: publisher.url(db), PGSUB_TARGET: target.url(db), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: db }, ['skip', '--lsn', f.finishLsn!]);
    children.push(skip);
    assert.equal(await skip.exited, 0, skip.output());
  };
  await publisher.query(`INSERT INTO public.v VALUES (1, '1')`, [], db);
  await publisher.query(`INSERT INTO public.v VALUES (2, '1.5')`, [], db);
  await expectFailure('the single insert', 'INSERT', /invalid input syntax for type integer: "1.5"/);
  await publisher.query(`INSERT INTO public.v SELECT g, CASE WHEN g = 15 THEN 'x15' ELSE g::text END FROM generate_series(10, 40) g`, [], db);
  await expectFailure('the COPY batch', 'COPY', /invalid input syntax for type integer: "x15"/);
  await publisher.query(`INSERT INTO public.v SELECT g, g::text FROM generate_series(50, 60) g`, [], db);
  await publisher.query(`UPDATE public.v SET n = CASE WHEN id = 55 THEN 'y55' ELSE (id * 2)::text END WHERE id BETWEEN 50 AND 60`, [], db);
  await expectFailure('the batched update', 'UPDATE', /invalid input syntax for type integer: "y55"/);
  await publisher.query(`INSERT INTO public.v VALUES (70, '70')`, [], db);
  await waitForCatchUp(publisher, db, db);
  const ids = (await target.query<{ id: number }>(`SELECT id FROM public.v ORDER BY id`, [], db)).map((r) => r.id);
  assert.deepEqual(ids, [1, ...Array.from({ length: 11 }, (_, i) => 50 + i), 70]);
  await stop(p);
});

test('startup warnings: a published table without a replica identity, and one with REPLICA IDENTITY FULL but no index on the target', async () => {
  const db = 'idents';
  await database(
    db,
    `CREATE TABLE public.nokey (a int, b text); CREATE TABLE public.wide (a int, b text); ALTER TABLE public.wide REPLICA IDENTITY FULL;
     CREATE TABLE public.keyed (id int PRIMARY KEY); CREATE TABLE public.inserts_only (a int);
     CREATE PUBLICATION pub FOR TABLE public.nokey, public.wide, public.keyed; CREATE PUBLICATION pub2 FOR TABLE public.inserts_only WITH (publish = 'insert');`,
    `CREATE TABLE public.nokey (a int, b text); CREATE TABLE public.wide (a int, b text); CREATE TABLE public.keyed (id int PRIMARY KEY); CREATE TABLE public.inserts_only (a int);`,
  );
  const p = start(db, db, { PGSUB_PUBLICATION: 'pub,pub2' });
  await p.waitForLog('streaming started');
  const warnings = p
    .output()
    .split('\n')
    .filter((l) => l.includes('"level":40'))
    .map((l) => JSON.parse(l) as { table?: string; msg: string });
  const about = (t: string) => warnings.filter((w) => w.table === t).map((w) => w.msg);
  assert.match(about('public.nokey').join(), /UPDATE and DELETE on public.nokey cannot be replicated: it has no replica identity/);
  assert.match(about('public.wide').join(), /REPLICA IDENTITY FULL and no index on the target/);
  assert.deepEqual(about('public.keyed'), []);
  assert.deepEqual(about('public.inserts_only'), []);
  await stop(p);
});

for (const [name, extra] of [
  ['defaults', {}],
  ['binary, no batches', { PGSUB_BINARY: 'true', PGSUB_BATCH_ROWS: '1' }],
] as const) {
  test(`GENERATED ALWAYS identity columns on the target take the source's values: copied, inserted, updated one by one and in runs, deleted (${name})`, async () => {
    const db = `ident${Object.keys(extra).length}`;
    // The schema as pg_dump gives it to the target: the identity column ALWAYS on both sides.
    const schema = `CREATE TABLE public.orders (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, n int GENERATED ALWAYS AS IDENTITY (START 100) UNIQUE, v text);`;
    await database(db, `${schema} INSERT INTO public.orders (v) SELECT 'c' || g FROM generate_series(1, 5) g; CREATE PUBLICATION pub FOR TABLE public.orders;`, schema);
    const p = start(db, db, extra);
    await p.waitForLog('streaming started');
    await publisher.query(`INSERT INTO public.orders (v) VALUES ('one')`, [], db);
    await publisher.query(`INSERT INTO public.orders (v) SELECT 's' || g FROM generate_series(1, 50) g`, [], db);
    await publisher.query(`UPDATE public.orders SET v = 'u1' WHERE id = 2`, [], db);
    // A run of updates in one transaction: the batched path (UPDATE of many rows at once).
    await publisher.query(`UPDATE public.orders SET v = v || '!' WHERE id > 10`, [], db);
    await publisher.query(`DELETE FROM public.orders WHERE id IN (3, 4)`, [], db);
    await waitForCatchUp(publisher, db, db);
    await equal(db, ['public.orders'], p);
    assert.equal(await count(db, 'public.orders'), 54);
    await stop(p);
  });
}
