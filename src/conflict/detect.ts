/**
 * Conflict detection on the pipelined path, at no extra round trip per row.
 *
 * The apply connection pipelines a remote transaction's statements and only looks at
 * results asynchronously, often after COMMIT has been sent — too late to add a log row
 * to that transaction. So the fast path never resolves anything; it only makes every
 * conflict abort the target transaction on the server:
 *  - INSERT is a plain INSERT: an existing key is a unique_violation (23505);
 *  - UPDATE and DELETE are wrapped (apply/sql/detecting.ts `detecting`) so that finding no
 *    row, or a row whose last writer (pg_xact_commit_timestamp_origin(xmin), when the
 *    target has track_commit_timestamp = on) is not this session's replication origin,
 *    calls pgsub.conflict(kind), which raises SQLSTATE PSC01 (migrations/0003).
 * The last writer is read from the row the statement changed (DELETE's RETURNING, and
 * UPDATE's RETURNING OLD on PostgreSQL 18; PostgreSQL 16/17 probe the row once more in
 * the same snapshot). A conflict-free transaction therefore costs what it cost before,
 * plus the CTE around each UPDATE/DELETE. A conflicting one is rolled back and its kept messages are
 * dispatched again in careful mode (apply/run/conflict-replay.ts → apply/handlers/careful.ts), which
 * names the conflict, applies its policy and logs it inside the new target transaction; inside
 * a group of source transactions the others are dispatched again as they came, in the same
 * session (no restart, no retry one by one).
 * Under the `error` policy the careful path throws ApplyConflictError and the service
 * retries after backoff, like native.
 */
export const CONFLICT_SQLSTATE = 'PSC01';
export const UNIQUE_VIOLATION = '23505';

/** A target error the careful path knows how to classify and resolve. */
export function isConflictSignal(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return code === CONFLICT_SQLSTATE || code === UNIQUE_VIOLATION;
}
