/**
 * Fields read from raw pgoutput messages without decoding them, for the code that routes
 * or transcodes messages on the hot path (the applier's insert fast path, apply lanes'
 * routing, binary COPY made from Insert messages). The decoder (decoder.ts) owns the full
 * layouts; this file is the only other place that knows where a field sits, so a layout
 * change is made here and in the decoder, nowhere else. Every function is pure and lenient:
 * bytes it cannot read give "unknown" (-1 or null), and the decoder reports them properly.
 */
import type { Lsn } from './lsn.js';
import type { RelationMessage } from './messages.js';
import { TAG } from './tags.js';

/** The relation id of an Insert, Update or Delete outside a stream block (after the tag). */
export function peekRelationId(raw: Buffer): number {
  return raw.readUInt32BE(1);
}

/** The (sub)transaction xid of an Insert, Update or Delete inside a stream block (after the tag); -1 if cut short. */
export function peekStreamXid(raw: Buffer): number {
  return raw.length >= 5 ? raw.readUInt32BE(1) : -1;
}

/** A Begin message's final LSN (the commit's LSN), right after the tag. */
export function peekBeginFinalLsn(raw: Buffer): Lsn {
  return raw.readBigUInt64BE(1) as Lsn;
}

/** The relation ids a Truncate message names (outside a stream block), each passed to `each`. */
export function peekTruncateRelationIds(raw: Buffer, each: (relationId: number) => void): void {
  // 'T', Int32 count, Int8 options, then the ids.
  for (let i = 0, n = raw.readInt32BE(1); i < n && 10 + 4 * i <= raw.length; i++) each(raw.readUInt32BE(6 + 4 * i));
}

/** 'I', Int32 relation id, 'N': where the tuple starts in an Insert outside a streamed transaction. */
export const INSERT_TUPLE_OFFSET = 6;

const TUPLE_NEW = 0x4e; // 'N'
const TUPLE_KEY = 0x4b; // 'K'
const TUPLE_OLD = 0x4f; // 'O'
const KIND_NULL = 0x6e; // 'n'
const KIND_UNCHANGED = 0x75; // 'u'
const KIND_TEXT = 0x74; // 't'
const KIND_BINARY = 0x62; // 'b'

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

function mix(hash: number, byte: number): number {
  return Math.imul(hash ^ byte, FNV_PRIME);
}

/** The key-column positions of a relation (empty: it has no key; every change depends on all before). */
export function keyColumns(remote: RelationMessage): number[] {
  const positions: number[] = [];
  remote.columns.forEach((c, i) => {
    if (c.isKey) positions.push(i);
  });
  return positions;
}

/** Where the tuple hashTuple last read ends (a module variable: no object per row). */
let tupleEnd = 0;

/** Row identity not fully there (an unchanged TOAST value in the key). */
const INCOMPLETE = -1;
/** Bytes that cannot be read as a tuple. */
const UNREADABLE = -2;

/**
 * Hash (non-negative) of the key columns of the tuple at `offset`, its end in tupleEnd;
 * INCOMPLETE or UNREADABLE otherwise.
 */
function hashTuple(raw: Buffer, offset: number, relationId: number, keys: readonly number[]): number {
  if (offset + 2 > raw.length) return UNREADABLE;
  const count = raw.readUInt16BE(offset);
  let at = offset + 2;
  let hash = FNV_OFFSET;
  for (let shift = 0; shift < 32; shift += 8) hash = mix(hash, (relationId >>> shift) & 0xff);
  let nextKey = 0;
  let complete = keys.length > 0 && keys[keys.length - 1]! < count;
  for (let column = 0; column < count; column++) {
    if (at >= raw.length) return UNREADABLE;
    const kind = raw[at++]!;
    const isKey = nextKey < keys.length && keys[nextKey] === column;
    if (isKey) nextKey++;
    if (kind === KIND_TEXT || kind === KIND_BINARY) {
      if (at + 4 > raw.length) return UNREADABLE;
      const length = raw.readInt32BE(at);
      at += 4;
      if (length < 0 || at + length > raw.length) return UNREADABLE;
      if (isKey) {
        hash = mix(hash, kind);
        hash = mix(hash, length & 0xff);
        hash = mix(hash, (length >>> 8) & 0xff);
        for (let i = at; i < at + length; i++) hash = mix(hash, raw[i]!);
      }
      at += length;
    } else if (kind === KIND_NULL) {
      if (isKey) hash = mix(hash, kind);
    } else if (kind === KIND_UNCHANGED) {
      if (isKey) complete = false;
    } else return UNREADABLE;
  }
  tupleEnd = at;
  return complete ? hash >>> 0 : INCOMPLETE;
}

/**
 * The row identities an Insert, Update or Delete (outside a stream block) touches, written
 * to `out` (reused: nothing is allocated per row); returns how many: one; two for an
 * update that changes its key; none for an insert into a table without a key. -1: not
 * known — the change must wait for every earlier transaction (an update or delete without
 * a usable key, unreadable bytes, not a row change).
 */
export function changeKeys(raw: Buffer, remote: RelationMessage, keys: readonly number[], out: number[]): number {
  if (raw.length < 6) return -1;
  const tag = raw[0];
  // No key (REPLICA IDENTITY NOTHING, or DEFAULT without a primary key): the publisher
  // sends only inserts, which touch no earlier row.
  if (keys.length === 0) return tag === TAG.INSERT && remote.replicaIdentity !== 'full' ? 0 : -1;
  const relationId = peekRelationId(raw);
  let at = 5;
  if (tag === TAG.INSERT || tag === TAG.DELETE) {
    const kind = raw[at];
    if (tag === TAG.INSERT ? kind !== TUPLE_NEW : kind !== TUPLE_KEY && kind !== TUPLE_OLD) return -1;
    const hash = hashTuple(raw, at + 1, relationId, keys);
    if (hash < 0) return -1;
    out[0] = hash;
    return 1;
  }
  if (tag !== TAG.UPDATE) return -1;
  let old = -1;
  if (raw[at] === TUPLE_KEY || raw[at] === TUPLE_OLD) {
    old = hashTuple(raw, at + 1, relationId, keys);
    if (old < 0) return -1;
    at = tupleEnd;
  }
  if (raw[at] !== TUPLE_NEW) return -1;
  const hash = hashTuple(raw, at + 1, relationId, keys);
  if (hash === UNREADABLE) return -1;
  if (hash === INCOMPLETE) {
    // The new row's key is an unchanged TOAST value: known only through the old key.
    if (old < 0 || remote.replicaIdentity === 'full') return -1;
    out[0] = old;
    return 1;
  }
  out[0] = hash;
  if (old < 0 || old === hash) return 1;
  out[0] = old;
  out[1] = hash;
  return 2;
}

/**
 * The tuple of Insert message `m` (outside streams, `width` columns) as one binary COPY
 * row written at `at` in `out` (room for it: copyRowBound); returns where the row ends,
 * or -1 when a value is neither binary nor NULL (text mode, unchanged TOAST) or the
 * bytes do not fit. A binary tuple column is 'b' + Int32 length + the type's send
 * output, a binary COPY field is Int32 length + the same bytes: one byte per column goes.
 */
export function insertTupleAsCopyRow(m: Buffer, width: number, out: Buffer, at: number): number {
  if (m[INSERT_TUPLE_OFFSET - 1] !== TUPLE_NEW || m.readInt16BE(INSERT_TUPLE_OFFSET) !== width) return -1;
  out.writeInt16BE(width, at);
  at += 2;
  let pos = INSERT_TUPLE_OFFSET + 2;
  for (let i = 0; i < width; i++) {
    const kind = m[pos];
    if (kind === KIND_BINARY) {
      const length = m.readInt32BE(pos + 1);
      const end = pos + 5 + length;
      if (length < 0 || end > m.length) return -1;
      // Most values are a few bytes (integers, timestamps): a loop beats Buffer.copy's call overhead.
      if (length <= SMALL_VALUE) for (let j = pos + 1; j < end; j++) out[at++] = m[j]!;
      else {
        m.copy(out, at, pos + 1, end);
        at += 4 + length;
      }
      pos = end;
    } else if (kind === KIND_NULL) {
      out.writeInt32BE(-1, at);
      at += 4;
      pos += 1;
    } else {
      return -1;
    }
  }
  return pos === m.length ? at : -1;
}

/** An upper bound of the COPY row insertTupleAsCopyRow makes of `m` (a NULL takes 4 bytes, not 1). */
export function copyRowBound(m: Buffer, width: number): number {
  return m.length - INSERT_TUPLE_OFFSET + 3 * width;
}

/** Values up to this many bytes are copied byte by byte. */
const SMALL_VALUE = 32;

/**
 * The commit LSN of a message that makes a remote transaction visible on the target: Begin
 * (its final LSN), Stream Commit ('c': xid, flags, then the commit LSN) and Commit Prepared
 * ('K': flags, then the commit LSN); null for every other message. For a hold at an LSN
 * (apply/run/hold.ts): what decides whether applying it crosses the hold.
 */
export function peekVisibleCommitLsn(raw: Buffer): Lsn | null {
  switch (raw[0]) {
    case TAG.BEGIN:
      return raw.length >= 9 ? (raw.readBigUInt64BE(1) as Lsn) : null;
    case 0x63 /* c: Stream Commit */:
      return raw.length >= 14 ? (raw.readBigUInt64BE(6) as Lsn) : null;
    case 0x4b /* K: Commit Prepared */:
      return raw.length >= 10 ? (raw.readBigUInt64BE(2) as Lsn) : null;
    default:
      return null;
  }
}
