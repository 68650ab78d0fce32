/**
 * applyOptions (config/apply-options.ts): the apply's settings taken from the Config under
 * the Config's own names, with the status interval held within a third of the publisher's
 * wal_sender_timeout; and BoundedQueue.ready (run/queue.ts), which the applier races
 * against an unanswered commit while the queue is empty.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { applyOptions } from '../../src/config/apply-options.js';
import { loadConfig } from '../../src/config/config.js';
import { BoundedQueue } from '../../src/apply/run/queue.js';

const env: NodeJS.ProcessEnv = {
  PGSUB_SOURCE: 'postgresql://rep@pub.example.com:5433/shop',
  PGSUB_TARGET: 'host=tgt.example.com dbname=shop user=apply',
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: 'sub',
  PGSUB_COPY_DATA: 'false',
  PGSUB_STATE_DIR: '/tmp/pgsub-apply-options-test',
  PGSUB_GROUP_TRANSACTIONS: '17',
  PGSUB_BATCH_ROWS: '33',
  PGSUB_APPLY_WORKERS: '3',
  PGSUB_STATUS_INTERVAL: '10',
};

test('applyOptions keeps every setting under its Config name', () => {
  const config = loadConfig({ env });
  const o = applyOptions(config, { walSenderTimeoutMs: 0 });
  for (const key of Object.keys(o) as (keyof typeof o)[]) assert.deepEqual(o[key], config[key as keyof typeof config], key);
  assert.equal(o.groupTransactions, 17);
  assert.equal(o.batchRows, 33);
  assert.equal(o.applyWorkers, 3);
  assert.ok(Object.isFrozen(o));
});

test("applyOptions reports within a third of the publisher's wal_sender_timeout", () => {
  const config = loadConfig({ env });
  assert.equal(applyOptions(config, { walSenderTimeoutMs: 60_000 }).statusIntervalMs, 10_000);
  assert.equal(applyOptions(config, { walSenderTimeoutMs: 15_000 }).statusIntervalMs, 5_000);
});

test('BoundedQueue.ready resolves on a put or a close and takes nothing', async () => {
  const q = new BoundedQueue<number>(4);
  let ready = false;
  const waiting = q.ready().then(() => (ready = true));
  await new Promise((r) => setImmediate(r));
  assert.equal(ready, false);
  q.putAlways(7);
  await waiting;
  assert.equal(q.length, 1);
  assert.equal(await q.take(), 7);
  const closed = q.ready();
  q.close();
  await closed;
  assert.equal(await q.take(), undefined);
});
