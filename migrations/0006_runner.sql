-- Which pgsub process runs each subscription, written by the session that holds the
-- subscription's advisory lock (service/preflight.ts), so that a second process started
-- for it can name the first (pid, host). Trusted only while backend_pid holds the lock.
CREATE TABLE IF NOT EXISTS "pgsub"."runner" (
  "subscription" text PRIMARY KEY,
  "pid" integer NOT NULL,
  "host" text NOT NULL,
  "backend_pid" integer NOT NULL,
  "started_at" timestamptz NOT NULL DEFAULT now()
);
