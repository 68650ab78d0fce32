/**
 * The careful path: one remote change at a time, each step awaited, for a remote
 * transaction in which the pipelined path met a conflict (detect.ts explains how it
 * gets here). Per change it finds what native's apply worker finds — the local row by
 * the replica identity (locked FOR UPDATE, with its last writer's origin when the
 * target tracks commit timestamps), and the local rows that the new values collide
 * with in each immediate unique index — names the conflict with PostgreSQL 18's
 * vocabulary, and resolves it with the policy configured for that table and type:
 *   error        throw ApplyConflictError: the target transaction rolls back and the
 *                service retries after backoff (or disables, disable_on_error);
 *   skip,        the remote change is not applied; the local state stays as it is;
 *   keep_local
 *   apply_remote insert_exists: the existing row takes the remote values;
 *                update_exists / multiple_unique_conflicts: the rows in the way are
 *                deleted, then the change is applied; update_missing: the new row is
 *                inserted; *_origin_differs: the change is applied (native's only choice).
 * Every resolved conflict writes its conflict_log row and counter in the same target
 * transaction (report.ts). Unique indexes with expressions or predicates are not
 * searched: a violation of one is an ordinary apply error (23505), retried.
 */
import { ApplyConflictError } from '../../errors.js';
import { formatLsn } from '../../protocol/lsn.js';
import type { Tuple } from '../../protocol/messages.js';
import type { MappedRelation } from '../sql/mapped-relation.js';
import type { ApplyState, RemoteTransaction } from '../txn/apply-state.js';
import { Params } from '../sql/params.js';
import { cached, column, param, target } from '../sql/statement-text.js';
import { addLocatorParams, locator, whereClause } from '../sql/locator.js';
import { insertStatement } from '../sql/insert.js';
import type { Statement } from '../../pgwire/statement.js';
import { filterRows, reshapedHitsStatement, reshapedRowUpdate, softDeleteRow, tombstoneDelete } from '../../mapping/row-statements.js';
import { queryRows } from '../../pgwire/connect.js';
import { quoteIdent } from '../../quote.js';
import { conflictLogStatement, tupleJson, unchangedColumns, type ConflictRecord } from '../../conflict/report.js';
import { policyFor, type ConflictType, type Policy } from '../../conflict/types.js';
import { noteConflict } from './detect-option.js';

interface LocalRow {
  reloid: string;
  tid: string;
  json: string;
  origin: string | null;
  ts: string | null;
}

interface UniqueIndex {
  name: string;
  /** Remote column indexes of the key columns; null: not searchable (expressions, predicate, column not published). */
  columns: number[] | null;
  /** Target column names of the key columns (a reshaped relation is searched by them); null: not searchable. */
  names: string[] | null;
  nullsNotDistinct: boolean;
}

const uniqueIndexCache = new WeakMap<MappedRelation, UniqueIndex[]>();

/** Local-row columns: location, the row as JSON, its last writer. */
function localColumns(state: ApplyState): string {
  const origin =
    state.session.originId === null
      ? 'NULL::pg_catalog.text, NULL::pg_catalog.text'
      : '(pg_catalog.pg_xact_commit_timestamp_origin(pgsub_local.xmin)).roident::pg_catalog.text, (pg_catalog.pg_xact_commit_timestamp_origin(pgsub_local.xmin)).timestamp::pg_catalog.text';
  return `pgsub_local.tableoid::pg_catalog.int8::pg_catalog.text, pgsub_local.ctid::pg_catalog.text, pg_catalog.to_jsonb(pgsub_local.*)::pg_catalog.text, ${origin}`;
}

function toLocal(row: unknown[], offset = 0): LocalRow {
  const v = (i: number) => (row[offset + i] ?? null) as string | null;
  return { reloid: v(0)!, tid: v(1)!, json: v(2)!, origin: v(3), ts: v(4) };
}

async function run(state: ApplyState, stmt: Statement): Promise<unknown[][]> {
  const result = await state.conn.execute(stmt.text, stmt.params, { wantRows: true, ...(stmt.paramTypes ? { paramTypes: stmt.paramTypes } : {}) });
  return result.rows;
}

async function uniqueIndexes(state: ApplyState, rel: MappedRelation): Promise<UniqueIndex[]> {
  const known = uniqueIndexCache.get(rel);
  if (known) return known;
  const nnd = state.conn.serverVersionNum >= 150000 ? 'i.indnullsnotdistinct' : 'false';
  const rows = await queryRows<{ name: string; simple: string; nnd: string; cols: string | null }>(
    state.conn,
    ['name', 'simple', 'nnd', 'cols'],
    `SELECT i.indexrelid::pg_catalog.regclass::pg_catalog.text, (i.indpred IS NULL AND i.indexprs IS NULL)::pg_catalog.text, (${nnd})::pg_catalog.text,
            (SELECT pg_catalog.json_agg(a.attname ORDER BY k.n) FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE k.n <= i.indnkeyatts)::pg_catalog.text
       FROM pg_catalog.pg_index i
      WHERE i.indrelid = pg_catalog.to_regclass($1) AND i.indisunique AND i.indimmediate
      ORDER BY i.indexrelid`,
    [rel.qualifiedName],
  );
  const byName = new Map(rel.remote.columns.map((c, i) => [c.name, i]));
  const indexes = rows.map((r) => {
    const names = JSON.parse(r.cols ?? '[]') as string[];
    const cols = names.map((n) => byName.get(n));
    const usable = r.simple === 'true' && names.length > 0 && cols.every((c) => c !== undefined);
    return { name: r.name, columns: usable ? (cols as number[]) : null, names: r.simple === 'true' && names.length > 0 ? names : null, nullsNotDistinct: r.nnd === 'true' };
  });
  uniqueIndexCache.set(rel, indexes);
  return indexes;
}

interface Hits {
  /** Indexes in which the values collide with a local row. */
  indexes: string[];
  /** The distinct local rows in the way. */
  rows: LocalRow[];
}

/** Local rows that `tuple`'s values collide with, per unique index; `except` is the row being updated. */
async function uniqueHits(state: ApplyState, rel: MappedRelation, tuple: Tuple, except: LocalRow | null): Promise<Hits> {
  const indexes = await uniqueIndexes(state, rel);
  if (rel.reshape) {
    // The target's values are the mapped ones (renamed, computed, a discriminator): searched by target names.
    const built = reshapedHitsStatement(
      rel,
      rel.reshape,
      indexes.map((x) => ({ name: x.name, columns: x.names, nullsNotDistinct: x.nullsNotDistinct })),
      tuple,
      localColumns(state),
      except,
    );
    if (!built) return { indexes: [], rows: [] };
    return collect(await run(state, built.statement), built.names);
  }
  const params = new Params(rel);
  const parts: string[] = [];
  const names: string[] = [];
  for (const index of indexes) {
    if (!index.columns) continue;
    const values = index.columns.map((i) => tuple[i]);
    // NULLs never collide (unless NULLS NOT DISTINCT); an unchanged TOAST value is not known here.
    if (values.some((v) => !v || v.kind === 'unchanged' || (v.kind === 'null' && !index.nullsNotDistinct))) continue;
    const conds = index.columns.map((i) => {
      if (tuple[i]!.kind === 'null') return `${column(rel, i)} IS NULL`;
      params.add(tuple, i);
      return `${column(rel, i)} = ${param(rel, i, params.values.length)}`;
    });
    if (except) {
      params.addText(except.reloid);
      params.addText(except.tid);
      const n = params.values.length;
      conds.push(`NOT (pgsub_local.tableoid = $${n - 1}::pg_catalog.oid AND pgsub_local.ctid = $${n}::pg_catalog.tid)`);
    }
    parts.push(`SELECT ${names.length}, ${localColumns(state)} FROM ${target(rel)} AS pgsub_local WHERE ${conds.join(' AND ')}`);
    names.push(index.name);
  }
  if (parts.length === 0) return { indexes: [], rows: [] };
  return collect(await run(state, params.statement(parts.join(' UNION ALL '))), names);
}

/** Rows of a hits query (index position, then the local row) as Hits. */
function collect(rows: unknown[][], names: readonly string[]): Hits {
  const hit = new Set<number>();
  const distinct = new Map<string, LocalRow>();
  for (const r of rows) {
    hit.add(Number(r[0]));
    const local = toLocal(r, 1);
    distinct.set(`${local.reloid}/${local.tid}`, local);
  }
  return { indexes: [...hit].map((i) => names[i]!), rows: [...distinct.values()] };
}

/** The local row a change locates by its replica identity, locked; null when missing. */
async function locate(
  state: ApplyState,
  rel: MappedRelation,
  what: 'UPDATE' | 'DELETE',
  oldKind: 'key' | 'old' | undefined,
  oldTuple: Tuple | undefined,
  newTuple: Tuple | undefined,
): Promise<LocalRow | null> {
  const loc = locator(rel, what, oldKind, oldTuple, newTuple);
  const text = cached(
    rel,
    `L|${loc.shape}|${state.session.originId ?? ''}`,
    () => `SELECT ${localColumns(state)} FROM ${target(rel)} AS pgsub_local WHERE ${whereClause(rel, loc, 1)} LIMIT 1 FOR UPDATE OF pgsub_local`,
  );
  const params = new Params(rel);
  addLocatorParams(params, loc);
  const [row] = await run(state, params.statement(text));
  return row ? toLocal(row) : null;
}

function rowUpdate(rel: MappedRelation, tuple: Tuple, row: LocalRow): Statement {
  if (rel.reshape) return reshapedRowUpdate(rel, rel.reshape, tuple, row.reloid, row.tid, false);
  const setIndexes = tuple.flatMap((v, i) => (v.kind === 'unchanged' ? [] : [i]));
  const first = rel.targetColumns[0]!.name;
  const sets = setIndexes.length > 0 ? setIndexes.map((i, n) => `${column(rel, i)} = ${param(rel, i, n + 1)}`).join(', ') : `${quoteIdent(first)} = ${quoteIdent(first)}`;
  const n = setIndexes.length;
  const text = cached(rel, `RU${setIndexes.join(',')}`, () => `UPDATE ${target(rel)} SET ${sets} WHERE tableoid = $${n + 1}::pg_catalog.oid AND ctid = $${n + 2}::pg_catalog.tid`);
  const params = new Params(rel);
  for (const i of setIndexes) params.add(tuple, i);
  params.addText(row.reloid);
  params.addText(row.tid);
  return params.statement(text);
}

function rowDelete(rel: MappedRelation, row: LocalRow): Statement {
  return { text: cached(rel, 'RD', () => `DELETE FROM ${target(rel)} WHERE tableoid = $1::pg_catalog.oid AND ctid = $2::pg_catalog.tid`), params: [row.reloid, row.tid] };
}

interface Seen {
  type: ConflictType;
  key: Record<string, string | null> | null;
  remote: Tuple | undefined;
  local: LocalRow[];
  detail: string | null;
}

/** The policy for this conflict; `error` throws, anything else is logged and counted in the transaction. */
async function decide(state: ApplyState, xact: RemoteTransaction, rel: MappedRelation, seen: Seen, override?: Policy): Promise<Policy> {
  const policy = policyFor(state.session.options.conflicts, rel.displayName, seen.type);
  noteConflict(rel);
  const record: ConflictRecord = {
    type: seen.type,
    relation: rel,
    key: seen.key,
    remoteTuple: tupleJson(rel, seen.remote),
    localTuple: seen.local.length === 0 ? null : seen.local.length === 1 ? seen.local[0]!.json : `[${seen.local.map((l) => l.json).join(',')}]`,
    localOrigin: seen.local[0]?.origin ?? null,
    localCommitTs: seen.local[0]?.ts ?? null,
    remoteLsn: xact.finalLsn,
    remoteXid: xact.xid,
    remoteCommitTime: xact.commitTime,
    policy: override ?? policy,
    detail: seen.detail,
  };
  // A mapped relation's record names the target table too (the log's relation is the publisher's name).
  if (rel.rule) record.detail = `${seen.detail ? `${seen.detail}; ` : ''}target ${rel.qualifiedName}`;
  const fields = {
    conflict: seen.type,
    table: rel.displayName,
    ...(rel.rule ? { target: rel.qualifiedName } : {}),
    xid: xact.xid,
    finishLsn: formatLsn(xact.finalLsn),
    policy: record.policy,
    key: seen.key,
  };
  if (policy === 'error') {
    throw new ApplyConflictError(seen.type, `conflict detected on relation "${rel.displayName}": conflict=${seen.type}${record.detail ? ` (${record.detail})` : ''}`, record, {
      relation: rel.displayName,
      remoteXid: xact.xid,
      finishLsn: formatLsn(xact.finalLsn),
    });
  }
  state.session.log.warn(fields, 'conflict detected');
  // Counted when this target transaction commits (commit.ts), with its log row.
  state.tx.resolved.push(seen.type);
  await run(state, conflictLogStatement(state.session.subscription, record));
  return record.policy;
}

function keyOf(rel: MappedRelation, oldKind: 'key' | 'old' | undefined, oldTuple: Tuple | undefined, newTuple: Tuple | undefined): Record<string, string | null> | null {
  if (oldKind === 'old' && oldTuple) return tupleJson(rel, oldTuple);
  if (rel.keyIndexes.length === 0) return null;
  return tupleJson(rel, oldTuple ?? newTuple, rel.keyIndexes);
}

function originDiffers(state: ApplyState, row: LocalRow): boolean {
  return state.session.originId !== null && row.origin !== null && Number(row.origin) !== state.session.originId;
}

function collision(hits: Hits): string {
  return `key already exists in unique ${hits.indexes.length > 1 ? 'indexes' : 'index'} ${hits.indexes.join(', ')}`;
}

export async function carefulInsert(state: ApplyState, xact: RemoteTransaction, rel: MappedRelation, tuple: Tuple): Promise<void> {
  await state.pipeline.drain();
  const hits = await uniqueHits(state, rel, tuple, null);
  if (hits.indexes.length === 0) {
    await run(state, insertStatement(rel, tuple));
    return;
  }
  const type: ConflictType = hits.indexes.length > 1 ? 'multiple_unique_conflicts' : 'insert_exists';
  const policy = await decide(state, xact, rel, { type, key: keyOf(rel, undefined, undefined, tuple), remote: tuple, local: hits.rows, detail: collision(hits) });
  if (policy !== 'apply_remote') return;
  if (hits.rows.length === 1) {
    // The row in the way takes the remote values, live (it may be another source's row marked deleted).
    await run(state, rel.reshape ? reshapedRowUpdate(rel, rel.reshape, tuple, hits.rows[0]!.reloid, hits.rows[0]!.tid, true) : rowUpdate(rel, tuple, hits.rows[0]!));
    return;
  }
  for (const row of hits.rows) await run(state, rowDelete(rel, row));
  await run(state, insertStatement(rel, tuple));
}

export async function carefulUpdate(
  state: ApplyState,
  xact: RemoteTransaction,
  rel: MappedRelation,
  oldKind: 'key' | 'old' | undefined,
  oldTuple: Tuple | undefined,
  newTuple: Tuple,
): Promise<void> {
  await state.pipeline.drain();
  const key = keyOf(rel, oldKind, oldTuple, newTuple);
  const row = await locate(state, rel, 'UPDATE', oldKind, oldTuple, newTuple);
  if (!row) {
    state.session.counters.updateMissing++;
    const unchanged = unchangedColumns(rel, newTuple);
    // apply_remote inserts the new row, which needs every value: unchanged TOAST values were not sent.
    const impossible = unchanged.length > 0 ? `the new row cannot be inserted: values of ${unchanged.join(', ')} were not sent (unchanged TOAST)` : null;
    const policy = await decide(
      state,
      xact,
      rel,
      { type: 'update_missing', key, remote: newTuple, local: [], detail: impossible },
      impossible && policyFor(state.session.options.conflicts, rel.displayName, 'update_missing') === 'apply_remote' ? 'skip' : undefined,
    );
    if (policy === 'apply_remote') await run(state, insertStatement(rel, newTuple));
    return;
  }
  if (originDiffers(state, row)) {
    const policy = await decide(state, xact, rel, {
      type: 'update_origin_differs',
      key,
      remote: newTuple,
      local: [row],
      detail: `row last written by origin ${row.origin} at ${row.ts}`,
    });
    if (policy !== 'apply_remote') return;
  }
  // A key moving onto one of this source's rows marked deleted: that row gives way (tombstoneDelete).
  const soft = rel.reshape?.rows?.softDelete;
  if (soft && oldTuple) await run(state, tombstoneDelete(rel, soft, filterRows(rel, oldTuple, newTuple).new, row));
  const hits = await uniqueHits(state, rel, newTuple, row);
  if (hits.indexes.length > 0) {
    const type: ConflictType = hits.indexes.length > 1 ? 'multiple_unique_conflicts' : 'update_exists';
    const policy = await decide(state, xact, rel, { type, key, remote: newTuple, local: hits.rows, detail: collision(hits) });
    if (policy !== 'apply_remote') return;
    for (const other of hits.rows) await run(state, rowDelete(rel, other));
  }
  await run(state, rowUpdate(rel, newTuple, row));
}

export async function carefulDelete(state: ApplyState, xact: RemoteTransaction, rel: MappedRelation, oldKind: 'key' | 'old', oldTuple: Tuple): Promise<void> {
  await state.pipeline.drain();
  const key = keyOf(rel, oldKind, oldTuple, undefined);
  const row = await locate(state, rel, 'DELETE', oldKind, oldTuple, undefined);
  if (!row) {
    state.session.counters.deleteMissing++;
    await decide(state, xact, rel, { type: 'delete_missing', key, remote: oldTuple, local: [], detail: null });
    return;
  }
  if (originDiffers(state, row)) {
    const policy = await decide(state, xact, rel, {
      type: 'delete_origin_differs',
      key,
      remote: oldTuple,
      local: [row],
      detail: `row last written by origin ${row.origin} at ${row.ts}`,
    });
    if (policy !== 'apply_remote') return;
  }
  const soft = rel.reshape?.rows?.softDelete;
  await run(state, soft ? softDeleteRow(rel, soft, row.reloid, row.tid, xact.commitTime, xact.finalLsn) : rowDelete(rel, row));
}
