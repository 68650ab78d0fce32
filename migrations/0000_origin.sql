-- pgsub's own state in the target. One row per subscription: the remote position
-- everything before which is applied, written in the same transaction as the changes.
CREATE SCHEMA IF NOT EXISTS "pgsub";
--> statement-breakpoint
CREATE TABLE IF NOT EXISTS "pgsub"."origin" (
  "subscription" text PRIMARY KEY,
  "slot_name" text NOT NULL,
  -- Position the publisher may be told is flushed: end LSN of the last applied commit,
  -- or a later idle position recorded before it is confirmed.
  "remote_lsn" pg_lsn NOT NULL DEFAULT '0/0',
  -- End LSN and commit time of the last remote transaction applied.
  "last_commit_end_lsn" pg_lsn,
  "last_commit_time" timestamptz,
  "transactions_applied" bigint NOT NULL DEFAULT 0,
  "created_at" timestamptz NOT NULL DEFAULT now(),
  "updated_at" timestamptz NOT NULL DEFAULT now()
);
