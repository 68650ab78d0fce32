/**
 * `pgsub status`: the progress recorded in the target (pgsub.origin) beside the slot's
 * position on the publisher, and the lag between the publisher's WAL and what the target
 * holds, the conflict and apply-error counters (named as pg_stat_subscription_stats'),
 * whether the subscription is enabled, the last apply error with the finish LSN that
 * `pgsub skip --lsn` takes, a pending skip, whether `pgsub cutover` finished it (and its
 * slot, if kept, with the WAL it retains), and per table its sync state and last copy
 * error, and the tables the publications publish that are not part of the subscription yet
 * (published since the last refresh: their changes are skipped until `pgsub refresh`) and
 * the configured publications missing on the publisher. Read-only on both sides.
 *
 * Both sides are read independently: with one down, what the other holds is still shown,
 * the unreachable side is named (host:port, never the password) and the exit code is 3.
 * A side that refuses pgsub (TLS, authentication, configuration: connect-failure.ts) is
 * exit 2 with its error code, as for every other command.
 * A subscription the target has never heard of is an error (exit 2), not a record with
 * defaults. The JSON form is a stable interface, documented key by key in
 * docs/status-json.md: a key is renamed or removed only with that document.
 */
import type { Config } from '../config/config.js';
import type { ConnInfo } from '../config/conninfo.js';
import { redactSecrets } from '../config/conninfo.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import { PgsubError, SubscriptionNotFoundError } from '../errors.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection, type SlotInfo } from '../protocol/replication.js';
import { formatBytes, formatSeconds } from '../tablesync/copy-report.js';
import { STATE_NAMES, type RelState } from '../origin/sync-state.js';
import { cutOverAt, loadStats, type Stats } from '../conflict/control.js';
import { CONFLICT_TYPES } from '../conflict/types.js';
import { sequenceStatus, type SequenceStatus } from '../migrate/sequences.js';
import { existingPublications, listPublishedNames } from '../tablesync/catalog.js';

/** Exit code of `pgsub status` when the source or the target could not be reached or read. */
export const EXIT_SIDE_UNREACHABLE = 3;

/** Unless the conninfo says otherwise: status is run by a person waiting for an answer. */
const STATUS_CONNECT_TIMEOUT_S = 10;

export interface SideStatus {
  /** host:port of the conninfo; never a password. */
  host: string;
  reachable: boolean;
  /** Why it could not be reached or read; null when it was. */
  error: string | null;
}

export interface TableStatus {
  table: string;
  state: string;
  sync_lsn: string | null;
  rows: number;
  bytes: number;
  seconds: number | null;
  last_error: string | null;
  last_error_at: string | null;
  error_count: number;
}

type Conflicts = Record<`confl_${(typeof CONFLICT_TYPES)[number]}`, number | null>;

export type StatusReport = {
  subscription: string;
  slot: string;
  source: SideStatus;
  target: SideStatus;
  slot_exists: boolean | null;
  slot_active: boolean | null;
  slot_confirmed_flush_lsn: string | null;
  slot_wal_status: string | null;
  slot_safe_wal_size: number | null;
  slot_retained_wal_bytes: number | null;
  publisher_wal_lsn: string | null;
  origin_remote_lsn: string | null;
  last_commit_end_lsn: string | null;
  last_commit_time: string | null;
  transactions_applied: number | null;
  lag_bytes: number | null;
  enabled: boolean | null;
  disabled_reason: string | null;
  skip_lsn: string | null;
  last_error_code: string | null;
  last_error_lsn: string | null;
  last_error_xid: number | null;
  last_error_conflict: string | null;
  last_error_message: string | null;
  last_error_time: string | null;
  last_error_pending: boolean | null;
  apply_error_count: number | null;
  /** The last `pgsub verify` (docs/verify.md): the LSN both sides were compared at, and what it found. */
  last_verify_lsn: string | null;
  last_verify_result: string | null;
  last_verify_differences: number | null;
  last_verify_time: string | null;
  /** `pgsub cutover` finished this subscription at this fence LSN (the target is the primary); null: not cut over. */
  cut_over_lsn: string | null;
  cut_over_at: string | null;
} & Conflicts & {
    stats_reset: string | null;
    /** Configured publications that do not exist on the publisher (warned, looked for at each refresh); null: source not read. */
    publications_missing: string[] | null;
    tables: TableStatus[] | null;
    /** Published by the existing publications, not part of the subscription: changes skipped until a refresh adds them; null: a side not read. */
    tables_not_subscribed: string[] | null;
    /** The synced sequences on both sides (migrate/sequences.ts); null when a side could not be read; [] with sequences: off. */
    sequences: SequenceStatus[] | null;
    /** Why `sequences` is null: the server, and for a missing privilege the GRANT to run there. */
    sequences_error: string | null;
  };

interface SourceRead {
  slot: SlotInfo | null;
  walLsn: Lsn;
  missing: string[];
  /** schema.table of every published table. */
  published: string[];
}

interface OriginRead {
  remoteLsn: Lsn;
  lastCommitEndLsn: string | null;
  lastCommitTime: string | null;
  transactionsApplied: number;
}

interface ControlRead {
  enabled: boolean;
  disabledReason: string | null;
  skipLsn: string | null;
  errorLsn: string | null;
  errorXid: number | null;
  errorCode: string | null;
  errorConflict: string | null;
  errorMessage: string | null;
  errorAt: string | null;
}

interface VerifyRead {
  lsn: string | null;
  result: string | null;
  differences: number | null;
  at: string | null;
}

interface TargetRead {
  verify: VerifyRead | null;
  cutOver: { lsn: Lsn; at: string } | null;
  origin: OriginRead | null;
  tables: TableStatus[];
  stats: Stats | null;
  control: ControlRead | null;
}

/** A side's failure, as `status` reports it: connecting, or reading once connected. */
class SideError extends Error {
  constructor(
    readonly reachable: boolean,
    message: string,
  ) {
    super(message);
  }
}

/** Gathers both sides and prints them; returns the exit code (0, or 3 with a side unreachable). */
/**
 * Print the status of one subscription, or of several side by side (the instances of a
 * split migration): text one after another, JSON one object (one config) or an array of
 * them. Exit 3 when a side of any of them is unreachable.
 */
export async function printStatus(configs: readonly Config[], json: boolean): Promise<number> {
  const reports = await Promise.all(configs.map((config) => readStatus(config)));
  for (const report of reports) {
    for (const side of ['source', 'target'] as const) {
      const s = report[side];
      const who = configs.length > 1 ? `${report.subscription}: ` : '';
      if (s.error !== null) process.stderr.write(`pgsub: ${who}${side} ${s.reachable ? 'could not be read' : 'unreachable'} (${s.host}): ${s.error}\n`);
    }
  }
  if (json) process.stdout.write(`${JSON.stringify(configs.length === 1 ? reports[0] : reports, null, 2)}\n`);
  else process.stdout.write(reports.map(renderText).join('\n'));
  return reports.some((r) => r.source.error !== null || r.target.error !== null) ? EXIT_SIDE_UNREACHABLE : 0;
}

async function readStatus(config: Config): Promise<StatusReport> {
  const [source, target, sequences] = await Promise.allSettled([
    readSource(config),
    readTarget(config),
    config.sequences === 'sync' ? sequenceStatus(config) : Promise.resolve([]),
  ]);
  // A refusal (TLS, authentication, configuration: exit 2) is the operator's to fix, not a side that is down.
  for (const side of [source, target]) {
    if (side.status === 'rejected' && side.reason instanceof PgsubError && !(side.reason instanceof SubscriptionNotFoundError)) throw side.reason;
  }
  if (target.status === 'rejected' && target.reason instanceof PgsubError) throw target.reason;
  const report = buildReport(config, source, target);
  report.sequences = sequences.status === 'fulfilled' ? sequences.value : null;
  report.sequences_error = sequences.status === 'rejected' ? redactSecrets(String((sequences.reason as Error)?.message ?? sequences.reason)) : null;
  return report;
}

function hostPort(info: ConnInfo): string {
  return `${info.host}:${info.port}`;
}

function withTimeout(info: ConnInfo): ConnInfo {
  return { ...info, connectTimeoutSeconds: info.connectTimeoutSeconds ?? STATUS_CONNECT_TIMEOUT_S };
}

/** The error's own words, without the conninfo the caller already shows redacted. */
function reason(err: unknown): string {
  const e = err as { cause?: unknown; message?: string; code?: string };
  const inner = (e?.cause as { message?: string } | undefined)?.message ?? e?.message ?? String(err);
  return redactSecrets(String(inner || e?.code || err));
}

async function readSource(config: Config): Promise<SourceRead> {
  let replication: ReplicationConnection;
  try {
    replication = await ReplicationConnection.open(withTimeout(config.source), `pgsub_${config.subscription}_status`);
  } catch (err) {
    if (err instanceof PgsubError && err.exitCode === 2) throw err;
    throw new SideError(false, reason(err));
  }
  try {
    const slot = await replication.getSlot(config.slotName);
    const [wal] = await replication.sql<{ lsn: string }>('SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn');
    const existing = await existingPublications(replication, config.publications);
    const published = (await listPublishedNames(replication, existing)).map((t) => `${t.schema}.${t.table}`);
    return { slot, walLsn: parseLsn(wal!.lsn), missing: config.publications.filter((p) => !existing.includes(p)), published };
  } catch (err) {
    throw new SideError(true, reason(err));
  } finally {
    await replication.close().catch(() => {});
  }
}

async function readTarget(config: Config): Promise<TargetRead> {
  const sql = openMaintenance(withTimeout(config.target), `pgsub_${config.subscription}_status`);
  try {
    let tables: { origin: boolean; rel: boolean; stats: boolean; verify: boolean };
    try {
      // The first statement connects: a failure here is the target being unreachable.
      const [row] = await sql.unsafe<{ origin: boolean; rel: boolean; stats: boolean; verify: boolean }[]>(
        `SELECT pg_catalog.to_regclass('"pgsub"."origin"') IS NOT NULL AS origin,
                pg_catalog.to_regclass('"pgsub"."subscription_rel"') IS NOT NULL AS rel,
                pg_catalog.to_regclass('"pgsub"."subscription_stats"') IS NOT NULL AS stats,
                pg_catalog.to_regclass('"pgsub"."verify"') IS NOT NULL AS verify`,
      );
      tables = row!;
    } catch (err) {
      if (err instanceof PgsubError && err.exitCode === 2) throw err;
      throw new SideError(false, reason(err));
    }
    try {
      const origin = tables.origin ? await readOrigin(sql, config.subscription) : null;
      const rels = tables.rel ? await readTables(sql, config.subscription) : [];
      if (origin === null && rels.length === 0) {
        throw new SubscriptionNotFoundError(`subscription ${config.subscription} not found in the target (pgsub run creates it)`, { subscription: config.subscription });
      }
      const stats = tables.stats ? await loadStats(sql, config.subscription) : null;
      const control = tables.stats ? await readControl(sql, config.subscription) : null;
      const verify = tables.verify ? await readVerify(sql, config.subscription) : null;
      const cutOver = await cutOverAt(sql, config.subscription);
      return { origin, tables: rels, stats, control, verify, cutOver };
    } catch (err) {
      if (err instanceof PgsubError) throw err;
      throw new SideError(true, reason(err));
    }
  } finally {
    await sql.end({ timeout: 5 }).catch(() => {});
  }
}

// Timestamps as ISO 8601 with their offset (to_json's form), the same for every key.
const iso = (column: string) => `pg_catalog.to_json(${column}) #>> '{}'`;

async function readOrigin(sql: Sql, subscription: string): Promise<OriginRead | null> {
  const [row] = await sql.unsafe<{ remote_lsn: string; last_commit_end_lsn: string | null; last_commit_time: string | null; transactions_applied: string }[]>(
    `SELECT "remote_lsn"::text AS remote_lsn, "last_commit_end_lsn"::text AS last_commit_end_lsn, ${iso('"last_commit_time"')} AS last_commit_time,
            "transactions_applied"::text AS transactions_applied
       FROM "pgsub"."origin" WHERE "subscription" = $1`,
    [subscription],
  );
  if (!row) return null;
  return {
    remoteLsn: parseLsn(row.remote_lsn),
    lastCommitEndLsn: row.last_commit_end_lsn,
    lastCommitTime: row.last_commit_time,
    transactionsApplied: Number(row.transactions_applied),
  };
}

async function readTables(sql: Sql, subscription: string): Promise<TableStatus[]> {
  type Row = {
    schema_name: string;
    table_name: string;
    state: string;
    sync_lsn: string | null;
    rows_copied: string;
    bytes_copied: string;
    seconds: string | null;
    last_error: string | null;
    last_error_at: string | null;
    error_count: string;
  };
  const query = (errors: boolean) =>
    sql.unsafe<Row[]>(
      `SELECT "schema_name", "table_name", "state", "sync_lsn"::text AS sync_lsn, "rows_copied"::text AS rows_copied, "bytes_copied"::text AS bytes_copied,
              extract(epoch FROM COALESCE("copy_finished_at", pg_catalog.now()) - "copy_started_at")::text AS seconds,
              ${errors ? `"last_error", ${iso('"last_error_at"')} AS last_error_at, "error_count"::text AS error_count` : `NULL AS last_error, NULL AS last_error_at, '0' AS error_count`}
         FROM "pgsub"."subscription_rel" WHERE "subscription" = $1 ORDER BY "schema_name", "table_name"`,
      [subscription],
    );
  // A target migrated before 0005_sync_errors has no error columns; status does not migrate.
  const rows = await query(true).catch((err: { code?: string }) => (err.code === '42703' ? query(false) : Promise.reject(err)));
  return rows.map((t) => ({
    table: `${t.schema_name}.${t.table_name}`,
    state: STATE_NAMES[t.state as RelState] ?? t.state,
    sync_lsn: t.sync_lsn,
    rows: Number(t.rows_copied),
    bytes: Number(t.bytes_copied),
    seconds: t.seconds === null ? null : Math.round(Number(t.seconds) * 10) / 10,
    last_error: t.last_error,
    last_error_at: t.last_error_at,
    error_count: Number(t.error_count),
  }));
}

/** The state row without creating it (status is read-only). */
async function readVerify(sql: Sql, subscription: string): Promise<VerifyRead | null> {
  const [row] = await sql.unsafe<Record<string, string | null>[]>(
    `SELECT "last_lsn"::text AS lsn, "last_result" AS result, "last_differences"::text AS differences, ${iso('"last_at"')} AS at FROM "pgsub"."verify" WHERE "subscription" = $1`,
    [subscription],
  );
  if (!row) return null;
  return { lsn: row.lsn ?? null, result: row.result ?? null, differences: row.differences == null ? null : Number(row.differences), at: row.at ?? null };
}

async function readControl(sql: Sql, subscription: string): Promise<ControlRead | null> {
  const [row] = await sql.unsafe<Record<string, string | boolean | null>[]>(
    `SELECT "enabled", "disabled_reason", "skip_lsn"::text AS skip_lsn, "error_lsn"::text AS error_lsn, "error_xid"::text AS error_xid,
            "error_code", "error_conflict", "error_message", ${iso('"error_at"')} AS error_at
       FROM "pgsub"."subscription" WHERE "subscription" = $1`,
    [subscription],
  );
  if (!row) return null;
  const text = (k: string) => (row[k] === null || row[k] === undefined ? null : String(row[k]));
  return {
    enabled: row.enabled === true || row.enabled === 't',
    disabledReason: text('disabled_reason'),
    skipLsn: text('skip_lsn'),
    errorLsn: text('error_lsn'),
    errorXid: text('error_xid') === null ? null : Number(text('error_xid')),
    errorCode: text('error_code'),
    errorConflict: text('error_conflict'),
    errorMessage: text('error_message'),
    errorAt: text('error_at'),
  };
}

function side(info: ConnInfo, read: PromiseSettledResult<unknown>): SideStatus {
  if (read.status === 'fulfilled') return { host: hostPort(info), reachable: true, error: null };
  const err = read.reason;
  return { host: hostPort(info), reachable: err instanceof SideError ? err.reachable : false, error: err instanceof SideError ? err.message : reason(err) };
}

function buildReport(config: Config, sourceRead: PromiseSettledResult<SourceRead>, targetRead: PromiseSettledResult<TargetRead>): StatusReport {
  const src = sourceRead.status === 'fulfilled' ? sourceRead.value : null;
  const tgt = targetRead.status === 'fulfilled' ? targetRead.value : null;
  const origin = tgt?.origin ?? null;
  const control = tgt?.control ?? null;
  const stats = tgt?.stats ?? null;
  // Target-side counters: 0 when the target has none yet, null when it could not be read.
  const count = (n: number | undefined) => (tgt === null ? null : (n ?? 0));
  const conflicts = Object.fromEntries(CONFLICT_TYPES.map((t) => [`confl_${t}`, count(stats?.[`confl_${t}`])])) as Conflicts;
  // A recorded error is pending while the origin has not passed its transaction.
  const errorLsn = control?.errorLsn != null ? parseLsn(control.errorLsn) : null;
  return {
    subscription: config.subscription,
    slot: config.slotName,
    source: side(config.source, sourceRead),
    target: side(config.target, targetRead),
    slot_exists: src === null ? null : src.slot !== null,
    slot_active: src === null ? null : (src.slot?.active ?? false),
    slot_confirmed_flush_lsn: src?.slot?.confirmedFlushLsn != null ? formatLsn(src.slot.confirmedFlushLsn) : null,
    slot_wal_status: src?.slot?.walStatus ?? null,
    slot_safe_wal_size: src?.slot?.safeWalSize ?? null,
    slot_retained_wal_bytes: src?.slot?.restartLsn != null ? Number(src.walLsn - src.slot.restartLsn) : null,
    publisher_wal_lsn: src ? formatLsn(src.walLsn) : null,
    origin_remote_lsn: origin ? formatLsn(origin.remoteLsn) : null,
    last_commit_end_lsn: origin?.lastCommitEndLsn ?? null,
    last_commit_time: origin?.lastCommitTime ?? null,
    transactions_applied: count(origin?.transactionsApplied),
    lag_bytes: src && origin ? Number(src.walLsn > origin.remoteLsn ? src.walLsn - origin.remoteLsn : 0n) : null,
    enabled: tgt === null ? null : (control?.enabled ?? true),
    disabled_reason: control?.disabledReason ?? null,
    skip_lsn: control?.skipLsn ?? null,
    last_error_code: control?.errorCode ?? null,
    last_error_lsn: errorLsn !== null ? formatLsn(errorLsn) : null,
    last_error_xid: control?.errorXid ?? null,
    last_error_conflict: control?.errorConflict ?? null,
    last_error_message: control?.errorMessage ?? null,
    last_error_time: control?.errorAt ?? null,
    last_error_pending: tgt === null ? null : errorLsn !== null && (origin === null || origin.remoteLsn < errorLsn),
    apply_error_count: count(stats?.applyErrorCount),
    last_verify_lsn: tgt?.verify?.lsn ?? null,
    last_verify_result: tgt?.verify?.result ?? null,
    last_verify_differences: tgt?.verify?.differences ?? null,
    last_verify_time: tgt?.verify?.at ?? null,
    cut_over_lsn: tgt?.cutOver ? formatLsn(tgt.cutOver.lsn) : null,
    cut_over_at: tgt?.cutOver?.at ?? null,
    ...conflicts,
    stats_reset: stats?.statsReset ?? null,
    publications_missing: src ? src.missing : null,
    tables: tgt?.tables ?? null,
    tables_not_subscribed: src && tgt ? src.published.filter((t) => !tgt.tables.some((r) => r.table === t)) : null,
    sequences: null,
    sequences_error: null,
  };
}

/**
 * Schema drift under `drift: stop` (apply/sql/relmap.ts DriftError) as a diff and its fix,
 * read from the recorded error while it is pending.
 */
function driftLines(report: StatusReport): string[] {
  if (report.last_error_code !== 'PGSUB_SCHEMA_DRIFT' || !report.last_error_pending || !report.last_error_message) return [];
  const m = /^schema drift on "([^"]+)": the publisher sends new columns? (.*) that "([^"]+)" lacks(?: \((.*?)\))?; .*? Fix: (.*); apply resumes by itself once fixed$/.exec(
    report.last_error_message,
  );
  if (!m) return [];
  const [, source, diff, target, reason, fix] = m;
  return [
    '',
    `schema drift: ${source} → ${target} (apply stopped before the first change carrying it; resumes by itself once fixed)`,
    ...diff!.split(/, (?=\+ ")/).map((d) => `  ${d}    (on the publisher; missing on ${target}${reason ? `, ${reason}` : ''})`),
    `  fix: ${fix}`,
  ];
}

/** One `key value` line per field, then the tables with their last copy error. */
function renderText(report: StatusReport): string {
  const { tables, source, target, sequences, sequences_error, publications_missing, tables_not_subscribed, ...rest } = report;
  const sideLine = (s: SideStatus) => `${s.host} ${s.error === null ? 'reachable' : `${s.reachable ? 'could not be read' : 'UNREACHABLE'}: ${s.error}`}`;
  const lines = [`${'subscription'.padEnd(32)} ${report.subscription}`, `${'source'.padEnd(32)} ${sideLine(source)}`, `${'target'.padEnd(32)} ${sideLine(target)}`];
  for (const [k, v] of Object.entries(rest)) if (k !== 'subscription') lines.push(`${k.padEnd(32)} ${v ?? '-'}`);
  lines.push(`${'publications_missing'.padEnd(32)} ${publications_missing === null ? '-' : publications_missing.length === 0 ? 'none' : publications_missing.join(', ')}`);
  lines.push(...driftLines(report));
  if (tables_not_subscribed !== null && tables_not_subscribed.length > 0) {
    lines.push('', 'published, not part of the subscription yet (changes skipped; pgsub refresh adds them):');
    for (const t of tables_not_subscribed) lines.push(`  ${t}`);
  }
  if (tables === null) {
    lines.push('', 'tables: unknown (target not read)');
  } else if (tables.length > 0) {
    lines.push('', `${'table'.padEnd(32)} ${'state'.padEnd(13)} ${'rows'.padStart(11)} ${'bytes'.padStart(10)} ${'duration'.padStart(9)} ${'errors'.padStart(6)}`);
    for (const t of tables) {
      lines.push(
        `${t.table.slice(0, 32).padEnd(32)} ${t.state.padEnd(13)} ${String(t.rows).padStart(11)} ${formatBytes(t.bytes).padStart(10)} ${(t.seconds === null ? '-' : formatSeconds(t.seconds)).padStart(9)} ${String(t.error_count).padStart(6)}`,
      );
      if (t.last_error !== null) lines.push(`  last error (${t.last_error_at ?? 'time unknown'}): ${t.last_error}`);
    }
  }
  if (sequences_error !== null) lines.push('', `sequences: could not be read: ${sequences_error}`);
  if (sequences && sequences.length > 0) {
    lines.push('', `${'sequence'.padEnd(32)} ${'source last'.padStart(14)} ${'target next'.padStart(14)} ${'ahead by'.padStart(9)}`);
    for (const q of sequences)
      lines.push(
        `${q.sequence.slice(0, 32).padEnd(32)} ${(q.source_last_value ?? '-').padStart(14)} ${(q.target_next_value ?? '-').padStart(14)} ${String(q.ahead_by ?? '-').padStart(9)}${q.synced === false ? '  BEHIND' : ''}${q.sources.length > 1 ? `  from ${q.sources.join(', ')}` : ''}${q.reason ? `  not synced: ${q.reason}` : ''}`,
      );
  }
  return `${lines.join('\n')}\n`;
}
