/**
 * The migration commands of `pgsub` (issue 20): `preflight` (is this pair ready; exit 0
 * ready, 1 blockers), `schema copy` (the published tables' schema from pg_dump, in two
 * steps), `schema diff` (source and target side by side; exit 1 with differences) and
 * `cutover` (cutover.ts). The work lives in src/migrate/; this file parses options, prints
 * the human or JSON form and maps typed errors to exit codes: a PgsubError's own exitCode
 * (2 for what the operator must fix before trying again, 1 for a step that failed), with
 * one line on stderr naming the code and what to do.
 */
import type { Command } from 'commander';
import { loadConfig } from '../config/config.js';
import { ConfigError, PgsubError } from '../errors.js';
import { preflight, renderPreflight } from '../migrate/preflight.js';
import { copySchema, type SchemaStep } from '../migrate/schema.js';
import { diffSchema, renderDiff } from '../migrate/schema-diff.js';
import { checkTablePrivileges } from '../service/preflight.js';

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
        const report = await preflight(config, {
          copyRateMb: positive('--copy-rate-mb', opts.copyRateMb),
          longTransactionSeconds: positive('--long-transaction', opts.longTransaction),
          checkTablePrivileges,
        });
        process.stdout.write(opts.json ? `${JSON.stringify(report, null, 2)}\n` : renderPreflight(report));
        return report.ready ? 0 : 1;
      }),
    );

  const schema = program.command('schema').description('the published tables\' schema: copy it to the target from pg_dump, or compare both sides');
  schema
    .command('copy')
    .description('create the published tables on the target from pg_dump --schema-only of the source (step tables before pgsub run; step post-data, foreign keys and triggers, once every table is ready)')
    .option('-c, --config <file>', 'YAML or JSON config file')
    .option('--step <step>', 'tables | post-data', 'tables')
    .option('--force', 'tables: drop and re-create published tables the target has already; post-data: run before the initial copy finished')
    .option('--print', 'print the SQL instead of running it')
    .option('--pg-dump <path>', 'the pg_dump to use (default: config pg_dump, else the first on PATH)')
    .option('--json', 'print JSON')
    .action((opts: { config?: string; step: string; force?: boolean; print?: boolean; pgDump?: string; json?: boolean }) =>
      withExitCode(async () => {
        if (opts.step !== 'tables' && opts.step !== 'post-data') throw new ConfigError(`schema copy: --step must be tables or post-data, not ${JSON.stringify(opts.step)}`, { key: 'step' });
        const config = loadConfig({ file: opts.config });
        const say = opts.json || opts.print ? () => {} : (line: string) => process.stdout.write(`${line}\n`);
        const report = await copySchema(config, { step: opts.step as SchemaStep, force: Boolean(opts.force), print: Boolean(opts.print), pgDump: opts.pgDump ?? null }, say);
        if (opts.print) process.stdout.write(report.sql ?? '');
        else if (opts.json) {
          const entry = (e: { type: string; schema: string | null; name: string }) => ({ type: e.type, schema: e.schema, name: e.name });
          process.stdout.write(`${JSON.stringify({ ...report, applied: report.applied.map(entry), alreadyPresent: report.alreadyPresent.map(entry) }, null, 2)}\n`);
        }
        return 0;
      }),
    );
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
