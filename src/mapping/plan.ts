/**
 * The compiled mapping plan (docs/mapping.md "Checks and pgsub plan"): every published
 * table described from the publisher's catalog as the Relation message pgoutput would
 * send for it (columns in attribute order, their types, the replica identity flags, and
 * the Type message's names for user-defined types), then resolved against the target by
 * the relation map itself (apply/sql/relmap.ts: matchColumns, the expression probe,
 * plan-checks.ts) — so the startup check, `pgsub plan` and the check at every Relation
 * message are one code path. The statements shown are the real builders' texts
 * (apply/sql/insert.ts, update.ts, delete.ts, tablesync/copy.ts), built for a sample row.
 *
 * At startup (runner.ts, first session only, when `mapping:` is set) a mapped table that
 * fails is a MappingError (exit 2) naming table, column and reason; a rule naming a table
 * the publications do not publish is a warning. Unmapped tables are not checked here:
 * they keep native's behaviour (a mismatch is an apply error, retried).
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { isEmptyMapping, ruleFor, type TableRule } from './rules.js';
import { MappingError, PgsubError } from '../errors.js';
import type { Logger } from '../log.js';
import type { RelationMessage, ReplicaIdentity, Tuple } from '../protocol/messages.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteLiteral, quoteQualified } from '../quote.js';
import { openApplyConnection, rolledBackOn, type WireConnection } from '../pgwire/connect.js';
import type { MappedRelation } from '../apply/sql/mapped-relation.js';
import { RelationMap } from '../apply/sql/relmap.js';
import { insertStatement } from '../apply/sql/insert.js';
import { updateStatement } from '../apply/sql/update.js';
import { deleteStatement, truncateStatement } from '../apply/sql/delete.js';
import { listPublishedTables, mapTable, type PublishedTable } from '../tablesync/catalog.js';
import { differingTargetTypes, openCopyClient, sourceColumnTypes, sourceCopySql, stagedCopySql, targetCopySql } from '../tablesync/copy.js';

export interface ColumnPlan {
  source: string;
  type: string;
  /** The target column it is written to; null: not written (excluded, or only an expression's input). */
  target: string | null;
  how: 'direct' | 'renamed' | 'excluded' | 'ignored (drift)';
}

export interface TablePlan {
  source: string;
  target: string;
  mapped: boolean;
  drift: string | null;
  replicaIdentity: string;
  columns: ColumnPlan[];
  computed: { column: string; expr: string }[];
  sql: { insert?: string; update?: string; delete?: string; truncate?: string; copy?: string[] };
  problems: { column?: string; code: string; reason: string }[];
}

export interface MappingPlan {
  tables: TablePlan[];
  /** Rules that name nothing the publications publish. */
  warnings: string[];
}

interface SourceRelation {
  table: PublishedTable;
  relation: RelationMessage;
  typeNames: string[];
  userTypes: { oid: number; namespace: string; name: string }[];
}

const IDENTITY: Record<string, ReplicaIdentity> = { d: 'default', n: 'nothing', f: 'full', i: 'index' };

/** The Relation message pgoutput would send for each published table (see header). */
async function describeSource(replication: ReplicationConnection, tables: PublishedTable[]): Promise<SourceRelation[]> {
  const out: SourceRelation[] = [];
  let id = 0;
  for (const t of tables) {
    const rows = await replication.sql<{ relid: string; attname: string; oid: string; typmod: string; typnsp: string; typname: string; typ: string; iskey: string }>(
      `SELECT c.oid::int8::text AS relid, a.attname::text AS attname, a.atttypid::int::text AS oid, a.atttypmod::text AS typmod,
              bn.nspname::text AS typnsp, bt.typname::text AS typname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS typ,
              (CASE c.relreplident WHEN 'f' THEN true WHEN 'n' THEN false
                    ELSE EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid
                                    AND (CASE c.relreplident WHEN 'd' THEN i.indisprimary ELSE i.indisreplident END)
                                    AND a.attnum = ANY (i.indkey)) END)::text AS iskey
         FROM pg_catalog.pg_attribute a
         JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
         JOIN pg_catalog.pg_type y ON y.oid = a.atttypid
         JOIN pg_catalog.pg_type bt ON bt.oid = CASE WHEN y.typtype = 'd' THEN y.typbasetype ELSE y.oid END
         JOIN pg_catalog.pg_namespace bn ON bn.oid = bt.typnamespace
        WHERE a.attrelid = ${quoteLiteral(quoteQualified(t.schema, t.table))}::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum`,
    );
    const published = rows.filter((r) => t.columns.includes(r.attname));
    out.push({
      table: t,
      relation: {
        tag: 'relation',
        // The relation OID, as pgoutput's relation id (the drift bookkeeping is keyed by it); a table without columns gets a stand-in.
        relationId: rows[0] ? Number(rows[0].relid) : -++id,
        namespace: t.schema === 'pg_catalog' ? '' : t.schema,
        name: t.table,
        replicaIdentity: IDENTITY[t.replicaIdentity] ?? 'default',
        columns: published.map((r) => ({ name: r.attname, typeOid: Number(r.oid), typeModifier: Number(r.typmod), isKey: r.iskey === 'true' })),
      },
      typeNames: published.map((r) => r.typ),
      // pgoutput's Type message names a domain by its base type.
      userTypes: published.filter((r) => Number(r.oid) >= 16384).map((r) => ({ oid: Number(r.oid), namespace: r.typnsp, name: r.typname })),
    });
  }
  return out;
}

const sample = (rel: MappedRelation, keysOnly = false): Tuple => rel.remote.columns.map((c) => (keysOnly && !c.isKey ? { kind: 'null' } : { kind: 'text', value: '' }));

/** The statements the apply and the copy run for a resolved relation; an operation that cannot run says why. */
async function statementsFor(rel: MappedRelation, t: PublishedTable, rule: TableRule | null, config: Config, source: pg.Client, target: pg.Client): Promise<TablePlan['sql']> {
  const sql: TablePlan['sql'] = {};
  const attempt = (f: () => string) => {
    try {
      return f();
    } catch (err) {
      return `-- not replicated: ${(err as Error).message}`;
    }
  };
  const full = rel.remote.replicaIdentity === 'full';
  sql.insert = attempt(() => insertStatement(rel, sample(rel)).text);
  sql.update = attempt(() => (full ? updateStatement(rel, 'old', sample(rel), sample(rel)) : updateStatement(rel, undefined, undefined, sample(rel))).text);
  sql.delete = attempt(() => deleteStatement(rel, full ? 'old' : 'key', sample(rel, !full)).text);
  sql.truncate = truncateStatement([rel], false).text;
  const mapped = mapTable(t, rule);
  const whole = { fromPage: null, toPage: null };
  if (mapped.target?.staged) {
    const types = await sourceColumnTypes(source, mapped);
    const staged = stagedCopySql(mapped, types, await differingTargetTypes(target, mapped, types), config.binary);
    sql.copy = [staged.create, `${sourceCopySql(mapped, whole, config.binary)} → ${staged.copyIn}`, staged.insert];
  } else {
    sql.copy = [`${sourceCopySql(mapped, whole, config.binary)} → ${targetCopySql(mapped, config.binary)}`];
  }
  return sql;
}

function problemOf(err: unknown): { column?: string; code: string; reason: string } {
  const e = err as PgsubError & { context?: { column?: string } };
  return { ...(e.context?.column ? { column: e.context.column } : {}), code: e instanceof PgsubError ? e.code : ((e as { code?: string }).code ?? 'ERROR'), reason: e.message };
}

/**
 * The plan of every published table (`onlyMapped`: of those a rule maps), checked against
 * the target; nothing is written on either side (a `drift: add` column is shown, not added).
 */
export async function buildPlan(config: Config, opts: { onlyMapped: boolean; withSql: boolean }): Promise<MappingPlan> {
  const appName = `pgsub_${config.subscription}_plan`;
  const replication = await ReplicationConnection.open(config.source, appName);
  let conn: WireConnection | null = null;
  let source: pg.Client | null = null;
  let target: pg.Client | null = null;
  try {
    const published = await listPublishedTables(replication, config.publications);
    const warnings: string[] = [];
    const names = new Set(published.map((t) => `${t.schema}.${t.table}`));
    for (const name of Object.keys(config.mapping.tables))
      if (!names.has(name)) warnings.push(`mapping.tables.${name}: the publications do not publish ${name} (the rule applies once they do)`);
    for (const schema of Object.keys(config.mapping.schemas))
      if (!published.some((t) => t.schema === schema)) warnings.push(`mapping.schemas.${schema}: the publications publish no table of schema ${schema}`);
    const chosen = published.filter((t) => !opts.onlyMapped || ruleFor(config.mapping, t.schema, t.table) !== null);
    const described = await describeSource(replication, chosen);
    conn = await openApplyConnection(config.target, { applicationName: appName, synchronousCommit: 'off' });
    if (opts.withSql) {
      source = await openCopyClient(config.source, appName, 'source');
      target = await openCopyClient(config.target, appName, 'target');
    }
    const map = new RelationMap(conn.serverVersionNum, {
      binary: config.binary,
      mapping: config.mapping,
      probe: rolledBackOn(config.target, appName),
      planOnly: true,
      subscription: config.subscription,
    });
    const tables: TablePlan[] = [];
    for (const d of described) {
      for (const u of d.userTypes) map.onType(u.oid, u.namespace, u.name);
      map.onRelation(d.relation);
      const rule = ruleFor(config.mapping, d.table.schema, d.table.table);
      const plan: TablePlan = {
        source: `${d.table.schema}.${d.table.table}`,
        target: rule ? `${rule.targetSchema}.${rule.targetTable}` : `${d.table.schema}.${d.table.table}`,
        mapped: rule !== null,
        drift: rule?.drift ?? null,
        replicaIdentity: d.relation.replicaIdentity,
        columns: [],
        computed: rule ? [...rule.computed].map(([column, expr]) => ({ column, expr })) : [],
        sql: {},
        problems: [],
      };
      let rel: MappedRelation | null = null;
      try {
        rel = await map.resolve(conn, d.relation.relationId);
      } catch (err) {
        plan.problems.push(problemOf(err));
      }
      const effective = rel?.rule ?? rule;
      plan.columns = d.relation.columns.map((c, i) => {
        const ignored = rel?.drift?.ignored.includes(c.name) ?? false;
        const to = effective?.renames.get(c.name) ?? c.name;
        const written = rel ? (rel.reshape ? rel.reshape.direct[i]! : true) : !(effective?.excluded.has(c.name) || effective?.computed.has(to));
        return {
          source: c.name,
          type: d.typeNames[i]!,
          target: written ? to : null,
          how: ignored ? 'ignored (drift)' : !written ? 'excluded' : to !== c.name ? 'renamed' : 'direct',
        };
      });
      if (rel && opts.withSql && source && target) {
        try {
          plan.sql = await statementsFor(rel, d.table, effective, config, source, target);
        } catch (err) {
          plan.problems.push(problemOf(err));
        }
      }
      tables.push(plan);
    }
    return { tables, warnings };
  } finally {
    await conn?.close().catch(() => {});
    await source?.end().catch(() => {});
    await target?.end().catch(() => {});
    await replication.close();
  }
}

/**
 * The startup check (see header): every mapped table resolved against the target before
 * the first session streams. All failures are gathered into one MappingError (exit 2).
 */
export async function checkMappingsAtStartup(config: Config, log: Logger): Promise<void> {
  if (isEmptyMapping(config.mapping)) return;
  const plan = await buildPlan(config, { onlyMapped: true, withSql: false });
  for (const w of plan.warnings) log.warn({}, w);
  const failed = plan.tables.flatMap((t) => t.problems.map((p) => ({ table: t.source, ...p })));
  if (failed.length === 0) return;
  const first = failed[0]!;
  throw new MappingError(
    `the mapping does not fit the publisher's tables and the target (pgsub plan shows them all): ${failed.map((f) => `${f.table}${f.column ? ` column ${f.column}` : ''}: ${f.reason}`).join('; ')}`,
    { relation: first.table, ...(first.column ? { column: first.column } : {}), problems: failed.length },
  );
}

/** The plan as text: per table the mapping, then the SQL. */
export function formatPlan(plan: MappingPlan): string {
  const lines: string[] = [];
  for (const w of plan.warnings) lines.push(`warning: ${w}`);
  for (const t of plan.tables) {
    lines.push('', `${t.source} → ${t.target}${t.mapped ? ` (mapped, drift: ${t.drift})` : ' (no rule)'}, replica identity ${t.replicaIdentity}`);
    for (const c of t.columns) lines.push(`  ${c.source} ${c.type}${c.target ? ` → ${c.target}` : ''}  [${c.how}]`);
    for (const c of t.computed) lines.push(`  ${c.column} = ${c.expr}  [computed]`);
    for (const p of t.problems) lines.push(`  ERROR ${p.code}${p.column ? ` (${p.column})` : ''}: ${p.reason}`);
    for (const [op, text] of Object.entries(t.sql)) {
      if (Array.isArray(text)) for (const [i, s] of text.entries()) lines.push(`  ${i === 0 ? `${op}:`.padEnd(10) : ' '.repeat(10)}${s}`);
      else lines.push(`  ${`${op}:`.padEnd(10)}${text}`);
    }
  }
  return `${lines.join('\n').trimStart()}\n`;
}
