/**
 * The decoding floor's reader, shared by `npm run bench:floor` and the apply benchmark's
 * floor contestant: a slot read with pgsub's replication connection and CopyBoth reader from
 * START_REPLICATION until a logical decoding message ('M') arrives, every message dropped.
 */
import { parseConninfo } from '../src/config/conninfo.js';
import { ZERO_LSN } from '../src/protocol/lsn.js';
import { protoVersionFor } from '../src/protocol/proto-version.js';
import { ReplicationConnection } from '../src/protocol/replication.js';

/** pgoutput's logical decoding message ('M'). */
const LOGICAL_MESSAGE_TAG = 0x4d;

export interface FloorRead {
  seconds: number;
  /** Reads of the socket, and the messages they held. */
  batches: number;
  messages: number;
}

/**
 * Reads `slot` (binary, the given streaming mode) until the first logical message. `walsenderPid`
 * is asked after each batch until it answers (the walsender serving the slot, for its CPU).
 */
export async function readToEndMessage(
  url: string,
  slot: string,
  publication: string,
  streaming: 'off' | 'on' | 'parallel',
  walsenderPid: () => Promise<number | null>,
  onWalsender: (pid: number) => void,
): Promise<FloorRead> {
  const replication = await ReplicationConnection.open(parseConninfo(url, 'source'), 'bench_floor');
  try {
    const t0 = performance.now();
    const stream = replication.startReplication({
      slotName: slot,
      startLsn: ZERO_LSN,
      protoVersion: protoVersionFor(replication.serverVersionNum),
      publications: [publication],
      binary: true,
      messages: true,
      streaming,
    });
    let batches = 0;
    let messages = 0;
    let walsenderSeen = false;
    for await (const batch of stream.batches()) {
      batches++;
      messages += batch.items.length;
      if (!walsenderSeen) {
        const pid = await walsenderPid();
        if (pid) {
          onWalsender(pid);
          walsenderSeen = true;
        }
      }
      if (batch.items.some((m) => Buffer.isBuffer(m) && m[0] === LOGICAL_MESSAGE_TAG)) break;
    }
    return { seconds: (performance.now() - t0) / 1000, batches, messages };
  } finally {
    await replication.close();
  }
}
