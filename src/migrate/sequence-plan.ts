/**
 * Which target sequence each source sequence moves (the plan of the sequence sync,
 * sequences.ts). A sequence feeds a column: an identity or serial column (what
 * pg_get_serial_sequence finds) or a nextval() default. The column's values reach the
 * target under the mapping's names (mapping/rules.ts: target table, renamed column), and
 * there the column is fed by the target's own sequence — looked up on the target with
 * pg_get_serial_sequence under the target's table and column names (a default's nextval
 * otherwise), whatever it is called. So a retargeted table's sequence is found under its
 * new name, and shards merged many-to-one into one table give one target sequence with
 * every shard's sequence as a source: the sync sets it past the furthest of them.
 *
 * `sequence_names` (standalone sequences) keep their name on both sides. What cannot be
 * planned is listed with the reason — a column the mapping excludes, a target column no
 * sequence feeds, a target table or sequence that does not exist — never dropped silently.
 * Catalog reads only (PostgreSQL 10+, text columns): the plan is made before a cutover's
 * fence and at each periodic round.
 */
import type { Config } from '../config/config.js';
import { ruleFor } from '../mapping/rules.js';
import { publishedTables, type Db, type Row } from './db.js';
import { readDescendants, readSequenceFeeds, relName, seqName, type Rel, type SequenceFeed, type SequenceUse } from './objects.js';

export interface PlannedSequence {
  /** The target's sequence. */
  schema: string;
  name: string;
  kind: SequenceUse['kind'];
  /** The target column it feeds (schema.table.column); null for sequence_names. */
  usedBy: string | null;
  /** Where the column floor reads max(column); null for sequence_names and a column not of integers. */
  column: { schema: string; table: string; column: string } | null;
  /** The source sequences whose values reach the column (several: many-to-one). */
  sources: { schema: string; name: string; usedBy: string | null }[];
}

export interface UnplannedSequence {
  /** The source sequence. */
  sequence: string;
  usedBy: string | null;
  kind: SequenceUse['kind'];
  reason: string;
}

export interface SequencePlan {
  sequences: PlannedSequence[];
  unplanned: UnplannedSequence[];
}

interface TargetColumn {
  schema: string;
  table: string;
  column: string;
}

interface TargetFeed {
  tableExists: boolean;
  columnExists: boolean;
  sequence: { schema: string; name: string; kind: SequenceUse['kind'] } | null;
  /** The column holds integers (int2, int4, int8, numeric; a domain over one): its max() is a floor. */
  integer: boolean;
}

/**
 * The sequence feeding each target column, on the target: pg_get_serial_sequence (identity
 * and serial), else the sequence a nextval() default names. One statement for all.
 */
async function readTargetFeeds(target: Db, cols: readonly TargetColumn[]): Promise<TargetFeed[]> {
  if (cols.length === 0) return [];
  const rows = await target.query<Row>(
    `SELECT x.i::text AS i, (c.oid IS NOT NULL)::text AS has_table, (a.attnum IS NOT NULL)::text AS has_column,
            sn.nspname::text AS seq_schema, s.relname::text AS seq_name, a.attidentity::text AS identity, (ser.oid IS NOT NULL)::text AS serial,
            (COALESCE(NULLIF(ty.typbasetype, 0), ty.oid) IN (20, 21, 23, 1700))::text AS is_integer
       FROM pg_catalog.json_to_recordset($1::json) AS x(i int, schema text, tab text, col text)
       LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema
       LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.tab AND c.relkind IN ('r', 'p')
       LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = x.col AND a.attnum > 0 AND NOT a.attisdropped
       LEFT JOIN pg_catalog.pg_type ty ON ty.oid = a.atttypid
       LEFT JOIN LATERAL (SELECT CASE WHEN a.attnum IS NOT NULL
                   THEN pg_catalog.pg_get_serial_sequence(pg_catalog.format('%I.%I', x.schema, x.tab), x.col)::pg_catalog.regclass::pg_catalog.oid END AS oid) ser ON true
       LEFT JOIN LATERAL (SELECT d.refobjid AS oid FROM pg_catalog.pg_attrdef ad
                   JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass AND d.objid = ad.oid
                        AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
                   JOIN pg_catalog.pg_class ds ON ds.oid = d.refobjid AND ds.relkind = 'S'
                  WHERE ad.adrelid = c.oid AND ad.adnum = a.attnum LIMIT 1) def ON true
       LEFT JOIN pg_catalog.pg_class s ON s.oid = COALESCE(ser.oid, def.oid)
       LEFT JOIN pg_catalog.pg_namespace sn ON sn.oid = s.relnamespace
      ORDER BY x.i`,
    [JSON.stringify(cols.map((c, i) => ({ i, schema: c.schema, tab: c.table, col: c.column })))],
  );
  return rows.map((r) => ({
    tableExists: r.has_table === 'true',
    columnExists: r.has_column === 'true',
    sequence: r.seq_name ? { schema: r.seq_schema!, name: r.seq_name, kind: r.identity ? 'identity' : r.serial === 'true' ? 'owned' : 'default' } : null,
    integer: r.is_integer === 'true',
  }));
}

/** The source's sequence-fed columns: the published tables' first, their partitions' for sequences not found there. */
async function sourceFeeds(source: Db, config: Config): Promise<SequenceFeed[]> {
  const roots: Rel[] = (await publishedTables(source, config.publications)).map((t) => ({ schema: t.schema, table: t.table }));
  const feeds = await readSequenceFeeds(source, roots);
  const seen = new Set(feeds.map((f) => `${f.seqSchema}.${f.seqName}`));
  // A partition's default names its root's sequence: the root's mapping decides where its values go.
  for (const f of await readSequenceFeeds(source, await readDescendants(source, roots))) if (!seen.has(`${f.seqSchema}.${f.seqName}`)) feeds.push(f);
  return feeds;
}

/** The plan: each target sequence with the source sequences merged into it, and what could not be planned. */
export async function planSequences(source: Db, target: Db, config: Config): Promise<SequencePlan> {
  const unplanned: UnplannedSequence[] = [];
  const wanted: { feed: SequenceFeed; to: TargetColumn }[] = [];
  for (const feed of await sourceFeeds(source, config)) {
    const rule = ruleFor(config.mapping, feed.schema, feed.table);
    const usedBy = `${relName(feed)}.${feed.column}`;
    if (rule?.excluded.has(feed.column)) {
      unplanned.push({
        sequence: `${feed.seqSchema}.${feed.seqName}`,
        usedBy,
        kind: feed.kind,
        reason: `column ${usedBy} is excluded by the mapping: its values do not reach the target`,
      });
      continue;
    }
    const to = rule
      ? { schema: rule.targetSchema, table: rule.targetTable, column: rule.renames.get(feed.column) ?? feed.column }
      : { schema: feed.schema, table: feed.table, column: feed.column };
    wanted.push({ feed, to });
  }
  const found = await readTargetFeeds(
    target,
    wanted.map((w) => w.to),
  );
  const planned = new Map<string, PlannedSequence>();
  wanted.forEach(({ feed, to }, i) => {
    const t = found[i]!;
    const sequence = `${feed.seqSchema}.${feed.seqName}`;
    const usedBy = `${relName(feed)}.${feed.column}`;
    const into = `${to.schema}.${to.table}.${to.column}`;
    const reason = !t.tableExists
      ? `its table's target ${to.schema}.${to.table} does not exist on the target`
      : !t.columnExists
        ? `its column's target ${into} does not exist on the target`
        : !t.sequence
          ? `no sequence feeds ${into} on the target (not an identity or serial column, no nextval() default): nothing to set`
          : null;
    if (reason !== null || !t.sequence) {
      unplanned.push({ sequence, usedBy, kind: feed.kind, reason: reason ?? '' });
      return;
    }
    const key = seqName(t.sequence);
    const p = planned.get(key) ?? { schema: t.sequence.schema, name: t.sequence.name, kind: t.sequence.kind, usedBy: into, column: t.integer ? to : null, sources: [] };
    if (!p.sources.some((s) => seqName(s) === sequence)) p.sources.push({ schema: feed.seqSchema, name: feed.seqName, usedBy });
    planned.set(key, p);
  });
  await addStandalone(target, config, planned, unplanned);
  return { sequences: [...planned.values()], unplanned };
}

/** sequence_names: the same name on both sides, unless a column's plan already sets it. */
async function addStandalone(target: Db, config: Config, planned: Map<string, PlannedSequence>, unplanned: UnplannedSequence[]): Promise<void> {
  const names = config.sequenceNames.filter((s) => !planned.has(seqName(s)));
  if (names.length === 0) return;
  const rows = await target.query<Row>(
    `SELECT x.schema || '.' || x.name AS name FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
      WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = x.schema AND c.relname = x.name AND c.relkind = 'S')`,
    [JSON.stringify(names.map((s) => ({ schema: s.schema, name: s.name })))],
  );
  const there = new Set(rows.map((r) => r.name!));
  for (const s of names) {
    if (!there.has(seqName(s))) {
      unplanned.push({ sequence: seqName(s), usedBy: null, kind: 'config', reason: 'sequence_names names it, and the target has no sequence of that name' });
      continue;
    }
    planned.set(seqName(s), { schema: s.schema, name: s.name, kind: 'config', usedBy: null, column: null, sources: [{ schema: s.schema, name: s.name, usedBy: null }] });
  }
}

/** The distinct source sequences of a plan. */
export function planSources(plan: SequencePlan): { schema: string; name: string }[] {
  const out = new Map<string, { schema: string; name: string }>();
  for (const p of plan.sequences) for (const s of p.sources) out.set(seqName(s), { schema: s.schema, name: s.name });
  return [...out.values()];
}
