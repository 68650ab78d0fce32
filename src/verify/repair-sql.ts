/**
 * The statements of `pgsub verify --repair` (repair.ts), built from a table's shape under
 * the target's names and the target's catalog: the rows of a batch of keys read on each
 * side (key, normalised row hash, and the values to copy or the old row to log), then one
 * UPDATE for the keys on both sides, one INSERT for the keys only the source has, one
 * DELETE for the keys only the target has. The UPDATE sets the compared columns only: a
 * column only the target has (a local column, one a mapping excludes) keeps its value, and
 * triggers see an update. Values travel as text arrays (one parameter per column, unnested),
 * cast to the target's column types. Pure: no connection.
 */
import { quoteIdent } from '../quote.js';
import { keysIn, keyText, onSide, qualified, rangeWhere, rowText, type ColumnInfo, type TableShape } from './sql.js';

const TEXT = 'pg_catalog.text';

export interface Statement {
  text: string;
  params: (string | null | (string | null)[])[];
}

/**
 * The source's rows of `keys` (with the publication's row filter): key as text, the
 * normalised row's md5, then every compared column as text.
 */
export function sourceRowsQuery(shape: TableShape, keys: readonly string[][]): Statement {
  const filter = rangeWhere(shape, null, 'source');
  const inKeys = keysIn(shape, keys, filter.params.length + 1);
  const cols = shape.columns.map((c) => `${quoteIdent(c.name)}::${TEXT}`).join(', ');
  return {
    text: `SELECT ${keyText(shape)}, pg_catalog.md5(${rowText(shape.columns)}), ${cols} FROM ${qualified(shape)}${filter.text ? `${filter.text} AND` : ' WHERE'} ${inKeys.text}`,
    params: [...filter.params, ...inKeys.params],
  };
}

/**
 * The target's rows of `keys`, locked for the batch's writes: key as text, the normalised
 * row's md5 (the compared columns under the target's names) and the whole row as JSON (the
 * repair log's local_tuple).
 */
export function targetRowsQuery(shape: TableShape, keys: readonly string[][]): Statement {
  const named = onSide(shape, 'target');
  const inKeys = keysIn(shape, keys, 1, 'target');
  return {
    text: `SELECT ${keyText(named)}, pg_catalog.md5(${rowText(named.columns)}), pg_catalog.to_jsonb(pgsub_old.*)::${TEXT} FROM ${qualified(named)} AS pgsub_old WHERE ${inKeys.text} FOR UPDATE`,
    params: inKeys.params,
  };
}

/** The target columns a repair writes, each with the index of its value in a source row. */
function written(shape: TableShape, target: readonly ColumnInfo[], skip: (c: ColumnInfo, name: string) => boolean): { column: ColumnInfo; index: number }[] {
  const named = onSide(shape, 'target');
  const out: { column: ColumnInfo; index: number }[] = [];
  for (const [index, c] of named.columns.entries()) {
    const column = target.find((t) => t.name === c.name);
    if (column && !column.generated && !skip(column, c.name)) out.push({ column, index });
  }
  return out;
}

/** `n` text-array parameters side by side as rows (the zipping unnest(a, b, …) is only the unqualified spelling of this). */
function unnested(n: number): string {
  return `ROWS FROM (${Array.from({ length: n }, (_, i) => `pg_catalog.unnest($${i + 1}::${TEXT}[])`).join(', ')})`;
}

function columnArrays(rows: readonly (readonly (string | null)[])[], indexes: readonly number[]): (string | null)[][] {
  return indexes.map((i) => rows.map((r) => r[i] ?? null));
}

/**
 * INSERT of source rows (compared columns, in the source's order) into the target: the
 * columns it does not generate, identity columns with OVERRIDING SYSTEM VALUE.
 */
export function insertStatement(shape: TableShape, target: readonly ColumnInfo[], rows: readonly (readonly (string | null)[])[]): Statement {
  const cols = written(shape, target, () => false);
  const names = cols.map((c) => quoteIdent(c.column.name));
  const aliases = cols.map((_, i) => `c${i}`);
  const overriding = cols.some((c) => c.column.identityAlways) ? ' OVERRIDING SYSTEM VALUE' : '';
  return {
    text:
      `INSERT INTO ${qualified(onSide(shape, 'target'))} (${names.join(', ')})${overriding} SELECT ${cols.map((c, i) => `v.${aliases[i]}::${c.column.type}`).join(', ')} ` +
      `FROM ${unnested(cols.length)} AS v(${aliases.join(', ')})`,
    params: columnArrays(
      rows,
      cols.map((c) => c.index),
    ),
  };
}

/**
 * UPDATE of the target rows of these source rows' keys: every compared column that is not
 * a key column (equal by the match), not generated and not GENERATED ALWAYS AS IDENTITY
 * (which only DEFAULT may update; the apply leaves it too). Null when nothing is settable.
 */
export function updateStatement(shape: TableShape, target: readonly ColumnInfo[], rows: readonly (readonly (string | null)[])[]): Statement | null {
  const named = onSide(shape, 'target');
  const keyCols = named.key.map((k) => ({ column: target.find((t) => t.name === k), index: named.columns.findIndex((c) => c.name === k) }));
  if (keyCols.some((k) => k.column === undefined || k.index < 0)) throw new Error(`key of ${named.schema}.${named.table} not found on the target`);
  const set = written(shape, target, (c) => c.identityAlways || named.key.includes(c.name));
  if (set.length === 0) return null;
  const keyAliases = keyCols.map((_, i) => `k${i}`);
  const setAliases = set.map((_, i) => `c${i}`);
  const arrays = [...keyCols.map((k) => k.index), ...set.map((c) => c.index)];
  return {
    text:
      `UPDATE ${qualified(named)} AS pgsub_t SET ${set.map((c, i) => `${quoteIdent(c.column.name)} = v.${setAliases[i]}::${c.column.type}`).join(', ')} ` +
      `FROM ${unnested(arrays.length)} AS v(${[...keyAliases, ...setAliases].join(', ')}) ` +
      `WHERE ${keyCols.map((k, i) => `pgsub_t.${quoteIdent(k.column!.name)} = v.${keyAliases[i]}::${k.column!.type}`).join(' AND ')}`,
    params: columnArrays(rows, arrays),
  };
}

/** DELETE of the target rows of these keys (text values, key order). */
export function deleteStatement(shape: TableShape, keys: readonly string[][]): Statement {
  const inKeys = keysIn(shape, keys, 1, 'target');
  return { text: `DELETE FROM ${qualified(onSide(shape, 'target'))} WHERE ${inKeys.text}`, params: inKeys.params };
}
