/**
 * What the published tables are made of and depend on, read from either side's catalogs:
 * their columns (name, type as format_type prints it, NOT NULL, default, identity), the
 * partitions under a published root, the sequences they use (owned by a column — serial
 * or identity — or named in a default), and the user-defined types, functions, collations
 * and extensions behind them. Preflight compares these between the sides, schema copy
 * dumps what they name, the sequence sync copies the sequences. Catalog queries work on
 * PostgreSQL 10 and later and return text only (db.ts).
 */
import type { Db, Row } from './db.js';
import { isTrue, relationsParam } from './db.js';

export interface Rel {
  schema: string;
  table: string;
}

export const relName = (r: Rel): string => `${r.schema}.${r.table}`;

export interface Column {
  name: string;
  /** format_type(atttypid, atttypmod), e.g. "character varying(20)", "shop.mood". */
  type: string;
  typeOid: string;
  notNull: boolean;
  /** The default expression as pg_get_expr prints it; null without one. */
  default: string | null;
  /** 'a' always / 'd' by default for identity columns, '' otherwise. */
  identity: string;
  /** 's' for a stored generated column (PostgreSQL 12+), '' otherwise. */
  generated: string;
  /** schema.name of a collation other than the type's default; null otherwise. */
  collation: string | null;
}

/** The rows of `json_to_recordset($1)` joined to pg_class: the relations named, as they exist here. */
const NAMED = `pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
  JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema
  JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name`;

/** Columns per `schema.table` of the relations that exist on this side (absent ones are missing from the map). */
export async function readColumns(db: Db, rels: readonly Rel[]): Promise<Map<string, Column[]>> {
  const generated = db.versionNum >= 120000 ? 'a.attgenerated::text' : `''`;
  const rows = await db.query<Row>(
    `SELECT n.nspname::text AS schema, c.relname::text AS rel, a.attname::text AS name,
            pg_catalog.format_type(a.atttypid, a.atttypmod) AS type, a.atttypid::text AS type_oid, a.attnotnull::text AS not_null,
            pg_catalog.pg_get_expr(d.adbin, d.adrelid) AS def, a.attidentity::text AS identity, ${generated} AS generated,
            CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN cn.nspname || '.' || co.collname END AS collation
       FROM ${NAMED}
       JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
       LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
       LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
       LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace
      ORDER BY n.nspname, c.relname, a.attnum`,
    [relationsParam(rels)],
  );
  const out = new Map<string, Column[]>();
  for (const r of rows) {
    const key = `${r.schema}.${r.rel}`;
    const cols = out.get(key) ?? [];
    cols.push({
      name: r.name!,
      type: r.type!,
      typeOid: r.type_oid!,
      notNull: isTrue(r.not_null),
      default: r.def ?? null,
      identity: r.identity ?? '',
      generated: r.generated ?? '',
      collation: r.collation ?? null,
    });
    out.set(key, cols);
  }
  return out;
}

/** Partitions (and inheritance children) under the given relations, at any depth, excluding the relations themselves. */
export function readDescendants(db: Db, rels: readonly Rel[]): Promise<Rel[]> {
  return readInheritance(db, rels, 'down');
}

/** Partitioned tables (and inheritance parents) above the given relations, at any depth: a published partition needs them to exist. */
export function readAncestors(db: Db, rels: readonly Rel[]): Promise<Rel[]> {
  return readInheritance(db, rels, 'up');
}

async function readInheritance(db: Db, rels: readonly Rel[], direction: 'up' | 'down'): Promise<Rel[]> {
  const step =
    direction === 'down'
      ? 'SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid'
      : 'SELECT i.inhparent FROM pg_catalog.pg_inherits i JOIN tree ON i.inhrelid = tree.oid';
  const rows = await db.query<Row>(
    `WITH RECURSIVE tree(oid) AS (
        SELECT c.oid FROM ${NAMED}
        UNION
        ${step})
     SELECT n.nspname::text AS schema, c.relname::text AS rel
       FROM tree JOIN pg_catalog.pg_class c ON c.oid = tree.oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      ORDER BY 1, 2`,
    [relationsParam(rels)],
  );
  const named = new Set(rels.map(relName));
  return rows.map((r) => ({ schema: r.schema!, table: r.rel! })).filter((r) => !named.has(relName(r)));
}

export interface SequenceUse {
  schema: string;
  name: string;
  /** How the tables use it: an identity column, a serial (OWNED BY), a default's nextval, or config's sequence_names. */
  kind: 'identity' | 'owned' | 'default' | 'config';
  /** schema.table.column that uses it; null for sequence_names. */
  usedBy: string | null;
}

export const seqName = (s: { schema: string; name: string }): string => `${s.schema}.${s.name}`;

/** The sequences the relations use (identity, serial, nextval() defaults), each once under its strongest tie. */
export async function readSequenceUses(db: Db, rels: readonly Rel[]): Promise<SequenceUse[]> {
  const feeds = (await readSequenceFeeds(db, rels)).map((f) => ({ schema: f.seqSchema, name: f.seqName, kind: f.kind, usedBy: `${f.schema}.${f.table}.${f.column}` }));
  feeds.sort((a, b) => (seqName(a) < seqName(b) ? -1 : seqName(a) > seqName(b) ? 1 : a.usedBy < b.usedBy ? -1 : a.usedBy > b.usedBy ? 1 : 0));
  const out = new Map<string, SequenceUse>();
  for (const use of feeds) {
    const prev = out.get(seqName(use));
    if (!prev || SEQUENCE_TIE_RANK[use.kind] < SEQUENCE_TIE_RANK[prev.kind]) out.set(seqName(use), use);
  }
  return [...out.values()];
}

/** A serial's sequence is both OWNED BY and in the default: the stronger tie is kept. */
const SEQUENCE_TIE_RANK = { identity: 0, owned: 1, default: 2, config: 3 } as const;

/** A column fed by a sequence. */
export interface SequenceFeed {
  schema: string;
  table: string;
  column: string;
  seqSchema: string;
  seqName: string;
  kind: SequenceUse['kind'];
}

const FEEDS = `WITH rels AS (SELECT c.oid FROM ${NAMED})
  SELECT tn.nspname::text AS schema, t.relname::text AS tab, a.attname::text AS col, sn.nspname::text AS seq_schema, s.relname::text AS seq_name,
         CASE d.deptype WHEN 'i' THEN 'identity' ELSE 'owned' END AS kind
    FROM pg_catalog.pg_depend d
    JOIN pg_catalog.pg_class s ON d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND s.oid = d.objid AND s.relkind = 'S'
    JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
    JOIN pg_catalog.pg_class t ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND t.oid = d.refobjid
    JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
    JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid
   WHERE d.deptype IN ('a', 'i') AND t.oid IN (SELECT oid FROM rels)
  UNION
  SELECT tn.nspname::text, t.relname::text, a.attname::text, sn.nspname::text, s.relname::text, 'default'
    FROM pg_catalog.pg_attrdef ad
    JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND d.objid = ad.oid
         AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
    JOIN pg_catalog.pg_class s ON s.oid = d.refobjid AND s.relkind = 'S'
    JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
    JOIN pg_catalog.pg_class t ON t.oid = ad.adrelid
    JOIN pg_catalog.pg_namespace tn ON tn.oid = t.relnamespace
    JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum = ad.adnum
   WHERE ad.adrelid IN (SELECT oid FROM rels)
   ORDER BY 1, 2, 3, 4, 5`;

/** Every column of the relations fed by a sequence (a serial's column twice: owned and default — the stronger kept). */
export async function readSequenceFeeds(db: Db, rels: readonly Rel[]): Promise<SequenceFeed[]> {
  if (rels.length === 0) return [];
  const rows = await db.query<Row>(FEEDS, [relationsParam(rels)]);
  const out = new Map<string, SequenceFeed>();
  for (const r of rows) {
    const f: SequenceFeed = { schema: r.schema!, table: r.tab!, column: r.col!, seqSchema: r.seq_schema!, seqName: r.seq_name!, kind: r.kind as SequenceUse['kind'] };
    const key = JSON.stringify([f.schema, f.table, f.column, f.seqSchema, f.seqName]);
    const prev = out.get(key);
    if (!prev || SEQUENCE_TIE_RANK[f.kind] < SEQUENCE_TIE_RANK[prev.kind]) out.set(key, f);
  }
  return [...out.values()];
}

export interface TypeDep {
  oid: string;
  schema: string;
  name: string;
  /** pg_type.typtype: e enum, d domain, c composite, r range, b base, m multirange. */
  kind: string;
  /** The extension that owns it; null for a type created by hand. */
  extension: string | null;
}

const SYSTEM_SCHEMAS = `('pg_catalog', 'information_schema')`;

/**
 * User-defined types the relations' columns need, with what they are built from (array
 * elements, domain bases, composite attributes, range subtypes), to a fixed point. Array
 * types themselves are left out: they come with their element type.
 */
export async function readTypeDeps(db: Db, rels: readonly Rel[]): Promise<TypeDep[]> {
  const [first] = await db.query<Row>(
    `SELECT COALESCE(pg_catalog.json_agg(DISTINCT a.atttypid::text), '[]')::text AS oids
       FROM ${NAMED} JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped`,
    [relationsParam(rels)],
  );
  let frontier = JSON.parse(first?.oids ?? '[]') as string[];
  const seen = new Set<string>();
  const found = new Map<string, TypeDep>();
  const multirange = db.versionNum >= 140000 ? `UNION SELECT rngsubtype FROM pg_catalog.pg_range WHERE rngmultitypid = t.oid` : '';
  while (frontier.length > 0) {
    for (const o of frontier) seen.add(o);
    const rows = await db.query<Row>(
      `SELECT t.oid::text AS oid, n.nspname::text AS schema, t.typname::text AS name, t.typtype::text AS kind,
              (t.typelem <> 0 AND t.typlen = -1)::text AS is_array,
              (SELECT r.relkind::text FROM pg_catalog.pg_class r WHERE r.oid = t.typrelid) AS rel_kind,
              (SELECT e.extname::text FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                WHERE d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND d.objid = t.oid
                  AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND d.deptype = 'e' LIMIT 1) AS extension,
              (SELECT pg_catalog.json_agg(x.dep::text)::text FROM (
                  SELECT NULLIF(t.typelem, 0) AS dep UNION SELECT NULLIF(t.typbasetype, 0)
                  UNION SELECT a.atttypid FROM pg_catalog.pg_attribute a WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
                  UNION SELECT rngsubtype FROM pg_catalog.pg_range WHERE rngtypid = t.oid ${multirange}) x WHERE x.dep IS NOT NULL) AS deps
         FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
        WHERE t.oid = ANY ($1::text[]::pg_catalog.oid[])`,
      [`{${frontier.join(',')}}`],
    );
    const next: string[] = [];
    for (const r of rows) {
      // A table's row type is the table itself, not a type to create.
      const rowType = r.kind === 'c' && r.rel_kind != null && r.rel_kind !== 'c';
      if (!['pg_catalog', 'information_schema'].includes(r.schema!) && !isTrue(r.is_array) && !rowType) {
        found.set(r.oid!, { oid: r.oid!, schema: r.schema!, name: r.name!, kind: r.kind!, extension: r.extension ?? null });
      }
      for (const d of JSON.parse(r.deps ?? '[]') as string[]) if (!seen.has(d)) next.push(d);
    }
    frontier = [...new Set(next)];
  }
  return [...found.values()];
}

export interface FunctionDep {
  schema: string;
  name: string;
  /** name(args) as pg_dump names a FUNCTION entry: pg_get_function_identity_arguments. */
  signature: string;
  extension: string | null;
}

/** User functions the relations call: in defaults, CHECK constraints, index expressions, triggers; and in their domains' checks. */
export async function readFunctionDeps(db: Db, rels: readonly Rel[], types: readonly TypeDep[]): Promise<FunctionDep[]> {
  const rows = await db.query<Row>(
    `WITH rels AS (SELECT c.oid FROM ${NAMED}),
          users(classid, objid) AS (
            SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass, ad.oid FROM pg_catalog.pg_attrdef ad WHERE ad.adrelid IN (SELECT oid FROM rels)
            UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, co.oid FROM pg_catalog.pg_constraint co
                       WHERE co.conrelid IN (SELECT oid FROM rels) OR co.contypid = ANY ($2::text[]::pg_catalog.oid[])
            UNION ALL SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass, tg.oid FROM pg_catalog.pg_trigger tg WHERE tg.tgrelid IN (SELECT oid FROM rels) AND NOT tg.tgisinternal
            UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, i.indexrelid FROM pg_catalog.pg_index i WHERE i.indrelid IN (SELECT oid FROM rels))
     SELECT DISTINCT n.nspname::text AS schema, p.proname::text AS name,
            p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')' AS signature,
            (SELECT e.extname::text FROM pg_catalog.pg_depend x JOIN pg_catalog.pg_extension e ON e.oid = x.refobjid
              WHERE x.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND x.objid = p.oid AND x.deptype = 'e' LIMIT 1) AS extension
       FROM users u
       JOIN pg_catalog.pg_depend d ON d.classid = u.classid AND d.objid = u.objid AND d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
       JOIN pg_catalog.pg_proc p ON p.oid = d.refobjid
       JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname NOT IN ${SYSTEM_SCHEMAS}
      ORDER BY 1, 3`,
    [relationsParam(rels), `{${types.map((t) => t.oid).join(',')}}`],
  );
  return rows.map((r) => ({ schema: r.schema!, name: r.name!, signature: r.signature!, extension: r.extension ?? null }));
}

/** schema.name → whether it exists here, for types (pg_type) or relations (pg_class). */
export async function existing(db: Db, catalog: 'type' | 'class' | 'collation', names: readonly { schema: string; name: string }[]): Promise<Set<string>> {
  if (names.length === 0) return new Set();
  const [table, nameCol, nsCol] =
    catalog === 'type' ? ['pg_type', 'typname', 'typnamespace'] : catalog === 'class' ? ['pg_class', 'relname', 'relnamespace'] : ['pg_collation', 'collname', 'collnamespace'];
  const rows = await db.query<Row>(
    `SELECT x.schema || '.' || x.name AS name
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
      WHERE EXISTS (SELECT 1 FROM pg_catalog.${table} o JOIN pg_catalog.pg_namespace n ON n.oid = o.${nsCol} WHERE n.nspname = x.schema AND o.${nameCol} = x.name)`,
    [JSON.stringify(names.map((n) => ({ schema: n.schema, name: n.name })))],
  );
  return new Set(rows.map((r) => r.name!));
}

/** Extensions installed here, with their versions. */
export async function readExtensions(db: Db): Promise<Map<string, string>> {
  const rows = await db.query<Row>(`SELECT extname::text AS name, extversion::text AS version FROM pg_catalog.pg_extension`);
  return new Map(rows.map((r) => [r.name!, r.version!]));
}
