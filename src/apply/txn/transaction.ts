/**
 * The remote transaction being applied, on the target side: opening it (its record in the
 * apply state, the skip or careful mark), which of its changes apply to which table (the
 * sync-state rule, origin/sync-state.ts), opening the target transaction at its first
 * change, and pipelining a statement into it. Only the txn layer writes the current
 * transaction (here and in commit.ts).
 *
 * With conflict detection on, a pipelined statement that fails names the remote
 * transactions whose changes it carried (`carriedBy`): the first (a batch's first row's)
 * and the newest started when it was sent. Its failure surfaces later and elsewhere (the
 * pipeline reports late), so this is how the applier knows which transaction of a group
 * met the conflict (run/conflict-replay.ts).
 */
import { ProtocolError } from '../../errors.js';
import { formatLsn, type Lsn } from '../../protocol/lsn.js';
import { schemaOf, type RelationMessage } from '../../protocol/messages.js';
import { syncKey } from '../../origin/sync-state.js';
import { NO_TABLES, type ApplyState, type RemoteTransaction } from './apply-state.js';
import type { TableSync } from '../../origin/sync-state.js';
import type { Statement } from '../../pgwire/statement.js';

export function requireTransaction(state: ApplyState, what: string): RemoteTransaction {
  if (!state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `${what} received outside a transaction`);
  return state.tx.xact;
}

/**
 * Whether this transaction's changes to a relation are applied (origin/sync-state.ts):
 * ready tables take commits at or after the origin, syncing tables commits at or after
 * their own position, tables still being copied nothing.
 */
export function applies(state: ApplyState, xact: RemoteTransaction, relationId: number): boolean {
  // A run of changes to one relation asks once per transaction: the states that decide it
  // change between transactions (commit.ts, the applier's idle record), not inside one.
  if (xact.appliesTo === relationId) return true;
  const remote = state.relations.remoteRelation(relationId);
  // One lookup per change: this runs for every row, so the key is built once per Relation message.
  let key = SYNC_KEYS.get(remote);
  if (key === undefined) SYNC_KEYS.set(remote, (key = syncKey(schemaOf(remote), remote.name)));
  const entry = state.session.sync.getByKey(key);
  if (!entry) {
    state.session.onUnknownTable(schemaOf(remote), remote.name);
    xact.unsubscribed = true;
  }
  // Not behind yet below the origin: a prepare decoded late, at its COMMIT PREPARED
  // (twophase.ts onBeginPrepare), which every ready table takes as at the origin.
  const durable = state.session.progress.durable;
  const lsn = xact.behind || xact.finalLsn >= durable ? xact.finalLsn : durable;
  if (!state.session.sync.entryApplies(entry, lsn, durable)) return false;
  if (entry && entry.state !== 'r') {
    if (xact.syncTouched === NO_TABLES) xact.syncTouched = new Set();
    (xact.syncTouched as Set<TableSync>).add(entry);
  }
  xact.appliesTo = relationId;
  return true;
}

const SYNC_KEYS = new WeakMap<RelationMessage, string>();

/**
 * BEGIN of a target transaction applying remote changes. With synchronous_commit = off
 * (native's default) only these commits are asynchronous — the origin still moves with
 * them, but feedback waits for the target's WAL flush (origin/positions.ts); idle records,
 * two-phase steps and skips stay synchronous.
 */
export async function beginTarget(state: ApplyState): Promise<void> {
  await state.pipeline.push(state.conn.execute('BEGIN'));
  if (state.session.asyncCommit) await state.pipeline.push(state.conn.execute('SET LOCAL synchronous_commit = off'));
}

/** The transaction to apply into, opening the target transaction on first use; null when skipped. */
export async function changeTarget(state: ApplyState, what: string, relationId: number): Promise<RemoteTransaction | null> {
  const xact = requireTransaction(state, what);
  if (xact.alreadyPrepared || !applies(state, xact, relationId) || xact.skip) return null;
  if (!xact.open) {
    xact.open = true;
    // Inside a group the target transaction is open already.
    if (!state.tx.group) await beginTarget(state);
  }
  xact.changes++;
  return xact;
}

/** The remote transactions whose changes a failed statement carried, by xid: `from` the oldest, `to` the newest it may hold. */
export interface Carried {
  from: number;
  to: number;
}

/** Keyed by the error the target returned for the statement (the root cause, never a PipelineAbortedError). */
const CARRIED = new WeakMap<object, Carried>();

/** Which remote transactions the failed statement behind `err` carried; null when it was not a tracked statement. */
export function carriedBy(err: unknown): Carried | null {
  return typeof err === 'object' && err !== null ? (CARRIED.get(err) ?? null) : null;
}

/**
 * Remember, should `result` fail, which remote transactions it carried: `from` (a batch
 * passes its first row's) up to the one started last. Only with detection on: only a
 * conflict is resolved by replaying the transactions that carry it.
 */
export function noteCarried(state: ApplyState, result: Promise<unknown>, from?: number): void {
  if (!state.session.options.conflicts.detect) return;
  const to = state.tx.lastXid;
  const carried = { from: from ?? state.tx.xact?.xid ?? to, to };
  result.catch((err: unknown) => {
    if (typeof err === 'object' && err !== null && !CARRIED.has(err)) CARRIED.set(err, carried);
  });
}

/**
 * Pipeline a statement; `rows`: how many changes it carries (a batch), for the in-flight
 * bound; `firstXid`: the remote transaction of its first change, when not the current one (a batch).
 */
export function sendStatement(state: ApplyState, statement: Statement, onCount?: (count: number) => void, rows = 1, firstXid?: number): Promise<void> | undefined {
  const result = state.conn.execute(statement.text, statement.params, statement.paramTypes ? { paramTypes: statement.paramTypes } : undefined);
  noteCarried(state, result, firstXid);
  return state.pipeline.push<unknown>(onCount ? result.then((r) => onCount(r.rowCount)) : result, paramBytes(statement), rows);
}

/** Pipeline a statement whose result rows say something (an in-line conflict's markers); `onRows` sees them when they arrive. */
export function sendStatementForRows(state: ApplyState, statement: Statement, onRows: (rows: readonly unknown[][]) => void): Promise<void> | undefined {
  const result = state.conn.execute(statement.text, statement.params, { wantRows: true, ...(statement.paramTypes ? { paramTypes: statement.paramTypes } : {}) });
  noteCarried(state, result);
  return state.pipeline.push<unknown>(
    result.then((r) => onRows(r.rows)),
    paramBytes(statement),
    1,
  );
}

function paramBytes(statement: Statement): number {
  let bytes = 0;
  for (const v of statement.params) if (v !== null) bytes += v.length;
  return bytes;
}

/** The remote transaction starting now (BEGIN, BEGIN PREPARE, a spool's replay, an eager one) becomes the current one. */
export function startRemote(state: ApplyState, spec: { xid: number; finalLsn: Lsn; commitTime: bigint; behind: boolean; alreadyPrepared?: boolean }): RemoteTransaction {
  // Written out, one shape for every transaction: a spread of `spec` made V8 build each
  // one through its slow clone path (a third of pgsub's CPU on single-row transactions).
  const xact: RemoteTransaction = {
    xid: spec.xid,
    finalLsn: spec.finalLsn,
    commitTime: spec.commitTime,
    behind: spec.behind,
    open: false,
    changes: 0,
    syncTouched: NO_TABLES,
    appliesTo: -1,
    alreadyPrepared: spec.alreadyPrepared ?? false,
    skip: false,
    unsubscribed: false,
  };
  state.tx.xact = xact;
  state.tx.lastXid = spec.xid;
  beginTransaction(state, xact);
  return xact;
}

/** Per remote transaction, whatever its kind: skip it (`pgsub skip`), or apply it carefully. */
export function beginTransaction(state: ApplyState, xact: RemoteTransaction): void {
  if (state.mode.skipLsn !== null && xact.finalLsn === state.mode.skipLsn) {
    xact.skip = true;
    state.session.log.warn({ xid: xact.xid, finishLsn: formatLsn(xact.finalLsn) }, 'skipping remote transaction (pgsub skip)');
  }
  if (state.mode.carefulLsn !== null && xact.finalLsn === state.mode.carefulLsn) state.mode.careful = true;
}
