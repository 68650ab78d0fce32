/**
 * SQL for one change, built from the relation map: INSERT, UPDATE and DELETE texts with
 * every identifier quoted and every value a bind parameter. Texts are cached per
 * relation by shape (which columns are set, which locate the row), so the driver's
 * per-text prepared statements are reused across rows.
 *
 * Rows are located as the native apply worker does: by the replica identity key the
 * message carries (old key tuple when the key changed, else the key columns of the new
 * tuple); with REPLICA IDENTITY FULL by every sent column, NULL-safe, one row at most.
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

export function insertStatement(rel: MappedRelation, tuple: Tuple): Statement {
  checkWidth(rel, tuple);
  const text = cached(rel, 'I', () => {
    const cols = rel.targetColumns.map((c) => quoteIdent(c.name)).join(', ');
    const values = rel.targetColumns.map((_, i) => `$${i + 1}`).join(', ');
    return `INSERT INTO ${rel.qualifiedName} (${cols}) VALUES (${values})`;
  });
  return { text, params: tuple.map((v, i) => valueOf(rel, v, i)) };
}

/** Row locator: key columns with `=`, or every comparable column NULL-safe for FULL identity. */
interface Locator {
  shape: string;
  indexes: number[];
  tuple: Tuple;
  full: boolean;
}

function locator(rel: MappedRelation, what: 'UPDATE' | 'DELETE', oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple | undefined): Locator {
  if (oldKind === 'old' && oldTuple) {
    checkWidth(rel, oldTuple);
    // Unchanged TOAST values in the old row cannot be compared; the others still pin the row.
    const indexes = oldTuple.flatMap((v, i) => (v.kind === 'unchanged' ? [] : [i]));
    return { shape: `F${indexes.join(',')}`, indexes, tuple: oldTuple, full: true };
  }
  if (rel.keyIndexes.length === 0) {
    throw new ApplyError(
      `publisher did not send replica identity column${'s'} for ${what} on "${rel.displayName}" (REPLICA IDENTITY NOTHING or no key); the target cannot locate the row`,
      { relation: rel.displayName, command: what },
    );
  }
  const tuple = oldTuple ?? newTuple;
  if (!tuple) throw new ApplyError(`${what} on "${rel.displayName}" carries no key`, { relation: rel.displayName });
  checkWidth(rel, tuple);
  return { shape: 'K', indexes: rel.keyIndexes, tuple, full: false };
}

function whereClause(rel: MappedRelation, loc: Locator, firstParam: number): string {
  const conds = loc.indexes.map((i, n) => `${quoteIdent(rel.targetColumns[i]!.name)} ${loc.full ? 'IS NOT DISTINCT FROM' : '='} $${firstParam + n}`);
  if (!loc.full) return conds.join(' AND ');
  // FULL identity may match duplicate rows; native changes exactly one of them.
  return `ctid = (SELECT ctid FROM ${rel.qualifiedName} WHERE ${conds.join(' AND ') || 'true'} LIMIT 1)`;
}

export function updateStatement(rel: MappedRelation, oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple): Statement {
  checkWidth(rel, newTuple);
  const loc = locator(rel, 'UPDATE', oldKind, oldTuple, newTuple);
  // Unchanged TOAST columns ('u') are left as they are in the target.
  const setIndexes = newTuple.flatMap((v, i) => (v.kind === 'unchanged' ? [] : [i]));
  const shape = `U${setIndexes.join(',')}|${loc.shape}`;
  const text = cached(rel, shape, () => {
    const sets = setIndexes.map((i, n) => `${quoteIdent(rel.targetColumns[i]!.name)} = $${n + 1}`).join(', ');
    return `UPDATE ${rel.qualifiedName} SET ${sets} WHERE ${whereClause(rel, loc, setIndexes.length + 1)}`;
  });
  const params = setIndexes.map((i) => valueOf(rel, newTuple[i], i));
  for (const i of loc.indexes) params.push(valueOf(rel, loc.tuple[i], i));
  return { text, params };
}

export function deleteStatement(rel: MappedRelation, oldKind: 'key' | 'old', oldTuple: Tuple): Statement {
  const loc = locator(rel, 'DELETE', oldKind, oldTuple, undefined);
  const text = cached(rel, `D|${loc.shape}`, () => `DELETE FROM ${rel.qualifiedName} WHERE ${whereClause(rel, loc, 1)}`);
  return { text, params: loc.indexes.map((i) => valueOf(rel, loc.tuple[i], i)) };
}

export function truncateStatement(relations: MappedRelation[], restartIdentity: boolean): Statement {
  // Native applies TRUNCATE with RESTRICT whatever the publisher's CASCADE said: the
  // publisher already listed every published relation the cascade reached.
  const names = relations.map((r) => r.qualifiedName).join(', ');
  return { text: `TRUNCATE ${names}${restartIdentity ? ' RESTART IDENTITY' : ''}`, params: [] };
}
