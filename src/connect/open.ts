/**
 * Opening one PostgreSQL session as libpq's PQconnectPoll does, for every connection pgsub
 * makes: the hosts in order (or shuffled, load_balance_hosts=random), each within
 * connect_timeout; TLS per sslmode with libpq's fallbacks (prefer: TLS, then plain if the
 * server cannot or the TLS attempt fails; allow: plain, then TLS if the server refuses;
 * never over a Unix socket), sslnegotiation=direct; the startup packet; authentication
 * (auth.ts); target_session_attrs, checked on the server's reported parameters or by a
 * query, moving on to the next host when it does not match. What it returns is an
 * authenticated socket and the bytes from AuthenticationOk to ReadyForQuery, which
 * drivers.ts hands to node-postgres or postgres.js as if they had logged in themselves.
 */
import net from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { ConnInfo, HostSpec } from '../config/conninfo.js';
import { authenticate } from './auth.js';
import { HandshakeFailure, ServerError } from './failure.js';
import { cstr, errorFields, frontend, MessageReader, SSL_REQUEST, startupPacket } from './messages.js';
import { startTls, tlsPlan } from './tls.js';

/** TCP keepalive idle time when keepalives_idle is unset: a vanished peer is found in seconds, not hours. */
export const KEEPALIVE_IDLE_MS = 10_000;
/** connect_timeout when unset (libpq waits for ever; a service must not). */
export const DEFAULT_CONNECT_TIMEOUT_S = 30;

export interface OpenOptions {
  applicationName: string;
  /** Startup parameters besides user, database, application_name and options (replication, GUCs). */
  startup?: Record<string, string>;
  /** Appended to the conninfo's `options` (later -c settings win). */
  options?: string;
  /** Overrides connect_timeout (a short probe). */
  connectTimeoutMs?: number;
}

export interface Opened {
  socket: net.Socket;
  /** AuthenticationOk … ReadyForQuery as the server sent them. */
  replay: Buffer;
  parameters: Map<string, string>;
  spec: HostSpec;
  tls: boolean;
}

type Method = 'plain' | 'tls' | 'direct';

function methods(info: ConnInfo, spec: HostSpec): Method[] {
  if (spec.host.startsWith('/') && !spec.hostaddr) return ['plain'];
  const direct = info.settings.sslnegotiation === 'direct';
  switch (info.sslmode) {
    case 'disable':
      return ['plain'];
    case 'allow':
      return ['plain', 'tls'];
    case 'prefer':
      return ['tls', 'plain'];
    default:
      return [direct ? 'direct' : 'tls'];
  }
}

function connectSocket(spec: HostSpec): net.Socket {
  if (spec.host.startsWith('/') && !spec.hostaddr) return net.connect(`${spec.host}/.s.PGSQL.${spec.port}`);
  return net.connect({ port: spec.port, host: spec.hostaddr ?? spec.host });
}

/** Open a session on the first host that connects and matches target_session_attrs. */
export async function openServer(info: ConnInfo, opts: OpenOptions): Promise<Opened> {
  let specs = [...info.hosts];
  if (info.settings.load_balance_hosts === 'random') specs = specs.sort(() => Math.random() - 0.5);
  const attrs = info.settings.target_session_attrs ?? 'any';
  const passes = attrs === 'prefer-standby' ? ['standby', 'any'] : [attrs];
  const failures: string[] = [];
  let last: unknown = null;
  for (const want of passes) {
    for (const spec of specs) {
      try {
        const opened = await openHost(info, spec, opts);
        const mismatch = await sessionAttrsMismatch(opened, want).catch((err: unknown) => {
          opened.socket.destroy();
          throw err;
        });
        if (mismatch === null) return opened;
        opened.socket.destroy();
        failures.push(`${spec.host}:${spec.port}: ${mismatch}`);
        last = new HandshakeFailure('network', `${mismatch} (target_session_attrs=${attrs})`);
      } catch (err) {
        // libpq tries the next host when the connection or TLS fails, not when the server refuses the login.
        if (err instanceof ServerError || (err instanceof HandshakeFailure && (err.kind === 'auth' || err.kind === 'config'))) throw err;
        failures.push(`${spec.host}:${spec.port}: ${(err as Error).message}`);
        last = err;
      }
    }
  }
  if (specs.length > 1 && last instanceof Error) {
    const kind = last instanceof HandshakeFailure ? last.kind : 'network';
    throw new HandshakeFailure(kind, `no host could be used: ${failures.join('; ')}`, { cause: last });
  }
  throw last;
}

/** One host: the encryption methods sslmode allows, in libpq's order. */
async function openHost(info: ConnInfo, spec: HostSpec, opts: OpenOptions): Promise<Opened> {
  const order = methods(info, spec);
  let first: unknown = null;
  for (let i = 0; i < order.length; i++) {
    try {
      return await attempt(info, spec, opts, order[i]!, i < order.length - 1);
    } catch (err) {
      first ??= err;
      const retriable = err instanceof ServerError || (err instanceof HandshakeFailure && err.kind === 'tls' && order[i] !== 'plain');
      if (!retriable || i === order.length - 1) throw first === err ? err : withEarlier(err, first);
    }
  }
  throw first;
}

function withEarlier(err: unknown, earlier: unknown): unknown {
  if (err instanceof Error && earlier instanceof Error) err.message = `${err.message} (after: ${earlier.message})`;
  return err;
}

function timeoutMs(info: ConnInfo, opts: OpenOptions): number {
  if (opts.connectTimeoutMs !== undefined) return opts.connectTimeoutMs;
  const s = info.connectTimeoutSeconds;
  if (s === undefined) return DEFAULT_CONNECT_TIMEOUT_S * 1000;
  return s <= 0 ? 0 : Math.max(2, s) * 1000;
}

/** One connection attempt with one encryption method; `mayFallBack`: prefer's 'N' continues in plain. */
async function attempt(info: ConnInfo, spec: HostSpec, opts: OpenOptions, method: Method, mayFallBack: boolean): Promise<Opened> {
  const raw = connectSocket(spec);
  const limit = timeoutMs(info, opts);
  const timer = limit > 0 ? setTimeout(() => raw.destroy(Object.assign(new Error(`timeout expired (connect_timeout ${limit / 1000} s)`), { code: 'ETIMEDOUT' })), limit) : null;
  try {
    await new Promise<void>((resolve, reject) => {
      raw.once('connect', resolve);
      raw.once('error', reject);
    });
    raw.removeAllListeners('error');
    if (info.settings.keepalives !== '0' && !(spec.host.startsWith('/') && !spec.hostaddr)) {
      const idle = info.settings.keepalives_idle !== undefined && Number(info.settings.keepalives_idle) > 0 ? Number(info.settings.keepalives_idle) * 1000 : KEEPALIVE_IDLE_MS;
      raw.setKeepAlive(true, idle);
    }
    raw.setNoDelay(true);
    let socket: net.Socket = raw;
    let secure: TLSSocket | null = null;
    if (method !== 'plain') {
      const plan = tlsPlan(info, spec);
      if (method === 'tls') {
        const reader = new MessageReader(raw);
        raw.write(SSL_REQUEST);
        const answer = (await reader.byte())[0];
        const rest = reader.pending;
        reader.detach();
        if (answer === 0x53 /* S */) {
          if (rest > 0) throw new HandshakeFailure('tls', 'received unencrypted data after SSL response');
          secure = await startTls(raw, plan);
        } else if (answer === 0x4e /* N */) {
          if (!mayFallBack || info.sslmode !== 'prefer') throw new HandshakeFailure('tls', 'server does not support SSL, but SSL was required');
          raw.resume();
        } else {
          throw new HandshakeFailure('network', 'received invalid response to SSL negotiation');
        }
      } else {
        secure = await startTls(raw, plan);
      }
      if (secure) socket = secure;
    }
    const opened = await login(info, spec, opts, socket, secure);
    return opened;
  } catch (err) {
    raw.destroy();
    if (err instanceof HandshakeFailure || err instanceof ServerError) throw err;
    throw new HandshakeFailure(
      'network',
      `connection to server at ${spec.host}${spec.hostaddr ? ` (${spec.hostaddr})` : ''}, port ${spec.port} failed: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  } finally {
    if (timer) clearTimeout(timer);
  }
}

async function login(info: ConnInfo, spec: HostSpec, opts: OpenOptions, socket: net.Socket, secure: TLSSocket | null): Promise<Opened> {
  const reader = new MessageReader(socket);
  const params: Record<string, string> = { user: info.user, database: info.database, application_name: opts.applicationName };
  const options = [info.settings.options, opts.options].filter((o) => o).join(' ');
  if (options) params.options = options;
  // Every driver pgsub hands the socket to reads and writes text as UTF-8 (the drivers' own startup sent it).
  params.client_encoding = 'UTF8';
  Object.assign(params, opts.startup ?? {});
  socket.write(startupPacket(params));
  const warnings: string[] = [];
  const ok = await authenticate({ info, spec, socket, tls: secure, reader, warnings });
  const replay: Buffer[] = [ok.raw];
  const parameters = new Map<string, string>();
  while (true) {
    const m = await reader.message();
    if (m.type === 'E') throw new ServerError(errorFields(m.body));
    replay.push(m.raw);
    if (m.type === 'S') {
      const [k = '', v = ''] = m.body.toString('utf8').split('\0');
      parameters.set(k, v);
    }
    if (m.type === 'Z') break;
  }
  const leftover = reader.detach();
  if (leftover.length > 0) replay.push(leftover);
  return { socket, replay: Buffer.concat(replay), parameters, spec, tls: secure !== null };
}

/** Why the session does not match target_session_attrs `want`, or null (libpq's checks, in its order). */
async function sessionAttrsMismatch(o: Opened, want: string): Promise<string | null> {
  if (want === 'any') return null;
  if (want === 'read-write' || want === 'read-only') {
    const dtro = o.parameters.get('default_transaction_read_only');
    const hot = o.parameters.get('in_hot_standby');
    const readOnly = dtro !== undefined && hot !== undefined ? dtro === 'on' || hot === 'on' : (await simpleValue(o, 'SHOW transaction_read_only')) === 'on';
    if (want === 'read-write' && readOnly) return 'session is read-only';
    if (want === 'read-only' && !readOnly) return 'session is not read-only';
    return null;
  }
  const hot = o.parameters.get('in_hot_standby');
  const standby = hot !== undefined ? hot === 'on' : (await simpleValue(o, 'SELECT pg_catalog.pg_is_in_recovery()')) === 't';
  if (want === 'primary' && standby) return 'server is in hot standby mode';
  if (want === 'standby' && !standby) return 'server is not in hot standby mode';
  return null;
}

/** The one value a simple query returns, read before the driver takes the socket over. */
async function simpleValue(o: Opened, sql: string): Promise<string | null> {
  const reader = new MessageReader(o.socket);
  o.socket.resume();
  o.socket.write(frontend('Q', cstr(sql)));
  let value: string | null = null;
  let failure: ServerError | null = null;
  while (true) {
    const m = await reader.message();
    if (m.type === 'D' && m.body.readInt16BE(0) > 0) {
      const len = m.body.readInt32BE(2);
      value = len < 0 ? null : m.body.toString('utf8', 6, 6 + len);
    } else if (m.type === 'E') failure = new ServerError(errorFields(m.body));
    else if (m.type === 'Z') break;
  }
  reader.detach();
  if (failure) throw failure;
  return value;
}
