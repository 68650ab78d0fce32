/**
 * One handler per pgoutput message, like worker.c's apply_dispatch → apply_handle_*.
 * A remote transaction becomes one target transaction: BEGIN is sent with its first
 * change, each change is pipelined, and COMMIT is preceded by the origin update in the
 * same transaction. A transaction whose commit LSN lies below the recorded origin was
 * applied before a restart and is dropped whole (walsender's own rule: it resends a
 * transaction unless its commit record starts before the confirmed position).
 * Conflicts: with detection on, UPDATE/DELETE statements abort the transaction when they
 * find no row or a foreign last writer, and INSERTs abort on an existing key; the loop
 * then replays the transaction with `state.careful`, where the change handlers hand each
 * change to conflict/resolve.ts. The transaction `pgsub skip` names applies nothing and
 * only moves the origin (finishSkipped).
 */
import { ApplyError, ProtocolError } from '../errors.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import type {
  BeginMessage,
  CommitMessage,
  DeleteMessage,
  InsertMessage,
  LogicalMessage,
  MessageTag,
  OriginMessage,
  PgOutputMessage,
  RelationMessage,
  TruncateMessage,
  TypeMessage,
  UpdateMessage,
} from '../protocol/messages.js';
import { originXactSetupStatement } from '../origin/replorigin.js';
import { commitProgressStatement, idleProgressStatement, preparedRowStatement } from '../origin/store.js';
import { clearSkipStatement } from '../conflict/control.js';
import { conflictLogStatement } from '../conflict/report.js';
import { carefulDelete, carefulInsert, carefulUpdate } from '../conflict/resolve.js';
import { quoteLiteral } from '../quote.js';
import { advanceSyncStatement, clearSyncProgressStatement, setStateStatement, syncKey } from '../tablesync/state.js';
import type { ApplyState, RemoteTransaction } from './state.js';
import type { MappedRelation } from './sql/relmap.js';
import type { TxStatus, WireResult } from '../target/wire.js';
import type { TableSync } from '../tablesync/state.js';
import { onStreamAbort, onStreamCommit, onStreamPrepare, onStreamStart, onStreamStop, spoolMessage } from './stream.js';
import { onBeginPrepare, onCommitPrepared, onPrepare, onRollbackPrepared } from './twophase.js';
import { deleteStatement, insertStatement, truncateStatement, updateStatement, type Detect, type Statement } from './sql/statements.js';
import { INSERT_TUPLE_OFFSET, insertsCopyAsSent } from './sql/copy-messages.js';
import { batchInsert, batchInsertMessage, batchUpdate, flushForChange, flushRowBatch, noteRowWrite, rowKey } from './batch.js';

type Handler<T extends MessageTag> = (state: ApplyState, message: Extract<PgOutputMessage, { tag: T }>) => Promise<void> | void;

export function requireTransaction(state: ApplyState, what: string): RemoteTransaction {
  if (!state.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `${what} received outside a transaction`);
  return state.xact;
}

/**
 * Whether this transaction's changes to a relation are applied (tablesync/state.ts):
 * ready tables take commits at or after the origin, syncing tables commits at or after
 * their own position, tables still being copied nothing.
 */
function applies(state: ApplyState, xact: RemoteTransaction, relationId: number): boolean {
  const remote = state.relations.remoteRelation(relationId);
  // One lookup per change: this runs for every row, so the key is built once per Relation message.
  let key = SYNC_KEYS.get(remote);
  if (key === undefined) SYNC_KEYS.set(remote, (key = syncKey(remote.namespace === '' ? 'pg_catalog' : remote.namespace, remote.name)));
  const entry = state.sync.getByKey(key);
  if (!entry) state.onUnknownTable(remote.namespace === '' ? 'pg_catalog' : remote.namespace, remote.name);
  // Not behind yet below the origin: a prepare decoded late, at its COMMIT PREPARED
  // (twophase.ts onBeginPrepare), which every ready table takes as at the origin.
  const durable = state.progress.durable;
  const lsn = xact.behind || xact.finalLsn >= durable ? xact.finalLsn : durable;
  if (!state.sync.entryApplies(entry, lsn, durable)) return false;
  if (entry && entry.state !== 'r') xact.syncTouched.add(entry);
  return true;
}

const SYNC_KEYS = new WeakMap<RelationMessage, string>();

/**
 * BEGIN of a target transaction applying remote changes. With synchronous_commit = off
 * (native's default) only these commits are asynchronous — the origin still moves with
 * them, but feedback waits for the target's WAL flush (origin/progress.ts); idle records,
 * two-phase steps and skips stay synchronous.
 */
export async function beginTarget(state: ApplyState): Promise<void> {
  await state.pipeline.push(state.conn.execute('BEGIN'));
  if (state.asyncCommit) await state.pipeline.push(state.conn.execute('SET LOCAL synchronous_commit = off'));
}

/** The transaction to apply into, opening the target transaction on first use; null when skipped. */
async function changeTarget(state: ApplyState, what: string, relationId: number): Promise<RemoteTransaction | null> {
  const xact = requireTransaction(state, what);
  if (xact.alreadyPrepared || !applies(state, xact, relationId) || xact.skip) return null;
  if (!xact.open) {
    xact.open = true;
    // Inside a group the target transaction is open already.
    if (!state.group) await beginTarget(state);
  }
  xact.changes++;
  return xact;
}

/** Pipeline a statement; `rows`: how many changes it carries (a batch), for the in-flight bound. */
export function sendStatement(state: ApplyState, statement: Statement, onCount?: (count: number) => void, rows = 1): Promise<void> {
  const result = state.conn.execute(statement.text, statement.params, statement.paramTypes ? { paramTypes: statement.paramTypes } : undefined);
  let bytes = 0;
  for (const v of statement.params) if (v !== null) bytes += v.length;
  return state.pipeline.push<unknown>(onCount ? result.then((r) => onCount(r.rowCount)) : result, bytes, rows);
}

function onBegin(state: ApplyState, m: BeginMessage): Promise<void> | void {
  if (state.xact) {
    throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `BEGIN of xid ${m.xid} while xid ${state.xact.xid} is still open`);
  }
  // Below the origin (a re-streamed range, or a transaction resent): only tables catching
  // up take its changes; for everything else it was applied before.
  const behind = m.finalLsn < state.progress.durable;
  // Such a transaction does not move the origin: it never joins a group.
  if (behind) {
    state.log.debug({ xid: m.xid, lsn: formatLsn(m.finalLsn) }, 'transaction below the origin; applied only to tables catching up');
    return commitGroup(state).then(() => startRemote(state, m, true));
  }
  startRemote(state, m, false);
}

function startRemote(state: ApplyState, m: BeginMessage, behind: boolean): void {
  state.xact = { xid: m.xid, finalLsn: m.finalLsn, commitTime: m.commitTime, behind, open: false, changes: 0, syncTouched: new Set(), alreadyPrepared: false };
  beginTransaction(state, state.xact);
}

/** Per remote transaction, whatever its kind: skip it (`pgsub skip`), or apply it carefully. */
export function beginTransaction(state: ApplyState, xact: RemoteTransaction): void {
  if (state.skipLsn !== null && xact.finalLsn === state.skipLsn) {
    xact.skip = true;
    state.log.warn({ xid: xact.xid, finishLsn: formatLsn(xact.finalLsn) }, 'skipping remote transaction (pgsub skip)');
  }
  if (state.carefulLsn !== null && xact.finalLsn === state.carefulLsn) state.careful = true;
}

/** The skipped transaction's end: the origin moves past it, with a log row, and the skip LSN is cleared. */
async function finishSkipped(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint): Promise<void> {
  // The transactions grouped before it commit on their own; the skip is a transaction of its own.
  await settleTarget(state);
  await state.pipeline.push(state.conn.execute('BEGIN'));
  await sendStatement(state, originXactSetupStatement(endLsn, commitTime));
  await sendStatement(state, idleProgressStatement(state.subscription, endLsn));
  for (const t of xact.syncTouched) await sendStatement(state, advanceSyncStatement(state.subscription, t, endLsn));
  await sendStatement(state, clearSkipStatement(state.subscription, xact.finalLsn));
  await sendStatement(
    state,
    conflictLogStatement(state.subscription, {
      type: 'transaction_skipped', relation: null, key: null, remoteTuple: null, localTuple: null, localOrigin: null, localCommitTs: null,
      remoteLsn: xact.finalLsn, remoteXid: xact.xid, remoteCommitTime: commitTime, policy: 'skip', detail: 'skipped by pgsub skip --lsn',
    }),
  );
  const commit = state.conn.execute('COMMIT');
  await state.pipeline.push(commit);
  const synced = state.conn.sync();
  await state.pipeline.push(synced);
  await state.pipeline.drain();
  if ((await commit).command !== 'COMMIT' || (await synced) !== 'I') throw new ApplyError(`target did not commit the skip of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  state.xact = null;
  for (const t of xact.syncTouched) state.sync.set({ ...t, syncLsn: endLsn });
  state.skipLsn = null;
  state.counters.transactionsSkipped++;
  state.log.warn({ xid: xact.xid, finishLsn: formatLsn(xact.finalLsn) }, 'remote transaction skipped');
  state.progress.noteDurable(endLsn);
  state.onDurable();
}

const PLAIN_COMMIT: Ending = { kind: 'commit', mayPipeline: true };

function onCommit(state: ApplyState, m: CommitMessage): Promise<void> | void {
  const xact = requireTransaction(state, 'COMMIT');
  if (m.commitLsn !== xact.finalLsn) {
    throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `incorrect commit LSN ${formatLsn(m.commitLsn)} in commit message (expected ${formatLsn(xact.finalLsn)})`);
  }
  return finishTransaction(state, xact, m.endLsn, m.commitTime, PLAIN_COMMIT);
}

/**
 * The end of a remote transaction (COMMIT, or STREAM COMMIT after its replay): the origin
 * row, the positions of tables catching up, and the target COMMIT, in one transaction.
 */
/**
 * How a remote transaction ends on the target: COMMIT, or PREPARE TRANSACTION (two_phase).
 * `mayPipeline`: a plain COMMIT message, whose target commit need not be waited for in a
 * backlog (commitTarget); the ends of streamed and prepared transactions always wait.
 */
export type Ending = { kind: 'commit'; mayPipeline?: boolean } | { kind: 'prepare'; gid: string };

const COMMIT: Ending = { kind: 'commit' };

/** Returns a promise only when the target is written (a group continues without one). */
export function finishTransaction(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending = COMMIT): Promise<void> | void {
  if (xact.skip) return finishSkipped(state, xact, endLsn, commitTime);
  const prepare = ending.kind === 'prepare';
  if (!xact.open) {
    // Nothing to write: skipped, or no published change. The position is recorded later.
    if (xact.behind) state.counters.transactionsSkipped++;
    state.xact = null;
    state.progress.noteProcessed(endLsn);
    return;
  }
  if (!prepare && !xact.behind && xact.syncTouched.size === 0 && state.canGroupHotRows && state.canGroup(xact.finalLsn)) {
    // Behind the stream: leave the target transaction open for the next source one. The
    // target commits only at source commit boundaries, with the origin at the last one.
    const group = (state.group ??= { transactions: 0, changes: 0, endLsn, commitTime });
    group.transactions++;
    group.changes += xact.changes;
    group.endLsn = endLsn;
    group.commitTime = commitTime;
    state.xact = null;
    return;
  }
  return commitTarget(state, xact, endLsn, commitTime, ending);
}

/** Commit the open group of source transactions (the queue ran dry, or a boundary needs it). */
export async function commitGroup(state: ApplyState): Promise<void> {
  const group = state.group;
  if (!group) return;
  const xact: RemoteTransaction = { xid: 0, finalLsn: group.endLsn, commitTime: group.commitTime, behind: false, open: true, changes: 0, syncTouched: new Set(), alreadyPrepared: false };
  // commitTarget counts the group's transactions; this empty one adds none.
  await commitTarget(state, xact, group.endLsn, group.commitTime, { kind: 'commit' }, 0);
}

async function commitTarget(state: ApplyState, xact: RemoteTransaction, endLsn: Lsn, commitTime: bigint, ending: Ending, own = 1): Promise<void> {
  // Inside a group a run of inserts continues across source commits (W4-like streams of
  // one-row transactions); it is sent before anything that ends the target transaction.
  await flushRowBatch(state);
  const prepare = ending.kind === 'prepare';
  const group = state.group;
  if (group && (prepare || xact.behind)) throw new ApplyError(`a group of ${group.transactions} transactions is open at the end of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  const transactions = own + (group?.transactions ?? 0);
  const turn = state.commitTurn;
  if (turn) {
    // An apply lane: commits keep source order, and the origin is this session's only for the commit.
    await turn.acquire();
    await state.pipeline.push(state.conn.execute('SELECT pg_catalog.pg_replication_origin_session_setup($1)', [turn.originName]));
  }
  // The commit record carries the remote LSN and time, like a native apply's (origin.c).
  await sendStatement(state, originXactSetupStatement(endLsn, commitTime));
  if (prepare) {
    // Not the origin row: a prepared transaction would hold its lock until COMMIT PREPARED.
    await sendStatement(state, preparedRowStatement(state.subscription, ending.gid, xact.xid, endLsn));
  } else if (!xact.behind) {
    const progress = commitProgressStatement(state.subscription, endLsn, commitTime, transactions);
    await sendStatement(state, progress, (count) => {
      if (count !== 1) throw new ApplyError(`origin row of subscription "${state.subscription}" is missing in the target`);
    });
  }
  // Tables catching up record their own position; those now level with the origin become ready.
  for (const t of xact.syncTouched) await sendStatement(state, advanceSyncStatement(state.subscription, t, endLsn));
  const promoted = xact.behind || prepare ? [] : state.sync.promotable(endLsn, state.progress.durable);
  for (const t of promoted) {
    await sendStatement(state, setStateStatement(state.subscription, t, 'r', null));
    await sendStatement(state, clearSyncProgressStatement(state.subscription, t));
  }
  // A table catching up, or becoming ready, moves the feedback hold (tablesync/state.ts
  // heldLsn) once its commit is answered, without the flush tracking origin positions get:
  // that commit must be on disk when answered, so it is synchronous (the session's default).
  const synchronous = state.asyncCommit && !prepare && (xact.syncTouched.size > 0 || promoted.length > 0);
  if (synchronous) await state.pipeline.push(state.conn.execute('SET LOCAL synchronous_commit TO DEFAULT'));
  const expected = prepare ? 'PREPARE TRANSACTION' : 'COMMIT';
  const commit = state.conn.execute(prepare ? `PREPARE TRANSACTION ${quoteLiteral(ending.gid)}` : 'COMMIT');
  await state.pipeline.push(commit);
  // Where the target's WAL stood right after the asynchronous commit: flushed past this, it is safe.
  const walAfter = state.asyncCommit && !prepare && !synchronous ? state.conn.execute('SELECT pg_catalog.pg_current_wal_insert_lsn()::text', [], { wantRows: true }) : null;
  if (walAfter) await state.pipeline.push(walAfter);
  if (turn) await state.pipeline.push(state.conn.execute('SELECT pg_catalog.pg_replication_origin_session_reset()'));
  // In the middle of a backlog the next transaction is applied while this commit is under
  // way: waiting for it would leave the target idle for a round trip per commit. No Sync
  // follows such a COMMIT: should it fail, the server skips everything after it up to the
  // next Sync, so no later transaction can commit past the failed one. Its outcome is
  // checked in order when it arrives; the position moves only then.
  const pipelined = ending.kind === 'commit' && ending.mayPipeline === true && !xact.behind && xact.syncTouched.size === 0 && promoted.length === 0 && !state.careful && state.canPipelineCommit(endLsn);
  // Otherwise Sync ends the pipeline segment; its ReadyForQuery says whether a transaction is left open.
  const synced = pipelined ? null : state.conn.sync();
  if (synced) await state.pipeline.push(synced);
  const settled = settleCommit(state, xact, commit, synced, walAfter, { endLsn, commitTime, expected, transactions, groupChanges: group?.changes ?? 0, promoted });
  settled.catch(() => {});
  if (pipelined) {
    endTarget(state);
    const unconfirmed = { until: endLsn, answered: settled };
    state.unconfirmed = unconfirmed;
    await state.pipeline.push(settled.then(() => {
      if (state.unconfirmed === unconfirmed) state.unconfirmed = null;
    }));
    return;
  }
  await state.pipeline.drain();
  await settled;
  // Only now: a failure above leaves state.xact for the loop's careful replay.
  endTarget(state);
}

/**
 * Before a step that sends a Sync of its own (runAlone, a two-phase step, the replication
 * origin handed to another connection): the open group commits and every pipelined commit
 * is answered — and known to have succeeded — then the segment they share ends. A Sync sent
 * earlier would let the server run what follows it after a commit that failed.
 */
export async function settleTarget(state: ApplyState): Promise<void> {
  await commitGroup(state);
  if (state.unconfirmed !== null || state.pipeline.size > 0) await state.pipeline.drain();
  state.unconfirmed = null;
  if (state.conn.unsynced) await state.conn.sync();
}

function endTarget(state: ApplyState): void {
  state.xact = null;
  state.group = null;
  state.rowWrites.clear();
  state.canGroupHotRows = true;
}

/** What a target commit's answer must be, and the bookkeeping once it is known. */
async function settleCommit(
  state: ApplyState,
  xact: RemoteTransaction,
  commit: Promise<WireResult>,
  synced: Promise<TxStatus> | null,
  walAfter: Promise<WireResult> | null,
  c: { endLsn: Lsn; commitTime: bigint; expected: string; transactions: number; groupChanges: number; promoted: TableSync[] },
): Promise<void> {
  // COMMIT of a failed transaction answers ROLLBACK without an error; never count that.
  const { command } = await commit;
  // Without a Sync (pipelined) the COMMIT ran in its segment only if nothing before it failed.
  const status = synced === null ? 'I' : await synced;
  if (command !== c.expected || status !== 'I') {
    throw new ApplyError(`target answered ${command} (status ${status}) to ${c.expected} of remote xid ${xact.xid}`, { remoteXid: xact.xid });
  }
  const { endLsn, promoted } = c;
  for (const t of xact.syncTouched) state.sync.set({ ...t, syncLsn: endLsn });
  for (const t of promoted) state.sync.set({ ...t, state: 'r', syncLsn: null });
  if (promoted.length > 0) state.log.info({ tables: promoted.map((t) => `${t.schema}.${t.table}`), lsn: formatLsn(endLsn) }, 'tables ready');
  state.counters.changesApplied += xact.changes + c.groupChanges;
  if (xact.behind || c.expected !== 'COMMIT') {
    state.onDurable();
    return;
  }
  state.counters.transactionsApplied += c.transactions;
  state.counters.lastCommitTime = c.commitTime;
  if (walAfter) state.progress.noteCommittedAsync(endLsn, parseLsn(String((await walAfter).rows[0]?.[0])));
  else state.progress.noteDurable(endLsn);
  state.onDurable();
}

function onRelation(state: ApplyState, m: RelationMessage): void {
  state.relations.onRelation(m);
}

function onType(state: ApplyState, m: TypeMessage): void {
  state.relations.onType(m.typeOid, m.namespace, m.name);
}

function onOrigin(state: ApplyState, m: OriginMessage): void {
  state.log.debug({ origin: m.originName, lsn: formatLsn(m.originLsn) }, 'transaction from another origin');
}

function onMessage(state: ApplyState, m: LogicalMessage): void {
  state.log.debug({ prefix: m.prefix, lsn: formatLsn(m.lsn), transactional: m.transactional, bytes: m.content.length }, 'logical decoding message ignored');
}

const DETECT = new WeakMap<ApplyState, Detect | null>();

/** Detection on the pipelined path: statements that abort the transaction on a conflict (conflict/detect.ts). */
function detect(state: ApplyState): Detect | null {
  // Constant for a session: one object, not one per change (this runs per row).
  let d = DETECT.get(state);
  if (d === undefined) DETECT.set(state, (d = state.conflicts.detect ? { originId: state.originId, returningOld: state.conn.serverVersionNum >= 180000 } : null));
  return d;
}

/**
 * The transaction a batchable change joins without any waiting: the target transaction is
 * open, the relation mapped and batching, the change applies. Null: take the full path.
 * Runs once per row, so it allocates nothing.
 */
function fastTarget(state: ApplyState, relationId: number): MappedRelation | null {
  const xact = state.xact;
  // Not open: a new remote transaction inside a group joins the open target one, no BEGIN.
  if (xact === null || (!xact.open && state.group === null) || xact.skip || xact.alreadyPrepared || state.careful || state.batchRows <= 1) return null;
  const rel = state.relations.cached(relationId);
  if (rel === undefined || rel.ordered || !applies(state, xact, relationId)) return null;
  xact.open = true;
  return rel;
}

/**
 * An Insert message before decoding (loop.ts, outside streams): batched as it came when its
 * relation's rows go to binary COPY as sent (copy-messages.ts) and the change takes the
 * fast path. False: decode it and dispatch as usual.
 */
export function insertAsSent(state: ApplyState, message: Buffer): Promise<void> | void | false {
  if (!state.copyInserts || state.streamXid !== null || message.length < INSERT_TUPLE_OFFSET + 2) return false;
  const relationId = message.readUInt32BE(1);
  const known = state.relations.cached(relationId);
  if (known === undefined || known.rowSecurity || !insertsCopyAsSent(known)) return false;
  const rel = fastTarget(state, relationId);
  if (rel === null) return false;
  const xact = state.xact!;
  xact.changes++;
  return batchInsertMessage(state, xact, relationId, rel, message);
}

function onInsert(state: ApplyState, m: InsertMessage): Promise<void> | void {
  const rel = fastTarget(state, m.relationId);
  if (rel === null) return insertChange(state, m);
  const xact = state.xact!;
  xact.changes++;
  return batchInsert(state, xact, m.relationId, rel, m.newTuple);
}

async function insertChange(state: ApplyState, m: InsertMessage): Promise<void> {
  const xact = await changeTarget(state, 'INSERT', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  if (state.careful) return carefulInsert(state, xact, rel, m.newTuple);
  // A unique violation aborts the transaction: with detection on, the loop replays it carefully.
  if (state.batchRows > 1 && !rel.ordered) return batchInsert(state, xact, m.relationId, rel, m.newTuple);
  await flushForChange(state, m.relationId, rel);
  await sendStatement(state, insertStatement(rel, m.newTuple));
}

function onUpdate(state: ApplyState, m: UpdateMessage): Promise<void> | void {
  const rel = fastTarget(state, m.relationId);
  if (rel !== null && m.oldKind === undefined) {
    const key = rowKey(rel, m.newTuple);
    if (key !== null) {
      const xact = state.xact!;
      const batched = batchUpdate(state, xact, m.relationId, rel, undefined, m.newTuple, detect(state), key);
      if (batched !== false) {
        xact.changes++;
        return batched;
      }
    }
  }
  return updateChange(state, m);
}

async function updateChange(state: ApplyState, m: UpdateMessage): Promise<void> {
  const xact = await changeTarget(state, 'UPDATE', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  if (state.careful) return carefulUpdate(state, xact, rel, m.oldKind, m.oldTuple, m.newTuple);
  const key = m.oldKind !== 'old' ? rowKey(rel, m.oldTuple ?? m.newTuple) : null;
  const d = detect(state);
  // A batched update counts as a row write when its batch goes out (batch.ts).
  if (state.batchRows > 1 && key !== null) {
    const batched = batchUpdate(state, xact, m.relationId, rel, m.oldTuple, m.newTuple, d, key);
    if (batched !== false) return batched;
  }
  if (state.groupTransactions > 1) noteRowWrite(state, m.relationId, key);
  await flushForChange(state, m.relationId, rel);
  if (d) return sendStatement(state, updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple, d));
  await sendStatement(state, updateStatement(rel, m.oldKind, m.oldTuple, m.newTuple), (count) => {
    if (count === 0) {
      // Detection off: native's update_missing default, skipped, logged and counted in memory.
      state.counters.updateMissing++;
      state.log.warn({ conflict: 'update_missing', table: rel.displayName, xid: xact.xid }, 'row to update not found; change skipped');
    }
  });
}

async function onDelete(state: ApplyState, m: DeleteMessage): Promise<void> {
  const xact = await changeTarget(state, 'DELETE', m.relationId);
  if (!xact) return;
  const rel = await state.relations.resolve(state.conn, m.relationId);
  if (state.careful) return carefulDelete(state, xact, rel, m.oldKind, m.oldTuple);
  await flushForChange(state, m.relationId, rel);
  const d = detect(state);
  if (d) return sendStatement(state, deleteStatement(rel, m.oldKind, m.oldTuple, d));
  await sendStatement(state, deleteStatement(rel, m.oldKind, m.oldTuple), (count) => {
    if (count === 0) {
      state.counters.deleteMissing++;
      state.log.warn({ conflict: 'delete_missing', table: rel.displayName, xid: xact.xid }, 'row to delete not found; change skipped');
    }
  });
}

async function onTruncate(state: ApplyState, m: TruncateMessage): Promise<void> {
  const xact = requireTransaction(state, 'TRUNCATE');
  const ids = m.relationIds.filter((id) => applies(state, xact, id));
  if (ids.length === 0 || !(await changeTarget(state, 'TRUNCATE', ids[0]!))) return;
  const rels = [];
  for (const id of ids) rels.push(await state.relations.resolve(state.conn, id));
  await sendStatement(state, truncateStatement(rels, m.restartIdentity));
}

export const handlers: { [T in MessageTag]: Handler<T> } = {
  begin: onBegin,
  commit: onCommit,
  relation: onRelation,
  type: onType,
  origin: onOrigin,
  message: onMessage,
  insert: onInsert,
  update: onUpdate,
  delete: onDelete,
  truncate: onTruncate,
  streamStart: onStreamStart,
  streamStop: onStreamStop,
  streamCommit: onStreamCommit,
  streamAbort: onStreamAbort,
  beginPrepare: onBeginPrepare,
  prepare: onPrepare,
  commitPrepared: onCommitPrepared,
  rollbackPrepared: onRollbackPrepared,
  streamPrepare: onStreamPrepare,
};

/**
 * Messages that keep pending batches: row changes flush what must precede them themselves
 * (batch.ts), the others send nothing (COMMIT's end of the target transaction flushes).
 */
const KEEPS_BATCH: ReadonlySet<MessageTag> = new Set(['begin', 'commit', 'origin', 'message', 'type', 'insert', 'update', 'delete']);

/** Messages that belong to a streamed transaction while its block is open: spooled, not applied. */
const SPOOLED: ReadonlySet<MessageTag> = new Set(['relation', 'type', 'origin', 'message', 'insert', 'update', 'delete', 'truncate']);

/** worker.c's apply_dispatch, with handle_streamed_transaction's diversion first. */
export function dispatch(state: ApplyState, message: PgOutputMessage, raw: Buffer): Promise<void> | void {
  if (state.streamXid !== null && SPOOLED.has(message.tag)) return spoolMessage(state, message, raw);
  const handler = handlers[message.tag] as Handler<typeof message.tag>;
  // A batch lives across changes of its kind and across the source commits of a group
  // (commitTarget sends it before the target commit); anything else that writes goes after it.
  if (state.rowBatches.size > 0 && !KEEPS_BATCH.has(message.tag)) return flushRowBatch(state).then(() => handler(state, message as never));
  // Most messages complete without waiting (a row joins a batch): no promise then.
  return handler(state, message as never);
}
