/**
 * Whether this session's pipelined statements detect conflicts (conflict/detect.ts), as
 * the one Detect object per session the statement builders take; shared by changes.ts
 * and rows.ts.
 */
import type { ApplyState } from '../txn/apply-state.js';
import type { Detect } from '../sql/statements.js';
import { policyFor } from '../../conflict/types.js';

const DETECT = new WeakMap<ApplyState, Detect | null>();

/** Detection on the pipelined path: statements that abort the transaction on a conflict (conflict/detect.ts). */
export function detect(state: ApplyState): Detect | null {
  // Constant for a session: one object, not one per change (this runs per row).
  let d = DETECT.get(state);
  if (d === undefined) DETECT.set(state, (d = state.session.options.conflicts.detect ? sessionDetect(state) : null));
  return d;
}

function sessionDetect(state: ApplyState): Detect {
  const { conflicts } = state.session.options;
  return {
    originId: state.session.originId,
    returningOld: state.conn.serverVersionNum >= 180000,
    // apply_remote for update_origin_differs (the default) needs no decision: the statement applies and logs it (statements.ts).
    inlineOriginDiffers: (rel) => policyFor(conflicts, rel.displayName, 'update_origin_differs') === 'apply_remote',
    // And skip for update_missing (the default): the statement logs the missing row.
    inlineMissing: (rel) => policyFor(conflicts, rel.displayName, 'update_missing') === 'skip',
    subscription: state.session.subscription,
  };
}
