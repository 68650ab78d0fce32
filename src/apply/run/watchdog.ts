/**
 * The lock watchdog that apply lanes and parallel apply share: a wait that crosses pgsub
 * (one backend waits for a lock another holds, while that one waits for its turn in
 * pgsub) is invisible to PostgreSQL's deadlock detector, so a timer asks
 * pg_blocking_pids on a connection of its own, always idle, and the driver breaks the
 * knot. One check runs at a time; a failed query is logged and tried at the next tick.
 */
import type { Logger } from '../../log.js';
import { runAlone, type WireConnection } from '../../pgwire/connect.js';

const pidArray = (pids: readonly number[]) => `{${pids.join(',')}}`;

export class LockWatch {
  #conn: WireConnection | null = null;
  #timer: NodeJS.Timeout | null = null;
  #checking = false;

  constructor(
    private readonly open: () => Promise<WireConnection>,
    private readonly log: Logger,
    /** Who watches, for the log ("apply lane", "parallel apply"). */
    private readonly what: string,
  ) {}

  /** Run `check` every `intervalMs` until stop() (a no-op while it runs already). */
  start(intervalMs: number, check: () => Promise<void>): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => void this.#tick(check), intervalMs);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  async close(): Promise<void> {
    this.stop();
    await this.#conn?.close().catch(() => {});
    this.#conn = null;
  }

  /** Whether one of `waiters` waits for a lock that one of `holders` holds. */
  async blocks(holders: readonly number[], waiters: readonly number[]): Promise<boolean> {
    const [result] = await runAlone(await this.#connection(), [
      {
        text: `SELECT EXISTS (SELECT FROM pg_catalog.unnest($1::pg_catalog.int4[]) AS w WHERE pg_catalog.pg_blocking_pids(w) && $2::pg_catalog.int4[])`,
        params: [pidArray(waiters), pidArray(holders)],
        wantRows: true,
      },
    ]);
    return result?.rows[0]?.[0] === 't';
  }

  /** Whether backend `pid` waits for a lock (of anyone: another client's too). */
  async waitsOnLock(pid: number): Promise<boolean> {
    const [result] = await runAlone(await this.#connection(), [
      { text: `SELECT wait_event_type = 'Lock' FROM pg_catalog.pg_stat_activity WHERE pid = $1::pg_catalog.int4`, params: [String(pid)], wantRows: true },
    ]);
    return result?.rows[0]?.[0] === 't';
  }

  /** End backend `pid` (its open transaction rolls back). */
  async terminate(pid: number): Promise<void> {
    await runAlone(await this.#connection(), [{ text: 'SELECT pg_catalog.pg_terminate_backend($1::pg_catalog.int4)', params: [String(pid)] }]);
  }

  async #connection(): Promise<WireConnection> {
    this.#conn ??= await this.open();
    return this.#conn;
  }

  async #tick(check: () => Promise<void>): Promise<void> {
    if (this.#checking) return;
    this.#checking = true;
    try {
      await check();
    } catch (err) {
      this.log.warn({ err }, `${this.what} watchdog query failed`);
    } finally {
      this.#checking = false;
    }
  }
}
