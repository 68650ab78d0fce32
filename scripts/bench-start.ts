/**
 * `npm run bench:start`: how long pgsub takes from its spawn to streaming when it restarts
 * an existing subscription with nothing to catch up — the part of every catch-up that no
 * apply speed wins back (`npm run bench`'s "to stream"). Native's apply worker starts inside
 * the server in about 0.05 s; pgsub has Node, its bundle, its checks and its logins.
 *
 *   npm run bench:start                              # 9 restarts, PostgreSQL 18 → 18
 *   npm run bench:start -- --baseline be869a0        # and an earlier commit's, alternating
 *   npm run bench:start -- --tables 20 --timeline    # 20 tables; both servers' statements
 *
 * Each contestant (pgsub, and pgsub-base with --baseline) has its own subscription, slot and
 * target database on the same two servers; a first start creates them. Then the restarts,
 * the contestants alternating, which goes first rotating: spawned (`node bin/pgsub.js run`
 * from a build, as the apply benchmark runs it), timed until its 'streaming started' line
 * (logged as START_REPLICATION is sent), stopped with SIGTERM. Prints min, median and max in
 * ms, and the median against the baseline's.
 *
 * --timeline: both servers log every login and statement with millisecond times
 * (log_connections, log_statement = all), and the last restart of each contestant is
 * printed as a timeline from its spawn: which step waits for which, read from the servers'
 * side (docs/benchmarks.md, "The session's start, shorter again"). Logging every statement
 * slows the servers a little: time with and without it apart.
 *
 * Writes bench-results/start-<timestamp>.json.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startCluster, stopAllClusters, type Cluster } from '../test/harness/index.js';
import { formatTable, headerText, median, min, pollUntil, round, snapshotPgsub, spawnPgsub, writeBenchResult, type PgsubBuild } from './bench-lib.js';

const { values: opts } = parseArgs({
  options: {
    restarts: { type: 'string', default: '9' },
    tables: { type: 'string', default: '1' },
    major: { type: 'string', default: '18' },
    baseline: { type: 'string' },
    timeline: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  process.stdout.write(headerText(import.meta.url));
  process.exit(0);
}
const RESTARTS = Number(opts.restarts);
const TABLES = Number(opts.tables);
const MAJOR = Number(opts.major);
if (!(RESTARTS >= 1 && TABLES >= 1)) throw new Error('--restarts and --tables want a positive number');

const log = (line: string) => process.stderr.write(`[start ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const out = (line = '') => process.stdout.write(`${line}\n`);

const LOGGED: Record<string, string> = opts.timeline ? { log_connections: 'on', log_statement: 'all', log_line_prefix: '%m [%p] %a ' } : {};

interface Contestant {
  name: 'pgsub' | 'pgsub-base';
  build: PgsubBuild;
  env: Record<string, string>;
  stateDir: string;
  ms: number[];
  /** The last restart's spawn and end (epoch ms), the timeline's window. */
  lastSpawn: number;
  lastEnd: number;
}

/** Spawns, waits for 'streaming started', stops; the ms from the spawn to that line. */
async function restart(c: Contestant): Promise<number> {
  const child = spawnPgsub(c.build, c.env);
  try {
    await pollUntil(
      async () => {
        if (child.exitCode() !== null) throw new Error(`${c.name} exited (${child.exitCode()}):\n${child.output().slice(-3000)}`);
        return child.logs().some((l) => l.msg === 'streaming started');
      },
      60_000,
      5,
    );
  } finally {
    await child.stop();
  }
  c.lastSpawn = child.startedAt;
  c.lastEnd = Date.now();
  const line = child.logs().find((l) => l.msg === 'streaming started')!;
  return Number(line.time) - child.startedAt;
}

/** The servers' log lines from `from` (epoch ms) on, as "ms S|T line". */
function timeline(servers: [string, Cluster][], from: number, until: number): string[] {
  const lines: { at: number; text: string }[] = [];
  for (const [side, cluster] of servers) {
    for (const line of readFileSync(path.join(cluster.dataDir, 'server.log'), 'utf8').split('\n')) {
      const m = /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d\.\d{3}) UTC (.*)$/.exec(line);
      if (!m || / DETAIL: | STATEMENT: |connection authenticated/.test(m[3]!)) continue;
      const at = Date.parse(`${m[1]}T${m[2]}Z`);
      if (at >= from && at <= until) lines.push({ at: at - from, text: `${String(at - from).padStart(5)} ${side} ${m[3]!.slice(0, 150)}` });
    }
  }
  return lines.sort((a, b) => a.at - b.at).map((l) => l.text);
}

const started = Date.now();
const builds: Contestant[] = [];
const current = snapshotPgsub(false, { build: true });
log(`pgsub copied to ${current.dir} (src fingerprint ${current.fingerprint}, run as ${current.mode})`);
const base = opts.baseline ? snapshotPgsub(false, { build: true, commit: opts.baseline }) : null;
if (base) log(`pgsub-base: ${opts.baseline} (${base.head.slice(0, 12)}) copied to ${base.dir}, run as ${base.mode}`);

const [pub, tgt] = await Promise.all([
  startCluster({ major: MAJOR, name: `bench-start-pub${MAJOR}`, settings: LOGGED }),
  startCluster({ major: MAJOR, name: `bench-start-tgt${MAJOR}`, settings: LOGGED }),
]);
try {
  await pub.createDatabase('src');
  const ddl = Array.from({ length: TABLES }, (_, i) => `CREATE TABLE public.t${i} (id bigint PRIMARY KEY, v text);`).join('\n');
  await pub.query(`${ddl}\nCREATE PUBLICATION bench_start FOR ALL TABLES;`, [], 'src');
  for (const [name, build] of [['pgsub', current], ...(base ? [['pgsub-base', base]] : [])] as [Contestant['name'], PgsubBuild][]) {
    const db = name.replace('-', '_');
    await tgt.createDatabase(db);
    await tgt.query(ddl, [], db);
    const stateDir = mkdtempSync(path.join(os.tmpdir(), 'pgsub-bench-start-'));
    const env = {
      PGSUB_SOURCE: pub.url('src'),
      PGSUB_TARGET: tgt.url(db),
      PGSUB_PUBLICATION: 'bench_start',
      PGSUB_SUBSCRIPTION: db,
      PGSUB_COPY_DATA: 'false',
      PGSUB_BINARY: 'true',
      PGSUB_SYNCHRONOUS_COMMIT: 'off',
      PGSUB_STATE_DIR: stateDir,
      PGSUB_LOG_LEVEL: 'info',
    };
    builds.push({ name, build, env, stateDir, ms: [], lastSpawn: 0, lastEnd: 0 });
  }
  // First starts: the schema, the slot, the origin and the tables' states.
  for (const c of builds) await restart(c);
  for (let r = 0; r < RESTARTS; r++) {
    const order = r % 2 === 0 ? builds : [...builds].reverse();
    for (const c of order) c.ms.push(await restart(c));
    log(`restart ${r + 1}: ${order.map((c) => `${c.name} ${c.ms.at(-1)} ms`).join(', ')}`);
  }

  out(`\nPostgreSQL ${MAJOR} → ${MAJOR}, ${TABLES} table(s), ${RESTARTS} restarts each; ms from the spawn to 'streaming started'`);
  const baseMedian = builds.find((c) => c.name === 'pgsub-base') ? median(builds.find((c) => c.name === 'pgsub-base')!.ms) : null;
  out(
    formatTable(
      ['contestant', 'restarts', 'min ms', 'median ms', 'max ms', 'against the baseline'],
      builds.map((c) => [
        c.name,
        c.ms.length,
        min(c.ms),
        median(c.ms),
        Math.max(...c.ms),
        baseMedian === null || c.name === 'pgsub-base' ? '-' : `${round(median(c.ms) - baseMedian, 0)} ms`,
      ]),
    ),
  );
  if (opts.timeline) {
    for (const c of builds) {
      out(`\n${c.name}'s last restart, both servers (S: publisher, T: target), ms from its spawn:`);
      const servers: [string, Cluster][] = [
        ['S', pub],
        ['T', tgt],
      ];
      for (const line of timeline(servers, c.lastSpawn, c.lastEnd)) out(line);
    }
  }
  writeBenchResult(
    'start',
    started,
    { postgres: MAJOR },
    {
      tables: TABLES,
      restarts: RESTARTS,
      timeline: opts.timeline,
      contestants: builds.map((c) => ({ name: c.name, head: c.build.head, fingerprint: c.build.fingerprint, mode: c.build.mode, ms: c.ms })),
    },
    out,
  );
} finally {
  await stopAllClusters();
  for (const c of builds) rmSync(c.stateDir, { recursive: true, force: true });
}
