/**
 * What systemd sees of `pgsub run` (service/notify.ts): READY=1 once the first session
 * streams — slot streaming, target connected — with STATUS= lines after it (state,
 * applied LSN, lag) every few seconds; while the initial copy runs before that, STATUS=
 * with the copy's progress and EXTEND_TIMEOUT_USEC= so that a long copy does not hit
 * TimeoutStartSec, as long as it moves; STOPPING=1 at SIGTERM.
 *
 * WATCHDOG=1 goes out at half of WATCHDOG_USEC only while pgsub is healthy: the apply
 * loop takes items (or waits, idle, for a publisher that still sends keepalives), a copy
 * moves bytes, or the service is between sessions waiting to retry. An apply stuck on one
 * statement (a lock held on the target) or a silent publisher socket stops the pings, so
 * systemd restarts pgsub; they resume once it moves again.
 */
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { Notifier } from './notify.js';
import type { Runner } from './runner.js';
import { lagSeconds } from './lag.js';

export interface Supervisor {
  /** A session streams (SessionEvents.onStreaming): READY=1 the first time. */
  streaming(startLsn: Lsn): void;
  stopping(): void;
  stop(): void;
}

/** STATUS= every this many ms (PGSUB_NOTIFY_INTERVAL_MS shortens it for tests). */
const STATUS_INTERVAL_MS = Number(process.env.PGSUB_NOTIFY_INTERVAL_MS ?? 5000);
/**
 * A copy's bytes stand still while it rebuilds a large table's indexes after the data:
 * that long without a byte moved, and the copy counts as stuck.
 */
const COPY_STALL_MS = 10 * 60_000;
/** Each extension of the start timeout while the initial copy runs. */
const EXTEND_MS = 60_000;

export function superviseService(runner: Runner, notifier: Notifier, log: Logger, receiveTimeoutMs: number): Supervisor {
  return new ServiceSupervisor(runner, notifier, log, receiveTimeoutMs);
}

/** The timers of STATUS= and WATCHDOG=1, and what they sample between ticks. */
class ServiceSupervisor implements Supervisor {
  #ready = false;
  #stopped = false;
  #lastCopiedBytes = -1;
  #copyMovedAt = Date.now();
  #lastItems = -1;
  readonly #statusTimer: NodeJS.Timeout;
  readonly #watchdogTimer: NodeJS.Timeout | null;

  constructor(
    private readonly runner: Runner,
    private readonly notifier: Notifier,
    private readonly log: Logger,
    private readonly receiveTimeoutMs: number,
  ) {
    this.#statusTimer = setInterval(() => this.#statusTick(), STATUS_INTERVAL_MS);
    this.#statusTimer.unref();
    this.#watchdogTimer = notifier.watchdogIntervalMs !== null ? setInterval(() => this.#watchdogTick(), notifier.watchdogIntervalMs) : null;
    this.#watchdogTimer?.unref();
  }

  streaming(startLsn: Lsn): void {
    if (this.#ready || this.#stopped) return;
    this.#ready = true;
    this.notifier.ready(`streaming from ${formatLsn(startLsn)}; ${this.runner.counters.transactionsApplied} transactions applied`);
  }

  stopping(): void {
    if (this.#stopped) return;
    this.notifier.stopping('stopping: rolling back the transaction in flight, then exiting');
  }

  stop(): void {
    this.#stopped = true;
    clearInterval(this.#statusTimer);
    if (this.#watchdogTimer) clearInterval(this.#watchdogTimer);
  }

  #statusTick(): void {
    if (this.#stopped) return;
    if (this.#ready) {
      this.notifier.status(this.#describe());
    } else if (this.runner.launcher.busy) {
      // Only a copy that moves keeps extending the start timeout.
      if (this.#copyMoving()) this.notifier.extendTimeout(EXTEND_MS);
      this.notifier.status(`initial copy: ${this.#describe()}`);
    }
  }

  #watchdogTick(): void {
    if (this.#stopped) return;
    if (this.#healthy()) this.notifier.watchdog();
    else this.log.warn({ status: this.#describe() }, 'no progress: watchdog keep-alive withheld');
  }

  #copiedBytes(): number {
    let bytes = 0;
    for (const p of this.runner.launcher.progress.values()) bytes += p.bytes;
    return bytes;
  }

  /** Whether the initial copy moved bytes lately (sampled by both timers). */
  #copyMoving(): boolean {
    const bytes = this.#copiedBytes();
    if (bytes !== this.#lastCopiedBytes) {
      this.#lastCopiedBytes = bytes;
      this.#copyMovedAt = Date.now();
    }
    return Date.now() - this.#copyMovedAt < COPY_STALL_MS;
  }

  #describe(): string {
    const { runner } = this;
    const session = runner.current();
    const copying = runner.sync.copying().length;
    if (!session) return copying > 0 ? `copying ${copying} table(s), ${this.#copiedBytes()} bytes so far` : 'connecting or waiting to retry';
    const p = session.progress;
    const lag = Number(p.received > p.flushed ? p.received - p.flushed : 0n);
    const seconds = lagSeconds({ progress: () => p, counters: runner.counters });
    return `streaming; applied ${formatLsn(p.flushed)}; lag ${lag} bytes${seconds === null ? '' : `, ${seconds.toFixed(1)} s`}; ${runner.counters.transactionsApplied} transactions applied`;
  }

  /** Whether pgsub moves (see the file's header); called once per watchdog interval. */
  #healthy(): boolean {
    const session = this.runner.current();
    if (!session) {
      // Copying before the first stream, or waiting to retry: alive; a copy must move.
      return this.runner.launcher.busy ? this.#copyMoving() : true;
    }
    const h = session.health();
    const moved = h.itemsTaken !== this.#lastItems;
    this.#lastItems = h.itemsTaken;
    if (h.silentMs > this.receiveTimeoutMs) return false;
    return moved || h.idle;
  }
}
