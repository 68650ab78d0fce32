/**
 * Whether this session's pipelined statements detect conflicts (conflict/detect.ts), as
 * the one Detect object per session the statement builders take; shared by changes.ts
 * and rows.ts. Also which relations get the statements that resolve the default policies'
 * conflicts themselves (sql/update-conflicts.ts updateLoggingConflicts): those that met a conflict
 * lately. That statement costs a conflict-free UPDATE about half its rate (two more
 * relations opened per execution), so a table nobody else writes keeps the lean one, and
 * one with local writers switches at its first conflict and back after a quiet minute.
 */
import type { ApplyState } from '../txn/apply-state.js';
import type { Detect } from '../sql/detecting.js';
import { policyFor } from '../../conflict/types.js';

const DETECT = new WeakMap<ApplyState, Detect | null>();

/** When each relation last met a conflict (Date.now()); kept with the relation map's entry. */
const LAST_CONFLICT = new WeakMap<object, number>();
/** How long after its last conflict a relation keeps the resolving statements. */
const CONFLICT_MEMORY_MS = 60_000;

/** A conflict met on `rel` (either path): its UPDATEs resolve the default policies' conflicts in the statement for a while. */
export function noteConflict(rel: object): void {
  LAST_CONFLICT.set(rel, Date.now());
}

function conflictedLately(rel: object): boolean {
  const at = LAST_CONFLICT.get(rel);
  return at !== undefined && Date.now() - at < CONFLICT_MEMORY_MS;
}

/** Detection on the pipelined path: statements that abort the transaction on a conflict (conflict/detect.ts). */
export function detect(state: ApplyState): Detect | null {
  // Constant for a session: one object, not one per change (this runs per row).
  let d = DETECT.get(state);
  if (d === undefined) DETECT.set(state, (d = state.session.options.conflicts.detect ? sessionDetect(state) : null));
  return d;
}

function sessionDetect(state: ApplyState): Detect {
  const { conflicts } = state.session.options;
  const lean: Detect = { originId: state.session.originId, returningOld: state.conn.serverVersionNum >= 180000 };
  // Only on the serial path: the statement upserts the subscription's counter row, whose lock
  // an apply lane or the parallel apply connection would hold until a commit that waits for
  // the connection blocked on it (commits keep source order) — a wait no server can see.
  if (state.policy.commitTurn !== undefined || state.policy.resultsBeforeCommit === true) return lean;
  return {
    ...lean,
    // apply_remote for update_origin_differs (the default) needs no decision: the statement applies and logs it (sql/update-conflicts.ts).
    inlineOriginDiffers: (rel) => conflictedLately(rel) && policyFor(conflicts, rel.displayName, 'update_origin_differs') === 'apply_remote',
    // And skip for update_missing (the default): the statement logs the missing row.
    inlineMissing: (rel) => policyFor(conflicts, rel.displayName, 'update_missing') === 'skip',
    subscription: state.session.subscription,
  };
}
