/**
 * The wait between attempts of a step that failed and is retried — a session (service/
 * runner.ts), a table's copy (tablesync/launcher.ts), a slot held by a walsender on its way
 * out: one home for every retry delay. Exponential from retry_min_delay, doubling up to
 * retry_max_delay, starting over after progress, with "equal jitter" (AWS Architecture Blog,
 * "Exponential Backoff And Jitter"): each wait is half the step plus a random share of the
 * other half. pgsub instances that failed together (a target that restarted under several
 * subscriptions) then come back spread over the step instead of in lockstep, while no wait
 * is shorter than half the step (never 0) nor longer than the step, so retry_max_delay
 * stays the bound. Polls that wait for a condition (a lag, a lock let go) are not retries
 * and do not use it.
 */

/** A wait drawn from [stepMs / 2, stepMs]: at least 1 ms, never above stepMs (rounded down). */
export function jitteredDelay(stepMs: number, random: () => number = Math.random): number {
  const half = stepMs / 2;
  const ms = Math.round(half + random() * half);
  return Math.max(1, Math.min(ms, Math.floor(stepMs)));
}

/** The waits of one retrying loop: next() after each failure, reset() after progress. */
export class Backoff {
  #stepMs: number;
  readonly #minMs: number;

  constructor(
    minMs: number,
    private readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {
    // retry_min_delay above retry_max_delay: the max is the bound.
    this.#minMs = Math.min(minMs, maxMs);
    this.#stepMs = this.#minMs;
  }

  /** The wait before the next attempt (jittered; log this value as retryInMs); the step then doubles, up to the max. */
  next(): number {
    const ms = jitteredDelay(this.#stepMs, this.random);
    this.#stepMs = Math.min(this.#stepMs * 2, this.maxMs);
    return ms;
  }

  /** Progress was made: the next failure waits from the minimum again. */
  reset(): void {
    this.#stepMs = this.#minMs;
  }
}
