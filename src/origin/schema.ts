/**
 * pgsub's metadata schema in the target, as drizzle-orm tables. The SQL that creates
 * it lives in migrations/ (applied at startup by migrate.ts); this file is the typed
 * view used for reads and for the non-hot-path writes. The per-commit origin update is
 * a prepared raw statement in store.ts because it rides in the apply pipeline.
 */
import { bigint, customType, pgSchema, text, timestamp } from 'drizzle-orm/pg-core';

const pgLsn = customType<{ data: string; driverData: string }>({
  dataType: () => 'pg_lsn',
});

export const pgsubSchema = pgSchema('pgsub');

export const origin = pgsubSchema.table('origin', {
  subscription: text('subscription').primaryKey(),
  slotName: text('slot_name').notNull(),
  remoteLsn: pgLsn('remote_lsn').notNull(),
  lastCommitEndLsn: pgLsn('last_commit_end_lsn'),
  lastCommitTime: timestamp('last_commit_time', { withTimezone: true, mode: 'string' }),
  transactionsApplied: bigint('transactions_applied', { mode: 'bigint' }).notNull(),
  /** The publication list of the last refresh (migrations/0010). */
  publications: text('publications').array(),
  createdAt: timestamp('created_at', { withTimezone: true, mode: 'string' }).notNull(),
  updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'string' }).notNull(),
});

/** Per-table sync state (pg_subscription_rel's analogue); see migrations/0001. */
export const subscriptionRel = pgsubSchema.table('subscription_rel', {
  subscription: text('subscription').notNull(),
  schemaName: text('schema_name').notNull(),
  tableName: text('table_name').notNull(),
  state: text('state').notNull(),
  syncLsn: pgLsn('sync_lsn'),
  rowsCopied: bigint('rows_copied', { mode: 'number' }).notNull(),
  bytesCopied: bigint('bytes_copied', { mode: 'number' }).notNull(),
  copyStartedAt: timestamp('copy_started_at', { withTimezone: true, mode: 'string' }),
  copyFinishedAt: timestamp('copy_finished_at', { withTimezone: true, mode: 'string' }),
  readyAt: timestamp('ready_at', { withTimezone: true, mode: 'string' }),
  updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'string' }).notNull(),
});
