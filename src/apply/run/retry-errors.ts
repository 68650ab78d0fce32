/**
 * The two failures the apply loop hands to the runner with a plan for the next session:
 * apply one transaction per target transaction up to an LSN (a group, or a commit sent
 * without waiting, failed and which transaction did is not known), or apply one
 * transaction carefully from its BEGIN (a conflict in a transaction too large to replay
 * from memory). service/runner.ts reads `untilLsn` and `finishLsn`.
 */
import { PgsubError } from '../../errors.js';
import { formatLsn, type Lsn } from '../../protocol/lsn.js';

/**
 * A failure while source transactions were grouped in one target transaction: which one
 * failed is not known (the pipeline reports late), and the group cannot be replayed from
 * memory. The next session applies one transaction per target transaction up to `untilLsn`,
 * so the failing one is found, resolved, retried or skipped on its own.
 */
export class GroupRetryError extends PgsubError {
  readonly code = 'PGSUB_GROUP_RETRY';
  readonly retryable = true;
  constructor(
    readonly untilLsn: Lsn,
    cause: unknown,
  ) {
    super(`a statement failed inside a group of transactions; re-applying them one by one up to ${formatLsn(untilLsn)}`, { untilLsn: formatLsn(untilLsn) }, { cause });
  }
}

/** A conflicting transaction too large to keep in memory: the next session applies it carefully from its BEGIN. */
export class CarefulReplayError extends PgsubError {
  readonly code = 'PGSUB_CAREFUL_REPLAY';
  readonly retryable = true;
  constructor(
    readonly finishLsn: Lsn,
    cause: unknown,
  ) {
    super(`conflict in a remote transaction larger than the replay buffer; re-applying it carefully from ${formatLsn(finishLsn)}`, { finishLsn: formatLsn(finishLsn) }, { cause });
  }
}
