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
 * Per target column the map also records its type (statement-text.ts casts every bind
 * parameter to it, so a column whose type changed gets a new statement text and thus a
 * new server-side prepared statement) and, for REPLICA IDENTITY FULL relations, whether
 * the type has the equality native uses to compare whole rows (type-catalog.ts typeEquality).
 *
 * Binary mode (see binary.ts): a binary value is the publisher's send output of the
 * REMOTE column type, so per column the map also records which target type reads it —
 * a built-in remote type is the same OID on the target; a user-defined one is found by
 * the namespace and name its Type message gave (pgoutput names a domain by its base
 * type) — and, when that type's binary format embeds user-defined type OIDs (arrays,
 * composites, ranges of enums or composites, domains over them), the plan to rewrite
 * them to the target's. The catalog rows for that are fetched once per relation
 * (type-catalog.ts), and only when a remote column has a user-defined type (and binary
 * mode is not known to be off). What a resolved relation holds is mapped-relation.ts.
 *
 * A relation with a mapping rule is also checked beyond column matching (plan-checks.ts:
 * NOT NULL columns nothing fills, lossy casts) and followed through schema drift on the
 * publisher (drift.ts: new, renamed and dropped columns under the rule's `drift:` policy).
 */
import { FIRST_GENBKI_OID, oidPlan, type OidPlan } from './binary.js';
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
import type { BinaryColumns, MappedRelation } from './mapped-relation.js';
import { targetTypes, typeEquality } from './type-catalog.js';

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
      // over a VALUES list, multi-row.ts), its updates and deletes one by one.
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
