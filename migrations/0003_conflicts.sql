-- Conflicts (conflict/*.ts). The subscription's operator-facing state, like the
-- pg_subscription columns subenabled / subskiplsn plus the last apply error, which
-- `pgsub skip` checks an LSN against and `pgsub status` shows.
CREATE TABLE IF NOT EXISTS "pgsub"."subscription" (
  "subscription" text PRIMARY KEY,
  "enabled" boolean NOT NULL DEFAULT true,
  "disabled_reason" text,
  "disabled_at" timestamptz,
  -- Finish LSN (commit or prepare LSN) of the one remote transaction to skip.
  "skip_lsn" pg_lsn,
  -- The remote transaction that last failed to apply, and why.
  "error_lsn" pg_lsn,
  "error_xid" bigint,
  "error_code" text,
  "error_conflict" text,
  "error_message" text,
  "error_at" timestamptz
);
--> statement-breakpoint
-- Counters named as pg_stat_subscription_stats'. Conflicts resolved by a policy are
-- counted in the apply transaction that resolves them; errors on the maintenance
-- connection when they happen (every occurrence, as native).
CREATE TABLE IF NOT EXISTS "pgsub"."subscription_stats" (
  "subscription" text PRIMARY KEY,
  "apply_error_count" bigint NOT NULL DEFAULT 0,
  "confl_insert_exists" bigint NOT NULL DEFAULT 0,
  "confl_update_origin_differs" bigint NOT NULL DEFAULT 0,
  "confl_update_exists" bigint NOT NULL DEFAULT 0,
  "confl_update_missing" bigint NOT NULL DEFAULT 0,
  "confl_delete_origin_differs" bigint NOT NULL DEFAULT 0,
  "confl_delete_missing" bigint NOT NULL DEFAULT 0,
  "confl_multiple_unique_conflicts" bigint NOT NULL DEFAULT 0,
  "stats_reset" timestamptz NOT NULL DEFAULT now()
);
--> statement-breakpoint
-- One row per conflict detected, written in the target transaction that resolved it
-- (so a transaction re-applied after a crash never logs twice); conflicts under the
-- `error` policy are logged once per failing transaction, and `pgsub skip` adds a
-- transaction_skipped row in the transaction that moves the origin past it.
CREATE TABLE IF NOT EXISTS "pgsub"."conflict_log" (
  "id" bigserial PRIMARY KEY,
  "subscription" text NOT NULL,
  "conflict_type" text NOT NULL,
  -- schema.table as published, and its parts (names may contain dots or quotes).
  "relation" text,
  "schema_name" text,
  "table_name" text,
  "key" jsonb,
  "remote_tuple" jsonb,
  -- The local row(s) in the way: an object, or an array for multiple_unique_conflicts.
  "local_tuple" jsonb,
  -- Last writer of the local row, when the target has track_commit_timestamp = on.
  "local_origin" text,
  "local_commit_ts" timestamptz,
  -- Finish LSN (commit/prepare LSN) and xid of the remote transaction.
  "remote_lsn" pg_lsn,
  "remote_xid" bigint,
  "remote_commit_ts" timestamptz,
  "policy" text NOT NULL,
  "detail" text,
  "logged_at" timestamptz NOT NULL DEFAULT now()
);
--> statement-breakpoint
CREATE INDEX IF NOT EXISTS "conflict_log_subscription" ON "pgsub"."conflict_log" ("subscription", "id");
--> statement-breakpoint
-- Raised by the pipelined apply statements when a change needs the careful path
-- (conflict/detect.ts): aborting the target transaction costs nothing when no row
-- conflicts, unlike a round trip per row to look at counts before COMMIT.
CREATE OR REPLACE FUNCTION "pgsub"."conflict"(kind text) RETURNS boolean
  LANGUAGE plpgsql VOLATILE SET search_path = ''
  AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'PSC01', MESSAGE = 'pgsub conflict: ' || kind; END $$;
