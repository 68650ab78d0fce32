/**
 * The service's heartbeat in the log: every 30 s one info line `progress` saying what
 * `pgsub run` is doing (state), how fast (source transactions applied per second since
 * the previous line) and how far behind, in bytes and in seconds. It also counts what
 * the table sync of this process copied, for the final `stopped` line.
 *
 * Lag in bytes is what the process already knows: the publisher's WAL end as its last
 * message carried it (`received`) minus the position flushed in the target. Lag in seconds
 * is now minus the source commit time of the last transaction applied, corrected by the
 * clock offset between the hosts, as the metrics compute it (lag.ts): no
 * query. With nothing left to apply it is 0, not the age of the last commit.
 */
import type { Logger } from '../log.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { lagSeconds } from './lag.js';
import { formatLsn } from '../protocol/lsn.js';
import type { TableProgress } from '../tablesync/job.js';
import type { SyncStates } from '../origin/sync-state.js';
import type { SessionHandle } from './session.js';

export const DEFAULT_PROGRESS_INTERVAL_MS = 30_000;
/** More received than flushed than this, and the apply is behind rather than keeping pace. */
export const CATCHING_UP_BYTES = 1024 * 1024;

export type RunState = 'copying' | 'catching up' | 'streaming' | 'retrying';

export interface ProgressSources {
  counters: ApplyCounters;
  sync: SyncStates;
  /** The apply session streaming now, if any. */
  session(): SessionHandle | null;
  /** A copy is running (launcher.busy). */
  copyRunning(): boolean;
}

export interface CopiedTotals {
  tables: number;
  rows: number;
  bytes: number;
}

/** The interval: PGSUB_PROGRESS_INTERVAL_MS (undocumented; tests shorten it), else 30 s. */
export function progressIntervalMs(env: NodeJS.ProcessEnv = process.env): number {
  const ms = Number(env.PGSUB_PROGRESS_INTERVAL_MS);
  return Number.isFinite(ms) && ms >= 10 ? ms : DEFAULT_PROGRESS_INTERVAL_MS;
}

/**
 * copying: a table waits for or runs its copy; retrying: no apply session (waiting to
 * retry after an error, connecting, or disabled); catching up: a table catches up with the
 * stream after its copy, or the target is more than CATCHING_UP_BYTES behind what was
 * received; streaming otherwise.
 */
export function runState(s: { copying: boolean; session: boolean; tablesCatchingUp: boolean; lagBytes: number | null }): RunState {
  if (s.copying) return 'copying';
  if (!s.session) return 'retrying';
  if (s.tablesCatchingUp || (s.lagBytes !== null && s.lagBytes > CATCHING_UP_BYTES)) return 'catching up';
  return 'streaming';
}

export class ProgressLog {
  private timer: NodeJS.Timeout | null = null;
  private last: { at: number; transactions: number };
  private ticking = false;
  private readonly copied: CopiedTotals = { tables: 0, rows: 0, bytes: 0 };

  constructor(
    private readonly log: Logger,
    private readonly sources: ProgressSources,
    private readonly intervalMs = progressIntervalMs(),
  ) {
    this.last = { at: Date.now(), transactions: sources.counters.transactionsApplied };
  }

  start(): void {
    this.last = { at: Date.now(), transactions: this.sources.counters.transactionsApplied };
    this.timer = setInterval(() => void this.tick(), this.intervalMs);
    // The heartbeat never keeps the process alive on its own.
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** A table's copy finished in this process (the launcher's onCopyFinished). */
  copyFinished(p: TableProgress | undefined): void {
    if (!p) return;
    this.copied.tables++;
    this.copied.rows += p.rows;
    this.copied.bytes += p.bytes;
  }

  /** What the table sync of this process copied, finished copies only. */
  copiedTotals(): CopiedTotals {
    return { ...this.copied };
  }

  /** One progress line; skipped while the previous one still waits for the target. */
  async tick(now = Date.now()): Promise<void> {
    if (this.ticking) return;
    this.ticking = true;
    try {
      const { counters, sync } = this.sources;
      const session = this.sources.session();
      const progress = session?.progress ?? null;
      const lagBytes = progress ? Number(progress.received > progress.flushed ? progress.received - progress.flushed : 0n) : null;
      const caughtUp = progress !== null && progress.flushed >= progress.received;
      const lag = caughtUp ? 0 : lagSeconds({ progress: () => progress, counters });
      const lagSecondsValue = lag === null ? null : Math.round(lag * 10) / 10;
      const seconds = (now - this.last.at) / 1000;
      const applied = counters.transactionsApplied - this.last.transactions;
      this.last = { at: now, transactions: counters.transactionsApplied };
      const copying = sync.copying().length;
      const state = runState({
        copying: copying > 0 || this.sources.copyRunning(),
        session: session !== null,
        tablesCatchingUp: sync.all().some((t) => t.state === 's' || t.state === 'f'),
        lagBytes,
      });
      this.log.info(
        {
          state,
          tx_per_second: seconds > 0 ? Math.round((applied / seconds) * 10) / 10 : 0,
          transactions_applied: counters.transactionsApplied,
          lag_bytes: lagBytes,
          lag_seconds: lagSecondsValue,
          received_lsn: progress ? formatLsn(progress.received) : null,
          flushed_lsn: progress ? formatLsn(progress.flushed) : null,
          tables_copying: copying,
        },
        'progress',
      );
    } finally {
      this.ticking = false;
    }
  }
}
