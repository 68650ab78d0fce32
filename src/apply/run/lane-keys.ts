/**
 * Row identities of a change, read from its raw pgoutput bytes for apply lanes (lanes.ts):
 * two transactions may be applied in parallel only if no row identity of one is one of
 * the other's. The identity is the replica identity key as the publisher sent it (the
 * columns its Relation message flags as key), hashed with the relation id into a 32-bit
 * number: a collision only makes a transaction wait when it need not, never the reverse.
 * Pure, allocation-free per row, and lenient: bytes it cannot read mean "depends on
 * everything before", and the lane's decoder reports them properly. `Writers` keeps, per
 * identity, the last group of transactions that wrote it: the group a change waits for.
 */
import { TAG } from '../../protocol/tags.js';
import type { RelationMessage } from '../../protocol/messages.js';

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
  const relationId = raw.readUInt32BE(1);
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
 * Slots of the row-writer table (a power of two). Far more than the row identities of
 * the groups in flight (a few lanes × a group's changes), so two rarely share a slot.
 */
const WRITER_SLOTS = 1 << 20;

/**
 * The last writer (group number, increasing) of every row identity, and of tables whose
 * changes had none. Lossy on purpose: rows sharing a slot share the latest writer, which
 * is at least the true one, and groups commit in order — so a shared slot can only make a
 * change wait longer, never less. No keys are stored: one array read and write per row.
 */
export class Writers {
  readonly #rows = new Int32Array(WRITER_SLOTS);
  /** Relation id → the last group with a change to it that had no row identity. */
  readonly #tables = new Map<number, number>();
  readonly #keyColumns = new WeakMap<RelationMessage, number[]>();
  readonly #keys = [0, 0];

  /**
   * The group the change in `raw` by group `seq` must wait for (0: none; seq - 1: all
   * before it), recording `seq` as the writer of what it touches. `ordered`: the target
   * table has triggers that would see the order of its rows.
   */
  record(seq: number, raw: Buffer, remote: RelationMessage, ordered: boolean): number {
    const relationId = raw.readUInt32BE(1);
    let count = -1;
    if (!ordered) {
      let columns = this.#keyColumns.get(remote);
      if (columns === undefined) this.#keyColumns.set(remote, (columns = keyColumns(remote)));
      count = changeKeys(raw, remote, columns, this.#keys);
    }
    if (count < 0) return this.wholeTable(seq, relationId);
    const tableWriter = this.#tables.get(relationId);
    let waitFor = tableWriter !== undefined && tableWriter !== seq ? tableWriter : 0;
    const rows = this.#rows;
    for (let i = 0; i < count; i++) {
      const slot = this.#keys[i]! & (WRITER_SLOTS - 1);
      const writer = rows[slot]!;
      if (writer !== seq && writer > waitFor) waitFor = writer;
      rows[slot] = seq;
    }
    return waitFor;
  }

  /** A change to a whole table (TRUNCATE, or rows without identity): waits for every group before; later changes to the table wait for it. */
  wholeTable(seq: number, relationId: number): number {
    this.#tables.set(relationId, seq);
    return seq - 1;
  }
}
