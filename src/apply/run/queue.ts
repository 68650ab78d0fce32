/**
 * A bounded FIFO between the stream reader and the applier. When it is full the reader
 * stops pulling frames, so back-pressure reaches the replication socket and memory stays
 * bounded however far behind the target is. `close` wakes both sides.
 */
export class BoundedQueue<T> {
  private items: T[] = [];
  private head = 0;
  private closed = false;
  private waitingTake: (() => void) | null = null;
  private waitingPut: (() => void) | null = null;
  private bytes = 0;
  private readonly sizes: number[] = [];

  /** At most `capacity` items and `byteCapacity` bytes (an item larger than that still passes alone). */
  constructor(
    private readonly capacity: number,
    private readonly byteCapacity = Number.POSITIVE_INFINITY,
  ) {}

  get length(): number {
    return this.items.length - this.head;
  }

  get full(): boolean {
    return this.length >= this.capacity || (this.length > 0 && this.bytes >= this.byteCapacity);
  }

  /** Queue at once if there is room (no promise); false when full or closed. */
  tryPut(item: T, size = 0): boolean {
    return !this.full && this.putAlways(item, size);
  }

  /** Queue even when full (a small marker that must not wait behind a waiting put); false if closed. */
  putAlways(item: T, size = 0): boolean {
    if (this.closed) return false;
    this.items.push(item);
    this.sizes.push(size);
    this.bytes += size;
    this.wake('take');
    return true;
  }

  /** The next item if one is queued (no promise), else undefined. */
  takeNow(): T | undefined {
    if (this.length === 0) return undefined;
    return this.#shift();
  }

  /** Resolves once the item is queued; false if the queue was closed. */
  async put(item: T, size = 0): Promise<boolean> {
    while (this.full && !this.closed) await new Promise<void>((resolve) => (this.waitingPut = resolve));
    return this.putAlways(item, size);
  }

  /** Resolves once an item is queued or the queue is closed (nothing taken). */
  ready(): Promise<void> {
    if (this.length > 0 || this.closed) return Promise.resolve();
    return new Promise<void>((resolve) => (this.waitingTake = resolve));
  }

  /** The next item, or undefined once closed. */
  async take(): Promise<T | undefined> {
    while (this.length === 0 && !this.closed) await new Promise<void>((resolve) => (this.waitingTake = resolve));
    if (this.length === 0) return undefined;
    return this.#shift();
  }

  #shift(): T {
    const item = this.items[this.head]!;
    this.bytes -= this.sizes[this.head]!;
    this.items[this.head++] = undefined as T;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.sizes.splice(0, this.head);
      this.head = 0;
    }
    this.wake('put');
    return item;
  }

  close(): void {
    this.closed = true;
    this.wake('take');
    this.wake('put');
  }

  private wake(side: 'take' | 'put'): void {
    const fn = side === 'take' ? this.waitingTake : this.waitingPut;
    if (side === 'take') this.waitingTake = null;
    else this.waitingPut = null;
    fn?.();
  }
}
