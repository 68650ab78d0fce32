/**
 * two_phase beside table copies (issue 15.2), as native's (worker.c, "TWO_PHASE
 * TRANSACTIONS"): two_phase stays pending while any table is not ready, so a transaction
 * prepared before a table's copy snapshot and committed after it arrives whole at COMMIT
 * PREPARED, and is applied to every table; once every table is ready pgsub restarts the
 * stream with two_phase, and later prepares are prepared on the target. A prepare made
 * before two_phase was enabled and committed after it comes whole at COMMIT PREPARED too,
 * below the origin, and is applied. While two_phase is enabled no table is copied (a table
 * added later waits, with its reason in subscription_rel; resync is refused, exit 2), and
 * `pgsub refresh --no-copy` takes a table copied by hand.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `CREATE TABLE public.a (id int PRIMARY KEY, v text); CREATE TABLE public.b (id int PRIMARY KEY, v text);`;
let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'tps-pub' }), startCluster({ major: 18, name: 'tps-tgt' })]);
  await publisher.createDatabase('src');
  await publisher.query(
    `${SCHEMA} INSERT INTO public.a SELECT g, 'a' || g FROM generate_series(1, 1000) g; INSERT INTO public.b SELECT g, 'b' || g FROM generate_series(1, 1000) g;
     CREATE PUBLICATION pub FOR TABLE public.a, public.b;`,
    [],
    'src',
  );
  for (const db of ['dst1', 'dst2']) {
    await target.createDatabase(db);
    await target.query(SCHEMA, [], db);
  }
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function env(sub: string, db: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url(db),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_TWO_PHASE: 'true',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    PGSUB_REFRESH_INTERVAL: '1',
    ...extra,
  };
}

function start(sub: string, db: string, extra: Record<string, string> = {}, args = ['run']): PgsubProcess {
  const child = spawnPgsub(env(sub, db, extra), args);
  children.push(child);
  return child;
}

async function stop(p: PgsubProcess): Promise<void> {
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
}

const preparedOnTarget = async (db: string) => (await target.query<{ gid: string }>(`SELECT gid FROM pg_prepared_xacts WHERE database = $1`, [db], db)).map((r) => r.gid);
const equal = async (db: string, tables = ['public.a', 'public.b']) => {
  const cmp = await compareTables(publisher, 'src', target, db, tables);
  assert.ok(cmp.equal, JSON.stringify(cmp));
};
const logged = (p: PgsubProcess, msg: string) => p.output().includes(`"msg":"${msg}"`);

test('the initial copy keeps two_phase pending; once every table is ready the stream restarts with it, and prepares reach the target', async () => {
  const p = start('tps', 'dst1');
  await p.waitForLog('two_phase pending until every table is ready; prepared transactions are applied at COMMIT PREPARED meanwhile', 120_000);
  await p.waitForLog('every table is ready; restarting the stream to enable two_phase', 120_000);
  await waitFor(async () => (p.output().match(/"msg":"streaming started"/g) ?? []).length >= 2, { timeoutMs: 60_000, what: 'the stream restarted' });
  await waitFor(async () => Boolean((await publisher.query(`SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'tps'`, [], 'src'))[0]?.two_phase), {
    timeoutMs: 30_000,
    what: 'two_phase enabled on the slot',
  });
  await publisher.query(`BEGIN; INSERT INTO public.a VALUES (5002, 'late'); PREPARE TRANSACTION 'late';`, [], 'src');
  await waitFor(async () => (await preparedOnTarget('dst1')).length === 1, { timeoutMs: 30_000, what: 'prepared on the target' });
  await publisher.query(`COMMIT PREPARED 'late'`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'tps');
  await equal('dst1');
  assert.deepEqual(await preparedOnTarget('dst1'), []);
  await stop(p);
});

test('two_phase turned on later: a transaction prepared before is sent whole at COMMIT PREPARED, below the origin, and applied', async () => {
  // Without two_phase the prepare is not sent; the origin moves past it with later commits.
  const first = start('tps2', 'dst2', { PGSUB_TWO_PHASE: 'false', PGSUB_COPY_DATA: 'false' });
  await first.waitForLog('streaming started');
  await publisher.query(`BEGIN; INSERT INTO public.b VALUES (6001, 'before'); PREPARE TRANSACTION 'before';`, [], 'src');
  await publisher.query(`INSERT INTO public.a VALUES (6002, 'other')`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'tps2');
  await stop(first);
  // Enabled now, from a position past the prepare: its COMMIT PREPARED brings it whole.
  const second = start('tps2', 'dst2', { PGSUB_COPY_DATA: 'false' });
  await second.waitForLog('streaming started');
  await publisher.query(`COMMIT PREPARED 'before'`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'tps2');
  const rows = await target.query(`SELECT id FROM public.b WHERE id = 6001`, [], 'dst2');
  assert.equal(rows.length, 1, second.output().slice(-3000));
  assert.deepEqual(await preparedOnTarget('dst2'), []);
  await stop(second);
});

test('with two_phase enabled a table added later is not copied (a transaction prepared during its copy would lose its part), resync is refused, and refresh --no-copy takes a table copied by hand', async () => {
  const p = start('tps', 'dst1');
  await p.waitForLog('streaming started');
  await target.query(`CREATE TABLE public.c (id int PRIMARY KEY, v text)`, [], 'dst1');
  await publisher.query(
    `CREATE TABLE public.c (id int PRIMARY KEY, v text); INSERT INTO public.c SELECT g, 'c' || g FROM generate_series(1, 300000) g; ALTER PUBLICATION pub ADD TABLE public.c;`,
    [],
    'src',
  );
  const refusal =
    "not copied: two_phase is enabled on the slot, and a transaction prepared during the copy would lack this table's changes. Mark the table copied by hand with pgsub refresh --no-copy (as ALTER SUBSCRIPTION ... REFRESH PUBLICATION WITH (copy_data = false)), or re-create the subscription";
  const cState = async () =>
    (await target.query(`SELECT state, sync_lsn::text AS lsn, last_error, error_count FROM pgsub.subscription_rel WHERE subscription = 'tps' AND table_name = 'c'`, [], 'dst1'))[0];
  // Refused, or (the hole this closes) copying: a transaction prepared now, after the copy's snapshot.
  await waitFor(async () => logged(p, refusal) || ((await cState())?.state === 'd' && (await cState())?.lsn !== null), {
    timeoutMs: 60_000,
    intervalMs: 20,
    what: 'public.c refused or copying',
  });
  await publisher.query(`BEGIN; INSERT INTO public.c VALUES (300001, 'prepared'); INSERT INTO public.a VALUES (7001, 'prepared'); PREPARE TRANSACTION 'pc';`, [], 'src');
  await waitFor(async () => logged(p, refusal) || (await cState())?.state === 'r', { timeoutMs: 120_000, intervalMs: 100, what: 'public.c refused or ready' });
  await publisher.query(`COMMIT PREPARED 'pc'`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'tps');
  assert.ok(logged(p, refusal), 'public.c was copied with two_phase enabled');
  const rel = await cState();
  assert.equal(rel.state, 'i');
  assert.match(rel.last_error, /two_phase is enabled/);
  assert.ok(rel.error_count >= 1);
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM public.c`, [], 'dst1'))[0].n, 0);

  const resync = start('tps', 'dst1', {}, ['resync', 'public.a']);
  assert.equal(await resync.exited, 2, resync.output());
  assert.match(resync.output(), /PGSUB_CONFIG_INVALID: resync: two_phase is enabled on slot tps/);
  const [a] = await target.query(`SELECT state FROM pgsub.subscription_rel WHERE subscription = 'tps' AND table_name = 'a'`, [], 'dst1');
  assert.equal(a.state, 'r');

  // The operator copies it (nothing writes to it meanwhile) and says so.
  await target.query(`INSERT INTO public.c SELECT g, 'c' || g FROM generate_series(1, 300000) g; INSERT INTO public.c VALUES (300001, 'prepared')`, [], 'dst1');
  const noCopy = start('tps', 'dst1', {}, ['refresh', '--no-copy']);
  assert.equal(await noCopy.exited, 0, noCopy.output());
  assert.match(noCopy.output(), /1 table\(s\) marked ready without a copy: public\.c/);
  await waitFor(async () => (await cState())?.state === 'r', { timeoutMs: 10_000, what: 'public.c ready' });
  await p.waitForLog('tables applied from now on without a copy (pgsub refresh --no-copy)', 30_000);
  await publisher.query(`INSERT INTO public.c VALUES (300002, 'after'); BEGIN; UPDATE public.c SET v = 'prepared' WHERE id = 1; PREPARE TRANSACTION 'c1';`, [], 'src');
  await publisher.query(`COMMIT PREPARED 'c1'`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'tps');
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM public.c`, [], 'dst1'))[0].n === 300002, { timeoutMs: 30_000, what: 'public.c streaming' });
  await equal('dst1', ['public.a', 'public.b', 'public.c']);
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM pgsub.prepared`, [], 'dst1'))[0].n, 0);
  await stop(p);
});
