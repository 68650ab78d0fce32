/**
 * One handler per pgoutput message, like worker.c's apply_dispatch → apply_handle_*.
 * A remote transaction becomes one target transaction: BEGIN is sent with its first
 * change, each change is pipelined, and COMMIT is preceded by the origin update in the
 * same transaction. A transaction whose commit LSN lies below the recorded origin was
 * applied before a restart and is dropped whole (walsender's own rule: it resends a
 * transaction unless its commit record starts before the confirmed position).
 * Conflicts: with detection on, UPDATE/DELETE statements abort the transaction when they
 * find no row or a foreign last writer, and INSERTs abort on an existing key; the loop
 * then replays the transaction with `state.mode.careful`, where the change handlers hand each
 * change to conflict/resolve.ts. The transaction `pgsub skip` names applies nothing and
 * only moves the origin (finishSkipped); its Relation and Type messages still update the
 * relation map (worker.c handles them while skipping), streamed ones as they arrive.
 */
import type { MessageTag, PgOutputMessage } from '../../protocol/messages.js';
import type { ApplyState, Dispatch } from '../txn/apply-state.js';
import { onStreamAbort, onStreamCommit, onStreamPrepare, onStreamStart, onStreamStop, spoolMessage } from './stream.js';
import { onBeginPrepare, onCommitPrepared, onPrepare, onRollbackPrepared } from './twophase.js';
import { flushRowBatch } from '../txn/batch.js';
import { onBegin, onCommit, onMessage, onOrigin, onRelation, onType } from './begin-commit.js';
import { onDelete, onInsert, onTruncate, onUpdate } from './changes.js';

/** A handler; `dispatch` for the ones that replay messages (a streamed transaction's spool). */
export type Handler<T extends MessageTag> = (state: ApplyState, message: Extract<PgOutputMessage, { tag: T }>, dispatch: Dispatch) => Promise<void> | void;

export const handlers: { [T in MessageTag]: Handler<T> } = {
  begin: onBegin,
  commit: onCommit,
  relation: onRelation,
  type: onType,
  origin: onOrigin,
  message: onMessage,
  insert: onInsert,
  update: onUpdate,
  delete: onDelete,
  truncate: onTruncate,
  streamStart: onStreamStart,
  streamStop: onStreamStop,
  streamCommit: onStreamCommit,
  streamAbort: onStreamAbort,
  beginPrepare: onBeginPrepare,
  prepare: onPrepare,
  commitPrepared: onCommitPrepared,
  rollbackPrepared: onRollbackPrepared,
  streamPrepare: onStreamPrepare,
};

/**
 * Messages that keep pending batches: row changes flush what must precede them themselves
 * (batch.ts), the others send nothing (COMMIT's end of the target transaction flushes).
 */
export const KEEPS_BATCH: ReadonlySet<MessageTag> = new Set(['begin', 'commit', 'origin', 'message', 'type', 'insert', 'update', 'delete']);

/** Messages that belong to a streamed transaction while its block is open: spooled, not applied. */
export const SPOOLED: ReadonlySet<MessageTag> = new Set(['relation', 'type', 'origin', 'message', 'insert', 'update', 'delete', 'truncate']);

/** worker.c's apply_dispatch, with handle_streamed_transaction's diversion first. */
export function dispatch(state: ApplyState, message: PgOutputMessage, raw: Buffer): Promise<void> | void {
  if (state.mode.streamXid !== null && SPOOLED.has(message.tag)) {
    // Relation and Type messages also update the relation map at once, as worker.c's leader
    // does while it spools: once a streamed transaction commits, the publisher counts the
    // relations described inside it as described (pgoutput's cleanup_rel_sync_cache), even
    // if pgsub skips that transaction, discards it as prepared already, or a parallel worker
    // applies it. Its replay describes them again, in order.
    if (message.tag === 'relation') onRelation(state, message);
    else if (message.tag === 'type') onType(state, message);
    return spoolMessage(state, message, raw);
  }
  const handler = handlers[message.tag] as Handler<typeof message.tag>;
  // A batch lives across changes of its kind and across the source commits of a group
  // (commitTarget sends it before the target commit); anything else that writes goes after it.
  if (state.tx.rowBatches.size > 0 && !KEEPS_BATCH.has(message.tag)) return flushRowBatch(state).then(() => handler(state, message as never, dispatch));
  // Most messages complete without waiting (a row joins a batch): no promise then.
  return handler(state, message as never, dispatch);
}
