/**
 * Prometheus metrics (`metrics_listen`, prom-client) and the health endpoints, named the
 * way PostgreSQL names what the native subscriber shows: the columns of
 * pg_stat_subscription (received_lsn, latest_end_lsn, last_msg_send_time,
 * last_msg_receipt_time, latest_end_time) and of pg_stat_subscription_stats
 * (apply_error_count, sync_error_count, confl_*) as `pgsub_<column>`, plus lag in bytes
 * and seconds, what was applied, the table sync, the spool, the slot's health and a
 * `pgsub_info` series. Every value is read from the running service when scraped: nothing
 * is computed per change. LSNs are exported as numbers (exact up to 2^53 bytes of WAL).
 *
 * Lag: bytes = the publisher's WAL end (its keepalives carry it) minus what the target
 * holds flushed; seconds = now minus the source commit time of the last transaction the
 * target committed, while more is waiting, corrected by the clock offset between the hosts
 * (the smallest arrival − send time of the keepalives, so it includes the shortest network
 * delay), and 0 when nothing waits. /healthz answers while the process runs; /readyz only
 * while streaming with lag under `ready_max_lag_bytes`.
 */
import http from 'node:http';
import { Counter, Gauge, Registry } from 'prom-client';
import type { Logger } from '../log.js';
import { pgTimeToEpochMs, type Progress } from '../origin/positions.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { CONFLICT_TYPES } from '../conflict/types.js';
import { STATE_NAMES, type SyncStates } from '../origin/sync-state.js';
import type { TableProgress } from '../tablesync/job.js';

export interface SlotHealth {
  walStatus: string | null;
  safeWalSizeBytes: number | null;
  retainedWalBytes: number | null;
}

/** What the running service offers to a scrape (cli run wires it to the runner). */
export interface MetricsSource {
  progress(): Progress | null;
  counters: ApplyCounters;
  sync: SyncStates;
  copies(): ReadonlyMap<string, TableProgress>;
  spoolBytes(): number;
  streaming(): boolean;
  slot(): SlotHealth | null;
  errors(): { apply: number; sync: number };
  info: Record<string, string>;
  /** The last `pgsub verify` of the subscription (verify/hold.ts reads it), if any. */
  lastVerify?(): { lsn: bigint; result: string; differences: number; at: string } | null;
}

export interface MetricsServer {
  readonly port: number;
  close(): Promise<void>;
}

const LSN_HELP = 'as a number of bytes (an LSN X/Y is X * 2^32 + Y)';

export function buildRegistry(source: MetricsSource): Registry {
  const registry = new Registry();
  const gauge = (name: string, help: string, read: () => number | null, labelNames: string[] = []) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers: [registry],
      collect() {
        const v = read();
        if (v !== null) this.set(v);
      },
    });
  const seconds = (ms: number | null) => (ms === null ? null : ms / 1000);
  const p = () => source.progress();
  gauge('pgsub_received_lsn', `Last WAL position received from the publisher, ${LSN_HELP}`, () => num(p()?.received));
  gauge('pgsub_latest_end_lsn', `Last WAL position reported to the publisher as flushed, ${LSN_HELP}`, () => num(p()?.latestEndLsn));
  gauge('pgsub_last_msg_send_time', 'Send time of the last keepalive from the publisher, seconds since the epoch (publisher clock)', () => {
    const t = p()?.lastMsgSendTime;
    return t == null ? null : pgTimeToEpochMs(t) / 1000;
  });
  gauge('pgsub_last_msg_receipt_time', 'Receipt time of the last keepalive from the publisher, seconds since the epoch', () => seconds(p()?.lastMsgReceiptAt ?? null));
  gauge('pgsub_latest_end_time', 'Time of the last flush position reported to the publisher, seconds since the epoch', () => seconds(p()?.latestEndAt ?? null));
  gauge('pgsub_flushed_lsn', `WAL position the target holds flushed (what feedback may report), ${LSN_HELP}`, () => num(p()?.flushed));
  gauge('pgsub_lag_bytes', 'Publisher WAL end minus the position the target holds flushed', () => {
    const pr = p();
    return pr ? Math.max(0, Number(pr.received - pr.flushed)) : null;
  });
  gauge('pgsub_lag_seconds', 'Age of the last source commit applied while more waits, clock offset corrected; 0 when caught up', () => lagSeconds(source));
  const v = () => source.lastVerify?.() ?? null;
  gauge('pgsub_verify_last_lsn', `Source LSN the last pgsub verify compared both sides at, ${LSN_HELP}`, () => num(v()?.lsn));
  gauge('pgsub_verify_last_equal', 'Whether the last pgsub verify found the target equal to the source (1) or not (0)', () => (v() ? (v()!.result === 'equal' ? 1 : 0) : null));
  gauge('pgsub_verify_last_differences', 'Rows missing, extra or different the last pgsub verify counted', () => v()?.differences ?? null);
  gauge('pgsub_verify_last_timestamp_seconds', 'When the last pgsub verify finished, seconds since the epoch', () => {
    const at = v()?.at;
    return at ? Date.parse(at) / 1000 : null;
  });
  gauge('pgsub_clock_offset_seconds', 'Estimated offset of the publisher clock behind this host plus the shortest network delay', () => seconds(p()?.clockOffsetMs ?? null));

  new Counter({
    name: 'pgsub_apply_error_count',
    help: 'Apply errors in this process (pg_stat_subscription_stats.apply_error_count)',
    registers: [registry],
    collect() {
      setCounter(this, source.errors().apply);
    },
  });
  new Counter({
    name: 'pgsub_sync_error_count',
    help: 'Table copy errors in this process (pg_stat_subscription_stats.sync_error_count)',
    registers: [registry],
    collect() {
      setCounter(this, source.errors().sync);
    },
  });
  for (const type of CONFLICT_TYPES) {
    new Counter({
      name: `pgsub_confl_${type}`,
      help: `${type} conflicts resolved by a policy in this process (pg_stat_subscription_stats.confl_${type})`,
      registers: [registry],
      collect() {
        setCounter(this, source.counters.conflicts[type]);
      },
    });
  }
  new Counter({
    name: 'pgsub_transactions_applied_total',
    help: 'Source transactions applied by this process',
    registers: [registry],
    collect() {
      setCounter(this, source.counters.transactionsApplied);
    },
  });
  new Counter({
    name: 'pgsub_transactions_skipped_total',
    help: 'Source transactions skipped (pgsub skip, or nothing published in them)',
    registers: [registry],
    collect() {
      setCounter(this, source.counters.transactionsSkipped);
    },
  });
  new Counter({
    name: 'pgsub_changes_applied_total',
    help: 'Row changes applied by this process',
    registers: [registry],
    collect() {
      setCounter(this, source.counters.changesApplied);
    },
  });

  new Gauge({
    name: 'pgsub_tablesync_tables',
    help: 'Published tables by sync state (init, datasync, finishedcopy, syncdone, ready)',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      const counts = new Map<string, number>(Object.values(STATE_NAMES).map((s) => [s, 0]));
      for (const t of source.sync.all()) counts.set(STATE_NAMES[t.state], (counts.get(STATE_NAMES[t.state]) ?? 0) + 1);
      for (const [state, n] of counts) this.set({ state }, n);
    },
  });
  // One series per published table: bounded by the publication.
  new Gauge({
    name: 'pgsub_tablesync_copied_bytes',
    help: 'Bytes copied by the current or last initial copy of a table, per table',
    labelNames: ['table'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [table, c] of source.copies()) this.set({ table }, c.bytes);
    },
  });
  new Counter({
    name: 'pgsub_tablesync_rows_copied_total',
    help: 'Rows copied by table sync in this process',
    registers: [registry],
    collect() {
      let rows = 0;
      for (const c of source.copies().values()) rows += c.rows;
      setCounter(this, rows);
    },
  });
  gauge('pgsub_spool_bytes', 'Bytes of streamed transactions spooled to disk', () => source.spoolBytes());
  gauge('pgsub_streaming', '1 while the apply session streams from the slot', () => (source.streaming() ? 1 : 0));
  new Gauge({
    name: 'pgsub_slot_wal_status',
    help: "The slot's pg_replication_slots.wal_status: 1 for the current one (reserved, extended, unreserved, lost)",
    labelNames: ['wal_status'],
    registers: [registry],
    collect() {
      this.reset();
      const status = source.slot()?.walStatus;
      if (status) this.set({ wal_status: status }, 1);
    },
  });
  gauge(
    'pgsub_slot_safe_wal_size_bytes',
    'WAL that can still be written before the slot is lost (pg_replication_slots.safe_wal_size)',
    () => source.slot()?.safeWalSizeBytes ?? null,
  );
  gauge('pgsub_slot_retained_wal_bytes', 'WAL the publisher keeps for the slot (current WAL position minus restart_lsn)', () => source.slot()?.retainedWalBytes ?? null);
  new Gauge({
    name: 'pgsub_info',
    help: 'Versions and names, as labels',
    labelNames: Object.keys(source.info),
    registers: [registry],
    collect() {
      this.set(source.info, 1);
    },
  });
  return registry;
}

function num(lsn: bigint | null | undefined): number | null {
  return lsn == null ? null : Number(lsn);
}

function setCounter(counter: Counter, value: number): void {
  // prom-client counters only go up: set by resetting then adding the process's total.
  counter.reset();
  counter.inc(value);
}

export function lagSeconds(source: Pick<MetricsSource, 'progress' | 'counters'>): number | null {
  const p = source.progress();
  if (!p) return null;
  if (p.received <= p.flushed) return 0;
  const t = source.counters.lastCommitTime;
  if (t === null) return null;
  return Math.max(0, (Date.now() - pgTimeToEpochMs(t) - (p.clockOffsetMs ?? 0)) / 1000);
}

/** `listen`: host:port (port 0 picks one). */
export async function startMetricsServer(listen: string, source: MetricsSource, readyMaxLagBytes: number, log: Logger): Promise<MetricsServer> {
  const registry = buildRegistry(source);
  const at = listen.lastIndexOf(':');
  const host = listen.slice(0, at).replace(/^\[|\]$/g, '') || '127.0.0.1';
  const port = Number(listen.slice(at + 1));
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (path === '/metrics') {
      registry
        .metrics()
        .then((body) => {
          res.writeHead(200, { 'content-type': registry.contentType });
          res.end(body);
        })
        .catch((err: unknown) => {
          res.writeHead(500, { 'content-type': 'text/plain' });
          res.end(String(err));
        });
    } else if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok\n');
    } else if (path === '/readyz') {
      const p = source.progress();
      const lag = p ? Number(p.received - p.flushed) : null;
      const ready = source.streaming() && lag !== null && lag <= readyMaxLagBytes;
      res.writeHead(ready ? 200 : 503, { 'content-type': 'text/plain' });
      res.end(ready ? 'ready\n' : `not ready: ${source.streaming() ? `lag ${lag} bytes > ${readyMaxLagBytes}` : 'not streaming'}\n`);
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found\n');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address();
  const bound = typeof address === 'object' && address ? address.port : port;
  log.info({ listen: `${host}:${bound}` }, 'metrics endpoint listening');
  server.unref();
  return {
    port: bound,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
