/**
 * The apply loop's worker half (worker.c's apply_dispatch side of LogicalRepApplyLoop):
 * takes queued items in order, decodes each message once and hands it, once, to the apply
 * lanes or to the handler table; records idle positions; stops at a verify hold's boundary.
 * While behind, commits go out without waiting for their answers (txn/commit.ts), also the
 * last one before the queue runs dry: the applier then waits for the next item or that
 * answer, whichever comes first, so a failed commit is seen at once and nothing after it
 * is committed (the server skips up to the next Sync).
 *
 * Conflicts (conflict/detect.ts): the raw messages of the remote transaction being applied
 * are kept (up to REPLAY_BYTES) until it ends; when the pipelined statements of that
 * transaction abort on a conflict, the target transaction is rolled back and the kept
 * messages are dispatched again in careful mode. A transaction too large to keep is
 * replayed by a new session instead (CarefulReplayError). A failure while a group is open
 * or a commit is unanswered is retried one transaction at a time (GroupRetryError).
 *
 * Fields: what the applier alone writes (items taken, idle, the last idle record, the
 * stream block, the kept messages, its wait counters); the transaction state is the txn
 * layer's (apply-state.ts).
 */
import { ConnectionLostError } from '../../errors.js';
import { isConflictSignal } from '../../conflict/detect.js';
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
import type { ApplyState } from '../txn/apply-state.js';
import { commitGroup, endTarget, pipelinedCommitSucceeded, PLAIN_COMMIT, settleTarget } from '../txn/commit.js';
import type { ApplyHold } from './hold.js';
import type { ApplyLanes } from './lanes.js';
import { newApplierTimes, type ApplierTimes } from './loop-times.js';
import type { BoundedQueue } from './queue.js';
import type { WorkItem } from './receiver.js';
import { CarefulReplayError, GroupRetryError } from './retry-errors.js';

/** Messages of one remote transaction kept for a careful replay; beyond this, a session restart replays it. */
const REPLAY_BYTES = 16 * 1024 * 1024;

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

/** The current remote transaction's raw messages, for a careful replay. */
class ReplayBuffer {
  #messages: Buffer[] | null = null;
  #bytes = 0;
  #tooLarge = false;

  start(): void {
    this.#messages = [];
    this.#bytes = 0;
    this.#tooLarge = false;
  }

  keep(raw: Buffer): void {
    if (this.#messages === null || this.#tooLarge) return;
    this.#bytes += raw.length;
    // Past the limit the kept messages are useless: release them now, not at the end of
    // what may be a huge transaction (they pin their frames' memory).
    if (this.#bytes > REPLAY_BYTES) {
      this.#tooLarge = true;
      this.#messages = [];
    } else this.#messages.push(raw);
  }

  clear(): void {
    this.#messages = null;
  }

  /** The kept messages; null when the transaction was too large or none were kept. */
  get messages(): Buffer[] | null {
    return this.#tooLarge ? null : this.#messages;
  }
}

export class Applier {
  readonly times: ApplierTimes = newApplierTimes();
  #idle = false;
  #lastRecordAt = 0;
  /** Inside STREAM START … STREAM STOP (messages carry an xid). */
  readonly #decodeContext: DecodeContext;
  readonly #replay = new ReplayBuffer();

  constructor(private readonly p: ApplierParts) {
    this.#decodeContext = { inStream: false, streamAbortInfo: p.streamAbortInfo };
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
    while (!this.p.stopping()) {
      const item = queue.takeNow() ?? (await this.#waitForItem());
      this.times.items++;
      if (item === undefined || this.p.stopping()) break;
      // Routed to an apply lane: the lanes commit it.
      if (item instanceof Uint8Array ? await this.#onMessage(item) : await this.#onPosition(item)) continue;
      await this.#afterItem(item);
    }
  }

  /** A position (or a tick) between transactions; true: the lanes are busy and the next serial step records one. */
  async #onPosition(item: Exclude<WorkItem, Buffer>): Promise<boolean> {
    const { state, lanes } = this.p;
    const outside = !this.#decodeContext.inStream && state.mode.streamXid === null;
    if (this.p.hold !== null && outside && state.tx.xact === null && item.kind === 'position') await this.#atHold(item.lsn, true);
    if (lanes === null || !outside) return false;
    if (lanes.busy) {
      lanes.endIfIdle(this.p.queue.length);
      return true;
    }
    if (lanes.needsConverge) await this.#converge();
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
        if (queue.length === 0 && state.tx.unconfirmed === unconfirmed && !(await pipelinedCommitSucceeded(state))) await this.#settle();
      }
    } finally {
      this.#idle = false;
      this.times.queueWaitMs += performance.now() - since;
    }
  }

  /** Apply one message; true when an apply lane took it instead. */
  async #onMessage(raw: Buffer): Promise<boolean> {
    const { state, lanes } = this.p;
    const ctx = this.#decodeContext;
    const outside = !ctx.inStream && state.mode.streamXid === null;
    if (this.p.hold !== null && outside && state.tx.xact === null) {
      const at = peekVisibleCommitLsn(raw);
      if (at !== null) await this.#atHold(at, false);
    }
    const tag = raw[0];
    // Decoded here, once: an insert that may join a COPY as sent is never decoded (its
    // failures come as the batch's); the lanes and the handlers get this message.
    const message = tag === TAG.INSERT && !ctx.inStream ? null : decode(raw, ctx);
    if (lanes !== null && outside && (await this.#route(raw, message))) return true;
    // Stream Start opens a stream block and Stream Stop closes it (neither is inside it).
    if (tag === TAG.STREAM_START) ctx.inStream = true;
    else if (tag === TAG.STREAM_STOP) ctx.inStream = false;
    this.#keep(raw);
    try {
      // Most changes complete without waiting (batched): no promise then.
      let pending = message === null ? insertAsSent(state, raw) : false;
      if (pending === false) pending = dispatch(state, message ?? decode(raw, ctx), raw);
      if (pending) await this.#timed(pending, 'resultsWaitMs');
    } catch (err) {
      // An earlier commit still unanswered: if it went through, the failure is this
      // transaction's own and a careful replay applies; if not, retry one by one.
      if (!state.tx.group && state.tx.unconfirmed !== null) await pipelinedCommitSucceeded(state);
      if (state.tx.group || state.tx.unconfirmed !== null) throw this.#groupFailure(err);
      if (!(await this.#replayCarefully(err))) throw err;
    }
    if (state.tx.xact === null && state.mode.streamXid === null) {
      state.mode.careful = false;
      this.#replay.clear();
    }
    return false;
  }

  /** Offer the message to the apply lanes: true when a lane took it. */
  async #route(raw: Buffer, message: PgOutputMessage | null): Promise<boolean> {
    const lanes = this.p.lanes!;
    const queued = this.p.queue.length;
    try {
      const r = lanes.route(raw, message, queued);
      const routed = r === true || r === false ? r : await this.#timed(r, 'resultsWaitMs');
      if (routed) lanes.endIfIdle(queued);
      else if (lanes.needsConverge) await this.#timed(lanes.converge(), 'commitWaitMs');
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

  /**
   * Keep what a careful replay would need: a transaction from its first message, or the
   * single STREAM COMMIT / STREAM PREPARE that replays a spooled one.
   */
  #keep(raw: Buffer): void {
    const { state, options } = this.p;
    if (!options.conflicts.detect || this.#decodeContext.inStream) return;
    if (state.tx.xact === null && state.mode.streamXid === null) this.#replay.start();
    this.#replay.keep(raw);
  }

  /** A hold of `pgsub verify` at `at`: every COMMIT answered before the hold looks at the target. */
  async #atHold(at: Lsn, isPosition: boolean): Promise<void> {
    const hold = this.p.hold!;
    if (!hold.blocks(at, isPosition)) return;
    await this.#settle();
    if (!this.p.stopping()) await hold.atBoundary(at);
  }

  /** After each item: the group commits when nothing more waits; an idle position is recorded now and then. */
  async #afterItem(item: WorkItem): Promise<void> {
    const { state, queue } = this.p;
    if (state.tx.group && state.tx.xact === null && queue.length === 0) {
      // Nothing more waiting: the grouped transactions commit now, not with the next
      // arrival, and without waiting for the answer (#waitForItem watches for it).
      try {
        await this.#timed(commitGroup(state, PLAIN_COMMIT), 'commitWaitMs');
      } catch (err) {
        throw this.#groupFailure(err);
      }
    } else if (!(item instanceof Uint8Array) && item.kind === 'position' && state.tx.xact === null) state.session.progress.noteProcessed(item.lsn);
    const now = Date.now();
    if (
      state.tx.xact === null &&
      state.tx.group === null &&
      state.session.progress.hasUnrecordedPosition &&
      now - this.#lastRecordAt >= this.p.idleRecordIntervalMs &&
      (queue.length === 0 || this.p.sinceFeedbackMs() >= this.p.options.statusIntervalMs)
    ) {
      // A commit still unanswered must be known to have succeeded before a later position is recorded.
      await this.#settle();
      try {
        await this.#timed(this.#recordIdlePosition(), 'commitWaitMs');
      } catch (err) {
        throw this.#groupFailure(err);
      }
    }
  }

  /** Every commit sent answered and known to have succeeded (settleTarget), timed as a commit wait. */
  async #settle(): Promise<void> {
    try {
      await this.#timed(settleTarget(this.p.state), 'commitWaitMs');
    } catch (err) {
      throw this.#groupFailure(err);
    }
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

  /** Whether `err` was a conflict the careful path resolves, and the transaction was replayed. */
  async #replayCarefully(err: unknown): Promise<boolean> {
    const { state, options } = this.p;
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    const xact = state.tx.xact;
    if (!options.conflicts.detect || state.mode.careful || xact === null || !isConflictSignal(root)) return false;
    const messages = this.#replay.messages;
    if (messages === null) throw new CarefulReplayError(xact.finalLsn, root);
    state.session.log.debug(
      { xid: xact.xid, finishLsn: formatLsn(xact.finalLsn), messages: messages.length, cause: (root as Error).message },
      'conflict in the pipeline; re-applying the transaction carefully',
    );
    await this.#rollbackTarget();
    state.mode.careful = true;
    state.session.counters.carefulReplays++;
    const ctx = { inStream: false, streamAbortInfo: this.p.streamAbortInfo };
    for (const raw of messages) await dispatch(state, decode(raw, ctx), raw);
    return true;
  }

  /** Roll back the target transaction after a failed statement (the wire waits for a Sync). */
  async #rollbackTarget(): Promise<void> {
    const { state } = this.p;
    state.pipeline.reset();
    endTarget(state);
    await state.conn.sync().catch(() => {});
    const rollback = state.conn.execute('ROLLBACK');
    const synced = state.conn.sync();
    await rollback;
    await synced;
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
