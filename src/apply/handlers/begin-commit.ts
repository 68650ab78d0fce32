/**
 * BEGIN, COMMIT and the messages around the changes (worker.c's apply_handle_begin,
 * _commit, _relation, _type, _origin; logical messages are logged). A transaction whose
 * commit lies below the origin was applied before a restart: only tables catching up take
 * it, and it never joins a group.
 */
import { ProtocolError } from '../../errors.js';
import { formatLsn } from '../../protocol/lsn.js';
import type { BeginMessage, CommitMessage, LogicalMessage, OriginMessage, RelationMessage, TypeMessage } from '../../protocol/messages.js';
import type { ApplyState } from '../txn/apply-state.js';
import { requireTransaction, startRemote } from '../txn/transaction.js';
import { commitGroup, finishTransaction, PLAIN_COMMIT } from '../txn/commit.js';

export function onBegin(state: ApplyState, m: BeginMessage): Promise<void> | void {
  if (state.tx.xact) {
    throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `BEGIN of xid ${m.xid} while xid ${state.tx.xact.xid} is still open`);
  }
  // Below the origin (a re-streamed range, or a transaction resent): only tables catching
  // up take its changes; for everything else it was applied before.
  const behind = m.finalLsn < state.session.progress.durable;
  // Such a transaction does not move the origin: it never joins a group.
  if (behind) {
    state.session.log.debug({ xid: m.xid, lsn: formatLsn(m.finalLsn) }, 'transaction below the origin; applied only to tables catching up');
    return commitGroup(state).then(() => void startRemote(state, { xid: m.xid, finalLsn: m.finalLsn, commitTime: m.commitTime, behind: true }));
  }
  startRemote(state, { xid: m.xid, finalLsn: m.finalLsn, commitTime: m.commitTime, behind: false });
}

export function onCommit(state: ApplyState, m: CommitMessage): Promise<void> | void {
  const xact = requireTransaction(state, 'COMMIT');
  if (m.commitLsn !== xact.finalLsn) {
    throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `incorrect commit LSN ${formatLsn(m.commitLsn)} in commit message (expected ${formatLsn(xact.finalLsn)})`);
  }
  return finishTransaction(state, xact, m.endLsn, m.commitTime, PLAIN_COMMIT);
}

export function onRelation(state: ApplyState, m: RelationMessage): void {
  state.relations.onRelation(m);
}

export function onType(state: ApplyState, m: TypeMessage): void {
  state.relations.onType(m.typeOid, m.namespace, m.name);
}

export function onOrigin(state: ApplyState, m: OriginMessage): void {
  state.session.log.debug({ origin: m.originName, lsn: formatLsn(m.originLsn) }, 'transaction from another origin');
}

export function onMessage(state: ApplyState, m: LogicalMessage): void {
  state.session.log.debug({ prefix: m.prefix, lsn: formatLsn(m.lsn), transactional: m.transactional, bytes: m.content.length }, 'logical decoding message ignored');
}
