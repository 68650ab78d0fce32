/**
 * Undoing a cutover that stopped before its point of no return — after a failed step, on
 * SIGINT/SIGTERM, at the next run after a crash, or by `pgsub cutover --abort`: the
 * reverse setup removed, the fence lifted to the value recorded before it (and read back),
 * and only when all of that held, each target's record marked `lifted`. Whatever could not
 * be undone is said with the statement that does it by hand, and the record stays so the
 * next run tries again. The forward slot after a finished cutover is here too: dropped
 * (its walsender ended first), or kept and left to `pgsub status`.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { quoteIdent } from '../quote.js';
import { errorText, type Db } from './db.js';
import { liftFence } from './fence.js';
import { recordLifted } from './cutover-record.js';
import { undoReverse, type ReversePlan } from './reverse.js';

/** A target that went away must not hold the undo: its record is cleared by the next run instead. */
const RECORD_TIMEOUT_MS = 5000;

function within<T>(ms: number, p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} within ${ms / 1000} s`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

export interface UndoWhat {
  /** The fence to lift: the database and its own setting before pgsub's fence (null: not set). */
  fence: { database: string; previous: string | null } | null;
  reverse: ReversePlan | null;
}

export interface UndoTarget {
  config: Config;
  target: Db;
}

/** Returns one line per thing undone or not, and whether everything was. */
export async function undoCutover(client: pg.Client, subs: readonly UndoTarget[], what: UndoWhat): Promise<{ lines: string[]; ok: boolean }> {
  const lines: string[] = [];
  let ok = true;
  if (what.reverse) {
    await undoReverse(subs[0]!.config, subs[0]!.target, what.reverse).then(
      () => lines.push('reverse setup removed'),
      (e) => {
        ok = false;
        lines.push(`reverse setup NOT removed (${errorText(e)})`);
      },
    );
  }
  const fence = what.fence;
  if (fence) {
    await liftFence(client, fence).then(
      (now) => lines.push(`fence lifted on database ${fence.database} (default_transaction_read_only ${now === null ? 'not set' : `= ${now}`}, read back)`),
      (e) => {
        ok = false;
        const fix =
          fence.previous === null
            ? `ALTER DATABASE ${quoteIdent(fence.database)} RESET default_transaction_read_only`
            : `ALTER DATABASE ${quoteIdent(fence.database)} SET default_transaction_read_only = ${fence.previous}`;
        lines.push(`fence NOT lifted (${errorText(e)}): run ${fix} on the source, or pgsub cutover --abort`);
      },
    );
  }
  if (ok) {
    for (const s of subs)
      await within(RECORD_TIMEOUT_MS, recordLifted(s.target, s.config.subscription), 'the target did not answer').catch((e) => {
        ok = false;
        lines.push(`the cutover record of ${s.config.subscription} NOT cleared in the target (${errorText(e)}): the next pgsub cutover clears it`);
      });
  }
  return { lines, ok };
}

/**
 * After the point of no return: the forward walsender ended (the service notices the cutover
 * and exits 5) and, unless kept, the forward slot dropped so it stops pinning the old
 * primary's WAL. A walsender that comes back is ended again until the slot goes.
 */
export async function finishForwardSlot(source: Db, slot: string, keep: boolean, timeoutMs = 15_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await source.query(`SELECT pg_catalog.pg_terminate_backend(active_pid)::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, [slot]);
    if (keep) return `slot ${slot} kept (--keep-slot): it retains WAL on the old primary until dropped; pgsub status shows how much`;
    // The walsender may be back between the filter and the drop: "slot is active" (55006) is retried.
    const [r] = await source
      .query(
        `SELECT (SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)::text AS n,
              (SELECT count(*) FROM (SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND NOT active) d)::text AS dropped`,
        [slot],
      )
      .catch((e: { code?: string }) => {
        if (e.code === '55006') return [{ n: '1', dropped: '0' }];
        throw e;
      });
    if (r!.n === '0') return `slot ${slot} was already gone`;
    if (r!.dropped !== '0') return `slot ${slot} dropped on the old primary`;
    if (Date.now() > deadline) throw new Error(`slot ${slot} stayed active for ${timeoutMs / 1000} s after its walsender was ended`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
