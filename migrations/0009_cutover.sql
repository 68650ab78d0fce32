-- The progress of `pgsub cutover` (cli/cutover.ts, migrate/cutover-record.ts), one row per
-- subscription, written in the target before each step so that an interrupted or crashed
-- cutover can be finished or undone by the next run (or `pgsub cutover --abort`):
--  - step: the last step begun; 'done' is the point of no return (the target is the
--    primary, the forward subscription disabled in the same transaction), 'lifted' a
--    cutover undone;
--  - source_setting: the source database's own default_transaction_read_only before the
--    first fence (NULL: not set), the value a lift restores;
--  - fence_raised: true from just before pgsub sets the database read-only until the fence
--    is lifted (read back), so an `on` found then is pgsub's, never the application's.
CREATE TABLE IF NOT EXISTS "pgsub"."cutover" (
  "subscription" text PRIMARY KEY,
  "step" text NOT NULL,
  "source_database" text NOT NULL,
  "source_setting" text,
  "fence_raised" boolean NOT NULL DEFAULT false,
  "fence_lsn" pg_lsn,
  "reverse" jsonb,
  "started_at" timestamptz NOT NULL DEFAULT now(),
  "updated_at" timestamptz NOT NULL DEFAULT now(),
  "done_at" timestamptz
);
