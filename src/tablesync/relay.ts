/**
 * A COPY relay that forwards the publisher's CopyData messages to the target as they are.
 * Both directions of the COPY protocol frame rows the same way ('d', int32 length, bytes),
 * so the bytes a `COPY … TO STDOUT` sends are exactly what a `COPY … FROM STDIN` wants;
 * pg-copy-streams instead cuts every message out (a Buffer per row), joins the payloads
 * and frames them again. Here a socket chunk is walked header to header (no per-row
 * allocation) and the runs of whole CopyData messages in it go on as slices of it; only a
 * chunk that starts inside a message is joined to that message's start. That halves pgsub's CPU per copied byte
 * (see README, "Benchmarks").
 *
 * `CopyOutRelay` is a pg submittable like pg-copy-streams' copy-to: it takes the source
 * connection's socket from pg for the duration of the COPY and gives it back, with
 * whatever follows CopyDone (CommandComplete, ReadyForQuery) or an ErrorResponse, to pg's
 * own parser. `rawCopyIn` is pg-copy-streams' copy-from writing chunks without framing
 * them, since they are framed already. Output chunks always end at a message boundary, so
 * a CopyFail sent by an aborted pipeline never lands inside a message.
 */
import { Readable } from 'node:stream';
import type { Writable } from 'node:stream';
import copyStreams from 'pg-copy-streams';

const COPY_DATA = 0x64; // 'd'
const COPY_DONE = 0x63; // 'c'
const ERROR_RESPONSE = 0x45; // 'E'
const HEADER = 5;

/** The slice of pg's Connection this relay uses. */
interface PgConnection {
  stream: NodeJS.ReadableStream & { read(): Buffer | null; listeners(e: 'data'): ((chunk: Buffer) => void)[] };
  query(text: string): void;
}

export class CopyOutRelay extends Readable {
  /** CopyData messages seen: rows, plus binary format's header and trailer. */
  messages = 0;
  bytes = 0;
  private connection: PgConnection | null = null;
  private pgDataHandler: ((chunk: Buffer) => void) | null = null;
  /** The start of a message the last chunk ended inside of. */
  private carry: Buffer | null = null;
  private wanted = false;
  private forwarding = false;
  private done = false;
  private discarding = false;
  private readonly onReadable = () => this.forward();

  constructor(
    private readonly text: string,
    private readonly onMessages: (messages: number, bytes: number) => void = () => {},
  ) {
    super({ highWaterMark: 256 * 1024 });
  }

  /** Called by pg when this query's turn comes. */
  submit(connection: PgConnection): void {
    this.connection = connection;
    const stream = connection.stream;
    const handlers = stream.listeners('data');
    if (handlers.length !== 1) throw new Error(`COPY relay: expected pg's one data listener on the socket, found ${handlers.length}`);
    this.pgDataHandler = handlers[0]!;
    stream.removeListener('data', this.pgDataHandler);
    stream.pause();
    stream.on('readable', this.onReadable);
    connection.query(this.text);
  }

  override _read(): void {
    this.wanted = true;
    this.forward();
  }

  /** Aborted (the target failed): keep reading to CopyDone so the connection stays usable. */
  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.discarding = true;
    this.forward();
    callback(err);
  }

  private forward(): void {
    if (this.forwarding || !this.connection || this.done) return;
    this.forwarding = true;
    let chunk: Buffer | null;
    while ((this.wanted || this.discarding) && !this.done && (chunk = this.connection.stream.read() as Buffer | null) !== null) this.wanted = this.walk(chunk);
    this.forwarding = false;
  }

  /** Push the whole CopyData messages of `chunk` on; returns whether more is wanted. */
  private walk(chunk: Buffer): boolean {
    let buf = chunk;
    let messages = 0;
    let pushed = 0;
    let more = true;
    const carry = this.carry;
    this.carry = null;
    if (carry !== null && carry.length >= HEADER && carry[0] === COPY_DATA) {
      // A chunk that starts inside a row: that row alone is joined to its start, not the
      // whole chunk (nearly every read ends inside a row).
      const missing = 1 + carry.readUInt32BE(1) - carry.length;
      if (chunk.length < missing) {
        this.carry = Buffer.concat([carry, chunk]);
        return true;
      }
      const row = Buffer.concat([carry, chunk.subarray(0, missing)]);
      messages++;
      if (!this.discarding) {
        pushed += row.length;
        more = this.push(row);
      }
      buf = chunk.subarray(missing);
    } else if (carry !== null) {
      // A header cut short, or a message that is not a row: joined with the whole chunk (rare).
      buf = Buffer.concat([carry, chunk]);
    }
    let pos = 0;
    let runStart = 0;
    // Pushes the run of rows before `end`, once: a message cut at the chunk's end that is
    // not a row (a NoticeResponse) stops the walk after this, and the tail flushes again.
    const flush = (end: number) => {
      if (end > runStart && !this.discarding) {
        pushed += end - runStart;
        more = this.push(buf.subarray(runStart, end));
      }
      runStart = end;
    };
    let finished = false;
    while (pos + HEADER <= buf.length) {
      const code = buf[pos]!;
      const end = pos + 1 + buf.readUInt32BE(pos + 1);
      if (code === COPY_DATA) {
        if (end > buf.length) break;
        messages++;
        pos = end;
        continue;
      }
      flush(pos);
      if (code === ERROR_RESPONSE || code === COPY_DONE) {
        finished = true;
        break;
      }
      // CopyOutResponse, or a NoticeResponse / ParameterStatus between rows: not forwarded.
      if (end > buf.length) break;
      pos = end;
      runStart = pos;
    }
    if (!finished) flush(pos);
    this.messages += messages;
    this.bytes += pushed;
    this.onMessages(messages, pushed);
    if (finished) {
      // pg's parser takes it from here: the error, or CopyDone (ignored by pg),
      // CommandComplete and ReadyForQuery.
      this.handBack(buf.subarray(pos));
      if (buf[pos] === COPY_DONE && !this.discarding) this.push(null);
      return false;
    }
    if (pos < buf.length) this.carry = Buffer.from(buf.subarray(pos));
    return more;
  }

  /** Give the socket back to pg, with the bytes from CopyDone or the ErrorResponse on. */
  private handBack(rest: Buffer): void {
    this.done = true;
    const stream = this.connection!.stream;
    stream.removeListener('readable', this.onReadable);
    const handler = this.pgDataHandler!;
    stream.on('data', handler);
    handler(rest);
    // As pg-copy-streams: resume on the next tick, after pg's handler has run.
    process.nextTick(() => stream.resume());
  }

  /* The rest of pg's submittable interface. */
  handleError(err: Error): void {
    // Once the pipeline is gone (aborted by the target side) nobody listens for 'error'
    // any more: an error then (the source connection dropped while draining) is not thrown.
    if (!this.destroyed) this.destroy(err);
  }
  handleCommandComplete(): void {}
  handleReadyForQuery(): void {}
}

/**
 * pg-copy-streams' copy-from, for chunks that are CopyData messages already. `accepted`
 * resolves when the server has started the COPY (CopyInResponse) and rejects if it
 * refused it instead; the connection is then ready for the next query.
 */
export function rawCopyIn(text: string): Writable & { rowCount?: number; accepted: Promise<void> } {
  const writer = copyStreams.from(text, { highWaterMark: 256 * 1024 }) as unknown as Writable & {
    connection: { stream: { write(b: Buffer): boolean } } | null;
    flushChunk(b: Buffer): boolean;
    handleCopyInResponse(connection: unknown): void;
    rowCount?: number;
    accepted: Promise<void>;
  };
  writer.flushChunk = (chunk: Buffer) => writer.connection!.stream.write(chunk);
  const handleCopyInResponse = writer.handleCopyInResponse.bind(writer);
  writer.accepted = new Promise<void>((resolve, reject) => {
    writer.handleCopyInResponse = (connection) => {
      resolve();
      handleCopyInResponse(connection);
    };
    writer.once('error', reject);
  });
  // Awaited by the caller; an error after the start goes to the pipeline.
  writer.accepted.catch(() => {});
  return writer;
}
