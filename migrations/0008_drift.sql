-- Schema drift bookkeeping of mapped relations (apply/sql/relmap.ts RelationMemory), so a
-- restarted pgsub still knows which source columns are new and which were renamed: per
-- publisher relation id, the columns of the last Relation message applied, those of the
-- one before it that differed, and the renames recognised (new name -> the name the
-- mapping rule knows). Written in the apply transaction that first uses the relation.
CREATE TABLE IF NOT EXISTS "pgsub"."relation_columns" (
  "subscription" text NOT NULL,
  "relation_id" bigint NOT NULL,
  "columns" jsonb NOT NULL,
  "previous" jsonb,
  "renamed" jsonb NOT NULL DEFAULT '{}',
  "updated_at" timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY ("subscription", "relation_id")
);
