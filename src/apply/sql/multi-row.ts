/**
 * A run of changes to one relation (batch.ts) as one statement with a VALUES list: a
 * multi-row INSERT (INSERT … SELECT from the list for a reshaped relation) and an
 * UPDATE … FROM (VALUES …) joined on the key; and how many rows one statement may carry.
 * The fallback of the cheaper forms, COPY (copy-rows.ts) and update arrays (update-rows.ts).
 */
import type { Tuple } from '../../protocol/messages.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Reshape } from '../../mapping/columns.js';
import type { Statement } from '../../pgwire/statement.js';
import { Params } from './params.js';
import { cached, checkWidth, column, noteParam, param, rowColumns, rowValue, target } from './statement-text.js';
import type { Detect } from './detecting.js';
import { insertStatement, overriding } from './insert.js';
import { updateStatement } from './update.js';

/** Most bind parameters one statement may carry (the protocol's Int16 count). */
const MAX_PARAMS = 65535;

/** How many rows of `width` parameters each one multi-row statement may carry. */
export function maxBatchRows(width: number, wanted: number): number {
  return Math.max(1, Math.min(wanted, Math.floor(MAX_PARAMS / Math.max(1, width))));
}

/**
 * One INSERT for several rows of the same relation (a run of INSERT messages): one Bind and
 * one executor run on the target instead of one per row. Texts are cached per row count;
 * callers use a few counts only (powers of two), so few statements get prepared.
 */
export function insertManyStatement(rel: MappedRelation, tuples: Tuple[]): Statement {
  if (tuples.length === 1) return insertStatement(rel, tuples[0]!);
  if (rel.reshape) return reshapedInsertMany(rel, rel.reshape, tuples);
  const width = rel.targetColumns.length;
  const text = cached(rel, `I${tuples.length}`, () => {
    const cols = rel.targetColumns.map((_, i) => column(rel, i)).join(', ');
    const rows = tuples.map((_, r) => `(${rel.targetColumns.map((_, i) => param(rel, i, r * width + i + 1)).join(', ')})`);
    return `INSERT INTO ${rel.qualifiedName} (${cols}) ${overriding(rel)}VALUES ${rows.join(', ')}`;
  });
  const params = new Params(rel);
  for (const tuple of tuples) {
    checkWidth(rel, tuple);
    for (let i = 0; i < tuple.length; i++) params.add(tuple, i);
  }
  return params.statement(text);
}

/**
 * A batch of INSERTs of a reshaped relation without row rules (batch.ts): the remote rows
 * as a VALUES list `r` under their remote names, the expressions evaluated per row by one
 * INSERT … SELECT. Texts cached per row count, as insertManyStatement's.
 */
function reshapedInsertMany(rel: MappedRelation, reshape: Reshape, tuples: Tuple[]): Statement {
  const direct = reshape.direct.flatMap((d, i) => (d ? [i] : []));
  const inRow = rowColumns(direct, reshape.computed);
  const width = inRow.length;
  const text = cached(rel, `RI${tuples.length}`, () => {
    const cols = [...direct.map((i) => column(rel, i)), ...reshape.computed.map((c) => quoteIdent(c.column.name))];
    const values = [...direct.map((i) => rowValue(rel, reshape, i)), ...reshape.computed.map((c) => `(${c.expr})`)];
    const rows = tuples.map(
      (_, r) =>
        `(${inRow
          .map((i, n) => {
            noteParam(r * width + n + 1, i);
            return `$${r * width + n + 1}::${reshape.rowTypes[i]}`;
          })
          .join(', ')})`,
    );
    const names = inRow.map((i) => quoteIdent(rel.remote.columns[i]!.name)).join(', ');
    return `INSERT INTO ${rel.qualifiedName} (${cols.join(', ')}) ${overriding(rel)}SELECT ${values.join(', ')} FROM (VALUES ${rows.join(', ')}) AS r (${names})`;
  });
  const params = new Params(rel);
  for (const tuple of tuples) {
    checkWidth(rel, tuple);
    for (const i of inRow) params.add(tuple, i);
  }
  return params.statement(text);
}

/**
 * One UPDATE for several rows located by key (batch.ts): the sent columns and the key of
 * each row as a VALUES list joined on the key. The rows have distinct keys (an UPDATE …
 * FROM with two matches for one row would apply only one). With detection, a count short
 * of the row count raises update_missing, and the careful path finds which row it was.
 */
export function updateManyStatement(rel: MappedRelation, tuples: Tuple[], sent: number[], detect: Detect | null): Statement {
  if (tuples.length === 1) return updateStatement(rel, undefined, undefined, tuples[0]!, detect);
  const setIndexes = sent.filter((i) => !rel.targetColumns[i]!.identityAlways);
  const columns = [...setIndexes, ...rel.keyIndexes];
  const width = columns.length;
  const text = cached(rel, `UM${tuples.length}|${setIndexes.join(',')}${detect ? '|d' : ''}`, () => {
    const rows = tuples.map((_, r) => `(${columns.map((i, n) => param(rel, i, r * width + n + 1)).join(', ')})`).join(', ');
    const names = columns.map((_, n) => `"p${n}"`).join(', ');
    const sets = setIndexes.map((i, n) => `${column(rel, i)} = "pgsub_values"."p${n}"`).join(', ');
    const where = rel.keyIndexes.map((i, n) => `"pgsub_row".${column(rel, i)} = "pgsub_values"."p${setIndexes.length + n}"`).join(' AND ');
    const plain = `UPDATE ${target(rel)} AS "pgsub_row" SET ${sets} FROM (VALUES ${rows}) AS "pgsub_values" (${names}) WHERE ${where}`;
    if (!detect) return plain;
    return `WITH pgsub_changed AS (${plain} RETURNING 1) SELECT CASE WHEN (SELECT pg_catalog.count(*) FROM pgsub_changed) <> ${tuples.length} THEN "pgsub"."conflict"('update_missing') END`;
  });
  const params = new Params(rel);
  for (const tuple of tuples) {
    checkWidth(rel, tuple);
    for (const i of columns) params.add(tuple, i);
  }
  return params.statement(text);
}
