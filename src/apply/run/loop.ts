/**
 * The streaming apply loop (worker.c's LogicalRepApplyLoop) as one object of four parts,
 * each the one writer of its own state:
 *  - Receiver (receiver.ts) reads CopyData frames, answers keepalives and queues messages
 *    as bytes (bounded: a full queue stops the reading, back-pressuring the socket);
 *  - Applier (applier.ts) takes queued items in order, decodes each message once and
 *    dispatches it to the apply lanes or the handlers, commits, records idle positions;
 *  - Feedback (feedback.ts) reports only the durable position (origin/positions.ts): after
 *    applied commits, every status interval, at once when the publisher asks;
 *  - FlushTracker (flush-tracker.ts), with synchronous_commit = off, follows the target's
 *    WAL flush so feedback confirms only what is on disk.
 * The loop itself owns the phase (running, stopping, failed) and the timer that pings a
 * silent publisher after half the receive timeout and drops it after all of it. Stopping
 * rolls back an open target transaction: a partial source transaction is never committed;
 * it is received again after restart. When it ends it logs 'apply loop stopped' with where
 * its time went (loop-times.ts).
 */
import { ConnectionLostError } from '../../errors.js';
import type { ApplyOptions } from '../../config/apply-options.js';
import type { Logger } from '../../log.js';
import type { Lsn } from '../../protocol/lsn.js';
import type { ReplicationStream } from '../../protocol/replication.js';
import type { Progress } from '../../origin/positions.js';
import type { SyncStates } from '../../origin/sync-state.js';
import type { WireConnection } from '../../pgwire/connect.js';
import { Pipeline } from '../../pgwire/pipeline.js';
import { PipelineAbortedError } from '../../pgwire/wire.js';
import { dispatch } from '../handlers/dispatch.js';
import { annotateTargetError } from '../sql/failure.js';
import type { RelationMap } from '../sql/relmap.js';
import { newTxState, type ApplyCounters, type ApplySession, type ApplyState } from '../txn/apply-state.js';
import { endTarget } from '../txn/commit.js';
import type { StreamSpool } from '../txn/spool.js';
import { Applier } from './applier.js';
import { Feedback } from './feedback.js';
import { FlushTracker } from './flush-tracker.js';
import type { ApplyHold } from './hold.js';
import { ApplyLanes, type LaneConnections } from './lanes.js';
import { loopTimesReport } from './loop-times.js';
import { ParallelApply, type ParallelConnections } from './parallel.js';
import { BoundedQueue } from './queue.js';
import { Receiver, type WorkItem } from './receiver.js';
import { GroupRetryError } from './retry-errors.js';

export { CarefulReplayError, GroupRetryError } from './retry-errors.js';

const QUEUE_BYTES = 16 * 1024 * 1024;
/** A group also ends after this many changes: a failure re-applies at most this much. */
const GROUP_MAX_CHANGES = 100_000;

export interface ApplyLoopOptions {
  /** The settings, built once from the config (config/apply-options.ts). */
  options: ApplyOptions;
  stream: ReplicationStream;
  conn: WireConnection;
  relations: RelationMap;
  progress: Progress;
  counters: ApplyCounters;
  sync: SyncStates;
  spool: StreamSpool;
  onUnknownTable(schema: string, table: string): void;
  log: Logger;
  /**
   * synchronous_commit = off: apply transactions commit asynchronously, and this idle
   * connection asks for the target's WAL flush position so feedback can follow it.
   */
  flushTracker?: WireConnection | null;
  /** No grouping of transactions finishing at or before this LSN (after a GroupRetryError). */
  noGroupUntil?: Lsn | null;
  /** apply_workers > 1: how the apply lanes open their connections (lanes.ts). */
  lanes?: LaneConnections | null;
  /** streaming = parallel, in a session that starts at the origin (never re-streams applied commits). */
  parallel?: ParallelConnections | null;
  /** Minimum spacing of idle-position records in the target. */
  idleRecordIntervalMs?: number;
  /** This session's replication origin id when the target tracks commit origins; else null. */
  originId: number | null;
  /** Finish LSN of the transaction `pgsub skip` named. */
  skipLsn: Lsn | null;
  /** Finish LSN of a transaction to apply carefully from its start (after a CarefulReplayError). */
  carefulLsn: Lsn | null;
  /** A hold at a source LSN (`pgsub verify`, hold.ts); absent: never held. */
  hold?: ApplyHold | null;
}

export interface ApplyHealth {
  /** Items the applier has taken (no change while it has work is a stuck apply). */
  itemsTaken: number;
  /** Waiting for the publisher, not for the target. */
  idle: boolean;
  /** How long the publisher has been silent. */
  silentMs: number;
}

type Phase = 'running' | 'stopping' | 'failed';

export class ApplyLoop {
  /** Settles when the loop ends: resolves after stop(), rejects with the first failure. */
  readonly done: Promise<void>;
  #phase: Phase = 'running';
  #failure: unknown = null;
  #failedTransaction: { finishLsn: Lsn; xid: number } | null = null;
  readonly #startedAt = performance.now();
  readonly #cpuAtStart = process.cpuUsage();
  readonly #queue: BoundedQueue<WorkItem>;
  readonly #state: ApplyState;
  readonly #feedback: Feedback;
  readonly #receiver: Receiver;
  readonly #applier: Applier;
  readonly #flushTracker: FlushTracker | null;
  readonly #lanes: ApplyLanes | null;
  readonly #parallel: ParallelApply | null;
  readonly #timer: NodeJS.Timeout;
  readonly #idleRecordIntervalMs: number;

  constructor(private readonly opts: ApplyLoopOptions) {
    const { options, progress } = opts;
    // Bounded by count and by bytes: wide rows must not multiply memory by queue_size.
    this.#queue = new BoundedQueue<WorkItem>(options.queueSize, QUEUE_BYTES);
    this.#idleRecordIntervalMs = opts.idleRecordIntervalMs ?? 1000;
    const live = () => this.#phase === 'running';
    this.#feedback = new Feedback(opts.stream, progress, opts.sync, opts.log, live);
    const parallelRef: { value: ParallelApply | null } = { value: null };
    this.#state = this.#newState(parallelRef);
    this.#lanes = this.#newLanes();
    // The leader waits for every lane before a stream message: a lane waiting on the eager
    // transaction stops it as surely as its own wait would.
    this.#parallel = opts.parallel
      ? new ParallelApply(this.#state, { ...opts.parallel, options, dispatch, waiters: () => [opts.conn.processId, ...(this.#lanes?.pids() ?? [])] })
      : null;
    parallelRef.value = this.#parallel;
    this.#receiver = new Receiver(opts.stream, this.#queue, progress, this.#feedback, () => this.#phase !== 'running');
    this.#applier = new Applier({
      state: this.#state,
      options,
      queue: this.#queue,
      lanes: this.#lanes,
      hold: opts.hold ?? null,
      streamAbortInfo: options.streaming === 'parallel',
      idleRecordIntervalMs: this.#idleRecordIntervalMs,
      sinceFeedbackMs: () => this.#feedback.sinceLastMs,
      stopping: () => this.#phase !== 'running',
    });
    this.#flushTracker = opts.flushTracker
      ? new FlushTracker(opts.flushTracker, options.subscription, progress, {
          idle: () => this.#queue.length === 0 && this.#state.tx.xact === null && this.#state.tx.group === null,
          live,
          onDurable: () => this.#feedback.soon(),
          onError: (err) => this.#fail(err),
        })
      : null;
    this.#flushTracker?.start();
    this.#timer = setInterval(() => this.#onTimer(), Math.min(250, options.statusIntervalMs));
    this.#timer.unref();
    const receiver = this.#receiver.run().catch((err: unknown) => this.#fail(err));
    const applier = this.#applier.run().catch((err: unknown) => this.#fail(err));
    this.done = this.#finish(receiver, applier);
  }

  /** The remote transaction being applied when the loop failed (for pgsub skip and status). */
  failedTransaction(): { finishLsn: Lsn; xid: number } | null {
    return this.#failedTransaction;
  }

  /** `pgsub skip` while running: the finish LSN to skip, from the next remote transaction on. */
  setSkipLsn(lsn: Lsn | null): void {
    this.#state.mode.skipLsn = lsn;
  }

  health(): ApplyHealth {
    return { itemsTaken: this.#applier.times.items, idle: this.#applier.idle, silentMs: this.#receiver.silentMs };
  }

  stop(): void {
    if (this.#phase !== 'running') return;
    this.#phase = 'stopping';
    this.#queue.close();
  }

  #newState(parallel: { value: ParallelApply | null }): ApplyState {
    const { opts } = this;
    const { options } = opts;
    const noGroupUntil = opts.noGroupUntil ?? null;
    const retrying = (finalLsn: Lsn) => noGroupUntil !== null && finalLsn <= noGroupUntil;
    const session: ApplySession = {
      subscription: options.subscription,
      options,
      progress: opts.progress,
      log: opts.log,
      counters: opts.counters,
      sync: opts.sync,
      spool: opts.spool,
      originId: opts.originId,
      asyncCommit: Boolean(opts.flushTracker),
      onUnknownTable: opts.onUnknownTable,
      onDurable: () => this.#feedback.soon(),
    };
    const queue = this.#queue;
    const state: ApplyState = {
      session,
      get parallel() {
        return parallel.value;
      },
      conn: opts.conn,
      pipeline: new Pipeline(options.maxInFlight),
      relations: opts.relations,
      tx: newTxState(),
      mode: { careful: false, carefulLsn: opts.carefulLsn, skipLsn: opts.skipLsn, streamXid: null },
      policy: {
        // Not when retrying one by one; else never wait for a commit's answer: the applier
        // watches for it while the queue is empty (applier.ts).
        canPipelineCommit: (finalLsn) => !retrying(finalLsn),
        canGroup(finalLsn) {
          // Only while more is already queued: a caught-up stream commits each transaction at once.
          const group = state.tx.group;
          if (retrying(finalLsn)) return false;
          return queue.length > 0 && (group?.transactions ?? 0) + 1 < options.groupTransactions && (group?.changes ?? 0) < GROUP_MAX_CHANGES;
        },
      },
    };
    return state;
  }

  #newLanes(): ApplyLanes | null {
    const { opts } = this;
    if (!opts.lanes || opts.options.applyWorkers < 2) return null;
    return new ApplyLanes(
      this.#state,
      {
        ...opts.lanes,
        options: opts.options,
        dispatch,
        noGroupUntil: opts.noGroupUntil ?? null,
        // A lane's failure is not tied to one known transaction: retry one by one up to the last routed.
        onFailure: (err, untilLsn) => this.#fail(err instanceof ConnectionLostError ? err : new GroupRetryError(untilLsn, err)),
      },
      opts.log,
    );
  }

  /** Feedback when due, pings and the receive timeout, and a tick for an idle position. */
  #onTimer(): void {
    const { options, progress } = this.opts;
    const feedback = this.#feedback;
    if (feedback.sinceLastMs >= options.statusIntervalMs) feedback.send();
    // A hold waiting for the position past its LSN: ask, an idle publisher may not say.
    else if (this.opts.hold?.wantsPosition()) feedback.ping();
    const silentFor = this.#receiver.silentMs;
    if (!this.#queue.full) {
      if (silentFor >= options.receiveTimeoutMs) {
        this.#fail(new ConnectionLostError(`no message from the publisher for ${Math.round(silentFor / 1000)} s (receive_timeout)`));
      } else if (silentFor >= options.receiveTimeoutMs / 2) feedback.ping();
    }
    if (this.#queue.length === 0 && progress.hasUnrecordedPosition && this.#applier.sinceRecordMs >= this.#idleRecordIntervalMs) {
      void this.#queue.put({ kind: 'tick' });
    }
  }

  /** The first failure wins; the stream and the queue close so both tasks end. */
  #fail(err: unknown): void {
    // A statement skipped after an earlier failure: report the earlier one, the root cause.
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    if (this.#phase === 'running') {
      // Which relation, column and change it was (the statement the target refused).
      annotateTargetError(root instanceof GroupRetryError ? root.cause : root, this.opts.relations);
      this.#phase = 'failed';
      this.#failure = root;
      const xact = this.#state.tx.xact;
      if (xact) this.#failedTransaction = { finishLsn: xact.finalLsn, xid: xact.xid };
    }
    this.#queue.close();
    this.opts.stream.destroy();
  }

  async #finish(receiver: Promise<void>, applier: Promise<void>): Promise<void> {
    await applier;
    const { conn } = this.opts;
    const state = this.#state;
    this.#queue.close();
    clearInterval(this.#timer);
    this.#flushTracker?.stop();
    if (state.tx.xact?.open || state.tx.group) {
      // Roll back the partial remote transaction; it is resent after restart.
      state.pipeline.reset();
      await conn.sync().catch(() => {});
      await Promise.all([conn.execute('ROLLBACK'), conn.sync()]).catch(() => {});
    }
    endTarget(state);
    await this.#parallel?.close();
    await this.#lanes?.close();
    if (this.#failure === null) this.#feedback.send();
    this.opts.stream.destroy();
    await receiver;
    this.opts.log.info(loopTimesReport(performance.now() - this.#startedAt, process.cpuUsage(this.#cpuAtStart), this.#receiver.times, this.#applier.times), 'apply loop stopped');
    if (this.#failure !== null) throw this.#failure;
  }
}

export function startApplyLoop(opts: ApplyLoopOptions): ApplyLoop {
  return new ApplyLoop(opts);
}
