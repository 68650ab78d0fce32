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
import { lagSeconds } from './metrics.js';

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
  let ready = false;
  let stopped = false;
  let lastCopiedBytes = -1;
  let copyMovedAt = Date.now();
  let lastItems = -1;

  const copiedBytes = () => {
    let bytes = 0;
    for (const p of runner.launcher.progress.values()) bytes += p.bytes;
    return bytes;
  };
  /** Whether the initial copy moved bytes lately (sampled by both timers). */
  const copyMoving = (): boolean => {
    const bytes = copiedBytes();
    if (bytes !== lastCopiedBytes) {
      lastCopiedBytes = bytes;
      copyMovedAt = Date.now();
    }
    return Date.now() - copyMovedAt < COPY_STALL_MS;
  };

  const describe = (): string => {
    const session = runner.current();
    const copying = runner.sync.copying().length;
    if (!session) return copying > 0 ? `copying ${copying} table(s), ${copiedBytes()} bytes so far` : 'connecting or waiting to retry';
    const p = session.progress;
    const lag = Number(p.received > p.flushed ? p.received - p.flushed : 0n);
    const seconds = lagSeconds({ progress: () => p, counters: runner.counters });
    return `streaming; applied ${formatLsn(p.flushed)}; lag ${lag} bytes${seconds === null ? '' : `, ${seconds.toFixed(1)} s`}; ${runner.counters.transactionsApplied} transactions applied`;
  };

  /** Whether pgsub moves (see the file's header); called once per watchdog interval. */
  const healthy = (): boolean => {
    const session = runner.current();
    if (!session) {
      // Copying before the first stream, or waiting to retry: alive; a copy must move.
      return runner.launcher.busy ? copyMoving() : true;
    }
    const h = session.health();
    const moved = h.itemsTaken !== lastItems;
    lastItems = h.itemsTaken;
    if (h.silentMs > receiveTimeoutMs) return false;
    return moved || h.idle;
  };

  const statusTimer = setInterval(() => {
    if (stopped) return;
    if (ready) {
      notifier.status(describe());
    } else if (runner.launcher.busy) {
      // Only a copy that moves keeps extending the start timeout.
      if (copyMoving()) notifier.extendTimeout(EXTEND_MS);
      notifier.status(`initial copy: ${describe()}`);
    }
  }, STATUS_INTERVAL_MS);
  statusTimer.unref();

  const watchdogTimer =
    notifier.watchdogIntervalMs !== null
      ? setInterval(() => {
          if (stopped) return;
          if (healthy()) notifier.watchdog();
          else log.warn({ status: describe() }, 'no progress: watchdog keep-alive withheld');
        }, notifier.watchdogIntervalMs)
      : null;
  watchdogTimer?.unref();

  return {
    streaming(startLsn) {
      if (ready || stopped) return;
      ready = true;
      notifier.ready(`streaming from ${formatLsn(startLsn)}; ${runner.counters.transactionsApplied} transactions applied`);
    },
    stopping() {
      if (stopped) return;
      notifier.stopping('stopping: rolling back the transaction in flight, then exiting');
    },
    stop() {
      stopped = true;
      clearInterval(statusTimer);
      if (watchdogTimer) clearInterval(watchdogTimer);
    },
  };
}
