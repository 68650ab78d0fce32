/**
 * SQL for one change, built from the relation map: INSERT, UPDATE and DELETE texts with
 * every identifier quoted and every value a bind parameter. Texts are cached per
 * relation by shape (which columns are set, which locate the row, which old values are
 * NULL), so the driver's per-text prepared statements are reused across rows.
 *
 * Every parameter is cast to its target column's type ($1::"pg_catalog"."int8"). The
 * value is still parsed by that type's input function, as native's slot_store_data does,
 * but the type is now part of the text: a server-side prepared statement fixes its
 * parameter types when first parsed, so after `ALTER COLUMN … TYPE bigint` a text that
 * left them to inference would keep parsing values as int4 ("out of range for type
 * integer"); a changed column type now gives a new text and a new statement.
 *
 * Rows are located as the native apply worker does: by the replica identity key the
 * message carries (old key tuple when the key changed, else the key columns of the new
 * tuple); with REPLICA IDENTITY FULL by every sent column, NULLs matching NULLs, and one
 * row at most even when the target holds exact duplicates (RelationFindReplTupleSeq
 * stops at the first match). Columns of types without an equality operator (json, xml,
 * point…) are compared by their text forms, where native gives up (see fullCondition).
 *
 * A plain target table is written with ONLY, like native, which changes exactly the
 * named relation and never rows of inheritance children; a partitioned target routes to
 * and searches its partitions (worker.c apply_handle_tuple_routing, and TRUNCATE of a
 * partitioned table truncates every partition).
 */
import { ApplyError } from '../errors.js';
import type { Tuple, TupleValue } from '../protocol/messages.js';
import { quoteIdent } from '../quote.js';
import type { MappedRelation } from './relmap.js';

export interface Statement {
  text: string;
  params: (string | null)[];
}

function valueOf(rel: MappedRelation, value: TupleValue | undefined, index: number): string | null {
  if (value === undefined) {
    throw new ApplyError(`tuple for "${rel.displayName}" has fewer columns than its Relation message`, { relation: rel.displayName });
  }
  switch (value.kind) {
    case 'null':
      return null;
    case 'text':
      return value.value;
    case 'unchanged':
      throw new ApplyError(`unchanged TOAST value where a full value is required, column "${rel.remote.columns[index]?.name}" of "${rel.displayName}"`, {
        relation: rel.displayName,
        column: rel.remote.columns[index]?.name,
      });
    case 'binary':
      throw new ApplyError(`binary value received without binary mode, column "${rel.remote.columns[index]?.name}" of "${rel.displayName}"`, {
        relation: rel.displayName,
      });
  }
}

function cached(rel: MappedRelation, shape: string, build: () => string): string {
  let text = rel.statements.get(shape);
  if (text === undefined) {
    text = build();
    rel.statements.set(shape, text);
  }
  return text;
}

function checkWidth(rel: MappedRelation, tuple: Tuple): void {
  if (tuple.length !== rel.remote.columns.length) {
    throw new ApplyError(`tuple for "${rel.displayName}" has ${tuple.length} columns, its Relation message ${rel.remote.columns.length}`, { relation: rel.displayName });
  }
}

/** `$n` cast to the type of the target column receiving remote column `index`. */
function param(rel: MappedRelation, index: number, n: number): string {
  return `$${n}::${rel.targetColumns[index]!.typeName}`;
}

function column(rel: MappedRelation, index: number): string {
  return quoteIdent(rel.targetColumns[index]!.name);
}

/** The relation as UPDATE/DELETE/TRUNCATE name it: ONLY for a plain table (see header). */
function target(rel: MappedRelation): string {
  return rel.relkind === 'p' ? rel.qualifiedName : `ONLY ${rel.qualifiedName}`;
}

export function insertStatement(rel: MappedRelation, tuple: Tuple): Statement {
  checkWidth(rel, tuple);
  const text = cached(rel, 'I', () => {
    const cols = rel.targetColumns.map((_, i) => column(rel, i)).join(', ');
    const values = rel.targetColumns.map((_, i) => param(rel, i, i + 1)).join(', ');
    return `INSERT INTO ${rel.qualifiedName} (${cols}) VALUES (${values})`;
  });
  return { text, params: tuple.map((v, i) => valueOf(rel, v, i)) };
}

/**
 * Row locator. `key`: the identity columns, `=` each. `full`: every sent column of the old
 * row; `nulls` are the ones whose old value is NULL (matched with IS NULL, no parameter).
 */
interface Locator {
  shape: string;
  indexes: number[];
  nulls: Set<number>;
  tuple: Tuple;
  full: boolean;
}

function locator(rel: MappedRelation, what: 'UPDATE' | 'DELETE', oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple | undefined): Locator {
  if (oldKind === 'old' && oldTuple) {
    checkWidth(rel, oldTuple);
    // Unchanged TOAST values in the old row cannot be compared; the others still pin the row.
    // (pgoutput sends FULL old rows flattened, so this is a safeguard.)
    const indexes = oldTuple.flatMap((v, i) => (v.kind === 'unchanged' ? [] : [i]));
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
function locatorParams(rel: MappedRelation, loc: Locator): (string | null)[] {
  return loc.indexes.filter((i) => !loc.nulls.has(i)).map((i) => valueOf(rel, loc.tuple[i], i));
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

function whereClause(rel: MappedRelation, loc: Locator, firstParam: number): string {
  let n = firstParam;
  if (!loc.full) return loc.indexes.map((i) => `${column(rel, i)} = ${param(rel, i, n++)}`).join(' AND ');
  const conds = loc.indexes.map((i) => (loc.nulls.has(i) ? `${column(rel, i)} IS NULL` : fullCondition(rel, i, n++)));
  const match = conds.join(' AND ') || 'true';
  // FULL identity may match duplicate rows; native changes exactly one of them. A ctid is
  // only unique within one table, so in a partitioned target the partition is pinned too.
  if (rel.relkind === 'p') return `(tableoid, ctid) = (SELECT tableoid, ctid FROM ${target(rel)} WHERE ${match} LIMIT 1)`;
  return `ctid = (SELECT ctid FROM ${target(rel)} WHERE ${match} LIMIT 1)`;
}

export function updateStatement(rel: MappedRelation, oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple): Statement {
  checkWidth(rel, newTuple);
  const loc = locator(rel, 'UPDATE', oldKind, oldTuple, newTuple);
  // Unchanged TOAST columns ('u') are left as they are in the target.
  const setIndexes = newTuple.flatMap((v, i) => (v.kind === 'unchanged' ? [] : [i]));
  const shape = `U${setIndexes.join(',')}|${loc.shape}`;
  const text = cached(rel, shape, () => {
    // Every sent value unchanged (FULL identity, only toasted columns): native still
    // updates the row to itself, firing its triggers; an empty SET is not SQL.
    const first = rel.targetColumns[0]!.name;
    const sets = setIndexes.length > 0 ? setIndexes.map((i, n) => `${column(rel, i)} = ${param(rel, i, n + 1)}`).join(', ') : `${quoteIdent(first)} = ${quoteIdent(first)}`;
    return `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, setIndexes.length + 1)}`;
  });
  const params = setIndexes.map((i) => valueOf(rel, newTuple[i], i));
  params.push(...locatorParams(rel, loc));
  return { text, params };
}

export function deleteStatement(rel: MappedRelation, oldKind: 'key' | 'old', oldTuple: Tuple): Statement {
  const loc = locator(rel, 'DELETE', oldKind, oldTuple, undefined);
  const text = cached(rel, `D|${loc.shape}`, () => `DELETE FROM ${target(rel)} WHERE ${whereClause(rel, loc, 1)}`);
  return { text, params: locatorParams(rel, loc) };
}

export function truncateStatement(relations: MappedRelation[], restartIdentity: boolean): Statement {
  // Native applies TRUNCATE with RESTRICT whatever the publisher's CASCADE said: the
  // publisher already listed every published relation the cascade reached. It truncates
  // the partitions of a partitioned table, never the inheritance children of a plain one.
  const names = relations.map((r) => target(r)).join(', ');
  return { text: `TRUNCATE ${names}${restartIdentity ? ' RESTART IDENTITY' : ''}`, params: [] };
}
