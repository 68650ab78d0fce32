/**
 * streaming = parallel (protocol 4, PG16+ publishers): worker.c's parallel apply
 * (applyparallelworker.c), with a second target connection in place of a parallel apply
 * worker. The changes of a streamed transaction are applied while it streams, in their own
 * target transaction on that connection, with a savepoint at the first change of each
 * subtransaction (STREAM ABORT of a subtransaction rolls back to it); STREAM COMMIT
 * commits it there together with the origin row and the replication origin's stamp.
 *
 * The leader spools every streamed change as in streaming = on, and the eager connection
 * reads the spool behind it (the read-ahead, #read): the leader never waits for the eager
 * apply while a block streams, so the walsender's burst after decoding a block is taken at
 * the speed of a file append and the walsender goes back to decoding while the eager
 * connection applies (native's leader instead waits on its parallel worker's queue). At
 * STREAM ABORT of a subtransaction, STREAM COMMIT and STREAM PREPARE the leader waits until
 * the read-ahead has applied everything spooled so far.
 *
 * Whenever the eager transaction cannot go on safely it is abandoned (its backend
 * terminated, which rolls it back) and the transaction is applied from the spool at its
 * commit, like native's fallback to serialization:
 *  - a change for a table that is not ready (still syncing, unknown), or any error;
 *  - the leader, or an apply lane the leader waits for, waits for a lock the eager
 *    transaction holds: the eager transaction can only commit after the leader gets past
 *    that wait, so PostgreSQL would never see the deadlock (one side waits in pgsub, not
 *    on a lock) — a watchdog on a third, always-idle connection asks pg_blocking_pids;
 *  - the eager connection has waited on a lock for longer than LOCK_WAIT_LIMIT_MS (e.g.
 *    behind a transaction prepared on the target, whose COMMIT PREPARED is still queued).
 * One streamed transaction is applied eagerly at a time; others are spooled (native's
 * max_parallel_apply_workers_per_subscription, here 1). Commit order is the stream's: the
 * leader handles STREAM COMMIT in order and waits for the eager commit.
 *
 * Only one session may hold a replication origin, so for the eager commit the leader
 * hands `pgsub_<subscription>` to the eager connection and takes it back afterwards.
 */
import type { ApplyOptions } from '../../config/apply-options.js';
import { LockWatch } from './watchdog.js';
import { ProtocolError } from '../../errors.js';
import { asLsn, formatLsn, type Lsn } from '../../protocol/lsn.js';
import { decode } from '../../protocol/decoder.js';
import { schemaOf, type PgOutputMessage, type RelationMessage, type StreamCommitMessage, type StreamPrepareMessage } from '../../protocol/messages.js';
import { faultPoint } from '../../faults.js';
import { beginTarget, sendStatement } from '../txn/transaction.js';
import { originSessionResetStatement, originSessionSetupStatement } from '../../origin/replorigin.js';
import { finishTransaction, type Ending } from '../txn/commit.js';
import { flushRowBatch } from '../txn/batch.js';
import { workerState, type ApplyState, type RemoteTransaction, type Dispatch, type ParallelPort } from '../txn/apply-state.js';
import { runAlone, type WireConnection } from '../../pgwire/connect.js';
import { advanceOrigin, targetGid } from '../handlers/twophase.js';
import { syncKey } from '../../origin/sync-state.js';
import { startRemote } from '../txn/transaction.js';
import { endTarget } from '../txn/commit.js';

const MAX_LSN = asLsn(0xffffffffffffffffn);
const WATCH_INTERVAL_MS = 250;
const LOCK_WAIT_LIMIT_MS = 5000;
/** Spooled records are messages of a stream block (STREAM ABORT, the one that carries abort info, is never spooled). */
const SPOOLED_CONTEXT = { inStream: true, streamAbortInfo: true };
const DATA_CHANGES: ReadonlySet<PgOutputMessage['tag']> = new Set(['insert', 'update', 'delete', 'truncate']);

export interface ParallelApplyOptions extends ParallelConnections {
  /** The settings (maxInFlight of the worker's connection). */
  options: ApplyOptions;
  /** The handler table (handlers/dispatch.ts), given by the loop. */
  dispatch: Dispatch;
  /**
   * Backends whose wait on the eager transaction stops the leader: its own connection and
   * the apply lanes' (the leader waits for every lane before the next stream message).
   */
  waiters?(): number[];
}

/** How the parallel apply worker's connections are opened and set up, from the session. */
export interface ParallelConnections {
  /** Opens a target connection set up like the apply connection (target.ts). */
  openConnection(purpose: 'parallel' | 'watch'): Promise<WireConnection>;
  originName: string;
  targetVersionNum: number;
}

interface Worker {
  conn: WireConnection;
  state: ApplyState;
}

interface Eager {
  xid: number;
  xact: RemoteTransaction;
  /** Subtransactions with a savepoint, in the order they were defined. */
  savepoints: number[];
  /** Since when the leader has been waiting on the eager connection (a statement push). */
  busySince: number | null;
  /** Committing: the watchdog keeps off. */
  finishing: boolean;
  /** The read-ahead (#read): the spool's offset of the next record to apply. */
  offset: number;
  /** The most the read-ahead has been behind the spool's written records, in bytes (logged at the end). */
  maxBehind: number;
  /** The read-ahead parked at the end of what is written: wakes it. */
  wake: (() => void) | null;
  /** Waiting until the read-ahead has applied everything written (#caughtUp). */
  caughtUp: (() => void)[];
}

export interface ParallelCounters {
  eagerTransactions: number;
  fallbacks: number;
}

export class ParallelApply implements ParallelPort {
  readonly counters: ParallelCounters = { eagerTransactions: 0, fallbacks: 0 };
  #worker: Worker | null = null;
  #eager: Eager | null = null;
  #closed = false;
  readonly #watch: LockWatch;

  constructor(
    private readonly leader: ApplyState,
    private readonly opts: ParallelApplyOptions,
  ) {
    this.#watch = new LockWatch(() => opts.openConnection('watch'), leader.session.log, 'parallel apply');
  }

  /** Is `xid` being applied eagerly? */
  isEager(xid: number): boolean {
    return this.#eager?.xid === xid;
  }

  /** STREAM START: the first segment of a transaction starts eager apply when the slot is free. */
  async onStreamStart(xid: number, firstSegment: boolean): Promise<void> {
    if (!firstSegment || this.#eager || this.#closed) return;
    try {
      const worker = await this.#ensureWorker();
      const xact = startRemote(worker.state, { xid, finalLsn: MAX_LSN, commitTime: 0n, behind: false });
      const eager: Eager = { xid, xact, savepoints: [], busySince: null, finishing: false, offset: 0, maxBehind: 0, wake: null, caughtUp: [] };
      this.#eager = eager;
      this.counters.eagerTransactions++;
      void this.#read(eager, worker);
      this.leader.session.log.debug({ xid }, 'streamed transaction applied in parallel');
    } catch (err) {
      // No second connection (e.g. max_connections): this transaction is spooled only.
      this.leader.session.log.warn({ xid, err }, 'parallel apply connection unavailable; transaction spooled');
    }
  }

  /** Records of `xid` reached the spool's file: the read-ahead goes on if it waits for them. */
  spooled(xid: number): void {
    const eager = this.#eager;
    if (eager?.xid === xid) wakeReader(eager);
  }

  /**
   * The read-ahead: applies the eager transaction's spooled records in order, behind the
   * leader, until the transaction stops being eager (committed, aborted, fallen back).
   * At the end of what is written it parks until woken (spooled, #caughtUp, #release).
   */
  async #read(eager: Eager, worker: Worker): Promise<void> {
    const spool = this.leader.session.spool;
    try {
      while (this.#eager === eager) {
        const { records, next } = spool.readFrom(eager.xid, eager.offset);
        if (records.length === 0) {
          for (const resolve of eager.caughtUp.splice(0)) resolve();
          await new Promise<void>((resolve) => (eager.wake = resolve));
          continue;
        }
        eager.maxBehind = Math.max(eager.maxBehind, spool.writtenOf(eager.xid) - eager.offset);
        // No turn for the event loop in between unless a statement must wait: the statement
        // window (max_in_flight rows) bounds how long that is, and W3 was no faster with a
        // turn every 2 ms.
        for (const record of records) {
          const applied = this.#applyRecord(eager, worker, record);
          if (applied === undefined) continue;
          await applied;
          if (this.#eager !== eager) return;
        }
        eager.offset = next;
      }
    } catch (err) {
      await this.#fallBack(eager, 'error in the parallel transaction', err);
    } finally {
      for (const resolve of eager.caughtUp.splice(0)) resolve();
    }
  }

  /** Until the read-ahead has applied every record written so far, or the transaction is no longer eager. */
  #caughtUp(eager: Eager): Promise<void> {
    if (this.#eager !== eager) return Promise.resolve();
    return new Promise((resolve) => {
      eager.caughtUp.push(resolve);
      wakeReader(eager);
    });
  }

  /** One spooled record: decoded (here only) and applied. No promise unless it has to wait. */
  #applyRecord(eager: Eager, worker: Worker, record: Buffer): Promise<void> | void {
    let message: PgOutputMessage;
    try {
      message = decode(record, SPOOLED_CONTEXT);
    } catch (err) {
      return this.#failed(eager, err);
    }
    const subXid = 'xid' in message && message.xid !== undefined ? message.xid : eager.xid;
    if (DATA_CHANGES.has(message.tag)) {
      const notReady = this.#notReadyTable(worker, message);
      if (notReady) return this.#fallBack(eager, `change for ${notReady}, which is not ready`);
      if (!eager.xact.open || (subXid !== eager.xid && !eager.savepoints.includes(subXid))) return this.#enterThenApply(worker, eager, subXid, message, record);
    }
    let applied: Promise<void> | void;
    try {
      applied = this.opts.dispatch(worker.state, message, record);
    } catch (err) {
      return this.#failed(eager, err);
    }
    if (applied === undefined) return;
    // Waiting on the eager connection from here (the watchdog looks at how long).
    eager.busySince = Date.now();
    return applied.then(
      () => {
        eager.busySince = null;
      },
      (err: unknown) => {
        eager.busySince = null;
        return this.#failed(eager, err);
      },
    );
  }

  /** The first change of the transaction or of a subtransaction: BEGIN or SAVEPOINT first. */
  async #enterThenApply(worker: Worker, eager: Eager, subXid: number, message: PgOutputMessage, raw: Buffer): Promise<void> {
    eager.busySince = Date.now();
    try {
      await this.#enterSubtransaction(worker, eager, subXid);
      await this.opts.dispatch(worker.state, message, raw);
    } catch (err) {
      await this.#failed(eager, err);
    } finally {
      eager.busySince = null;
    }
  }

  #failed(eager: Eager, err: unknown): Promise<void> | void {
    if (this.#eager === eager) return this.#fallBack(eager, 'error in the parallel transaction', err);
  }

  /**
   * STREAM ABORT: roll back the subtransaction to its savepoint, or the whole eager
   * transaction. Called before the spool cuts the subtransaction's records: the read-ahead
   * first applies everything spooled, then goes on from the cut.
   */
  async onStreamAbort(xid: number, subXid: number): Promise<void> {
    const eager = this.#eager;
    const worker = this.#worker;
    if (!eager || eager.xid !== xid || !worker) return;
    if (xid === subXid) {
      await this.#end(eager);
      return;
    }
    const cut = this.leader.session.spool.abortOffset(xid, subXid);
    if (cut === undefined) return; // no change of it was spooled
    await this.#caughtUp(eager);
    if (this.#eager !== eager) return;
    // Parked until the next records are written, which is after the cut.
    eager.offset = cut;
    const at = eager.savepoints.indexOf(subXid);
    if (at < 0) return; // no change of it was applied
    // Later savepoints are gone with it: they were defined after it.
    eager.savepoints.length = at;
    try {
      // Inserts batched before the abort belong before the rollback.
      await flushRowBatch(worker.state);
      await worker.state.pipeline.push(worker.conn.execute(`ROLLBACK TO SAVEPOINT ${savepointName(subXid)}`));
    } catch (err) {
      await this.#fallBack(eager, 'error in the parallel transaction', err);
    }
  }

  /** STREAM COMMIT of the eager transaction: commit it with the origin. False: not eager, replay the spool. */
  async commit(m: StreamCommitMessage): Promise<boolean> {
    return this.#finish(m.xid, m.commitLsn, m.endLsn, m.commitTime, { kind: 'commit' });
  }

  /** STREAM PREPARE of the eager transaction: prepare it under its gid, then move the origin. */
  async prepare(m: StreamPrepareMessage): Promise<boolean> {
    const done = await this.#finish(m.xid, m.prepareLsn, m.endLsn, m.prepareTime, { kind: 'prepare', gid: targetGid(this.leader.session.subscription, m.xid) });
    if (!done) return false;
    faultPoint('after-prepare');
    await advanceOrigin(this.leader, m.endLsn, []);
    return true;
  }

  /** Abandon the eager transaction of `xid` (e.g. it turned out to be prepared already). */
  async abandon(xid: number): Promise<void> {
    const eager = this.#eager;
    if (eager?.xid === xid) await this.#end(eager);
  }

  async close(): Promise<void> {
    this.#closed = true;
    const eager = this.#eager;
    if (eager) this.#release(eager);
    else this.#stopWatching();
    const worker = this.#worker;
    this.#worker = null;
    // Closing the socket rolls back an open eager transaction.
    await worker?.conn.close().catch(() => {});
    await this.#watch.close();
  }

  async #finish(xid: number, finalLsn: Lsn, endLsn: Lsn, time: bigint, ending: Ending): Promise<boolean> {
    const eager = this.#eager;
    const worker = this.#worker;
    if (!eager || eager.xid !== xid || !worker) return false;
    await this.#caughtUp(eager);
    if (this.#eager !== eager) return false;
    // Still watched while draining: a lock wait here is as stuck as one during the stream.
    eager.busySince = Date.now();
    try {
      // Pending batches go out now, not with the commit: every answer, and so every
      // affected-row count (state.policy.resultsBeforeCommit), is in before COMMIT is sent.
      await flushRowBatch(worker.state);
      await worker.state.pipeline.drain();
    } catch (err) {
      if (this.#eager === eager) await this.#fallBack(eager, 'error in the parallel transaction', err);
      return false;
    }
    if (this.#eager !== eager) return false;
    eager.finishing = true;
    const { xact } = eager;
    xact.finalLsn = finalLsn;
    xact.commitTime = time;
    if (finalLsn < this.leader.session.progress.durable) {
      // Cannot happen in a session that allows parallel apply (loop.ts); never apply twice.
      throw new ProtocolError(
        'PGSUB_PROTOCOL_OUT_OF_ORDER',
        `streamed xid ${xid} ends at ${formatLsn(finalLsn)}, below the origin ${formatLsn(this.leader.session.progress.durable)}`,
      );
    }
    if (xact.open) {
      // The commit record must carry the origin: hand it over for this one commit.
      await runAlone(this.leader.conn, [originSessionResetStatement()]);
      try {
        await sendStatement(worker.state, originSessionSetupStatement(this.opts.originName));
        await finishTransaction(worker.state, xact, endLsn, time, ending);
      } finally {
        this.#release(eager);
        await runAlone(worker.conn, [originSessionResetStatement()]);
        await runAlone(this.leader.conn, [originSessionSetupStatement(this.opts.originName)]);
      }
    } else {
      this.#release(eager);
      await finishTransaction(worker.state, xact, endLsn, time, ending);
    }
    this.leader.session.log.debug({ xid, lsn: formatLsn(finalLsn), changes: xact.changes, readAheadMaxBytes: eager.maxBehind }, 'parallel transaction finished');
    return true;
  }

  /** End the eager transaction without committing (ROLLBACK), keeping the connection. */
  async #end(eager: Eager): Promise<void> {
    const worker = this.#worker;
    this.#release(eager);
    if (!worker) return;
    endTarget(worker.state);
    if (!eager.xact.open) return;
    try {
      worker.state.pipeline.reset();
      await runAlone(worker.conn, [{ text: 'ROLLBACK', params: [] }]);
    } catch {
      await this.#dropWorker();
    }
  }

  /**
   * Give up eager apply of this transaction: terminate its backend (rolling it back, even
   * while it waits on a lock), and let STREAM COMMIT replay the spool.
   */
  async #fallBack(eager: Eager, reason: string, err?: unknown): Promise<void> {
    if (this.#eager !== eager) return;
    this.#release(eager);
    this.counters.fallbacks++;
    this.leader.session.log.info({ xid: eager.xid, reason, ...(err === undefined ? {} : { err }) }, 'parallel apply fell back to the spool');
    await this.#dropWorker();
  }

  /** The transaction is no longer eager: the watchdog stops and the read-ahead ends. */
  #release(eager: Eager): void {
    if (this.#eager === eager) this.#eager = null;
    this.#stopWatching();
    wakeReader(eager);
  }

  async #dropWorker(): Promise<void> {
    const worker = this.#worker;
    this.#worker = null;
    if (!worker) return;
    worker.state.pipeline.reset();
    try {
      await this.#watch.terminate(worker.conn.processId);
    } catch (err) {
      this.leader.session.log.warn({ err }, 'could not terminate the parallel apply backend; closing its connection');
    }
    await worker.conn.close().catch(() => {});
  }

  #notReadyTable(worker: Worker, message: PgOutputMessage): string | null {
    if (message.tag !== 'truncate') return 'relationId' in message ? this.#notReady(worker, message.relationId) : null;
    for (const id of message.relationIds) {
      const notReady = this.#notReady(worker, id);
      if (notReady) return notReady;
    }
    return null;
  }

  #notReady(worker: Worker, relationId: number): string | null {
    const remote = worker.state.relations.remoteRelation(relationId);
    // Once per change: the lookup key is built once per Relation message.
    let key = SYNC_KEYS.get(remote);
    if (key === undefined) SYNC_KEYS.set(remote, (key = syncKey(schemaOf(remote), remote.name)));
    const entry = this.leader.session.sync.getByKey(key);
    // A table not part of the subscription has its changes skipped whatever the LSN (sync-state.ts): the dispatch skips them here too.
    const ready = entry ? entry.state === 'r' : true;
    return ready ? null : `${schemaOf(remote)}.${remote.name}`;
  }

  /** BEGIN before the first change, and a savepoint at the first change of a subtransaction. */
  async #enterSubtransaction(worker: Worker, eager: Eager, subXid: number): Promise<void> {
    if (!eager.xact.open) {
      eager.xact.open = true;
      await beginTarget(worker.state);
      this.#startWatching();
    }
    if (subXid === eager.xid || eager.savepoints.includes(subXid)) return;
    eager.savepoints.push(subXid);
    // Inserts batched so far belong before the savepoint.
    await flushRowBatch(worker.state);
    await worker.state.pipeline.push(worker.conn.execute(`SAVEPOINT ${savepointName(subXid)}`));
  }

  async #ensureWorker(): Promise<Worker> {
    if (this.#worker) return this.#worker;
    const conn = await this.opts.openConnection('parallel');
    const leader = this.leader;
    // Its own relation map, as a parallel apply worker has: a streamed transaction's
    // Relation messages describe the table as that transaction sees it.
    const relations = leader.relations.sibling();
    // #finish drains the pipeline before the commit goes out.
    const state = workerState(leader, conn, relations, this.opts.options.maxInFlight, { resultsBeforeCommit: true });
    this.#worker = { conn, state };
    return this.#worker;
  }

  #startWatching(): void {
    this.#watch.start(WATCH_INTERVAL_MS, () => this.#checkBlocking());
  }

  #stopWatching(): void {
    this.#watch.stop();
  }

  /** The watchdog: is the leader waiting for the eager transaction, or the eager one stuck on a lock? */
  async #checkBlocking(): Promise<void> {
    const eager = this.#eager;
    const worker = this.#worker;
    if (!eager || !worker || eager.finishing) return;
    const waiters = this.opts.waiters?.() ?? [this.leader.conn.processId];
    const leaderBlocked = await this.#watch.blocks([worker.conn.processId], waiters);
    if (this.#eager !== eager || eager.finishing) return;
    if (leaderBlocked) {
      await this.#fallBack(eager, 'the leader or an apply lane waits for a lock the parallel transaction holds');
    } else if (eager.busySince !== null && Date.now() - eager.busySince > LOCK_WAIT_LIMIT_MS && (await this.#watch.waitsOnLock(worker.conn.processId))) {
      if (this.#eager !== eager || eager.finishing) return;
      await this.#fallBack(eager, `the parallel transaction has waited on a lock for over ${LOCK_WAIT_LIMIT_MS / 1000} s`);
    }
  }
}

const SYNC_KEYS = new WeakMap<RelationMessage, string>();

function wakeReader(eager: Eager): void {
  const wake = eager.wake;
  eager.wake = null;
  wake?.();
}

function savepointName(subXid: number): string {
  return `"pgsub_sub_${subXid}"`;
}
