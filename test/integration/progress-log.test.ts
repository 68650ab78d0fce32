/**
 * `pgsub run`'s progress line and its final `stopped` line, from a child process
 * (PostgreSQL 18 → 18), with the line's interval shortened (PGSUB_PROGRESS_INTERVAL_MS):
 *  - while a workload streams: the state, a transaction rate that adds up to what was
 *    applied, lag in bytes and in seconds that are numbers and small, 0 s once caught up;
 *  - with the publisher unreachable: state retrying, lag unknown;
 *  - `stopped` counts the rows the initial copy brought (it said rowsCopied 0 before).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect, spawnPgsub, startCluster, stopAllClusters, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'app';
const COPIED_ROWS = 3000;
const TRANSACTIONS = 300;
const INTERVAL_MS = 400;

let publisher: Cluster;
let target: Cluster;
const children = new Set<PgsubProcess>();

function records(p: PgsubProcess, msg: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of p.output().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const rec = JSON.parse(line) as Record<string, unknown>;
      if (rec.msg === msg) out.push(rec);
    } catch {
      // an unfinished line
    }
  }
  return out;
}

function start(env: Record<string, string>): PgsubProcess {
  const p = spawnPgsub({ PGSUB_PROGRESS_INTERVAL_MS: String(INTERVAL_MS), PGSUB_STATUS_INTERVAL: '1', PGSUB_RETRY_MIN_DELAY: '0.2', PGSUB_RETRY_MAX_DELAY: '1', ...env });
  children.add(p);
  void p.exited.then(() => children.delete(p));
  return p;
}

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'progress-pub' }), startCluster({ major: 18, name: 'progress-tgt' })]);
  await Promise.all([publisher.createDatabase(DB), target.createDatabase(DB)]);
  const schema = 'CREATE TABLE public.items (id int PRIMARY KEY, v text NOT NULL);';
  await publisher.query(`${schema} INSERT INTO public.items SELECT g, 'copied' FROM generate_series(1, ${COPIED_ROWS}) g; CREATE PUBLICATION pub FOR TABLE public.items;`, [], DB);
  await target.query(schema, [], DB);
});

after(async () => {
  for (const p of children) p.kill('SIGKILL');
  await Promise.all([...children].map((p) => withTimeout(p.exited, 10_000, 'leftover pgsub').catch(() => {})));
  await stopAllClusters();
});

test('progress lines while a workload streams; stopped counts the initial copy', async () => {
  const p = start({ PGSUB_SOURCE: publisher.url(DB), PGSUB_TARGET: target.url(DB), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: 'prog' });
  await p.waitForLog('initial copy finished');
  await p.waitForLog('streaming started');
  const before = records(p, 'progress').length;

  // A workload spread over a few seconds, so several lines fall inside it.
  const db = await connect(publisher, DB);
  const startedAt = Date.now();
  try {
    for (let i = 1; i <= TRANSACTIONS; i++) {
      await db.query('INSERT INTO public.items VALUES ($1, $2)', [COPIED_ROWS + i, 'streamed']);
      if (i % 30 === 0) await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    await db.end();
  }
  const workloadSeconds = (Date.now() - startedAt) / 1000;
  await waitForCatchUp(publisher, DB, 'prog');
  // Two more lines after the catch-up: the last one sees everything applied.
  const caughtUpAt = records(p, 'progress').length;
  await waitFor(() => records(p, 'progress').length >= caughtUpAt + 2, { timeoutMs: 10_000, what: 'lines after the catch-up' });

  const lines = records(p, 'progress').slice(before);
  assert.ok(lines.length >= 4, `several lines during ${workloadSeconds.toFixed(1)} s of workload: ${lines.length}`);
  for (const l of lines) {
    assert.equal(l.level, 30, 'info');
    assert.ok(['copying', 'catching up', 'streaming', 'retrying'].includes(String(l.state)), `state ${l.state}`);
    assert.equal(typeof l.tx_per_second, 'number');
    assert.ok((l.tx_per_second as number) >= 0 && (l.tx_per_second as number) < 100_000, `rate ${l.tx_per_second}`);
    // Known while a session streams; unknown without one (between sessions, or while the
    // initial copy runs before the first), which the state then says.
    const detail = `${JSON.stringify(l)}\n${p
      .output()
      .split('\n')
      .filter((x) => !x.includes('"progress"'))
      .join('\n')
      .slice(-3000)}`;
    if (l.lag_bytes === null) assert.ok(l.state === 'retrying' || l.state === 'copying', detail);
    else assert.equal(typeof l.lag_bytes, 'number', detail);
    if (l.lag_bytes !== null) assert.ok((l.lag_bytes as number) >= 0 && (l.lag_bytes as number) < 64 * 1024 * 1024, `lag_bytes ${l.lag_bytes}`);
    if (l.lag_seconds !== null) assert.ok((l.lag_seconds as number) >= 0 && (l.lag_seconds as number) < 60, `lag_seconds ${l.lag_seconds}`);
    if (l.lag_bytes !== null) assert.match(String(l.received_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
    if (l.lag_bytes !== null) assert.match(String(l.flushed_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
  }
  assert.ok(lines.filter((l) => l.lag_bytes !== null).length >= lines.length - 1, 'a session streamed through the workload');
  // The rates, times the interval, add up to the transactions applied (the intervals are
  // timer ticks, so allow their jitter).
  const rated = lines.reduce((sum, l) => sum + (l.tx_per_second as number) * (INTERVAL_MS / 1000), 0);
  assert.ok(Math.abs(rated - TRANSACTIONS) <= TRANSACTIONS * 0.25, `rates add up to ${rated.toFixed(0)}, applied ${TRANSACTIONS}`);
  assert.ok(
    lines.some((l) => (l.tx_per_second as number) > 0),
    'a line saw transactions applied',
  );
  assert.equal(lines.at(-1)!.transactions_applied, TRANSACTIONS);
  const last = lines.at(-1)!;
  assert.equal(last.state, 'streaming');
  assert.equal(last.tx_per_second, 0);
  assert.equal(last.lag_seconds, 0, 'caught up: no lag');
  assert.ok((last.lag_bytes as number) < 1024 * 1024, `lag_bytes ${last.lag_bytes}`);
  // At least one line while behind knew how far behind in seconds.
  const timed = lines.filter((l) => typeof l.lag_seconds === 'number');
  assert.ok(timed.length > 0);

  p.kill('SIGTERM');
  assert.equal(await withTimeout(p.exited, 20_000, 'pgsub to stop'), 0, p.output().slice(-3000));
  const [stopped] = records(p, 'stopped');
  assert.ok(stopped, 'a stopped line');
  assert.deepEqual(stopped.tableSync, { tables: 1, rows: COPIED_ROWS, bytes: (stopped.tableSync as { bytes: number }).bytes });
  assert.ok((stopped.tableSync as { bytes: number }).bytes > COPIED_ROWS * 5, 'bytes copied');
  const counters = stopped.counters as { rowsCopied: number; transactionsApplied: number };
  assert.ok(counters.rowsCopied >= COPIED_ROWS, `rowsCopied ${counters.rowsCopied} counts the initial copy`);
  assert.equal(counters.transactionsApplied, TRANSACTIONS);
});

test('with the publisher unreachable: state retrying, lag unknown', async () => {
  const p = start({ PGSUB_SOURCE: 'postgresql://postgres@127.0.0.1:1/app', PGSUB_TARGET: target.url(DB), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: 'prog_down' });
  await waitFor(() => records(p, 'progress').length >= 2, { timeoutMs: 20_000, what: 'two progress lines' });
  const l = records(p, 'progress').at(-1)!;
  assert.equal(l.state, 'retrying');
  assert.equal(l.lag_bytes, null);
  assert.equal(l.tx_per_second, 0);
  assert.ok(records(p, 'apply failed; retrying').length > 0);
  p.kill('SIGTERM');
  assert.equal(await withTimeout(p.exited, 20_000, 'pgsub to stop'), 0);
  const [stopped] = records(p, 'stopped');
  assert.deepEqual(stopped?.tableSync, { tables: 0, rows: 0, bytes: 0 });
});
