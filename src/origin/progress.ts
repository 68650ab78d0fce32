/**
 * Feedback positions, the analogue of worker.c's last_received / lsn_mapping /
 * send_feedback. Three positions, never confused:
 *  - received:  the highest WAL position the publisher has sent us (reported as "write");
 *  - processed: every message up to here is handled and we are between transactions,
 *               but the position may not be recorded in the target yet;
 *  - durable:   the origin row committed in the target says this; the only position
 *               ever reported as "flush"/"apply", so the publisher never discards WAL
 *               for a change the target could still lose.
 * An idle position (keepalive while nothing is pending) becomes durable only after an
 * idle-progress row is committed, so an idle slot still advances, as with native.
 */
import { maxLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';

export class Progress {
  received: Lsn = ZERO_LSN;
  processed: Lsn = ZERO_LSN;
  durable: Lsn = ZERO_LSN;

  constructor(start: Lsn) {
    this.received = start;
    this.processed = start;
    this.durable = start;
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
  }

  /** Whether a processed position still waits to be recorded before it can be confirmed. */
  get hasUnrecordedPosition(): boolean {
    return this.processed > this.durable;
  }

  /** `held`: a position a table being synced still needs; flush is never reported past it. */
  standbyStatus(held: Lsn | null = null): { written: Lsn; flushed: Lsn; applied: Lsn } {
    const flushed = held !== null && held < this.durable ? held : this.durable;
    return { written: maxLsn(this.received, this.durable), flushed, applied: flushed };
  }
}
