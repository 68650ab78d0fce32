/**
 * `pgsub schema copy`: the published tables' schema created on the target from
 * `pg_dump --schema-only` of the source, in two steps.
 *
 *  - `tables` (before `pgsub run`): pg_dump's pre-data section for the published tables,
 *    their partitions and the sequences they use (types, sequences, tables, defaults,
 *    CHECK constraints, comments), the user types, collations and functions those need
 *    (taken from a dump of their schemas), and from the post-data section the primary
 *    keys, unique and exclusion constraints and indexes. pgsub's copy drops those indexes
 *    of an empty table and builds them once from the loaded rows (defer_indexes), so the
 *    copy pays no index maintenance, and the stream that follows never meets a table
 *    without its key: an UPDATE or DELETE located by a key the target has no index for
 *    would scan the table once per change.
 *  - `post-data` (once `pgsub status` shows every table ready): the rest of post-data —
 *    foreign keys, triggers, rules, policies and row security. They wait because defer_indexes
 *    keeps any index a foreign key depends on, copy_freeze cannot truncate a table a foreign
 *    key references or one with a TRUNCATE trigger, and a foreign key checked row by row
 *    during the copy would cost more than the one validation at the end.
 *
 * Each step runs in one target transaction: all of it or nothing. Ownership and grants
 * are not copied (--no-owner --no-privileges): objects belong to the target role that runs
 * the step, which is what pgsub needs for defer_indexes; roles and grants are the
 * operator's. A target that already has the tables is left alone unless --force, which
 * drops and re-creates them. Types, collations, functions and free-standing sequences that
 * exist already are kept as they are; post-data objects that exist are skipped, so the
 * step can be repeated.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { SchemaCopyError } from '../errors.js';
import { sqlstateOf } from '../connect-failure.js';
import { quoteIdent, quoteQualified } from '../quote.js';
import { errorText, openPgClient, openPgDb, openTargetDb, publishedTables, type Db } from './db.js';
import { existing, readAncestors, readColumns, readDescendants, readExtensions, readFunctionDeps, readSequenceUses, readTypeDeps, relName, type Rel } from './objects.js';
import { dumpPattern, findPgDump, runPgDump, splitDump, type DumpEntry, type PgDump } from './pgdump.js';

export type SchemaStep = 'tables' | 'post-data';

export interface SchemaCopyOptions {
  step: SchemaStep;
  /** Drop and re-create published tables the target has already (tables); run post-data before the copy finished. */
  force: boolean;
  /** Print the SQL instead of running it. */
  print: boolean;
  /** --pg-dump; else config pg_dump; else PATH. */
  pgDump: string | null;
}

export interface SchemaCopyReport {
  step: SchemaStep;
  pgDump: { path: string; version: string };
  sourceVersion: string;
  targetVersion: string;
  tables: string[];
  /** Every table was there already and nothing was asked to change. */
  leftAlone: boolean;
  dropped: string[];
  applied: DumpEntry[];
  alreadyPresent: DumpEntry[];
  /** The script, in print mode. */
  sql: string | null;
}

/** Entry types of post-data that the `tables` step creates (the indexes defer_indexes rebuilds after the copy). */
const INDEX_TYPES = new Set(['INDEX', 'CONSTRAINT', 'INDEX ATTACH', 'STATISTICS']);
/** Entries that belong to the one before them. */
const ATTACHED_TYPES = new Set(['COMMENT', 'SECURITY LABEL', 'ACL']);
/** Never applied: the target's own business (schemas are created IF NOT EXISTS below). */
const SKIPPED_TYPES = new Set([
  'SCHEMA',
  'EXTENSION',
  'PUBLICATION',
  'PUBLICATION TABLE',
  'PUBLICATION TABLES IN SCHEMA',
  'SUBSCRIPTION',
  'ACL',
  'DEFAULT ACL',
  'DATABASE',
  'ENCODING',
  'STDSTRINGS',
  'SEARCHPATH',
]);
/** Objects that may exist already and are then kept: an error creating them is "already present". */
const SHARED_TYPES = new Set(['TYPE', 'DOMAIN', 'COLLATION', 'FUNCTION', 'PROCEDURE', 'SEQUENCE', 'SEQUENCE OWNED BY']);
/** "already exists" (duplicate_object, duplicate_table, duplicate_function) and "multiple primary keys". */
const DUPLICATE_STATES = new Set(['42710', '42P07', '42723', '42P16']);

/** Group each COMMENT (and the like) with the entry before it, so both are selected together. */
function groups(entries: DumpEntry[]): DumpEntry[][] {
  const out: DumpEntry[][] = [];
  for (const e of entries) {
    if (ATTACHED_TYPES.has(e.type) && out.length > 0) out[out.length - 1]!.push(e);
    else out.push([e]);
  }
  return out.filter((g) => !SKIPPED_TYPES.has(g[0]!.type)).map((g) => g.filter((e) => !SKIPPED_TYPES.has(e.type)));
}

interface Plan {
  dump: PgDump;
  source: Db;
  target: Db;
  rels: Rel[];
  schemas: string[];
  preamble: string;
  entries: DumpEntry[];
  existingTables: string[];
}

export async function copySchema(config: Config, opts: SchemaCopyOptions, out: (line: string) => void = () => {}): Promise<SchemaCopyReport> {
  const appName = `pgsub_${config.subscription}_schema`;
  const source = await openPgDb(config.source, appName);
  let target: Db | null = null;
  try {
    const dump = await findPgDump(opts.pgDump ?? config.pgDump, source);
    out(`pg_dump ${dump.version} (${dump.path}) for a PostgreSQL ${source.version} source`);
    target = await openTargetDb(config.target, appName);
    const plan = await planStep(config, opts, dump, source, target, out);
    const report: SchemaCopyReport = {
      step: opts.step,
      pgDump: { path: dump.path, version: dump.version },
      sourceVersion: source.version,
      targetVersion: target.version,
      tables: plan.rels.map(relName),
      leftAlone: false,
      dropped: [],
      applied: [],
      alreadyPresent: [],
      sql: null,
    };
    if (opts.step === 'tables' && plan.existingTables.length > 0 && !opts.force) {
      if (plan.existingTables.length < plan.rels.length) {
        const missing = plan.rels.map(relName).filter((r) => !plan.existingTables.includes(r));
        throw new SchemaCopyError(
          'PGSUB_SCHEMA_EXISTS',
          `the target has ${plan.existingTables.length} of the ${plan.rels.length} tables already (${plan.existingTables.slice(0, 5).join(', ')}${plan.existingTables.length > 5 ? ', …' : ''}) but not ${missing.slice(0, 5).join(', ')}${missing.length > 5 ? ', …' : ''}: create the missing ones by hand, or drop and re-create all of them with --force`,
          { existing: plan.existingTables.length, missing: missing.length },
        );
      }
      out(`the target has all ${plan.rels.length} tables already: left alone (--force drops and re-creates them)`);
      return { ...report, leftAlone: true };
    }
    const drops = opts.step === 'tables' && opts.force ? plan.existingTables : [];
    if (opts.print) {
      report.sql = script(plan, drops);
      report.dropped = drops;
      report.applied = plan.entries;
      return report;
    }
    const applied = await apply(config, opts.step, plan, drops);
    out(
      `${opts.step === 'tables' ? 'tables step' : 'post-data step'}: ${applied.applied.length} object(s) created${applied.alreadyPresent.length ? `, ${applied.alreadyPresent.length} already present` : ''}${drops.length ? `, ${drops.length} table(s) dropped first (--force)` : ''}`,
    );
    return { ...report, dropped: drops, ...applied };
  } finally {
    await source.close();
    await target?.close();
  }
}

async function planStep(config: Config, opts: SchemaCopyOptions, dump: PgDump, source: Db, target: Db, out: (line: string) => void): Promise<Plan> {
  const published = await publishedTables(source, config.publications);
  if (published.length === 0)
    throw new SchemaCopyError('PGSUB_SCHEMA_PREREQUISITE', `publication(s) ${config.publications.join(', ')} publish no tables in the source database (or do not exist)`);
  const roots: Rel[] = published.map((t) => ({ schema: t.schema, table: t.table }));
  // A published partition (a publisher before 13, or publish_via_partition_root off) needs its parents.
  const tree = [...roots, ...(await readDescendants(source, roots))];
  const rels = [...(await readAncestors(source, tree)), ...tree];
  const existingTables = [
    ...(await existing(
      target,
      'class',
      rels.map((r) => ({ schema: r.schema, name: r.table })),
    )),
  ];
  if (opts.step === 'post-data' && !opts.force) await requireCopied(target, config.subscription);
  const sequences = [...(await readSequenceUses(source, rels)), ...config.sequenceNames.map((s) => ({ ...s, kind: 'config' as const, usedBy: null }))];
  const tablePatterns = [...rels.map((r) => dumpPattern(r.schema, r.table)), ...sequences.map((s) => dumpPattern(s.schema, s.name))].flatMap((p) => ['--table', p]);

  let entries: DumpEntry[] = [];
  let preamble = '';
  const schemas = new Set([...rels.map((r) => r.schema), ...sequences.map((s) => s.schema)]);
  if (opts.step === 'tables') {
    const deps = await planDependencies(config, dump, source, target, rels);
    for (const s of deps.schemas) schemas.add(s);
    const pre = splitDump(await runPgDump(dump, config.source, ['--section=pre-data', '--strict-names', ...tablePatterns]));
    const post = splitDump(await runPgDump(dump, config.source, ['--section=post-data', '--strict-names', ...tablePatterns]));
    preamble = pre.preamble;
    entries = [
      ...deps.entries,
      ...groups(pre.entries).flat(),
      ...groups(post.entries)
        .filter((g) => INDEX_TYPES.has(g[0]!.type))
        .flat(),
    ];
    out(`${rels.length} table(s), ${sequences.length} sequence(s), ${deps.count} type(s), collation(s) and function(s) they need`);
  } else {
    const post = splitDump(await runPgDump(dump, config.source, ['--section=post-data', '--strict-names', ...tablePatterns]));
    preamble = post.preamble;
    entries = groups(post.entries)
      .filter((g) => !INDEX_TYPES.has(g[0]!.type))
      .flat();
    out(`${rels.length} table(s): ${entries.filter((e) => !ATTACHED_TYPES.has(e.type)).length} foreign key(s), trigger(s), rule(s) and polic(ies)`);
  }
  return { dump, source, target, rels, schemas: [...schemas].sort(), preamble, entries, existingTables };
}

/** The post-data step waits for the initial copy: every table of the subscription ready in pgsub.subscription_rel. */
async function requireCopied(target: Db, subscription: string): Promise<void> {
  const [t] = await target.query(`SELECT (pg_catalog.to_regclass('"pgsub"."subscription_rel"') IS NOT NULL)::text AS present`);
  if (t?.present !== 'true') return;
  const rows = await target.query(`SELECT schema_name || '.' || table_name AS rel FROM "pgsub"."subscription_rel" WHERE subscription = $1 AND state <> 'r' ORDER BY 1`, [
    subscription,
  ]);
  if (rows.length === 0) return;
  throw new SchemaCopyError(
    'PGSUB_SCHEMA_PREREQUISITE',
    `the initial copy of subscription ${subscription} has not finished for ${rows.length} table(s) (${rows
      .slice(0, 5)
      .map((r) => r.rel)
      .join(
        ', ',
      )}${rows.length > 5 ? ', …' : ''}; see pgsub status): foreign keys and triggers created now would keep pgsub's copy from deferring indexes and loading frozen. Run this step again once every table is ready, or give --force`,
    { subscription, notReady: rows.length },
  );
}

/**
 * The user types, collations and functions the tables need, from a pre-data dump of the
 * schemas that hold them (pg_dump --table dumps none of them). Those of an extension are
 * not dumped: the extension must be installed on the target, or the step is refused.
 */
async function planDependencies(config: Config, dump: PgDump, source: Db, target: Db, rels: Rel[]): Promise<{ entries: DumpEntry[]; schemas: string[]; count: number }> {
  const types = await readTypeDeps(source, rels);
  const functions = await readFunctionDeps(source, rels, types);
  const columns = await readColumns(source, rels);
  const collations = [
    ...new Set(
      [...columns.values()]
        .flat()
        .map((c) => c.collation)
        .filter((c): c is string => c !== null && !c.startsWith('pg_catalog.')),
    ),
  ];
  const needExtensions = new Set([...types, ...functions].map((o) => o.extension).filter((e): e is string => e !== null));
  const installed = await readExtensions(target);
  const missing = [...needExtensions].filter((e) => !installed.has(e)).sort();
  if (missing.length > 0) {
    throw new SchemaCopyError(
      'PGSUB_SCHEMA_PREREQUISITE',
      `the published tables use types or functions of extension(s) the target lacks: ${missing.join(', ')}. Install them there first (as a superuser, in the target database): ${missing.map((e) => `CREATE EXTENSION ${quoteIdent(e)};`).join(' ')}`,
      { extensions: missing.join(',') },
    );
  }
  const wantTypes = new Set(types.filter((t) => t.extension === null).map((t) => `${t.schema}.${t.name}`));
  const wantFunctions = new Set(functions.filter((f) => f.extension === null).map((f) => `${f.schema}.${f.name}`));
  const wantCollations = new Set(collations);
  const schemas = [...new Set([...wantTypes, ...wantFunctions, ...wantCollations].map((n) => n.slice(0, n.indexOf('.'))))];
  if (schemas.length === 0) return { entries: [], schemas: [], count: 0 };
  // Without their tables: pg_dump locks every table it dumps, which takes SELECT on each —
  // tables of those schemas that are not published need not be readable by pgsub's role.
  const text = await runPgDump(dump, config.source, ['--section=pre-data', ...schemas.flatMap((s) => ['--schema', dumpPattern(s), '--exclude-table', `${dumpPattern(s)}.*`])]);
  const wanted = (e: DumpEntry) => {
    const name = `${e.schema}.${e.name}`;
    if (e.type === 'TYPE' || e.type === 'DOMAIN') return wantTypes.has(name);
    // By name: pg_dump names a function by its argument types as its search_path = '' spells them; every overload is taken.
    if (e.type === 'FUNCTION' || e.type === 'PROCEDURE') return wantFunctions.has(`${e.schema}.${e.name.slice(0, e.name.indexOf('('))}`);
    if (e.type === 'COLLATION') return wantCollations.has(name);
    return false;
  };
  const chosen = groups(splitDump(text).entries).filter((g) => wanted(g[0]!));
  return { entries: chosen.flat(), schemas, count: chosen.length };
}

/** The statements of a plan as one script (print mode); also what `apply` runs, statement group by group. */
function script(plan: Plan, drops: string[]): string {
  const parts = [plan.preamble, ...schemaStatements(plan.schemas), ...dropStatements(drops), ...plan.entries.map((e) => `-- ${e.type} ${e.schema ?? '-'} ${e.name}\n${e.sql}`)];
  return `BEGIN;\n${parts.filter(Boolean).join('\n\n')}\n\nCOMMIT;\n`;
}

const schemaStatements = (schemas: string[]) => schemas.map((s) => `CREATE SCHEMA IF NOT EXISTS ${quoteIdent(s)};`);
const dropStatements = (tables: string[]) =>
  tables.map((t) => {
    const dot = t.indexOf('.');
    return `DROP TABLE IF EXISTS ${quoteQualified(t.slice(0, dot), t.slice(dot + 1))} CASCADE;`;
  });

/** Run the plan in one target transaction, each entry under a savepoint (to tell "already there" from a failure). */
async function apply(config: Config, step: SchemaStep, plan: Plan, drops: string[]): Promise<{ applied: DumpEntry[]; alreadyPresent: DumpEntry[] }> {
  const client: pg.Client = await openPgClient(config.target, `pgsub_${config.subscription}_schema`, 'target');
  const applied: DumpEntry[] = [];
  const alreadyPresent: DumpEntry[] = [];
  try {
    await client.query('BEGIN');
    // pg_dump's session settings; one a target does not know (an older server) is left out.
    for (const statement of plan.preamble.split('\n').filter((l) => l.trim() !== '')) {
      await client.query('SAVEPOINT pgsub_setting');
      try {
        await client.query(statement);
        await client.query('RELEASE SAVEPOINT pgsub_setting');
      } catch (err) {
        if (sqlstateOf(err) !== '42704') throw err;
        await client.query('ROLLBACK TO SAVEPOINT pgsub_setting');
      }
    }
    for (const statement of [...schemaStatements(plan.schemas), ...dropStatements(drops)]) await client.query(statement);
    for (const entry of plan.entries) {
      await client.query('SAVEPOINT pgsub_entry');
      try {
        await client.query(entry.sql);
        await client.query('RELEASE SAVEPOINT pgsub_entry');
        applied.push(entry);
      } catch (err) {
        const present = DUPLICATE_STATES.has(sqlstateOf(err) ?? '') && (step === 'post-data' || SHARED_TYPES.has(entry.type));
        if (!present) {
          throw new SchemaCopyError(
            'PGSUB_SCHEMA_COPY_FAILED',
            `${entry.type} ${entry.schema ? `${entry.schema}.` : ''}${entry.name} could not be created on the target: ${errorText(err)}; nothing of this step was kept`,
            {
              entry: `${entry.type} ${entry.name}`,
              sqlstate: sqlstateOf(err) ?? undefined,
            },
          );
        }
        await client.query('ROLLBACK TO SAVEPOINT pgsub_entry');
        alreadyPresent.push(entry);
      }
    }
    await client.query('COMMIT');
    return { applied, alreadyPresent };
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    if (err instanceof SchemaCopyError) throw err;
    throw new SchemaCopyError('PGSUB_SCHEMA_COPY_FAILED', `schema ${step} step failed on the target: ${errorText(err)}; nothing of this step was kept`, {
      sqlstate: sqlstateOf(err) ?? undefined,
    });
  } finally {
    await client.end().catch(() => {});
  }
}
