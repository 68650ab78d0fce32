/**
 * The table-sync launcher (launcher.c + the sync half of tablesync.c): keeps
 * pgsub.subscription_rel in step with what the publications publish, and runs sync
 * jobs for tables that need a copy — several tables at once and large tables in ranges,
 * under one limit of parallel COPY streams (p-queue). A refresh (ALTER SUBSCRIPTION …
 * REFRESH PUBLICATION) registers the tables published since the last one and drops those
 * no longer published; it runs only on demand (`pgsub refresh`), every `refresh_interval`
 * (0: never by itself), and at a process start whose `publication` list differs from the
 * one recorded at the last refresh (ADD/DROP/SET PUBLICATION). A table published but not
 * registered is not part of the subscription: its changes are skipped (sync-state.ts).
 * Every session start resumes the copies due without registering anything; `resync`
 * copies one table again while the others keep streaming. A copy that fails is that
 * table's error (last_error, sync error count), retried with backoff, and holds nothing
 * back: the other tables stream and the slot is confirmed for them.
 * It tells the runner when a finished copy needs the stream to re-deliver what that table
 * missed (origin/sync-state.ts), which publications exist (the stream is given only those),
 * and holds the live progress shown by status and the terminal.
 */
import PQueue from 'p-queue';
import type { Config } from '../config/config.js';
import { ConfigError } from '../errors.js';
import { redactSecrets } from '../config/conninfo.js';
import { Backoff } from '../backoff.js';
import type { Logger } from '../log.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import { parseLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';
import { existingPublications, listPublishedTables, mapTable, type PublishedTable } from './catalog.js';
import { ruleFor } from '../mapping/rules.js';
import { restoreIndexes, runOnSql } from './deferred-indexes.js';
import { syncTable, type TableProgress } from './job.js';
import { LanePool, openLane } from './copy-lanes.js';
import { rowToSync, type SyncStates, type TableSync } from '../origin/sync-state.js';

export interface LauncherEvents {
  /** A table finished its copy; the stream must start from its position. */
  onCopyFinished?(table: TableSync): void;
  /** No copy is running or waiting. */
  onIdle?(): void;
  /** `pgsub skip` set a skip LSN (the service takes it at its next remote transaction). */
  onSkipRequested?(): void;
  /**
   * A refresh found these of the configured publications existing (the stream must carry
   * exactly these), with the publisher's WAL position then: every one of them was created
   * before it.
   */
  onPublications?(existing: readonly string[], seenAt: Lsn): void;
}

export class Launcher {
  private readonly tableQueue: PQueue;
  private readonly rangeQueue: PQueue;
  private readonly sql: Sql;
  private readonly running = new Set<string>();
  private readonly published = new Map<string, PublishedTable>();
  readonly progress = new Map<string, TableProgress>();
  private timer: NodeJS.Timeout | null = null;
  private refreshing: Promise<void> | null = null;
  /** The refresh under way registers tables (not only a session start's resume). */
  private refreshingRegisters = false;
  /** Configured publications missing on the publisher, as of the last look (warned once per change). */
  private missing: string[] = [];
  private stopped = false;
  /** The wait before a failed copy is tried again; starts over after a copy that finished. */
  private readonly copyBackoff: Backoff;
  /** server_version_num of the publisher, as of the last refresh. */
  private publisherVersion = 0;
  /** Lane pools of batches that still have tables to start. */
  private readonly lanePools = new Set<LanePool>();
  /** Copies that failed in this process (pg_stat_subscription_stats.sync_table_error_count, sync_error_count before PostgreSQL 19). */
  syncErrors = 0;
  /** Tables already warned about for their replica identity. */
  private readonly warned = new Set<string>();
  /** Tables not copied, and why (logged once). */
  private readonly refused = new Map<string, string>();

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly states: SyncStates,
    private readonly events: LauncherEvents = {},
  ) {
    this.tableQueue = new PQueue({ concurrency: config.maxSyncWorkers });
    this.rangeQueue = new PQueue({ concurrency: config.maxSyncWorkers });
    this.sql = openMaintenance(config.target, `pgsub_${config.subscription}_launcher`);
    this.tableQueue.on('idle', () => this.events.onIdle?.());
    this.copyBackoff = new Backoff(config.retryMinDelayMs, config.retryMaxDelayMs);
  }

  /** Opens the launcher's target session ahead of its first use (load); a failure is load's to report. */
  connect(): void {
    this.sql.unsafe('SELECT 1').catch(() => {});
  }

  /** Load the states from the target. */
  async load(): Promise<void> {
    // A running copy's in-memory state (its feedback hold) and anything set while this
    // read is in flight are newer than what the read returns: keep them.
    const since = this.states.stamp;
    const runningBefore = new Set(this.running);
    const rows = await this.sql.unsafe<{ schema_name: string; table_name: string; state: string; sync_lsn: string | null }[]>(
      `SELECT r.schema_name, r.table_name, r.state,
              GREATEST(r.sync_lsn, (SELECT p.lsn FROM "pgsub"."sync_progress" p
                                     WHERE p.subscription = r.subscription AND p.schema_name = r.schema_name AND p.table_name = r.table_name
                                     ORDER BY p.lsn DESC LIMIT 1))::text AS sync_lsn
         FROM "pgsub"."subscription_rel" r WHERE r.subscription = $1`,
      [this.config.subscription],
    );
    const keep = (schema: string, table: string) => runningBefore.has(`${schema}.${table}`) || this.running.has(`${schema}.${table}`);
    const waiting = new Set(
      this.states
        .all()
        .filter((t) => t.state === 'i')
        .map((t) => `${t.schema}.${t.table}`),
    );
    // A datasync row whose copy is not running here (a crash, a failed attempt) holds
    // nothing: its next attempt starts over from a new snapshot (sync-state.ts heldLsn).
    const loaded = rows.map(rowToSync).map((t) => (t.state === 'd' && !keep(t.schema, t.table) ? { ...t, syncLsn: null } : t));
    this.states.load(loaded, { since, keep });
    const taken = this.states.all().filter((t) => t.state === 'r' && waiting.has(`${t.schema}.${t.table}`));
    if (taken.length > 0) this.log.info({ tables: taken.map((t) => `${t.schema}.${t.table}`) }, 'tables applied from now on without a copy (pgsub refresh --no-copy)');
  }

  /**
   * Periodic refresh (none with refresh_interval 0), and on demand: `pgsub refresh` NOTIFYs
   * this channel to refresh, `pgsub resync` to start the copy it marked (no registration).
   */
  startPeriodicRefresh(): void {
    const failed = (err: unknown) => this.log.warn({ err }, 'publication refresh failed');
    const refresh = () => void this.refresh().catch(failed);
    if (this.config.refreshIntervalMs > 0) {
      this.timer = setInterval(refresh, this.config.refreshIntervalMs);
      this.timer.unref();
    }
    this.sql
      .listen(notifyChannel(this.config.subscription), (payload) => {
        if (payload === 'skip') return this.events.onSkipRequested?.();
        this.log.info({ request: payload }, 'refresh requested');
        if (payload.startsWith('resync ')) void this.resume().catch(failed);
        else refresh();
      })
      .catch((err) => this.log.warn({ err }, 'cannot listen for refresh requests; periodic refresh only'));
  }

  /** Sync the table list with the publications and start copies that are due (REFRESH PUBLICATION). Coalesced. */
  refresh(): Promise<void> {
    return this.run(true);
  }

  /** Start the copies that are due, registering nothing (a copy's retry, a resync). */
  resume(): Promise<void> {
    return this.run(false);
  }

  /**
   * At the process's first session, whether a refresh is due: the configured publications
   * differ from those recorded at the last refresh (or none is recorded: a new subscription,
   * or one from before the record), as CREATE SUBSCRIPTION and ALTER SUBSCRIPTION …
   * ADD/DROP/SET PUBLICATION (refresh = true) refresh; otherwise a start only resumes.
   */
  async refreshDueAtStart(): Promise<boolean> {
    // As JSON: the maintenance connection does not parse arrays.
    const [row] = await this.sql.unsafe<{ publications: string | null }[]>(
      `SELECT pg_catalog.to_json("publications")::text AS publications FROM "pgsub"."origin" WHERE "subscription" = $1`,
      [this.config.subscription],
    );
    const recorded = row?.publications ? (JSON.parse(row.publications) as string[]) : null;
    const configured = [...this.config.publications];
    if (recorded !== null && sameSet(recorded, configured)) return false;
    if (recorded !== null) {
      this.log.info(
        { was: recorded, now: configured, added: configured.filter((p) => !recorded.includes(p)), dropped: recorded.filter((p) => !configured.includes(p)) },
        'publications changed since the last refresh; refreshing (as ALTER SUBSCRIPTION … SET PUBLICATION)',
      );
    }
    return true;
  }

  /** A session start's refresh (`register`) or resume, reading the publisher through the session's connection. */
  atSessionStart(register: boolean, publisher: ReplicationConnection): Promise<void> {
    return this.run(register, publisher);
  }

  /**
   * One refresh or resume at a time; a refresh asked for during a resume runs after it.
   * `publisher`: a connection of the caller's to read the publications through (a session
   * start lends its replication connection before START_REPLICATION: one login less).
   */
  private run(register: boolean, publisher?: ReplicationConnection): Promise<void> {
    if (this.refreshing && (this.refreshingRegisters || !register)) return this.refreshing;
    const before = this.refreshing ?? Promise.resolve();
    const next: Promise<void> = before
      .catch(() => {})
      .then(() => this.doRefresh(register, publisher))
      .finally(() => {
        if (this.refreshing === next) this.refreshing = null;
      });
    this.refreshing = next;
    this.refreshingRegisters = register;
    return next;
  }

  private async doRefresh(register: boolean, publisher?: ReplicationConnection): Promise<void> {
    const replication = publisher ?? (await ReplicationConnection.open(this.config.source, `pgsub_${this.config.subscription}_refresh`));
    let existing: string[];
    let seenAt: Lsn;
    let tables: PublishedTable[] = [];
    let twoPhaseEnabled = false;
    try {
      const [wal] = await replication.sql<{ lsn: string }>('SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn');
      seenAt = parseLsn(wal!.lsn);
      existing = await existingPublications(replication, this.config.publications);
      // A resume lists the published tables only for copies due: the listing (sizes, column
      // lists, row filters of every table) is a start's slowest publisher query, and a copy
      // that becomes due later comes through here again and lists them then.
      if (!register) await this.load();
      if (register || this.states.copying().length > 0) {
        tables = await this.listPublished(replication);
        if (this.config.twoPhase) twoPhaseEnabled = (await replication.getSlot(this.config.slotName))?.twoPhase ?? false;
      }
    } finally {
      if (replication !== publisher) await replication.close();
    }
    this.notePublications(existing, seenAt);
    // None exists (dropped, or not created yet): a setup problem, not a reason to drop every table.
    if (register && existing.length > 0) await this.register(tables);
    if (register) await this.load();
    // Largest first: the last table to start should be a short one, not the one that
    // decides when the whole copy ends.
    const size = (t: TableSync) => this.published.get(`${t.schema}.${t.table}`)?.estimatedBytes ?? 0;
    const due = this.states.copying().filter((t) => this.published.has(`${t.schema}.${t.table}`) && !this.running.has(`${t.schema}.${t.table}`));
    if (due.length === 0 || this.stopped) return;
    if (twoPhaseEnabled) {
      // As native refuses REFRESH PUBLICATION with copy_data once two_phase is enabled: a
      // transaction prepared while a table is copied would be prepared without that table's
      // changes, and COMMIT PREPARED would commit it so (worker.c, "TWO_PHASE TRANSACTIONS").
      for (const t of due) await this.refuseCopy(t, TWO_PHASE_REFUSAL);
      return;
    }
    // Feedback held for every table of the batch before any of its lanes takes a snapshot
    // (copy-lanes.ts), then the batch shares them.
    for (const t of due) this.states.set({ schema: t.schema, table: t.table, state: 'd', syncLsn: ZERO_LSN });
    const lanes = new LanePool(() => openLane(this.config, `pgsub_${this.config.subscription}_sync`), due.length);
    this.lanePools.add(lanes);
    for (const t of due.sort((a, b) => size(b) - size(a))) this.schedule(t, lanes);
  }

  /** What the publications publish now, mapped (the copies' sizes, columns and filters), kept for the copies. */
  private async listPublished(replication: ReplicationConnection): Promise<PublishedTable[]> {
    const tables = (await listPublishedTables(replication, this.config.publications)).map((t) => mapTable(t, ruleFor(this.config.mapping, t.schema, t.table)));
    this.publisherVersion = replication.serverVersionNum;
    this.published.clear();
    for (const t of tables) this.published.set(`${t.schema}.${t.table}`, t);
    return tables;
  }

  /**
   * A missing publication is a warning naming it (PostgreSQL 18's pgoutput skips it so),
   * again whenever the set changes; the runner is told which exist, to stream exactly those.
   */
  private notePublications(existing: string[], seenAt: Lsn): void {
    const missing = this.config.publications.filter((p) => !existing.includes(p));
    if (!sameSet(missing, this.missing)) {
      const found = this.missing.filter((p) => !missing.includes(p));
      if (found.length > 0) this.log.info({ publications: found }, 'publication now exists on the publisher; its tables are registered at this refresh');
      if (missing.length > 0)
        this.log.warn(
          { publications: missing, side: 'source' },
          `publication${missing.length > 1 ? 's' : ''} ${missing.map((m) => `"${m}"`).join(', ')} not found on the publisher; replicating the others, and looking again at each refresh`,
        );
    }
    this.missing = missing;
    this.events.onPublications?.(existing, seenAt);
  }

  /** The refresh proper: new tables registered (each logged with its copy), tables no longer published dropped, the publications recorded. */
  private async register(tables: PublishedTable[]): Promise<void> {
    const initial = this.config.copyData ? 'i' : 'r';
    await this.warnAboutIdentities(tables);
    const added: string[] = [];
    await this.sql.begin(async (tx) => {
      for (const t of tables) {
        const rows = await tx.unsafe(
          `INSERT INTO "pgsub"."subscription_rel" (subscription, schema_name, table_name, state, ready_at)
           VALUES ($1, $2, $3, $4::text, CASE WHEN $4::text = 'r' THEN now() END) ON CONFLICT DO NOTHING RETURNING 1`,
          [this.config.subscription, t.schema, t.table, initial],
        );
        if (rows.length > 0) added.push(`${t.schema}.${t.table}`);
      }
      // Tables no longer published stop being applied (native: ALTER SUBSCRIPTION … REFRESH).
      const keep = tables.map((t) => `${t.schema}.${t.table}`);
      const removed = await tx.unsafe<{ schema_name: string; table_name: string }[]>(
        `DELETE FROM "pgsub"."subscription_rel" WHERE subscription = $1 AND NOT (schema_name || '.' || table_name = ANY($2::text[])) RETURNING schema_name, table_name`,
        [this.config.subscription, textArray(keep)],
      );
      for (const r of removed) {
        // A copy cut short may have left its indexes dropped; the table is the user's again.
        await restoreIndexes(runOnSql(tx), this.config.subscription, r.schema_name, r.table_name);
        this.log.info({ table: `${r.schema_name}.${r.table_name}` }, 'table no longer published; not applied any more');
      }
      // What the next process start compares its publication list with (refreshDueAtStart).
      await tx.unsafe(`UPDATE "pgsub"."origin" SET "publications" = $2::text[] WHERE "subscription" = $1`, [this.config.subscription, textArray([...this.config.publications])]);
    });
    for (const table of added) {
      if (this.config.copyData) this.log.info({ table, copy: true }, 'table added to the subscription; its copy starts');
      else this.log.info({ table, copy: false }, 'table added to the subscription without a copy (copy_data = false); applied from now on');
    }
  }

  /** Copy one table again from a fresh snapshot, while everything else keeps streaming. */
  async resync(schema: string, table: string): Promise<void> {
    if (!(await requestRefresh(this.sql, this.config.subscription, { schema, table }))) {
      throw new ConfigError(`table ${schema}.${table} is not part of subscription ${this.config.subscription}`, { relation: `${schema}.${table}` });
    }
    await this.resume();
  }

  private schedule(t: TableSync, lanes: LanePool): void {
    const k = `${t.schema}.${t.table}`;
    const published = this.published.get(k)!;
    this.running.add(k);
    const progress: TableProgress = {
      schema: t.schema,
      table: t.table,
      rows: 0,
      bytes: 0,
      estimatedBytes: published.estimatedBytes,
      startedAt: Date.now(),
      finishedAt: null,
      syncLsn: null,
    };
    this.progress.set(k, progress);
    void this.tableQueue.add(async () => {
      try {
        if (this.stopped) {
          await lanes.enter(false);
          return;
        }
        progress.startedAt = Date.now();
        await syncTable(
          {
            config: this.config,
            log: this.log,
            states: this.states,
            rangesPerTable: this.config.maxSyncWorkers,
            runRange: (task) => this.rangeQueue.add(task, { throwOnTimeout: true }) as Promise<never>,
            publisherVersion: this.publisherVersion,
            lanes,
            progress,
          },
          published,
          t,
        );
        this.copyBackoff.reset();
        const done = this.states.get(t.schema, t.table);
        if (done) this.events.onCopyFinished?.(done);
      } catch (err) {
        this.syncErrors++;
        const message = redactSecrets(String((err as Error).message));
        // Retry with backoff (jittered, backoff.ts); the table stays in init/datasync and is picked up again.
        const delay = this.copyBackoff.next();
        // Logged here only: the copy's failure is handled here (the apply session goes on).
        this.log.error({ table: k, err, retryInMs: delay }, 'table copy failed; will retry');
        await this.recordError(t, message);
        // That table's error only: its hold on the feedback (set for its snapshot) ends
        // here, so the others' positions are confirmed while it waits for its retry.
        this.states.set({ schema: t.schema, table: t.table, state: t.state, syncLsn: null });
        setTimeout(() => {
          if (!this.stopped) void this.resume().catch(() => {});
        }, delay).unref();
      } finally {
        this.running.delete(k);
        if (!lanes.active) this.lanePools.delete(lanes);
      }
    });
  }

  /**
   * Published tables whose UPDATE/DELETE cannot be replicated — the publisher refuses them
   * without a replica identity — or will be slow: REPLICA IDENTITY FULL locates each row by
   * all its columns, a scan of the whole target table unless it has an index. Logged once.
   */
  private async warnAboutIdentities(tables: PublishedTable[]): Promise<void> {
    const full: PublishedTable[] = [];
    for (const t of tables) {
      if (!t.publishesUpdates) continue;
      const k = `${t.schema}.${t.table}`;
      if (t.replicaIdentity === 'n' || (t.replicaIdentity === 'd' && !t.hasPrimaryKey)) {
        if (this.warned.has(k)) continue;
        this.warned.add(k);
        this.log.warn(
          { table: k, side: 'source' },
          `UPDATE and DELETE on ${k} cannot be replicated: it has no replica identity, so the publisher refuses them once published. Add a primary key, or ALTER TABLE ... REPLICA IDENTITY USING INDEX / FULL`,
        );
      } else if (t.replicaIdentity === 'f') full.push(t);
    }
    const unwarned = full.filter((t) => !this.warned.has(`${t.schema}.${t.table}`));
    if (unwarned.length === 0) return;
    const indexed = await this.sql
      .unsafe<{ schema_name: string; table_name: string }[]>(
        `SELECT n.nspname AS schema_name, c.relname AS table_name FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE pg_catalog.format('%s.%s', n.nspname, c.relname) = ANY ($1::text[])
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid)`,
        [textArray(unwarned.map((t) => `${t.schema}.${t.table}`))],
      )
      .catch((err: unknown) => {
        this.log.debug({ err }, 'cannot look up target indexes');
        return null;
      });
    if (indexed === null) return;
    const has = new Set(indexed.map((r) => `${r.schema_name}.${r.table_name}`));
    for (const t of unwarned) {
      const k = `${t.schema}.${t.table}`;
      this.warned.add(k);
      if (!has.has(k)) {
        this.log.warn(
          { table: k, side: 'target' },
          `${k} has REPLICA IDENTITY FULL and no index on the target: each replicated UPDATE and DELETE scans the whole target table. Add an index on the target (a primary key or unique index on the source is better)`,
        );
      }
    }
  }

  /** Why a table is not copied (status shows it); logged once per table and reason. */
  private async refuseCopy(t: TableSync, reason: string): Promise<void> {
    const k = `${t.schema}.${t.table}`;
    if (this.refused.get(k) !== reason) this.log.error({ table: k }, reason);
    this.refused.set(k, reason);
    await this.recordError(t, reason);
  }

  /** The copy's last failure in subscription_rel (pgsub status); the copy's end clears it. */
  private async recordError(t: TableSync, message: string): Promise<void> {
    await this.sql
      .unsafe(
        `UPDATE "pgsub"."subscription_rel" SET last_error = $4, last_error_at = now(), error_count = error_count + 1
          WHERE subscription = $1 AND schema_name = $2 AND table_name = $3`,
        [this.config.subscription, t.schema, t.table, message],
      )
      .catch((err: unknown) => this.log.debug({ err }, 'cannot record the copy error in the target'));
  }

  /** Resolves when no copy is running or waiting. */
  async idle(): Promise<void> {
    await this.tableQueue.onIdle();
  }

  get busy(): boolean {
    return this.running.size > 0;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.tableQueue.clear();
    this.rangeQueue.clear();
    for (const lanes of this.lanePools) lanes.close();
    this.lanePools.clear();
    await this.sql.end({ timeout: 5 }).catch(() => {});
  }
}

export const TWO_PHASE_REFUSAL =
  "not copied: two_phase is enabled on the slot, and a transaction prepared during the copy would lack this table's changes. Mark the table copied by hand with pgsub refresh --no-copy (as ALTER SUBSCRIPTION ... REFRESH PUBLICATION WITH (copy_data = false)), or re-create the subscription";

/** The target-side channel a running pgsub listens on for refresh requests. */
export function notifyChannel(subscription: string): string {
  return `pgsub_${subscription}`.slice(0, 63);
}

/**
 * For `pgsub refresh` / `pgsub resync` from another process: mark, then wake the service. A
 * refresh asked for while no pgsub runs is made at the next start, as native's ALTER
 * SUBSCRIPTION … REFRESH PUBLICATION works on a disabled subscription too.
 */
export async function requestRefresh(sql: Sql, subscription: string, resync?: { schema: string; table: string }): Promise<boolean> {
  if (resync) {
    const rows = await sql.unsafe(
      `UPDATE "pgsub"."subscription_rel" SET state = 'd', sync_lsn = NULL, updated_at = now() WHERE subscription = $1 AND schema_name = $2 AND table_name = $3 RETURNING 1`,
      [subscription, resync.schema, resync.table],
    );
    if (rows.length === 0) return false;
  } else {
    // Forget the recorded publication list: a pgsub not running now refreshes at its next start (refreshDueAtStart).
    await sql.unsafe(`UPDATE "pgsub"."origin" SET "publications" = NULL WHERE "subscription" = $1`, [subscription]);
  }
  await sql.notify(notifyChannel(subscription), resync ? `resync ${resync.schema}.${resync.table}` : 'refresh');
  return true;
}

/**
 * `pgsub refresh --no-copy`: every published table not copied yet (new, or waiting in init)
 * is taken as it is on the target, ready from the subscription's origin on — the
 * operator's promise that it holds what the source held there.
 */
export async function markReadyWithoutCopy(sql: Sql, subscription: string, tables: { schema: string; table: string }[]): Promise<string[]> {
  const marked: string[] = [];
  await sql.begin(async (tx) => {
    for (const t of tables) {
      const rows = await tx.unsafe(
        `INSERT INTO "pgsub"."subscription_rel" AS r (subscription, schema_name, table_name, state, ready_at)
         VALUES ($1, $2, $3, 'r', now())
         ON CONFLICT (subscription, schema_name, table_name) DO UPDATE
            SET state = 'r', sync_lsn = NULL, ready_at = now(), updated_at = now(), last_error = NULL, error_count = 0
          WHERE r.state = 'i'
         RETURNING 1`,
        [subscription, t.schema, t.table],
      );
      if (rows.length > 0) marked.push(`${t.schema}.${t.table}`);
    }
  });
  return marked;
}

function sameSet(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x) => b.includes(x));
}

/** A text[] literal of `items`, each quoted (a parameter; names may hold commas and quotes). */
function textArray(items: string[]): string {
  return `{${items.map((k) => `"${k.replace(/\\/g, '\\\\').replace(/"/g, '\\"')}"`).join(',')}}`;
}
