/**
 * two_phase: a transaction prepared on the publisher is prepared on the target (not
 * visible), then committed or rolled back there; a prepared transaction survives a pgsub
 * restart; SIGKILL right after PREPARE on the target and between COMMIT PREPARED and the
 * origin update each end with the transaction applied exactly once; streamed prepared
 * transactions (STREAM PREPARE); a target without max_prepared_transactions warns, applies
 * ordinary transactions and fails the first PREPARE (retried) until it is fixed.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { compareTables, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;
const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-2pc-'));
const SUB = 'tpc';
const SCHEMA = `CREATE TABLE public.t (id int PRIMARY KEY, v text);`;

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: '2pc-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: '2pc-tgt' }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.t;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(stateDir, { recursive: true, force: true });
});

function start(extra: Record<string, string> = {}): PgsubProcess {
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: SUB,
    PGSUB_COPY_DATA: 'false',
    PGSUB_TWO_PHASE: 'true',
    PGSUB_STREAMING: 'on',
    PGSUB_STATE_DIR: stateDir,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    ...extra,
  });
  return child;
}

async function stop(p: PgsubProcess): Promise<void> {
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
}

const caughtUp = () => waitForCatchUp(publisher, 'src', SUB);

const preparedOnTarget = async () => (await target.query<{ gid: string }>(`SELECT gid FROM pg_prepared_xacts WHERE database = 'dst'`, [], 'dst')).map((r) => r.gid);
const count = async () => (await target.query(`SELECT count(*)::int AS n FROM public.t`, [], 'dst'))[0].n as number;
const applied = async () => (await target.query(`SELECT transactions_applied::int AS n FROM pgsub.origin WHERE subscription = $1`, [SUB], 'dst'))[0].n as number;

test('prepare → prepared on the target, invisible; commit prepared and rollback prepared finish it', async () => {
  const p = start();
  await p.waitForLog('streaming started');
  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (1, 'one'), (2, 'two'); PREPARE TRANSACTION 'app gid 1';`, [], 'src');
  await waitFor(async () => (await preparedOnTarget()).length === 1, { timeoutMs: 30_000, what: 'prepared on the target' });
  assert.match((await preparedOnTarget())[0]!, /^pgsub_tpc_\d+$/);
  assert.equal(await count(), 0);
  await publisher.query(`COMMIT PREPARED 'app gid 1'`, [], 'src');
  await caughtUp();
  assert.deepEqual(await preparedOnTarget(), []);
  assert.equal(await count(), 2);

  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (3, 'three'); PREPARE TRANSACTION 'app gid 2';`, [], 'src');
  await waitFor(async () => (await preparedOnTarget()).length === 1, { timeoutMs: 30_000, what: 'second prepared' });
  await publisher.query(`ROLLBACK PREPARED 'app gid 2'`, [], 'src');
  await caughtUp();
  assert.deepEqual(await preparedOnTarget(), []);
  assert.equal(await count(), 2);
  await stop(p);
});

test('a prepared transaction survives a pgsub restart and is committed after it', async () => {
  let p = start();
  await p.waitForLog('streaming started');
  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (10, 'ten'); PREPARE TRANSACTION 'across restart';`, [], 'src');
  await waitFor(async () => (await preparedOnTarget()).length === 1, { timeoutMs: 30_000, what: 'prepared' });
  await caughtUp();
  await stop(p);
  await publisher.query(`COMMIT PREPARED 'across restart'`, [], 'src');
  p = start();
  await caughtUp();
  assert.deepEqual(await preparedOnTarget(), []);
  assert.equal((await target.query(`SELECT v FROM public.t WHERE id = 10`, [], 'dst'))[0].v, 'ten');
  await stop(p);
});

test('SIGKILL right after PREPARE on the target: prepared once, committed once', async () => {
  const before = await applied();
  let p = start({ PGSUB_FAULT: 'after-prepare' });
  await p.waitForLog('streaming started');
  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (20, 'twenty'); PREPARE TRANSACTION 'killed after prepare';`, [], 'src');
  assert.equal(await p.exited, 'SIGKILL');
  assert.equal((await preparedOnTarget()).length, 1);
  p = start();
  await p.waitForLog('streaming started');
  await publisher.query(`COMMIT PREPARED 'killed after prepare'`, [], 'src');
  await caughtUp();
  assert.deepEqual(await preparedOnTarget(), []);
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM public.t WHERE id = 20`, [], 'dst'))[0].n, 1);
  assert.equal(await applied(), before + 1);
  await stop(p);
});

test('SIGKILL between COMMIT PREPARED and the origin update: committed once, counted once', async () => {
  const before = await applied();
  let p = start({ PGSUB_FAULT: 'after-commit-prepared' });
  await p.waitForLog('streaming started');
  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (30, 'thirty'); PREPARE TRANSACTION 'killed after commit';`, [], 'src');
  await waitFor(async () => (await preparedOnTarget()).length === 1, { timeoutMs: 30_000, what: 'prepared' });
  await publisher.query(`COMMIT PREPARED 'killed after commit'`, [], 'src');
  assert.equal(await p.exited, 'SIGKILL');
  assert.deepEqual(await preparedOnTarget(), [], 'COMMIT PREPARED ran before the kill');
  p = start();
  await caughtUp();
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM public.t WHERE id = 30`, [], 'dst'))[0].n, 1);
  assert.equal(await applied(), before + 1);
  // The row that told "committed" from "never prepared" goes with the origin update.
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM pgsub.prepared`, [], 'dst'))[0].n, 0);
  await stop(p);
});

test('a large prepared transaction is streamed (STREAM PREPARE) and committed', async () => {
  const p = start();
  await p.waitForLog('streaming started');
  await publisher.query(
    `BEGIN; INSERT INTO public.t SELECT g, repeat('s', 200) FROM generate_series(1000, 6000) g;
       SAVEPOINT a; DELETE FROM public.t WHERE id BETWEEN 1000 AND 1999; ROLLBACK TO SAVEPOINT a;
     PREPARE TRANSACTION 'streamed prepare';`,
    [],
    'src',
  );
  await waitFor(async () => (await preparedOnTarget()).length === 1, { timeoutMs: 60_000, what: 'streamed prepared' });
  await publisher.query(`COMMIT PREPARED 'streamed prepare'`, [], 'src');
  await caughtUp();
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.t']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  assert.deepEqual(await preparedOnTarget(), []);
  await stop(p);
});

test('a target with max_prepared_transactions = 0: a warning at startup, ordinary transactions applied, an apply error at the first PREPARE until the target is fixed', async () => {
  const plain = await startCluster({ major: 18, name: '2pc-noprep', settings: { max_prepared_transactions: 0 } });
  try {
    await plain.createDatabase('dst');
    await plain.query(SCHEMA, [], 'dst');
    const p = spawnPgsub({
      PGSUB_SOURCE: publisher.url('src'),
      PGSUB_TARGET: plain.url('dst'),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: 'noprep',
      PGSUB_COPY_DATA: 'false',
      PGSUB_TWO_PHASE: 'true',
      PGSUB_RETRY_MIN_DELAY: '0.2',
      PGSUB_RETRY_MAX_DELAY: '0.5',
    });
    child = p;
    await p.waitForLog('streaming started');
    assert.match(p.output(), /max_prepared_transactions is 0: the first PREPARE will fail until max_prepared_transactions is set/);
    await publisher.query(`INSERT INTO public.t VALUES (900, 'plain')`, [], 'src');
    await waitFor(async () => (await plain.query(`SELECT 1 FROM public.t WHERE id = 900`, [], 'dst')).length === 1, { timeoutMs: 30_000, what: 'the ordinary transaction' });
    await publisher.query(`BEGIN; INSERT INTO public.t VALUES (901, 'prepared'); PREPARE TRANSACTION 'noprep gid';`, [], 'src');
    await waitFor(async () => /prepared transactions are disabled/.test(p.output()), { timeoutMs: 30_000, what: 'the PREPARE error' });
    const [recorded] = await plain.query(`SELECT error_message FROM pgsub.subscription WHERE subscription = 'noprep'`, [], 'dst');
    assert.match(recorded.error_message, /prepared transactions are disabled/);
    await plain.query(`ALTER SYSTEM SET max_prepared_transactions = 10`);
    await plain.restart('fast');
    await waitFor(async () => (await plain.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst'))[0].n === 1, {
      timeoutMs: 60_000,
      what: 'prepared once the target allows it',
    });
    await publisher.query(`COMMIT PREPARED 'noprep gid'`, [], 'src');
    await waitForCatchUp(publisher, 'src', 'noprep');
    const cmp = await compareTables(publisher, 'src', plain, 'dst', ['public.t']);
    // The target had no rows before 900: it equals the source from there on.
    const [{ n }] = await plain.query(`SELECT count(*)::int AS n FROM public.t WHERE id IN (900, 901)`, [], 'dst');
    assert.equal(n, 2, JSON.stringify(cmp));
    await stop(p);
  } finally {
    await plain.stop();
  }
});
