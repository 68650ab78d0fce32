-- Indexes and unique/primary-key constraints the table sync dropped from an empty target
-- table so that its copy loads the heap alone and builds each index once, sorted, at the
-- end (tablesync/deferred-indexes.ts). Written in the transaction that drops them and
-- deleted in the one that recreates them, together with the table's move to finishedcopy:
-- a crash in between leaves the definitions here, and the next copy of the table (or
-- `pgsub drop`, or the table leaving the publication) recreates them.
CREATE TABLE IF NOT EXISTS "pgsub"."deferred_index" (
  "subscription" text NOT NULL,
  "schema_name" text NOT NULL,
  "table_name" text NOT NULL,
  -- Creation order (the original index OIDs' order).
  "ord" integer NOT NULL,
  "index_name" text NOT NULL,
  -- The statement that recreates it: ALTER TABLE ... ADD CONSTRAINT ... or CREATE INDEX ...
  "definition" text NOT NULL,
  PRIMARY KEY ("subscription", "schema_name", "table_name", "ord")
);
