/**
 * The apply connection to the target (porsager `postgres`, one connection, max: 1).
 * Its session behaves like the native apply worker's: session_replication_role =
 * replica (ordinary triggers and FK checks do not fire; ENABLE REPLICA/ALWAYS triggers
 * do), an empty search_path so only schema-qualified names resolve, and the configured
 * synchronous_commit. These are startup parameters, so they survive a driver reconnect.
 *
 * Statements are pipelined: `send` puts one on the wire without waiting for its result;
 * `Pipeline` bounds how many are outstanding and surfaces the first error in send order.
 */
import postgres from 'postgres';
import { redactConninfo, redactSecrets, tlsOptions, type ConnInfo } from '../config/conninfo.js';
import { ConnectionLostError } from '../errors.js';

export type Sql = postgres.Sql<Record<string, never>>;
export type Row = Record<string, unknown>;
export interface StatementResult { count: number; rows: Row[]; command: string }

// Values reach us as the publisher's text output; the driver must pass them through
// untouched (its defaults would JSON-encode json, re-format dates and booleans…).
const PASS_THROUGH_OIDS = [16, 17, 20, 21, 23, 26, 114, 700, 701, 1082, 1114, 1184, 3802];

export interface TargetOptions {
  applicationName: string;
  synchronousCommit: string;
  /** Apply-session settings; off for pgsub's own maintenance connections. */
  replicaRole: boolean;
}

export function openTarget(info: ConnInfo, opts: TargetOptions): Sql {
  const connection: Record<string, string> = {
    application_name: opts.applicationName,
    search_path: '',
    synchronous_commit: opts.synchronousCommit,
  };
  if (opts.replicaRole) connection.session_replication_role = 'replica';
  return postgres({
    host: info.host,
    port: info.port,
    user: info.user,
    pass: info.password ?? '',
    database: info.database,
    ssl: tlsOptions(info) || false,
    max: 1,
    idle_timeout: 0,
    max_lifetime: null,
    connect_timeout: info.connectTimeoutSeconds ?? 30,
    fetch_types: false,
    prepare: true,
    connection,
    onnotice: () => {},
    types: {
      pgsubText: { to: 25, from: PASS_THROUGH_OIDS, serialize: (x: unknown) => String(x), parse: (x: string) => x },
    },
  } as unknown as postgres.Options<Record<string, never>>) as unknown as Sql;
}

/** Send a statement now; the promise settles when its result arrives. */
export function send(sql: Sql, text: string, params: unknown[] = []): Promise<StatementResult> {
  const query = sql.unsafe(text, params as postgres.ParameterOrJSON<never>[], { prepare: true });
  query.execute();
  return Promise.resolve(query).then((result) => ({
    count: result.count ?? 0,
    rows: result as unknown as Row[],
    command: (result as unknown as { command: string }).command,
  }));
}

/** Connection-level failures are retryable; SQL errors carry a SQLSTATE and are not rewritten. */
export function classifyTargetError(err: unknown, info: ConnInfo): unknown {
  const e = err as { code?: string; message?: string };
  if (e && typeof e.code === 'string' && /^(CONNECTION_|ECONNRESET|ECONNREFUSED|EPIPE|ETIMEDOUT|CONNECT_TIMEOUT)/.test(e.code)) {
    return new ConnectionLostError(`target connection lost (${redactConninfo(info)}): ${redactSecrets(e.message ?? '')}`, { target: redactConninfo(info) }, { cause: err });
  }
  return err;
}

/**
 * A window of statements in flight. `push` never lets more than `limit` be outstanding:
 * past that it waits for the oldest, which is also where errors surface, oldest first,
 * so the root cause (not "current transaction is aborted") is what gets reported.
 */
export class Pipeline {
  private readonly inFlight: Promise<unknown>[] = [];
  private head = 0;

  constructor(private readonly limit: number) {}

  async push<T>(promise: Promise<T>): Promise<void> {
    // Rejections are observed when drained; this keeps Node from flagging them early.
    promise.catch(() => {});
    this.inFlight.push(promise);
    if (this.inFlight.length - this.head > this.limit) await this.inFlight[this.head++];
    if (this.head > 4096) {
      this.inFlight.splice(0, this.head);
      this.head = 0;
    }
  }

  get size(): number {
    return this.inFlight.length - this.head;
  }

  /** Wait for everything sent; throw the first failure in send order. */
  async drain(): Promise<void> {
    try {
      while (this.head < this.inFlight.length) await this.inFlight[this.head++];
    } finally {
      this.inFlight.length = 0;
      this.head = 0;
    }
  }

  /** Forget outstanding statements after a failure; their rejections stay observed. */
  reset(): void {
    this.inFlight.length = 0;
    this.head = 0;
  }
}
