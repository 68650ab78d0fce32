/**
 * Small pure pieces of the wire executor (wire.ts): CommandComplete tags, the
 * server_version number, and the FIFO of outstanding protocol operations.
 */

/** FIFO with O(1) shift; compacts occasionally. */
export class Fifo<T> {
  #items: (T | undefined)[] = [];
  #head = 0;
  get length(): number { return this.#items.length - this.#head; }
  push(item: T): void { this.#items.push(item); }
  peek(): T | undefined { return this.#items[this.#head]; }
  at(i: number): T | undefined { return this.#items[this.#head + i]; }
  shift(): T | undefined {
    const item = this.#items[this.#head];
    if (item === undefined) return undefined;
    this.#items[this.#head++] = undefined;
    if (this.#head === this.#items.length) { this.#items.length = 0; this.#head = 0; }
    else if (this.#head >= 4096 && this.#head * 2 >= this.#items.length) { this.#items.splice(0, this.#head); this.#head = 0; }
    return item;
  }
  takeAll(): T[] { const all = this.#items.slice(this.#head) as T[]; this.#items = []; this.#head = 0; return all; }
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
      if (c < 48 || c > 57) { digits = false; break; }
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
