/**
 * Measuring helpers for the benchmark scripts (scripts/bench-*.ts): where the CPU went
 * (per PostgreSQL cluster, per backend type, pgsub, the bench process itself, the whole
 * machine), a process's peak memory, what the sessions waited on (pg_stat_activity
 * samples), summary statistics and a plain-text table.
 *
 * CPU is read from /proc, so it is exact for a whole cluster: a postmaster's own time plus
 * the time of its children it has reaped (cutime/cstime) plus that of the children still
 * running. The split by backend type comes from samples of the live children every
 * `intervalMs`, so a process that ends between two samples loses its last interval there
 * (the cluster total does not). Linux only; the benchmarks run on the same machine as
 * their servers, which is the point: every contestant shares the same cores.
 *
 * Also: pgsub run from a private copy of the working tree (so that edits made while a
 * benchmark runs do not mix versions) as a watched child process, and the plain
 * `COPY … TO STDOUT | COPY … FROM STDIN` pipe the table-copy benchmarks compare against.
 *
 * Nothing here asserts anything about speed: the scripts print numbers and ratios, and
 * people judge them (tests never time things).
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import copyStreams from 'pg-copy-streams';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

const TICKS_PER_SECOND = 100; // USER_HZ; 100 on every Linux we run on.

// ---------------------------------------------------------------------------------------
// /proc readers

interface ProcStat {
  pid: number;
  ppid: number;
  /** utime + stime, seconds. */
  cpu: number;
  /** cutime + cstime (reaped children), seconds. */
  childCpu: number;
}

function readProcStat(pid: number): ProcStat | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  // The command name (field 2) may hold spaces and parentheses: parse after the last ')'.
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state); field n is rest[n - 3].
  const num = (field: number) => Number(rest[field - 3]);
  return { pid, ppid: num(4), cpu: (num(14) + num(15)) / TICKS_PER_SECOND, childCpu: (num(16) + num(17)) / TICKS_PER_SECOND };
}

/** Seconds the process has waited, runnable, for a CPU (/proc/PID/schedstat, second field); null once it has gone. */
function readRunDelay(pid: number): number | null {
  try {
    return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[1]) / 1e9;
  } catch {
    return null;
  }
}

function readCmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0+$/, '').replace(/\0/g, ' ');
  } catch {
    return '';
  }
}

/** VmRSS, RssAnon and VmHWM (peak RSS) of a process, in MiB; null once it has gone. */
export function readMemory(pid: number): { rssMiB: number; anonMiB: number; hwmMiB: number } | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return null;
  }
  const kb = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? NaN);
  return { rssMiB: kb('VmRSS') / 1024, anonMiB: kb('RssAnon') / 1024, hwmMiB: kb('VmHWM') / 1024 };
}

/** Busy and total CPU seconds of the whole machine since boot (all cores). */
function readMachineCpu(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!;
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal (guest time is already in user/nice)
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: (total - idle) / TICKS_PER_SECOND, total: total / TICKS_PER_SECOND };
}

/**
 * Give a cluster (the postmaster and its current children; later children inherit it)
 * a scheduling priority, as `renice`. Root only for negative values.
 */
export function reniceCluster(dataDir: string, nice: number): void {
  const pm = postmasterPid(dataDir);
  os.setPriority(pm, nice);
  for (const pid of listPids()) if (readProcStat(pid)?.ppid === pm) os.setPriority(pid, nice);
}

/** The postmaster's pid, from the first line of postmaster.pid. */
export function postmasterPid(dataDir: string): number {
  return Number(readFileSync(path.join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
}

/** What a PostgreSQL child process is, from its ps title. */
export function backendKind(cmdline: string): string {
  const title = cmdline.replace(/^postgres:\s*/, '');
  if (title.startsWith('walsender')) return 'walsender';
  if (title.startsWith('logical replication tablesync worker')) return 'tablesync worker';
  if (title.startsWith('logical replication apply worker')) return 'apply worker';
  if (title.startsWith('logical replication parallel apply worker')) return 'parallel apply worker';
  if (title.startsWith('logical replication launcher')) return 'launcher';
  if (/^autovacuum/.test(title)) return 'autovacuum';
  for (const aux of ['checkpointer', 'background writer', 'walwriter', 'io worker', 'startup', 'archiver', 'stats', 'walsummarizer']) {
    if (title.startsWith(aux)) return aux === 'background writer' ? 'bgwriter' : aux;
  }
  // "user database host(port) COMMAND" — a client backend.
  if (/^\S+ \S+ \S+/.test(title)) return 'backend';
  return 'other';
}

// ---------------------------------------------------------------------------------------
// CPU accounting over one measured interval

export interface CpuReport {
  wallSeconds: number;
  /** Busy CPU seconds of the whole machine (all processes). */
  machineBusy: number;
  /** Cores available; machineBusy / wallSeconds / cores = utilisation. */
  cores: number;
  /** Exact totals per group: each cluster, each watched process, the bench process. */
  groups: Record<string, number>;
  /** Sampled split of each cluster's children by backend kind (seconds). */
  kinds: Record<string, Record<string, number>>;
  /**
   * Per watched process: seconds it was runnable but waited for a CPU (schedstat). With
   * its CPU seconds and the wall time this says whether a process that is not busy waited
   * for work or for a core.
   */
  runDelay: Record<string, number>;
}

/**
 * Samples CPU per cluster (exact total + sampled split) and per watched process, and the
 * machine total. start() before the measured interval, stop() after it.
 */
export class CpuSampler {
  private timer: NodeJS.Timeout | null = null;
  private readonly procs = new Map<string, number>();
  private readonly procFirst = new Map<string, number>();
  private readonly procLast = new Map<string, number>();
  private readonly delayFirst = new Map<string, number>();
  private readonly delayLast = new Map<string, number>();
  /** Per cluster: pid → { kind, first seen cpu, last seen cpu }. */
  private readonly children = new Map<string, Map<number, { kind: string; first: number; last: number }>>();
  private clusterStart = new Map<string, number>();
  private machineStart = readMachineCpu();
  private selfStart = process.cpuUsage();
  private startedAt = 0;

  constructor(
    private readonly clusters: Record<string, number>,
    private readonly intervalMs = 250,
  ) {}

  start(): void {
    this.startedAt = performance.now();
    this.machineStart = readMachineCpu();
    this.selfStart = process.cpuUsage();
    for (const [name, pid] of Object.entries(this.clusters)) {
      this.clusterStart.set(name, this.clusterTotal(pid));
      this.children.set(name, new Map());
    }
    this.sample(true);
    this.timer = setInterval(() => this.sample(false), this.intervalMs);
  }

  /**
   * Watch one more process: its CPU time counts from the moment it was added, or with
   * `fromBirth` all of it (for a process started inside the interval but found a little
   * later, e.g. the walsender serving a subscriber that was just started).
   */
  addProcess(name: string, pid: number, fromBirth = false): void {
    this.procs.set(name, pid);
    const s = readProcStat(pid);
    this.procFirst.set(name, fromBirth ? 0 : (s?.cpu ?? 0));
    this.procLast.set(name, s?.cpu ?? 0);
    const delay = readRunDelay(pid) ?? 0;
    this.delayFirst.set(name, fromBirth ? 0 : delay);
    this.delayLast.set(name, delay);
  }

  stop(): CpuReport {
    this.sample(false);
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    const wallSeconds = (performance.now() - this.startedAt) / 1000;
    const machine = readMachineCpu();
    const self = process.cpuUsage(this.selfStart);
    const groups: Record<string, number> = {};
    for (const [name, pid] of Object.entries(this.clusters)) groups[name] = round(this.clusterTotal(pid) - (this.clusterStart.get(name) ?? 0));
    for (const name of this.procs.keys()) groups[name] = round((this.procLast.get(name) ?? 0) - (this.procFirst.get(name) ?? 0));
    groups.bench = round((self.user + self.system) / 1e6);
    const kinds: Record<string, Record<string, number>> = {};
    for (const [name, pids] of this.children) {
      const k: Record<string, number> = {};
      for (const c of pids.values()) k[c.kind] = (k[c.kind] ?? 0) + (c.last - c.first);
      kinds[name] = Object.fromEntries(
        Object.entries(k)
          .filter(([, v]) => v > 0)
          .map(([kind, v]) => [kind, round(v)])
          .sort((a, b) => (b[1] as number) - (a[1] as number)),
      );
    }
    const runDelay: Record<string, number> = {};
    for (const name of this.procs.keys()) runDelay[name] = round((this.delayLast.get(name) ?? 0) - (this.delayFirst.get(name) ?? 0));
    return { wallSeconds: round(wallSeconds), machineBusy: round(machine.busy - this.machineStart.busy), cores: coreCount(), groups, kinds, runDelay };
  }

  private clusterTotal(postmaster: number): number {
    const pm = readProcStat(postmaster);
    if (!pm) return 0;
    let total = pm.cpu + pm.childCpu;
    for (const pid of listPids()) {
      const s = readProcStat(pid);
      if (s && s.ppid === postmaster) total += s.cpu;
    }
    return total;
  }

  /** `initial`: processes alive at start() count from now; any found later from birth. */
  private sample(initial: boolean): void {
    for (const [name, pid] of this.procs) {
      const s = readProcStat(pid);
      if (s) this.procLast.set(name, s.cpu);
      const delay = readRunDelay(pid);
      if (delay !== null) this.delayLast.set(name, delay);
    }
    const byParent = new Map<number, string>();
    for (const [name, pid] of Object.entries(this.clusters)) byParent.set(pid, name);
    for (const pid of listPids()) {
      const s = readProcStat(pid);
      if (!s) continue;
      const cluster = byParent.get(s.ppid);
      if (!cluster) continue;
      const seen = this.children.get(cluster)!;
      const entry = seen.get(pid);
      if (entry) {
        entry.last = s.cpu;
        // Just forked, it still had the postmaster's command line.
        if (entry.kind === 'other') entry.kind = backendKind(readCmdline(pid));
      } else seen.set(pid, { kind: backendKind(readCmdline(pid)), first: initial ? s.cpu : 0, last: s.cpu });
    }
  }
}

function listPids(): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number);
}

/**
 * Waits until the machine has been nearly idle (busy below `maxCores` cores) for
 * `quietMs`, or `timeoutMs` passed. Returns the seconds waited and the last busy level.
 * Other people's jobs on a shared machine would otherwise land inside a measurement.
 */
export async function waitForQuiet(maxCores = 0.3, quietMs = 2000, timeoutMs = 60_000): Promise<{ waitedSeconds: number; busyCores: number }> {
  const started = Date.now();
  let quietSince = Date.now();
  let prev = readMachineCpu();
  let busyCores = 0;
  for (;;) {
    await sleep(500);
    const now = readMachineCpu();
    busyCores = ((now.busy - prev.busy) / Math.max(now.total - prev.total, 1e-9)) * coreCount();
    prev = now;
    if (busyCores > maxCores) quietSince = Date.now();
    if (Date.now() - quietSince >= quietMs || Date.now() - started >= timeoutMs) return { waitedSeconds: round((Date.now() - started) / 1000, 1), busyCores: round(busyCores) };
  }
}

/** CPU seconds of processes outside the measured groups, per wall second. */
export function foreignCores(r: CpuReport): number {
  const ours = Object.values(r.groups).reduce((a, b) => a + b, 0);
  return round(Math.max(0, r.machineBusy - ours) / Math.max(r.wallSeconds, 1e-9));
}

export function coreCount(): number {
  return readFileSync('/proc/stat', 'utf8')
    .split('\n')
    .filter((l) => /^cpu\d+ /.test(l)).length;
}

// ---------------------------------------------------------------------------------------
// Memory of a child process

/**
 * Polls VmRSS of a process; finish() returns the kernel's VmHWM (exact) and the sampled max,
 * and with `timelineEveryMs` also VmRSS every that often since the sampler was made (to
 * show whether memory stays flat or grows with the work, not just its peak).
 */
export class MemorySampler {
  private timer: NodeJS.Timeout;
  private maxRss = 0;
  private hwm = 0;
  private readonly startedAt = performance.now();
  private readonly timeline: [seconds: number, rssMiB: number][] = [];
  private nextTimelineAt = 0;
  constructor(
    private readonly pid: number,
    intervalMs = 200,
    private readonly timelineEveryMs?: number,
  ) {
    this.nextTimelineAt = timelineEveryMs ?? Number.POSITIVE_INFINITY;
    this.timer = setInterval(() => this.sample(), intervalMs);
  }
  private sample(): void {
    const m = readMemory(this.pid);
    if (!m) return;
    this.maxRss = Math.max(this.maxRss, m.rssMiB);
    this.hwm = Math.max(this.hwm, m.hwmMiB);
    const at = performance.now() - this.startedAt;
    if (this.timelineEveryMs && at >= this.nextTimelineAt) {
      this.timeline.push([round(at / 1000, 1), round(m.rssMiB, 1)]);
      this.nextTimelineAt += this.timelineEveryMs * Math.max(1, Math.floor((at - this.nextTimelineAt) / this.timelineEveryMs) + 1);
    }
  }
  /** Call while the process is still alive, then it stops sampling. */
  finish(): { peakRssMiB: number; sampledMaxRssMiB: number; timeline?: [seconds: number, rssMiB: number][] } {
    this.sample();
    clearInterval(this.timer);
    return { peakRssMiB: round(this.hwm), sampledMaxRssMiB: round(this.maxRss), ...(this.timelineEveryMs ? { timeline: this.timeline } : {}) };
  }
}

// ---------------------------------------------------------------------------------------
// pg_stat_activity samples: what the sessions of interest are doing

export interface ActivityFilter {
  /** A name for the side, e.g. 'publisher'. */
  side: string;
  client: pg.Client;
  /** SQL condition on pg_stat_activity (alias a) selecting the sessions of interest. */
  where: string;
}

/** Counts (side, who, state/wait event) over periodic samples. */
export class ActivitySampler {
  private timer: NodeJS.Timeout | null = null;
  private busy = false;
  private readonly counts = new Map<string, number>();
  samples = 0;

  constructor(
    private readonly filters: ActivityFilter[],
    private readonly intervalMs = 500,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.sample(), this.intervalMs);
  }

  private async sample(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const results = await Promise.all(
        this.filters.map((f) =>
          f.client
            .query<{ who: string; what: string }>(
              `SELECT coalesce(nullif(a.backend_type, 'client backend'), 'client') || ':' || coalesce(nullif(a.application_name, ''), '-') AS who,
                      CASE WHEN a.wait_event IS NULL THEN 'CPU' ELSE a.wait_event_type || ':' || a.wait_event END AS what
                 FROM pg_catalog.pg_stat_activity a
                WHERE a.pid <> pg_catalog.pg_backend_pid() AND a.state IS DISTINCT FROM 'idle' AND (${f.where})`,
            )
            .then((r) => r.rows.map((row) => `${f.side} ${row.who} ${row.what}`)),
        ),
      );
      this.samples++;
      for (const key of results.flat()) this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
    } catch {
      // a sample lost (e.g. a server busy restarting); the next one counts
    } finally {
      this.busy = false;
    }
  }

  /** Share of samples (0..1) in which a session was in each (side, who, event), largest first. */
  stop(): { samples: number; shares: Record<string, number> } {
    if (this.timer) clearInterval(this.timer);
    const n = Math.max(this.samples, 1);
    const shares = Object.fromEntries([...this.counts].sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, round(v / n)]));
    return { samples: this.samples, shares };
  }
}

// ---------------------------------------------------------------------------------------
// pgsub under test

const liveChildren = new Set<ChildProcess>();
const snapshots = new Set<string>();
process.on('exit', () => {
  for (const c of liveChildren) c.kill('SIGKILL');
  for (const d of snapshots) rmSync(d, { recursive: true, force: true });
});

export interface PgsubBuild {
  /** Where bin/pgsub.js is run from. */
  dir: string;
  /** sha1 of src/ and migrations/ (paths and contents), 12 hex digits. */
  fingerprint: string;
  /** The checkout's HEAD and its uncommitted files under src/, migrations/, bin/. */
  head: string;
  dirty: string[];
  /** 'tsx' (TypeScript loaded at run time), 'dist' (compiled with tsc) or 'bundle' (`npm run build`: tsc, then one bundled file). */
  mode: 'tsx' | 'dist' | 'bundle';
  /** tsc's complaints when building (the JavaScript is emitted anyway). */
  buildErrors: number;
  remove(): void;
}

/**
 * A private copy of what `node bin/pgsub.js` loads (node_modules linked), or the tree
 * itself when `live`. With `build`, the copy is compiled (tsc -p tsconfig.build.json into
 * its own dist/, then bundled by scripts/bundle.mjs into dist/bundle/, which bin/pgsub.js
 * prefers), as an installed pgsub would run; the
 * working tree's dist/ is never touched. With `commit`, the copy is that commit's tree
 * (git archive, no worktree registered): an earlier pgsub run in the same benchmark, so a
 * change is measured as a ratio against its own past (`--baseline`).
 */
export function snapshotPgsub(live: boolean, options: { build?: boolean; commit?: string } = {}): PgsubBuild {
  const info = treeInfo();
  const liveMode = buildMode(REPO_ROOT);
  if (options.commit) {
    const head = git(['rev-parse', '--verify', `${options.commit}^{commit}`]);
    if (!head) throw new Error(`--baseline ${options.commit}: not a commit of this repository`);
    info.head = head;
    info.dirty = [];
  }
  if (live && !options.commit) return { dir: REPO_ROOT, fingerprint: fingerprint(REPO_ROOT), ...info, mode: liveMode, buildErrors: 0, remove() {} };
  const dir = mkdtempSync(path.join(os.tmpdir(), 'pgsub-snapshot-'));
  snapshots.add(dir);
  const items = ['bin', 'src', 'migrations', 'package.json', 'tsconfig.json', 'tsconfig.build.json', 'test/harness', 'scripts/bundle.mjs', 'scripts/bundle-loader.mjs'];
  if (options.commit) {
    const present = items.filter((item) => git(['ls-tree', '--name-only', info.head, '--', item]) !== '');
    const tar = execFileSync('git', ['archive', '--format=tar', info.head, ...present], { cwd: REPO_ROOT, maxBuffer: 1 << 30 });
    execFileSync('tar', ['-x', '-C', dir], { input: tar });
  } else {
    for (const item of items) if (existsSync(path.join(REPO_ROOT, item))) cpSync(path.join(REPO_ROOT, item), path.join(dir, item), { recursive: true });
  }
  symlinkSync(path.join(REPO_ROOT, 'node_modules'), path.join(dir, 'node_modules'));
  let buildErrors = 0;
  if (options.build) {
    try {
      execFileSync(process.execPath, [path.join(REPO_ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.build.json'], {
        cwd: dir,
        stdio: 'pipe',
        encoding: 'utf8',
      });
    } catch (err) {
      // tsc exits non-zero on type errors but still emits; count them for the record.
      buildErrors = ((err as { stdout?: string }).stdout ?? '').split('\n').filter((l) => / error TS\d+:/.test(l)).length;
    }
    // The one-file bundle, as `npm run build` makes it (when the tree has the script).
    if (existsSync(path.join(dir, 'scripts', 'bundle.mjs'))) execFileSync(process.execPath, ['scripts/bundle.mjs'], { cwd: dir, stdio: 'pipe' });
  }
  const mode = buildMode(dir);
  // One start to warm caches (tsx's transforms; the files in the page cache).
  execFileSync(process.execPath, [path.join(dir, 'bin', 'pgsub.js'), '--help'], { cwd: dir, stdio: 'ignore' });
  return {
    dir,
    fingerprint: fingerprint(dir),
    ...info,
    mode,
    buildErrors,
    remove() {
      rmSync(dir, { recursive: true, force: true });
      snapshots.delete(dir);
    },
  };
}

/**
 * A copy that snapshotPgsub made in another bench process, used as it is (one build for a
 * whole run: bench-scale.ts passes its copy to the bench-apply and bench-sync it runs as
 * children, `--pgsub-dir`). The process that made it removes it; remove() here does not.
 */
export function preparedPgsub(dir: string): PgsubBuild {
  if (!existsSync(path.join(dir, 'bin', 'pgsub.js'))) throw new Error(`--pgsub-dir ${dir}: no bin/pgsub.js there (not a copy made by snapshotPgsub)`);
  return { dir, fingerprint: fingerprint(dir), ...treeInfo(), mode: buildMode(dir), buildErrors: 0, remove() {} };
}

function git(args: string[]): string {
  try {
    return execFileSync('git', args, { cwd: REPO_ROOT, encoding: 'utf8' }).trim();
  } catch {
    return '';
  }
}

/** The checkout's HEAD and its uncommitted files under src/, migrations/, bin/. */
function treeInfo(): { head: string; dirty: string[] } {
  return { head: git(['rev-parse', 'HEAD']), dirty: git(['status', '--porcelain', '--', 'src', 'migrations', 'bin']).split('\n').filter(Boolean) };
}

function buildMode(root: string): PgsubBuild['mode'] {
  return existsSync(path.join(root, 'dist', 'bundle', 'main.js')) ? 'bundle' : existsSync(path.join(root, 'dist', 'src', 'cli', 'main.js')) ? 'dist' : 'tsx';
}

function fingerprint(root: string): string {
  const hash = createHash('sha1');
  const walk = (rel: string) => {
    for (const name of readdirSync(path.join(root, rel)).sort()) {
      const p = path.join(rel, name);
      if (statSync(path.join(root, p)).isDirectory()) walk(p);
      else hash.update(p).update(readFileSync(path.join(root, p)));
    }
  };
  for (const d of ['src', 'migrations']) walk(d);
  return hash.digest('hex').slice(0, 12);
}

export interface WatchedPgsub {
  pid: number;
  /** Epoch ms of the spawn. */
  startedAt: number;
  /** Exit code or signal once it has exited, else null. */
  exitCode(): number | string | null;
  output(): string;
  /** The JSON log lines so far. */
  logs(): Record<string, unknown>[];
  /** SIGTERM, then SIGKILL after `graceMs`; resolves once it has exited. */
  stop(graceMs?: number): Promise<void>;
}

/**
 * `node bin/pgsub.js run` from a build, configured by PGSUB_* variables only; with `nice`,
 * under `nice -n` (every thread of it, from its first instruction).
 */
export function spawnPgsub(build: PgsubBuild, env: Record<string, string>, options: { nice?: number } = {}): WatchedPgsub {
  const startedAt = Date.now();
  const argv = [process.execPath, path.join(build.dir, 'bin', 'pgsub.js'), 'run'];
  if (options.nice) argv.unshift('nice', '-n', String(options.nice));
  const child = spawn(argv[0]!, argv.slice(1), {
    cwd: build.dir,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  liveChildren.add(child);
  let output = '';
  child.stdout!.on('data', (b: Buffer) => (output += b.toString('utf8')));
  child.stderr!.on('data', (b: Buffer) => (output += b.toString('utf8')));
  let code: number | string | null = null;
  const exited = new Promise<void>((resolve) =>
    child.on('exit', (c, signal) => {
      code = c ?? signal ?? -1;
      liveChildren.delete(child);
      resolve();
    }),
  );
  return {
    pid: child.pid!,
    startedAt,
    exitCode: () => code,
    output: () => output,
    logs: () =>
      output.split('\n').flatMap((l) => {
        if (!l.startsWith('{')) return [];
        try {
          return [JSON.parse(l) as Record<string, unknown>];
        } catch {
          return [];
        }
      }),
    async stop(graceMs = 20_000) {
      if (code !== null) return;
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(killer);
    },
  };
}

// ---------------------------------------------------------------------------------------
// The plain pipe

/**
 * `COPY t TO STDOUT (FORMAT binary)` piped into `COPY t FROM STDIN (FORMAT binary)` for
 * each table, in `lanes` parallel pairs of connections taking tables in the given order.
 * Returns the bytes streamed.
 */
export async function copyPipe(sourceUrl: string, targetUrl: string, tables: string[], lanes: number): Promise<number> {
  const queue = [...tables];
  let bytes = 0;
  await Promise.all(
    Array.from({ length: Math.min(lanes, tables.length) }, async () => {
      const source = new pg.Client({ connectionString: sourceUrl, application_name: 'pipe' });
      const target = new pg.Client({ connectionString: targetUrl, application_name: 'pipe' });
      try {
        await Promise.all([source.connect(), target.connect()]);
        for (let t = queue.shift(); t; t = queue.shift()) {
          const counter = new Transform({
            transform(chunk: Buffer, _enc, done) {
              bytes += chunk.length;
              done(null, chunk);
            },
          });
          await pipeline(source.query(copyStreams.to(`COPY ${t} TO STDOUT (FORMAT binary)`)), counter, target.query(copyStreams.from(`COPY ${t} FROM STDIN (FORMAT binary)`)));
        }
      } finally {
        await Promise.all([source.end().catch(() => {}), target.end().catch(() => {})]);
      }
    }),
  );
  return bytes;
}

// ---------------------------------------------------------------------------------------
// Statistics and printing

export function round(x: number, digits = 2): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function min(xs: number[]): number {
  return Math.min(...xs);
}

/** A plain-text table; cells that look like numbers (or '-') right-aligned. */
export function formatTable(header: string[], rows: (string | number)[][]): string {
  const cells = [header, ...rows].map((r) => r.map((c) => String(c)));
  const widths = header.map((_, i) => Math.max(...cells.map((r) => r[i]?.length ?? 0)));
  const numeric = (c: string) => /^(-|[-+]?\d[\d.,/]*)$/.test(c);
  const line = (r: string[], body: boolean) =>
    r
      .map((c, j) => (body && numeric(c) ? c.padStart(widths[j]!) : c.padEnd(widths[j]!)))
      .join('  ')
      .trimEnd();
  return [line(cells[0]!, false), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map((r) => line(r, true))].join('\n');
}

/**
 * `--pgsub-env PGSUB_NAME=value` options (repeatable) as an environment for pgsub; also
 * NODE_OPTIONS, so that a profile can be taken: `NODE_OPTIONS=--require <repo>/scripts/profile-preload.cjs`
 * (Node 20 refuses --cpu-prof there; see that file).
 */
export function parsePgsubEnv(list: string[]): Record<string, string> {
  return Object.fromEntries(
    list.map((kv) => {
      const eq = kv.indexOf('=');
      if (eq < 1 || !(kv.startsWith('PGSUB_') || kv.startsWith('NODE_OPTIONS='))) throw new Error(`--pgsub-env wants PGSUB_NAME=value or NODE_OPTIONS=…, not ${kv}`);
      return [kv.slice(0, eq), kv.slice(eq + 1)];
    }),
  );
}

/** The text of a script's header comment, for --help. */
export function headerText(scriptUrl: string): string {
  return `${readFileSync(fileURLToPath(scriptUrl), 'utf8')
    .split('*/')[0]!
    .replace(/^\/\*\*\n?/, '')
    .replace(/^ \* ?/gm, '')}\n`;
}

/** A pg.Client for measuring and driving workloads; an error while idle (server stopped) is left to the next query. */
export async function benchClient(url: string, applicationName = 'bench'): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, application_name: applicationName });
  c.on('error', () => {});
  await c.connect();
  return c;
}

/** A replication slot as the benchmarks watch it: who serves it and how far it has confirmed. */
export async function slotState(c: pg.Client, slot: string): Promise<{ active: boolean; activePid: number | null; confirmed: bigint | null } | undefined> {
  const row = (
    await c.query<{ active: boolean; active_pid: number | null; confirmed: string | null }>(
      'SELECT active, active_pid, confirmed_flush_lsn::text AS confirmed FROM pg_catalog.pg_replication_slots WHERE slot_name = $1',
      [slot],
    )
  ).rows[0];
  return row && { active: row.active, activePid: row.active_pid, confirmed: row.confirmed === null ? null : lsnValue(row.confirmed) };
}

/** 'XX/YYYYYYYY' → bigint. */
export function lsnValue(text: string): bigint {
  const [hi, lo] = text.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Calls `done` every `intervalMs` until it returns true; throws after `timeoutMs`. */
export async function pollUntil(done: () => Promise<boolean>, timeoutMs: number, intervalMs = 100): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`not finished within ${Math.round(timeoutMs / 1000)} s`);
    await sleep(intervalMs);
  }
}

/**
 * Write a benchmark's JSON result to bench-results/<kind>-<start time>.json, with what every
 * result carries (start, duration, the machine), and print where it went.
 */
export function writeBenchResult(kind: string, started: number, machineExtra: Record<string, unknown>, body: Record<string, unknown>, out: (line: string) => void): string {
  const dir = path.join(REPO_ROOT, 'bench-results');
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${kind}-${new Date(started).toISOString().replace(/[:.]/g, '-')}.json`);
  const machine = { cores: coreCount(), cpu: os.cpus()[0]?.model, memoryGiB: round(os.totalmem() / 2 ** 30, 1), node: process.version, ...machineExtra };
  const result = { benchmark: kind, startedAt: new Date(started).toISOString(), totalSeconds: round((Date.now() - started) / 1000, 0), machine, ...body };
  writeFileSync(file, JSON.stringify(result, null, 2));
  out(`\nresults: ${path.relative(process.cwd(), file)} (${round((Date.now() - started) / 60_000, 1)} min)`);
  return file;
}
