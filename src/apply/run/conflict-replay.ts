/**
 * A conflict met on the pipelined path, resolved where it happened — inside a group of
 * source transactions too — without ending the session (conflict/detect.ts: a conflict
 * aborts the target transaction; the careful path then names and resolves it).
 *
 * The applier keeps the raw messages of every remote transaction whose target commit is
 * not known to have gone through (KeptSpan): the open group's, the one under way, and
 * those behind a commit sent without waiting. A pipelined statement that fails names the
 * remote transactions it carried (txn/transaction.ts carriedBy), wherever its failure
 * surfaces. On a conflict signal: every outstanding answer is awaited (the commits sent
 * before the failure then count in progress.durable; everything after it was skipped by
 * the server), the target transaction rolls back, and the kept transactions not committed
 * are dispatched again in order, in the same session: those before the failing one as
 * they came (batched, grouped, pipelined), the failing one carefully, those after it as
 * they came. The careful one ends the target transaction: its first change waits for
 * every answer before it (a conflict among those surfaces before it resolves anything),
 * and its commit is waited for (txn/commit.ts: a careful transaction never stays open for
 * a group), so what it resolved and logged is never rolled back and resolved again. A
 * new conflict on the way (a local writer got there in between) is resolved the same
 * way; each round adds one careful transaction, so it ends.
 *
 * Why not a SAVEPOINT per source transaction: it would cost every grouped transaction a
 * statement and a subtransaction (past 64 in one transaction every snapshot taken on the
 * target overflows its subxid cache and must look in pg_subtrans, a cost paid by the
 * target's own sessions, the very ones that make conflicts), and insert batches that run
 * across source commits would have to stop at each one. Re-sending the transactions
 * before the failing one costs nothing until a conflict, and at most one group per
 * conflict.
 *
 * Exactly once: nothing that committed is dispatched again (progress.durable, read once
 * every answer is in), and what is dispatched again commits with its origin row through
 * the ordinary commit path. Bounded: past REPLAY_BYTES the kept messages are dropped, and
 * a conflict that would need them is left to a new session (GroupRetryError: one by one
 * up to the failing transaction; CarefulReplayError: a lone transaction re-streamed and
 * applied carefully). A spool's replay (STREAM COMMIT) or a prepare can be dispatched
 * again only until it ends (its spool is then gone); apply lanes break the span (they
 * commit on their own connections). Failures that are not conflicts are not handled here.
 */
import { isConflictSignal } from '../../conflict/detect.js';
import { ApplyConflictError } from '../../errors.js';
import { decode } from '../../protocol/decoder.js';
import { formatLsn, type Lsn } from '../../protocol/lsn.js';
import type { PgOutputMessage } from '../../protocol/messages.js';
import { TAG } from '../../protocol/tags.js';
import { PipelineAbortedError } from '../../pgwire/wire.js';
import { dispatch } from '../handlers/dispatch.js';
import { insertAsSent } from '../handlers/changes.js';
import type { ApplyState } from '../txn/apply-state.js';
import { flushRowBatch } from '../txn/batch.js';
import { rollbackAfterFailure, settleTarget } from '../txn/commit.js';
import { carriedBy, type Carried } from '../txn/transaction.js';
import { CarefulReplayError, GroupRetryError } from './retry-errors.js';

/** Messages kept, all transactions together; beyond this a conflict among them is left to a new session. */
const REPLAY_BYTES = 16 * 1024 * 1024;

/** One remote transaction's raw messages, as they came: `count` of them from slot `first` of the message log. */
interface KeptTransaction {
  xid: number;
  /** Its commit (or prepare) LSN: committed on the target once progress.durable is past it. */
  finalLsn: Lsn;
  first: number;
  count: number;
  /** BEGIN … COMMIT: its messages apply it again at any time. A spool's replay, a prepare: only until it ends. */
  plain: boolean;
  /** Dispatched through its end. */
  ended: boolean;
  /** Its messages were dropped (the byte limit, or it can no longer be dispatched again). */
  lost: boolean;
  /** To be applied carefully: it met a conflict. */
  careful: boolean;
}

/** Slots the message log may leave unused at its front before it moves the rest down. */
const LOG_SHIFT_SLOTS = 16_384;

/**
 * Where the kept messages lie — each one's ArrayBuffer, offset and length, in arrival
 * order — with no object per message. Keeping the message's own view for as long as a
 * group is open made every view survive the young generation's collections and be
 * promoted (on small transactions ~4% of pgsub's CPU and ~15 MB of RSS; keeping nothing
 * would save ~10% and ~30 MB more, at a stream restart for the first conflict). The views
 * are made again only for a replay.
 */
export class MessageLog {
  #buffers: (ArrayBufferLike | undefined)[] = [];
  #offsets = new Int32Array(4096);
  #lengths = new Int32Array(4096);
  #end = 0;

  /** The next slot. */
  get end(): number {
    return this.#end;
  }

  push(raw: Buffer): void {
    const i = this.#end;
    if (i === this.#offsets.length) this.#grow();
    this.#buffers[i] = raw.buffer;
    this.#offsets[i] = raw.byteOffset;
    this.#lengths[i] = raw.length;
    this.#end = i + 1;
  }

  /** Slots [from, from + count) as views of the bytes they name. */
  views(from: number, count: number): Buffer[] {
    const out: Buffer[] = new Array<Buffer>(count);
    for (let i = 0; i < count; i++) out[i] = Buffer.from(this.#buffers[from + i]!, this.#offsets[from + i]!, this.#lengths[from + i]!);
    return out;
  }

  /** Let go of the bytes of slots [from, from + count); returns how many bytes they held. */
  release(from: number, count: number): number {
    let bytes = 0;
    for (let i = from; i < from + count; i++) {
      if (this.#buffers[i] === undefined) continue;
      bytes += this.#lengths[i]!;
      this.#buffers[i] = undefined;
    }
    return bytes;
  }

  /** Drop the first `n` slots (released already): the rest move down by `n`. */
  shift(n: number): void {
    this.#offsets.copyWithin(0, n, this.#end);
    this.#lengths.copyWithin(0, n, this.#end);
    this.#buffers.copyWithin(0, n, this.#end);
    this.#end -= n;
    this.#buffers.length = this.#end;
  }

  reset(): void {
    this.#buffers.length = 0;
    this.#end = 0;
  }

  #grow(): void {
    const offsets = new Int32Array(this.#offsets.length * 2);
    offsets.set(this.#offsets);
    this.#offsets = offsets;
    const lengths = new Int32Array(this.#lengths.length * 2);
    lengths.set(this.#lengths);
    this.#lengths = lengths;
  }
}

/** The kept transactions, oldest first; the applier's alone. */
class KeptSpan {
  readonly entries: KeptTransaction[] = [];
  readonly #log = new MessageLog();
  #bytes = 0;
  #current: KeptTransaction | null = null;

  /** A remote transaction starts; `settled`: nothing sent before is unanswered, so nothing before needs keeping. */
  start(xid: number, finalLsn: Lsn, plain: boolean, settled: boolean, durable: Lsn): void {
    if (settled) this.clear();
    else this.#dropCommitted(durable);
    this.#current = { xid, finalLsn, first: this.#log.end, count: 0, plain, ended: false, lost: false, careful: false };
    this.entries.push(this.#current);
  }

  /** Keep a message of the transaction under way; false when none is kept. */
  keep(raw: Buffer): boolean {
    const t = this.#current;
    if (t === null || t.lost) return false;
    this.#bytes += raw.length;
    // Past the limit the kept messages are useless: release them now (they pin their frames' memory).
    if (this.#bytes > REPLAY_BYTES) {
      for (const e of this.entries) this.#lose(e);
      this.#bytes = 0;
      return false;
    }
    this.#log.push(raw);
    t.count++;
    return true;
  }

  /** The kept messages of `t`, in order. */
  messagesOf(t: KeptTransaction): Buffer[] {
    return this.#log.views(t.first, t.count);
  }

  /** The transaction under way was dispatched through its end. */
  end(): void {
    const t = this.#current;
    if (t === null) return;
    t.ended = true;
    if (!t.plain) this.#lose(t);
    this.#current = null;
  }

  /** Something was applied elsewhere (an apply lane): what is kept can no longer be dispatched again in order. */
  interrupt(): void {
    for (const e of this.entries) this.#lose(e);
  }

  clear(): void {
    this.entries.length = 0;
    this.#log.reset();
    this.#bytes = 0;
    this.#current = null;
  }

  /** After a failure, every answer in: forget what committed; the rest is what must be applied again. */
  pending(durable: Lsn): readonly KeptTransaction[] {
    this.#dropCommitted(durable);
    return this.entries;
  }

  /** Mark the transactions `carried` names careful; false when they are not kept, or careful already. */
  markCareful(carried: Carried): boolean {
    const first = this.entries.findIndex((e) => e.xid === carried.from);
    let last = -1;
    for (let i = this.entries.length - 1; i >= first && first >= 0; i--) {
      if (this.entries[i]!.xid === carried.to) {
        last = i;
        break;
      }
    }
    if (first < 0 || last < 0) return false;
    let added = false;
    for (let i = first; i <= last; i++) {
      const e = this.entries[i]!;
      if (!e.careful) added = true;
      e.careful = true;
    }
    return added;
  }

  /** Every transaction left can be dispatched again from its messages. */
  get replayable(): boolean {
    return this.entries.every((e) => !e.lost);
  }

  #dropCommitted(durable: Lsn): void {
    let n = 0;
    while (n < this.entries.length && this.entries[n]!.ended && this.entries[n]!.finalLsn < durable) n++;
    if (n === 0) return;
    for (let i = 0; i < n; i++) {
      const e = this.entries[i]!;
      this.#bytes -= this.#log.release(e.first, e.count);
    }
    this.entries.splice(0, n);
    if (this.entries.length === 0) return this.#log.reset();
    // The slots before the oldest entry left are free: move the rest down now and then.
    const from = this.entries[0]!.first;
    if (from >= LOG_SHIFT_SLOTS && from * 2 >= this.#log.end) {
      this.#log.shift(from);
      for (const e of this.entries) e.first -= from;
    }
  }

  #lose(e: KeptTransaction): void {
    if (e.lost) return;
    this.#bytes -= this.#log.release(e.first, e.count);
    e.lost = true;
  }
}

/** The xid and final LSN of a message that starts a remote transaction the careful path can apply; null for any other. */
function startOf(message: PgOutputMessage): { xid: number; finalLsn: Lsn; plain: boolean } | null {
  switch (message.tag) {
    case 'begin':
      return { xid: message.xid, finalLsn: message.finalLsn, plain: true };
    case 'beginPrepare':
      return { xid: message.xid, finalLsn: message.prepareLsn, plain: false };
    case 'streamCommit':
      return { xid: message.xid, finalLsn: message.commitLsn, plain: false };
    case 'streamPrepare':
      return { xid: message.xid, finalLsn: message.prepareLsn, plain: false };
    default:
      return null;
  }
}

function rootOf(err: unknown): unknown {
  return err instanceof PipelineAbortedError && err.cause ? err.cause : err;
}

/** The transactions a conflict signal's statement carried; null when `err` is not one this resolves. */
function conflictCarried(err: unknown): Carried | null {
  const root = rootOf(err);
  return isConflictSignal(root) ? carriedBy(root) : null;
}

/** The last source position the target state refers to (for a one-by-one retry up to it). */
function reach(state: ApplyState): Lsn {
  let until = 0n as Lsn;
  for (const lsn of [state.tx.unconfirmed?.until, state.tx.group?.endLsn, state.tx.xact?.finalLsn]) if (lsn !== undefined && lsn > until) until = lsn;
  return until;
}

/** What resolve returns when the conflict was resolved in place. */
export const RESOLVED: unique symbol = Symbol('resolved');

export class ConflictReplay {
  readonly #kept = new KeptSpan();
  readonly #context: { inStream: false; streamAbortInfo: boolean };

  constructor(
    private readonly state: ApplyState,
    streamAbortInfo: boolean,
  ) {
    this.#context = { inStream: false, streamAbortInfo };
  }

  /**
   * Keep `raw` (outside stream blocks, detection on) if it belongs to a remote transaction
   * the careful path can apply; `message` is its decoding (null: an Insert, never a start).
   * True when kept: a replay dispatches it again.
   */
  keep(raw: Buffer, message: PgOutputMessage | null): boolean {
    const { state } = this;
    if (!state.session.options.conflicts.detect) return false;
    if (state.tx.xact === null && state.mode.streamXid === null) {
      const start = message === null ? null : startOf(message);
      if (start === null) return false;
      this.#kept.start(start.xid, start.finalLsn, start.plain, state.tx.group === null && state.tx.unconfirmed === null, state.session.progress.durable);
    }
    return this.#kept.keep(raw);
  }

  /** The remote transaction under way ended (its last message dispatched). */
  ended(): void {
    this.#kept.end();
  }

  /** A message went to an apply lane. */
  interrupt(): void {
    this.#kept.interrupt();
  }

  /**
   * After `err`: RESOLVED when it was a conflict of kept transactions, now applied again
   * as described above (the applier goes on where it was); otherwise the error for the
   * applier's usual handling — `err` itself when it is no conflict this resolves, what
   * the replay threw (an ApplyConflictError under the `error` policy, a failure that is
   * not a conflict), or a GroupRetryError / CarefulReplayError when what must be applied
   * again was not all kept.
   */
  async resolve(err: unknown): Promise<unknown> {
    const { state } = this;
    let carried = conflictCarried(err);
    if (carried === null || state.mode.streamXid !== null) return err;
    let failure = err;
    let until = reach(state);
    let commitBefore = false;
    for (;;) {
      await rollbackAfterFailure(state);
      const pending = this.#kept.pending(state.session.progress.durable);
      if ((carried !== null && !this.#kept.markCareful(carried)) || !this.#kept.replayable) return this.#fallback(failure, until, pending);
      state.session.log.debug(
        {
          transactions: pending.length,
          careful: pending.filter((t) => t.careful).map((t) => ({ xid: t.xid, finishLsn: formatLsn(t.finalLsn) })),
          cause: (rootOf(failure) as Error).message,
        },
        'conflict in the pipeline; applying the transactions since the last commit again, the conflicting one carefully',
      );
      try {
        await this.#replay(pending, commitBefore);
        return RESOLVED;
      } catch (e) {
        if (e instanceof ApplyConflictError && !commitBefore && pending[0]?.careful === false) {
          // The `error` policy: the transactions before the conflicting one commit first, as
          // one by one they would have; then it fails alone (and is what pgsub skip names).
          commitBefore = true;
          carried = null;
          continue;
        }
        carried = conflictCarried(e);
        if (carried === null) return e;
        failure = e;
        const reached = reach(state);
        if (reached > until) until = reached;
      }
    }
  }

  /**
   * The kept transactions not committed, in order; each careful one ends its target
   * transaction; `commitBefore`: what precedes it commits on its own first.
   */
  async #replay(pending: readonly KeptTransaction[], commitBefore: boolean): Promise<void> {
    const { state } = this;
    let afterCareful = false;
    for (const t of pending) {
      // Conflicts come in runs (a local writer busy on many rows): each transaction after a
      // careful one has its answers read before the next is sent, so the next conflict
      // surfaces at once instead of after everything sent behind it — which would all be
      // sent again, once per conflict.
      if (afterCareful && !t.careful) await state.pipeline.drain();
      if (t.careful) {
        // What the transactions before it left in batches goes first (the careful path never batches).
        if (commitBefore) await settleTarget(state);
        else await flushRowBatch(state);
        state.session.counters.carefulReplays++;
      }
      state.mode.careful = t.careful;
      for (const raw of this.#kept.messagesOf(t)) {
        const sent = raw[0] === TAG.INSERT ? insertAsSent(state, raw) : false;
        const applied = sent === false ? dispatch(state, decode(raw, this.#context), raw) : sent;
        if (applied) await applied;
      }
      afterCareful ||= t.careful;
    }
    if (afterCareful) await state.pipeline.drain();
  }

  /** What was not kept is left to a new session: a lone transaction re-streamed carefully, or one by one up to the last. */
  #fallback(err: unknown, until: Lsn, pending: readonly KeptTransaction[]): unknown {
    const root = rootOf(err);
    const [only] = pending;
    if (pending.length === 1 && !only!.ended) return only!.careful && !only!.lost ? err : new CarefulReplayError(only!.finalLsn, root);
    let last = until;
    for (const t of pending) if (t.finalLsn > last) last = t.finalLsn;
    return new GroupRetryError(last, root);
  }
}
