/**
 * How verify normalises a value before hashing it (docs/verify.md, "Normalised types"): the
 * expression giving one column's normalised text, the same on both servers whatever their
 * versions and settings. Scalars by their base type's rule; arrays element by element (with
 * their dimensions) and composites field by field, recursively, when they hold a type whose
 * text is not comparable as is — float8[] printed by PostgreSQL 11 and by 18, a NaN inside a
 * composite. A float array without a NaN or a zero goes by its binary form, at C speed. The type tree is read from the catalog (typeTreeQuery) once per column type.
 * Pure: no connection.
 */
import { quoteIdent } from '../quote.js';

/** Types whose text output is not compared as is. */
export const NORMALISED_TYPES = ['float4', 'float8', 'numeric', 'money', 'json', 'bytea', 'timestamptz'] as const;

const NORMALISED = new Set<string>(NORMALISED_TYPES);
const TEXT = 'pg_catalog.text';

/**
 * A column type that holds a normalised type below its top level: an array (its element
 * type's tree; `type` is the array type itself, what a domain over it is cast to) or a
 * composite (its fields, in order). A scalar leaf names its base type.
 */
export type TypeTree = { kind: 'scalar'; base: string } | { kind: 'array'; type: string; elem: TypeTree } | { kind: 'composite'; fields: { name: string; tree: TypeTree }[] };

function trimScale(expr: string): string {
  return `CASE WHEN ${expr} LIKE '%.%' THEN pg_catalog.rtrim(pg_catalog.rtrim(${expr}, '0'), '.') ELSE ${expr} END`;
}

/**
 * A float by its IEEE bits with -0 made 0 (text output changed in PostgreSQL 12); every NaN
 * as 'NaN' (PostgreSQL takes all NaNs as equal, but their bits differ: 'Infinity' - 'Infinity'
 * is a negative NaN on x86, the text 'NaN' a positive one).
 */
function floatText(expr: string, type: 'float4' | 'float8'): string {
  const t = `pg_catalog.${type}`;
  return `CASE WHEN ${expr} OPERATOR(pg_catalog.=) 'NaN'::${t} THEN 'NaN' ELSE pg_catalog.encode(pg_catalog.${type}send(${expr} OPERATOR(pg_catalog.+) 0::${t}), 'hex') END`;
}

/** The normalised text of a scalar value of base type `base` (NULL stays NULL). */
export function scalarText(expr: string, base: string): string {
  switch (base) {
    case 'float4':
    case 'float8':
      return floatText(expr, base);
    case 'numeric':
      return trimScale(`${expr}::${TEXT}`);
    case 'money':
      return trimScale(`${expr}::pg_catalog.numeric::${TEXT}`);
    case 'json':
      return `${expr}::pg_catalog.jsonb::${TEXT}`;
    case 'bytea':
      return `pg_catalog.encode(${expr}::pg_catalog.bytea, 'hex')`;
    case 'timestamptz':
      return `(${expr} AT TIME ZONE 'UTC')::${TEXT}`;
    default:
      return `${expr}::${TEXT}`;
  }
}

/**
 * The normalised text of a value of type `tree`. An array: its dimensions (bounds) and the
 * array of its normalised elements in order (NULL elements kept apart from 'NULL' by the
 * array's own quoting); a composite: the row of its normalised fields, a NULL composite
 * staying NULL (num_nulls: `IS NULL` is also true of a row whose fields are all NULL).
 * `depth` keeps the aliases of nested element lists apart.
 */
export function treeText(expr: string, tree: TypeTree, depth = 0): string {
  switch (tree.kind) {
    case 'scalar':
      return scalarText(expr, tree.base);
    case 'array': {
      const u = `u${depth}`;
      const value = `(${expr})::${tree.type}`;
      // unnest in the select list, in lockstep with the positions: in FROM, an array of a
      // composite type would be expanded into its fields (and a NULL element lost among them).
      const elements =
        `(SELECT pg_catalog.array_agg(${treeText(`${u}.e`, tree.elem, depth + 1)} ORDER BY ${u}.i)::${TEXT} ` +
        `FROM (SELECT pg_catalog.unnest(${value}) AS e, pg_catalog.generate_series(1, pg_catalog.cardinality(${value})) AS i) AS ${u})`;
      const slow = `COALESCE(pg_catalog.array_dims(${value}), '') || COALESCE(${elements}, '{}')`;
      if (tree.elem.kind === 'scalar' && (tree.elem.base === 'float8' || tree.elem.base === 'float4')) {
        // A float array without a NaN or a zero is its binary form (array_send; as an array of
        // the base type, whose oid both servers share), without the word saying whether a
        // NULL bitmap is present (an array may keep one with no NULL left): at C speed.
        // Element by element only where a NaN's bits or a zero's sign may differ.
        const t = `pg_catalog.${tree.elem.base}`;
        const bits = `pg_catalog.array_send((${expr})::${t}[])`;
        const fast = `'b' || pg_catalog.encode(pg_catalog.overlay(${bits}, pg_catalog.decode('00000000', 'hex'), 5, 4), 'hex')`;
        return `CASE WHEN ${expr} IS NULL THEN NULL WHEN 'NaN'::${t} OPERATOR(pg_catalog.=) ANY (${value}) OR 0::${t} OPERATOR(pg_catalog.=) ANY (${value}) THEN ${slow} ELSE ${fast} END`;
      }
      return `CASE WHEN ${expr} IS NULL THEN NULL ELSE ${slow} END`;
    }
    case 'composite': {
      const fields = tree.fields.map((f) => treeText(`(${expr}).${quoteIdent(f.name)}`, f.tree, depth + 1));
      return `CASE WHEN pg_catalog.num_nulls(${expr}) OPERATOR(pg_catalog.=) 1 THEN NULL ELSE ROW(${fields.join(', ')})::${TEXT} END`;
    }
  }
}

/**
 * One row per type reachable from the types `$1` (oid[]): through a domain's base type, an
 * array's element type, a composite's field types. Each with its kind (typtype), its name,
 * the array element (0: not an array) and the composite's fields as JSON [[name, oid], …].
 */
export function typeTreeQuery(): string {
  const fields = `SELECT a.attname::${TEXT} AS name, a.atttypid::${TEXT} AS oid, a.attnum FROM pg_catalog.pg_attribute a WHERE ty.typtype = 'c' AND a.attrelid = ty.typrelid AND a.attnum > 0 AND NOT a.attisdropped`;
  // An array in PostgreSQL's own sense: a varlena with an element type (not point or name).
  const elem = `CASE WHEN ty.typelem <> 0 AND ty.typlen = -1 THEN ty.typelem ELSE 0 END`;
  return (
    `WITH RECURSIVE reach(oid) AS (SELECT pg_catalog.unnest($1::pg_catalog.oid[]) ` +
    `UNION SELECT x.oid FROM reach JOIN pg_catalog.pg_type ty ON ty.oid = reach.oid CROSS JOIN LATERAL (` +
    `SELECT ty.typbasetype AS oid WHERE ty.typtype = 'd' UNION ALL SELECT ${elem} WHERE ${elem} <> 0 UNION ALL SELECT f.oid::pg_catalog.oid FROM (${fields}) f) x) ` +
    `SELECT ty.oid::${TEXT}, ty.typtype::${TEXT}, ty.typname::${TEXT}, pg_catalog.format_type(ty.oid, NULL), ty.typbasetype::${TEXT}, (${elem})::${TEXT}, ` +
    `(SELECT pg_catalog.json_agg(pg_catalog.json_build_array(f.name, f.oid) ORDER BY f.attnum) FROM (${fields}) f)::${TEXT} ` +
    `FROM reach JOIN pg_catalog.pg_type ty ON ty.oid = reach.oid`
  );
}

interface TypeRow {
  typtype: string;
  name: string;
  format: string;
  base: string;
  elem: string;
  fields: [string, string][] | null;
}

/**
 * The trees of the types typeTreeQuery returned, by oid: only the types that hold a
 * normalised type below their top level (an array of them, a composite with one, a domain
 * over either); every other type is compared by its text, as a scalar is.
 */
export function typeTrees(rows: readonly (string | null)[][]): Map<string, TypeTree> {
  const types = new Map<string, TypeRow>(
    rows.map((r) => [r[0]!, { typtype: r[1]!, name: r[2]!, format: r[3]!, base: r[4]!, elem: r[5]!, fields: r[6] ? (JSON.parse(r[6]) as [string, string][]) : null }]),
  );
  const memo = new Map<string, TypeTree | null>();
  /** The type's tree, or null when its text is compared as is (a scalar leaf: { scalar } with its name). */
  const resolve = (oid: string, seen: Set<string>): { tree: TypeTree | null; scalar: string } => {
    const t = types.get(oid);
    if (t === undefined || seen.has(oid)) return { tree: null, scalar: t?.name ?? 'text' };
    if (t.typtype === 'd') return resolve(t.base, new Set(seen).add(oid));
    if (memo.has(oid)) return { tree: memo.get(oid)!, scalar: t.name };
    const inner = new Set(seen).add(oid);
    let tree: TypeTree | null = null;
    if (t.elem !== '0') {
      const e = resolve(t.elem, inner);
      const elem: TypeTree | null = e.tree ?? (NORMALISED.has(e.scalar) ? { kind: 'scalar', base: e.scalar } : null);
      if (elem !== null) tree = { kind: 'array', type: t.format, elem };
    } else if (t.typtype === 'c' && t.fields) {
      const fields = t.fields.map(([name, fieldOid]) => {
        const f = resolve(String(fieldOid), inner);
        return { name, tree: f.tree ?? { kind: 'scalar' as const, base: f.scalar }, normalised: f.tree !== null || NORMALISED.has(f.scalar) };
      });
      if (fields.some((f) => f.normalised)) tree = { kind: 'composite', fields: fields.map(({ name, tree: ft }) => ({ name, tree: ft })) };
    }
    memo.set(oid, tree);
    return { tree, scalar: t.name };
  };
  const out = new Map<string, TypeTree>();
  for (const oid of types.keys()) {
    const { tree } = resolve(oid, new Set());
    if (tree !== null) out.set(oid, tree);
  }
  return out;
}
