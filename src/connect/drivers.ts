/**
 * Handing a session opened by open.ts to the drivers. node-postgres takes it as its
 * `stream`, postgres.js from its `socket` option; both are told to use no TLS of their
 * own (the socket already is TLS when it should be) and then "log in" as usual: their
 * connect() resolves at once, their startup packet is swallowed and answered with the
 * server's own AuthenticationOk … ReadyForQuery from the real login. So every connection
 * pgsub opens gets libpq's conninfo semantics, whichever driver runs it. Failures are
 * classified here once (connect-failure.ts), naming the side.
 */
import net from 'node:net';
import pg from 'pg';
import type { ConnInfo } from '../config/conninfo.js';
import { type ConnectionPurpose, connectFailure } from '../connect-failure.js';
import type { Side } from '../errors.js';
import { startupLength } from './messages.js';
import { type Opened, type OpenOptions, openServer } from './open.js';

export interface ConnectOptions extends OpenOptions {
  side: Side;
  purpose: ConnectionPurpose;
  /** What is being opened, for the message of a lost connection ("replication connection"). */
  what: string;
}

/** Make an authenticated socket look to a driver like one it is about to log in on. */
export function handOver(o: Opened): net.Socket {
  const socket = o.socket;
  const write = socket.write as (...a: unknown[]) => boolean;
  // Stays in place once the startup message went by (a pass-through): a caller may have
  // wrapped socket.write over this one (connect.ts's watchdog), and putting the original
  // back would silently remove that wrapper.
  let started = false;
  socket.write = function (this: net.Socket, chunk: unknown, encoding?: unknown, cb?: unknown): boolean {
    if (started) return write.call(socket, chunk, encoding, cb);
    const buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as string, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8');
    const n = startupLength(buf);
    if (n === 0) return write.call(socket, chunk, encoding, cb);
    started = true;
    const callback = typeof encoding === 'function' ? encoding : typeof cb === 'function' ? cb : null;
    process.nextTick(() => {
      socket.emit('data', o.replay);
      socket.resume();
      (callback as (() => void) | null)?.();
    });
    return buf.length > n ? write.call(socket, buf.subarray(n)) : true;
  } as typeof socket.write;
  // node-postgres connects its stream itself; this one is connected already.
  socket.connect = (() => {
    process.nextTick(() => socket.emit('connect'));
    return socket;
  }) as unknown as typeof socket.connect;
  return socket;
}

/** Open a session for `info`, typed failures naming the side. */
export async function openSession(info: ConnInfo, opts: ConnectOptions): Promise<Opened> {
  try {
    return await openServer(info, opts);
  } catch (err) {
    throw connectFailure(opts.side, info, err, opts.purpose, opts.what);
  }
}

/** A node-postgres Client, not yet connected, whose connect() takes over `opened`. */
export function pgClientOver(info: ConnInfo, opened: Opened, extra: Partial<pg.ClientConfig> & Record<string, unknown> = {}): pg.Client {
  return new pg.Client({
    ...extra,
    stream: handOver(opened),
    host: opened.spec.host,
    port: opened.spec.port,
    user: info.user,
    database: info.database,
    ssl: false,
    keepAlive: false,
  } as unknown as pg.ClientConfig);
}

/** A connected node-postgres Client over a session opened with libpq's semantics. */
export async function connectPgClient(info: ConnInfo, opts: ConnectOptions, extra: Partial<pg.ClientConfig> & Record<string, unknown> = {}): Promise<pg.Client> {
  const opened = await openSession(info, opts);
  const client = pgClientOver(info, opened, extra);
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (err) {
    opened.socket.destroy();
    throw connectFailure(opts.side, info, err, opts.purpose, opts.what);
  }
  return client;
}

/**
 * For postgres.js's `socket` option: the authenticated socket, with host and port as it
 * names them in errors. Never rejects: postgres.js keeps a connection whose socket factory
 * rejected in its connecting state for good (every later query of that pool waits for
 * ever), so a failed open is a socket that errors with the failure and closes, which takes
 * postgres.js's normal path: the query rejects with that error, the next one connects again.
 */
export async function postgresSocket(info: ConnInfo, opts: ConnectOptions): Promise<net.Socket> {
  try {
    const opened = await openSession(info, opts);
    return Object.assign(handOver(opened), { host: opened.spec.host, port: opened.spec.port });
  } catch (err) {
    return failingSocket(err instanceof Error ? err : new Error(String(err)));
  }
}

/**
 * Fails once postgres.js has written its startup message to it: failed before, the message
 * would stay in postgres.js's write buffer and go out ahead of the next connection's own.
 */
function failingSocket(err: Error): net.Socket {
  const failed = new net.Socket();
  const fail = () => setImmediate(() => failed.destroy(err));
  failed.write = (() => {
    fail();
    return true;
  }) as typeof failed.write;
  return failed;
}
