/**
 * Whether this session's pipelined statements detect conflicts (conflict/detect.ts), as
 * the one Detect object per session the statement builders take; shared by changes.ts
 * and rows.ts.
 */
import type { ApplyState } from '../txn/apply-state.js';
import type { Detect } from '../sql/statements.js';

const DETECT = new WeakMap<ApplyState, Detect | null>();

/** Detection on the pipelined path: statements that abort the transaction on a conflict (conflict/detect.ts). */
export function detect(state: ApplyState): Detect | null {
  // Constant for a session: one object, not one per change (this runs per row).
  let d = DETECT.get(state);
  if (d === undefined)
    DETECT.set(state, (d = state.session.options.conflicts.detect ? { originId: state.session.originId, returningOld: state.conn.serverVersionNum >= 180000 } : null));
  return d;
}
