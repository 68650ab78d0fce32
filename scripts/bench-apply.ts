/**
 * `npm run bench`: how fast pgsub works off a replication backlog, against PostgreSQL's
 * native subscriber (CREATE SUBSCRIPTION), in the same run, on the same servers and
 * versions: PostgreSQL 18 → 18, and a cross-version pair (16 → 18 by default).
 *
 *   npm run bench                                      # full run: W1-W4, 3 repetitions, 18-18 and 16-18
 *   npm run bench -- --scale 0.05 --repeat 1           # a quick look (every count × 0.05)
 *   npm run bench -- --pair 18-18,14-18 --cross-repeat 1   # another cross-version pair, once
 *   npm run bench -- --workloads W1,W4 --contestants pgsub --pair 18-18
 *   npm run bench -- --workloads W3 --modes parallel          # one streaming mode of W3
 *   npm run bench -- --pgsub-env PGSUB_MAX_IN_FLIGHT=5000   # any pgsub setting, repeatable
 *   npm run bench -- --contestants pgsub,pgsub-lanes,native --lanes 2   # also pgsub with apply_workers = 2
 *   npm run bench -- --contestants pgsub,pgsub-metrics,native --workloads W1,W2   # the metrics endpoint's cost
 *   npm run bench -- --baseline bac382c --workloads W1,W2,W4 --scale 0.1   # also an earlier commit, as pgsub-base
 *   npm run bench -- --contestants pgsub,native,floor    # also the decoding floor of each round's backlog
 *
 * Workloads (scripts/bench-apply-workloads.ts): W1 1,000,000 rows inserted in
 * transactions of 10,000; W2 pgbench's TPC-B-like transaction, 100,000 from 4 clients;
 * W3 one transaction updating 1,000,000 rows, measured with streaming on and with
 * streaming parallel; W4 100,000 single-row transactions. --scale shrinks the counts,
 * and W3's logical_decoding_work_mem (64MB, the default) with them, so that W3 is still
 * streamed.
 * W1m and W2m are W1 and W2 under a `mapping:` (each table retargeted, one column renamed,
 * one computed column; bench-apply-workloads.ts mappedVariants), pgsub only (native has no
 * mapping); the goals print each one's time against its base workload's in the same run
 * (--workloads W1,W1m to run just that pair).
 *
 * One round = one workload × streaming mode × repetition, for every contestant:
 *   1. The publisher's tables are emptied and refilled with the workload's starting
 *      rows; each contestant gets a fresh database on the target with the same tables
 *      and rows (deterministic SQL, no copy).
 *   2. Each contestant's slot is created before the backlog. pgsub: `pgsub run`
 *      (copy_data false, binary true, streaming <mode>) is started until it logs
 *      'streaming started' — which creates its slot and its progress row — and stopped;
 *      a mode its config refuses (exit 2, PGSUB_NOT_IMPLEMENTED) is recorded as refused.
 *      native: CREATE SUBSCRIPTION … WITH (enabled = false, copy_data = false,
 *      binary = true, streaming = <mode>), synchronous_commit left at its default (off).
 *   3. CHECKPOINT; the backlog runs on the publisher while nobody consumes the slots;
 *      then one marker row is inserted (a table in every publication) and
 *      pg_current_wal_lsn() is the end LSN (a logical message written after it, in the
 *      source database, makes sure the walsenders have something to decode beyond it,
 *      and ends the floor's read).
 *   4. The contestants, one after the other (the order alternates between repetitions,
 *      so that neither always finds the WAL in the page cache): after waiting up to
 *      --quiet-seconds for a quiet machine, the subscriber is started (pgsub: spawn;
 *      native: ALTER SUBSCRIPTION … ENABLE) and timed until its slot's
 *      confirmed_flush_lsn ≥ the end LSN and its target has the marker row, so it has
 *      applied everything before it (the slot alone does not say so: native confirms a
 *      transaction streamed with streaming = on before it has applied it). Then every
 *      workload table's checksum on the target must equal the publisher's (count + md5
 *      of the sorted row md5s; if it does not yet, the time is when it does).
 * Measured meanwhile (scripts/bench-lib.ts): CPU seconds of the publisher and the
 * target clusters (exact, from /proc), of the walsender serving the slot (its
 * pg_replication_slots.active_pid, whole life: the decoding floor both contestants
 * share) and its busy share (CPU / the measured time: below ~90% the subscriber leaves
 * the decoding floor waiting — or the walsender waits for a core: its schedstat run delay
 * is printed as "core wait"), of every target backend in the contestant's database
 * (pg_stat_activity, sampled: pgsub's apply, lane, flush and helper connections, native's
 * apply and parallel workers), of pgsub (all its threads); pgsub's peak RSS (VmHWM), and
 * where its apply loop waited (its 'apply loop stopped' log line, src/apply/run/loop-times.ts:
 * the receiver on the socket and on a full queue, the applier on an empty queue, on the
 * target's results and on commits; pgsub is stopped right after the clock for it).
 * Slots, subscriptions and databases are dropped after each round.
 *
 * --baseline <commit>: that commit's pgsub (git archive of bin/, src/, migrations/, built
 * like the working tree's) runs as contestant pgsub-base in the same rounds, so a change's
 * cost or gain is a ratio in one run, on the same backlogs.
 *
 * Duration: the full default run (2 pairs × 3 repetitions × 5 rounds) takes about 35
 * minutes on a 2-core machine with today's pgsub: one repetition of all workloads is
 * about 6 minutes, of which pgsub applying is about 2.5 (W2 alone ~50 s, W4 ~50 s),
 * native about 0.5, and the rest generating backlogs and starting rows, checksums,
 * slots and databases. Waiting for a quiet machine adds up to 30 s per measurement on
 * a busy one (--quiet-seconds). --scale, --repeat, --cross-repeat, --workloads and
 * --pair make it shorter; a measurement exceeding --timeout-minutes (default 20) is
 * recorded as failed and the run goes on.
 *
 * pgsub runs from a copy of bin/, src/ and migrations/ taken at startup and compiled
 * with tsc, as an installed pgsub runs (--tsx: the TypeScript through tsx; --live: the
 * working tree as it is). Output: a table on stdout (min and median seconds over the
 * repetitions, rows/s at the median, native/pgsub time ratio = pgsub's speedup, peak
 * RSS, walsender / pgsub / target CPU seconds), the issue's goals as met / not met, and
 * bench-results/apply-<timestamp>.json. Nothing is asserted about speed.
 *
 * For scripts/bench-scale.ts, which runs this one as a child: --rss-timeline adds pgsub's
 * VmRSS once a second over each measurement to the JSON (rssTimelineMB, [seconds, MB]),
 * and --pgsub-dir <dir> runs the copy of pgsub that the parent made instead of making one.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type pg from 'pg';
import { installedMajors, startCluster, stopAllClusters, tableChecksum, type Cluster, type TableChecksum } from '../test/harness/index.js';
import { replicationOriginName } from '../src/origin/replorigin.js';
import { readToEndMessage } from './bench-floor-read.js';
import { WORKLOAD_IDS, runBacklog, workloads, type Mode, type Workload, type WorkloadId } from './bench-apply-workloads.js';
import {
  benchClient,
  CpuSampler,
  foreignCores,
  formatTable,
  headerText,
  lsnValue,
  median,
  MemorySampler,
  min,
  parsePgsubEnv,
  pollUntil,
  postmasterPid,
  preparedPgsub,
  round,
  sleep,
  slotState,
  snapshotPgsub,
  spawnPgsub,
  waitForQuiet,
  type CpuReport,
  type PgsubBuild,
  type WatchedPgsub,
  writeBenchResult,
} from './bench-lib.js';

const SOURCE_DB = 'bench';
/**
 * pgsub-lanes: pgsub with apply_workers = --lanes; pgsub-metrics: pgsub with the metrics
 * endpoint on, scraped every second while it applies (both opt-in: --contestants …).
 * floor: the decoding floor in the same round (scripts/bench-floor-read.ts's reader): a slot
 * of its own read from START_REPLICATION to the end of the backlog, every message dropped.
 */
const CONTESTANTS = ['pgsub', 'native', 'pgsub-lanes', 'pgsub-metrics', 'pgsub-base', 'floor'] as const;
const SCRAPE_EVERY_MS = 1000;
type Kind = (typeof CONTESTANTS)[number];
const isPgsub = (kind: Kind) => kind.startsWith('pgsub');
/**
 * Issue 27's goals: pgsub's speedup over native (time ratio; best mode against best mode,
 * W3 with streaming = parallel on both sides), the walsender ≥ 90% busy under pgsub (W1,
 * W2, W4), pgsub within 1.1× the decoding floor (contestant floor), and its peak RSS.
 */
const SPEEDUP_GOALS: Partial<Record<WorkloadId, number>> = { W1: 1.3, W2: 1.3, W3: 1.3, W4: 1.3 };
const SPEEDUP_MODE: Partial<Record<WorkloadId, Mode>> = { W3: 'parallel' };
const WALSENDER_BUSY_GOAL = 0.9;
const FLOOR_GOAL = 1.1;
/** A mapped variant (W1m, W2m) against its base workload, pgsub's median time: goal within 10%. */
const MAPPED_GOAL = 1.1;
const RSS_GOAL_MB = 200;
const MIB_TO_MB = 1.048576;
/** How often the end is checked (slot, marker row): the resolution of every time measured, both contestants. */
const POLL_MS = 20;
/**
 * One row per round, inserted on the publisher after the backlog, in every workload's
 * publication: when a target has it, it has applied everything before it (both
 * subscribers commit in the publisher's commit order). The slot's confirmed_flush_lsn
 * alone is not enough: the native subscriber confirms the end of a transaction streamed
 * with streaming = on before it has applied it.
 */
const MARKER_TABLE = 'public.bench_marker';
const MARKER_DDL = `CREATE TABLE ${MARKER_TABLE} (round integer PRIMARY KEY)`;

const { values: opts } = parseArgs({
  options: {
    scale: { type: 'string', default: '1' },
    repeat: { type: 'string', default: '3' },
    'cross-repeat': { type: 'string' },
    workloads: { type: 'string', default: WORKLOAD_IDS.join(',') },
    modes: { type: 'string', default: '' },
    contestants: { type: 'string', default: 'pgsub,native' },
    lanes: { type: 'string', default: '2' },
    pair: { type: 'string', default: '18-18,16-18' },
    'pgsub-env': { type: 'string', multiple: true, default: [] },
    'timeout-minutes': { type: 'string', default: '20' },
    'quiet-seconds': { type: 'string', default: '30' },
    live: { type: 'boolean', default: false },
    tsx: { type: 'boolean', default: false },
    baseline: { type: 'string' },
    'rss-timeline': { type: 'boolean', default: false },
    'pgsub-dir': { type: 'string' },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  process.stdout.write(headerText(import.meta.url));
  process.exit(0);
}
const SCALE = Number(opts.scale);
if (!(SCALE > 0 && SCALE <= 10)) throw new Error(`--scale must be in (0, 10], not ${opts.scale}`);
const REPEAT = Number(opts.repeat);
if (!Number.isInteger(REPEAT) || REPEAT < 1) throw new Error(`--repeat must be a positive integer, not ${opts.repeat}`);
const CROSS_REPEAT = Number(opts['cross-repeat'] ?? opts.repeat);
if (!Number.isInteger(CROSS_REPEAT) || CROSS_REPEAT < 1) throw new Error(`--cross-repeat must be a positive integer, not ${opts['cross-repeat']}`);
/** --modes on,parallel: only these streaming modes of the workloads that have several (W3). */
const MODES = opts.modes
  .split(',')
  .map((m) => m.trim())
  .filter(Boolean) as Mode[];
for (const m of MODES) if (!['off', 'on', 'parallel'].includes(m)) throw new Error(`--modes: unknown ${m} (known: off, on, parallel)`);
const SELECTED = opts.workloads.split(',').map((w) => w.trim().toUpperCase().replace(/M$/, 'm')) as WorkloadId[];
for (const w of SELECTED) if (!WORKLOAD_IDS.includes(w)) throw new Error(`--workloads: unknown ${w} (known: ${WORKLOAD_IDS.join(', ')})`);
const KINDS = opts.contestants.split(',').map((c) => c.trim()) as Kind[];
if (opts.baseline && !KINDS.includes('pgsub-base')) KINDS.splice(1, 0, 'pgsub-base');
if (KINDS.includes('pgsub-base') && !opts.baseline) throw new Error('--contestants pgsub-base needs --baseline <commit>');
for (const c of KINDS) if (!CONTESTANTS.includes(c)) throw new Error(`--contestants: unknown ${c} (known: ${CONTESTANTS.join(', ')})`);
const PAIRS = opts.pair.split(',').map((p) => {
  const m = /^(\d+)-(\d+)$/.exec(p.trim());
  if (!m) throw new Error(`--pair wants PUBLISHER-TARGET majors like 18-18 or 16-18, not ${p}`);
  for (const major of [Number(m[1]), Number(m[2])])
    if (!installedMajors().includes(major)) throw new Error(`--pair ${p}: PostgreSQL ${major} is not installed (installed: ${installedMajors().join(', ')})`);
  const [publisher, target] = [Number(m[1]), Number(m[2])];
  // --cross-repeat: a cross-version pair may be repeated less, for a shorter run.
  return { name: `${publisher}-${target}`, publisher, target, repeat: publisher === target ? REPEAT : CROSS_REPEAT };
});
const PGSUB_EXTRA_ENV = parsePgsubEnv(opts['pgsub-env']);
const TIMEOUT_MS = Number(opts['timeout-minutes']) * 60_000;
const QUIET_MS = Number(opts['quiet-seconds']) * 1000;
const WORKLOADS = workloads(SCALE).filter((w) => SELECTED.includes(w.id));
/** Both servers of a pair. Large max_wal_size: no checkpoint forced by a backlog's WAL volume. */
const SERVER_SETTINGS = {
  shared_buffers: '128MB',
  max_wal_size: '4GB',
  checkpoint_timeout: '30min',
  // Per workload (ALTER SYSTEM before each round); this is the default.
  logical_decoding_work_mem: '64MB',
};

const out = (line = '') => process.stdout.write(`${line}\n`);
const log = (line: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}\n`);

// ---------------------------------------------------------------------------------------
// Servers

interface Servers {
  pair: (typeof PAIRS)[number];
  pub: Cluster;
  tgt: Cluster;
  pubMonitor: pg.Client;
  tgtMonitor: pg.Client;
  /** Publisher sessions in the source database: the backlog's clients. */
  work: pg.Client[];
  versions: { publisher: string; target: string };
}

async function startServers(pair: (typeof PAIRS)[number]): Promise<Servers> {
  const [pub, tgt] = await Promise.all([
    startCluster({ major: pair.publisher, name: `bench-apply-pub${pair.publisher}`, settings: SERVER_SETTINGS }),
    startCluster({ major: pair.target, name: `bench-apply-tgt${pair.target}`, settings: SERVER_SETTINGS }),
  ]);
  await pub.createDatabase(SOURCE_DB);
  await pub.query(MARKER_DDL, [], SOURCE_DB);
  const published = new Set<string>();
  for (const w of WORKLOADS) {
    // A mapped variant shares its base workload's publication and tables.
    if (published.has(w.publication)) continue;
    published.add(w.publication);
    await pub.query(`${w.ddl}; ${w.publisherDdl}; CREATE PUBLICATION ${w.publication} FOR TABLE ${[...w.tables, MARKER_TABLE].join(', ')}`, [], SOURCE_DB);
  }
  const work = await Promise.all(Array.from({ length: Math.max(...WORKLOADS.map((w) => w.backlog.length)) }, () => benchClient(pub.url(SOURCE_DB))));
  const version = async (c: Cluster) => (await c.query<{ v: string }>('SELECT version() AS v'))[0]!.v;
  return {
    pair,
    pub,
    tgt,
    pubMonitor: await benchClient(pub.url()),
    tgtMonitor: await benchClient(tgt.url()),
    work,
    versions: { publisher: await version(pub), target: await version(tgt) },
  };
}

async function stopServers(s: Servers): Promise<void> {
  for (const c of [s.pubMonitor, s.tgtMonitor, ...s.work]) await c.end().catch(() => {});
  await Promise.all([s.pub.stop(), s.tgt.stop()]);
}

// ---------------------------------------------------------------------------------------
// Contestants: prepared (slot created) before the backlog, started when measured

interface Entrant {
  kind: Kind;
  db: string;
  slot: string;
  /** pgsub's config refused the mode: nothing was created. */
  refused?: string;
  /** Starts applying; returns pgsub's pid (its memory and CPU are watched). */
  start(): Promise<number | null>;
  /** Throws when the subscriber has visibly failed, so that waiting stops early. */
  check(): Promise<void>;
  /** For the JSON: pgsub's warnings and last log messages. */
  details?(): Record<string, unknown>;
  /** After the clock: stops pgsub and returns where its apply loop waited (seconds, summed over its sessions). */
  finish?(): Promise<Record<string, number> | undefined>;
  cleanup(): Promise<void>;
}

async function createTargetDb(s: Servers, w: Workload, db: string): Promise<void> {
  await s.tgt.createDatabase(db);
  await s.tgt.query(`${w.mapped?.targetDdl ?? w.ddl}; ${MARKER_DDL}; ${w.initialRows}; ANALYZE`, [], db);
}

async function dropSlot(s: Servers, slot: string): Promise<void> {
  await pollUntil(async () => {
    const st = await slotState(s.pubMonitor, slot);
    if (st && !st.active) await s.pubMonitor.query('SELECT pg_catalog.pg_drop_replication_slot($1)', [slot]);
    return !st?.active;
  }, 30_000);
}

/** The working tree's pgsub, and --baseline's (contestant pgsub-base). */
interface Builds {
  current: PgsubBuild;
  base: PgsubBuild | null;
}

/** The fields of pgsub's 'apply loop stopped' lines (src/apply/run/loop-times.ts), summed; undefined when it logs none (an older pgsub). */
function loopWaits(logs: Record<string, unknown>[]): Record<string, number> | undefined {
  const lines = logs.filter((l) => l.msg === 'apply loop stopped');
  if (lines.length === 0) return undefined;
  const sum: Record<string, number> = {};
  for (const l of lines) for (const [k, v] of Object.entries(l)) if (typeof v === 'number' && k !== 'level' && k !== 'time' && k !== 'pid') sum[k] = round((sum[k] ?? 0) + v, 3);
  return sum;
}

/** `name`'s target database exists (createTargetDb); returns with the slot created. */
async function preparePgsub(s: Servers, w: Workload, mode: Mode, name: string, builds: Builds, kind: Kind): Promise<Entrant> {
  const build = kind === 'pgsub-base' ? builds.base! : builds.current;
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'pgsub-bench-apply-'));
  const env = {
    PGSUB_SOURCE: s.pub.url(SOURCE_DB),
    PGSUB_TARGET: s.tgt.url(name),
    PGSUB_PUBLICATION: w.publication,
    PGSUB_SUBSCRIPTION: name,
    PGSUB_COPY_DATA: 'false',
    PGSUB_BINARY: 'true',
    // Like native's default: asynchronous apply commits, feedback after the target's WAL flush.
    PGSUB_SYNCHRONOUS_COMMIT: 'off',
    PGSUB_STREAMING: mode,
    PGSUB_STATE_DIR: stateDir,
    PGSUB_LOG_LEVEL: 'info',
    ...PGSUB_EXTRA_ENV,
    ...(kind === 'pgsub-lanes' ? { PGSUB_APPLY_WORKERS: opts.lanes } : {}),
    ...(w.mapped ? { PGSUB_MAPPING: JSON.stringify(w.mapped.mapping) } : {}),
    ...(kind === 'pgsub-metrics' ? { PGSUB_METRICS_LISTEN: '127.0.0.1:0' } : {}),
  };
  let lastScrape = 0;
  const scrape = () => {
    if (kind !== 'pgsub-metrics' || !child || Date.now() - lastScrape < SCRAPE_EVERY_MS) return;
    const listening = child.logs().find((l) => l.msg === 'metrics endpoint listening');
    if (!listening) return;
    lastScrape = Date.now();
    void fetch(`http://${String(listening.listen)}/metrics`).then(
      (r) => r.text(),
      () => '',
    );
  };
  let child: WatchedPgsub | null = null;
  const cleanup = async () => {
    await child?.stop();
    await dropSlot(s, name);
    rmSync(stateDir, { recursive: true, force: true });
    await s.tgt.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    // Replication origins are cluster-wide and outlive the database (as `pgsub drop` does):
    // each one keeps a replication state slot, and once they are all taken the native
    // subscriber of a later round cannot start ("could not find free replication state slot").
    await s.tgt.query(`SELECT pg_catalog.pg_replication_origin_drop(roname) FROM pg_catalog.pg_replication_origin WHERE roname = $1`, [replicationOriginName(name)]);
  };
  // First start: creates the slot (and pgsub's progress row) before the backlog exists.
  const first = spawnPgsub(build, env);
  try {
    await pollUntil(async () => {
      if (first.logs().some((l) => l.msg === 'streaming started')) return true;
      if (first.exitCode() !== null) throw new Error('exited');
      return false;
    }, 60_000);
    await first.stop();
  } catch (err) {
    await first.stop();
    await cleanup();
    const refusal = /^pgsub: PGSUB_NOT_IMPLEMENTED: (.*)$/m.exec(first.output());
    if (first.exitCode() === 2 && refusal) return { kind, db: name, slot: name, refused: refusal[1]!, start: async () => null, check: async () => {}, cleanup: async () => {} };
    throw new Error(`pgsub (streaming ${mode}) did not start (${(err as Error).message}, exit ${first.exitCode()}):\n${first.output().slice(-4000)}`);
  }
  return {
    kind,
    db: name,
    slot: name,
    async start() {
      child = spawnPgsub(build, env);
      return child.pid;
    },
    async check() {
      if (child && child.exitCode() !== null) throw new Error(`pgsub exited (${child.exitCode()}):\n${child.output().slice(-4000)}`);
      scrape();
    },
    async finish() {
      await child?.stop();
      return loopWaits(child?.logs() ?? []);
    },
    details() {
      const messages = (child?.logs() ?? []).filter((l) => l.msg !== undefined);
      const line = (l: Record<string, unknown>) => `${round((Number(l.time) - child!.startedAt) / 1000)} ${String(l.level)} ${String(l.msg)}`;
      return {
        warnings: messages
          .filter((l) => Number(l.level) >= 40)
          .map(line)
          .slice(0, 20),
        log: messages.map(line).slice(-20),
      };
    },
    cleanup,
  };
}

async function prepareNative(s: Servers, w: Workload, mode: Mode, name: string): Promise<Entrant> {
  const conninfo = `host=${s.pub.host} port=${s.pub.port} user=${s.pub.user} dbname=${SOURCE_DB}`;
  const tgtDb = await benchClient(s.tgt.url(name));
  const cleanup = async () => {
    await tgtDb.query(`DROP SUBSCRIPTION IF EXISTS ${name}`).catch((err: Error) => log(`DROP SUBSCRIPTION ${name}: ${err.message}`));
    await tgtDb.end().catch(() => {});
    await dropSlot(s, name);
    await s.tgt.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  };
  try {
    // Creates the slot now; the apply worker starts with ENABLE.
    await tgtDb.query(
      `CREATE SUBSCRIPTION ${name} CONNECTION '${conninfo}' PUBLICATION ${w.publication} WITH (enabled = false, copy_data = false, binary = true, streaming = ${mode})`,
    );
  } catch (err) {
    await cleanup();
    throw err;
  }
  let lastCheck = 0;
  return {
    kind: 'native',
    db: name,
    slot: name,
    async start() {
      await tgtDb.query(`ALTER SUBSCRIPTION ${name} ENABLE`);
      return null;
    },
    async check() {
      // Once a second is soon enough to stop waiting, and keeps the target's CPU for applying.
      if (Date.now() - lastCheck < 1000) return;
      lastCheck = Date.now();
      const [st] = (await s.tgtMonitor.query<{ n: string }>('SELECT apply_error_count::text AS n FROM pg_catalog.pg_stat_subscription_stats WHERE subname = $1', [name])).rows;
      if (st && Number(st.n) > 0) throw new Error(`native subscription ${name} reports ${st.n} apply error(s); see the target's server log`);
    },
    cleanup,
  };
}

/** The floor's slot, created before the backlog like the subscribers'. */
async function prepareFloor(s: Servers, slot: string): Promise<Entrant> {
  await s.pub.query(`SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, [slot], SOURCE_DB);
  const none = async () => {
    throw new Error('the floor is measured by measureFloor');
  };
  return { kind: 'floor', db: '', slot, start: none, check: none, cleanup: () => dropSlot(s, slot) };
}

/**
 * The decoding floor of this round's backlog: its slot read from START_REPLICATION until the
 * logical message written after the backlog, with the options pgsub streams with (binary,
 * this round's streaming mode), every message dropped (scripts/bench-floor-read.ts).
 */
async function measureFloor(s: Servers, w: Workload, mode: Mode, slot: string): Promise<Omit<RunResult, 'pair' | 'workload' | 'mode' | 'contestant' | 'rep'>> {
  const quiet = QUIET_MS > 0 ? await waitForQuiet(0.3, 2000, QUIET_MS) : { waitedSeconds: 0 };
  const cpu = new CpuSampler({ publisher: postmasterPid(s.pub.dataDir) });
  cpu.start();
  const { seconds } = await readToEndMessage(
    s.pub.url(SOURCE_DB),
    slot,
    w.publication,
    mode,
    async () => (await slotState(s.pubMonitor, slot))?.activePid ?? null,
    (pid) => cpu.addProcess('walsender', pid, true),
  );
  const report = cpu.stop();
  const walsenderCpu = report.groups.walsender;
  return {
    seconds: round(seconds),
    rowsPerSecond: Math.round(w.rowChanges / seconds),
    ...(walsenderCpu !== undefined ? { walsenderCpu, walsenderBusy: round(walsenderCpu / seconds, 3) } : {}),
    ...(report.runDelay.walsender !== undefined ? { walsenderCoreWait: report.runDelay.walsender } : {}),
    publisherCpu: report.groups.publisher,
    quietWaitSeconds: quiet.waitedSeconds,
    foreignCores: foreignCores(report),
  };
}

// ---------------------------------------------------------------------------------------
// One round: backlog once, then each contestant works it off

interface Backlog {
  pair: string;
  workload: WorkloadId;
  mode: Mode;
  rep: number;
  seconds: number;
  walBytes: number;
  endLsn: string;
}

interface RunResult {
  pair: string;
  workload: WorkloadId;
  mode: Mode;
  contestant: Kind;
  rep: number;
  refused?: string;
  error?: string;
  /** Subscriber started → slot confirmed the end LSN (and the target equal to the source). */
  seconds?: number;
  /** When the slot had confirmed the end LSN, and when the target had the round's marker row (seconds since start). */
  confirmedSeconds?: number;
  /** When a walsender had the slot (START_REPLICATION; seconds since start): the subscriber's start, the rest is the catch-up. */
  streamSeconds?: number;
  markerSeconds?: number;
  /** The checksums were not equal yet when both had happened; `seconds` is when they were. */
  checksumLate?: boolean;
  rowsPerSecond?: number;
  peakRssMB?: number;
  /** --rss-timeline: pgsub's VmRSS once a second since its start, [seconds, MB]. */
  rssTimelineMB?: [number, number][];
  walsenderCpu?: number;
  /** Walsender CPU / measured seconds. */
  walsenderBusy?: number;
  /** Seconds the walsender was runnable but waited for a CPU (schedstat): its "not busy" that is not waiting for the subscriber. */
  walsenderCoreWait?: number;
  pgsubCpu?: number;
  /** pgsub's CPU per row change, µs. */
  pgsubUsPerChange?: number;
  /** Every backend of the contestant's target database (pg_stat_activity), summed. */
  targetBackendsCpu?: number;
  targetCpu?: number;
  publisherCpu?: number;
  /** pgsub's apply loop waits (loop-times.ts). */
  waits?: Record<string, number>;
  quietWaitSeconds?: number;
  foreignCores?: number;
  /** pg_stat_replication_slots after the run: transactions and bytes decoded, streamed, spilled. */
  slotStats?: Record<string, number>;
  details?: Record<string, unknown>;
  cpu?: CpuReport;
}

let roundCounter = 0;

async function runRound(s: Servers, w: Workload, mode: Mode, rep: number, builds: Builds): Promise<{ backlog: Backlog; runs: RunResult[] }> {
  const n = ++roundCounter;
  // Native has no mapping: a mapped variant is pgsub's only.
  const kinds = w.mapped ? KINDS.filter(isPgsub) : KINDS;
  const order = rep % 2 === 1 ? kinds : [...kinds].reverse();
  // 1. Decoding memory, then starting rows, with no slot in existence (none of it is decoded).
  await s.pubMonitor.query(`ALTER SYSTEM SET logical_decoding_work_mem = '${w.decodingWorkMem}'`);
  await s.pubMonitor.query('SELECT pg_catalog.pg_reload_conf()');
  // New sessions (the walsenders to come) must see it; the reload is asynchronous.
  const settled = `SELECT pg_catalog.pg_size_bytes(current_setting('logical_decoding_work_mem')) = pg_catalog.pg_size_bytes('${w.decodingWorkMem}') AS ok`;
  await pollUntil(async () => (await s.pub.query<{ ok: boolean }>(settled))[0]!.ok, 10_000);
  const [work] = s.work;
  await work!.query(`${w.reset}; TRUNCATE ${MARKER_TABLE}`);
  if (w.initialRows) await work!.query(w.initialRows);
  await work!.query(`VACUUM ANALYZE ${w.tables.join(', ')}`);
  // 2. Targets and slots.
  const entrants: Entrant[] = [];
  const cleaned = new Set<Entrant>();
  const runs: RunResult[] = [];
  try {
    const name = (kind: Kind) => `bench_${n}_${kind.replace('-', '_')}`;
    await Promise.all(order.filter((kind) => kind !== 'floor').map((kind) => createTargetDb(s, w, name(kind))));
    for (const kind of order)
      entrants.push(
        kind === 'floor'
          ? await prepareFloor(s, name(kind))
          : isPgsub(kind)
            ? await preparePgsub(s, w, mode, name(kind), builds, kind)
            : await prepareNative(s, w, mode, name(kind)),
      );
    // 3. The backlog, nobody consuming.
    await Promise.all([s.pub.query('CHECKPOINT'), s.tgt.query('CHECKPOINT')]);
    const startLsn = await currentLsn(s.pubMonitor);
    const t0 = performance.now();
    await runBacklog(w, s.work);
    const seconds = round((performance.now() - t0) / 1000);
    await work!.query(`INSERT INTO ${MARKER_TABLE} VALUES (${n})`);
    const endLsnText = (await s.pubMonitor.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn')).rows[0]!.lsn;
    const endLsn = lsnValue(endLsnText);
    await work!.query(`SELECT pg_catalog.pg_logical_emit_message(false, 'bench', 'end of backlog')`);
    const backlog: Backlog = { pair: s.pair.name, workload: w.id, mode, rep, seconds, walBytes: Number(endLsn - startLsn), endLsn: endLsnText };
    log(`${s.pair.name} ${w.id} ${mode} rep ${rep}: backlog of ${(backlog.walBytes / 1e6).toFixed(0)} MB WAL generated in ${seconds} s`);
    const source = await Promise.all(w.tables.map((t) => tableChecksum(s.pub, SOURCE_DB, t)));
    // 4. Each contestant in turn.
    for (const e of entrants) {
      const base = { pair: s.pair.name, workload: w.id, mode, contestant: e.kind, rep };
      if (e.refused) {
        log(`  ${e.kind}: refused streaming ${mode} (${e.refused})`);
        runs.push({ ...base, refused: e.refused });
        continue;
      }
      try {
        if (e.kind === 'floor') {
          const r = await measureFloor(s, w, mode, e.slot);
          runs.push({ ...base, ...r });
          log(`  floor: ${r.seconds} s, walsender CPU ${r.walsenderCpu} s (${pct(r.walsenderBusy)} busy, ${r.walsenderCoreWait ?? '-'} s waiting for a core)`);
          cleaned.add(e);
          await e.cleanup();
          continue;
        }
        const r = await measure(s, w, e, n, endLsn, source);
        runs.push({ ...base, ...r });
        log(
          `  ${e.kind}: ${r.seconds} s (streaming after ${r.streamSeconds ?? '-'} s, applied ${r.markerSeconds} s, confirmed ${r.confirmedSeconds} s${r.checksumLate ? ', checksums late' : ''}), ${fmtInt(r.rowsPerSecond!)} rows/s` +
            (r.peakRssMB !== undefined ? `, peak RSS ${r.peakRssMB} MB` : '') +
            `, CPU walsender ${r.walsenderCpu} s (${pct(r.walsenderBusy)} busy, ${r.walsenderCoreWait ?? '-'} s waiting for a core), target ${r.targetCpu} s (its backends ${r.targetBackendsCpu} s)` +
            (r.pgsubCpu !== undefined ? `, pgsub ${r.pgsubCpu} s (${r.pgsubUsPerChange} µs/change)` : '') +
            (r.waits ? `, pgsub waits ${fmtWaits(r.waits)}` : '') +
            (r.slotStats?.stream_txns ? `, ${r.slotStats.stream_txns} streamed txn(s)` : '') +
            (r.slotStats?.spill_txns ? `, ${r.slotStats.spill_txns} spilled txn(s)` : '') +
            (r.foreignCores! > 0.25 ? `; other processes used ${r.foreignCores} cores meanwhile` : ''),
        );
      } catch (err) {
        const message = (err as Error).message;
        log(`  ${e.kind}: FAILED: ${message.slice(0, 2000)}`);
        runs.push({ ...base, error: message.slice(0, 4000) });
      }
      // Its walsender and workers stop now, not while the next contestant is measured.
      cleaned.add(e);
      await e.cleanup();
    }
    return { backlog, runs };
  } finally {
    for (const e of entrants) if (!cleaned.has(e)) await e.cleanup().catch((err: Error) => log(`cleanup of ${e.db}: ${err.message}`));
  }
}

async function currentLsn(c: pg.Client): Promise<bigint> {
  return lsnValue((await c.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn')).rows[0]!.lsn);
}

async function measure(
  s: Servers,
  w: Workload,
  e: Entrant,
  marker: number,
  endLsn: bigint,
  source: TableChecksum[],
): Promise<Omit<RunResult, 'pair' | 'workload' | 'mode' | 'contestant' | 'rep'>> {
  const quiet = QUIET_MS > 0 ? await waitForQuiet(0.3, 2000, QUIET_MS) : { waitedSeconds: 0 };
  const cpu = new CpuSampler({ publisher: postmasterPid(s.pub.dataDir), target: postmasterPid(s.tgt.dataDir) });
  let memory: MemorySampler | null = null;
  let stopped: CpuReport | null = null;
  const target = await benchClient(s.tgt.url(e.db));
  try {
    cpu.start();
    const t0 = performance.now();
    const pid = await e.start();
    if (pid !== null) {
      memory = new MemorySampler(pid, 200, opts['rss-timeline'] ? 1000 : undefined);
      cpu.addProcess('pgsub', pid, true);
    }
    let walsender: number | null = null;
    let lastReport = Date.now();
    let lastBackendScan = 0;
    const backends = new Set<number>();
    // Every backend in the contestant's database but the bench's own: pgsub's connections, native's workers.
    const scanBackends = async () => {
      if (Date.now() - lastBackendScan < 250) return;
      lastBackendScan = Date.now();
      const rows = (
        await s.tgtMonitor.query<{ pid: number }>(
          `SELECT pid FROM pg_catalog.pg_stat_activity WHERE datname = $1 AND pid <> pg_catalog.pg_backend_pid() AND application_name IS DISTINCT FROM 'bench'`,
          [e.db],
        )
      ).rows;
      for (const { pid } of rows) {
        if (backends.has(pid)) continue;
        backends.add(pid);
        cpu.addProcess(`backend:${pid}`, pid, true);
      }
    };
    let tConfirmed = 0;
    let tMarker = 0;
    let tStream = 0;
    await pollUntil(
      async () => {
        await e.check();
        await scanBackends();
        if (!tConfirmed) {
          const st = await slotState(s.pubMonitor, e.slot);
          if (walsender === null && st?.activePid) {
            walsender = st.activePid;
            tStream = performance.now();
            cpu.addProcess('walsender', walsender, true);
          }
          if (Date.now() - lastReport > 30_000) {
            lastReport = Date.now();
            log(`  … ${e.kind} ${((performance.now() - t0) / 1000).toFixed(0)} s, slot at ${st?.confirmed === null || !st ? '-' : fmtLsn(st.confirmed)} of ${fmtLsn(endLsn)}`);
          }
          if (st?.confirmed != null && st.confirmed >= endLsn) tConfirmed = performance.now();
        }
        if (!tMarker && (await target.query(`SELECT 1 FROM ${MARKER_TABLE} WHERE round = $1`, [marker])).rowCount) tMarker = performance.now();
        return tConfirmed > 0 && tMarker > 0;
      },
      TIMEOUT_MS,
      POLL_MS,
    );
    let tDone = Math.max(tConfirmed, tMarker);
    const peak = memory?.finish();
    memory = null;
    await sleep(200); // let the postmasters reap ended workers: their CPU counts
    stopped = cpu.stop();
    const report = stopped;
    // What decoding did (streamed or spilled transactions): proof of the mode, and the same for both contestants.
    const stats = (
      await s.pubMonitor.query<Record<string, string | number | null>>(
        'SELECT total_txns, total_bytes, stream_txns, stream_bytes, spill_txns, spill_bytes FROM pg_catalog.pg_stat_replication_slots WHERE slot_name = $1',
        [e.slot],
      )
    ).rows[0];
    const slotStats = stats && Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)]));
    // Equal to the source? Checked after the clock stopped, unless it is not yet.
    let late = false;
    for (;;) {
      const sums = await Promise.all(w.tables.map((t) => tableChecksum(s.tgt, e.db, t)));
      const diff = sums.filter((t, i) => t.rows !== source[i]!.rows || t.md5 !== source[i]!.md5);
      if (diff.length === 0) break;
      late = true;
      await e.check();
      if (performance.now() - t0 > TIMEOUT_MS)
        throw new Error(`target differs from the source: ${diff.map((t) => `${t.table} ${t.rows} rows vs ${source[w.tables.indexOf(t.table)]!.rows}`).join(', ')}`);
      await sleep(500);
      tDone = performance.now();
    }
    const seconds = round((tDone - t0) / 1000);
    // Stopped only now: the checksums above may still have needed it to apply.
    const waits = await e.finish?.();
    const backendsCpu = round(
      Object.entries(report.groups)
        .filter(([k]) => k.startsWith('backend:'))
        .reduce((sum, [, v]) => sum + v, 0),
    );
    for (const k of Object.keys(report.groups)) if (k.startsWith('backend:')) delete report.groups[k];
    return {
      seconds,
      confirmedSeconds: round((tConfirmed - t0) / 1000),
      ...(tStream ? { streamSeconds: round((tStream - t0) / 1000) } : {}),
      markerSeconds: round((tMarker - t0) / 1000),
      ...(late ? { checksumLate: true } : {}),
      rowsPerSecond: Math.round(w.rowChanges / seconds),
      ...(peak ? { peakRssMB: round(peak.peakRssMiB * MIB_TO_MB, 0) } : {}),
      ...(peak?.timeline ? { rssTimelineMB: peak.timeline.map(([t, mib]): [number, number] => [t, round(mib * MIB_TO_MB, 0)]) } : {}),
      walsenderCpu: report.groups.walsender,
      ...(report.groups.walsender !== undefined ? { walsenderBusy: round(report.groups.walsender / ((tDone - t0) / 1000), 3) } : {}),
      ...(report.runDelay.walsender !== undefined ? { walsenderCoreWait: report.runDelay.walsender } : {}),
      ...(report.groups.pgsub !== undefined ? { pgsubCpu: report.groups.pgsub, pgsubUsPerChange: round((report.groups.pgsub * 1e6) / w.rowChanges, 1) } : {}),
      targetBackendsCpu: backendsCpu,
      ...(waits ? { waits } : {}),
      targetCpu: report.groups.target,
      publisherCpu: report.groups.publisher,
      quietWaitSeconds: quiet.waitedSeconds,
      foreignCores: foreignCores(report),
      ...(slotStats ? { slotStats } : {}),
      ...(e.details ? { details: e.details() } : {}),
      cpu: report,
    };
  } finally {
    // After a failure: stop the samplers' timers, or they would keep this process alive.
    memory?.finish();
    if (!stopped) cpu.stop();
    await target.end().catch(() => {});
  }
}

// ---------------------------------------------------------------------------------------
// Report

interface Summary {
  pair: string;
  workload: WorkloadId;
  mode: Mode;
  contestant: Kind;
  runs: number;
  refused?: string;
  failed: number;
  minSeconds?: number;
  medianSeconds?: number;
  rowsPerSecond?: number;
  /** On pgsub's row: native's median / pgsub's median in the same mode. */
  speedup?: number;
  peakRssMB?: number;
  walsenderCpu?: number;
  walsenderBusy?: number;
  walsenderCoreWait?: number;
  streamSeconds?: number;
  pgsubCpu?: number;
  pgsubUsPerChange?: number;
  targetBackendsCpu?: number;
  targetCpu?: number;
  /** Median of each of pgsub's apply loop waits. */
  waits?: Record<string, number>;
}

function summarize(runs: RunResult[]): Summary[] {
  const keys = [...new Set(runs.map((r) => `${r.pair}|${r.workload}|${r.mode}|${r.contestant}`))];
  const summaries = keys.map((key): Summary => {
    const [pair, workload, mode, contestant] = key.split('|') as [string, WorkloadId, Mode, Kind];
    const all = runs.filter((r) => `${r.pair}|${r.workload}|${r.mode}|${r.contestant}` === key);
    const ok = all.filter((r) => r.seconds !== undefined);
    const base: Summary = { pair, workload, mode, contestant, runs: ok.length, failed: all.filter((r) => r.error).length };
    if (all.some((r) => r.refused)) base.refused = all.find((r) => r.refused)!.refused;
    if (ok.length === 0) return base;
    const med = (f: (r: RunResult) => number | undefined) => {
      const xs = ok.map(f).filter((x): x is number => x !== undefined);
      return xs.length ? round(median(xs)) : undefined;
    };
    const medianSeconds = med((r) => r.seconds)!;
    const rows = WORKLOADS.find((w) => w.id === workload)!.rowChanges;
    return {
      ...base,
      minSeconds: round(min(ok.map((r) => r.seconds!))),
      medianSeconds,
      rowsPerSecond: Math.round(rows / medianSeconds),
      ...(isPgsub(contestant) ? { peakRssMB: Math.max(...ok.map((r) => r.peakRssMB ?? 0)) } : {}),
      walsenderCpu: med((r) => r.walsenderCpu),
      walsenderBusy: med((r) => r.walsenderBusy),
      walsenderCoreWait: med((r) => r.walsenderCoreWait),
      streamSeconds: med((r) => r.streamSeconds),
      pgsubCpu: med((r) => r.pgsubCpu),
      pgsubUsPerChange: med((r) => r.pgsubUsPerChange),
      targetBackendsCpu: med((r) => r.targetBackendsCpu),
      ...(ok.some((r) => r.waits) ? { waits: Object.fromEntries(WAIT_KEYS.map((k) => [k, med((r) => r.waits?.[k])!])) } : {}),
      targetCpu: med((r) => r.targetCpu),
    };
  });
  for (const p of summaries.filter((x) => isPgsub(x.contestant) && x.medianSeconds)) {
    const nat = summaries.find((x) => x.contestant === 'native' && x.pair === p.pair && x.workload === p.workload && x.mode === p.mode);
    if (nat?.medianSeconds) p.speedup = round(nat.medianSeconds / p.medianSeconds!);
  }
  return summaries;
}

/** The issue's goals per pair and workload: best mode against best mode, and the RSS bound. */
function goals(summaries: Summary[]): { text: string; met: boolean | null }[] {
  const lines: { text: string; met: boolean | null }[] = [];
  for (const pair of PAIRS) {
    for (const w of WORKLOADS) {
      const of = (kind: Kind) => summaries.filter((x) => x.pair === pair.name && x.workload === w.id && x.contestant === kind && x.medianSeconds);
      const best = (xs: Summary[]) => xs.reduce<Summary | null>((a, b) => (a === null || b.medianSeconds! < a.medianSeconds! ? b : a), null);
      const p = best(of('pgsub'));
      if (w.mapped) {
        const base = summaries.find((x) => x.pair === pair.name && x.workload === w.mapped!.base && x.contestant === 'pgsub' && x.mode === p?.mode && x.medianSeconds);
        if (p && base) {
          const ratio = round(p.medianSeconds! / base.medianSeconds!);
          lines.push({
            met: ratio <= MAPPED_GOAL,
            text: `${pair.name} ${w.id}: mapped ${p.medianSeconds} s / unmapped ${w.mapped.base} ${base.medianSeconds} s = ${ratio.toFixed(2)}× (goal ≤ ${MAPPED_GOAL}×)`,
          });
        } else lines.push({ met: null, text: `${pair.name} ${w.id}: mapped/unmapped not measured (run ${w.mapped.base} too; goal ≤ ${MAPPED_GOAL}×)` });
        continue;
      }
      const goal = SPEEDUP_GOALS[w.id]!;
      const goalMode = SPEEDUP_MODE[w.id];
      const inMode = (xs: Summary[]) => (goalMode ? xs.filter((x) => x.mode === goalMode) : xs);
      const [mine, nm] = [best(inMode(of('pgsub'))), best(inMode(of('native')))];
      const modeNote = goalMode ? `, streaming = ${goalMode}` : '';
      if (mine && nm) {
        const ratio = round(nm.medianSeconds! / mine.medianSeconds!);
        lines.push({
          met: ratio >= goal,
          text: `${pair.name} ${w.id}: native ${nm.medianSeconds} s (${nm.mode}) / pgsub ${mine.medianSeconds} s (${mine.mode}) = ${ratio.toFixed(2)}× (goal ≥ ${goal}×${modeNote})`,
        });
      } else lines.push({ met: null, text: `${pair.name} ${w.id}: speedup not measured (goal ≥ ${goal}×${modeNote})` });
      if (mine && mine.walsenderBusy !== undefined && w.id !== 'W3') {
        lines.push({
          met: mine.walsenderBusy >= WALSENDER_BUSY_GOAL,
          text: `${pair.name} ${w.id}: walsender ${pct(mine.walsenderBusy)} busy under pgsub (goal ≥ ${pct(WALSENDER_BUSY_GOAL)})`,
        });
      }
      const floor = best(of('floor').filter((x) => x.mode === mine?.mode));
      if (mine && floor) {
        const ratio = round(mine.medianSeconds! / floor.medianSeconds!);
        lines.push({
          met: ratio <= FLOOR_GOAL,
          text: `${pair.name} ${w.id}: pgsub ${mine.medianSeconds} s / floor ${floor.medianSeconds} s = ${ratio.toFixed(2)}× (goal ≤ ${FLOOR_GOAL}×)`,
        });
      } else if (mine) lines.push({ met: null, text: `${pair.name} ${w.id}: against the floor not measured (--contestants …,floor; goal ≤ ${FLOOR_GOAL}×)` });
      const b = best(of('pgsub-base'));
      if (p && b) {
        lines.push({
          met: null,
          text: `${pair.name} ${w.id}: against --baseline: pgsub-base ${b.medianSeconds} s / pgsub ${p.medianSeconds} s = ${round(b.medianSeconds! / p.medianSeconds!).toFixed(2)}×; pgsub CPU ${b.pgsubUsPerChange ?? '-'} → ${p.pgsubUsPerChange ?? '-'} µs/change; walsender busy ${pct(b.walsenderBusy)} → ${pct(p.walsenderBusy)}`,
        });
      }
      const rss = Math.max(0, ...of('pgsub').map((x) => x.peakRssMB ?? 0));
      if (p) lines.push({ met: rss <= RSS_GOAL_MB, text: `${pair.name} ${w.id}: pgsub peak RSS ${rss} MB (goal ≤ ${RSS_GOAL_MB} MB)` });
    }
  }
  return lines;
}

function printReport(summaries: Summary[], backlogs: Backlog[], goalLines: { text: string; met: boolean | null }[]): void {
  const f = (x: number | undefined, d = 2) => (x === undefined ? '-' : x.toFixed(d));
  out();
  out(
    `scale ${SCALE}; repetitions: ${PAIRS.map((p) => `${p.name} ${p.repeat}`).join(', ')}; seconds: subscriber start → slot confirmed the backlog's end LSN, target equal to the source`,
  );
  for (const w of WORKLOADS) {
    const b = backlogs.filter((x) => x.workload === w.id);
    out(
      `  ${w.id}: ${w.title}${b.length ? `; backlog ${(median(b.map((x) => x.walBytes)) / 1e6).toFixed(0)} MB of WAL, generated in ${median(b.map((x) => x.seconds)).toFixed(1)} s (median)` : ''}`,
    );
  }
  out('native/pgsub > 1: pgsub faster (median against median, same mode). CPU: seconds during the measurement (median); walsender = the one serving the slot,');
  out(
    '  busy = its CPU / the time; core wait = its time runnable but waiting for a CPU (schedstat; the rest of "not busy" it slept: waiting for the subscriber, or not connected yet);',
  );
  out("  to stream = start → a walsender has the slot (START_REPLICATION): the subscriber's own start, inside the seconds;");
  out('  backends = every backend of the contestant in the target; µs/change = pgsub CPU per row change;');
  out('  pgsub waits (s): receiver on the socket / on a full queue, applier on an empty queue / on results / on commits (apply loop stopped)');
  out();
  const header = [
    'pair',
    'workload',
    'mode',
    'contestant',
    'runs',
    'min s',
    'median s',
    'to stream s',
    'rows/s',
    'native/pgsub',
    'pgsub peak RSS MB',
    'walsender CPU s',
    'walsender busy',
    'walsender core wait s',
    'pgsub CPU s',
    'pgsub µs/change',
    'target CPU s',
    'backends CPU s',
    'pgsub waits s',
  ];
  const rows = summaries.map((x) =>
    x.refused && !x.runs
      ? [x.pair, x.workload, x.mode, x.contestant, 0, 'refused', '', '', '', '', '', '', '', '', '', '', '', '', '']
      : [
          x.pair,
          x.workload,
          x.mode,
          x.contestant,
          x.failed ? `${x.runs} (${x.failed} failed)` : x.runs,
          f(x.minSeconds),
          f(x.medianSeconds),
          f(x.streamSeconds),
          x.rowsPerSecond === undefined ? '-' : fmtInt(x.rowsPerSecond),
          f(x.speedup),
          x.peakRssMB === undefined ? '-' : String(x.peakRssMB),
          f(x.walsenderCpu),
          pct(x.walsenderBusy),
          f(x.walsenderCoreWait),
          f(x.pgsubCpu),
          f(x.pgsubUsPerChange, 1),
          f(x.targetCpu),
          f(x.targetBackendsCpu),
          x.waits ? fmtWaits(x.waits) : '-',
        ],
  );
  out(formatTable(header, rows));
  out('\ngoals:');
  for (const g of goalLines) out(`  ${g.met === null ? 'n/a    ' : g.met ? 'met    ' : 'NOT met'}  ${g.text}`);
}

const fmtInt = (n: number) => n.toLocaleString('en-US');
const pct = (x: number | undefined) => (x === undefined ? '-' : `${Math.round(x * 100)}%`);
/** The apply loop's waits in loop-times.ts order: socket / queue full / queue empty / results / commit. */
const WAIT_KEYS = ['socketWaitSeconds', 'queueFullSeconds', 'queueWaitSeconds', 'resultsWaitSeconds', 'commitWaitSeconds'] as const;
const fmtWaits = (w: Record<string, number>) => WAIT_KEYS.map((k) => (w[k] === undefined ? '-' : w[k]!.toFixed(1))).join('/');
const fmtLsn = (lsn: bigint) => `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;

// ---------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const started = Date.now();
  const build = opts['pgsub-dir'] ? preparedPgsub(opts['pgsub-dir']) : snapshotPgsub(opts.live, { build: !opts.tsx });
  const base = opts.baseline ? snapshotPgsub(false, { build: !opts.tsx, commit: opts.baseline }) : null;
  if (base) log(`pgsub-base: ${opts.baseline} (${base.head.slice(0, 12)}) copied to ${base.dir}, run as ${base.mode}${base.buildErrors ? `, ${base.buildErrors} tsc errors` : ''}`);
  const builds: Builds = { current: build, base };
  log(
    `pgsub ${opts.live ? 'working tree' : `copied to ${build.dir}`} (src fingerprint ${build.fingerprint}, run as ${build.mode}${build.buildErrors ? `, ${build.buildErrors} tsc errors` : ''}); workloads ${WORKLOADS.map((w) => w.id).join(', ')}, scale ${SCALE}, pairs ${PAIRS.map((p) => `${p.name} (${p.repeat} repetition(s))`).join(', ')}`,
  );
  const backlogs: Backlog[] = [];
  const runs: RunResult[] = [];
  const versions: Record<string, Servers['versions']> = {};
  try {
    for (const pair of PAIRS) {
      log(`starting PostgreSQL ${pair.publisher} publisher and PostgreSQL ${pair.target} target`);
      const s = await startServers(pair);
      versions[pair.name] = s.versions;
      try {
        for (let rep = 1; rep <= pair.repeat; rep++) {
          for (const w of WORKLOADS) {
            for (const mode of w.modes.filter((m) => MODES.length === 0 || MODES.includes(m))) {
              const r = await runRound(s, w, mode, rep, builds);
              backlogs.push(r.backlog);
              runs.push(...r.runs);
            }
          }
        }
      } finally {
        await stopServers(s);
      }
    }
    const summaries = summarize(runs);
    const goalLines = goals(summaries);
    printReport(summaries, backlogs, goalLines);
    writeBenchResult(
      'apply',
      started,
      { servers: versions },
      {
        pgsub: {
          head: build.head,
          dirty: build.dirty,
          srcFingerprint: build.fingerprint,
          copiedTree: !opts.live,
          runAs: build.mode,
          buildErrors: build.buildErrors,
          ...(base ? { baseline: { commit: base.head, srcFingerprint: base.fingerprint, runAs: base.mode, buildErrors: base.buildErrors } } : {}),
          settings: { copy_data: false, binary: true, synchronous_commit: 'off', streaming: 'per workload', ...PGSUB_EXTRA_ENV },
        },
        native: { settings: 'enabled false until measured, copy_data false, binary true, streaming per workload, synchronous_commit off (default)' },
        settings: {
          scale: SCALE,
          repeat: REPEAT,
          crossRepeat: CROSS_REPEAT,
          pairs: PAIRS,
          contestants: KINDS,
          server: SERVER_SETTINGS,
          workloads: WORKLOADS.map((w) => ({ id: w.id, title: w.title, modes: w.modes, rowChanges: w.rowChanges, tables: w.tables })),
        },
        goals: goalLines,
        summaries,
        backlogs,
        runs,
      },
      out,
    );
  } finally {
    await stopAllClusters();
    build.remove();
    base?.remove();
  }
}

main().catch((err) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  // The clusters are gone (main's finally); nothing left worth waiting for.
  process.exit(1);
});
