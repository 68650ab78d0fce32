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

  constructor(private readonly capacity: number) {}

  get length(): number {
    return this.items.length - this.head;
  }

  get full(): boolean {
    return this.length >= this.capacity;
  }

  /** Resolves once the item is queued; false if the queue was closed. */
  async put(item: T): Promise<boolean> {
    while (this.full && !this.closed) await new Promise<void>((resolve) => (this.waitingPut = resolve));
    if (this.closed) return false;
    this.items.push(item);
    this.wake('take');
    return true;
  }

  /** The next item, or undefined once closed. */
  async take(): Promise<T | undefined> {
    while (this.length === 0 && !this.closed) await new Promise<void>((resolve) => (this.waitingTake = resolve));
    if (this.length === 0) return undefined;
    const item = this.items[this.head]!;
    this.items[this.head++] = undefined as T;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
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
