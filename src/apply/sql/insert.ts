/**
 * INSERT of one remote row: every sent column as a parameter (OVERRIDING SYSTEM VALUE
 * where a GENERATED ALWAYS identity column takes the sent value), or for a reshaped
 * relation an INSERT … SELECT over the row subquery, with the mapping's row filter and
 * the revival of a soft-deleted row (rows.ts). multi-row.ts builds runs of them.
 */
import type { Tuple } from '../../protocol/messages.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Reshape } from '../../mapping/columns.js';
import type { Statement } from '../../pgwire/statement.js';
import { Params } from './params.js';
import { cached, checkWidth, column, param, rowColumns, rowSelect, rowSubquery, rowValue } from './statement-text.js';

/** The source's value of a GENERATED ALWAYS identity column is taken as sent, as native's apply does. */
export const overriding = (rel: MappedRelation) => (rel.targetColumns.some((c) => c.identityAlways) ? 'OVERRIDING SYSTEM VALUE ' : '');

export function insertStatement(rel: MappedRelation, tuple: Tuple): Statement {
  checkWidth(rel, tuple);
  if (rel.reshape) return reshapedInsert(rel, rel.reshape, tuple);
  const text = cached(rel, 'I', () => {
    if (rel.targetColumns.length === 0) return `INSERT INTO ${rel.qualifiedName} DEFAULT VALUES`;
    const cols = rel.targetColumns.map((_, i) => column(rel, i)).join(', ');
    const values = rel.targetColumns.map((_, i) => param(rel, i, i + 1)).join(', ');
    return `INSERT INTO ${rel.qualifiedName} (${cols}) ${overriding(rel)}VALUES (${values})`;
  });
  const params = new Params(rel);
  for (let i = 0; i < tuple.length; i++) params.add(tuple, i);
  return params.statement(text);
}

function reshapedInsert(rel: MappedRelation, reshape: Reshape, tuple: Tuple): Statement {
  const direct = reshape.direct.flatMap((d, i) => (d ? [i] : []));
  const rows = reshape.rows;
  const filter = rows?.filter ?? null;
  const inRow = rowColumns([...direct, ...(filter?.uses ?? [])], reshape.computed);
  const text = cached(rel, 'RI', () => {
    const cols = [...direct.map((i) => column(rel, i)), ...reshape.computed.map((c) => quoteIdent(c.column.name))];
    if (cols.length === 0) return `INSERT INTO ${rel.qualifiedName} DEFAULT VALUES`;
    const values = [...direct.map((i) => rowValue(rel, reshape, i)), ...reshape.computed.map((c) => `(${c.expr})`)];
    // The row filter (rows.ts): a row that does not pass is not inserted (PostgreSQL 15's pgoutput_row_filter).
    const where = filter ? ` WHERE (${filter.expr}) IS TRUE` : '';
    const soft = rows?.softDelete;
    if (!soft) return `INSERT INTO ${rel.qualifiedName} (${cols.join(', ')}) ${overriding(rel)}SELECT ${values.join(', ')} FROM ${rowSubquery(rel, reshape, inRow, 1)}${where}`;
    // Soft delete: an INSERT of a key whose row is marked deleted revives it; a live row
    // with that key is insert_exists, as a plain INSERT's unique violation would be.
    const settable = [...direct.filter((i) => !rel.targetColumns[i]!.identityAlways).map((i) => column(rel, i)), ...reshape.computed.map((c) => quoteIdent(c.column.name))];
    const sets = [
      ...settable.map((c) => `${c} = EXCLUDED.${c}`),
      ...(soft.flag ? [`${quoteIdent(soft.flag.name)} = false`] : []),
      ...(soft.at ? [`${quoteIdent(soft.at.name)} = NULL`] : []),
      ...(soft.lsn ? [`${quoteIdent(soft.lsn.name)} = NULL`] : []),
    ];
    const insert =
      `INSERT INTO ${rel.qualifiedName} AS "pgsub_row" (${cols.join(', ')}) ${overriding(rel)}SELECT ${values.join(', ')} FROM r${where} ` +
      `ON CONFLICT (${rows!.keyNames.map(quoteIdent).join(', ')}) DO UPDATE SET ${sets.join(', ')} WHERE ${softDeleted(soft, '"pgsub_row".')} RETURNING 1`;
    const passes = filter ? ` AND EXISTS (SELECT FROM r${where})` : '';
    return `WITH r AS (${rowSelect(rel, reshape, inRow, 1)}), pgsub_changed AS (${insert}) SELECT CASE WHEN NOT EXISTS (SELECT FROM pgsub_changed)${passes} THEN "pgsub"."conflict"('insert_exists') END`;
  });
  const params = new Params(rel);
  for (const i of inRow) params.add(tuple, i);
  return params.statement(text);
}

/** The condition of a soft-deleted row (rows.ts): its flag set, else its timestamp or LSN. */
export function softDeleted(soft: NonNullable<NonNullable<Reshape['rows']>['softDelete']>, prefix: string): string {
  if (soft.flag) return `${prefix}${quoteIdent(soft.flag.name)} IS TRUE`;
  return `${prefix}${quoteIdent((soft.at ?? soft.lsn)!.name)} IS NOT NULL`;
}
