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
  let health: SlotHealth | null = null;
  let conn: ReplicationConnection | null = null;
  let stopped = false;
  let overBudget = false;
  let running: Promise<void> | null = null;

  const check = async () => {
    conn ??= await ReplicationConnection.open(config.source, `pgsub_${config.subscription}_guard`);
    const v = conn.serverVersionNum;
    if (v < 130000) return; // no wal_status before PostgreSQL 13
    const rows = await conn.sql<{ wal_status: string | null; safe_wal_size: string | null; retained: string | null; invalidated: string | null }>(
      `SELECT wal_status, safe_wal_size::text, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn)::bigint::text AS retained,
              ${v >= 170000 ? 'invalidation_reason' : 'NULL::text'} AS invalidated
         FROM pg_catalog.pg_replication_slots WHERE slot_name = ${quoteLiteral(config.slotName)}`,
    );
    const row = rows[0];
    if (!row) return; // created by the session; a missing slot is the session's error
    health = {
      walStatus: row.wal_status,
      safeWalSizeBytes: row.safe_wal_size === null ? null : Number(row.safe_wal_size),
      retainedWalBytes: row.retained === null ? null : Number(row.retained),
    };
    if (row.wal_status === 'lost' || row.invalidated !== null) {
      opts.onLost(
        new SlotLostError(
          `replication slot "${config.slotName}" on the publisher is lost (${row.invalidated ?? `wal_status ${row.wal_status}`}): the WAL it needed was removed, so changes since the target's origin are gone. Re-create the subscription: pgsub drop, then pgsub run to copy every table again (raise max_slot_wal_keep_size, or keep pgsub running, so it does not happen again)`,
          { slot: config.slotName, walStatus: row.wal_status, invalidation: row.invalidated },
        ),
      );
      return;
    }
    const retained = health.retainedWalBytes ?? 0;
    if (opts.maxRetainedBytes > 0 && retained > opts.maxRetainedBytes) {
      if (!overBudget)
        log.warn(
          { slot: config.slotName, retainedWalBytes: retained, maxRetainedWalBytes: opts.maxRetainedBytes, walStatus: row.wal_status, safeWalSizeBytes: health.safeWalSizeBytes },
          'the slot retains more WAL on the publisher than max_retained_wal',
        );
      overBudget = true;
    } else if (overBudget) {
      overBudget = false;
      log.info({ slot: config.slotName, retainedWalBytes: retained }, 'the slot retains WAL within max_retained_wal again');
    }
  };

  // Until the slot is seen (the first session creates it) it is looked for every second.
  let timer: NodeJS.Timeout | null = null;
  // A read on a connection gone silent (a black-holed network) must not hang the guard, nor its stop().
  const checkTimeoutMs = Math.max(config.receiveTimeoutMs, 5000);
  const tick = () => {
    if (stopped) return;
    let timeout: NodeJS.Timeout | undefined;
    running = Promise.race([
      check(),
      new Promise<never>((_, reject) => {
        timeout = setTimeout(() => reject(new Error(`no answer from the publisher within ${checkTimeoutMs} ms`)), checkTimeoutMs);
        timeout.unref();
      }),
    ])
      .finally(() => clearTimeout(timeout))
      .catch(async (err: unknown) => {
        log.debug({ err }, 'slot guard: cannot read the slot');
        await conn?.close();
        conn = null;
      })
      .finally(() => {
        running = null;
        if (stopped) return;
        timer = setTimeout(tick, health === null ? Math.min(1000, opts.intervalMs) : opts.intervalMs);
        timer.unref();
      });
  };
  tick();
  return {
    health: () => health,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      // Closing first: a read in flight on a silent connection ends when its socket is dropped.
      const closing = conn?.close();
      conn = null;
      await closing;
      await running;
      // A connection opened while stopping.
      await (conn as ReplicationConnection | null)?.close();
    },
  };
}
