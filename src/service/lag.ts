/**
 * Lag in seconds as the metrics (metrics.ts), the progress line and systemd's STATUS report
 * it: now minus the source commit time of the last transaction the target committed, while
 * more is waiting, corrected by the clock offset between the hosts; 0 when nothing waits.
 * Its own file so that the progress line and the supervisor do not load prom-client, which
 * only a configured metrics_listen needs (about 10 ms of every start).
 */
import { pgTimeToEpochMs, type Progress } from '../origin/positions.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';

export interface LagSource {
  progress(): Progress | null;
  counters: ApplyCounters;
}

export function lagSeconds(source: LagSource): number | null {
  const p = source.progress();
  if (!p) return null;
  if (p.received <= p.flushed) return 0;
  const t = source.counters.lastCommitTime;
  if (t === null) return null;
  return Math.max(0, (Date.now() - pgTimeToEpochMs(t) - (p.clockOffsetMs ?? 0)) / 1000);
}
