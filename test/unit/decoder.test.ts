/**
 * pgoutput decoder: table-driven over fixtures captured from real PostgreSQL 14 and 18 servers
 * (scripts/capture-fixtures.ts), plus the error paths proto.c guards against.
 *
 * Fixture encoding: LSN fields are "X/Y" text, timestamps decimal strings with an "n" suffix,
 * Buffers { "$hex": "…" }; `revive` below turns them back into Lsn / bigint / Buffer.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ProtocolError, type ProtocolErrorCode } from '../../src/errors.js';
import { decode } from '../../src/protocol/decoder.js';
import { parseLsn } from '../../src/protocol/lsn.js';
import { peekStreamXid } from '../../src/protocol/peek.js';
import type { DecodeContext, MessageTag, PgOutputMessage } from '../../src/protocol/messages.js';

const FIXTURE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/pgoutput');

const LSN_KEYS = new Set(['finalLsn', 'commitLsn', 'endLsn', 'originLsn', 'lsn', 'abortLsn', 'prepareLsn', 'prepareEndLsn', 'rollbackEndLsn']);
const TIME_KEYS = new Set(['commitTime', 'abortTime', 'prepareTime', 'rollbackTime']);

function revive(key: string, value: unknown): unknown {
  if (typeof value === 'string') {
    if (LSN_KEYS.has(key)) return parseLsn(value);
    if (TIME_KEYS.has(key)) {
      assert.match(value, /^-?\d+n$/, `bad bigint encoding for ${key}`);
      return BigInt(value.slice(0, -1));
    }
  }
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    const keys = Object.keys(value);
    if (keys.length === 1 && keys[0] === '$hex') return Buffer.from((value as { $hex: string }).$hex, 'hex');
  }
  return value;
}

interface Fixture {
  name: string;
  server: string;
  protoVersion: number;
  ctx: DecodeContext;
  description: string;
  hex: string;
  expected: PgOutputMessage;
}

const fixtures: Fixture[] = fs
  .readdirSync(FIXTURE_DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => JSON.parse(fs.readFileSync(path.join(FIXTURE_DIR, f), 'utf8'), revive) as Fixture);

const bytes = (f: Fixture) => Buffer.from(f.hex, 'hex');
const byTag = (tag: MessageTag) => fixtures.filter((f) => f.expected.tag === tag);
const first = (tag: MessageTag, pred: (f: Fixture) => boolean = () => true): Fixture => {
  const f = byTag(tag).find(pred);
  assert.ok(f, `no ${tag} fixture`);
  return f;
};

function throwsCode(fn: () => unknown, codes: ProtocolErrorCode | ProtocolErrorCode[], message?: RegExp): ProtocolError {
  const allowed = Array.isArray(codes) ? codes : [codes];
  try {
    fn();
  } catch (e) {
    if (!(e instanceof ProtocolError)) throw new assert.AssertionError({ message: `expected ProtocolError, got ${String(e)}` });
    assert.ok(allowed.includes(e.code), `expected ${allowed.join('|')}, got ${e.code}: ${e.message}`);
    assert.equal(e.retryable, false);
    if (message) assert.match(e.message, message);
    return e;
  }
  throw new assert.AssertionError({ message: `expected ${allowed.join('|')}, nothing thrown` });
}

const ALL_TAGS: MessageTag[] = [
  'begin',
  'commit',
  'origin',
  'relation',
  'type',
  'insert',
  'update',
  'delete',
  'truncate',
  'message',
  'streamStart',
  'streamStop',
  'streamCommit',
  'streamAbort',
  'beginPrepare',
  'prepare',
  'commitPrepared',
  'rollbackPrepared',
  'streamPrepare',
];
const XID_PREFIXED = new Set<MessageTag>(['relation', 'type', 'insert', 'update', 'delete', 'truncate', 'message']);

describe('fixtures', () => {
  test('cover every message of protocol v1–v4 from both servers', () => {
    assert.ok(fixtures.length >= 80, `only ${fixtures.length} fixtures`);
    for (const tag of ALL_TAGS) assert.ok(byTag(tag).length > 0, `no fixture for ${tag}`);
    assert.ok(fixtures.some((f) => f.server.startsWith('PostgreSQL 14')));
    assert.ok(fixtures.some((f) => f.server.startsWith('PostgreSQL 18')));
    const kinds = new Set(
      fixtures.flatMap((f) => {
        const m = f.expected;
        const tuples = m.tag === 'insert' ? [m.newTuple] : m.tag === 'update' ? [m.newTuple, m.oldTuple ?? []] : m.tag === 'delete' ? [m.oldTuple] : [];
        return tuples.flat().map((v) => v.kind);
      }),
    );
    assert.deepEqual([...kinds].sort(), ['binary', 'null', 'text', 'unchanged']);
    const identities = new Set(byTag('relation').map((f) => (f.expected as Extract<PgOutputMessage, { tag: 'relation' }>).replicaIdentity));
    assert.deepEqual([...identities].sort(), ['default', 'full', 'index', 'nothing']);
  });
});

describe('decode: captured messages', () => {
  for (const f of fixtures) {
    test(f.name, () => {
      assert.deepStrictEqual(decode(bytes(f), f.ctx), f.expected);
    });
  }
});

describe("peekStreamXid: the xid the leader spools a stream block's row change under, without decoding it", () => {
  const rowChanges = fixtures.filter((f) => f.ctx.inStream && (f.expected.tag === 'insert' || f.expected.tag === 'update' || f.expected.tag === 'delete'));
  // Captured ones are inserts; Update and Delete carry the xid at the same place (after the tag).
  test('there are streamed row changes of both versions, top-level and in subtransactions', () => assert.ok(rowChanges.length >= 6, rowChanges.map((f) => f.name).join(', ')));
  for (const f of rowChanges) {
    test(f.name, () => assert.equal(peekStreamXid(bytes(f)), (f.expected as { xid?: number }).xid));
  }
  test('cut short: -1', () => assert.equal(peekStreamXid(Buffer.from([0x49, 0, 0, 2])), -1));
});

describe('decode: binary values are views into the input; other output does not alias it', () => {
  // Binary tuple values are subarrays of the message (no copy per value; the apply path
  // never writes into them). Everything else — strings, MESSAGE content — is independent.
  const binaryValues = (m: PgOutputMessage) => (m.tag === 'insert' || m.tag === 'update' ? m.newTuple.flatMap((v) => (v.kind === 'binary' ? [v.value] : [])) : []);
  const withBinary = fixtures.filter((x) => binaryValues(x.expected).length > 0);
  const withContent = fixtures.filter((x) => x.expected.tag === 'message');
  test('there are fixtures with binary values and message contents', () => assert.ok(withBinary.length >= 3 && withContent.length >= 1));
  for (const f of withBinary) {
    test(`${f.name}: values share the input's memory`, () => {
      const buf = bytes(f);
      const values = binaryValues(decode(buf, f.ctx));
      for (const v of values) assert.equal(v.buffer, buf.buffer);
    });
  }
  for (const f of withContent) {
    test(`${f.name}: content survives reuse of the input`, () => {
      const buf = bytes(f);
      const m = decode(buf, f.ctx);
      buf.fill(0xaa);
      assert.deepStrictEqual(m, f.expected);
    });
  }
});

describe('decode: truncation', () => {
  test('every proper prefix of every fixture throws TRUNCATED or BAD_FIELD', () => {
    let n = 0;
    for (const f of fixtures) {
      const buf = bytes(f);
      for (let len = 0; len < buf.length; len++) {
        throwsCode(() => decode(buf.subarray(0, len), f.ctx), ['PGSUB_PROTOCOL_TRUNCATED', 'PGSUB_PROTOCOL_BAD_FIELD']);
        n++;
      }
    }
    assert.ok(n > 1000);
  });

  test('empty buffer', () => {
    throwsCode(() => decode(Buffer.alloc(0), { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /message tag.*offset 0/);
  });

  test('error names the field and the offset', () => {
    const c = bytes(first('commit'));
    throwsCode(() => decode(c.subarray(0, 12), { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /COMMIT end_lsn: need 8 byte\(s\) at offset 10/);
    const r = bytes(first('relation', (f) => !f.ctx.inStream));
    throwsCode(() => decode(r.subarray(0, 7), { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /RELATION namespace: unterminated string at offset 5/);
  });

  test('a huge column count with few bytes left fails fast, before allocating', () => {
    // 'I', relid, 'N', ncols = 32767, then 3 bytes.
    const buf = Buffer.from([0x49, 0, 0, 0x40, 0, 0x4e, 0x7f, 0xff, 0x6e, 0x6e, 0x6e]);
    const t0 = performance.now();
    for (let i = 0; i < 10_000; i++) throwsCode(() => decode(buf, { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /INSERT new tuple columns/);
    assert.ok(performance.now() - t0 < 2000);
    // 65535 read as a signed Int16 is negative: BAD_FIELD.
    buf[6] = 0xff;
    throwsCode(() => decode(buf, { inStream: false }), 'PGSUB_PROTOCOL_BAD_FIELD', /negative count/);
    // Relation with 32767 columns and nothing after.
    const rel = Buffer.from([0x52, 0, 0, 0x40, 0, 0x00, 0x74, 0x00, 0x64, 0x7f, 0xff]);
    throwsCode(() => decode(rel, { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /RELATION columns/);
    // Truncate claiming 2^31-1 relations.
    const tr = Buffer.from([0x54, 0x7f, 0xff, 0xff, 0xff, 0x00, 0, 0, 0, 1]);
    throwsCode(() => decode(tr, { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /TRUNCATE relation ids/);
    tr[1] = 0x80;
    throwsCode(() => decode(tr, { inStream: false }), 'PGSUB_PROTOCOL_BAD_FIELD', /TRUNCATE relation count: negative/);
  });

  test('declared value lengths beyond the buffer are TRUNCATED, negative ones BAD_FIELD', () => {
    const text = Buffer.from([0x49, 0, 0, 0x40, 0, 0x4e, 0, 1, 0x74, 0x7f, 0xff, 0xff, 0xff, 0x41]);
    throwsCode(() => decode(text, { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /INSERT new tuple text value/);
    text[9] = 0xff;
    throwsCode(() => decode(text, { inStream: false }), 'PGSUB_PROTOCOL_BAD_FIELD', /negative length/);
    text[8] = 0x62; /* b */
    throwsCode(() => decode(text, { inStream: false }), 'PGSUB_PROTOCOL_BAD_FIELD', /binary length: negative/);
    const m = bytes(first('message', (f) => !f.ctx.inStream));
    const lenAt = m.indexOf(0, 10) + 1; // after flags, lsn, prefix
    m.writeInt32BE(0x7fffffff, lenAt);
    throwsCode(() => decode(m, { inStream: false }), 'PGSUB_PROTOCOL_TRUNCATED', /MESSAGE content/);
  });
});

describe('decode: trailing bytes', () => {
  test('one extra byte after any fixture is TRAILING_BYTES', () => {
    for (const f of fixtures) {
      const buf = Buffer.concat([bytes(f), Buffer.from([0])]);
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_TRAILING_BYTES', /1 trailing byte/);
    }
  });

  test('Stream Abort with abort info decoded without streamAbortInfo has 16 trailing bytes', () => {
    const f = first('streamAbort', (x) => x.ctx.streamAbortInfo === true);
    throwsCode(() => decode(bytes(f), { inStream: false }), 'PGSUB_PROTOCOL_TRAILING_BYTES', /STREAM ABORT: 16 trailing/);
    const g = first('streamAbort', (x) => x.ctx.streamAbortInfo !== true);
    throwsCode(() => decode(bytes(g), { inStream: false, streamAbortInfo: true }), 'PGSUB_PROTOCOL_TRUNCATED', /abort_lsn/);
  });
});

describe('decode: unknown tag', () => {
  for (const b of [0x00, 0x5a /* Z */, 0x7a /* z */, 0xff, 0x77 /* w: a frame, not a message */]) {
    test(`0x${b.toString(16).padStart(2, '0')}`, () => {
      const e = throwsCode(() => decode(Buffer.from([b, 1, 2, 3]), { inStream: false }), 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE');
      assert.match(e.message, new RegExp(`0x${b.toString(16).padStart(2, '0')}`));
    });
  }
});

describe('decode: flags proto.c requires to be zero', () => {
  const cases: [MessageTag, number][] = [
    ['commit', 1],
    ['streamCommit', 5],
    ['prepare', 1],
    ['streamPrepare', 1],
    ['commitPrepared', 1],
    ['rollbackPrepared', 1],
  ];
  for (const [tag, at] of cases) {
    test(tag, () => {
      const f = first(tag);
      const buf = bytes(f);
      assert.equal(buf[at], 0);
      for (const v of [1, 0x80, 0xff]) {
        buf[at] = v;
        throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', new RegExp(`flags: unrecognized flags ${v}`));
      }
    });
  }

  test('message, relation-column and truncate flags are bit sets, unknown bits ignored like proto.c', () => {
    const m = first('message', (f) => !f.ctx.inStream && (f.expected as { transactional: boolean }).transactional);
    const buf = bytes(m);
    buf[1] = 0xff;
    assert.equal((decode(buf, m.ctx) as { transactional: boolean }).transactional, true);
    buf[1] = 0xfe;
    assert.equal((decode(buf, m.ctx) as { transactional: boolean }).transactional, false);
  });
});

describe('decode: field validation', () => {
  function identityOffset(buf: Buffer, inStream: boolean): number {
    let pos = 1 + (inStream ? 4 : 0) + 4;
    pos = buf.indexOf(0, pos) + 1; // namespace
    pos = buf.indexOf(0, pos) + 1; // name
    return pos;
  }

  test('relation replica identity must be d/n/f/i', () => {
    const f = first('relation', (x) => !x.ctx.inStream);
    const buf = bytes(f);
    const at = identityOffset(buf, false);
    assert.ok([0x64, 0x6e, 0x66, 0x69].includes(buf[at]!));
    for (const [b, want] of [
      [0x64, 'default'],
      [0x6e, 'nothing'],
      [0x66, 'full'],
      [0x69, 'index'],
    ] as const) {
      buf[at] = b;
      assert.equal((decode(buf, f.ctx) as { replicaIdentity: string }).replicaIdentity, want);
    }
    for (const b of [0x00, 0x44 /* D */, 0x78 /* x */, 0xff]) {
      buf[at] = b;
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /RELATION replica identity: unknown setting/);
    }
  });

  test('LSNs proto.c requires to be set', () => {
    const cases: [MessageTag, number, RegExp][] = [
      ['begin', 1, /BEGIN final_lsn: LSN not set/],
      ['beginPrepare', 1, /BEGIN PREPARE prepare_lsn/],
      ['beginPrepare', 9, /BEGIN PREPARE end_lsn/],
      ['prepare', 2, /PREPARE prepare_lsn/],
      ['prepare', 10, /PREPARE end_lsn/],
      ['streamPrepare', 2, /STREAM PREPARE prepare_lsn/],
      ['commitPrepared', 2, /COMMIT PREPARED commit_lsn/],
      ['commitPrepared', 10, /COMMIT PREPARED end_lsn/],
      ['rollbackPrepared', 2, /ROLLBACK PREPARED prepare_end_lsn/],
      ['rollbackPrepared', 10, /ROLLBACK PREPARED rollback_end_lsn/],
    ];
    for (const [tag, at, re] of cases) {
      const f = first(tag);
      const buf = bytes(f);
      buf.fill(0, at, at + 8);
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', re);
    }
  });

  test('prepare xid must be valid', () => {
    for (const tag of ['prepare', 'streamPrepare'] as const) {
      const f = first(tag);
      const buf = bytes(f);
      buf.fill(0, 26, 30);
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /xid: invalid two-phase transaction id 0/);
    }
  });

  test('insert requires N', () => {
    const f = first('insert', (x) => !x.ctx.inStream);
    const buf = bytes(f);
    assert.equal(buf[5], 0x4e);
    for (const b of [0x4b, 0x4f, 0x00]) {
      buf[5] = b;
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /INSERT tuple marker: expected 'N'/);
    }
  });

  test('update: optional K/O, then required N', () => {
    const withOld = first('update', (x) => x.expected.tag === 'update' && x.expected.oldKind === 'key' && !x.ctx.inStream);
    const buf = bytes(withOld);
    assert.equal(buf[5], 0x4b);
    buf[5] = 0x4f; // K → O: same bytes otherwise
    assert.equal((decode(buf, withOld.ctx) as { oldKind: string }).oldKind, 'old');
    buf[5] = 0x58; /* X */
    throwsCode(() => decode(buf, withOld.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /UPDATE tuple marker: expected 'K', 'O' or 'N', got 0x58 'X'/);
    // The marker after the old tuple must be N.
    const good = bytes(withOld);
    const m = decode(good, withOld.ctx);
    assert.equal(m.tag, 'update');
    const oldLen = tupleLength(good, 6);
    assert.equal(good[6 + oldLen], 0x4e);
    for (const b of [0x4b, 0x4f, 0x6e]) {
      const bad = Buffer.from(good);
      bad[6 + oldLen] = b;
      throwsCode(() => decode(bad, withOld.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /UPDATE new tuple marker: expected 'N'/);
    }
  });

  test('delete requires K or O', () => {
    const f = first('delete', (x) => !x.ctx.inStream);
    const buf = bytes(f);
    buf[5] = 0x4e;
    throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /DELETE tuple marker: expected 'K' or 'O'/);
  });

  test('tuple column kinds are n/u/t/b only', () => {
    const f = first('insert', (x) => !x.ctx.inStream);
    const buf = bytes(f);
    assert.ok(buf[8] === 0x74 || buf[8] === 0x62); // first column kind after 'I', relid, 'N', ncols
    for (const b of [0x00, 0x4e, 0x54, 0x78]) {
      buf[8] = b;
      throwsCode(() => decode(buf, f.ctx), 'PGSUB_PROTOCOL_BAD_FIELD', /INSERT new tuple column kind: unrecognized data representation/);
    }
  });

  test('ids are unsigned 32-bit', () => {
    const f = first('begin');
    const buf = bytes(f);
    buf.writeUInt32BE(0xfffffffe, 17);
    assert.equal((decode(buf, f.ctx) as { xid: number }).xid, 0xfffffffe);
    const r = first('relation', (x) => !x.ctx.inStream);
    const rb = bytes(r);
    rb.writeUInt32BE(0x80000001, 1);
    assert.equal((decode(rb, r.ctx) as { relationId: number }).relationId, 0x80000001);
  });

  test('stream start first_segment is 1 or anything else (proto.c compares with 1)', () => {
    const f = first('streamStart', (x) => (x.expected as { firstSegment: boolean }).firstSegment);
    const buf = bytes(f);
    buf[5] = 0;
    assert.equal((decode(buf, f.ctx) as { firstSegment: boolean }).firstSegment, false);
  });
});

/** Byte length of a TupleData starting at `at` (test helper, assumes well-formed input). */
function tupleLength(buf: Buffer, at: number): number {
  let pos = at;
  const n = buf.readInt16BE(pos);
  pos += 2;
  for (let i = 0; i < n; i++) {
    const kind = buf[pos++];
    if (kind === 0x74 || kind === 0x62) pos += 4 + buf.readInt32BE(pos);
  }
  return pos - at;
}

describe('decode: xid prefix only inside a stream', () => {
  test('non-stream fixtures with an xid inserted decode the same plus xid when inStream', () => {
    let n = 0;
    for (const f of fixtures.filter((x) => !x.ctx.inStream && XID_PREFIXED.has(x.expected.tag))) {
      const buf = bytes(f);
      const xid = Buffer.alloc(4);
      xid.writeUInt32BE(0xdeadbeef);
      const streamed = Buffer.concat([buf.subarray(0, 1), xid, buf.subarray(1)]);
      assert.deepStrictEqual(decode(streamed, { ...f.ctx, inStream: true }), { ...f.expected, xid: 0xdeadbeef }, f.name);
      n++;
    }
    assert.ok(n >= 10);
  });

  test('stream fixtures without their xid decode the same minus xid outside a stream', () => {
    let n = 0;
    for (const f of fixtures.filter((x) => x.ctx.inStream && XID_PREFIXED.has(x.expected.tag))) {
      const buf = bytes(f);
      const plain = Buffer.concat([buf.subarray(0, 1), buf.subarray(5)]);
      const { xid, ...rest } = f.expected as PgOutputMessage & { xid?: number };
      assert.equal(typeof xid, 'number');
      assert.deepStrictEqual(decode(plain, { ...f.ctx, inStream: false }), rest, f.name);
      n++;
    }
    assert.ok(n >= 4);
  });

  test('a stream insert decoded outside a stream is rejected, not misread silently', () => {
    const f = first('insert', (x) => x.ctx.inStream);
    // xid bytes are read as relation id, then the relation id's first byte as the 'N' marker.
    throwsCode(() => decode(bytes(f), { inStream: false }), ['PGSUB_PROTOCOL_BAD_FIELD', 'PGSUB_PROTOCOL_TRUNCATED', 'PGSUB_PROTOCOL_TRAILING_BYTES']);
  });

  test('messages without an xid prefix ignore inStream', () => {
    for (const f of fixtures.filter((x) => !XID_PREFIXED.has(x.expected.tag))) {
      assert.deepStrictEqual(decode(bytes(f), { ...f.ctx, inStream: !f.ctx.inStream }), f.expected, f.name);
    }
  });
});
