/**
 * `pgsub drop`: DROP SUBSCRIPTION for pgsub. Removes the publisher's slot (unless
 * --keep-slot, like `slot_name = NONE`), then everything pgsub keeps for the subscription in
 * the target — its rows in the pgsub schema and its replication origin `pgsub_<name>` — and
 * its spool files. The slot goes first: a target that still holds progress without its
 * slot refuses to start (PGSUB_SOURCE_SETUP), while a slot without progress would be
 * streamed from as if new. A slot in use (pgsub still running) is refused. Each step is
 * idempotent, so a drop cut short can simply be run again. The roles' privileges on both
 * sides are checked first (migrate/privileges.ts), so a refusal leaves everything in place.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Config } from '../config/config.js';
import { ControlError } from '../errors.js';
import { checkDropPrivileges } from '../migrate/privileges.js';
import { openMaintenance } from '../pgwire/connect.js';
import { replicationOriginName } from '../origin/replorigin.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteLiteral } from '../quote.js';
import { restoreIndexes, runOnSql, tablesWithDeferredIndexes } from '../tablesync/deferred-indexes.js';

/** pgsub's tables with a row (or rows) per subscription, children before parents. */
const SUBSCRIPTION_TABLES = [
  'cutover',
  'relation_columns',
  'deferred_index',
  'sync_progress',
  'subscription_rel',
  'prepared',
  'conflict_log',
  'subscription_stats',
  'subscription',
  'origin',
];

export interface DropReport {
  slot: 'dropped' | 'absent' | 'kept';
  rows: number;
  origin: 'dropped' | 'absent';
  spoolFiles: number;
  preparedLeft: string[];
}

export async function dropSubscription(config: Config, opts: { keepSlot: boolean }): Promise<DropReport> {
  await checkDropPrivileges(config, opts);
  const appName = `pgsub_${config.subscription}_cli`;
  let slot: DropReport['slot'] = 'kept';
  if (!opts.keepSlot) {
    const replication = await ReplicationConnection.open(config.source, appName);
    try {
      const rows = await replication.sql<{ active_pid: number | null }>(
        `SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = ${quoteLiteral(config.slotName)}`,
      );
      if (rows.length === 0) slot = 'absent';
      else if (rows[0]!.active_pid !== null) {
        throw new ControlError(`replication slot "${config.slotName}" is in use by walsender PID ${rows[0]!.active_pid}; stop pgsub (or whatever streams from it) first`, {
          slot: config.slotName,
        });
      } else {
        await replication.sql(`SELECT pg_catalog.pg_drop_replication_slot(${quoteLiteral(config.slotName)})`);
        slot = 'dropped';
      }
    } finally {
      await replication.close();
    }
  }
  const sql = openMaintenance(config.target, appName);
  let rows = 0;
  let origin: DropReport['origin'] = 'absent';
  let preparedLeft: string[] = [];
  try {
    const originName = replicationOriginName(config.subscription);
    const existing = new Set(
      (
        await sql.unsafe<{ name: string }[]>(
          `SELECT c.relname AS name FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgsub' AND c.relkind = 'r'`,
        )
      ).map((r) => r.name),
    );
    // Transactions prepared on the target for this subscription stay (their data is the user's); report them.
    preparedLeft = (
      await sql.unsafe<{ gid: string }[]>(`SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE gid LIKE $1`, [`pgsub\\_${config.subscription.replace(/[_%\\]/g, '\\$&')}\\_%`])
    ).map((r) => r.gid);
    if (existing.has('deferred_index')) {
      // Indexes a copy cut short left dropped go back first (tablesync/deferred-indexes.ts).
      for (const t of await tablesWithDeferredIndexes(runOnSql(sql), config.subscription)) {
        await sql.begin((tx) => restoreIndexes(runOnSql(tx), config.subscription, t.schema, t.table));
      }
    }
    await sql.begin(async (tx) => {
      for (const table of SUBSCRIPTION_TABLES) {
        if (!existing.has(table)) continue;
        const result = await tx.unsafe(`DELETE FROM "pgsub".${`"${table}"`} WHERE "subscription" = $1`, [config.subscription]);
        rows += result.count;
      }
    });
    const dropped = await sql.unsafe<{ dropped: boolean }[]>(
      `SELECT pg_catalog.pg_replication_origin_drop($1) IS NULL AS dropped FROM (SELECT 1) s WHERE pg_catalog.pg_replication_origin_oid($1) IS NOT NULL`,
      [originName],
    );
    if (dropped.length > 0) origin = 'dropped';
  } finally {
    await sql.end({ timeout: 5 });
  }
  let spoolFiles = 0;
  if (fs.existsSync(config.spoolDir)) {
    const ours = new RegExp(`^${config.subscription.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}-\\d+\\.changes$`);
    for (const name of fs.readdirSync(config.spoolDir)) {
      if (!ours.test(name)) continue;
      fs.rmSync(path.join(config.spoolDir, name), { force: true });
      spoolFiles++;
    }
  }
  return { slot, rows, origin, spoolFiles, preparedLeft };
}
