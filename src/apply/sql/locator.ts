/**
 * Where an UPDATE or DELETE finds its row: the locator of a change (which columns, which
 * old values, which of them NULL), the WHERE clause it becomes and the parameters it
 * binds, and the mapping's row filter as a condition over the located row's tuple.
 *
 * Rows are located as the native apply worker does: by the replica identity key the
 * message carries (old key tuple when the key changed, else the key columns of the new
 * tuple); with REPLICA IDENTITY FULL by every sent column, NULLs matching NULLs, and one
 * row at most even when the target holds exact duplicates (RelationFindReplTupleSeq
 * stops at the first match). Columns of types without an equality operator (json, xml,
 * point…) are compared by their text forms, where native gives up (see fullCondition).
 */
import { ApplyError } from '../../errors.js';
import type { Tuple } from '../../protocol/messages.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Params } from './params.js';
import { checkWidth, column, noteParam, param, rowSubquery, target } from './statement-text.js';

/**
 * The mapping's row filter over the located row's tuple, as a condition the statement
 * carries (handlers/rows.ts decides when): a filtered-out change then changes nothing and
 * is no conflict. Its parameters follow the locator's, from `firstParam`.
 */
export function filterGuard(rel: MappedRelation, firstParam: number): string {
  const filter = rel.reshape!.rows!.filter!;
  return `(SELECT (${filter.expr}) IS TRUE FROM ${rowSubquery(rel, rel.reshape!, filter.uses, firstParam)})`;
}

export function addFilterParams(params: Params, rel: MappedRelation, loc: Locator): void {
  for (const i of rel.reshape!.rows!.filter!.uses) params.add(loc.tuple, i);
}

export function locatorParamCount(loc: Locator): number {
  return loc.indexes.length - loc.nulls.size;
}

/**
 * Row locator. `key`: the identity columns, `=` each. `full`: every sent column of the old
 * row; `nulls` are the ones whose old value is NULL (matched with IS NULL, no parameter).
 */
export interface Locator {
  shape: string;
  indexes: number[];
  nulls: Set<number>;
  tuple: Tuple;
  full: boolean;
  /** Located by the mapping's key (rows.ts RowPlan.key); `indexes` are the remote columns its values read. */
  keyed?: boolean;
}

export function locator(rel: MappedRelation, what: 'UPDATE' | 'DELETE', oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple | undefined): Locator {
  const key = rel.reshape?.rows?.key;
  if (key) {
    // A key override or a discriminator: the key's values over the old row (the identity
    // covers them, rows.ts), or over the new row when the key did not change.
    const tuple = oldTuple ?? newTuple;
    if (!tuple) throw new ApplyError(`${what} on "${rel.displayName}" carries no key`, { relation: rel.displayName, command: what });
    checkWidth(rel, tuple);
    const indexes = [...new Set(key.flatMap((k) => k.uses))].sort((a, b) => a - b);
    return { shape: 'M', indexes, nulls: new Set(), tuple, full: false, keyed: true };
  }
  if (oldKind === 'old' && oldTuple) {
    checkWidth(rel, oldTuple);
    // Unchanged TOAST values in the old row cannot be compared; the others still pin the row.
    // (pgoutput sends FULL old rows flattened, so this is a safeguard.)
    // A reshaped relation compares only the columns the target holds as they were sent.
    const indexes = oldTuple.flatMap((v, i) => (v.kind === 'unchanged' || (rel.reshape && !rel.reshape.direct[i]) ? [] : [i]));
    const nulls = new Set(indexes.filter((i) => oldTuple[i]!.kind === 'null'));
    // The NULL pattern is part of the shape: `col IS NULL` and `col = $n` let the target
    // use an index, where `IS NOT DISTINCT FROM $n` never does.
    const shape = `F${indexes.map((i) => `${i}${nulls.has(i) ? 'n' : ''}`).join(',')}`;
    return { shape, indexes, nulls, tuple: oldTuple, full: true };
  }
  if (rel.keyIndexes.length === 0) {
    throw new ApplyError(
      `publisher did not send replica identity columns for ${what} on "${rel.displayName}" (REPLICA IDENTITY NOTHING or no key); the target cannot locate the row`,
      { relation: rel.displayName, command: what },
    );
  }
  const tuple = oldTuple ?? newTuple;
  if (!tuple) throw new ApplyError(`${what} on "${rel.displayName}" carries no key`, { relation: rel.displayName, command: what });
  checkWidth(rel, tuple);
  return { shape: 'K', indexes: rel.keyIndexes, nulls: new Set(), tuple, full: false };
}

/** Parameters of a locator, in the order whereClause numbers them. */
export function addLocatorParams(params: Params, loc: Locator): void {
  for (const i of loc.indexes) if (!loc.nulls.has(i)) params.add(loc.tuple, i);
}

/**
 * One FULL-identity column condition. Types with an equality operator compare with it, like
 * native's tuples_equal. Types without one (json, xml, point, box, polygon, composites or
 * arrays of them…) make native fail the change with "could not identify an equality
 * operator for type …" (execReplication.c, PostgreSQL 14–18); pgsub instead compares the
 * target's text form of the stored value with the text form of the sent value read as the
 * column type, which for these types is the value exactly (json keeps its text verbatim).
 */
function fullCondition(rel: MappedRelation, index: number, n: number): string {
  const col = rel.targetColumns[index]!;
  if (col.hasEquality) return `${column(rel, index)} = ${param(rel, index, n)}`;
  return `${column(rel, index)}::pg_catalog.text = (${param(rel, index, n)})::pg_catalog.text`;
}

export function whereClause(rel: MappedRelation, loc: Locator, firstParam: number): string {
  if (loc.keyed) return keyedWhere(rel, loc, firstParam);
  let n = firstParam;
  if (!loc.full) return loc.indexes.map((i) => `${column(rel, i)} = ${param(rel, i, n++)}`).join(' AND ');
  const conds = loc.indexes.map((i) => (loc.nulls.has(i) ? `${column(rel, i)} IS NULL` : fullCondition(rel, i, n++)));
  const match = conds.join(' AND ') || 'true';
  // FULL identity may match duplicate rows; native changes exactly one of them. A ctid is
  // only unique within one table, so in a partitioned target the partition is pinned too.
  if (rel.relkind === 'p') return `(tableoid, ctid) = (SELECT tableoid, ctid FROM ${target(rel)} WHERE ${match} LIMIT 1)`;
  return `ctid = (SELECT ctid FROM ${target(rel)} WHERE ${match} LIMIT 1)`;
}

/**
 * The mapping's key (rows.ts): `col = $n` for a directly written column, the expression
 * over the row subquery for a computed one (an uncorrelated subquery, computed once, so an
 * index on the column still serves). Parameter n is loc.indexes[n - firstParam] in every
 * place it appears, always with the same type.
 */
function keyedWhere(rel: MappedRelation, loc: Locator, firstParam: number): string {
  const reshape = rel.reshape!;
  const number = new Map(loc.indexes.map((i, k) => [i, firstParam + k]));
  for (const [i, n] of number) noteParam(n, i);
  return reshape
    .rows!.key!.map((k) => {
      const col = quoteIdent(k.column.name);
      if (k.remote !== null) {
        const p = `$${number.get(k.remote)}::${reshape.rowTypes[k.remote]}`;
        return `${col} = ${reshape.rowTypes[k.remote] === k.column.typeName ? p : `CAST(${p} AS ${k.column.typeName})`}`;
      }
      const value = `CAST((${k.expr}) AS ${k.column.typeName})`;
      if (k.uses.length === 0) return `${col} = ${value}`;
      const row = k.uses.map((i) => `$${number.get(i)}::${reshape.rowTypes[i]} AS ${quoteIdent(rel.remote.columns[i]!.name)}`).join(', ');
      return `${col} = (SELECT ${value} FROM (SELECT ${row}) AS r)`;
    })
    .join(' AND ');
}
