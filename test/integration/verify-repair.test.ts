/**
 * `pgsub verify --repair` and `pgsub preflight` on a running subscription (issue 25), against
 * PostgreSQL 10 → 18 and 14 → 18 with the service running:
 *  - nested types: float8[] / float4[] (printed differently before 12), NaN (a negative NaN
 *    from 'Infinity' - 'Infinity' on the source, the canonical one on the target), numeric[],
 *    money and money[], json[], timestamptz[], a composite with a float and arrays of it,
 *    multi-dimensional arrays with other bounds: equal; deliberate differences repaired,
 *    then equal, and a second --repair repairs nothing;
 *  - the repair writes only what it compares: a row differing in compared columns is
 *    UPDATEd (a target-only column keeps 'precious-7'; an ENABLE ALWAYS trigger sees one
 *    UPDATE), a missing key INSERTed, an extra key DELETEd (before the updates, so it does
 *    not hold a unique value back); 5,000 rows repaired at once; a table whose repair the
 *    target refuses (two rows that swapped a unique value) is named with the key and SQLSTATE
 *    while the others are repaired;
 *  - a table mid-copy (its copy stopped by a lock inside a trigger) is reported "not
 *    compared: syncing (state d)" and --repair neither touches nor waits for it; the copy
 *    then finishes and the changes made meanwhile are applied;
 *  - a table resynced after the comparison and before the repair hold is refused at the
 *    hold by name, and its copy repairs it;
 *  - a hold the service gives up (its holder gone) while a repair batch is in flight: the
 *    service waits for the batch before the apply goes on;
 *  - preflight before the run reports no blocker, on the running subscription still none
 *    (its own copied tables are not "not empty"), and a genuinely non-empty table published
 *    later is still a blocker.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { verifyChannel, verifyLockKey } from '../../src/verify/channel.js';
import { spawnPgsub, startCluster, stopAllClusters, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

let pub10: Cluster;
let pub14: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];
const clients: pg.Client[] = [];
const numbers: string[] = [];

const SOURCE_DDL = `
CREATE TYPE pt AS (x float8, label text);
CREATE TABLE public.nested (id int PRIMARY KEY, f8 float8[], f4 float4[], n numeric[], m money, ma money[], j json[], tz timestamptz[], c pt, ca pt[], nan float8);
CREATE TABLE public.notes (id int PRIMARY KEY, v text, n int);
CREATE TABLE public.bulk (id int PRIMARY KEY, v text, x float8);
CREATE TABLE public.gate (id int PRIMARY KEY);
CREATE TABLE public.uniq (id int PRIMARY KEY, v text UNIQUE);
CREATE TABLE public.resynced (id int PRIMARY KEY, v text);
CREATE TABLE public.slow (id int PRIMARY KEY, v text);
CREATE TABLE public.late (id int PRIMARY KEY, v text);`;

const FILL = `
INSERT INTO public.nested SELECT g,
  ARRAY[g::float8 / 3, 0.1, CASE WHEN g % 7 = 0 THEN 'Infinity'::float8 - 'Infinity'::float8 END, '-0'::float8],
  ARRAY[g::float4 / 7, NULL],
  ARRAY[g / 7.0, 1.50, 'NaN'],
  (g * 1.25)::numeric::money,
  ARRAY[(g * 0.5)::numeric::money],
  ARRAY[('{"g": ' || g || ', "a": [1, 2.50]}')::json],
  ARRAY[timestamptz '2024-01-02 03:04:05.123456+02' + g * interval '1 minute'],
  ROW(g::float8 / 9, 'p' || g)::pt,
  CASE WHEN g % 5 = 0 THEN ARRAY[ROW(g::float8 / 11, NULL)::pt, NULL] WHEN g % 5 = 1 THEN '{}'::pt[] END,
  CASE WHEN g % 3 = 0 THEN 'Infinity'::float8 - 'Infinity'::float8 WHEN g % 3 = 1 THEN g::float8 / 13 END
FROM generate_series(1, 300) g;
INSERT INTO public.nested (id, f8) VALUES (301, '[0:1][1:2]={{0.1,0.2},{0.3,NaN}}');
INSERT INTO public.notes SELECT g, 'note ' || g, g FROM generate_series(1, 50) g;
INSERT INTO public.bulk SELECT g, 'bulk ' || g, g::float8 / 7 FROM generate_series(1, 20000) g;
INSERT INTO public.gate VALUES (1);
INSERT INTO public.uniq VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd');
INSERT INTO public.resynced SELECT g, 'r ' || g FROM generate_series(1, 1000) g;
INSERT INTO public.slow SELECT g, 's ' || g FROM generate_series(1, 2000) g;
CREATE PUBLICATION pub FOR TABLE public.nested, public.notes, public.bulk, public.gate, public.uniq, public.resynced;`;

/**
 * The target: notes has a column of its own and an ENABLE ALWAYS trigger logging what it
 * sees; slow and resynced a trigger that stops a copy at row 501 while the test holds an
 * advisory lock named after the table.
 */
const TARGET_DDL = `${SOURCE_DDL.replace('CREATE TABLE public.notes (id int PRIMARY KEY, v text, n int);', "CREATE TABLE public.notes (id int PRIMARY KEY, v text, n int, local_note text DEFAULT 'dflt');")}
CREATE TABLE public.trig_log (seq serial, op text, id int);
CREATE FUNCTION public.note_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.trig_log (op, id) VALUES (TG_OP, COALESCE(NEW.id, OLD.id)); RETURN NULL; END $$;
CREATE TRIGGER notes_log AFTER INSERT OR UPDATE OR DELETE ON public.notes FOR EACH ROW EXECUTE FUNCTION public.note_log();
ALTER TABLE public.notes ENABLE ALWAYS TRIGGER notes_log;
CREATE FUNCTION public.copy_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.id > 500 THEN PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtext(TG_TABLE_NAME)); END IF; RETURN NEW; END $$;
CREATE TRIGGER slow_gate BEFORE INSERT ON public.slow FOR EACH ROW EXECUTE FUNCTION public.copy_gate();
ALTER TABLE public.slow ENABLE ALWAYS TRIGGER slow_gate;
CREATE TRIGGER resynced_gate BEFORE INSERT ON public.resynced FOR EACH ROW EXECUTE FUNCTION public.copy_gate();
ALTER TABLE public.resynced ENABLE ALWAYS TRIGGER resynced_gate;`;

const env = (publisher: Cluster, sub: string): Record<string, string> => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url(sub),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: sub,
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
  // Tables added to the publication are picked up only on `pgsub refresh`.
  PGSUB_REFRESH_INTERVAL: '3600',
});

interface TableJson {
  table: string;
  status: string;
  reason: string | null;
  sourceRows: number;
  missing: number;
  extra: number;
  different: number;
  ms: number;
}

interface VerifyJson {
  equal: boolean;
  differences: number;
  elapsedMs: number;
  tables: TableJson[];
  repair: {
    complete: boolean;
    pauseMs: number;
    tables: { table: string; keys: number; updated: number; inserted: number; deleted: number; unchanged: number; ms: number }[];
    skipped: { table: string; reason: string; code?: string }[];
  } | null;
}

function cli(publisher: Cluster, sub: string, args: string[]): PgsubProcess {
  return spawnPgsub({ ...env(publisher, sub), PGSUB_LOG_LEVEL: 'warn' }, args);
}

async function finished(p: PgsubProcess, what: string): Promise<{ code: number | string; stdout: string; output: string }> {
  let stdout = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  const code = await withTimeout(p.exited, 150_000, what);
  return { code, stdout, output: p.output() };
}

async function verify(publisher: Cluster, sub: string, args: string[] = []): Promise<{ code: number | string; result: VerifyJson; output: string }> {
  const r = await finished(cli(publisher, sub, ['verify', '--json', ...args]), `pgsub verify ${args.join(' ')}`);
  let result: VerifyJson;
  try {
    result = JSON.parse(r.stdout) as VerifyJson;
  } catch {
    assert.fail(`verify printed no result (exit ${r.code}): ${r.output}`);
  }
  return { code: r.code, result, output: r.output };
}

const table = (v: VerifyJson, name: string) => v.tables.find((t) => t.table === name)!;

async function session(sub: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: target.url(sub) });
  c.on('error', () => {});
  await c.connect();
  clients.push(c);
  return c;
}

const relState = async (sub: string, rel: string) =>
  ((await target.query(`SELECT state FROM pgsub.subscription_rel WHERE subscription = $1 AND schema_name || '.' || table_name = $2`, [sub, rel], sub))[0]?.state as
    | string
    | undefined) ?? null;

/** A copy stopped by the trigger: a backend of the subscription waiting for the table's advisory lock. */
const copyStopped = async (sub: string) =>
  (
    await target.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = $1)`,
      [sub],
      sub,
    )
  )[0].n > 0;

async function preflight(publisher: Cluster, sub: string): Promise<{ code: number | string; blockers: { code: string; object: string }[]; report: Record<string, unknown> }> {
  const r = await finished(cli(publisher, sub, ['preflight', '--json']), 'pgsub preflight');
  const report = JSON.parse(r.stdout) as { findings: { severity: string; code: string; object: string }[] };
  return { code: r.code, blockers: report.findings.filter((f) => f.severity === 'blocker').map((f) => ({ code: f.code, object: f.object })), report };
}

before(async () => {
  [pub10, pub14, target] = await Promise.all([
    startCluster({ major: 10, name: 'vr-pub10' }),
    startCluster({ major: 14, name: 'vr-pub14' }),
    startCluster({ major: 18, name: 'vr-tgt' }),
  ]);
  for (const [publisher, sub] of [
    [pub10, 'r10'],
    [pub14, 'r14'],
  ] as const) {
    await publisher.createDatabase('src');
    await publisher.query(`${SOURCE_DDL}${FILL}`, [], 'src');
    await target.createDatabase(sub);
    await target.query(TARGET_DDL, [], sub);
  }
});

after(async () => {
  for (const c of clients) await c.end().catch(() => {});
  for (const c of children) c.kill('SIGKILL');
  await stopAllClusters();
  if (numbers.length > 0) process.stderr.write(`verify-repair: ${numbers.join('; ')}\n`);
});

async function startService(publisher: Cluster, sub: string): Promise<void> {
  const service = spawnPgsub(env(publisher, sub));
  children.push(service);
  await service.waitForLog('streaming started', 120_000);
  await waitFor(async () => (await target.query(`SELECT count(*) = 6 AND bool_and(state = 'r') AS ok FROM pgsub.subscription_rel WHERE subscription = $1`, [sub], sub))[0].ok, {
    timeoutMs: 120_000,
    intervalMs: 200,
    what: `${sub}: every table ready`,
  });
}

describe('pgsub verify --repair, table states, nested types; preflight on a running subscription', () => {
  test('preflight before the run: ready, no blocker', { timeout: 120_000 }, async () => {
    const p = await preflight(pub14, 'r14');
    assert.deepEqual(p.blockers, [], JSON.stringify(p.report, null, 1));
    assert.equal(p.code, 0);
    await Promise.all([startService(pub10, 'r10'), startService(pub14, 'r14')]);
  });

  test('nested types verify equal from PostgreSQL 10 and 14; a repaired table verifies equal; a second --repair repairs nothing', { timeout: 300_000 }, async () => {
    for (const [publisher, sub] of [
      [pub10, 'r10'],
      [pub14, 'r14'],
    ] as const) {
      const v = await verify(publisher, sub);
      assert.equal(v.code, 0, v.output);
      const nested = table(v.result, 'public.nested');
      assert.deepEqual([nested.status, nested.sourceRows], ['equal', 301], JSON.stringify(nested));
      numbers.push(`${sub}: verify of public.nested (301 rows, 10 nested columns) ${nested.ms} ms`);
      // Rows 3 and 6 hold a negative NaN at the top level, row 21 one inside float8[]; 10 an array of composites.
      await target.query(
        `UPDATE public.nested SET f8 = '{1,2}', nan = 0 WHERE id IN (3, 6);
         UPDATE public.nested SET ca = NULL, c = ROW(1, 'x') WHERE id = 10;
         UPDATE public.nested SET m = 0, ma = '{}' WHERE id = 4;
         UPDATE public.nested SET n = '{1.5}' WHERE id = 301;
         DELETE FROM public.nested WHERE id = 21;
         INSERT INTO public.nested (id) VALUES (9999);`,
        [],
        sub,
      );
      const found = await verify(publisher, sub, ['--repair']);
      assert.equal(found.code, 1, found.output);
      const t = table(found.result, 'public.nested');
      assert.deepEqual([t.different, t.missing, t.extra], [5, 1, 1], JSON.stringify(t));
      assert.equal(found.result.repair?.complete, true, found.output);
      const repaired = found.result.repair!.tables.find((x) => x.table === 'public.nested')!;
      assert.deepEqual([repaired.keys, repaired.updated, repaired.inserted, repaired.deleted, repaired.unchanged], [7, 5, 1, 1, 0]);
      const again = await verify(publisher, sub);
      assert.equal(again.code, 0, again.output);
      assert.equal(table(again.result, 'public.nested').status, 'equal');
      const twice = await verify(publisher, sub, ['--repair']);
      assert.equal(twice.code, 0, twice.output);
      assert.equal(twice.result.repair, null, 'nothing to repair');
      assert.equal(twice.result.differences, 0);
    }
  });

  test('--repair updates only the compared columns, inserts missing keys, deletes extra ones; a table the target refuses is named', { timeout: 200_000 }, async () => {
    const sub = 'r14';
    await target.query(
      `UPDATE public.notes SET local_note = 'precious-7' WHERE id = 7;
       UPDATE public.notes SET v = 'wrong', n = -1 WHERE id = 7;
       DELETE FROM public.notes WHERE id = 8;
       INSERT INTO public.notes (id, v) VALUES (9999, 'extra');
       UPDATE public.bulk SET v = 'drift', x = -x WHERE id % 4 = 0;
       UPDATE public.uniq SET v = 'tmp' WHERE id = 1; UPDATE public.uniq SET v = 'a' WHERE id = 2; UPDATE public.uniq SET v = 'b' WHERE id = 1;
       UPDATE public.uniq SET v = 'x' WHERE id = 4; INSERT INTO public.uniq VALUES (5, 'd');
       TRUNCATE public.trig_log;`,
      [],
      sub,
    );
    const r = await verify(pub14, sub, ['--repair']);
    assert.equal(r.code, 1, r.output);
    // Rows 1 and 2 swapped their unique values: one UPDATE cannot put them back (PostgreSQL
    // checks a unique index row by row). The table is named with the key; the others are repaired.
    assert.equal(r.result.repair!.complete, false);
    const refused = r.result.repair!.skipped.find((x) => x.table === 'public.uniq')!;
    assert.equal(refused.code, 'PGSUB_VERIFY_REPAIR_FAILED');
    assert.match(refused.reason, /^repair of public\.uniq failed at key \(v\)=\([ab]\): duplicate key value violates unique constraint "uniq_v_key" \(SQLSTATE 23505\)$/);
    assert.match(r.output, /"code":"PGSUB_VERIFY_REPAIR_FAILED"/, 'logged');
    assert.equal((await target.query(`SELECT count(*)::int AS n FROM public.uniq WHERE id = 5`, [], sub))[0].n, 1, 'its batch rolled back');
    const byTable = new Map(r.result.repair!.tables.map((t) => [t.table, t]));
    assert.equal(byTable.has('public.uniq'), false);
    assert.deepEqual(byTable.get('public.notes'), { ...byTable.get('public.notes')!, keys: 3, updated: 1, inserted: 1, deleted: 1 });
    assert.deepEqual(byTable.get('public.bulk'), { ...byTable.get('public.bulk')!, keys: 5000, updated: 5000, inserted: 0, deleted: 0 });
    numbers.push(`repair of 5,000 differing rows of public.bulk ${byTable.get('public.bulk')!.ms} ms, apply held ${r.result.repair!.pauseMs} ms in all`);
    assert.deepEqual(await target.query(`SELECT id, v, n, local_note FROM public.notes WHERE id IN (7, 8, 9999) ORDER BY id`, [], sub), [
      { id: 7, v: 'note 7', n: 7, local_note: 'precious-7' },
      { id: 8, v: 'note 8', n: 8, local_note: 'dflt' },
    ]);
    // The ENABLE ALWAYS trigger saw an update of 7, not a delete and an insert.
    assert.deepEqual(
      (await target.query(`SELECT op, id FROM public.trig_log ORDER BY id`, [], sub)).map((x) => `${x.op} ${x.id}`),
      ['UPDATE 7', 'INSERT 8', 'DELETE 9999'],
    );
    const logged = await target.query(
      `SELECT key->>'id' AS id, detail, local_tuple->>'local_note' AS local FROM pgsub.conflict_log WHERE conflict_type = 'verify_repair' AND relation = 'public.notes' ORDER BY (key->>'id')::int`,
      [],
      sub,
    );
    assert.deepEqual(
      logged.map((x) => x.id),
      ['7', '8', '9999'],
    );
    assert.match(logged[0].detail, /^pgsub verify found it different; updated from the source at /);
    assert.equal(logged[0].local, 'precious-7');

    // The swap undone by hand: the rest repairs, the extra row 5 deleted before row 4 takes its 'd'.
    await target.query(`UPDATE public.uniq SET v = 'tmp' WHERE id = 1; UPDATE public.uniq SET v = 'b' WHERE id = 2; UPDATE public.uniq SET v = 'a' WHERE id = 1;`, [], sub);
    const r2 = await verify(pub14, sub, ['--repair']);
    assert.equal(r2.code, 1, r2.output);
    assert.deepEqual(
      r2.result.repair!.tables.map((t) => `${t.table} updated ${t.updated} deleted ${t.deleted}`),
      ['public.uniq updated 1 deleted 1'],
    );
    const again = await verify(pub14, sub);
    assert.equal(again.code, 0, again.output);
  });

  test('a table mid-copy is not compared and --repair leaves it alone; its copy then applies the changes made meanwhile', { timeout: 300_000 }, async () => {
    const sub = 'r14';
    const holder = await session(sub);
    await holder.query(`SELECT pg_advisory_lock(hashtext('slow'))`);
    await pub14.query(`ALTER PUBLICATION pub ADD TABLE public.slow`, [], 'src');
    assert.equal((await finished(cli(pub14, sub, ['refresh']), 'pgsub refresh')).code, 0);
    await waitFor(async () => (await relState(sub, 'public.slow')) === 'd' && (await copyStopped(sub)), {
      timeoutMs: 60_000,
      intervalMs: 200,
      what: 'the copy of public.slow stopped in datasync',
    });
    // Changes after the copy's snapshot: the stream brings them once the copy is done.
    await pub14.query(`UPDATE public.slow SET v = 'changed' WHERE id IN (3, 1500); INSERT INTO public.slow VALUES (2001, 'new'); DELETE FROM public.slow WHERE id = 4;`, [], 'src');
    await target.query(`UPDATE public.notes SET v = 'again' WHERE id = 11`, [], sub);

    const r = await verify(pub14, sub, ['--repair']);
    assert.equal(r.code, 1, r.output);
    const slow = table(r.result, 'public.slow');
    assert.equal(slow.status, 'not compared');
    assert.equal(slow.reason, 'syncing (state d: datasync)');
    assert.deepEqual(
      r.result.repair!.tables.map((t) => `${t.table} ${t.updated}`),
      ['public.notes 1'],
    );
    assert.deepEqual(r.result.repair!.skipped, []);
    assert.doesNotMatch(r.output, /23505/);
    assert.equal((await target.query(`SELECT count(*)::int AS n FROM pgsub.conflict_log WHERE relation = 'public.slow'`, [], sub))[0].n, 0);
    assert.equal(await relState(sub, 'public.slow'), 'd', 'the copy is still where it was');

    await holder.query(`SELECT pg_advisory_unlock(hashtext('slow'))`);
    await waitFor(async () => (await relState(sub, 'public.slow')) === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'public.slow ready' });
    await waitForCatchUp(pub14, 'src', sub);
    const rows = `SELECT id, v FROM public.slow ORDER BY id`;
    assert.deepEqual(await target.query(rows, [], sub), await pub14.query(rows, [], 'src'));
    assert.deepEqual(await target.query(`SELECT id, v FROM public.slow WHERE id IN (3, 4, 1500, 2001) ORDER BY id`, [], sub), [
      { id: 3, v: 'changed' },
      { id: 1500, v: 'changed' },
      { id: 2001, v: 'new' },
    ]);
    const v = await verify(pub14, sub);
    assert.equal(v.code, 0, v.output);
    assert.deepEqual([table(v.result, 'public.slow').status, table(v.result, 'public.slow').sourceRows], ['equal', 2000]);
  });

  test('a table resynced between the comparison and the repair hold is refused at the hold, by name', { timeout: 300_000 }, async () => {
    const sub = 'r14';
    await target.query(`UPDATE public.resynced SET v = 'wrong' WHERE id = 5`, [], sub);
    const gate = await session(sub);
    await gate.query(`BEGIN; LOCK TABLE public.gate IN ACCESS EXCLUSIVE MODE`);
    const holder = await session(sub);
    await holder.query(`SELECT pg_advisory_lock(hashtext('resynced'))`);
    const run = finished(cli(pub14, sub, ['verify', '--json', '--repair', '--parallel', '2']), 'pgsub verify --repair');
    // The comparison is under way (one pair waits for public.gate) and has read public.resynced.
    const verifyBackends = `SELECT a.pid FROM pg_stat_activity a WHERE a.application_name = 'pgsub_r14_verify'`;
    await waitFor(
      async () =>
        (await target.query(`${verifyBackends} AND a.wait_event_type = 'Lock'`, [], sub)).length > 0 &&
        (await target.query(`SELECT 1 FROM pg_locks l WHERE l.relation = 'public.resynced'::regclass AND l.granted AND l.pid IN (${verifyBackends})`, [], sub)).length > 0,
      { timeoutMs: 60_000, intervalMs: 100, what: 'verify comparing, held up by public.gate' },
    );
    assert.equal((await finished(cli(pub14, sub, ['resync', 'public.resynced']), 'pgsub resync')).code, 0);
    assert.equal(await relState(sub, 'public.resynced'), 'd');
    await gate.query('COMMIT');

    const r = await run;
    assert.equal(r.code, 1, r.output);
    const result = JSON.parse(r.stdout) as VerifyJson;
    assert.equal(table(result, 'public.resynced').status, 'different', 'compared: it was ready in the snapshot');
    assert.equal(result.repair?.complete, false);
    assert.deepEqual(
      result.repair!.skipped.map((s) => `${s.table}: ${s.reason}`),
      ['public.resynced: not repaired: syncing (state d: datasync) at the repair hold; its copy writes it (verify again once the table is ready)'],
    );
    assert.equal((await target.query(`SELECT count(*)::int AS n FROM pgsub.conflict_log WHERE relation = 'public.resynced'`, [], sub))[0].n, 0);

    await holder.query(`SELECT pg_advisory_unlock(hashtext('resynced'))`);
    await waitFor(async () => (await relState(sub, 'public.resynced')) === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'public.resynced ready again' });
    await waitForCatchUp(pub14, 'src', sub);
    const v = await verify(pub14, sub);
    assert.equal(v.code, 0, v.output);
  });

  test('a hold given up while a repair batch is in flight waits for the batch before the apply goes on', { timeout: 120_000 }, async () => {
    const sub = 'r14';
    // A repair request as verify makes it, from a session that then dies mid-batch.
    const holder = await session(sub);
    const [classId, objId] = verifyLockKey(sub);
    await holder.query('SELECT pg_advisory_lock($1, $2)', [classId, objId]);
    const step = async (set: string, state: string, params: unknown[] = []) => {
      await holder.query(`UPDATE pgsub.verify SET ${set}, state = '${state}' WHERE subscription = '${sub}'`, params);
      await holder.query('SELECT pg_notify($1, $2)', [verifyChannel(sub), state]);
    };
    const rowState = async () => (await target.query(`SELECT state, detail FROM pgsub.verify WHERE subscription = $1`, [sub], sub))[0] as { state: string; detail: string };
    await step(`request_id = 'test-repair', mode = 'repair', holder_pid = pg_backend_pid(), hold_timeout_ms = 120000`, 'requested');
    await waitFor(async () => (await rowState()).state === 'armed', { timeoutMs: 10_000, what: 'armed' });
    const lsn = (await pub14.query(`SELECT pg_current_wal_lsn()::text AS l`, [], 'src'))[0].l as string;
    await step(`bound_lsn = $1::pg_lsn`, 'bounded', [lsn]);
    await step(`slot_lsn = $1::pg_lsn`, 'located', [lsn]);
    await waitFor(async () => (await rowState()).state === 'held', { timeoutMs: 30_000, what: 'held for the repair' });
    // A batch in flight: it read 'held' under a share lock, as repair.ts does.
    const batch = await session(sub);
    await batch.query(`BEGIN; SELECT state FROM pgsub.verify WHERE subscription = '${sub}' FOR SHARE`);
    await pub14.query(`INSERT INTO public.notes SELECT g, 'late ' || g, g FROM generate_series(1000, 1009) g`, [], 'src');
    const applied = async () => (await target.query(`SELECT count(*)::int AS n FROM public.notes WHERE id >= 1000`, [], sub))[0].n as number;
    holder.connection.stream.destroy();
    // The service gives up (its holder is gone) and first waits to move the row behind the batch.
    await waitFor(
      async () => (await target.query(`SELECT 1 FROM pg_stat_activity WHERE application_name = 'pgsub_${sub}_verify' AND wait_event_type = 'Lock'`, [], sub)).length > 0,
      { timeoutMs: 30_000, intervalMs: 100, what: 'the service waiting for the batch' },
    );
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal(await applied(), 0, 'applied while a repair batch could still write');
    assert.equal((await rowState()).state, 'held');
    await batch.query('COMMIT');
    await waitFor(async () => (await applied()) === 10, { timeoutMs: 30_000, intervalMs: 100, what: 'the rows applied once the batch ended' });
    assert.deepEqual(await rowState(), { state: 'abandoned', detail: 'the verify session is gone' });
  });

  test('preflight on the running subscription: no false blocker; a non-empty table published later still is one', { timeout: 120_000 }, async () => {
    const sub = 'r14';
    const p = await preflight(pub14, sub);
    assert.deepEqual(p.blockers, [], JSON.stringify(p.report, null, 1));
    assert.equal(p.code, 0);
    const findings = p.report.findings as { code: string; message: string }[];
    assert.match(findings.find((f) => f.code === 'TARGET_SUBSCRIPTION_RUNNING')!.message, /already has 7 of the 7 published table\(s\) on the target \(7 ready\)/);
    assert.deepEqual([(p.report.estimate as { tables: number }).tables, (p.report.estimate as { already_copied: number }).already_copied], [0, 7]);

    await pub14.query(`INSERT INTO public.late SELECT g, 'l' FROM generate_series(1, 10) g`, [], 'src');
    await pub14.query(`ALTER PUBLICATION pub ADD TABLE public.late`, [], 'src');
    await target.query(`INSERT INTO public.late VALUES (1, 'only on the target')`, [], sub);
    const p2 = await preflight(pub14, sub);
    assert.equal(p2.code, 1);
    assert.deepEqual(p2.blockers, [{ code: 'TARGET_TABLE_NOT_EMPTY', object: 'public.late' }]);
  });
});
