/**
 * The `pgsub` command line: `run` (the service), `status`, and `demo` (an embedded
 * publisher and target with a sample workload). Startup errors print one line naming
 * the problem and exit 2; a fatal apply error exits 1; a clean stop exits 0.
 */
import { Command } from 'commander';
import { loadConfig } from '../config/config.js';
import { PgsubError } from '../errors.js';
import { createLogger } from '../log.js';
import { startRunner } from '../service/runner.js';
import { installStopSignals } from '../service/signals.js';
import { printStatus } from './status.js';

const program = new Command();
program.name('pgsub').description('PostgreSQL logical-replication subscriber that runs outside the database').showHelpAfterError();

program
  .command('run')
  .description('stream the publication into the target until stopped (SIGTERM/SIGINT)')
  .option('-c, --config <file>', 'YAML or JSON config file (every key can also come from PGSUB_* environment variables)')
  .option('--log-level <level>', 'fatal|error|warn|info|debug|trace')
  .action(async (opts: { config?: string; logLevel?: string }) => {
    const config = loadConfig({ file: opts.config, overrides: { log_level: opts.logLevel } });
    const log = createLogger(config.logLevel);
    const runner = startRunner(config, log);
    installStopSignals(log, () => runner.stop());
    try {
      await runner.done;
      log.info({ counters: runner.counters }, 'stopped');
      process.exitCode = 0;
    } catch {
      process.exitCode = 1;
    }
  });

program
  .command('status')
  .description('show the subscription\'s progress recorded in the target and the slot on the publisher')
  .option('-c, --config <file>', 'YAML or JSON config file')
  .option('--json', 'print JSON')
  .action(async (opts: { config?: string; json?: boolean }) => {
    const config = loadConfig({ file: opts.config });
    await printStatus(config, Boolean(opts.json));
  });

program
  .command('demo')
  .description('embedded publisher and target of different majors, a sample workload, live progress, and a final comparison')
  .option('--publisher <major>', 'publisher major version', '16')
  .option('--target <major>', 'target major version', '18')
  .option('--transactions <n>', 'source transactions in the workload', '5000')
  .option('--clients <n>', 'concurrent workload clients', '4')
  .action(async (opts: { publisher: string; target: string; transactions: string; clients: string }) => {
    const { runDemo } = await import('./demo.js');
    process.exitCode = await runDemo({
      publisherMajor: Number(opts.publisher),
      targetMajor: Number(opts.target),
      transactions: Number(opts.transactions),
      clients: Number(opts.clients),
    });
  });

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof PgsubError) {
    process.stderr.write(`pgsub: ${err.code}: ${err.message}\n`);
    process.exitCode = 2;
  } else {
    throw err;
  }
}
