/**
 * target_timeout (opts.timeoutMs) of the apply connection's wire (wire.ts): a server silent
 * for that long while operations are outstanding fails the connection, unless a probe on
 * another connection finds the backend running them (a lock wait, a long statement). A
 * fully synced idle connection is pinged with a Sync after half of it, so a dead or
 * black-holed one is found idle too. It owns the silence clock; the connection restarts it
 * when the server speaks and when operations become outstanding after none were.
 */
import type { WireOptions } from './wire-ops.js';

/** What the watchdog reads of the connection, and what it may ask of it. */
export interface WatchedWire {
  /** Lost, or closing: nothing to watch. */
  gone(): boolean;
  /** Operations awaiting an answer. */
  outstanding(): number;
  /** Whether a Sync changes nothing now: nothing unsynced, no failure awaiting its Sync, nothing corked. */
  canPing(): boolean;
  /** Send a Sync, whose answer is the sign of life. */
  ping(): void;
  fail(reason: string): void;
}

export class WireWatchdog {
  readonly #timeoutMs: number;
  readonly #probe: ((pid: number) => Promise<boolean>) | undefined;
  readonly #pid: number;
  readonly #wire: WatchedWire;
  /** When the server last sent a message, or when operations became outstanding after none were. */
  #lastHeard = Date.now();
  #probing = false;
  #timer: NodeJS.Timeout | null = null;

  /** `pid`: the watched connection's backend, for the probe. */
  constructor(opts: Pick<WireOptions, 'timeoutMs' | 'probe'>, pid: number, wire: WatchedWire) {
    this.#timeoutMs = opts.timeoutMs ?? 0;
    this.#probe = opts.probe;
    this.#pid = pid;
    this.#wire = wire;
    if (this.#timeoutMs > 0) {
      this.#timer = setInterval(this.#watch, Math.max(50, Math.min(1000, this.#timeoutMs / 4)));
      this.#timer.unref();
    }
  }

  /** The silence clock starts now: the server sent a message, or operations became outstanding. */
  restart(): void {
    this.#lastHeard = Date.now();
  }

  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  readonly #watch = (): void => {
    if (this.#wire.gone() || this.#probing) return;
    const silentMs = Date.now() - this.#lastHeard;
    if (this.#wire.outstanding() === 0) {
      // A ping only where a Sync changes nothing: nothing unsynced, no failure awaiting its Sync.
      if (silentMs >= this.#timeoutMs / 2 && this.#wire.canPing()) {
        const heard = this.#lastHeard;
        this.#wire.ping();
        this.#lastHeard = heard; // the ping is answered within the rest of the timeout
      }
      return;
    }
    if (silentMs < this.#timeoutMs) return;
    const outstanding = this.#wire.outstanding();
    const reason = `no answer from the target for ${Math.round(silentMs / 1000)} s with ${outstanding} operation(s) outstanding (target_timeout)`;
    if (!this.#probe) return this.#wire.fail(reason);
    this.#probing = true;
    this.#probe(this.#pid)
      .catch(() => false)
      .then((busy) => {
        this.#probing = false;
        if (busy)
          this.#lastHeard = Date.now(); // running them (a lock wait, a long statement): wait another period
        else this.#wire.fail(reason);
      });
  };
}
