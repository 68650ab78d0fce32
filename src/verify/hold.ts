/**
 * The service's side of `pgsub verify` (docs/verify.md): the ApplyHold the apply loop asks
 * before each remote transaction (apply/run/hold.ts), driven by the pgsub.verify row
 * (channel.ts). The hold never lets the apply cross the LSN verify compares at:
 *
 *  1. verify writes a request ('requested'). On reading it the service closes its gate
 *     (synchronously, before it answers) and answers 'armed'. From then on no remote
 *     transaction starts to apply; one already started commits at an LSN the publisher had
 *     flushed before the service saw the request.
 *  2. verify, having read 'armed', reads W = pg_current_wal_lsn() on the source and writes
 *     it ('bounded'). Every commit the service applied or started so far lies below W (it
 *     was flushed on the source before 'armed', 'armed' was read before W), and the gate
 *     now lets through exactly the transactions committing below W.
 *  3. verify creates a temporary logical slot with an exported snapshot; its consistent
 *     point L is past the running-xacts record the slot creation logs after W was read, so
 *     L >= W: everything applied so far is in the source snapshot. verify writes L
 *     ('located'); the gate lets through the transactions committing below L.
 *  4. At the first transaction committing at or past L (or a keepalive position at or past
 *     L: the publisher has sent every commit below it), the loop settles the target (group
 *     committed, every pipelined COMMIT answered) and calls atBoundary: the target now
 *     holds exactly the source's commits below L, which is what the source snapshot shows.
 *     The service opens a REPEATABLE READ transaction, exports its snapshot and lets the
 *     apply go at once ('snapshot'); the exporting transaction stays open until verify has
 *     imported it ('imported'). In repair mode it answers 'held' instead and stays held
 *     until 'released' (repair.ts writes the rows while nothing else does).
 *
 * A request whose holder (the backend holding the verify lock) is gone, or a hold longer
 * than the request's hold_timeout_ms, is abandoned: the gate opens and the row says why
 * (held for a repair, the row moves first, behind any repair batch in flight: no batch
 * writes once the apply goes on).
 * Apply lanes and parallel apply commit on other connections this gate does not see: the
 * request is refused with the reason.
 */
import type { Logger } from '../log.js';
import type { ConnInfo } from '../config/conninfo.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import type { ApplyHold } from '../apply/run/hold.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import { holderAlive, moveVerifyRow, readVerifyRow, sqlQuery, verifyChannel, type Query, type VerifyRow } from './channel.js';

type Phase = 'idle' | 'armed' | 'bounded' | 'located' | 'held';

interface Request {
  id: string;
  holder: number;
  mode: 'snapshot' | 'repair';
  timeoutMs: number;
  armedAt: number;
  /** How long the apply waited at the gate for this request so far. */
  blockedMs: number;
}

export interface VerifyOutcome {
  lsn: Lsn;
  result: string;
  differences: number;
  at: string;
}

export interface VerifyHoldOptions {
  target: ConnInfo;
  subscription: string;
  log: Logger;
  /** Why this configuration cannot be held (lanes, parallel apply); null: it can. */
  refusal: string | null;
}

const CHECK_MS = 100;

export class VerifyHold implements ApplyHold {
  #phase: Phase = 'idle';
  #bound: Lsn = 0n as Lsn;
  #request: Request | null = null;
  #wake: (() => void) | null = null;
  #sql: Sql;
  #query: Query;
  #snapshotSql: Sql | null = null;
  #releaseSnapshot: (() => void) | null = null;
  #timer: NodeJS.Timeout | null = null;
  #checking = false;
  #reading: Promise<void> | null = null;
  #readAgain = false;
  #closed = false;
  /** The last finished verify (status, metrics). */
  last: VerifyOutcome | null = null;

  constructor(private readonly opts: VerifyHoldOptions) {
    this.#sql = openMaintenance(opts.target, `pgsub_${opts.subscription}_verify`);
    this.#query = sqlQuery(this.#sql);
  }

  /** Listen for requests, and take one already waiting. Failing to listen only disables verify. */
  async start(): Promise<void> {
    try {
      // LISTEN gets a connection of its own: the reads' one logs in beside it (a session
      // start waits for this), and the read still comes after LISTEN, so no request is missed.
      const reading = this.#sql.unsafe('SELECT 1').catch(() => {});
      await this.#sql.listen(verifyChannel(this.opts.subscription), () => this.#refresh());
      await reading;
      await this.#read();
    } catch (err) {
      this.opts.log.warn({ err }, 'cannot listen for verify requests; pgsub verify will not get an answer');
    }
    this.#timer = setInterval(() => void this.#check(), CHECK_MS);
    this.#timer.unref();
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#open('service stopping');
    this.#endSnapshot();
    await this.#snapshotSql?.end({ timeout: 2 }).catch(() => {});
    await this.#sql.end({ timeout: 2 }).catch(() => {});
  }

  blocks(commitLsn: Lsn, position = false): boolean {
    switch (this.#phase) {
      case 'idle':
        return false;
      case 'armed':
      case 'held':
        return !position;
      case 'bounded':
        return !position && commitLsn >= this.#bound;
      case 'located':
        return commitLsn >= this.#bound;
    }
  }

  wantsPosition(): boolean {
    return this.#phase === 'located';
  }

  async atBoundary(next: Lsn): Promise<void> {
    const started = performance.now();
    try {
      while (!this.#closed && this.blocks(next) && this.#request !== null) {
        const request = this.#request;
        if (this.#phase === 'located') {
          if (request.mode === 'snapshot') {
            await this.#export(request, next, started);
            return;
          }
          this.#phase = 'held';
          await moveVerifyRow(this.#query, this.opts.subscription, request.id, ['located'], 'held', { applied_lsn: formatLsn(this.#bound) });
          this.opts.log.info({ lsn: formatLsn(this.#bound) }, 'verify: apply held for the repair');
        }
        await new Promise<void>((resolve) => {
          this.#wake = resolve;
          setTimeout(resolve, CHECK_MS).unref();
        });
        this.#wake = null;
      }
    } catch (err) {
      this.#open(`hold failed: ${(err as Error).message}`);
    } finally {
      if (this.#request) this.#request.blockedMs += performance.now() - started;
      if (this.#phase === 'idle' && this.#request?.mode === 'repair') this.#request = null;
    }
  }

  /** The target at the hold: one REPEATABLE READ snapshot, exported; the apply goes on as soon as it exists. */
  async #export(request: Request, next: Lsn, started: number): Promise<void> {
    const exportStarted = performance.now();
    const snapshot = await this.#exportSnapshot();
    const pauseMs = performance.now() - started + request.blockedMs;
    const exportMs = performance.now() - exportStarted;
    this.#phase = 'idle';
    this.opts.log.info({ lsn: formatLsn(this.#bound), next: formatLsn(next), pauseMs: round(pauseMs), exportMs: round(exportMs) }, 'verify: target snapshot taken; apply resumed');
    request.blockedMs = 0;
    void moveVerifyRow(this.#query, this.opts.subscription, request.id, ['located'], 'snapshot', { snapshot, pause_ms: round(pauseMs), applied_lsn: formatLsn(this.#bound) }).catch(
      (err) => this.#open(`cannot answer: ${(err as Error).message}`),
    );
  }

  #exportSnapshot(): Promise<string> {
    this.#endSnapshot();
    const sql = this.#snapshotConnection();
    return new Promise<string>((resolve, reject) => {
      sql
        .begin('isolation level repeatable read read only', async (tx) => {
          const rows = await tx.unsafe('SELECT pg_catalog.pg_export_snapshot() AS s');
          resolve(String((rows[0] as unknown as { s: string }).s));
          await new Promise<void>((release) => (this.#releaseSnapshot = release));
        })
        .catch(reject);
    });
  }

  #snapshotConnection(): Sql {
    this.#snapshotSql ??= openMaintenance(this.opts.target, `pgsub_${this.opts.subscription}_verify_snapshot`);
    return this.#snapshotSql;
  }

  #endSnapshot(): void {
    this.#releaseSnapshot?.();
    this.#releaseSnapshot = null;
  }

  /** Open the gate and forget the request (the row says why, when it is still this request's). */
  #open(reason: string | null): void {
    const request = this.#request;
    const wasHolding = this.#phase !== 'idle';
    this.#phase = 'idle';
    this.#request = null;
    this.#wake?.();
    this.#endSnapshot();
    if (request && reason !== null) {
      if (wasHolding) this.opts.log.warn({ reason }, 'verify request abandoned; apply goes on');
      void moveVerifyRow(this.#query, this.opts.subscription, request.id, null, 'abandoned', { detail: reason }).catch(() => {});
    }
  }

  #refresh(): void {
    if (this.#reading) {
      this.#readAgain = true;
      return;
    }
    this.#reading = this.#read()
      .catch((err) => this.opts.log.warn({ err }, 'cannot read the verify request'))
      .finally(() => {
        this.#reading = null;
        if (this.#readAgain) {
          this.#readAgain = false;
          this.#refresh();
        }
      });
  }

  async #read(): Promise<void> {
    const row = await readVerifyRow(this.#query, this.opts.subscription);
    if (row === null || this.#closed) return;
    if (row.last_lsn !== null && row.last_result !== null) {
      this.last = { lsn: parseLsn(row.last_lsn), result: row.last_result, differences: Number(row.last_differences ?? 0), at: row.last_at ?? '' };
    }
    const request = this.#request;
    if (row.state === 'requested' && row.request_id !== null && row.holder_pid !== null && row.request_id !== request?.id) return this.#arm(row);
    if (request === null || row.request_id !== request.id) return;
    if (row.state === 'bounded' && this.#phase === 'armed' && row.bound_lsn !== null) {
      this.#bound = parseLsn(row.bound_lsn);
      this.#phase = 'bounded';
      this.opts.log.debug({ bound: row.bound_lsn, sinceArmedMs: Date.now() - request.armedAt }, 'verify: commits below the bound may apply');
    } else if (row.state === 'located' && (this.#phase === 'armed' || this.#phase === 'bounded') && row.slot_lsn !== null) {
      this.#bound = parseLsn(row.slot_lsn);
      this.#phase = 'located';
      this.opts.log.debug({ lsn: row.slot_lsn, sinceArmedMs: Date.now() - request.armedAt }, 'verify: holding at the slot position');
    } else if (row.state === 'imported') {
      this.#endSnapshot();
      if (request.mode === 'snapshot' && this.#phase === 'idle') this.#request = null;
      return;
    } else if (row.state === 'released' || row.state === 'done' || row.state === 'abandoned') {
      this.#open(null);
      return;
    } else return;
    this.#wake?.();
  }

  async #arm(row: VerifyRow): Promise<void> {
    if (this.#request !== null) this.#open('a newer request replaced it');
    if (!(await holderAlive(this.#query, this.opts.subscription, row.holder_pid!))) return;
    if (this.opts.refusal !== null) {
      await moveVerifyRow(this.#query, this.opts.subscription, row.request_id!, ['requested'], 'refused', { detail: this.opts.refusal });
      return;
    }
    // The gate closes before the answer leaves: whatever starts to apply after 'armed' is gated.
    this.#request = { id: row.request_id!, holder: row.holder_pid!, mode: row.mode, timeoutMs: row.hold_timeout_ms, armedAt: Date.now(), blockedMs: 0 };
    this.#phase = 'armed';
    // Connecting now, without delaying the answer: by the boundary (after the source's slot
    // is created) the pause is a BEGIN and an export, not a connect.
    if (row.mode === 'snapshot')
      void this.#snapshotConnection()
        .unsafe('SELECT 1')
        .catch(() => {});
    this.opts.log.info({ request: row.request_id, mode: row.mode }, 'verify: apply gate closed, waiting for the source position');
    if (!(await moveVerifyRow(this.#query, this.opts.subscription, row.request_id!, ['requested'], 'armed'))) this.#open(null);
  }

  /**
   * Let go of a request. Held for a repair, the row is moved first: each repair batch reads
   * it 'held' under a share lock, so this waits for a batch in flight to commit, and no
   * batch writes once the apply goes on (it would undo what the apply writes).
   */
  async #giveUp(request: Request, reason: string): Promise<void> {
    if (this.#phase === 'held') await moveVerifyRow(this.#query, this.opts.subscription, request.id, null, 'abandoned', { detail: reason }).catch(() => {});
    if (this.#request === request) this.#open(reason);
  }

  /** Holder gone or hold too long: let go. While the exported snapshot waits to be imported, the same. */
  async #check(): Promise<void> {
    const request = this.#request;
    if (request === null || this.#checking) return;
    this.#checking = true;
    try {
      if (this.#phase !== 'idle' && Date.now() - request.armedAt > request.timeoutMs) return await this.#giveUp(request, `hold timeout (${request.timeoutMs} ms)`);
      if (!(await holderAlive(this.#query, this.opts.subscription, request.holder))) {
        if (this.#request === request) await this.#giveUp(request, 'the verify session is gone');
      } else if (this.#phase === 'idle' && Date.now() - request.armedAt > request.timeoutMs + 60_000) this.#open('snapshot not imported in time');
    } catch (err) {
      this.opts.log.debug({ err }, 'verify holder check failed');
    } finally {
      this.#checking = false;
    }
  }
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
