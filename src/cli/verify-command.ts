/**
 * `pgsub verify` (issue 21, docs/verify.md): the target compared with the source at one
 * exact LSN while the service keeps applying; exit 0 equal, 1 differences (also when
 * --repair fixed them: run it again to see equal), 2 could not run (no service, the hold
 * refused or unanswered, a server unreachable), with one line saying what to do. Progress:
 * a line on a terminal (rows/s, ETA), `verify progress` log events otherwise; the result as
 * text or --json on stdout.
 */
import type { Command } from 'commander';
import { loadConfig } from '../config/config.js';
import { ConfigError, PgsubError } from '../errors.js';
import { createLogger, type Logger } from '../log.js';
import { checkVerifyPrivileges } from '../migrate/privileges.js';
import { runVerify, selectTables, type VerifyProgress, type VerifyResult } from '../verify/verify.js';

/** `50000` or `50000rows`: rows per second; `20MB` (or kB, GB): bytes per second; per side. */
export function parseRateLimit(text: string): { perSecond: number; unit: 'rows' | 'bytes' } {
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*(rows?|kb|mb|gb)?(?:\/s)?\s*$/i.exec(text);
  const n = m ? Number(m[1]) : Number.NaN;
  if (!m || !(n > 0)) throw new ConfigError(`--rate-limit must be rows per second (50000, 50000rows) or bytes (20MB, 512kB), not ${JSON.stringify(text)}`, { key: 'rate-limit' });
  const unit = (m[2] ?? 'rows').toLowerCase();
  const scale = unit === 'kb' ? 1024 : unit === 'mb' ? 1024 ** 2 : unit === 'gb' ? 1024 ** 3 : 1;
  return { perSecond: n * scale, unit: unit.startsWith('row') ? 'rows' : 'bytes' };
}

const list = (value: string, previous: string[] = []) => [
  ...previous,
  ...value
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
];

function count(n: number): string {
  return n.toLocaleString('en-US');
}

export function renderVerify(r: VerifyResult): string {
  const lines: string[] = [];
  const differing = r.tables.filter((t) => t.status === 'different').length;
  const verdict = r.equal ? 'equal' : `${count(r.differences)} difference${r.differences === 1 ? '' : 's'} in ${differing} of ${r.tables.length} tables`;
  lines.push(
    `pgsub verify ${r.subscription} at ${r.lsn}: ${verdict} (${count(r.rows)} source rows in ${(r.elapsedMs / 1000).toFixed(1)} s; apply paused ${r.pauseMs === null ? '?' : r.pauseMs.toFixed(1)} ms)`,
  );
  const width = Math.max(10, ...r.tables.map((t) => t.table.length));
  for (const t of r.tables) {
    const what =
      t.status === 'equal'
        ? `equal       ${count(t.sourceRows)} rows${t.keyed ? '' : ' (no key: multiset)'}`
        : t.status === 'not compared'
          ? `not compared: ${t.reason}`
          : t.ranges === 0
            ? `DIFFERENT   ${t.reason}`
            : `DIFFERENT   missing ${count(t.missing)}, extra ${count(t.extra)}, different ${count(t.different)} (source ${count(t.sourceRows)} rows, target ${count(t.targetRows)})${t.keyed ? '' : ' (no key: multiset)'}`;
    lines.push(`  ${t.table.padEnd(width)}  ${what}`);
    for (const d of t.listed) lines.push(`      ${d.kind.padEnd(9)} ${JSON.stringify(d.key)}`);
    const unlisted = t.missing + t.extra + t.different - t.listed.length;
    if (t.keyed && unlisted > 0) lines.push(`      … and ${count(unlisted)} more`);
  }
  if (r.repair) {
    lines.push(`repair at ${r.repair.lsn || '-'} (apply held ${r.repair.pauseMs} ms): ${r.repair.complete ? 'every differing row re-copied' : 'incomplete'}`);
    for (const t of r.repair.tables)
      lines.push(
        `  ${t.table}: ${count(t.keys)} keys: ${count(t.updated)} updated, ${count(t.inserted)} inserted, ${count(t.deleted)} deleted${t.unchanged > 0 ? `, ${count(t.unchanged)} equal again` : ''} (${t.ms} ms)`,
      );
    for (const s of r.repair.skipped)
      lines.push(`  ${s.table}: ${s.code ? `${s.code}: ${s.reason}` : s.reason.startsWith('not repaired') ? s.reason : `not repaired: ${s.reason}`}`);
    lines.push('run pgsub verify again to confirm');
  }
  return `${lines.join('\n')}\n`;
}

function progressLine(p: VerifyProgress): string {
  const pct = p.totalRows > 0 ? Math.min(100, (100 * p.rows) / p.totalRows).toFixed(0) : '-';
  const eta = p.etaSeconds === null ? '?' : `${Math.ceil(p.etaSeconds)} s`;
  return `verify: ${count(p.rows)}/${count(p.totalRows)} rows (${pct}%), ${count(Math.round(p.rowsPerSecond))} rows/s, ETA ${eta}, tables ${p.tablesDone}/${p.tables}`;
}

interface VerifyFlags {
  config?: string[];
  table: string[];
  exclude: string[];
  rateLimit?: string;
  parallel: string;
  list: string;
  holdTimeout: string;
  repair?: boolean;
  json?: boolean;
  logLevel?: string;
}

export function registerVerifyCommand(program: Command): void {
  program
    .command('verify')
    .description('compare the target with the source at one exact LSN while the service keeps applying (exit 0 equal, 1 differences, 2 could not run)')
    .option(
      '-c, --config <file...>',
      'config file of the subscription (its service must be running); several subscriptions of one source database into one target database are compared at one LSN',
    )
    .option('--table <patterns>', 'only these tables: schema.table patterns, * matches anything, comma-separated or repeated', list, [])
    .option('--exclude <patterns>', 'not these tables (same patterns)', list, [])
    .option('--rate-limit <rate>', 'per side: rows per second (50000) or bytes per second (20MB)')
    .option('--parallel <n>', 'connection pairs comparing at once', '2')
    .option('--list <n>', 'differences listed per table', '20')
    .option('--hold-timeout <seconds>', 'the longest the service holds its apply for the snapshot before giving up', '10')
    .option('--repair', 're-copy the rows found different from the source, at a second short hold (logged in pgsub.conflict_log)')
    .option('--json', 'print the result as JSON')
    .option('--log-level <level>', 'fatal|error|warn|info|debug|trace')
    .action(verify);
}

/** `pgsub verify`: sets the exit code itself, as its failures all exit 2 (not withExitCode's mapping). */
async function verify(opts: VerifyFlags): Promise<void> {
  try {
    const configs = (opts.config && opts.config.length > 0 ? opts.config : [undefined]).map((file) => loadConfig({ file, overrides: { log_level: opts.logLevel } }));
    const config = configs[0]!;
    const { parallel, listLimit, holdTimeout } = numericFlags(opts);
    const log = createLogger(config.logLevel, process.stderr as never);
    const tty = Boolean(process.stderr.isTTY) && !opts.json;
    for (const c of configs) await checkVerifyPrivileges(c, { repair: Boolean(opts.repair), tables: (rels) => selectTables(rels, opts.table, opts.exclude) });
    const result = await runVerify(configs, {
      include: opts.table,
      exclude: opts.exclude,
      parallel,
      rateLimit: opts.rateLimit ? parseRateLimit(opts.rateLimit) : null,
      listLimit,
      repair: Boolean(opts.repair),
      holdTimeoutMs: holdTimeout * 1000,
      log,
      onProgress: progressReporter(tty, log),
    });
    if (tty) process.stderr.write('\n');
    process.stdout.write(opts.json ? `${JSON.stringify(result, null, 2)}\n` : renderVerify(result));
    process.exitCode = result.equal ? 0 : 1;
  } catch (err) {
    // Anything that kept the comparison from running: exit 2, one line.
    const code = err instanceof PgsubError ? err.code : ((err as { code?: string }).code ?? 'PGSUB_VERIFY_FAILED');
    process.stderr.write(`pgsub: ${code}: ${(err as Error).message ?? String(err)}\n`);
    process.exitCode = 2;
  }
}

/** --parallel, --list and --hold-timeout, each checked in that order. */
function numericFlags(opts: VerifyFlags): { parallel: number; listLimit: number; holdTimeout: number } {
  const parallel = Number(opts.parallel);
  if (!Number.isInteger(parallel) || parallel < 1 || parallel > 64)
    throw new ConfigError(`--parallel must be an integer from 1 to 64, not ${JSON.stringify(opts.parallel)}`, { key: 'parallel' });
  const listLimit = Number(opts.list);
  if (!Number.isInteger(listLimit) || listLimit < 0) throw new ConfigError(`--list must be a whole number, not ${JSON.stringify(opts.list)}`, { key: 'list' });
  const holdTimeout = Number(opts.holdTimeout);
  if (!(holdTimeout > 0)) throw new ConfigError(`--hold-timeout must be a positive number of seconds`, { key: 'hold-timeout' });
  return { parallel, listLimit, holdTimeout };
}

/** Progress as one rewritten line on a terminal, else a `verify progress` log event every 5 s and at the end. */
function progressReporter(tty: boolean, log: Logger): (p: VerifyProgress) => void {
  let lastLogged = 0;
  return (p) => {
    if (tty) process.stderr.write(`\r${progressLine(p)}\x1b[K`);
    else if (Date.now() - lastLogged >= 5000 || p.tablesDone === p.tables) {
      lastLogged = Date.now();
      log.info(
        {
          rows: p.rows,
          totalRows: p.totalRows,
          rowsPerSecond: Math.round(p.rowsPerSecond),
          etaSeconds: p.etaSeconds === null ? null : Math.ceil(p.etaSeconds),
          tablesDone: p.tablesDone,
          tables: p.tables,
        },
        'verify progress',
      );
    }
  };
}
