/**
 * `pgsub verify --repair`: the rows found different are written again from the source, at a
 * second hold. Why a second hold: a row found different at L may have changed on the source
 * since, and the service may have applied that change; copying the row as it was at L would
 * undo it. So the command asks the service to hold again (handshake.ts, repair mode) at a
 * new LSN L2 and waits until it is held there: the target then has exactly the source's
 * commits before L2 (plus the divergence), the apply writes nothing, and a new source
 * snapshot at L2 gives each differing key its value at L2.
 *
 * Each batch of keys is one target transaction that first checks, under row locks, that the
 * service still holds (pgsub.verify 'held': the service moves it away before it lets the
 * apply go, so it waits for the batch) and that the table is still ready (subscription_rel
 * state 'r': a resync or a copy started since the comparison owns the table, and its copy
 * writes what the repair would). It then writes only what verify compares: a DELETE for
 * the keys only the target has, an UPDATE of the compared columns for the keys both sides
 * have and that still differ at L2 (a column only the target has keeps its value; triggers
 * see an update), an INSERT for the keys only the source has; one pgsub.conflict_log row
 * per written key (conflict_type 'verify_repair', the old target row as local_tuple).
 * Idempotent. The writes run with session_replication_role = replica, as the apply's. A
 * table whose batch fails is reported by name with PostgreSQL's reason (RepairError) and
 * the others go on.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { RepairError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { quoteLiteral } from '../quote.js';
import { STATE_NAMES, type RelState } from '../origin/sync-state.js';
import type { TableComparison } from './compare.js';
import { holdAtLsn, release, type Control } from './handshake.js';
import { deleteStatement, insertStatement, sourceRowsQuery, targetRowsQuery, updateStatement, type Statement } from './repair-sql.js';
import { columnsQuery, onSide, parseColumns, qualified, type ColumnInfo } from './sql.js';
import { openSide } from './connections.js';

export interface RepairedTable {
  table: string;
  /** Keys found different by the comparison. */
  keys: number;
  updated: number;
  inserted: number;
  deleted: number;
  /** Keys equal again at the repair's LSN (the source changed them since, and the apply followed). */
  unchanged: number;
  ms: number;
}

export interface RepairReport {
  /** The LSN the repaired rows were copied at (the second hold). */
  lsn: string;
  /** Every differing row of every compared table was repaired. */
  complete: boolean;
  pauseMs: number;
  tables: RepairedTable[];
  /** Tables not (or not wholly) repaired, and why; `code` when it failed (PGSUB_VERIFY_REPAIR_FAILED). */
  skipped: { table: string; reason: string; code?: string }[];
}

const BATCH_KEYS = 500;
/** The longest a repair statement waits for a lock while the apply is held (then the table fails by name). */
const LOCK_TIMEOUT = '10s';

/** Why a table in this sync state is neither compared nor repaired. */
export function syncingReason(state: string | null): string {
  if (state === null) return 'not subscribed yet (no pgsub.subscription_rel row: the service adds it at its next refresh)';
  return `syncing (state ${state}: ${STATE_NAMES[state as RelState] ?? 'unknown'})`;
}

interface Context {
  config: Config;
  source: pg.Client;
  target: pg.Client;
  control: Control;
  lsn: Lsn;
}

export async function repairDifferences(
  config: Config,
  control: Control,
  comparisons: readonly TableComparison[],
  opts: { log: Logger; holdTimeoutMs: number },
): Promise<RepairReport> {
  const report: RepairReport = { lsn: '', complete: true, pauseMs: 0, tables: [], skipped: [] };
  const work = comparisons.filter((c) => c.report.status === 'different');
  for (const c of work) {
    const reason = !c.report.keyed
      ? 'no primary key: rows cannot be re-copied by key (resync the table: pgsub resync)'
      : c.repairOverflow
        ? 'too many differing rows to repair by key (resync the table: pgsub resync)'
        : null;
    if (reason) {
      report.skipped.push({ table: c.report.table, reason });
      report.complete = false;
    }
  }
  const repairable = work.filter((c) => c.report.keyed && !c.repairOverflow && c.repairKeys.size > 0);
  if (repairable.length === 0) return report;
  const app = `pgsub_${config.subscription}_verify_repair`;
  const source = await openSide('source', config.source, app);
  const target = await openSide('target', config.target, app, ` -c session_replication_role=replica -c lock_timeout=${LOCK_TIMEOUT}`);
  try {
    const held = await holdAtLsn([{ config, control }], source, 'repair', opts.holdTimeoutMs);
    const heldAt = performance.now();
    report.lsn = formatLsn(held.lsn);
    try {
      await source.query(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT ${quoteLiteral(held.sourceSnapshot)}`);
      await held.replication.close();
      const targetVersion = Number((await target.query('SHOW server_version_num')).rows[0].server_version_num);
      const ctx: Context = { config, source, target, control, lsn: held.lsn };
      for (const c of repairable) {
        const outcome = await repairTable(ctx, targetVersion, c);
        if (outcome.table) report.tables.push(outcome.table);
        if (outcome.skipped) {
          report.skipped.push(outcome.skipped);
          report.complete = false;
          if (outcome.skipped.code) opts.log.error({ table: c.report.table, code: outcome.skipped.code, reason: outcome.skipped.reason }, 'verify: repair of a table failed');
        }
      }
    } finally {
      await held.replication.close();
      await source.query('COMMIT').catch(() => {});
      report.pauseMs = Math.round(performance.now() - heldAt);
      await release(config, control);
    }
    opts.log.info({ lsn: report.lsn, tables: report.tables, skipped: report.skipped, pauseMs: report.pauseMs }, 'verify: differing rows repaired');
    return report;
  } finally {
    await source.end().catch(() => {});
    await target.end().catch(() => {});
  }
}

/** A table's repair in batches: what was written, and why it stopped short if it did. */
async function repairTable(ctx: Context, targetVersion: number, c: TableComparison): Promise<{ table: RepairedTable | null; skipped: RepairReport['skipped'][number] | null }> {
  const started = performance.now();
  const name = c.report.table;
  const entries = [...c.repairKeys.values()];
  const out: RepairedTable = { table: name, keys: entries.length, updated: 0, inserted: 0, deleted: 0, unchanged: 0, ms: 0 };
  let written = false;
  try {
    const targetColumns = parseColumns(
      (await ctx.target.query({ text: columnsQuery(targetVersion), values: [qualified(onSide(c.shape, 'target'))], rowMode: 'array' })).rows as (string | null)[][],
    ).columns;
    for (let i = 0; i < entries.length; i += BATCH_KEYS) {
      const result = await repairBatch(ctx, c, targetColumns, entries.slice(i, i + BATCH_KEYS));
      if ('refused' in result) {
        const reason = `not repaired: ${result.refused} at the repair hold; its copy writes it (verify again once the table is ready)`;
        return { table: written ? finish(out, started) : null, skipped: { table: name, reason } };
      }
      written = true;
      out.updated += result.updated;
      out.inserted += result.inserted;
      out.deleted += result.deleted;
      out.unchanged += result.unchanged;
    }
    return { table: finish(out, started), skipped: null };
  } catch (err) {
    const failure = repairFailure(name, err);
    if (failure.context.holdLost) throw failure;
    return { table: written ? finish(out, started) : null, skipped: { table: name, reason: failure.message, code: failure.code } };
  }
}

function finish(out: RepairedTable, started: number): RepairedTable {
  out.ms = Math.round(performance.now() - started);
  return out;
}

/** A failed repair statement as a RepairError naming the table, the SQLSTATE and the key PostgreSQL names. */
export function repairFailure(table: string, err: unknown): RepairError {
  if (err instanceof RepairError) return err;
  const e = err as { code?: string; detail?: string; message?: string; constraint?: string };
  const key = e.detail ? (/^Key (\(.*\)=\(.*\))/.exec(e.detail)?.[1] ?? null) : null;
  const where = key ? ` at key ${key}` : '';
  return new RepairError(
    `repair of ${table} failed${where}: ${e.message ?? String(err)}${e.code ? ` (SQLSTATE ${e.code})` : ''}${e.detail && !key ? `: ${e.detail}` : ''}`,
    { relation: table, sqlstate: e.code ?? null, key, constraint: e.constraint ?? null },
    { cause: err },
  );
}

async function rows(client: pg.Client, st: Statement): Promise<(string | null)[][]> {
  return (await client.query({ text: st.text, values: st.params, rowMode: 'array' })).rows as (string | null)[][];
}

interface BatchCounts {
  updated: number;
  inserted: number;
  deleted: number;
  unchanged: number;
}

/**
 * One batch in one target transaction: the hold and the table's state checked under row
 * locks, the rows of both sides read (the target's locked), then the writes and their log.
 */
async function repairBatch(ctx: Context, c: TableComparison, targetColumns: ColumnInfo[], batch: { key: string[]; kind: string }[]): Promise<BatchCounts | { refused: string }> {
  const { config, target } = ctx;
  const shape = c.shape;
  const n = shape.key.length;
  const keys = batch.map((b) => b.key);
  await target.query('BEGIN');
  try {
    const hold = await target.query({
      text: `SELECT state, detail FROM "pgsub"."verify" WHERE subscription = $1 AND request_id = $2 FOR SHARE`,
      values: [config.subscription, ctx.control.requestId],
    });
    if (hold.rows[0]?.state !== 'held') {
      throw new RepairError(
        `the service no longer holds its apply for the repair (${hold.rows[0]?.state ?? 'no request'}${hold.rows[0]?.detail ? `: ${hold.rows[0].detail}` : ''}); nothing more was written`,
        {
          relation: c.report.table,
          holdLost: true,
        },
      );
    }
    const rel = await target.query({
      text: `SELECT state::text AS state FROM "pgsub"."subscription_rel" WHERE subscription = $1 AND schema_name = $2 AND table_name = $3 FOR SHARE`,
      values: [config.subscription, shape.schema, shape.table],
    });
    const state = (rel.rows[0]?.state as string | undefined) ?? null;
    if (state !== 'r') {
      await target.query('ROLLBACK');
      return { refused: syncingReason(state) };
    }
    const fresh = new Map((await rows(ctx.source, sourceRowsQuery(shape, keys))).map((r) => [JSON.stringify(r.slice(0, n)), { hash: r[n], values: r.slice(n + 1) }]));
    const old = new Map((await rows(target, targetRowsQuery(shape, keys))).map((r) => [JSON.stringify(r.slice(0, n)), { hash: r[n], row: r[n + 1] ?? null }]));
    const counts: BatchCounts = { updated: 0, inserted: 0, deleted: 0, unchanged: 0 };
    const updates: (string | null)[][] = [];
    const inserts: (string | null)[][] = [];
    const deletes: string[][] = [];
    const logged: LogEntry[] = [];
    for (const b of batch) {
      const id = JSON.stringify(b.key);
      const s = fresh.get(id);
      const t = old.get(id);
      if (s && t && s.hash === t.hash) counts.unchanged++;
      else if (s && t) {
        updates.push(s.values);
        logged.push({ key: b.key, kind: b.kind, action: 'updated', values: s.values, old: t.row });
      } else if (s) {
        inserts.push(s.values);
        logged.push({ key: b.key, kind: b.kind, action: 'inserted', values: s.values, old: null });
      } else if (t) {
        deletes.push(b.key);
        logged.push({ key: b.key, kind: b.kind, action: 'deleted', values: null, old: t.row });
      } else counts.unchanged++;
    }
    // Extra rows first: a row about to be deleted must not stand in the way of a unique value the others take.
    if (deletes.length > 0) {
      const del = deleteStatement(shape, deletes);
      counts.deleted = (await target.query({ text: del.text, values: del.params })).rowCount ?? 0;
    }
    if (updates.length > 0) {
      const update = updateStatement(shape, targetColumns, updates);
      if (update === null)
        throw new RepairError(`repair of ${c.report.table}: its rows differ only in columns a repair cannot update (generated or GENERATED ALWAYS AS IDENTITY); resync the table`, {
          relation: c.report.table,
        });
      counts.updated = (await target.query({ text: update.text, values: update.params })).rowCount ?? 0;
    }
    if (inserts.length > 0) {
      const insert = insertStatement(shape, targetColumns, inserts);
      counts.inserted = (await target.query({ text: insert.text, values: insert.params })).rowCount ?? 0;
    }
    if (logged.length > 0) await logRepairs(ctx, c, logged);
    await target.query('COMMIT');
    return counts;
  } catch (err) {
    await target.query('ROLLBACK').catch(() => {});
    throw err;
  }
}

interface LogEntry {
  key: string[];
  kind: string;
  action: 'updated' | 'inserted' | 'deleted';
  values: (string | null)[] | null;
  old: string | null;
}

/** One pgsub.conflict_log row per written key, in the batch's transaction. */
async function logRepairs(ctx: Context, c: TableComparison, entries: readonly LogEntry[]): Promise<void> {
  const shape = c.shape;
  const at = formatLsn(ctx.lsn);
  const params: (string | null)[] = [];
  const values = entries.map((e) => {
    const base = params.length;
    params.push(
      ctx.config.subscription,
      `${shape.schema}.${shape.table}`,
      shape.schema,
      shape.table,
      JSON.stringify(Object.fromEntries(shape.key.map((k, i) => [k, e.key[i] ?? null]))),
      e.values ? JSON.stringify(Object.fromEntries(shape.columns.map((col, i) => [col.name, e.values![i] ?? null]))) : null,
      e.old,
      at,
      `pgsub verify found it ${e.kind}; ${e.action === 'deleted' ? 'deleted: not on' : `${e.action} from`} the source at ${at}`,
    );
    const p = (k: number) => `$${base + k}`;
    return `(${p(1)}, 'verify_repair', ${p(2)}, ${p(3)}, ${p(4)}, ${p(5)}::pg_catalog.jsonb, ${p(6)}::pg_catalog.jsonb, ${p(7)}::pg_catalog.jsonb, ${p(8)}::pg_catalog.pg_lsn, 'repair', ${p(9)})`;
  });
  await ctx.target.query({
    text: `INSERT INTO "pgsub"."conflict_log" ("subscription", "conflict_type", "relation", "schema_name", "table_name", "key", "remote_tuple", "local_tuple", "remote_lsn", "policy", "detail") VALUES ${values.join(', ')}`,
    values: params,
  });
}
