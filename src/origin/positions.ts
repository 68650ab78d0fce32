/**
 * Feedback positions, the analogue of worker.c's last_received / lsn_mapping /
 * send_feedback. Four positions, never confused:
 *  - received:  the highest WAL position the publisher has sent us (reported as "write");
 *  - processed: every message up to here is handled and we are between transactions,
 *               but the position may not be recorded in the target yet;
 *  - durable:   the origin row committed in the target says this (what the apply
 *               decisions go by);
 *  - flushed:   durable, and the commit is in the target's WAL on disk; the only
 *               position ever reported as "flush"/"apply", so the publisher never
 *               discards WAL for a change the target could still lose. With
 *               synchronous_commit = off (native's default) a commit is durable at once
 *               but flushed only when the target's WAL flush passes its local commit LSN
 *               (lsn_mapping); a synchronous commit flushes every earlier one with it.
 * An idle position (keepalive while nothing is pending) becomes durable only after an
 * idle-progress row is committed, so an idle slot still advances, as with native.
 */
import { maxLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';

export class Progress {
  received: Lsn = ZERO_LSN;
  processed: Lsn = ZERO_LSN;
  durable: Lsn = ZERO_LSN;
  #flushed: Lsn = ZERO_LSN;
  // pg_stat_subscription's timing columns, for status and metrics (service/metrics.ts).
  /** The publisher's clock at its last keepalive (µs since 2000-01-01), and when it arrived (ms since 1970). */
  lastMsgSendTime: bigint | null = null;
  lastMsgReceiptAt: number | null = null;
  /** The flush position last reported to the publisher, and when. */
  latestEndLsn: Lsn | null = null;
  latestEndAt: number | null = null;
  /**
   * The smallest (arrival − send) of the keepalives, ms: the offset of the publisher's
   * clock behind ours plus the shortest network delay — what lag in seconds subtracts.
   */
  clockOffsetMs: number | null = null;
  /** Asynchronous commits not known to be flushed: remote end LSN → target WAL LSN after the commit. */
  readonly #unflushed: { remote: Lsn; local: Lsn }[] = [];

  constructor(start: Lsn) {
    this.received = start;
    this.processed = start;
    this.durable = start;
    this.#flushed = start;
  }

  get flushed(): Lsn {
    return this.#flushed;
  }

  /** Asynchronous commits wait for the target's WAL flush before they are reported. */
  get hasUnflushed(): boolean {
    return this.#unflushed.length > 0;
  }

  /** The target committed (synchronous_commit = off) an origin row saying `lsn`; its WAL ends by `localLsn`. */
  noteCommittedAsync(lsn: Lsn, localLsn: Lsn): void {
    this.durable = maxLsn(this.durable, lsn);
    this.processed = maxLsn(this.processed, lsn);
    this.#unflushed.push({ remote: lsn, local: localLsn });
  }

  /** The target's WAL is flushed up to `localFlushLsn`: asynchronous commits before it are safe. */
  noteTargetFlush(localFlushLsn: Lsn): boolean {
    let advanced = false;
    while (this.#unflushed.length > 0 && this.#unflushed[0]!.local <= localFlushLsn) {
      this.#flushed = maxLsn(this.#flushed, this.#unflushed.shift()!.remote);
      advanced = true;
    }
    return advanced;
  }

  /** A keepalive sent at `sendTime` (the publisher's clock) arrived now. */
  noteKeepalive(sendTime: bigint): void {
    const now = Date.now();
    this.lastMsgSendTime = sendTime;
    this.lastMsgReceiptAt = now;
    const offset = now - pgTimeToEpochMs(sendTime);
    if (this.clockOffsetMs === null || offset < this.clockOffsetMs) this.clockOffsetMs = offset;
  }

  /** Feedback told the publisher `flushed`. */
  noteReported(flushed: Lsn): void {
    this.latestEndLsn = flushed;
    this.latestEndAt = Date.now();
  }

  noteReceived(lsn: Lsn): void {
    this.received = maxLsn(this.received, lsn);
  }

  /** A boundary between transactions: everything before `lsn` is handled. */
  noteProcessed(lsn: Lsn): void {
    this.processed = maxLsn(this.processed, lsn);
  }

  /** The target committed an origin row saying `lsn`. */
  noteDurable(lsn: Lsn): void {
    this.durable = maxLsn(this.durable, lsn);
    this.processed = maxLsn(this.processed, lsn);
    // A synchronous commit waits for the WAL flush up to its record: every earlier
    // (asynchronous) commit of this target is flushed with it.
    this.#flushed = maxLsn(this.#flushed, this.durable);
    this.#unflushed.length = 0;
  }

  /** Whether a processed position still waits to be recorded before it can be confirmed. */
  get hasUnrecordedPosition(): boolean {
    return this.processed > this.durable;
  }

  /** `held`: a position a table being synced still needs; flush is never reported past it. */
  standbyStatus(held: Lsn | null = null): { written: Lsn; flushed: Lsn; applied: Lsn } {
    const flushed = held !== null && held < this.#flushed ? held : this.#flushed;
    return { written: maxLsn(this.received, this.durable), flushed, applied: flushed };
  }
}

/** PostgreSQL's timestamps count µs from 2000-01-01; JavaScript's ms from 1970-01-01. */
export function pgTimeToEpochMs(t: bigint): number {
  return Number(t / 1000n) + 946_684_800_000;
}
