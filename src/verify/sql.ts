/**
 * The SQL of `pgsub verify`, built from a table's shape: the normalised text of a row (what
 * is hashed on both sides, so two servers of different versions agree on equal values),
 * the key-range predicate, and the per-range queries — a range's count and order-independent
 * hash (two 32-bit halves of md5 summed as int4 into bigints: additions commute, so the
 * database aggregates in any order and a multiset without a key hashes too), the sampled
 * boundaries that split a range, and the leaf's keys with row hashes. Pure: no connection.
 * Values are parameters, identifiers quoted; keys travel as text and are cast back.
 *
 * Normalisation (normalise.ts, docs/verify.md): float4/float8 by their binary form with -0
 * made 0 and every NaN alike; numeric and money without trailing fractional zeros; json
 * through jsonb; bytea as hex; timestamptz at UTC; arrays and composites holding these
 * element by element and field by field. Everything else by its text output, under the
 * session settings the comparison connections fix (SESSION_OPTIONS). Domains as their base.
 */
import { quoteIdent } from '../quote.js';
import { scalarText, treeText, type TypeTree } from './normalise.js';

export interface ColumnInfo {
  name: string;
  /** format_type of the column: what parameters are cast to. */
  type: string;
  /** The type's name, or its base type's for a domain. */
  base: string;
  collatable: boolean;
  /** A stored generated column (never written by a repair). */
  generated: boolean;
  /** GENERATED ALWAYS AS IDENTITY (a repair writes it with OVERRIDING SYSTEM VALUE). */
  identityAlways: boolean;
  /** The column's type (pg_type oid, as text): what its type tree is looked up by. */
  typeOid?: string;
  /** An array or composite holding a normalised type (normalise.ts); absent: a scalar by `base`. */
  tree?: TypeTree;
}

export interface TableShape {
  schema: string;
  table: string;
  /** The compared columns, in the source's order. */
  columns: ColumnInfo[];
  /** The primary key's columns (by name, in key order); empty: no key. */
  key: string[];
  /** The publication's row filter (source side only), or null. */
  rowFilter: string | null;
  /**
   * A mapping that retargets, renames or excludes (config mapping:): the target table and
   * the target name of each compared column, in `columns`' order. Absent: the same names.
   */
  target?: { schema: string; table: string; names: readonly string[] };
}

const SIDES = new WeakMap<TableShape, TableShape>();

/** The shape as one side names it: the source's names, or the mapping's target names. */
export function onSide(shape: TableShape, side: 'source' | 'target'): TableShape {
  const t = shape.target;
  if (side === 'source' || t === undefined) return shape;
  let named = SIDES.get(shape);
  if (named === undefined) {
    const rename = new Map(shape.columns.map((c, i) => [c.name, t.names[i]!]));
    named = {
      schema: t.schema,
      table: t.table,
      columns: shape.columns.map((c, i) => ({ ...c, name: t.names[i]! })),
      key: shape.key.map((k) => rename.get(k)!),
      rowFilter: shape.rowFilter,
    };
    SIDES.set(shape, named);
  }
  return named;
}

/** A key range: `lo` inclusive, `hi` exclusive, as key values in text; null: unbounded. */
export interface KeyRange {
  lo: string[] | null;
  hi: string[] | null;
}

export interface Query {
  text: string;
  params: string[];
}

/**
 * The session settings both sides' comparison connections run with (startup options);
 * lc_monetary C: money's text (inside arrays and composites, and what a repair copies)
 * is the same on both servers.
 */
export const SESSION_OPTIONS = '-c datestyle=ISO -c intervalstyle=postgres -c timezone=UTC -c extra_float_digits=3 -c bytea_output=hex -c lc_monetary=C';

const TEXT = 'pg_catalog.text';

/** The normalised text of one column's value (NULL stays NULL): by its type tree, or its base type. */
export function normalisedColumn(c: Pick<ColumnInfo, 'name' | 'base' | 'tree'>): string {
  const q = quoteIdent(c.name);
  return c.tree ? treeText(q, c.tree) : scalarText(q, c.base);
}

/** A row's normalised text: a ROW() of the normalised columns (NULL and '' stay apart). */
export function rowText(columns: readonly Pick<ColumnInfo, 'name' | 'base' | 'tree'>[]): string {
  return `ROW(${columns.map(normalisedColumn).join(', ')})::${TEXT}`;
}

export function qualified(shape: Pick<TableShape, 'schema' | 'table'>): string {
  return `${quoteIdent(shape.schema)}.${quoteIdent(shape.table)}`;
}

function keyColumns(shape: TableShape): ColumnInfo[] {
  return shape.key.map((k) => {
    const c = shape.columns.find((col) => col.name === k);
    if (!c) throw new Error(`key column ${k} of ${shape.schema}.${shape.table} is not compared`);
    return c;
  });
}

/** A key column as ranges compare it: collatable ones bytewise, so both servers order them alike. */
function keyExpr(c: ColumnInfo): string {
  return c.collatable ? `${quoteIdent(c.name)} COLLATE "C"` : quoteIdent(c.name);
}

function keyTuple(cols: ColumnInfo[]): string {
  return cols.length === 1 ? keyExpr(cols[0]!) : `ROW(${cols.map(keyExpr).join(', ')})`;
}

function valueTuple(cols: ColumnInfo[], first: number): string {
  const values = cols.map((c, i) => `$${first + i}::${c.type}`);
  return cols.length === 1 ? values[0]! : `ROW(${values.join(', ')})`;
}

/** `WHERE …` for a range (and the source's row filter), with its parameters from `$first`. */
export function rangeWhere(shape: TableShape, range: KeyRange | null, side: 'source' | 'target', first = 1): Query {
  shape = onSide(shape, side);
  const parts: string[] = [];
  const params: string[] = [];
  if (side === 'source' && shape.rowFilter !== null) parts.push(`(${shape.rowFilter})`);
  if (range !== null && shape.key.length > 0) {
    const cols = keyColumns(shape);
    if (range.lo !== null) {
      parts.push(`${keyTuple(cols)} >= ${valueTuple(cols, first + params.length)}`);
      params.push(...range.lo);
    }
    if (range.hi !== null) {
      parts.push(`${keyTuple(cols)} < ${valueTuple(cols, first + params.length)}`);
      params.push(...range.hi);
    }
  }
  return { text: parts.length > 0 ? ` WHERE ${parts.join(' AND ')}` : '', params };
}

/** count, the two hash sums, and the bytes of normalised text, of the rows in a range. */
export function hashQuery(shape: TableShape, range: KeyRange | null, side: 'source' | 'target'): Query {
  shape = onSide(shape, side);
  const where = rangeWhere(shape, range, side);
  const half = (from: number) => `pg_catalog.sum(('x' || pg_catalog.substr(h, ${from}, 8))::pg_catalog.bit(32)::pg_catalog.int4)`;
  return {
    text:
      `SELECT pg_catalog.count(*)::${TEXT}, COALESCE(${half(1)}, 0)::${TEXT}, COALESCE(${half(9)}, 0)::${TEXT}, COALESCE(pg_catalog.sum(pg_catalog.octet_length(r)), 0)::${TEXT} ` +
      `FROM (SELECT pg_catalog.md5(r) AS h, r FROM (SELECT ${rowText(shape.columns)} AS r FROM ${qualified(shape)}${where.text}) AS rows) AS hashed`,
    params: where.params,
  };
}

function orderByKey(shape: TableShape): string {
  return keyColumns(shape).map(keyExpr).join(', ');
}

/** The key columns as text, in key order (how keys travel). */
export function keyText(shape: TableShape): string {
  return keyColumns(shape)
    .map((c) => `${quoteIdent(c.name)}::${TEXT}`)
    .join(', ');
}

/** A leaf: every row's key (as text) and row hash. */
export function leafQuery(shape: TableShape, range: KeyRange | null, side: 'source' | 'target'): Query {
  shape = onSide(shape, side);
  const where = rangeWhere(shape, range, side);
  return { text: `SELECT ${keyText(shape)}, pg_catalog.md5(${rowText(shape.columns)}) FROM ${qualified(shape)}${where.text}`, params: where.params };
}

/** The first `limit` keys of a range (a range one side does not have at all). */
export function keysQuery(shape: TableShape, range: KeyRange | null, side: 'source' | 'target', limit: number): Query {
  shape = onSide(shape, side);
  const where = rangeWhere(shape, range, side);
  return { text: `SELECT ${keyText(shape)} FROM ${qualified(shape)}${where.text} ORDER BY ${orderByKey(shape)} LIMIT ${Math.max(0, Math.floor(limit))}`, params: where.params };
}

/** Every `step`-th key of a range in key order: the boundaries that split it. */
export function boundariesQuery(shape: TableShape, range: KeyRange | null, side: 'source' | 'target', step: number): Query {
  shape = onSide(shape, side);
  const where = rangeWhere(shape, range, side);
  const cols = keyColumns(shape);
  const names = cols.map((_, i) => `k${i}`);
  return {
    text:
      `SELECT ${names.join(', ')} FROM (SELECT ${cols.map((c, i) => `${quoteIdent(c.name)}::${TEXT} AS k${i}`).join(', ')}, ` +
      `pg_catalog.row_number() OVER (ORDER BY ${orderByKey(shape)}) AS rn FROM ${qualified(shape)}${where.text}) AS numbered ` +
      `WHERE rn % ${Math.max(1, Math.floor(step))} = 0 ORDER BY rn`,
    params: where.params,
  };
}

/** A single integer key's smallest and largest value (index ends). */
export function minMaxQuery(shape: TableShape, side: 'source' | 'target'): Query {
  shape = onSide(shape, side);
  const where = rangeWhere(shape, null, side);
  const k = quoteIdent(shape.key[0]!);
  return { text: `SELECT pg_catalog.min(${k})::${TEXT}, pg_catalog.max(${k})::${TEXT} FROM ${qualified(shape)}${where.text}`, params: where.params };
}

/** `key IN (…)` for a list of keys (text values cast to the key's types), parameters from `$first`. */
export function keysIn(shape: TableShape, keys: readonly string[][], first = 1, side: 'source' | 'target' = 'source'): Query {
  shape = onSide(shape, side);
  const cols = keyColumns(shape);
  const tuples = keys.map((_, i) => valueTuple(cols, first + i * cols.length));
  const plain = cols.length === 1 ? quoteIdent(cols[0]!.name) : `ROW(${cols.map((c) => quoteIdent(c.name)).join(', ')})`;
  return { text: `${plain} IN (${tuples.join(', ')})`, params: keys.flat() };
}

/** Columns of a table with what the queries need, for `$1` = the quoted table name. */
export function columnsQuery(serverVersionNum: number): string {
  const generated = serverVersionNum >= 120000 ? `a.attgenerated <> ''` : 'false';
  return (
    `SELECT a.attname::${TEXT}, pg_catalog.format_type(a.atttypid, a.atttypmod), bt.typname::${TEXT}, (a.attcollation <> 0)::${TEXT}, (${generated})::${TEXT}, ` +
    `(a.attidentity = 'a')::${TEXT}, COALESCE(k.pos, 0)::${TEXT}, a.atttypid::${TEXT} ` +
    `FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid ` +
    `JOIN pg_catalog.pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END ` +
    // indkey is an int2vector, a 0-based array: its position by ordinality.
    `LEFT JOIN LATERAL (SELECT u.ord AS pos FROM pg_catalog.pg_index i, pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS u(attnum, ord) ` +
    `WHERE i.indrelid = a.attrelid AND i.indisprimary AND u.attnum = a.attnum) k ON true ` +
    `WHERE a.attrelid = $1::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`
  );
}

/** What columnsQuery returned, as columns and the key. */
export function parseColumns(rows: readonly (string | null)[][]): { columns: ColumnInfo[]; key: string[] } {
  const columns = rows.map((r) => ({
    name: r[0]!,
    type: r[1]!,
    base: r[2]!,
    collatable: r[3] === 'true',
    generated: r[4] === 'true',
    identityAlways: r[5] === 'true',
    ...(r[7] ? { typeOid: r[7] } : {}),
  }));
  const key = rows
    .filter((r) => Number(r[6]) > 0)
    .sort((a, b) => Number(a[6]) - Number(b[6]))
    .map((r) => r[0]!);
  return { columns, key };
}
