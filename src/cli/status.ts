/**
 * `pgsub status`: the progress recorded in the target (pgsub.origin) beside the slot's
 * position on the publisher, and the lag between the publisher's WAL and what the target
 * holds, the conflict and apply-error counters (named as pg_stat_subscription_stats'),
 * whether the subscription is enabled, the last apply error with the finish LSN that
 * `pgsub skip --lsn` takes, and a pending skip. Read-only on both sides.
 */
import type { Config } from '../config/config.js';
import { openMaintenance } from '../apply/target.js';
import { formatLsn, parseLsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { loadOrigin } from '../origin/store.js';
import { formatBytes, formatSeconds } from '../tablesync/progress.js';
import { STATE_NAMES, type RelState } from '../tablesync/state.js';
import { loadStats, type Control, type Stats } from '../conflict/control.js';

export async function printStatus(config: Config, json: boolean): Promise<void> {
  const sql = openMaintenance(config.target, `pgsub_${config.subscription}_status`);
  const replication = await ReplicationConnection.open(config.source, `pgsub_${config.subscription}_status`);
  try {
    const hasSchema = await sql.unsafe<{ ok: boolean }[]>(`SELECT pg_catalog.to_regclass('pgsub.origin') IS NOT NULL AS ok`);
    const origin = hasSchema[0]?.ok ? await loadOrigin(sql, config.subscription) : null;
    const slot = await replication.getSlot(config.slotName);
    const [wal] = await replication.sql<{ lsn: string }>('SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn');
    const publisherLsn = parseLsn(wal!.lsn);
    const tables = hasSchema[0]?.ok
      ? await sql.unsafe<{ schema_name: string; table_name: string; state: string; sync_lsn: string | null; rows_copied: string; bytes_copied: string; seconds: string | null }[]>(
          `SELECT schema_name, table_name, state, sync_lsn::text AS sync_lsn, rows_copied::text, bytes_copied::text,
                  extract(epoch FROM COALESCE(copy_finished_at, now()) - copy_started_at)::text AS seconds
             FROM pgsub.subscription_rel WHERE subscription = $1 ORDER BY schema_name, table_name`,
          [config.subscription],
        ).catch(() => [])
      : [];
    const hasConflictSchema = hasSchema[0]?.ok
      ? (await sql.unsafe<{ ok: boolean }[]>(`SELECT pg_catalog.to_regclass('pgsub.subscription_stats') IS NOT NULL AS ok`))[0]?.ok
      : false;
    const stats: Stats | null = hasConflictSchema ? await loadStats(sql, config.subscription) : null;
    const control: Control | null = hasConflictSchema ? await readControl(sql, config.subscription) : null;
    // A recorded error is pending while the origin has not passed its transaction.
    const errorPending = control?.errorLsn != null && (origin === null || origin.remoteLsn < control.errorLsn);
    const status = {
      subscription: config.subscription,
      slot: config.slotName,
      slotExists: slot !== null,
      slotActive: slot?.active ?? false,
      slotConfirmedFlushLsn: slot?.confirmedFlushLsn != null ? formatLsn(slot.confirmedFlushLsn) : null,
      publisherWalLsn: formatLsn(publisherLsn),
      originRemoteLsn: origin ? formatLsn(origin.remoteLsn) : null,
      lastCommitEndLsn: origin?.lastCommitEndLsn ? formatLsn(origin.lastCommitEndLsn) : null,
      lastCommitTime: origin?.lastCommitTime ?? null,
      transactionsApplied: origin ? Number(origin.transactionsApplied) : 0,
      lagBytes: origin ? Number(publisherLsn > origin.remoteLsn ? publisherLsn - origin.remoteLsn : 0n) : null,
      enabled: control?.enabled ?? true,
      disabledReason: control?.disabledReason ?? null,
      skipLsn: control?.skipLsn != null ? formatLsn(control.skipLsn) : null,
      lastErrorLsn: control?.errorLsn != null ? formatLsn(control.errorLsn) : null,
      lastErrorXid: control?.errorXid ?? null,
      lastErrorConflict: control?.errorConflict ?? null,
      lastErrorMessage: control?.errorMessage ?? null,
      lastErrorTime: control?.errorAt ?? null,
      lastErrorPending: errorPending,
      apply_error_count: stats?.applyErrorCount ?? 0,
      confl_insert_exists: stats?.confl_insert_exists ?? 0,
      confl_update_origin_differs: stats?.confl_update_origin_differs ?? 0,
      confl_update_exists: stats?.confl_update_exists ?? 0,
      confl_update_missing: stats?.confl_update_missing ?? 0,
      confl_delete_origin_differs: stats?.confl_delete_origin_differs ?? 0,
      confl_delete_missing: stats?.confl_delete_missing ?? 0,
      confl_multiple_unique_conflicts: stats?.confl_multiple_unique_conflicts ?? 0,
      tables: tables.map((t) => ({
        table: `${t.schema_name}.${t.table_name}`,
        state: STATE_NAMES[t.state as RelState] ?? t.state,
        syncLsn: t.sync_lsn,
        rows: Number(t.rows_copied),
        bytes: Number(t.bytes_copied),
        seconds: t.seconds === null ? null : Math.round(Number(t.seconds) * 10) / 10,
      })),
    };
    if (json) {
      process.stdout.write(`${JSON.stringify(status, null, 2)}\n`);
    } else {
      const { tables: rels, ...rest } = status;
      for (const [k, v] of Object.entries(rest)) process.stdout.write(`${k.padEnd(24)} ${v ?? '-'}\n`);
      if (rels.length > 0) {
        process.stdout.write(`\n${'table'.padEnd(32)} ${'state'.padEnd(13)} ${'rows'.padStart(11)} ${'bytes'.padStart(10)} ${'duration'.padStart(9)}\n`);
        for (const t of rels) {
          process.stdout.write(
            `${t.table.slice(0, 32).padEnd(32)} ${t.state.padEnd(13)} ${String(t.rows).padStart(11)} ${formatBytes(t.bytes).padStart(10)} ${(t.seconds === null ? '-' : formatSeconds(t.seconds)).padStart(9)}\n`,
          );
        }
      }
    }
  } finally {
    await replication.close();
    await sql.end({ timeout: 5 });
  }
}

/** The state row without creating it (status is read-only). */
async function readControl(sql: ReturnType<typeof openMaintenance>, subscription: string): Promise<Control | null> {
  const [row] = await sql.unsafe<Record<string, string | boolean | null>[]>(
    `SELECT enabled, disabled_reason, skip_lsn::text AS skip_lsn, error_lsn::text AS error_lsn, error_xid::text AS error_xid,
            error_code, error_conflict, error_message, error_at::text AS error_at
       FROM "pgsub"."subscription" WHERE subscription = $1`,
    [subscription],
  );
  if (!row) return null;
  const text = (k: string) => (row[k] === null || row[k] === undefined ? null : String(row[k]));
  return {
    enabled: row.enabled === true || row.enabled === 't',
    disabledReason: text('disabled_reason'),
    skipLsn: text('skip_lsn') ? parseLsn(text('skip_lsn')!) : null,
    errorLsn: text('error_lsn') ? parseLsn(text('error_lsn')!) : null,
    errorXid: text('error_xid') === null ? null : Number(text('error_xid')),
    errorCode: text('error_code'),
    errorConflict: text('error_conflict'),
    errorMessage: text('error_message'),
    errorAt: text('error_at'),
  };
}
