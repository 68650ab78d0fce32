/**
 * The subscription's operator-facing state in the target (pgsub.subscription and
 * pgsub.subscription_stats, migrations/0003), read and written on the maintenance
 * connection: whether it is enabled, the one remote transaction to skip, and the last
 * apply error — the finish LSN `pgsub skip` must match, as the LSN native's
 * ALTER SUBSCRIPTION … SKIP takes is the failing transaction's commit/prepare LSN.
 * Apply-path writes (conflict log rows, counters, clearing the skip LSN once used) are
 * statements in the apply transaction instead (report.ts, apply/handlers.ts).
 */
import type { Sql } from '../pgwire/connect.js';
import { ControlError, CutOverError } from '../errors.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { LOG_COLUMNS, LOG_VALUES, logParams, type ConflictRecord } from './report.js';
import { CONFLICT_TYPES, counterColumn, type ConflictType } from './types.js';
import { quoteIdent } from '../quote.js';
import type { Statement } from '../pgwire/statement.js';

export interface Control {
  enabled: boolean;
  disabledReason: string | null;
  skipLsn: Lsn | null;
  errorLsn: Lsn | null;
  errorXid: number | null;
  errorCode: string | null;
  errorConflict: string | null;
  errorMessage: string | null;
  errorAt: string | null;
}

type ControlRow = {
  enabled: boolean;
  disabled_reason: string | null;
  skip_lsn: string | null;
  error_lsn: string | null;
  error_xid: string | null;
  error_code: string | null;
  error_conflict: string | null;
  error_message: string | null;
  error_at: string | null;
};

/** The state row, created (enabled) on first read. */
export async function loadControl(sql: Sql, subscription: string): Promise<Control> {
  await sql.unsafe('INSERT INTO "pgsub"."subscription" ("subscription") VALUES ($1) ON CONFLICT DO NOTHING', [subscription]);
  const [row] = await sql.unsafe<ControlRow[]>(
    `SELECT enabled, disabled_reason, skip_lsn::text AS skip_lsn, error_lsn::text AS error_lsn, error_xid::text AS error_xid,
            error_code, error_conflict, error_message, error_at::text AS error_at
       FROM "pgsub"."subscription" WHERE subscription = $1`,
    [subscription],
  );
  return {
    enabled: row!.enabled === true || (row!.enabled as unknown) === 't',
    disabledReason: row!.disabled_reason,
    skipLsn: row!.skip_lsn ? parseLsn(row!.skip_lsn) : null,
    errorLsn: row!.error_lsn ? parseLsn(row!.error_lsn) : null,
    errorXid: row!.error_xid === null ? null : Number(row!.error_xid),
    errorCode: row!.error_code,
    errorConflict: row!.error_conflict,
    errorMessage: row!.error_message,
    errorAt: row!.error_at,
  };
}

export interface ApplyErrorReport {
  /** The remote transaction being applied when it failed; null for errors between transactions. */
  failed: { finishLsn: Lsn; xid: number } | null;
  code: string;
  message: string;
  /** Set when the error is a conflict under the `error` policy: counted and logged. */
  conflict: ConflictRecord | null;
  /** disable_on_error: the subscription is disabled in the same transaction. */
  disable: boolean;
}

/**
 * An apply error, on the maintenance connection: apply_error_count (every occurrence,
 * as native), the conflict's counter, the failing transaction, and for a conflict one
 * log row per failing transaction and type (not one per retry).
 */
export async function recordApplyError(sql: Sql, subscription: string, e: ApplyErrorReport): Promise<void> {
  await sql.begin(async (tx) => {
    const t = tx as unknown as Sql;
    await t.unsafe('INSERT INTO "pgsub"."subscription" ("subscription") VALUES ($1) ON CONFLICT DO NOTHING', [subscription]);
    const [prev] = await t.unsafe<{ error_lsn: string | null; error_conflict: string | null }[]>(
      'SELECT error_lsn::text AS error_lsn, error_conflict FROM "pgsub"."subscription" WHERE subscription = $1 FOR UPDATE',
      [subscription],
    );
    const counter = e.conflict && e.conflict.type !== 'transaction_skipped' ? `, ${quoteIdent(counterColumn(e.conflict.type))}` : '';
    await t.unsafe(
      `INSERT INTO "pgsub"."subscription_stats" AS s ("subscription", "apply_error_count"${counter}) VALUES ($1, 1${counter ? ', 1' : ''})
       ON CONFLICT ("subscription") DO UPDATE SET "apply_error_count" = s."apply_error_count" + 1${counter ? `${counter} = s.${counter.slice(2)} + 1` : ''}`,
      [subscription],
    );
    const lsn = e.failed ? formatLsn(e.failed.finishLsn) : null;
    if (e.conflict && (prev?.error_lsn !== lsn || prev?.error_conflict !== e.conflict.type)) {
      await t.unsafe(`INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) VALUES (${LOG_VALUES})`, logParams(subscription, e.conflict));
    }
    await t.unsafe(
      `UPDATE "pgsub"."subscription" SET error_lsn = $2::pg_catalog.pg_lsn, error_xid = $3::pg_catalog.int8, error_code = $4, error_conflict = $5,
              error_message = $6, error_at = pg_catalog.now()
              ${e.disable ? ', enabled = false, disabled_reason = $7, disabled_at = pg_catalog.now()' : ''}
        WHERE subscription = $1`,
      [subscription, lsn, e.failed ? String(e.failed.xid) : null, e.code, e.conflict?.type ?? null, e.message, ...(e.disable ? [`disable_on_error: ${e.code}: ${e.message}`] : [])],
    );
  });
}

/**
 * `pgsub skip --lsn`, as ALTER SUBSCRIPTION … SKIP (lsn): the finish LSN (commit, or
 * prepare for a prepared transaction) of a remote transaction the target has not applied
 * yet — the failing one, or one still to come — which is then skipped whole when it
 * arrives. Only an LSN the origin has passed is refused. Returns the state with the skip.
 */
export async function requestSkip(sql: Sql, subscription: string, lsn: Lsn): Promise<Control> {
  const control = await loadControl(sql, subscription);
  const [origin] = await sql.unsafe<{ remote_lsn: string }[]>('SELECT remote_lsn::text AS remote_lsn FROM "pgsub"."origin" WHERE subscription = $1', [subscription]);
  if (origin && parseLsn(origin.remote_lsn) >= lsn) {
    throw new ControlError(
      `skip LSN ${formatLsn(lsn)} must be greater than the origin LSN ${origin.remote_lsn} of subscription ${subscription}: everything up to the origin is applied${control.errorLsn !== null && control.errorLsn > parseLsn(origin.remote_lsn) ? ` (the failing remote transaction finishes at ${formatLsn(control.errorLsn)}, xid ${control.errorXid})` : ''}`,
      { lsn: formatLsn(lsn), originLsn: origin.remote_lsn },
    );
  }
  await sql.unsafe('UPDATE "pgsub"."subscription" SET skip_lsn = $2::pg_catalog.pg_lsn WHERE subscription = $1', [subscription, formatLsn(lsn)]);
  return { ...control, skipLsn: lsn };
}

/** The failing-transaction record, once the origin has passed it (applied since, or skipped). */
export async function clearPassedError(sql: Sql, subscription: string): Promise<void> {
  await sql.unsafe(
    `UPDATE "pgsub"."subscription" s SET error_lsn = NULL, error_xid = NULL, error_conflict = NULL
       FROM "pgsub"."origin" o
      WHERE s.subscription = $1 AND o.subscription = s.subscription AND s.error_lsn IS NOT NULL AND o.remote_lsn > s.error_lsn`,
    [subscription],
  );
}

/**
 * Where `pgsub cutover` finished this subscription (pgsub.cutover step done, migrations/0009),
 * or null: a target not migrated that far has had no cutover.
 */
export async function cutOverAt(sql: Sql, subscription: string): Promise<{ lsn: Lsn; at: string } | null> {
  const [exists] = await sql.unsafe<{ ok: string }[]>(`SELECT (pg_catalog.to_regclass('"pgsub"."cutover"') IS NOT NULL)::text AS ok`);
  if (exists?.ok !== 'true') return null;
  const [row] = await sql.unsafe<{ lsn: string | null; at: string | null }[]>(
    `SELECT fence_lsn::text AS lsn, pg_catalog.to_json(done_at) #>> '{}' AS at FROM "pgsub"."cutover" WHERE subscription = $1 AND step = 'done'`,
    [subscription],
  );
  return row?.lsn ? { lsn: parseLsn(row.lsn), at: row.at ?? '' } : null;
}

/** How the forward service ends once its subscription was cut over at `lsn` (exit 5). */
export function forwardServiceEnds(lsn: Lsn): CutOverError {
  return new CutOverError(`cut over at LSN ${formatLsn(lsn)}: the target is the primary now; the forward service ends`, { lsn: formatLsn(lsn) });
}

/** `pgsub enable`: returns whether it was disabled. A cut-over subscription is refused: its target is the primary now. */
export async function enableSubscription(sql: Sql, subscription: string): Promise<boolean> {
  const control = await loadControl(sql, subscription);
  const cut = await cutOverAt(sql, subscription);
  if (cut)
    throw new ControlError(
      `subscription ${subscription} was cut over at ${formatLsn(cut.lsn)} (${cut.at}): the target is the primary now, and streaming from the old primary again would write into it. Start a new subscription instead`,
      { lsn: formatLsn(cut.lsn) },
    );
  await sql.unsafe('UPDATE "pgsub"."subscription" SET enabled = true, disabled_reason = NULL, disabled_at = NULL WHERE subscription = $1', [subscription]);
  return !control.enabled;
}

/**
 * In the apply transaction that moved the origin past the skipped transaction: the skip
 * is used, and a failure recorded for that transaction is no longer pending.
 */
export function clearSkipStatement(subscription: string, lsn: Lsn): Statement {
  return {
    text: `UPDATE "pgsub"."subscription"
              SET skip_lsn = NULL,
                  error_lsn = CASE WHEN error_lsn = $2::pg_catalog.pg_lsn THEN NULL ELSE error_lsn END,
                  error_xid = CASE WHEN error_lsn = $2::pg_catalog.pg_lsn THEN NULL ELSE error_xid END,
                  error_conflict = CASE WHEN error_lsn = $2::pg_catalog.pg_lsn THEN NULL ELSE error_conflict END
            WHERE subscription = $1 AND skip_lsn = $2::pg_catalog.pg_lsn`,
    params: [subscription, formatLsn(lsn)],
  };
}

export type Stats = { applyErrorCount: number; statsReset: string | null } & Record<`confl_${ConflictType}`, number>;

export async function loadStats(sql: Sql, subscription: string): Promise<Stats> {
  const cols = CONFLICT_TYPES.map((t) => `${quoteIdent(counterColumn(t))}::text`).join(', ');
  const [row] = await sql.unsafe<Record<string, string | null>[]>(
    `SELECT apply_error_count::text AS apply_error_count, stats_reset::text AS stats_reset, ${cols} FROM "pgsub"."subscription_stats" WHERE subscription = $1`,
    [subscription],
  );
  const stats = { applyErrorCount: Number(row?.apply_error_count ?? 0), statsReset: row?.stats_reset ?? null } as Stats;
  for (const t of CONFLICT_TYPES) stats[`confl_${t}`] = Number(row?.[counterColumn(t)] ?? 0);
  return stats;
}
