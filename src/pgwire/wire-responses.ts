/**
 * The answering half of the apply connection's wire (wire.ts): the operations awaiting an
 * answer, in wire order, and the matching of every backend message to the one at their
 * head — its result or error, the segment the server skips after an ErrorResponse up to
 * the next Sync, the transaction status of each ReadyForQuery. It is the one writer of the
 * op queue, of what is pending and of the abort state; every write to the socket stays
 * with the connection, asked for through `ResponseHost`.
 */
import type pg from 'pg';
import { Fifo, tagCommand, tagRowCount } from './wire-tags.js';
import { PipelineAbortedError, WireUsageError, type Deferred, type Message, type Op, type Stmt, type TxStatus, type WireNotice } from './wire-ops.js';

const NO_ROWS = Object.freeze([]) as unknown as unknown[][];
const noop = () => {};

/** What the matching asks of the connection, which does every write. */
export interface ResponseHost {
  /** Drop a statement whose Parse never happened from the cache (nothing to Close). */
  forget(stmt: Stmt): void;
  /** Write a Close the server skipped again; its op is queued again by the matcher. */
  resendClose(name: string): void;
  /** Make the server fail a COPY FROM STDIN that has no data source. */
  copyFail(message: string): void;
  /** The connection is unusable: reject everything, now and later. */
  fail(reason: string, cause?: unknown): void;
}

export class ResponseMatcher {
  readonly #host: ResponseHost;
  readonly #onNotice: ((n: WireNotice) => void) | undefined;
  readonly #ops = new Fifo<Op>();
  readonly #params: Map<string, string>;
  #aborted = false; // an ErrorResponse arrived; the server skips until its Sync
  #abortCause: unknown = null; // set while no Sync follows the failure on the wire
  #pending = 0;
  #txStatus: TxStatus = 'I';

  /** `params`: the startup's ParameterStatus values, kept up to date from here on. */
  constructor(host: ResponseHost, params: Map<string, string>, onNotice: ((n: WireNotice) => void) | undefined) {
    this.#host = host;
    this.#params = params;
    this.#onNotice = onNotice;
  }

  /** Operations awaiting an answer, Closes included. */
  get outstanding(): number {
    return this.#ops.length;
  }
  /** Calls awaiting their promise. */
  get pending(): number {
    return this.#pending;
  }
  /** Transaction status from the last ReadyForQuery. */
  get txStatus(): TxStatus {
    return this.#txStatus;
  }
  /** The failure no Sync follows on the wire yet (null: none): nothing may be sent before sync(). */
  get abortCause(): unknown {
    return this.#abortCause;
  }
  parameter(name: string): string | undefined {
    return this.#params.get(name);
  }

  /** An op just written, in wire order; a caller awaits every kind but a Close. */
  expect(op: Op): void {
    this.#ops.push(op);
    if (op.kind !== 'close') this.#pending++;
  }

  /** A Sync was written: the failed segment, if any, ends there. */
  syncWritten(): void {
    this.#abortCause = null;
  }

  /** The connection is lost: every op awaiting an answer rejects with `err`. */
  rejectAll(err: unknown): void {
    for (const op of this.#ops.takeAll()) if (op.kind !== 'close') this.#rejectOp(op, err, true);
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

  /** A backend message, matched to the op at the head of the queue. */
  dispatch(msg: Message): void {
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
        this.#host.copyFail('COPY FROM STDIN is not supported by execute(); use copyIn()');
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
    if (!err.code) return this.#host.fail(`protocol error: ${err.message}`, err);
    if (isFatal(err)) return this.#host.fail(`${err.code} ${err.message}`, err);
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
        if (head.parsed !== null && !head.parsed.prepared) this.#host.forget(head.parsed);
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
        this.#host.resendClose(head.name);
        this.#ops.push(head);
      } else {
        if (head.parsed !== null && !head.parsed.prepared) this.#host.forget(head.parsed);
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
    this.#host.fail(`protocol out of sync: unexpected ${what} (${this.#ops.length} operations outstanding)`);
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
