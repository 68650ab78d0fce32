-- `pgsub verify` (src/verify/, docs/verify.md): one row per subscription, the channel
-- between the verify command and the running service, and the last result. The command
-- writes the request (holder_pid holds the verify advisory lock for as long as the request
-- is alive) and the LSNs it learns on the source; the service answers in `state`, with the
-- position it holds at, the exported target snapshot and how long apply waited.
CREATE TABLE IF NOT EXISTS "pgsub"."verify" (
  "subscription" text PRIMARY KEY,
  "request_id" text,
  "mode" text NOT NULL DEFAULT 'snapshot',
  "state" text NOT NULL DEFAULT 'idle',
  "holder_pid" integer,
  "hold_timeout_ms" integer NOT NULL DEFAULT 10000,
  "bound_lsn" pg_lsn,
  "slot_lsn" pg_lsn,
  "applied_lsn" pg_lsn,
  "snapshot" text,
  "pause_ms" double precision,
  "detail" text,
  "updated_at" timestamptz NOT NULL DEFAULT now(),
  "last_lsn" pg_lsn,
  "last_result" text,
  "last_differences" bigint,
  "last_at" timestamptz
);
