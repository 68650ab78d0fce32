/**
 * The relation map: what the publisher said about each relation id (Relation messages)
 * joined with what the target has under the same schema-qualified name, as
 * logicalrep_rel_open does. Columns are matched by name; target columns the publisher
 * does not send keep their defaults (or are computed, if generated); a published column
 * the target lacks is a PGSUB_SCHEMA_MISMATCH naming table and columns, and so is a
 * published column that is generated on the target (relation.c's "incompatible
 * generated column"). A new Relation message for an id drops the cached target mapping,
 * so schema changes on either side are picked up.
 *
 * Per target column the map also records its type (statements.ts casts every bind
 * parameter to it, so a column whose type changed gets a new statement text and thus a
 * new server-side prepared statement) and, for REPLICA IDENTITY FULL relations, whether
 * the type has the equality native uses to compare whole rows (see typeEquality).
 */
import { SchemaMismatchError } from '../errors.js';
import type { RelationMessage } from '../protocol/messages.js';
import { quoteQualified } from '../quote.js';
import { queryRows, type WireConnection } from './target.js';

export interface TargetColumn {
  name: string;
  typeOid: number;
  /** Schema-qualified, quoted type name for casts ("pg_catalog"."int8"); search_path is empty. */
  typeName: string;
  generated: boolean;
  /**
   * The type has the equality operator native's tuples_equal looks up (a default btree or
   * hash opclass, element/field types included). Only computed for REPLICA IDENTITY FULL
   * relations, whose rows are located by comparing every column; true otherwise.
   */
  hasEquality: boolean;
}

export interface MappedRelation {
  remote: RelationMessage;
  /** Schema-qualified, quoted target name. */
  qualifiedName: string;
  /** For messages and logs: schema.table as the publisher named it. */
  displayName: string;
  /** 'r' plain table, 'p' partitioned table (rows are routed to and found in its partitions). */
  relkind: 'r' | 'p';
  /** Per remote column index, the target column receiving it. */
  targetColumns: TargetColumn[];
  /** Remote column indexes of the replica identity key. */
  keyIndexes: number[];
  /** Built SQL texts by shape (see statements.ts), cached for the relation's lifetime. */
  statements: Map<string, string>;
}

export class RelationMap {
  private readonly remote = new Map<number, RelationMessage>();
  private readonly mapped = new Map<number, MappedRelation>();
  private readonly types = new Map<number, { namespace: string; name: string }>();

  constructor(private readonly targetVersionNum: number) {}

  onRelation(message: RelationMessage): void {
    this.remote.set(message.relationId, message);
    this.mapped.delete(message.relationId);
  }

  onType(typeOid: number, namespace: string, name: string): void {
    this.types.set(typeOid, { namespace, name });
  }

  /** Forget target lookups (e.g. after an error, the operator may have fixed the target). */
  invalidateTargets(): void {
    this.mapped.clear();
  }

  remoteRelation(relationId: number): RelationMessage {
    const rel = this.remote.get(relationId);
    if (!rel) {
      throw new SchemaMismatchError(`no Relation message was received for relation id ${relationId} before its change`, { relationId });
    }
    return rel;
  }

  async resolve(conn: WireConnection, relationId: number): Promise<MappedRelation> {
    const cached = this.mapped.get(relationId);
    if (cached) return cached;
    const remote = this.remoteRelation(relationId);
    // An empty namespace on the wire means pg_catalog (pgoutput's convention).
    const schema = remote.namespace === '' ? 'pg_catalog' : remote.namespace;
    const displayName = `${schema}.${remote.name}`;
    const generatedExpr = this.targetVersionNum >= 120000 ? `a.attgenerated <> ''` : 'false';
    // Catalog rows come back as text: booleans arrive as 't'/'f'.
    const rows = await queryRows<{ attname: string | null; atttypid: string; typnsp: string | null; typname: string | null; generated: string; relkind: string }>(
      conn,
      ['attname', 'atttypid', 'typnsp', 'typname', 'generated', 'relkind'],
      `SELECT a.attname, a.atttypid::int AS atttypid, tn.nspname::text AS typnsp, t.typname::text AS typname,
              (${generatedExpr})::text AS generated, c.relkind::text AS relkind
         FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
         LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         LEFT JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
        WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
      [schema, remote.name],
    );
    if (rows.length === 0) {
      throw new SchemaMismatchError(`logical replication target relation "${displayName}" does not exist`, { relation: displayName });
    }
    const byName = new Map<string, TargetColumn>();
    for (const r of rows) {
      if (r.attname !== null) {
        byName.set(r.attname, {
          name: r.attname,
          typeOid: Number(r.atttypid),
          typeName: quoteQualified(r.typnsp ?? 'pg_catalog', r.typname ?? 'text'),
          generated: r.generated === 't',
          hasEquality: true,
        });
      }
    }
    const missing = remote.columns.filter((c) => !byName.has(c.name)).map((c) => c.name);
    if (missing.length > 0) {
      throw new SchemaMismatchError(
        `logical replication target relation "${displayName}" is missing replicated column${missing.length > 1 ? 's' : ''}: ${missing.map((m) => `"${m}"`).join(', ')}`,
        { relation: displayName, column: missing.join(', ') },
      );
    }
    const targetColumns = remote.columns.map((c) => ({ ...byName.get(c.name)! }));
    const generated = targetColumns.filter((c) => c.generated).map((c) => c.name);
    if (generated.length > 0) {
      // relation.c's wording; PostgreSQL 18 is the first publisher that can send generated columns.
      throw new SchemaMismatchError(
        `logical replication target relation "${displayName}" has incompatible generated column${generated.length > 1 ? 's' : ''}: ${generated.map((m) => `"${m}"`).join(', ')}`,
        { relation: displayName, column: generated.join(', ') },
      );
    }
    if (remote.replicaIdentity === 'full') {
      const equality = await typeEquality(conn, this.targetVersionNum, targetColumns.map((c) => c.typeOid));
      for (const c of targetColumns) c.hasEquality = equality.get(c.typeOid) ?? false;
    }
    const mapped: MappedRelation = {
      remote,
      qualifiedName: quoteQualified(schema, remote.name),
      displayName,
      relkind: rows[0]!.relkind === 'p' ? 'p' : 'r',
      targetColumns,
      keyIndexes: remote.columns.flatMap((c, i) => (c.isKey ? [i] : [])),
      statements: new Map(),
    };
    this.mapped.set(relationId, mapped);
    return mapped;
  }
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
 * equality operator for type json"; statements.ts compares their text forms instead.
 */
async function typeEquality(conn: WireConnection, targetVersionNum: number, typeOids: number[]): Promise<Map<number, boolean>> {
  // get_element_type: a "true" array type (PostgreSQL 14 gave types a subscript handler).
  const isArray =
    targetVersionNum >= 140000 ? `t.typelem <> 0 AND t.typsubscript = 'pg_catalog.array_subscript_handler'::pg_catalog.regproc` : `t.typelem <> 0 AND t.typlen = -1`;
  const rows = await queryRows<TypeRow>(
    conn,
    ['oid', 'typtype', 'base', 'elem', 'fields', 'has_opclass'],
    `WITH RECURSIVE reach(oid) AS (
         SELECT DISTINCT pg_catalog.unnest($1::pg_catalog.oid[])
       UNION
         SELECT x.oid
           FROM reach r
           JOIN pg_catalog.pg_type t ON t.oid = r.oid
          CROSS JOIN LATERAL (
                SELECT t.typbasetype WHERE t.typtype = 'd'
                UNION ALL SELECT t.typelem WHERE ${isArray}
                UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
                           WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
               ) x(oid)
     )
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
      else if (t.typtype === 'c') result = (t.fields ?? '').split(',').filter(Boolean).every((f) => has(Number(f)));
      else if (t.typtype === 'e' || t.typtype === 'r' || t.typtype === 'm') result = true;
      else result = t.has_opclass === 't' || t.has_opclass === 'true';
    }
    memo.set(oid, result);
    return result;
  };
  return new Map(typeOids.map((oid) => [oid, has(oid)]));
}
