-- Per-table synchronisation state, mirroring pg_subscription_rel:
--   i init, d datasync (copy running at sync_lsn), f finishedcopy, s syncdone
--   (catching up in the stream from sync_lsn), r ready (applied with everything else).
-- sync_lsn is the table's own position while it is not ready: every remote transaction
-- committing before it is in the table already, every one after it still has to be applied.
CREATE TABLE IF NOT EXISTS "pgsub"."subscription_rel" (
  "subscription" text NOT NULL,
  "schema_name" text NOT NULL,
  "table_name" text NOT NULL,
  "state" char(1) NOT NULL CHECK ("state" IN ('i', 'd', 'f', 's', 'r')),
  "sync_lsn" pg_lsn,
  "rows_copied" bigint NOT NULL DEFAULT 0,
  "bytes_copied" bigint NOT NULL DEFAULT 0,
  "copy_started_at" timestamptz,
  "copy_finished_at" timestamptz,
  "ready_at" timestamptz,
  "updated_at" timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY ("subscription", "schema_name", "table_name")
);
