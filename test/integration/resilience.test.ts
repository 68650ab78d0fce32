/**
 * Connection resilience: the walsender or the target backend killed mid-workload, a
 * publisher gone silent (a black-holed network path), keepalives answered within a
 * short wal_sender_timeout even while idle — each ends with pgsub reconnecting by itself
 * and the target equal to the source, nothing lost or duplicated. And a slot ahead of the
 * position recorded in the target is a fatal, typed error that applies nothing.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { checkLedger, currentWalLsn, LEDGER_SCHEMA, runLedgerWorkload, slotConfirmedLsn, startCluster, startProxy, waitFor, type Cluster, type Proxy } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
let proxy: Proxy;
let runner: Runner | null = null;

const SUB = 'resilient';

before(async () => {
  [publisher, target] = await Promise.all([
    // A short wal_sender_timeout: pgsub must report within it, and a dead peer is noticed quickly.
    startCluster({ major: 18, name: 'res-pub', settings: { wal_sender_timeout: '3s' } }),
    startCluster({ major: 18, name: 'res-tgt' }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${LEDGER_SCHEMA} CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags;`, [], 'src');
  await target.query(LEDGER_SCHEMA, [], 'dst');
  proxy = await startProxy(publisher.port);
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await proxy?.close();
  await publisher?.stop();
  await target?.stop();
});

function start(overrides: Record<string, unknown> = {}): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: SUB,
      source: `postgres://postgres@127.0.0.1:${proxy.port}/src`,
      target: target.url('dst'),
      publication: 'pub',
      copy_data: false,
      receive_timeout: 2,
      retry_min_delay: 0.1,
      retry_max_delay: 0.5,
      ...overrides,
    },
  });
  return startRunner(config, createLogger('silent'));
}

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, SUB)) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
}

async function assertExactlyOnce(): Promise<void> {
  const ledger = await checkLedger(publisher, 'src', target, 'dst');
  assert.deepEqual(ledger.duplicates, []);
  assert.equal(ledger.targetRows, ledger.sourceRows);
  assert.ok(ledger.equal, 'target differs from source');
}

describe('reconnects and resumes', () => {
  test('walsender terminated, target backend terminated, network silent: converges exactly once', async () => {
    runner = start();
    await waitFor(async () => (await slotConfirmedLsn(publisher, SUB)) !== null, { timeoutMs: 30_000, what: 'slot' });
    let seed = 1;
    const connectionsBefore = proxy.connections();

    // 1. The publisher ends the walsender mid-workload.
    const w1 = runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 600, seed: seed++, firstClient: 0 });
    await new Promise((r) => setTimeout(r, 400));
    const [killedWalsender] = await publisher.query(`SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_replication WHERE application_name = '${SUB}'`);
    assert.equal(killedWalsender.n, 1);
    await w1;
    await caughtUp();
    await assertExactlyOnce();
    assert.ok(proxy.connections() > connectionsBefore, 'pgsub reconnected to the publisher');

    // 2. The target ends pgsub's apply backend mid-workload.
    const w2 = runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 600, seed: seed++, firstClient: 10 });
    await new Promise((r) => setTimeout(r, 400));
    const [killedApply] = await target.query(`SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = 'pgsub_${SUB}'`);
    assert.ok(killedApply.n >= 1);
    await w2;
    await caughtUp();
    await assertExactlyOnce();

    // 3. The network path goes silent: no bytes, no reset. receive_timeout (2 s) must notice.
    const beforeSilence = proxy.connections();
    const w3 = runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 300, seed: seed++, pauseMs: 2, firstClient: 20 });
    await new Promise((r) => setTimeout(r, 300));
    proxy.blackhole();
    await w3;
    await caughtUp();
    await assertExactlyOnce();
    assert.ok(proxy.connections() > beforeSilence, 'pgsub opened a new replication connection after the silence');

    // 4. Idle for several wal_sender_timeouts (3 s): keepalives answered, no reconnects.
    const beforeIdle = proxy.connections();
    await new Promise((r) => setTimeout(r, 7000));
    assert.equal(proxy.connections(), beforeIdle, 'the walsender dropped an idle pgsub');
    assert.equal(runner.counters.transactionsApplied >= 1500, true);
    runner.stop();
    await runner.done;
    runner = null;
  });

  test('a slot ahead of the target is fatal: PGSUB_SLOT_AHEAD, nothing applied', async () => {
    // While pgsub is stopped, more changes arrive and the slot is moved past them by someone else.
    await runLedgerWorkload(publisher, 'src', { clients: 1, transactionsPerClient: 20, seed: 99, firstClient: 30 });
    const [before] = await target.query(`SELECT count(*)::int AS n FROM app.ledger`, [], 'dst');
    await publisher.query(`SELECT pg_replication_slot_advance('${SUB}', pg_current_wal_lsn())`, [], 'src');
    const r = start();
    await assert.rejects(r.done, (err: Error & { code?: string }) => {
      assert.equal(err.code, 'PGSUB_SLOT_AHEAD');
      assert.match(err.message, /beyond the .* recorded in the target/);
      return true;
    });
    const [afterwards] = await target.query(`SELECT count(*)::int AS n FROM app.ledger`, [], 'dst');
    assert.equal(afterwards.n, before.n);
  });
});
