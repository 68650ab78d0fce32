/**
 * The cutover's progress, durable in each target (pgsub.cutover, migrations/0009): the
 * step begun, the fence LSN, the source database's own default_transaction_read_only as
 * found before the first fence, and whether pgsub's fence is up. It is written *before*
 * each step acts — the fence's marker before the ALTER DATABASE — so that whatever point
 * a cutover stops at (a signal, a crash, a lost connection), the next `pgsub cutover`
 * (or `--abort`) knows what to undo: it lifts the fence to the recorded value, never to
 * an `on` its own fence left, and removes a reverse setup. `done` is the point of no
 * return: it is committed in the same transaction that disables the forward
 * subscription, and from then on the target is the primary. The forward service, `pgsub
 * status` and `pgsub enable` read the same row (conflict/control.ts cutOverAt).
 */
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import type { Db, Row } from './db.js';
import type { ReverseNames } from './reverse.js';

/** The steps in order; `lifted` is a cutover undone, `done` one finished. */
export type CutoverStep = 'preflight' | 'fence' | 'prepared' | 'fence-lsn' | 'apply' | 'sequences' | 'verify' | 'reverse' | 'done' | 'lifted';

export interface CutoverRecord {
  subscription: string;
  step: CutoverStep;
  sourceDatabase: string;
  /** The database's own setting before pgsub's first fence; null: not set. */
  sourceSetting: string | null;
  fenceRaised: boolean;
  fenceLsn: Lsn | null;
  reverse: (ReverseNames & { createdPublication: boolean; configFile: string | null }) | null;
  doneAt: string | null;
}

/** A record whose cutover stopped half-way: something may be left to undo. */
export const halfDone = (r: CutoverRecord | null): r is CutoverRecord => r !== null && r.step !== 'done' && r.step !== 'lifted';

export async function readRecord(target: Db, subscription: string): Promise<CutoverRecord | null> {
  const [r] = await target.query<Row>(
    `SELECT step, source_database, source_setting, fence_raised::text AS fence_raised, fence_lsn::text AS fence_lsn, reverse::text AS reverse, done_at::text AS done_at
       FROM "pgsub"."cutover" WHERE subscription = $1`,
    [subscription],
  );
  if (!r) return null;
  return {
    subscription,
    step: r.step as CutoverStep,
    sourceDatabase: r.source_database!,
    sourceSetting: r.source_setting ?? null,
    fenceRaised: r.fence_raised === 'true',
    fenceLsn: r.fence_lsn ? parseLsn(r.fence_lsn) : null,
    reverse: r.reverse ? (JSON.parse(r.reverse) as CutoverRecord['reverse']) : null,
    doneAt: r.done_at ?? null,
  };
}

/**
 * A new cutover begins: the row starts over at `preflight`, keeping only a setting
 * recorded by an earlier cutover whose fence is still up (that `on` is pgsub's).
 */
export async function beginRecord(target: Db, subscription: string, database: string): Promise<void> {
  await target.query(
    `INSERT INTO "pgsub"."cutover" AS c (subscription, step, source_database) VALUES ($1, 'preflight', $2)
     ON CONFLICT (subscription) DO UPDATE SET step = 'preflight', source_database = $2, fence_lsn = NULL, reverse = NULL, done_at = NULL,
            started_at = pg_catalog.now(), updated_at = pg_catalog.now(),
            source_setting = CASE WHEN c.fence_raised THEN c.source_setting END`,
    [subscription, database],
  );
}

/** Before the ALTER DATABASE: the value the lift must restore, and the mark that the `on` to come is pgsub's. */
export async function recordFence(target: Db, subscription: string, sourceSetting: string | null): Promise<void> {
  await target.query(`UPDATE "pgsub"."cutover" SET step = 'fence', source_setting = $2, fence_raised = true, updated_at = pg_catalog.now() WHERE subscription = $1`, [
    subscription,
    sourceSetting,
  ]);
}

export async function recordStep(target: Db, subscription: string, step: CutoverStep, fenceLsn?: Lsn): Promise<void> {
  await target.query(`UPDATE "pgsub"."cutover" SET step = $2, fence_lsn = coalesce($3::pg_catalog.pg_lsn, fence_lsn), updated_at = pg_catalog.now() WHERE subscription = $1`, [
    subscription,
    step,
    fenceLsn === undefined ? null : formatLsn(fenceLsn),
  ]);
}

/** Before the reverse setup creates anything: what to remove if the cutover stops. */
export async function recordReverse(target: Db, subscription: string, reverse: NonNullable<CutoverRecord['reverse']>): Promise<void> {
  await target.query(`UPDATE "pgsub"."cutover" SET step = 'reverse', reverse = $2::jsonb, updated_at = pg_catalog.now() WHERE subscription = $1`, [
    subscription,
    JSON.stringify(reverse),
  ]);
}

/** The fence is lifted (read back) and the reverse setup removed: nothing left to undo. */
export async function recordLifted(target: Db, subscription: string): Promise<void> {
  await target.query(`UPDATE "pgsub"."cutover" SET step = 'lifted', fence_raised = false, reverse = NULL, updated_at = pg_catalog.now() WHERE subscription = $1`, [subscription]);
}

/**
 * The point of no return, in one target transaction: the cutover done and the forward
 * subscription disabled. The fence stays up on purpose (the old primary stays read-only),
 * so fence_raised is cleared: a later `on` is no longer this cutover's to lift.
 */
export async function recordDone(target: Db, subscription: string, fenceLsn: Lsn): Promise<void> {
  const reason = `cut over at ${formatLsn(fenceLsn)}: the target is the primary now`;
  await target.query(
    `WITH c AS (UPDATE "pgsub"."cutover" SET step = 'done', fence_raised = false, fence_lsn = $2::pg_catalog.pg_lsn, done_at = pg_catalog.now(), updated_at = pg_catalog.now()
                 WHERE subscription = $1 RETURNING subscription)
     INSERT INTO "pgsub"."subscription" (subscription, enabled, disabled_reason, disabled_at) SELECT subscription, false, $3, pg_catalog.now() FROM c
     ON CONFLICT (subscription) DO UPDATE SET enabled = false, disabled_reason = EXCLUDED.disabled_reason, disabled_at = EXCLUDED.disabled_at`,
    [subscription, formatLsn(fenceLsn), reason],
  );
}
