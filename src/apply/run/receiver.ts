/**
 * The apply loop's reader (worker.c's walrcv_receive side of LogicalRepApplyLoop): takes
 * CopyData frames off the replication stream, notes received positions and keepalives,
 * answers a keepalive that asks for a reply, and queues pgoutput messages as bytes for the
 * applier (applier.ts decodes each one once). A full queue stops the reading, which
 * back-pressures the socket. Only the tag byte is looked at here: a keepalive between
 * transactions becomes a position the applier may record. This class is the one writer
 * of the last frame's time and of its own wait counters.
 */
import { ConnectionLostError } from '../../errors.js';
import type { Lsn } from '../../protocol/lsn.js';
import type { ReplicationStream } from '../../protocol/replication.js';
import { TAG } from '../../protocol/tags.js';
import type { Progress } from '../../origin/positions.js';
import type { Feedback } from './feedback.js';
import { newReceiverTimes, type ReceiverTimes } from './loop-times.js';
import type { BoundedQueue } from './queue.js';

export type WorkItem =
  /** A pgoutput message, decoded by the applier: the queue holds bytes only once (no wrapper object per message). */
  | Buffer
  /** A keepalive between transactions: everything before `lsn` has been sent to us. */
  | { kind: 'position'; lsn: Lsn }
  /** Wakes the applier so an idle position gets recorded. */
  | { kind: 'tick' };

export class Receiver {
  readonly times: ReceiverTimes = newReceiverTimes();
  #lastFrameAt = Date.now();
  /** Between a BEGIN and its COMMIT (keepalives there are not positions). */
  #inTransaction = false;

  constructor(
    private readonly stream: ReplicationStream,
    private readonly queue: BoundedQueue<WorkItem>,
    private readonly progress: Progress,
    private readonly feedback: Feedback,
    private readonly stopping: () => boolean,
  ) {}

  /** How long the publisher has sent nothing (time spent waiting for queue space excluded). */
  get silentMs(): number {
    return Date.now() - this.#lastFrameAt;
  }

  /** Until the stream ends (an error unless stopping) or the queue closes. */
  async run(): Promise<void> {
    let waitingSince = performance.now();
    for await (const batch of this.stream.batches()) {
      this.times.socketWaitMs += performance.now() - waitingSince;
      this.#lastFrameAt = Date.now();
      this.feedback.onFrame();
      if (batch.walEnd !== null) this.progress.noteReceived(batch.walEnd);
      for (const item of batch.items) {
        if (item instanceof Uint8Array) {
          // The tag byte is all the receiver needs.
          const tag = item[0];
          if (tag === TAG.BEGIN || tag === TAG.BEGIN_PREPARE) this.#inTransaction = true;
          else if (tag === TAG.COMMIT || tag === TAG.PREPARE) this.#inTransaction = false;
          if (!this.queue.tryPut(item, item.length) && !(await this.#put(item, item.length))) return;
          continue;
        }
        this.progress.noteReceived(item.walEnd);
        this.progress.noteKeepalive(item.sendTime);
        if (!this.#inTransaction) {
          const position: WorkItem = { kind: 'position', lsn: item.walEnd };
          if (!this.queue.tryPut(position, 0) && !(await this.#put(position, 0))) return;
        }
        if (item.replyRequested) this.feedback.send();
      }
      waitingSince = performance.now();
    }
    if (!this.stopping()) throw new ConnectionLostError('replication stream ended');
  }

  /** The queue is full: wait for room (false once it closed). */
  async #put(item: WorkItem, size: number): Promise<boolean> {
    const since = performance.now();
    const queued = await this.queue.put(item, size);
    this.times.queueFullMs += performance.now() - since;
    // Time spent waiting for queue space is not publisher silence.
    this.#lastFrameAt = Date.now();
    return queued;
  }
}
