/**
 * The streaming apply loop (worker.c's LogicalRepApplyLoop), as two cooperating tasks:
 *  - the receiver reads CopyData frames, answers keepalives, decodes pgoutput messages
 *    and queues them (bounded: a full queue stops the reading, back-pressuring the socket);
 *  - the applier takes queued items in order and dispatches them to the handlers.
 * Feedback ('r') reports only the durable position (see origin/progress.ts): after each
 * applied commit, every status interval, and at once when the publisher asks. A silent
 * publisher is pinged after half the receive timeout and dropped after all of it.
 * Stopping rolls back an open target transaction: a partial source transaction is never
 * committed; it is received again after restart.
 */
import { ConnectionLostError } from '../errors.js';
import type { Logger } from '../log.js';
import { decode } from '../protocol/decoder.js';
import { parseReplicationFrame } from '../protocol/framing.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { ReplicationStream } from '../protocol/replication.js';
import { idleProgressStatement } from '../origin/store.js';
import type { Progress } from '../origin/progress.js';
import { commitGroup, dispatch } from './handlers.js';
import { BoundedQueue } from './queue.js';
import type { RelationMap } from './relmap.js';
import { clearSyncProgressStatement, setStateStatement, type SyncStates } from '../tablesync/state.js';
import type { StreamSpool } from './spool.js';
import type { ApplyCounters, ApplyState } from './state.js';
import { ParallelApply, type ParallelApplyOptions } from './parallel.js';
import { Pipeline, runAlone, type WireConnection } from './target.js';
import { PipelineAbortedError } from './wire.js';

type WorkItem =
  /** A pgoutput message, decoded by the applier: the queue holds bytes only once. */
  | { kind: 'message'; raw: Buffer }
  /** A keepalive between transactions: everything before `lsn` has been sent to us. */
  | { kind: 'position'; lsn: Lsn }
  /** Wakes the applier so an idle position gets recorded. */
  | { kind: 'tick' };

const QUEUE_BYTES = 32 * 1024 * 1024;
/** A group also ends after this many changes: a failure re-applies at most this much. */
const GROUP_MAX_CHANGES = 100_000;
const TAG_BEGIN = 0x42; // 'B'
const TAG_COMMIT = 0x43; // 'C'
const TAG_BEGIN_PREPARE = 0x62; // 'b'
const TAG_PREPARE = 0x50; // 'P'

export interface ApplyLoopOptions {
  subscription: string;
  stream: ReplicationStream;
  conn: WireConnection;
  relations: RelationMap;
  progress: Progress;
  counters: ApplyCounters;
  sync: SyncStates;
  spool: StreamSpool;
  /** Stream Abort messages carry abort LSN and time (protocol 4, streaming = parallel). */
  streamAbortInfo: boolean;
  onUnknownTable(schema: string, table: string): void;
  log: Logger;
  statusIntervalMs: number;
  receiveTimeoutMs: number;
  maxInFlight: number;
  queueSize: number;
  /** Most source transactions per target transaction while behind (1: no grouping). */
  groupTransactions?: number;
  /** streaming = parallel, in a session that starts at the origin (never re-streams applied commits). */
  parallel?: ParallelApplyOptions | null;
  /** Minimum spacing of idle-position records in the target. */
  idleRecordIntervalMs?: number;
}

export interface ApplyLoop {
  /** Settles when the loop ends: resolves after stop(), rejects with the first failure. */
  done: Promise<void>;
  stop(): void;
}

export function startApplyLoop(opts: ApplyLoopOptions): ApplyLoop {
  const { stream, progress, log } = opts;
  // Bounded by count and by bytes: wide rows must not multiply memory by queue_size.
  const queue = new BoundedQueue<WorkItem>(opts.queueSize, QUEUE_BYTES);
  const pipeline = new Pipeline(opts.maxInFlight);
  const idleRecordIntervalMs = opts.idleRecordIntervalMs ?? 1000;
  const groupTransactions = opts.groupTransactions ?? 1;
  let stopping = false;
  let failure: unknown = null;
  let lastFrameAt = Date.now();
  let pingSent = false;
  let lastFeedbackAt = 0;
  let lastRecordAt = 0;
  let feedbackScheduled = false;

  const sendFeedback = (replyRequested = false) => {
    lastFeedbackAt = Date.now();
    // Never confirm past what a table being synced still needs from the stream.
    const status = progress.standbyStatus(opts.sync.heldLsn());
    stream.sendStandbyStatus({ ...status, replyRequested });
    log.trace({ write: formatLsn(status.written), flush: formatLsn(status.flushed) }, 'feedback sent');
  };

  const parallelHolder: { value: ParallelApply | null } = { value: null };
  const state: ApplyState = {
    get parallel() {
      return parallelHolder.value;
    },
    subscription: opts.subscription,
    conn: opts.conn,
    pipeline,
    relations: opts.relations,
    progress,
    log,
    counters: opts.counters,
    sync: opts.sync,
    spool: opts.spool,
    streamXid: null,
    onUnknownTable: opts.onUnknownTable,
    xact: null,
    group: null,
    canGroup() {
      // Only while more is already queued: a caught-up stream commits each transaction at once.
      const group = state.group;
      return queue.length > 0 && (group?.transactions ?? 0) + 1 < groupTransactions && (group?.changes ?? 0) < GROUP_MAX_CHANGES;
    },
    onDurable() {
      // Coalesce: one feedback for a burst of commits.
      if (feedbackScheduled) return;
      feedbackScheduled = true;
      setTimeout(() => {
        feedbackScheduled = false;
        if (!stopping && failure === null) sendFeedback();
      }, 20).unref();
    },
  };

  if (opts.parallel) parallelHolder.value = new ParallelApply(state, opts.parallel);

  const fail = (err: unknown) => {
    // A statement skipped after an earlier failure: report the earlier one, the root cause.
    const root = err instanceof PipelineAbortedError && err.cause ? err.cause : err;
    if (failure === null && !stopping) failure = root;
    queue.close();
    stream.destroy();
  };

  async function receive(): Promise<void> {
    let inTransaction = false;
    for await (const frame of stream.frames()) {
      lastFrameAt = Date.now();
      pingSent = false;
      const parsed = parseReplicationFrame(frame as Buffer);
      if (parsed.kind === 'keepalive') {
        progress.noteReceived(parsed.walEnd);
        if (!inTransaction) await queue.put({ kind: 'position', lsn: parsed.walEnd });
        if (parsed.replyRequested) sendFeedback();
        continue;
      }
      progress.noteReceived(parsed.walEnd);
      // The tag byte is all the receiver needs: keepalives between transactions are positions.
      const tag = parsed.data[0];
      if (tag === TAG_BEGIN || tag === TAG_BEGIN_PREPARE) inTransaction = true;
      else if (tag === TAG_COMMIT || tag === TAG_PREPARE) inTransaction = false;
      if (!(await queue.put({ kind: 'message', raw: parsed.data }, parsed.data.length))) return;
      // Time spent waiting for queue space is not publisher silence.
      lastFrameAt = Date.now();
    }
    if (!stopping) throw new ConnectionLostError('replication stream ended');
  }

  async function recordIdlePosition(): Promise<void> {
    const lsn = progress.processed;
    lastRecordAt = Date.now();
    const statement = idleProgressStatement(opts.subscription, lsn);
    const promoted = opts.sync.promotable(lsn, progress.durable);
    // Outside BEGIN, the statements and the Sync form one implicit transaction.
    const statements = [statement, ...promoted.flatMap((t) => [setStateStatement(opts.subscription, t, 'r', null), clearSyncProgressStatement(opts.subscription, t)])];
    await runAlone(opts.conn, statements);
    for (const t of promoted) opts.sync.set({ ...t, state: 'r', syncLsn: null });
    if (promoted.length > 0) log.info({ tables: promoted.map((t) => `${t.schema}.${t.table}`), lsn: formatLsn(lsn) }, 'tables ready');
    progress.noteDurable(lsn);
    state.onDurable();
  }

  async function apply(): Promise<void> {
    const decodeContext = { inStream: false, streamAbortInfo: opts.streamAbortInfo };
    while (!stopping) {
      const item = await queue.take();
      if (item === undefined || stopping) break;
      if (item.kind === 'message') {
        const message = decode(item.raw, decodeContext);
        if (message.tag === 'streamStart') decodeContext.inStream = true;
        else if (message.tag === 'streamStop') decodeContext.inStream = false;
        await dispatch(state, message, item.raw);
      }
      // Nothing more waiting: the grouped transactions commit now, not with the next arrival.
      if (state.group && state.xact === null && queue.length === 0) await commitGroup(state);
      else if (item.kind === 'position' && state.xact === null) progress.noteProcessed(item.lsn);
      const now = Date.now();
      if (
        state.xact === null &&
        state.group === null &&
        progress.hasUnrecordedPosition &&
        now - lastRecordAt >= idleRecordIntervalMs &&
        (queue.length === 0 || now - lastFeedbackAt >= opts.statusIntervalMs)
      ) {
        await recordIdlePosition();
      }
    }
  }

  const timer = setInterval(() => {
    const now = Date.now();
    if (now - lastFeedbackAt >= opts.statusIntervalMs) sendFeedback();
    const silentFor = now - lastFrameAt;
    if (!queue.full) {
      if (silentFor >= opts.receiveTimeoutMs) {
        fail(new ConnectionLostError(`no message from the publisher for ${Math.round(silentFor / 1000)} s (receive_timeout)`));
      } else if (silentFor >= opts.receiveTimeoutMs / 2 && !pingSent) {
        pingSent = true;
        sendFeedback(true);
      }
    }
    if (queue.length === 0 && progress.hasUnrecordedPosition && now - lastRecordAt >= idleRecordIntervalMs) {
      void queue.put({ kind: 'tick' });
    }
  }, Math.min(250, opts.statusIntervalMs));
  timer.unref();

  const receiver = receive().catch(fail);
  const applier = apply().catch(fail);

  const done = (async () => {
    await applier;
    queue.close();
    clearInterval(timer);
    if (state.xact?.open || state.group) {
      // Roll back the partial remote transaction; it is resent after restart.
      pipeline.reset();
      await opts.conn.sync().catch(() => {});
      await Promise.all([opts.conn.execute('ROLLBACK'), opts.conn.sync()]).catch(() => {});
    }
    state.xact = null;
    state.group = null;
    await parallelHolder.value?.close();
    if (failure === null) sendFeedback();
    stream.destroy();
    await receiver;
    if (failure !== null) throw failure;
  })();

  return {
    done,
    stop() {
      if (stopping) return;
      stopping = true;
      queue.close();
    },
  };
}
