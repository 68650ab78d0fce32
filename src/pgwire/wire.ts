/**
 * The apply connection's wire: a pipelined extended-query executor on top of node-postgres.
 * A `pg.Client` connects over a session src/connect opened (auth, TLS, startup parameters), then
 * this module takes its `Connection` over — it removes every listener the Client attached
 * and is the only reader of backend messages from then on; the Client object is never
 * used again (never call client.query on it). pg-protocol's Bind sends a Buffer parameter
 * in binary format and a string in text format, which is how pgoutput's binary-mode
 * values reach the target unchanged; results always come back in text format.
 *
 * Invariants:
 *  - Every message that earns a response has an op queued (wire-responses.ts), in wire
 *    order; responses are matched FIFO (exec: [ParseComplete] BindComplete DataRow*
 *    CommandComplete; copyIn: [ParseComplete] BindComplete CopyInResponse CommandComplete;
 *    close: CloseComplete; sync and simple query: … ReadyForQuery).
 *  - copyIn writes CopyData… CopyDone right behind its Execute in the same synchronous
 *    write, without waiting for CopyInResponse. The server reads them as the copy's input;
 *    after a failure it skips to the Sync and drops them (postgres.c ignores copy messages
 *    outside a copy), so the abort rules below hold unchanged.
 *  - Writes are corked and released once per tick, followed by a Flush so results of an
 *    unsynced batch come back. Sync is sent only when the caller asks (sync()).
 *  - A statement counts as prepared only after its ParseComplete. A Parse whose outcome is
 *    unknown may be relied on only within its own sync segment: if it fails or is skipped,
 *    every statement after it up to the Sync is skipped by the server anyway.
 *  - After an ErrorResponse the server skips everything up to the next Sync. The failing
 *    statement rejects with the server's DatabaseError; every later statement in that
 *    segment rejects at once with PipelineAbortedError, and execute() rejects without
 *    sending anything until the caller calls sync().
 *  - Socket loss, or a FATAL error, rejects everything pending with ConnectionLostError
 *    and every later call too, and resolves `lost`, so an idle owner hears of it at once.
 *    Mass rejections (aborted, lost) are pre-marked handled so they cannot crash the
 *    process as unhandled; the root cause is not.
 *  - target_timeout (opts.timeoutMs): a server silent for that long while operations are
 *    outstanding fails the connection, unless a probe on another connection finds the
 *    backend running them (a lock wait, a long statement). A fully synced idle connection
 *    is pinged with a Sync after half of it, so a dead or black-holed one is found idle too
 *    (wire-watchdog.ts).
 * This file is the sending half: every write, corked per tick, and the statement cache.
 * Matching the answers to the ops is wire-responses.ts; statement text and what the values
 * mean live in apply/sql/ and apply/handlers/; the ops, errors and types in wire-ops.ts.
 */
import { copyFrames, parseServerVersion } from './wire-tags.js';
import { redactConninfo, redactSecrets, type ConnInfo } from '../config/conninfo.js';
import { openSession, pgClientOver } from '../connect/drivers.js';
import { connectFailure } from '../connect-failure.js';
import { ConnectionLostError } from '../errors.js';
import { ResponseMatcher, type ResponseHost } from './wire-responses.js';
import { WireWatchdog, type WatchedWire } from './wire-watchdog.js';
import {
  CloseOp,
  ExecOp,
  PipelineAbortedError,
  QueryOp,
  Stmt,
  SyncOp,
  WireUsageError,
  type Message,
  type Op,
  type PgConnection,
  type SimpleQueryResult,
  type TxStatus,
  type WireOptions,
  type WireResult,
  type WireValue,
} from './wire-ops.js';
export { PipelineAbortedError, WireUsageError } from './wire-ops.js';
export type { SimpleQueryResult, TxStatus, WireNotice, WireOptions, WireResult, WireValue } from './wire-ops.js';

const NO_VALUES: readonly WireValue[] = [];
const NO_TYPES: readonly number[] = [];
const noop = () => {};
const EARLY_RELEASE_BYTES = 256 * 1024;
/** How long close() waits for the server to end the connection before dropping the socket. */
const CLOSE_TIMEOUT_MS = 2000;

/** A rejection that is a consequence of another error: never reported as unhandled. */
function consequential<T>(err: unknown): Promise<T> {
  const p = Promise.reject(err);
  p.catch(noop);
  return p as Promise<T>;
}

export class WireConnection {
  readonly serverVersionNum: number;
  readonly processId: number;
  readonly #con: PgConnection;
  readonly #info: ConnInfo;
  readonly #cacheSize: number;
  readonly #cache = new Map<string, Stmt>();
  /** The ops awaiting an answer, and the matching of every backend message to them. */
  readonly #responses: ResponseMatcher;
  readonly #watchdog: WireWatchdog;
  #nextName = 0;
  #segment = 0; // incremented by every Sync written
  #unsynced = false; // execute() written since the last Sync
  #needFlush = false;
  #corked = false;
  #lost: ConnectionLostError | null = null;
  #closing: ConnectionLostError | null = null;
  #closed: Promise<void>;
  #markClosed!: () => void;
  #markLost!: (err: ConnectionLostError) => void;
  /** Resolves when the connection is lost other than by close() (never rejects). */
  readonly lost: Promise<ConnectionLostError>;

  private constructor(con: PgConnection, info: ConnInfo, opts: WireOptions, params: Map<string, string>, processId: number) {
    this.#con = con;
    this.#info = info;
    this.#cacheSize = Math.max(1, opts.statementCacheSize ?? 1000);
    this.#responses = new ResponseMatcher(this.#responseHost(), params, opts.onNotice);
    this.processId = processId;
    this.serverVersionNum = parseServerVersion(params.get('server_version') ?? '');
    this.#closed = new Promise((resolve) => {
      this.#markClosed = resolve;
    });
    this.lost = new Promise((resolve) => {
      this.#markLost = resolve;
    });
    this.#watchdog = new WireWatchdog(opts, processId, this.#watchedWire());
    // Take the connection over: the Client's handlers would treat every result as
    // "unexpected" (no active query) and turn it into a client 'error'.
    for (const event of con.eventNames()) if (event !== 'newListener') con.removeAllListeners(event);
    con._emitMessage = true;
    con.on('message', this.#onMessage);
    con.on('error', (err: Error) => this.#fail(err.message, err));
    con.on('end', () => {
      this.#fail(this.#closing ? 'connection closed' : 'server closed the connection');
      this.#markClosed();
    });
  }

  static async connect(info: ConnInfo, opts: WireOptions): Promise<WireConnection> {
    // The login is src/connect's (libpq's conninfo semantics); the startup parameters go in its startup packet.
    const opened = await openSession(info, {
      side: 'target',
      purpose: 'apply',
      what: 'target connection',
      applicationName: opts.applicationName,
      startup: opts.startupParameters ?? {},
    });
    const client = pgClientOver(info, opened);
    const internals = client as unknown as { processID: number };
    client.on('error', noop);
    const con = client.connection as unknown as PgConnection;
    const params = new Map<string, string>();
    con.on('parameterStatus', (m: Message) => params.set(m.parameterName!, m.parameterValue!));
    try {
      // Built inside the callback, i.e. inside the startup ReadyForQuery: no message can
      // slip between the Client's handlers and ours.
      return await new Promise<WireConnection>((resolve, reject) => {
        client.connect((err: Error | undefined) => {
          if (err) return reject(err);
          try {
            resolve(new WireConnection(con, info, opts, params, internals.processID));
          } catch (e) {
            reject(e);
          }
        });
      });
    } catch (err) {
      con.stream.destroy();
      throw connectFailure('target', info, err, 'apply', 'target connection');
    }
  }

  get pending(): number {
    return this.#responses.pending;
  }
  /** Statements were sent since the last Sync: the server has not ended their segment. */
  get unsynced(): boolean {
    return this.#unsynced;
  }
  /** Transaction status from the last ReadyForQuery. */
  get txStatus(): TxStatus {
    return this.#responses.txStatus;
  }
  parameter(name: string): string | undefined {
    return this.#responses.parameter(name);
  }

  execute(text: string, values: readonly WireValue[] = NO_VALUES, opts?: { paramTypes?: readonly number[]; wantRows?: boolean }): Promise<WireResult> {
    const refused = this.#refusal();
    if (refused) return refused;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      // A bad value would throw inside pg's Bind serializer after Parse went out.
      if (v != null && typeof v !== 'string' && !Buffer.isBuffer(v)) {
        return Promise.reject(new WireUsageError(`parameter $${i + 1} is a ${typeof v}; pass a string (text), a Buffer (binary) or null`));
      }
    }
    return this.#exec(text, values, opts?.paramTypes, opts?.wantRows ?? false, null);
  }

  /** `text`: a COPY … FROM STDIN; `data`: its whole input, sent right behind it (not copied:
   *  leave the buffers alone). Resolves { command: 'COPY', rowCount }; pipelines like execute(). */
  copyIn(text: string, data: readonly Buffer[]): Promise<WireResult> {
    const refused = this.#refusal();
    if (refused) return refused;
    if (!data.every((d) => Buffer.isBuffer(d))) return Promise.reject(new WireUsageError('copyIn data must be Buffers'));
    return this.#exec(text, NO_VALUES, undefined, false, data);
  }

  /** Why nothing may be sent now (connection gone, segment aborted), or null. */
  #refusal(): Promise<never> | null {
    const gone = this.#lost ?? this.#closing;
    if (gone) return consequential(gone);
    if (this.#responses.abortCause !== null) return consequential(new PipelineAbortedError(this.#responses.abortCause));
    return null;
  }

  #exec(text: string, values: readonly WireValue[], types: readonly number[] | undefined, wantRows: boolean, copyData: readonly Buffer[] | null): Promise<WireResult> {
    const key = types && types.length > 0 ? `${text}\0${types.join(',')}` : text;
    let stmt = this.#cache.get(key);
    let parsed: Stmt | null = null;
    this.#cork();
    if (stmt !== undefined && (stmt.prepared || stmt.segment === this.#segment)) {
      this.#cache.delete(key); // LRU touch
      this.#cache.set(key, stmt);
    } else {
      // Absent, or parsed in an earlier segment whose outcome is not known yet.
      if (stmt !== undefined) this.#forget(stmt, true);
      stmt = parsed = new Stmt(`pgsub_${(this.#nextName++).toString(36)}`, key, this.#segment);
      this.#cache.set(key, stmt);
      if (this.#cache.size > this.#cacheSize) {
        const oldest = this.#cache.values().next().value;
        if (oldest !== undefined) this.#forget(oldest, true);
      }
      this.#con.parse({ name: stmt.name, text, types: types ?? NO_TYPES });
    }
    this.#con.bind({ statement: stmt.name, values });
    this.#con.execute();
    const op = new ExecOp(parsed, wantRows ? [] : null, text, values);
    if (copyData !== null) {
      const stream = this.#con.stream;
      if (stream.writable) for (const frame of copyFrames(copyData)) stream.write(frame);
      op.copy = 'sent';
    }
    this.#needFlush = true;
    this.#unsynced = true;
    this.#push(op);
    // A long synchronous burst: let the server start on it instead of waiting for the tick.
    if (this.#con.stream.writableLength > EARLY_RELEASE_BYTES) this.#release();
    return op.promise;
  }

  sync(): Promise<TxStatus> {
    const gone = this.#lost ?? this.#closing;
    if (gone) return consequential(gone);
    this.#cork();
    this.#con.sync();
    this.#segment++;
    this.#unsynced = false;
    this.#needFlush = false;
    this.#responses.syncWritten();
    const op = new SyncOp();
    this.#push(op);
    return op.promise;
  }

  flush(): void {
    if (this.#lost || !this.#corked) return;
    this.#con.flush();
    this.#needFlush = false;
    this.#corked = false;
    this.#con.stream.uncork();
  }

  /** Simple protocol (several statements allowed). A sync point of its own, so it must not
   *  follow unsynced execute() calls: call sync() first. */
  simpleQuery(text: string): Promise<SimpleQueryResult> {
    const gone = this.#lost ?? this.#closing;
    if (gone) return consequential(gone);
    if (this.#responses.abortCause !== null) return consequential(new PipelineAbortedError(this.#responses.abortCause));
    if (this.#unsynced) return Promise.reject(new WireUsageError('simpleQuery after execute() without sync(): the server would run it inside the unsynced segment'));
    this.#cork();
    this.#con.query(text);
    const op = new QueryOp();
    this.#push(op);
    return op.promise;
  }

  /** Terminate after what is already queued; anything still unanswered at socket close rejects. */
  async close(): Promise<void> {
    if (this.#lost) return;
    if (!this.#closing) {
      this.#closing = new ConnectionLostError(`target connection closed by pgsub (${redactConninfo(this.#info)})`, { target: redactConninfo(this.#info) });
      this.#release(); // with a Flush: the server must answer what is queued before Terminate
      this.#con.end();
      this.#watchdog.stop();
    }
    // A server that does not answer (a silent network) would keep the socket forever.
    let timer: NodeJS.Timeout | undefined;
    const gaveUp = await Promise.race([this.#closed.then(() => false), new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), CLOSE_TIMEOUT_MS)))]);
    clearTimeout(timer);
    if (gaveUp) {
      this.#con.stream.destroy();
      await this.#closed;
    }
  }

  /** Queue an op; the silence clock starts when operations become outstanding. */
  #push(op: Op): void {
    if (this.#responses.outstanding === 0) this.#watchdog.restart();
    this.#responses.expect(op);
  }

  #cork(): void {
    if (this.#corked) return;
    this.#corked = true;
    this.#con.stream.cork();
    process.nextTick(this.#release);
  }

  readonly #release = (): void => {
    if (!this.#corked) return;
    this.#corked = false;
    if (this.#needFlush && !this.#lost) {
      this.#con.flush();
      this.#needFlush = false;
    }
    this.#con.stream.uncork();
  };

  /** Drop a statement from the cache; Close it on the server unless it is known not to exist. */
  #forget(stmt: Stmt, closeOnServer: boolean): void {
    if (this.#cache.get(stmt.key) === stmt) this.#cache.delete(stmt.key);
    if (!closeOnServer) return;
    this.#writeClose(stmt.name);
    this.#push(new CloseOp(stmt.name));
  }

  /** Write a Close of a prepared statement; its op is queued by the caller. */
  #writeClose(name: string): void {
    this.#cork();
    this.#con.close({ type: 'S', name });
    this.#needFlush = true;
  }

  /** What the matching of answers asks of the sending side (wire-responses.ts). */
  #responseHost(): ResponseHost {
    return {
      forget: (stmt) => this.#forget(stmt, false),
      resendClose: (name) => this.#writeClose(name),
      copyFail: (message) => this.#con.sendCopyFail(message),
      fail: (reason, cause) => this.#fail(reason, cause),
    };
  }

  /** What target_timeout reads of the connection and asks of it (wire-watchdog.ts). */
  #watchedWire(): WatchedWire {
    return {
      gone: () => this.#lost !== null || this.#closing !== null,
      outstanding: () => this.#responses.outstanding,
      canPing: () => !this.#unsynced && this.#responses.abortCause === null && !this.#corked,
      ping: () => void this.sync().catch(noop),
      fail: (reason) => this.#fail(reason),
    };
  }

  readonly #onMessage = (msg: Message): void => {
    this.#watchdog.restart();
    try {
      this.#responses.dispatch(msg);
    } catch (err) {
      // A bug here must not escape into the socket's 'data' handler.
      this.#fail(`internal error handling ${msg.name}: ${(err as Error).message}`, err);
    }
  };

  /** The connection is unusable: reject everything, now and later. */
  #fail(reason: string, cause?: unknown): void {
    if (this.#lost) return;
    const target = redactConninfo(this.#info);
    this.#lost = new ConnectionLostError(redactSecrets(`target connection lost (${target}): ${reason}`), { target }, cause === undefined ? undefined : { cause });
    this.#cache.clear();
    this.#watchdog.stop();
    this.#responses.rejectAll(this.#lost);
    this.#con.stream.destroy();
    if (!this.#closing) this.#markLost(this.#lost);
  }
}

export { parseServerVersion, tagCommand, tagRowCount } from './wire-tags.js';
