/**
 * How the service loop (runner.ts) sorts a session's error: retried or fatal, a slot held by
 * a walsender on its way out, a connection failure (not the target's data disagreeing).
 * Pure functions; the loop decides what each leads to. How an error is logged is log.ts's
 * serializeError.
 */
import { sqlstateOf } from '../connect-failure.js';
import { ConnectionLostError, PgsubError, RowSecurityError, SlotBusyError } from '../errors.js';

/** Waiting is pointless: the slot is held by a walsender that is on its way out (ours, or 55006 at START_REPLICATION). */
export function slotBusy(err: unknown): boolean {
  return err instanceof SlotBusyError || (sqlstateOf(err) === '55006' && /replication slot/.test(String((err as Error)?.message)));
}

/** Not the target's data disagreeing: nothing to record as an apply error there. */
export function connectionFailure(err: unknown): boolean {
  return err instanceof ConnectionLostError || slotBusy(err) || (err instanceof PgsubError && err.fatalAtStartup && !(err instanceof RowSecurityError));
}

export function isRetryable(err: unknown): boolean {
  if (err instanceof PgsubError) return err.retryable;
  // SQL errors from the target (unique violation, lock timeout, …) are retried like the
  // native worker, which exits and is restarted by the launcher.
  return true;
}
