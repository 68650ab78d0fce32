/**
 * A run of INSERTs into one relation as one `COPY … FROM STDIN`: the statement text and
 * the rows encoded as its input, for WireConnection.copyIn. The target then inserts them
 * with heap_multi_insert, far cheaper than a multi-row INSERT … VALUES, and no Bind with
 * thousands of parameters is built or parsed.
 *
 * Same behaviour as multi-row.ts insertManyStatement, which stays the fallback: the same
 * column list (rel.targetColumns in remote order; target columns not sent keep their
 * defaults), the relation itself without ONLY (COPY never writes inheritance children,
 * and routes into partitions), and each value read by the same function the INSERT path
 * has read it with:
 *  - FORMAT binary when every value is binary or NULL. A binary value is the publisher's
 *    typsend output; COPY hands it to the target column type's receive function, which is
 *    what the INSERT path's Parse type inferred from the cast does too, after the same
 *    OID rewriting (params.ts binaryValue). Where the INSERT path would read it as
 *    another type (BinaryColumns.parseTypes: remote type ≠ target type, converted by the
 *    cast) or send it as text (textForUnreceivable), there is no COPY equivalent: null.
 *  - FORMAT text when every value is text or NULL: the column type's input function, as
 *    for the INSERT path's text parameters (same session, so same DateStyle, encoding…).
 *    Backslash, newline, carriage return and tab are escaped; NULL is \N.
 *  - null otherwise (text and binary mixed, unchanged TOAST values, a tuple whose width
 *    differs from the Relation message): the INSERT path applies or reports those.
 * One Buffer per call, sized in a first pass; values are copied into it once.
 *
 * Batch size matters on the target: COPY buffers up to 1000 rows (or 64 kB of tuples)
 * per flush in slots it creates per COPY statement, each registering the same TupleDesc
 * with the resource owner, whose hash then probes linearly (perf on PG 18: 40% of the
 * backend in ResourceOwnerAddToHash/Forget at 1024 rows per COPY). The cost per row peaks
 * around 500–1000 rows per COPY; 128 or 4096+ rows are cheap (scripts/bench-copy-insert.ts).
 */
import type { Tuple } from '../../protocol/messages.js';
import type { MappedRelation } from './mapped-relation.js';
import { binaryValue } from './params.js';
import { cached, column } from './statement-text.js';

export interface CopyStatement {
  /** COPY "schema"."table" ("col", …) FROM STDIN [WITH (FORMAT binary)] */
  text: string;
  /** The whole COPY input, for WireConnection.copyIn. */
  data: Buffer[];
}

/** "PGCOPY\n\377\r\n\0", then int32 flags (no OIDs) and int32 header-extension length. */
export const BINARY_HEADER = Buffer.from([0x50, 0x47, 0x43, 0x4f, 0x50, 0x59, 0x0a, 0xff, 0x0d, 0x0a, 0x00, 0, 0, 0, 0, 0, 0, 0, 0]);
const TAB = 0x09;
const NEWLINE = 0x0a;
const BACKSLASH = 0x5c;
const NEEDS_ESCAPE = /[\\\n\r\t]/;
const ESCAPE_LETTER: Record<number, number> = { 0x5c: 0x5c, 0x0a: 0x6e /* n */, 0x0d: 0x72 /* r */, 0x09: 0x74 /* t */ };

/** The COPY for inserting `tuples` into `rel`, or null where only the INSERT path can (see header). */
export function copyInsertStatement(rel: MappedRelation, tuples: readonly Tuple[]): CopyStatement | null {
  const width = rel.targetColumns.length;
  if (tuples.length === 0 || width === 0) return null;
  let binary = false;
  let text = false;
  for (const tuple of tuples) {
    if (tuple.length !== width) return null;
    for (let i = 0; i < width; i++) {
      const kind = tuple[i]!.kind;
      if (kind === 'binary') binary = true;
      else if (kind === 'text') text = true;
      else if (kind !== 'null') return null;
    }
  }
  if (binary && text) return null;
  return binary ? binaryCopy(rel, tuples, width) : textCopy(rel, tuples, width);
}

function columnList(rel: MappedRelation): string {
  return rel.targetColumns.map((_, i) => column(rel, i)).join(', ');
}

/** Binary COPY: per row int16 field count, per field int32 length (-1: NULL) and bytes; int16 -1 ends it. */
function binaryCopy(rel: MappedRelation, tuples: readonly Tuple[], width: number): CopyStatement | null {
  const parseTypes = rel.binary?.parseTypes;
  // The values as the target must see them; the first pass decides whether COPY can carry them.
  const values = new Array<Buffer | null>(tuples.length * width);
  let size = BINARY_HEADER.length + tuples.length * (2 + 4 * width) + 2;
  let k = 0;
  for (const tuple of tuples) {
    for (let i = 0; i < width; i++, k++) {
      const v = tuple[i]!;
      if (v.kind !== 'binary') {
        values[k] = null;
        continue;
      }
      if (parseTypes && parseTypes[i] !== 0) return null;
      const value = binaryValue(rel, v.value, i);
      if (typeof value === 'string') return null;
      values[k] = value;
      size += value.length;
    }
  }
  const out = Buffer.allocUnsafe(size);
  out.set(BINARY_HEADER, 0);
  let at = BINARY_HEADER.length;
  k = 0;
  for (let r = 0; r < tuples.length; r++) {
    out.writeInt16BE(width, at);
    at += 2;
    for (let i = 0; i < width; i++) {
      const value = values[k++]!;
      if (value === null) {
        out.writeInt32BE(-1, at);
        at += 4;
      } else {
        out.writeInt32BE(value.length, at);
        out.set(value, at + 4);
        at += 4 + value.length;
      }
    }
  }
  out.writeInt16BE(-1, at);
  return { text: binaryCopyText(rel), data: [out] };
}

/** COPY "schema"."table" (columns in remote order) FROM STDIN WITH (FORMAT binary), built once per relation. */
export function binaryCopyText(rel: MappedRelation): string {
  return cached(rel, 'C|binary', () => `COPY ${rel.qualifiedName} (${columnList(rel)}) FROM STDIN WITH (FORMAT binary)`);
}

/** Text COPY: fields separated by tab, rows ended by newline, NULL as \N, specials backslash-escaped. */
function textCopy(rel: MappedRelation, tuples: readonly Tuple[], width: number): CopyStatement {
  let size = tuples.length * width; // one tab or newline after every field
  for (const tuple of tuples) {
    for (let i = 0; i < width; i++) {
      const v = tuple[i]!;
      if (v.kind !== 'text') size += 2;
      else {
        size += Buffer.byteLength(v.value, 'utf8');
        if (NEEDS_ESCAPE.test(v.value)) size += escapeCount(v.value);
      }
    }
  }
  const out = Buffer.allocUnsafe(size);
  let at = 0;
  for (const tuple of tuples) {
    for (let i = 0; i < width; i++) {
      const v = tuple[i]!;
      if (v.kind !== 'text') {
        out[at++] = BACKSLASH;
        out[at++] = 0x4e; // N
      } else if (NEEDS_ESCAPE.test(v.value)) {
        at = writeEscaped(out, at, v.value);
      } else {
        at += out.write(v.value, at, 'utf8');
      }
      out[at++] = i + 1 < width ? TAB : NEWLINE;
    }
  }
  const text = cached(rel, 'C|text', () => `COPY ${rel.qualifiedName} (${columnList(rel)}) FROM STDIN`);
  return { text, data: [out] };
}

function escapeCount(s: string): number {
  let n = 0;
  for (let j = 0; j < s.length; j++) if (ESCAPE_LETTER[s.charCodeAt(j)] !== undefined) n++;
  return n;
}

/** `s` with its specials escaped, written at `at` in UTF-8 (the specials are ASCII, so no
 *  multi-byte sequence is split); returns the offset after it. */
function writeEscaped(out: Buffer, at: number, s: string): number {
  let from = 0;
  for (let j = 0; j < s.length; j++) {
    const letter = ESCAPE_LETTER[s.charCodeAt(j)];
    if (letter === undefined) continue;
    if (j > from) at += out.write(s.slice(from, j), at, 'utf8');
    out[at++] = BACKSLASH;
    out[at++] = letter;
    from = j + 1;
  }
  if (from < s.length) at += out.write(s.slice(from), at, 'utf8');
  return at;
}
