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
 *
 * Binary mode (see binary.ts): a binary value is the publisher's send output of the
 * REMOTE column type, so per column the map also records which target type reads it —
 * a built-in remote type is the same OID on the target; a user-defined one is found by
 * the namespace and name its Type message gave (pgoutput names a domain by its base
 * type) — and, when that type's binary format embeds user-defined type OIDs (arrays,
 * composites, ranges of enums or composites, domains over them), the plan to rewrite
 * them to the target's. The catalog rows for that are fetched once per relation, and
 * only when a remote column has a user-defined type (and binary mode is not known to be off).
 *
 * A relation with a mapping rule is also checked beyond column matching (plan-checks.ts:
 * NOT NULL columns nothing fills, lossy casts) and followed through schema drift on the
 * publisher (drift.ts: new, renamed and dropped columns under the rule's `drift:` policy).
 */
import { FIRST_GENBKI_OID, oidPlan, type OidPlan, type TargetTypeInfo } from './binary.js';
import { SchemaMismatchError } from '../../errors.js';
import { schemaOf, type RelationMessage } from '../../protocol/messages.js';
import { quoteQualified } from '../../quote.js';
import { queryRows, type WireConnection } from '../../pgwire/connect.js';
import { hasRowRules, ruleFor, type MappingConfig, type TableRule } from '../../mapping/rules.js';
import { checkExpressions, matchColumns, type Probe, type Reshape, type TargetColumn } from '../../mapping/columns.js';
import { checkUniqueKey, compileRows } from '../../mapping/rows.js';
import { checkMapped, type TargetExtra } from '../../mapping/plan-checks.js';
import { Drift, type DriftOutcome } from '../../mapping/drift.js';
import { ROW_SECURITY_COLUMNS, ROW_SECURITY_SQL, rowSecurityError, tablesParam, type RowSecurityRow } from './row-security.js';

export type { DriftOutcome } from '../../mapping/drift.js';

export type { TargetColumn } from '../../mapping/columns.js';

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
  /**
   * The target table (or a partition of it) has triggers or rules that fire in replica
   * mode (ENABLE ALWAYS / ENABLE REPLICA): they may observe the order of changes, so its
   * changes are never batched or reordered (batch.ts). Read when the relation is mapped.
   */
  ordered: boolean;
  /** Row-level security is enabled on the target table (COPY FROM refuses it; INSERT applies the policies). */
  rowSecurity: boolean;
  /** Built SQL texts by shape (see statements.ts), cached for the relation's lifetime. */
  statements: Map<string, string>;
  /** Per built text, the remote column index of each parameter number (error messages name the column). */
  paramColumns: Map<string, number[]>;
  /** How binary values are bound, per remote column index; absent: as they are, types inferred from the casts. */
  binary?: BinaryColumns;
  /** The mapping rule of the source table (config mapping:); absent: none applies. */
  rule?: TableRule;
  /** Excluded or computed columns: statements are built from this (mapping/columns.ts); absent: the plain builders. */
  reshape?: Reshape;
  /** Mapped relations: what schema drift changed in the rule (plan-checks.ts). */
  drift?: DriftOutcome;
}

export interface BinaryColumns {
  /**
   * Parse type of a binary value: the target OID of the remote column's type where it
   * differs from the target column's type (the cast then converts, e.g. int4 → int8);
   * 0 where the cast alone gives the right type. Null when every entry would be 0.
   * Text values always leave their parameter's type to the cast (the target type's
   * input function reads them, as native's slot_store_data).
   */
  parseTypes: readonly number[] | null;
  /** OID rewrite plan per column (binary.ts); null when no column has one. */
  plans: readonly (OidPlan | null)[] | null;
}

export interface RelationMapOptions {
  /**
   * false: the publisher never sends binary values, so no binary bookkeeping. Unset: the
   * catalog rows binary values need are fetched when a relation has user-defined column types.
   */
  binary?: boolean;
  /** Mapping rules (config mapping:); absent: every relation to the same name. */
  mapping?: MappingConfig;
  /** Where computed columns' expressions are checked (mapping/columns.ts); absent: not checked here. */
  probe?: Probe;
  /** The subscription whose drift bookkeeping is kept in pgsub.relation_columns; absent: in memory only. */
  subscription?: string;
  /**
   * Checking only (startup check, `pgsub plan`): a column `drift: add` would add is taken
   * as excluded and recorded in MappedRelation.drift instead of being added; the drift
   * bookkeeping is read (renames recognised earlier apply) but not written.
   */
  planOnly?: boolean;
}

export class RelationMap {
  private readonly remote = new Map<number, RelationMessage>();
  private readonly mapped = new Map<number, MappedRelation>();
  private readonly types = new Map<number, { namespace: string; name: string }>();
  /** Schema drift of mapped relations (drift.ts). */
  private readonly drift: Drift;

  constructor(
    private readonly targetVersionNum: number,
    private readonly options: RelationMapOptions = {},
  ) {
    this.drift = new Drift(options, this.types);
  }

  /** A map for another connection of the same subscription (apply lanes, parallel workers): same options, nothing resolved. */
  sibling(): RelationMap {
    return new RelationMap(this.targetVersionNum, this.options);
  }

  onRelation(message: RelationMessage): void {
    this.remote.set(message.relationId, message);
    this.mapped.delete(message.relationId);
  }

  /** Start from what another map was told (an apply lane joining a running stream). */
  seedFrom(other: RelationMap): void {
    for (const [id, message] of other.remote) this.remote.set(id, message);
    for (const [oid, type] of other.types) this.types.set(oid, type);
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

  /** The relation one of whose statements has this text (an error's; failure.ts). */
  byStatement(text: string): MappedRelation | undefined {
    for (const rel of this.mapped.values()) if (rel.paramColumns.has(text) || [...rel.statements.values()].includes(text)) return rel;
    return undefined;
  }

  /** The mapping of a relation already resolved, without a lookup; undefined otherwise. */
  cached(relationId: number): MappedRelation | undefined {
    return this.mapped.get(relationId);
  }

  async resolve(conn: WireConnection, relationId: number): Promise<MappedRelation> {
    const cached = this.mapped.get(relationId);
    if (cached) return cached;
    const remote = this.remoteRelation(relationId);
    // An empty namespace on the wire means pg_catalog (pgoutput's convention).
    const schema = schemaOf(remote);
    const displayName = `${schema}.${remote.name}`;
    const baseRule = this.options.mapping ? ruleFor(this.options.mapping, schema, remote.name) : null;
    if (baseRule) await this.drift.observe(conn, relationId, remote);
    let rule = baseRule ? this.drift.withRenames(relationId, baseRule) : null;
    const target = rule ? { schema: rule.targetSchema, table: rule.targetTable } : { schema, table: remote.name };
    let { rows, byName, extra } = await this.readTarget(conn, target, rule, displayName);
    let drift: DriftOutcome | undefined;
    if (rule) {
      const outcome = await this.drift.apply(conn, relationId, remote, rule, byName, target, displayName);
      rule = outcome.rule;
      drift = outcome.drift;
      if (outcome.drift.added.length > 0) ({ rows, byName, extra } = await this.readTarget(conn, target, rule, displayName));
    }
    // Policies that apply to pgsub's role would hide rows from its UPDATEs and DELETEs (row-security.ts).
    if (rows[0]!.rls === 'true') await refuseRowSecurity(conn, target, displayName);
    const { targetColumns, reshape } = matchColumns(remote, byName, displayName, `${target.schema}.${target.table}`, rule);
    if (reshape) await this.reshapeTypes(conn, remote, reshape);
    // Row semantics (rows.ts): key, filter, soft delete, discriminator.
    if (reshape && rule && hasRowRules(rule.rows)) {
      reshape.rows = compileRows(remote, rule, reshape, targetColumns, byName, displayName, `${target.schema}.${target.table}`);
      await checkUniqueKey(conn, quoteQualified(target.schema, target.table), reshape.rows, displayName, `${target.schema}.${target.table}`, rule);
    }
    if (reshape && rule && this.options.probe) await checkExpressions(this.options.probe, reshape, remote, displayName, rule);
    if (rule) checkMapped(remote, rule, targetColumns, reshape, extra, displayName, `${target.schema}.${target.table}`, this.drift.previous(relationId));
    if (remote.replicaIdentity === 'full') {
      const equality = await typeEquality(
        conn,
        this.targetVersionNum,
        targetColumns.map((c) => c.typeOid),
      );
      for (const c of targetColumns) c.hasEquality = equality.get(c.typeOid) ?? false;
    }
    const mapped: MappedRelation = {
      remote,
      // A table without columns has only DEFAULT VALUES inserts, one statement each; one
      // with row rules (filter, soft delete, discriminator, key: rows.ts) is written one
      // statement per change. A reshaped one without batches its inserts (INSERT … SELECT
      // over a VALUES list, statements.ts), its updates and deletes one by one.
      ordered: remote.columns.length === 0 || reshape?.rows !== undefined || (await firesInReplicaMode(conn, target.schema, target.table)),
      rowSecurity: rows[0]!.rls === 'true',
      qualifiedName: quoteQualified(target.schema, target.table),
      displayName,
      relkind: rows[0]!.relkind === 'p' ? 'p' : 'r',
      targetColumns,
      keyIndexes: remote.columns.flatMap((c, i) => (c.isKey ? [i] : [])),
      statements: new Map(),
      paramColumns: new Map(),
    };
    if (rule) mapped.rule = rule;
    if (reshape) mapped.reshape = reshape;
    if (drift) mapped.drift = drift;
    if (this.options.binary !== false) {
      const binary = await this.binaryColumns(conn, remote, targetColumns);
      if (binary) mapped.binary = binary;
    }
    this.mapped.set(relationId, mapped);
    return mapped;
  }

  /** The target table's columns (and, for mapped tables, what plan-checks.ts needs of them). */
  private async readTarget(conn: WireConnection, target: { schema: string; table: string }, rule: TableRule | null, displayName: string) {
    const generatedExpr = this.targetVersionNum >= 120000 ? `a.attgenerated <> ''` : 'false';
    // Catalog rows come back as text: booleans arrive as 't'/'f'.
    const rows = await queryRows<{
      attname: string | null;
      atttypid: string;
      typnsp: string | null;
      typname: string | null;
      generated: string;
      relkind: string;
      rls: string;
      arraytype: string | null;
      always: string;
      typmod: string | null;
      required: string | null;
    }>(
      conn,
      ['attname', 'atttypid', 'typnsp', 'typname', 'generated', 'relkind', 'rls', 'arraytype', 'always', 'typmod', 'required'],
      `SELECT a.attname, a.atttypid::int AS atttypid, tn.nspname::text AS typnsp, t.typname::text AS typname,
              (${generatedExpr})::text AS generated, c.relkind::text AS relkind, c.relrowsecurity::text AS rls,
              (t.typarray <> 0 AND t.typcategory <> 'A')::text AS arraytype, (a.attidentity = 'a')::text AS always,
              a.atttypmod::text AS typmod, (a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND NOT (${generatedExpr}))::text AS required
         FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
         LEFT JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         LEFT JOIN pg_catalog.pg_namespace tn ON tn.oid = t.typnamespace
        WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
      [target.schema, target.table],
    );
    if (rows.length === 0) {
      const named = rule ? `"${target.schema}.${target.table}" (for "${displayName}")` : `"${displayName}"`;
      throw new SchemaMismatchError(`logical replication target relation ${named} does not exist`, { relation: displayName });
    }
    const byName = new Map<string, TargetColumn>();
    const extra = new Map<string, TargetExtra>();
    for (const r of rows) {
      if (r.attname !== null) {
        byName.set(r.attname, {
          name: r.attname,
          typeOid: Number(r.atttypid),
          typeName: quoteQualified(r.typnsp ?? 'pg_catalog', r.typname ?? 'text'),
          generated: r.generated === 'true',
          hasEquality: true,
          arrayType: r.arraytype === 'true',
          identityAlways: r.always === 'true',
        });
        extra.set(r.attname, { typeMod: Number(r.typmod ?? -1), required: r.required === 'true' });
      }
    }
    return { rows, byName, extra };
  }

  /**
   * The types of the remote columns the expressions use, in the row subquery: the remote
   * type as the target knows it (built-in types by OID, others by the name their Type
   * message gave); null where the target has no such type (checkExpressions says so).
   */
  private async reshapeTypes(conn: WireConnection, remote: RelationMessage, reshape: Reshape): Promise<void> {
    const wanted = reshape.rowTypes.flatMap((t, i) => (t === '' ? [i] : []));
    const builtin = wanted.filter((i) => remote.columns[i]!.typeOid < FIRST_GENBKI_OID).map((i) => remote.columns[i]!.typeOid);
    const names = new Map<number, string>();
    if (builtin.length > 0) {
      const rows = await queryRows<{ oid: string; nsp: string; name: string }>(
        conn,
        ['oid', 'nsp', 'name'],
        `SELECT t.oid::int::text, n.nspname::text, t.typname::text FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
          WHERE t.oid = ANY ($1::pg_catalog.oid[])`,
        [`{${[...new Set(builtin)].join(',')}}`],
      );
      for (const r of rows) names.set(Number(r.oid), quoteQualified(r.nsp ?? '', r.name ?? ''));
    }
    for (const i of wanted) {
      const oid = remote.columns[i]!.typeOid;
      const t = this.types.get(oid);
      reshape.rowTypes[i] = oid < FIRST_GENBKI_OID ? (names.get(oid) ?? null) : t ? quoteQualified(schemaOf(t), t.name) : null;
    }
  }

  /** See BinaryColumns; undefined when binary values need nothing beyond the casts. */
  private async binaryColumns(conn: WireConnection, remote: RelationMessage, targetColumns: TargetColumn[]): Promise<BinaryColumns | undefined> {
    // The target type reading each column's binary value; 0: unknown, the column's own type.
    const readAs = remote.columns.map((c) => (c.typeOid < FIRST_GENBKI_OID ? c.typeOid : 0));
    let plans: (OidPlan | null)[] | null = null;
    const user = remote.columns.flatMap((c, i) => (c.typeOid >= FIRST_GENBKI_OID ? [i] : []));
    if (user.length > 0) {
      const names = user.map((i) => {
        const t = this.types.get(remote.columns[i]!.typeOid);
        return t ? { namespace: schemaOf(t), name: t.name } : null;
      });
      const types = await targetTypes(
        conn,
        this.targetVersionNum,
        names.filter((n) => n !== null),
        user.map((i) => targetColumns[i]!.typeOid),
      );
      const byName = new Map([...types.values()].map((t) => [t.name, t.oid]));
      plans = remote.columns.map(() => null);
      user.forEach((i, k) => {
        const n = names[k];
        readAs[i] = n ? (byName.get(quoteQualified(n.namespace, n.name)) ?? 0) : 0;
        plans![i] = oidPlan(readAs[i] || targetColumns[i]!.typeOid, types);
      });
      if (plans.every((p) => p === null)) plans = null;
    }
    const parseTypes = readAs.map((oid, i) => (oid !== 0 && oid !== targetColumns[i]!.typeOid ? oid : 0));
    const anyParseType = parseTypes.some((t) => t !== 0);
    if (!anyParseType && !plans) return undefined;
    return { parseTypes: anyParseType ? parseTypes : null, plans };
  }
}

/** Whether the table or any partition below it has a trigger or rule enabled in replica mode. */
async function refuseRowSecurity(conn: WireConnection, target: { schema: string; table: string }, displayName: string): Promise<void> {
  const [applies] = await queryRows<RowSecurityRow>(conn, ROW_SECURITY_COLUMNS, ROW_SECURITY_SQL, [tablesParam([target])]);
  if (applies) throw rowSecurityError(applies, { relation: displayName });
}

async function firesInReplicaMode(conn: WireConnection, schema: string, table: string): Promise<boolean> {
  const [row] = await queryRows<{ fires: string }>(
    conn,
    ['fires'],
    `WITH RECURSIVE tree(oid) AS (
         SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = $1 AND c.relname = $2
       UNION
         SELECT i.inhrelid FROM pg_catalog.pg_inherits i JOIN tree ON i.inhparent = tree.oid
     )
     SELECT (EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g JOIN tree ON g.tgrelid = tree.oid
                      WHERE NOT g.tgisinternal AND g.tgenabled IN ('A', 'R'))
          OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w JOIN tree ON w.ev_class = tree.oid
                      WHERE w.rulename <> '_RETURN' AND w.ev_enabled IN ('A', 'R')))::text AS fires`,
    [schema, table],
  );
  return row?.fires === 'true';
}

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
async function targetTypes(
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
 * equality operator for type json"; statements.ts compares their text forms instead.
 */
async function typeEquality(conn: WireConnection, targetVersionNum: number, typeOids: number[]): Promise<Map<number, boolean>> {
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
