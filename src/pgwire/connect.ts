/**
 * Connections to the target.
 *
 * The apply connection is a WireConnection (wire.ts): pipelined, one named prepared
 * statement per SQL text, values in text or binary format as pgoutput sent them. Its
 * session behaves like the native apply worker's: session_replication_role = replica
 * (ordinary triggers and FK checks do not fire; ENABLE REPLICA/ALWAYS triggers do), an
 * empty search_path so only schema-qualified names resolve, row_security = off (a policy
 * that would filter rows is an error, never a silently missed row), and the configured
 * synchronous_commit. These are startup parameters, set before the first statement.
 *
 * The maintenance connection (porsager `postgres`) serves drizzle: pgsub's schema
 * migrations, progress reads, `pgsub status`. Its socket is watched like the wire's: sent
 * bytes unanswered for target_timeout destroy it (postgres.js fails the query and opens a
 * new connection for the next one), so a silent network cannot hang startup or the
 * launcher's long-lived connection forever.

 */
import type net from 'node:net';
import postgres from 'postgres';
import type { ConnInfo } from '../config/conninfo.js';
import { connectPgClient, postgresSocket } from '../connect/drivers.js';
import { WireConnection, type WireResult, type WireValue } from './wire.js';
import type { Statement } from './statement.js';

export type Sql = postgres.Sql<Record<string, never>>;
export type { WireConnection, WireValue };

export interface ApplyConnectionOptions {
  applicationName: string;
  synchronousCommit: string;
  /** target_timeout in ms (wire-watchdog.ts); 0 or absent: no timeout. */
  timeoutMs?: number;
}

export function openApplyConnection(info: ConnInfo, opts: ApplyConnectionOptions): Promise<WireConnection> {
  const timeoutMs = opts.timeoutMs ?? 0;
  return WireConnection.connect(info, {
    applicationName: opts.applicationName,
    timeoutMs,
    probe: timeoutMs > 0 ? (pid) => backendBusy(info, `${opts.applicationName}_probe`, pid, timeoutMs) : undefined,
    startupParameters: {
      search_path: '',
      session_replication_role: 'replica',
      // A target fenced read-only for a cutover (or the old primary taking changes back) still takes the apply.
      default_transaction_read_only: 'off',
      // As a role under row-level security: a policy that would hide rows fails the statement
      // instead (apply/sql/row-security.ts), so no change is lost to a filtered UPDATE.
      row_security: 'off',
      synchronous_commit: opts.synchronousCommit,
      datestyle: 'ISO',
      intervalstyle: 'postgres',
      extra_float_digits: '3',
    },
  });
}

/**
 * Whether backend `pid` is running a statement, asked on a short-lived connection of its
 * own: a silent apply connection whose backend waits on a lock is alive; one whose backend
 * waits for its client (idle, or blocked sending to it), or that cannot be asked, is not.
 */
async function backendBusy(info: ConnInfo, applicationName: string, pid: number, timeoutMs: number): Promise<boolean> {
  const limit = Math.min(timeoutMs, (info.connectTimeoutSeconds ?? 10) * 1000);
  let client: Awaited<ReturnType<typeof connectPgClient>> | null = null;
  try {
    client = await connectPgClient(info, { side: 'target', purpose: 'apply', what: 'probe connection', applicationName, connectTimeoutMs: limit }, { query_timeout: limit });
    const { rows } = await client.query<{ state: string | null; wait_event_type: string | null }>('SELECT state, wait_event_type FROM pg_catalog.pg_stat_activity WHERE pid = $1', [
      pid,
    ]);
    return rows[0]?.state === 'active' && rows[0].wait_event_type !== 'Client';
  } catch {
    return false;
  } finally {
    if (client) {
      const c = client;
      c.end().catch(() => {});
      setTimeout(() => c.connection.stream.destroy(), 1000).unref();
    }
  }
}

/**
 * Statements that form one implicit transaction of their own (up to the Sync). Their
 * rejections are observed before the Sync is awaited, so a failing one is reported once,
 * here, and never as an unhandled rejection.
 */
export async function runAlone(conn: WireConnection, statements: readonly Statement[]): Promise<WireResult[]> {
  const results = statements.map((s) => conn.execute(s.text, s.params, s.wantRows || s.paramTypes ? { wantRows: s.wantRows, paramTypes: s.paramTypes } : undefined));
  for (const r of results) r.catch(() => {});
  await conn.sync();
  return Promise.all(results);
}

/** Rows of a catalog query as objects, by the names of its SELECT list in order. */
export async function queryRows<T extends Record<string, string | null>>(
  conn: WireConnection,
  names: readonly (keyof T & string)[],
  text: string,
  params: WireValue[] = [],
): Promise<T[]> {
  const result = await conn.execute(text, params, { wantRows: true });
  return result.rows.map((row) => Object.fromEntries(names.map((n, i) => [n, (row[i] ?? null) as string | null])) as T);
}

// Values are read back as text: the driver must not re-parse them (booleans stay 't'/'f').
const PASS_THROUGH_OIDS = [16, 17, 20, 21, 23, 26, 114, 700, 701, 1082, 1114, 1184, 3802];

/** target_timeout for maintenance connections; the service sets it from its config (setMaintenanceTimeout). */
let maintenanceTimeoutMs = 60_000;

export function setMaintenanceTimeout(ms: number): void {
  maintenanceTimeoutMs = ms;
}

/**
 * A connected socket for postgres.js that destroys itself when bytes it sent get no byte
 * back for `timeoutMs` (a long statement on a maintenance connection is a bug; a lock wait
 * that long is retried).
 */
async function watchedSocket(info: ConnInfo, applicationName: string, timeoutMs: number): Promise<net.Socket> {
  // Logged in by src/connect (libpq's conninfo semantics), Nagle off: postgres.js leaves it on,
  // and a statement written in two pieces (BEGIN then the query) would wait ~40 ms for an ACK.
  const socket = await postgresSocket(info, {
    side: 'target',
    purpose: 'apply',
    what: 'a maintenance connection',
    applicationName,
    startup: { client_encoding: 'UTF8', default_transaction_read_only: 'off' },
  });
  let waitingSince: number | null = null;
  const write = socket.write.bind(socket) as (...args: unknown[]) => boolean;
  socket.write = ((...args: unknown[]) => {
    waitingSince ??= Date.now();
    return write(...args);
  }) as typeof socket.write;
  socket.on('data', () => (waitingSince = null));
  closeWithError(socket);
  const timer = setInterval(
    () => {
      if (waitingSince !== null && Date.now() - waitingSince >= timeoutMs) {
        socket.destroy(new Error(`no answer from the target for ${Math.round(timeoutMs / 1000)} s (target_timeout)`));
      }
    },
    Math.max(50, Math.min(1000, timeoutMs / 4)),
  );
  timer.unref();
  socket.once('close', () => clearInterval(timer));
  return socket;
}

/**
 * postgres.js rejects what is in flight on a socket's 'error' and everything sent on its
 * 'close', but not what was sent between the two (the close of a failed socket reports
 * hadError, and it assumes the error rejected all): a query issued in reaction to the
 * error went out on the dead socket and waited for ever. 'close' follows 'error' here
 * before any reaction can run; the socket's own later 'close' is not repeated.
 */
function closeWithError(socket: net.Socket): void {
  const emit = socket.emit.bind(socket) as (event: string | symbol, ...args: unknown[]) => boolean;
  let closeEmitted = false;
  socket.emit = ((event: string | symbol, ...args: unknown[]) => {
    if (event === 'close') {
      if (closeEmitted) return false;
      closeEmitted = true;
      return emit(event, ...args);
    }
    const handled = emit(event, ...args);
    if (event === 'error' && !closeEmitted) {
      closeEmitted = true;
      socket.destroy();
      emit('close', true);
    }
    return handled;
  }) as typeof socket.emit;
}

const ROLLBACK = Symbol('rollback');

/**
 * Runs SQL in a transaction that is always rolled back, on a short-lived connection of
 * its own: checks that must not touch the apply session (a failure there would abort its
 * transaction; a temporary table would keep it from being prepared).
 */
export function rolledBackOn(info: ConnInfo, applicationName: string): (sql: string) => Promise<void> {
  return async (sql) => {
    const conn = openMaintenance(info, applicationName);
    try {
      await conn.begin(async (tx) => {
        // As the apply session sees names: an empty search_path (pg_catalog only).
        await tx.unsafe(`SELECT pg_catalog.set_config('search_path', '', true)`);
        await tx.unsafe(sql);
        throw ROLLBACK;
      });
    } catch (err) {
      if (err !== ROLLBACK) throw err;
    } finally {
      await conn.end({ timeout: 5 }).catch(() => {});
    }
  };
}

export function openMaintenance(info: ConnInfo, applicationName: string): Sql {
  const timeoutMs = maintenanceTimeoutMs;
  return postgres({
    socket: () => watchedSocket(info, applicationName, timeoutMs),
    host: info.host,
    port: info.port,
    user: info.user,
    database: info.database,
    ssl: false,
    max: 1,
    idle_timeout: 0,
    max_lifetime: null,
    // src/connect bounds the login itself (connect_timeout per host); keepalives are set there too.
    connect_timeout: 0,
    // pgsub retries with its own backoff; postgres.js's grows with every failed connect of a
    // pool (up to 20 s) and would hold the first query after an outage back that long.
    backoff: 0,
    keep_alive: null,
    fetch_types: false,
    // postgres.js reads PGTARGETSESSIONATTRS itself (and throws on "any"); src/connect has checked the session already.
    ...(process.env.PGTARGETSESSIONATTRS ? { target_session_attrs: info.settings.target_session_attrs === 'read-write' ? 'read-write' : 'primary' } : {}),
    prepare: true,
    onnotice: () => {},
    types: {
      pgsubText: { to: 25, from: PASS_THROUGH_OIDS, serialize: (x: unknown) => String(x), parse: (x: string) => x },
    },
  } as unknown as postgres.Options<Record<string, never>>) as unknown as Sql;
}
