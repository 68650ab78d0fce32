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

export async function printStatus(config: Config, json: boolean): Promise<void> {
  const sql = openMaintenance(config.target, `pgsub_${config.subscription}_status`);
  const replication = await ReplicationConnection.open(config.source, `pgsub_${config.subscription}_status`);
  try {
    const hasSchema = await sql.unsafe<{ ok: boolean }[]>(`SELECT pg_catalog.to_regclass('pgsub.origin') IS NOT NULL AS ok`);
    const origin = hasSchema[0]?.ok ? await loadOrigin(sql, config.subscription) : null;
    const slot = await replication.getSlot(config.slotName);
    const [wal] = await replication.sql<{ lsn: string }>('SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn');
    const publisherLsn = parseLsn(wal!.lsn);
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
    };
    if (json) {
      process.stdout.write(`${JSON.stringify(status, null, 2)}\n`);
    } else {
      for (const [k, v] of Object.entries(status)) process.stdout.write(`${k.padEnd(24)} ${v ?? '-'}\n`);
    }
  } finally {
    await replication.close();
    await sql.end({ timeout: 5 });
  }
}
