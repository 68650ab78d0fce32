/**
 * One apply lane (lanes.ts): a target connection with its own apply state, pipeline and
 * relation map (a sibling of the main connection's), and the task that applies what the
 * leader queues for it — a group's messages through the usual handlers, then, at the
 * group's end marker, its commit in source order (lane-order.ts). Its group number is
 * written only here: set by the leader through assign(), back to 0 once the group committed.
 */
import type { ApplyOptions } from '../../config/apply-options.js';
import { decode } from '../../protocol/decoder.js';
import type { PgOutputMessage } from '../../protocol/messages.js';
import { TAG } from '../../protocol/tags.js';
import type { WireConnection } from '../../pgwire/connect.js';
import { insertAsSent } from '../handlers/changes.js';
import { workerState, type ApplyState, type Dispatch } from '../txn/apply-state.js';
import { commitGroup } from '../txn/commit.js';
import type { CommitOrder } from './lane-order.js';
import { BoundedQueue } from './queue.js';

/** Bytes queued for one lane before the leader waits for it. */
const LANE_QUEUE_BYTES = 8 * 1024 * 1024;
const LANE_QUEUE_ITEMS = 100_000;
const DECODE_CONTEXT = { inStream: false, streamAbortInfo: false };

/** `message`: decoded by the leader already (null: the lane decodes it, if it is not copied as sent). */
export type LaneItem = { raw: Buffer; message: PgOutputMessage | null; waitFor: number } | { end: number };

/** What a lane applies with (lanes.ts ApplyLanesOptions). */
export interface LaneOptions {
  /** The settings (maxInFlight per lane). */
  options: ApplyOptions;
  /** The handler table (handlers/dispatch.ts), given by the loop. */
  dispatch: Dispatch;
  originName: string;
}

export class Lane {
  readonly queue: BoundedQueue<LaneItem>;
  readonly state: ApplyState;
  /** The group it applies (0: none); the leader waits for 0 before giving it the next. */
  #seq = 0;
  #task: Promise<void>;
  readonly #opts: LaneOptions;
  readonly #order: CommitOrder;

  constructor(
    readonly index: number,
    readonly conn: WireConnection,
    main: ApplyState,
    opts: LaneOptions,
    order: CommitOrder,
  ) {
    this.#opts = opts;
    this.#order = order;
    const relations = main.relations.sibling();
    relations.seedFrom(main.relations);
    this.queue = new BoundedQueue<LaneItem>(LANE_QUEUE_ITEMS, LANE_QUEUE_BYTES);
    this.#task = Promise.resolve();
    this.state = workerState(main, conn, relations, opts.options.maxInFlight, {
      // The leader decides where a group ends (the end marker).
      canGroup: () => true,
      commitTurn: { originName: opts.originName, acquire: () => order.until(this.#seq - 1) },
    });
  }

  /** The group it applies (0: none). */
  get seq(): number {
    return this.#seq;
  }

  /** The leader gives it group `seq` (after its previous group committed). */
  assign(seq: number): void {
    this.#seq = seq;
  }

  /** Its apply task: settles when the queue closes or the lanes fail. */
  get task(): Promise<void> {
    return this.#task;
  }

  /** Start applying what is queued; a failure goes to `onFailure`. */
  start(onFailure: (err: unknown) => void): void {
    this.#task = this.#run().catch(onFailure);
  }

  async #run(): Promise<void> {
    for (;;) {
      const item = this.queue.takeNow() ?? (await this.queue.take());
      if (item === undefined || this.#order.failure !== null) return;
      if ('end' in item) {
        await this.#endGroup(item.end);
        continue;
      }
      if (item.waitFor > this.#order.committedThrough) await this.#order.until(item.waitFor);
      const raw = item.raw;
      let pending = raw[0] === TAG.INSERT ? insertAsSent(this.state, raw) : false;
      if (pending === false) pending = this.#opts.dispatch(this.state, item.message ?? decode(raw, DECODE_CONTEXT), raw);
      if (pending) await pending;
    }
  }

  async #endGroup(seq: number): Promise<void> {
    // A group whose transactions wrote nothing has no commit: it still passes in order.
    await commitGroup(this.state);
    await this.#order.until(seq - 1);
    this.#seq = 0;
    this.#order.committed(seq);
  }
}
