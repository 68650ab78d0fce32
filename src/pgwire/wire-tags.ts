/**
 * Small pure pieces of the wire executor (wire.ts, wire-responses.ts): CommandComplete
 * tags, the server_version number, the FIFO of outstanding protocol operations, and the
 * CopyData/CopyDone frames of a COPY FROM STDIN (pg's Connection copies every CopyData
 * payload into a fresh buffer; these frames reference the payload instead).
 */

/** FIFO with O(1) shift; compacts occasionally. */
export class Fifo<T> {
  #items: (T | undefined)[] = [];
  #head = 0;
  get length(): number {
    return this.#items.length - this.#head;
  }
  push(item: T): void {
    this.#items.push(item);
  }
  peek(): T | undefined {
    return this.#items[this.#head];
  }
  at(i: number): T | undefined {
    return this.#items[this.#head + i];
  }
  shift(): T | undefined {
    const item = this.#items[this.#head];
    if (item === undefined) return undefined;
    this.#items[this.#head++] = undefined;
    if (this.#head === this.#items.length) {
      this.#items.length = 0;
      this.#head = 0;
    } else if (this.#head >= 4096 && this.#head * 2 >= this.#items.length) {
      this.#items.splice(0, this.#head);
      this.#head = 0;
    }
    return item;
  }
  takeAll(): T[] {
    const all = this.#items.slice(this.#head) as T[];
    this.#items = [];
    this.#head = 0;
    return all;
  }
}

/** CommandComplete tag without its trailing counts: "INSERT 0 1" → "INSERT". */
export function tagCommand(tag: string): string {
  let end = tag.length;
  for (;;) {
    const sp = tag.lastIndexOf(' ', end - 1);
    if (sp < 0 || sp + 1 === end) break;
    let digits = true;
    for (let i = sp + 1; i < end; i++) {
      const c = tag.charCodeAt(i);
      if (c < 48 || c > 57) {
        digits = false;
        break;
      }
    }
    if (!digits) break;
    end = sp;
  }
  return end === tag.length ? tag : tag.slice(0, end);
}

/** The row count a CommandComplete tag carries (its last number), 0 when it has none. */
export function tagRowCount(tag: string): number {
  const sp = tag.lastIndexOf(' ');
  if (sp < 0) return 0;
  const n = Number(tag.slice(sp + 1));
  return Number.isInteger(n) ? n : 0;
}

/** server_version "18.4" → 180004, "9.6.24" → 90624, "17beta1" → 170000. */
export function parseServerVersion(version: string): number {
  const m = /^(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(version);
  if (!m) return 0;
  const major = Number(m[1]);
  const minor = Number(m[2] ?? 0);
  return major >= 10 ? major * 10000 + minor : major * 10000 + minor * 100 + Number(m[3] ?? 0);
}

/** Largest CopyData payload sent as one message: the server holds a whole message in memory. */
export const COPY_CHUNK_BYTES = 256 * 1024;
/** Up to this much data goes out as one buffer (frames and payload copied together). */
const COPY_COALESCE_BYTES = 64 * 1024;
const COPY_DATA = 0x64; // 'd'
const COPY_DONE = 0x63; // 'c'

/**
 * The wire bytes of `data` as CopyData messages followed by CopyDone, in write order.
 * Small inputs become one buffer; large ones alternate 5-byte headers with subarrays of
 * the caller's buffers (no payload copy), each message at most `chunk` bytes of payload.
 * Message boundaries carry no meaning in COPY: a row may span messages.
 */
export function copyFrames(data: readonly Buffer[], chunk = COPY_CHUNK_BYTES): Buffer[] {
  let total = 0;
  let messages = 0;
  for (const d of data) {
    total += d.length;
    messages += Math.ceil(d.length / chunk);
  }
  if (total <= COPY_COALESCE_BYTES) {
    const parts = data.filter((d) => d.length > 0);
    const out = Buffer.allocUnsafe(5 * parts.length + total + 5);
    let at = 0;
    for (const d of parts) {
      out[at] = COPY_DATA;
      out.writeInt32BE(d.length + 4, at + 1);
      at += 5 + d.copy(out, at + 5);
    }
    out[at] = COPY_DONE;
    out.writeInt32BE(4, at + 1);
    return [out];
  }
  const headers = Buffer.allocUnsafe(5 * messages + 5);
  const out: Buffer[] = [];
  let h = 0;
  for (const d of data) {
    for (let from = 0; from < d.length; from += chunk) {
      const piece = d.subarray(from, Math.min(d.length, from + chunk));
      headers[h] = COPY_DATA;
      headers.writeInt32BE(piece.length + 4, h + 1);
      out.push(headers.subarray(h, h + 5), piece);
      h += 5;
    }
  }
  headers[h] = COPY_DONE;
  headers.writeInt32BE(4, h + 1);
  out.push(headers.subarray(h, h + 5));
  return out;
}
