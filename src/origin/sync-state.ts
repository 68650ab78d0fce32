/**
 * Per-table sync states (pg_subscription_rel's analogue) and the rule that decides,
 * for every change, whether the apply loop applies it — the hand-off between a table's
 * copy and the stream, with no gap and no overlap.
 *
 * Each table that is not ready has its own position `syncLsn`: its copy was taken from
 * a snapshot consistent with that LSN (a temporary slot's consistent point), so every
 * remote transaction committing before it is in the table and every one committing
 * after it still has to be applied. Ready tables share the subscription's origin LSN.
 * A change of table X in a transaction with commit LSN C is applied iff
 *   X ready:                C >= origin
 *   X syncdone:             C >= X.syncLsn   (syncLsn advances with each applied commit)
 *   X init/datasync/finishedcopy: never — a copy that finished while a stream ran missed
 *                           what that stream passed; the next stream, which starts at the
 *                           smallest syncLsn, turns it into syncdone
 *   X not registered:       never — published since the last refresh, not part of the
 *                           subscription until `pgsub refresh` (native: no pg_subscription_rel row)
 * No commit record straddles a consistent point or a commit end, so "C >= P" is exactly
 * "this transaction is not yet in X". The publisher is never told a position beyond the
 * smallest syncLsn of a table being synced, and streaming (re)starts from the smallest
 * position any table needs, so a table that finished its copy behind the stream gets the
 * transactions it missed by re-streaming them (other tables skip what they already have).
 * A syncing table becomes ready at the first position that is at or beyond both its own
 * and the origin: from there on both rules agree.
 */
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import type { Statement } from '../pgwire/statement.js';

export type RelState = 'i' | 'd' | 'f' | 's' | 'r';

export const STATE_NAMES: Record<RelState, string> = { i: 'init', d: 'datasync', f: 'finishedcopy', s: 'syncdone', r: 'ready' };

export interface TableSync {
  schema: string;
  table: string;
  state: RelState;
  syncLsn: Lsn | null;
}

const key = (schema: string, table: string) => `${schema}\u0000${table}`;
/** The lookup key of a table (getByKey), for callers that look the same table up per row. */
export const syncKey = key;

export class SyncStates {
  private readonly tables = new Map<string, TableSync>();
  private version = 0;
  private readonly changedAt = new Map<string, number>();

  /** Taken before reading the states from the target (see load). */
  get stamp(): number {
    return this.version;
  }

  /**
   * Adopt rows read from the target. With `merge`, an entry set in memory since
   * `merge.since` (the read may predate it) or claimed by `merge.keep` (a running copy's
   * hold) stays as it is; rows gone from the target are dropped, new ones added.
   */
  load(rows: TableSync[], merge?: { since: number; keep(schema: string, table: string): boolean }): void {
    const fresh = new Map(rows.map((r) => [key(r.schema, r.table), r]));
    if (!merge) this.tables.clear();
    for (const k of [...this.tables.keys()]) if (!fresh.has(k)) this.tables.delete(k);
    for (const [k, r] of fresh) {
      if (merge && this.tables.has(k) && ((this.changedAt.get(k) ?? 0) > merge.since || merge.keep(r.schema, r.table))) continue;
      this.tables.set(k, { ...r });
    }
  }

  all(): TableSync[] {
    return [...this.tables.values()];
  }

  get(schema: string, table: string): TableSync | undefined {
    return this.tables.get(key(schema, table));
  }

  getByKey(k: string): TableSync | undefined {
    return this.tables.get(k);
  }

  set(entry: TableSync): void {
    const k = key(entry.schema, entry.table);
    this.tables.set(k, { ...entry });
    this.changedAt.set(k, ++this.version);
  }

  shouldApply(schema: string, table: string, commitLsn: Lsn, originLsn: Lsn): boolean {
    return this.entryApplies(this.tables.get(key(schema, table)), commitLsn, originLsn);
  }

  /**
   * shouldApply for an entry already looked up. A table not registered yet (published since
   * the last refresh) is not part of the subscription: its changes are skipped, as native's
   * apply worker skips a relation without a pg_subscription_rel row, until `pgsub refresh`.
   */
  entryApplies(t: TableSync | undefined, commitLsn: Lsn, originLsn: Lsn): boolean {
    if (!t) return false;
    switch (t.state) {
      case 'r':
        return commitLsn >= originLsn;
      case 's':
        // Not 'f': a copy that finished while this stream ran missed what the stream passed
        // during its copy; it is applied from the next stream, which starts at its syncLsn.
        return t.syncLsn !== null && commitLsn >= t.syncLsn;
      default:
        return false;
    }
  }

  /**
   * The smallest position a table being synced still needs: feedback must not pass it. A
   * datasync table holds only while its copy runs (the launcher loads a datasync row whose
   * copy is not running without its position: the next attempt takes a new snapshot).
   */
  heldLsn(): Lsn | null {
    let held: Lsn | null = null;
    for (const t of this.tables.values()) {
      if ((t.state === 'd' || t.state === 'f' || t.state === 's') && t.syncLsn !== null && (held === null || t.syncLsn < held)) held = t.syncLsn;
    }
    return held;
  }

  /** Where streaming must start so that every finished copy gets what it missed. */
  streamStart(originLsn: Lsn): Lsn {
    let start = originLsn;
    for (const t of this.tables.values()) {
      if ((t.state === 'f' || t.state === 's') && t.syncLsn !== null && t.syncLsn < start) start = t.syncLsn;
    }
    return start;
  }

  /** Tables still waiting for their copy. */
  copying(): TableSync[] {
    return this.all().filter((t) => t.state === 'i' || t.state === 'd');
  }

  /** Syncing tables whose own position is at or before `position`, when the stream is beyond the origin too. */
  promotable(position: Lsn, originLsn: Lsn): TableSync[] {
    if (position < originLsn) return [];
    return this.all().filter((t) => t.state === 's' && t.syncLsn !== null && t.syncLsn <= position);
  }
}

// Statements on pgsub.subscription_rel, run in the apply or sync transaction they belong to.

/** Append a catching-up table's new position (pgsub.sync_progress; no row lock to hold). */
export function advanceSyncStatement(subscription: string, t: { schema: string; table: string }, lsn: Lsn): Statement {
  return {
    text: `INSERT INTO "pgsub"."sync_progress" ("subscription", "schema_name", "table_name", "lsn") VALUES ($1, $2, $3, $4::pg_catalog.pg_lsn)`,
    params: [subscription, t.schema, t.table, formatLsn(lsn)],
  };
}

/** Forget a table's appended positions (it became ready, or its copy starts over). */
export function clearSyncProgressStatement(subscription: string, t: { schema: string; table: string }): Statement {
  return {
    text: `DELETE FROM "pgsub"."sync_progress" WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`,
    params: [subscription, t.schema, t.table],
  };
}

export function setStateStatement(subscription: string, t: { schema: string; table: string }, state: RelState, lsn: Lsn | null): Statement {
  // A finished copy clears the last copy error (migrations/0005).
  const cleared = ', "last_error" = NULL, "error_count" = 0';
  const stamp =
    state === 'r'
      ? `, "ready_at" = pg_catalog.now()${cleared}`
      : state === 'd'
        ? ', "copy_started_at" = pg_catalog.now()'
        : state === 'f'
          ? `, "copy_finished_at" = pg_catalog.now()${cleared}`
          : '';
  return {
    text: `UPDATE "pgsub"."subscription_rel" SET "state" = $4, "sync_lsn" = $5::pg_catalog.pg_lsn, "updated_at" = pg_catalog.now()${stamp}
            WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`,
    params: [subscription, t.schema, t.table, state, lsn === null ? null : formatLsn(lsn)],
  };
}

export function rowToSync(row: { schema_name: string; table_name: string; state: string; sync_lsn: string | null }): TableSync {
  return { schema: row.schema_name, table: row.table_name, state: row.state as RelState, syncLsn: row.sync_lsn ? parseLsn(row.sync_lsn) : null };
}
