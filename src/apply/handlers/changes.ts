/**
 * INSERT, UPDATE, DELETE and TRUNCATE (worker.c's apply_handle_insert/_update/_delete/
 * _truncate). A change that may join a batch (txn/batch.ts) takes the fast path, which
 * allocates nothing per row; the others become one statement each (sql/insert.ts,
 * update.ts, delete.ts).
 * With conflict detection on, the statements abort the transaction on a conflict and the
 * loop replays it carefully, where each change goes to careful.ts.
 */
import type { DeleteMessage, InsertMessage, TruncateMessage, UpdateMessage } from '../../protocol/messages.js';
import { carefulDelete, carefulInsert, carefulUpdate } from './careful.js';
import type { ApplyState, RemoteTransaction } from '../txn/apply-state.js';
import { formatLsn } from '../../protocol/lsn.js';
import { tupleJson } from '../../conflict/report.js';
import type { MappedRelation } from '../sql/mapped-relation.js';
import { insertStatement } from '../sql/insert.js';
import { resolvesConflicts, updateStatement } from '../sql/update.js';
import { deleteStatement, truncateStatement } from '../sql/delete.js';
import { detect, noteConflict } from './detect-option.js';
import { hasRowSemantics, rowsDelete, rowsInsert, rowsTruncate, rowsUpdate } from './rows.js';
import { insertsCopyAsSent } from '../sql/copy-messages.js';
import { INSERT_TUPLE_OFFSET, peekRelationId } from '../../protocol/peek.js';
import { batchInsert, batchInsertMessage, batchUpdate, flushForChange, noteRowWrite, rowKey } from '../txn/batch.js';
import { applies, changeTarget, requireTransaction, sendStatement, sendStatementForRows } from '../txn/transaction.js';

export { detect } from './detect-option.js';

/**
 * The transaction a batchable change joins without any waiting: the target transaction is
 * open, the relation mapped and batching, the change applies. Null: take the full path.
 * Runs once per row, so it allocates nothing.
 */
export function fastTarget(state: ApplyState, relationId: number): MappedRelation | null {
  const xact = state.tx.xact;
  // Not open: a new remote transaction inside a group joins the open target one, no BEGIN.
  if (xact === null || (!xact.open && state.tx.group === null) || xact.skip || xact.alreadyPrepared || state.mode.careful || state.session.options.batchRows <= 1) return null;
  const rel = state.relations.cached(relationId);
  if (rel === undefined || rel.ordered || !applies(state, xact, relationId)) return null;
  xact.open = true;
  return rel;
}

/**
 * An Insert message before decoding (run/applier.ts, outside streams): batched as it came when its
 * relation's rows go to binary COPY as sent (copy-messages.ts) and the change takes the
 * fast path. False: decode it and dispatch as usual.
 */
export function insertAsSent(state: ApplyState, message: Buffer): Promise<void> | void | false {
  if (!state.session.options.copyInserts || state.mode.streamXid !== null || message.length < INSERT_TUPLE_OFFSET + 2) return false;
  const relationId = peekRelationId(message);
  const known = state.relations.cached(relationId);
  if (known === undefined || known.rowSecurity || !insertsCopyAsSent(known)) return false;
  const rel = fastTarget(state, relationId);
  if (rel === null) return false;
  const xact = state.tx.xact!;
  xact.changes++;
  return batchInsertMessage(state, xact, relationId, rel, message);
}

export function onInsert(state: ApplyState, m: InsertMessage): Promise<void> | void {
  const rel = fastTarget(state, m.relationId);
  if (rel === null) return insertChange(state, m);
  const xact = state.tx.xact!;
  xact.changes++;
  return batchInsert(state, xact, m.relationId, rel, m.newTuple);
}

export async function insertChange(state: ApplyState, m: InsertMessage): Promise<void> {
  const xact = await changeTarget(state, 'INSERT', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  // A mapping's row semantics (filter, soft delete…): rows.ts.
  if (hasRowSemantics(rel)) return rowsInsert(state, xact, rel, m.relationId, m.newTuple);
  if (state.mode.careful) return carefulInsert(state, xact, rel, m.newTuple);
  // A unique violation aborts the transaction: with detection on, the loop replays it carefully.
  if (state.session.options.batchRows > 1 && !rel.ordered) return batchInsert(state, xact, m.relationId, rel, m.newTuple);
  await flushForChange(state, m.relationId, rel);
  await sendStatement(state, insertStatement(rel, m.newTuple));
}

export function onUpdate(state: ApplyState, m: UpdateMessage): Promise<void> | void {
  const rel = fastTarget(state, m.relationId);
  if (rel !== null && m.oldKind === undefined) {
    const key = rowKey(rel, m.newTuple);
    if (key !== null) {
      const xact = state.tx.xact!;
      const batched = batchUpdate(state, xact, m.relationId, rel, undefined, m.newTuple, detect(state), key);
      if (batched !== false) {
        xact.changes++;
        return batched;
      }
    }
  }
  return updateChange(state, m);
}

export async function updateChange(state: ApplyState, m: UpdateMessage): Promise<void> {
  const xact = await changeTarget(state, 'UPDATE', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  if (hasRowSemantics(rel)) return rowsUpdate(state, xact, rel, m);
  if (state.mode.careful) return carefulUpdate(state, xact, rel, m.oldKind, m.oldTuple, m.newTuple);
  const key = m.oldKind !== 'old' ? rowKey(rel, m.oldTuple ?? m.newTuple) : null;
  const d = detect(state);
  // A batched update counts as a row write when its batch goes out (batch.ts).
  if (state.session.options.batchRows > 1 && key !== null) {
    const batched = batchUpdate(state, xact, m.relationId, rel, m.oldTuple, m.newTuple, d, key);
    if (batched !== false) return batched;
  }
  if (state.session.options.groupTransactions > 1) noteRowWrite(state, m.relationId, key);
  await flushForChange(state, m.relationId, rel);
  if (d) {
    // A row another origin wrote last may be applied and logged in the statement (apply_remote): one result row per such conflict.
    const statement = updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple, d, false, xact);
    if (!resolvesConflicts(statement)) return sendStatement(state, statement);
    return sendStatementForRows(state, statement, (rows) => {
      for (const [type] of rows) noteInlineConflict(state, rel, xact, m, type as 'update_origin_differs' | 'update_missing');
    });
  }
  await sendStatement(state, updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple), (count) => {
    if (count === 0) {
      // Detection off: native's update_missing default, skipped, logged and counted in memory.
      state.session.counters.updateMissing++;
      state.session.counters.conflicts.update_missing++;
      state.session.log.warn({ conflict: 'update_missing', table: rel.displayName, xid: xact.xid }, 'row to update not found; change skipped');
    }
  });
}

export async function onDelete(state: ApplyState, m: DeleteMessage): Promise<void> {
  const xact = await changeTarget(state, 'DELETE', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  if (hasRowSemantics(rel)) return rowsDelete(state, xact, rel, m.relationId, m.oldKind, m.oldTuple);
  if (state.mode.careful) return carefulDelete(state, xact, rel, m.oldKind, m.oldTuple);
  await flushForChange(state, m.relationId, rel);
  const d = detect(state);
  if (d) return sendStatement(state, deleteStatement(rel, m.oldKind, m.oldTuple, d));
  await sendStatement(state, deleteStatement(rel, m.oldKind, m.oldTuple), (count) => {
    if (count === 0) {
      state.session.counters.deleteMissing++;
      state.session.counters.conflicts.delete_missing++;
      state.session.log.warn({ conflict: 'delete_missing', table: rel.displayName, xid: xact.xid }, 'row to delete not found; change skipped');
    }
  });
}

export async function onTruncate(state: ApplyState, m: TruncateMessage): Promise<void> {
  const xact = requireTransaction(state, 'TRUNCATE');
  const ids = m.relationIds.filter((id) => applies(state, xact, id));
  if (ids.length === 0 || !(await changeTarget(state, 'TRUNCATE', ids[0]!))) return;
  const rels = [];
  for (const id of ids) rels.push(await state.relations.resolve(state.conn, id));
  // Mapped relations with a TRUNCATE policy or a discriminator: rows.ts.
  if (rels.some(hasRowSemantics)) return rowsTruncate(state, state.tx.xact!, rels, m.restartIdentity);
  await sendStatement(state, truncateStatement(rels, m.restartIdentity));
}

/** A conflict the statement resolved and logged itself (sql/update-conflicts.ts): counted (as native, when detected) and logged like the careful path's. */
function noteInlineConflict(state: ApplyState, rel: MappedRelation, xact: RemoteTransaction, m: UpdateMessage, type: 'update_origin_differs' | 'update_missing'): void {
  state.session.counters.conflicts[type]++;
  if (type === 'update_missing') state.session.counters.updateMissing++;
  noteConflict(rel);
  state.session.log.warn(
    {
      conflict: type,
      table: rel.displayName,
      xid: xact.xid,
      finishLsn: formatLsn(xact.finalLsn),
      policy: type === 'update_missing' ? 'skip' : 'apply_remote',
      key: tupleJson(rel, m.newTuple, rel.keyIndexes),
    },
    'conflict detected',
  );
}
