/**
 * `pgsub verify` (docs/verify.md): is the target the source, at one exact LSN, while both
 * keep taking writes? The handshake (handshake.ts, hold.ts) gives a source snapshot and a
 * target snapshot at the same LSN; `parallel` connection pairs import them and compare the
 * published tables range by range (compare.ts); with `repair`, the rows found different are
 * written again at a second hold (repair.ts). Only tables the target snapshot shows ready
 * (pgsub.subscription_rel state 'r') are compared: a table still copying or catching up
 * holds the source's rows at its own position, not at L, and is reported as not compared
 * (syncing). A table a mapping retargets, renames or excludes columns of is compared under
 * the target's names (sql.ts onSide); one with computed columns, row rules or a changed
 * type is reported as not compared, never skipped silently. Several subscriptions of one
 * source database into one target database (a migration split over several instances) are
 * compared at one L. The result goes to each subscription's pgsub.verify row for
 * `pgsub status` and the service's metrics.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { hasRowRules, ruleFor, type TableRule } from '../mapping/rules.js';
import type { Logger } from '../log.js';
import { VerifyError } from '../errors.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteLiteral } from '../quote.js';
import { listPublishedTables, type PublishedTable } from '../tablesync/catalog.js';
import { RateLimit, TableComparison, WorkQueue, type ConnectionPair, type TableReport } from './compare.js';
import { finish, holdAtLsn, imported, openControl, release, type Held, type HoldParty } from './handshake.js';
import { repairDifferences, syncingReason, type RepairReport } from './repair.js';
import { typeTreeQuery, typeTrees } from './normalise.js';
import { columnsQuery, parseColumns, qualified, type ColumnInfo, type TableShape } from './sql.js';
import { openSide, sideConnection } from './connections.js';

export interface VerifyOptions {
  /** Patterns of schema.table (`*` any run of characters; without a dot: any schema). Empty: every published table. */
  include: string[];
  exclude: string[];
  parallel: number;
  rateLimit: { perSecond: number; unit: 'rows' | 'bytes' } | null;
  /** Differences listed per table. */
  listLimit: number;
  repair: boolean;
  holdTimeoutMs: number;
  log: Logger;
  onProgress?(p: VerifyProgress): void;
}

export interface VerifyProgress {
  rows: number;
  totalRows: number;
  rowsPerSecond: number;
  etaSeconds: number | null;
  tablesDone: number;
  tables: number;
}

export interface VerifyResult {
  subscription: string;
  /** The source LSN both snapshots show: every commit before it, none after. */
  lsn: string;
  equal: boolean;
  /** Rows missing, extra or different, over every table (a keyless table that differs counts its count difference, or 1). */
  differences: number;
  /** How long the service's apply waited for the target snapshot. */
  pauseMs: number | null;
  handshakeMs: number;
  /** The handshake's parts (handshake.ts): most of the pause is the slot's creation on the source. */
  handshakeSteps: { armedMs: number; slotMs: number; answerMs: number };
  elapsedMs: number;
  rows: number;
  tables: TableReport[];
  repair: RepairReport | null;
}

export function globToRegExp(pattern: string): RegExp {
  const full = pattern.includes('.') ? pattern : `*.${pattern}`;
  return new RegExp(`^${full.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*')}$`);
}

export function selectTables<T extends { schema: string; table: string }>(tables: readonly T[], include: readonly string[], exclude: readonly string[]): T[] {
  const inc = include.map(globToRegExp);
  const exc = exclude.map(globToRegExp);
  return tables.filter((t) => {
    const name = `${t.schema}.${t.table}`;
    return (inc.length === 0 || inc.some((r) => r.test(name))) && !exc.some((r) => r.test(name));
  });
}

async function readColumns(client: pg.Client, versionNum: number, schema: string, table: string): Promise<{ columns: ColumnInfo[]; key: string[] } | null> {
  const name = qualified({ schema, table });
  const exists = await client.query({ text: 'SELECT pg_catalog.to_regclass($1) IS NOT NULL', values: [name], rowMode: 'array' });
  if (exists.rows[0]?.[0] !== true) return null;
  const rows = await client.query({ text: columnsQuery(versionNum), values: [name], rowMode: 'array' });
  const parsed = parseColumns(rows.rows as (string | null)[][]);
  // Arrays and composites holding a normalised type are compared element by element (normalise.ts).
  const oids = [...new Set(parsed.columns.map((c) => c.typeOid).filter((o): o is string => o !== undefined))];
  const trees = typeTrees((await client.query({ text: typeTreeQuery(), values: [`{${oids.join(',')}}`], rowMode: 'array' })).rows as (string | null)[][]);
  for (const c of parsed.columns) {
    const tree = c.typeOid === undefined ? undefined : trees.get(c.typeOid);
    if (tree) c.tree = tree;
  }
  return parsed;
}

/** The sync state of each table of the subscription, as the target snapshot shows it. */
async function readSyncStates(client: pg.Client, subscription: string): Promise<Map<string, string>> {
  const rows = await client.query({
    text: `SELECT schema_name || '.' || table_name, state::text FROM "pgsub"."subscription_rel" WHERE subscription = $1`,
    values: [subscription],
    rowMode: 'array',
  });
  return new Map((rows.rows as string[][]).map((r) => [r[0]!, r[1]!]));
}

/** The shape both sides are compared by, or why the table is not compared as is. */
function shapeOf(
  t: PublishedTable,
  source: { columns: ColumnInfo[]; key: string[] },
  target: { columns: ColumnInfo[] } | null,
  rule: TableRule | null,
): { shape: TableShape } | { status: 'different' | 'not compared'; reason: string } {
  const targetName = rule ? `${rule.targetSchema}.${rule.targetTable}` : null;
  if (target === null) return { status: 'different', reason: targetName ? `missing on the target (mapped to ${targetName})` : 'missing on the target' };
  const columns = source.columns.filter((c) => t.columns.includes(c.name) && !rule?.excluded.has(c.name));
  const names = columns.map((c) => rule?.renames.get(c.name) ?? c.name);
  for (const [i, c] of columns.entries()) {
    const other = target.columns.find((o) => o.name === names[i]);
    if (!other) return { status: 'different', reason: `shape differs: column ${names[i]} is missing on the target` };
    if (other.type !== c.type && other.base !== c.base) {
      // A mapping may change a type on purpose (int → bigint, text → jsonb): their text forms are not comparable as is.
      if (rule) return { status: 'not compared', reason: `not compared (mapped): column ${c.name} is ${c.type} on the source, ${other.type} in ${targetName}` };
      return { status: 'different', reason: `shape differs: column ${c.name} is ${c.type} on the source, ${other.type} on the target` };
    }
    // The same type name, another structure (a composite's fields): not comparable by one expression.
    if (JSON.stringify(other.tree ?? null) !== JSON.stringify(c.tree ?? null))
      return { status: 'different', reason: `shape differs: the type ${c.type} of column ${c.name} is not the same on the source and the target (fields or element type)` };
  }
  const key = source.key.every((k) => columns.some((c) => c.name === k)) ? source.key : [];
  const shape: TableShape = { schema: t.schema, table: t.table, columns, key, rowFilter: t.rowFilter };
  if (rule) shape.target = { schema: rule.targetSchema, table: rule.targetTable, names };
  return { shape };
}

/**
 * Why a mapping rule keeps its table from being compared, or null: a rule that retargets,
 * renames or excludes columns is compared under the target's names; computed columns and
 * row rules change the rows themselves.
 */
function notComparable(rule: TableRule): string | null {
  if (rule.computed.size > 0) return 'not compared (mapped): computed columns';
  if (hasRowRules(rule.rows)) return 'not compared (mapped): row rules (filter, key, soft delete, truncate policy or discriminator)';
  return null;
}

function notCompared(t: { schema: string; table: string }, status: 'different' | 'not compared', reason: string): TableReport {
  return {
    table: `${t.schema}.${t.table}`,
    status,
    reason,
    keyed: false,
    sourceRows: 0,
    targetRows: 0,
    missing: 0,
    extra: 0,
    different: status === 'different' ? 1 : 0,
    listed: [],
    ranges: 0,
    ms: 0,
  };
}

/** A published table and the subscription it belongs to. */
interface Candidate {
  table: PublishedTable;
  config: Config;
}

/**
 * Several subscriptions are compared at one L only when they share the source database (one
 * slot gives L and the source snapshot) and the target database (one snapshot shows every
 * service held at L). Repair holds one service at a time: refused with several.
 */
function checkParties(configs: readonly Config[], repair: boolean): void {
  const first = configs[0]!;
  const same = (a: Config['source'], b: Config['source']) => a.host === b.host && a.port === b.port && a.database === b.database;
  for (const c of configs.slice(1)) {
    if (c.subscription === first.subscription) throw new VerifyError(`subscription ${c.subscription} is named twice`);
    if (!same(c.source, first.source))
      throw new VerifyError(`subscriptions ${first.subscription} and ${c.subscription} replicate different source databases: verify them one at a time`);
    if (!same(c.target, first.target))
      throw new VerifyError(`subscriptions ${first.subscription} and ${c.subscription} apply into different target databases: verify them one at a time`);
  }
  if (repair && configs.length > 1)
    throw new VerifyError(`--repair works on one subscription at a time: run pgsub verify --repair -c <file> for each of ${configs.map((c) => c.subscription).join(', ')}`);
}

/** The tables to compare: each subscription's publications, selected by --table/--exclude. */
async function listCandidates(configs: readonly Config[], opts: VerifyOptions): Promise<{ candidates: Candidate[]; sourceVersion: number }> {
  const first = configs[0]!;
  const lister = await ReplicationConnection.open(first.source, `pgsub_${first.subscription}_verify_list`);
  try {
    const candidates: Candidate[] = [];
    const seen = new Set<string>();
    for (const config of configs) {
      for (const table of selectTables(await listPublishedTables(lister, config.publications), opts.include, opts.exclude)) {
        const name = `${table.schema}.${table.table}`;
        // A table in two subscriptions' publications is compared once, under the first that names it.
        if (seen.has(name)) continue;
        seen.add(name);
        candidates.push({ table, config });
      }
    }
    return { candidates, sourceVersion: lister.serverVersionNum };
  } finally {
    await lister.close();
  }
}

/**
 * Every connection pair in one transaction at L. With one subscription the target snapshot
 * is its service's, exported at L as it lets the apply go on. With several, each service
 * stays held at L (the hold repair uses) until this command has exported its own target
 * snapshot, which then shows every one of them at L; they are released right after.
 */
async function importSnapshots(parties: readonly HoldParty[], sources: pg.Client[], targets: pg.Client[], holdTimeoutMs: number): Promise<Held> {
  const several = parties.length > 1;
  const held = await holdAtLsn(parties, sources[0]!, several ? 'repair' : 'snapshot', holdTimeoutMs);
  try {
    const begin = 'BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY';
    const set = (snapshot: string) => `${begin}; SET TRANSACTION SNAPSHOT ${quoteLiteral(snapshot)}`;
    let targetSnapshot = held.targetSnapshot;
    let importers = targets;
    if (targetSnapshot === null) {
      await targets[0]!.query(begin);
      targetSnapshot = String((await targets[0]!.query('SELECT pg_catalog.pg_export_snapshot() AS s')).rows[0].s);
      importers = targets.slice(1);
    }
    await Promise.all([...sources.map((c) => c.query(set(held.sourceSnapshot))), ...importers.map((c) => c.query(set(targetSnapshot)))]);
  } finally {
    // Imported: the slot, the services' exporting transactions and their holds are no longer needed.
    await held.replication.close();
    for (const { config, control } of parties) await (several ? release(config, control) : imported(config, control)).catch(() => {});
  }
  return held;
}

/** Start a comparison for each candidate that can be compared; a report for every other. */
async function planComparisons(
  candidates: readonly Candidate[],
  sides: { source: pg.Client; target: pg.Client; sourceVersion: number; targetVersion: number },
  opts: VerifyOptions,
  start: (c: TableComparison) => void,
  onRows: (n: number) => void,
): Promise<{ reports: TableReport[]; comparisons: TableComparison[] }> {
  const reports: TableReport[] = [];
  const comparisons: TableComparison[] = [];
  const limits = {
    source: opts.rateLimit ? new RateLimit(opts.rateLimit.perSecond, opts.rateLimit.unit) : null,
    target: opts.rateLimit ? new RateLimit(opts.rateLimit.perSecond, opts.rateLimit.unit) : null,
  };
  // The table states in the target snapshot: only a ready table holds the source's rows at L.
  const states = new Map<string, Map<string, string>>();
  for (const { config } of candidates) if (!states.has(config.subscription)) states.set(config.subscription, await readSyncStates(sides.target, config.subscription));
  for (const { table: t, config } of candidates) {
    const state = states.get(config.subscription)!.get(`${t.schema}.${t.table}`) ?? null;
    if (state !== 'r') {
      reports.push(notCompared(t, 'not compared', syncingReason(state)));
      continue;
    }
    const rule = ruleFor(config.mapping, t.schema, t.table);
    const refused = rule ? notComparable(rule) : null;
    if (refused !== null) {
      reports.push(notCompared(t, 'not compared', refused));
      continue;
    }
    const source = await readColumns(sides.source, sides.sourceVersion, t.schema, t.table);
    if (source === null) {
      reports.push(notCompared(t, 'not compared', 'no longer on the source'));
      continue;
    }
    const to = rule ? { schema: rule.targetSchema, table: rule.targetTable } : t;
    const shaped = shapeOf(t, source, await readColumns(sides.target, sides.targetVersion, to.schema, to.table), rule);
    if (!('shape' in shaped)) {
      reports.push(notCompared(t, shaped.status, shaped.reason));
      continue;
    }
    const c = new TableComparison(shaped.shape, t.estimatedRows, { listLimit: opts.listLimit, repairLimit: opts.repair ? 100_000 : 0, limits, onRows });
    comparisons.push(c);
    reports.push(c.report);
    start(c);
  }
  return { reports, comparisons };
}

/**
 * Compare the subscriptions' tables at one LSN: one subscription, or several of one source
 * database into one target database (a migration split over several instances).
 */
export async function runVerify(configs: readonly Config[], opts: VerifyOptions): Promise<VerifyResult> {
  const started = performance.now();
  checkParties(configs, opts.repair);
  const first = configs[0]!;
  const parties: HoldParty[] = [];
  const clients: pg.Client[] = [];
  try {
    for (const config of configs) parties.push({ config, control: await openControl(config) });
    const { candidates, sourceVersion } = await listCandidates(configs, opts);
    const pairs = await openPairs(first, opts.parallel, clients);

    const held = await importSnapshots(parties, pairs.sources, pairs.targets, opts.holdTimeoutMs);
    opts.log.info(
      { lsn: formatLsn(held.lsn), pauseMs: held.pauseMs, handshakeMs: Math.round(held.handshakeMs), tables: candidates.length, subscriptions: configs.length },
      'verify: snapshots taken at the same LSN',
    );

    const progress = new CompareProgress(candidates, opts);
    const { reports, comparisons } = await compareTables(candidates, { ...pairs, sourceVersion }, opts, progress);
    await Promise.all(clients.map((c) => c.query('COMMIT').catch(() => {})));
    const result = summarise(configs, held, progress.rows, reports);
    if (opts.repair && result.differences > 0)
      result.repair = await repairDifferences(first, parties[0]!.control, comparisons, { log: opts.log, holdTimeoutMs: Math.max(opts.holdTimeoutMs, 60_000) });
    result.elapsedMs = Math.round(performance.now() - started);
    await recordResults(parties, candidates, held.lsn, result, opts.log);
    return result;
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => {})));
    for (const { control } of parties) await control.close();
  }
}

/** `parallel` connection pairs, each client added to `clients` as soon as it is open (closed by the caller). */
async function openPairs(first: Config, parallel: number, clients: pg.Client[]): Promise<{ sources: pg.Client[]; targets: pg.Client[]; targetVersion: number }> {
  const n = Math.max(1, Math.floor(parallel));
  const app = `pgsub_${first.subscription}_verify`;
  const sources = await Promise.all(Array.from({ length: n }, () => openSide('source', first.source, app)));
  clients.push(...sources);
  const targets = await Promise.all(Array.from({ length: n }, () => openSide('target', first.target, app)));
  clients.push(...targets);
  const targetVersion = Number((await targets[0]!.query('SHOW server_version_num')).rows[0].server_version_num);
  return { sources, targets, targetVersion };
}

/** Rows and tables compared so far, reported through opts.onProgress (each second and as each table ends). */
class CompareProgress {
  rows = 0;
  tablesDone = 0;
  readonly #started = performance.now();
  readonly #totalRows: number;

  constructor(
    private readonly candidates: readonly Candidate[],
    private readonly opts: VerifyOptions,
  ) {
    this.#totalRows = candidates.reduce((n, c) => n + Math.max(0, c.table.estimatedRows), 0);
  }

  report(): void {
    const { rows } = this;
    const totalRows = this.#totalRows;
    const seconds = (performance.now() - this.#started) / 1000;
    const rowsPerSecond = seconds > 0 ? rows / seconds : 0;
    this.opts.onProgress?.({
      rows,
      totalRows: Math.max(totalRows, rows),
      rowsPerSecond,
      etaSeconds: rowsPerSecond > 0 ? Math.max(0, (totalRows - rows) / rowsPerSecond) : null,
      tablesDone: this.tablesDone,
      tables: this.candidates.length,
    });
  }
}

/** Plan the comparisons and run them over the connection pairs, all in their snapshots at L. */
async function compareTables(
  candidates: readonly Candidate[],
  pairs: { sources: pg.Client[]; targets: pg.Client[]; sourceVersion: number; targetVersion: number },
  opts: VerifyOptions,
  progress: CompareProgress,
): Promise<{ reports: TableReport[]; comparisons: TableComparison[] }> {
  const { sources, targets } = pairs;
  const queue = new WorkQueue();
  const planned = await planComparisons(
    candidates,
    { source: sources[0]!, target: targets[0]!, sourceVersion: pairs.sourceVersion, targetVersion: pairs.targetVersion },
    opts,
    (c) =>
      c.start(queue, () => {
        progress.tablesDone++;
        progress.report();
      }),
    (n) => {
      progress.rows += n;
    },
  );
  const ticker = setInterval(() => progress.report(), 1000);
  try {
    await queue.run(sources.map((s, i): ConnectionPair => ({ source: sideConnection(s), target: sideConnection(targets[i]!) })));
  } finally {
    clearInterval(ticker);
  }
  progress.report();
  return planned;
}

/** The result over every table, sorted by name; elapsedMs and repair are filled in after. */
function summarise(configs: readonly Config[], held: Held, rows: number, reports: TableReport[]): VerifyResult {
  reports.sort((a, b) => a.table.localeCompare(b.table));
  const differences = reports.reduce((n, r) => n + r.missing + r.extra + r.different, 0);
  return {
    subscription: configs.map((c) => c.subscription).join(', '),
    lsn: formatLsn(held.lsn),
    equal: differences === 0,
    differences,
    pauseMs: held.pauseMs,
    handshakeMs: Math.round(held.handshakeMs),
    handshakeSteps: held.steps,
    elapsedMs: 0,
    rows,
    tables: reports,
    repair: null,
  };
}

/** Each subscription's own result (its tables' differences) for `pgsub status` and its metrics. */
async function recordResults(parties: readonly HoldParty[], candidates: readonly Candidate[], lsn: Lsn, result: VerifyResult, log: Logger): Promise<void> {
  for (const { config, control } of parties) {
    const own = new Set(candidates.filter((c) => c.config === config).map((c) => `${c.table.schema}.${c.table.table}`));
    const differences = result.tables.filter((t) => own.has(t.table)).reduce((n, r) => n + r.missing + r.extra + r.different, 0);
    const outcome = differences === 0 ? 'equal' : result.repair?.complete ? 'repaired' : 'differences';
    await finish(config, control, lsn, outcome, differences).catch((err) => log.warn({ err, subscription: config.subscription }, 'cannot record the verify result'));
  }
}
