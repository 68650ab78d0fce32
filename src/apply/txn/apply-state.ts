/**
 * The apply worker's state between messages (worker.c's file-level statics, gathered):
 * the target connection and its statement pipeline, the relation map, the remote
 * transaction being applied, progress positions and counters. Handlers read and change
 * it; only the applier creates it.
 */
import type { Logger } from '../../log.js';
import type { Lsn } from '../../protocol/lsn.js';
import type { PgOutputMessage, StreamCommitMessage, StreamPrepareMessage } from '../../protocol/messages.js';
import type { Progress } from '../../origin/positions.js';
import type { RelationMap } from '../sql/relmap.js';
import type { MappedRelation } from '../sql/mapped-relation.js';
import type { Detect } from '../sql/detecting.js';
import type { Tuple } from '../../protocol/messages.js';
import type { StreamSpool } from './spool.js';
import type { SyncStates, TableSync } from '../../origin/sync-state.js';
import type { WireConnection } from '../../pgwire/connect.js';
import { Pipeline } from '../../pgwire/pipeline.js';
import { CONFLICT_TYPES, type ConflictType } from '../../conflict/types.js';
import type { ApplyOptions } from '../../config/apply-options.js';

export interface RemoteTransaction {
  xid: number;
  finalLsn: Lsn;
  commitTime: bigint;
  /** Commit LSN below the origin: applied only to tables catching up (re-streamed range). */
  behind: boolean;
  /** A target BEGIN has been sent (deferred until the first change). */
  open: boolean;
  changes: number;
  /** Tables not ready yet that this transaction changed: their own positions advance with it (NO_TABLES until one is). */
  syncTouched: ReadonlySet<TableSync>;
  /** The relation whose changes this transaction last found to apply (transaction.ts applies); -1: none yet. */
  appliesTo: number;
  /** A resent BEGIN PREPARE whose transaction is already prepared on the target: body skipped. */
  alreadyPrepared: boolean;
  /** The transaction `pgsub skip --lsn` named: no change applied, the origin moves past it. */
  skip?: boolean;
  /** It changed a table published but not part of the subscription (skipped): its end is still committed with the origin (commit.ts). */
  unsubscribed: boolean;
}

/**
 * Source transactions applied in the target transaction still open (grouping while
 * behind): committed together, with the origin at the last one's end.
 */
export interface TargetGroup {
  transactions: number;
  changes: number;
  endLsn: Lsn;
  commitTime: bigint;
}

export interface ApplyCounters {
  transactionsApplied: number;
  transactionsSkipped: number;
  changesApplied: number;
  updateMissing: number;
  deleteMissing: number;
  /**
   * Conflicts detected in this process, as pg_stat_subscription_stats.confl_* counts them
   * (the durable counters are in the target): one resolved by a policy once the target
   * transaction resolving it commits (commit.ts settleCommit, from TxState.resolved), one
   * under `error` with the apply error it raises (service/runner.ts); with detection off,
   * a missing row when its statement's answer says so (handlers/changes.ts, rows.ts, batch.ts).
   */
  conflicts: Record<ConflictType, number>;
  /**
   * The conflict types the current (or last) session detects: none with detection off,
   * no *_origin_differs without track_commit_timestamp on the target; null before a
   * session set it. A type outside it has no conflicts metric unless counted.
   */
  detectedConflicts: readonly ConflictType[] | null;
  /** Remote transactions re-applied one change at a time after the fast path met a conflict. */
  carefulReplays: number;
  /** Rows inserted through COPY batches (batch.ts). */
  rowsCopied: number;
  /** Source commit time (µs since 2000) of the last transaction the target committed, for lag in seconds. */
  lastCommitTime: bigint | null;
}

/**
 * What every apply connection of a session shares, leader and workers (a parallel apply
 * worker, the apply lanes) alike: fixed for the session, never written by the apply.
 */
export interface ApplySession {
  readonly subscription: string;
  readonly progress: Progress;
  readonly log: Logger;
  readonly counters: ApplyCounters;
  readonly sync: SyncStates;
  readonly spool: StreamSpool;
  /** The settings, as built once from the config (config/apply-options.ts). */
  readonly options: ApplyOptions;
  /** This session's replication origin id when the target tracks commit origins (origin_differs checks); else null. */
  readonly originId: number | null;
  /** synchronous_commit = off for apply transactions, with flush tracking (txn/transaction.ts beginTarget). */
  readonly asyncCommit: boolean;
  /** A change for a table the sync states do not know: the publication gained a table. */
  onUnknownTable(schema: string, table: string): void;
  /** Called after the target committed a new durable position. */
  onDurable(): void;
}

/**
 * The target transaction under way on one connection. Written only by the txn layer
 * (transaction.ts opens it, commit.ts ends it); endTarget resets it, in one place.
 */
export interface TxState {
  xact: RemoteTransaction | null;
  /** An open target transaction holding committed source transactions (see TargetGroup). */
  group: TargetGroup | null;
  /** Row changes waiting to go out as multi-row statements, per relation id (batch.ts). */
  readonly rowBatches: Map<number, RowBatch>;
  /** Writes per row (relation, then key) in the open target transaction; see batch.ts noteRowWrite. */
  readonly rowWrites: Map<number, Map<string, number>>;
  /** Rows in rowWrites, all relations together. */
  rowWritesTracked: number;
  /** False once a row was written often enough in the open target transaction to end the group. */
  canGroupHotRows: boolean;
  /**
   * Conflicts a policy resolved in the open target transaction (handlers/careful.ts), in
   * its conflict log: counted in the session's counters when it commits, dropped with a
   * rollback (a re-apply of the transaction detects them again).
   */
  readonly resolved: ConflictType[];
  /**
   * The last target commit sent without waiting for its answer (commit.ts commitTarget):
   * its end LSN and the answer's outcome; null once the answer arrived. A failure while one
   * is outstanding may belong to it, so it cannot be replayed from memory (run/applier.ts).
   */
  unconfirmed: { until: Lsn; answered: Promise<void> } | null;
  /** The xid of the remote transaction started last (transaction.ts startRemote): the newest one a statement sent now can carry. */
  lastXid: number;
}

/** How the current remote transaction is applied, set by the loop and the handlers. */
export interface ApplyMode {
  /**
   * Apply the current remote transaction one change at a time, detecting and resolving
   * conflicts with their policies (handlers/careful.ts); set by the loop for a replay.
   */
  careful: boolean;
  /** Finish LSN of a transaction to apply carefully from its BEGIN (replay across a session restart). */
  carefulLsn: Lsn | null;
  /** Finish LSN of the remote transaction to skip (`pgsub skip`); cleared once skipped. */
  skipLsn: Lsn | null;
  /** Inside STREAM START … STREAM STOP: the streamed transaction's xid. */
  streamXid: number | null;
}

/** What the driver of this connection decides (run/loop.ts, run/lanes.ts, run/parallel.ts). */
export interface ApplyPolicy {
  /** May the commit of the transaction finishing at `finalLsn` go unanswered for now? (more is queued, not retrying one by one) */
  canPipelineCommit(finalLsn: Lsn): boolean;
  /** May the transaction finishing at `finalLsn` stay open for the next one? (more is queued, limits) */
  canGroup(finalLsn: Lsn): boolean;
  /**
   * Every statement's answer is read before the target transaction's COMMIT is sent (the
   * parallel apply connection drains before it commits, parallel.ts): with detection on,
   * batched updates then check their affected-row count on the client instead of inside
   * the statement (batch.ts), and a shortfall ends the eager apply like any conflict.
   */
  readonly resultsBeforeCommit?: boolean;
  /**
   * Apply lanes (run/lane-runner.ts, run/lane-order.ts): a target commit waits for
   * `acquire` (every earlier group committed), takes the replication origin for its commit
   * and releases it before its Sync. Absent on the main connection, which holds the origin for the session.
   */
  readonly commitTurn?: { originName: string; acquire(): Promise<void> };
}

/** One apply connection's state, by lifetime: the shared session, its connection, its transaction, its mode and policy. */
export interface ApplyState {
  readonly session: ApplySession;
  readonly conn: WireConnection;
  readonly pipeline: Pipeline;
  readonly relations: RelationMap;
  /** streaming = parallel: eager apply of one streamed transaction at a time (run/parallel.ts). */
  readonly parallel: ParallelPort | null;
  readonly tx: TxState;
  readonly mode: ApplyMode;
  readonly policy: ApplyPolicy;
}

/** A transaction state with nothing under way. */
export function newTxState(): TxState {
  return { xact: null, group: null, rowBatches: new Map(), rowWrites: new Map(), rowWritesTracked: 0, canGroupHotRows: true, resolved: [], unconfirmed: null, lastXid: 0 };
}

/** The syncTouched of a transaction that changed no table being synced: shared, never written (no Set per transaction). */
export const NO_TABLES: ReadonlySet<TableSync> = new Set();

export function newCounters(): ApplyCounters {
  return {
    transactionsApplied: 0,
    transactionsSkipped: 0,
    changesApplied: 0,
    updateMissing: 0,
    deleteMissing: 0,
    conflicts: Object.fromEntries(CONFLICT_TYPES.map((t) => [t, 0])) as Record<ConflictType, number>,
    detectedConflicts: null,
    carefulReplays: 0,
    rowsCopied: 0,
    lastCommitTime: null,
  };
}

/**
 * The state of a second apply connection working for `leader` (a parallel apply worker,
 * an apply lane): its own connection, pipeline, relation map, transaction and mode; the
 * leader's session, shared. It never groups or pipelines commits on its own unless
 * `policy` says so.
 */
export function workerState(leader: ApplyState, conn: WireConnection, relations: RelationMap, maxInFlight: number, policy: Partial<ApplyPolicy> = {}): ApplyState {
  return {
    session: leader.session,
    conn,
    pipeline: new Pipeline(maxInFlight),
    relations,
    parallel: null,
    tx: newTxState(),
    // A conflict ends the worker's apply: the leader replays the transaction carefully.
    mode: { careful: false, carefulLsn: null, skipLsn: null, streamXid: null },
    policy: { canGroup: () => false, canPipelineCommit: () => false, ...policy },
  };
}

/**
 * The handler table's entry point (handlers/dispatch.ts), handed to every path that
 * replays messages (a streamed transaction's spool, a careful replay, lanes, parallel
 * apply) instead of imported by it: the layers below handlers never import it.
 */
export type Dispatch = (state: ApplyState, message: PgOutputMessage, raw: Buffer) => Promise<void> | void;

/**
 * streaming = parallel, as the stream handlers see it (run/parallel.ts implements it):
 * one streamed transaction applied eagerly on a connection of its own while it arrives,
 * read from the spool behind the leader.
 */
export interface ParallelPort {
  isEager(xid: number): boolean;
  onStreamStart(xid: number, firstSegment: boolean): Promise<void>;
  /** Records of `xid` reached the spool's file (the eager connection reads them from there). */
  spooled(xid: number): void;
  /** Before the spool cuts a subtransaction: the eager connection applies what was spooled, then rolls back to its savepoint. */
  onStreamAbort(xid: number, subXid: number): Promise<void>;
  /** STREAM COMMIT of the eager transaction; false: not eager, replay the spool. */
  commit(m: StreamCommitMessage): Promise<boolean>;
  prepare(m: StreamPrepareMessage): Promise<boolean>;
  /** Give up eager apply of `xid` (it will be replayed from the spool, or was prepared already). */
  abandon(xid: number): Promise<void>;
}

/** Row changes of one relation waiting to go out as one multi-row statement or COPY (batch.ts). */
export interface RowBatch {
  kind: 'insert' | 'update';
  relationId: number;
  rel: MappedRelation;
  /** update: the columns sent (unchanged TOAST ones are left out) and the detection, as one key. */
  shape: string;
  setIndexes: number[];
  detect: Detect | null;
  tuples: Tuple[];
  /** insert: Insert messages not decoded, to become COPY input as sent (copy-messages.ts); a batch holds these or tuples. */
  messages: Buffer[];
  /** update: position of each key in `tuples` — a second update of the row replaces it. */
  keys: Map<string, number>;
  bytes: number;
  xid: number;
}
