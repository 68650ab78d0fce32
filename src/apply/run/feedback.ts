/**
 * Standby status ('r') to the publisher (worker.c's send_feedback): only the durable
 * position (origin/positions.ts), never past what a table being synced still needs
 * (origin/sync-state.ts heldLsn). Sent after applied commits (coalesced: one for a
 * burst), every status interval, at once when the publisher asks, and as a ping after
 * half the receive timeout of silence. This class is the one writer of when feedback was
 * last sent and whether a ping is outstanding.
 */
import type { Logger } from '../../log.js';
import { formatLsn } from '../../protocol/lsn.js';
import type { ReplicationStream } from '../../protocol/replication.js';
import type { Progress } from '../../origin/positions.js';
import type { SyncStates } from '../../origin/sync-state.js';

/** Commits answered within this window share one feedback message. */
const COALESCE_MS = 20;

export class Feedback {
  #lastSentAt = 0;
  #scheduled = false;
  #pingSent = false;

  constructor(
    private readonly stream: ReplicationStream,
    private readonly progress: Progress,
    private readonly sync: SyncStates,
    private readonly log: Logger,
    /** False once the loop stops or fails: nothing more is confirmed. */
    private readonly live: () => boolean,
  ) {}

  get sinceLastMs(): number {
    return Date.now() - this.#lastSentAt;
  }

  get pingSent(): boolean {
    return this.#pingSent;
  }

  send(replyRequested = false): void {
    this.#lastSentAt = Date.now();
    // Never confirm past what a table being synced still needs from the stream.
    const status = this.progress.standbyStatus(this.sync.heldLsn());
    this.stream.sendStandbyStatus({ ...status, replyRequested });
    this.progress.noteReported(status.flushed);
    this.log.trace({ write: formatLsn(status.written), flush: formatLsn(status.flushed) }, 'feedback sent');
  }

  /** A new durable position: feedback soon, once for a burst of commits. */
  soon(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    setTimeout(() => {
      this.#scheduled = false;
      if (this.live()) this.send();
    }, COALESCE_MS).unref();
  }

  /** Ask the publisher for a reply (a keepalive), once until it sends something. */
  ping(): void {
    if (this.#pingSent) return;
    this.#pingSent = true;
    this.send(true);
  }

  /** A frame arrived: the publisher is alive, a new ping may be sent when it falls silent again. */
  onFrame(): void {
    this.#pingSent = false;
  }
}
