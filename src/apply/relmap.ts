/**
 * The relation map: what the publisher said about each relation id (Relation messages)
 * joined with what the target has under the same schema-qualified name, as
 * logicalrep_rel_open does. Columns are matched by name; target columns the publisher
 * does not send keep their defaults; a published column the target lacks is a
 * PGSUB_SCHEMA_MISMATCH naming table and columns. A new Relation message for an id
 * drops the cached target mapping, so schema changes on either side are picked up.
 */
import { SchemaMismatchError } from '../errors.js';
import type { RelationMessage } from '../protocol/messages.js';
import { quoteQualified } from '../quote.js';
import type { Sql } from './target.js';

export interface TargetColumn {
  name: string;
  typeOid: number;
  generated: boolean;
}

export interface MappedRelation {
  remote: RelationMessage;
  /** Schema-qualified, quoted target name. */
  qualifiedName: string;
  /** For messages and logs: schema.table as the publisher named it. */
  displayName: string;
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

  async resolve(sql: Sql, relationId: number): Promise<MappedRelation> {
    const cached = this.mapped.get(relationId);
    if (cached) return cached;
    const remote = this.remoteRelation(relationId);
    // An empty namespace on the wire means pg_catalog (pgoutput's convention).
    const schema = remote.namespace === '' ? 'pg_catalog' : remote.namespace;
    const displayName = `${schema}.${remote.name}`;
    const generatedExpr = this.targetVersionNum >= 120000 ? `a.attgenerated <> ''` : 'false';
    // The apply connection passes values through as text: booleans arrive as 't'/'f'.
    const rows = await sql.unsafe<{ attname: string | null; atttypid: string; generated: string; relkind: string }[]>(
      `SELECT a.attname, a.atttypid::int AS atttypid, (${generatedExpr})::text AS generated, c.relkind::text AS relkind
         FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`,
      [schema, remote.name],
    );
    if (rows.length === 0) {
      throw new SchemaMismatchError(`logical replication target relation "${displayName}" does not exist`, { relation: displayName });
    }
    const byName = new Map<string, TargetColumn>();
    for (const r of rows) {
      if (r.attname !== null) byName.set(r.attname, { name: r.attname, typeOid: Number(r.atttypid), generated: r.generated === 't' });
    }
    const missing = remote.columns.filter((c) => !byName.has(c.name)).map((c) => c.name);
    if (missing.length > 0) {
      throw new SchemaMismatchError(
        `logical replication target relation "${displayName}" is missing replicated column${missing.length > 1 ? 's' : ''}: ${missing.map((m) => `"${m}"`).join(', ')}`,
        { relation: displayName, column: missing.join(', ') },
      );
    }
    const targetColumns = remote.columns.map((c) => byName.get(c.name)!);
    const generated = targetColumns.filter((c) => c.generated).map((c) => c.name);
    if (generated.length > 0) {
      throw new SchemaMismatchError(
        `logical replication target relation "${displayName}" has generated column${generated.length > 1 ? 's' : ''} ${generated.map((m) => `"${m}"`).join(', ')} that the publisher sends values for`,
        { relation: displayName, column: generated.join(', ') },
      );
    }
    const mapped: MappedRelation = {
      remote,
      qualifiedName: quoteQualified(schema, remote.name),
      displayName,
      targetColumns,
      keyIndexes: remote.columns.flatMap((c, i) => (c.isKey ? [i] : [])),
      statements: new Map(),
    };
    this.mapped.set(relationId, mapped);
    return mapped;
  }
}
