-- The last failure of a table's copy (or why it is not copied), for pgsub status: the
-- message, when, and how many attempts failed in a row. Cleared when the copy finishes.
ALTER TABLE "pgsub"."subscription_rel" ADD COLUMN IF NOT EXISTS "last_error" text;
--> statement-breakpoint
ALTER TABLE "pgsub"."subscription_rel" ADD COLUMN IF NOT EXISTS "last_error_at" timestamptz;
--> statement-breakpoint
ALTER TABLE "pgsub"."subscription_rel" ADD COLUMN IF NOT EXISTS "error_count" integer NOT NULL DEFAULT 0;
