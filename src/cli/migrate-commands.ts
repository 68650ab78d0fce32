/**
 * The migration commands of `pgsub` (issue 20): `preflight` (is this pair ready; exit 0
 * ready, 1 blockers), `schema copy` (the published tables' schema from pg_dump, in two
 * steps), `schema diff` (source and target side by side; exit 1 with differences) and
 * `cutover` (cutover.ts). The work lives in src/migrate/; this file parses options, prints
 * the human or JSON form and maps typed errors to exit codes: a PgsubError's own exitCode
 * (2 for what the operator must fix before trying again, 1 for a step that failed), with
 * one line on stderr naming the code and what to do. Each command first checks that the
 * configured roles have what it needs on both sides (migrate/privileges.ts: exit 2 naming
 * the server, the privilege and the GRANT) before it reads or changes anything else.
 */
import type { Command } from 'commander';
import { loadConfig } from '../config/config.js';
import { ConfigError, PgsubError } from '../errors.js';
import { preflight, renderPreflight } from '../migrate/preflight.js';
import { copySchema, type SchemaStep } from '../migrate/schema.js';
import { diffSchema, renderDiff } from '../migrate/schema-diff.js';
import { Findings } from '../migrate/findings.js';
import { checkPreflightPrivileges, checkSchemaCopyPrivileges, cutoverFindings } from '../migrate/privileges.js';
import { checkTablePrivileges } from '../service/preflight.js';
import { createLogger } from '../log.js';
import { abortCutover, renderCutover, runCutover } from './cutover.js';

interface CutoverFlags {
  config?: string[];
  fence: 'read-only' | 'none';
  maxLagMb: string;
  lagTimeout: string;
  timeout: string;
  fenceTimeout: string;
  preparedTimeout: string;
  refusePrepared?: boolean;
  keepSlot?: boolean;
  abort?: boolean;
  reverse?: boolean;
  reverseConfig: string;
  json?: boolean;
}

interface SchemaCopyFlags {
  config?: string;
  step: string;
  force?: boolean;
  print?: boolean;
  pgDump?: string;
  json?: boolean;
}

/** Runs a command body; a PgsubError ends it with its own exit code and one line on stderr. */
export async function withExitCode(body: () => Promise<number>): Promise<void> {
  try {
    process.exitCode = await body();
  } catch (err) {
    if (!(err instanceof PgsubError)) throw err;
    process.stderr.write(`pgsub: ${err.code}: ${err.message}\n`);
    process.exitCode = err.exitCode === 1 ? 1 : 2;
  }
}

const positive = (name: string, value: string): number => {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new ConfigError(`${name} must be a positive number, not ${JSON.stringify(value)}`, { key: name });
  return n;
};

export function registerMigrationCommands(program: Command): void {
  registerCutover(program);
  registerPreflight(program);
  const schema = program.command('schema').description("the published tables' schema: copy it to the target from pg_dump, or compare both sides");
  registerSchemaCopy(schema);
  registerSchemaDiff(schema);
}

function registerCutover(program: Command): void {
  program
    .command('cutover')
    .description(
      'switch to the target: lag check, write fence, wait until the running service applied the fence LSN, sequences, row counts, optionally replication back; any failure lifts the fence',
    )
    .option('-c, --config <file...>', 'config file(s); several subscriptions of one source database are drained to the same fence')
    .option('--fence <how>', 'read-only (the source database read-only, other sessions terminated) | none (you fenced the application yourself)', 'read-only')
    .option('--max-lag-mb <n>', 'start only when the target is at most this far behind', '16')
    .option('--lag-timeout <seconds>', 'how long to wait for the lag to come under --max-lag-mb', '60')
    .option('--timeout <seconds>', 'how long to wait, fenced, for the service to apply the fence LSN', '60')
    .option('--reverse', 'set up replication from the new primary back to the old one (origin = none)')
    .option('--reverse-config <file>', "where to write the reverse subscription's config", 'pgsub-reverse.yaml')
    .option('--fence-timeout <seconds>', 'how long the fence may take to end every session from before it; longer is a failure', '10')
    .option('--prepared-timeout <seconds>', "how long to wait, fenced, for the source's prepared transactions to be committed or rolled back", '30')
    .option('--refuse-prepared', 'refuse before the fence while the source has prepared transactions')
    .option('--keep-slot', 'keep the forward slot on the old primary (pgsub status shows the WAL it retains)')
    .option('--abort', 'undo a cutover that stopped half-way (lift its fence, remove its reverse setup) and exit')
    .option('--json', 'print the summary as JSON')
    .action((opts: CutoverFlags) => withExitCode(() => cutover(opts)));
}

/** `pgsub cutover` (or `--abort`): its exit code; a refusal or failure is thrown as its CutoverError. */
async function cutover(opts: CutoverFlags): Promise<number> {
  if (opts.fence !== 'read-only' && opts.fence !== 'none') throw new ConfigError(`cutover: --fence must be read-only or none, not ${JSON.stringify(opts.fence)}`, { key: 'fence' });
  const configs = (opts.config && opts.config.length > 0 ? opts.config : [undefined]).map((file) => loadConfig({ file }));
  const log = createLogger(configs[0]!.logLevel, process.stderr as never);
  const say = opts.json ? () => {} : (line: string) => process.stdout.write(`${line}\n`);
  if (opts.abort) {
    process.stdout.write(`pgsub cutover --abort: ${await abortCutover(configs, say, log)}\n`);
    return 0;
  }
  const options = cutoverOptions(opts);
  say(`pgsub cutover: ${configs.map((c) => c.subscription).join(', ')}, fence ${opts.fence}`);
  const report = await untilInterrupted((signal) => runCutover(configs, { ...options, signal }, say, log));
  process.stdout.write(opts.json ? `${JSON.stringify(report, null, 2)}\n` : renderCutover(report));
  return 0;
}

/** The flags as runCutover's options, each timeout checked positive. */
function cutoverOptions(opts: CutoverFlags) {
  return {
    fence: opts.fence,
    maxLagBytes: Math.round(Number(opts.maxLagMb) * 1024 * 1024),
    lagTimeoutMs: positive('--lag-timeout', opts.lagTimeout) * 1000,
    applyTimeoutMs: positive('--timeout', opts.timeout) * 1000,
    fenceTimeoutMs: positive('--fence-timeout', opts.fenceTimeout) * 1000,
    preparedTimeoutMs: positive('--prepared-timeout', opts.preparedTimeout) * 1000,
    refusePrepared: Boolean(opts.refusePrepared),
    keepSlot: Boolean(opts.keepSlot),
    reverse: Boolean(opts.reverse),
    reverseConfigFile: opts.reverse ? opts.reverseConfig : null,
  } as const;
}

/** Runs the cutover with SIGINT/SIGTERM as its abort signal, the handlers removed when it ends. */
async function untilInterrupted<T>(body: (signal: AbortSignal) => Promise<T>): Promise<T> {
  // Ctrl-C or SIGTERM: before the point of no return the cutover is undone, after it finished (cutover.ts).
  const interrupt = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (interrupt.signal.aborted) return;
    process.stderr.write(`pgsub cutover: ${signal} received: undoing the cutover unless it is past the point of no return\n`);
    interrupt.abort(signal);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    return await body(interrupt.signal);
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

function registerPreflight(program: Command): void {
  program
    .command('preflight')
    .description('check the source, the target and the version pair before a migration (read-only; exit 0 ready, 1 blockers)')
    .option('-c, --config <file>', 'YAML or JSON config file')
    .option('--json', 'print JSON')
    .option('--copy-rate-mb <n>', 'copy rate the estimate assumes, MB/s', '50')
    .option('--long-transaction <seconds>', 'report transactions open longer than this', '60')
    .action((opts: { config?: string; json?: boolean; copyRateMb: string; longTransaction: string }) =>
      withExitCode(async () => {
        const config = loadConfig({ file: opts.config });
        await checkPreflightPrivileges(config);
        const report = await preflight(config, {
          copyRateMb: positive('--copy-rate-mb', opts.copyRateMb),
          longTransactionSeconds: positive('--long-transaction', opts.longTransaction),
          checkTablePrivileges,
        });
        // What the cutover will need besides: warned about now, long before its fence.
        if (report.source.version !== null && report.target.version !== null) {
          const notes = new Findings();
          await cutoverFindings(config, notes);
          report.findings.push(...notes.list);
        }
        process.stdout.write(opts.json ? `${JSON.stringify(report, null, 2)}\n` : renderPreflight(report));
        return report.ready ? 0 : 1;
      }),
    );
}

function registerSchemaCopy(schema: Command): void {
  schema
    .command('copy')
    .description(
      'create the published tables on the target from pg_dump --schema-only of the source (step tables before pgsub run; step post-data, foreign keys and triggers, once every table is ready)',
    )
    .option('-c, --config <file>', 'YAML or JSON config file')
    .option('--step <step>', 'tables | post-data', 'tables')
    .option('--force', 'tables: drop and re-create published tables the target has already; post-data: run before the initial copy finished')
    .option('--print', 'print the SQL instead of running it')
    .option('--pg-dump <path>', 'the pg_dump to use (default: config pg_dump, else the first on PATH)')
    .option('--json', 'print JSON')
    .action((opts: SchemaCopyFlags) => withExitCode(() => schemaCopy(opts)));
}

async function schemaCopy(opts: SchemaCopyFlags): Promise<number> {
  if (opts.step !== 'tables' && opts.step !== 'post-data')
    throw new ConfigError(`schema copy: --step must be tables or post-data, not ${JSON.stringify(opts.step)}`, { key: 'step' });
  const config = loadConfig({ file: opts.config });
  const say = opts.json || opts.print ? () => {} : (line: string) => process.stdout.write(`${line}\n`);
  await checkSchemaCopyPrivileges(config, { step: opts.step as SchemaStep, force: Boolean(opts.force), print: Boolean(opts.print) });
  const report = await copySchema(config, { step: opts.step as SchemaStep, force: Boolean(opts.force), print: Boolean(opts.print), pgDump: opts.pgDump ?? null }, say);
  if (opts.print) process.stdout.write(report.sql ?? '');
  else if (opts.json) {
    const entry = (e: { type: string; schema: string | null; name: string }) => ({ type: e.type, schema: e.schema, name: e.name });
    process.stdout.write(`${JSON.stringify({ ...report, applied: report.applied.map(entry), alreadyPresent: report.alreadyPresent.map(entry) }, null, 2)}\n`);
  }
  return 0;
}

function registerSchemaDiff(schema: Command): void {
  schema
    .command('diff')
    .description('the published tables on the source and the target side by side, differences listed (exit 1 when they differ)')
    .option('-c, --config <file>', 'YAML or JSON config file')
    .option('--json', 'print JSON')
    .action((opts: { config?: string; json?: boolean }) =>
      withExitCode(async () => {
        const config = loadConfig({ file: opts.config });
        const diff = await diffSchema(config);
        process.stdout.write(opts.json ? `${JSON.stringify(diff, null, 2)}\n` : renderDiff(diff));
        return diff.differences === 0 ? 0 : 1;
      }),
    );
}
