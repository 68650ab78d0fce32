/**
 * The streamed-transaction spool on its own: records come back in order, a
 * subtransaction abort takes back exactly its records and those after it, appends after
 * a truncation land right after it (no hole), whole aborts and discards delete files,
 * prepare() removes a previous run's files of this subscription only.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { StreamSpool } from '../../src/apply/txn/spool.js';

function tmp(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-spool-unit-'));
}

async function replayed(spool: StreamSpool, xid: number): Promise<string[]> {
  const out: string[] = [];
  for await (const records of spool.replay(xid)) for (const r of records) out.push(r.toString());
  return out;
}

test('records replay in order across segments and write-buffer flushes', async () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(7, true);
  const many = Array.from({ length: 5000 }, (_, i) => `record ${i} ${'x'.repeat(i % 300)}`);
  for (const m of many.slice(0, 2500)) spool.append(7, 7, Buffer.from(m));
  spool.stop(7);
  spool.start(7, false);
  for (const m of many.slice(2500)) spool.append(7, 7, Buffer.from(m));
  spool.stop(7);
  assert.deepEqual(await replayed(spool, 7), many);
});

test('records larger than the write buffer, between small ones; a reused source buffer does not change what was spooled', async () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(8, true);
  const frame = Buffer.alloc(64);
  const want: string[] = [];
  for (let i = 0; i < 40; i++) {
    // A view into one frame buffer, overwritten right after each append (as the loop's frames are).
    const text = `small ${i}`;
    const n = frame.write(text);
    spool.append(8, 8, frame.subarray(0, n));
    frame.fill(0x21);
    want.push(text);
    if (i % 10 === 3) {
      const big = `big ${i} ${'y'.repeat(300 * 1024 + i)}`;
      spool.append(8, 8, Buffer.from(big));
      want.push(big);
    }
  }
  spool.stop(8);
  assert.deepEqual(await replayed(spool, 8), want);
  assert.equal(
    spool.bytes,
    want.reduce((n, w) => n + 4 + Buffer.byteLength(w), 0),
  );
});

test('records split between reads (1 MB each) at every kind of place: inside a header, inside a body, over three reads', async () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(9, true);
  const MB = 1 << 20;
  const body = (n: number, c: string) => c.repeat(n);
  // Record 1 ends 2 bytes before the first 1 MB boundary: record 2's header is split 2 + 2.
  const want = [body(MB - 4 - 2, 'a'), body(10, 'b'), body(2 * MB + 5, 'c'), body(3, 'd')];
  // Then one ending exactly at a boundary, and one whose header starts 1 byte before the next.
  let size = want.reduce((n, w) => n + 4 + w.length, 0);
  const toBoundary = (k: number) => (Math.ceil(size / MB) * MB - size + k * MB) % MB;
  const exact = body(toBoundary(0) - 4 + MB, 'e');
  want.push(exact);
  size += 4 + exact.length;
  const oneShort = body(toBoundary(0) - 4 - 1 + MB, 'f');
  want.push(oneShort, body(7, 'g'));
  for (const w of want) spool.append(9, 9, Buffer.from(w));
  spool.stop(9);
  const got = await replayed(spool, 9);
  assert.deepEqual(
    got.map((g) => [g.length, g[0]]),
    want.map((w) => [w.length, w[0]]),
  );
  assert.deepEqual(got, want);
});

test('subtransaction abort truncates its records and later ones; later appends follow without a hole', async () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(1, true);
  spool.append(1, 1, Buffer.from('top a'));
  spool.append(1, 2, Buffer.from('sub2 a'));
  spool.append(1, 3, Buffer.from('sub3 a'));
  spool.append(1, 2, Buffer.from('sub2 b'));
  spool.abort(1, 3); // sub3's first record and everything after it go (sub2 b was written after it)
  assert.deepEqual(await replayed(spool, 1), ['top a', 'sub2 a']);
  spool.append(1, 4, Buffer.from('sub4 a'));
  spool.abort(1, 99); // a subtransaction with no records: nothing changes
  spool.append(1, 1, Buffer.from('top b'));
  assert.deepEqual(await replayed(spool, 1), ['top a', 'sub2 a', 'sub4 a', 'top b']);
  spool.abort(1, 2);
  spool.append(1, 1, Buffer.from('top c'));
  assert.deepEqual(await replayed(spool, 1), ['top a', 'top c']);
});

test("whole-transaction abort and discard delete the file; prepare removes only this subscription's orphans", () => {
  const dir = tmp();
  fs.writeFileSync(path.join(dir, 'sub-42.changes'), 'orphan');
  fs.writeFileSync(path.join(dir, 'other-42.changes'), 'not ours');
  const spool = new StreamSpool(dir, 'sub');
  assert.equal(spool.prepare(), 1);
  assert.deepEqual(fs.readdirSync(dir), ['other-42.changes']);
  spool.start(5, true);
  spool.append(5, 5, Buffer.from('x'));
  assert.ok(spool.bytes > 0);
  spool.abort(5, 5);
  assert.deepEqual(fs.readdirSync(dir), ['other-42.changes']);
  spool.start(6, true);
  spool.discard(6);
  assert.equal(spool.bytes, 0);
  assert.deepEqual(fs.readdirSync(dir), ['other-42.changes']);
});

test('a later segment for a transaction with no file is a protocol error', () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  assert.throws(
    () => spool.start(9, false),
    (e: Error & { code?: string }) => e.code === 'PGSUB_PROTOCOL_OUT_OF_ORDER',
  );
});

test('readFrom: whole records as far as they reached the file, from an offset, across a cut and a record longer than a read', () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(9, true);
  const read: string[] = [];
  let offset = 0;
  const readAll = () => {
    for (;;) {
      const { records, next } = spool.readFrom(9, offset);
      if (records.length === 0) return;
      for (const r of records) read.push(r.toString());
      offset = next;
    }
  };
  // Buffered, not yet in the file: nothing to read; append reports a flush only when the file grows.
  assert.equal(spool.append(9, 9, Buffer.from('a0')), false);
  readAll();
  assert.deepEqual(read, []);
  spool.stop(9);
  readAll();
  assert.deepEqual(read, ['a0']);
  // Enough to flush the write buffer several times: append says so, readFrom sees the flushed part.
  const many = Array.from({ length: 3000 }, (_, i) => `b${i} ${'z'.repeat(200)}`);
  let flushes = 0;
  for (const m of many) if (spool.append(9, 9, Buffer.from(m))) flushes++;
  assert.ok(flushes >= 2, `flushes: ${flushes}`);
  readAll();
  assert.ok(read.length > 1 && read.length < 3001, `read ${read.length} before STREAM STOP`);
  assert.equal(offset, spool.writtenOf(9));
  spool.stop(9);
  readAll();
  assert.deepEqual(read, ['a0', ...many]);
  // A subtransaction cut: the reader moves to the cut, and reads what follows it.
  spool.append(9, 10, Buffer.from('sub 10'));
  spool.stop(9);
  const cut = spool.abortOffset(9, 10)!;
  assert.equal(cut, offset);
  spool.abort(9, 10);
  spool.append(9, 9, Buffer.from('after cut'));
  // Longer than one read (1 MB): returned whole.
  const big = `big ${'q'.repeat(1.5 * 1024 * 1024)}`;
  spool.append(9, 9, Buffer.from(big));
  spool.stop(9);
  readAll();
  assert.deepEqual(read.slice(-2), ['after cut', big]);
  assert.equal(offset, spool.writtenOf(9));
  assert.equal(spool.abortOffset(9, 10), undefined);
  spool.close();
});
