/**
 * Streamed (in-progress) transactions, streaming = on (protocol 2+): worker.c's
 * apply_handle_stream_start/stop/abort/commit. Changes of a streamed block go to the spool
 * (spool.ts) through dispatch's diversion, row changes as bytes without being decoded
 * (spoolRowChange, called by the applier); STREAM ABORT takes back a subtransaction or the
 * whole transaction; STREAM COMMIT replays the spooled messages through the same handlers
 * into one target transaction that also records the origin, then deletes the file.
 */
import { ProtocolError } from '../../errors.js';
import { decode } from '../../protocol/decoder.js';
import { formatLsn, type Lsn } from '../../protocol/lsn.js';
import { peekStreamXid } from '../../protocol/peek.js';
import type { PgOutputMessage, StreamAbortMessage, StreamCommitMessage, StreamPrepareMessage, StreamStartMessage, StreamStopMessage } from '../../protocol/messages.js';
import { finishTransaction, settleTarget } from '../txn/commit.js';
import type { RemoteTransaction } from '../txn/apply-state.js';
import { advanceOrigin, isPrepared, prepareOnTarget, targetGid } from './twophase.js';
import type { ApplyState, Dispatch } from '../txn/apply-state.js';
import { startRemote } from '../txn/transaction.js';

export async function onStreamStart(state: ApplyState, m: StreamStartMessage): Promise<void> {
  if (state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM START of xid ${m.xid} inside transaction ${state.tx.xact.xid}`);
  if (state.mode.streamXid !== null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM START of xid ${m.xid} inside the stream of xid ${state.mode.streamXid}`);
  // The leader holds no locks while a streamed block is applied in parallel, nor while a
  // streamed transaction's end waits (below).
  await settleTarget(state);
  state.session.spool.start(m.xid, m.firstSegment);
  state.mode.streamXid = m.xid;
  await state.parallel?.onStreamStart(m.xid, m.firstSegment);
}

export function onStreamStop(state: ApplyState, _m: StreamStopMessage): void {
  const xid = state.mode.streamXid;
  if (xid === null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', 'STREAM STOP without STREAM START');
  state.session.spool.stop(xid);
  state.mode.streamXid = null;
  state.parallel?.spooled(xid);
}

/**
 * Spooled, never waited for: with streaming = parallel the eager connection reads the
 * spool behind the leader (run/parallel.ts), told when records reach the file.
 */
export function spoolMessage(state: ApplyState, message: PgOutputMessage, raw: Buffer): void {
  const xid = state.mode.streamXid!;
  const subXid = 'xid' in message && message.xid !== undefined ? message.xid : xid;
  if (state.session.spool.append(xid, subXid, raw)) state.parallel?.spooled(xid);
}

/**
 * A row change (Insert, Update, Delete) of a stream block, spooled as its bytes without
 * being decoded: only its (sub)transaction's xid is read, as native's leader does. It is
 * decoded once, where it is applied (the eager connection's read-ahead, or the replay).
 */
export function spoolRowChange(state: ApplyState, raw: Buffer): void {
  const xid = state.mode.streamXid;
  if (xid === null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', 'a streamed row change outside a stream block');
  const subXid = peekStreamXid(raw);
  if (subXid < 0) throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `a streamed row change of xid ${xid} is ${raw.length} bytes long`, { remoteXid: xid });
  if (state.session.spool.append(xid, subXid, raw)) state.parallel?.spooled(xid);
}

export async function onStreamAbort(state: ApplyState, m: StreamAbortMessage): Promise<void> {
  if (state.mode.streamXid !== null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM ABORT of xid ${m.xid} inside a stream block`);
  if (m.subXid !== m.xid && state.parallel?.isEager(m.xid)) {
    // The eager connection applies what was spooled before the rollback to the savepoint;
    // it may need a lock the leader's open group holds.
    await settleTarget(state);
  }
  // Before the spool cuts the records: the eager apply reads up to them first.
  await state.parallel?.onStreamAbort(m.xid, m.subXid);
  state.session.spool.abort(m.xid, m.subXid);
  state.session.log.debug({ xid: m.xid, subXid: m.subXid }, m.xid === m.subXid ? 'streamed transaction aborted' : 'streamed subtransaction aborted');
}

/** Replay a spooled transaction's changes into state.tx.xact (opened on first change). */
async function replaySpool(state: ApplyState, xid: number, finalLsn: Lsn, time: bigint, dispatch: Dispatch): Promise<RemoteTransaction> {
  if (state.mode.streamXid !== null || state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `end of streamed xid ${xid} inside another transaction`);
  const behind = finalLsn < state.session.progress.durable;
  const xact = startRemote(state, { xid, finalLsn, commitTime: time, behind });
  // Skipped (`pgsub skip`): its changes are not even read back.
  if (xact.skip) return xact;
  for await (const records of state.session.spool.replay(xid)) {
    for (const record of records) {
      // Most records join a batch without waiting: no await (a microtask) per record.
      const applied = dispatch(state, decode(record, { inStream: true }), record);
      if (applied !== undefined) await applied;
    }
  }
  return xact;
}

export async function onStreamCommit(state: ApplyState, m: StreamCommitMessage, dispatch: Dispatch): Promise<void> {
  if (state.mode.streamXid !== null || state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM COMMIT of xid ${m.xid} inside another transaction`);
  await settleTarget(state);
  // The transaction `pgsub skip` names is never committed eagerly: the spool path skips it.
  if (state.mode.skipLsn === m.commitLsn) await state.parallel?.abandon(m.xid);
  if (state.parallel?.isEager(m.xid) && (await state.parallel.commit(m))) {
    state.session.spool.discard(m.xid);
    return;
  }
  const xact = await replaySpool(state, m.xid, m.commitLsn, m.commitTime, dispatch);
  await finishTransaction(state, xact, m.endLsn, m.commitTime);
  state.session.spool.discard(m.xid);
  state.session.log.debug({ xid: m.xid, lsn: formatLsn(m.commitLsn), changes: xact.changes }, 'streamed transaction applied');
}

/** STREAM PREPARE (streaming with two_phase): the spooled transaction becomes a prepared one. */
export async function onStreamPrepare(state: ApplyState, m: StreamPrepareMessage, dispatch: Dispatch): Promise<void> {
  await settleTarget(state);
  if (await isPrepared(state, targetGid(state.session.subscription, m.xid))) {
    // Resent after a restart: prepared already.
    await state.parallel?.abandon(m.xid);
    state.session.spool.discard(m.xid);
    await advanceOrigin(state, m.endLsn, []);
    return;
  }
  if (state.mode.skipLsn === m.prepareLsn) await state.parallel?.abandon(m.xid);
  if (state.parallel?.isEager(m.xid) && (await state.parallel.prepare(m))) {
    state.session.spool.discard(m.xid);
    return;
  }
  await replaySpool(state, m.xid, m.prepareLsn, m.prepareTime, dispatch);
  await prepareOnTarget(state, m.xid, m.endLsn, m.prepareTime);
  state.session.spool.discard(m.xid);
}
