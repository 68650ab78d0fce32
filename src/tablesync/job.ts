/**
 * One table's sync job (tablesync.c's analogue): take a snapshot consistent with a known
 * LSN from a temporary slot, record the table as datasync at that LSN, empty it in the
 * target if this is a retry (or the config asks), copy it, and record it as finishedcopy
 * at that LSN. The stream then applies exactly the transactions committing at or after it
 * (see origin/sync-state.ts). A crash anywhere before finishedcopy leaves datasync, and the next
 * attempt starts over with a new snapshot.
 *
 * A table copied whole runs on a lane (copy-lanes.ts): a walsender transaction holding a
 * snapshot shared with the other whole-table copies of the same refresh, and a target
 * connection, both reused from table to table. A large table (64 MB of heap or more, or
 * split into page ranges) gets a snapshot of its own, exported to one publisher and one
 * target connection per range.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { ApplyError, NotImplementedError, SchemaMismatchError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteIdent, quoteLiteral, quoteQualified } from '../quote.js';
import { copyTarget, type PublishedTable } from './catalog.js';
import { ROW_SECURITY_SQL, rowSecurityError, tablesParam, type RowSecurityRow } from '../apply/sql/row-security.js';
import {
  differingTargetTypes,
  openCopyClient,
  relayInto,
  sourceColumnTypes,
  splitRanges,
  stagedCopySql,
  startCopyIn,
  straightShardCopy,
  type CopyIn,
  type CopyRange,
} from './copy.js';
import { deferIndexes, restoreIndexes, type Run } from './deferred-indexes.js';
import type { LanePool } from './copy-lanes.js';
import { clearSyncProgressStatement, setStateStatement, type SyncStates, type TableSync } from '../origin/sync-state.js';

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
  /** server_version_num of the publisher (ctid range scans need 14+). */
  publisherVersion: number;
  /** The lanes of the batch this table was scheduled with. */
  lanes: LanePool;
  progress: TableProgress;
}

let slotCounter = 0;
/** Heap page size of the publisher; PostgreSQL's default build (catalog.ts's page counts assume the same). */
const PAGE_SIZE = 8192;
const WHOLE: CopyRange = { fromPage: null, toPage: null };
/** Tables of at least this much heap are copied on a snapshot of their own, not on a lane. */
const LANE_TABLE_MAX_BYTES = 64 * 1024 * 1024;

export async function syncTable(ctx: SyncJobContext, t: PublishedTable, previous: TableSync): Promise<void> {
  if (t.target?.unsupported) throw new NotImplementedError(t.target.unsupported, { relation: `${t.schema}.${t.table}` });
  // Hold feedback from before the snapshot exists: the stream must not confirm past the
  // consistent point the copy is about to get (a lower flush is ignored by the walsender).
  // For a lane the launcher held it already, before the lane's slot was created.
  ctx.states.set({ schema: t.schema, table: t.table, state: 'd', syncLsn: ZERO_LSN });
  const ranges = splitRanges(t, ctx.rangesPerTable, ctx.publisherVersion >= 140000, Math.ceil((ctx.config.syncRangeMinMb * 1024 * 1024) / PAGE_SIZE));
  if (ranges.length > 1 || t.pages * PAGE_SIZE >= LANE_TABLE_MAX_BYTES) {
    await ctx.lanes.enter(false);
    await syncOnOwnSnapshot(ctx, t, previous, ranges);
    return;
  }
  const lane = await ctx.lanes.enter(true);
  let healthy = false;
  try {
    await copyAndFinish(ctx, t, previous, lane.target, lane.syncLsn, 1, async (freeze) => [await ctx.runRange(() => copyInto(ctx, t, WHOLE, lane.source, lane.target, freeze))]);
    healthy = true;
  } finally {
    ctx.lanes.release(lane, healthy);
  }
}

/**
 * A large table, whole or in page ranges, under an exported snapshot of its own, one
 * connection pair per range. A COPY on a lane's walsender cost the publisher more CPU per
 * byte than on a plain backend (docs/design-measurements.md), so lanes are for the smaller tables, whose time
 * goes into connections and slots rather than bytes.
 */
async function syncOnOwnSnapshot(ctx: SyncJobContext, t: PublishedTable, previous: TableSync, ranges: CopyRange[]): Promise<void> {
  const { config } = ctx;
  const appName = `pgsub_${config.subscription}_sync`;
  const slotName = `pgsub_${config.subscription}_sync_${process.pid}_t${++slotCounter}`
    .slice(0, 63)
    .toLowerCase()
    .replace(/[^a-z0-9_]/g, '_');
  const replication = await ReplicationConnection.open(config.source, appName);
  let control: pg.Client | null = null;
  try {
    control = await openCopyClient(config.target, appName, 'target');
    const snapshot = await replication.createSnapshotSlot(slotName);
    await copyAndFinish(ctx, t, previous, control, snapshot.consistentPoint, ranges.length, (freeze) =>
      Promise.all(ranges.map((range) => ctx.runRange(() => copyOneRange(ctx, t, range, snapshot.snapshotName, freeze)))),
    );
  } finally {
    await control?.end().catch(() => {});
    // Closing the walsender connection drops the temporary slot.
    await replication.close();
  }
}

/**
 * Datasync at `syncLsn`, the copy (`copy`, told whether it may FREEZE; returns per range
 * whether it did), then the indexes back and finishedcopy, on the `control` connection.
 */
async function copyAndFinish(
  ctx: SyncJobContext,
  t: PublishedTable,
  previous: TableSync,
  control: pg.Client,
  syncLsn: Lsn,
  ranges: number,
  copy: (freeze: boolean) => Promise<boolean[]>,
): Promise<void> {
  const { config, log } = ctx;
  const { truncatable } = await prepareTarget(control, config, t, previous, syncLsn);
  ctx.states.set({ schema: t.schema, table: t.table, state: 'd', syncLsn });
  ctx.progress.syncLsn = syncLsn;
  log.info({ table: `${t.schema}.${t.table}`, lsn: formatLsn(syncLsn), estimatedBytes: t.estimatedBytes }, 'table copy started');

  // One COPY for the whole table may load it frozen; ranges in parallel transactions cannot.
  const frozen = await copy(config.copyFreeze && truncatable && ranges === 1);

  // Finished only with its indexes back: rebuilt and marked in one transaction.
  const indexStart = Date.now();
  const rebuilt = await inTransaction(control, async (run) => {
    const built = await restoreIndexes(run, config.subscription, copyTarget(t).schema, copyTarget(t).table);
    const done = setStateStatement(config.subscription, t, 'f', syncLsn);
    await run(done.text, [...done.params]);
    return built;
  });
  if (rebuilt.length > 0) log.info({ table: `${t.schema}.${t.table}`, indexes: rebuilt, seconds: (Date.now() - indexStart) / 1000 }, 'indexes rebuilt after the copy');
  ctx.states.set({ schema: t.schema, table: t.table, state: 'f', syncLsn });
  ctx.progress.finishedAt = Date.now();
  const seconds = (ctx.progress.finishedAt - ctx.progress.startedAt) / 1000;
  log.info(
    { table: `${t.schema}.${t.table}`, rows: ctx.progress.rows, bytes: ctx.progress.bytes, seconds, ranges, frozen: frozen.every(Boolean), lsn: formatLsn(syncLsn) },
    'table copy finished',
  );
}

/**
 * Datasync at the snapshot's LSN; the table emptied when it holds our own partial copy.
 * Returns whether the copy may empty the table again in its own transaction, to load it
 * with COPY FREEZE (copyOneRange): a plain table we may truncate, that no foreign key
 * references (TRUNCATE refuses those), with no TRUNCATE trigger that fires for pgsub's
 * replica role, and not published on the target (a cascaded subscriber would be sent the
 * TRUNCATE).
 */
async function prepareTarget(control: pg.Client, config: Config, t: PublishedTable, previous: TableSync, syncLsn: Lsn): Promise<{ truncatable: boolean }> {
  const to = copyTarget(t);
  const name = quoteQualified(to.schema, to.table);
  const target = await control.query<{ relkind: string; referenced: boolean; truncatable: boolean }>(
    `SELECT c.relkind::text AS relkind,
            EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k WHERE k.confrelid = c.oid AND k.contype = 'f') AS referenced,
            c.relkind = 'r' AND pg_catalog.has_table_privilege(c.oid, 'TRUNCATE')
              AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                               WHERE g.tgrelid = c.oid AND (g.tgtype::integer & ${TRIGGER_TYPE_TRUNCATE}) <> 0 AND g.tgenabled IN ('A', 'R'))
              AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables p WHERE p.schemaname = n.nspname AND p.tablename = c.relname) AS truncatable
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
    [to.schema, to.table],
  );
  const info = target.rows[0];
  if (!info) throw new SchemaMismatchError(`logical replication target relation "${to.schema}.${to.table}" does not exist`, { relation: `${t.schema}.${t.table}` });
  // Policies that apply to pgsub's role would make the table look empty below and hide rows from the stream's changes.
  const [applies] = (await control.query<RowSecurityRow>(ROW_SECURITY_SQL, [tablesParam([to])])).rows;
  if (applies) throw rowSecurityError(applies, { relation: `${t.schema}.${t.table}` });
  // A shard (discriminator) owns only its rows of the shared table (catalog.ts CopyTarget.discriminator).
  const disc = t.target?.discriminator;
  const own = disc ? ` WHERE ${quoteIdent(disc.column)} = ${quoteLiteral(disc.value)}` : '';
  const only = info.relkind === 'p' ? '' : 'ONLY ';
  await control.query('BEGIN');
  try {
    const firstCopy = previous.state === 'i';
    if (firstCopy && !config.truncateBeforeCopy) {
      const rows = await control.query(`SELECT 1 FROM ${only}${name}${own} LIMIT 1`);
      if (rows.rowCount && rows.rowCount > 0) {
        throw new ApplyError(
          `target table "${to.schema}.${to.table}" ${disc ? `holds rows of ${disc.column} = ${quoteLiteral(disc.value)}` : 'is not empty'}; the initial copy would duplicate rows. Empty it${disc ? ' of them' : ''}, or set truncate_before_copy: true to have pgsub empty it`,
          { relation: `${t.schema}.${t.table}` },
        );
      }
    } else {
      // A retry (our own partial copy) or an explicit request: empty it (a shard: of its own
      // rows). TRUNCATE cannot empty a table other tables reference; with replica role, DELETE skips FK checks.
      if (info.referenced || disc) await control.query(`DELETE FROM ${only}${name}${own}`);
      else await control.query(`TRUNCATE ${only}${name}`);
    }
    // Empty now: its indexes can be built once, after the rows are in (deferred-indexes.ts). Not a shared table.
    if (config.deferIndexes && info.relkind === 'r' && !disc) await deferIndexes(runOn(control), config.subscription, to.schema, to.table);
    const state = setStateStatement(config.subscription, t, 'd', syncLsn);
    await control.query(state.text, [...state.params]);
    const clear = clearSyncProgressStatement(config.subscription, t);
    await control.query(clear.text, [...clear.params]);
    await control.query(`UPDATE "pgsub"."subscription_rel" SET "rows_copied" = 0, "bytes_copied" = 0 WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`, [
      config.subscription,
      t.schema,
      t.table,
    ]);
    await control.query('COMMIT');
  } catch (err) {
    await control.query('ROLLBACK').catch(() => {});
    throw err;
  }
  return { truncatable: info.truncatable && !info.referenced && !disc };
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

/** One range on connections of its own, the publisher's importing the exported snapshot. */
async function copyOneRange(ctx: SyncJobContext, t: PublishedTable, range: CopyRange, snapshotName: string, freeze: boolean): Promise<boolean> {
  const { config } = ctx;
  const appName = `pgsub_${config.subscription}_sync`;
  const source = await openCopyClient(config.source, appName, 'source');
  let target: pg.Client | null = null;
  try {
    target = await openCopyClient(config.target, appName, 'target');
    await source.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    await source.query(`SET TRANSACTION SNAPSHOT '${snapshotName.replace(/'/g, "''")}'`);
    const frozen = await copyInto(ctx, t, range, source, target, freeze);
    await source.query('COMMIT');
    return frozen;
  } finally {
    await target?.end().catch(() => {});
    await source.end().catch(() => {});
  }
}

/**
 * Copy a range from `source` (already in the snapshot's transaction, left open) into
 * `target`, in a target transaction of its own that also counts the rows copied. Returns
 * whether the rows went in frozen.
 */
async function copyInto(ctx: SyncJobContext, published: PublishedTable, range: CopyRange, source: pg.Client, target: pg.Client, freeze: boolean): Promise<boolean> {
  const { config } = ctx;
  let t = published;
  try {
    if (t.target?.staged) {
      const straight = await straightShardCopy(source, target, t, config.binary);
      ctx.log.debug({ table: `${t.schema}.${t.table}`, copy: straight ? 'straight' : 'staged' }, 'copy shape of a mapped table');
      if (!straight) return await copyStaged(ctx, t, range, source, target);
      t = straight;
    }
    let frozen = await beginCopyTarget(target, t, freeze, ctx.log);
    let liveRows = 0;
    const onData = (n: number, r: number) => {
      ctx.progress.bytes += n;
      ctx.progress.rows += r;
      liveRows += r;
    };
    let writer: CopyIn;
    try {
      writer = await startCopyIn(target, t, { binary: config.binary, freeze: frozen });
    } catch (err) {
      // A COPY FREEZE the target refused (nothing was read on the publisher): copy plainly.
      // Any other refusal (a missing column, a syntax error) is the copy's own error.
      if (!frozen || !isFreezeRefusal(err)) throw err;
      ctx.log.info({ table: `${t.schema}.${t.table}`, reason: (err as Error).message }, 'COPY FREEZE refused; copying without it');
      await target.query('ROLLBACK');
      frozen = await beginCopyTarget(target, t, false, ctx.log);
      writer = await startCopyIn(target, t, { binary: config.binary });
    }
    const { rows, bytes } = await relayInto(writer, source, t, range, config.binary, onData);
    await commitCopy(ctx, t, target, rows, bytes, liveRows);
    return frozen;
  } catch (err) {
    await target.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

/**
 * The copy transaction's end: the rows and bytes counted with the rows themselves, then the
 * live progress (counted as the bytes streamed) set to what was committed.
 */
async function commitCopy(ctx: SyncJobContext, t: PublishedTable, target: pg.Client, rows: number, bytes: number, liveRows: number): Promise<void> {
  await target.query(
    `UPDATE "pgsub"."subscription_rel" SET "rows_copied" = "rows_copied" + $4, "bytes_copied" = "bytes_copied" + $5, "updated_at" = pg_catalog.now()
      WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`,
    [ctx.config.subscription, t.schema, t.table, String(rows), String(bytes)],
  );
  await target.query('COMMIT');
  ctx.progress.rows += rows - liveRows;
}

/**
 * A table with computed columns (copy.ts stagedCopySql): COPY into a temporary staging
 * table, then INSERT … SELECT into the target, in the one copy transaction that also
 * counts the rows, so the copy's state is recorded exactly once as for a plain COPY.
 * Never frozen (INSERT cannot load frozen rows).
 */
async function copyStaged(ctx: SyncJobContext, t: PublishedTable, range: CopyRange, source: pg.Client, target: pg.Client): Promise<boolean> {
  const { config } = ctx;
  try {
    await beginCopyTarget(target, t, false, ctx.log);
    const sourceTypes = await sourceColumnTypes(source, t);
    const sql = stagedCopySql(t, sourceTypes, await differingTargetTypes(target, t, sourceTypes), config.binary);
    await target.query(sql.create);
    const writer = await startCopyIn(target, t, { binary: config.binary, sql: sql.copyIn });
    let liveRows = 0;
    const { bytes } = await relayInto(writer, source, t, range, config.binary, (n, r) => {
      ctx.progress.bytes += n;
      ctx.progress.rows += r;
      liveRows += r;
    });
    const rows = (await target.query(sql.insert)).rowCount ?? 0;
    await commitCopy(ctx, t, target, rows, bytes, liveRows);
    return false;
  } catch (err) {
    await target.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

/** TRUNCATE trigger bit of pg_trigger.tgtype. */
const TRIGGER_TYPE_TRUNCATE = 1 << 5;
/** How long the copy waits to lock its (empty) table for TRUNCATE before it copies without FREEZE. */
const FREEZE_LOCK_TIMEOUT_MS = 1000;

/**
 * Begin the copy's target transaction. With `freeze`, empty the table in it: COPY FREEZE
 * needs a table created or truncated in its own transaction, and then writes the rows
 * frozen and (PostgreSQL 14+) their pages all-visible — no hint bits for the index build after the copy or
 * the first readers to set (and write again), no freezing for a later VACUUM. The table
 * is locked first and checked empty, so that TRUNCATE never removes rows, and the lock is
 * held to the commit, so nobody writes into it meanwhile. As with native COPY FREEZE, the
 * rows are visible to snapshots of other sessions taken before the commit (a reader of
 * the target table sees it filled rather than empty). Returns whether the table was
 * emptied here: if it cannot be (its lock is not granted within a second, TRUNCATE fails,
 * someone wrote into it), the transaction starts over and the copy runs without FREEZE.
 */
async function beginCopyTarget(target: pg.Client, t: PublishedTable, freeze: boolean, log: Logger): Promise<boolean> {
  // Explicitly: a target whose default isolation keeps a snapshot would make FREEZE fail.
  await target.query('BEGIN ISOLATION LEVEL READ COMMITTED');
  if (!freeze) return false;
  const name = `ONLY ${quoteQualified(copyTarget(t).schema, copyTarget(t).table)}`;
  try {
    await target.query(`SET LOCAL lock_timeout = ${FREEZE_LOCK_TIMEOUT_MS}`);
    await target.query(`LOCK TABLE ${name} IN ACCESS EXCLUSIVE MODE`);
    const rows = await target.query(`SELECT 1 FROM ${name} LIMIT 1`);
    if (rows.rowCount && rows.rowCount > 0) throw new Error('the table is not empty');
    await target.query(`TRUNCATE ${name}`);
    await target.query('SET LOCAL lock_timeout = DEFAULT');
    return true;
  } catch (err) {
    log.info({ table: `${t.schema}.${t.table}`, reason: (err as Error).message }, 'cannot empty the table in the copy transaction; copying without FREEZE');
    await target.query('ROLLBACK');
    await target.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    return false;
  }
}

/** COPY FREEZE's own refusals: prerequisite state (prior transaction activity, not created or truncated here) or unsupported (a partitioned or foreign table). */
function isFreezeRefusal(err: unknown): boolean {
  const e = err as { code?: string; message?: string };
  return (e.code === '55000' || e.code === '0A000') && /FREEZE/.test(e.message ?? '');
}
