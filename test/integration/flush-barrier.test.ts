/**
 * synchronous_commit = off with flush tracking (loop.ts): a commit is reported to the
 * publisher as flushed only once the target's WAL is flushed past it. When pgsub is idle
 * it forces that flush itself (a synchronous commit of a KEY SHARE lock of its origin
 * row) instead of waiting for the target's walwriter. Here the walwriter waits 10 s
 * (wal_writer_delay's maximum), so the slot confirming a transaction within 5 s can only
 * come from the barrier; and the confirmed position never passes the origin row. The same
 * barrier makes the origin a session resumes from durable before the session reports it.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { openMaintenance } from '../../src/pgwire/connect.js';
import { ReplicationConnection } from '../../src/protocol/replication.js';
import { OwnConnections } from '../../src/service/preflight.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { reconcileSlot } from '../../src/service/session-checks.js';
import { currentWalLsn, lsnToBigint, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
let runner: Runner | null = null;

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'flushb-pub' }),
    startCluster({ major: 18, name: 'flushb-tgt', settings: { wal_writer_delay: '10s', wal_writer_flush_after: '1GB' } }),
  ]);
  await publisher.createDatabase('db');
  await target.createDatabase('db');
  await publisher.query('CREATE TABLE public.t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE public.t;', [], 'db');
  await target.query('CREATE TABLE public.t (id int PRIMARY KEY, v text)', [], 'db');
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await Promise.all([publisher?.stop(), target?.stop()]);
});

test('idle after an asynchronous commit: pgsub flushes the target WAL itself, and only then confirms', async () => {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: 'flushb',
      source: publisher.url('db'),
      target: target.url('db'),
      publication: 'pub',
      copy_data: false,
      synchronous_commit: 'off',
      status_interval: 1,
    },
  });
  runner = startRunner(config, createLogger('warn'));
  await waitFor(async () => (await slotConfirmedLsn(publisher, 'flushb')) !== null, { timeoutMs: 30_000, what: 'slot' });
  for (let round = 1; round <= 3; round++) {
    await publisher.query(`INSERT INTO public.t VALUES (${round}, 'r${round}')`, [], 'db');
    const end = await currentWalLsn(publisher, 'db');
    const started = Date.now();
    await waitFor(async () => ((await slotConfirmedLsn(publisher, 'flushb')) ?? 0n) >= end, {
      timeoutMs: 5_000,
      intervalMs: 20,
      what: `round ${round} confirmed (the walwriter alone would take 10 s)`,
    });
    const [origin] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'flushb'`, [], 'db');
    assert.ok(lsnToBigint(origin!.lsn) >= ((await slotConfirmedLsn(publisher, 'flushb')) ?? 0n), 'confirmed never beyond the origin row');
    const [row] = await target.query<{ v: string }>(`SELECT v FROM public.t WHERE id = ${round}`, [], 'db');
    assert.equal(row?.v, `r${round}`);
    assert.ok(Date.now() - started < 5_000);
  }
});

// The position a session resumes from is reported as flushed from its first feedback
// (origin/positions.ts Progress). A session restarted in the same process may find the
// origin row as the session before it left it: committed asynchronously, still in the
// target's WAL buffers (seen once as PGSUB_SLOT_AHEAD after a target crash, sync-durable
// test). reconcileSlot must return it only once it is on disk.
test('a session resumes only from an origin position that is on the target disk', async () => {
  runner?.stop();
  await runner?.done;
  runner = null;
  const config = loadConfig({
    env: {},
    overrides: { subscription: 'flushb', source: publisher.url('db'), target: target.url('db'), publication: 'pub', synchronous_commit: 'off' },
  });
  // The origin row as an asynchronous apply commit leaves it: nothing flushes it for up to
  // wal_writer_delay (10 s), and a target crash now would take it back. (Should the WAL
  // writer's own flush fall between the write and the look, the row is written again.)
  const flushed = async () => lsnToBigint((await target.query<{ lsn: string }>('SELECT pg_catalog.pg_current_wal_flush_lsn()::text AS lsn', [], 'db'))[0]!.lsn);
  let written = 0n;
  for (let attempt = 1; ; attempt++) {
    const [row] = await target.query<{ lsn: string }>(
      `SET synchronous_commit = off; UPDATE pgsub.origin SET updated_at = now() WHERE subscription = 'flushb'; SELECT pg_catalog.pg_current_wal_insert_lsn()::text AS lsn`,
      [],
      'db',
    );
    written = lsnToBigint(row!.lsn);
    if ((await flushed()) < written) break;
    assert.ok(attempt < 3, 'the origin row is not on disk before the session starts');
  }
  const replication = await ReplicationConnection.open(config.source, 'pgsub_flushb_test');
  const sql = openMaintenance(config.target, 'pgsub_flushb_test');
  try {
    const [origin] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'flushb'`, [], 'db');
    const resumeAt = await reconcileSlot(config, replication, sql, createLogger('warn'), 'pgsub_flushb_test', new OwnConnections());
    assert.equal(resumeAt, lsnToBigint(origin!.lsn));
    assert.ok((await flushed()) >= written, 'the origin row a session resumes from is flushed before the session reports it');
  } finally {
    await Promise.all([replication.close(), sql.end()]);
  }
});
