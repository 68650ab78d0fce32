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
 *
 * Binary mode: a tuple may mix binary values (the publisher's typsend output) and text
 * ones (types without a send function); each is bound as it came — a Buffer in binary
 * format, a string in text format — so the target reads it with the type's receive or
 * input function, as native's slot_store_data does per column. The cast stays in the
 * text; what a binary value is read as is its Parse type (relmap.ts BinaryColumns): by
 * default inferred from the cast, the REMOTE type where that differs, so a remote int4
 * read in binary and cast to a target int8 column works (native requires identical types
 * in binary mode). Text values always leave the type to the cast. The Parse types only
 * depend on which columns came in binary, and the wire keys its prepared statements by
 * text and Parse types, so the SQL texts cached here are shared by text and binary rows.
 * User-defined type OIDs embedded in arrays and composites are rewritten to the
 * target's (binary.ts) before binding.
 *
 * A reshaped relation (excluded or computed columns, mapping/columns.ts) binds the remote row as
 * a subquery `r` and selects the target's values from it; its rows are located as above,
 * by the columns the target holds as sent.
 */
import { ApplyError, SchemaMismatchError } from '../../errors.js';
import { formatPgTimestamp, schemaOf, type Tuple, type TupleValue } from '../../protocol/messages.js';
import { formatLsn } from '../../protocol/lsn.js';
import { LOG_COLUMNS } from '../../conflict/report.js';
import { counterColumn, type ConflictType } from '../../conflict/types.js';
import { quoteIdent } from '../../quote.js';
import { BinaryLayoutError, rewriteOids, textForUnreceivable } from './binary.js';
import type { MappedRelation } from './relmap.js';
import type { Reshape } from '../../mapping/columns.js';
import type { WireValue } from '../../pgwire/wire.js';
import type { Statement } from '../../pgwire/statement.js';

export type { Statement } from '../../pgwire/statement.js';

/**
 * A binary value as the target's receive function must see it (embedded OIDs rewritten),
 * or its text form where the receive function cannot read it (binary.ts).
 */
export function binaryValue(rel: MappedRelation, value: Buffer, index: number): Buffer | string {
  const text = textForUnreceivable(rel.remote.columns[index]?.typeOid ?? 0, value);
  if (text !== null) return text;
  const plan = rel.binary?.plans?.[index];
  if (!plan) return value;
  try {
    return rewriteOids(value, plan);
  } catch (err) {
    if (!(err instanceof BinaryLayoutError)) throw err;
    const column = rel.remote.columns[index]?.name;
    throw new SchemaMismatchError(
      `binary value of column "${column}" of "${rel.displayName}" does not fit the target's type: ${err.message}`,
      { relation: rel.displayName, column, type: err.typeName },
      { cause: err },
    );
  }
}

/** Bind parameters in order, with their Parse types when a binary value needs one. */
export class Params {
  readonly values: WireValue[] = [];
  #types: number[] | undefined;

  constructor(private readonly rel: MappedRelation) {}

  add(tuple: Tuple, index: number): void {
    const value = valueOf(this.rel, tuple[index], index);
    this.values.push(value);
    const parseType = Buffer.isBuffer(value) ? (this.rel.binary?.parseTypes?.[index] ?? 0) : 0;
    if (parseType !== 0) (this.#types ??= new Array<number>(this.values.length - 1).fill(0)).push(parseType);
    else this.#types?.push(0);
  }

  /** A value pgsub supplies itself (a ctid, an OID), in text format. */
  addText(value: string): void {
    this.values.push(value);
    this.#types?.push(0);
  }

  statement(text: string): Statement {
    return this.#types ? { text, params: this.values, paramTypes: this.#types } : { text, params: this.values };
  }
}

function valueOf(rel: MappedRelation, value: TupleValue | undefined, index: number): WireValue {
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
      return binaryValue(rel, value.value, index);
  }
}

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

/** The source's value of a GENERATED ALWAYS identity column is taken as sent, as native's apply does. */
const overriding = (rel: MappedRelation) => (rel.targetColumns.some((c) => c.identityAlways) ? 'OVERRIDING SYSTEM VALUE ' : '');

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

/**
 * UPDATE of a reshaped relation: the sent direct columns, and the computed columns all of
 * whose inputs were sent (an unchanged TOASTed input leaves an immutable result as it is).
 */
function reshapedUpdate(rel: MappedRelation, reshape: Reshape, loc: Locator, newTuple: Tuple, detect: Detect | null, guard: boolean): Statement {
  const sent = (i: number) => newTuple[i]!.kind !== 'unchanged';
  // A GENERATED ALWAYS identity column is never SET (428C9), as in updateStatement.
  const direct = reshape.direct.flatMap((d, i) => (d && sent(i) && !rel.targetColumns[i]!.identityAlways ? [i] : []));
  const computed = reshape.computed.filter((c) => c.uses.every(sent));
  const inRow = rowColumns(direct, computed);
  const shape = `RU${newTuple.map((v) => (v.kind === 'unchanged' ? 'u' : '')).join(',')}|${loc.shape}${detect ? `|d${detect.originId ?? ''}` : ''}${guard ? '|g' : ''}`;
  const text = cached(rel, shape, () => {
    const cols = [...direct.map((i) => column(rel, i)), ...computed.map((c) => quoteIdent(c.column.name))];
    const values = [...direct.map((i) => rowValue(rel, reshape, i)), ...computed.map((c) => `(${c.expr})`)];
    const first = quoteIdent(rel.targetColumns[reshape.direct.indexOf(true)]!.name);
    const sets = cols.length > 0 ? `(${cols.join(', ')}) = (SELECT ${values.join(', ')} FROM ${rowSubquery(rel, reshape, inRow, 1)})` : `${first} = ${first}`;
    const firstLoc = cols.length > 0 ? inRow.length + 1 : 1;
    const cond = guard ? filterGuard(rel, firstLoc + locatorParamCount(loc)) : null;
    const plain = `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, firstLoc)}${cond ? ` AND ${cond}` : ''}`;
    return detect ? detecting(rel, loc, plain, firstLoc, 'update', detect, cond) : plain;
  });
  const params = new Params(rel);
  if (direct.length + computed.length > 0) for (const i of inRow) params.add(newTuple, i);
  addLocatorParams(params, loc);
  if (guard) addFilterParams(params, rel, loc);
  return params.statement(text);
}

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

/**
 * Conflict detection on the pipelined path (conflict/detect.ts): the statement raises
 * (SQLSTATE PSC01) when it changed no row, or when the row's last writer was another
 * origin; null: a plain statement whose affected-row count the caller checks.
 */
export interface Detect {
  /** This session's replication origin id; null when the target cannot tell (no track_commit_timestamp). */
  originId: number | null;
  /** The target's RETURNING can name the old row (PostgreSQL 18+: RETURNING WITH (OLD AS …)). */
  returningOld: boolean;
  /**
   * An UPDATE of this relation whose row another origin wrote last is applied and logged by
   * the statement itself (its update_origin_differs policy is apply_remote; PostgreSQL 18);
   * absent: never (the careful path resolves it).
   */
  inlineOriginDiffers?: (rel: MappedRelation) => boolean;
  /** And a missing row is logged (its update_missing policy is skip) instead of raising. */
  inlineMissing?: (rel: MappedRelation) => boolean;
  /** The subscription the in-line conflict rows name. */
  subscription?: string;
}

/** The remote transaction a change belongs to, as an in-line conflict row records it. */
export interface RemoteRef {
  xid: number;
  finalLsn: bigint;
  commitTime: bigint;
}

/** `stmt` wrapped so that a missing row or a foreign last writer aborts the transaction. */
export function detecting(rel: MappedRelation, loc: Locator, stmt: string, firstLocParam: number, kind: 'update' | 'delete', detect: Detect, guard: string | null = null): string {
  // A guard (the mapping's row filter) that fails means the change was not for this table: no conflict.
  const only = guard ? `${guard} AND ` : '';
  const missing = `WHEN ${only}NOT EXISTS (SELECT FROM pgsub_changed) THEN "pgsub"."conflict"('${kind}_missing')`;
  if (detect.originId === null) return `WITH pgsub_changed AS (${stmt} RETURNING 1) SELECT CASE ${missing} END`;
  const differs = `WHEN ${only}EXISTS (SELECT FROM pgsub_changed WHERE r <> ${detect.originId}) THEN "pgsub"."conflict"('${kind}_origin_differs')`;
  // The last writer of the row as it was: DELETE returns the old row itself, UPDATE names it
  // on PostgreSQL 18; no extra probe either way.
  if (kind === 'delete') return `WITH pgsub_changed AS (${stmt} RETURNING (pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident AS r) SELECT CASE ${missing} ${differs} END`;
  if (detect.returningOld) {
    return `WITH pgsub_changed AS (${stmt} RETURNING WITH (OLD AS pgsub_old) (pg_catalog.pg_xact_commit_timestamp_origin(pgsub_old.xmin)).roident AS r) SELECT CASE ${missing} ${differs} END`;
  }
  // PostgreSQL 16/17: read the row in the same snapshot, before this statement writes it.
  const before = `SELECT (pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident AS r FROM ${target(rel)} WHERE ${whereClause(rel, loc, firstLocParam)} LIMIT 1`;
  return `WITH pgsub_before AS (${before}), pgsub_changed AS (${stmt} RETURNING 1) SELECT CASE ${missing} ${differs.replace('pgsub_changed WHERE', 'pgsub_before WHERE')} END`;
}

/** `guard`: the statement itself checks the mapping's row filter over the located row's tuple (filterGuard). */
export function updateStatement(
  rel: MappedRelation,
  oldKind: 'key' | 'old' | undefined,
  oldTuple: Tuple | undefined,
  newTuple: Tuple,
  detect: Detect | null = null,
  guard = false,
  remote: RemoteRef | null = null,
): Statement {
  checkWidth(rel, newTuple);
  const loc = locator(rel, 'UPDATE', oldKind, oldTuple, newTuple);
  if (rel.reshape) return reshapedUpdate(rel, rel.reshape, loc, newTuple, detect, guard);
  // Unchanged TOAST columns ('u') are left as they are in the target.
  const setIndexes = newTuple.flatMap((v, i) => (v.kind === 'unchanged' || rel.targetColumns[i]!.identityAlways ? [] : [i]));
  const inline = remote !== null && oldKind === undefined && !guard && detect !== null && inlinesOriginDiffers(rel, detect, setIndexes);
  const inlineShape = inline ? (detect.inlineMissing?.(rel) ? 'im' : 'i') : '';
  const shape = `U${setIndexes.join(',')}|${loc.shape}${detect ? `|d${detect.originId ?? ''}${inlineShape}` : ''}`;
  const text = cached(rel, shape, () => {
    // Every sent value unchanged (FULL identity, only toasted columns): native still
    // updates the row to itself, firing its triggers; an empty SET is not SQL.
    const first = (rel.targetColumns.find((c) => !c.identityAlways) ?? rel.targetColumns[0]!).name;
    const sets = setIndexes.length > 0 ? setIndexes.map((i, n) => `${column(rel, i)} = ${param(rel, i, n + 1)}`).join(', ') : `${quoteIdent(first)} = ${quoteIdent(first)}`;
    const plain = `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, setIndexes.length + 1)}`;
    if (inline) return updateLoggingConflicts(rel, plain, setIndexes, setIndexes.length + locatorParamCount(loc) + 1, detect);
    return detect ? detecting(rel, loc, plain, setIndexes.length + 1, 'update', detect) : plain;
  });
  const params = new Params(rel);
  for (const i of setIndexes) params.add(newTuple, i);
  addLocatorParams(params, loc);
  if (!inline) return params.statement(text);
  addInlineParams(params, rel, detect!.subscription!, remote!);
  const statement = params.statement(text);
  RESOLVING.add(statement);
  return statement;
}

/** The UPDATEs built to resolve conflicts themselves: their result rows name the conflicts met. */
const RESOLVING = new WeakSet<Statement>();

/** Whether `statement` resolves the default policies' conflicts itself (its rows name them); else its result has nothing to read. */
export function resolvesConflicts(statement: Statement): boolean {
  return RESOLVING.has(statement);
}

/** In-line resolution applies: detection with origins on PostgreSQL 18, apply_remote for this table, a plain relation whose key columns are all set. */
function inlinesOriginDiffers(rel: MappedRelation, detect: Detect, setIndexes: number[]): boolean {
  if (detect.originId === null || !detect.returningOld || !detect.inlineOriginDiffers || detect.subscription === undefined || rel.reshape) return false;
  // The relation's recent conflicts first: for a table nobody else writes that answers at once (a per-row check).
  return detect.inlineOriginDiffers(rel) && rel.keyIndexes.length > 0 && rel.keyIndexes.every((i) => setIndexes.includes(i));
}

/** Names as the conflict rows show them (JSON arrays, bound as values): every column, the key's. */
const INLINE_NAMES = new WeakMap<MappedRelation, { all: string; key: string }>();

function addInlineParams(params: Params, rel: MappedRelation, subscription: string, remote: RemoteRef): void {
  let names = INLINE_NAMES.get(rel);
  if (!names) {
    const columnName = (i: number) => rel.remote.columns[i]?.name ?? `#${i}`;
    names = { all: JSON.stringify(rel.remote.columns.map((_, i) => columnName(i))), key: JSON.stringify(rel.keyIndexes.map(columnName)) };
    INLINE_NAMES.set(rel, names);
  }
  params.addText(subscription);
  params.addText(rel.displayName);
  params.addText(schemaOf(rel.remote));
  params.addText(rel.remote.name);
  params.addText(names.all);
  params.addText(names.key);
  params.addText(formatLsn(remote.finalLsn));
  params.addText(String(remote.xid));
  params.addText(formatPgTimestamp(remote.commitTime));
}

/**
 * An UPDATE that applies the remote change whoever wrote the row last, and when that was
 * another origin writes the conflict's log row and counter in the same statement — the
 * careful path's apply_remote for update_origin_differs without rolling back: a target
 * with local writers, where such conflicts come every other transaction, keeps the
 * pipelined pace. A missing row is logged the same way where its policy is skip, and
 * raises otherwise (the careful path resolves it). The result has one row per conflict
 * logged, naming it ('update_origin_differs' or 'update_missing'). The JSON of the sent
 * values is built from the bound parameters, in SQL, only for a row that is logged.
 */
function updateLoggingConflicts(rel: MappedRelation, plain: string, setIndexes: number[], first: number, detect: Detect): string {
  // Keep in step with the text's cache key (updateStatement's inlineShape).
  const $ = (k: number) => `$${first + k}`;
  const sentText = (i: number) => {
    const n = setIndexes.indexOf(i);
    return n < 0 ? 'NULL' : `(${param(rel, i, n + 1)})::pg_catalog.text`;
  };
  const json = (names: string, indexes: number[]) =>
    `(SELECT pg_catalog.jsonb_object_agg(n.name, v.value) FROM pg_catalog.jsonb_array_elements_text(${names}::pg_catalog.jsonb) WITH ORDINALITY AS n(name, i) ` +
    `JOIN pg_catalog.unnest(ARRAY[${indexes.map(sentText).join(', ')}]::pg_catalog.text[]) WITH ORDINALITY AS v(value, i) USING (i))`;
  const remoteRef = `${$(6)}::pg_catalog.pg_lsn, ${$(7)}::pg_catalog.int8, ${$(8)}::pg_catalog.timestamptz`;
  const tuples = `${json($(5), rel.keyIndexes)}, ${json(
    $(4),
    rel.remote.columns.map((_, i) => i),
  )}`;
  const logRow = (type: ConflictType) => `${$(0)}, '${type}', ${$(1)}, ${$(2)}, ${$(3)}, ${tuples}`;
  const origin = '(pg_catalog.pg_xact_commit_timestamp_origin(pgsub_old.xmin))';
  const differs = quoteIdent(counterColumn('update_origin_differs'));
  const missing = quoteIdent(counterColumn('update_missing'));
  const logsMissing = detect.inlineMissing?.(rel) === true;
  return (
    `WITH pgsub_changed AS (${plain} RETURNING WITH (OLD AS pgsub_old) ${origin}.roident AS r, ${origin}.timestamp AS ts, pg_catalog.to_jsonb(pgsub_old.*) AS j), ` +
    `pgsub_differs AS (INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) ` +
    `SELECT ${logRow('update_origin_differs')}, j, r::pg_catalog.text, ts, ${remoteRef}, 'apply_remote', 'row last written by origin ' || r || ' at ' || ts ` +
    `FROM pgsub_changed WHERE r <> ${detect.originId} RETURNING 'update_origin_differs'::pg_catalog.text AS c), ` +
    (logsMissing
      ? `pgsub_missing AS (INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) SELECT ${logRow('update_missing')}, NULL, NULL, NULL, ${remoteRef}, 'skip', NULL ` +
        `WHERE NOT EXISTS (SELECT FROM pgsub_changed) RETURNING 'update_missing'::pg_catalog.text AS c), `
      : '') +
    `pgsub_logged AS (SELECT c FROM pgsub_differs${logsMissing ? ' UNION ALL SELECT c FROM pgsub_missing' : ''}), ` +
    `pgsub_counted AS (INSERT INTO "pgsub"."subscription_stats" AS s ("subscription", ${differs}, ${missing}) ` +
    `SELECT ${$(0)}, pg_catalog.count(*) FILTER (WHERE c = 'update_origin_differs'), pg_catalog.count(*) FILTER (WHERE c = 'update_missing') FROM pgsub_logged HAVING pg_catalog.count(*) > 0 ` +
    `ON CONFLICT ("subscription") DO UPDATE SET ${differs} = s.${differs} + EXCLUDED.${differs}, ${missing} = s.${missing} + EXCLUDED.${missing}) ` +
    (logsMissing ? '' : `SELECT "pgsub"."conflict"('update_missing')::pg_catalog.text WHERE NOT EXISTS (SELECT FROM pgsub_changed) UNION ALL `) +
    'SELECT c FROM pgsub_logged'
  );
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

export function deleteStatement(rel: MappedRelation, oldKind: 'key' | 'old', oldTuple: Tuple, detect: Detect | null = null, guard = false): Statement {
  const loc = locator(rel, 'DELETE', oldKind, oldTuple, undefined);
  const text = cached(rel, `D|${loc.shape}${detect ? `|d${detect.originId ?? ''}` : ''}${guard ? '|g' : ''}`, () => {
    const cond = guard ? filterGuard(rel, 1 + locatorParamCount(loc)) : null;
    const plain = `DELETE FROM ${target(rel)} WHERE ${whereClause(rel, loc, 1)}${cond ? ` AND ${cond}` : ''}`;
    return detect ? detecting(rel, loc, plain, 1, 'delete', detect, cond) : plain;
  });
  const params = new Params(rel);
  addLocatorParams(params, loc);
  if (guard) addFilterParams(params, rel, loc);
  return params.statement(text);
}

export function truncateStatement(relations: MappedRelation[], restartIdentity: boolean): Statement {
  // Native applies TRUNCATE with RESTRICT whatever the publisher's CASCADE said: the
  // publisher already listed every published relation the cascade reached. It truncates
  // the partitions of a partitioned table, never the inheritance children of a plain one.
  const names = relations.map((r) => target(r)).join(', ');
  return { text: `TRUNCATE ${names}${restartIdentity ? ' RESTART IDENTITY' : ''}`, params: [] };
}
