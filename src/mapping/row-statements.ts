/**
 * Statements of the row semantics (rows.ts) beyond INSERT/UPDATE/DELETE themselves:
 * the row filter's verdicts, the soft delete's UPDATE, the TRUNCATE policies of a
 * mapped table, and what the careful path needs of any reshaped table (its rows
 * updated by ctid with the mapped values, the local rows its new values collide with).
 * Values are bind parameters; expressions and the discriminator's constant come from
 * the config.
 */
import { ApplyError } from '../errors.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { formatPgTimestamp, type Tuple, type TupleValue } from '../protocol/messages.js';
import { quoteIdent } from '../quote.js';
import type { Reshape } from './columns.js';
import type { MappedRelation } from '../apply/sql/mapped-relation.js';
import type { RowPlan } from './rows.js';
import { Params } from '../apply/sql/params.js';
import { cached, column, rowColumns, rowSubquery, rowValue, target } from '../apply/sql/statement-text.js';
import { addFilterParams, addLocatorParams, filterGuard, locator, locatorParamCount, whereClause, type Locator } from '../apply/sql/locator.js';
import { detecting, type Detect } from '../apply/sql/detecting.js';
import { softDeleted } from '../apply/sql/insert.js';
import type { Statement } from '../pgwire/statement.js';

type SoftDelete = NonNullable<RowPlan['softDelete']>;

/**
 * The filter's input rows of an UPDATE, as PostgreSQL 15's pgoutput_row_filter builds
 * them: the old row is the old tuple (key columns, or all under FULL) and, for columns
 * it does not carry, the new tuple's values; the new row takes the old tuple's value
 * where the new one was not sent (an unchanged TOASTed identity column).
 */
export function filterRows(rel: MappedRelation, oldTuple: Tuple | undefined, newTuple: Tuple): { old: Tuple; new: Tuple } {
  if (!oldTuple) return { old: newTuple, new: newTuple };
  const carried = (i: number, v: TupleValue | undefined) => v !== undefined && v.kind !== 'unchanged' && (rel.remote.replicaIdentity === 'full' || rel.remote.columns[i]!.isKey);
  return {
    old: newTuple.map((v, i) => (carried(i, oldTuple[i]) ? oldTuple[i]! : v)),
    new: newTuple.map((v, i) => (v.kind === 'unchanged' && oldTuple[i] ? oldTuple[i]! : v)),
  };
}

/** `SELECT (filter) IS TRUE …` for each row: one round trip gives every verdict. */
export function verdictStatement(rel: MappedRelation, reshape: Reshape, rows: readonly Tuple[]): Statement {
  const filter = reshape.rows!.filter!;
  const uses = filter.uses;
  const text = cached(rel, `FV${rows.length}`, () => {
    const parts = rows.map((_, r) => `(SELECT (${filter.expr}) IS TRUE FROM ${rowSubquery(rel, reshape, uses, r * uses.length + 1)})::pg_catalog.text`);
    return `SELECT ${parts.join(', ')}`;
  });
  const params = new Params(rel);
  for (const row of rows) for (const i of uses) params.add(row, i);
  return params.statement(text);
}

/** SET of a soft delete: the flag, the source commit time, the remote LSN; parameters from `first`. */
function softSets(soft: SoftDelete, first: number): { sets: string; count: number } {
  const sets: string[] = [];
  let n = first;
  if (soft.flag) sets.push(`${quoteIdent(soft.flag.name)} = true`);
  if (soft.at) sets.push(`${quoteIdent(soft.at.name)} = $${n++}::pg_catalog.timestamptz`);
  if (soft.lsn) sets.push(`${quoteIdent(soft.lsn.name)} = $${n++}::pg_catalog.pg_lsn`);
  return { sets: sets.join(', '), count: n - first };
}

function addSoftParams(params: Params, soft: SoftDelete, commitTime: bigint, lsn: Lsn, rel: MappedRelation): void {
  // A transaction applied while it streams (streaming = parallel) has no commit yet.
  if ((soft.at || soft.lsn) && (commitTime === 0n || lsn === 0xffffffffffffffffn)) {
    throw new ApplyError(
      `soft_delete of "${rel.displayName}" records the source commit time or LSN, which a transaction applied while it streams (streaming = parallel) does not have yet; use streaming = on for this subscription`,
      { relation: rel.displayName },
    );
  }
  if (soft.at) params.addText(formatPgTimestamp(commitTime));
  if (soft.lsn) params.addText(formatLsn(lsn));
}

/** A DELETE as the soft delete's UPDATE of the located row. */
export function softDeleteStatement(rel: MappedRelation, soft: SoftDelete, loc: Locator, commitTime: bigint, lsn: Lsn, detect: Detect | null, guard = false): Statement {
  const text = cached(rel, `SD|${loc.shape}${detect ? `|d${detect.originId ?? ''}` : ''}${guard ? '|g' : ''}`, () => {
    const { sets, count } = softSets(soft, 1);
    const cond = guard ? filterGuard(rel, count + 1 + locatorParamCount(loc)) : null;
    const plain = `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, count + 1)}${cond ? ` AND ${cond}` : ''}`;
    return detect ? detecting(rel, loc, plain, count + 1, 'update', detect, cond) : plain;
  });
  const params = new Params(rel);
  addSoftParams(params, soft, commitTime, lsn, rel);
  addLocatorParams(params, loc);
  if (guard) addFilterParams(params, rel, loc);
  return params.statement(text);
}

/**
 * Before an UPDATE that may move a row's key (it sent an old row): the row marked deleted
 * under the new key — this source's own, the key includes its discriminator — gives way,
 * so that the moved row takes that key with the new values, live, as an INSERT of the key
 * would revive it (docs/mapping.md "Keys that move"). A live row there is left alone: the
 * UPDATE then meets it as update_exists. `tuple` is the new row (unsent values filled from
 * the old one, filterRows); `except` the located row on the careful path.
 */
export function tombstoneDelete(rel: MappedRelation, soft: SoftDelete, tuple: Tuple, except: { reloid: string; tid: string } | null = null): Statement {
  const loc = locator(rel, 'DELETE', rel.reshape?.rows?.key ? undefined : 'key', undefined, tuple);
  const text = cached(rel, `TD|${loc.shape}${except ? '|e' : ''}`, () => {
    const n = 1 + locatorParamCount(loc);
    const notSelf = except ? ` AND NOT (tableoid = $${n}::pg_catalog.oid AND ctid = $${n + 1}::pg_catalog.tid)` : '';
    return `DELETE FROM ${target(rel)} WHERE ${whereClause(rel, loc, 1)} AND ${softDeleted(soft, '')}${notSelf}`;
  });
  const params = new Params(rel);
  addLocatorParams(params, loc);
  if (except) {
    params.addText(except.reloid);
    params.addText(except.tid);
  }
  return params.statement(text);
}

/** The soft delete of one local row (careful path). */
export function softDeleteRow(rel: MappedRelation, soft: SoftDelete, reloid: string, tid: string, commitTime: bigint, lsn: Lsn): Statement {
  const text = cached(rel, 'SDR', () => {
    const { sets, count } = softSets(soft, 1);
    return `UPDATE ${target(rel)} SET ${sets} WHERE tableoid = $${count + 1}::pg_catalog.oid AND ctid = $${count + 2}::pg_catalog.tid`;
  });
  const params = new Params(rel);
  addSoftParams(params, soft, commitTime, lsn, rel);
  params.addText(reloid);
  params.addText(tid);
  return params.statement(text);
}

/** `column = constant` of a discriminated relation's own rows; null without a discriminator. */
function ownRows(reshape: Reshape): string | null {
  const d = reshape.rows?.discriminator;
  if (!d) return null;
  const expr = reshape.computed.find((c) => c.column.name === d.column.name)!.expr;
  return `${quoteIdent(d.column.name)} = ${expr}`;
}

/**
 * TRUNCATE of a relation with row semantics, by its policy: `ignore` nothing; `soft_delete`
 * marks every live row; `truncate` of a discriminated relation deletes only its source's
 * rows. Null: a plain TRUNCATE (truncateStatement).
 */
export function truncatePolicyStatement(rel: MappedRelation, commitTime: bigint, lsn: Lsn): Statement | 'ignore' | null {
  const reshape = rel.reshape;
  const rows = reshape?.rows;
  if (!reshape || !rows) return null;
  if (rows.truncate === 'ignore') return 'ignore';
  const own = ownRows(reshape);
  if (rows.truncate === 'soft_delete') {
    const soft = rows.softDelete!;
    const { sets } = softSets(soft, 1);
    const params = new Params(rel);
    addSoftParams(params, soft, commitTime, lsn, rel);
    return params.statement(`UPDATE ${target(rel)} SET ${sets} WHERE NOT (${softDeleted(soft, '')})${own ? ` AND ${own}` : ''}`);
  }
  if (own) return { text: `DELETE FROM ${target(rel)} WHERE ${own}`, params: [] };
  return null;
}

/** The careful path's UPDATE of one local row with the mapped values of `tuple` (sent columns only). */
export function reshapedRowUpdate(rel: MappedRelation, reshape: Reshape, tuple: Tuple, reloid: string, tid: string, revive: boolean): Statement {
  const sent = (i: number) => tuple[i]!.kind !== 'unchanged';
  const direct = reshape.direct.flatMap((d, i) => (d && sent(i) && !rel.targetColumns[i]!.identityAlways ? [i] : []));
  const computed = reshape.computed.filter((c) => c.uses.every(sent));
  const inRow = rowColumns(direct, computed);
  const soft = revive ? reshape.rows?.softDelete : undefined;
  const shape = `RRU${tuple.map((v) => (v.kind === 'unchanged' ? 'u' : '')).join(',')}${soft ? '|r' : ''}`;
  const text = cached(rel, shape, () => {
    const cols = [...direct.map((i) => column(rel, i)), ...computed.map((c) => quoteIdent(c.column.name))];
    const values = [...direct.map((i) => rowValue(rel, reshape, i)), ...computed.map((c) => `(${c.expr})`)];
    const clears = soft
      ? [
          ...(soft.flag ? [`${quoteIdent(soft.flag.name)} = false`] : []),
          ...(soft.at ? [`${quoteIdent(soft.at.name)} = NULL`] : []),
          ...(soft.lsn ? [`${quoteIdent(soft.lsn.name)} = NULL`] : []),
        ]
      : [];
    const first = quoteIdent(rel.targetColumns[reshape.direct.indexOf(true)]?.name ?? reshape.computed[0]!.column.name);
    const sets = [...(cols.length > 0 ? [`(${cols.join(', ')}) = (SELECT ${values.join(', ')} FROM ${rowSubquery(rel, reshape, inRow, 1)})`] : []), ...clears];
    const n = cols.length > 0 ? inRow.length : 0;
    return `UPDATE ${target(rel)} SET ${sets.length > 0 ? sets.join(', ') : `${first} = ${first}`} WHERE tableoid = $${n + 1}::pg_catalog.oid AND ctid = $${n + 2}::pg_catalog.tid`;
  });
  const params = new Params(rel);
  if (direct.length + computed.length > 0) for (const i of inRow) params.add(tuple, i);
  params.addText(reloid);
  params.addText(tid);
  return params.statement(text);
}

/** A unique index of a reshaped target, by target column names. */
export interface TargetUniqueIndex {
  name: string;
  columns: string[] | null;
  nullsNotDistinct: boolean;
}

/**
 * The careful path's search for local rows that the mapped new values of `tuple` collide
 * with, per unique index all of whose columns the mapping fills from sent values: one
 * query, `n` (the index's position) first, then `local` (the row's columns). A row marked
 * deleted (soft delete) under the new row's own key is not in the way (an INSERT revives
 * it, an UPDATE moving onto it replaces it: tombstoneDelete); one under another key is.
 * Null: nothing to search.
 */
export function reshapedHitsStatement(
  rel: MappedRelation,
  reshape: Reshape,
  indexes: readonly TargetUniqueIndex[],
  tuple: Tuple,
  local: string,
  except: { reloid: string; tid: string } | null,
): { statement: Statement; names: string[] } | null {
  const sent = (i: number) => tuple[i] !== undefined && tuple[i]!.kind !== 'unchanged';
  const value = new Map<string, { sql: string; uses: number[] }>();
  reshape.direct.forEach((d, i) => {
    if (d && sent(i)) value.set(rel.targetColumns[i]!.name, { sql: rowValue(rel, reshape, i), uses: [i] });
  });
  for (const c of reshape.computed) if (c.uses.every(sent)) value.set(c.column.name, { sql: `CAST((${c.expr}) AS ${c.column.typeName})`, uses: c.uses });
  const usable = indexes.filter((x) => x.columns?.every((c) => value.has(c)));
  if (usable.length === 0) return null;
  const soft = reshape.rows?.softDelete;
  // A row marked deleted under the new row's own key is revived, not in the way; one under
  // another key (another shard's, in an index without the discriminator) is a collision.
  const ownKey = soft && reshape.rows!.keyNames.every((c) => value.has(c)) ? reshape.rows!.keyNames : null;
  const slots = [...new Set([...usable.flatMap((x) => x.columns!), ...(ownKey ?? [])])];
  const inRow = [...new Set(slots.flatMap((c) => value.get(c)!.uses))].sort((a, b) => a - b);
  const params = new Params(rel);
  for (const i of inRow) params.add(tuple, i);
  let n = inRow.length;
  const exceptParams = except ? [++n, ++n] : null;
  const revivable = soft
    ? ownKey
      ? `NOT (${softDeleted(soft, 'pgsub_local.')} AND ${ownKey.map((c) => `pgsub_local.${quoteIdent(c)} = pgsub_new."v${slots.indexOf(c)}"`).join(' AND ')})`
      : `NOT (${softDeleted(soft, 'pgsub_local.')})`
    : null;
  const parts = usable.map((x, k) => {
    const conds = x.columns!.map((c) => `pgsub_local.${quoteIdent(c)} ${x.nullsNotDistinct ? 'IS NOT DISTINCT FROM' : '='} pgsub_new."v${slots.indexOf(c)}"`);
    if (exceptParams) conds.push(`NOT (pgsub_local.tableoid = $${exceptParams[0]}::pg_catalog.oid AND pgsub_local.ctid = $${exceptParams[1]}::pg_catalog.tid)`);
    if (revivable) conds.push(revivable);
    return `SELECT ${k}, ${local} FROM ${target(rel)} AS pgsub_local, pgsub_new WHERE ${conds.join(' AND ')}`;
  });
  const text = cached(
    rel,
    `RH${usable.map((x) => x.name).join(',')}|${inRow.join(',')}|${except ? 'e' : ''}|${ownKey ? 'k' : ''}|${local.length}`,
    () =>
      `WITH pgsub_new AS (SELECT ${slots.map((c, k) => `${value.get(c)!.sql} AS "v${k}"`).join(', ')} FROM ${rowSubquery(rel, reshape, inRow, 1)}) ${parts.join(' UNION ALL ')}`,
  );
  if (except) {
    params.addText(except.reloid);
    params.addText(except.tid);
  }
  return { statement: params.statement(text), names: usable.map((x) => x.name) };
}
