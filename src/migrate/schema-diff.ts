/**
 * `pgsub schema diff`: the published tables' schema on the source and on the target, side
 * by side, with the differences listed — columns (type, NOT NULL, default, identity,
 * generated, collation), constraints and indexes by name with their definitions as the
 * server prints them (pg_get_constraintdef, pg_get_indexdef), triggers, and the sequences
 * the tables use (type, increment, bounds, cycle). Read-only on both sides. NOT NULL
 * constraints, which PostgreSQL 18 also lists in pg_constraint, are compared as the
 * columns' NOT NULL, so an 18 side and an older one compare equal.
 */
import type { Config } from '../config/config.js';
import { openPgDb, openTargetDb, publishedTables, relationsParam, type Db, type Row } from './db.js';
import { readColumns, readDescendants, readSequenceUses, relName, type Column, type Rel } from './objects.js';

export type ItemKind = 'table' | 'column' | 'constraint' | 'index' | 'trigger' | 'sequence';

export interface DiffItem {
  object: string;
  kind: ItemKind;
  name: string;
  source: string | null;
  target: string | null;
  /** same, differs, source_only (missing on the target), target_only. */
  status: 'same' | 'differs' | 'source_only' | 'target_only';
}

export interface SchemaDiff {
  source_version: string;
  target_version: string;
  items: DiffItem[];
  differences: number;
}

export function describeColumn(c: Column): string {
  const parts = [c.type];
  if (c.collation) parts.push(`COLLATE ${c.collation}`);
  if (c.generated !== '') parts.push(`GENERATED ALWAYS AS (${c.default ?? ''}) ${c.generated === 'v' ? 'VIRTUAL' : 'STORED'}`);
  else if (c.default !== null) parts.push(`DEFAULT ${c.default}`);
  if (c.identity !== '') parts.push(`GENERATED ${c.identity === 'a' ? 'ALWAYS' : 'BY DEFAULT'} AS IDENTITY`);
  if (c.notNull) parts.push('NOT NULL');
  return parts.join(' ');
}

const NAMED = `pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
  JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name`;

type Definitions = Map<string, Map<string, string>>;

async function readDefinitions(db: Db, rels: Rel[], kind: 'constraint' | 'index' | 'trigger'): Promise<Definitions> {
  const query = {
    constraint: `SELECT n.nspname || '.' || c.relname AS rel, co.conname::text AS name, pg_catalog.pg_get_constraintdef(co.oid) AS def
                   FROM ${NAMED} JOIN pg_catalog.pg_constraint co ON co.conrelid = c.oid WHERE co.contype <> 'n'`,
    index: `SELECT n.nspname || '.' || c.relname AS rel, ic.relname::text AS name, pg_catalog.pg_get_indexdef(i.indexrelid) AS def
              FROM ${NAMED} JOIN pg_catalog.pg_index i ON i.indrelid = c.oid JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid`,
    trigger: `SELECT n.nspname || '.' || c.relname AS rel, t.tgname::text AS name, pg_catalog.pg_get_triggerdef(t.oid) AS def
                FROM ${NAMED} JOIN pg_catalog.pg_trigger t ON t.tgrelid = c.oid WHERE NOT t.tgisinternal`,
  }[kind];
  const out: Definitions = new Map();
  for (const r of await db.query<Row>(query, [relationsParam(rels)])) {
    const m = out.get(r.rel!) ?? new Map<string, string>();
    m.set(r.name!, r.def!);
    out.set(r.rel!, m);
  }
  return out;
}

async function readSequenceDefs(db: Db, names: { schema: string; name: string }[]): Promise<Map<string, string>> {
  const rows = await db.query<Row>(
    `SELECT x.schema || '.' || x.name AS name,
            pg_catalog.format('AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s%s', pg_catalog.format_type(s.seqtypid, NULL), s.seqincrement, s.seqmin, s.seqmax, s.seqstart,
                              CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END) AS def
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
       JOIN pg_catalog.pg_sequence s ON s.seqrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name))`,
    [JSON.stringify(names.map((s) => ({ schema: s.schema, name: s.name })))],
  );
  return new Map(rows.map((r) => [r.name!, r.def!]));
}

function compare(object: string, kind: ItemKind, source: Map<string, string>, target: Map<string, string>, items: DiffItem[]): void {
  const names = [...source.keys(), ...[...target.keys()].filter((k) => !source.has(k))];
  for (const name of names) {
    const s = source.get(name) ?? null;
    const t = target.get(name) ?? null;
    items.push({ object, kind, name, source: s, target: t, status: s === null ? 'target_only' : t === null ? 'source_only' : s === t ? 'same' : 'differs' });
  }
}

export async function diffSchema(config: Config): Promise<SchemaDiff> {
  const appName = `pgsub_${config.subscription}_schema`;
  const source = await openPgDb(config.source, appName);
  let target: Db | null = null;
  try {
    target = await openTargetDb(config.target, appName);
    const roots: Rel[] = (await publishedTables(source, config.publications)).map((t) => ({ schema: t.schema, table: t.table }));
    const rels = [...roots, ...(await readDescendants(source, roots))];
    const [sCols, tCols] = await Promise.all([readColumns(source, rels), readColumns(target, rels)]);
    const defs = async (kind: 'constraint' | 'index' | 'trigger') => Promise.all([readDefinitions(source, rels, kind), readDefinitions(target!, rels, kind)]);
    const [constraints, indexes, triggers] = [await defs('constraint'), await defs('index'), await defs('trigger')];
    const items: DiffItem[] = [];
    for (const r of rels) {
      const name = relName(r);
      const s = sCols.get(name);
      const t = tCols.get(name);
      if (!t) {
        items.push({ object: name, kind: 'table', name, source: 'table', target: null, status: 'source_only' });
        continue;
      }
      const asMap = (cols: Column[] | undefined) => new Map((cols ?? []).map((c) => [c.name, describeColumn(c)]));
      compare(name, 'column', asMap(s), asMap(t), items);
      compare(name, 'constraint', constraints[0].get(name) ?? new Map(), constraints[1].get(name) ?? new Map(), items);
      compare(name, 'index', indexes[0].get(name) ?? new Map(), indexes[1].get(name) ?? new Map(), items);
      compare(name, 'trigger', triggers[0].get(name) ?? new Map(), triggers[1].get(name) ?? new Map(), items);
    }
    const sequences = [...(await readSequenceUses(source, rels)), ...config.sequenceNames];
    const [sSeq, tSeq] = await Promise.all([readSequenceDefs(source, sequences), readSequenceDefs(target, sequences)]);
    if (sequences.length > 0) compare('sequences', 'sequence', sSeq, tSeq, items);
    return { source_version: source.version, target_version: target.version, items, differences: items.filter((i) => i.status !== 'same').length };
  } finally {
    await source.close();
    await target?.close();
  }
}

const MARK = { same: ' ', differs: '≠', source_only: '<', target_only: '>' } as const;

/** Side by side: each table's columns and definitions, a mark where they differ, then the differences. */
export function renderDiff(d: SchemaDiff, width = 56): string {
  const cut = (s: string | null) => (s === null ? '(missing)' : s.length > width ? `${s.slice(0, width - 1)}…` : s);
  const lines = [`${''.padEnd(13)}${'name'.padEnd(28)} ${`source (PostgreSQL ${d.source_version})`.padEnd(width)}   target (PostgreSQL ${d.target_version})`];
  let object = '';
  for (const i of d.items) {
    if (i.object !== object) {
      object = i.object;
      lines.push('', i.object);
    }
    lines.push(`  ${i.kind.padEnd(11)}${i.name.slice(0, 28).padEnd(28)} ${cut(i.source).padEnd(width)} ${MARK[i.status]} ${cut(i.target)}`);
  }
  const diffs = d.items.filter((i) => i.status !== 'same');
  lines.push('', diffs.length === 0 ? 'no differences' : `${diffs.length} difference(s):`);
  for (const i of diffs) {
    const what = i.status === 'source_only' ? 'missing on the target' : i.status === 'target_only' ? 'only on the target' : `source: ${i.source}; target: ${i.target}`;
    lines.push(`  ${i.object} ${i.kind} ${i.name}: ${what}`);
  }
  return `${lines.join('\n')}\n`;
}
