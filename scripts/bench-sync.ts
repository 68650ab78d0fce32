/**
 * `npm run bench:sync`: the initial table copy, pgsub against PostgreSQL's own
 * subscriber and against a plain `COPY … TO STDOUT | COPY … FROM STDIN` pipe, in the
 * same run on the same servers.
 *
 *   npm run bench:sync                               # full run (2,000,000 rows, 3 repetitions)
 *   npm run bench:sync -- --rows 200000 --reps 1     # a quick look
 *   npm run bench:sync -- --datasets single --contestants pgsub-w2,native-binary
 *   npm run bench:sync -- --pgsub-env PGSUB_SYNC_RANGE_MIN_MB=1000   # any pgsub setting, repeatable
 *   npm run bench:sync -- --publisher 14             # a PostgreSQL 14 publisher (the target stays 18)
 *   npm run bench:sync -- --baseline 1464e81         # also an earlier commit's pgsub, as pgsub-base-w2
 *
 * Servers: one PostgreSQL 18 publisher (--publisher: another major) and one PostgreSQL 18
 * target (throw-away clusters from test/harness, identical settings), on this machine.
 * Datasets, seeded once on the publisher: `single`, one table of --rows rows (~250 MB of heap at 2,000,000), and `set`,
 * 20 tables of geometric sizes and three column layouts with --rows rows in total.
 * Every measurement gets a fresh target database with the same DDL (primary keys
 * included, all tables logged) and starts after a CHECKPOINT on both servers.
 *
 * Contestants, each timed until the data is in and usable:
 *   pgsub-w2       `node bin/pgsub.js run` (PGSUB_* environment, binary, max_sync_workers
 *   pgsub-w4       2 or 4), from spawn until every table of the subscription is 'r' in
 *                  pgsub.subscription_rel; peak RSS from /proc/<pid>/status (VmHWM).
 *                  Only when named: pgsub-w1, pgsub-text-w2 (text COPY),
 *                  pgsub-w2-keep-indexes (defer_indexes off), pgsub-w2-no-freeze
 *                  (copy_freeze off), pgsub-w2-whole / pgsub-w2-split (every table
 *                  copied whole / split into ranges wherever possible).
 *                  pgsub-base-w2: --baseline's pgsub (a git archive of that commit,
 *                  built the same way), as pgsub-w2, in the same repetitions.
 *   native-binary  CREATE SUBSCRIPTION … WITH (copy_data = true, binary = true), from the
 *   native-text    statement until no pg_subscription_rel row is not 'r'; server defaults
 *                  (max_sync_workers_per_subscription = 2: one worker per table).
 *   pipe-binary    per table COPY … TO STDOUT (FORMAT binary) piped into COPY … FROM STDIN
 *   pipe-binary-p4 (FORMAT binary) with pg + pg-copy-streams in this process; one table
 *                  after the other, or four lanes (the table set only).
 * Also recorded: when all copies had finished (state f/s/r), pgsub's startup (spawn → first
 * COPY), CPU seconds per cluster / backend kind / pgsub / this process and the machine
 * total (scripts/bench-lib.ts), and pg_stat_activity wait-event samples on both sides.
 * Contestants rotate their order in each repetition; rows are counted afterwards (count
 * and sum of ids per table), a wrong result aborts the run.
 *
 * pgsub runs from a copy of bin/, src/ and migrations/ taken at startup and compiled with
 * tsc as `npm run build` would (--tsx: run the TypeScript through tsx instead; --live: the
 * working tree itself), so edits made to the tree during the run do not mix versions.
 *
 * A shared machine: before each measurement the script waits (up to 30 s) for the machine
 * to be idle; a run during which other processes used more than 0.25 cores is repeated
 * (--attempts, within --budget-minutes) and left out of the summary when a clean run
 * exists. --nice -5 gives the servers, pgsub and the pipe the same higher priority.
 *
 * Results: a table on stdout and bench-results/sync-<timestamp>.json. Nothing is asserted
 * about speed; issue 27's goals (binary: 1.3× native-binary, 1.2× pipe-binary) are
 * printed as met / not met.
 *
 * Only when named (scripts/bench-scale.ts runs it): `--datasets mixed`, --mixed-tables
 * (200) tables of mixed sizes — five of 1,000,000 rows, one wide table of 20,000 rows whose
 * `body` is 2–20 kB of text that does not compress (stored out of line, in its TOAST
 * table), the rest small (100 to 50,000 rows, log-uniform) — every count × --mixed-scale.
 * Each pgsub run's JSON lists per table when its copy started and finished (seconds since
 * the spawn, from pgsub's 'table copy started' / 'table copy finished' lines).
 * --pgsub-dir <dir> runs the copy of pgsub that a parent bench made instead of making one;
 * --quiet-seconds (30) bounds the wait for an idle machine before each measurement.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { installedMajors, startCluster, stopAllClusters, type Cluster } from '../test/harness/index.js';
import {
  ActivitySampler,
  copyPipe,
  CpuSampler,
  foreignCores,
  formatTable,
  median,
  MemorySampler,
  min,
  parsePgsubEnv,
  pollUntil,
  postmasterPid,
  preparedPgsub,
  reniceCluster,
  round,
  sleep,
  snapshotPgsub,
  spawnPgsub,
  type CpuReport,
  waitForQuiet,
  type PgsubBuild,
  writeBenchResult,
} from './bench-lib.js';

const SOURCE_DB = 'bench';
const APP = 'bench';
/** Both servers; PostgreSQL defaults otherwise. Big max_wal_size: no checkpoint forced by WAL volume mid-copy. */
const SERVER_SETTINGS = { shared_buffers: '128MB', max_wal_size: '8GB', checkpoint_timeout: '30min' };
const RUN_TIMEOUT_MS = 5 * 60_000;
/** The mixed dataset (1.3 GB at full scale, 200 tables): native starts a worker per table. */
const MIXED_RUN_TIMEOUT_MS = 20 * 60_000;
/** A run during which other processes used more than this many cores on average is repeated. */
const DISTURBED_CORES = 0.25;

const { values: opts } = parseArgs({
  options: {
    rows: { type: 'string', default: '2000000' },
    reps: { type: 'string', default: '3' },
    datasets: { type: 'string', default: 'single,set' },
    contestants: { type: 'string', default: '' },
    live: { type: 'boolean', default: false },
    tsx: { type: 'boolean', default: false },
    nice: { type: 'string', default: '0' },
    attempts: { type: 'string', default: '3' },
    'budget-minutes': { type: 'string', default: '30' },
    'pgsub-env': { type: 'string', multiple: true, default: [] },
    'mixed-tables': { type: 'string', default: '200' },
    'mixed-scale': { type: 'string', default: '1' },
    'pgsub-dir': { type: 'string' },
    'quiet-seconds': { type: 'string', default: '30' },
    publisher: { type: 'string', default: '18' },
    baseline: { type: 'string' },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  process.stdout.write(
    `${readFileSync(fileURLToPath(import.meta.url), 'utf8')
      .split('*/')[0]!
      .replace(/^\/\*\*\n?/, '')
      .replace(/^ \* ?/gm, '')}\n`,
  );
  process.exit(0);
}
const ROWS = Number(opts.rows);
const MIXED_TABLES = Number(opts['mixed-tables']);
if (!Number.isInteger(MIXED_TABLES) || MIXED_TABLES < 7) throw new Error(`--mixed-tables must be an integer ≥ 7, not ${opts['mixed-tables']}`);
const MIXED_SCALE = Number(opts['mixed-scale']);
if (!(MIXED_SCALE > 0 && MIXED_SCALE <= 10)) throw new Error(`--mixed-scale must be in (0, 10], not ${opts['mixed-scale']}`);
const REPS = Number(opts.reps);
const ATTEMPTS = Number(opts.attempts);
/** No more repetitions of disturbed runs after this. */
const BUDGET_MS = Number(opts['budget-minutes']) * 60_000;
/** Scheduling priority for the servers, pgsub and this process (e.g. -5 on a shared machine; root). */
const NICE = Number(opts.nice);
/** Before each measurement, wait at most this long for the machine to be idle. */
const QUIET_WAIT_MS = Number(opts['quiet-seconds']) * 1000;
/** --publisher 14: the publisher's major (the target is PostgreSQL 18). */
const PUBLISHER_MAJOR = Number(opts.publisher);
if (!installedMajors().includes(PUBLISHER_MAJOR))
  throw new Error(`--publisher ${opts.publisher}: PostgreSQL ${opts.publisher} is not installed (installed: ${installedMajors().join(', ')})`);
if (opts.contestants.split(',').includes('pgsub-base-w2') && !opts.baseline) throw new Error('--contestants pgsub-base-w2 needs --baseline <commit>');
/** --pgsub-env: settings for every pgsub contestant (after the contestant's own). */
const PGSUB_EXTRA_ENV = parsePgsubEnv(opts['pgsub-env']);

// ---------------------------------------------------------------------------------------
// Datasets

/** W: wide rows, a 2–20 kB text each (TOAST). */
type Layout = 'A' | 'B' | 'C' | 'W';
interface TableDef {
  name: string;
  layout: Layout;
  rows: number;
}
interface Dataset {
  name: 'single' | 'set' | 'mixed';
  publication: string;
  tables: TableDef[];
}

const DDL: Record<Layout, string> = {
  A: 'id bigint PRIMARY KEY, a integer NOT NULL, b integer, c integer, created_at timestamptz NOT NULL, note text NOT NULL',
  B: 'id bigint PRIMARY KEY, amount numeric(14,2) NOT NULL, flag boolean NOT NULL, created_at timestamptz NOT NULL, payload jsonb NOT NULL',
  C: 'id integer PRIMARY KEY, ref uuid NOT NULL, day date NOT NULL, qty smallint NOT NULL, label text NOT NULL',
  W: 'id bigint PRIMARY KEY, title text NOT NULL, body text NOT NULL',
};
const FILL: Record<Layout, string> = {
  A: `SELECT i, (i * 7) % 1000, (i * 13) % 100000, i % 7, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', md5(i::text) || md5((i + 1)::text)`,
  B: `SELECT i, (i % 100000) * 1.37, i % 3 = 0, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second', jsonb_build_object('n', i, 'tag', md5(i::text), 'ok', i % 2 = 0)`,
  C: `SELECT i, md5(i::text)::uuid, date '2020-01-01' + (i % 2000), (i % 30000)::smallint, md5((i * 3)::text) || md5((i * 5)::text)`,
  // 64–624 md5s (2–20 kB) of hex: pglz cannot take a quarter off, so it is stored as is, out of line.
  W: `SELECT i, 'document ' || i, (SELECT string_agg(md5(i::text || '/' || g::text), '') FROM generate_series(1, 64 + (i * 7919) % 561) AS g)`,
};

function datasets(): Dataset[] {
  const single: Dataset = { name: 'single', publication: 'pub_single', tables: [{ name: 'big', layout: 'A', rows: ROWS }] };
  // 20 tables, sizes falling geometrically (largest ≈ 70× the smallest), in a shuffled order
  // of names so that name order is not size order.
  const weights = Array.from({ length: 20 }, (_, i) => 0.8 ** i);
  const total = weights.reduce((a, b) => a + b, 0);
  const sizes = weights.map((w) => Math.max(1, Math.round((ROWS * w) / total)));
  const order = [7, 0, 13, 4, 18, 2, 10, 15, 1, 8, 19, 5, 12, 3, 16, 9, 6, 14, 11, 17];
  const set: Dataset = {
    name: 'set',
    publication: 'pub_set',
    tables: order.map((k, i) => ({ name: `set_${String(i + 1).padStart(2, '0')}`, layout: (['A', 'B', 'C'] as const)[i % 3]!, rows: sizes[k]! })),
  };
  return [single, set, mixed()].filter((d) => opts.datasets.split(',').includes(d.name));
}

/**
 * --mixed-tables tables: five of 1,000,000 rows, one wide (TOAST), the rest small (100 to
 * 50,000 rows, log-uniform by a golden-ratio sequence: deterministic); the big and wide
 * ones spread over the name order. Every count × --mixed-scale.
 */
function mixed(): Dataset {
  const n = MIXED_TABLES;
  const scaled = (rows: number) => Math.max(1, Math.round(rows * MIXED_SCALE));
  const big = new Set(Array.from({ length: 5 }, (_, k) => Math.floor(((2 * k + 1) * n) / 10)));
  let wide = Math.floor(n * 0.6) + 1;
  while (big.has(wide)) wide++;
  const layouts = ['A', 'B', 'C'] as const;
  let small = 0;
  const tables = Array.from({ length: n }, (_, i): TableDef => {
    const name = `mixed_${String(i + 1).padStart(3, '0')}`;
    if (i === wide) return { name: 'mixed_wide', layout: 'W', rows: scaled(20_000) };
    if (big.has(i)) return { name, layout: layouts[i % 3]!, rows: scaled(1_000_000) };
    const f = (++small * 0.6180339887) % 1;
    return { name, layout: layouts[i % 3]!, rows: scaled(100 * 500 ** f) };
  });
  return { name: 'mixed', publication: 'pub_mixed', tables };
}

const qname = (t: TableDef) => `public.${t.name}`;
const ddlFor = (d: Dataset) => d.tables.map((t) => `CREATE TABLE ${qname(t)} (${DDL[t.layout]});`).join('\n');

interface Expected {
  rows: number;
  sumId: string;
}
interface DatasetInfo {
  heapBytes: number;
  totalBytes: number;
  /** Out-of-line values (and the free space and visibility maps): pg_table_size − pg_relation_size. */
  toastBytes: number;
  rows: number;
  expected: Record<string, Expected>;
}

async function seed(pub: Cluster, all: Dataset[]): Promise<Record<string, DatasetInfo>> {
  await pub.createDatabase(SOURCE_DB);
  const out: Record<string, DatasetInfo> = {};
  for (const d of all) {
    const t0 = performance.now();
    await pub.query(ddlFor(d), [], SOURCE_DB);
    // Two loaders at once: the machine has two cores. Largest first, so that they end together.
    const queue = [...d.tables].sort((a, b) => b.rows - a.rows);
    await Promise.all(
      [0, 1].map(async () => {
        for (let t = queue.shift(); t; t = queue.shift()) await pub.query(`INSERT INTO ${qname(t)} ${FILL[t.layout]} FROM generate_series(1, ${t.rows}) AS i`, [], SOURCE_DB);
      }),
    );
    await pub.query(`CREATE PUBLICATION ${d.publication} FOR TABLE ${d.tables.map(qname).join(', ')}`, [], SOURCE_DB);
    // Frozen and analyzed: every contestant reads all-visible pages with hint bits set,
    // and pgsub's range split sees real page counts.
    await pub.query(`VACUUM (FREEZE, ANALYZE) ${d.tables.map(qname).join(', ')}`, [], SOURCE_DB);
    const expected: Record<string, Expected> = {};
    let heapBytes = 0;
    let totalBytes = 0;
    let toastBytes = 0;
    for (const t of d.tables) {
      const [r] = await pub.query<{ rows: string; sum_id: string; heap: string; total: string; toast: string }>(
        `SELECT count(*)::text AS rows, coalesce(sum(id), 0)::text AS sum_id, pg_relation_size('${qname(t)}')::text AS heap, pg_total_relation_size('${qname(t)}')::text AS total,
                (pg_table_size('${qname(t)}') - pg_relation_size('${qname(t)}'))::text AS toast FROM ${qname(t)}`,
        [],
        SOURCE_DB,
      );
      expected[t.name] = { rows: Number(r!.rows), sumId: r!.sum_id };
      heapBytes += Number(r!.heap);
      totalBytes += Number(r!.total);
      toastBytes += Number(r!.toast);
    }
    out[d.name] = { heapBytes, totalBytes, toastBytes, rows: d.tables.reduce((a, t) => a + t.rows, 0), expected };
    log(
      `seeded ${d.name}: ${d.tables.length} table(s), ${out[d.name]!.rows} rows, heap ${mb(heapBytes)} MB, with indexes ${mb(totalBytes)} MB (${((performance.now() - t0) / 1000).toFixed(1)} s)`,
    );
  }
  await pub.query('CHECKPOINT');
  return out;
}

// ---------------------------------------------------------------------------------------
// Contestants

/** The working tree's pgsub, and --baseline's (contestant pgsub-base-w2). */
interface Builds {
  current: PgsubBuild;
  base: PgsubBuild | null;
}

/** `extra`: only when named in --contestants (diagnostics). */
type Contestant = { id: string; extra?: boolean } & (
  | { kind: 'pgsub'; workers: number; binary: boolean; env?: Record<string, string>; baseline?: true }
  | { kind: 'native'; binary: boolean }
  | { kind: 'pipe'; lanes: number }
);

const CONTESTANTS: Contestant[] = [
  { id: 'pgsub-w1', kind: 'pgsub', workers: 1, binary: true, extra: true },
  { id: 'pgsub-text-w2', kind: 'pgsub', workers: 2, binary: false, extra: true },
  { id: 'pgsub-w2', kind: 'pgsub', workers: 2, binary: true },
  { id: 'pgsub-w2-keep-indexes', kind: 'pgsub', workers: 2, binary: true, extra: true, env: { PGSUB_DEFER_INDEXES: 'false' } },
  { id: 'pgsub-w2-no-freeze', kind: 'pgsub', workers: 2, binary: true, extra: true, env: { PGSUB_COPY_FREEZE: 'false' } },
  { id: 'pgsub-w2-whole', kind: 'pgsub', workers: 2, binary: true, extra: true, env: { PGSUB_SYNC_RANGE_MIN_MB: '1000000' } },
  { id: 'pgsub-w2-split', kind: 'pgsub', workers: 2, binary: true, extra: true, env: { PGSUB_SYNC_RANGE_MIN_MB: '0' } },
  { id: 'pgsub-w4', kind: 'pgsub', workers: 4, binary: true },
  { id: 'pgsub-base-w2', kind: 'pgsub', workers: 2, binary: true, extra: true, baseline: true },
  { id: 'native-binary', kind: 'native', binary: true },
  { id: 'native-text', kind: 'native', binary: false },
  { id: 'pipe-binary', kind: 'pipe', lanes: 1 },
  { id: 'pipe-binary-p4', kind: 'pipe', lanes: 4 },
];

function contestantsFor(d: Dataset): Contestant[] {
  const chosen = opts.contestants ? opts.contestants.split(',') : null;
  // --baseline adds its contestant to the chosen ones and to the default set alike.
  const wanted = (c: Contestant) => (chosen ? chosen.includes(c.id) : !c.extra) || (c.kind === 'pgsub' && c.baseline === true && opts.baseline !== undefined);
  return CONTESTANTS.filter((c) => wanted(c) && !(c.kind === 'pipe' && c.lanes > 1 && d.tables.length === 1));
}

interface RunResult {
  dataset: string;
  contestant: string;
  rep: number;
  /** Start → every table ready (pgsub, native) or every COPY committed (pipe). */
  seconds: number;
  /** Start → every table's copy finished (state f/s/r), as polled. */
  copiedSeconds: number;
  /** pgsub: spawn → first 'table copy started' log line. */
  startupSeconds?: number;
  peakRssMiB?: number;
  sampledMaxRssMiB?: number;
  copyBytes?: number;
  cpu: CpuReport;
  /** Cores used by processes outside the servers, pgsub and this process during the run. */
  foreignCores: number;
  /** foreignCores above DISTURBED_CORES: repeated, and left out of the summary if a clean run exists. */
  disturbed: boolean;
  quietWaitSeconds: number;
  activity: { samples: number; shares: Record<string, number> };
  details?: unknown;
}

interface Servers {
  pub: Cluster;
  tgt: Cluster;
  pubMonitor: pg.Client;
  tgtMonitor: pg.Client;
}

type Measured = Omit<RunResult, 'dataset' | 'contestant' | 'rep' | 'cpu' | 'activity' | 'foreignCores' | 'disturbed' | 'quietWaitSeconds'>;
let runCounter = 0;

async function measure(s: Servers, d: Dataset, info: DatasetInfo, c: Contestant, rep: number, builds: Builds): Promise<RunResult> {
  const n = ++runCounter;
  const db = `run_${n}_${d.name}_${c.id.replace(/-/g, '_')}`;
  const sub = `sub_${n}`;
  await s.tgt.createDatabase(db);
  await s.tgt.query(ddlFor(d), [], db);
  await Promise.all([s.pub.query('CHECKPOINT'), s.tgt.query('CHECKPOINT')]);
  const quietWaitSeconds = (await waitForQuiet(0.3, 2000, QUIET_WAIT_MS)).waitedSeconds;

  const cpu = new CpuSampler({ publisher: postmasterPid(s.pub.dataDir), target: postmasterPid(s.tgt.dataDir) });
  const activity = new ActivitySampler([
    { side: 'pub', client: s.pubMonitor, where: `a.datname = '${SOURCE_DB}' AND a.application_name IS DISTINCT FROM '${APP}'` },
    { side: 'tgt', client: s.tgtMonitor, where: `(a.datname = '${db}' OR a.backend_type LIKE 'logical replication %worker') AND a.application_name IS DISTINCT FROM '${APP}'` },
  ]);
  const poller = new pg.Client({ connectionString: s.tgt.url(db), application_name: APP });
  // A failed measurement (pgsub exited, say) leaves it open until the servers stop: their
  // shutdown ending its connection must not crash the bench before it reports the failure.
  poller.on('error', () => {});
  await poller.connect();
  let result: Measured;
  let cpuReport: CpuReport;
  let act: RunResult['activity'];
  const cleanups: (() => Promise<void>)[] = [];
  try {
    cpu.start();
    activity.start();
    if (c.kind === 'pgsub') result = await runPgsub(s, d, c, db, sub, poller, cpu, c.baseline ? builds.base! : builds.current, cleanups);
    else if (c.kind === 'native') result = await runNative(s, d, c, sub, poller, cleanups);
    else {
      const t0 = performance.now();
      const copyBytes = await copyPipe(s.pub.url(SOURCE_DB), s.tgt.url(db), d.tables.map(qname), c.lanes);
      const seconds = (performance.now() - t0) / 1000;
      result = { seconds, copiedSeconds: seconds, copyBytes };
    }
  } finally {
    // Let the postmasters reap the backends that just ended, so their CPU time is counted.
    await sleep(300);
    cpuReport = cpu.stop();
    act = activity.stop();
    for (const f of cleanups) await f();
  }
  // The result must be right before its time means anything.
  for (const t of d.tables) {
    const [r] = (await poller.query<{ rows: string; sum_id: string }>(`SELECT count(*)::text AS rows, coalesce(sum(id), 0)::text AS sum_id FROM ${qname(t)}`)).rows;
    const want = info.expected[t.name]!;
    if (Number(r!.rows) !== want.rows || r!.sum_id !== want.sumId) {
      throw new Error(`${c.id} on ${d.name}: ${t.name} has ${r!.rows} rows (sum of ids ${r!.sum_id}), expected ${want.rows} (${want.sumId})`);
    }
  }
  await poller.end();
  await s.tgt.query(`DROP DATABASE ${db} WITH (FORCE)`);
  const foreign = foreignCores(cpuReport);
  return { dataset: d.name, contestant: c.id, rep, ...result, cpu: cpuReport, foreignCores: foreign, disturbed: foreign > DISTURBED_CORES, quietWaitSeconds, activity: act };
}

/** Polls a per-table state column until every table is ready; notes when all were copied. */
async function waitReady(d: Dataset, states: () => Promise<{ total: number; ready: number; copied: number }>, check: () => void = () => {}): Promise<number> {
  let copiedAt = 0;
  await pollUntil(
    async () => {
      check();
      const r = await states();
      if (!copiedAt && r.total === d.tables.length && r.copied === r.total) copiedAt = performance.now();
      return r.total === d.tables.length && r.ready === r.total;
    },
    d.name === 'mixed' ? MIXED_RUN_TIMEOUT_MS : RUN_TIMEOUT_MS,
  );
  return copiedAt;
}

async function runPgsub(
  s: Servers,
  d: Dataset,
  c: Extract<Contestant, { kind: 'pgsub' }>,
  db: string,
  sub: string,
  poller: pg.Client,
  cpu: CpuSampler,
  build: PgsubBuild,
  cleanups: (() => Promise<void>)[],
): Promise<Measured> {
  const t0 = performance.now();
  const child = spawnPgsub(
    build,
    {
      PGSUB_SOURCE: s.pub.url(SOURCE_DB),
      PGSUB_TARGET: s.tgt.url(db),
      PGSUB_PUBLICATION: d.publication,
      PGSUB_SUBSCRIPTION: sub,
      PGSUB_MAX_SYNC_WORKERS: String(c.workers),
      PGSUB_BINARY: String(c.binary),
      PGSUB_LOG_LEVEL: 'info',
      ...c.env,
      ...PGSUB_EXTRA_ENV,
    },
    { nice: NICE },
  );
  cpu.addProcess('pgsub', child.pid);
  const mem = new MemorySampler(child.pid);
  cleanups.push(async () => {
    mem.finish();
    await child.stop();
    // The slot and the target's replication origin outlive pgsub (they are the
    // subscription's, and origins are cluster-wide: each holds one of the target's
    // max_active_replication_origins); this run is over.
    await pollUntil(async () => {
      const [slot] = await s.pub.query<{ active: boolean }>('SELECT active FROM pg_replication_slots WHERE slot_name = $1', [sub]);
      if (slot && !slot.active) await s.pub.query('SELECT pg_drop_replication_slot($1)', [sub]);
      return !slot?.active;
    }, 30_000);
    await s.tgt.query('SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname = $1', [`pgsub_${sub}`]);
  });
  const copiedAt = await waitReady(
    d,
    () =>
      poller
        .query<{ total: number; ready: number; copied: number }>(
          `SELECT count(*)::int AS total, count(*) FILTER (WHERE state = 'r')::int AS ready, count(*) FILTER (WHERE state IN ('f', 's', 'r'))::int AS copied
             FROM pgsub.subscription_rel WHERE subscription = $1`,
          [sub],
        )
        .then((q) => q.rows[0]!)
        .catch(() => ({ total: 0, ready: 0, copied: 0 })), // pgsub has not created its schema yet
    () => {
      if (child.exitCode() !== null) throw new Error(`pgsub exited (${child.exitCode()}) before every table was ready:\n${child.output().slice(-4000)}`);
    },
  );
  const seconds = (performance.now() - t0) / 1000;
  const memory = mem.finish();
  const logs = child.logs();
  const at = (epochMs: unknown) => (typeof epochMs === 'number' || typeof epochMs === 'string' ? round((Number(epochMs) - child.startedAt) / 1000) : null);
  const [phases] = (
    await poller.query<{ copy_start: string | null; copy_end: string | null; ready: string | null; bytes: string | null }>(
      `SELECT extract(epoch FROM min(copy_started_at)) * 1000 AS copy_start, extract(epoch FROM max(copy_finished_at)) * 1000 AS copy_end,
              extract(epoch FROM max(ready_at)) * 1000 AS ready, sum(bytes_copied)::text AS bytes
         FROM pgsub.subscription_rel WHERE subscription = $1`,
      [sub],
    )
  ).rows;
  return {
    seconds,
    copiedSeconds: (copiedAt - t0) / 1000,
    startupSeconds: at(logs.find((l) => l.msg === 'table copy started')?.time) ?? undefined,
    peakRssMiB: memory.peakRssMiB,
    sampledMaxRssMiB: memory.sampledMaxRssMiB,
    copyBytes: Number(phases?.bytes ?? 0),
    details: {
      // Seconds since spawn, from pgsub.subscription_rel (target clock) and pgsub's log.
      phases: { firstCopyStarted: at(phases?.copy_start), lastCopyFinished: at(phases?.copy_end), lastReady: at(phases?.ready) },
      log: logs.filter((l) => !String(l.msg).startsWith('table copy')).map((l) => `${at(l.time)} ${String(l.msg)}`),
      tables: logs
        .filter((l) => l.msg === 'table copy finished')
        .map((l) => ({
          table: l.table,
          rows: l.rows,
          bytes: l.bytes,
          seconds: l.seconds,
          ranges: l.ranges,
          startedAt: at(logs.find((s) => s.msg === 'table copy started' && s.table === l.table)?.time),
          finishedAt: at(l.time),
        })),
    },
  };
}

async function runNative(s: Servers, d: Dataset, c: Extract<Contestant, { kind: 'native' }>, sub: string, poller: pg.Client, cleanups: (() => Promise<void>)[]): Promise<Measured> {
  const conninfo = `host=${s.pub.host} port=${s.pub.port} user=${s.pub.user} dbname=${SOURCE_DB}`;
  const t0 = performance.now();
  cleanups.push(() => poller.query(`DROP SUBSCRIPTION IF EXISTS ${sub}`).then(() => {}));
  await poller.query(`CREATE SUBSCRIPTION ${sub} CONNECTION '${conninfo}' PUBLICATION ${d.publication} WITH (copy_data = true, binary = ${c.binary})`);
  const copiedAt = await waitReady(d, async () => {
    const r = (
      await poller.query<{ total: number; ready: number; copied: number; errors: number }>(
        `SELECT count(*)::int AS total, count(*) FILTER (WHERE srsubstate = 'r')::int AS ready, count(*) FILTER (WHERE srsubstate IN ('f', 's', 'r'))::int AS copied,
                (SELECT (apply_error_count + sync_error_count)::int FROM pg_catalog.pg_stat_subscription_stats WHERE subname = $1) AS errors
           FROM pg_catalog.pg_subscription_rel WHERE srsubid = (SELECT oid FROM pg_catalog.pg_subscription WHERE subname = $1)`,
        [sub],
      )
    ).rows[0]!;
    // A worker error would only be retried every wal_retrieve_retry_interval; the run is void.
    if (r.errors > 0) throw new Error(`native subscription ${sub} reported a worker error; target server log:\n${tailFile(path.join(s.tgt.dataDir, 'server.log'))}`);
    return r;
  });
  return { seconds: (performance.now() - t0) / 1000, copiedSeconds: (copiedAt - t0) / 1000 };
}

// ---------------------------------------------------------------------------------------
// Report

interface Summary {
  dataset: string;
  contestant: string;
  runs: number;
  disturbedRunsLeftOut: number;
  disturbedRunsKept: number;
  minSeconds: number;
  medianSeconds: number;
  medianCopiedSeconds: number;
  mbPerSecond: number;
  vsNative: number | null;
  vsNativeMin: number | null;
  /** Against native with its default binary = false. */
  vsNativeText: number | null;
  vsPipe: number | null;
  vsPipeMin: number | null;
  peakRssMiB: number | null;
  startupSeconds: number | null;
  /** Median cores used by other processes on the machine during these runs. */
  foreignCores: number;
  cpu: Record<string, number>;
}

function summarize(results: RunResult[], infos: Record<string, DatasetInfo>): Summary[] {
  const out: Summary[] = [];
  const groups = new Map<string, RunResult[]>();
  for (const r of results) groups.set(`${r.dataset}\u0000${r.contestant}`, [...(groups.get(`${r.dataset}\u0000${r.contestant}`) ?? []), r]);
  // Runs disturbed by other jobs on the machine count only where no clean run exists.
  const excluded = new Map<string, number>();
  for (const [k, runs] of groups) {
    if (!runs.some((r) => !r.disturbed)) continue;
    groups.set(
      k,
      runs.filter((r) => !r.disturbed),
    );
    excluded.set(k, runs.filter((r) => r.disturbed).length);
  }
  const stat = (dataset: string, contestant: string, f: (xs: number[]) => number) => {
    const g = groups.get(`${dataset}\u0000${contestant}`);
    return g ? f(g.map((r) => r.seconds)) : null;
  };
  for (const [, runs] of groups) {
    const { dataset, contestant } = runs[0]!;
    const times = runs.map((r) => r.seconds);
    const med = median(times);
    const lo = min(times);
    const nativeMed = stat(dataset, 'native-binary', median);
    const nativeMin = stat(dataset, 'native-binary', min);
    const nativeTextMed = stat(dataset, 'native-text', median);
    const pipeMed = stat(dataset, 'pipe-binary', median);
    const pipeMin = stat(dataset, 'pipe-binary', min);
    const cpuKeys = new Set(runs.flatMap((r) => Object.keys(r.cpu.groups)));
    const cpu: Record<string, number> = {};
    for (const k of cpuKeys) cpu[k] = round(median(runs.map((r) => r.cpu.groups[k] ?? 0)));
    cpu.machine = round(median(runs.map((r) => r.cpu.machineBusy)));
    // The copying client: pgsub, or this process for the pipe (native has none outside the servers).
    cpu.client = contestant.startsWith('pgsub') ? (cpu.pgsub ?? 0) : contestant.startsWith('pipe') ? (cpu.bench ?? 0) : 0;
    const rss = runs.map((r) => r.peakRssMiB).filter((x): x is number => x !== undefined);
    const startup = runs.map((r) => r.startupSeconds).filter((x): x is number => x !== undefined);
    out.push({
      dataset,
      contestant,
      runs: runs.length,
      disturbedRunsLeftOut: excluded.get(`${dataset}\u0000${contestant}`) ?? 0,
      disturbedRunsKept: runs.filter((r) => r.disturbed).length,
      minSeconds: round(lo),
      medianSeconds: round(med),
      medianCopiedSeconds: round(median(runs.map((r) => r.copiedSeconds))),
      mbPerSecond: round(infos[dataset]!.heapBytes / 1e6 / med, 1),
      vsNative: nativeMed ? round(nativeMed / med) : null,
      vsNativeMin: nativeMin ? round(nativeMin / lo) : null,
      vsNativeText: nativeTextMed ? round(nativeTextMed / med) : null,
      vsPipe: pipeMed ? round(pipeMed / med) : null,
      vsPipeMin: pipeMin ? round(pipeMin / lo) : null,
      peakRssMiB: rss.length ? round(Math.max(...rss), 0) : null,
      startupSeconds: startup.length ? round(median(startup)) : null,
      foreignCores: round(median(runs.map((r) => r.foreignCores))),
      cpu,
    });
  }
  const order = CONTESTANTS.map((c) => c.id);
  return out.sort((a, b) => (a.dataset === b.dataset ? order.indexOf(a.contestant) - order.indexOf(b.contestant) : a.dataset === 'single' ? -1 : 1));
}

function printReport(summaries: Summary[], infos: Record<string, DatasetInfo>): string[] {
  const f = (x: number | null, d = 2) => (x === null ? '-' : x.toFixed(d));
  const header = [
    'dataset',
    'contestant',
    'runs',
    'min s',
    'median s',
    'copied s',
    'MB/s',
    '×native',
    '×native-text',
    '×pipe',
    'peak RSS MiB',
    'startup s',
    'CPU s pub/tgt/client/all',
    'other load',
  ];
  const rows = summaries.map((s) => [
    s.dataset,
    s.contestant,
    s.runs,
    f(s.minSeconds),
    f(s.medianSeconds),
    f(s.medianCopiedSeconds),
    f(s.mbPerSecond, 1),
    f(s.vsNative),
    f(s.vsNativeText),
    f(s.vsPipe),
    s.peakRssMiB === null ? '-' : String(s.peakRssMiB),
    f(s.startupSeconds),
    `${f(s.cpu.publisher ?? 0, 1)}/${f(s.cpu.target ?? 0, 1)}/${f(s.cpu.client ?? 0, 1)}/${f((s.cpu.publisher ?? 0) + (s.cpu.target ?? 0) + (s.cpu.client ?? 0), 1)}`,
    f(s.foreignCores),
  ]);
  out('');
  for (const [name, i] of Object.entries(infos))
    out(`${name}: ${i.rows} rows, heap ${mb(i.heapBytes)} MB (MB/s is heap MB per median second), with indexes ${mb(i.totalBytes)} MB`);
  out('×native, ×native-text, ×pipe: median time of native-binary, native-text or pipe-binary divided by this median (> 1 = faster)');
  out('seconds: start → every table ready (pipe: every COPY committed); copied: → every copy finished');
  out('CPU: median CPU seconds of the publisher, the target, the copying client (pgsub, or this process for the pipe) and their sum');
  out('other load: median cores used meanwhile by processes outside this benchmark (a shared machine makes wall times noisy)');
  out('');
  out(formatTable(header, rows));
  const left = summaries.reduce((a, x) => a + x.disturbedRunsLeftOut, 0);
  const kept = summaries.filter((x) => x.disturbedRunsKept > 0).map((x) => `${x.dataset}/${x.contestant}`);
  if (left) out(`\n${left} run(s) disturbed by other processes on the machine were repeated and left out`);
  if (kept.length) out(`disturbed runs kept for want of clean ones: ${kept.join(', ')}`);
  const goals: string[] = [];
  const get = (dataset: string, contestant: string) => summaries.find((s) => s.dataset === dataset && s.contestant === contestant);
  const check = (what: string, value: number | null | undefined, goal: number) => {
    if (value === null || value === undefined) return;
    goals.push(`${value >= goal ? 'met    ' : 'NOT met'}  ${what}: ${value.toFixed(2)}× (goal ≥ ${goal}×)`);
  };
  // Issue 27: binary copies at 1.3× native's binary copy and 1.2× a plain binary COPY pipe.
  for (const c of CONTESTANTS.filter((c) => c.kind === 'pgsub' && !c.extra)) {
    check(`${c.id} vs native-binary, single table`, get('single', c.id)?.vsNative, 1.3);
    check(`${c.id} vs native-binary, table set`, get('set', c.id)?.vsNative, 1.3);
    check(`${c.id} vs pipe-binary, single table`, get('single', c.id)?.vsPipe, 1.2);
    check(`${c.id} vs pipe-binary, table set`, get('set', c.id)?.vsPipe, 1.2);
  }
  for (const dataset of ['single', 'set']) {
    const [now, then] = [get(dataset, 'pgsub-w2'), get(dataset, 'pgsub-base-w2')];
    if (now?.medianSeconds && then?.medianSeconds)
      goals.push(`info     pgsub-w2 against --baseline, ${dataset}: ${(then.medianSeconds / now.medianSeconds).toFixed(2)}× (pgsub-base-w2 ${then.medianSeconds.toFixed(2)} s)`);
  }
  if (goals.length) {
    out('\ngoals (medians):');
    for (const g of goals) out(`  ${g}`);
  }
  return goals;
}

// ---------------------------------------------------------------------------------------

const out = (line: string) => process.stdout.write(`${line}\n`);
const tailFile = (file: string, lines = 30) => {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch (err) {
    return `(${String(err)})`;
  }
};
const log = (line: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const mb = (bytes: number) => (bytes / 1e6).toFixed(0);

async function main(): Promise<void> {
  const started = Date.now();
  const all = datasets();
  const build = opts['pgsub-dir'] ? preparedPgsub(opts['pgsub-dir']) : snapshotPgsub(opts.live, { build: !opts.tsx });
  const base = opts.baseline ? snapshotPgsub(false, { build: !opts.tsx, commit: opts.baseline }) : null;
  if (base) log(`pgsub-base-w2: ${opts.baseline} (${base.head.slice(0, 12)}) copied to ${base.dir}, run as ${base.mode}`);
  const builds: Builds = { current: build, base };
  let servers: Servers | undefined;
  const results: RunResult[] = [];
  try {
    log(
      `pgsub ${opts.live ? 'working tree' : `copied to ${build.dir}`}, run via ${build.mode}${build.buildErrors ? ` (tsc reported ${build.buildErrors} type errors)` : ''}, src fingerprint ${build.fingerprint}; starting a PostgreSQL ${PUBLISHER_MAJOR} publisher and a PostgreSQL 18 target`,
    );
    const [pub, tgt] = await Promise.all([
      startCluster({ major: PUBLISHER_MAJOR, name: 'bench-sync-pub', settings: SERVER_SETTINGS }),
      startCluster({ major: 18, name: 'bench-sync-tgt', settings: SERVER_SETTINGS }),
    ]);
    if (NICE) {
      // Everything measured gets the same priority over other jobs on a shared machine.
      for (const c of [pub, tgt]) reniceCluster(c.dataDir, NICE);
      os.setPriority(NICE);
    }
    const pubMonitor = new pg.Client({ connectionString: pub.url(), application_name: APP });
    const tgtMonitor = new pg.Client({ connectionString: tgt.url(), application_name: APP });
    await Promise.all([pubMonitor.connect(), tgtMonitor.connect()]);
    servers = { pub, tgt, pubMonitor, tgtMonitor };
    const version = (await pub.query<{ version: string }>('SELECT version()'))[0]!.version;
    const infos = await seed(pub, all);

    for (let rep = 1; rep <= REPS; rep++) {
      for (const d of all) {
        const list = contestantsFor(d);
        // Rotate the order each repetition so that no contestant always runs first.
        const rotated = list.map((_, i) => list[(i + rep - 1) % list.length]!);
        for (const c of rotated) {
          for (let attempt = 1; ; attempt++) {
            const r = await measure(servers, d, infos[d.name]!, c, rep, builds);
            results.push(r);
            log(
              `rep ${rep} ${d.name} ${c.id}: ${r.seconds.toFixed(2)} s (copied ${r.copiedSeconds.toFixed(2)} s)` +
                (r.peakRssMiB !== undefined ? `, peak RSS ${r.peakRssMiB.toFixed(0)} MiB, startup ${r.startupSeconds} s` : '') +
                `, CPU ${JSON.stringify(r.cpu.groups)}, machine ${r.cpu.machineBusy} of ${round(r.cpu.wallSeconds * r.cpu.cores)}` +
                (r.quietWaitSeconds > 3 ? `, waited ${r.quietWaitSeconds} s for a quiet machine` : '') +
                (r.disturbed ? `; DISTURBED: ${r.foreignCores} cores used by other processes` : ''),
            );
            if (!r.disturbed || attempt >= ATTEMPTS || Date.now() - started > BUDGET_MS) break;
          }
        }
      }
    }

    const summaries = summarize(results, infos);
    const goals = printReport(summaries, infos);
    writeBenchResult(
      'sync',
      started,
      { server: version },
      {
        pgsub: { head: build.head, dirty: build.dirty, srcFingerprint: build.fingerprint, copiedTree: !opts.live, mode: build.mode, buildTypeErrors: build.buildErrors },
        ...(base ? { baseline: { commit: base.head, srcFingerprint: base.fingerprint, runAs: base.mode } } : {}),
        publisherMajor: PUBLISHER_MAJOR,
        settings: { server: SERVER_SETTINGS, rows: ROWS, reps: REPS, pgsubEnv: PGSUB_EXTRA_ENV, nativeDefaults: 'max_sync_workers_per_subscription = 2 (default)' },
        datasets: Object.fromEntries(all.map((d) => [d.name, { ...infos[d.name], tables: d.tables }])),
        summaries,
        goals,
        runs: results,
      },
      out,
    );
  } finally {
    await servers?.pubMonitor.end().catch(() => {});
    await servers?.tgtMonitor.end().catch(() => {});
    await stopAllClusters();
    build.remove();
    base?.remove();
  }
}

main().catch((err) => {
  process.stderr.write(`bench:sync failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
