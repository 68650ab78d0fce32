/**
 * The bound on statements in flight on one pipelined connection (wire.ts), and where
 * their failures surface: oldest first, in send order.
 */
/**
 * A window of statements in flight. `push` never lets more than `limit` statements, or
 * more than `byteLimit` bytes of their values, be outstanding: past that it waits for the
 * oldest, which is also where errors surface, oldest first, so the root cause (not
 * "current transaction is aborted") is what gets reported. Bytes matter for wide rows:
 * a count alone would let a thousand 1 MB values pile up in the socket buffer.
 */
export class Pipeline {
  private readonly inFlight: { promise: Promise<unknown>; bytes: number; weight: number }[] = [];
  private head = 0;
  private bytes = 0;
  /** Statements in flight, a multi-row one counting once per row: the limit bounds rows. */
  private weight = 0;

  constructor(
    private readonly limit: number,
    private readonly byteLimit = 16 * 1024 * 1024,
  ) {}

  /** Undefined (no promise) while the window has room: most statements never wait. */
  push<T>(promise: Promise<T>, bytes = 0, weight = 1): Promise<void> | undefined {
    // Rejections are observed when drained; this keeps Node from flagging them early.
    promise.catch(() => {});
    this.inFlight.push({ promise, bytes, weight });
    this.bytes += bytes;
    this.weight += weight;
    if (this.#over()) return this.#makeRoom();
    this.#compact();
    return undefined;
  }

  #over(): boolean {
    return this.size > 1 && (this.weight > this.limit || this.bytes > this.byteLimit);
  }

  async #makeRoom(): Promise<void> {
    while (this.#over()) await this.takeOldest();
    this.#compact();
  }

  #compact(): void {
    if (this.head > 4096) {
      this.inFlight.splice(0, this.head);
      this.head = 0;
    }
  }

  private async takeOldest(): Promise<void> {
    const oldest = this.inFlight[this.head++]!;
    this.bytes -= oldest.bytes;
    this.weight -= oldest.weight;
    await oldest.promise;
  }

  get size(): number {
    return this.inFlight.length - this.head;
  }

  /** Wait for everything sent; throw the first failure in send order. */
  async drain(): Promise<void> {
    try {
      while (this.head < this.inFlight.length) await this.takeOldest();
    } finally {
      this.reset();
    }
  }

  /** Wait until everything sent has its answer, failures included, then forget it (after a failure: which commits went through). */
  async settle(): Promise<void> {
    const pending = this.inFlight.slice(this.head).map((e) => e.promise);
    this.reset();
    await Promise.allSettled(pending);
  }

  /** Forget outstanding statements after a failure; their rejections stay observed. */
  reset(): void {
    this.inFlight.length = 0;
    this.head = 0;
    this.bytes = 0;
    this.weight = 0;
  }
}
