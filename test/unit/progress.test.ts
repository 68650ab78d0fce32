/**
 * origin/positions.ts without a server: feedback reports only what the target has flushed.
 * An asynchronous commit (synchronous_commit = off) is durable for the apply decisions at
 * once but reported as flushed only when the target's WAL flush passes its local LSN; a
 * synchronous commit flushes every earlier one; a syncing table's hold caps the report.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Progress } from '../../src/origin/positions.js';
import { asLsn } from '../../src/protocol/lsn.js';

const L = (n: number) => asLsn(BigInt(n));

test('asynchronous commits are reported as flushed only after the target WAL flush passes them', () => {
  const p = new Progress(L(100));
  p.noteReceived(L(500));
  p.noteCommittedAsync(L(200), L(9000));
  p.noteCommittedAsync(L(300), L(9500));
  assert.equal(p.durable, 300n);
  assert.equal(p.hasUnflushed, true);
  assert.deepEqual(p.standbyStatus(), { written: 500n, flushed: 100n, applied: 100n });
  assert.equal(p.noteTargetFlush(L(8999)), false);
  assert.equal(p.standbyStatus().flushed, 100n);
  assert.equal(p.noteTargetFlush(L(9000)), true);
  assert.equal(p.standbyStatus().flushed, 200n);
  assert.equal(p.noteTargetFlush(L(10000)), true);
  assert.equal(p.standbyStatus().flushed, 300n);
  assert.equal(p.hasUnflushed, false);
});

test('a synchronous commit flushes every earlier asynchronous one with it', () => {
  const p = new Progress(L(100));
  p.noteCommittedAsync(L(200), L(9000));
  p.noteDurable(L(250));
  assert.equal(p.hasUnflushed, false);
  assert.equal(p.standbyStatus().flushed, 250n);
});

test('a table still syncing holds the reported position back', () => {
  const p = new Progress(L(100));
  p.noteDurable(L(400));
  assert.equal(p.standbyStatus(L(150)).flushed, 150n);
  assert.equal(p.standbyStatus(null).flushed, 400n);
});
