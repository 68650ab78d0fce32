/**
 * The streaming connection's application_name, which the publisher's
 * synchronous_standby_names names: the source conninfo's application_name, else the
 * subscription name (as native's walreceiver). With synchronous_standby_names = 'mysub'
 * and application_name=mysub, a commit on the publisher returns once pgsub has applied it;
 * helper connections (table sync, refresh) never carry that name.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, startCluster, waitFor, withTimeout, type Cluster } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
let runner: Runner | null = null;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'app-pub' }), startCluster({ major: 18, name: 'app-tgt' })]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
  const schema = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';
  await publisher.query(`${schema} CREATE PUBLICATION pub FOR TABLE app.items; INSERT INTO app.items SELECT g, 'seed' FROM generate_series(1, 100) g;`, [], 'src');
  await target.query(schema, [], 'dst');
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await publisher?.query(`ALTER SYSTEM RESET synchronous_standby_names`).catch(() => undefined);
  await publisher?.query('SELECT pg_reload_conf()').catch(() => undefined);
  await publisher?.stop();
  await target?.stop();
});

function start(subscription: string, source: string): Runner {
  const config = loadConfig({
    env: {},
    overrides: { subscription, source, target: target.url('dst'), publication: 'pub', retry_min_delay: 0.2, retry_max_delay: 1, refresh_interval: 1 },
  });
  return startRunner(config, createLogger('warn'));
}

/** The application_name of the walsender streaming from `slot` (the slot is also active while being created). */
async function walsenderName(slot: string): Promise<string | null> {
  const [row] = await publisher.query<{ application_name: string }>(
    `SELECT r.application_name FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1 AND r.state = 'streaming'`,
    [slot],
  );
  return row?.application_name ?? null;
}

async function stopRunner(): Promise<void> {
  runner?.stop();
  await runner?.done;
  runner = null;
}

describe('application_name of the streaming connection', () => {
  test('default: the subscription name', async () => {
    runner = start('appdefault', publisher.url('src'));
    try {
      await waitFor(async () => (await walsenderName('appdefault')) !== null, { timeoutMs: 30_000, what: 'the walsender' });
      assert.equal(await walsenderName('appdefault'), 'appdefault');
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, 'appdefault')) ?? 0n) >= end, { timeoutMs: 30_000, what: 'catch-up' });
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.items']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
    } finally {
      await stopRunner();
    }
  });

  test("synchronous_standby_names = 'mysub' with application_name=mysub: a commit returns and is applied", async () => {
    await publisher.query(`ALTER SYSTEM SET synchronous_standby_names = 'mysub'`);
    await publisher.query('SELECT pg_reload_conf()');
    await target.query('TRUNCATE app.items', [], 'dst');
    // copy_data (the default): the table sync's connections run beside the stream and must not be taken for it.
    runner = start('syncsub', `${publisher.url('src')}?application_name=mysub`);
    try {
      await waitFor(async () => (await walsenderName('syncsub')) === 'mysub', { timeoutMs: 30_000, what: 'the walsender named mysub' });
      await waitFor(async () => (await publisher.query(`SELECT 1 FROM pg_stat_replication WHERE application_name = 'mysub' AND sync_state = 'sync'`)).length === 1, {
        timeoutMs: 30_000,
        what: 'pgsub to be the synchronous standby',
      });
      const startedAt = Date.now();
      await withTimeout(publisher.query(`INSERT INTO app.items VALUES (1000, 'synchronous')`, [], 'src'), 15_000, 'the synchronous commit to return');
      const commitMs = Date.now() - startedAt;
      console.log(`synchronous commit returned after ${commitMs} ms`);
      // Returned, so pgsub reported it flushed: it is in the target.
      const [row] = await target.query<{ v: string }>(`SELECT v FROM app.items WHERE id = 1000`, [], 'dst');
      assert.equal(row?.v, 'synchronous');
      const named = await publisher.query<{ pid: number }>(`SELECT pid FROM pg_stat_activity WHERE application_name = 'mysub'`);
      const [slot] = await publisher.query<{ active_pid: number }>(`SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'syncsub'`);
      assert.deepEqual(
        named.map((r) => r.pid),
        [slot!.active_pid],
        'only the streaming connection is named mysub',
      );
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, 'syncsub')) ?? 0n) >= end, { timeoutMs: 30_000, what: 'catch-up' });
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.items']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
    } finally {
      await stopRunner();
    }
  });
});
