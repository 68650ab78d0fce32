/**
 * Where the apply loop's wall time went while it waited, per part, for the 'apply loop
 * stopped' log line (and `npm run bench`, which prints it): the receiver waiting for the
 * publisher's next frame (socket) or for room in the queue (the applier is behind), the
 * applier waiting for an item (the receiver is behind, or nothing to do), for the target's
 * answers (the in-flight bound, a round trip a handler needs) and for a commit's answer.
 * Each part owns its own counters (one writer); a wait is timed only where a promise is
 * awaited, so the fast path pays nothing.
 */

/** The receiver's waits (receiver.ts). */
export interface ReceiverTimes {
  /** Waiting for the next frame from the publisher's socket. */
  socketWaitMs: number;
  /** Waiting for room in the queue: the applier is behind. */
  queueFullMs: number;
}

/** The applier's waits (applier.ts). */
export interface ApplierTimes {
  /** Waiting for the next queued item: the receiver is behind, or the stream is idle. */
  queueWaitMs: number;
  /** Waiting on the target's answers to statements (the in-flight bound, a handler's round trip). */
  resultsWaitMs: number;
  /** Waiting for a commit's answer (a group committed when the queue ran dry, a settle before a record or hold). */
  commitWaitMs: number;
  /** Items taken from the queue (messages, positions, ticks). */
  items: number;
  /** Turns given to the event loop inside a streamed block (applier.ts, STREAM_YIELD_MS). */
  yields: number;
}

export function newReceiverTimes(): ReceiverTimes {
  return { socketWaitMs: 0, queueFullMs: 0 };
}

export function newApplierTimes(): ApplierTimes {
  return { queueWaitMs: 0, resultsWaitMs: 0, commitWaitMs: 0, items: 0, yields: 0 };
}

/** The log line's fields: seconds, and this process's CPU seconds over the loop's life. */
export function loopTimesReport(wallMs: number, cpu: NodeJS.CpuUsage, r: ReceiverTimes, a: ApplierTimes): Record<string, number> {
  const s = (ms: number) => Math.round(ms) / 1000;
  return {
    wallSeconds: s(wallMs),
    cpuSeconds: s((cpu.user + cpu.system) / 1000),
    items: a.items,
    yields: a.yields,
    socketWaitSeconds: s(r.socketWaitMs),
    queueFullSeconds: s(r.queueFullMs),
    queueWaitSeconds: s(a.queueWaitMs),
    resultsWaitSeconds: s(a.resultsWaitMs),
    commitWaitSeconds: s(a.commitWaitMs),
  };
}
