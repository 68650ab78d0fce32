/**
 * The conflict replay's message log (src/apply/run/conflict-replay.ts MessageLog): it keeps
 * where each message's bytes lie instead of the message's view, and gives back views with
 * the same bytes — across growth, release, the shift that frees its front, and a reset.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MessageLog } from '../../src/apply/run/conflict-replay.js';

/** Messages cut out of socket-like chunks, as the receiver does (views, several per chunk). */
function messages(count: number): Buffer[] {
  const out: Buffer[] = [];
  for (let c = 0; out.length < count; c++) {
    const chunk = Buffer.alloc(1000);
    for (let at = 0; at + 10 <= chunk.length && out.length < count; at += 10) {
      const m = chunk.subarray(at, at + 10);
      m.writeUInt32BE(out.length, 0);
      m.writeUInt32BE(c, 4);
      out.push(m);
    }
  }
  return out;
}

test('views have the bytes of the messages pushed, past the growth of the log', () => {
  const log = new MessageLog();
  const ms = messages(10_000);
  for (const m of ms) log.push(m);
  assert.equal(log.end, 10_000);
  const back = log.views(0, 10_000);
  assert.equal(back.length, 10_000);
  for (let i = 0; i < ms.length; i += 997) assert.ok(back[i]!.equals(ms[i]!), `message ${i}`);
  assert.ok(log.views(9_990, 10).every((v, i) => v.readUInt32BE(0) === 9_990 + i));
});

test('release counts the bytes once and lets go of them; shift moves the rest down; reset empties', () => {
  const log = new MessageLog();
  const ms = messages(300);
  for (const m of ms) log.push(m);
  assert.equal(log.release(0, 100), 1000);
  assert.equal(log.release(50, 100), 500, 'slots 50-99 were released already');
  log.shift(150);
  assert.equal(log.end, 150);
  const rest = log.views(0, 150);
  assert.ok(rest.every((v, i) => v.readUInt32BE(0) === 150 + i));
  log.push(ms[0]!);
  assert.equal(log.end, 151);
  assert.equal(log.views(150, 1)[0]!.readUInt32BE(0), 0);
  log.reset();
  assert.equal(log.end, 0);
  log.push(ms[7]!);
  assert.equal(log.views(0, 1)[0]!.readUInt32BE(0), 7);
});
