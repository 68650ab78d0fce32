/**
 * `npm run bench:scale`: pgsub at ten times the usual sizes (issue 30), against
 * PostgreSQL's native subscriber in the same run, on the same servers (PostgreSQL 18 → 18,
 * throw-away clusters from test/harness) and the same machine. Three parts, each
 * selectable:
 *
 *   npm run bench:scale                              # all three at full size (~35–45 min on 2 cores)
 *   npm run bench:scale -- --quick                   # every part small, a few minutes: a trial
 *   npm run bench:scale -- --parts copy,rate         # some parts (w1, copy, rate)
 *
 * w1    W1 of `npm run bench` (rows inserted in transactions of 10,000) with 10,000,000
 *       rows of backlog (--scale 10), worked off by pgsub and by native in one run
 *       (scripts/bench-apply.ts as a child: both slots made first, the backlog written
 *       while nobody consumes, then each subscriber alone, timed until its slot confirmed
 *       the end and the target equals the source); and the same at 1,000,000 rows in the
 *       same run. Printed: both catch-up times and their ratio, pgsub's peak RSS (VmHWM)
 *       and its VmRSS sampled once a second over the catch-up (first / median / max, and
 *       at each tenth of it), so that memory is seen flat, not growing with the backlog,
 *       against the 1,000,000-row run's peak.
 * copy  The initial copy of 200 tables of mixed sizes (scripts/bench-sync.ts's `mixed`
 *       dataset, as a child): five of 1,000,000 rows, one wide table of 20,000 rows with a
 *       2–20 kB text each (out of line, in TOAST), 194 small ones (100 to 50,000 rows).
 *       pgsub (its defaults: binary, max_sync_workers 4) against native (CREATE
 *       SUBSCRIPTION … copy_data, binary = true, max_sync_workers_per_subscription 2, its
 *       default) and a plain binary `COPY … TO STDOUT | COPY … FROM STDIN` pipe (one lane,
 *       and four), each timed until every table is ready. pgsub's schedule, from its
 *       'table copy started' / 'table copy finished' lines: a text Gantt of the largest
 *       tables and counts for the small ones.
 * rate  The highest pgbench rate each subscriber sustains, pglogical's method: `pgbench
 *       --rate` (TPC-B-like, --pgbench-scale 10, 8 clients, prepared statements; the
 *       system's pgbench, /usr/lib/postgresql/<v>/bin/pgbench) stepped up from --rate-step
 *       (500) by --rate-step TPS, --step-seconds (25) each, until a step's p99 replay lag
 *       exceeds 1 s or pgbench itself falls 5% short of the rate (the machine is full: the
 *       subscriber's CPU counts there too); then --refine (2) steps halving the interval
 *       between the highest rate sustained and the lowest failed (resolution 125 TPS). Native
 *       first, then pgsub, on the same servers and tables (pgbench_history with a primary
 *       key, as in W2; each target filled by a binary COPY pipe, its subscription made with
 *       copy_data off, pgsub with synchronous_commit off like native); then pgsub's p99 at
 *       native's highest rate (from its own steps when it ran that rate, else one more step).
 *       Replay lag, sampled every 100 ms during each step: now − the publisher's start time
 *       of the newest pgbench transaction visible on the target (pgbench_history.mtime of
 *       its highest hid; until the step's first one is visible there, now − that first
 *       transaction's start on the publisher; pgbench's own start-up is not counted).
 *       It means the same for both subscribers: what a reader of the target sees.
 *       pg_stat_replication.replay_lag does not (pgsub reports a position applied once the
 *       target has flushed it, native once it has applied it), so it is only shown beside.
 *
 * pgsub runs from one copy of bin/, src/ and migrations/ made at startup and compiled as
 * `npm run build` would (bench-lib.ts snapshotPgsub; --tsx: TypeScript through tsx), shared
 * with the children (--pgsub-dir). Output: a table per part with ratios and peak RSS, the
 * conditions (cores, CPU, PostgreSQL and pgbench versions, date) and the total time, and
 * bench-results/scale-<timestamp>.json (the children's own JSON files stay beside it). A part
 * that fails is reported and the others still run (exit 1 at the end). Nothing is asserted
 * about speed.
 *
 * Expected duration on 2 cores (full; each part's time is printed): w1 ~12 min (writing
 * the 10M-row backlog and checksumming 10M rows three times take longer than the
 * catch-ups), copy ~8 min, rate ~15 min (steps of 25 s, each followed by the drain). --quick: w1 at 20,000 / 200,000 rows, copy of 30 small
 * tables, rate with pgbench scale 1, steps of 100 TPS and 5 s, at most 3 and one refinement.
 * --pgbench-scale, --rate-step, --step-seconds, --max-steps and --refine change the rate part.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type pg from 'pg';
import { startCluster, stopAllClusters, type Cluster } from '../test/harness/index.js';
import { replicationOriginName } from '../src/origin/replorigin.js';
import {
  benchClient,
  copyPipe,
  coreCount,
  CpuSampler,
  foreignCores,
  formatTable,
  headerText,
  median,
  MemorySampler,
  pollUntil,
  postmasterPid,
  REPO_ROOT,
  round,
  slotState,
  snapshotPgsub,
  spawnPgsub,
  type PgsubBuild,
  type WatchedPgsub,
  waitForQuiet,
  writeBenchResult,
} from './bench-lib.js';

const PARTS = ['w1', 'copy', 'rate'] as const;
type Part = (typeof PARTS)[number];

const { values: opts } = parseArgs({
  options: {
    parts: { type: 'string', default: PARTS.join(',') },
    quick: { type: 'boolean', default: false },
    'quiet-seconds': { type: 'string', default: '10' },
    'pgbench-scale': { type: 'string' },
    'rate-step': { type: 'string' },
    'step-seconds': { type: 'string' },
    'max-steps': { type: 'string' },
    refine: { type: 'string' },
    tsx: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  process.stdout.write(headerText(import.meta.url));
  process.exit(0);
}
const SELECTED = opts.parts.split(',').map((p) => p.trim()) as Part[];
for (const p of SELECTED) if (!PARTS.includes(p)) throw new Error(`--parts: unknown ${p} (known: ${PARTS.join(', ')})`);
const QUICK = opts.quick;
const positive = (name: string, value: string | undefined, fallback: number) => {
  const n = value === undefined ? fallback : Number(value);
  if (!(n > 0)) throw new Error(`--${name} must be a positive number, not ${value}`);
  return n;
};
/** Everything that sizes a part; --quick shrinks each. */
const SIZE = {
  w1Scales: QUICK ? [0.02, 0.2] : [1, 10],
  copyTables: QUICK ? 30 : 200,
  copyScale: QUICK ? 0.02 : 1,
  pgbenchScale: positive('pgbench-scale', opts['pgbench-scale'], QUICK ? 1 : 10),
  rateStep: positive('rate-step', opts['rate-step'], QUICK ? 100 : 500),
  refine: Number(opts.refine ?? (QUICK ? 1 : 2)),
  stepSeconds: positive('step-seconds', opts['step-seconds'], QUICK ? 5 : 25),
  maxSteps: positive('max-steps', opts['max-steps'], QUICK ? 3 : 24),
};
if (!Number.isInteger(SIZE.refine) || SIZE.refine < 0) throw new Error(`--refine must be an integer ≥ 0, not ${opts.refine}`);
const QUIET_SECONDS = opts['quiet-seconds'];
/** The step fails when p99 replay lag exceeds this (seconds). */
const LAG_LIMIT_S = 1;
/** …or when pgbench reaches less than this share of the rate asked. */
const RATE_SHORTFALL = 0.95;
const LAG_SAMPLE_MS = 100;
const PGBENCH_CLIENTS = 8;
const PGBENCH_THREADS = 2;
const DRAIN_TIMEOUT_MS = 180_000;
const SOURCE_DB = 'bench';
const RATE_PUBLICATION = 'pub_rate';
const PGBENCH_TABLES = ['public.pgbench_accounts', 'public.pgbench_branches', 'public.pgbench_tellers', 'public.pgbench_history'];
/** Both rate-part servers, like bench-apply's. */
const SERVER_SETTINGS = { shared_buffers: '128MB', max_wal_size: '4GB', checkpoint_timeout: '30min' };

const out = (line = '') => process.stdout.write(`${line}\n`);
const log = (line: string) => process.stderr.write(`[bench:scale ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const fmtInt = (n: number) => Math.round(n).toLocaleString('en-US');
const f = (x: number | null | undefined, d = 2) => (x === null || x === undefined || !Number.isFinite(x) ? '-' : x.toFixed(d));

// ---------------------------------------------------------------------------------------
// The other bench scripts as children

const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) c.kill('SIGTERM');
});

/**
 * Runs scripts/<script> through tsx with `args`; its progress (stderr) and its table
 * (stdout) go to this process's stderr, indented. Returns its JSON result (the file named
 * on its `results:` line).
 */
async function runBenchScript(script: string, args: string[]): Promise<Record<string, unknown>> {
  log(`running scripts/${script} ${args.join(' ')}`);
  const child = spawn(path.join(REPO_ROOT, 'node_modules', '.bin', 'tsx'), [path.join('scripts', script), ...args], {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  let stdout = '';
  const relay = (b: Buffer) => process.stderr.write(b.toString('utf8').replace(/^(?=.)/gm, '    '));
  child.stdout!.on('data', (b: Buffer) => {
    stdout += b.toString('utf8');
    relay(b);
  });
  child.stderr!.on('data', relay);
  const code = await new Promise<number | string>((resolve) => child.on('exit', (c, signal) => resolve(c ?? signal ?? -1)));
  children.delete(child);
  const file = /^results: (\S+\.json)/m.exec(stdout)?.[1];
  if (code !== 0 || !file) throw new Error(`scripts/${script} exited with ${code}${file ? '' : ' and no results file'}`);
  return JSON.parse(readFileSync(path.resolve(REPO_ROOT, file), 'utf8')) as Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------
// Part w1: the 10M-row catch-up

interface ApplyRun {
  contestant: string;
  seconds?: number;
  error?: string;
  peakRssMB?: number;
  rssTimelineMB?: [number, number][];
  walsenderBusy?: number;
  pgsubCpu?: number;
  targetCpu?: number;
}
interface ApplyResult {
  machine: { servers?: Record<string, { publisher: string; target: string }> };
  runs: ApplyRun[];
  backlogs: { walBytes: number; seconds: number }[];
  settings: { workloads: { rowChanges: number }[] };
}

interface W1Row {
  scale: number;
  rows: number;
  backlogMB: number;
  backlogSeconds: number;
  nativeSeconds: number | null;
  pgsubSeconds: number | null;
  /** native / pgsub: > 1 means pgsub is faster. */
  ratio: number | null;
  pgsubPeakRssMB: number | null;
  rss: { first: number; median: number; max: number; samples: number; tenths: number[] } | null;
  walsenderBusy: { pgsub: number | null; native: number | null };
  errors: string[];
  resultFile: string;
}

async function partW1(build: PgsubBuild): Promise<{ rows: W1Row[]; versions: unknown }> {
  const rows: W1Row[] = [];
  let versions: unknown = null;
  for (const scale of SIZE.w1Scales) {
    const r = (await runBenchScript('bench-apply.ts', [
      '--workloads',
      'W1',
      '--pair',
      '18-18',
      '--repeat',
      '1',
      '--contestants',
      'pgsub,native',
      '--scale',
      String(scale),
      '--rss-timeline',
      '--quiet-seconds',
      QUIET_SECONDS,
      '--pgsub-dir',
      build.dir,
    ])) as unknown as ApplyResult & { startedAt: string };
    versions = r.machine.servers;
    const pgsub = r.runs.find((x) => x.contestant === 'pgsub');
    const native = r.runs.find((x) => x.contestant === 'native');
    const timeline = pgsub?.rssTimelineMB ?? [];
    const mbs = timeline.map(([, mb]) => mb);
    const seconds = pgsub?.seconds ?? 0;
    // The sample nearest to each tenth of the catch-up (0% = the first sample, after ~1 s).
    const tenths = timeline.length
      ? Array.from({ length: 11 }, (_, k) => {
          const at = (seconds * k) / 10;
          return timeline.reduce((best, s) => (Math.abs(s[0] - at) < Math.abs(best[0] - at) ? s : best))[1];
        })
      : [];
    rows.push({
      scale,
      rows: r.settings.workloads[0]?.rowChanges ?? 0,
      backlogMB: round((r.backlogs[0]?.walBytes ?? 0) / 1e6, 0),
      backlogSeconds: r.backlogs[0]?.seconds ?? 0,
      nativeSeconds: native?.seconds ?? null,
      pgsubSeconds: pgsub?.seconds ?? null,
      ratio: native?.seconds && pgsub?.seconds ? round(native.seconds / pgsub.seconds) : null,
      pgsubPeakRssMB: pgsub?.peakRssMB ?? null,
      rss: mbs.length ? { first: mbs[0]!, median: round(median(mbs), 0), max: Math.max(...mbs), samples: mbs.length, tenths } : null,
      walsenderBusy: { pgsub: pgsub?.walsenderBusy ?? null, native: native?.walsenderBusy ?? null },
      errors: r.runs.filter((x) => x.error).map((x) => `${x.contestant}: ${x.error!.split('\n')[0]}`),
      resultFile: `apply-${r.startedAt.replace(/[:.]/g, '-')}.json`,
    });
  }
  return { rows, versions };
}

function printW1(rows: W1Row[]): void {
  out('\n## w1: catching up a W1 backlog (rows inserted in transactions of 10,000), PostgreSQL 18 → 18, one run each');
  out('seconds: subscriber start → its slot confirmed the backlog end and the target equals the source (bench-apply.ts);');
  out('native/pgsub > 1: pgsub faster. RSS: pgsub VmRSS sampled once a second over the catch-up; peak = VmHWM');
  out();
  out(
    formatTable(
      ['rows', 'backlog WAL MB', 'native s', 'pgsub s', 'native/pgsub', 'pgsub peak RSS MB', 'RSS first/median/max MB', 'samples', 'walsender busy pgsub/native'],
      rows.map((r) => [
        fmtInt(r.rows),
        r.backlogMB,
        f(r.nativeSeconds),
        f(r.pgsubSeconds),
        f(r.ratio),
        r.pgsubPeakRssMB ?? '-',
        r.rss ? `${r.rss.first}/${r.rss.median}/${r.rss.max}` : '-',
        r.rss?.samples ?? '-',
        `${pct(r.walsenderBusy.pgsub)}/${pct(r.walsenderBusy.native)}`,
      ]),
    ),
  );
  const big = rows[rows.length - 1];
  const small = rows[0];
  if (big?.rss) out(`\npgsub RSS over the ${fmtInt(big.rows)}-row catch-up at each tenth (MB): ${big.rss.tenths.join(' ')}`);
  if (big && small && big !== small && big.pgsubPeakRssMB && small.pgsubPeakRssMB) {
    out(
      `pgsub peak RSS at ${fmtInt(big.rows)} rows / at ${fmtInt(small.rows)} rows: ${big.pgsubPeakRssMB} / ${small.pgsubPeakRssMB} MB = ${(big.pgsubPeakRssMB / small.pgsubPeakRssMB).toFixed(2)}× for ${(big.rows / small.rows).toFixed(0)}× the backlog`,
    );
  }
  for (const r of rows) for (const e of r.errors) out(`FAILED at ${fmtInt(r.rows)} rows: ${e}`);
}

const pct = (x: number | null | undefined) => (x === null || x === undefined ? '-' : `${Math.round(x * 100)}%`);

// ---------------------------------------------------------------------------------------
// Part copy: 200 tables of mixed sizes

interface SyncSummary {
  dataset: string;
  contestant: string;
  medianSeconds: number;
  medianCopiedSeconds: number;
  peakRssMiB: number | null;
  startupSeconds: number | null;
  cpu: Record<string, number>;
}
interface SyncTable {
  table: string;
  rows: number;
  bytes: number;
  startedAt: number | null;
  finishedAt: number | null;
}
interface SyncResult {
  startedAt: string;
  machine: { server?: string };
  datasets: Record<string, { heapBytes: number; totalBytes: number; toastBytes: number; rows: number; tables: { name: string; layout: string; rows: number }[] }>;
  summaries: SyncSummary[];
  runs: { contestant: string; details?: { tables?: SyncTable[] } }[];
}

const COPY_CONTESTANTS = ['pgsub-w4', 'native-binary', 'pipe-binary', 'pipe-binary-p4'];

async function partCopy(build: PgsubBuild): Promise<SyncResult> {
  return (await runBenchScript('bench-sync.ts', [
    '--datasets',
    'mixed',
    '--mixed-tables',
    String(SIZE.copyTables),
    '--mixed-scale',
    String(SIZE.copyScale),
    '--contestants',
    COPY_CONTESTANTS.join(','),
    '--reps',
    '1',
    '--attempts',
    '1',
    '--quiet-seconds',
    QUIET_SECONDS,
    '--pgsub-dir',
    build.dir,
  ])) as unknown as SyncResult;
}

/** pgsub's per-table copy schedule (seconds since its spawn), from bench-sync's JSON. */
function copySchedule(r: SyncResult): SyncTable[] {
  return (r.runs.find((x) => x.contestant === 'pgsub-w4')?.details?.tables ?? []).filter((t) => t.startedAt !== null && t.finishedAt !== null);
}

function printCopy(r: SyncResult, tables: SyncTable[]): void {
  const d = r.datasets.mixed!;
  const sizes = d.tables.map((t) => t.rows).sort((a, b) => b - a);
  out(`\n## copy: the initial copy of ${d.tables.length} tables of mixed sizes, PostgreSQL 18 → 18, one run each`);
  out(
    `${fmtInt(d.rows)} rows: ${sizes.filter((n) => n === sizes[0]).length} tables of ${fmtInt(sizes[0]!)} rows, one wide table with a 2–20 kB text per row, the rest ${fmtInt(Math.min(...sizes))}–${fmtInt(sizes[6] ?? 0)} rows;` +
      ` heap ${mb(d.heapBytes)} MB, TOAST ${mb(d.toastBytes)} MB, with indexes ${mb(d.totalBytes)} MB`,
  );
  out("seconds: start → every table ready (pipe: every COPY committed); copied: → every copy finished; ×X: X's time / this one's (> 1: faster)");
  out('pgsub: max_sync_workers 4 (its default), binary; native: binary = true, max_sync_workers_per_subscription 2 (its default); pipe: 1 or 4 lanes');
  out();
  const sum = (c: string) => r.summaries.find((s) => s.dataset === 'mixed' && s.contestant === c);
  const ratio = (c: string, s: SyncSummary) => {
    const o = sum(c);
    return o ? f(o.medianSeconds / s.medianSeconds) : '-';
  };
  out(
    formatTable(
      ['contestant', 'seconds', 'copied s', 'MB/s', '×native', '×pipe', '×pipe-p4', 'peak RSS MiB', 'startup s', 'CPU s pub/tgt/client'],
      COPY_CONTESTANTS.flatMap((c) => {
        const s = sum(c);
        if (!s) return [[c, 'failed', '', '', '', '', '', '', '', '']];
        return [
          [
            c,
            f(s.medianSeconds),
            f(s.medianCopiedSeconds),
            f((d.heapBytes + d.toastBytes) / 1e6 / s.medianSeconds, 1),
            ratio('native-binary', s),
            ratio('pipe-binary', s),
            ratio('pipe-binary-p4', s),
            s.peakRssMiB ?? '-',
            f(s.startupSeconds),
            `${f(s.cpu.publisher, 1)}/${f(s.cpu.target, 1)}/${f(s.cpu.client, 1)}`,
          ],
        ];
      }),
    ),
  );
  if (tables.length === 0) return;
  // The schedule: a bar per large table over the whole copy, counts for the small ones.
  const end = Math.max(...tables.map((t) => t.finishedAt!));
  const width = 60;
  const bar = (t: SyncTable) => {
    const a = Math.floor((t.startedAt! / end) * width);
    const b = Math.max(a + 1, Math.ceil((t.finishedAt! / end) * width));
    return `|${' '.repeat(a)}${'#'.repeat(b - a)}${' '.repeat(width - b)}|`;
  };
  const ordered = [...tables].sort((a, b) => b.bytes - a.bytes);
  const large = ordered.slice(0, Math.min(8, ordered.length));
  const small = ordered.slice(large.length);
  out(`\npgsub's schedule (seconds since its spawn; # = copying, scale 0–${end.toFixed(1)} s), the ${large.length} largest tables:`);
  out(
    formatTable(
      ['table', 'rows', 'MB', 'start s', 'end s', 'schedule'],
      large.sort((a, b) => a.startedAt! - b.startedAt!).map((t) => [t.table.replace(/^public\./, ''), fmtInt(t.rows), mb(t.bytes), f(t.startedAt), f(t.finishedAt), bar(t)]),
    ),
  );
  if (small.length) {
    const durations = small.map((t) => t.finishedAt! - t.startedAt!);
    const tenthCounts = Array.from({ length: 10 }, (_, k) => small.filter((t) => Math.min(9, Math.floor((t.finishedAt! / end) * 10)) === k).length);
    out(
      `the other ${small.length} tables (${fmtInt(Math.min(...small.map((t) => t.rows)))}–${fmtInt(Math.max(...small.map((t) => t.rows)))} rows): started ${f(Math.min(...small.map((t) => t.startedAt!)))}–${f(Math.max(...small.map((t) => t.startedAt!)))} s, ` +
        `finished ${f(Math.min(...small.map((t) => t.finishedAt!)))}–${f(Math.max(...small.map((t) => t.finishedAt!)))} s, each ${f(median(durations))} s median (max ${f(Math.max(...durations))} s)`,
    );
    out(`  finished per tenth of the copy: ${tenthCounts.join(' ')}`);
  }
  // How many copies ran at once, at each table's start.
  const overlaps = tables.map((t) => tables.filter((o) => o.startedAt! <= t.startedAt! && o.finishedAt! > t.startedAt!).length);
  out(`copies running at once (at each table's start): median ${median(overlaps)}, max ${Math.max(...overlaps)}`);
}

const mb = (bytes: number) => (bytes / 1e6).toFixed(0);

// ---------------------------------------------------------------------------------------
// Part rate: the highest sustainable pgbench rate

/** The system's pgbench (Debian ships it in the server package, postgresql-<v>), newest first. */
function findPgbench(): string {
  const root = '/usr/lib/postgresql';
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => /^\d+$/.test(v))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  for (const v of versions) {
    const p = path.join(root, v, 'bin', 'pgbench');
    if (existsSync(p)) return p;
  }
  throw new Error(`no pgbench in ${root}/*/bin: the rate part needs PostgreSQL's pgbench (on Debian 12: apt-get install postgresql-15)`);
}

interface PgbenchOutput {
  code: number | string;
  text: string;
  processed: number | null;
  tps: number | null;
  latencyMs: number | null;
  scheduleLagMs: number | null;
  failed: number | null;
}

/** `onSpawn`: told pgbench's pid (its CPU is watched). */
function runPgbench(bin: string, c: Cluster, db: string, args: string[], onSpawn?: (pid: number) => void): Promise<PgbenchOutput> {
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/tmp',
    PGHOST: c.host,
    PGPORT: String(c.port),
    PGUSER: c.user,
    PGTZ: 'UTC',
    PGAPPNAME: 'pgbench',
  };
  return new Promise((resolve, reject) => {
    const child = spawn(bin, [...args, db], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(child);
    if (child.pid !== undefined) onSpawn?.(child.pid);
    let text = '';
    child.stdout!.on('data', (b: Buffer) => (text += b.toString('utf8')));
    child.stderr!.on('data', (b: Buffer) => (text += b.toString('utf8')));
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      children.delete(child);
      const num = (re: RegExp) => {
        const m = re.exec(text);
        return m ? Number(m[1]) : null;
      };
      resolve({
        code: code ?? signal ?? -1,
        text,
        processed: num(/number of transactions actually processed: (\d+)/),
        tps: num(/^tps = ([\d.]+)/m),
        latencyMs: num(/latency average = ([\d.]+) ms/),
        scheduleLagMs: num(/rate limit schedule lag: avg ([\d.]+)/),
        failed: num(/number of failed transactions: (\d+)/),
      });
    });
  });
}

async function pgbenchOk(bin: string, c: Cluster, db: string, args: string[]): Promise<void> {
  const r = await runPgbench(bin, c, db, args);
  if (r.code !== 0) throw new Error(`pgbench ${args.join(' ')} ${db} exited with ${r.code}:\n${r.text.slice(-2000)}`);
}

interface RateServers {
  pub: Cluster;
  tgt: Cluster;
  pubMonitor: pg.Client;
  tgtMonitor: pg.Client;
  pgbench: string;
}

interface Step {
  subscriber: 'native' | 'pgsub';
  rate: number;
  /** Why it ran: the step-up, a step halving the interval after the first failure, or pgsub at native's highest. */
  kind: 'step' | 'refine' | 'at-native';
  pgbenchTps: number | null;
  pgbenchLatencyMs: number | null;
  scheduleLagMs: number | null;
  samples: number;
  lagP50: number | null;
  lagP99: number | null;
  lagMax: number | null;
  /** pg_stat_replication.replay_lag of the subscriber's walsender (p99 of the non-null samples). */
  walsenderReplayLagP99: number | null;
  /** Step end → the target has the publisher's last pgbench row. */
  drainSeconds: number | null;
  /** Busy cores of the whole machine during the step, pgsub's CPU share of a core, and the cores used by processes outside this benchmark. */
  machineBusyCores: number;
  pgsubCores: number | null;
  otherCores: number;
  sustained: boolean;
  why: string;
}

/** The p-th percentile (0..100) of xs, nearest rank. */
function percentile(xs: number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/**
 * Replay lag every 100 ms: now − the publisher's start time (mtime, written in UTC) of the
 * newest pgbench_history row on the target, at most now − the start of the step's first
 * transaction; and the walsender's replay_lag beside it. Sampling starts with the step's
 * first transaction on the publisher (pgbench's own start, its connections, is not lag).
 */
class LagSampler {
  readonly lags: number[] = [];
  readonly walsenderLags: number[] = [];
  private timer: NodeJS.Timeout | null = null;
  private busy = false;
  /** The publisher's start time of the step's first transaction (epoch seconds), once there is one. */
  private stepStartEpoch: number | null = null;
  constructor(
    private readonly target: pg.Client,
    /** In the source database. */
    private readonly publisherDb: pg.Client,
    private readonly publisherMonitor: pg.Client,
    private readonly slot: string,
    /** The publisher's highest hid before the step. */
    private readonly fromHid: bigint,
  ) {}
  start(): void {
    this.timer = setInterval(() => void this.sample(), LAG_SAMPLE_MS);
  }
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
  private async sample(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      if (this.stepStartEpoch === null) {
        const first = await this.publisherDb.query<{ mtime: number }>(
          'SELECT extract(epoch FROM mtime)::float8 AS mtime FROM public.pgbench_history WHERE hid > $1 ORDER BY hid LIMIT 1',
          [this.fromHid.toString()],
        );
        if (!first.rows[0]) return;
        this.stepStartEpoch = first.rows[0].mtime;
      }
      const [t, w] = await Promise.all([
        this.target.query<{ now: number; mtime: number | null }>(
          `SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                  (SELECT extract(epoch FROM mtime)::float8 FROM public.pgbench_history ORDER BY hid DESC LIMIT 1) AS mtime`,
        ),
        this.publisherMonitor.query<{ lag: number | null }>(
          `SELECT extract(epoch FROM r.replay_lag)::float8 AS lag
             FROM pg_catalog.pg_stat_replication r JOIN pg_catalog.pg_replication_slots s ON s.active_pid = r.pid
            WHERE s.slot_name = $1`,
          [this.slot],
        ),
      ]);
      if (!this.timer) return;
      const row = t.rows[0]!;
      this.lags.push(Math.max(0, row.now - Math.max(row.mtime ?? 0, this.stepStartEpoch)));
      const wl = w.rows[0]?.lag;
      if (wl !== null && wl !== undefined) this.walsenderLags.push(wl);
    } catch {
      // a lost sample (a server busy); the next one counts
    } finally {
      this.busy = false;
    }
  }
}

/** A subscriber under test: started with its target ready, stopped and dropped at the end. */
interface RateSubscriber {
  name: 'native' | 'pgsub';
  db: string;
  slot: string;
  target: pg.Client;
  pgsub: WatchedPgsub | null;
  memory: MemorySampler | null;
  check(): void;
  stop(): Promise<void>;
}

async function prepareTarget(s: RateServers, db: string): Promise<void> {
  await s.tgt.createDatabase(db);
  // pgbench's own tables (empty), the publisher's rows by a binary COPY pipe, then the keys.
  await pgbenchOk(s.pgbench, s.tgt, db, ['-i', '-q', '-I', 'dt', '-s', String(SIZE.pgbenchScale)]);
  await s.tgt.query('ALTER TABLE public.pgbench_history ADD COLUMN hid bigint NOT NULL', [], db);
  await copyPipe(s.pub.url(SOURCE_DB), s.tgt.url(db), PGBENCH_TABLES, 2);
  await pgbenchOk(s.pgbench, s.tgt, db, ['-i', '-q', '-I', 'p', '-s', String(SIZE.pgbenchScale)]);
  await s.tgt.query('ALTER TABLE public.pgbench_history ADD PRIMARY KEY (hid)', [], db);
  await s.tgt.query('VACUUM ANALYZE', [], db);
}

async function dropSlot(s: RateServers, slot: string): Promise<void> {
  await pollUntil(async () => {
    const st = await slotState(s.pubMonitor, slot);
    if (st && !st.active) await s.pubMonitor.query('SELECT pg_catalog.pg_drop_replication_slot($1)', [slot]);
    return !st?.active;
  }, 30_000);
}

async function startSubscriber(s: RateServers, name: 'native' | 'pgsub', build: PgsubBuild): Promise<RateSubscriber> {
  const db = `rate_${name}`;
  const slot = `rate_${name}`;
  await prepareTarget(s, db);
  const target = await benchClient(s.tgt.url(db));
  if (name === 'native') {
    const conninfo = `host=${s.pub.host} port=${s.pub.port} user=${s.pub.user} dbname=${SOURCE_DB}`;
    await target.query(`CREATE SUBSCRIPTION ${slot} CONNECTION '${conninfo}' PUBLICATION ${RATE_PUBLICATION} WITH (copy_data = false, binary = true)`);
    await pollUntil(async () => (await slotState(s.pubMonitor, slot))?.active === true, 60_000);
    return {
      name,
      db,
      slot,
      target,
      pgsub: null,
      memory: null,
      check() {},
      async stop() {
        await target.query(`DROP SUBSCRIPTION IF EXISTS ${slot}`);
        await target.end().catch(() => {});
        await dropSlot(s, slot);
        await s.tgt.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      },
    };
  }
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'pgsub-bench-scale-'));
  const child = spawnPgsub(build, {
    PGSUB_SOURCE: s.pub.url(SOURCE_DB),
    PGSUB_TARGET: s.tgt.url(db),
    PGSUB_PUBLICATION: RATE_PUBLICATION,
    PGSUB_SUBSCRIPTION: slot,
    PGSUB_COPY_DATA: 'false',
    PGSUB_BINARY: 'true',
    // Like native's default: asynchronous apply commits, feedback after the target's WAL flush.
    PGSUB_SYNCHRONOUS_COMMIT: 'off',
    PGSUB_STATE_DIR: stateDir,
    PGSUB_LOG_LEVEL: 'info',
  });
  const memory = new MemorySampler(child.pid, 500);
  const check = () => {
    if (child.exitCode() !== null) throw new Error(`pgsub exited (${child.exitCode()}):\n${child.output().slice(-4000)}`);
  };
  await pollUntil(async () => {
    check();
    return child.logs().some((l) => l.msg === 'streaming started');
  }, 120_000);
  return {
    name,
    db,
    slot,
    target,
    pgsub: child,
    memory,
    check,
    async stop() {
      memory.finish();
      await child.stop();
      await target.end().catch(() => {});
      await dropSlot(s, slot);
      rmSync(stateDir, { recursive: true, force: true });
      await s.tgt.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      // Origins are cluster-wide and outlive the database.
      await s.tgt.query('SELECT pg_catalog.pg_replication_origin_drop(roname) FROM pg_catalog.pg_replication_origin WHERE roname = $1', [replicationOriginName(slot)]);
    },
  };
}

async function maxHid(c: pg.Client): Promise<bigint> {
  return BigInt((await c.query<{ h: string }>('SELECT coalesce(max(hid), 0)::text AS h FROM public.pgbench_history')).rows[0]!.h);
}

async function runStep(s: RateServers, sub: RateSubscriber, publisherDb: pg.Client, rate: number, kind: Step['kind']): Promise<Step> {
  const cpu = new CpuSampler({ publisher: postmasterPid(s.pub.dataDir), target: postmasterPid(s.tgt.dataDir) });
  if (sub.pgsub) cpu.addProcess('pgsub', sub.pgsub.pid);
  cpu.start();
  const sampler = new LagSampler(sub.target, publisherDb, s.pubMonitor, sub.slot, await maxHid(publisherDb));
  sampler.start();
  const run = await runPgbench(
    s.pgbench,
    s.pub,
    SOURCE_DB,
    ['-n', '-M', 'prepared', '-c', String(PGBENCH_CLIENTS), '-j', String(PGBENCH_THREADS), '-R', String(rate), '-T', String(SIZE.stepSeconds)],
    (pid) => cpu.addProcess('pgbench', pid, true),
  );
  sampler.stop();
  const report = cpu.stop();
  if (run.code !== 0) throw new Error(`pgbench --rate ${rate} exited with ${run.code}:\n${run.text.slice(-2000)}`);
  // The drain: until the target has the publisher's last row of the step.
  const last = await maxHid(publisherDb);
  const t0 = performance.now();
  let drainSeconds: number | null = null;
  try {
    await pollUntil(
      async () => {
        sub.check();
        return (await maxHid(sub.target)) >= last;
      },
      DRAIN_TIMEOUT_MS,
      100,
    );
    drainSeconds = round((performance.now() - t0) / 1000);
  } catch (err) {
    sub.check();
    log(`  ${sub.name} did not catch up within ${DRAIN_TIMEOUT_MS / 1000} s after the step at ${rate} TPS: ${(err as Error).message}`);
  }
  const p99 = percentile(sampler.lags, 99);
  const reasons: string[] = [];
  if (sampler.lags.length === 0) reasons.push('no lag sample');
  if (p99 !== null && p99 > LAG_LIMIT_S) reasons.push(`p99 lag > ${LAG_LIMIT_S} s`);
  if ((run.tps ?? 0) < rate * RATE_SHORTFALL) reasons.push(`pgbench reached ${f(run.tps, 0)} TPS < ${Math.round(RATE_SHORTFALL * 100)}%`);
  if (drainSeconds === null) reasons.push('no catch-up');
  const step: Step = {
    subscriber: sub.name,
    rate,
    kind,
    pgbenchTps: run.tps,
    pgbenchLatencyMs: run.latencyMs,
    scheduleLagMs: run.scheduleLagMs,
    samples: sampler.lags.length,
    lagP50: percentile(sampler.lags, 50),
    lagP99: p99,
    lagMax: sampler.lags.length ? Math.max(...sampler.lags) : null,
    walsenderReplayLagP99: percentile(sampler.walsenderLags, 99),
    drainSeconds,
    machineBusyCores: round(report.machineBusy / report.wallSeconds),
    pgsubCores: report.groups.pgsub !== undefined ? round(report.groups.pgsub / report.wallSeconds) : null,
    otherCores: foreignCores(report),
    sustained: reasons.length === 0,
    why: reasons.join('; ') || 'ok',
  };
  log(
    `  ${sub.name} at ${rate} TPS (${kind}): pgbench ${f(run.tps, 0)} TPS, lag p50 ${f(step.lagP50, 3)} p99 ${f(step.lagP99, 3)} max ${f(step.lagMax, 3)} s (${step.samples} samples), ` +
      `walsender replay_lag p99 ${f(step.walsenderReplayLagP99, 3)} s, drain ${f(drainSeconds)} s, machine ${step.machineBusyCores} cores busy (${step.otherCores} by other processes): ${step.why}`,
  );
  return step;
}

/**
 * pgbench --rate stepped up until a step fails, then --refine steps halving the interval
 * between the highest sustained rate and the lowest failed one. Returns the highest
 * sustained rate (null: none).
 */
async function stepUp(s: RateServers, sub: RateSubscriber, publisherDb: pg.Client, steps: Step[]): Promise<{ highest: number | null; limitFound: boolean }> {
  let highest: number | null = null;
  let failedAt: number | null = null;
  for (let k = 1; k <= SIZE.maxSteps; k++) {
    const rate = k * SIZE.rateStep;
    const step = await runStep(s, sub, publisherDb, rate, 'step');
    steps.push(step);
    if (step.drainSeconds === null) return { highest, limitFound: true };
    if (!step.sustained) {
      failedAt = rate;
      break;
    }
    highest = rate;
  }
  if (failedAt === null) return { highest, limitFound: false };
  for (let k = 0; k < SIZE.refine; k++) {
    const mid = Math.round(((highest ?? 0) + failedAt) / 2);
    if (mid === highest || mid === failedAt) break;
    const step = await runStep(s, sub, publisherDb, mid, 'refine');
    steps.push(step);
    if (step.drainSeconds === null) break;
    if (step.sustained) highest = mid;
    else failedAt = mid;
  }
  return { highest, limitFound: true };
}

interface RateResult {
  steps: Step[];
  highest: Record<'native' | 'pgsub', number | null>;
  limitFound: Record<'native' | 'pgsub', boolean>;
  pgsubAtNative: Step | null;
  nativeAtNative: Step | null;
  pgsubPeakRssMB: number | null;
  versions: { publisher: string; target: string; pgbench: string };
}

async function partRate(build: PgsubBuild): Promise<RateResult> {
  const bin = findPgbench();
  log(`starting PostgreSQL 18 publisher and target for the rate part; ${bin}`);
  const [pub, tgt] = await Promise.all([
    startCluster({ major: 18, name: 'bench-scale-pub', settings: SERVER_SETTINGS }),
    startCluster({ major: 18, name: 'bench-scale-tgt', settings: SERVER_SETTINGS }),
  ]);
  const s: RateServers = { pub, tgt, pubMonitor: await benchClient(pub.url()), tgtMonitor: await benchClient(tgt.url()), pgbench: bin };
  const version = async (c: Cluster) => (await c.query<{ v: string }>('SELECT version() AS v'))[0]!.v;
  const pgbenchVersion = (await runPgbench(bin, pub, SOURCE_DB, ['--version'])).text.trim();
  await pub.createDatabase(SOURCE_DB);
  await pgbenchOk(bin, pub, SOURCE_DB, ['-i', '-q', '-s', String(SIZE.pgbenchScale)]);
  await pub.query(
    `ALTER TABLE public.pgbench_history ADD COLUMN hid bigserial PRIMARY KEY;
     CREATE PUBLICATION ${RATE_PUBLICATION} FOR TABLE ${PGBENCH_TABLES.join(', ')}`,
    [],
    SOURCE_DB,
  );
  await pub.query('VACUUM ANALYZE', [], SOURCE_DB);
  const pubDb = await benchClient(pub.url(SOURCE_DB));
  const steps: Step[] = [];
  const highest: RateResult['highest'] = { native: null, pgsub: null };
  const limitFound: RateResult['limitFound'] = { native: false, pgsub: false };
  let pgsubAtNative: Step | null = null;
  let pgsubPeakRssMB: number | null = null;
  try {
    for (const name of ['native', 'pgsub'] as const) {
      // Every subscriber starts from the same history (none) and a checkpoint; no slot exists now.
      await pubDb.query('TRUNCATE public.pgbench_history');
      await Promise.all([pub.query('CHECKPOINT'), tgt.query('CHECKPOINT')]);
      log(`rate: ${name}: preparing its target and starting it`);
      const sub = await startSubscriber(s, name, build);
      try {
        const quiet = await waitForQuiet(0.3, 2000, Number(QUIET_SECONDS) * 1000);
        if (quiet.waitedSeconds > 3) log(`  waited ${quiet.waitedSeconds} s for a quiet machine (${quiet.busyCores} cores busy)`);
        const r = await stepUp(s, sub, pubDb, steps);
        highest[name] = r.highest;
        limitFound[name] = r.limitFound;
        if (name === 'pgsub' && highest.native !== null) {
          const nat = highest.native;
          pgsubAtNative = steps.find((x) => x.subscriber === 'pgsub' && x.rate === nat) ?? null;
          if (!pgsubAtNative && steps[steps.length - 1]?.drainSeconds !== null) {
            pgsubAtNative = await runStep(s, sub, pubDb, nat, 'at-native');
            steps.push(pgsubAtNative);
          }
        }
      } finally {
        if (sub.memory) pgsubPeakRssMB = round(sub.memory.finish().peakRssMiB * 1.048576, 0);
        await sub.stop();
      }
    }
    return {
      steps,
      highest,
      limitFound,
      pgsubAtNative,
      nativeAtNative: steps.find((x) => x.subscriber === 'native' && x.rate === highest.native) ?? null,
      pgsubPeakRssMB,
      versions: { publisher: await version(pub), target: await version(tgt), pgbench: pgbenchVersion },
    };
  } finally {
    for (const c of [pubDb, s.pubMonitor, s.tgtMonitor]) await c.end().catch(() => {});
    await Promise.all([pub.stop(), tgt.stop()]);
  }
}

function printRate(r: RateResult): void {
  out(
    `\n## rate: the highest sustainable pgbench rate, PostgreSQL 18 → 18 (pgbench scale ${SIZE.pgbenchScale}, ${PGBENCH_CLIENTS} clients, -M prepared, ${SIZE.stepSeconds} s per step)`,
  );
  out(`replay lag (sampled every ${LAG_SAMPLE_MS} ms): now − the publisher's start time of the newest pgbench transaction visible on the target;`);
  out(`a step is sustained when its p99 is ≤ ${LAG_LIMIT_S} s and pgbench reached ≥ ${Math.round(RATE_SHORTFALL * 100)}% of the rate. walsender replay_lag: pg_stat_replication's`);
  out('(pgsub reports a position once the target flushed it, native once applied: not the same measure). busy: cores of the whole machine in use;');
  out('other load: cores used by processes outside this benchmark (servers, pgsub, pgbench, this process) — a shared machine makes a step fail early');
  out();
  out(
    formatTable(
      [
        'subscriber',
        'rate TPS',
        'pgbench TPS',
        'lag p50 s',
        'lag p99 s',
        'lag max s',
        'samples',
        'walsender replay_lag p99 s',
        'drain s',
        'busy cores',
        'pgsub cores',
        'other load',
        'result',
      ],
      r.steps.map((x) => [
        x.subscriber,
        `${fmtInt(x.rate)}${x.kind === 'step' ? '' : ` (${x.kind})`}`,
        f(x.pgbenchTps, 0),
        f(x.lagP50, 3),
        f(x.lagP99, 3),
        f(x.lagMax, 3),
        x.samples,
        f(x.walsenderReplayLagP99, 3),
        f(x.drainSeconds),
        f(x.machineBusyCores),
        f(x.pgsubCores),
        f(x.otherCores),
        x.why,
      ]),
    ),
  );
  const hi = (n: 'native' | 'pgsub') => (r.highest[n] === null ? `none (not even ${SIZE.rateStep} TPS)` : `${r.limitFound[n] ? '' : '≥ '}${fmtInt(r.highest[n]!)} TPS`);
  out(
    `\nhighest sustainable rate: native ${hi('native')}, pgsub ${hi('pgsub')}` +
      (r.highest.native && r.highest.pgsub
        ? ` (pgsub/native ${!r.limitFound.pgsub ? '≥ ' : !r.limitFound.native ? '≤ ' : ''}${(r.highest.pgsub / r.highest.native).toFixed(2)})`
        : ''),
  );
  if (r.pgsubAtNative)
    out(
      `pgsub at native's highest rate (${fmtInt(r.pgsubAtNative.rate)} TPS): p99 replay lag ${f(r.pgsubAtNative.lagP99, 3)} s (native ${f(r.nativeAtNative?.lagP99, 3)} s), p50 ${f(r.pgsubAtNative.lagP50, 3)} s (native ${f(r.nativeAtNative?.lagP50, 3)} s)`,
    );
  if (r.pgsubPeakRssMB !== null) out(`pgsub peak RSS over its steps: ${r.pgsubPeakRssMB} MB`);
}

// ---------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const started = Date.now();
  const build = snapshotPgsub(false, { build: !opts.tsx });
  log(
    `pgsub copied to ${build.dir} (src fingerprint ${build.fingerprint}, run as ${build.mode}${build.buildErrors ? `, ${build.buildErrors} tsc errors` : ''}); parts ${SELECTED.join(', ')}${QUICK ? ' (quick)' : ''}`,
  );
  const results: Partial<Record<Part, unknown>> = {};
  const errors: Partial<Record<Part, string>> = {};
  const seconds: Partial<Record<Part, number>> = {};
  const servers: Record<string, unknown> = {};
  const printers: (() => void)[] = [];
  try {
    for (const part of PARTS.filter((p) => SELECTED.includes(p))) {
      const t0 = Date.now();
      try {
        if (part === 'w1') {
          const r = await partW1(build);
          results.w1 = r.rows;
          servers.w1 = r.versions;
          printers.push(() => printW1(r.rows));
        } else if (part === 'copy') {
          const r = await partCopy(build);
          servers.copy = r.machine.server;
          const schedule = copySchedule(r);
          const { tables, ...dataset } = r.datasets.mixed!;
          results.copy = {
            dataset: { ...dataset, tables: tables.length },
            summaries: r.summaries,
            pgsubSchedule: schedule,
            resultFile: `sync-${r.startedAt.replace(/[:.]/g, '-')}.json`,
          };
          printers.push(() => printCopy(r, schedule));
        } else {
          const r = await partRate(build);
          results.rate = r;
          servers.rate = r.versions;
          printers.push(() => printRate(r));
        }
      } catch (err) {
        errors[part] = (err as Error).message;
        log(`part ${part} FAILED: ${(err as Error).stack ?? (err as Error).message}`);
        printers.push(() => out(`\n## ${part}: FAILED: ${(err as Error).message.split('\n')[0]}`));
      }
      seconds[part] = round((Date.now() - t0) / 1000, 0);
      log(`part ${part}: ${(seconds[part]! / 60).toFixed(1)} min`);
    }
    out(`# bench:scale${QUICK ? ' --quick' : ''}, ${new Date(started).toISOString().slice(0, 16).replace('T', ' ')} UTC`);
    out(
      `machine: ${coreCount()} cores (${os.cpus()[0]?.model ?? '?'}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}; pgsub ${build.head.slice(0, 12)}${build.dirty.length ? ' (with uncommitted changes)' : ''}, run as ${build.mode}`,
    );
    const pg18 =
      (servers.rate as RateResult['versions'] | undefined)?.publisher ??
      (servers.copy as string | undefined) ??
      Object.values((servers.w1 as Record<string, { publisher: string }> | undefined) ?? {})[0]?.publisher;
    if (pg18) out(`servers: ${pg18.split(' on ')[0]} → the same (publisher and target on this machine)`);
    if (servers.rate) out(`pgbench: ${(servers.rate as RateResult['versions']).pgbench}`);
    for (const p of printers) p();
    const total = (Date.now() - started) / 60_000;
    out(
      `\ntime: ${Object.entries(seconds)
        .map(([p, s]) => `${p} ${(s / 60).toFixed(1)} min`)
        .join(', ')}; total ${total.toFixed(1)} min`,
    );
    writeBenchResult(
      'scale',
      started,
      { servers },
      {
        pgsub: { head: build.head, dirty: build.dirty, srcFingerprint: build.fingerprint, runAs: build.mode, buildErrors: build.buildErrors },
        settings: {
          quick: QUICK,
          parts: SELECTED,
          size: SIZE,
          lagLimitSeconds: LAG_LIMIT_S,
          rateShortfall: RATE_SHORTFALL,
          pgbenchClients: PGBENCH_CLIENTS,
          pgbenchThreads: PGBENCH_THREADS,
        },
        partSeconds: seconds,
        errors,
        ...results,
      },
      out,
    );
  } finally {
    await stopAllClusters();
    build.remove();
  }
  if (Object.keys(errors).length) process.exitCode = 1;
}

main().catch((err) => {
  process.stderr.write(`bench:scale failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
