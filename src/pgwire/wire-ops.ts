/**
 * The apply connection wire's vocabulary (wire.ts): the values and results it deals in,
 * its errors, the slice of pg's Connection it drives, and the ops it keeps in wire order to
 * match each backend response to what asked for it.
 */
import type { Duplex } from 'node:stream';
import type { EventEmitter } from 'node:events';
import { PgsubError } from '../errors.js';

export type WireValue = string | Buffer | null;
export type TxStatus = 'I' | 'T' | 'E';
export interface WireResult {
  command: string;
  rowCount: number;
  rows: unknown[][];
}
export interface WireNotice {
  severity?: string;
  code?: string;
  message: string;
  detail?: string;
  hint?: string;
}
export interface WireOptions {
  applicationName: string;
  /** Sent in the StartupMessage (search_path, session_replication_role, synchronous_commit…). */
  startupParameters?: Record<string, string>;
  /** Named prepared statements kept per connection; LRU, evicted ones are Closed. Default 1000. */
  statementCacheSize?: number;
  onNotice?: (notice: WireNotice) => void;
  /**
   * target_timeout: with operations outstanding and no message from the server for this
   * long, the connection fails (ConnectionLostError) — unless `probe` says the backend is
   * busy running them. An idle connection is pinged (a Sync) after half of it. 0: off.
   */
  timeoutMs?: number;
  /** Whether backend `pid` is running a statement (asked over another connection); false when unsure. */
  probe?: (pid: number) => Promise<boolean>;
}

/** A statement the server skipped because an earlier one in the same sync segment failed. */
export class PipelineAbortedError extends PgsubError {
  readonly code = 'PGSUB_PIPELINE_ABORTED';
  readonly retryable = false;
  constructor(cause: unknown) {
    super(`statement skipped: an earlier statement in the pipeline failed (${(cause as Error)?.message ?? String(cause)})`, {}, { cause });
  }
}

/** The connection was used against its protocol contract (a bug in the caller). */
export class WireUsageError extends PgsubError {
  readonly code = 'PGSUB_WIRE_USAGE';
  readonly retryable = false;
}

/** The parts of pg's (untyped-for-this-use) Connection that are driven directly. */
export interface PgConnection extends EventEmitter {
  stream: Duplex;
  _emitMessage: boolean;
  parse(q: { name: string; text: string; types: readonly number[] }): void;
  bind(c: { statement: string; values: readonly WireValue[] }): void;
  execute(c?: undefined): void;
  close(m: { type: 'S'; name: string }): void;
  query(text: string): void;
  flush(): void;
  sync(): void;
  end(): void;
  sendCopyFail(message: string): void;
}
export interface Message {
  name: string;
  fields?: unknown[];
  text?: string;
  status?: string;
  parameterName?: string;
  parameterValue?: string;
}

export abstract class Deferred<T> {
  done = false;
  resolve!: (value: T) => void;
  reject!: (err: unknown) => void;
  readonly promise = new Promise<T>((res, rej) => {
    this.resolve = res;
    this.reject = rej;
  });
}
export class ExecOp extends Deferred<WireResult> {
  readonly kind = 'exec';
  /** copyIn: 'sent' until the server's CopyInResponse confirms it read the data as the copy's. */
  copy: 'sent' | 'started' | null = null;
  /** `text`, `values`: the statement and its parameters, given to its error (statementText, statementParams) so a caller can say what failed. */
  constructor(
    readonly parsed: Stmt | null,
    readonly rows: unknown[][] | null,
    readonly text: string,
    readonly values: readonly WireValue[],
  ) {
    super();
  }
}
export class SyncOp extends Deferred<TxStatus> {
  readonly kind = 'sync';
  error: unknown = null;
}
export type SimpleQueryResult = { command: string; rowCount: number; rows: Record<string, string | null>[] };
export class QueryOp extends Deferred<SimpleQueryResult> {
  readonly kind = 'query';
  error: unknown = null;
  columns: string[] = [];
  rows: Record<string, string | null>[] = [];
  result: SimpleQueryResult = { command: '', rowCount: 0, rows: [] };
}
export class CloseOp {
  readonly kind = 'close';
  constructor(readonly name: string) {}
}
export type Op = ExecOp | SyncOp | QueryOp | CloseOp;

export class Stmt {
  prepared = false;
  constructor(
    readonly name: string,
    readonly key: string,
    readonly segment: number,
  ) {}
}
