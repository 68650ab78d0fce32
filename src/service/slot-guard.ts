/**
 * The slot and WAL guard: every `interval` the publisher's view of the slot is read on a
 * connection of its own (pg_replication_slots: wal_status and safe_wal_size from
 * PostgreSQL 13, invalidation_reason from 17), with the WAL it retains. Retained WAL above
 * `max_retained_wal` is a warning (log, metrics, status); a slot that is lost — wal_status
 * lost, or invalidated — is fatal (SlotLostError, exit 4): the subscription must be
 * re-created, which pgsub never does by itself. A failed read is only logged: the apply
 * session sees a publisher that is gone on its own.
 */
import type { Config } from '../config/config.js';
import { SlotLostError } from '../errors.js';
import type { Logger } from '../log.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteLiteral } from '../quote.js';
import type { SlotHealth } from './metrics.js';

export interface SlotGuard {
  health(): SlotHealth | null;
  stop(): Promise<void>;
}

export interface SlotGuardOptions {
  intervalMs: number;
  /** Retained WAL above this is warned about; 0: never. */
  maxRetainedBytes: number;
  /** The slot is lost: the service must stop with this error. */
  onLost(err: SlotLostError): void;
}

export function startSlotGuard(config: Config, log: Logger, opts: SlotGuardOptions): SlotGuard {
  const guard = new SlotWatch(config, log, opts);
  guard.tick();
  return guard;
}

interface SlotRow {
  wal_status: string | null;
  safe_wal_size: string | null;
  retained: string | null;
  invalidated: string | null;
}

/** The guard's loop: one read at a time, the next scheduled when it ends. */
class SlotWatch implements SlotGuard {
  #health: SlotHealth | null = null;
  #conn: ReplicationConnection | null = null;
  #stopped = false;
  /** Retained WAL was above max_retained_wal at the last read (warned once until it is not). */
  #overBudget = false;
  #running: Promise<void> | null = null;
  #timer: NodeJS.Timeout | null = null;
  // A read on a connection gone silent (a black-holed network) must not hang the guard, nor its stop().
  readonly #checkTimeoutMs: number;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly opts: SlotGuardOptions,
  ) {
    this.#checkTimeoutMs = Math.max(config.receiveTimeoutMs, 5000);
  }

  health(): SlotHealth | null {
    return this.#health;
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    // Closing first: a read in flight on a silent connection ends when its socket is dropped.
    const closing = this.#conn?.close();
    this.#conn = null;
    await closing;
    await this.#running;
    // A connection opened while stopping.
    await (this.#conn as ReplicationConnection | null)?.close();
  }

  tick(): void {
    if (this.#stopped) return;
    let timeout: NodeJS.Timeout | undefined;
    this.#running = Promise.race([
      this.#check(),
      new Promise<never>((_, reject) => {
        timeout = setTimeout(() => reject(new Error(`no answer from the publisher within ${this.#checkTimeoutMs} ms`)), this.#checkTimeoutMs);
        timeout.unref();
      }),
    ])
      .finally(() => clearTimeout(timeout))
      .catch(async (err: unknown) => {
        this.log.debug({ err }, 'slot guard: cannot read the slot');
        await this.#conn?.close();
        this.#conn = null;
      })
      .finally(() => {
        this.#running = null;
        if (this.#stopped) return;
        // Until the slot is seen (the first session creates it) it is looked for every second.
        this.#timer = setTimeout(() => this.tick(), this.#health === null ? Math.min(1000, this.opts.intervalMs) : this.opts.intervalMs);
        this.#timer.unref();
      });
  }

  async #check(): Promise<void> {
    const row = await this.#readSlot();
    if (!row) return; // created by the session; a missing slot is the session's error
    this.#health = {
      walStatus: row.wal_status,
      safeWalSizeBytes: row.safe_wal_size === null ? null : Number(row.safe_wal_size),
      retainedWalBytes: row.retained === null ? null : Number(row.retained),
    };
    if (row.wal_status === 'lost' || row.invalidated !== null) {
      this.opts.onLost(lostError(this.config.slotName, row));
      return;
    }
    this.#noteRetained(row, this.#health);
  }

  /** The slot's row; undefined before PostgreSQL 13 (no wal_status) or while there is no slot. */
  async #readSlot(): Promise<SlotRow | undefined> {
    this.#conn ??= await ReplicationConnection.open(this.config.source, `pgsub_${this.config.subscription}_guard`);
    const v = this.#conn.serverVersionNum;
    if (v < 130000) return undefined; // no wal_status before PostgreSQL 13
    const rows = await this.#conn.sql<SlotRow>(
      `SELECT wal_status, safe_wal_size::text, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn)::bigint::text AS retained,
              ${v >= 170000 ? 'invalidation_reason' : 'NULL::text'} AS invalidated
         FROM pg_catalog.pg_replication_slots WHERE slot_name = ${quoteLiteral(this.config.slotName)}`,
    );
    return rows[0];
  }

  /** Warns once when retained WAL goes above max_retained_wal, and says when it is back within. */
  #noteRetained(row: SlotRow, health: SlotHealth): void {
    const { config, log, opts } = this;
    const retained = health.retainedWalBytes ?? 0;
    if (opts.maxRetainedBytes > 0 && retained > opts.maxRetainedBytes) {
      if (!this.#overBudget)
        log.warn(
          { slot: config.slotName, retainedWalBytes: retained, maxRetainedWalBytes: opts.maxRetainedBytes, walStatus: row.wal_status, safeWalSizeBytes: health.safeWalSizeBytes },
          'the slot retains more WAL on the publisher than max_retained_wal',
        );
      this.#overBudget = true;
    } else if (this.#overBudget) {
      this.#overBudget = false;
      log.info({ slot: config.slotName, retainedWalBytes: retained }, 'the slot retains WAL within max_retained_wal again');
    }
  }
}

function lostError(slotName: string, row: SlotRow): SlotLostError {
  return new SlotLostError(
    `replication slot "${slotName}" on the publisher is lost (${row.invalidated ?? `wal_status ${row.wal_status}`}): the WAL it needed was removed, so changes since the target's origin are gone. Re-create the subscription: pgsub drop, then pgsub run to copy every table again (raise max_slot_wal_keep_size, or keep pgsub running, so it does not happen again)`,
    { slot: slotName, walStatus: row.wal_status, invalidation: row.invalidated },
  );
}
