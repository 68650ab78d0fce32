/**
 * Structured logs via pino. Fields, not prose: `{ lsn, xid, table }`. Passwords are
 * never logged: conninfo is only ever logged through redactConninfo, and the redact paths
 * below are a second line of defence for objects that carry one by accident. An error is
 * logged as the error itself under `err` (`log.error({ err }, 'what failed')`), which
 * serializeError turns into its class, code, context fields and stack.
 */
import pino, { type Logger } from 'pino';
import pretty from 'pino-pretty';
import { redactSecrets } from './config/conninfo.js';

export type { Logger };

/**
 * JSON lines on stdout for journald and log shippers; on a terminal, pino-pretty's
 * human-readable lines (synchronous, in-process: no transport worker thread).
 */
function defaultDestination(): pino.DestinationStream {
  if (process.stdout.isTTY && process.env.PGSUB_LOG_FORMAT !== 'json') return pretty({ sync: true, colorize: true, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,name' });
  return pino.destination({ fd: 1, sync: true });
}

export function createLogger(level: string = process.env.PGSUB_LOG_LEVEL ?? 'info', destination?: pino.DestinationStream): Logger {
  return pino(
    {
      name: 'pgsub',
      level,
      base: { pid: process.pid },
      redact: { paths: ['password', '*.password', '*.*.password', 'conninfo', '*.conninfo'], censor: '****' },
      serializers: { err: serializeError },
    },
    destination ?? defaultDestination(),
  );
}

/**
 * The fields of PostgreSQL's ErrorResponse as pg (DatabaseError), postgres.js (PostgresError)
 * and connect/failure.ts (ServerError) name them, and the name each is logged under. The
 * query text and parameters postgres.js may attach are left out (they can hold row values).
 */
const SERVER_FIELDS: readonly (readonly [string, string])[] = [
  ['severity', 'severity'],
  ['detail', 'detail'],
  ['hint', 'hint'],
  ['where', 'where'],
  ['position', 'position'],
  ['schema', 'schema'],
  ['schema_name', 'schema'],
  ['table', 'table'],
  ['table_name', 'table'],
  ['column', 'column'],
  ['column_name', 'column'],
  ['dataType', 'dataType'],
  ['data_type_name', 'dataType'],
  ['constraint', 'constraint'],
  ['constraint_name', 'constraint'],
  ['routine', 'routine'],
];
/** A Node system error's own fields (ECONNREFUSED and the like); its code is logged as `code`. */
const SYSTEM_FIELDS = ['syscall', 'address', 'port'] as const;
/** Context keys never logged, whatever an error carries by accident. */
const SECRET_KEYS = new Set(['password', 'sslpassword', 'conninfo', 'connectionString']);
/** How deep a chain of causes is followed. */
const MAX_CAUSES = 3;

function redactValue(v: unknown): unknown {
  return typeof v === 'string' ? redactSecrets(v) : v;
}

/**
 * An error as one log field: `type` (its class: ApplyError, DatabaseError…), `code`
 * (PGSUB_…, a SQLSTATE for a server error, a Node code like ECONNREFUSED), `message`, the
 * context fields of a PgsubError (relation, column, LSNs…) and a server error's fields
 * (detail, hint, where, schema, table, column, constraint), then `cause` (the same, without
 * its stack) and `stack`. Every string goes through redactSecrets and keys that name a
 * password or conninfo are dropped, so no secret reaches the log.
 *
 * The stack is kept at every level, not only at debug: a handled error is logged once on
 * one line (runner.ts), and the stack is what tells which step failed; a retried failure
 * repeats it in bytes, never in lines. The causes' stacks (a driver's parser, a socket)
 * are left out: the error that wraps them says where pgsub was.
 *
 * Not an Error (a string, a plain object thrown by a library): its message and code.
 */
export function serializeError(err: unknown, depth = 0): Record<string, unknown> {
  if (err === null || typeof err !== 'object') return { type: typeof err, message: redactSecrets(String(err)) };
  const e = err as Record<string, unknown> & { context?: unknown; stack?: unknown; cause?: unknown };
  const ctor = (err as { constructor?: { name?: unknown } }).constructor;
  const out: Record<string, unknown> = {};
  // Context first: the class's own fields below win over a context key of the same name.
  if (e.context !== null && typeof e.context === 'object') {
    for (const [k, v] of Object.entries(e.context)) if (v !== undefined && !SECRET_KEYS.has(k)) out[k] = redactValue(v);
  }
  out.type = typeof ctor?.name === 'string' && ctor.name !== 'Object' ? ctor.name : typeof e.name === 'string' ? e.name : 'Object';
  if (e.code !== undefined) out.code = e.code;
  out.message = redactSecrets(String(e.message ?? ''));
  for (const [from, to] of SERVER_FIELDS) if (e[from] !== undefined && e[from] !== null && e[from] !== '') out[to] = redactValue(e[from]);
  for (const k of SYSTEM_FIELDS) if (e[k] !== undefined) out[k] = redactValue(e[k]);
  if (e.cause !== undefined && depth < MAX_CAUSES) {
    const { stack: _, ...cause } = serializeError(e.cause, depth + 1);
    out.cause = cause;
  }
  if (typeof e.stack === 'string') out.stack = redactSecrets(e.stack);
  return out;
}
