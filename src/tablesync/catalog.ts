/**
 * What the publisher publishes, as the table sync needs it: the published tables of the
 * subscription's publications (the partition root instead of leaves where
 * publish_via_partition_root says so), their published columns (PG15+ column lists;
 * generated columns only where the publication publishes them) and row filters (PG15+,
 * OR-ed across publications, none if any publication has none — as native's copy), plus
 * size estimates for progress. Queries run as simple SQL on the walsender connection.
 */
import type { ReplicationConnection } from '../protocol/replication.js';
import { quoteLiteral } from '../quote.js';
import type { TableRule } from '../mapping/rules.js';
import { expressionColumns } from '../mapping/columns.js';
import type { RelationMessage } from '../protocol/messages.js';

export interface PublishedTable {
  schema: string;
  table: string;
  /** Published columns in table order. */
  columns: string[];
  /** SQL boolean expression, or null for all rows. */
  rowFilter: string | null;
  /** 'r' plain, 'p' partitioned root. */
  relkind: string;
  estimatedRows: number;
  estimatedBytes: number;
  /** Heap pages, for splitting a plain table into ctid ranges. */
  pages: number;
  /** A published column is generated on the publisher (PG18): COPY must read it through a query. */
  generated: boolean;
  /** pg_class.relreplident: d default (primary key), n nothing, f full, i index. */
  replicaIdentity: string;
  /** The default identity has a primary key to use. */
  hasPrimaryKey: boolean;
  /** A publication publishes its UPDATEs or DELETEs. */
  publishesUpdates: boolean;
  /** Where a mapping rule sends the rows (mapTable); absent: the same name and columns. */
  target?: CopyTarget;
}

export interface CopyTarget {
  schema: string;
  table: string;
  /** The target column receiving each of `columns`, in order. */
  columns: string[];
  /** Why this version cannot copy the table under its rule; null: it can. */
  unsupported: string | null;
  /**
   * Computed columns: the copy goes through a staging table (copy.ts stagedCopySql).
   * `direct[i]`: the published column `columns[i]` of the table is written as it is (to
   * `CopyTarget.columns`, in order); the others only feed the expressions.
   */
  staged?: { direct: boolean[]; computed: [string, string][] };
  /**
   * Many-to-one (a discriminator): the target table is shared with other source tables, so
   * the copy's emptiness check and a retry's cleanup are scoped to this source's rows
   * (`column = value`, a DELETE, never TRUNCATE), indexes are not deferred and nothing is
   * loaded frozen (job.ts); the value is written as a computed constant (staged), or, where
   * the target takes it as text, appended on the publisher's side (copy.ts straightShardCopy).
   */
  discriminator?: { column: string; value: string };
  /**
   * Set by copy.ts straightShardCopy only: the straight COPY of a shard, the discriminator's
   * value read on the publisher as a text literal after `columns` (the target's last column).
   */
  constant?: string;
}

/** The target table of a copy: the mapped one, else the publisher's name. */
export function copyTarget(t: PublishedTable): { schema: string; table: string } {
  return t.target ?? t;
}

/**
 * A published table under its mapping rule (mapping/rules.ts): excluded columns are not
 * read, renamed ones are written under their target names, so a table mapped only by
 * renames and excludes keeps the straight COPY with column lists.
 */
export function mapTable(t: PublishedTable, rule: TableRule | null): PublishedTable {
  if (!rule) return t;
  const isDirect = (c: string) => !rule.excluded.has(c) && !rule.computed.has(rule.renames.get(c) ?? c);
  const kept = t.columns.filter(isDirect);
  const disc = rule.rows.discriminator;
  // The discriminator's constant is a computed column of the copy, as of the apply (mapping/columns.ts).
  const computed: [string, string][] = [...rule.computed, ...(disc ? ([[disc.column, quoteLiteral(disc.value)]] as [string, string][]) : [])];
  // The mapping's row filter reads the remote row by the publisher's names: the copy pushes
  // it down to the publisher's SELECT, as native's copy does with publication row filters.
  const filter = rule.rows.filter;
  const rowFilter = filter === undefined ? t.rowFilter : t.rowFilter ? `(${t.rowFilter}) AND (${filter})` : `(${filter})`;
  const target: CopyTarget = { schema: rule.targetSchema, table: rule.targetTable, columns: kept.map((c) => rule.renames.get(c) ?? c), unsupported: null };
  if (disc) target.discriminator = { column: disc.column, value: disc.value };
  if (computed.length === 0) return { ...t, columns: kept, rowFilter, target };
  // Computed columns: read the direct columns and every column an expression names.
  const asRelation = { columns: t.columns.map((name) => ({ name })) } as unknown as RelationMessage;
  const used = new Set([...rule.computed.values()].flatMap((e) => expressionColumns(e, asRelation)));
  const columns = t.columns.filter((c, i) => isDirect(c) || used.has(i));
  return { ...t, columns, rowFilter, target: { ...target, staged: { direct: columns.map(isDirect), computed } } };
}

/**
 * Which of `publications` exist in the publisher's database now, in the configured order.
 * A missing one is skipped with a warning by PostgreSQL 18's pgoutput and an error in older
 * ones: only these are given to START_REPLICATION, and checked again at each refresh.
 */
export async function existingPublications(replication: ReplicationConnection, publications: readonly string[]): Promise<string[]> {
  const names = publications.map(quoteLiteral).join(', ');
  const rows = await replication.sql<{ pubname: string }>(`SELECT pubname::text FROM pg_catalog.pg_publication WHERE pubname IN (${names})`);
  const found = new Set(rows.map((r) => r.pubname));
  return publications.filter((p) => found.has(p));
}

/**
 * The names of the tables `publications` publish (as listPublishedTables lists them, without
 * their columns and sizes): what `pgsub status` compares with the subscription's tables.
 */
export async function listPublishedNames(replication: ReplicationConnection, publications: readonly string[]): Promise<{ schema: string; table: string }[]> {
  if (publications.length === 0) return [];
  const pubs = publications.map(quoteLiteral).join(', ');
  const rows = await replication.sql<{ schemaname: string; tablename: string }>(
    `SELECT DISTINCT pt.schemaname::text, pt.tablename::text
       FROM pg_catalog.pg_publication_tables pt
       JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
       JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
      WHERE pt.pubname IN (${pubs})${replication.serverVersionNum >= 130000 ? viaAncestor(pubs) : ''}
      ORDER BY 1, 2`,
  );
  return rows.map((r) => ({ schema: r.schemaname, table: r.tablename }));
}

export async function listPublishedTables(replication: ReplicationConnection, publications: string[]): Promise<PublishedTable[]> {
  const v = replication.serverVersionNum;
  const pubs = publications.map(quoteLiteral).join(', ');
  const hasColumnLists = v >= 150000;
  // PostgreSQL 18 publishes generated columns (publish_generated_columns, or a column list).
  const hasGeneratedColumns = v >= 180000;
  const rows = await replication.sql<{
    schemaname: string;
    tablename: string;
    attnames: string | null;
    rowfilters: string | null;
    unfiltered: string;
    relkind: string;
    reltuples: string;
    bytes: string;
    pages: string;
    generated: string;
    replident: string;
    haspk: string;
    updates: string;
  }>(
    `SELECT pt.schemaname::text, pt.tablename::text,
            ${hasColumnLists ? `(pg_catalog.json_agg(pt.attnames) -> 0)::text` : 'NULL::text'} AS attnames,
            ${hasColumnLists ? `pg_catalog.json_agg(pt.rowfilter) FILTER (WHERE pt.rowfilter IS NOT NULL)::text` : 'NULL::text'} AS rowfilters,
            ${hasColumnLists ? `bool_or(pt.rowfilter IS NULL)::text` : `'true'`} AS unfiltered,
            c.relkind::text, GREATEST(c.reltuples, 0)::bigint::text AS reltuples,
            pg_catalog.pg_total_relation_size(c.oid)::text AS bytes,
            (pg_catalog.pg_relation_size(c.oid) / pg_catalog.current_setting('block_size')::int)::text AS pages,
            ${hasGeneratedColumns ? `bool_or(EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attgenerated <> '' AND a.attname = ANY (pt.attnames)))::text` : `'false'`} AS generated,
            c.relreplident::text AS replident,
            EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)::text AS haspk,
            bool_or(pp.pubupdate OR pp.pubdelete)::text AS updates
       FROM pg_catalog.pg_publication_tables pt
       JOIN pg_catalog.pg_publication pp ON pp.pubname = pt.pubname
       JOIN pg_catalog.pg_namespace n ON n.nspname = pt.schemaname
       JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
      WHERE pt.pubname IN (${pubs})${v >= 130000 ? viaAncestor(pubs) : ''}
      GROUP BY pt.schemaname, pt.tablename, c.oid, c.relkind, c.reltuples, c.relreplident
      ORDER BY pt.schemaname, pt.tablename`,
  );
  const generatedExpr = v >= 120000 ? `a.attgenerated = ''` : 'true';
  const out: PublishedTable[] = [];
  for (const r of rows) {
    let columns: string[] | null = r.attnames ? (JSON.parse(r.attnames) as string[]) : null;
    if (!columns) {
      const cols = await replication.sql<{ attname: string }>(
        `SELECT a.attname::text FROM pg_catalog.pg_attribute a
          WHERE a.attrelid = pg_catalog.format('%I.%I', ${quoteLiteral(r.schemaname)}, ${quoteLiteral(r.tablename)})::pg_catalog.regclass
            AND a.attnum > 0 AND NOT a.attisdropped AND ${generatedExpr}
          ORDER BY a.attnum`,
      );
      columns = cols.map((c) => c.attname);
    }
    const filters = r.unfiltered === 'true' || !r.rowfilters ? null : (JSON.parse(r.rowfilters) as string[]);
    out.push({
      schema: r.schemaname,
      table: r.tablename,
      columns,
      rowFilter: filters && filters.length > 0 ? filters.map((f) => `(${f})`).join(' OR ') : null,
      relkind: r.relkind,
      estimatedRows: Number(r.reltuples),
      estimatedBytes: Number(r.bytes),
      pages: Number(r.pages),
      generated: r.generated === 'true',
      replicaIdentity: r.replident,
      hasPrimaryKey: r.haspk === 'true',
      publishesUpdates: r.updates === 'true',
    });
  }
  return out;
}

/**
 * A partition whose ancestor one of these publications publishes with
 * publish_via_partition_root is published only through that ancestor, whatever else
 * names the partition itself (pg_get_publication_tables, pgoutput's get_rel_sync_entry):
 * its rows are copied and streamed as the ancestor's.
 */
function viaAncestor(pubs: string): string {
  return `
        AND NOT (c.relispartition AND EXISTS (
              SELECT 1 FROM pg_catalog.pg_partition_ancestors(c.oid) AS anc
                JOIN pg_catalog.pg_class ac ON ac.oid = anc.relid
                JOIN pg_catalog.pg_namespace an ON an.oid = ac.relnamespace
                JOIN pg_catalog.pg_publication_tables apt ON apt.schemaname = an.nspname AND apt.tablename = ac.relname
                JOIN pg_catalog.pg_publication p ON p.pubname = apt.pubname
               WHERE anc.relid <> c.oid AND p.pubviaroot AND apt.pubname IN (${pubs})))`;
}
