/**
 * CopyBoth replication framing: 'w' XLogData and 'k' keepalive in, 'r' standby status out.
 * Byte layouts from the "Streaming Replication Protocol" documentation page.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ProtocolError, type ProtocolErrorCode } from '../../src/errors.js';
import { decode } from '../../src/protocol/decoder.js';
import { encodeStandbyStatus, parseReplicationFrame, STANDBY_STATUS_SIZE } from '../../src/protocol/framing.js';
import { parseLsn, type Lsn } from '../../src/protocol/lsn.js';
import type { DecodeContext } from '../../src/protocol/messages.js';

function throwsCode(fn: () => unknown, code: ProtocolErrorCode, message?: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${String(e)}`);
    assert.equal(e.code, code, e.message);
    if (message) assert.match(e.message, message);
    return true;
  });
}

function u64(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt.asUintN(64, v));
  return b;
}

function xlogData(walStart: bigint, walEnd: bigint, sendTime: bigint, data: Buffer): Buffer {
  return Buffer.concat([Buffer.from('w'), u64(walStart), u64(walEnd), u64(sendTime), data]);
}

function keepalive(walEnd: bigint, sendTime: bigint, reply: number): Buffer {
  return Buffer.concat([Buffer.from('k'), u64(walEnd), u64(sendTime), Buffer.from([reply])]);
}

const FIXTURE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/pgoutput');
const fixtures = fs
  .readdirSync(FIXTURE_DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => JSON.parse(fs.readFileSync(path.join(FIXTURE_DIR, f), 'utf8')) as { name: string; hex: string; ctx: DecodeContext });

describe("'w' XLogData", () => {
  test('fields and data', () => {
    const data = Buffer.from('42000000000183fea8', 'hex');
    const frame = xlogData(0x16b374d848n, 0x16b374d900n, 764_525_296_789_012n, data);
    const f = parseReplicationFrame(frame);
    assert.equal(f.kind, 'xlogData');
    if (f.kind !== 'xlogData') return;
    assert.equal(f.walStart, parseLsn('16/B374D848'));
    assert.equal(f.walEnd, parseLsn('16/B374D900'));
    assert.equal(f.sendTime, 764_525_296_789_012n);
    assert.deepEqual(f.data, data);
  });

  test('data is a view into the frame (documented), starting at byte 25', () => {
    const frame = xlogData(1n, 2n, 3n, Buffer.from([0x45]));
    const f = parseReplicationFrame(frame);
    assert.ok(f.kind === 'xlogData');
    assert.equal(f.data.buffer, frame.buffer);
    assert.equal(f.data.byteOffset, frame.byteOffset + 25);
    frame[25] = 0x99;
    assert.equal(f.data[0], 0x99);
  });

  test('empty data is allowed', () => {
    const f = parseReplicationFrame(xlogData(0n, 0n, 0n, Buffer.alloc(0)));
    assert.ok(f.kind === 'xlogData');
    assert.equal(f.data.length, 0);
  });

  test('negative send time (clock before 2000) is signed', () => {
    const f = parseReplicationFrame(xlogData(1n, 1n, -5n, Buffer.alloc(0)));
    assert.equal(f.sendTime, -5n);
  });

  test('LSNs use all 64 bits unsigned', () => {
    const f = parseReplicationFrame(xlogData(0xffff_ffff_ffff_fff0n, 0xffff_ffff_ffff_ffffn, 0n, Buffer.alloc(0)));
    assert.ok(f.kind === 'xlogData');
    assert.equal(f.walStart, 0xffff_ffff_ffff_fff0n);
    assert.equal(f.walEnd, 0xffff_ffff_ffff_ffffn);
  });

  test('every captured pgoutput message survives wrapping and decodes from the frame view', () => {
    for (const fx of fixtures) {
      const msg = Buffer.from(fx.hex, 'hex');
      const f = parseReplicationFrame(xlogData(100n, 200n, 300n, msg));
      assert.ok(f.kind === 'xlogData');
      assert.deepStrictEqual(decode(f.data, fx.ctx), decode(msg, fx.ctx), fx.name);
    }
  });

  test('truncated header: every prefix shorter than 25 bytes', () => {
    const frame = xlogData(1n, 2n, 3n, Buffer.from('abc'));
    for (let len = 0; len < 25; len++) throwsCode(() => parseReplicationFrame(frame.subarray(0, len)), 'PGSUB_PROTOCOL_TRUNCATED');
    throwsCode(() => parseReplicationFrame(frame.subarray(0, 10)), 'PGSUB_PROTOCOL_TRUNCATED', /XLogData walEnd: need 8 byte\(s\) at offset 9/);
  });
});

describe("'k' keepalive", () => {
  test('fields, reply requested', () => {
    const f = parseReplicationFrame(keepalive(0x1_0abc_def0n, 123_456n, 1));
    assert.deepEqual(f, { kind: 'keepalive', walEnd: parseLsn('1/ABCDEF0'), sendTime: 123_456n, replyRequested: true });
  });

  test('reply not requested', () => {
    const f = parseReplicationFrame(keepalive(5n, 6n, 0));
    assert.ok(f.kind === 'keepalive');
    assert.equal(f.replyRequested, false);
  });

  test('truncated: every proper prefix', () => {
    const frame = keepalive(5n, 6n, 1);
    assert.equal(frame.length, 18);
    for (let len = 0; len < frame.length; len++) throwsCode(() => parseReplicationFrame(frame.subarray(0, len)), 'PGSUB_PROTOCOL_TRUNCATED');
    throwsCode(() => parseReplicationFrame(frame.subarray(0, 17)), 'PGSUB_PROTOCOL_TRUNCATED', /keepalive replyRequested: need 1 byte\(s\) at offset 17/);
  });

  test('trailing bytes', () => {
    throwsCode(() => parseReplicationFrame(Buffer.concat([keepalive(5n, 6n, 1), Buffer.from([0])])), 'PGSUB_PROTOCOL_TRAILING_BYTES');
  });
});

describe('unknown frame tag', () => {
  for (const tag of ['r', 'B', 'x', '\0']) {
    test(JSON.stringify(tag), () => {
      const code = tag.charCodeAt(0).toString(16).padStart(2, '0');
      throwsCode(() => parseReplicationFrame(Buffer.from(`${tag}0000000000000000`)), 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE', new RegExp(`0x${code}`));
    });
  }
});

describe("'r' standby status update", () => {
  test('byte layout', () => {
    const out = encodeStandbyStatus({
      written: parseLsn('16/B374D848'),
      flushed: parseLsn('16/B374D800'),
      applied: parseLsn('1/2'),
      clientTime: 0x0102_0304_0506_0708n,
      replyRequested: true,
    });
    assert.equal(out.length, STANDBY_STATUS_SIZE);
    assert.equal(out.length, 34);
    assert.equal(
      out.toString('hex'),
      [
        '72', //                  'r'
        '00000016b374d848', //   written
        '00000016b374d800', //   flushed
        '0000000100000002', //   applied
        '0102030405060708', //   client time
        '01', //                  reply requested
      ].join(''),
    );
  });

  test('reply flag defaults to 0; times before 2000 are negative', () => {
    const out = encodeStandbyStatus({ written: 1n as Lsn, flushed: 1n as Lsn, applied: 0n as Lsn, clientTime: -1n });
    assert.equal(out[33], 0);
    assert.equal(out.subarray(25, 33).toString('hex'), 'ffffffffffffffff');
  });

  test('maximum LSN', () => {
    const max = 0xffff_ffff_ffff_ffffn as Lsn;
    const out = encodeStandbyStatus({ written: max, flushed: max, applied: max, clientTime: 0n, replyRequested: false });
    assert.equal(out.subarray(1, 25).toString('hex'), 'ff'.repeat(24));
  });
});
