/**
 * Changes to a relation whose mapping has row semantics (sql/rows.ts): the row filter
 * with PostgreSQL 15's publication semantics, soft delete, and TRUNCATE policies.
 * changes.ts hands such changes here once the relation is resolved; what they become
 * is then applied by the usual statements (pipelined) or the careful path.
 *
 * The filter (pgoutput.c pgoutput_row_filter): an INSERT is applied only if its new row
 * passes — checked inside the INSERT itself (`… SELECT … WHERE filter`), no round trip;
 * a DELETE only if its old row passes; an UPDATE whose old and new rows both pass is an
 * UPDATE, old passes and new fails a DELETE, old fails and new passes an INSERT of the
 * new row, neither is skipped. An UPDATE that did not send an old row (its identity
 * unchanged) is decided by the new row alone, as pgoutput does.
 *
 * Where the verdict is taken: with conflict detection on (the default), a DELETE and an
 * UPDATE without an old row carry the filter as a condition of their own statement
 * (sql/locator.ts filterGuard), which also keeps a filtered-out change from counting as a
 * missing row — no round trip. An UPDATE with an old row (its identity changed), every
 * change on the careful path, and detection off (where a statement's row count would not
 * tell filtered from missing) ask the target for the verdicts first, in one query for the
 * old and the new row, after the pipeline drained: one round trip per such change.
 */
import { ApplyError } from '../../errors.js';
import type { Tuple, UpdateMessage } from '../../protocol/messages.js';
import type { MappedRelation } from '../sql/mapped-relation.js';
import { filterRows, softDeleteStatement, tombstoneDelete, truncatePolicyStatement, verdictStatement } from '../../mapping/row-statements.js';
import { locator } from '../sql/locator.js';
import { insertStatement } from '../sql/insert.js';
import { updateStatement } from '../sql/update.js';
import { deleteStatement, truncateStatement } from '../sql/delete.js';
import type { ApplyState, RemoteTransaction } from '../txn/apply-state.js';
import { flushForChange, noteRowWrite, rowKey } from '../txn/batch.js';
import { sendStatement } from '../txn/transaction.js';
import { carefulDelete, carefulInsert, carefulUpdate } from './careful.js';
import { detect } from './detect-option.js';

/** Whether a relation's changes go through this module. */
export function hasRowSemantics(rel: MappedRelation): boolean {
  return rel.reshape?.rows !== undefined;
}

/** The filter's verdict for each row, asked of the target in one query. */
async function verdicts(state: ApplyState, rel: MappedRelation, rows: readonly Tuple[]): Promise<boolean[]> {
  await state.pipeline.drain();
  const stmt = verdictStatement(rel, rel.reshape!, rows);
  const result = await state.conn.execute(stmt.text, stmt.params, { wantRows: true, ...(stmt.paramTypes ? { paramTypes: stmt.paramTypes } : {}) });
  const row = (result.rows[0] ?? []) as unknown[];
  return rows.map((_, i) => row[i] === 'true' || row[i] === 't' || row[i] === true);
}

export async function rowsInsert(state: ApplyState, xact: RemoteTransaction, rel: MappedRelation, relationId: number, tuple: Tuple, filtered = false): Promise<void> {
  if (state.mode.careful) {
    // The careful path searches for collisions first, so a filtered-out row must not get there.
    if (!filtered && rel.reshape!.rows!.filter && !(await verdicts(state, rel, [tuple]))[0]) return;
    return carefulInsert(state, xact, rel, tuple);
  }
  await flushForChange(state, relationId, rel);
  await sendStatement(state, insertStatement(rel, tuple));
}

export async function rowsUpdate(state: ApplyState, xact: RemoteTransaction, rel: MappedRelation, m: UpdateMessage): Promise<void> {
  // No old row (identity unchanged): only UPDATE or nothing, decided by the UPDATE itself (guard).
  const guard = rel.reshape!.rows!.filter !== null && !m.oldTuple && !state.mode.careful && detect(state) !== null;
  if (rel.reshape!.rows!.filter && !guard) {
    const rows = filterRows(rel, m.oldTuple, m.newTuple);
    const [oldPasses, newPasses] = m.oldTuple ? await verdicts(state, rel, [rows.old, rows.new]) : [...(await verdicts(state, rel, [rows.new])), undefined];
    const passes = newPasses ?? oldPasses;
    if (!oldPasses && !passes) return;
    if (oldPasses && !passes) return rowsDelete(state, xact, rel, m.relationId, m.oldKind!, m.oldTuple!, true);
    if (!oldPasses && passes) {
      const unsent = rows.new.flatMap((v, i) => (v.kind === 'unchanged' ? [rel.remote.columns[i]!.name] : []));
      if (unsent.length > 0) {
        throw new ApplyError(
          `UPDATE on "${rel.displayName}" brings the row into the mapping's filter, so it is inserted, but ${unsent.map((c) => `"${c}"`).join(', ')} ${unsent.length > 1 ? 'were' : 'was'} not sent (unchanged TOAST)`,
          { relation: rel.displayName, column: unsent.join(', ') },
        );
      }
      return rowsInsert(state, xact, rel, m.relationId, rows.new, true);
    }
  }
  if (state.mode.careful) return carefulUpdate(state, xact, rel, m.oldKind, m.oldTuple, m.newTuple);
  if (state.session.options.groupTransactions > 1) noteRowWrite(state, m.relationId, m.oldKind !== 'old' ? rowKey(rel, m.oldTuple ?? m.newTuple) : null);
  await flushForChange(state, m.relationId, rel);
  // A key that may move (an old row was sent) onto one marked deleted: that row gives way (tombstoneDelete).
  const soft = rel.reshape!.rows!.softDelete;
  if (soft && m.oldTuple) await sendStatement(state, tombstoneDelete(rel, soft, filterRows(rel, m.oldTuple, m.newTuple).new));
  const d = detect(state);
  if (d) return sendStatement(state, updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple, d, guard));
  await sendStatement(state, updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple), (count) => {
    if (count === 0) {
      state.session.counters.updateMissing++;
      state.session.counters.conflicts.update_missing++;
      state.session.log.warn({ conflict: 'update_missing', table: rel.displayName, target: rel.qualifiedName, xid: xact.xid }, 'row to update not found; change skipped');
    }
  });
}

export async function rowsDelete(
  state: ApplyState,
  xact: RemoteTransaction,
  rel: MappedRelation,
  relationId: number,
  oldKind: 'key' | 'old',
  oldTuple: Tuple,
  filtered = false,
): Promise<void> {
  const rows = rel.reshape!.rows!;
  const d = detect(state);
  // With detection on, the DELETE checks the filter itself (guard): no round trip.
  const guard = !filtered && rows.filter !== null && !state.mode.careful && d !== null;
  if (!filtered && !guard && rows.filter && !(await verdicts(state, rel, [oldTuple]))[0]) return;
  if (state.mode.careful) return carefulDelete(state, xact, rel, oldKind, oldTuple);
  await flushForChange(state, relationId, rel);
  const stmt = rows.softDelete
    ? softDeleteStatement(rel, rows.softDelete, locator(rel, 'DELETE', oldKind, oldTuple, undefined), xact.commitTime, xact.finalLsn, d, guard)
    : deleteStatement(rel, oldKind, oldTuple, d, guard);
  if (d) return sendStatement(state, stmt);
  await sendStatement(state, stmt, (count) => {
    if (count === 0) {
      state.session.counters.deleteMissing++;
      state.session.counters.conflicts.delete_missing++;
      state.session.log.warn({ conflict: 'delete_missing', table: rel.displayName, target: rel.qualifiedName, xid: xact.xid }, 'row to delete not found; change skipped');
    }
  });
}

/**
 * TRUNCATE: the relations without a policy of their own in one TRUNCATE (RESTRICT, as
 * native), then each other one by its policy (row-statements.ts truncatePolicyStatement).
 */
export async function rowsTruncate(state: ApplyState, xact: RemoteTransaction, rels: readonly MappedRelation[], restartIdentity: boolean): Promise<void> {
  const plain: MappedRelation[] = [];
  const own = [];
  for (const rel of rels) {
    const stmt = truncatePolicyStatement(rel, xact.commitTime, xact.finalLsn);
    if (stmt === null) plain.push(rel);
    else if (stmt !== 'ignore') own.push(stmt);
  }
  if (plain.length > 0) await sendStatement(state, truncateStatement(plain, restartIdentity));
  for (const stmt of own) await sendStatement(state, stmt);
}
