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

/** Which server a failure is about: the publisher (source) or the database applied into (target). */
export type Side = 'source' | 'target';

export abstract class PgsubError extends Error {
  abstract readonly code: string;
  abstract readonly retryable: boolean;
  /**
   * Fatal before the first session of the process reached streaming: a setup mistake the
   * operator must fix (exit 2). Retried like its `retryable` says once a session has run,
   * since then it is a change (a rotated password, a revoked grant) that may be undone.
   */
  readonly fatalAtStartup: boolean = false;
  /** The exit code when this error stops the service: 2, setup the operator must fix; 4, the subscription is lost; 5, it was cut over; 1, anything else. */
  readonly exitCode: 1 | 2 | 4 | 5 = 1;
  constructor(
    message: string,
    readonly context: ErrorContext = {},
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The spool directory (`state_dir`) has no room for a streamed transaction (ENOSPC, EDQUOT).
 * Transient: the session ends, its spool files are deleted, and the retry streams the
 * transaction again from its first change once space is freed; nothing was confirmed.
 */
export class SpoolFullError extends PgsubError {
  readonly code = 'PGSUB_SPOOL_FULL';
  readonly retryable = true;
  constructor(dir: string, remoteXid: number, bytes: number, cause: unknown) {
    const why = (cause as { code?: string } | null)?.code === 'EDQUOT' ? 'the disk quota is exhausted' : 'no space is left on the device';
    super(
      `cannot spool streamed transaction ${remoteXid}: ${why} in the spool directory ${dir} (${bytes} bytes of it spooled); free space there or set state_dir to a larger file system — pgsub retries and streams the transaction again`,
      { dir, remoteXid, spooledBytes: bytes },
      { cause },
    );
  }
}

/** Exit code of `pgsub run` when the subscription cannot go on and must be re-created (slot lost, slot ahead of the target). */
export const EXIT_SUBSCRIPTION_LOST = 4;
/** Exit code of `pgsub run` for a subscription `pgsub cutover` finished: its work is done, not failed. */
export const EXIT_CUT_OVER = 5;

export type ProtocolErrorCode =
  | 'PGSUB_PROTOCOL_TRUNCATED'
  | 'PGSUB_PROTOCOL_TRAILING_BYTES'
  | 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE'
  | 'PGSUB_PROTOCOL_BAD_FIELD'
  | 'PGSUB_PROTOCOL_OUT_OF_ORDER';

/** Bytes from the publisher that do not form a valid message (proto.c's PROTOCOL_VIOLATION). */
export class ProtocolError extends PgsubError {
  readonly retryable = false;
  constructor(
    readonly code: ProtocolErrorCode,
    message: string,
    context: ErrorContext = {},
  ) {
    super(message, context);
  }
}

/** Configuration that cannot be used as given; names the key and where it came from. */
export class ConfigError extends PgsubError {
  readonly code = 'PGSUB_CONFIG_INVALID';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/** An option users know from CREATE SUBSCRIPTION that this version does not implement yet. */
export class NotImplementedError extends PgsubError {
  readonly code = 'PGSUB_NOT_IMPLEMENTED';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/** The target's schema cannot receive what the publisher sends (missing table or column…). */
export class SchemaMismatchError extends PgsubError {
  readonly code = 'PGSUB_SCHEMA_MISMATCH';
  // The operator can fix the target while pgsub waits; apply resumes by itself.
  readonly retryable = true;
}

/**
 * A mapping rule (config `mapping:`) that does not fit the publisher's relation or the
 * target catalog: an unknown column, an expression that does not parse or is not
 * immutable, a key the target cannot locate rows by. Names the source table, the column
 * and the reason. Exit 2 at startup; later (a Relation message changed the relation) it is
 * retried, since fixing the target may be enough.
 */
export class MappingError extends PgsubError {
  readonly code = 'PGSUB_MAPPING_INVALID';
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
}

/**
 * Schema drift under `drift: stop` (docs/mapping.md): the publisher sends a column the
 * mapped target does not have. The transaction carrying it is rolled back, so apply stops
 * at the boundary before it; retried with backoff (re-reading the target catalog), it
 * resumes by itself once the column is added or excluded. The context holds the diff and
 * the fix, which `pgsub status` shows.
 */
export class DriftError extends PgsubError {
  readonly code = 'PGSUB_SCHEMA_DRIFT';
  readonly retryable = true;
}

/** A change that cannot be applied as sent (e.g. UPDATE on a table with REPLICA IDENTITY NOTHING). */
export class ApplyError extends PgsubError {
  readonly code = 'PGSUB_APPLY_FAILED';
  readonly retryable = true;
}

/**
 * The target has no free replication origin state for this subscription's origin (53400:
 * every one of max_active_replication_origins — max_replication_slots before PostgreSQL 18 —
 * holds another origin's progress). Exit 2 at startup naming the setting; later retried with
 * backoff, since a dropped subscription frees one.
 */
export class OriginLimitError extends PgsubError {
  readonly code = 'PGSUB_ORIGIN_LIMIT';
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
  constructor(message: string, context: ErrorContext = {}, options?: ErrorOptions) {
    super(message, { ...context, side: 'target' }, options);
  }
}

/** The source or target connection broke; resume from the committed origin after backoff. */
export class ConnectionLostError extends PgsubError {
  readonly code = 'PGSUB_CONNECTION_LOST';
  readonly retryable = true;
}

/**
 * Row-level security of a target table applies to pgsub's role (FORCE ROW LEVEL SECURITY,
 * or a role that neither owns the table nor has BYPASSRLS): an UPDATE or DELETE would miss
 * the rows the policies hide and the change would be lost, so pgsub refuses to apply into
 * the table, as the native apply worker does (apply/sql/row-security.ts). Exit 2 at
 * startup; later (a Relation message, a table's copy) retried with backoff, never skipped,
 * until the table or the role is changed.
 */
export class RowSecurityError extends PgsubError {
  readonly code = 'PGSUB_ROW_SECURITY';
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
  constructor(message: string, context: ErrorContext = {}) {
    super(message, { ...context, side: 'target' });
  }
}

/** The publisher's slot is ahead of what the target recorded: changes would be missing. */
export class SlotAheadError extends PgsubError {
  readonly code = 'PGSUB_SLOT_AHEAD';
  readonly retryable = false;
  override readonly exitCode = EXIT_SUBSCRIPTION_LOST;
}

/** Publisher-side setup is unusable (wal_level, publication missing, version too old…). */
export class SourceSetupError extends PgsubError {
  readonly code = 'PGSUB_SOURCE_SETUP';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/** Target-side setup pgsub cannot work without (privileges, settings); fix and restart. */
export class TargetSetupError extends PgsubError {
  readonly code = 'PGSUB_TARGET_SETUP';
  readonly retryable = false;
  override readonly exitCode = 2;
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
  constructor(
    readonly conflict: string,
    message: string,
    readonly record: unknown,
    context: ErrorContext = {},
  ) {
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
  override readonly exitCode = EXIT_SUBSCRIPTION_LOST;
}

/**
 * The subscription was cut over (`pgsub cutover`, pgsub.cutover): the target is the
 * primary and the forward stream has nothing more to do. Ends `pgsub run` with its own
 * exit code (EXIT_CUT_OVER), and `pgsub enable` refuses it.
 */
export class CutOverError extends PgsubError {
  readonly code = 'PGSUB_CUT_OVER';
  readonly retryable = false;
  override readonly exitCode = EXIT_CUT_OVER;
}

/** A command names a subscription the target has no trace of (`pgsub run` creates it). */
export class SubscriptionNotFoundError extends PgsubError {
  readonly code = 'PGSUB_SUBSCRIPTION_NOT_FOUND';
  readonly retryable = false;
}

/** A server that refused one side's connection for a reason only the operator can fix: exit 2 at startup, retried during a run. */
abstract class SideRefusalError extends PgsubError {
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
  constructor(
    readonly side: Side,
    message: string,
    context: ErrorContext = {},
    options?: ErrorOptions,
  ) {
    super(message, { ...context, side }, options);
  }
}

/**
 * The server refused the login: a wrong password (SQLSTATE 28P01) or no pg_hba.conf line
 * letting this user in (28000). The message names the side and what to change.
 */
export class AuthenticationError extends SideRefusalError {
  readonly code = 'PGSUB_AUTH_FAILED';
}

/**
 * TLS could not be set up as the conninfo asks: the server's certificate failed a check
 * (chain, host name, revocation), a client certificate or key is missing or not private,
 * the server requires a client certificate, or the server does not offer TLS. Permanent
 * until the operator fixes a file or a setting; the message names the side and the check.
 */
export class TlsError extends SideRefusalError {
  readonly code = 'PGSUB_TLS_FAILED';
}

/** A role lacks a privilege pgsub needs (REPLICATION, CREATE, table grants, SET of session_replication_role). */
export class PrivilegeError extends PgsubError {
  readonly code = 'PGSUB_PRIVILEGE_MISSING';
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
  constructor(
    readonly side: Side,
    message: string,
    context: ErrorContext = {},
    options?: ErrorOptions,
  ) {
    super(message, { ...context, side }, options);
  }
}

/** Another pgsub process holds the subscription's advisory lock in the target. */
export class AlreadyRunningError extends PgsubError {
  readonly code = 'PGSUB_ALREADY_RUNNING';
  // Once this process has run, the other one took over while this one was cut off: wait for it.
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
}

/** The replication slot is streaming to a client that is not pgsub (another application_name). */
export class SlotInUseError extends PgsubError {
  readonly code = 'PGSUB_SLOT_IN_USE';
  readonly retryable = true;
  override readonly fatalAtStartup = true;
  override readonly exitCode = 2;
}

/**
 * The slot is still held by a walsender with pgsub's own application_name, an earlier
 * connection the publisher has not noticed gone yet: retried on a short fixed interval
 * (like native's wal_retrieve_retry_interval), never with a growing backoff.
 */
export class SlotBusyError extends PgsubError {
  readonly code = 'PGSUB_SLOT_BUSY';
  readonly retryable = true;
}

/** pg_dump for `pgsub schema` is missing, older than the source server, or failed (exit 2: use another one). */
export class PgDumpError extends PgsubError {
  readonly code = 'PGSUB_PG_DUMP';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/**
 * `pgsub schema copy` could not create the schema: `PGSUB_SCHEMA_EXISTS` (exit 2) when the
 * target already holds some of the tables and --force was not given; `PGSUB_SCHEMA_PREREQUISITE`
 * (exit 2) when the target lacks what the dump needs (an extension) or the step comes too early
 * (post-data before the initial copy finished); `PGSUB_SCHEMA_COPY_FAILED` (exit 1) when a
 * statement of the dump failed — nothing of that step is left behind.
 */
export class SchemaCopyError extends PgsubError {
  readonly retryable = false;
  override readonly exitCode: 1 | 2;
  constructor(
    readonly code: 'PGSUB_SCHEMA_EXISTS' | 'PGSUB_SCHEMA_PREREQUISITE' | 'PGSUB_SCHEMA_COPY_FAILED',
    message: string,
    context: ErrorContext = {},
  ) {
    super(message, context);
    this.exitCode = code === 'PGSUB_SCHEMA_COPY_FAILED' ? 1 : 2;
  }
}

/**
 * `pgsub cutover` did not switch: `PGSUB_CUTOVER_REFUSED` (exit 2) when a precondition does
 * not hold before anything was changed (lag, service not running, a table not ready);
 * `PGSUB_CUTOVER_FAILED` (exit 1) when a step failed after the fence — the fence is lifted
 * and the source left as it was before the command; `PGSUB_CUTOVER_INTERRUPTED` (exit 1)
 * for a SIGINT/SIGTERM before the point of no return, undone the same way.
 */
export class CutoverError extends PgsubError {
  readonly retryable = false;
  override readonly exitCode: 1 | 2;
  constructor(
    readonly code: 'PGSUB_CUTOVER_REFUSED' | 'PGSUB_CUTOVER_FAILED' | 'PGSUB_CUTOVER_INTERRUPTED',
    message: string,
    context: ErrorContext = {},
    options?: ErrorOptions,
  ) {
    super(message, context, options);
    this.exitCode = code === 'PGSUB_CUTOVER_REFUSED' ? 2 : 1;
  }
}

/**
 * `pgsub verify` could not run (exit 2): no service for the subscription, the service
 * refused the hold (apply lanes, parallel apply) or did not answer, a table it cannot read.
 */
export class VerifyError extends PgsubError {
  readonly code = 'PGSUB_VERIFY_REFUSED';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/**
 * `pgsub verify --repair` could not write a table's repair: the target refused a statement
 * (a unique or check constraint, a lock it could not get in time) or the hold was lost.
 * Names the table (context.relation, the source's name), the key where PostgreSQL's
 * message gives it (context.key) and PostgreSQL's SQLSTATE (context.sqlstate).
 */
export class RepairError extends PgsubError {
  readonly code = 'PGSUB_VERIFY_REPAIR_FAILED';
  readonly retryable = false;
  override readonly exitCode = 2;
}

/**
 * `pgsub demo` has no server binaries for a major it needs (exit 2): the demo starts its
 * servers from the npm packages pg10 … pg18, development dependencies that an installed
 * pgsub leaves out, so it runs from a checkout; in a checkout, a major that is not among them.
 */
export class DemoUnavailableError extends PgsubError {
  readonly code = 'PGSUB_DEMO_NO_SERVERS';
  readonly retryable = false;
  override readonly exitCode = 2;
}
