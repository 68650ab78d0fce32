-- The publication list the last refresh registered the tables of (the config's
-- `publication`, missing ones included, as pg_subscription.subpublications). A process
-- start whose list differs refreshes, as ALTER SUBSCRIPTION ... ADD/DROP/SET PUBLICATION
-- (refresh = true) does; NULL (a new subscription, or one from before this) refreshes too.
ALTER TABLE "pgsub"."origin" ADD COLUMN IF NOT EXISTS "publications" text[];
