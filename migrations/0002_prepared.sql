-- Prepared transactions pgsub created on the target (two_phase). A row is inserted inside
-- the prepared transaction itself, so it exists exactly when that transaction committed:
-- a COMMIT PREPARED resent after a crash can tell "already committed" from "never prepared".
CREATE TABLE IF NOT EXISTS "pgsub"."prepared" (
  "subscription" text NOT NULL,
  "gid" text NOT NULL,
  "remote_xid" bigint NOT NULL,
  "prepare_end_lsn" pg_lsn NOT NULL,
  PRIMARY KEY ("subscription", "gid")
);
--> statement-breakpoint
-- Positions of tables catching up, appended by each apply transaction that changes them
-- (append-only: no row lock for a prepared transaction to hold). A table's position is
-- the greatest of its subscription_rel.sync_lsn and these.
CREATE TABLE IF NOT EXISTS "pgsub"."sync_progress" (
  "subscription" text NOT NULL,
  "schema_name" text NOT NULL,
  "table_name" text NOT NULL,
  "lsn" pg_lsn NOT NULL
);
--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "sync_progress_table" ON "pgsub"."sync_progress" ("subscription", "schema_name", "table_name");
