/**
 * Table-sync progress for people: per-table rows, bytes, rate and ETA as structured log
 * events every few seconds, a live block redrawn on the terminal when there is one, and a
 * summary table when the initial copy ends (pgcopydb-style). Rates come from the bytes
 * streamed so far; the ETA from the table's on-disk size on the publisher, an estimate.
 */
import type { Logger } from '../log.js';
import type { TableProgress } from './job.js';

export function formatBytes(n: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(u === 0 ? 0 : 1)} ${units[u]}`;
}

export function formatSeconds(s: number): string {
  if (!Number.isFinite(s)) return '-';
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m}m${String(Math.round(s - m * 60)).padStart(2, '0')}s`;
}

interface Line {
  table: string;
  rows: number;
  bytes: number;
  seconds: number;
  rate: number;
  eta: number;
  done: boolean;
}

function lines(progress: Iterable<TableProgress>, now: number): Line[] {
  return [...progress].map((p) => {
    const seconds = ((p.finishedAt ?? now) - p.startedAt) / 1000;
    const rate = seconds > 0 ? p.bytes / seconds : 0;
    const remaining = Math.max(p.estimatedBytes - p.bytes, 0);
    return {
      table: `${p.schema}.${p.table}`,
      rows: p.rows,
      bytes: p.bytes,
      seconds,
      rate,
      eta: p.finishedAt ? 0 : rate > 0 ? remaining / rate : Infinity,
      done: p.finishedAt !== null,
    };
  });
}

export function renderTable(progress: Iterable<TableProgress>, now = Date.now()): string {
  const rows = lines(progress, now);
  const header = `${'table'.padEnd(32)} ${'rows'.padStart(11)} ${'bytes'.padStart(10)} ${'rate'.padStart(11)} ${'time'.padStart(8)} ${'eta'.padStart(8)}`;
  const body = rows.map(
    (r) =>
      `${r.table.slice(0, 32).padEnd(32)} ${String(r.rows).padStart(11)} ${formatBytes(r.bytes).padStart(10)} ${`${formatBytes(r.rate)}/s`.padStart(11)} ${formatSeconds(r.seconds).padStart(8)} ${(r.done ? 'done' : formatSeconds(r.eta)).padStart(8)}`,
  );
  const total = rows.reduce((a, r) => ({ rows: a.rows + r.rows, bytes: a.bytes + r.bytes }), { rows: 0, bytes: 0 });
  return [header, ...body, `${'total'.padEnd(32)} ${String(total.rows).padStart(11)} ${formatBytes(total.bytes).padStart(10)}`].join('\n');
}

/** Periodic log events and, on a terminal, a live block; `finish` prints the summary. */
export class ProgressReporter {
  private timer: NodeJS.Timeout | null = null;
  private drawn = 0;
  private lastLog = 0;

  constructor(
    private readonly progress: Map<string, TableProgress>,
    private readonly log: Logger,
    private readonly tty: NodeJS.WriteStream | null,
    private readonly logEveryMs = 5000,
  ) {}

  start(): void {
    this.timer = setInterval(() => this.tick(), 1000);
    this.timer.unref();
  }

  private tick(): void {
    const now = Date.now();
    const active = [...this.progress.values()].filter((p) => p.finishedAt === null);
    if (now - this.lastLog >= this.logEveryMs && active.length > 0) {
      this.lastLog = now;
      for (const l of lines(active, now)) {
        this.log.info(
          { table: l.table, rowsCommitted: l.rows, bytes: l.bytes, bytesPerSecond: Math.round(l.rate), etaSeconds: Number.isFinite(l.eta) ? Math.round(l.eta) : null },
          'table copy progress',
        );
      }
    }
    if (this.tty && this.progress.size > 0) {
      const text = renderTable(this.progress.values(), now);
      // Move up over the previous block and redraw it in place.
      this.tty.write(`${this.drawn > 0 ? `\x1b[${this.drawn}A` : ''}\x1b[J${text}\n`);
      this.drawn = text.split('\n').length;
    }
  }

  finish(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.progress.size === 0) return;
    const summary = lines(this.progress.values(), Date.now());
    this.log.info({ tables: summary.map((l) => ({ table: l.table, rows: l.rows, bytes: l.bytes, seconds: Math.round(l.seconds * 10) / 10 })) }, 'initial copy summary');
    if (this.tty) {
      this.tty.write(`${this.drawn > 0 ? `\x1b[${this.drawn}A\x1b[J` : ''}initial copy finished\n${renderTable(this.progress.values())}\n`);
      this.drawn = 0;
    }
  }
}
