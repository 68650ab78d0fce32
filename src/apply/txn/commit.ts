/**
 * The end of a remote transaction on the target: COMMIT or PREPARE TRANSACTION with the
 * origin row, the positions of tables catching up and the tables now ready, in the same
 * transaction (exactly once); a group of source transactions committed together while
 * behind; a commit pipelined without a Sync while more is queued, whose failure the server
 * then makes skip everything after it; the skipped transaction of `pgsub skip`; and the one
 * reset of the transaction state (endTarget).
 */
import { ApplyError } from '../../errors.js';
import { formatLsn, parseLsn, type Lsn } from '../../protocol/lsn.js';
import { originSessionResetStatement, originSessionSetupStatement, originXactSetupStatement } from '../../origin/replorigin.js';
import { commitProgressStatement, idleProgressStatement, preparedRowStatement } from '../../origin/store.js';
import { clearSkipStatement } from '../../conflict/control.js';
import { conflictLogStatement } from '../../conflict/report.js';
import { quoteLiteral } from '../../quote.js';
import { advanceSyncStatement, clearSyncProgressStatement, setStateStatement } from '../../origin/sync-state.js';
import { NO_TABLES, type ApplyState, type RemoteTransaction } from './apply-state.js';
import type { TxStatus, WireResult } from '../../pgwire/wire.js';
import type { TableSync } from '../../origin/sync-state.js';
import type { ConflictType } from '../../conflict/types.js';
import { flushRowBatch } from './batch.js';
import { beginTarget, sendStatement } from './transaction.js';

/** The skipped transaction's end: the origin moves past it, with a log row, and the skip LSN is cleared. */
export async function finishSkipped(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint): Promise<void> {
  // The transactions grouped before it commit on their own; the skip is a transaction of its own.
  await settleTarget(state);
  await state.pipeline.push(state.conn.execute('BEGIN'));
  await sendStatement(state, originXactSetupStatement(endLsn, commitTime));
  await sendStatement(state, idleProgressStatement(state.session.subscription, endLsn));
  for (const t of xact.syncTouched) await sendStatement(state, advanceSyncStatement(state.session.subscription, t, endLsn));
  await sendStatement(state, clearSkipStatement(state.session.subscription, xact.finalLsn));
  await sendStatement(
    state,
    conflictLogStatement(state.session.subscription, {
      type: 'transaction_skipped',
      relation: null,
      key: null,
      remoteTuple: null,
      localTuple: null,
      localOrigin: null,
      localCommitTs: null,
      remoteLsn: xact.finalLsn,
      remoteXid: xact.xid,
      remoteCommitTime: commitTime,
      policy: 'skip',
      detail: 'skipped by pgsub skip --lsn',
    }),
  );
  const commit = state.conn.execute('COMMIT');
  await state.pipeline.push(commit);
  const synced = state.conn.sync();
  await state.pipeline.push(synced);
  await state.pipeline.drain();
  if ((await commit).command !== 'COMMIT' || (await synced) !== 'I') throw new ApplyError(`target did not commit the skip of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  state.tx.xact = null;
  for (const t of xact.syncTouched) state.session.sync.set({ ...t, syncLsn: endLsn });
  state.mode.skipLsn = null;
  state.session.counters.transactionsSkipped++;
  state.session.log.warn({ xid: xact.xid, finishLsn: formatLsn(xact.finalLsn) }, 'remote transaction skipped');
  state.session.progress.noteDurable(endLsn);
  state.session.onDurable();
}

export const PLAIN_COMMIT: Ending = { kind: 'commit', mayPipeline: true };

/**
 * How a remote transaction ends on the target: COMMIT, or PREPARE TRANSACTION (two_phase).
 * `mayPipeline`: a plain COMMIT message, whose target commit need not be waited for in a
 * backlog (commitTarget); the ends of streamed and prepared transactions always wait.
 */
export type Ending = { kind: 'commit'; mayPipeline?: boolean } | { kind: 'prepare'; gid: string };

export const COMMIT: Ending = { kind: 'commit' };

/** Returns a promise only when the target is written (a group continues without one). */
export function finishTransaction(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending = COMMIT): Promise<void> | void {
  if (xact.skip) return finishSkipped(state, xact, endLsn, commitTime);
  const prepare = ending.kind === 'prepare';
  if (!xact.open && xact.unsubscribed && !xact.behind && !prepare) return commitSkippedChanges(state, xact, endLsn, commitTime, ending);
  if (!xact.open) {
    // Nothing to write: skipped, or no published change. The position is recorded later.
    if (xact.behind) state.session.counters.transactionsSkipped++;
    state.tx.xact = null;
    state.session.progress.noteProcessed(endLsn);
    return;
  }
  // A transaction applied carefully ends the target transaction (with the group before it):
  // what it resolved and logged is then never rolled back by a later conflict, nor resolved twice.
  if (!prepare && !xact.behind && xact.syncTouched.size === 0 && !state.mode.careful && state.tx.canGroupHotRows && state.policy.canGroup(xact.finalLsn)) {
    // Behind the stream: leave the target transaction open for the next source one. The
    // target commits only at source commit boundaries, with the origin at the last one.
    const group = (state.tx.group ??= { transactions: 0, changes: 0, endLsn, commitTime });
    group.transactions++;
    group.changes += xact.changes;
    group.endLsn = endLsn;
    group.commitTime = commitTime;
    state.tx.xact = null;
    return;
  }
  return commitTarget(state, xact, endLsn, commitTime, ending);
}

/**
 * A transaction whose changes were all to tables published but not part of the subscription
 * ends like an applied one, with the origin at its end (native commits it too: its changes
 * were skipped inside an apply transaction). Were only its position noted for a later idle
 * record, a re-stream after a restart could bring its changes back once a refresh has added
 * the table — rows from before the refresh that copy_data = false says are not wanted.
 */
async function commitSkippedChanges(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending): Promise<void> {
  xact.open = true;
  if (!state.tx.group) await beginTarget(state);
  await finishTransaction(state, xact, endLsn, commitTime, ending);
}

/**
 * Commit the open group of source transactions (the queue ran dry, or a boundary needs it).
 * `ending`: PLAIN_COMMIT lets the commit go without waiting for its answer (commitTarget).
 */
export async function commitGroup(state: ApplyState, ending: Ending = { kind: 'commit' }): Promise<void> {
  const group = state.tx.group;
  if (!group) return;
  const xact: RemoteTransaction = {
    xid: 0,
    finalLsn: group.endLsn,
    commitTime: group.commitTime,
    behind: false,
    open: true,
    changes: 0,
    syncTouched: NO_TABLES,
    appliesTo: -1,
    alreadyPrepared: false,
    skip: false,
    unsubscribed: false,
  };
  // commitTarget counts the group's transactions; this empty one adds none.
  await commitTarget(state, xact, group.endLsn, group.commitTime, ending, 0);
}

export async function commitTarget(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending, own = 1): Promise<void> {
  // Inside a group a run of inserts continues across source commits (W4-like streams of
  // one-row transactions); it is sent before anything that ends the target transaction.
  await flushRowBatch(state);
  const prepare = ending.kind === 'prepare';
  const group = state.tx.group;
  if (group && (prepare || xact.behind))
    throw new ApplyError(`a group of ${group.transactions} transactions is open at the end of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  const transactions = own + (group?.transactions ?? 0);
  const turn = state.policy.commitTurn;
  if (turn) {
    // An apply lane: commits keep source order, and the origin is this session's only for the commit.
    await turn.acquire();
    await sendStatement(state, originSessionSetupStatement(turn.originName));
  }
  const promoted = await sendCommitRows(state, xact, endLsn, commitTime, ending, transactions);
  // A table catching up, or becoming ready, moves the feedback hold (origin/sync-state.ts
  // heldLsn) once its commit is answered, without the flush tracking origin positions get:
  // that commit must be on disk when answered, so it is synchronous (the session's default).
  const synchronous = state.session.asyncCommit && !prepare && (xact.syncTouched.size > 0 || promoted.length > 0);
  if (synchronous) await state.pipeline.push(state.conn.execute('SET LOCAL synchronous_commit TO DEFAULT'));
  const expected = prepare ? 'PREPARE TRANSACTION' : 'COMMIT';
  const commit = state.conn.execute(ending.kind === 'prepare' ? `PREPARE TRANSACTION ${quoteLiteral(ending.gid)}` : 'COMMIT');
  await state.pipeline.push(commit);
  // Where the target's WAL stood right after the asynchronous commit: flushed past this, it is safe.
  const walAfter = state.session.asyncCommit && !prepare && !synchronous ? state.conn.execute('SELECT pg_catalog.pg_current_wal_insert_lsn()::text', [], { wantRows: true }) : null;
  if (walAfter) await state.pipeline.push(walAfter);
  if (turn) await sendStatement(state, originSessionResetStatement());
  const pipelined = mayLeaveCommitUnanswered(state, xact, ending, endLsn, promoted);
  // Otherwise Sync ends the pipeline segment; its ReadyForQuery says whether a transaction is left open.
  const synced = pipelined ? null : state.conn.sync();
  if (synced) await state.pipeline.push(synced);
  // Taken now: a pipelined commit's state is reset (endTarget) before its answer arrives.
  const resolved = state.tx.resolved.splice(0);
  const settled = settleCommit(state, xact, commit, synced, walAfter, { endLsn, commitTime, expected, transactions, groupChanges: group?.changes ?? 0, promoted, resolved });
  settled.catch(() => {});
  if (pipelined) return leaveCommitPipelined(state, endLsn, settled);
  await state.pipeline.drain();
  await settled;
  // Only now: a failure above leaves state.tx.xact for the loop's careful replay.
  endTarget(state);
}

/**
 * The rows a commit writes with the changes: the origin's stamp, the progress row (or a
 * prepared transaction's row), the positions of tables catching up and the tables that
 * become ready. Returns those that become ready.
 */
async function sendCommitRows(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending, transactions: number): Promise<TableSync[]> {
  const subscription = state.session.subscription;
  // The commit record carries the remote LSN and time, like a native apply's (origin.c).
  await sendStatement(state, originXactSetupStatement(endLsn, commitTime));
  if (ending.kind === 'prepare') {
    // Not the origin row: a prepared transaction would hold its lock until COMMIT PREPARED.
    await sendStatement(state, preparedRowStatement(subscription, ending.gid, xact.xid, endLsn));
  } else if (!xact.behind) {
    const progress = commitProgressStatement(subscription, endLsn, commitTime, transactions);
    await sendStatement(state, progress, (count) => {
      if (count !== 1) throw new ApplyError(`origin row of subscription "${subscription}" is missing in the target`);
    });
  }
  // Tables catching up record their own position; those now level with the origin become ready.
  for (const t of xact.syncTouched) await sendStatement(state, advanceSyncStatement(subscription, t, endLsn));
  const promoted = xact.behind || ending.kind === 'prepare' ? [] : state.session.sync.promotable(endLsn, state.session.progress.durable);
  for (const t of promoted) {
    await sendStatement(state, setStateStatement(subscription, t, 'r', null));
    await sendStatement(state, clearSyncProgressStatement(subscription, t));
  }
  return promoted;
}

/**
 * In the middle of a backlog the next transaction is applied while this commit is under
 * way: waiting for it would leave the target idle for a round trip per commit. No Sync
 * follows such a COMMIT: should it fail, the server skips everything after it up to the
 * next Sync, so no later transaction can commit past the failed one.
 */
function mayLeaveCommitUnanswered(state: ApplyState, xact: RemoteTransaction, ending: Ending, endLsn: Lsn, promoted: readonly TableSync[]): boolean {
  return (
    ending.kind === 'commit' &&
    ending.mayPipeline === true &&
    !xact.behind &&
    xact.syncTouched.size === 0 &&
    promoted.length === 0 &&
    !state.mode.careful &&
    state.policy.canPipelineCommit(endLsn)
  );
}

/** A commit left unanswered: its outcome is checked in order when it arrives; the position moves only then. */
async function leaveCommitPipelined(state: ApplyState, endLsn: Lsn, settled: Promise<void>): Promise<void> {
  endTarget(state);
  const unconfirmed = { until: endLsn, answered: settled };
  state.tx.unconfirmed = unconfirmed;
  await state.pipeline.push(
    settled.then(() => {
      if (state.tx.unconfirmed === unconfirmed) state.tx.unconfirmed = null;
    }),
  );
}

/**
 * Before a step that sends a Sync of its own (runAlone, a two-phase step, the replication
 * origin handed to another connection): the open group commits and every pipelined commit
 * is answered — and known to have succeeded — then the segment they share ends. A Sync sent
 * earlier would let the server run what follows it after a commit that failed.
 */
export async function settleTarget(state: ApplyState): Promise<void> {
  await commitGroup(state);
  if (state.tx.unconfirmed !== null || state.pipeline.size > 0) await state.pipeline.drain();
  state.tx.unconfirmed = null;
  if (state.conn.unsynced) await state.conn.sync();
}

/**
 * After a statement failed in the pipeline: every answer outstanding is awaited, so the
 * commits sent before the failure have counted (progress.durable says which went through)
 * and everything after it is known skipped; then the open target transaction rolls back.
 */
export async function rollbackAfterFailure(state: ApplyState): Promise<void> {
  await state.pipeline.settle();
  await state.tx.unconfirmed?.answered.catch(() => {});
  state.tx.unconfirmed = null;
  endTarget(state);
  await state.conn.sync().catch(() => {});
  const rollback = state.conn.execute('ROLLBACK');
  const synced = state.conn.sync();
  await rollback;
  await synced;
}

/** The one reset of the transaction state: after a commit, a rollback, a stop. */
export function endTarget(state: ApplyState): void {
  state.tx.xact = null;
  state.tx.group = null;
  state.tx.rowBatches.clear();
  state.tx.rowWrites.clear();
  state.tx.rowWritesTracked = 0;
  state.tx.canGroupHotRows = true;
  state.tx.resolved.length = 0;
}

/** Whether the last commit sent without waiting went through (its answer awaited); then it is forgotten. */
export async function pipelinedCommitSucceeded(state: ApplyState): Promise<boolean> {
  const unconfirmed = state.tx.unconfirmed;
  if (unconfirmed === null) return true;
  const ok = await unconfirmed.answered.then(
    () => true,
    () => false,
  );
  if (ok && state.tx.unconfirmed === unconfirmed) state.tx.unconfirmed = null;
  return ok;
}

/** What a target commit's answer must be, and the bookkeeping once it is known. */
export async function settleCommit(
  state: ApplyState,
  xact: RemoteTransaction,
  commit: Promise<WireResult>,
  synced: Promise<TxStatus> | null,
  walAfter: Promise<WireResult> | null,
  c: { endLsn: Lsn; commitTime: bigint; expected: string; transactions: number; groupChanges: number; promoted: TableSync[]; resolved: readonly ConflictType[] },
): Promise<void> {
  // COMMIT of a failed transaction answers ROLLBACK without an error; never count that.
  const { command } = await commit;
  // Without a Sync (pipelined) the COMMIT ran in its segment only if nothing before it failed.
  const status = synced === null ? 'I' : await synced;
  if (command !== c.expected || status !== 'I') {
    throw new ApplyError(`target answered ${command} (status ${status}) to ${c.expected} of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  }
  const { endLsn, promoted } = c;
  for (const t of xact.syncTouched) state.session.sync.set({ ...t, syncLsn: endLsn });
  for (const t of promoted) state.session.sync.set({ ...t, state: 'r', syncLsn: null });
  if (promoted.length > 0) state.session.log.info({ tables: promoted.map((t) => `${t.schema}.${t.table}`), lsn: formatLsn(endLsn) }, 'tables ready');
  state.session.counters.changesApplied += xact.changes + c.groupChanges;
  // The conflicts resolved in it count once they are in the target (their log rows committed).
  for (const type of c.resolved) state.session.counters.conflicts[type]++;
  if (xact.behind || c.expected !== 'COMMIT') {
    state.session.onDurable();
    return;
  }
  state.session.counters.transactionsApplied += c.transactions;
  state.session.counters.lastCommitTime = c.commitTime;
  if (walAfter) state.session.progress.noteCommittedAsync(endLsn, parseLsn(String((await walAfter).rows[0]?.[0])));
  else state.session.progress.noteDurable(endLsn);
  state.session.onDurable();
}
