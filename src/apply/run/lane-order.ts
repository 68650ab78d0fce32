/**
 * The commit-order turn of apply lanes (lanes.ts): groups are numbered in source order and
 * commit in that order. A lane's COMMIT, a change that depends on an earlier group and the
 * leader handing a lane its next group all wait here until the group before has committed;
 * the first failure rejects every wait, now and later. The lane that committed a group
 * (lane-runner.ts) is the only one to move the turn on, the leader the only one to fail it.
 */

export class CommitOrder {
  #committedThrough = 0;
  #waiters: { seq: number; resolve: () => void; reject: (err: unknown) => void }[] = [];
  #failure: unknown = null;

  /** Every group up to this one has committed. */
  get committedThrough(): number {
    return this.#committedThrough;
  }

  /** What ended the lanes, or null. */
  get failure(): unknown {
    return this.#failure;
  }

  /** Resolves once group `seq` has committed; rejects once the lanes failed. */
  until(seq: number): Promise<void> {
    if (this.#failure !== null) return Promise.reject(this.#failure);
    if (seq <= this.#committedThrough) return Promise.resolve();
    return new Promise((resolve, reject) => this.#waiters.push({ seq, resolve, reject }));
  }

  throwIfFailed(): void {
    if (this.#failure !== null) throw this.#failure;
  }

  /** Group `seq` committed: the waits for it and for the groups before it end. */
  committed(seq: number): void {
    this.#committedThrough = seq;
    const ready = this.#waiters.filter((w) => w.seq <= seq);
    this.#waiters = this.#waiters.filter((w) => w.seq > seq);
    for (const w of ready) w.resolve();
  }

  /** The lanes failed with `err`: every wait rejects. False when they had failed already. */
  fail(err: unknown): boolean {
    if (this.#failure !== null) return false;
    this.#failure = err;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w.reject(err);
    return true;
  }
}
