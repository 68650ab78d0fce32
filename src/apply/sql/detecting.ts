/**
 * Conflict detection inside a pipelined UPDATE or DELETE (conflict/detect.ts): the
 * statement wrapped so that finding no row, or a row whose last writer is another origin,
 * calls pgsub.conflict and aborts the target transaction; and what a statement builder is
 * told for it (Detect, and RemoteRef for the in-line resolution of update-conflicts.ts).
 */
import type { MappedRelation } from './mapped-relation.js';
import { type Locator, whereClause } from './locator.js';
import { target } from './statement-text.js';

/**
 * Conflict detection on the pipelined path (conflict/detect.ts): the statement raises
 * (SQLSTATE PSC01) when it changed no row, or when the row's last writer was another
 * origin; null: a plain statement whose affected-row count the caller checks.
 */
export interface Detect {
  /** This session's replication origin id; null when the target cannot tell (no track_commit_timestamp). */
  originId: number | null;
  /** The target's RETURNING can name the old row (PostgreSQL 18+: RETURNING WITH (OLD AS …)). */
  returningOld: boolean;
  /**
   * An UPDATE of this relation whose row another origin wrote last is applied and logged by
   * the statement itself (its update_origin_differs policy is apply_remote; PostgreSQL 18);
   * absent: never (the careful path resolves it).
   */
  inlineOriginDiffers?: (rel: MappedRelation) => boolean;
  /** And a missing row is logged (its update_missing policy is skip) instead of raising. */
  inlineMissing?: (rel: MappedRelation) => boolean;
  /** The subscription the in-line conflict rows name. */
  subscription?: string;
}

/** The remote transaction a change belongs to, as an in-line conflict row records it. */
export interface RemoteRef {
  xid: number;
  finalLsn: bigint;
  commitTime: bigint;
}

/** `stmt` wrapped so that a missing row or a foreign last writer aborts the transaction. */
export function detecting(rel: MappedRelation, loc: Locator, stmt: string, firstLocParam: number, kind: 'update' | 'delete', detect: Detect, guard: string | null = null): string {
  // A guard (the mapping's row filter) that fails means the change was not for this table: no conflict.
  const only = guard ? `${guard} AND ` : '';
  const missing = `WHEN ${only}NOT EXISTS (SELECT FROM pgsub_changed) THEN "pgsub"."conflict"('${kind}_missing')`;
  if (detect.originId === null) return `WITH pgsub_changed AS (${stmt} RETURNING 1) SELECT CASE ${missing} END`;
  const differs = `WHEN ${only}EXISTS (SELECT FROM pgsub_changed WHERE r <> ${detect.originId}) THEN "pgsub"."conflict"('${kind}_origin_differs')`;
  // The last writer of the row as it was: DELETE returns the old row itself, UPDATE names it
  // on PostgreSQL 18; no extra probe either way.
  if (kind === 'delete') return `WITH pgsub_changed AS (${stmt} RETURNING (pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident AS r) SELECT CASE ${missing} ${differs} END`;
  if (detect.returningOld) {
    return `WITH pgsub_changed AS (${stmt} RETURNING WITH (OLD AS pgsub_old) (pg_catalog.pg_xact_commit_timestamp_origin(pgsub_old.xmin)).roident AS r) SELECT CASE ${missing} ${differs} END`;
  }
  // PostgreSQL 16/17: read the row in the same snapshot, before this statement writes it.
  const before = `SELECT (pg_catalog.pg_xact_commit_timestamp_origin(xmin)).roident AS r FROM ${target(rel)} WHERE ${whereClause(rel, loc, firstLocParam)} LIMIT 1`;
  return `WITH pgsub_before AS (${before}), pgsub_changed AS (${stmt} RETURNING 1) SELECT CASE ${missing} ${differs.replace('pgsub_changed WHERE', 'pgsub_before WHERE')} END`;
}
