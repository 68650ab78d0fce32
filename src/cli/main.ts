/**
 * The `pgsub` command line: `run` (the service), `status`, `plan` (the mapping's plan and SQL, plan.ts), `refresh`, `resync`, `skip`
 * and `enable` (conflict handling, conflict/control.ts), the migration commands
 * (`preflight`, `schema copy|diff`, `cutover`: migrate-commands.ts), and `demo` (an
 * embedded migration with a sample workload). Startup errors (configuration, and
 * setup the operator must fix: passwords, pg_hba.conf, privileges, a second pgsub) and
 * usage errors (an unknown command or option) print one line naming the problem and exit
 * 2; a fatal apply error exits 1; a lost subscription (slot lost or ahead) exits 4; a
 * clean stop exits 0; `status` exits 3 when a side is unreachable.
 */
import { Command, CommanderError } from 'commander';
import { loadConfig } from '../config/config.js';
import { ConfigError, PgsubError } from '../errors.js';
import { createLogger } from '../log.js';
import { startRunner, type Runner } from '../service/runner.js';
import { createNotifier } from '../service/notify.js';
import { superviseService, type Supervisor } from '../service/supervise.js';
import type { MetricsSource } from '../service/metrics.js';
import { installStopSignals } from '../service/signals.js';
import { printStatus } from './status.js';
import { printPlan } from './plan.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import type { Config } from '../config/config.js';
import { markReadyWithoutCopy, notifyChannel, requestRefresh } from '../tablesync/launcher.js';
import { listPublishedTables } from '../tablesync/catalog.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { enableSubscription, requestSkip } from '../conflict/control.js';
import { migrateTarget } from '../origin/store.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { bundleCodeCache, packageVersion } from './version.js';
import { registerMigrationCommands } from './migrate-commands.js';
import { registerVerifyCommand } from './verify-command.js';
import { checkControlPrivileges } from '../migrate/privileges.js';

const program = new Command();
// exitOverride before the commands: subcommands inherit it when they are created. A usage
// error then throws instead of exiting 1, which is kept for "ran, and found a problem".
program
  .name('pgsub')
  .description('PostgreSQL logical-replication subscriber that runs outside the database')
  .version(packageVersion(), '-V, --version', 'print the version')
  .exitOverride()
  .showHelpAfterError();

program
  .command('run')
  .description('stream the publication into the target until stopped (SIGTERM/SIGINT)')
  .option('-c, --config <file>', 'YAML or JSON config file (every key can also come from PGSUB_* environment variables)')
  .option('--log-level <level>', 'fatal|error|warn|info|debug|trace')
  .action(async (opts: { config?: string; logLevel?: string }) => {
    const config = loadConfig({ file: opts.config, overrides: { log_level: opts.logLevel } });
    const log = createLogger(config.logLevel);
    log.info({ subscription: config.subscription, slot: config.slotName, state_dir: config.stateDir, code_cache: bundleCodeCache() }, 'starting');
    const notifier = createNotifier(log);
    let supervisor: Supervisor | null = null;
    const runner = startRunner(config, log, { onStreaming: ({ startLsn }) => supervisor?.streaming(startLsn) });
    // READY=1 only once a session streams, which is after the run lock (session.ts).
    supervisor = superviseService(runner, notifier, log, config.receiveTimeoutMs);
    installStopSignals(log, () => {
      supervisor?.stopping();
      runner.stop();
    });
    // The single-instance check before the port is bound: a second pgsub for this
    // subscription ends with PGSUB_ALREADY_RUNNING naming the first (exit 2), not with the
    // first one's metrics port taken. A service that ends first binds nothing.
    const going = await Promise.race([
      runner.started.then(() => true),
      runner.done.then(
        () => false,
        () => false,
      ),
    ]);
    const metrics =
      config.metricsListen && going
        ? await (await import('../service/metrics.js'))
            .startMetricsServer(config.metricsListen, metricsSource(runner, config), config.readyMaxLagBytes, log)
            .catch((err: unknown) => {
              // Asked for and not possible (the port is taken by something else): say so, and stop.
              runner.stop();
              throw new ConfigError(`metrics_listen ${config.metricsListen}: ${(err as Error).message}`, { key: 'metrics_listen' });
            })
        : null;
    try {
      await runner.done;
      // What this process did: rowsCopied counts the rows of the table sync's copies too,
      // not only the apply's COPY batches; tableSync breaks them out.
      const tableSync = runner.copied();
      log.info({ counters: { ...runner.counters, rowsCopied: runner.counters.rowsCopied + tableSync.rows }, tableSync, failures: runner.failures }, 'stopped');
      process.exitCode = 0;
    } catch (err) {
      // Setup the operator must fix: one line saying what, as for a configuration error.
      const exitCode = err instanceof PgsubError ? err.exitCode : 1;
      if (exitCode === 2 || exitCode === 5) process.stderr.write(`pgsub: ${(err as PgsubError).code}: ${(err as PgsubError).message}\n`);
      process.exitCode = exitCode;
    }
    supervisor.stop();
    await metrics?.close();
    await notifier.flush();
    // Stopped: a connection attempt still pending (a server that does not answer) must not hold the exit.
    setTimeout(() => process.exit(), 1000).unref();
  });

program
  .command('status')
  .description("show the subscription's progress recorded in the target and the slot on the publisher (exit 3: a side is unreachable; docs/status-json.md)")
  .option('-c, --config <file...>', 'config file(s); several print each subscription (JSON: an array)')
  .option('--json', 'print JSON')
  .action(async (opts: { config?: string[]; json?: boolean }) => {
    const configs = (opts.config && opts.config.length > 0 ? opts.config : [undefined]).map((file) => loadConfig({ file }));
    process.exitCode = await printStatus(configs, Boolean(opts.json));
  });

program
  .command('plan')
  .description(
    'print per published table the resolved mapping and the SQL pgsub runs for insert, update, delete, truncate and the initial copy (exit 2: a plan is invalid; docs/mapping.md)',
  )
  .option('-c, --config <file>', 'YAML or JSON config file')
  .option('--json', 'print JSON')
  .action(async (opts: { config?: string; json?: boolean }) => {
    const config = loadConfig({ file: opts.config });
    process.exitCode = await printPlan(config, Boolean(opts.json));
  });

program
  .command('refresh')
  .description(
    'ALTER SUBSCRIPTION … REFRESH PUBLICATION: add the tables published since the last refresh, drop those no longer published (a running pgsub is woken; otherwise at its next start)',
  )
  .option('-c, --config <file>', 'YAML or JSON config file')
  .option('--no-copy', 'mark published tables not copied yet as ready without copying them (ALTER SUBSCRIPTION … REFRESH PUBLICATION WITH (copy_data = false))')
  .action(async (opts: { config?: string; copy: boolean }) => {
    const config = loadConfig({ file: opts.config });
    await checkControlPrivileges(config, 'refresh', { source: !opts.copy });
    // The request is recorded in pgsub.origin (migrations/0010) for a pgsub that is not running.
    await migrateTarget(config.target, `pgsub_${config.subscription}_cli`);
    if (!opts.copy) {
      const tables = await withSource(config, (replication) => listPublishedTables(replication, config.publications));
      const marked = await withMaintenance(config, (sql) => markReadyWithoutCopy(sql, config.subscription, tables));
      process.stdout.write(`${marked.length} table(s) marked ready without a copy${marked.length > 0 ? `: ${marked.join(', ')}` : ''}\n`);
    }
    await withMaintenance(config, (sql) => requestRefresh(sql, config.subscription));
    process.stdout.write(`refresh requested for subscription ${config.subscription}\n`);
  });

program
  .command('resync')
  .description('copy one table again from a fresh snapshot while the others keep streaming')
  .argument('<table>', 'schema.table as published')
  .option('-c, --config <file>', 'YAML or JSON config file')
  .action(async (table: string, opts: { config?: string }) => {
    const config = loadConfig({ file: opts.config });
    const dot = table.indexOf('.');
    if (dot <= 0) throw new ConfigError(`resync: give the table as schema.table, not ${JSON.stringify(table)}`, { key: 'table' });
    const target = { schema: table.slice(0, dot), table: table.slice(dot + 1) };
    await checkControlPrivileges(config, 'resync', { source: config.twoPhase });
    if (config.twoPhase && (await withSource(config, (replication) => replication.getSlot(config.slotName)))?.twoPhase) {
      // Native refuses REFRESH PUBLICATION with copy_data while two_phase is enabled, for the same reason (launcher.ts).
      throw new ConfigError(
        `resync: two_phase is enabled on slot ${config.slotName}, so ${table} cannot be copied again: a transaction prepared during the copy would lack its changes. Re-create the subscription to copy it again`,
        { key: 'table' },
      );
    }
    const ok = await withMaintenance(config, (sql) => requestRefresh(sql, config.subscription, target));
    if (!ok) throw new ConfigError(`resync: ${table} is not a table of subscription ${config.subscription} (see pgsub status)`, { key: 'table' });
    process.stdout.write(`resync of ${table} requested for subscription ${config.subscription}\n`);
  });

program
  .command('skip')
  .description('skip the one remote transaction that fails to apply, like ALTER SUBSCRIPTION … SKIP (lsn = its finish LSN, shown by pgsub status)')
  .requiredOption('--lsn <lsn>', 'finish LSN (commit or prepare LSN) of the failing remote transaction, X/Y')
  .option('-c, --config <file>', 'YAML or JSON config file')
  .action(async (opts: { config?: string; lsn: string }) => {
    const config = loadConfig({ file: opts.config });
    let lsn: Lsn;
    try {
      lsn = parseLsn(opts.lsn);
    } catch {
      throw new ConfigError(`skip: --lsn must be an LSN like 0/1A2B3C4, not ${JSON.stringify(opts.lsn)}`, { key: 'lsn' });
    }
    await checkControlPrivileges(config, 'skip', { source: false });
    await migrateTarget(config.target, `pgsub_${config.subscription}_cli`);
    const control = await withMaintenance(config, async (sql) => {
      const skip = await requestSkip(sql, config.subscription, lsn);
      // A running service takes the skip at its next remote transaction.
      await sql.notify(notifyChannel(config.subscription), 'skip');
      return skip;
    });
    process.stdout.write(
      control.errorLsn === lsn
        ? `subscription ${config.subscription} will skip remote transaction ${control.errorXid} (finish LSN ${formatLsn(lsn)}) at its next attempt\n`
        : `subscription ${config.subscription} will skip the remote transaction finishing at ${formatLsn(lsn)} when it arrives\n`,
    );
  });

program
  .command('enable')
  .description('resume a subscription disabled after an apply error (disable_on_error)')
  .option('-c, --config <file>', 'YAML or JSON config file')
  .action(async (opts: { config?: string }) => {
    const config = loadConfig({ file: opts.config });
    await checkControlPrivileges(config, 'enable', { source: false });
    await migrateTarget(config.target, `pgsub_${config.subscription}_cli`);
    const was = await withMaintenance(config, (sql) => enableSubscription(sql, config.subscription));
    process.stdout.write(was ? `subscription ${config.subscription} enabled\n` : `subscription ${config.subscription} was already enabled\n`);
  });

program
  .command('drop')
  .description("drop the subscription like DROP SUBSCRIPTION: the publisher's slot, pgsub's rows and replication origin in the target, spool files")
  .option('-c, --config <file>', 'YAML or JSON config file')
  .option('--keep-slot', 'leave the replication slot on the publisher (like slot_name = NONE)')
  .action(async (opts: { config?: string; keepSlot?: boolean }) => {
    const config = loadConfig({ file: opts.config });
    const { dropSubscription } = await import('./drop.js');
    const report = await dropSubscription(config, { keepSlot: Boolean(opts.keepSlot) });
    process.stdout.write(
      `subscription ${config.subscription} dropped: slot ${config.slotName} ${report.slot}, ${report.rows} row(s) of pgsub's schema deleted, replication origin ${report.origin}, ${report.spoolFiles} spool file(s) removed\n`,
    );
    if (report.preparedLeft.length > 0)
      process.stdout.write(`left in place: transactions prepared on the target ${report.preparedLeft.join(', ')} (COMMIT PREPARED or ROLLBACK PREPARED them)\n`);
  });

registerMigrationCommands(program);
registerVerifyCommand(program);

program
  .command('demo')
  .description(
    'a whole migration on embedded servers: an older publisher with an application writing throughout, preflight, schema copy, initial copy, streaming, the fenced cutover, and a final comparison',
  )
  .option('--publisher <major>', 'publisher major version', '14')
  .option('--target <major>', 'target major version', '18')
  .option('--transactions <n>', 'transactions the application commits before the cutover', '5000')
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

/** The running service as a scrape sees it (service/metrics.ts). */
function metricsSource(runner: Runner, config: Config): MetricsSource {
  return {
    progress: () => runner.current()?.progress ?? null,
    counters: runner.counters,
    sync: runner.sync,
    copies: () => new Map([...runner.launcher.progress].map(([k, v]) => [k, v])),
    spoolBytes: () => runner.current()?.spoolBytes() ?? null,
    streaming: () => runner.current() !== null,
    slot: () => runner.slotHealth(),
    errors: () => ({ apply: runner.applyErrors(), syncTable: runner.launcher.syncErrors, syncSeq: runner.sequenceSyncErrors() }),
    build: { version: packageVersion() },
    info: { subscription: config.subscription, slot: config.slotName },
    lastVerify: () => runner.lastVerify(),
  };
}

async function withSource<T>(config: Config, fn: (replication: ReplicationConnection) => Promise<T>): Promise<T> {
  const replication = await ReplicationConnection.open(config.source, `pgsub_${config.subscription}_cli`);
  try {
    return await fn(replication);
  } finally {
    await replication.close();
  }
}

async function withMaintenance<T>(config: Config, fn: (sql: Sql) => Promise<T>): Promise<T> {
  const sql = openMaintenance(config.target, `pgsub_${config.subscription}_cli`);
  try {
    return await fn(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}

// A reader that went away (`pgsub status | head -1`) is not an error: the rest of the
// output is dropped (the stream is closed after the first EPIPE) and the command ends
// with its own exit code, without a stack trace.
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code !== 'EPIPE') throw err;
});

/** No top-level await: the bundle is a CommonJS script, for V8's code cache (scripts/bundle.mjs). */
async function main(): Promise<void> {
  try {
    await program.parseAsync(process.argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      // commander has printed the message and the usage on stderr; --help and --version
      // end here too, with exit code 0. Anything else is a usage error: exit 2, like a
      // configuration error.
      process.exitCode = err.exitCode === 0 ? 0 : 2;
    } else if (err instanceof PgsubError) {
      process.stderr.write(`pgsub: ${err.code}: ${err.message}\n`);
      process.exitCode = 2;
    } else {
      throw err;
    }
  }
}

let finished = false;
void main().finally(() => {
  finished = true;
});
// As Node ends an unsettled top-level await (exit 13): the event loop emptied while a command
// still waited for something. Not exit 0, which a service manager takes for a clean stop.
process.on('exit', (code) => {
  if (finished || code !== 0) return;
  process.stderr.write('pgsub: the command ended without finishing (nothing left to wait for)\n');
  process.exitCode = 13;
});
