/**
 * Prometheus metrics (`metrics_listen`, prom-client) and the health endpoints. Names follow
 * Prometheus' conventions (https://prometheus.io/docs/practices/naming): counters end in
 * `_total`, times are seconds (`_timestamp_seconds` for a point in time), sizes and LSNs
 * bytes (`_lsn_bytes`: an LSN X/Y is X * 2^32 + Y bytes of WAL, exact up to 2^53), and
 * labels that describe the process ride on `pgsub_build_info` and `pgsub_info`. Their
 * meanings are PostgreSQL's: each help text names the column of pg_stat_subscription,
 * pg_stat_subscription_stats (PostgreSQL 19's names) or pg_replication_slots it mirrors,
 * and README's metrics table lists them all. prom-client's default process metrics
 * (`process_*`, `nodejs_*`, unprefixed as every client library names them) are
 * registered beside them. Every value is read from the running service when scraped:
 * nothing is computed per change.
 *
 * A value that is not known, or does not apply, is absent — never 0: the LSNs and times
 * before a session has them, safe_wal_size when PostgreSQL reports NULL (an unlimited
 * max_slot_wal_keep_size), the verify series before any verify, the conflict types this
 * process does not detect (conflict detection off; the *_origin_differs without
 * track_commit_timestamp on the target; update_deleted, which needs retain_dead_tuples
 * inside the target server), sync_seq errors with `sequences: off`. A labelless prom-client
 * gauge exports 0 until set, so such a series is removed in its collect().
 *
 * Counters count this process (PostgreSQL's stats_reset is process_start_time_seconds).
 * A conflict is counted once each time it is detected in an apply attempt, whatever its
 * policy did, as PostgreSQL counts it: under `error` together with the apply error it
 * raises (service/runner.ts), so each retry that meets it again counts again; resolved by
 * another policy when the target transaction resolving it commits (apply/txn/commit.ts),
 * so pgsub's own re-applies of a transaction (a careful replay, a group retried one by one)
 * do not count it twice — the same counts pgsub.subscription_stats keeps in the target.
 *
 * Lag: bytes = the publisher's WAL end (its keepalives carry it) minus what the target
 * holds flushed; seconds = now minus the source commit time of the last transaction the
 * target committed, while more is waiting, corrected by the clock offset between the hosts
 * (the smallest arrival − send time of the keepalives, so it includes the shortest network
 * delay), and 0 when nothing waits. /healthz answers while the process runs; /readyz only
 * while streaming with lag under `ready_max_lag_bytes`.
 */
import http from 'node:http';
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client';
import type { Logger } from '../log.js';
import { pgTimeToEpochMs, type Progress } from '../origin/positions.js';
import { lagSeconds } from './lag.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { CONFLICT_TYPES, counterColumn } from '../conflict/types.js';
import { STATE_NAMES, type SyncStates } from '../origin/sync-state.js';
import type { TableProgress } from '../tablesync/job.js';

export interface SlotHealth {
  walStatus: string | null;
  /** pg_replication_slots.safe_wal_size; null when unlimited (max_slot_wal_keep_size = -1) or not applicable. */
  safeWalSizeBytes: number | null;
  retainedWalBytes: number | null;
}

/** What the running service offers to a scrape (cli run wires it to the runner). */
export interface MetricsSource {
  progress(): Progress | null;
  counters: ApplyCounters;
  sync: SyncStates;
  copies(): ReadonlyMap<string, TableProgress>;
  /** Bytes spooled by the running session; null without one. */
  spoolBytes(): number | null;
  streaming(): boolean;
  slot(): SlotHealth | null;
  /** apply_error_count, sync_table_error_count, sync_seq_error_count (null: sequences are not synced). */
  errors(): { apply: number; syncTable: number; syncSeq: number | null };
  /** pgsub_build_info's labels (version). */
  build: Record<string, string>;
  /** pgsub_info's labels (subscription, slot). */
  info: Record<string, string>;
  /** The last `pgsub verify` of the subscription (verify/hold.ts reads it), if any. */
  lastVerify?(): { lsn: bigint; result: string; differences: number; at: string } | null;
}

export interface MetricsServer {
  readonly port: number;
  close(): Promise<void>;
}

const LSN_HELP = 'as bytes of WAL (an LSN X/Y is X * 2^32 + Y)';

/** A labelless metric without a value: no sample at all (prom-client would export 0). */
function absent(metric: Gauge | Counter): void {
  metric.reset();
  metric.remove();
}

/** Defines a labelless metric read when scraped; a null read leaves it absent. */
type Define = (name: string, help: string, read: () => number | null) => void;

/** The registry and its two kinds of labelless metric. */
interface Definers {
  registry: Registry;
  gauge: Define;
  counter: Define;
}

function definers(registry: Registry): Definers {
  const gauge: Define = (name, help, read) => {
    new Gauge({
      name,
      help,
      registers: [registry],
      collect() {
        const v = read();
        if (v === null) absent(this);
        else this.set(v);
      },
    });
  };
  const counter: Define = (name, help, read) => {
    new Counter({
      name,
      help,
      registers: [registry],
      collect() {
        const v = read();
        if (v === null) absent(this);
        else setCounter(this, v);
      },
    });
  };
  return { registry, gauge, counter };
}

/** Registered group by group: the order is /metrics' order. */
export function buildRegistry(source: MetricsSource): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const define = definers(registry);
  defineStreamMetrics(define, source);
  defineStatsMetrics(define, source);
  defineApplyMetrics(define, source);
  defineTableSyncMetrics(define, source);
  defineSessionMetrics(define, source);
  defineSlotMetrics(define, source);
  defineVerifyMetrics(define, source);
  defineInfoMetrics(define, source);
  return registry;
}

function seconds(ms: number | null): number | null {
  return ms === null ? null : ms / 1000;
}

/** pg_stat_subscription */
function defineStreamMetrics({ gauge }: Definers, source: MetricsSource): void {
  const p = () => source.progress();
  gauge('pgsub_received_lsn_bytes', `Last WAL position received from the publisher, ${LSN_HELP} (pg_stat_subscription.received_lsn)`, () => num(p()?.received));
  gauge('pgsub_latest_end_lsn_bytes', `Last WAL position reported to the publisher as flushed, ${LSN_HELP} (pg_stat_subscription.latest_end_lsn)`, () => num(p()?.latestEndLsn));
  gauge('pgsub_last_msg_send_timestamp_seconds', 'Send time of the last message from the publisher, publisher clock (pg_stat_subscription.last_msg_send_time)', () => {
    const t = p()?.lastMsgSendTime;
    return t == null ? null : pgTimeToEpochMs(t) / 1000;
  });
  gauge('pgsub_last_msg_receipt_timestamp_seconds', 'Receipt time of the last message from the publisher (pg_stat_subscription.last_msg_receipt_time)', () =>
    seconds(p()?.lastMsgReceiptAt ?? null),
  );
  gauge('pgsub_latest_end_timestamp_seconds', 'Time the last flush position was reported to the publisher (pg_stat_subscription.latest_end_time)', () =>
    seconds(p()?.latestEndAt ?? null),
  );
  gauge('pgsub_flushed_lsn_bytes', `WAL position the target holds flushed (what feedback may report), ${LSN_HELP} (pg_replication_origin_status.remote_lsn, once on disk)`, () =>
    num(p()?.flushed),
  );
  gauge('pgsub_lag_bytes', 'Publisher WAL end minus the position the target holds flushed', () => {
    const pr = p();
    return pr ? Math.max(0, Number(pr.received - pr.flushed)) : null;
  });
  gauge('pgsub_lag_seconds', 'Age of the last source commit applied while more waits, clock offset corrected; 0 when caught up', () => lagSeconds(source));
  gauge('pgsub_clock_offset_seconds', 'Estimated offset of the publisher clock behind this host plus the shortest network delay', () => seconds(p()?.clockOffsetMs ?? null));
}

/** pg_stat_subscription_stats (PostgreSQL 19's columns) */
function defineStatsMetrics({ registry, counter }: Definers, source: MetricsSource): void {
  counter('pgsub_apply_errors_total', 'Apply errors in this process, every occurrence (pg_stat_subscription_stats.apply_error_count)', () => source.errors().apply);
  counter(
    'pgsub_sync_table_errors_total',
    'Table copy errors in this process (pg_stat_subscription_stats.sync_table_error_count; sync_error_count before PostgreSQL 19)',
    () => source.errors().syncTable,
  );
  counter(
    'pgsub_sync_seq_errors_total',
    'Failed sequence sync rounds in this process; absent with sequences: off (pg_stat_subscription_stats.sync_seq_error_count)',
    () => source.errors().syncSeq,
  );
  new Counter({
    name: 'pgsub_conflicts_total',
    help: `Conflicts detected in this process, whatever the policy did (an error too); label conflict = the type, mirroring pg_stat_subscription_stats.confl_<conflict> (${CONFLICT_TYPES.map(counterColumn).join(', ')}); a type this process does not detect has no series`,
    labelNames: ['conflict'],
    registers: [registry],
    collect() {
      this.reset();
      const detected = source.counters.detectedConflicts;
      for (const type of CONFLICT_TYPES) {
        const n = source.counters.conflicts[type];
        if (n > 0 || detected?.includes(type)) this.inc({ conflict: type }, n);
      }
    },
  });
}

/** What this process applied */
function defineApplyMetrics({ counter }: Definers, source: MetricsSource): void {
  counter('pgsub_transactions_applied_total', 'Source transactions applied by this process', () => source.counters.transactionsApplied);
  counter('pgsub_transactions_skipped_total', 'Source transactions skipped (pgsub skip, or nothing published in them)', () => source.counters.transactionsSkipped);
  counter('pgsub_changes_applied_total', 'Row changes applied by this process', () => source.counters.changesApplied);
}

/** Table sync (pg_subscription_rel.srsubstate) */
function defineTableSyncMetrics({ registry, counter }: Definers, source: MetricsSource): void {
  new Gauge({
    name: 'pgsub_tablesync_tables',
    help: 'Published tables by sync state (init, datasync, finishedcopy, syncdone, ready; pg_subscription_rel.srsubstate)',
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
  counter('pgsub_tablesync_rows_copied_total', 'Rows copied by table sync in this process', () => {
    let rows = 0;
    for (const c of source.copies().values()) rows += c.rows;
    return rows;
  });
}

/** The running session */
function defineSessionMetrics({ gauge }: Definers, source: MetricsSource): void {
  gauge('pgsub_spool_bytes', 'Bytes of streamed transactions spooled to disk by the running session', () => source.spoolBytes());
  gauge('pgsub_streaming', '1 while an apply session streams from the slot, else 0', () => (source.streaming() ? 1 : 0));
}

/** The slot on the publisher (pg_replication_slots), as the slot guard last read it */
function defineSlotMetrics({ registry, gauge }: Definers, source: MetricsSource): void {
  new Gauge({
    name: 'pgsub_slot_wal_status',
    help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost; pg_replication_slots.wal_status)",
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
    'WAL that can still be written before the slot is lost; absent when unlimited, max_slot_wal_keep_size = -1 (pg_replication_slots.safe_wal_size)',
    () => source.slot()?.safeWalSizeBytes ?? null,
  );
  gauge(
    'pgsub_slot_retained_wal_bytes',
    'WAL the publisher keeps for the slot (pg_current_wal_lsn() minus pg_replication_slots.restart_lsn)',
    () => source.slot()?.retainedWalBytes ?? null,
  );
}

/** The last pgsub verify: absent before any */
function defineVerifyMetrics({ gauge }: Definers, source: MetricsSource): void {
  const v = () => source.lastVerify?.() ?? null;
  gauge('pgsub_verify_last_lsn_bytes', `Source LSN the last pgsub verify compared both sides at, ${LSN_HELP}`, () => num(v()?.lsn));
  gauge('pgsub_verify_last_equal', 'Whether the last pgsub verify found the target equal to the source (1) or not (0)', () => {
    const last = v();
    return last ? (last.result === 'equal' ? 1 : 0) : null;
  });
  gauge('pgsub_verify_last_differences', 'Rows missing, extra or different the last pgsub verify counted', () => v()?.differences ?? null);
  gauge('pgsub_verify_last_timestamp_seconds', 'When the last pgsub verify finished', () => {
    const at = v()?.at;
    return at ? Date.parse(at) / 1000 : null;
  });
}

/** Labels, as _info pseudo-metrics (value 1) */
function defineInfoMetrics({ registry }: Definers, source: MetricsSource): void {
  new Gauge({
    name: 'pgsub_build_info',
    help: 'pgsub build, as labels (version); always 1',
    labelNames: Object.keys(source.build),
    registers: [registry],
    collect() {
      this.set(source.build, 1);
    },
  });
  new Gauge({
    name: 'pgsub_info',
    help: 'The subscription this process runs, as labels (subscription, slot); always 1',
    labelNames: Object.keys(source.info),
    registers: [registry],
    collect() {
      this.set(source.info, 1);
    },
  });
}

function num(lsn: bigint | null | undefined): number | null {
  return lsn == null ? null : Number(lsn);
}

function setCounter(counter: Counter, value: number): void {
  // prom-client counters only go up: set by resetting then adding the process's total.
  counter.reset();
  counter.inc(value);
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
