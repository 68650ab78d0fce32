/**
 * Bounds-checked big-endian reader over one message's bytes.
 *
 * Owns: turning "not enough bytes" and "bytes left over" into typed ProtocolErrors that name
 * the field being read and the byte offset, so a bad message from the publisher is reported as
 * `PGSUB_PROTOCOL_TRUNCATED` / `PGSUB_PROTOCOL_TRAILING_BYTES` and never as a RangeError from
 * Buffer or a silently short value.
 *
 * Invariants:
 *  - every read checks the remaining length *before* touching the buffer;
 *  - `bytes()` returns a view (no copy); callers that keep the value past the lifetime of the
 *    input buffer must copy (the decoder does, see decoder.ts);
 *  - `need(count, each, what)` lets callers validate an untrusted element count against the
 *    bytes actually left before they loop or allocate, so a forged count fails in O(1).
 *
 * The pgoutput decoder (decoder.ts) and CopyBoth framing (framing.ts) are the only users; nothing
 * above them sees byte offsets.
 */
import { ProtocolError } from '../errors.js';
import type { Lsn } from './lsn.js';

export class Reader {
  #pos: number;
  readonly #buf: Buffer;
  readonly #end: number;

  constructor(buf: Buffer, start = 0) {
    this.#buf = buf;
    this.#pos = start;
    this.#end = buf.length;
  }

  /** Current byte offset (from the start of the buffer). */
  get offset(): number {
    return this.#pos;
  }

  /** Bytes not yet read. */
  remaining(): number {
    return this.#end - this.#pos;
  }

  #truncated(n: number, what: string): never {
    throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `${what}: need ${n} byte(s) at offset ${this.#pos}, only ${this.#end - this.#pos} left`, {
      field: what,
      offset: this.#pos,
    });
  }

  /**
   * Fail unless at least `count * each` bytes remain: for untrusted counts, checked before
   * looping or allocating. `count` must already be known non-negative.
   */
  need(count: number, each: number, what: string): void {
    const n = count * each;
    if (n > this.#end - this.#pos) this.#truncated(n, what);
  }

  u8(what: string): number {
    if (this.#pos >= this.#end) this.#truncated(1, what);
    return this.#buf[this.#pos++]!;
  }

  i16(what: string): number {
    if (this.#pos + 2 > this.#end) this.#truncated(2, what);
    const v = this.#buf.readInt16BE(this.#pos);
    this.#pos += 2;
    return v;
  }

  u16(what: string): number {
    if (this.#pos + 2 > this.#end) this.#truncated(2, what);
    const v = this.#buf.readUInt16BE(this.#pos);
    this.#pos += 2;
    return v;
  }

  i32(what: string): number {
    if (this.#pos + 4 > this.#end) this.#truncated(4, what);
    const v = this.#buf.readInt32BE(this.#pos);
    this.#pos += 4;
    return v;
  }

  u32(what: string): number {
    if (this.#pos + 4 > this.#end) this.#truncated(4, what);
    const v = this.#buf.readUInt32BE(this.#pos);
    this.#pos += 4;
    return v;
  }

  i64(what: string): bigint {
    if (this.#pos + 8 > this.#end) this.#truncated(8, what);
    const v = this.#buf.readBigInt64BE(this.#pos);
    this.#pos += 8;
    return v;
  }

  lsn(what: string): Lsn {
    if (this.#pos + 8 > this.#end) this.#truncated(8, what);
    const v = this.#buf.readBigUInt64BE(this.#pos);
    this.#pos += 8;
    return v as Lsn;
  }

  /** NUL-terminated string, decoded as UTF-8 (invalid sequences become U+FFFD). */
  cstring(what: string): string {
    const start = this.#pos;
    const nul = start < this.#end ? this.#buf.indexOf(0, start) : -1;
    if (nul < 0 || nul >= this.#end) {
      throw new ProtocolError('PGSUB_PROTOCOL_TRUNCATED', `${what}: unterminated string at offset ${start}`, { field: what, offset: start });
    }
    this.#pos = nul + 1;
    return nul === start ? '' : this.#buf.toString('utf8', start, nul);
  }

  /** `n` bytes as UTF-8 text. */
  utf8(n: number, what: string): string {
    if (n > this.#end - this.#pos) this.#truncated(n, what);
    const start = this.#pos;
    this.#pos += n;
    return n === 0 ? '' : this.#buf.toString('utf8', start, this.#pos);
  }

  /** `n` bytes as a view into the underlying buffer (no copy). */
  bytes(n: number, what: string): Buffer {
    if (n > this.#end - this.#pos) this.#truncated(n, what);
    const start = this.#pos;
    this.#pos += n;
    return this.#buf.subarray(start, this.#pos);
  }

  /** `n` bytes copied into a fresh Buffer that does not alias the input. */
  copy(n: number, what: string): Buffer {
    if (n > this.#end - this.#pos) this.#truncated(n, what);
    const out = Buffer.allocUnsafe(n);
    this.#buf.copy(out, 0, this.#pos, this.#pos + n);
    this.#pos += n;
    return out;
  }

  /** The message must be fully consumed: anything left is a protocol violation. */
  end(what: string): void {
    if (this.#pos !== this.#end) {
      throw new ProtocolError('PGSUB_PROTOCOL_TRAILING_BYTES', `${what}: ${this.#end - this.#pos} trailing byte(s) at offset ${this.#pos}`, { field: what, offset: this.#pos });
    }
  }
}
