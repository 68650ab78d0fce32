/**
 * A batch of key-located UPDATEs of one relation (batch.ts) as one statement with one
 * bind parameter per column — an array holding that column's value for every row —
 * joined to the table by key:
 *
 *   UPDATE ONLY t AS pgsub_row SET a = v.p0, b = v.p1
 *     FROM (SELECT unnest($1::a_type[]) AS p0, unnest($2::b_type[]) AS p1, unnest($3::key_type[]) AS p2) AS v
 *    WHERE pgsub_row.key = v.p2
 *
 * Against multi-row.ts updateManyStatement's VALUES list (one parameter per value) the
 * target parses a Bind of a handful of parameters instead of thousands and builds no
 * expression per row; the text is the same whatever the row count, so one prepared
 * statement serves every batch of a shape and batches need no power-of-two sizes.
 * `npm run bench:update` measures it (figures in docs/design-measurements.md): less target
 * CPU than VALUES lists, and the client's encoding CPU falls by a third to a half. A
 * temporary staging table loaded by binary COPY was no faster, needs catalog work per
 * session, and a transaction that touched a temporary table cannot be PREPAREd.
 *
 * Each value is read by the function the per-row path reads it with:
 *  - a column whose values are all binary (or NULL) goes as a binary array of the target
 *    column's type: array_recv hands each element to that type's receive function, as
 *    the per-row path's Parse type inferred from its cast does, after the same OID
 *    rewriting (params.ts binaryValue). Not possible — null, the VALUES path then —
 *    where the per-row path reads the value as another type (BinaryColumns.parseTypes:
 *    remote type ≠ target type), sends it as text (textForUnreceivable), or where the
 *    column's type is an array itself (unnest would flatten an array of arrays) or has
 *    no array type (TargetColumn.arrayType);
 *  - a column whose values are all text (or NULL) goes as a text[] whose elements are
 *    cast to the column's type, an I/O conversion: the type's input function, as for the
 *    per-row path's text parameters ($n::type). Array-typed columns work this way too;
 *  - a column mixing binary and text values: null.
 * Rows have distinct keys (batch.ts coalesces), so no row of the table matches twice.
 * The affected-row count says how many rows were found; with detection (detecting.ts
 * Detect) a count short of the batch's raises update_missing inside the statement, as
 * updateManyStatement does.
 */
import type { Tuple } from '../../protocol/messages.js';
import type { Reshape } from '../../mapping/columns.js';
import type { MappedRelation } from './mapped-relation.js';
import { quoteIdent } from '../../quote.js';
import { binaryValue } from './params.js';
import { cached, column, noteParam, rowColumns, rowValue, target } from './statement-text.js';
import type { Detect } from './detecting.js';
import type { Statement } from '../../pgwire/statement.js';

const TEXT_OID = 25;

/** Per column of the statement: 'b' binary array of the column's type, 't' text[] cast per element. */
type Encoding = 'b' | 't';

/**
 * The UPDATE of `tuples` (distinct keys, every one carrying the columns `setIndexes`) as
 * column arrays, or null where only the VALUES path can send them (see header).
 */
export function updateArraysStatement(rel: MappedRelation, tuples: readonly Tuple[], setIndexes: readonly number[], detect: Detect | null): Statement | null {
  const columns = [...setIndexes, ...rel.keyIndexes];
  // The values as the target reads them, column by column.
  const encodings: Encoding[] = [];
  const values: (Buffer | string | null)[][] = [];
  const sizes: number[] = [];
  for (const i of columns) {
    const col = columnValues(rel, tuples, i, true);
    if (col === null) return null;
    encodings.push(col.encoding);
    values.push(col.values);
    sizes.push(col.size);
  }
  const keyParam = setIndexes.length + 1;
  const text = cached(rel, `UA|${setIndexes.join(',')}|${encodings.join('')}${detect ? '|d' : ''}`, () => {
    // Set-returning functions in one SELECT list run in lockstep (arrays of one length:
    // row r of each); ROWS FROM would expand a composite element into its fields.
    const arrays = columns.map((i, n) => {
      noteParam(n + 1, i);
      const type = rel.targetColumns[i]!.typeName;
      return `pg_catalog.unnest($${n + 1}::${encodings[n] === 'b' ? type : '"pg_catalog"."text"'}[]) AS "p${n}"`;
    });
    const value = (i: number, n: number) => (encodings[n] === 'b' ? `"pgsub_values"."p${n}"` : `"pgsub_values"."p${n}"::${rel.targetColumns[i]!.typeName}`);
    const sets = setIndexes.map((i, n) => `${column(rel, i)} = ${value(i, n)}`).join(', ');
    const where = rel.keyIndexes.map((i, k) => `"pgsub_row".${column(rel, i)} = ${value(i, setIndexes.length + k)}`).join(' AND ');
    const plain = `UPDATE ${target(rel)} AS "pgsub_row" SET ${sets} FROM (SELECT ${arrays.join(', ')}) AS "pgsub_values" WHERE ${where}`;
    if (!detect) return plain;
    return `WITH pgsub_changed AS (${plain} RETURNING 1) SELECT CASE WHEN (SELECT pg_catalog.count(*) FROM pgsub_changed) <> pg_catalog.cardinality($${keyParam}::${encodings[setIndexes.length] === 'b' ? rel.targetColumns[rel.keyIndexes[0]!]!.typeName : '"pg_catalog"."text"'}[]) THEN "pgsub"."conflict"('update_missing') END`;
  });
  const params = columns.map((i, n) => encodeArray(encodings[n] === 'b' ? rel.targetColumns[i]!.typeOid : TEXT_OID, values[n]!, sizes[n]!));
  return { text, params };
}

/**
 * Column `i`'s values of every tuple as one array parameter: binary (allowed by the caller,
 * and the per-row path would send the target type's binary value) or text; null where
 * neither can carry them (see the header).
 */
function columnValues(
  rel: MappedRelation,
  tuples: readonly Tuple[],
  i: number,
  binaryAllowed: boolean,
): { encoding: Encoding; values: (Buffer | string | null)[]; size: number } | null {
  const col = rel.targetColumns[i]!;
  const width = rel.remote.columns.length;
  const parseTypes = rel.binary?.parseTypes;
  let binary = false;
  let text = false;
  let size = 20 + 4 * tuples.length;
  const out = new Array<Buffer | string | null>(tuples.length);
  for (let r = 0; r < tuples.length; r++) {
    const tuple = tuples[r]!;
    if (tuple.length !== width) return null;
    const v = tuple[i]!;
    if (v.kind === 'null') {
      out[r] = null;
    } else if (v.kind === 'binary') {
      if (text || !binaryAllowed || !col.arrayType || (parseTypes && parseTypes[i] !== 0)) return null;
      const b = binaryValue(rel, v.value, i);
      if (typeof b === 'string') return null;
      binary = true;
      out[r] = b;
      size += b.length;
    } else if (v.kind === 'text') {
      if (binary) return null;
      text = true;
      out[r] = v.value;
      size += Buffer.byteLength(v.value, 'utf8');
    } else {
      return null; // unchanged TOAST value in a column the shape says was sent
    }
  }
  return { encoding: binary ? 'b' : 't', values: out, size };
}

/**
 * One-dimensional array in array_send's layout: ndim, has-nulls flag, element type OID,
 * size and lower bound of the dimension, then per element its length (-1: NULL) and bytes
 * (text elements as UTF-8, textrecv's format).
 */
function encodeArray(elementOid: number, values: readonly (Buffer | string | null)[], size: number): Buffer {
  const out = Buffer.allocUnsafe(size);
  let nulls = 0;
  let at = 20;
  for (const v of values) {
    if (v === null) {
      nulls = 1;
      out.writeInt32BE(-1, at);
      at += 4;
    } else if (typeof v === 'string') {
      const n = out.write(v, at + 4, 'utf8');
      out.writeInt32BE(n, at);
      at += 4 + n;
    } else {
      out.writeInt32BE(v.length, at);
      out.set(v, at + 4);
      at += 4 + v.length;
    }
  }
  out.writeInt32BE(1, 0);
  out.writeInt32BE(nulls, 4);
  out.writeUInt32BE(elementOid, 8);
  out.writeInt32BE(values.length, 12);
  out.writeInt32BE(1, 16);
  return out;
}

/**
 * A batch of INSERTs of a reshaped relation (excluded or computed columns, no row rules)
 * as one statement with one array parameter per remote column the row needs, unnested in
 * lockstep into the row subquery `r` the expressions read:
 *
 *   INSERT INTO t (a, b, c) SELECT r."a", r."b", (lower(r."b")) FROM
 *     (SELECT pg_catalog.unnest($1::int4[]) AS "a", pg_catalog.unnest($2::text[])::text AS "b") AS r
 *
 * The same text for every batch size, and a handful of parameters instead of one per
 * value (multi-row.ts reshapedInsertMany's VALUES list). Values as in updateArraysStatement:
 * a binary array where the row holds the column as the target column's type and the
 * per-row path would send it as that type's binary value; a text[] cast per element
 * otherwise; null (the VALUES path) for anything else.
 */
export function insertArraysStatement(rel: MappedRelation, reshape: Reshape, tuples: readonly Tuple[]): Statement | null {
  const direct = reshape.direct.flatMap((d, i) => (d ? [i] : []));
  const inRow = rowColumns(direct, reshape.computed);
  if (inRow.length === 0) return null;
  const columns = reshapedColumns(rel, reshape, tuples, inRow);
  if (columns === null) return null;
  const { encodings } = columns;
  const text = cached(rel, `RIA|${encodings.join('')}`, () => {
    const cols = [...direct.map((i) => column(rel, i)), ...reshape.computed.map((c) => quoteIdent(c.column.name))];
    const row = unnestedRow(rel, reshape, inRow, encodings);
    const exprs = [...direct.map((i) => rowValue(rel, reshape, i)), ...reshape.computed.map((c) => `(${c.expr})`)];
    const overriding = rel.targetColumns.some((c) => c.identityAlways) ? 'OVERRIDING SYSTEM VALUE ' : '';
    return `INSERT INTO ${rel.qualifiedName} (${cols.join(', ')}) ${overriding}SELECT ${exprs.join(', ')} FROM (SELECT ${row.join(', ')}) AS r`;
  });
  return { text, params: reshapedParams(rel, inRow, columns) };
}

interface ReshapedColumns {
  encodings: Encoding[];
  values: (Buffer | string | null)[][];
  sizes: number[];
}

/** The rows' values of each column of `r`, as arrays; binary only where `r` holds the column as the target column's type. */
function reshapedColumns(rel: MappedRelation, reshape: Reshape, tuples: readonly Tuple[], inRow: readonly number[]): ReshapedColumns | null {
  const out: ReshapedColumns = { encodings: [], values: [], sizes: [] };
  for (const i of inRow) {
    const col = columnValues(rel, tuples, i, reshape.direct[i] === true && reshape.rowTypes[i] === rel.targetColumns[i]!.typeName);
    if (col === null) return null;
    out.encodings.push(col.encoding);
    out.values.push(col.values);
    out.sizes.push(col.size);
  }
  return out;
}

/** `r`'s columns: each parameter array unnested in lockstep under the remote column's name. */
function unnestedRow(rel: MappedRelation, reshape: Reshape, inRow: readonly number[], encodings: readonly Encoding[]): string[] {
  return inRow.map((i, n) => {
    noteParam(n + 1, i);
    const name = quoteIdent(rel.remote.columns[i]!.name);
    return encodings[n] === 'b'
      ? `pg_catalog.unnest($${n + 1}::${reshape.rowTypes[i]}[]) AS ${name}`
      : `pg_catalog.unnest($${n + 1}::"pg_catalog"."text"[])::${reshape.rowTypes[i]} AS ${name}`;
  });
}

function reshapedParams(rel: MappedRelation, inRow: readonly number[], c: ReshapedColumns): Buffer[] {
  return inRow.map((i, n) => encodeArray(c.encodings[n] === 'b' ? rel.targetColumns[i]!.typeOid : TEXT_OID, c.values[n]!, c.sizes[n]!));
}

/**
 * A batch of key-located UPDATEs of a reshaped relation (excluded or computed columns, no
 * row rules) as column arrays: the remote rows unnested in lockstep into `r` under their
 * remote names, the values — direct columns, the computed columns all of whose inputs
 * were sent (as reshapedUpdate), and the key — evaluated in a subquery where only `r` is in
 * scope (an expression's column names never meet the target's), then joined by key:
 *
 *   UPDATE ONLY t AS pgsub_row SET a = v."v0", c = v."v1"
 *     FROM (SELECT r."a" AS "v0", (lower(r."b")) AS "v1", r."id" AS "k0"
 *             FROM (SELECT pg_catalog.unnest($1::int4[]) AS "id", …) AS r) AS v
 *    WHERE pgsub_row."id" = v."k0"
 *
 * Values encoded as insertArraysStatement's; null where they cannot be (the caller then
 * sends the rows one by one).
 */
export function reshapedUpdateArraysStatement(
  rel: MappedRelation,
  reshape: Reshape,
  tuples: readonly Tuple[],
  setIndexes: readonly number[],
  detect: Detect | null,
): Statement | null {
  const sent = new Set(setIndexes);
  const direct = setIndexes.filter((i) => reshape.direct[i] === true);
  const computed = reshape.computed.filter((c) => c.uses.every((i) => sent.has(i)));
  if (direct.length + computed.length === 0) return null;
  const inRow = rowColumns([...direct, ...rel.keyIndexes], computed);
  const columns = reshapedColumns(rel, reshape, tuples, inRow);
  if (columns === null) return null;
  const { encodings } = columns;
  const shape = `RUA|${setIndexes.join(',')}|${encodings.join('')}${detect ? '|d' : ''}`;
  const text = cached(rel, shape, () => {
    const row = unnestedRow(rel, reshape, inRow, encodings);
    const cols = [...direct.map((i) => column(rel, i)), ...computed.map((c) => quoteIdent(c.column.name))];
    const exprs = [...direct.map((i) => rowValue(rel, reshape, i)), ...computed.map((c) => `(${c.expr})`)];
    const keys = rel.keyIndexes.map((i, k) => `${rowValue(rel, reshape, i)} AS "k${k}"`);
    const from = `(SELECT ${[...exprs.map((e, n) => `${e} AS "v${n}"`), ...keys].join(', ')} FROM (SELECT ${row.join(', ')}) AS r) AS "pgsub_values"`;
    const sets = cols.map((c, n) => `${c} = "pgsub_values"."v${n}"`).join(', ');
    const where = rel.keyIndexes.map((i, k) => `"pgsub_row".${column(rel, i)} = "pgsub_values"."k${k}"`).join(' AND ');
    const plain = `UPDATE ${target(rel)} AS "pgsub_row" SET ${sets} FROM ${from} WHERE ${where}`;
    if (!detect) return plain;
    const first = encodings[0] === 'b' ? reshape.rowTypes[inRow[0]!] : '"pg_catalog"."text"';
    return `WITH pgsub_changed AS (${plain} RETURNING 1) SELECT CASE WHEN (SELECT pg_catalog.count(*) FROM pgsub_changed) <> pg_catalog.cardinality($1::${first}[]) THEN "pgsub"."conflict"('update_missing') END`;
  });
  return { text, params: reshapedParams(rel, inRow, columns) };
}
