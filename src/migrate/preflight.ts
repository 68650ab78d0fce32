/**
 * `pgsub preflight`: is this pair of servers ready for a migration with pgsub? The source
 * checks (preflight-source.ts), the target checks (preflight-target.ts), the hazards of the
 * version pair and of the options asked for, and an estimate of the initial copy. Every
 * finding has a severity, the object and the remediation; blockers make it exit 1,
 * warnings are listed either way. Read-only and safe to repeat: it creates nothing, not
 * even pgsub's schema, and opens no walsender. On a subscription already running (rows in
 * pgsub.subscription_rel), the tables it has copied are its own: not "not empty", not in
 * the copy estimate or the copy slots; every other check stays.
 */
import type { Config } from '../config/config.js';
import { formatBytes, formatSeconds } from '../tablesync/copy-report.js';
import { errorText, major, openPgDb, openTargetDb, type Db } from './db.js';
import { Findings, type Finding } from './findings.js';
import { checkSource, type SourceFacts } from './preflight-source.js';
import { checkTarget, COPIED_STATES, readSubscribed, type TablePrivilegeCheck } from './preflight-target.js';

export interface PreflightOptions {
  /** The copy rate the estimate assumes, MB/s. */
  copyRateMb: number;
  longTransactionSeconds: number;
  /** service/preflight.ts checkTablePrivileges, the check `pgsub run` makes at startup. */
  checkTablePrivileges: TablePrivilegeCheck;
}

export interface CopyEstimate {
  /** Tables still to copy. */
  tables: number;
  /** Published tables this subscription has copied already (not in the estimate). */
  already_copied: number;
  rows: number;
  table_bytes: number;
  index_bytes: number;
  copy_rate_mb_per_s: number;
  seconds: number;
}

export interface PreflightReport {
  ready: boolean;
  subscription: string;
  source: { host: string; database: string; version: string | null };
  target: { host: string; database: string; version: string | null };
  findings: Finding[];
  estimate: CopyEstimate | null;
  not_checked: string[];
}

export async function preflight(config: Config, opts: PreflightOptions): Promise<PreflightReport> {
  const f = new Findings();
  const appName = `pgsub_${config.subscription}_preflight`;
  const notChecked: string[] = [];
  let source: Db | null = null;
  let target: Db | null = null;
  let facts: SourceFacts | null = null;
  let estimate: CopyEstimate | null = null;
  try {
    source = await openPgDb(config.source, appName).catch((err: unknown) => {
      f.blocker(
        'SOURCE_UNREACHABLE',
        'source',
        `${config.source.host}:${config.source.port}`,
        `cannot connect to the source: ${errorText(err)}`,
        'fix the source conninfo, pg_hba.conf or the password',
      );
      return null;
    });
    target = await openTargetDb(config.target, appName).catch((err: unknown) => {
      f.blocker(
        'TARGET_UNREACHABLE',
        'target',
        `${config.target.host}:${config.target.port}`,
        `cannot connect to the target: ${errorText(err)}`,
        'fix the target conninfo, pg_hba.conf or the password',
      );
      return null;
    });
    // A subscription already running: the tables it copied are not copied again (and their rows are its own).
    const subscribed = target ? await readSubscribed(target, config) : new Map<string, string>();
    const copied = new Set([...subscribed].filter(([, state]) => COPIED_STATES.has(state)).map(([rel]) => rel));
    if (source) {
      facts = await checkSource(source, config, { ...opts, copied }, f);
      estimate = copyEstimate(facts, opts.copyRateMb, copied);
      noteSubscription(config, facts, subscribed, f);
    } else notChecked.push('the source (unreachable)');
    if (target && facts) {
      const checked = await checkTarget(target, config, facts, estimate!.table_bytes + estimate!.index_bytes, opts.checkTablePrivileges, f, subscribed);
      notChecked.push(...checked.notChecked);
    } else if (!target) notChecked.push('the target (unreachable)');
    if (source && target) checkPair(source, target, facts!, f);
    checkOptions(source, config, f);
  } finally {
    await source?.close();
    await target?.close();
  }
  return {
    ready: !f.list.some((x) => x.severity === 'blocker'),
    subscription: config.subscription,
    source: { host: `${config.source.host}:${config.source.port}`, database: config.source.database, version: source?.version ?? null },
    target: { host: `${config.target.host}:${config.target.port}`, database: config.target.database, version: target?.version ?? null },
    findings: f.list,
    estimate,
    not_checked: notChecked,
  };
}

/** The initial copy still to do: the published tables this subscription has not copied yet. */
function copyEstimate(facts: SourceFacts, rateMb: number, copied: ReadonlySet<string>): CopyEstimate {
  const sizes = facts.sizes.filter((r) => !copied.has(r.rel));
  const tableBytes = sizes.reduce((s, r) => s + r.tableBytes, 0);
  const alreadyCopied = facts.tables.filter((t) => copied.has(`${t.schema}.${t.table}`)).length;
  return {
    tables: facts.tables.length - alreadyCopied,
    already_copied: alreadyCopied,
    rows: sizes.reduce((s, r) => s + r.rows, 0),
    table_bytes: tableBytes,
    index_bytes: sizes.reduce((s, r) => s + r.indexBytes, 0),
    copy_rate_mb_per_s: rateMb,
    seconds: Math.round((tableBytes / (rateMb * 1024 * 1024)) * 10) / 10,
  };
}

/** A subscription already on the target: say so, with the tables it has copied and those it has not. */
function noteSubscription(config: Config, facts: SourceFacts, subscribed: ReadonlyMap<string, string>, f: Findings): void {
  if (subscribed.size === 0) return;
  const published = facts.tables.map((t) => `${t.schema}.${t.table}`);
  const copied = published.filter((t) => COPIED_STATES.has(subscribed.get(t) ?? ''));
  const waiting = published.filter((t) => !COPIED_STATES.has(subscribed.get(t) ?? ''));
  const ready = published.filter((t) => subscribed.get(t) === 'r').length;
  f.info(
    'TARGET_SUBSCRIPTION_RUNNING',
    'target',
    `subscription ${config.subscription}`,
    `subscription ${config.subscription} already has ${copied.length} of the ${published.length} published table(s) on the target (${ready} ready): their rows are its own copy, not a blocker${
      waiting.length > 0 ? `; not copied yet: ${waiting.slice(0, 5).join(', ')}${waiting.length > 5 ? ', …' : ''}` : ''
    }`,
  );
}

/** What changes between these two majors that a migration meets. */
function checkPair(source: Db, target: Db, facts: SourceFacts, f: Findings): void {
  const s = major(source.versionNum);
  const t = major(target.versionNum);
  const pair = `PostgreSQL ${s} → ${t}`;
  if (t < s) f.warning('PAIR_DOWNGRADE', 'pair', pair, `the target is older than the source: pg_dump output and data types of ${s} may not load into ${t}`);
  if (t === s) f.info('PAIR_SAME_MAJOR', 'pair', pair, 'source and target run the same major version');
  if (s < 13)
    f.info(
      'PAIR_PUBLISHER_13',
      'pair',
      pair,
      `a PostgreSQL ${s} publisher cannot publish a partitioned table as a whole (publish_via_partition_root is 13+): its partitions are published one by one and must exist on the target`,
    );
  if (s < 14)
    f.info(
      'PAIR_PUBLISHER_14',
      'pair',
      pair,
      `a PostgreSQL ${s} publisher sends a large transaction only at its commit (no streaming = on) and values as text (no binary); no two_phase (15+)`,
    );
  if (s < 15)
    f.info(
      'PAIR_PUBLISHER_15',
      'pair',
      pair,
      `a PostgreSQL ${s} publisher has no row filters and no column lists: every row and column of a published table is copied and streamed`,
    );
  if (s < 16 && t >= 16)
    f.info(
      'PAIR_PUBLISHER_16',
      'pair',
      pair,
      `origin = none (only changes made on the publisher) needs a 16+ publisher: the reverse replication of a cutover (new primary ${t} → old primary ${s}) can use it, the forward one cannot`,
    );
  if (t >= 19 && !facts.standardConformingStrings) {
    f.warning(
      'PAIR_STANDARD_CONFORMING_STRINGS',
      'pair',
      'standard_conforming_strings',
      `the source runs with standard_conforming_strings = off; PostgreSQL ${t} always has it on: string literals with backslashes in the application (and in function bodies) mean something else on the target`,
      "use E'…' for escapes, then ALTER SYSTEM SET standard_conforming_strings = on on the source to test",
    );
  }
  if (s < 15 && t >= 15)
    f.info(
      'PAIR_PUBLIC_SCHEMA',
      'pair',
      pair,
      'PostgreSQL 15+ no longer lets every role CREATE in schema public: grant it on the target to roles that need it',
      'GRANT CREATE ON SCHEMA public TO <role>;',
    );
  f.info(
    'PAIR_STATISTICS',
    'pair',
    pair,
    'planner statistics are not replicated: ANALYZE the target after the initial copy and before the cutover',
    'ANALYZE;  -- on the target (vacuumdb --analyze-only)',
  );
}

/** Options the publisher's version cannot carry (pgsub run refuses them too, at startup). */
function checkOptions(source: Db | null, config: Config, f: Findings): void {
  if (!source) return;
  const v = source.versionNum;
  const s = major(v);
  const refuse = (key: string, value: string, need: number) =>
    f.blocker(
      'OPTION_UNSUPPORTED',
      'pair',
      key,
      `${key} = ${value} needs a PostgreSQL ${need} or later publisher; this one is ${s}`,
      `${key}: ${key === 'streaming' ? 'off' : key === 'origin' ? 'any' : 'false'}`,
    );
  if (config.streaming !== 'off' && v < 140000) refuse('streaming', config.streaming, 14);
  if (config.streaming === 'parallel' && v >= 140000 && v < 160000) refuse('streaming', 'parallel', 16);
  if (config.binary && v < 140000) refuse('binary', 'true', 14);
  if (config.messages && v < 140000) refuse('messages', 'true', 14);
  if (config.twoPhase && v < 150000) refuse('two_phase', 'true', 15);
  if (config.origin === 'none' && v < 160000) refuse('origin', 'none', 16);
}

const SEVERITY_ORDER = { blocker: 0, warning: 1, info: 2 } as const;

/** The human form: one block per finding, blockers first, then the estimate and the verdict. */
export function renderPreflight(r: PreflightReport): string {
  const lines = [
    `pgsub preflight: subscription ${r.subscription}, PostgreSQL ${r.source.version ?? '?'} (${r.source.host}/${r.source.database}) → PostgreSQL ${r.target.version ?? '?'} (${r.target.host}/${r.target.database})`,
    '',
  ];
  const sorted = [...r.findings].sort((a, b) => SEVERITY_ORDER[a.severity] - SEVERITY_ORDER[b.severity]);
  if (sorted.length > 0) lines.push(`${'severity'.padEnd(8)} ${'side'.padEnd(6)} ${'object'.padEnd(32)} finding`);
  for (const x of sorted) {
    lines.push(`${x.severity.toUpperCase().padEnd(8)} ${x.side.padEnd(6)} ${x.object.slice(0, 32).padEnd(32)} ${x.message}`);
    if (x.remediation) lines.push(`${''.padEnd(16)}fix: ${x.remediation}`);
  }
  if (r.estimate) {
    const e = r.estimate;
    lines.push(
      '',
      `initial copy: ${e.tables} table(s)${e.already_copied > 0 ? ` (${e.already_copied} more already copied by this subscription)` : ''}, about ${e.rows.toLocaleString('en-US')} rows, ${formatBytes(e.table_bytes)} of tables and ${formatBytes(e.index_bytes)} of indexes (built after the copy): about ${formatSeconds(e.seconds)} at ${e.copy_rate_mb_per_s} MB/s (an assumed rate; --copy-rate-mb sets it, npm run bench:sync measures one)`,
    );
  }
  for (const n of r.not_checked) lines.push(`not checked: ${n}`);
  const count = (s: Finding['severity']) => r.findings.filter((x) => x.severity === s).length;
  lines.push('', `${r.ready ? 'ready' : 'NOT READY'}: ${count('blocker')} blocker(s), ${count('warning')} warning(s), ${count('info')} note(s)`);
  return `${lines.join('\n')}\n`;
}
