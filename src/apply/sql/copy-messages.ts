/**
 * Binary COPY input made straight from pgoutput Insert messages, never decoded: in binary
 * mode a tuple's column is 'b' + Int32 length + the type's send output, and a binary COPY
 * field is Int32 length + the receive function's input — the same bytes. So a run of
 * inserts into a table whose columns all travel as sent (copy-rows.ts's binary case with
 * no conversion: every remote column mapped, no Parse type, no OID rewrite, no value
 * needing text) becomes COPY input by dropping one byte per column; no tuple, value or
 * Buffer object is made per row. This is the hottest path of a bulk load (W1): decoding
 * and re-encoding cost pgsub about as much CPU as everything else together.
 *
 * A message with any other kind of value (text, unchanged TOAST) yields null and the
 * batch is decoded and sent by copy-rows.ts or as INSERTs; the relation is then marked
 * so its later rows are decoded at once (binary mode off sends text throughout).
 */
import { TSQUERY_OID } from './binary.js';
import { BINARY_HEADER, binaryCopyText, type CopyStatement } from './copy-rows.js';
import type { MappedRelation } from './relmap.js';
const KIND_BINARY = 0x62; // b
const KIND_NULL = 0x6e; // n
const NEW_TUPLE = 0x4e; // N
/** Values up to this many bytes are copied byte by byte. */
const SMALL_VALUE = 32;
/** 'I', Int32 relation id, 'N': where the tuple starts in an Insert outside a streamed transaction. */
export const INSERT_TUPLE_OFFSET = 6;

/** Per relation: whether its inserts may go as sent (computed once; false once a message did not fit). */
const AS_SENT = new WeakMap<MappedRelation, boolean>();

/** Whether `rel`'s Insert messages can become binary COPY input as sent (see header). */
export function insertsCopyAsSent(rel: MappedRelation): boolean {
  let ok = AS_SENT.get(rel);
  if (ok === undefined) {
    const width = rel.remote.columns.length;
    const parseTypes = rel.binary?.parseTypes;
    const plans = rel.binary?.plans;
    ok =
      width > 0 &&
      rel.targetColumns.length === width &&
      !rel.remote.columns.some((c, i) => c.typeOid === TSQUERY_OID || (parseTypes != null && parseTypes[i] !== 0) || (plans != null && plans[i] != null));
    AS_SENT.set(rel, ok);
  }
  return ok;
}

/**
 * The COPY for `messages` (Insert messages of `rel`, outside streams), or null when one of
 * them holds a value that is not binary or NULL — the relation is then no longer tried.
 */
export function copyFromInsertMessages(rel: MappedRelation, messages: readonly Buffer[]): CopyStatement | null {
  const width = rel.remote.columns.length;
  // COPY's field is as long as pgoutput's, less the kind byte; a NULL takes 4 bytes, not 1.
  let size = BINARY_HEADER.length + 2;
  for (const m of messages) size += m.length - INSERT_TUPLE_OFFSET + 3 * width;
  const out = Buffer.allocUnsafe(size);
  out.set(BINARY_HEADER, 0);
  let at = BINARY_HEADER.length;
  for (const m of messages) {
    if (m[INSERT_TUPLE_OFFSET - 1] !== NEW_TUPLE || m.readInt16BE(INSERT_TUPLE_OFFSET) !== width) return notAsSent(rel);
    out.writeInt16BE(width, at);
    at += 2;
    let pos = INSERT_TUPLE_OFFSET + 2;
    for (let i = 0; i < width; i++) {
      const kind = m[pos];
      if (kind === KIND_BINARY) {
        const length = m.readInt32BE(pos + 1);
        const end = pos + 5 + length;
        if (length < 0 || end > m.length) return notAsSent(rel);
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
        return notAsSent(rel);
      }
    }
    if (pos !== m.length) return notAsSent(rel);
  }
  out.writeInt16BE(-1, at);
  at += 2;
  return { text: binaryCopyText(rel), data: [out.subarray(0, at)] };
}

function notAsSent(rel: MappedRelation): null {
  AS_SENT.set(rel, false);
  return null;
}
