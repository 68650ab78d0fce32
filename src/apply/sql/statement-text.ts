/**
 * What every statement builder writes its SQL text with: identifiers quoted, every value
 * a bind parameter cast to its target column's type, the relation named with ONLY or
 * not, a reshaped relation's remote row as the subquery `r`. Texts are cached per
 * relation by shape (which columns are set, which locate the row, which old values are
 * NULL), so the driver's per-text prepared statements are reused across rows; while a
 * text is built, the column each parameter carries is recorded (failure.ts reads it).
 *
 * Every parameter is cast to its target column's type ($1::"pg_catalog"."int8"). The
 * value is still parsed by that type's input function, as native's slot_store_data does,
 * but the type is now part of the text: a server-side prepared statement fixes its
 * parameter types when first parsed, so after `ALTER COLUMN … TYPE bigint` a text that
 * left them to inference would keep parsing values as int4 ("out of range for type
 * integer"); a changed column type now gives a new text and a new statement.
 *
 * A plain target table is written with ONLY, like native, which changes exactly the
 * named relation and never rows of inheritance children; a partitioned target routes to
 * and searches its partitions (worker.c apply_handle_tuple_routing, and TRUNCATE of a
 * partitioned table truncates every partition).
 *
 * A reshaped relation (excluded or computed columns, mapping/columns.ts) binds the remote row as
 * a subquery `r` and selects the target's values from it; its rows are located as
 * locator.ts says, by the columns the target holds as sent.
 */
import { ApplyError } from '../../errors.js';
import type { Tuple } from '../../protocol/messages.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Reshape } from '../../mapping/columns.js';

/** While a text is built: the target column index of each parameter number (param(), noteParam()). */
let recording: number[] | null = null;

export function cached(rel: MappedRelation, shape: string, build: () => string): string {
  let text = rel.statements.get(shape);
  if (text === undefined) {
    const columns: number[] = [];
    recording = columns;
    try {
      text = build();
    } finally {
      recording = null;
    }
    rel.statements.set(shape, text);
    // Built once per shape, read only when the target rejects a value (failure.ts).
    if (columns.length > 0) rel.paramColumns.set(text, columns);
  }
  return text;
}

/** Parameter $n of the text being built carries the value of column `index`. */
export function noteParam(n: number, index: number): void {
  if (recording !== null) recording[n] = index;
}

export function checkWidth(rel: MappedRelation, tuple: Tuple): void {
  if (tuple.length !== rel.remote.columns.length) {
    throw new ApplyError(`tuple for "${rel.displayName}" has ${tuple.length} columns, its Relation message ${rel.remote.columns.length}`, { relation: rel.displayName });
  }
}

/** `$n` cast to the type of the target column receiving remote column `index`. */
export function param(rel: MappedRelation, index: number, n: number): string {
  if (recording !== null) recording[n] = index;
  return `$${n}::${rel.targetColumns[index]!.typeName}`;
}

export function column(rel: MappedRelation, index: number): string {
  return quoteIdent(rel.targetColumns[index]!.name);
}

/** The relation as UPDATE/DELETE/TRUNCATE name it: ONLY for a plain table (see header). */
export function target(rel: MappedRelation): string {
  return rel.relkind === 'p' ? rel.qualifiedName : `ONLY ${rel.qualifiedName}`;
}

/**
 * The remote row as the subquery `r` of a reshaped statement (mapping/columns.ts): one column per
 * remote column in `indexes`, under its remote name and of its row type, so that mapped
 * expressions read it by the names the publisher uses. Parameters from `firstParam`.
 */
export function rowSubquery(rel: MappedRelation, reshape: Reshape, indexes: readonly number[], firstParam: number): string {
  return `(${rowSelect(rel, reshape, indexes, firstParam)}) AS r`;
}

/** The SELECT of rowSubquery, for a CTE named r. */
export function rowSelect(rel: MappedRelation, reshape: Reshape, indexes: readonly number[], firstParam: number): string {
  const cols = indexes.map((i, n) => {
    if (recording !== null) recording[firstParam + n] = i;
    return `$${firstParam + n}::${reshape.rowTypes[i]} AS ${quoteIdent(rel.remote.columns[i]!.name)}`;
  });
  return `SELECT ${cols.join(', ')}`;
}

/** A directly written column's value read from `r`, cast when `r` holds it as the remote type. */
export function rowValue(rel: MappedRelation, reshape: Reshape, i: number): string {
  const value = `r.${quoteIdent(rel.remote.columns[i]!.name)}`;
  const type = rel.targetColumns[i]!.typeName;
  return reshape.rowTypes[i] === type ? value : `CAST(${value} AS ${type})`;
}

/** Remote columns `r` needs: the written ones and the inputs of the computed ones. */
export function rowColumns(direct: readonly number[], computed: Reshape['computed']): number[] {
  const need = new Set([...direct, ...computed.flatMap((c) => c.uses)]);
  return [...need].sort((a, b) => a - b);
}
