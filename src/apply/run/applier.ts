/**
 * The apply loop's worker half (worker.c's apply_dispatch side of LogicalRepApplyLoop):
 * takes queued items in order, decodes each message once and hands it, once, to the apply
 * lanes or to the handler table; records idle positions; stops at a verify hold's boundary.
 * While behind, commits go out without waiting for their answers (txn/commit.ts), also the
 * last one before the queue runs dry: the applier then waits for the next item or that
 * answer, whichever comes first, so a failed commit is seen at once and nothing after it
 * is committed (the server skips up to the next Sync).
 *
 * Conflicts (conflict/detect.ts): the raw messages of the remote transactions whose target
 * commit is not known yet are kept; when a pipelined statement aborts on a conflict, in a
 * group or not, conflict-replay.ts rolls back and applies them again in this session, the
 * conflicting one carefully. What it cannot resolve from memory is replayed by a new
 * session (CarefulReplayError, GroupRetryError). Any other failure while a group is open or
 * a commit is unanswered is retried one transaction at a time (GroupRetryError).
 *
 * Fields: what the applier alone writes (items taken, idle, the last idle record, the
 * stream block, the kept messages, its wait counters); the transaction state is the txn
 * layer's (apply-state.ts).
 */
import { ConnectionLostError } from '../../errors.js';
import type { ApplyOptions } from '../../config/apply-options.js';
import { decode } from '../../protocol/decoder.js';
import { formatLsn, type Lsn } from '../../protocol/lsn.js';
import type { DecodeContext, PgOutputMessage } from '../../protocol/messages.js';
import { peekVisibleCommitLsn } from '../../protocol/peek.js';
import { TAG } from '../../protocol/tags.js';
import { idleProgressStatement } from '../../origin/store.js';
import { clearSyncProgressStatement, setStateStatement } from '../../origin/sync-state.js';
import { runAlone } from '../../pgwire/connect.js';
import { PipelineAbortedError } from '../../pgwire/wire.js';
import { dispatch } from '../handlers/dispatch.js';
import { insertAsSent } from '../handlers/changes.js';
import { spoolRowChange } from '../handlers/stream.js';
import type { ApplyState } from '../txn/apply-state.js';
import { commitGroup, pipelinedCommitSucceeded, PLAIN_COMMIT, settleTarget } from '../txn/commit.js';
import { ConflictReplay, RESOLVED } from './conflict-replay.js';
import type { ApplyHold } from './hold.js';
import type { ApplyLanes } from './lanes.js';
import { newApplierTimes, type ApplierTimes } from './loop-times.js';
import type { BoundedQueue } from './queue.js';
import type { WorkItem } from './receiver.js';
import { GroupRetryError } from './retry-errors.js';

export interface ApplierParts {
  state: ApplyState;
  options: ApplyOptions;
  queue: BoundedQueue<WorkItem>;
  lanes: ApplyLanes | null;
  hold: ApplyHold | null;
  /** Stream Abort messages carry abort LSN and time (protocol 4). */
  streamAbortInfo: boolean;
  /** Minimum spacing of idle-position records in the target. */
  idleRecordIntervalMs: number;
  /** Time since the last feedback message (feedback.ts). */
  sinceFeedbackMs(): number;
  stopping(): boolean;
}

/**
 * Inside a streamed block the queue stays full and most items need no promise, so the loop
 * could run for many milliseconds without the event loop reading a socket: the parallel
 * connection's read-ahead and its answers wait (its backend idles) and the walsender's
 * socket fills. So it gives the event loop a turn every STREAM_YIELD_MS (looked at every
 * STREAM_YIELD_EVERY + 1 items). Measured when the leader still fed the parallel connection
 * itself (W3 parallel, medians against the code without it: 15.20 → 14.32 s and 15.54 →
 * 13.26 s, docs/benchmarks.md); outside streams (W2) yielding cost 6%, so it is not done there.
 */
const STREAM_YIELD_MS = 2;
const STREAM_YIELD_EVERY = 255;

/** What a dispatch threw, handed to the slow path (a handler's answer may be any thenable, so the failure is the one marked). */
class DispatchFailed {
  constructor(readonly failure: unknown) {}
}

export class Applier {
  readonly times: ApplierTimes = newApplierTimes();
  #idle = false;
  #lastRecordAt = 0;
  /** Inside STREAM START … STREAM STOP (messages carry an xid). */
  readonly #decodeContext: DecodeContext;
  /** The messages kept for a conflict's replay, and the replay (conflict-replay.ts). */
  readonly #conflicts: ConflictReplay;

  constructor(private readonly p: ApplierParts) {
    this.#decodeContext = { inStream: false, streamAbortInfo: p.streamAbortInfo };
    this.#conflicts = new ConflictReplay(p.state, p.streamAbortInfo);
  }

  /** Waiting for the queue (not for the target): for a watchdog. */
  get idle(): boolean {
    return this.#idle;
  }

  /** Time since the last idle position was recorded. */
  get sinceRecordMs(): number {
    return Date.now() - this.#lastRecordAt;
  }

  async run(): Promise<void> {
    const { queue } = this.p;
    let yieldedAt = performance.now();
    while (!this.p.stopping()) {
      // Between items, so that none is held across the turn and a stop during it is seen.
      if ((this.times.items & STREAM_YIELD_EVERY) === 0 && this.#decodeContext.inStream && performance.now() - yieldedAt > STREAM_YIELD_MS) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        this.times.yields++;
        yieldedAt = performance.now();
        if (this.p.stopping()) break;
      }
      const item = queue.takeNow() ?? (await this.#waitForItem());
      this.times.items++;
      if (item === undefined || this.p.stopping()) break;
      // Most items are applied without waiting for anything: no promise then (an async
      // call and an await per item cost 3-6% of pgsub's CPU on small transactions).
      const routed = item instanceof Uint8Array ? this.#onMessage(item) : this.#onPosition(item);
      // Routed to an apply lane: the lanes commit it.
      if (routed === true || (routed !== false && (await routed))) continue;
      const after = this.#afterItem(item);
      if (after !== undefined) await after;
    }
  }

  /** A position (or a tick) between transactions; true: the lanes are busy and the next serial step records one. */
  #onPosition(item: Exclude<WorkItem, Buffer>): boolean | Promise<boolean> {
    const { state } = this.p;
    const outside = !this.#decodeContext.inStream && state.mode.streamXid === null;
    if (this.p.hold !== null && outside && state.tx.xact === null && item.kind === 'position') {
      return this.#atHold(item.lsn, true).then(() => this.#positionForLanes(outside));
    }
    return this.#positionForLanes(outside);
  }

  #positionForLanes(outside: boolean): boolean | Promise<boolean> {
    const { lanes } = this.p;
    if (lanes === null || !outside) return false;
    if (lanes.busy) {
      lanes.endIfIdle(this.p.queue.length);
      return true;
    }
    if (lanes.needsConverge) return this.#converge().then(() => false);
    return false;
  }

  /**
   * The queue is empty: wait for the next item, or for the answer of a commit sent without
   * waiting (a failed one must stop the apply now, not at the next arrival).
   */
  async #waitForItem(): Promise<WorkItem | undefined> {
    const { state, queue } = this.p;
    const since = performance.now();
    this.#idle = true;
    try {
      for (;;) {
        const unconfirmed = state.tx.unconfirmed;
        if (unconfirmed === null || queue.length > 0) return await queue.take();
        await Promise.race([queue.ready(), unconfirmed.answered.catch(() => {})]);
        if (queue.length === 0 && state.tx.unconfirmed === unconfirmed && !(await pipelinedCommitSucceeded(state))) {
          // Between transactions the open group may commit; inside one (its next message not
          // here yet) nothing may: a commit now would end the remote transaction half applied.
          if (state.tx.xact === null) await this.#settle();
          else await this.#surfaceFailure(unconfirmed.answered);
        }
      }
    } finally {
      this.#idle = false;
      this.times.queueWaitMs += performance.now() - since;
    }
  }

  /** Apply one message; true when an apply lane took it instead. */
  #onMessage(raw: Buffer): boolean | Promise<boolean> {
    const { state } = this.p;
    const outside = !this.#decodeContext.inStream && state.mode.streamXid === null;
    if (this.p.hold !== null && outside && state.tx.xact === null) {
      const at = peekVisibleCommitLsn(raw);
      if (at !== null) return this.#atHold(at, false).then(() => this.#decodeAndApply(raw, outside));
    }
    return this.#decodeAndApply(raw, outside);
  }

  #decodeAndApply(raw: Buffer, outside: boolean): boolean | Promise<boolean> {
    const tag = raw[0];
    // Decoded here, once: an insert that may join a COPY as sent is never decoded (its
    // failures come as the batch's), nor a stream block's row change, which is spooled as
    // bytes and decoded where it is applied; the lanes and the handlers get this message.
    const inStream = this.#decodeContext.inStream;
    const message = (inStream ? tag === TAG.INSERT || tag === TAG.UPDATE || tag === TAG.DELETE : tag === TAG.INSERT) ? null : decode(raw, this.#decodeContext);
    if (this.p.lanes !== null && outside) return this.#route(raw, message).then((routed) => routed || this.#apply(raw, message, tag));
    return this.#apply(raw, message, tag);
  }

  /** Dispatch the message (not routed to a lane); a promise only when it must wait. */
  #apply(raw: Buffer, message: PgOutputMessage | null, tag: number | undefined): false | Promise<false> {
    const ctx = this.#decodeContext;
    // Stream Start opens a stream block and Stream Stop closes it (neither is inside it).
    if (tag === TAG.STREAM_START) ctx.inStream = true;
    else if (tag === TAG.STREAM_STOP) ctx.inStream = false;
    // Kept (conflict-replay.ts): a conflict's replay dispatches it again; if not, it is dispatched again here.
    const kept = !ctx.inStream && this.#conflicts.keep(raw, message);
    const step = this.#dispatchOnce(raw, message);
    if (step !== undefined) return this.#applyWaiting(raw, message, kept, step);
    this.#afterMessage();
    return false;
  }

  /** Dispatch once: nothing when it completed (most changes are batched), the answer to wait for, or what it threw. */
  #dispatchOnce(raw: Buffer, message: PgOutputMessage | null): Promise<void> | DispatchFailed | undefined {
    const { state } = this.p;
    try {
      if (message === null && this.#decodeContext.inStream) {
        spoolRowChange(state, raw);
        return undefined;
      }
      let pending = message === null ? insertAsSent(state, raw) : false;
      if (pending === false) pending = dispatch(state, message ?? decode(raw, this.#decodeContext), raw);
      return pending || undefined;
    } catch (failure) {
      return new DispatchFailed(failure);
    }
  }

  /** The message's slow path: its answer awaited; after a failure, recovered and dispatched again unless a replay applied it. */
  async #applyWaiting(raw: Buffer, message: PgOutputMessage | null, kept: boolean, first: Promise<void> | DispatchFailed): Promise<false> {
    let step: Promise<void> | DispatchFailed | undefined = first;
    while (step !== undefined) {
      try {
        if (step instanceof DispatchFailed) throw step.failure;
        await this.#timed(step, 'resultsWaitMs');
        break;
      } catch (err) {
        await this.#recover(err);
        if (kept) break;
        step = this.#dispatchOnce(raw, message);
      }
    }
    this.#afterMessage();
    return false;
  }

  /** A remote transaction ended: the careful mode and the kept span's current transaction end with it. */
  #afterMessage(): void {
    const { state } = this.p;
    if (state.tx.xact === null && state.mode.streamXid === null) {
      state.mode.careful = false;
      this.#conflicts.ended();
    }
  }

  /** Offer the message to the apply lanes: true when a lane took it. */
  async #route(raw: Buffer, message: PgOutputMessage | null): Promise<boolean> {
    const lanes = this.p.lanes!;
    const queued = this.p.queue.length;
    try {
      const r = lanes.route(raw, message, queued);
      const routed = r === true || r === false ? r : await this.#timed(r, 'resultsWaitMs');
      if (routed) {
        this.#conflicts.interrupt();
        lanes.endIfIdle(queued);
      } else if (lanes.needsConverge) await this.#timed(lanes.converge(), 'commitWaitMs');
      return routed;
    } catch (err) {
      throw this.#groupFailure(err);
    }
  }

  /** Before the serial path: every lane's group committed, the origin back on the main connection. */
  async #converge(): Promise<void> {
    try {
      await this.#timed(this.p.lanes!.converge(), 'commitWaitMs');
    } catch (err) {
      throw this.#groupFailure(err);
    }
  }

  /** A hold of `pgsub verify` at `at`: every COMMIT answered before the hold looks at the target. */
  async #atHold(at: Lsn, isPosition: boolean): Promise<void> {
    const hold = this.p.hold!;
    if (!hold.blocks(at, isPosition)) return;
    await this.#settle();
    if (!this.p.stopping()) await hold.atBoundary(at);
  }

  /** After each item: the group commits when nothing more waits; an idle position is recorded now and then. */
  #afterItem(item: WorkItem): Promise<void> | undefined {
    const { state, queue } = this.p;
    if (state.tx.group && state.tx.xact === null && queue.length === 0) return this.#commitGroupNow().then(() => this.#recordIfDue());
    if (!(item instanceof Uint8Array) && item.kind === 'position' && state.tx.xact === null) state.session.progress.noteProcessed(item.lsn);
    return this.#recordIfDue();
  }

  /**
   * Nothing more waiting: the grouped transactions commit now, not with the next arrival,
   * and without waiting for the answer (#waitForItem watches for it).
   */
  async #commitGroupNow(): Promise<void> {
    const { state, queue } = this.p;
    while (state.tx.group && state.tx.xact === null && queue.length === 0) {
      try {
        await this.#timed(commitGroup(state, PLAIN_COMMIT), 'commitWaitMs');
      } catch (err) {
        await this.#recover(err);
      }
    }
  }

  /** An idle position recorded when one is due: between transactions, now and then, when the queue is empty or feedback is due. */
  #recordIfDue(): Promise<void> | undefined {
    const { state, queue } = this.p;
    if (
      state.tx.xact === null &&
      state.tx.group === null &&
      state.session.progress.hasUnrecordedPosition &&
      Date.now() - this.#lastRecordAt >= this.p.idleRecordIntervalMs &&
      (queue.length === 0 || this.p.sinceFeedbackMs() >= this.p.options.statusIntervalMs)
    ) {
      return this.#recordIdle();
    }
    return undefined;
  }

  async #recordIdle(): Promise<void> {
    // A commit still unanswered must be known to have succeeded before a later position is recorded.
    await this.#settle();
    try {
      await this.#timed(this.#recordIdlePosition(), 'commitWaitMs');
    } catch (err) {
      throw this.#groupFailure(err);
    }
  }

  /** Every commit sent answered and known to have succeeded (settleTarget), timed as a commit wait. */
  async #settle(): Promise<void> {
    for (;;) {
      try {
        await this.#timed(settleTarget(this.p.state), 'commitWaitMs');
        return;
      } catch (err) {
        await this.#recover(err);
      }
    }
  }

  /**
   * A commit sent without waiting failed while a remote transaction is under way: its
   * failure is handled (a conflict replayed in place, restoring the transaction's part
   * applied so far; anything else ends the loop) without committing anything.
   */
  async #surfaceFailure(answered: Promise<void>): Promise<void> {
    try {
      await this.#timed(this.p.state.pipeline.drain(), 'commitWaitMs');
      // Drained already elsewhere: the answer itself carries the failure.
      await answered;
    } catch (err) {
      await this.#recover(err);
    }
  }

  /**
   * After a failure: a conflict is resolved in place (conflict-replay.ts) and the applier
   * goes on; anything else ends the loop — after a group or a commit still unanswered, as a
   * retry one transaction at a time (an unanswered commit that went through leaves the
   * failure to the transaction under way).
   */
  async #recover(err: unknown): Promise<void> {
    const { state } = this.p;
    let failure: unknown;
    try {
      failure = await this.#conflicts.resolve(err);
    } catch (e) {
      failure = e;
    }
    if (failure === RESOLVED) return;
    if (!state.tx.group && state.tx.unconfirmed !== null) await pipelinedCommitSucceeded(state);
    throw this.#groupFailure(failure);
  }

  async #recordIdlePosition(): Promise<void> {
    const { state } = this.p;
    const { progress, sync, subscription, log } = state.session;
    const lsn = progress.processed;
    this.#lastRecordAt = Date.now();
    const promoted = sync.promotable(lsn, progress.durable);
    // Outside BEGIN, the statements and the Sync form one implicit transaction.
    const statements = [
      idleProgressStatement(subscription, lsn),
      ...promoted.flatMap((t) => [setStateStatement(subscription, t, 'r', null), clearSyncProgressStatement(subscription, t)]),
    ];
    await runAlone(state.conn, statements);
    for (const t of promoted) sync.set({ ...t, state: 'r', syncLsn: null });
    if (promoted.length > 0) log.info({ tables: promoted.map((t) => `${t.schema}.${t.table}`), lsn: formatLsn(lsn) }, 'tables ready');
    progress.noteDurable(lsn);
    state.session.onDurable();
  }

  /**
   * A failure with a group open, or with a commit still unanswered (it may be the one that
   * failed): retry without grouping up to here, unless the connection itself was lost.
   */
  #groupFailure(err: unknown): unknown {
    const { tx } = this.p.state;
    const group = tx.group;
    if ((!group && tx.unconfirmed === null) || err instanceof ConnectionLostError || err instanceof GroupRetryError) return err;
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    let until = tx.unconfirmed?.until ?? group!.endLsn;
    for (const lsn of [group?.endLsn, tx.xact?.finalLsn]) if (lsn !== undefined && lsn > until) until = lsn;
    return new GroupRetryError(until, root);
  }

  /** Await `pending`, adding the time to one of the wait counters. */
  async #timed<T>(pending: Promise<T> | T, counter: 'resultsWaitMs' | 'commitWaitMs'): Promise<T> {
    const since = performance.now();
    try {
      return await pending;
    } finally {
      this.times[counter] += performance.now() - since;
    }
  }
}
