/**
 * A clean stop of the publisher (pg_ctl stop -m fast, -m smart, and a restart) ends the
 * walsender with CommandComplete and no CopyDone (walsender.c WalSndDone). pgsub must take
 * that as the end of the connection, reconnect with backoff once the server is back, and
 * never exit: writes before and after each stop arrive once, the target equal to the source.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const SUB = 'pubstop';
const TABLES = ['app.items'];

let publisher: Cluster;
let target: Cluster;
let runner: Runner | null = null;
let settled: string | null = null;
const logs: { level: number; msg: string; err?: { code?: string; message?: string } }[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'stop-pub' }), startCluster({ major: 18, name: 'stop-tgt' })]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
  const schema = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';
  await publisher.query(`${schema} CREATE PUBLICATION pub FOR TABLE app.items;`, [], 'src');
  await target.query(schema, [], 'dst');
  const config = loadConfig({
    env: {},
    overrides: { subscription: SUB, source: publisher.url('src'), target: target.url('dst'), publication: 'pub', copy_data: false, retry_min_delay: 0.2, retry_max_delay: 1 },
  });
  const destination = { write: (line: string) => void logs.push(JSON.parse(line) as (typeof logs)[number]) };
  runner = startRunner(config, createLogger('info', destination));
  runner.done.then(
    () => (settled = 'resolved'),
    (err: Error) => (settled = `rejected: ${err.message}`),
  );
  await waitFor(async () => (await slotConfirmedLsn(publisher, SUB)) !== null, { timeoutMs: 30_000, what: 'the slot' });
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await publisher?.stop();
  await target?.stop();
});

let nextId = 1;
async function write(rows: number): Promise<void> {
  const first = nextId;
  nextId += rows;
  await publisher.query(`INSERT INTO app.items SELECT g, 'v' || g FROM generate_series($1::int, $2::int) g`, [first, nextId - 1], 'src');
  await publisher.query(`UPDATE app.items SET v = v || '+' WHERE id = $1`, [first], 'src');
}

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, SUB)) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
}

async function assertEqual(): Promise<void> {
  const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
  assert.ok(cmp.equal, `target differs: ${JSON.stringify(cmp)}`);
}

describe('publisher shut down cleanly', () => {
  for (const mode of ['fast', 'smart', 'restart'] as const) {
    test(`pg_ctl ${mode === 'restart' ? 'restart' : `stop -m ${mode}`}: pgsub reconnects and never exits`, async () => {
      await write(50);
      await caughtUp();
      const errorsBefore = logs.length;
      if (mode === 'restart') {
        await publisher.restart('fast');
      } else {
        await publisher.stopServer(mode);
        // Down for a while: pgsub retries and keeps running.
        await new Promise((r) => setTimeout(r, 1500));
        assert.equal(settled, null, 'pgsub stopped while the publisher was down');
        await publisher.startServer();
      }
      await write(50);
      await caughtUp();
      await assertEqual();
      assert.equal(settled, null, 'pgsub stopped');
      const seen = logs.slice(errorsBefore);
      assert.ok(!seen.some((l) => l.err?.code === 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE'), 'CommandComplete was taken for a protocol violation');
      assert.ok(!seen.some((l) => l.level >= 60), `a fatal log line: ${JSON.stringify(seen.filter((l) => l.level >= 60))}`);
      // The end of the stream is reported as what it is.
      assert.ok(
        seen.some((l) => /walsender stopped/.test(l.err?.message ?? '')),
        JSON.stringify(seen.map((l) => l.err?.message ?? l.msg)),
      );
    });
  }
});
