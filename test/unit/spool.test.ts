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
import { StreamSpool } from '../../src/apply/spool.js';

function tmp(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-spool-unit-'));
}

async function replayed(spool: StreamSpool, xid: number): Promise<string[]> {
  const out: string[] = [];
  for await (const r of spool.replay(xid)) out.push(r.toString());
  return out;
}

test('records replay in order across segments and write-buffer flushes', async () => {
  const spool = new StreamSpool(tmp(), 'sub');
  spool.prepare();
  spool.start(7, true);
  const many = Array.from({ length: 5000 }, (_, i) => `record ${i} ${'x'.repeat(i % 300)}`);
  many.slice(0, 2500).forEach((m) => spool.append(7, 7, Buffer.from(m)));
  spool.stop(7);
  spool.start(7, false);
  many.slice(2500).forEach((m) => spool.append(7, 7, Buffer.from(m)));
  spool.stop(7);
  assert.deepEqual(await replayed(spool, 7), many);
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

test('whole-transaction abort and discard delete the file; prepare removes only this subscription\'s orphans', () => {
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
  assert.throws(() => spool.start(9, false), (e: Error & { code?: string }) => e.code === 'PGSUB_PROTOCOL_OUT_OF_ORDER');
});
