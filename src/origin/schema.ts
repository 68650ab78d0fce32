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
  createdAt: timestamp('created_at', { withTimezone: true, mode: 'string' }).notNull(),
  updatedAt: timestamp('updated_at', { withTimezone: true, mode: 'string' }).notNull(),
});
