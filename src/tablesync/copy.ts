/**
 * One COPY from the publisher into the target: `COPY (SELECT published columns FROM the
 * table [WHERE row filter] [AND ctid range]) TO STDOUT` inside a source transaction that
 * imported the sync snapshot, piped into `COPY table (columns) FROM STDIN` inside a
 * target transaction that also records the rows copied. Binary format when the
 * subscription is binary, as native. Bytes stream through with back-pressure (relay.ts);
 * nothing is held in memory beyond the stream buffers.
 */
import { pipeline } from 'node:stream/promises';
import type pg from 'pg';
import type { ConnInfo } from '../config/conninfo.js';
import { connectPgClient } from '../connect/drivers.js';
import { quoteIdent, quoteLiteral, quoteQualified } from '../quote.js';
import type { PublishedTable } from './catalog.js';
import { CopyOutRelay, rawCopyIn } from './relay.js';

export interface CopyRange {
  /** First heap page (inclusive) and last (exclusive); null for the whole table. */
  fromPage: number | null;
  toPage: number | null;
}

/** A pg client for COPY: on the target it runs with the apply session's settings. */
export async function openCopyClient(info: ConnInfo, applicationName: string, role: 'source' | 'target'): Promise<pg.Client> {
  return connectPgClient(info, {
    side: role,
    purpose: 'apply',
    what: `a ${role} connection for table sync`,
    applicationName,
    options:
      role === 'target'
        ? '-c session_replication_role=replica -c search_path= -c datestyle=ISO -c default_transaction_read_only=off'
        : '-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c search_path=',
  });
}

/** `(a, b)`, or nothing for a table without columns (COPY takes no empty list). */
function columnList(columns: readonly string[]): string {
  return columns.length === 0 ? '' : ` (${columns.map(quoteIdent).join(', ')})`;
}

export function sourceCopySql(t: PublishedTable, range: CopyRange, binary: boolean): string {
  const cols = t.columns.map(quoteIdent).join(', ');
  // A whole plain table without a row filter: COPY reads the heap directly, as native's
  // tablesync does, without a query's executor overhead (COPY TO never includes children).
  // Generated columns (PG18) are read only by a query, as native's copy does.
  const constant = t.target?.constant;
  if (t.relkind === 'r' && !t.rowFilter && !t.generated && constant === undefined && range.fromPage === null && range.toPage === null) {
    return `COPY ${quoteQualified(t.schema, t.table)}${columnList(t.columns)} TO STDOUT${binary ? ' (FORMAT binary)' : ''}`;
  }
  // COPY of a partitioned root must read its partitions; of a plain table only itself.
  const from = `${t.relkind === 'p' ? '' : 'ONLY '}${quoteQualified(t.schema, t.table)}`;
  const conds: string[] = [];
  if (t.rowFilter) conds.push(`(${t.rowFilter})`);
  if (range.fromPage !== null) conds.push(`ctid >= ${quoteLiteral(`(${range.fromPage},0)`)}::pg_catalog.tid`);
  if (range.toPage !== null) conds.push(`ctid < ${quoteLiteral(`(${range.toPage},0)`)}::pg_catalog.tid`);
  const where = conds.length > 0 ? ` WHERE ${conds.join(' AND ')}` : '';
  const read = constant === undefined ? cols : [...(cols ? [cols] : []), `${quoteLiteral(constant)}::pg_catalog.text`].join(', ');
  return `COPY (SELECT ${read} FROM ${from}${where}) TO STDOUT${binary ? ' (FORMAT binary)' : ''}`;
}

/** `freeze`: the table was created or emptied in the COPY's own transaction (see job.ts). */
export function targetCopySql(t: PublishedTable, binary: boolean, freeze = false): string {
  const options = [...(binary ? ['FORMAT binary'] : []), ...(freeze ? ['FREEZE'] : [])];
  // A mapped table (catalog.ts mapTable): its target name and the target names of the columns read.
  const to = t.target ?? t;
  return `COPY ${quoteQualified(to.schema, to.table)}${columnList(to.columns)} FROM STDIN${options.length > 0 ? ` (${options.join(', ')})` : ''}`;
}

/** The staging table of a copy with computed columns (one per copy transaction, dropped at its commit). */
const STAGING = 'pg_temp."pgsub_copy_staging"';

/**
 * A table with computed columns (catalog.ts CopyTarget.staged) is copied in three steps in
 * the copy's target transaction: the publisher's rows COPYed as they are (binary or text)
 * into a temporary table of the remote column types, then one INSERT … SELECT writing the
 * direct columns and the expressions over the staged row `r` (the same scope the streamed
 * statements give them, apply/sql/statement-text.ts), then the staging table dropped at COMMIT (ON
 * COMMIT DROP; the copy transaction is never prepared, so a temporary table is allowed).
 * A temporary table writes no WAL; measured against COPY into the target in docs/mapping.md.
 * `sourceTypes`: the remote type of each read column; `targetTypes`: the target type of
 * each direct column, where it differs (read through text, as the target type's input
 * function reads a streamed value).
 */
export function stagedCopySql(
  t: PublishedTable,
  sourceTypes: readonly string[],
  targetTypes: ReadonlyMap<string, string>,
  binary: boolean,
): { create: string; copyIn: string; insert: string } {
  const to = t.target!;
  const staged = to.staged!;
  const create = `CREATE TEMPORARY TABLE "pgsub_copy_staging" (${t.columns.map((c, i) => `${quoteIdent(c)} ${sourceTypes[i]}`).join(', ')}) ON COMMIT DROP`;
  const copyIn = `COPY ${STAGING}${columnList(t.columns)} FROM STDIN${binary ? ' (FORMAT binary)' : ''}`;
  const names: string[] = [];
  const values: string[] = [];
  let k = 0;
  t.columns.forEach((c, i) => {
    if (!staged.direct[i]) return;
    const name = to.columns[k++]!;
    names.push(quoteIdent(name));
    const cast = targetTypes.get(name);
    values.push(cast ? `r.${quoteIdent(c)}::pg_catalog.text::${cast}` : `r.${quoteIdent(c)}`);
  });
  for (const [name, expr] of staged.computed) {
    names.push(quoteIdent(name));
    values.push(`(${expr})`);
  }
  // OVERRIDING SYSTEM VALUE: as COPY, a GENERATED ALWAYS identity column takes the copied value.
  const insert = `INSERT INTO ${quoteQualified(to.schema, to.table)} (${names.join(', ')}) OVERRIDING SYSTEM VALUE SELECT ${values.join(', ')} FROM ${STAGING} AS r`;
  return { create, copyIn, insert };
}

/** The remote type of each column `t` reads, as the target spells it (user types schema-qualified). */
export async function sourceColumnTypes(source: pg.Client, t: PublishedTable): Promise<string[]> {
  const { rows } = await source.query<{ attname: string; type: string }>(
    `SELECT a.attname::text AS attname,
            CASE WHEN n.nspname = 'pg_catalog' THEN pg_catalog.format_type(a.atttypid, a.atttypmod)
                 ELSE pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(y.typname) END AS type
       FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type y ON y.oid = a.atttypid JOIN pg_catalog.pg_namespace n ON n.oid = y.typnamespace
      WHERE a.attrelid = ${quoteLiteral(quoteQualified(t.schema, t.table))}::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped`,
  );
  const byName = new Map(rows.map((r) => [r.attname, r.type]));
  return t.columns.map((c) => byName.get(c) ?? 'pg_catalog.text');
}

/** The target table's column types, as sourceColumnTypes spells them. */
async function targetColumnTypes(target: pg.Client, t: PublishedTable): Promise<Map<string, string>> {
  const to = t.target!;
  const { rows } = await target.query<{ attname: string; type: string }>(
    `SELECT a.attname::text AS attname,
            CASE WHEN n.nspname = 'pg_catalog' THEN pg_catalog.format_type(a.atttypid, a.atttypmod)
                 ELSE pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(y.typname) END AS type
       FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type y ON y.oid = a.atttypid JOIN pg_catalog.pg_namespace n ON n.oid = y.typnamespace
      WHERE a.attrelid = $1::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped`,
    [quoteQualified(to.schema, to.table)],
  );
  return new Map(rows.map((r) => [r.attname, r.type]));
}

/** The target type of each direct column of a staged copy whose type differs from the remote one. */
export async function differingTargetTypes(target: pg.Client, t: PublishedTable, sourceTypes: readonly string[]): Promise<Map<string, string>> {
  return differing(t, sourceTypes, await targetColumnTypes(target, t));
}

function differing(t: PublishedTable, sourceTypes: readonly string[], byName: ReadonlyMap<string, string>): Map<string, string> {
  const to = t.target!;
  const out = new Map<string, string>();
  let k = 0;
  t.columns.forEach((_, i) => {
    if (!to.staged!.direct[i]) return;
    const name = to.columns[k++]!;
    const type = byName.get(name);
    if (type !== undefined && type !== sourceTypes[i]) out.set(name, type);
  });
  return out;
}

/** Types whose input and binary receive take a text value as it is (a typmod is checked as on input). */
const TEXT_LIKE = /^(text|name|character varying(\(\d+\))?|character(\(\d+\))?)$/;

/**
 * A shard of a many-to-one table with no computed column of its own, as the straight COPY
 * (no staging table, no INSERT … SELECT — about half the time): the discriminator's value
 * is read on the publisher as a text literal after the columns. Only where the COPY can
 * take it as it is: in binary mode every direct column's type equal on both sides and the
 * discriminator column text-like; else null, and the copy is staged.
 */
export async function straightShardCopy(source: pg.Client, target: pg.Client, t: PublishedTable, binary: boolean): Promise<PublishedTable | null> {
  const to = t.target;
  const disc = to?.discriminator;
  if (!to?.staged || !disc || to.staged.computed.length !== 1 || to.staged.direct.some((d) => !d)) return null;
  if (binary) {
    const targetTypes = await targetColumnTypes(target, t);
    if (!TEXT_LIKE.test(targetTypes.get(disc.column) ?? '')) return null;
    if (differing(t, await sourceColumnTypes(source, t), targetTypes).size > 0) return null;
  }
  const { staged: _staged, ...straight } = to;
  return { ...t, target: { ...straight, columns: [...to.columns, disc.column], constant: disc.value } };
}

/** A `COPY … FROM STDIN` the target has started (startCopyIn). */
export type CopyIn = ReturnType<typeof rawCopyIn>;

/**
 * One range is streamed in two steps, in transactions the caller owns: startCopyIn on the
 * target, resolved once the target has taken the COPY, then relayInto from the publisher.
 * The publisher starts reading only after the first step, so a target that refuses the
 * COPY (a missing column, FREEZE not allowed) costs no scan on the publisher, and both
 * connections stay usable; the error is the target's.
 */
export async function startCopyIn(target: pg.Client, t: PublishedTable, options: { binary: boolean; freeze?: boolean; sql?: string }): Promise<CopyIn> {
  const writer = rawCopyIn(options.sql ?? targetCopySql(t, options.binary, options.freeze));
  target.query(writer as unknown as pg.QueryConfig);
  await writer.accepted;
  return writer;
}

/**
 * The publisher side: stream the range into a started COPY; returns rows and bytes
 * copied. The publisher's CopyData messages go to the target as they are (relay.ts).
 * `onData` sees bytes and messages as they pass: in text format one message is one row, in
 * binary format the header and trailer ride in messages too, so live counts may be off by
 * those; the returned rows are the target's own count.
 */
export async function relayInto(
  writer: CopyIn,
  source: pg.Client,
  t: PublishedTable,
  range: CopyRange,
  binary: boolean,
  onData: (bytes: number, rows: number) => void,
): Promise<{ rows: number; bytes: number }> {
  const reader = new CopyOutRelay(sourceCopySql(t, range, binary), (messages, bytes) => onData(bytes, messages));
  source.query(reader as unknown as pg.QueryConfig);
  await pipeline(reader, writer);
  return { rows: Number(writer.rowCount ?? 0), bytes: reader.bytes };
}

/**
 * Page ranges of about equal size, each at least `minPages` (and 8) pages; one range (the
 * whole table) when splitting is not possible or not worth it. A range costs two
 * connections, a transaction and a query-based COPY on each side, ranges of one table
 * contend on its WAL and relation extension, and only a table copied whole can be loaded
 * frozen (job.ts). Measured, whole tables copied faster up to a few hundred MB
 * (docs/design-measurements.md), hence the default minimum of 256 MB per range
 * (sync_range_min_mb).
 */
export function splitRanges(t: PublishedTable, maxParts: number, canSplit: boolean, minPages = 8): CopyRange[] {
  const parts = Math.min(maxParts, Math.floor(t.pages / Math.max(minPages, 8)));
  if (!canSplit || parts <= 1 || t.relkind !== 'r') return [{ fromPage: null, toPage: null }];
  const step = Math.ceil(t.pages / parts);
  const ranges: CopyRange[] = [];
  for (let i = 0; i < parts; i++) {
    // The last range is open-ended: pages added since the estimate are still copied.
    ranges.push({ fromPage: i === 0 ? null : i * step, toPage: i === parts - 1 ? null : (i + 1) * step });
  }
  return ranges;
}
