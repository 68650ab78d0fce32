/**
 * A hold of the apply at a source LSN, for `pgsub verify` (src/verify/, docs/verify.md):
 * the loop asks `blocks` before it applies anything that makes a remote transaction
 * visible on the target (a Begin, a Stream Commit, a Commit Prepared: their commit LSN),
 * and before it takes a keepalive position between transactions; when blocked it first
 * settles the target — an open group committed, every pipelined COMMIT answered — and then
 * waits in `atBoundary` until the hold lets it go. So when `atBoundary` runs, the target
 * holds exactly the remote transactions committing before `next` (that the stream has
 * delivered), and nothing after. The policy (what bound, when to let go) is the hold's;
 * this file is only the loop's side of it, so the loop stays ignorant of verify.
 */
import type { Lsn } from '../../protocol/lsn.js';

export interface ApplyHold {
  /**
   * Whether applying a remote transaction that commits at `commitLsn` (or, with
   * `position`, going past a keepalive at that LSN) must wait. Called per transaction:
   * cheap and synchronous.
   */
  blocks(commitLsn: Lsn, position?: boolean): boolean;
  /**
   * The loop is settled at a transaction boundary and `next` is blocked: resolves when
   * applying may go on. Never rejects (a failing hold lets the apply go).
   */
  atBoundary(next: Lsn): Promise<void>;
  /** Holding for a position that may not come by itself: the loop asks the publisher for a keepalive. */
  wantsPosition(): boolean;
}
