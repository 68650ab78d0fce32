/**
 * `pgsub verify --repair`: the rows found different are re-copied from the source, at a
 * second hold. Why a second hold: a row found different at L may have changed on the source
 * since, and the service may have applied that change; copying the row as it was at L would
 * undo it. So the command asks the service to hold again (handshake.ts, repair mode) at a
 * new LSN L2 and waits until it is held there: the target then has exactly the source's
 * commits before L2 (plus the divergence), nothing writes to it, and a new source snapshot
 * at L2 gives each differing key its value at L2. Each batch of keys is one target
 * transaction: the keys' rows deleted, the source's rows at L2 inserted (a key the source no
 * longer has stays deleted), one pgsub.conflict_log row per key (conflict_type
 * 'verify_repair', the old target row as local_tuple). Idempotent: running it again writes
 * the same rows. Then the hold is released and the apply goes on from L2. The apply pause is
 * the time of the writes (a bounded number of keys per table: a table differing in more rows
 * is left alone, with a hint to resync it). The writes run with session_replication_role =
 * replica, as the apply's: triggers and foreign keys of the target do not fire.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { quoteIdent, quoteLiteral } from '../quote.js';
import type { TableComparison } from './compare.js';
import { holdAtLsn, release, type Control } from './handshake.js';
import { columnsQuery, insertQuery, keysIn, onSide, parseColumns, qualified, rangeWhere, type ColumnInfo, type TableShape } from './sql.js';
import { openSide } from './connections.js';

export interface RepairReport {
  /** The LSN the repaired rows were copied at (the second hold). */
  lsn: string;
  /** Every differing row of every compared table was repaired. */
  complete: boolean;
  pauseMs: number;
  tables: { table: string; keys: number; deleted: number; inserted: number }[];
  /** Tables not repaired, and why. */
  skipped: { table: string; reason: string }[];
}

const BATCH_KEYS = 500;

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
  const source = await openSide(config.source, app);
  const target = await openSide(config.target, app, ' -c session_replication_role=replica');
  try {
    const held = await holdAtLsn(config, control, source, 'repair', opts.holdTimeoutMs);
    const heldAt = performance.now();
    report.lsn = formatLsn(held.lsn);
    try {
      await source.query(`BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT ${quoteLiteral(held.sourceSnapshot)}`);
      await held.replication.close();
      const targetVersion = Number((await target.query('SHOW server_version_num')).rows[0].server_version_num);
      for (const c of repairable) report.tables.push(await repairTable(config, source, target, targetVersion, c, held.lsn));
    } finally {
      await held.replication.close();
      await source.query('COMMIT').catch(() => {});
      report.pauseMs = Math.round(performance.now() - heldAt);
      await release(config, control);
    }
    opts.log.info({ lsn: report.lsn, tables: report.tables, pauseMs: report.pauseMs }, 'verify: differing rows repaired');
    return report;
  } finally {
    await source.end().catch(() => {});
    await target.end().catch(() => {});
  }
}

async function repairTable(config: Config, source: pg.Client, target: pg.Client, targetVersion: number, c: TableComparison, lsn: Lsn): Promise<RepairReport['tables'][number]> {
  const shape = c.shape;
  const targetColumns = parseColumns(
    (await target.query({ text: columnsQuery(targetVersion), values: [qualified(onSide(shape, 'target'))], rowMode: 'array' })).rows as (string | null)[][],
  ).columns;
  const entries = [...c.repairKeys.values()];
  const out = { table: c.report.table, keys: entries.length, deleted: 0, inserted: 0 };
  for (let i = 0; i < entries.length; i += BATCH_KEYS) {
    const batch = entries.slice(i, i + BATCH_KEYS);
    const { deleted, inserted } = await repairBatch(config, source, target, shape, targetColumns, batch, lsn);
    out.deleted += deleted;
    out.inserted += inserted;
  }
  return out;
}

async function repairBatch(
  config: Config,
  source: pg.Client,
  target: pg.Client,
  shape: TableShape,
  targetColumns: ColumnInfo[],
  batch: { key: string[]; kind: string }[],
  lsn: Lsn,
): Promise<{ deleted: number; inserted: number }> {
  const n = shape.key.length;
  const keys = batch.map((b) => b.key);
  const filter = rangeWhere(shape, null, 'source');
  const inSource = keysIn(shape, keys, filter.params.length + 1);
  const cols = shape.columns.map((col) => `${quoteIdent(col.name)}::pg_catalog.text`).join(', ');
  const keyText = shape.key.map((k) => `${quoteIdent(k)}::pg_catalog.text`).join(', ');
  const sourceRows = (
    await source.query({
      text: `SELECT ${keyText}, ${cols} FROM ${qualified(shape)}${filter.text ? `${filter.text} AND` : ' WHERE'} ${inSource.text}`,
      values: [...filter.params, ...inSource.params],
      rowMode: 'array',
    })
  ).rows as (string | null)[][];
  const fresh = new Map(sourceRows.map((r) => [JSON.stringify(r.slice(0, n)), r.slice(n)]));
  // The target's names (a mapping may retarget and rename); values in the same column order.
  const named = onSide(shape, 'target');
  const targetKeyText = named.key.map((k) => `${quoteIdent(k)}::pg_catalog.text`).join(', ');
  const inTarget = keysIn(shape, keys, 1, 'target');
  await target.query('BEGIN');
  try {
    const old = (
      await target.query({
        text: `SELECT ${targetKeyText}, pg_catalog.to_jsonb(t)::pg_catalog.text FROM ${qualified(named)} AS t WHERE ${inTarget.text}`,
        values: inTarget.params,
        rowMode: 'array',
      })
    ).rows as (string | null)[][];
    const before = new Map(old.map((r) => [JSON.stringify(r.slice(0, n)), r[n] ?? null]));
    const deleted = (await target.query({ text: `DELETE FROM ${qualified(named)} WHERE ${inTarget.text}`, values: inTarget.params })).rowCount ?? 0;
    const rows = [...fresh.values()];
    if (rows.length > 0) {
      const insert = insertQuery(named, targetColumns, rows);
      await target.query({ text: insert.text, values: insert.params });
    }
    const log: (string | null)[] = [];
    const values = batch.map((b) => {
      const id = JSON.stringify(b.key);
      const row = fresh.get(id);
      const base = log.length;
      log.push(
        config.subscription,
        `${shape.schema}.${shape.table}`,
        shape.schema,
        shape.table,
        JSON.stringify(Object.fromEntries(shape.key.map((k, i) => [k, b.key[i] ?? null]))),
        row ? JSON.stringify(Object.fromEntries(shape.columns.map((col, i) => [col.name, row[i] ?? null]))) : null,
        before.get(id) ?? null,
        formatLsn(lsn),
        `pgsub verify found it ${b.kind}; ${row ? 're-copied from' : 'deleted: not on'} the source at ${formatLsn(lsn)}`,
      );
      const p = (k: number) => `$${base + k}`;
      return `(${p(1)}, 'verify_repair', ${p(2)}, ${p(3)}, ${p(4)}, ${p(5)}::pg_catalog.jsonb, ${p(6)}::pg_catalog.jsonb, ${p(7)}::pg_catalog.jsonb, ${p(8)}::pg_catalog.pg_lsn, 'repair', ${p(9)})`;
    });
    await target.query({
      text: `INSERT INTO "pgsub"."conflict_log" ("subscription", "conflict_type", "relation", "schema_name", "table_name", "key", "remote_tuple", "local_tuple", "remote_lsn", "policy", "detail") VALUES ${values.join(', ')}`,
      values: log,
    });
    await target.query('COMMIT');
    return { deleted, inserted: rows.length };
  } catch (err) {
    await target.query('ROLLBACK').catch(() => {});
    throw err;
  }
}
