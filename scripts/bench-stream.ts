/**
 * `npm run bench:stream`: one large transaction (default 5,000,000 inserted rows), pgsub
 * against PostgreSQL's own subscriber, for each `streaming` mode, in the same run on the
 * same servers; pgsub's peak memory and its spool's peak size.
 *
 *   npm run bench:stream                               # full run: 5,000,000 rows, modes off, on, parallel
 *   npm run bench:stream -- --rows 500000              # a quick look
 *   npm run bench:stream -- --modes on --contestants pgsub
 *   npm run bench:stream -- --rows 20000 --value-bytes 65536   # wide rows: 64 kB values
 *
 * Servers: one PostgreSQL 18 publisher and one PostgreSQL 18 target (throw-away clusters
 * from test/harness, same settings: logical_decoding_work_mem 64MB, the default, so a
 * large transaction spills (streaming off) or is streamed (on, parallel) as it would in
 * production; max_wal_size 4GB and checkpoint_timeout 30min so the WAL of one
 * transaction does not force checkpoints in the middle of it). Publisher table
 * `public.big (id bigint PRIMARY KEY, n integer, t text)` with t 40 characters (or
 * --value-bytes); every
 * measurement gets a fresh target database with the same table.
 *
 * One measurement = one contestant × one mode:
 *   pgsub   `node bin/pgsub.js run` (PGSUB_* environment: copy_data false, streaming
 *           <mode>, a fresh state_dir and subscription name), started and waited for until
 *           it logs 'streaming started' and its slot is active. A mode pgsub's config
 *           refuses (exit 2, not implemented) is recorded as refused, not measured.
 *   native  CREATE SUBSCRIPTION … WITH (copy_data = false, streaming = <mode>), waited for
 *           until pg_stat_subscription shows its apply worker and the slot is active.
 * Then ONE transaction on the publisher, `INSERT … SELECT … FROM generate_series(1, N)`;
 * the publisher's WAL position just after its commit is the end LSN. Timed from the start
 * of the INSERT until the subscription's slot has confirmed_flush_lsn ≥ the end LSN and
 * the target table holds N rows ("seconds"); "lag" is the part after the commit
 * returned. Sampled every 200 ms: pgsub's VmRSS / RssAnon (/proc/<pid>/status; VmHWM at
 * the end is the exact peak), the size of its spool directory, and for native the RSS of
 * its apply workers (leader and parallel; a backend's RSS includes the shared buffers it
 * touched, so RssAnon is the comparable number). Also recorded: CPU seconds per cluster
 * and pgsub (scripts/bench-lib.ts), the slot's decoding statistics
 * (pg_stat_replication_slots: spilled / streamed bytes), and a correctness check (count
 * and sum of ids). After each measurement the subscription and its slot are dropped and
 * the publisher table truncated, so every run starts from the same state.
 *
 * Duration: the full run (5,000,000 rows, 3 modes × 2 contestants, pgsub refusing
 * parallel) takes 5 to 10 minutes on a 2-core machine, most of it pgsub with streaming
 * off; --rows and --modes make it shorter, and a measurement that exceeds
 * --timeout-minutes (default 15) fails the run. Before each measurement it waits up to
 * 30 s for the machine to be quiet; the CPU other processes used meanwhile is logged.
 *
 * pgsub runs from a copy of bin/, src/ and migrations/ taken at startup and compiled
 * with tsc, as an installed pgsub runs (--tsx: the TypeScript sources through tsx, which
 * costs memory of its own; --live: the working tree as it is). --trace-memory loads a
 * preload module into pgsub (NODE_OPTIONS --import) that prints process.memoryUsage()
 * every 200 ms — V8 heap used / total, external and array buffers next to the RSS — and
 * keeps those samples in the JSON; --pgsub-env PGSUB_QUEUE_SIZE=1000 (repeatable) sets
 * more of pgsub's settings for an experiment. Results: a table on stdout and
 * bench-results/stream-<timestamp>.json. Nothing is asserted about speed; the memory goal
 * (issue 27: peak RSS at most 200 MB) is printed as met / not met.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { startCluster, stopAllClusters, type Cluster } from '../test/harness/index.js';
import {
  CpuSampler,
  foreignCores,
  formatTable,
  postmasterPid,
  round,
  sleep,
  snapshotPgsub,
  spawnPgsub,
  waitForQuiet,
  type CpuReport,
  type PgsubBuild,
  type WatchedPgsub,
  readMemory,
  writeBenchResult,
} from './bench-lib.js';

const SOURCE_DB = 'bench';
const APP = 'bench';
const PUBLICATION = 'pub_big';
const TABLE = 'public.big';
const DDL = `CREATE TABLE ${TABLE} (id bigint PRIMARY KEY, n integer NOT NULL, t text NOT NULL)`;
/** Both servers. logical_decoding_work_mem is the default, stated because it decides when decoding spills or streams. */
const SERVER_SETTINGS = {
  shared_buffers: '128MB',
  logical_decoding_work_mem: '64MB',
  max_wal_size: '4GB',
  checkpoint_timeout: '30min',
};
const MODES = ['off', 'on', 'parallel'] as const;
type Mode = (typeof MODES)[number];
const CONTESTANTS = ['pgsub', 'native'] as const;
type ContestantKind = (typeof CONTESTANTS)[number];
/** The issue's memory goal: pgsub's peak RSS under this many (decimal) megabytes. */
const RSS_GOAL_MB = 200;
const SAMPLE_MS = 200;

const { values: opts } = parseArgs({
  options: {
    rows: { type: 'string', default: '5000000' },
    'value-bytes': { type: 'string', default: '40' },
    modes: { type: 'string', default: MODES.join(',') },
    contestants: { type: 'string', default: CONTESTANTS.join(',') },
    'timeout-minutes': { type: 'string', default: '15' },
    live: { type: 'boolean', default: false },
    tsx: { type: 'boolean', default: false },
    'trace-memory': { type: 'boolean', default: false },
    'pgsub-env': { type: 'string', multiple: true, default: [] },
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
if (!Number.isInteger(ROWS) || ROWS < 1) throw new Error(`--rows must be a positive integer, not ${opts.rows}`);
const SELECTED_MODES = opts.modes.split(',').map((m) => m.trim()) as Mode[];
for (const m of SELECTED_MODES) if (!MODES.includes(m)) throw new Error(`--modes: unknown mode ${m} (known: ${MODES.join(', ')})`);
const SELECTED_CONTESTANTS = opts.contestants.split(',').map((c) => c.trim()) as ContestantKind[];
for (const c of SELECTED_CONTESTANTS) if (!CONTESTANTS.includes(c)) throw new Error(`--contestants: unknown ${c} (known: ${CONTESTANTS.join(', ')})`);
const RUN_TIMEOUT_MS = Number(opts['timeout-minutes']) * 60_000;
const TRACE_MEMORY = opts['trace-memory'];
/** Extra PGSUB_* settings for experiments, e.g. --pgsub-env PGSUB_QUEUE_SIZE=1000. */
const PGSUB_EXTRA_ENV: Record<string, string> = Object.fromEntries(
  opts['pgsub-env'].map((kv) => {
    const eq = kv.indexOf('=');
    if (eq < 1 || !kv.startsWith('PGSUB_')) throw new Error(`--pgsub-env wants PGSUB_NAME=value, not ${kv}`);
    return [kv.slice(0, eq), kv.slice(eq + 1)];
  }),
);

const VALUE_BYTES = Number(opts['value-bytes']);
if (!Number.isInteger(VALUE_BYTES) || VALUE_BYTES < 1) throw new Error(`--value-bytes must be a positive integer, not ${opts['value-bytes']}`);
/** t: VALUE_BYTES hex characters (a repeated md5 beyond 64, which TOAST compresses but pgoutput sends whole). */
const T_VALUE =
  VALUE_BYTES <= 64 ? `substr(md5(i::text) || md5((i + 1)::text), 1, ${VALUE_BYTES})` : `substr(repeat(md5(i::text), ${Math.ceil(VALUE_BYTES / 32)}), 1, ${VALUE_BYTES})`;
const FILL = `INSERT INTO ${TABLE} (id, n, t) SELECT i, (i % 1000)::int, ${T_VALUE} FROM generate_series(1, ${ROWS}) AS i`;
const EXPECTED_SUM = ((BigInt(ROWS) * BigInt(ROWS + 1)) / 2n).toString();

// ---------------------------------------------------------------------------------------
// Samplers

const MB = (bytes: number) => bytes / 1e6;

/** VmRSS, RssAnon and VmHWM of a process, in decimal MB; null once it has gone. */
function procMemory(pid: number): { rss: number; anon: number; hwm: number } | null {
  const m = readMemory(pid);
  const mb = (mib: number) => (mib * 1024 * 1024) / 1e6;
  return m && { rss: mb(m.rssMiB), anon: mb(m.anonMiB), hwm: mb(m.hwmMiB) };
}

/** Bytes of the files directly in a directory (0 when it does not exist yet). */
function dirBytes(dir: string): number {
  let total = 0;
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return 0;
  }
  for (const name of names) {
    try {
      total += statSync(path.join(dir, name)).size;
    } catch {
      // removed between readdir and stat
    }
  }
  return total;
}

interface Sample {
  /** Seconds since the INSERT started (negative: before it). */
  t: number;
  rssMB: number;
  anonMB: number;
  spoolMB?: number;
}

/**
 * Every SAMPLE_MS: the memory of the watched processes (summed) and, for pgsub, its spool
 * directory. `pids` is called each time, so a changing set (native's parallel apply
 * workers) is followed; `hwm` keeps the largest VmHWM seen per pid.
 */
class RunSampler {
  readonly samples: Sample[] = [];
  private readonly hwm = new Map<number, number>();
  private maxAnon = 0;
  private maxSpool = 0;
  private timer: NodeJS.Timeout;
  private t0 = performance.now();
  private finished: ReturnType<RunSampler['finish']> | null = null;

  constructor(
    private readonly pids: () => number[],
    private readonly spoolDir: string | null,
  ) {
    this.timer = setInterval(() => this.sample(), SAMPLE_MS);
  }

  /** The INSERT starts: sample times count from here. */
  mark(): void {
    this.t0 = performance.now();
  }

  sample(): void {
    let rss = 0;
    let anon = 0;
    for (const pid of this.pids()) {
      const m = procMemory(pid);
      if (!m) continue;
      rss += m.rss;
      anon += m.anon;
      this.hwm.set(pid, Math.max(this.hwm.get(pid) ?? 0, m.hwm));
    }
    this.maxAnon = Math.max(this.maxAnon, anon);
    const s: Sample = { t: round((performance.now() - this.t0) / 1000), rssMB: round(rss, 1), anonMB: round(anon, 1) };
    if (this.spoolDir !== null) {
      const spool = MB(dirBytes(this.spoolDir));
      this.maxSpool = Math.max(this.maxSpool, spool);
      s.spoolMB = round(spool, 1);
    }
    this.samples.push(s);
  }

  /** Call while the processes still run; later calls return the same figures. */
  finish(): { peakRssMB: number; sampledMaxRssMB: number; sampledMaxAnonMB: number; spoolPeakMB: number | null } {
    if (this.finished) return this.finished;
    this.sample();
    clearInterval(this.timer);
    return (this.finished = {
      // Per process exact peaks, summed (for one process: its VmHWM).
      peakRssMB: round(
        [...this.hwm.values()].reduce((a, b) => a + b, 0),
        1,
      ),
      sampledMaxRssMB: round(Math.max(0, ...this.samples.map((s) => s.rssMB)), 1),
      sampledMaxAnonMB: round(this.maxAnon, 1),
      spoolPeakMB: this.spoolDir === null ? null : round(this.maxSpool, 1),
    });
  }
}

// ---------------------------------------------------------------------------------------
// Servers

interface Servers {
  pub: Cluster;
  tgt: Cluster;
  /** Long-lived sessions: the publisher's workload, and monitoring on both sides. */
  pubWork: pg.Client;
  pubMonitor: pg.Client;
  tgtMonitor: pg.Client;
}

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, application_name: APP });
  c.on('error', () => {}); // a server stopped under an idle client; its next query fails
  await c.connect();
  return c;
}

async function setup(): Promise<Servers> {
  const [pub, tgt] = await Promise.all([
    startCluster({ major: 18, name: 'bench-stream-pub', settings: SERVER_SETTINGS }),
    startCluster({ major: 18, name: 'bench-stream-tgt', settings: SERVER_SETTINGS }),
  ]);
  await pub.createDatabase(SOURCE_DB);
  await pub.query(`${DDL}; CREATE PUBLICATION ${PUBLICATION} FOR TABLE ${TABLE}`, [], SOURCE_DB);
  return { pub, tgt, pubWork: await client(pub.url(SOURCE_DB)), pubMonitor: await client(pub.url()), tgtMonitor: await client(tgt.url()) };
}

async function lsnOf(c: pg.Client): Promise<string> {
  return (await c.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn')).rows[0]!.lsn;
}

function lsnValue(text: string): bigint {
  const [hi, lo] = text.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

async function slotRow(s: Servers, slot: string): Promise<{ active: boolean; confirmed: string | null } | undefined> {
  return (
    await s.pubMonitor.query<{ active: boolean; confirmed: string | null }>(
      'SELECT active, confirmed_flush_lsn::text AS confirmed FROM pg_catalog.pg_replication_slots WHERE slot_name = $1',
      [slot],
    )
  ).rows[0];
}

async function pollUntil(what: string, done: () => Promise<boolean>, timeoutMs: number, intervalMs = SAMPLE_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${Math.round(timeoutMs / 1000)} s waiting for ${what}`);
    await sleep(intervalMs);
  }
}

// ---------------------------------------------------------------------------------------
// One measurement

interface Subscriber {
  slot: string;
  /** Processes whose memory is sampled. */
  pids(): number[];
  /** Throws when the subscriber has visibly failed (so waiting stops early). */
  check(): Promise<void>;
  stop(): Promise<void>;
  spoolDir: string | null;
  /** `insertEpoch`: Date.now() when the INSERT started, to align sample times. */
  details(insertEpoch: number): Record<string, unknown>;
}

interface RunResult {
  mode: Mode;
  contestant: ContestantKind;
  /** The contestant does not support the mode (pgsub's config refused it). */
  refused?: string;
  /** INSERT start → slot confirmed the end LSN and the target holds every row. */
  seconds?: number;
  /** Commit returned → the same. */
  lagSeconds?: number;
  insertSeconds?: number;
  /** Bytes of WAL between the INSERT's start and its commit. */
  walBytes?: number;
  peakRssMB?: number;
  sampledMaxRssMB?: number;
  sampledMaxAnonMB?: number;
  spoolPeakMB?: number | null;
  cpu?: CpuReport;
  foreignCores?: number;
  slotStats?: Record<string, unknown>;
  memory?: Sample[];
  details?: Record<string, unknown>;
}

let runCounter = 0;

async function measure(s: Servers, mode: Mode, kind: ContestantKind, build: PgsubBuild): Promise<RunResult> {
  const n = ++runCounter;
  const db = `run_${n}_${kind}_${mode}`;
  const sub = `bench_${n}_${kind}_${mode}`;
  await s.tgt.createDatabase(db);
  await s.tgt.query(DDL, [], db);
  const poller = await client(s.tgt.url(db));
  let subscriber: Subscriber | null = null;
  let sampler: RunSampler | null = null;
  let cpu: CpuSampler | null = null;
  try {
    await Promise.all([s.pub.query('CHECKPOINT'), s.tgt.query('CHECKPOINT')]);
    const started = kind === 'pgsub' ? await startPgsub(s, mode, db, sub, build) : await startNative(s, mode, sub, poller);
    if ('refused' in started) return { mode, contestant: kind, refused: started.refused };
    subscriber = started;
    await pollUntil(
      `slot ${sub} to be active`,
      async () => {
        await subscriber!.check();
        return (await slotRow(s, sub))?.active === true;
      },
      60_000,
    );
    const quiet = await waitForQuiet(0.3, 2000, 30_000);
    if (quiet.waitedSeconds > 3) log(`waited ${quiet.waitedSeconds} s for a quiet machine`);

    cpu = new CpuSampler({ publisher: postmasterPid(s.pub.dataDir), target: postmasterPid(s.tgt.dataDir) });
    const pids = subscriber.pids;
    if (kind === 'pgsub') cpu.addProcess('pgsub', pids()[0]!);
    sampler = new RunSampler(pids, subscriber.spoolDir);
    cpu.start();
    sampler.mark();
    const startLsn = await lsnOf(s.pubWork);
    const insertEpoch = Date.now();
    const t0 = performance.now();
    await s.pubWork.query(FILL);
    const tCommit = performance.now();
    const endLsn = await lsnOf(s.pubWork);
    log(`${kind} ${mode}: INSERT of ${ROWS} rows committed in ${((tCommit - t0) / 1000).toFixed(1)} s, end LSN ${endLsn}`);
    const end = lsnValue(endLsn);
    let tFlushed = 0;
    let tDone = 0;
    let countLate = false;
    let lastProgress = Date.now();
    await pollUntil(
      `${kind} ${mode} to confirm ${endLsn} and hold ${ROWS} rows`,
      async () => {
        await subscriber!.check();
        if (!tFlushed) {
          const confirmed = (await slotRow(s, sub))?.confirmed;
          if (Date.now() - lastProgress > 30_000) {
            lastProgress = Date.now();
            const last = sampler!.samples.at(-1);
            log(
              `  … ${((performance.now() - t0) / 1000).toFixed(0)} s, slot at ${confirmed ?? '-'}, RSS ${last?.rssMB ?? '-'} MB${last?.spoolMB !== undefined ? `, spool ${last.spoolMB} MB` : ''}`,
            );
          }
          if (!confirmed || lsnValue(confirmed) < end) return false;
          tFlushed = performance.now();
        }
        const { rows } = await poller.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${TABLE}`);
        if (Number(rows[0]!.n) !== ROWS) {
          countLate = true;
          return false;
        }
        // The slot's confirmation is the time; the count (slow itself) only checks it,
        // unless the rows were not all there yet then (not expected: both commit first).
        tDone = countLate ? performance.now() : tFlushed;
        return true;
      },
      RUN_TIMEOUT_MS,
    );
    const memory = sampler.finish();
    await sleep(300); // let the postmasters reap ended backends: their CPU counts
    const cpuReport = cpu.stop();
    cpu = null;
    const slotStats = (await s.pubMonitor.query('SELECT * FROM pg_catalog.pg_stat_replication_slots WHERE slot_name = $1', [sub])).rows[0] as Record<string, unknown> | undefined;
    const [check] = (await poller.query<{ n: string; sum: string }>(`SELECT count(*)::text AS n, coalesce(sum(id), 0)::text AS sum FROM ${TABLE}`)).rows;
    if (Number(check!.n) !== ROWS || check!.sum !== EXPECTED_SUM) {
      throw new Error(`${kind} ${mode}: target has ${check!.n} rows (sum of ids ${check!.sum}), expected ${ROWS} (${EXPECTED_SUM})`);
    }
    return {
      mode,
      contestant: kind,
      seconds: round((tDone - t0) / 1000),
      lagSeconds: round((tDone - tCommit) / 1000),
      insertSeconds: round((tCommit - t0) / 1000),
      walBytes: Number(end - lsnValue(startLsn)),
      ...memory,
      cpu: cpuReport,
      foreignCores: foreignCores(cpuReport),
      slotStats: slotStats && Object.fromEntries(Object.entries(slotStats).map(([k, v]) => [k, typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v])),
      memory: sampler.samples,
      details: subscriber.details(insertEpoch),
    };
  } finally {
    // After a failure: stop the samplers' timers, or they would keep this process alive.
    sampler?.finish();
    cpu?.stop();
    await subscriber?.stop();
    await poller.end().catch(() => {});
    // Every run starts from an empty publisher table and no slot decoding old WAL.
    await s.pubWork.query(`TRUNCATE ${TABLE}`);
    await s.tgt.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
  }
}

async function dropSlot(s: Servers, slot: string): Promise<void> {
  await pollUntil(
    `slot ${slot} to be released`,
    async () => {
      const row = await slotRow(s, slot);
      if (row && !row.active) await s.pubMonitor.query('SELECT pg_catalog.pg_drop_replication_slot($1)', [slot]);
      return !row?.active;
    },
    30_000,
  );
}

/** Preloaded into pgsub with --trace-memory: one JSON line of memory figures per 200 ms on stderr. */
const MEMORY_TRACER = `
import v8 from 'node:v8';
const timer = setInterval(() => {
  const m = process.memoryUsage();
  const spaces = Object.fromEntries(v8.getHeapSpaceStatistics().map((x) => [x.space_name, [x.space_size, x.space_used_size]]));
  process.stderr.write(JSON.stringify({ memtrace: Date.now(), rss: m.rss, heapTotal: m.heapTotal, heapUsed: m.heapUsed, external: m.external, arrayBuffers: m.arrayBuffers, spaces }) + '\\n');
}, ${SAMPLE_MS});
timer.unref();
`;

interface MemTrace {
  t: number;
  rssMB: number;
  heapTotalMB: number;
  heapUsedMB: number;
  externalMB: number;
  arrayBuffersMB: number;
  /** V8 heap spaces: [size, used] MB. */
  spaces: Record<string, [number, number]>;
}

function memoryTrace(logs: Record<string, unknown>[], insertEpoch: number): { samples: MemTrace[]; atPeak: MemTrace | null; max: Record<string, number> } {
  const samples: MemTrace[] = logs
    .filter((l) => typeof l.memtrace === 'number')
    .map((l) => ({
      t: round(((l.memtrace as number) - insertEpoch) / 1000),
      rssMB: round(MB(l.rss as number), 1),
      heapTotalMB: round(MB(l.heapTotal as number), 1),
      heapUsedMB: round(MB(l.heapUsed as number), 1),
      externalMB: round(MB(l.external as number), 1),
      arrayBuffersMB: round(MB(l.arrayBuffers as number), 1),
      spaces: Object.fromEntries(Object.entries(l.spaces as Record<string, [number, number]>).map(([k, [size, used]]) => [k, [round(MB(size), 1), round(MB(used), 1)]])),
    }));
  const atPeak = samples.reduce<MemTrace | null>((a, b) => (a === null || b.rssMB > a.rssMB ? b : a), null);
  const max: Record<string, number> = {};
  for (const k of ['rssMB', 'heapTotalMB', 'heapUsedMB', 'externalMB', 'arrayBuffersMB'] as const) max[k] = Math.max(0, ...samples.map((x) => x[k]));
  return { samples, atPeak, max };
}

async function startPgsub(s: Servers, mode: Mode, db: string, sub: string, build: PgsubBuild): Promise<Subscriber | { refused: string }> {
  const stateDir = mkdtempSync(path.join(os.tmpdir(), 'pgsub-bench-state-'));
  const traceEnv: Record<string, string> = {};
  if (TRACE_MEMORY) {
    const tracer = path.join(stateDir, 'memtrace.mjs');
    writeFileSync(tracer, MEMORY_TRACER);
    traceEnv.NODE_OPTIONS = `--import=${pathToFileURL(tracer).href}`;
  }
  const child: WatchedPgsub = spawnPgsub(build, {
    ...traceEnv,
    PGSUB_SOURCE: s.pub.url(SOURCE_DB),
    PGSUB_TARGET: s.tgt.url(db),
    PGSUB_PUBLICATION: PUBLICATION,
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STREAMING: mode,
    PGSUB_STATE_DIR: stateDir,
    PGSUB_LOG_LEVEL: 'info',
    ...PGSUB_EXTRA_ENV,
  });
  const cleanup = async () => {
    await child.stop();
    await dropSlot(s, sub);
    rmSync(stateDir, { recursive: true, force: true });
  };
  try {
    await pollUntil(
      `pgsub (streaming ${mode}) to log 'streaming started'`,
      async () => {
        if (child.logs().some((l) => l.msg === 'streaming started')) return true;
        if (child.exitCode() !== null) throw new Error('exited');
        return false;
      },
      60_000,
      100,
    );
  } catch (err) {
    const code = child.exitCode();
    await cleanup();
    // A startup error is one line on stderr: "pgsub: PGSUB_NOT_IMPLEMENTED: streaming = …".
    const refusal = /^pgsub: PGSUB_NOT_IMPLEMENTED: (.*)$/m.exec(child.output());
    if (code === 2 && refusal) return { refused: refusal[1]! };
    throw new Error(`pgsub (streaming ${mode}) did not start (${(err as Error).message}, exit ${code}):\n${child.output().slice(-4000)}`);
  }
  return {
    slot: sub,
    spoolDir: path.join(stateDir, 'spool'),
    pids: () => [child.pid],
    async check() {
      if (child.exitCode() !== null) throw new Error(`pgsub exited (${child.exitCode()}):\n${child.output().slice(-4000)}`);
    },
    stop: cleanup,
    details(insertEpoch) {
      const logs = child.logs();
      const messages = logs.filter((l) => l.msg !== undefined);
      return {
        // Seconds since the INSERT started.
        log: messages.map((l) => `${round((Number(l.time) - insertEpoch) / 1000)} ${String(l.level)} ${String(l.msg)}`).slice(-50),
        warnings: messages.filter((l) => Number(l.level) >= 40).length,
        ...(TRACE_MEMORY ? { memoryTrace: memoryTrace(logs, insertEpoch) } : {}),
      };
    },
  };
}

async function startNative(s: Servers, mode: Mode, sub: string, poller: pg.Client): Promise<Subscriber> {
  const conninfo = `host=${s.pub.host} port=${s.pub.port} user=${s.pub.user} dbname=${SOURCE_DB}`;
  await poller.query(`CREATE SUBSCRIPTION ${sub} CONNECTION '${conninfo}' PUBLICATION ${PUBLICATION} WITH (copy_data = false, streaming = ${mode})`);
  let workers: number[] = [];
  let refreshing = false;
  const refresh = async () => {
    if (refreshing) return;
    refreshing = true;
    try {
      workers = (await s.tgtMonitor.query<{ pid: number }>('SELECT pid FROM pg_catalog.pg_stat_subscription WHERE subname = $1 AND pid IS NOT NULL', [sub])).rows.map((r) => r.pid);
    } finally {
      refreshing = false;
    }
  };
  try {
    await pollUntil(
      `native subscription ${sub}'s apply worker`,
      async () => {
        await refresh();
        return workers.length > 0;
      },
      60_000,
    );
  } catch (err) {
    await poller.query(`DROP SUBSCRIPTION IF EXISTS ${sub}`).catch(() => {});
    throw err;
  }
  // Parallel apply workers come and go with streamed transactions: follow them.
  const timer = setInterval(() => void refresh().catch(() => {}), 1000);
  const seen = new Set<number>();
  return {
    slot: sub,
    spoolDir: null,
    pids: () => {
      for (const p of workers) seen.add(p);
      return workers;
    },
    async check() {
      const [st] = (await s.tgtMonitor.query<{ apply_error_count: string }>('SELECT apply_error_count::text FROM pg_catalog.pg_stat_subscription_stats WHERE subname = $1', [sub]))
        .rows;
      if (st && Number(st.apply_error_count) > 0) throw new Error(`native subscription ${sub} reports ${st.apply_error_count} apply error(s); see the target's server log`);
    },
    async stop() {
      clearInterval(timer);
      await poller.query(`DROP SUBSCRIPTION IF EXISTS ${sub}`);
    },
    details: () => ({ workerPids: [...seen] }),
  };
}

// ---------------------------------------------------------------------------------------
// Report

const out = (line: string) => process.stdout.write(`${line}\n`);
const log = (line: string) => process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${line}\n`);

function report(results: RunResult[]): string[] {
  const f = (x: number | null | undefined, d = 2) => (x === null || x === undefined ? '-' : x.toFixed(d));
  const get = (mode: Mode, c: ContestantKind) => results.find((r) => r.mode === mode && r.contestant === c);
  const header = [
    'streaming',
    'pgsub s',
    'native s',
    'native/pgsub',
    'pgsub lag s',
    'native lag s',
    'pgsub peak RSS MB',
    'spool peak MB',
    'native workers RssAnon MB',
    'CPU s pub/tgt/pgsub',
  ];
  const rows = SELECTED_MODES.map((mode) => {
    const p = get(mode, 'pgsub');
    const nat = get(mode, 'native');
    const pgsubCell = (v: string) => (p?.refused ? 'refused' : v);
    return [
      mode,
      pgsubCell(f(p?.seconds)),
      f(nat?.seconds),
      p?.seconds && nat?.seconds ? f(nat.seconds / p.seconds) : '-',
      pgsubCell(f(p?.lagSeconds)),
      f(nat?.lagSeconds),
      pgsubCell(f(p?.peakRssMB, 0)),
      pgsubCell(f(p?.spoolPeakMB ?? null, 0)),
      f(nat?.sampledMaxAnonMB, 0),
      p?.cpu ? `${f(p.cpu.groups.publisher, 1)}/${f(p.cpu.groups.target, 1)}/${f(p.cpu.groups.pgsub, 1)}` : '-',
    ];
  });
  out('');
  out(
    `one transaction inserting ${ROWS.toLocaleString('en-US')} rows (id bigint, n int, t text(${VALUE_BYTES})); PostgreSQL 18 → 18; logical_decoding_work_mem ${SERVER_SETTINGS.logical_decoding_work_mem}`,
  );
  out('seconds: INSERT start → slot confirmed the commit and the target holds every row; lag: the part after the commit returned');
  out("native/pgsub > 1: pgsub faster. RSS: VmHWM (exact peak); native: sampled max of its apply workers' private memory");
  out('');
  out(formatTable(header, rows));
  const insert = results.filter((r) => r.insertSeconds !== undefined).map((r) => `${r.contestant}/${r.mode} ${f(r.insertSeconds, 1)}`);
  if (insert.length) out(`\nINSERT seconds on the publisher: ${insert.join(', ')}`);
  const goals: string[] = [];
  for (const r of results.filter((x) => x.contestant === 'pgsub' && x.peakRssMB !== undefined)) {
    goals.push(`${r.peakRssMB! <= RSS_GOAL_MB ? 'met    ' : 'NOT met'}  streaming ${r.mode}: pgsub peak RSS ${f(r.peakRssMB, 0)} MB (goal ≤ ${RSS_GOAL_MB} MB)`);
  }
  if (goals.length) {
    out('\nmemory goal:');
    for (const g of goals) out(`  ${g}`);
  }
  return goals;
}

// ---------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const started = Date.now();
  const build = snapshotPgsub(opts.live, { build: !opts.tsx });
  let servers: Servers | undefined;
  const results: RunResult[] = [];
  try {
    log(
      `pgsub ${opts.live ? 'working tree' : `copied to ${build.dir}`} (src fingerprint ${build.fingerprint}, run as ${build.mode}${build.buildErrors ? `, ${build.buildErrors} tsc errors` : ''}); starting PostgreSQL 18 publisher and target`,
    );
    servers = await setup();
    const version = (await servers.pub.query<{ version: string }>('SELECT version()'))[0]!.version;
    for (const mode of SELECTED_MODES) {
      for (const kind of SELECTED_CONTESTANTS) {
        const r = await measure(servers, mode, kind, build);
        results.push(r);
        if (r.refused) log(`${kind} streaming ${mode}: refused by its config (${r.refused})`);
        else {
          log(
            `${kind} streaming ${mode}: ${r.seconds} s (lag after commit ${r.lagSeconds} s, INSERT ${r.insertSeconds} s, WAL ${MB(r.walBytes!).toFixed(0)} MB), ` +
              `peak RSS ${r.peakRssMB} MB (anon ${r.sampledMaxAnonMB} MB)${r.spoolPeakMB != null ? `, spool peak ${r.spoolPeakMB} MB` : ''}, CPU ${JSON.stringify(r.cpu!.groups)}` +
              (r.foreignCores! > 0.25 ? `; other processes used ${r.foreignCores} cores meanwhile` : ''),
          );
          const trace = r.details?.memoryTrace as ReturnType<typeof memoryTrace> | undefined;
          if (trace?.atPeak) {
            const p = trace.atPeak;
            log(
              `  memory at pgsub's RSS peak (${p.t} s): RSS ${p.rssMB} MB = V8 heap ${p.heapTotalMB} MB (used ${p.heapUsedMB}; ${Object.entries(p.spaces)
                .filter(([, [size]]) => size >= 1)
                .map(([k, [size, used]]) => `${k} ${size}/${used}`)
                .join(', ')}) + external ${p.externalMB} MB (array buffers ${p.arrayBuffersMB}) + code, stacks, libraries`,
            );
          }
        }
      }
    }
    const goals = report(results);
    writeBenchResult(
      'stream',
      started,
      { server: version },
      {
        pgsub: {
          head: build.head,
          dirty: build.dirty,
          srcFingerprint: build.fingerprint,
          copiedTree: !opts.live,
          runAs: build.mode,
          buildErrors: build.buildErrors,
          traceMemory: TRACE_MEMORY,
          extraEnv: PGSUB_EXTRA_ENV,
        },
        settings: {
          server: SERVER_SETTINGS,
          rows: ROWS,
          valueBytes: VALUE_BYTES,
          modes: SELECTED_MODES,
          contestants: SELECTED_CONTESTANTS,
          sampleMs: SAMPLE_MS,
          pgsubDefaults: 'queue_size 2000, max_in_flight 4000, binary false, synchronous_commit on',
          native: 'binary false, synchronous_commit off (native default)',
        },
        goals,
        runs: results,
      },
      out,
    );
  } finally {
    await servers?.pubWork.end().catch(() => {});
    await servers?.pubMonitor.end().catch(() => {});
    await servers?.tgtMonitor.end().catch(() => {});
    await stopAllClusters();
    build.remove();
  }
}

main().catch((err) => {
  process.stderr.write(`bench:stream failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  // The clusters are gone (main's finally); nothing left worth waiting for.
  process.exit(1);
});
