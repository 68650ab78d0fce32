/**
 * Conflicts inside transactions that do not arrive as one BEGIN … COMMIT: a streamed
 * transaction (streaming = on, applied from the spool at STREAM COMMIT) and a prepared
 * one (two_phase, applied at PREPARE and finished by COMMIT PREPARED), each inserting a
 * row whose key already exists on the target. The pipelined apply aborts on the unique
 * violation; the transaction is re-applied carefully from the spool or from memory, the
 * policy decides, the conflict is logged once, and every other row of the transaction is
 * applied exactly once.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { startCluster, waitFor, waitForCatchUp, type Cluster } from '../harness/index.js';

const DDL = `CREATE TABLE public.items (id int PRIMARY KEY, v text NOT NULL)`;
let pub: Cluster;
let tgt: Cluster;
const runners: Runner[] = [];

before(async () => {
  [pub, tgt] = await Promise.all([
    // Small enough that a 2,000-row transaction is streamed.
    startCluster({ major: 18, name: 'cstream-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: 'cstream-tgt' }),
  ]);
  await pub.createDatabase('src');
  await pub.query(`${DDL}; CREATE PUBLICATION pub FOR TABLE public.items;`, [], 'src');
  for (const db of ['streamed', 'prepared', 'binary']) {
    await tgt.createDatabase(db);
    await tgt.query(`${DDL}; INSERT INTO public.items VALUES (5, 'local five'), (1505, 'local 1505');`, [], db);
  }
});

after(async () => {
  for (const r of runners) r.stop();
  await Promise.all(runners.map((r) => r.done.catch(() => undefined)));
  await pub?.stop();
  await tgt?.stop();
});

function subscribe(db: string, extra: Record<string, unknown>): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: `sub_${db}`,
      source: pub.url('src'),
      target: tgt.url(db),
      publication: 'pub',
      copy_data: false,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      conflicts: { default: { insert_exists: 'apply_remote' } },
      ...extra,
    },
  });
  const runner = startRunner(config, createLogger('silent'));
  runners.push(runner);
  return runner;
}

async function conflicts(db: string): Promise<{ conflict_type: string; key: string; policy: string }[]> {
  return tgt.query(`SELECT conflict_type, key::text AS key, policy FROM pgsub.conflict_log ORDER BY id`, [], db);
}

async function summary(cluster: Cluster, db: string): Promise<{ n: number; remote: number; five: string; other: string }> {
  const [row] = await cluster.query<{ n: number; remote: number; five: string; other: string }>(
    `SELECT count(*)::int AS n, count(*) FILTER (WHERE v LIKE 'remote %')::int AS remote,
            max(v) FILTER (WHERE id = 5) AS five, max(v) FILTER (WHERE id = 1505) AS other FROM public.items`,
    [],
    db,
  );
  return row!;
}

test('a streamed transaction meeting insert_exists: replayed carefully from the spool, the remote rows win, logged once', async () => {
  const runner = subscribe('streamed', { streaming: 'on' });
  await waitFor(async () => (await pub.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'sub_streamed'`, [], 'src')).length === 1, {
    timeoutMs: 60_000,
    what: 'the slot',
  });
  await pub.query(`INSERT INTO public.items SELECT g, 'remote ' || g FROM generate_series(1, 2000) g`, [], 'src');
  await waitForCatchUp(pub, 'src', 'sub_streamed', 120_000);
  assert.deepEqual(await summary(tgt, 'streamed'), { n: 2000, remote: 2000, five: 'remote 5', other: 'remote 1505' });
  const logged = await conflicts('streamed');
  assert.deepEqual(
    logged.map((c) => [c.conflict_type, c.policy]),
    [
      ['insert_exists', 'apply_remote'],
      ['insert_exists', 'apply_remote'],
    ],
  );
  assert.match(logged[0]!.key, /5/);
  assert.ok(runner.counters.carefulReplays >= 1, 'the conflict was resolved by a careful replay');
  // The stream really was a streamed transaction: pgoutput streamed it (a spool was used).
  const [stats] = await pub.query<{ stream_txns: string }>(`SELECT stream_txns::text FROM pg_stat_replication_slots WHERE slot_name = 'sub_streamed'`, [], 'src');
  assert.ok(Number(stats!.stream_txns) >= 1, `stream_txns ${stats!.stream_txns}`);
});

test('a prepared transaction meeting insert_exists: prepared on the target with the remote rows, committed by COMMIT PREPARED', async () => {
  subscribe('prepared', { two_phase: true });
  await waitFor(async () => (await pub.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'sub_prepared' AND two_phase`, [], 'src')).length === 1, {
    timeoutMs: 60_000,
    what: 'the two-phase slot',
  });
  await pub.query(`TRUNCATE public.items`, [], 'src');
  await waitForCatchUp(pub, 'src', 'sub_prepared', 60_000);
  await tgt.query(`INSERT INTO public.items VALUES (5, 'local five'), (1505, 'local 1505')`, [], 'prepared');
  await pub.query(`BEGIN; INSERT INTO public.items SELECT g, 'remote ' || g FROM generate_series(1, 20) g; PREPARE TRANSACTION 'cstream_g1';`, [], 'src');
  await waitFor(async () => (await tgt.query(`SELECT 1 FROM pg_prepared_xacts WHERE database = 'prepared'`, [], 'prepared')).length === 1, {
    timeoutMs: 60_000,
    what: 'the transaction prepared on the target',
  });
  // Prepared, not committed: the target still shows its local row.
  assert.deepEqual((await summary(tgt, 'prepared')).five, 'local five');
  await pub.query(`COMMIT PREPARED 'cstream_g1'`, [], 'src');
  await waitForCatchUp(pub, 'src', 'sub_prepared', 60_000);
  await waitFor(async () => (await summary(tgt, 'prepared')).five === 'remote 5', { timeoutMs: 30_000, what: 'the commit of the prepared transaction' });
  assert.deepEqual(await summary(tgt, 'prepared'), { n: 21, remote: 20, five: 'remote 5', other: 'local 1505' });
  assert.deepEqual(
    (await conflicts('prepared')).map((c) => [c.conflict_type, c.policy]),
    [['insert_exists', 'apply_remote']],
  );
  assert.deepEqual(await tgt.query(`SELECT gid FROM pg_prepared_xacts`, [], 'prepared'), []);
});

test('binary mode, not streamed: the COPY made from the Insert messages meets insert_exists; replayed carefully, logged once', async () => {
  const runner = subscribe('binary', { binary: true });
  await waitFor(async () => (await pub.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'sub_binary'`, [], 'src')).length === 1, {
    timeoutMs: 60_000,
    what: 'the slot',
  });
  // Rows 5 and 1505 exist on the target since the start (not on this stream's path); these two are in it.
  await tgt.query(`INSERT INTO public.items VALUES (3005, 'local 3005'), (4505, 'local 4505')`, [], 'binary');
  await pub.query(`INSERT INTO public.items SELECT g, 'remote ' || g FROM generate_series(3001, 5000) g`, [], 'src');
  await waitForCatchUp(pub, 'src', 'sub_binary', 120_000);
  const [row] = await tgt.query<{ n: number; remote: number; mine: string }>(
    `SELECT count(*)::int AS n, count(*) FILTER (WHERE v LIKE 'remote %')::int AS remote, string_agg(v, ',' ORDER BY id) FILTER (WHERE id IN (3005, 4505)) AS mine FROM public.items`,
    [],
    'binary',
  );
  assert.deepEqual(row, { n: 2002, remote: 2000, mine: 'remote 3005,remote 4505' });
  const logged = await conflicts('binary');
  assert.deepEqual(
    logged.map((c) => [c.conflict_type, c.policy]),
    [
      ['insert_exists', 'apply_remote'],
      ['insert_exists', 'apply_remote'],
    ],
  );
  assert.ok(runner.counters.carefulReplays >= 1, 'the conflict was resolved by a careful replay');
});
