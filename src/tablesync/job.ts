/**
 * One table's sync job (tablesync.c's analogue): take a snapshot consistent with a known
 * LSN from a temporary slot, record the table as datasync at that LSN, empty it in the
 * target if this is a retry (or the config asks), copy it — in page ranges on parallel
 * connections when it is large, all importing the same snapshot — and record it as
 * finishedcopy at that LSN. The stream then applies exactly the transactions committing
 * at or after it (see state.ts). A crash anywhere before finishedcopy leaves datasync,
 * and the next attempt starts over with a new snapshot.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { ApplyError, SchemaMismatchError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteQualified } from '../quote.js';
import type { PublishedTable } from './catalog.js';
import { copyRange, openCopyClient, splitRanges, type CopyRange } from './copy.js';
import { deferIndexes, restoreIndexes, type Run } from './deferred-indexes.js';
import { clearSyncProgressStatement, setStateStatement, type SyncStates, type TableSync } from './state.js';

export interface TableProgress {
  schema: string;
  table: string;
  rows: number;
  bytes: number;
  estimatedBytes: number;
  startedAt: number;
  finishedAt: number | null;
  syncLsn: Lsn | null;
}

export interface SyncJobContext {
  config: Config;
  log: Logger;
  states: SyncStates;
  /** Runs a range copy under the shared limit of parallel COPY streams. */
  runRange<T>(task: () => Promise<T>): Promise<T>;
  /** Parallel ranges for one large table. */
  rangesPerTable: number;
  progress: TableProgress;
}

let slotCounter = 0;
/** Heap page size of the publisher; PostgreSQL's default build (catalog.ts's page counts assume the same). */
const PAGE_SIZE = 8192;

export async function syncTable(ctx: SyncJobContext, t: PublishedTable, previous: TableSync): Promise<void> {
  const { config, log } = ctx;
  const appName = `pgsub_${config.subscription}_sync`;
  const slotName = `pgsub_${config.subscription}_sync_${process.pid}_${++slotCounter}`.slice(0, 63).toLowerCase().replace(/[^a-z0-9_]/g, '_');
  const replication = await ReplicationConnection.open(config.source, appName);
  let control: pg.Client | null = null;
  try {
    control = await openCopyClient(config.target, appName, 'target');
    // Hold feedback from before the snapshot exists: the stream must not confirm past the
    // consistent point this slot is about to get (a lower flush is ignored by the walsender).
    ctx.states.set({ schema: t.schema, table: t.table, state: 'd', syncLsn: ZERO_LSN });
    const snapshot = await replication.createSnapshotSlot(slotName);
    const syncLsn = snapshot.consistentPoint;
    await prepareTarget(control, config, t, previous, syncLsn);
    ctx.states.set({ schema: t.schema, table: t.table, state: 'd', syncLsn });
    ctx.progress.syncLsn = syncLsn;
    log.info({ table: `${t.schema}.${t.table}`, lsn: formatLsn(syncLsn), estimatedBytes: t.estimatedBytes }, 'table copy started');

    const ranges = splitRanges(t, ctx.rangesPerTable, replication.serverVersionNum >= 140000, Math.ceil((config.syncRangeMinMb * 1024 * 1024) / PAGE_SIZE));
    await Promise.all(ranges.map((range) => ctx.runRange(() => copyOneRange(ctx, t, range, snapshot.snapshotName))));

    // Finished only with its indexes back: rebuilt and marked in one transaction.
    const indexStart = Date.now();
    const rebuilt = await inTransaction(control, async (run) => {
      const built = await restoreIndexes(run, config.subscription, t.schema, t.table);
      const done = setStateStatement(config.subscription, t, 'f', syncLsn);
      await run(done.text, done.params);
      return built;
    });
    if (rebuilt.length > 0) log.info({ table: `${t.schema}.${t.table}`, indexes: rebuilt, seconds: (Date.now() - indexStart) / 1000 }, 'indexes rebuilt after the copy');
    ctx.states.set({ schema: t.schema, table: t.table, state: 'f', syncLsn });
    ctx.progress.finishedAt = Date.now();
    const seconds = (ctx.progress.finishedAt - ctx.progress.startedAt) / 1000;
    log.info(
      { table: `${t.schema}.${t.table}`, rows: ctx.progress.rows, bytes: ctx.progress.bytes, seconds, ranges: ranges.length, lsn: formatLsn(syncLsn) },
      'table copy finished',
    );
  } finally {
    await control?.end().catch(() => {});
    // Closing the walsender connection drops the temporary slot.
    await replication.close();
  }
}

/** Datasync at the snapshot's LSN; the table emptied when it holds our own partial copy. */
async function prepareTarget(control: pg.Client, config: Config, t: PublishedTable, previous: TableSync, syncLsn: Lsn): Promise<void> {
  const name = quoteQualified(t.schema, t.table);
  const target = await control.query<{ relkind: string; referenced: boolean }>(
    `SELECT c.relkind::text AS relkind,
            EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k WHERE k.confrelid = c.oid AND k.contype = 'f') AS referenced
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
    [t.schema, t.table],
  );
  const info = target.rows[0];
  if (!info) throw new SchemaMismatchError(`logical replication target relation "${t.schema}.${t.table}" does not exist`, { relation: `${t.schema}.${t.table}` });
  await control.query('BEGIN');
  try {
    const firstCopy = previous.state === 'i';
    if (firstCopy && !config.truncateBeforeCopy) {
      const rows = await control.query(`SELECT 1 FROM ${info.relkind === 'p' ? '' : 'ONLY '}${name} LIMIT 1`);
      if (rows.rowCount && rows.rowCount > 0) {
        throw new ApplyError(
          `target table "${t.schema}.${t.table}" is not empty; the initial copy would duplicate rows. Empty it, or set truncate_before_copy: true to have pgsub empty it`,
          { relation: `${t.schema}.${t.table}` },
        );
      }
    } else {
      // A retry (our own partial copy) or an explicit request: empty it. TRUNCATE cannot
      // empty a table other tables reference; with replica role, DELETE skips FK checks.
      if (info.referenced) await control.query(`DELETE FROM ${info.relkind === 'p' ? '' : 'ONLY '}${name}`);
      else await control.query(`TRUNCATE ${info.relkind === 'p' ? '' : 'ONLY '}${name}`);
    }
    // Empty now: its indexes can be built once, after the rows are in (deferred-indexes.ts).
    if (config.deferIndexes && info.relkind === 'r') await deferIndexes(runOn(control), config.subscription, t.schema, t.table);
    const state = setStateStatement(config.subscription, t, 'd', syncLsn);
    await control.query(state.text, state.params);
    const clear = clearSyncProgressStatement(config.subscription, t);
    await control.query(clear.text, clear.params);
    await control.query(`UPDATE "pgsub"."subscription_rel" SET "rows_copied" = 0, "bytes_copied" = 0 WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`, [config.subscription, t.schema, t.table]);
    await control.query('COMMIT');
  } catch (err) {
    await control.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

const runOn =
  (client: pg.Client): Run =>
  async (text, params) =>
    (await client.query(text, params)).rows as Record<string, unknown>[];

async function inTransaction<T>(client: pg.Client, body: (run: Run) => Promise<T>): Promise<T> {
  await client.query('BEGIN');
  try {
    const result = await body(runOn(client));
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

async function copyOneRange(ctx: SyncJobContext, t: PublishedTable, range: CopyRange, snapshotName: string): Promise<void> {
  const { config } = ctx;
  const appName = `pgsub_${config.subscription}_sync`;
  const source = await openCopyClient(config.source, appName, 'source');
  let target: pg.Client | null = null;
  try {
    target = await openCopyClient(config.target, appName, 'target');
    await source.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    await source.query(`SET TRANSACTION SNAPSHOT '${snapshotName.replace(/'/g, "''")}'`);
    await target.query('BEGIN');
    let liveRows = 0;
    const { rows, bytes } = await copyRange(source, target, t, range, config.binary, (n, r) => {
      ctx.progress.bytes += n;
      ctx.progress.rows += r;
      liveRows += r;
    });
    await target.query(
      `UPDATE "pgsub"."subscription_rel" SET "rows_copied" = "rows_copied" + $4, "bytes_copied" = "bytes_copied" + $5, "updated_at" = pg_catalog.now()
        WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`,
      [config.subscription, t.schema, t.table, String(rows), String(bytes)],
    );
    await target.query('COMMIT');
    ctx.progress.rows += rows - liveRows;
    await source.query('COMMIT');
  } catch (err) {
    await target?.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    await target?.end().catch(() => {});
    await source.end().catch(() => {});
  }
}
