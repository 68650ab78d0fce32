/**
 * The streamed-transaction spool (worker.c's stream_open_file / subxact files): while the
 * publisher streams an in-progress transaction (streaming = on), its messages are
 * appended to one file per transaction, `<subscription>-<xid>.changes`, as records
 * `[u32 length][pgoutput message bytes]`. Subtransactions are remembered by the offset
 * of their first record, so STREAM ABORT of a subtransaction truncates exactly its
 * changes (and those of later subtransactions, which it contains); STREAM ABORT of the
 * whole transaction deletes the file; STREAM COMMIT replays the records in order.
 * Memory stays bounded: records go to disk through a small write buffer and come back
 * through a bounded read stream. Files left by a crash are removed at startup — the
 * publisher streams every uncommitted transaction again from its first change.
 */
import fs from 'node:fs';
import path from 'node:path';
import { ProtocolError } from '../errors.js';

const WRITE_BUFFER_BYTES = 256 * 1024;

interface SpoolFile {
  path: string;
  fd: number;
  /** Bytes in the file plus bytes buffered. */
  size: number;
  /** Bytes in the file: where the next flush writes (positional, since truncation moves it back). */
  written: number;
  buffered: Buffer[];
  bufferedBytes: number;
  /** Subtransaction xid → offset of its first record, in first-seen order. */
  subxacts: Map<number, number>;
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
    this.files.set(xid, { path: file, fd: fs.openSync(file, 'w', 0o600), size: 0, written: 0, buffered: [], bufferedBytes: 0, subxacts: new Map() });
  }

  /** Append one message of transaction `xid`, made by (sub)transaction `subXid`. */
  append(xid: number, subXid: number, message: Buffer): void {
    const f = this.fileFor(xid, 'a streamed change');
    if (subXid !== xid && !f.subxacts.has(subXid)) f.subxacts.set(subXid, f.size);
    const header = Buffer.allocUnsafe(4);
    header.writeUInt32BE(message.length, 0);
    // Copy: the message may be a view into a frame buffer that is reused.
    f.buffered.push(header, Buffer.from(message));
    f.bufferedBytes += 4 + message.length;
    f.size += 4 + message.length;
    if (f.bufferedBytes >= WRITE_BUFFER_BYTES) this.flush(f);
  }

  private flush(f: SpoolFile): void {
    if (f.bufferedBytes === 0) return;
    fs.writeSync(f.fd, Buffer.concat(f.buffered, f.bufferedBytes), 0, f.bufferedBytes, f.written);
    f.written += f.bufferedBytes;
    f.buffered = [];
    f.bufferedBytes = 0;
  }

  /** STREAM STOP: the segment is complete; its records reach the file. */
  stop(xid: number): void {
    this.flush(this.fileFor(xid, 'STREAM STOP'));
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
    this.flush(f);
    fs.ftruncateSync(f.fd, offset);
    f.size = offset;
    f.written = offset;
    for (const [sub, at] of f.subxacts) if (at >= offset) f.subxacts.delete(sub);
  }

  /** STREAM COMMIT: the records in order, read back through a bounded stream. */
  async *replay(xid: number): AsyncGenerator<Buffer> {
    const f = this.fileFor(xid, 'STREAM COMMIT');
    this.flush(f);
    let pending: Buffer = Buffer.alloc(0);
    for await (const chunk of fs.createReadStream(f.path, { highWaterMark: 1 << 20, start: 0, end: Math.max(f.size - 1, 0) })) {
      pending = pending.length === 0 ? (chunk as Buffer) : Buffer.concat([pending, chunk as Buffer]);
      let pos = 0;
      while (pending.length - pos >= 4) {
        const len = pending.readUInt32BE(pos);
        if (pending.length - pos - 4 < len) break;
        yield pending.subarray(pos + 4, pos + 4 + len);
        pos += 4 + len;
      }
      pending = pending.subarray(pos);
    }
    if (pending.length > 0 && f.size > 0) throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `spool file ${f.path} ends inside a record`);
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
