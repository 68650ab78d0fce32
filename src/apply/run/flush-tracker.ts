/**
 * synchronous_commit = off (lsn_mapping's other half in worker.c): apply transactions
 * commit asynchronously, and this idle second connection asks how far the target's WAL is
 * flushed, so feedback confirms only what is on disk (origin/positions.ts). The target's
 * walwriter flushes asynchronous commits within wal_writer_delay; when the applier is idle,
 * waiting for it only delays the confirmation (up to 200 ms by default, a good part of a
 * short catch-up), so then a synchronous commit flushes every asynchronous one before it
 * (origin/store.ts flushBarrierStatements).
 */
import { parseLsn } from '../../protocol/lsn.js';
import type { Progress } from '../../origin/positions.js';
import { flushBarrierStatements } from '../../origin/store.js';
import { runAlone, type WireConnection } from '../../pgwire/connect.js';

const POLL_MS = 50;
const FLUSH_QUERY = { text: 'SELECT pg_catalog.pg_current_wal_flush_lsn()::text', params: [], wantRows: true };

export class FlushTracker {
  #running = false;
  #timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly conn: WireConnection,
    private readonly subscription: string,
    private readonly progress: Progress,
    private readonly hooks: {
      /** The applier has nothing under way and nothing queued. */
      idle(): boolean;
      live(): boolean;
      onDurable(): void;
      onError(err: unknown): void;
    },
  ) {}

  start(): void {
    this.#timer = setInterval(() => this.#poll(), POLL_MS);
    this.#timer.unref();
  }

  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
  }

  #poll(): void {
    if (this.#running || !this.progress.hasUnflushed || !this.hooks.live()) return;
    this.#running = true;
    const statements = this.hooks.idle() ? [...flushBarrierStatements(this.subscription), FLUSH_QUERY] : [FLUSH_QUERY];
    runAlone(this.conn, statements)
      .then((results) => {
        if (this.progress.noteTargetFlush(parseLsn(String(results[results.length - 1]?.rows[0]?.[0])))) this.hooks.onDurable();
      })
      .catch((err: unknown) => this.hooks.onError(err))
      .finally(() => (this.#running = false));
  }
}
