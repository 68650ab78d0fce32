/**
 * The channel between `pgsub verify` and the running service, in the target database:
 * the `pgsub.verify` row (migrations/0007_verify.sql), the NOTIFY channel that wakes the
 * other side when it changes, and the advisory lock the verify command holds for as long
 * as its request lives (the service lets go of a hold whose holder's lock is gone: a killed
 * verify never leaves the apply waiting). Both sides import only this file of each other.
 */
import { createHash } from 'node:crypto';
import type { Sql } from '../pgwire/connect.js';

/** One statement on the side's own connection (postgres.js in the service, pg in the command). */
export type Query = (text: string, params?: unknown[]) => Promise<Record<string, unknown>[]>;

export function sqlQuery(sql: Sql): Query {
  return async (text, params = []) => (await sql.unsafe(text, params as string[])) as unknown as Record<string, unknown>[];
}

/** States of the row, in the order they are written: [who writes it] meaning. */
export type VerifyState =
  /** [verify] a new request; the service closes its gate at the next transaction boundary */
  | 'requested'
  /** [service] gate closed: nothing more is applied until the bound is known */
  | 'armed'
  /** [service] the hold cannot be made here (detail says why) */
  | 'refused'
  /** [verify] bound_lsn = the source's pg_current_wal_lsn() read after 'armed': commits before it may apply */
  | 'bounded'
  /** [verify] slot_lsn = the consistent point of the temporary slot: commits before it apply, none after */
  | 'located'
  /** [service, mode snapshot] snapshot = the exported target snapshot at slot_lsn; apply already resumed */
  | 'snapshot'
  /** [service, mode repair] apply held at slot_lsn until 'released' */
  | 'held'
  /** [verify] the snapshot is imported (the service ends its exporting transaction) / the repair hold is over */
  | 'imported'
  | 'released'
  /** [verify] finished; last_* hold the result */
  | 'done'
  /** [service] gave up: the holder is gone or the hold timed out */
  | 'abandoned';

export interface VerifyRow {
  request_id: string | null;
  mode: 'snapshot' | 'repair';
  state: VerifyState;
  holder_pid: number | null;
  hold_timeout_ms: number;
  bound_lsn: string | null;
  slot_lsn: string | null;
  snapshot: string | null;
  pause_ms: number | null;
  detail: string | null;
  last_lsn: string | null;
  last_result: string | null;
  last_differences: string | null;
  last_at: string | null;
}

// 'pgsv' in ASCII: the class of the verify lock (the run lock's is another).
const VERIFY_LOCK_CLASS = 0x70677376;

/** The verify lock's key for a subscription: two non-negative int4s (pg_locks: classid, objid). */
export function verifyLockKey(subscription: string): [number, number] {
  return [VERIFY_LOCK_CLASS, createHash('sha256').update(`verify ${subscription}`).digest().readUInt32BE(0) & 0x7fffffff];
}

export function verifyChannel(subscription: string): string {
  return `pgsub_verify_${subscription}`.slice(0, 63);
}

const ROW_COLUMNS =
  'request_id, mode, state, holder_pid, hold_timeout_ms, bound_lsn::text AS bound_lsn, slot_lsn::text AS slot_lsn, snapshot, pause_ms, detail, ' +
  "last_lsn::text AS last_lsn, last_result, last_differences::text AS last_differences, pg_catalog.to_json(last_at) #>> '{}' AS last_at";

export async function readVerifyRow(query: Query, subscription: string): Promise<VerifyRow | null> {
  const rows = await query(`SELECT ${ROW_COLUMNS} FROM "pgsub"."verify" WHERE subscription = $1`, [subscription]);
  const r = rows[0] as Record<string, unknown> | undefined;
  if (!r) return null;
  return {
    ...(r as unknown as VerifyRow),
    holder_pid: r.holder_pid === null ? null : Number(r.holder_pid),
    hold_timeout_ms: Number(r.hold_timeout_ms),
    pause_ms: r.pause_ms === null ? null : Number(r.pause_ms),
  };
}

/**
 * Move the row of request `requestId` to `state` (with more columns), only if it is still
 * that request and in one of `from` (null: any state); then wake the other side. Whether it moved.
 */
export async function moveVerifyRow(
  query: Query,
  subscription: string,
  requestId: string,
  from: readonly VerifyState[] | null,
  state: VerifyState,
  set: Record<string, string | number | null> = {},
): Promise<boolean> {
  const names = Object.keys(set);
  const params: (string | number | null)[] = [subscription, requestId, state, ...names.map((n) => set[n] ?? null)];
  const assignments = names.map((n, i) => `${n} = $${i + 4}${n.endsWith('_lsn') ? '::pg_catalog.pg_lsn' : ''}`);
  let where = 'subscription = $1 AND request_id = $2';
  if (from !== null) {
    where += ` AND state = ANY($${params.length + 1}::text[])`;
    params.push(`{${from.join(',')}}`);
  }
  // One statement, one round trip: the row moves and the other side is woken (at commit) together.
  params.push(verifyChannel(subscription));
  const rows = await query(
    `WITH moved AS (UPDATE "pgsub"."verify" SET state = $3, updated_at = now()${assignments.map((a) => `, ${a}`).join('')} WHERE ${where} RETURNING 1) ` +
      `SELECT (SELECT pg_catalog.count(*) FROM moved)::pg_catalog.int4 AS moved FROM (SELECT pg_catalog.pg_notify($${params.length}, $3::text)) AS woken`,
    params,
  );
  // A number from pg, its text from the maintenance connection (which passes int4 through).
  return Number(rows[0]?.moved) > 0;
}

/** Whether backend `pid` still holds the verify lock of the subscription (the request is alive). */
export async function holderAlive(query: Query, subscription: string, pid: number): Promise<boolean> {
  const [classId, objId] = verifyLockKey(subscription);
  const rows = await query(
    `SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1 AND classid = $2::pg_catalog.oid AND objid = $3::pg_catalog.oid AND objsubid = 2`,
    [pid, classId, objId],
  );
  return rows.length > 0;
}
