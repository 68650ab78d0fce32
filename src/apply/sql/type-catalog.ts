/**
 * The target's catalog of types, as the relation map asks it (relmap.ts): the types a
 * column's binary format nests (domain base, array element, composite fields, range
 * subtype, multirange range), from which binary.ts plans the OID rewriting, and which
 * types have the equality operator native compares REPLICA IDENTITY FULL rows with. Both
 * lookups walk the same recursive closure of nested types (reachableTypes).
 */
import type { TargetTypeInfo } from './binary.js';
import { quoteQualified } from '../../quote.js';
import { queryRows, type WireConnection } from '../../pgwire/connect.js';

/** A text[] literal for a bind parameter. */
function textArray(values: readonly string[]): string {
  return `{${values.map((v) => `"${v.replace(/[\\"]/g, (c) => `\\${c}`)}"`).join(',')}}`;
}

/** get_element_type's "true" array type (PostgreSQL 14 gave types a subscript handler). */
function isArrayCondition(targetVersionNum: number): string {
  return targetVersionNum >= 140000 ? `t.typelem <> 0 AND t.typsubscript = 'pg_catalog.array_subscript_handler'::pg_catalog.regproc` : `t.typelem <> 0 AND t.typlen = -1`;
}

/**
 * `WITH RECURSIVE reach(oid)`: the types `seed` selects and every type they nest — domain
 * base, array element, composite fields and, with `ranges`, range subtype and multirange
 * range. Shared by the binary-format and the equality lookups.
 */
function reachableTypes(seed: string, targetVersionNum: number, opts: { ranges: boolean }): string {
  const ranges = opts.ranges
    ? `UNION ALL SELECT g.rngsubtype FROM pg_catalog.pg_range g WHERE t.typtype = 'r' AND g.rngtypid = t.oid
                ${targetVersionNum >= 140000 ? `UNION ALL SELECT g.rngtypid FROM pg_catalog.pg_range g WHERE t.typtype = 'm' AND g.rngmultitypid = t.oid` : ''}`
    : '';
  return `WITH RECURSIVE reach(oid) AS (
         ${seed}
       UNION
         SELECT x.oid
           FROM reach r
           JOIN pg_catalog.pg_type t ON t.oid = r.oid
          CROSS JOIN LATERAL (
                SELECT t.typbasetype WHERE t.typtype = 'd'
                UNION ALL SELECT t.typelem WHERE ${isArrayCondition(targetVersionNum)}
                UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
                           WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
                ${ranges}
               ) x(oid)
     )`;
}

/**
 * The target types named (namespace, name) or given by OID, and every type their binary
 * formats nest (domain base, array element, composite fields, range subtype, multirange
 * range), keyed by OID; `name` is the quoted, schema-qualified name.
 */
export async function targetTypes(
  conn: WireConnection,
  targetVersionNum: number,
  names: readonly { namespace: string; name: string }[],
  oids: readonly number[],
): Promise<Map<number, TargetTypeInfo>> {
  const isArray = isArrayCondition(targetVersionNum);
  const rows = await queryRows<{ oid: string; typtype: string; nspname: string; typname: string; base: string; elem: string; fields: string | null; inner: string | null }>(
    conn,
    ['oid', 'typtype', 'nspname', 'typname', 'base', 'elem', 'fields', 'inner'],
    `${reachableTypes(
      `SELECT t.oid
           FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS q(nsp, name)
           JOIN pg_catalog.pg_namespace n ON n.nspname = q.nsp
           JOIN pg_catalog.pg_type t ON t.typnamespace = n.oid AND t.typname = q.name
       UNION
         SELECT pg_catalog.unnest($3::pg_catalog.oid[])`,
      targetVersionNum,
      { ranges: true },
    )}
     SELECT t.oid::int::text AS oid, t.typtype::text AS typtype, n.nspname::text AS nspname, t.typname::text AS typname,
            t.typbasetype::int::text AS base,
            (CASE WHEN ${isArray} THEN t.typelem ELSE 0 END)::int::text AS elem,
            (SELECT pg_catalog.string_agg(a.atttypid::int::text, ',' ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
              WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) AS fields,
            (SELECT (CASE WHEN t.typtype = 'r' THEN g.rngsubtype ELSE g.rngtypid END)::int::text FROM pg_catalog.pg_range g
              WHERE (t.typtype = 'r' AND g.rngtypid = t.oid) ${targetVersionNum >= 140000 ? `OR (t.typtype = 'm' AND g.rngmultitypid = t.oid)` : ''}) AS nested
       FROM reach r
       JOIN pg_catalog.pg_type t ON t.oid = r.oid
       JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace`,
    [textArray(names.map((n) => n.namespace)), textArray(names.map((n) => n.name)), `{${[...new Set(oids)].join(',')}}`],
  );
  return new Map(
    rows.map((r) => [
      Number(r.oid),
      {
        oid: Number(r.oid),
        typtype: r.typtype,
        elem: Number(r.elem),
        base: Number(r.base),
        fields: (r.fields ?? '').split(',').filter(Boolean).map(Number),
        inner: Number(r.inner ?? 0),
        name: quoteQualified(r.nspname, r.typname),
      },
    ]),
  );
}

type TypeRow = {
  oid: string;
  typtype: string;
  base: string;
  elem: string;
  fields: string | null;
  has_opclass: string;
};

/**
 * Which of `typeOids` have an equality operator the way lookup_type_cache(…,
 * TYPECACHE_EQ_OPR_FINFO) finds one, which is what native's tuples_equal
 * (execReplication.c) uses to compare rows of REPLICA IDENTITY FULL relations: the "="
 * of the type's default btree or hash opclass (exact input type or binary-coercible to
 * it, as GetDefaultOpClass), domains by their base type, arrays only if their element
 * type has one, composites only if every field type has one (array_eq / record_eq would
 * fail at run time otherwise); enums, ranges and multiranges always. json, xml, point,
 * box, polygon… have none: native then fails the change with "could not identify an
 * equality operator for type json"; locator.ts compares their text forms instead.
 */
export async function typeEquality(conn: WireConnection, targetVersionNum: number, typeOids: number[]): Promise<Map<number, boolean>> {
  const isArray = isArrayCondition(targetVersionNum);
  const rows = await queryRows<TypeRow>(
    conn,
    ['oid', 'typtype', 'base', 'elem', 'fields', 'has_opclass'],
    `${reachableTypes('SELECT DISTINCT pg_catalog.unnest($1::pg_catalog.oid[])', targetVersionNum, { ranges: false })}
     SELECT t.oid::int::text AS oid, t.typtype::text AS typtype, t.typbasetype::int::text AS base,
            (CASE WHEN ${isArray} THEN t.typelem ELSE 0 END)::int::text AS elem,
            (SELECT pg_catalog.string_agg(a.atttypid::int::text, ',') FROM pg_catalog.pg_attribute a
              WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) AS fields,
            EXISTS (SELECT 1 FROM pg_catalog.pg_opclass oc JOIN pg_catalog.pg_am am ON am.oid = oc.opcmethod
                     WHERE oc.opcdefault AND am.amname IN ('btree', 'hash')
                       AND (oc.opcintype = t.oid
                            OR EXISTS (SELECT 1 FROM pg_catalog.pg_cast k
                                        WHERE k.castsource = t.oid AND k.casttarget = oc.opcintype
                                          AND k.castmethod = 'b' AND k.castcontext = 'i')))::text AS has_opclass
       FROM reach r JOIN pg_catalog.pg_type t ON t.oid = r.oid`,
    [`{${[...new Set(typeOids)].join(',')}}`],
  );
  const info = new Map(rows.map((r) => [Number(r.oid), r]));
  const memo = new Map<number, boolean>();
  const has = (oid: number): boolean => {
    const known = memo.get(oid);
    if (known !== undefined) return known;
    memo.set(oid, false); // a cycle (impossible in a sane catalog) counts as no equality
    const t = info.get(oid);
    let result = false;
    if (t) {
      if (t.typtype === 'd') result = has(Number(t.base));
      else if (Number(t.elem) !== 0) result = has(Number(t.elem));
      else if (t.typtype === 'c')
        result = (t.fields ?? '')
          .split(',')
          .filter(Boolean)
          .every((f) => has(Number(f)));
      else if (t.typtype === 'e' || t.typtype === 'r' || t.typtype === 'm') result = true;
      else result = t.has_opclass === 't' || t.has_opclass === 'true';
    }
    memo.set(oid, result);
    return result;
  };
  return new Map(typeOids.map((oid) => [oid, has(oid)]));
}
