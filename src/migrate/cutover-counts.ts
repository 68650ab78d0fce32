/**
 * The cutover's row counts (its step 6): once the source is fenced and the target has
 * applied up to the fence, the rows a table sends through the subscription and the rows
 * they became on the target are of the same moment, so their counts must be equal. What a
 * table sends is what the publication publishes — its row filter (PostgreSQL 15+,
 * pg_publication_tables.rowfilter, OR-ed across publications as the table sync does;
 * a column list changes no count) — and its mapping rule's filter; where it lands is the
 * mapping's target table (mapping/rules.ts), as verify names it (verify/sql.ts onSide).
 *
 * A rule's row semantics decide what is counted on the target: a discriminator shard is
 * the slice `discriminator = value`; soft delete counts the live rows (flag not true, at
 * and lsn null — what a revive resets); source tables merged into one target without a
 * discriminator are counted together. Where no slice is exact the table is named "not
 * counted" with why — a truncate policy that keeps rows a source TRUNCATE removed, a key
 * override (the target may hold rows of other origins), a shard merged beside ones
 * without a discriminator — instead of failing the cutover. The plan is made before the
 * fence (a target table that is missing refuses the cutover there); counting costs one
 * scan per table and side.
 */
import type { Config } from '../config/config.js';
import { ruleFor, type TableRule } from '../mapping/rules.js';
import { quoteIdent, quoteQualified } from '../quote.js';
import type { PublishedTable } from '../tablesync/catalog.js';
import type { Db, Row } from './db.js';

export interface TableCount {
  /** The source table (several joined by " + " when merged without a discriminator). */
  table: string;
  /** Where its rows land: the target table, with the slice counted there. */
  target_table: string;
  /** null: not counted. */
  source: number | null;
  /** null: not counted, or the table cannot be read on the target. */
  target: number | null;
  /** null: not counted. */
  equal: boolean | null;
  status: 'equal' | 'different' | 'not counted';
  /** Why it is not counted, or what was counted on the source side (the filters). */
  note: string | null;
}

interface Counted {
  table: string;
  sources: { schema: string; table: string; where: string | null }[];
  target: { schema: string; table: string; where: string | null; params: string[]; slice: string | null };
  /** What filtered the source's rows, in words; null: none. */
  filters: string | null;
}

interface NotCounted {
  table: string;
  targetTable: string;
  reason: string;
}

export interface CountPlan {
  counted: Counted[];
  notCounted: NotCounted[];
}

/** The filters a table's source rows are counted through, in words. */
function filterWords(rowFilter: string | null, mappingFilter: string | undefined): string | null {
  const parts = [rowFilter && `the publication's row filter ${rowFilter}`, mappingFilter && `the mapping's filter (${mappingFilter})`].filter(Boolean);
  return parts.length > 0 ? `counted through ${parts.join(' and ')}` : null;
}

const and = (parts: (string | null | undefined)[]): string | null => {
  const kept = parts.filter((p): p is string => !!p);
  return kept.length === 0 ? null : kept.map((p) => `(${p})`).join(' AND ');
};

/** Why a rule's rows cannot be counted exactly, or null. */
function notCountable(rule: TableRule): string | null {
  const r = rule.rows;
  if (r.truncate === 'ignore') return 'truncate: ignore keeps the rows a source TRUNCATE removed';
  if (r.truncate === 'soft_delete' && !r.softDelete) return 'truncate: soft_delete without soft_delete columns';
  // A shard's slice holds its own rows only, whatever its key; without one the table is shared.
  if (r.key && !r.discriminator) return `key (${r.key.join(', ')}) overrides the replica identity: the target table may hold rows that did not come from this source`;
  return null;
}

/** Soft delete: a live row has none of the marks a DELETE sets (a revive resets them all). */
function liveRows(rule: TableRule): string | null {
  const s = rule.rows.softDelete;
  if (!s) return null;
  return and([s.flag && `${quoteIdent(s.flag)} IS NOT TRUE`, s.at && `${quoteIdent(s.at)} IS NULL`, s.lsn && `${quoteIdent(s.lsn)} IS NULL`]);
}

/** Target tables that exist, with the discriminator columns' types (a shard's value is cast to it). */
async function readTargets(target: Db, cols: { schema: string; table: string; column: string | null }[]): Promise<{ exists: boolean; type: string | null }[]> {
  if (cols.length === 0) return [];
  const rows = await target.query<Row>(
    `SELECT x.i::text AS i, (c.oid IS NOT NULL)::text AS has_table, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
       FROM pg_catalog.json_to_recordset($1::json) AS x(i int, schema text, tab text, col text)
       LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema
       LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.tab AND c.relkind IN ('r', 'p', 'f')
       LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = x.col AND a.attnum > 0 AND NOT a.attisdropped
      ORDER BY x.i`,
    [JSON.stringify(cols.map((c, i) => ({ i, schema: c.schema, tab: c.table, col: c.column })))],
  );
  return rows.map((r) => ({ exists: r.has_table === 'true', type: r.type ?? null }));
}

/** Where each published table's rows land: the mapping's target, else the same name. */
function placed(mapping: Config['mapping'], published: readonly PublishedTable[]) {
  return published.map((t) => {
    const rule = ruleFor(mapping, t.schema, t.table);
    return { t, rule, to: rule ? { schema: rule.targetSchema, table: rule.targetTable } : { schema: t.schema, table: t.table } };
  });
}

/**
 * The counts to take at the fence, per published table (see the header). Throws, naming
 * them, when target tables are missing: the cutover refuses before its fence.
 */
export async function planCounts(target: Db, config: Config, published: readonly PublishedTable[]): Promise<CountPlan> {
  const found = await readTargets(
    target,
    placed(config.mapping, published).map((e) => ({ ...e.to, column: e.rule?.rows.discriminator?.column ?? null })),
  );
  return countPlanFrom(config.mapping, published, found);
}

/** The plan from what the target has (readTargets, in `published`' order): pure, for planCounts and its unit test. */
export function countPlanFrom(mapping: Config['mapping'], published: readonly PublishedTable[], found: readonly { exists: boolean; type: string | null }[]): CountPlan {
  const entries = placed(mapping, published);
  const missing = entries.filter((_, i) => !found[i]!.exists).map((e) => `${e.t.schema}.${e.t.table} → ${e.to.schema}.${e.to.table}`);
  if (missing.length > 0) throw new Error(`target table(s) missing, so their rows cannot be counted at the fence: ${missing.join(', ')}`);

  const byTarget = new Map<string, typeof entries>();
  for (const e of entries) byTarget.set(`${e.to.schema}.${e.to.table}`, [...(byTarget.get(`${e.to.schema}.${e.to.table}`) ?? []), e]);
  const plan: CountPlan = { counted: [], notCounted: [] };
  for (const [targetTable, group] of byTarget) {
    const plain = group.filter((e) => !e.rule?.rows.discriminator);
    const shards = group.filter((e) => e.rule?.rows.discriminator);
    for (const e of group) {
      const name = `${e.t.schema}.${e.t.table}`;
      const why = e.rule ? notCountable(e.rule) : null;
      const shardBesidePlain = shards.length > 0 && plain.length > 0 && !e.rule?.rows.discriminator;
      const reason =
        why ??
        (shardBesidePlain
          ? `${targetTable} also receives the rows of ${shards.map((s) => `${s.t.schema}.${s.t.table}`).join(', ')}, and this table has no discriminator to tell its own`
          : null);
      if (reason) {
        plan.notCounted.push({ table: name, targetTable, reason });
        continue;
      }
      const source = { schema: e.t.schema, table: e.t.table, where: and([e.t.rowFilter, e.rule?.rows.filter]) };
      const filters = filterWords(e.t.rowFilter, e.rule?.rows.filter);
      const d = e.rule?.rows.discriminator;
      if (d) {
        // The value as the apply writes it: cast to the column's type (format_type is the server's own text).
        const type = found[entries.indexOf(e)]!.type ?? 'pg_catalog.text';
        const slice = `${quoteIdent(d.column)} = $1::pg_catalog.text::${type}`;
        plan.counted.push({
          table: name,
          sources: [source],
          target: { ...e.to, where: and([slice, e.rule && liveRows(e.rule)]), params: [d.value], slice: `${d.column} = '${d.value}'` },
          filters,
        });
      } else if (plain.length === 1 || shards.length > 0) {
        plan.counted.push({ table: name, sources: [source], target: { ...e.to, where: e.rule ? liveRows(e.rule) : null, params: [], slice: null }, filters });
      }
    }
    // Several source tables into one target without a discriminator: their sum is the target's count.
    const merged = plain.filter((e) => !(e.rule && notCountable(e.rule)));
    if (plain.length > 1 && shards.length === 0 && merged.length === plain.length) {
      plan.counted.push({
        table: merged.map((e) => `${e.t.schema}.${e.t.table}`).join(' + '),
        sources: merged.map((e) => ({ schema: e.t.schema, table: e.t.table, where: and([e.t.rowFilter, e.rule?.rows.filter]) })),
        target: { ...merged[0]!.to, where: and(merged.map((e) => (e.rule ? liveRows(e.rule) : null))), params: [], slice: null },
        filters: merged.some((e) => e.t.rowFilter || e.rule?.rows.filter) ? 'counted through their filters' : null,
      });
    } else if (plain.length > 1 && shards.length === 0) {
      for (const e of merged)
        plan.notCounted.push({ table: `${e.t.schema}.${e.t.table}`, targetTable, reason: `${targetTable} also receives rows of source tables that are not counted` });
    }
  }
  return plan;
}

async function count(db: Db, rel: { schema: string; table: string }, where: string | null, params: string[] = []): Promise<number> {
  const [r] = await db.query<Row>(`SELECT pg_catalog.count(*)::text AS n FROM ${quoteQualified(rel.schema, rel.table)}${where ? ` WHERE ${where}` : ''}`, params);
  return Number(r!.n);
}

/** The counts of the plan, each table's sides read side by side. */
export async function countAtFence(source: Db, target: Db, plan: CountPlan): Promise<TableCount[]> {
  const out: TableCount[] = [];
  for (const c of plan.counted) {
    const [s, t] = await Promise.all([
      Promise.all(c.sources.map((x) => count(source, x, x.where))).then((n) => n.reduce((a, b) => a + b, 0)),
      count(target, c.target, c.target.where, c.target.params).catch(() => null),
    ]);
    out.push({
      table: c.table,
      target_table: `${c.target.schema}.${c.target.table}${c.target.slice ? ` where ${c.target.slice}` : ''}`,
      source: s,
      target: t,
      equal: s === t,
      status: s === t ? 'equal' : 'different',
      note: c.filters,
    });
  }
  for (const n of plan.notCounted)
    out.push({ table: n.table, target_table: n.targetTable, source: null, target: null, equal: null, status: 'not counted', note: `not counted: ${n.reason}` });
  return out;
}

/** The step's one line: how many tables and rows are equal, and how many were not counted. */
export function countSummary(tables: readonly TableCount[]): string {
  const counted = tables.filter((t) => t.status !== 'not counted');
  const rows = counted.reduce((s, t) => s + (t.source ?? 0), 0);
  const skipped = tables.length - counted.length;
  return `${counted.length} table(s), ${rows} rows, equal on both sides${skipped > 0 ? `; ${skipped} not counted (row rules: see the summary)` : ''}`;
}

/** The differences, for the failure's message. */
export function countDifferences(tables: readonly TableCount[]): string | null {
  const unequal = tables.filter((t) => t.status === 'different');
  if (unequal.length === 0) return null;
  return unequal.map((t) => `${t.table} source ${t.source}, target ${t.target_table} ${t.target ?? 'unreadable'}`).join('; ');
}

/** The summary's table of counts (cli/cutover.ts renderCutover). */
export function renderCounts(tables: readonly TableCount[]): string[] {
  const lines = [`  ${'table'.padEnd(32)} ${'source rows'.padStart(12)} ${'target rows'.padStart(12)}`];
  for (const t of tables) {
    const into = t.target_table !== t.table ? `  → ${t.target_table}` : '';
    if (t.status === 'not counted') lines.push(`  ${t.table.slice(0, 32).padEnd(32)} ${'-'.padStart(12)} ${'-'.padStart(12)}${into}  ${t.note}`);
    else lines.push(`  ${t.table.slice(0, 32).padEnd(32)} ${String(t.source).padStart(12)} ${String(t.target ?? '-').padStart(12)}${into}${t.note ? `  (${t.note})` : ''}`);
  }
  return lines;
}
