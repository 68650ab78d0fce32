/**
 * Transient failures heal by themselves, in bounded time:
 *  - the target restarted five times in a row: each time pgsub resumes within a few
 *    seconds of the server being back (the backoff starts over after a session that
 *    committed something, instead of growing across unrelated outages);
 *  - SIGTERM while pgsub waits to retry: exit 0 at once;
 *  - a black-holed publisher connection: dropped after receive_timeout, and the next
 *    streaming connection starts within 5 s more, although the old walsender still holds
 *    the slot (wal_sender_timeout 60 s): pgsub terminates its own stale walsender;
 *  - a black-holed target connection (new connections too, until the network heals):
 *    noticed within target_timeout plus the probe, recovered once healed;
 *  - the target crashed (restart immediate) while pgsub is idle: noticed at once, resumed.
 * Every test ends with the target equal to the source.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, startProxy, waitFor, withTimeout, type Cluster, type Proxy } from '../harness/index.js';

const SCHEMA = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';

let publisher: Cluster;
let target: Cluster;
const proxies: Proxy[] = [];
let runner: Runner | null = null;
interface LogLine {
  level: number;
  time: number;
  msg: string;
  err?: { code?: string; message?: string };
  retryInMs?: number;
}
let logs: LogLine[] = [];

before(async () => {
  // The default wal_sender_timeout (60 s): a silent connection's walsender keeps the slot that long.
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'rec-pub' }), startCluster({ major: 18, name: 'rec-tgt' })]);
  await publisher.createDatabase('src');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items;`, [], 'src');
});

after(async () => {
  // A test that failed mid-way leaves its writer running; stopped before the servers.
  for (const w of writers) await w.stop().catch(() => undefined);
  runner?.stop();
  await runner?.done.catch(() => undefined);
  for (const p of proxies) await p.close();
  await publisher?.stop();
  await target?.stop();
});

/** A runner into a fresh target database (copy_data: it starts from the rows the source has). */
async function start(subscription: string, overrides: Record<string, unknown> = {}): Promise<Runner> {
  await target.createDatabase(subscription);
  await target.query(SCHEMA, [], subscription);
  logs = [];
  const config = loadConfig({
    env: {},
    overrides: { subscription, source: publisher.url('src'), target: target.url(subscription), publication: 'pub', ...overrides },
  });
  runner = startRunner(config, createLogger((process.env.REC_LEVEL ?? 'info') as 'info', { write: (line: string) => void logs.push(JSON.parse(line) as LogLine) }));
  await waitFor(() => logs.some((l) => l.msg === 'streaming started'), { timeoutMs: 30_000, what: 'streaming' });
  return runner;
}

async function stop(): Promise<void> {
  runner?.stop();
  await runner?.done;
  runner = null;
}

let nextId = 1;
/** Insert a row on the publisher; resolves when it is in the target database `db`. */
async function roundTrip(db: string, timeoutMs = 30_000): Promise<void> {
  const id = nextId++;
  await publisher.query(`INSERT INTO app.items VALUES ($1, 'row')`, [id], 'src');
  await waitFor(async () => (await target.query(`SELECT 1 FROM app.items WHERE id = $1`, [id], db)).length === 1, { timeoutMs, intervalMs: 50, what: `row ${id} in ${db}` });
}

async function assertEqual(subscription: string): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, subscription)) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
  const cmp = await compareTables(publisher, 'src', target, subscription, ['app.items']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
}

const writers = new Set<{ stop(): Promise<void> }>();
/** Writes on the publisher every few milliseconds until stopped. */
function writer(): { stop(): Promise<void> } {
  let running = true;
  const done = (async () => {
    while (running) {
      await publisher.query(`INSERT INTO app.items VALUES ($1, 'busy')`, [nextId++], 'src');
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  const w = {
    async stop() {
      running = false;
      writers.delete(w);
      await done;
    },
  };
  writers.add(w);
  return w;
}

describe('transient failures heal by themselves', () => {
  test('the target restarted five times in a row: resumed within 5 s of the server being back each time', async () => {
    // The default backoff (1 s doubling to 60 s).
    await start('rec_restart');
    await roundTrip('rec_restart');
    const resumeMs: number[] = [];
    for (let i = 0; i < 5; i++) {
      await target.restart('fast');
      const back = Date.now();
      await roundTrip('rec_restart', 60_000);
      resumeMs.push(Date.now() - back);
    }
    console.log(`resumed after each target restart in ${resumeMs.join(', ')} ms`);
    for (const ms of resumeMs) assert.ok(ms < 5000, `resume times ${resumeMs.join(', ')} ms`);
    await assertEqual('rec_restart');
    await stop();
  });

  test('SIGTERM while pgsub waits to retry: exit 0 within 2 s', async () => {
    await target.createDatabase('rec_sigterm');
    await target.query(SCHEMA, [], 'rec_sigterm');
    // The target is down from the start, and the wait between attempts long: the signal must not wait for it.
    await target.stopServer('fast');
    const p = spawnPgsub({
      PGSUB_SOURCE: publisher.url('src'),
      PGSUB_TARGET: target.url('rec_sigterm'),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: 'rec_sigterm',
      PGSUB_RETRY_MIN_DELAY: '30',
      PGSUB_RETRY_MAX_DELAY: '60',
    });
    try {
      await p.waitForLog('apply failed; retrying', 30_000);
      await new Promise((r) => setTimeout(r, 500));
      const signalled = Date.now();
      p.kill('SIGTERM');
      assert.equal(await withTimeout(p.exited, 10_000, `pgsub to exit; output:\n${p.output().slice(-2000)}`), 0);
      const exitMs = Date.now() - signalled;
      console.log(`exit ${exitMs} ms after SIGTERM during the retry wait`);
      assert.ok(exitMs < 2000, `exited ${exitMs} ms after SIGTERM`);
    } finally {
      p.kill('SIGKILL');
      await target.startServer();
    }
    // Resumed by a new process: nothing lost.
    const again = spawnPgsub({ PGSUB_SOURCE: publisher.url('src'), PGSUB_TARGET: target.url('rec_sigterm'), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: 'rec_sigterm' });
    try {
      await again.waitForLog('streaming started', 30_000);
      await roundTrip('rec_sigterm');
      await assertEqual('rec_sigterm');
      again.kill('SIGTERM');
      assert.equal(await withTimeout(again.exited, 20_000, 'pgsub to stop'), 0);
    } finally {
      again.kill('SIGKILL');
    }
  });

  test('a black-holed publisher: a new streaming connection within receive_timeout + 5 s', async () => {
    const proxy = await startProxy(publisher.port);
    proxies.push(proxy);
    const receiveTimeoutS = 5;
    await start('rec_pubhole', { source: `postgres://postgres@127.0.0.1:${proxy.port}/src`, receive_timeout: receiveTimeoutS });
    await roundTrip('rec_pubhole');
    const [holder] = await publisher.query<{ pid: number }>(`SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = 'rec_pubhole'`);
    const oldPid = holder!.pid;
    const w = writer();
    const silencedAt = Date.now();
    proxy.blackhole();
    // A walsender other than the silenced one streams from the slot again.
    await waitFor(
      async () =>
        (
          await publisher.query(
            `SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = 'rec_pubhole' AND r.pid <> $1 AND r.state = 'streaming'`,
            [oldPid],
          )
        ).length === 1,
      { timeoutMs: 60_000, intervalMs: 100, what: 'a new walsender streaming from the slot' },
    );
    const reconnectMs = Date.now() - silencedAt;
    await w.stop();
    console.log(`new streaming connection ${reconnectMs} ms after the publisher went silent (receive_timeout ${receiveTimeoutS} s)`);
    assert.ok(reconnectMs < (receiveTimeoutS + 5) * 1000, `${reconnectMs} ms`);
    await roundTrip('rec_pubhole');
    await assertEqual('rec_pubhole');
    await stop();
  });

  test('a black-holed target: noticed within target_timeout and the probe, recovered once the network heals', async () => {
    const proxy = await startProxy(target.port);
    proxies.push(proxy);
    const timeoutS = 3;
    await start('rec_tgthole', {
      target: `postgres://postgres@127.0.0.1:${proxy.port}/rec_tgthole?connect_timeout=2`,
      target_timeout: timeoutS,
      retry_min_delay: 0.5,
      retry_max_delay: 2,
    });
    await roundTrip('rec_tgthole');
    const w = writer();
    await new Promise((r) => setTimeout(r, 300));
    const silencedAt = Date.now();
    proxy.blackhole({ newConnections: true });
    await waitFor(() => logs.some((l) => l.time >= silencedAt && l.msg === 'apply failed; retrying'), {
      timeoutMs: 30_000,
      intervalMs: 50,
      what: 'pgsub to notice the silent target',
    });
    const noticed = logs.find((l) => l.time >= silencedAt && l.msg === 'apply failed; retrying')!;
    const noticedMs = noticed.time - silencedAt;
    console.log(`silent target noticed after ${noticedMs} ms: ${noticed.err?.message}`);
    assert.match(noticed.err?.message ?? '', /target_timeout/);
    // target_timeout, then at most the probe's connect_timeout (2 s), then a tick.
    assert.ok(noticedMs < (timeoutS + 2 + 1.5) * 1000, `${noticedMs} ms`);
    await new Promise((r) => setTimeout(r, 3000));
    proxy.heal();
    const healedAt = Date.now();
    await w.stop();
    try {
      await roundTrip('rec_tgthole', 30_000);
    } catch (err) {
      // What pgsub did after the network healed, for the failure's reader.
      for (const l of logs.filter((l) => l.time >= healedAt - 1000)) console.log(`${l.time - healedAt} ms: ${l.msg} ${l.err?.message ?? ''}`);
      throw err;
    }
    console.log(`applying again ${Date.now() - healedAt} ms after the network healed`);
    await assertEqual('rec_tgthole');
    await stop();
  });

  test('the target crashed while pgsub is idle: noticed at once and resumed within a few seconds', async () => {
    await start('rec_crash', { retry_min_delay: 0.5 });
    await roundTrip('rec_crash');
    await new Promise((r) => setTimeout(r, 1000));
    const crashedAt = Date.now();
    await target.restart('immediate');
    const back = Date.now();
    await waitFor(() => logs.some((l) => l.time >= crashedAt && l.msg === 'apply failed; retrying'), { timeoutMs: 30_000, what: 'pgsub to notice' });
    const noticedMs = logs.find((l) => l.time >= crashedAt && l.msg === 'apply failed; retrying')!.time - crashedAt;
    await roundTrip('rec_crash', 60_000);
    const resumedMs = Date.now() - back;
    // The attempts that failed while the target restarted each doubled the (jittered) wait:
    // once it is back, the last wait logged is all that may pass before pgsub resumes, plus a few seconds.
    const lastWaitMs = logs.filter((l) => l.time >= crashedAt && l.msg === 'apply failed; retrying').at(-1)?.retryInMs ?? 0;
    console.log(`target crash noticed after ${noticedMs} ms (restart took ${back - crashedAt} ms), resumed ${resumedMs} ms after it was back (last backoff ${lastWaitMs} ms)`);
    assert.ok(noticedMs < 3000, `noticed after ${noticedMs} ms`);
    assert.ok(resumedMs < lastWaitMs + 4000, `resumed after ${resumedMs} ms (last backoff ${lastWaitMs} ms)`);
    await assertEqual('rec_crash');
    await stop();
  });
});
