/**
 * `pgsub status`: the progress recorded in the target (pgsub.origin) beside the slot's
 * position on the publisher, and the lag between the publisher's WAL and what the target
 * holds. Read-only on both sides.
 */
import type { Config } from '../config/config.js';
import { openMaintenance } from '../apply/target.js';
import { formatLsn, parseLsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { loadOrigin } from '../origin/store.js';
import { formatBytes, formatSeconds } from '../tablesync/progress.js';
import { STATE_NAMES, type RelState } from '../tablesync/state.js';

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
