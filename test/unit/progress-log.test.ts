/**
 * The service's progress line (service/progress-log.ts) without servers: which state it
 * reports, the interval override tests use, the rate since the previous line, the lag in
 * bytes from the session's positions, 0 s of lag once everything received is flushed, and
 * the rows of finished copies counted for the `stopped` line.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { Writable } from 'node:stream';
import { newCounters } from '../../src/apply/txn/apply-state.js';
import { Progress } from '../../src/origin/positions.js';
import type { Lsn } from '../../src/protocol/lsn.js';
import { SyncStates } from '../../src/origin/sync-state.js';
import type { SessionHandle } from '../../src/service/session.js';
import { CATCHING_UP_BYTES, DEFAULT_PROGRESS_INTERVAL_MS, ProgressLog, progressIntervalMs, runState } from '../../src/service/progress-log.js';

const lsn = (n: number) => BigInt(n) as Lsn;

function capture(): { log: pino.Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const l of chunk.toString('utf8').split('\n').filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
      done();
    },
  });
  return { log: pino({ level: 'info' }, sink), lines };
}

test('state: copying before everything, retrying without a session, catching up when behind, else streaming', () => {
  assert.equal(runState({ copying: true, session: false, tablesCatchingUp: false, lagBytes: null }), 'copying');
  assert.equal(runState({ copying: true, session: true, tablesCatchingUp: true, lagBytes: 10 }), 'copying');
  assert.equal(runState({ copying: false, session: false, tablesCatchingUp: false, lagBytes: null }), 'retrying');
  assert.equal(runState({ copying: false, session: true, tablesCatchingUp: true, lagBytes: 0 }), 'catching up');
  assert.equal(runState({ copying: false, session: true, tablesCatchingUp: false, lagBytes: CATCHING_UP_BYTES + 1 }), 'catching up');
  assert.equal(runState({ copying: false, session: true, tablesCatchingUp: false, lagBytes: CATCHING_UP_BYTES }), 'streaming');
  assert.equal(runState({ copying: false, session: true, tablesCatchingUp: false, lagBytes: null }), 'streaming');
});

test('interval: 30 s unless PGSUB_PROGRESS_INTERVAL_MS says otherwise', () => {
  assert.equal(DEFAULT_PROGRESS_INTERVAL_MS, 30_000);
  assert.equal(progressIntervalMs({}), 30_000);
  assert.equal(progressIntervalMs({ PGSUB_PROGRESS_INTERVAL_MS: '500' }), 500);
  assert.equal(progressIntervalMs({ PGSUB_PROGRESS_INTERVAL_MS: 'soon' }), 30_000);
  assert.equal(progressIntervalMs({ PGSUB_PROGRESS_INTERVAL_MS: '0' }), 30_000);
});

test('a line: rate since the previous line, lag from the session positions, counts of finished copies', async () => {
  // Nothing listens on port 1: the lag in seconds, read from the target, is then unknown.
  const counters = newCounters();
  const sync = new SyncStates();
  const progress = new Progress(lsn(1000));
  let session: SessionHandle | null = null;
  const { log, lines } = capture();
  const p = new ProgressLog(log, { counters, sync, session: () => session, copyRunning: () => false }, 60_000);

  await p.tick(Date.now());
  assert.equal(lines.length, 1);
  assert.equal(lines[0]!.msg, 'progress');
  assert.equal(lines[0]!.level, 30);
  assert.equal(lines[0]!.state, 'retrying');
  assert.equal(lines[0]!.lag_bytes, null);

  session = { progress } as unknown as SessionHandle;
  const t0 = Date.now();
  await p.tick(t0);
  counters.transactionsApplied += 50;
  progress.noteReceived(lsn(1000 + 4096));
  progress.noteDurable(lsn(1000 + 1096));
  await p.tick(t0 + 10_000);
  const behind = lines[2]!;
  assert.equal(behind.state, 'streaming');
  assert.equal(behind.tx_per_second, 5);
  assert.equal(behind.transactions_applied, 50);
  assert.equal(behind.lag_bytes, 3000);
  assert.equal(behind.lag_seconds, null, 'target unreachable: unknown, and the line still goes out');
  assert.equal(behind.received_lsn, '0/13E8');

  progress.noteDurable(lsn(1000 + 4096));
  await p.tick(t0 + 20_000);
  assert.equal(lines[3]!.tx_per_second, 0);
  assert.equal(lines[3]!.lag_bytes, 0);
  assert.equal(lines[3]!.lag_seconds, 0, 'nothing left to apply: no lag, whatever the age of the last commit');

  p.copyFinished({ schema: 's', table: 'a', rows: 100, bytes: 4000, estimatedBytes: 0, startedAt: 0, finishedAt: 1, syncLsn: null });
  p.copyFinished({ schema: 's', table: 'a', rows: 7, bytes: 300, estimatedBytes: 0, startedAt: 0, finishedAt: 1, syncLsn: null });
  p.copyFinished(undefined);
  assert.deepEqual(p.copiedTotals(), { tables: 2, rows: 107, bytes: 4300 });
});
