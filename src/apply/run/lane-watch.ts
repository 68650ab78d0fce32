/**
 * The apply lanes' watchdog (lanes.ts): the oldest uncommitted group's lane waiting on a
 * lock another lane holds never moves, since the holder waits for its turn behind it, and
 * PostgreSQL sees no deadlock (one side waits in pgsub). Once the oldest group has been
 * oldest for a while, it asks pg_blocking_pids (watchdog.ts LockWatch) and, if so, fails the
 * lanes through the leader. It is the one writer of how long the oldest group has been oldest.
 */
import { ApplyError } from '../../errors.js';
import type { Logger } from '../../log.js';
import type { WireConnection } from '../../pgwire/connect.js';
import type { CommitOrder } from './lane-order.js';
import type { Lane } from './lane-runner.js';
import { LockWatch } from './watchdog.js';

const WATCH_INTERVAL_MS = 1000;

/** What the watchdog reads of the leader, and how it ends the lanes. */
export interface WatchedLanes {
  /** The lanes (null: not started). */
  lanes(): Lane[] | null;
  /** The last group handed to a lane. */
  lastSeq(): number;
  fail(err: unknown): void;
}

export class HeadWatch {
  readonly #watch: LockWatch;
  readonly #order: CommitOrder;
  readonly #leader: WatchedLanes;
  #headSince = { seq: 0, at: 0 };

  constructor(open: () => Promise<WireConnection>, log: Logger, order: CommitOrder, leader: WatchedLanes) {
    this.#watch = new LockWatch(open, log, 'apply lane');
    this.#order = order;
    this.#leader = leader;
  }

  /** Check the oldest group every second from now on, once lanes run (a no-op while it runs already). */
  start(): void {
    if (this.#leader.lanes() !== null) this.#watch.start(WATCH_INTERVAL_MS, () => this.#checkHead());
  }

  stop(): void {
    this.#watch.stop();
  }

  close(): Promise<void> {
    return this.#watch.close();
  }

  /**
   * The oldest uncommitted group's lane waiting on a lock another lane holds: the holder
   * waits for its turn behind it, so neither moves (PostgreSQL sees no deadlock: one side
   * waits in pgsub). Looked at once the oldest group has been oldest for a while.
   */
  async #checkHead(): Promise<void> {
    const head = this.#order.committedThrough + 1;
    if (head > this.#leader.lastSeq() || this.#order.failure !== null) return;
    const now = Date.now();
    if (this.#headSince.seq !== head) {
      this.#headSince = { seq: head, at: now };
      return;
    }
    if (now - this.#headSince.at < WATCH_INTERVAL_MS) return;
    const lanes = this.#leader.lanes() ?? [];
    const headLane = lanes.find((lane) => lane.seq === head);
    if (!headLane) return;
    const others = lanes.filter((lane) => lane !== headLane).map((lane) => lane.conn.processId);
    if ((await this.#watch.blocks(others, [headLane.conn.processId])) && this.#order.committedThrough + 1 === head) {
      this.#leader.fail(new ApplyError(`apply lane ${headLane.index + 1} waits on a lock held by a later lane (a uniqueness the row identities do not cover)`, { group: head }));
    }
  }
}
