/**
 * Binary COPY input made straight from pgoutput Insert messages, never decoded: in binary
 * mode a tuple's column is 'b' + Int32 length + the type's send output, and a binary COPY
 * field is Int32 length + the receive function's input — the same bytes. So a run of
 * inserts into a table whose columns all travel as sent (copy-rows.ts's binary case with
 * no conversion: every remote column mapped, no Parse type, no OID rewrite, no value
 * needing text) becomes COPY input by dropping one byte per column; no tuple, value or
 * Buffer object is made per row (protocol/peek.ts insertTupleAsCopyRow does the bytes).
 * This is the hottest path of a bulk load (W1, docs/benchmarks.md).
 *
 * A message with any other kind of value (text, unchanged TOAST) yields null and the
 * batch is decoded and sent by copy-rows.ts or as INSERTs; the relation is then marked
 * so its later rows are decoded at once (binary mode off sends text throughout).
 */
import { TSQUERY_OID } from './binary.js';
import { BINARY_HEADER, binaryCopyText, type CopyStatement } from './copy-rows.js';
import type { MappedRelation } from './mapped-relation.js';
import { copyRowBound, insertTupleAsCopyRow } from '../../protocol/peek.js';

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
      rel.reshape === undefined &&
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
  let size = BINARY_HEADER.length + 2;
  for (const m of messages) size += copyRowBound(m, width);
  const out = Buffer.allocUnsafe(size);
  out.set(BINARY_HEADER, 0);
  let at = BINARY_HEADER.length;
  for (const m of messages) {
    at = insertTupleAsCopyRow(m, width, out, at);
    if (at < 0) return notAsSent(rel);
  }
  out.writeInt16BE(-1, at);
  at += 2;
  return { text: binaryCopyText(rel), data: [out.subarray(0, at)] };
}

function notAsSent(rel: MappedRelation): null {
  AS_SENT.set(rel, false);
  return null;
}
