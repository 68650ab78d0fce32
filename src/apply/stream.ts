/**
 * Streamed (in-progress) transactions, streaming = on (protocol 2+): worker.c's
 * apply_handle_stream_start/stop/abort/commit. Changes of a streamed block go to the spool
 * (spool.ts) through dispatch's diversion; STREAM ABORT takes back a subtransaction or the
 * whole transaction; STREAM COMMIT replays the spooled messages through the same handlers
 * into one target transaction that also records the origin, then deletes the file.
 */
import { ProtocolError } from '../errors.js';
import { decode } from '../protocol/decoder.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { PgOutputMessage, StreamAbortMessage, StreamCommitMessage, StreamPrepareMessage, StreamStartMessage, StreamStopMessage } from '../protocol/messages.js';
import { beginTransaction, dispatch, finishTransaction } from './handlers.js';
import type { RemoteTransaction } from './state.js';
import { advanceOrigin, isPrepared, prepareOnTarget, targetGid } from './twophase.js';
import type { ApplyState } from './state.js';

export function onStreamStart(state: ApplyState, m: StreamStartMessage): void {
  if (state.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM START of xid ${m.xid} inside transaction ${state.xact.xid}`);
  if (state.streamXid !== null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM START of xid ${m.xid} inside the stream of xid ${state.streamXid}`);
  state.spool.start(m.xid, m.firstSegment);
  state.streamXid = m.xid;
}

export function onStreamStop(state: ApplyState, _m: StreamStopMessage): void {
  if (state.streamXid === null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', 'STREAM STOP without STREAM START');
  state.spool.stop(state.streamXid);
  state.streamXid = null;
}

export function spoolMessage(state: ApplyState, message: PgOutputMessage, raw: Buffer): void {
  const xid = state.streamXid!;
  const subXid = 'xid' in message && message.xid !== undefined ? message.xid : xid;
  state.spool.append(xid, subXid, raw);
}

export function onStreamAbort(state: ApplyState, m: StreamAbortMessage): void {
  if (state.streamXid !== null) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `STREAM ABORT of xid ${m.xid} inside a stream block`);
  state.spool.abort(m.xid, m.subXid);
  state.log.debug({ xid: m.xid, subXid: m.subXid }, m.xid === m.subXid ? 'streamed transaction aborted' : 'streamed subtransaction aborted');
}

/** Replay a spooled transaction's changes into state.xact (opened on first change). */
async function replaySpool(state: ApplyState, xid: number, finalLsn: Lsn, time: bigint): Promise<RemoteTransaction> {
  if (state.streamXid !== null || state.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `end of streamed xid ${xid} inside another transaction`);
  const behind = finalLsn < state.progress.durable;
  const xact: RemoteTransaction = { xid, finalLsn, commitTime: time, behind, open: false, changes: 0, syncTouched: new Set(), alreadyPrepared: false };
  state.xact = xact;
  beginTransaction(state, xact);
  // Skipped (`pgsub skip`): its changes are not even read back.
  if (xact.skip) return xact;
  for await (const record of state.spool.replay(xid)) {
    await dispatch(state, decode(record, { inStream: true }), record);
  }
  return xact;
}

export async function onStreamCommit(state: ApplyState, m: StreamCommitMessage): Promise<void> {
  const xact = await replaySpool(state, m.xid, m.commitLsn, m.commitTime);
  await finishTransaction(state, xact, m.endLsn, m.commitTime);
  state.spool.discard(m.xid);
  state.log.debug({ xid: m.xid, lsn: formatLsn(m.commitLsn), changes: xact.changes }, 'streamed transaction applied');
}

/** STREAM PREPARE (streaming with two_phase): the spooled transaction becomes a prepared one. */
export async function onStreamPrepare(state: ApplyState, m: StreamPrepareMessage): Promise<void> {
  if (await isPrepared(state, targetGid(state.subscription, m.xid))) {
    // Resent after a restart: prepared already.
    state.spool.discard(m.xid);
    await advanceOrigin(state, m.endLsn, []);
    return;
  }
  await replaySpool(state, m.xid, m.prepareLsn, m.prepareTime);
  await prepareOnTarget(state, m.xid, m.endLsn, m.prepareTime);
  state.spool.discard(m.xid);
}
