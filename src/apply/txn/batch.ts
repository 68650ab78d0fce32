/**
 * Row changes sent as few statements: INSERTs into one relation become a multi-row
 * INSERT (or a COPY, copy-rows.ts), key-located UPDATEs of one relation and one shape
 * (same columns sent) one UPDATE … FROM an array per column (update-rows.ts), or where
 * the values do not allow that, UPDATE … FROM (VALUES …). One Bind and one executor run
 * on the target per batch instead of one per row — the per-statement cost is what a
 * subscriber outside the server pays most for. VALUES batches go out in power-of-two
 * sizes, so a relation needs only a handful of prepared texts. The careful
 * (conflict-resolving) path never batches.
 *
 * Each relation has its own pending batch, so interleaved changes to several tables (a
 * pgbench transaction touches four) still batch: within one target transaction the order
 * of changes to DIFFERENT tables is not observable — the apply session runs with
 * session_replication_role = replica, so FK and ordinary triggers do not fire, and every
 * constraint is per table or checked at commit. A relation's own changes keep their
 * order: anything that is not a batchable change of the same kind and shape flushes its
 * batch first. A target table with triggers or rules that fire in replica mode
 * (`rel.ordered`) could observe the order, so it never batches and flushes every pending
 * batch before its change. Everything that is not a row change (commit, savepoint,
 * truncate, a Relation message) flushes all batches first.
 *
 * A second UPDATE of a row already in the pending batch replaces the first (same shape:
 * the later full row wins; the earlier one would be overwritten before anyone could see
 * it, commits being at source commit boundaries). Hot rows (a pgbench branch) then cost
 * one row version per flush instead of one per change.
 */
import { ApplyError } from '../../errors.js';
import type { Tuple, TupleValue } from '../../protocol/messages.js';
import { noteCarried, sendStatement } from './transaction.js';
import type { MappedRelation } from '../sql/mapped-relation.js';
import type { ApplyState, RemoteTransaction, RowBatch } from './apply-state.js';
import type { Detect } from '../sql/detecting.js';
import { updateStatement } from '../sql/update.js';
import { insertManyStatement, maxBatchRows, updateManyStatement } from '../sql/multi-row.js';
import type { Statement } from '../../pgwire/statement.js';
import type { Reshape } from '../../mapping/columns.js';
import { copyInsertStatement, type CopyStatement } from '../sql/copy-rows.js';
import { copyFromInsertMessages } from '../sql/copy-messages.js';
import { decode } from '../../protocol/decoder.js';
import { insertArraysStatement, reshapedUpdateArraysStatement, updateArraysStatement } from '../sql/update-rows.js';

/**
 * A batch of at least this many inserts goes out as COPY when the settings and values
 * allow (copy-rows.ts): below it the COPY round of messages gains nothing over an INSERT.
 * Row security: COPY FROM refuses a table with RLS for a role that does not bypass it,
 * where INSERT applies the policies — such tables keep the INSERT path.
 */
const COPY_MIN_ROWS = 8;

/**
 * Inserts batched as sent (copy-messages.ts) gather up to this many rows or bytes: one
 * COPY per source transaction of a bulk load. The target's COPY creates a slot per
 * buffered row (up to 1000) and registers each with the resource owner, whose cost grows
 * with their number, and per row a long COPY costs less than short ones
 * (scripts/bench-copy-insert.ts; docs/design-measurements.md). So a run of at least
 * LARGE_COPY_ROWS goes as one COPY, a shorter one as COPYs of batch_rows rows.
 */
const AS_SENT_MAX_ROWS = 16_384;
const AS_SENT_MAX_BYTES = 8 * 1024 * 1024;
const LARGE_COPY_ROWS = 4096;

/**
 * An update batch grows to this many rows (or batch_rows, if larger): sent as arrays its
 * text does not depend on the row count and no parameter limit applies. scripts/
 * bench-update.ts: target CPU per row falls from 128 to 1024 rows per statement, not
 * beyond; at 1024 several statements still fit in the pipeline's window (max_in_flight
 * counts rows), so the target is not left idle while the next one is encoded.
 */
const UPDATE_BATCH_ROWS = 1024;

/** Smaller update batches keep the VALUES form, whose texts for a few rows are prepared already. */
const ARRAY_MIN_ROWS = 8;

/** Every column index of a relation, for updates that send all columns. */
const ALL_COLUMNS = new WeakMap<MappedRelation, number[]>();

/** A batch stops growing here, whatever the row count: wide rows. */
const BATCH_BYTES = 1024 * 1024;

function valueKey(v: TupleValue | undefined): string {
  if (!v || v.kind === 'null' || v.kind === 'unchanged') return v?.kind ?? '';
  return v.kind === 'text' ? `t${v.value}` : `b${v.value.toString('latin1')}`;
}

/** The replica identity key of a row as one string; null when the row has no usable key. */
export function rowKey(rel: MappedRelation, tuple: Tuple | undefined): string | null {
  if (!tuple || rel.keyIndexes.length === 0) return null;
  // Usually one key column: no array, no join (this runs once per row).
  if (rel.keyIndexes.length === 1) return valueKey(tuple[rel.keyIndexes[0]!]);
  return rel.keyIndexes.map((i) => valueKey(tuple[i])).join('\u0000');
}

/** Rows tracked per target transaction; past this the group ends at the next source commit. */
const MAX_TRACKED_ROWS = 10_000;

/** Writes of one row within a group beyond which the group ends at the next source commit. */
const HOT_ROW_WRITES = 8;

/**
 * Count a write of an existing row in the open target transaction. Every update of a row
 * inside one transaction adds a version that no one can prune until it commits, and the
 * next update walks them all: a hot row (a counter, a branch balance) makes long groups
 * quadratic. So a group ends once a row has been written HOT_ROW_WRITES times.
 */
export function noteRowWrite(state: ApplyState, relationId: number, key: string | null): void {
  if (key === null || state.tx.canGroupHotRows === false) return;
  const tx = state.tx;
  if (tx.rowWritesTracked >= MAX_TRACKED_ROWS) {
    // A target transaction this large gains nothing from growing further; memory stays bounded.
    tx.canGroupHotRows = false;
    tx.rowWrites.clear();
    tx.rowWritesTracked = 0;
    return;
  }
  // Per relation, then by key: no string built per row.
  let rows = tx.rowWrites.get(relationId);
  if (rows === undefined) tx.rowWrites.set(relationId, (rows = new Map()));
  const writes = (rows.get(key) ?? 0) + 1;
  if (writes === 1) tx.rowWritesTracked++;
  rows.set(key, writes);
  if (writes >= HOT_ROW_WRITES) state.tx.canGroupHotRows = false;
}

function tupleBytes(tuple: Tuple): number {
  let bytes = 0;
  for (const v of tuple) if (v.kind === 'text' || v.kind === 'binary') bytes += v.value.length;
  return bytes;
}

/**
 * Before a change of `rel` that is not batched: its own pending rows go first, and every
 * pending batch before a change of an ordered relation (which never has a batch itself).
 */
export async function flushForChange(state: ApplyState, relationId: number, rel: MappedRelation): Promise<void> {
  if (rel.ordered) return flushRowBatch(state);
  const own = state.tx.rowBatches.get(relationId);
  if (own !== undefined) await flushBatch(state, own);
}

const NO_INDEXES: number[] = [];

/**
 * Add a row to its relation's batch. Returns a promise only when a batch had to be sent
 * (a different kind or shape was pending, or the batch is full): the common case costs no
 * promise — this runs once per row.
 */
function add(
  state: ApplyState,
  kind: RowBatch['kind'],
  relationId: number,
  rel: MappedRelation,
  shape: string,
  setIndexes: number[],
  detect: Detect | null,
  xid: number,
  tuple: Tuple,
  key: string | null,
): Promise<void> | void {
  let batch = state.tx.rowBatches.get(relationId);
  if (batch !== undefined && (batch.kind !== kind || batch.rel !== rel || batch.shape !== shape || batch.messages.length > 0)) {
    return flushBatch(state, batch).then(() => add(state, kind, relationId, rel, shape, setIndexes, detect, xid, tuple, key));
  }
  if (batch !== undefined && key !== null) {
    const at = batch.keys.get(key);
    if (at !== undefined) {
      batch.bytes += tupleBytes(tuple) - tupleBytes(batch.tuples[at]!);
      batch.tuples[at] = tuple;
      return;
    }
  }
  if (batch === undefined) {
    batch = { kind, relationId, rel, shape, setIndexes, detect, xid, tuples: [], messages: [], keys: new Map(), bytes: 0 };
    state.tx.rowBatches.set(relationId, batch);
  }
  if (key !== null) batch.keys.set(key, batch.tuples.length);
  batch.tuples.push(tuple);
  batch.bytes += tupleBytes(tuple);
  const limit = kind === 'insert' ? maxBatchRows(rel.targetColumns.length, state.session.options.batchRows) : Math.max(state.session.options.batchRows, UPDATE_BATCH_ROWS);
  if (batch.tuples.length >= limit || batch.bytes >= BATCH_BYTES) return flushBatch(state, batch);
}

/** Batch an INSERT of a relation that batches (not `ordered`: the caller checks). */
export function batchInsert(state: ApplyState, xact: RemoteTransaction, relationId: number, rel: MappedRelation, tuple: Tuple): Promise<void> | void {
  // Ordered relations never batch, so no pending batch needs to precede this one.
  return add(state, 'insert', relationId, rel, '', NO_INDEXES, null, xact.xid, tuple, null);
}

/**
 * Batch an Insert message as it came (outside streams), for a relation whose inserts go to
 * COPY as sent (handlers.ts insertAsSent checks): decoded only if the batch ends up too small
 * for COPY or a value does not fit after all.
 */
export function batchInsertMessage(state: ApplyState, xact: RemoteTransaction, relationId: number, rel: MappedRelation, message: Buffer): Promise<void> | void {
  let batch = state.tx.rowBatches.get(relationId);
  if (batch !== undefined && (batch.kind !== 'insert' || batch.rel !== rel || batch.tuples.length > 0)) {
    return flushBatch(state, batch).then(() => batchInsertMessage(state, xact, relationId, rel, message));
  }
  if (batch === undefined) {
    batch = { kind: 'insert', relationId, rel, shape: '', setIndexes: NO_INDEXES, detect: null, xid: xact.xid, tuples: [], messages: [], keys: new Map(), bytes: 0 };
    state.tx.rowBatches.set(relationId, batch);
  }
  batch.messages.push(message);
  batch.bytes += message.length;
  if (batch.messages.length >= AS_SENT_MAX_ROWS || batch.bytes >= AS_SENT_MAX_BYTES) return flushBatch(state, batch);
}

/**
 * An UPDATE that can join a batch: located by the replica identity key of the new tuple
 * (the key did not change), not FULL, and detection without origin checks. Else false
 * (nothing done); otherwise as batchInsert.
 */
export function batchUpdate(
  state: ApplyState,
  xact: RemoteTransaction,
  relationId: number,
  rel: MappedRelation,
  oldTuple: Tuple | undefined,
  newTuple: Tuple,
  detect: Detect | null,
  key: string,
): Promise<void> | void | false {
  // A reshaped relation batches too (update-rows.ts reshapedUpdateArraysStatement); one with row rules is `ordered`.
  if (rel.ordered || oldTuple || rel.keyIndexes.length === 0 || (detect && detect.originId !== null) || newTuple.length !== rel.remote.columns.length) return false;
  for (const i of rel.keyIndexes) {
    const v = newTuple[i];
    if (!v || v.kind === 'null' || v.kind === 'unchanged') return false;
  }
  // Usually every column is sent: one shared column list per relation, no per-row strings.
  let setIndexes: number[];
  let shape: string;
  // A GENERATED ALWAYS identity column cannot be SET (428C9): it is left as it is, as in sql/update.ts.
  if (newTuple.some((v) => v.kind === 'unchanged')) {
    setIndexes = newTuple.flatMap((v, i) => (v.kind === 'unchanged' || rel.targetColumns[i]!.identityAlways ? [] : [i]));
    shape = `${setIndexes.join(',')}${detect ? '|d' : ''}`;
  } else {
    let all = ALL_COLUMNS.get(rel);
    if (!all) ALL_COLUMNS.set(rel, (all = newTuple.flatMap((_, i) => (rel.targetColumns[i]!.identityAlways ? [] : [i]))));
    setIndexes = all;
    shape = detect ? '*|d' : '*';
  }
  // Nothing to set (every sent column unchanged or an identity): the one-row path updates the row to itself.
  if (setIndexes.length === 0) return false;
  return add(state, 'update', relationId, rel, shape, setIndexes, detect, xact.xid, newTuple, key);
}

/** Send every pending batch, in the order they were opened. */
export async function flushRowBatch(state: ApplyState): Promise<void> {
  for (const batch of state.tx.rowBatches.values()) await flushBatch(state, batch);
}

function sendCopy(state: ApplyState, batch: RowBatch, copy: CopyStatement, rows: number): Promise<void> | undefined {
  let bytes = 0;
  for (const b of copy.data) bytes += b.length;
  state.session.counters.rowsCopied += rows;
  const result = state.conn.copyIn(copy.text, copy.data);
  noteCarried(state, result, batch.xid);
  return state.pipeline.push(result, bytes, rows);
}

const OUTSIDE_STREAMS = { inStream: false, streamAbortInfo: false };

function insertedTuple(message: Buffer): Tuple {
  const m = decode(message, OUTSIDE_STREAMS);
  if (m.tag !== 'insert') throw new Error(`batched Insert message decoded as ${m.tag}`);
  return m.newTuple;
}

async function flushBatch(state: ApplyState, batch: RowBatch): Promise<void> {
  state.tx.rowBatches.delete(batch.relationId);
  if (batch.kind === 'update' && state.session.options.groupTransactions > 1) for (const key of batch.keys.keys()) noteRowWrite(state, batch.relationId, key);
  if (batch.messages.length >= COPY_MIN_ROWS) {
    // A long run as one COPY; a shorter one in COPYs of batch_rows (see AS_SENT_MAX_ROWS).
    // All encoded before any is sent: a message that does not fit sends the batch decoded.
    const messages = batch.messages;
    const size = messages.length >= LARGE_COPY_ROWS ? messages.length : maxBatchRows(batch.rel.targetColumns.length, state.session.options.batchRows);
    const copies: { copy: CopyStatement; rows: number }[] = [];
    for (let at = 0; at < messages.length; at += size) {
      const part = messages.slice(at, at + size);
      const copy = copyFromInsertMessages(batch.rel, part);
      if (copy === null) break;
      copies.push({ copy, rows: part.length });
    }
    if (copies.reduce((n, c) => n + c.rows, 0) === messages.length) {
      for (const { copy, rows } of copies) await sendCopy(state, batch, copy, rows);
      return;
    }
  }
  if (batch.messages.length > 0) batch.tuples = batch.messages.map(insertedTuple);
  // A reshaped relation's rows need its expressions: INSERT … SELECT, never COPY.
  if (batch.kind === 'insert' && state.session.options.copyInserts && batch.tuples.length >= COPY_MIN_ROWS && !batch.rel.rowSecurity && !batch.rel.reshape) {
    const copy = copyInsertStatement(batch.rel, batch.tuples);
    if (copy) return sendCopy(state, batch, copy, batch.tuples.length);
  }
  // Detection inside the statement (a CTE counting the changed rows) costs the target per
  // row; where every answer is read before the commit, the command's count says as much.
  const detect = state.policy.resultsBeforeCommit === true ? null : batch.detect;
  if (batch.kind === 'update' && batch.rel.reshape) return flushReshapedUpdates(state, batch, batch.rel.reshape, detect);
  if (batch.kind === 'update' && batch.tuples.length >= ARRAY_MIN_ROWS) {
    const statement = updateArraysStatement(batch.rel, batch.tuples, batch.setIndexes, detect);
    if (statement) return sendUpdate(state, batch, statement, batch.tuples.length, detect === null);
  }
  // A reshaped relation's inserts: one statement of column arrays where the values allow.
  if (batch.kind === 'insert' && batch.rel.reshape && batch.tuples.length >= ARRAY_MIN_ROWS) {
    const statement = insertArraysStatement(batch.rel, batch.rel.reshape, batch.tuples);
    if (statement) return sendStatement(state, statement, undefined, batch.tuples.length, batch.xid);
  }
  // One statement carries at most this many rows (bind parameters are limited).
  const most = batch.kind === 'insert' ? Infinity : maxBatchRows(batch.setIndexes.length + batch.rel.keyIndexes.length, state.session.options.batchRows);
  let rest = batch.tuples;
  while (rest.length > 0) {
    let size = 1;
    while (size * 2 <= rest.length && size * 2 <= most) size *= 2;
    const rows = rest.slice(0, size);
    rest = rest.slice(size);
    if (batch.kind === 'insert') {
      await sendStatement(state, insertManyStatement(batch.rel, rows), undefined, rows.length, batch.xid);
      continue;
    }
    await sendUpdate(state, batch, updateManyStatement(batch.rel, rows, batch.setIndexes, detect), rows.length, detect === null);
  }
}

/**
 * A reshaped relation's updates: one statement of column arrays (its text the same for any
 * row count, so from two rows on); one statement per row where the values do not allow it.
 */
async function flushReshapedUpdates(state: ApplyState, batch: RowBatch, reshape: Reshape, detect: Detect | null): Promise<void> {
  const statement = batch.tuples.length > 1 ? reshapedUpdateArraysStatement(batch.rel, reshape, batch.tuples, batch.setIndexes, detect) : null;
  if (statement) return sendUpdate(state, batch, statement, batch.tuples.length, detect === null);
  for (const tuple of batch.tuples) await sendUpdate(state, batch, updateStatement(batch.rel, undefined, undefined, tuple, detect), 1, detect === null);
}

/**
 * `counted`: the statement does not raise update_missing itself; its affected-row count is
 * checked here. Without detection a shortfall is counted and logged like native's skip;
 * with detection (answers read before the commit) it fails the transaction as the
 * statement would have.
 */
function sendUpdate(state: ApplyState, batch: RowBatch, statement: Statement, rows: number, counted: boolean): Promise<void> | undefined {
  return sendStatement(
    state,
    statement,
    counted
      ? (count) => {
          if (count >= rows) return;
          if (batch.detect) {
            throw new ApplyError(`update_missing: ${rows - count} of ${rows} rows to update in "${batch.rel.displayName}" not found`, {
              relation: batch.rel.displayName,
              remoteXid: batch.xid,
            });
          }
          state.session.counters.updateMissing += rows - count;
          state.session.counters.conflicts.update_missing += rows - count;
          state.session.log.warn({ conflict: 'update_missing', table: batch.rel.displayName, xid: batch.xid, rows: rows - count }, 'rows to update not found; changes skipped');
        }
      : undefined,
    rows,
    batch.xid,
  );
}
