/**
 * The streamed-transaction spool (worker.c's stream_open_file / subxact files): while the
 * publisher streams an in-progress transaction (streaming = on), its messages are
 * appended to one file per transaction, `<subscription>-<xid>.changes`, as records
 * `[u32 length][pgoutput message bytes]`. Subtransactions are remembered by the offset
 * of their first record, so STREAM ABORT of a subtransaction truncates exactly its
 * changes (and those of later subtransactions, which it contains); STREAM ABORT of the
 * whole transaction deletes the file; STREAM COMMIT replays the records in order.
 * Memory stays bounded: records go to disk through one write buffer per file (each
 * message copied into it once, no allocation per message) and come back through a
 * bounded read stream. With streaming = parallel the eager connection also reads the
 * file while it grows (readFrom, up to what has been written). Files left by a crash are
 * removed at startup — the publisher streams every uncommitted transaction again from its
 * first change. A full
 * file system (ENOSPC, EDQUOT) is a SpoolFullError naming the directory: the session ends,
 * closes (deletes) its files and retries with backoff.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ProtocolError, SpoolFullError } from '../../errors.js';

const WRITE_BUFFER_BYTES = 256 * 1024;
/** How much parallel apply's read-ahead reads at a time (readFrom). */
const READ_AHEAD_BYTES = 256 * 1024;

interface SpoolFile {
  path: string;
  fd: number;
  /** Bytes in the file plus bytes buffered. */
  size: number;
  /** Bytes in the file: where the next flush writes (positional, since truncation moves it back). */
  written: number;
  /** Records not yet written: buffer[0, bufferedBytes). */
  buffer: Buffer;
  bufferedBytes: number;
  /** Subtransaction xid → offset of its first record, in first-seen order. */
  subxacts: Map<number, number>;
}

/** The first `length` bytes of `data` at file offset `position`. */
function writeAll(fd: number, data: Buffer, length: number, position: number): void {
  let at = 0;
  while (at < length) at += fs.writeSync(fd, data, at, length - at, position + at);
}

function isOutOfSpace(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return code === 'ENOSPC' || code === 'EDQUOT';
}

export class StreamSpool {
  private readonly files = new Map<number, SpoolFile>();

  constructor(
    private readonly dir: string,
    private readonly subscription: string,
  ) {}

  /** Create the directory and remove this subscription's files from a previous run. */
  prepare(): number {
    fs.mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    let removed = 0;
    for (const name of fs.readdirSync(this.dir)) {
      if (name.startsWith(`${this.subscription}-`) && name.endsWith('.changes')) {
        fs.rmSync(path.join(this.dir, name), { force: true });
        removed++;
      }
    }
    return removed;
  }

  private fileFor(xid: number, what: string): SpoolFile {
    const f = this.files.get(xid);
    if (!f) throw new ProtocolError('PGSUB_PROTOCOL_OUT_OF_ORDER', `${what} for streamed transaction ${xid}, which has no open spool file`, { remoteXid: xid });
    return f;
  }

  /** STREAM START: a new file for the first segment, the existing one for later segments. */
  start(xid: number, firstSegment: boolean): void {
    if (!firstSegment) {
      this.fileFor(xid, 'STREAM START of a later segment');
      return;
    }
    this.discard(xid);
    const file = path.join(this.dir, `${this.subscription}-${xid}.changes`);
    let fd: number;
    try {
      // Read as well as written: parallel apply reads it behind the receiver (readFrom).
      fd = fs.openSync(file, 'w+', 0o600);
    } catch (err) {
      throw isOutOfSpace(err) ? new SpoolFullError(this.dir, xid, 0, err) : err;
    }
    this.files.set(xid, {
      path: file,
      fd,
      size: 0,
      written: 0,
      buffer: Buffer.allocUnsafe(WRITE_BUFFER_BYTES),
      bufferedBytes: 0,
      subxacts: new Map(),
    });
  }

  /**
   * Append one message of transaction `xid`, made by (sub)transaction `subXid`. True when
   * records reached the file (what readFrom can see grew).
   */
  append(xid: number, subXid: number, message: Buffer): boolean {
    const f = this.fileFor(xid, 'a streamed change');
    if (subXid !== xid && !f.subxacts.has(subXid)) f.subxacts.set(subXid, f.size);
    const length = 4 + message.length;
    const flushing = f.bufferedBytes + length > f.buffer.length;
    if (flushing) this.flush(f, xid);
    f.size += length;
    if (length > f.buffer.length) {
      // Larger than the buffer: written on its own, right away.
      const header = Buffer.allocUnsafe(4);
      header.writeUInt32BE(message.length, 0);
      this.write(f, xid, header, 4, f.written);
      this.write(f, xid, message, message.length, f.written + 4);
      f.written += length;
      return true;
    }
    // Copied: the message may be a view into a frame buffer that is reused.
    f.buffer.writeUInt32BE(message.length, f.bufferedBytes);
    message.copy(f.buffer, f.bufferedBytes + 4);
    f.bufferedBytes += length;
    return flushing;
  }

  /**
   * Whole records of `xid` from file offset `from` on, as far as they reached the file,
   * about READ_AHEAD_BYTES at a time (a longer record whole): parallel apply's read-ahead
   * (run/parallel.ts). `next` is the offset after the last record returned. Read
   * synchronously: the pages were just written and sit in the page cache. Each read gets a
   * buffer of its own: decoded binary values are views into it (decoder.ts) and live until
   * their batch is sent, after the next read.
   */
  readFrom(xid: number, from: number): { records: Buffer[]; next: number } {
    const f = this.fileFor(xid, 'a read-ahead');
    const available = f.written - from;
    if (available < 4) return { records: [], next: from };
    let buf = Buffer.allocUnsafe(Math.min(available, READ_AHEAD_BYTES));
    this.readAll(f, buf, from);
    const first = buf.readUInt32BE(0);
    if (4 + first > buf.length) {
      // One record longer than a read: read whole, if all of it is written.
      if (4 + first > available) return { records: [], next: from };
      buf = Buffer.allocUnsafe(4 + first);
      this.readAll(f, buf, from);
    }
    const records: Buffer[] = [];
    let pos = 0;
    while (buf.length - pos >= 4) {
      const len = buf.readUInt32BE(pos);
      if (buf.length - pos - 4 < len) break;
      records.push(buf.subarray(pos + 4, pos + 4 + len));
      pos += 4 + len;
    }
    return { records, next: from + pos };
  }

  /** Bytes of `xid`'s records in the file (what readFrom can reach); 0 without a file. */
  writtenOf(xid: number): number {
    return this.files.get(xid)?.written ?? 0;
  }

  /** Where STREAM ABORT of `subXid` will cut `xid`'s file (undefined: it has no record there). */
  abortOffset(xid: number, subXid: number): number | undefined {
    return this.files.get(xid)?.subxacts.get(subXid);
  }

  private readAll(f: SpoolFile, into: Buffer, position: number): void {
    let at = 0;
    while (at < into.length) {
      const n = fs.readSync(f.fd, into, at, into.length - at, position + at);
      if (n === 0) throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `spool file ${f.path} ends before ${position + into.length}`);
      at += n;
    }
  }

  private write(f: SpoolFile, xid: number, data: Buffer, length: number, position: number): void {
    try {
      writeAll(f.fd, data, length, position);
    } catch (err) {
      throw isOutOfSpace(err) ? new SpoolFullError(this.dir, xid, f.written, err) : err;
    }
  }

  private flush(f: SpoolFile, xid: number): void {
    this.write(f, xid, f.buffer, f.bufferedBytes, f.written);
    f.written += f.bufferedBytes;
    f.bufferedBytes = 0;
  }

  /** STREAM STOP: the segment is complete; its records reach the file (readFrom sees them). */
  stop(xid: number): void {
    this.flush(this.fileFor(xid, 'STREAM STOP'), xid);
  }

  /** STREAM ABORT: the whole transaction, or one subtransaction and those after it. */
  abort(xid: number, subXid: number): void {
    if (subXid === xid) {
      this.discard(xid);
      return;
    }
    const f = this.files.get(xid);
    const offset = f?.subxacts.get(subXid);
    // A subtransaction with no change in the stream: nothing to take back.
    if (!f || offset === undefined) return;
    this.flush(f, xid);
    fs.ftruncateSync(f.fd, offset);
    f.size = offset;
    f.written = offset;
    for (const [sub, at] of f.subxacts) if (at >= offset) f.subxacts.delete(sub);
  }

  /**
   * STREAM COMMIT: the records in order, read back through a bounded stream, as many at a
   * time as one read brings (about 1 MB): one await per read, not per record. A record
   * split between two reads is put together from its two parts alone.
   */
  async *replay(xid: number): AsyncGenerator<Buffer[]> {
    const f = this.fileFor(xid, 'STREAM COMMIT');
    this.flush(f, xid);
    let pending: Buffer | null = null;
    for await (const chunk of fs.createReadStream(f.path, { highWaterMark: 1 << 20, start: 0, end: Math.max(f.size - 1, 0) })) {
      const buf = chunk as Buffer;
      const records: Buffer[] = [];
      let pos = 0;
      if (pending !== null) {
        // The header first (it may be split too), then the rest of that one record.
        let head: Buffer = pending;
        if (head.length < 4) {
          pos = Math.min(4 - head.length, buf.length);
          head = Buffer.concat([head, buf.subarray(0, pos)]);
        }
        if (head.length >= 4) {
          const take = Math.min(4 + head.readUInt32BE(0) - head.length, buf.length - pos);
          head = Buffer.concat([head, buf.subarray(pos, pos + take)]);
          pos += take;
        }
        if (head.length < 4 || head.length < 4 + head.readUInt32BE(0)) {
          pending = head;
          continue;
        }
        records.push(head.subarray(4));
        pending = null;
      }
      while (buf.length - pos >= 4) {
        const len = buf.readUInt32BE(pos);
        if (buf.length - pos - 4 < len) break;
        records.push(buf.subarray(pos + 4, pos + 4 + len));
        pos += 4 + len;
      }
      if (pos < buf.length) pending = buf.subarray(pos);
      if (records.length > 0) yield records;
    }
    if (pending !== null && f.size > 0) throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `spool file ${f.path} ends inside a record`);
  }

  /** Close and delete a transaction's file. */
  discard(xid: number): void {
    const f = this.files.get(xid);
    if (!f) return;
    this.files.delete(xid);
    fs.closeSync(f.fd);
    fs.rmSync(f.path, { force: true });
  }

  /** Bytes spooled and not yet applied or discarded (for status and metrics). */
  get bytes(): number {
    let n = 0;
    for (const f of this.files.values()) n += f.size;
    return n;
  }

  close(): void {
    for (const xid of [...this.files.keys()]) this.discard(xid);
  }
}
