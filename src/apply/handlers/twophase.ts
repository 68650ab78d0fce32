/**
 * Two-phase commit (two_phase = true, protocol 3+): worker.c's apply_handle_begin_prepare,
 * _prepare, _commit_prepared, _rollback_prepared. A remote prepared transaction becomes a
 * prepared transaction on the target under a gid derived from the subscription and the
 * remote xid; COMMIT/ROLLBACK PREPARED finish it. Everything is idempotent by gid, so a
 * restart at any point neither loses nor repeats it:
 *  - BEGIN PREPARE resent for a gid already prepared on the target: the body is skipped;
 *  - PREPARE: the prepared transaction holds a pgsub.prepared row (not the origin row,
 *    whose lock it would keep until COMMIT PREPARED); the origin then moves to the
 *    prepare's end in its own transaction;
 *  - COMMIT PREPARED cannot share a transaction with the origin update, so it runs first;
 *    if a crash comes between the two, the resent COMMIT PREPARED finds the gid gone and
 *    its pgsub.prepared row committed — it was committed — and only moves the origin.
 */
import { formatLsn, type Lsn } from '../../protocol/lsn.js';
import type { BeginPrepareMessage, CommitPreparedMessage, PrepareMessage, RollbackPreparedMessage } from '../../protocol/messages.js';
import { finishPreparedStatements, forgetPreparedStatement, idleProgressStatement } from '../../origin/store.js';
import { quoteLiteral } from '../../quote.js';
import { faultPoint } from '../../faults.js';
import { ProtocolError } from '../../errors.js';
import { requireTransaction } from '../txn/transaction.js';
import { finishTransaction, settleTarget } from '../txn/commit.js';
import type { ApplyState } from '../txn/apply-state.js';
import { runAlone } from '../../pgwire/connect.js';
import type { Statement } from '../../pgwire/statement.js';
import { startRemote } from '../txn/transaction.js';

/** The target gid: unique per subscription and remote transaction, like native's pg_gid_<subid>_<xid>. */
export function targetGid(subscription: string, xid: number): string {
  return `pgsub_${subscription}_${xid}`;
}

export async function isPrepared(state: ApplyState, gid: string): Promise<boolean> {
  const [result] = await runAlone(state.conn, [{ text: 'SELECT 1 FROM pg_catalog.pg_prepared_xacts WHERE gid = $1', params: [gid], wantRows: true }]);
  return (result?.rows.length ?? 0) > 0;
}

/** Whether `gid` is prepared on the target, or was committed there with its origin update still to come. */
async function preparedState(state: ApplyState, gid: string): Promise<{ prepared: boolean; committed: boolean }> {
  const [result] = await runAlone(state.conn, [
    {
      text: `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_xacts WHERE gid = $1),
                    EXISTS (SELECT 1 FROM "pgsub"."prepared" WHERE "subscription" = $2 AND "gid" = $1)`,
      params: [gid, state.session.subscription],
      wantRows: true,
    },
  ]);
  const row = result?.rows[0];
  return { prepared: row?.[0] === 't', committed: row?.[1] === 't' };
}

export async function onBeginPrepare(state: ApplyState, m: BeginPrepareMessage): Promise<void> {
  if (state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `BEGIN PREPARE of xid ${m.xid} while xid ${state.tx.xact.xid} is still open`);
  // A prepared transaction is a target transaction of its own.
  await settleTarget(state);
  const known = await preparedState(state, targetGid(state.session.subscription, m.xid));
  const alreadyPrepared = known.prepared || known.committed;
  if (alreadyPrepared) state.session.log.info({ xid: m.xid, gid: m.gid, committed: known.committed }, 'transaction already prepared on the target; body skipped');
  // A prepare below the origin that the target never saw is one prepared before two_phase
  // was enabled on the slot: the walsender sends it whole at its COMMIT PREPARED
  // (reorderbuffer.c ReorderBufferFinishPrepared), and every table takes it. While tables
  // catch up below the origin, two_phase is not enabled (session.ts), so no other prepare
  // below the origin can arrive.
  const behind = m.prepareLsn < state.session.progress.durable && alreadyPrepared;
  startRemote(state, { xid: m.xid, finalLsn: m.prepareLsn, commitTime: m.prepareTime, behind, alreadyPrepared });
}

export async function onPrepare(state: ApplyState, m: PrepareMessage): Promise<void> {
  const xact = requireTransaction(state, 'PREPARE');
  if (m.prepareLsn !== xact.finalLsn) {
    throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `incorrect prepare LSN ${formatLsn(m.prepareLsn)} in prepare message (expected ${formatLsn(xact.finalLsn)})`);
  }
  await prepareOnTarget(state, m.xid, m.endLsn, m.prepareTime);
}

/** Shared by PREPARE and STREAM PREPARE: the open transaction becomes a prepared one. */
export async function prepareOnTarget(state: ApplyState, xid: number, endLsn: Lsn, prepareTime: bigint): Promise<void> {
  const xact = requireTransaction(state, 'PREPARE');
  const gid = targetGid(state.session.subscription, xid);
  await finishTransaction(state, xact, endLsn, prepareTime, { kind: 'prepare', gid });
  faultPoint('after-prepare');
  await advanceOrigin(state, endLsn, []);
}

export async function onCommitPrepared(state: ApplyState, m: CommitPreparedMessage): Promise<void> {
  if (state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `COMMIT PREPARED of xid ${m.xid} inside transaction ${state.tx.xact.xid}`);
  await settleTarget(state);
  const gid = targetGid(state.session.subscription, m.xid);
  if (await isPrepared(state, gid)) {
    await runAlone(state.conn, [{ text: `COMMIT PREPARED ${quoteLiteral(gid)}`, params: [] }]);
    faultPoint('after-commit-prepared');
    state.session.counters.transactionsApplied++;
  }
  // Resent below the origin (a re-streamed range): the origin stays, the row still goes.
  if (m.endLsn <= state.session.progress.durable) await runAlone(state.conn, [forgetPreparedStatement(state.session.subscription, gid)]);
  else await advanceOrigin(state, m.endLsn, finishPreparedStatements(state.session.subscription, gid, m.endLsn, m.commitTime));
}

export async function onRollbackPrepared(state: ApplyState, m: RollbackPreparedMessage): Promise<void> {
  if (state.tx.xact) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `ROLLBACK PREPARED of xid ${m.xid} inside transaction ${state.tx.xact.xid}`);
  await settleTarget(state);
  const gid = targetGid(state.session.subscription, m.xid);
  // Its pgsub.prepared row goes with it.
  if (await isPrepared(state, gid)) await runAlone(state.conn, [{ text: `ROLLBACK PREPARED ${quoteLiteral(gid)}`, params: [] }]);
  await advanceOrigin(state, m.rollbackEndLsn, [idleProgressStatement(state.session.subscription, m.rollbackEndLsn)]);
}

/** Move the origin (and run `extra`, which includes the origin statement when given) past a two-phase message. */
export async function advanceOrigin(state: ApplyState, endLsn: Lsn, extra: Statement[]): Promise<void> {
  if (endLsn <= state.session.progress.durable) return;
  await runAlone(state.conn, extra.length > 0 ? extra : [idleProgressStatement(state.session.subscription, endLsn)]);
  state.session.progress.noteDurable(endLsn);
  state.session.onDurable();
}
