/**
 * Apply lanes (apply_workers > 1, src/apply/run/lanes.ts): a backlog of 3,000 source
 * transactions mixing independent inserts with dependent changes — hot-row updates, deletes
 * and key changes of rows inserted by earlier transactions, a keyless table, a TRUNCATE —
 * is applied by several target connections in parallel, and the target ends equal to the
 * source with every transaction counted once. A transaction that fails in a lane (a row
 * already in the target) ends the session; the next applies the lanes' transactions one
 * by one, where the conflict is found and named, and after the fix the backlog is applied
 * exactly once. When every transaction touches one hot row, lanes pause. When the oldest
 * group waits on a lock a later lane holds (a unique index only the target has), the
 * watchdog ends the session instead of waiting forever. Streamed (parallel) and prepared
 * transactions in the backlog take the serial path between lane groups. (Exactly once
 * across SIGKILL with lanes: crash.test.ts.)
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, connect, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `
  CREATE TABLE public.item (id bigint PRIMARY KEY, v int NOT NULL, note text);
  CREATE TABLE public.hot (id int PRIMARY KEY, n bigint NOT NULL);
  CREATE TABLE public.moved (id int PRIMARY KEY, v text);
  CREATE TABLE public.uniq (id int PRIMARY KEY, code int);
  CREATE TABLE public."lOg ""x""" (n int, t text);
  INSERT INTO public.hot SELECT g, 0 FROM generate_series(0, 4) g;`;
const TABLES = ['public.item', 'public.hot', 'public.moved', 'public.uniq', 'public."lOg ""x"""'];
let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'lanes-pub' }), startCluster({ major: 18, name: 'lanes-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR ALL TABLES;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, extra: Record<string, string> = {}): PgsubProcess {
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    PGSUB_APPLY_WORKERS: '4',
    PGSUB_SYNCHRONOUS_COMMIT: 'off',
    // Small groups: many of them, so lanes overlap and depend on each other.
    PGSUB_GROUP_TRANSACTIONS: '40',
    ...extra,
  });
  return child;
}

async function stop(): Promise<string> {
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-2000));
  const output = child!.output();
  child = null;
  return output;
}

const applied = async (sub: string) => Number((await target.query(`SELECT transactions_applied FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst'))[0].transactions_applied);

async function equal(): Promise<void> {
  const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
  assert.ok(cmp.equal, JSON.stringify(cmp));
}

/**
 * Transaction i of the mixed backlog, ids offset by `base`. Hot rows are updated 200
 * transactions apart (5 groups: committed by then, as lanes run at most 4 groups ahead);
 * deletes and key changes reach back a few transactions, into the group before or the
 * same one — often enough to wait, not so often that lanes pause (4 dependent groups in a row).
 */
function transaction(i: number, base: number): string {
  const s = [`INSERT INTO public.item VALUES (${base + i}, ${i}, 'n${i}')`, `INSERT INTO public."lOg ""x""" VALUES (${i}, 'l')`];
  if (i % 40 === 0) s.push(`UPDATE public.hot SET n = n + ${i} WHERE id = ${(i / 40) % 5}`);
  if (i % 37 === 0) s.push(`DELETE FROM public.item WHERE id = ${base + i - 5}`);
  if (i % 31 === 0) s.push(`UPDATE public.item SET id = id + 1000000 WHERE id = ${base + i - 3}`);
  if (i % 31 === 5 && i > 31) s.push(`UPDATE public.item SET v = -v, note = 'moved' WHERE id = ${base + i - 8 + 1000000}`);
  if (i % 2 === 0) s.push(`INSERT INTO public.moved VALUES (${base + i}, 'm${i}')`);
  if (i % 500 === 250) s.push(`TRUNCATE public.moved`);
  return `BEGIN; ${s.join('; ')}; COMMIT;`;
}

async function backlog(base: number, n: number, make = transaction): Promise<void> {
  const statements = [];
  for (let i = 1; i <= n; i++) statements.push(make(i, base));
  await publisher.query(statements.join('\n'), [], 'src');
}

/** The counters pgsub logs when its lanes stop. */
function laneCounters(output: string): { groups: number; pauses: number; dependencyWaits: number } {
  const line = output.split('\n').find((l) => l.includes('apply lanes stopped'));
  assert.ok(line, output.slice(-3000));
  return JSON.parse(line) as { groups: number; pauses: number; dependencyWaits: number };
}

test('a backlog of 3,000 mixed transactions is applied by four lanes; the target equals the source', async () => {
  start('lanes');
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000);
  await stop();
  const before = await applied('lanes');
  await backlog(0, 3000);
  start('lanes');
  await waitForCatchUp(publisher, 'src', 'lanes', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  // Caught up: the next transaction is the main connection's again, with the replication origin back.
  await publisher.query(`UPDATE public.hot SET n = n + 1 WHERE id = 0`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000);
  const output = await stop();
  // One session did it all: no error, no retry.
  assert.equal(output.split('\n').filter((l) => l.includes('"streaming started"')).length, 1, output.slice(-3000));
  assert.doesNotMatch(output, /"level":50/);
  await equal();
  assert.equal((await applied('lanes')) - before, 3001, 'each source transaction counted once');
  const counters = laneCounters(output);
  process.stdout.write(`# lanes: ${counters.groups} groups, ${counters.dependencyWaits} changes waited for an earlier group, ${counters.pauses} pauses\n`);
  assert.ok(counters.groups >= 8, `groups: ${counters.groups}`);
  assert.ok(counters.dependencyWaits > 0, `dependency waits: ${counters.dependencyWaits}`);
  // Hot rows took every update, in order.
  const [hot] = await target.query(`SELECT sum(n)::bigint AS n FROM public.hot`, [], 'dst');
  const expected = Array.from({ length: 3000 }, (_, k) => k + 1)
    .filter((i) => i % 40 === 0)
    .reduce((a, b) => a + b, 1);
  assert.equal(Number(hot.n), expected);
});

test('a failure in a lane: the lanes’ transactions are re-applied one by one, the conflict is named, then applied exactly once', async () => {
  const base = 10_000_000;
  // The target already holds the row of transaction 1,234: a unique violation in a lane.
  await target.query(`INSERT INTO public.item VALUES (${base + 1234}, -1, 'pre-existing')`, [], 'dst');
  start('lanes');
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000);
  await stop();
  const before = await applied('lanes');
  // Independent inserts only: every transaction goes through a lane.
  await backlog(base, 2000, (i) => `BEGIN; INSERT INTO public.item VALUES (${base + i}, ${i}, 'f'); COMMIT;`);
  start('lanes');
  // The lane's failure, logged once, by the service loop that re-applies the lanes' transactions one by one.
  const retry = await child!.waitForLog('a grouped transaction failed; re-applying one transaction at a time');
  const err = retry.err as { type?: string; code?: string; cause?: { type?: string; code?: string } };
  assert.equal(err.type, 'GroupRetryError', JSON.stringify(retry));
  assert.deepEqual([err.cause?.type, err.cause?.code], ['DatabaseError', '23505'], JSON.stringify(retry));
  assert.doesNotMatch(child!.output(), /apply lane failed/);
  // One by one, the transaction is found and logged with its key.
  await waitFor(async () => (await target.query(`SELECT 1 FROM pgsub.conflict_log WHERE subscription = 'lanes' AND conflict_type = 'insert_exists'`, [], 'dst')).length > 0, {
    timeoutMs: 60_000,
    intervalMs: 100,
    what: 'the conflict log row',
  });
  const [logged] = await target.query(`SELECT key::text AS key FROM pgsub.conflict_log WHERE subscription = 'lanes' AND conflict_type = 'insert_exists'`, [], 'dst');
  assert.match(logged.key, new RegExp(String(base + 1234)));
  // Nothing after the failing transaction is committed.
  const [{ n }] = await target.query(`SELECT count(*)::int AS n FROM public.item WHERE id > ${base + 1234} AND id < ${base + 1000000}`, [], 'dst');
  assert.equal(n, 0);
  await target.query(`DELETE FROM public.item WHERE id = ${base + 1234}`, [], 'dst');
  await waitForCatchUp(publisher, 'src', 'lanes', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await stop();
  await equal();
  assert.equal((await applied('lanes')) - before, 2000);
});

test('every transaction touching one hot row: lanes pause and the serial path applies the rest; the row ends right', async () => {
  start('lanes');
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000);
  await stop();
  const before = await applied('lanes');
  const [initial] = await publisher.query(`SELECT n FROM public.hot WHERE id = 4`, [], 'src');
  await backlog(20_000_000, 3000, (i, base) => `BEGIN; INSERT INTO public.item VALUES (${base + i}, ${i}, 'h'); UPDATE public.hot SET n = n + 1 WHERE id = 4; COMMIT;`);
  start('lanes');
  await waitForCatchUp(publisher, 'src', 'lanes', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const counters = laneCounters(await stop());
  assert.ok(counters.pauses >= 1, JSON.stringify(counters));
  // A few groups decide the pause; then 64 groups' worth of transactions go the serial way.
  assert.ok(counters.groups < 20, JSON.stringify(counters));
  await equal();
  const [hot] = await target.query(`SELECT n FROM public.hot WHERE id = 4`, [], 'dst');
  assert.equal(Number(hot.n), Number(initial.n) + 3000);
  assert.equal((await applied('lanes')) - before, 3000);
});

test('the oldest group waits on a lock a later lane holds (a unique index only the target has): the watchdog ends the session, the serial path reports the violation', async () => {
  await target.query(`CREATE UNIQUE INDEX uniq_code ON public.uniq (code)`, [], 'dst');
  start('lanes');
  await child!.waitForLog('streaming started');
  await publisher.query(`INSERT INTO public.uniq VALUES (1, 1)`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000);
  await stop();
  // Filler first (lanes open only while behind), then T1: an update that will wait on a lock
  // this test holds, and an insert of code 7; then T2: another insert of code 7.
  const filler = (base: number) => Array.from({ length: 50 }, (_, i) => `BEGIN; INSERT INTO public.item VALUES (${base + i}, ${i}, 'w'); COMMIT;`);
  const t1 = `BEGIN; UPDATE public.uniq SET code = 2 WHERE id = 1; INSERT INTO public.uniq VALUES (4, 7); COMMIT;`;
  const t2 = `BEGIN; INSERT INTO public.uniq VALUES (5, 7); COMMIT;`;
  await publisher.query([...filler(30_000_000), t1, t2, ...filler(31_000_000)].join('\n'), [], 'src');
  const blocker = await connect(target, 'dst');
  try {
    await blocker.query(`BEGIN; SELECT * FROM public.uniq WHERE id = 1 FOR UPDATE`);
    // One transaction per group: T1 and T2 go to different lanes.
    start('lanes', { PGSUB_GROUP_TRANSACTIONS: '1', PGSUB_SYNCHRONOUS_COMMIT: 'on' });
    // T2's lane has inserted code 7 while T1's lane waits on this test's lock.
    await waitFor(
      async () =>
        (await target.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE 'pgsub_lanes_lane%' AND wait_event_type = 'Lock'`, [], 'dst'))[0].n > 0,
      {
        timeoutMs: 30_000,
        intervalMs: 50,
        what: 'a lane waiting on the test lock',
      },
    ).catch((err) => {
      throw new Error(`${err}\n${child!.output().slice(0, 6000)}`);
    });
    // The three other lanes (T2 and two fillers) have written (an xid) and wait for their turn to commit.
    const written = `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE 'pgsub_lanes_lane%' AND backend_xid IS NOT NULL AND wait_event_type IS DISTINCT FROM 'Lock'`;
    await waitFor(async () => (await target.query(written, [], 'dst'))[0].n >= 3, {
      timeoutMs: 30_000,
      intervalMs: 50,
      what: 'the later lanes waiting for their turn',
    });
  } finally {
    await blocker.query('ROLLBACK');
    await blocker.end();
  }
  await waitFor(async () => /waits on a lock held by a later lane/.test(child!.output()), { timeoutMs: 30_000, intervalMs: 100, what: 'the watchdog' });
  // One by one, T2 fails on the target's own unique index, as a serial apply would.
  await waitFor(async () => /uniq_code/.test(child!.output()), { timeoutMs: 30_000, intervalMs: 100, what: 'the unique violation' });
  await target.query(`DROP INDEX public.uniq_code`, [], 'dst');
  await waitForCatchUp(publisher, 'src', 'lanes', 60_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await stop();
  const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
  assert.ok(cmp.equal, JSON.stringify(cmp));
});

test('lanes beside streamed (parallel) and prepared transactions: the serial path takes them in order, with the origin back on the main connection', async () => {
  const env = { PGSUB_APPLY_WORKERS: '3', PGSUB_GROUP_TRANSACTIONS: '20', PGSUB_STREAMING: 'parallel', PGSUB_TWO_PHASE: 'true' };
  // Its own slot (two_phase is chosen when the slot is created).
  start('lanes2', env);
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'lanes2', 60_000);
  await stop();
  // Small enough that the big transaction below is streamed.
  await publisher.query(`ALTER SYSTEM SET logical_decoding_work_mem = '64kB'`, [], 'src');
  await publisher.query(`SELECT pg_reload_conf()`, [], 'src');
  const before = await applied('lanes2');
  const small = (from: number) => Array.from({ length: 200 }, (_, i) => `BEGIN; INSERT INTO public.item VALUES (${from + i}, ${i}, 's'); COMMIT;`);
  const big = `BEGIN; INSERT INTO public.item SELECT g, g, repeat('x', 100) FROM generate_series(40100000, 40104999) g; UPDATE public.item SET v = v + 1 WHERE id BETWEEN 40000000 AND 40000099; COMMIT;`;
  const prepare = `BEGIN; UPDATE public.item SET note = 'prepared' WHERE id BETWEEN 40200000 AND 40200009; PREPARE TRANSACTION 'lanes_gid';`;
  await publisher.query([...small(40_000_000), big, ...small(40_200_000), prepare, ...small(40_300_000)].join('\n'), [], 'src');
  // COMMIT PREPARED cannot share a query string (an implicit transaction block).
  await publisher.query(`COMMIT PREPARED 'lanes_gid'`, [], 'src');
  await publisher.query(small(40_400_000).join('\n'), [], 'src');
  start('lanes2', env);
  await waitForCatchUp(publisher, 'src', 'lanes2', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const output = await stop();
  await publisher.query(`ALTER SYSTEM RESET logical_decoding_work_mem`, [], 'src');
  await publisher.query(`SELECT pg_reload_conf()`, [], 'src');
  assert.doesNotMatch(output, /"level":50/, output.slice(-3000));
  assert.ok(laneCounters(output).groups >= 4, output.slice(-3000));
  // The big transaction was streamed, so it took the streaming path, not a lane.
  await waitFor(async () => Number((await publisher.query(`SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'lanes2'`, [], 'src'))[0]?.stream_txns ?? 0) > 0, {
    timeoutMs: 10_000,
    intervalMs: 200,
    what: 'a streamed transaction in the slot statistics',
  });
  await equal();
  // 800 small, the streamed one and the prepared one, each counted once.
  assert.equal((await applied('lanes2')) - before, 802);
  const [{ n }] = await target.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst');
  assert.equal(n, 0);
});

test('a lane waiting on a lock the parallel transaction holds (a trigger only the target has): the parallel apply falls back, nothing hangs', async () => {
  const env = { PGSUB_APPLY_WORKERS: '3', PGSUB_GROUP_TRANSACTIONS: '10', PGSUB_STREAMING: 'parallel' };
  start('lanes3', env);
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'lanes3', 60_000);
  await stop();
  // Every row of public.moved applied on the target bumps one counter row: the eager
  // transaction holds its lock until it commits, and each lane's insert waits for it.
  await target.query(
    `CREATE TABLE public.counter (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO public.counter VALUES (1, 0);
     CREATE FUNCTION public.bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE public.counter SET n = n + 1 WHERE id = 1; RETURN NULL; END $$;
     CREATE TRIGGER moved_bump AFTER INSERT ON public.moved FOR EACH ROW EXECUTE FUNCTION public.bump();
     ALTER TABLE public.moved ENABLE ALWAYS TRIGGER moved_bump;`,
    [],
    'dst',
  );
  await publisher.query(`ALTER SYSTEM SET logical_decoding_work_mem = '64kB'`, [], 'src');
  await publisher.query(`SELECT pg_reload_conf()`, [], 'src');
  // One transaction streamed in two blocks with 300 small ones committing between them.
  const big = await connect(publisher, 'src');
  try {
    await big.query('BEGIN');
    await big.query(`INSERT INTO public.moved SELECT g, repeat('x', 200) FROM generate_series(50000000, 50002999) g`);
    const small = Array.from({ length: 300 }, (_, i) => `BEGIN; INSERT INTO public.moved VALUES (${51_000_000 + i}, 's'); COMMIT;`);
    await publisher.query(small.join('\n'), [], 'src');
    await big.query(`INSERT INTO public.moved SELECT g, repeat('y', 200) FROM generate_series(50003000, 50005999) g`);
    await big.query('COMMIT');
  } finally {
    await big.end();
  }
  start('lanes3', env);
  await waitForCatchUp(publisher, 'src', 'lanes3', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const output = await stop();
  await publisher.query(`ALTER SYSTEM RESET logical_decoding_work_mem`, [], 'src');
  await publisher.query(`SELECT pg_reload_conf()`, [], 'src');
  assert.match(output, /"reason":"the leader or an apply lane waits for a lock the parallel transaction holds","msg":"parallel apply fell back to the spool"/, output.slice(-3000));
  assert.match(output, /"msg":"apply lanes started"/);
  await equal();
  // Each applied row fired the trigger once: the eager rows were rolled back with their bumps.
  const [{ rows, n }] = await target.query(`SELECT (SELECT count(*) FROM public.moved WHERE id >= 50000000)::int AS rows, (SELECT n FROM public.counter)::int AS n`, [], 'dst');
  assert.equal(rows, 6300);
  assert.equal(n, 6300);
});
