/**
 * The streaming apply loop (worker.c's LogicalRepApplyLoop), as two cooperating tasks:
 *  - the receiver reads CopyData frames, answers keepalives, decodes pgoutput messages
 *    and queues them (bounded: a full queue stops the reading, back-pressuring the socket);
 *  - the applier takes queued items in order and dispatches them to the handlers.
 * Feedback ('r') reports only the durable position (see origin/positions.ts): after each
 * applied commit, every status interval, and at once when the publisher asks. A silent
 * publisher is pinged after half the receive timeout and dropped after all of it.
 * Stopping rolls back an open target transaction: a partial source transaction is never
 * committed; it is received again after restart.
 *
 * Conflicts (conflict/detect.ts): the raw messages of the remote transaction being
 * applied are kept (up to REPLAY_BYTES) until it ends; when the pipelined statements of
 * that transaction abort on a conflict, the loop rolls the target transaction back and
 * dispatches the kept messages again in careful mode, then continues with the queue. A
 * transaction too large to keep is replayed by a new session instead (CarefulReplayError).
 */
import { TAG } from '../../protocol/tags.js';
import { ConnectionLostError, PgsubError } from '../../errors.js';
import { isConflictSignal } from '../../conflict/detect.js';
import type { ConflictConfig } from '../../conflict/types.js';
import type { Logger } from '../../log.js';
import { decode } from '../../protocol/decoder.js';
import { formatLsn, parseLsn, type Lsn } from '../../protocol/lsn.js';
import type { ReplicationStream } from '../../protocol/replication.js';
import { flushBarrierStatements, idleProgressStatement } from '../../origin/store.js';
import type { Progress } from '../../origin/positions.js';
import { commitGroup, settleTarget } from '../txn/commit.js';
import { dispatch } from '../handlers/dispatch.js';
import { insertAsSent } from '../handlers/changes.js';
import { BoundedQueue } from './queue.js';
import type { RelationMap } from '../sql/relmap.js';
import { clearSyncProgressStatement, setStateStatement, type SyncStates } from '../../tablesync/sync-state.js';
import type { StreamSpool } from '../txn/spool.js';
import { newTxState, type ApplyCounters, type ApplySession, type ApplyState } from '../txn/apply-state.js';
import { ParallelApply, type ParallelApplyOptions } from './parallel.js';
import { ApplyLanes, type ApplyLanesOptions } from './lanes.js';
import { runAlone, type WireConnection } from '../../target/connect.js';
import { Pipeline } from '../../target/pipeline.js';
import { PipelineAbortedError } from '../../target/wire.js';
import { annotateTargetError } from '../sql/failure.js';
import { endTarget, pipelinedCommitSucceeded } from '../txn/commit.js';
import { peekVisibleCommitLsn } from '../../protocol/peek.js';
import type { ApplyHold } from './hold.js';

type WorkItem =
  /** A pgoutput message, decoded by the applier: the queue holds bytes only once (no wrapper object per message). */
  | Buffer
  /** A keepalive between transactions: everything before `lsn` has been sent to us. */
  | { kind: 'position'; lsn: Lsn }
  /** Wakes the applier so an idle position gets recorded. */
  | { kind: 'tick' };

const QUEUE_BYTES = 16 * 1024 * 1024;
/** A group also ends after this many changes: a failure re-applies at most this much. */
const GROUP_MAX_CHANGES = 100_000;
/** Messages of one remote transaction kept for a careful replay; beyond this, a session restart replays it. */
const REPLAY_BYTES = 16 * 1024 * 1024;

/**
 * A failure while source transactions were grouped in one target transaction: which one
 * failed is not known (the pipeline reports late), and the group cannot be replayed from
 * memory. The next session applies one transaction per target transaction up to `untilLsn`,
 * so the failing one is found, resolved, retried or skipped on its own.
 */
export class GroupRetryError extends PgsubError {
  readonly code = 'PGSUB_GROUP_RETRY';
  readonly retryable = true;
  constructor(
    readonly untilLsn: Lsn,
    cause: unknown,
  ) {
    super(`a statement failed inside a group of transactions; re-applying them one by one up to ${formatLsn(untilLsn)}`, { untilLsn: formatLsn(untilLsn) }, { cause });
  }
}

/** A conflicting transaction too large to keep in memory: the next session applies it carefully from its BEGIN. */
export class CarefulReplayError extends PgsubError {
  readonly code = 'PGSUB_CAREFUL_REPLAY';
  readonly retryable = true;
  constructor(
    readonly finishLsn: Lsn,
    cause: unknown,
  ) {
    super(`conflict in a remote transaction larger than the replay buffer; re-applying it carefully from ${formatLsn(finishLsn)}`, { finishLsn: formatLsn(finishLsn) }, { cause });
  }
}

export interface ApplyLoopOptions {
  subscription: string;
  stream: ReplicationStream;
  conn: WireConnection;
  relations: RelationMap;
  progress: Progress;
  counters: ApplyCounters;
  sync: SyncStates;
  spool: StreamSpool;
  /** Stream Abort messages carry abort LSN and time (protocol 4, streaming = parallel). */
  streamAbortInfo: boolean;
  onUnknownTable(schema: string, table: string): void;
  log: Logger;
  statusIntervalMs: number;
  receiveTimeoutMs: number;
  maxInFlight: number;
  queueSize: number;
  /** Most source transactions per target transaction while behind (1: no grouping). */
  groupTransactions?: number;
  /**
   * synchronous_commit = off: apply transactions commit asynchronously, and this idle
   * connection asks for the target's WAL flush position so feedback can follow it.
   */
  flushTracker?: WireConnection | null;
  /** Most rows per multi-row INSERT for runs of inserts into one table (1: one per row). */
  batchRows?: number;
  /** Batched INSERTs as COPY where possible. */
  copyInserts?: boolean;
  /** No grouping of transactions finishing at or before this LSN (after a GroupRetryError). */
  noGroupUntil?: Lsn | null;
  /** apply_workers > 1: independent transactions applied in parallel while behind (lanes.ts). */
  lanes?: Omit<ApplyLanesOptions, 'onFailure' | 'groupTransactions' | 'noGroupUntil' | 'dispatch'> | null;
  /** streaming = parallel, in a session that starts at the origin (never re-streams applied commits). */
  parallel?: Omit<ParallelApplyOptions, 'dispatch' | 'waiters'> | null;
  /** Minimum spacing of idle-position records in the target. */
  idleRecordIntervalMs?: number;
  conflicts: ConflictConfig;
  /** This session's replication origin id when the target tracks commit origins; else null. */
  originId: number | null;
  /** Finish LSN of the transaction `pgsub skip` named. */
  skipLsn: Lsn | null;
  /** Finish LSN of a transaction to apply carefully from its start (after a CarefulReplayError). */
  carefulLsn: Lsn | null;
  /** A hold at a source LSN (`pgsub verify`, hold.ts); absent: never held. */
  hold?: ApplyHold | null;
}

export interface ApplyLoop {
  /** Settles when the loop ends: resolves after stop(), rejects with the first failure. */
  done: Promise<void>;
  stop(): void;
  /** The remote transaction being applied when the loop failed (for pgsub skip and status). */
  failedTransaction(): { finishLsn: Lsn; xid: number } | null;
  /** `pgsub skip` while running: the finish LSN to skip, from the next remote transaction on. */
  setSkipLsn(lsn: Lsn | null): void;
  /**
   * For a watchdog: how many items the applier has taken (no change while it has work is
   * a stuck apply), whether it is idle waiting for the publisher, and how long the
   * publisher has been silent.
   */
  health(): ApplyHealth;
}

export interface ApplyHealth {
  itemsTaken: number;
  idle: boolean;
  silentMs: number;
}

export function startApplyLoop(opts: ApplyLoopOptions): ApplyLoop {
  const { stream, progress, log } = opts;
  // Bounded by count and by bytes: wide rows must not multiply memory by queue_size.
  const queue = new BoundedQueue<WorkItem>(opts.queueSize, QUEUE_BYTES);
  const pipeline = new Pipeline(opts.maxInFlight);
  const idleRecordIntervalMs = opts.idleRecordIntervalMs ?? 1000;
  const groupTransactions = opts.groupTransactions ?? 1;
  const hold = opts.hold ?? null;
  let stopping = false;
  let failure: unknown = null;
  let lastFrameAt = Date.now();
  // For health(): items taken, and whether the applier waits for the queue (not the target).
  let itemsTaken = 0;
  let idle = false;
  let pingSent = false;
  let lastFeedbackAt = 0;
  let lastRecordAt = 0;
  let feedbackScheduled = false;
  let failedTransaction: { finishLsn: Lsn; xid: number } | null = null;

  const sendFeedback = (replyRequested = false) => {
    lastFeedbackAt = Date.now();
    // Never confirm past what a table being synced still needs from the stream.
    const status = progress.standbyStatus(opts.sync.heldLsn());
    stream.sendStandbyStatus({ ...status, replyRequested });
    progress.noteReported(status.flushed);
    log.trace({ write: formatLsn(status.written), flush: formatLsn(status.flushed) }, 'feedback sent');
  };

  const parallelHolder: { value: ParallelApply | null } = { value: null };
  const session: ApplySession = {
    subscription: opts.subscription,
    progress,
    log,
    counters: opts.counters,
    sync: opts.sync,
    spool: opts.spool,
    conflicts: opts.conflicts,
    originId: opts.originId,
    asyncCommit: Boolean(opts.flushTracker),
    batchRows: opts.batchRows ?? 1,
    copyInserts: opts.copyInserts ?? false,
    groupTransactions,
    onUnknownTable: opts.onUnknownTable,
    onDurable() {
      // Coalesce: one feedback for a burst of commits.
      if (feedbackScheduled) return;
      feedbackScheduled = true;
      setTimeout(() => {
        feedbackScheduled = false;
        if (!stopping && failure === null) sendFeedback();
      }, 20).unref();
    },
  };
  const state: ApplyState = {
    session,
    get parallel() {
      return parallelHolder.value;
    },
    conn: opts.conn,
    pipeline,
    relations: opts.relations,
    tx: newTxState(),
    mode: { careful: false, carefulLsn: opts.carefulLsn, skipLsn: opts.skipLsn, streamXid: null },
    policy: {
      canPipelineCommit(finalLsn) {
        return queue.length > 0 && !(opts.noGroupUntil != null && finalLsn <= opts.noGroupUntil);
      },
      canGroup(finalLsn) {
        // Only while more is already queued: a caught-up stream commits each transaction at once.
        const group = state.tx.group;
        if (opts.noGroupUntil != null && finalLsn <= opts.noGroupUntil) return false;
        return queue.length > 0 && (group?.transactions ?? 0) + 1 < groupTransactions && (group?.changes ?? 0) < GROUP_MAX_CHANGES;
      },
    },
  };

  // The leader waits for every lane before a stream message: a lane waiting on the eager
  // transaction stops it as surely as its own wait would.
  if (opts.parallel) parallelHolder.value = new ParallelApply(state, { ...opts.parallel, dispatch, waiters: () => [opts.conn.processId, ...(lanes?.pids() ?? [])] });
  const lanes =
    opts.lanes && opts.lanes.lanes > 1
      ? new ApplyLanes(
          state,
          {
            ...opts.lanes,
            dispatch,
            groupTransactions,
            noGroupUntil: opts.noGroupUntil ?? null,
            // A lane's failure is not tied to one known transaction: retry one by one up to the last routed.
            onFailure: (err, untilLsn) => fail(err instanceof ConnectionLostError ? err : new GroupRetryError(untilLsn, err)),
          },
          log,
        )
      : null;

  const fail = (err: unknown) => {
    // A statement skipped after an earlier failure: report the earlier one, the root cause.
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    if (failure === null && !stopping) {
      // Which relation, column and change it was (the statement the target refused).
      annotateTargetError(root instanceof GroupRetryError ? root.cause : root, opts.relations);
      failure = root;
      if (state.tx.xact) failedTransaction = { finishLsn: state.tx.xact.finalLsn, xid: state.tx.xact.xid };
    }
    queue.close();
    stream.destroy();
  };

  async function receive(): Promise<void> {
    let inTransaction = false;
    // Frames come many at a time; a promise is made only when the queue is full.
    const enqueue = async (item: WorkItem, size: number): Promise<boolean> => {
      if (queue.tryPut(item, size)) return true;
      const queued = await queue.put(item, size);
      // Time spent waiting for queue space is not publisher silence.
      lastFrameAt = Date.now();
      return queued;
    };
    for await (const batch of stream.batches()) {
      lastFrameAt = Date.now();
      pingSent = false;
      if (batch.walEnd !== null) progress.noteReceived(batch.walEnd);
      for (const item of batch.items) {
        if (!(item instanceof Uint8Array)) {
          progress.noteReceived(item.walEnd);
          progress.noteKeepalive(item.sendTime);
          if (!inTransaction && !(await enqueue({ kind: 'position', lsn: item.walEnd }, 0))) return;
          if (item.replyRequested) sendFeedback();
          continue;
        }
        // The tag byte is all the receiver needs: keepalives between transactions are positions.
        const tag = item[0];
        if (tag === TAG.BEGIN || tag === TAG.BEGIN_PREPARE) inTransaction = true;
        else if (tag === TAG.COMMIT || tag === TAG.PREPARE) inTransaction = false;
        if (!(await enqueue(item, item.length))) return;
      }
    }
    if (!stopping) throw new ConnectionLostError('replication stream ended');
  }

  async function recordIdlePosition(): Promise<void> {
    const lsn = progress.processed;
    lastRecordAt = Date.now();
    const statement = idleProgressStatement(opts.subscription, lsn);
    const promoted = opts.sync.promotable(lsn, progress.durable);
    // Outside BEGIN, the statements and the Sync form one implicit transaction.
    const statements = [statement, ...promoted.flatMap((t) => [setStateStatement(opts.subscription, t, 'r', null), clearSyncProgressStatement(opts.subscription, t)])];
    await runAlone(opts.conn, statements);
    for (const t of promoted) opts.sync.set({ ...t, state: 'r', syncLsn: null });
    if (promoted.length > 0) log.info({ tables: promoted.map((t) => `${t.schema}.${t.table}`), lsn: formatLsn(lsn) }, 'tables ready');
    progress.noteDurable(lsn);
    state.session.onDurable();
  }

  /**
   * A failure with a group open, or with a commit still unanswered (it may be the one that
   * failed): retry without grouping up to here, unless the connection itself was lost.
   */
  function groupFailure(err: unknown): unknown {
    const group = state.tx.group;
    if ((!group && state.tx.unconfirmed === null) || err instanceof ConnectionLostError) return err;
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    let until = state.tx.unconfirmed?.until ?? group!.endLsn;
    for (const lsn of [group?.endLsn, state.tx.xact?.finalLsn]) if (lsn !== undefined && lsn > until) until = lsn;
    return new GroupRetryError(until, root);
  }

  /** Roll back the target transaction after a failed statement (the wire waits for a Sync). */
  async function rollbackTarget(): Promise<void> {
    pipeline.reset();
    endTarget(state);
    await opts.conn.sync().catch(() => {});
    const rollback = opts.conn.execute('ROLLBACK');
    const synced = opts.conn.sync();
    await rollback;
    await synced;
  }

  // The current remote transaction's raw messages, for a careful replay; null when not kept.
  let kept: Buffer[] | null = null;
  let keptBytes = 0;
  let keptTooLarge = false;

  /** Whether `err` was a conflict the careful path resolves, and the transaction was replayed. */
  async function replayCarefully(err: unknown): Promise<boolean> {
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    const xact = state.tx.xact;
    if (!opts.conflicts.detect || state.mode.careful || xact === null || !isConflictSignal(root)) return false;
    if (keptTooLarge || kept === null) throw new CarefulReplayError(xact.finalLsn, root);
    log.debug(
      { xid: xact.xid, finishLsn: formatLsn(xact.finalLsn), messages: kept.length, cause: (root as Error).message },
      'conflict in the pipeline; re-applying the transaction carefully',
    );
    await rollbackTarget();
    state.mode.careful = true;
    opts.counters.carefulReplays++;
    const messages = kept;
    for (const raw of messages) await dispatch(state, decode(raw, { inStream: false, streamAbortInfo: opts.streamAbortInfo }), raw);
    return true;
  }

  async function apply(): Promise<void> {
    const decodeContext = { inStream: false, streamAbortInfo: opts.streamAbortInfo };
    while (!stopping) {
      let next = queue.takeNow();
      if (next === undefined) {
        idle = true;
        next = await queue.take();
        idle = false;
      }
      const item = next;
      itemsTaken++;
      if (item === undefined || stopping) break;
      const isMessage = item instanceof Uint8Array;
      if (hold !== null && !decodeContext.inStream && state.tx.xact === null && state.mode.streamXid === null) {
        const at = isMessage ? peekVisibleCommitLsn(item) : item.kind === 'position' ? item.lsn : null;
        if (at !== null && hold.blocks(at, !isMessage)) {
          try {
            // Every COMMIT answered before the hold looks at the target.
            await settleTarget(state);
          } catch (err) {
            throw groupFailure(err);
          }
          if (!stopping) await hold.atBoundary(at);
        }
      }
      if (lanes !== null && !decodeContext.inStream && state.mode.streamXid === null) {
        let routed = false;
        try {
          if (isMessage) {
            const r = lanes.route(item, queue.length);
            routed = r === true || r === false ? r : await r;
          } else routed = lanes.busy; // a position while lanes run: the next serial step records one
          if (routed) lanes.endIfIdle(queue.length);
          else if (lanes.needsConverge) await lanes.converge();
        } catch (err) {
          throw groupFailure(err);
        }
        if (routed) continue;
      }
      if (isMessage) {
        const raw = item;
        const tag = raw[0];
        // Stream Start opens a stream block and Stream Stop closes it (neither is inside it).
        if (tag === TAG.STREAM_START) decodeContext.inStream = true;
        else if (tag === TAG.STREAM_STOP) decodeContext.inStream = false;
        // Keep what a careful replay would need: a transaction from its first message,
        // or the single STREAM COMMIT / STREAM PREPARE that replays a spooled one.
        if (opts.conflicts.detect && !decodeContext.inStream) {
          if (state.tx.xact === null && state.mode.streamXid === null) {
            kept = [];
            keptBytes = 0;
            keptTooLarge = false;
          }
          if (kept !== null && !keptTooLarge) {
            keptBytes += raw.length;
            if (keptBytes > REPLAY_BYTES) {
              // Past the limit the kept messages are useless: release them now, not at the
              // end of what may be a huge transaction (they pin their frames' memory).
              keptTooLarge = true;
              kept = [];
            } else kept.push(raw);
          }
        }
        // An insert that joins a COPY as sent is never decoded (its failures come as the
        // batch's); most other changes complete without waiting (batched): no promise then.
        let pending = tag === TAG.INSERT && !decodeContext.inStream ? insertAsSent(state, raw) : false;
        const message = pending === false ? decode(raw, decodeContext) : null;
        try {
          if (message !== null) pending = dispatch(state, message, raw);
          if (pending) await pending;
        } catch (err) {
          // An earlier commit still unanswered: if it went through, the failure is this
          // transaction's own and a careful replay applies; if not, retry one by one.
          if (!state.tx.group && state.tx.unconfirmed !== null) await pipelinedCommitSucceeded(state);
          if (state.tx.group || state.tx.unconfirmed !== null) throw groupFailure(err);
          if (!(await replayCarefully(err))) throw err;
        }
        if (state.tx.xact === null && state.mode.streamXid === null) {
          state.mode.careful = false;
          kept = null;
        }
      }
      // Nothing more waiting: the grouped transactions commit now, not with the next arrival.
      if (state.tx.group && state.tx.xact === null && queue.length === 0) {
        try {
          await commitGroup(state);
        } catch (err) {
          throw groupFailure(err);
        }
      } else if (!isMessage && item.kind === 'position' && state.tx.xact === null) progress.noteProcessed(item.lsn);
      const now = Date.now();
      if (
        state.tx.xact === null &&
        state.tx.group === null &&
        progress.hasUnrecordedPosition &&
        now - lastRecordAt >= idleRecordIntervalMs &&
        (queue.length === 0 || now - lastFeedbackAt >= opts.statusIntervalMs)
      ) {
        try {
          // A commit still unanswered must be known to have succeeded before a later position is recorded.
          await settleTarget(state);
          await recordIdlePosition();
        } catch (err) {
          throw groupFailure(err);
        }
      }
    }
  }

  // lsn_mapping's other half: how far the target's WAL is flushed (its walwriter flushes
  // asynchronous commits within wal_writer_delay). When the applier is idle, waiting for
  // the walwriter only delays the confirmation (up to 200 ms by default, a good part of a
  // short catch-up): a synchronous commit flushes every asynchronous one before it
  // (store.ts flushBarrierStatements).
  let flushQueryRunning = false;
  const flushTimer = opts.flushTracker
    ? setInterval(() => {
        const tracker = opts.flushTracker!;
        if (flushQueryRunning || !progress.hasUnflushed || stopping) return;
        flushQueryRunning = true;
        const idle = queue.length === 0 && state.tx.xact === null && state.tx.group === null;
        const flushQuery = { text: 'SELECT pg_catalog.pg_current_wal_flush_lsn()::text', params: [], wantRows: true };
        runAlone(tracker, idle ? [...flushBarrierStatements(opts.subscription), flushQuery] : [flushQuery])
          .then((results) => {
            if (progress.noteTargetFlush(parseLsn(String(results[results.length - 1]?.rows[0]?.[0])))) state.session.onDurable();
          })
          .catch((err: unknown) => fail(err))
          .finally(() => (flushQueryRunning = false));
      }, 50)
    : null;
  flushTimer?.unref();

  const timer = setInterval(
    () => {
      const now = Date.now();
      if (now - lastFeedbackAt >= opts.statusIntervalMs) sendFeedback();
      // A hold waiting for the position past its LSN: ask, an idle publisher may not say.
      else if (hold?.wantsPosition() && !pingSent) sendFeedback(true);
      const silentFor = now - lastFrameAt;
      if (!queue.full) {
        if (silentFor >= opts.receiveTimeoutMs) {
          fail(new ConnectionLostError(`no message from the publisher for ${Math.round(silentFor / 1000)} s (receive_timeout)`));
        } else if (silentFor >= opts.receiveTimeoutMs / 2 && !pingSent) {
          pingSent = true;
          sendFeedback(true);
        }
      }
      if (queue.length === 0 && progress.hasUnrecordedPosition && now - lastRecordAt >= idleRecordIntervalMs) {
        void queue.put({ kind: 'tick' });
      }
    },
    Math.min(250, opts.statusIntervalMs),
  );
  timer.unref();

  const receiver = receive().catch(fail);
  const applier = apply().catch(fail);

  const done = (async () => {
    await applier;
    queue.close();
    clearInterval(timer);
    if (flushTimer) clearInterval(flushTimer);
    if (state.tx.xact?.open || state.tx.group) {
      // Roll back the partial remote transaction; it is resent after restart.
      pipeline.reset();
      await opts.conn.sync().catch(() => {});
      await Promise.all([opts.conn.execute('ROLLBACK'), opts.conn.sync()]).catch(() => {});
    }
    endTarget(state);
    await parallelHolder.value?.close();
    await lanes?.close();
    if (failure === null) sendFeedback();
    stream.destroy();
    await receiver;
    if (failure !== null) throw failure;
  })();

  return {
    done,
    failedTransaction: () => failedTransaction,
    setSkipLsn(lsn) {
      state.mode.skipLsn = lsn;
    },
    health: () => ({ itemsTaken, idle, silentMs: Date.now() - lastFrameAt }),
    stop() {
      if (stopping) return;
      stopping = true;
      queue.close();
    },
  };
}
