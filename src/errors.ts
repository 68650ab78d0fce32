/**
 * Typed errors with stable codes. Every failure pgsub reports carries a `code` that
 * operators and tests can match on, a `retryable` classification (reconnect-and-resume
 * vs stop-and-alert), and context fields naming what and where (relation, column, LSN…).
 * Errors are logged once, where they are handled (the service loop), never where thrown.
 */
export interface ErrorContext {
  command?: string;
  relation?: string;
  column?: string;
  remoteXid?: number;
  finishLsn?: string;
  [key: string]: unknown;
}

export abstract class PgsubError extends Error {
  abstract readonly code: string;
  abstract readonly retryable: boolean;
  constructor(message: string, readonly context: ErrorContext = {}, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

export type ProtocolErrorCode =
  | 'PGSUB_PROTOCOL_TRUNCATED'
  | 'PGSUB_PROTOCOL_TRAILING_BYTES'
  | 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE'
  | 'PGSUB_PROTOCOL_BAD_FIELD'
  | 'PGSUB_PROTOCOL_OUT_OF_ORDER';

/** Bytes from the publisher that do not form a valid message (proto.c's PROTOCOL_VIOLATION). */
export class ProtocolError extends PgsubError {
  readonly retryable = false;
  constructor(readonly code: ProtocolErrorCode, message: string, context: ErrorContext = {}) {
    super(message, context);
  }
}

/** Configuration that cannot be used as given; names the key and where it came from. */
export class ConfigError extends PgsubError {
  readonly code = 'PGSUB_CONFIG_INVALID';
  readonly retryable = false;
}

/** An option users know from CREATE SUBSCRIPTION that this version does not implement yet. */
export class NotImplementedError extends PgsubError {
  readonly code = 'PGSUB_NOT_IMPLEMENTED';
  readonly retryable = false;
}

/** The target's schema cannot receive what the publisher sends (missing table or column…). */
export class SchemaMismatchError extends PgsubError {
  readonly code = 'PGSUB_SCHEMA_MISMATCH';
  // The operator can fix the target while pgsub waits; apply resumes by itself.
  readonly retryable = true;
}

/** A change that cannot be applied as sent (e.g. UPDATE on a table with REPLICA IDENTITY NOTHING). */
export class ApplyError extends PgsubError {
  readonly code = 'PGSUB_APPLY_FAILED';
  readonly retryable = true;
}

/** The source or target connection broke; resume from the committed origin after backoff. */
export class ConnectionLostError extends PgsubError {
  readonly code = 'PGSUB_CONNECTION_LOST';
  readonly retryable = true;
}

/** The publisher's slot is ahead of what the target recorded: changes would be missing. */
export class SlotAheadError extends PgsubError {
  readonly code = 'PGSUB_SLOT_AHEAD';
  readonly retryable = false;
}

/** Publisher-side setup is unusable (wal_level, publication missing, version too old…). */
export class SourceSetupError extends PgsubError {
  readonly code = 'PGSUB_SOURCE_SETUP';
  readonly retryable = false;
}

/** Target-side setup pgsub cannot work without (privileges, settings); fix and restart. */
export class TargetSetupError extends PgsubError {
  readonly code = 'PGSUB_TARGET_SETUP';
  readonly retryable = false;
}

/**
 * A conflict whose policy is `error` (native's behaviour for *_exists): the target
 * transaction is rolled back and the remote transaction retried after backoff, until
 * the operator fixes the target row or skips the transaction (`pgsub skip --lsn`).
 */
export class ApplyConflictError extends PgsubError {
  readonly code = 'PGSUB_APPLY_CONFLICT';
  // Retried like native: the operator may fix the local row meanwhile.
  readonly retryable = true;
  /** `record`: the conflict as conflict/report.ts logs it (kept opaque here, errors.ts imports nothing). */
  constructor(readonly conflict: string, message: string, readonly record: unknown, context: ErrorContext = {}) {
    super(message, { ...context, conflict });
  }
}

/** The subscription is disabled in the target (disable_on_error); `pgsub enable` resumes it. */
export class SubscriptionDisabledError extends PgsubError {
  readonly code = 'PGSUB_SUBSCRIPTION_DISABLED';
  readonly retryable = false;
}

/** `pgsub skip` / `pgsub enable` asked for something the recorded state does not allow. */
export class ControlError extends PgsubError {
  readonly code = 'PGSUB_CONTROL_REFUSED';
  readonly retryable = false;
}

/**
 * The slot lost the WAL the subscription needs (wal_status = lost, or invalidated): the
 * changes in between are gone for good. Fatal to the subscription, with its own exit
 * code (EXIT_SUBSCRIPTION_LOST): it must be re-created and its tables copied again —
 * never silently, by pgsub.
 */
export class SlotLostError extends PgsubError {
  readonly code = 'PGSUB_SLOT_LOST';
  readonly retryable = false;
}

/** Exit code of `pgsub run` when the subscription cannot go on and must be re-created (slot lost, slot ahead of the target). */
export const EXIT_SUBSCRIPTION_LOST = 4;

/** A command names a subscription the target has no trace of (`pgsub run` creates it). */
export class SubscriptionNotFoundError extends PgsubError {
  readonly code = 'PGSUB_SUBSCRIPTION_NOT_FOUND';
  readonly retryable = false;
}
