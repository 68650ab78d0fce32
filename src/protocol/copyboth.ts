/**
 * CopyBoth mode of a `pg` connection after START_REPLICATION, read straight off the
 * socket: the connection's own parser is set aside (as pg-copy-streams' both() does) and
 * the CopyData messages are cut out of the socket's chunks here, each XLogData frame
 * becoming one view of its pgoutput message. This replaced pg-copy-streams' both(), which
 * copies every frame through a BufferList and pushes it through an object-mode Readable:
 * with a frame per row that machinery cost more CPU than decoding the rows
 * (docs/design-measurements.md). Back-pressure is the socket's own: bytes are read only when the
 * consumer asks for the next batch.
 *
 * Reads are coalesced: after a read of less than 64 kB the next one waits a few
 * milliseconds. A subscriber faster than the walsender otherwise wakes for every few
 * frames the walsender sends, and each wake-up costs both sides: the walsender's send()
 * has to wake the reader, the reader runs a batch. A 3 ms pause brings the walsender's CPU
 * down to what it uses serving the native subscriber (docs/design-measurements.md); a
 * lagging subscriber finds 64 kB waiting and never pauses. What it costs is at most 3 ms
 * of lag per read when the stream is light. Stopping the socket's reads during the pause
 * made the walsender block on a full socket instead, which cost it more.
 *
 * An ErrorResponse, or the server's CopyDone, hands the rest of the bytes back to pg's
 * parser, so the error reaches this query's handleError and the connection stays usable.
 * The server's CopyDone is answered with ours, as the protocol asks, so it can send
 * CommandComplete and ReadyForQuery. A walsender stopping with its server (pg_ctl stop,
 * fast or smart) sends CommandComplete without any CopyDone (walsender.c WalSndDone) and
 * exits: that ends the stream too, like a lost connection, not as a protocol violation.
 */
import type { Duplex } from 'node:stream';
import type pg from 'pg';
import { ProtocolError } from '../errors.js';
import { parseReplicationFrame, type KeepaliveFrame } from './framing.js';
import type { Lsn } from './lsn.js';

/** Backend message tags met in CopyBoth mode (protocol "Message Formats"). */
const COPY_DATA = 0x64; // d
const COPY_DONE = 0x63; // c
const COPY_BOTH_RESPONSE = 0x57; // W
const COMMAND_COMPLETE = 0x43; // C
const ERROR_RESPONSE = 0x45; // E
const NOTICE_RESPONSE = 0x4e; // N
const PARAMETER_STATUS = 0x53; // S
const NOTIFICATION_RESPONSE = 0x41; // A
const XLOG_DATA = 0x77; // w
/** 'w', walStart, walEnd, sendTime: the XLogData header before the pgoutput message. */
const XLOG_HEADER = 25;
const WAL_END_OFFSET = 9;
/** A read smaller than this makes the next one wait `coalesceMs` first. */
const COALESCE_BELOW_BYTES = 64 * 1024;
export const DEFAULT_COALESCE_MS = 3;

/** What one read of the socket produced, in arrival order. */
/** How the server ended CopyBoth mode: CopyDone, or CommandComplete alone (a walsender stopping with its server). */
export type ServerEnd = 'copy-done' | 'command-complete';

/** CopyDone, sent in answer to the server's. */
const COPY_DONE_MESSAGE = Buffer.from([COPY_DONE, 0, 0, 0, 4]);

export interface ReceivedBatch {
  /** pgoutput messages (views into the received bytes) and keepalives. */
  items: (Buffer | KeepaliveFrame)[];
  /** walEnd of the batch's last XLogData frame; null when it has none. */
  walEnd: Lsn | null;
}

type Connection = pg.Connection & { stream: Duplex };

export class CopyBothReader implements pg.Submittable {
  #connection: Connection | null = null;
  #pgDataHandler: ((chunk: Buffer) => void) | null = null;
  #started = false;
  #ended = false;
  #serverEnd: ServerEnd | null = null;
  #markStarted!: () => void;
  /** Resolves when the server answered START_REPLICATION with CopyBothResponse (never rejects). */
  readonly started = new Promise<void>((resolve) => (this.#markStarted = resolve));
  #failure: Error | null = null;
  /** Bytes of a message not yet complete, and how many bytes it needs in all. */
  #pending: Buffer[] = [];
  #pendingBytes = 0;
  #needed = 0;
  #wake: (() => void) | null = null;
  /** Bytes the last read returned: a small read means the walsender is the slower side. */
  #lastReadBytes = COALESCE_BELOW_BYTES;
  /** Where the walEnd of the last XLogData frame read is (read once per batch, not per frame). */
  #walEndBuf: Buffer | null = null;
  #walEndAt = 0;
  readonly #onReadable = () => this.#wakeUp();

  constructor(
    private readonly text: string,
    private readonly coalesceMs = DEFAULT_COALESCE_MS,
  ) {}

  submit(connection: pg.Connection): void {
    const con = connection as Connection;
    this.#connection = con;
    const stream = con.stream;
    const listeners = stream.listeners('data') as ((chunk: Buffer) => void)[];
    if (listeners.length !== 1) throw new Error(`CopyBoth expects pg's one data listener on the socket, found ${listeners.length}`);
    this.#pgDataHandler = listeners[0]!;
    stream.removeListener('data', this.#pgDataHandler);
    stream.pause();
    stream.on('readable', this.#onReadable);
    stream.on('end', this.#onReadable);
    stream.on('close', this.#onReadable);
    con.query(this.text);
  }

  /** The failure that ended the stream, if any. */
  get error(): Error | null {
    return this.#failure;
  }

  /** Set once the server itself ended CopyBoth mode. */
  get serverEnd(): ServerEnd | null {
    return this.#serverEnd;
  }

  get finished(): boolean {
    return this.#ended || this.#failure !== null;
  }

  /**
   * Everything the socket holds now, parsed; waits for bytes when it holds none. Null once
   * the stream has ended; throws the failure that ended it.
   */
  async next(): Promise<ReceivedBatch | null> {
    if (this.coalesceMs > 0 && this.#lastReadBytes < COALESCE_BELOW_BYTES && !this.finished) {
      await new Promise((resolve) => setTimeout(resolve, this.coalesceMs));
    }
    for (;;) {
      const batch = this.#read();
      if (batch !== null) return batch;
      if (this.#failure) throw this.#failure;
      if (this.#ended) return null;
      const stream = this.#connection?.stream;
      if (!stream || stream.destroyed || stream.readableEnded) {
        this.#ended = true;
        return null;
      }
      await new Promise<void>((resolve) => (this.#wake = resolve));
    }
  }

  /** Send one CopyData message (a standby status update); dropped before CopyBoth started or after it ended. */
  write(payload: Buffer): void {
    const stream = this.#connection?.stream;
    if (!this.#started || this.finished || !stream || stream.destroyed || stream.writableEnded) return;
    const message = Buffer.allocUnsafe(5 + payload.length);
    message[0] = COPY_DATA;
    message.writeUInt32BE(4 + payload.length, 1);
    payload.copy(message, 5);
    stream.write(message);
  }

  /** Stop reading: later bytes are discarded (the connection is closed next). */
  destroy(err?: Error): void {
    if (!this.finished) {
      if (err) this.#failure = err;
      else this.#ended = true;
    }
    this.#wakeUp();
  }

  #wakeUp(): void {
    const stream = this.#connection?.stream;
    // After the end nobody reads: drain what arrives so the socket can close.
    if (this.finished && stream && this.#pgDataHandler !== null) while (stream.read() !== null);
    const wake = this.#wake;
    this.#wake = null;
    wake?.();
  }

  #read(): ReceivedBatch | null {
    const stream = this.#connection?.stream;
    if (!stream || this.finished) return null;
    const items: ReceivedBatch['items'] = [];
    this.#walEndBuf = null;
    let chunk: Buffer | null;
    let bytes = 0;
    while (!this.finished && (chunk = stream.read() as Buffer | null) !== null) {
      bytes += chunk.length;
      this.#parse(chunk, items);
    }
    if (items.length === 0) return null;
    this.#lastReadBytes = bytes;
    // (#parse set it: a cast, since TypeScript does not see that.)
    const walEndBuf = this.#walEndBuf as Buffer | null;
    const walEnd = walEndBuf ? (walEndBuf.readBigUInt64BE(this.#walEndAt) as Lsn) : null;
    this.#walEndBuf = null;
    return { items, walEnd };
  }

  /**
   * Cut the messages out of `chunk`, after completing the one the previous reads left
   * incomplete: only that message is copied together, not the whole chunk (nearly every
   * read ends inside a message).
   */
  #parse(chunk: Buffer, items: ReceivedBatch['items']): void {
    let at = 0;
    while (this.#pendingBytes > 0) {
      const missing = this.#needed - this.#pendingBytes;
      if (chunk.length - at < missing) {
        this.#pending.push(at === 0 ? chunk : chunk.subarray(at));
        this.#pendingBytes += chunk.length - at;
        return;
      }
      if (this.#pending[0]![0] !== COPY_DATA) {
        // Rare (a notice, an error, CopyDone across reads): parse it with the rest of the chunk,
        // which pg gets back after an error.
        const buf = Buffer.concat([...this.#pending, at === 0 ? chunk : chunk.subarray(at)]);
        this.#pending = [];
        this.#pendingBytes = 0;
        this.#cut(buf, 0, items);
        return;
      }
      const joined = Buffer.concat([...this.#pending, chunk.subarray(at, at + missing)], this.#needed);
      at += missing;
      this.#pending = [];
      this.#pendingBytes = 0;
      const total = 1 + joined.readUInt32BE(1);
      if (total > joined.length) {
        // Only the header was complete: now the message's length is known.
        this.#pending = [joined];
        this.#pendingBytes = joined.length;
        this.#needed = total;
        continue;
      }
      this.#cut(joined, 0, items);
    }
    this.#cut(chunk, at, items);
  }

  /** The messages of `buf` from `at`; an incomplete last one is kept for the next read. */
  #cut(buf: Buffer, at: number, items: ReceivedBatch['items']): void {
    const size = buf.length;
    while (size - at >= 5) {
      const tag = buf[at]!;
      const end = at + 1 + buf.readUInt32BE(at + 1);
      if (end > size) break;
      if (tag === COPY_DATA) {
        const start = at + 5;
        if (buf[start] === XLOG_DATA && end - start >= XLOG_HEADER) {
          items.push(buf.subarray(start + XLOG_HEADER, end));
          this.#walEndBuf = buf;
          this.#walEndAt = start + WAL_END_OFFSET;
        } else {
          // Keepalives are rare; unknown or short frames raise their ProtocolError here.
          const frame = parseReplicationFrame(buf.subarray(start, end));
          if (frame.kind === 'keepalive') items.push(frame);
          else throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', 'XLogData frame shorter than its header', { bytes: end - start });
        }
      } else if (tag === COPY_BOTH_RESPONSE) {
        this.#started = true;
        this.#markStarted();
      } else if (tag === ERROR_RESPONSE) {
        this.#handBack(buf.subarray(at), false);
        return;
      } else if (tag === COPY_DONE) {
        this.#serverEnd = 'copy-done';
        // Our CopyDone lets the server finish with CommandComplete and ReadyForQuery.
        const stream = this.#connection?.stream;
        if (stream && !stream.destroyed && !stream.writableEnded) stream.write(COPY_DONE_MESSAGE);
        this.#handBack(buf.subarray(end), true);
        return;
      } else if (tag === COMMAND_COMPLETE) {
        // pg parses it (this query's handleCommandComplete); the server exits right after.
        this.#serverEnd = 'command-complete';
        this.#handBack(buf.subarray(at), true);
        return;
      } else if (tag !== NOTICE_RESPONSE && tag !== PARAMETER_STATUS && tag !== NOTIFICATION_RESPONSE) {
        throw new ProtocolError('PGSUB_PROTOCOL_UNKNOWN_MESSAGE', `unexpected message 0x${tag.toString(16)} in CopyBoth mode`, { tag: `0x${tag.toString(16)}` });
      }
      at = end;
    }
    if (at < size) {
      const rest = buf.subarray(at);
      this.#pending = [rest];
      this.#pendingBytes = rest.length;
      this.#needed = rest.length >= 5 ? 1 + rest.readUInt32BE(1) : 5;
    }
  }

  /** Give the connection back to pg's parser with the bytes after CopyBoth mode. */
  #handBack(rest: Buffer, serverDone: boolean): void {
    const con = this.#connection!;
    const stream = con.stream;
    const handler = this.#pgDataHandler!;
    this.#pgDataHandler = null;
    if (serverDone) this.#ended = true;
    stream.removeListener('readable', this.#onReadable);
    stream.removeListener('end', this.#onReadable);
    stream.removeListener('close', this.#onReadable);
    stream.on('data', handler);
    if (rest.length > 0) handler(rest);
    // Its data listener back, the socket flows again (after this read returns).
    process.nextTick(() => stream.resume());
  }

  // pg.Submittable callbacks once pg parses again (after an ErrorResponse or CopyDone).
  handleError(err: Error): void {
    this.#failure ??= err;
    this.#wakeUp();
  }

  handleCommandComplete(): void {}

  handleReadyForQuery(): void {
    this.#ended = true;
    this.#wakeUp();
  }

  handleCopyData(): void {}
}
