/**
 * Progress kept in the target (the analogue of pg_replication_origin_status): one row
 * per subscription in pgsub.origin. Migrations run at startup, serialised by an advisory
 * lock so two pgsub processes starting together do not race. The per-commit update is a
 * raw statement sent down the apply pipeline inside the same target transaction as the
 * changes it covers: the row and the data commit or vanish together.
 */
import { eq } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/postgres-js';
import { migrate } from 'drizzle-orm/postgres-js/migrator';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ConnInfo } from '../config/conninfo.js';
import { formatLsn, parseLsn, ZERO_LSN, type Lsn } from '../protocol/lsn.js';
import { formatPgTimestamp } from '../protocol/messages.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import { origin } from './schema.js';
import type { Statement } from '../pgwire/statement.js';

/** migrations/ sits at the package root, above src/ (tsx) or dist/src/ (built). */
function findMigrationsFolder(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = path.join(dir, 'migrations');
    if (fs.existsSync(path.join(candidate, 'meta', '_journal.json'))) return candidate;
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error('pgsub installation is incomplete: migrations/meta/_journal.json not found');
    dir = parent;
  }
}
const MIGRATIONS_FOLDER = findMigrationsFolder();
// Arbitrary but fixed: "pgsub" in ASCII, the advisory lock key of schema migrations.
const MIGRATION_LOCK_KEY = 0x7067737562;

export interface OriginRow {
  subscription: string;
  slotName: string;
  remoteLsn: Lsn;
  lastCommitEndLsn: Lsn | null;
  lastCommitTime: string | null;
  transactionsApplied: bigint;
}

/** Create or upgrade pgsub's schema in the target; idempotent. */
export async function migrateTarget(info: ConnInfo, applicationName: string): Promise<void> {
  const sql = openMaintenance(info, applicationName);
  try {
    await migrateWith(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

/** The newest migration's timestamp (drizzle's folderMillis), what schema_migrations records. */
const NEWEST_MIGRATION = Math.max(
  ...(JSON.parse(fs.readFileSync(path.join(MIGRATIONS_FOLDER, 'meta', '_journal.json'), 'utf8')) as { entries: { when: number }[] }).entries.map((e) => e.when),
);

/**
 * Whether pgsub's schema in the target has the newest migration already (drizzle applies
 * those newer than the newest recorded, so that is its own test). Only reads: a session
 * start asks it while the privileges are still being checked.
 */
export async function schemaIsCurrent(sql: Sql): Promise<boolean> {
  const newest = await sql
    .unsafe(`SELECT max(created_at)::text AS newest FROM "pgsub"."schema_migrations"`)
    .then((rows) => (rows[0]?.newest == null ? null : Number(rows[0].newest)))
    .catch((err: { code?: string }) => {
      // No schema or table yet (a first start): the migrator creates them.
      if (err.code === '42P01' || err.code === '3F000') return null;
      throw err;
    });
  return newest !== null && newest >= NEWEST_MIGRATION;
}

/**
 * migrateTarget on an open connection. A schema that is current (schemaIsCurrent) is left
 * alone without the lock and the migrator's reads: a restart's usual case, about 25 ms of
 * every start. `current`: that answer, when the caller has it already.
 */
export async function migrateWith(sql: Sql, current?: boolean): Promise<void> {
  if (current ?? (await schemaIsCurrent(sql))) return;
  await sql.unsafe('SELECT pg_catalog.pg_advisory_lock($1)', [String(MIGRATION_LOCK_KEY)]);
  try {
    await migrate(drizzle(sql), { migrationsFolder: MIGRATIONS_FOLDER, migrationsSchema: 'pgsub', migrationsTable: 'schema_migrations' });
  } finally {
    await sql.unsafe('SELECT pg_catalog.pg_advisory_unlock($1)', [String(MIGRATION_LOCK_KEY)]);
  }
}

// The flush barrier's statements (flushBarrierStatements says why they flush).
const FLUSH_BARRIER_SETTING = 'SET LOCAL synchronous_commit = local';
const FLUSH_BARRIER_LOCK = 'SELECT 1 FROM "pgsub"."origin" WHERE "subscription" = $1 FOR KEY SHARE';

/**
 * The origin row as read may come from an asynchronous commit that is not on the target's
 * disk yet (synchronous_commit = off, the session before this one in the same process), and
 * a session starts out reporting it as durable (Progress). The flush barrier's synchronous
 * commit flushes the target's WAL past the row read before it: a target crash cannot then
 * take back a position the publisher is told (native reads its origin's flushed progress
 * only, origin.c).
 */
export async function flushTargetWal(sql: Sql, subscription: string): Promise<void> {
  await sql.begin(async (tx) => {
    await tx.unsafe(FLUSH_BARRIER_SETTING);
    await tx.unsafe(FLUSH_BARRIER_LOCK, [subscription]);
  });
}

export async function loadOrigin(sql: Sql, subscription: string): Promise<OriginRow | null> {
  const rows = await drizzle(sql).select().from(origin).where(eq(origin.subscription, subscription));
  const row = rows[0];
  if (!row) return null;
  return {
    subscription: row.subscription,
    slotName: row.slotName,
    remoteLsn: parseLsn(row.remoteLsn),
    lastCommitEndLsn: row.lastCommitEndLsn ? parseLsn(row.lastCommitEndLsn) : null,
    lastCommitTime: row.lastCommitTime,
    transactionsApplied: row.transactionsApplied,
  };
}

/** First start of a subscription against this target: its row, at the slot's start. */
export async function createOrigin(sql: Sql, subscription: string, slotName: string, startLsn: Lsn): Promise<void> {
  await drizzle(sql)
    .insert(origin)
    .values({
      subscription,
      slotName,
      remoteLsn: formatLsn(startLsn),
      transactionsApplied: 0n,
      createdAt: new Date().toISOString(),
      updatedAt: new Date().toISOString(),
    })
    .onConflictDoNothing();
}

/** Statement recording an applied remote commit; rides inside that commit's target transaction. */
export function commitProgressStatement(subscription: string, endLsn: Lsn, commitTime: bigint, transactions = 1): Statement {
  return {
    text:
      'UPDATE "pgsub"."origin" SET "remote_lsn" = $2::pg_catalog.pg_lsn, "last_commit_end_lsn" = $2::pg_catalog.pg_lsn, ' +
      '"last_commit_time" = $3::pg_catalog.timestamptz, "transactions_applied" = "transactions_applied" + $4::pg_catalog.int8, "updated_at" = pg_catalog.now() ' +
      'WHERE "subscription" = $1',
    params: [subscription, formatLsn(endLsn), formatPgTimestamp(commitTime), String(transactions)],
  };
}

/** Statement recording an idle position before it is confirmed to the publisher. */
export function idleProgressStatement(subscription: string, lsn: Lsn): Statement {
  return {
    text: 'UPDATE "pgsub"."origin" SET "remote_lsn" = $2::pg_catalog.pg_lsn, "updated_at" = pg_catalog.now() WHERE "subscription" = $1 AND "remote_lsn" < $2::pg_catalog.pg_lsn',
    params: [subscription, formatLsn(lsn)],
  };
}

/**
 * A transaction whose synchronous commit flushes the target's WAL up to it, and so every
 * asynchronous commit before it (apply/run/flush-tracker.ts when idle, flushTargetWal at a
 * session's start). It must write WAL before its commit, or the commit is not flushed at
 * all (an xid alone is not enough, RecordTransactionCommit): a KEY SHARE lock of the origin
 * row writes a lock record, and does not conflict with the applier's updates of that row,
 * which never change its key.
 */
export function flushBarrierStatements(subscription: string): Statement[] {
  return [
    { text: 'BEGIN', params: [] },
    { text: FLUSH_BARRIER_SETTING, params: [] },
    { text: FLUSH_BARRIER_LOCK, params: [subscription] },
    { text: 'COMMIT', params: [] },
  ];
}

export { ZERO_LSN };

/** Inside a prepared transaction: its existence once committed (see migrations/0002). */
export function preparedRowStatement(subscription: string, gid: string, remoteXid: number, prepareEndLsn: Lsn): Statement {
  return {
    text: 'INSERT INTO "pgsub"."prepared" ("subscription", "gid", "remote_xid", "prepare_end_lsn") VALUES ($1, $2, $3, $4::pg_catalog.pg_lsn)',
    params: [subscription, gid, String(remoteXid), formatLsn(prepareEndLsn)],
  };
}

/**
 * After COMMIT PREPARED / ROLLBACK PREPARED (which cannot share a transaction with
 * anything): the origin moves to that message's end and the prepared row goes.
 */
export function finishPreparedStatements(subscription: string, gid: string, endLsn: Lsn, commitTime: bigint | null): Statement[] {
  const origin = commitTime === null ? idleProgressStatement(subscription, endLsn) : commitProgressStatement(subscription, endLsn, commitTime);
  return [origin, forgetPreparedStatement(subscription, gid)];
}

/** The prepared row of a transaction committed or rolled back on the target. */
export function forgetPreparedStatement(subscription: string, gid: string): Statement {
  return { text: 'DELETE FROM "pgsub"."prepared" WHERE "subscription" = $1 AND "gid" = $2', params: [subscription, gid] };
}
