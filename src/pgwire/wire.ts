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
 *  - Every message that earns a response has an op in `#ops`, in wire order; responses are
 *    matched FIFO (exec: [ParseComplete] BindComplete DataRow* CommandComplete; copyIn:
 *    [ParseComplete] BindComplete CopyInResponse CommandComplete; close: CloseComplete;
 *    sync and simple query: … ReadyForQuery).
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
 *    is pinged with a Sync after half of it, so a dead or black-holed one is found idle too.
 * Statement text and what the values mean live in apply/sql/ and apply/handlers/; the ops,
 * errors and types in wire-ops.ts.
 */
import { copyFrames, Fifo, parseServerVersion, tagCommand, tagRowCount } from './wire-tags.js';
import type pg from 'pg';
import { redactConninfo, redactSecrets, type ConnInfo } from '../config/conninfo.js';
import { openSession, pgClientOver } from '../connect/drivers.js';
import { connectFailure } from '../connect-failure.js';
import { ConnectionLostError } from '../errors.js';
import {
  CloseOp,
  ExecOp,
  PipelineAbortedError,
  QueryOp,
  Stmt,
  SyncOp,
  WireUsageError,
  type Deferred,
  type Message,
  type Op,
  type PgConnection,
  type SimpleQueryResult,
  type TxStatus,
  type WireNotice,
  type WireOptions,
  type WireResult,
  type WireValue,
} from './wire-ops.js';
export { PipelineAbortedError, WireUsageError } from './wire-ops.js';
export type { SimpleQueryResult, TxStatus, WireNotice, WireOptions, WireResult, WireValue } from './wire-ops.js';

const NO_VALUES: readonly WireValue[] = [];
const NO_TYPES: readonly number[] = [];
const NO_ROWS = Object.freeze([]) as unknown as unknown[][];
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
  readonly #onNotice: ((n: WireNotice) => void) | undefined;
  readonly #cacheSize: number;
  readonly #cache = new Map<string, Stmt>();
  readonly #ops = new Fifo<Op>();
  readonly #params: Map<string, string>;
  #nextName = 0;
  #segment = 0; // incremented by every Sync written
  #unsynced = false; // execute() written since the last Sync
  #needFlush = false;
  #corked = false;
  #aborted = false; // an ErrorResponse arrived; the server skips until its Sync
  #abortCause: unknown = null; // set while no Sync follows the failure on the wire
  #pending = 0;
  #txStatus: TxStatus = 'I';
  #lost: ConnectionLostError | null = null;
  #closing: ConnectionLostError | null = null;
  #closed: Promise<void>;
  #markClosed!: () => void;
  #markLost!: (err: ConnectionLostError) => void;
  /** Resolves when the connection is lost other than by close() (never rejects). */
  readonly lost: Promise<ConnectionLostError>;
  readonly #timeoutMs: number;
  readonly #probe: ((pid: number) => Promise<boolean>) | undefined;
  /** When the server last sent a message, or when operations became outstanding after none were. */
  #lastHeard = Date.now();
  #probing = false;
  #watchdog: NodeJS.Timeout | null = null;

  private constructor(con: PgConnection, info: ConnInfo, opts: WireOptions, params: Map<string, string>, processId: number) {
    this.#con = con;
    this.#info = info;
    this.#onNotice = opts.onNotice;
    this.#cacheSize = Math.max(1, opts.statementCacheSize ?? 1000);
    this.#params = params;
    this.processId = processId;
    this.serverVersionNum = parseServerVersion(params.get('server_version') ?? '');
    this.#closed = new Promise((resolve) => {
      this.#markClosed = resolve;
    });
    this.lost = new Promise((resolve) => {
      this.#markLost = resolve;
    });
    this.#timeoutMs = opts.timeoutMs ?? 0;
    this.#probe = opts.probe;
    if (this.#timeoutMs > 0) {
      this.#watchdog = setInterval(this.#watch, Math.max(50, Math.min(1000, this.#timeoutMs / 4)));
      this.#watchdog.unref();
    }
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
    return this.#pending;
  }
  /** Statements were sent since the last Sync: the server has not ended their segment. */
  get unsynced(): boolean {
    return this.#unsynced;
  }
  /** Transaction status from the last ReadyForQuery. */
  get txStatus(): TxStatus {
    return this.#txStatus;
  }
  parameter(name: string): string | undefined {
    return this.#params.get(name);
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
    if (this.#abortCause !== null) return consequential(new PipelineAbortedError(this.#abortCause));
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
    this.#pending++;
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
    this.#abortCause = null;
    const op = new SyncOp();
    this.#push(op);
    this.#pending++;
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
    if (this.#abortCause !== null) return consequential(new PipelineAbortedError(this.#abortCause));
    if (this.#unsynced) return Promise.reject(new WireUsageError('simpleQuery after execute() without sync(): the server would run it inside the unsynced segment'));
    this.#cork();
    this.#con.query(text);
    const op = new QueryOp();
    this.#push(op);
    this.#pending++;
    return op.promise;
  }

  /** Terminate after what is already queued; anything still unanswered at socket close rejects. */
  async close(): Promise<void> {
    if (this.#lost) return;
    if (!this.#closing) {
      this.#closing = new ConnectionLostError(`target connection closed by pgsub (${redactConninfo(this.#info)})`, { target: redactConninfo(this.#info) });
      this.#release(); // with a Flush: the server must answer what is queued before Terminate
      this.#con.end();
      this.#stopWatchdog();
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
    if (this.#ops.length === 0) this.#lastHeard = Date.now();
    this.#ops.push(op);
  }

  #stopWatchdog(): void {
    if (this.#watchdog !== null) clearInterval(this.#watchdog);
    this.#watchdog = null;
  }

  readonly #watch = (): void => {
    if (this.#lost || this.#closing || this.#probing) return;
    const silentMs = Date.now() - this.#lastHeard;
    if (this.#ops.length === 0) {
      // A ping only where a Sync changes nothing: nothing unsynced, no failure awaiting its Sync.
      if (silentMs >= this.#timeoutMs / 2 && !this.#unsynced && this.#abortCause === null && !this.#corked) {
        const heard = this.#lastHeard;
        this.sync().catch(noop);
        this.#lastHeard = heard; // the ping is answered within the rest of the timeout
      }
      return;
    }
    if (silentMs < this.#timeoutMs) return;
    const outstanding = this.#ops.length;
    const reason = `no answer from the target for ${Math.round(silentMs / 1000)} s with ${outstanding} operation(s) outstanding (target_timeout)`;
    if (!this.#probe) return this.#fail(reason);
    this.#probing = true;
    this.#probe(this.processId)
      .catch(() => false)
      .then((busy) => {
        this.#probing = false;
        if (busy)
          this.#lastHeard = Date.now(); // running them (a lock wait, a long statement): wait another period
        else this.#fail(reason);
      });
  };

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
    this.#cork();
    this.#con.close({ type: 'S', name: stmt.name });
    this.#needFlush = true;
    this.#push(new CloseOp(stmt.name));
  }

  #settle<T>(op: Deferred<T>, value: T): void {
    if (op.done) return;
    op.done = true;
    this.#pending--;
    op.resolve(value);
  }

  #rejectOp(op: Pick<Deferred<unknown>, 'done' | 'promise' | 'reject'>, err: unknown, consequential: boolean): void {
    if (op.done) return;
    op.done = true;
    this.#pending--;
    if (consequential) op.promise.catch(noop);
    op.reject(err);
  }

  readonly #onMessage = (msg: Message): void => {
    this.#lastHeard = Date.now();
    try {
      this.#dispatch(msg);
    } catch (err) {
      // A bug here must not escape into the socket's 'data' handler.
      this.#fail(`internal error handling ${msg.name}: ${(err as Error).message}`, err);
    }
  };

  #dispatch(msg: Message): void {
    const head = this.#ops.peek();
    switch (msg.name) {
      case 'parseComplete':
        if (head?.kind !== 'exec' || head.parsed === null || head.parsed.prepared) return this.#desync(msg.name);
        head.parsed.prepared = true;
        return;
      case 'bindComplete':
        if (head?.kind !== 'exec') return this.#desync(msg.name);
        return;
      case 'dataRow':
        if (head?.kind === 'exec') {
          head.rows?.push(msg.fields!);
          return;
        }
        if (head?.kind === 'query') {
          head.rows.push(toRecord(head.columns, msg.fields as (string | null)[]));
          return;
        }
        return this.#desync(msg.name);
      case 'rowDescription':
        if (head?.kind !== 'query') return this.#desync(msg.name);
        head.columns = (msg.fields as { name: string }[]).map((f) => f.name);
        return;
      case 'commandComplete':
      case 'emptyQuery': {
        const tag = msg.text ?? '';
        if (head?.kind === 'exec') {
          this.#ops.shift();
          // The server ran it, but it was no COPY FROM STDIN and dropped the data.
          if (head.copy === 'sent') return this.#rejectOp(head, new WireUsageError(`copyIn of a statement that reads no COPY data (${tag})`), false);
          this.#settle(head, { command: tagCommand(tag), rowCount: tagRowCount(tag), rows: head.rows ?? NO_ROWS });
          return;
        }
        if (head?.kind !== 'query') return this.#desync(msg.name);
        head.result = { command: tagCommand(tag), rowCount: tagRowCount(tag), rows: head.rows };
        head.rows = [];
        head.columns = [];
        return;
      }
      case 'closeComplete':
        if (head?.kind !== 'close') return this.#desync(msg.name);
        this.#ops.shift();
        return;
      case 'error':
        return this.#onError(msg as unknown as pg.DatabaseError);
      case 'readyForQuery':
        return this.#onReady((msg.status ?? 'I') as TxStatus);
      case 'notice':
        if (this.#onNotice)
          try {
            this.#onNotice(msg as unknown as WireNotice);
          } catch {
            /* a logger's problem */
          }
        return;
      case 'parameterStatus':
        this.#params.set(msg.parameterName!, msg.parameterValue!);
        return;
      case 'copyInResponse':
        if (head?.kind !== 'exec') return this.#desync(msg.name);
        // copyIn: its data is already on the wire.
        if (head.copy === 'sent') {
          head.copy = 'started';
          return;
        }
        // execute() of COPY FROM STDIN has no data source; make the server fail the statement.
        this.#con.sendCopyFail('COPY FROM STDIN is not supported by execute(); use copyIn()');
        return;
      case 'portalSuspended':
        return this.#desync(msg.name);
      default:
        // noData, copyOutResponse/copyData/copyDone (COPY TO STDOUT output is dropped),
        // notification, parameterDescription: nothing to do.
        return;
    }
  }

  #onError(err: pg.DatabaseError): void {
    if (!err.code) return this.#fail(`protocol error: ${err.message}`, err);
    if (isFatal(err)) return this.#fail(`${err.code} ${err.message}`, err);
    const head = this.#ops.peek();
    if (head === undefined) return this.#desync('error');
    switch (head.kind) {
      case 'sync':
        head.error = err;
        return; // e.g. a deferred constraint at implicit COMMIT
      case 'query':
        head.error ??= err;
        return; // the server still runs on to ReadyForQuery
      case 'close':
        this.#ops.shift();
        break;
      case 'exec':
        this.#ops.shift();
        if (head.parsed !== null && !head.parsed.prepared) this.#forget(head.parsed, false);
        Object.assign(err, { statementText: head.text, statementParams: head.values });
        this.#rejectOp(head, err, false);
        break;
    }
    this.#aborted = true;
    // The server skips everything up to its next Sync: settle those now, so a caller
    // awaiting one of them before calling sync() does not wait forever.
    for (let i = 0; ; i++) {
      const op = this.#ops.at(i);
      if (op === undefined) {
        this.#abortCause = err;
        return;
      }
      if (op.kind === 'sync' || op.kind === 'query') return;
      if (op.kind === 'exec') this.#rejectOp(op, new PipelineAbortedError(err), true);
    }
  }

  #onReady(status: TxStatus): void {
    let head = this.#ops.peek();
    // Ops the server skipped after an error: their Parses never happened, their Closes
    // did not either (send those again).
    while (head !== undefined && head.kind !== 'sync' && head.kind !== 'query') {
      if (!this.#aborted) return this.#desync('readyForQuery');
      this.#ops.shift();
      if (head.kind === 'close') {
        this.#cork();
        this.#con.close({ type: 'S', name: head.name });
        this.#needFlush = true;
        this.#ops.push(head);
      } else {
        if (head.parsed !== null && !head.parsed.prepared) this.#forget(head.parsed, false);
        if (!head.done) this.#rejectOp(head, new PipelineAbortedError(null), true);
      }
      head = this.#ops.peek();
    }
    if (head === undefined) return this.#desync('readyForQuery');
    this.#ops.shift();
    this.#aborted = false;
    this.#txStatus = status;
    if (head.error !== null) this.#rejectOp(head, head.error, false);
    else if (head.kind === 'sync') this.#settle(head, status);
    else this.#settle(head, head.result);
  }

  #desync(what: string): void {
    this.#fail(`protocol out of sync: unexpected ${what} (${this.#ops.length} operations outstanding)`);
  }

  /** The connection is unusable: reject everything, now and later. */
  #fail(reason: string, cause?: unknown): void {
    if (this.#lost) return;
    const target = redactConninfo(this.#info);
    this.#lost = new ConnectionLostError(redactSecrets(`target connection lost (${target}): ${reason}`), { target }, cause === undefined ? undefined : { cause });
    this.#cache.clear();
    this.#stopWatchdog();
    for (const op of this.#ops.takeAll()) if (op.kind !== 'close') this.#rejectOp(op, this.#lost, true);
    this.#con.stream.destroy();
    if (!this.#closing) this.#markLost(this.#lost);
  }
}

function toRecord(columns: readonly string[], fields: readonly (string | null)[]): Record<string, string | null> {
  const row: Record<string, string | null> = {};
  for (let i = 0; i < fields.length; i++) row[columns[i] ?? `?column${i}?`] = fields[i] ?? null;
  return row;
}

/** Errors after which the server closes the session. Severity is localized, so the SQLSTATE
 *  classes that only come with FATAL count too (admin shutdown, idle timeouts, 08xxx). */
function isFatal(err: pg.DatabaseError): boolean {
  const code = err.code ?? '';
  // 08P01 (protocol_violation) is also raised at ERROR level by binary input functions
  // ("insufficient data left in message"); only the untranslated-severity-proof classes remain.
  return err.severity === 'FATAL' || err.severity === 'PANIC' || (code.startsWith('08') && code !== '08P01') || code.startsWith('57P') || code === '25P03';
}

export { parseServerVersion, tagCommand, tagRowCount } from './wire-tags.js';
