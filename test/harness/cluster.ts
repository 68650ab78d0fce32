/**
 * Throw-away PostgreSQL clusters for integration tests (initdb + pg_ctl), one per call.
 *
 * - Binaries come from the pgNN npm aliases (see binaries.ts).
 * - As root, initdb/pg_ctl run as an unprivileged user via `runuser -u <user> --`
 *   (`postgres` if it exists, else a system user `pgsub` that is created once).
 * - Listens on 127.0.0.1 only (plus a unix socket inside the cluster's private temp dir),
 *   trust auth, superuser `postgres`.
 * - Every started cluster is registered; on process exit / SIGINT / SIGTERM the remaining
 *   ones are stopped (immediate) and their directories removed. Directories left behind
 *   by a killed process are swept on the next startCluster().
 */
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import pg from 'pg';
import type { QueryResult } from 'pg';
import { pgBinDir } from './binaries.js';

export interface ClusterOptions {
  major: number;
  /** postgresql.conf settings; override the harness defaults. */
  settings?: Record<string, string | number>;
  /** Used in the temp dir name (pgsub-<name>-XXXXXX); default `pg<major>`. */
  name?: string;
  /** pg_hba.conf's whole text (default: initdb's, trust). */
  hba?: string;
  /** Files written into the data directory before the start (certificates, keys, CRLs): name → content, mode 0600, owned by the server's user. */
  files?: Record<string, string | Buffer>;
}

export interface Cluster {
  major: number;
  port: number;
  /** Always '127.0.0.1'. */
  host: string;
  /** Superuser, always 'postgres' (trust auth). */
  user: string;
  dataDir: string;
  binDir: string;
  name: string;
  /** Directory holding the unix socket (and the data dir). */
  socketDir: string;
  /** conninfo URL, e.g. postgres://postgres@127.0.0.1:PORT/db (default db: postgres). */
  url(database?: string): string;
  /** Run SQL through a short-lived `pg` Client. Without params the simple protocol is used,
   *  so several statements are allowed; the rows of the last statement are returned. */
  // biome-ignore lint/suspicious/noExplicitAny: tests read rows of any shape; callers that care pass T
  query<T = any>(sql: string, params?: unknown[], database?: string): Promise<T[]>;
  createDatabase(name: string): Promise<void>;
  /** Fast shutdown, then remove the cluster's directories. Idempotent. */
  stop(): Promise<void>;
  /** pg_ctl restart, keeping data and settings; `immediate` is a crash (no shutdown checkpoint, unflushed WAL lost). */
  restart(mode?: 'fast' | 'smart' | 'immediate'): Promise<void>;
  /** pg_ctl stop with this mode, keeping the data directory for startServer(). */
  stopServer(mode?: 'fast' | 'smart' | 'immediate'): Promise<void>;
  /** Start a server stopped by stopServer(), on the same port. */
  startServer(): Promise<void>;
}

/** Settings applied to every cluster unless overridden by ClusterOptions.settings. */
export const DEFAULT_SETTINGS: Readonly<Record<string, string | number>> = Object.freeze({
  wal_level: 'logical',
  max_wal_senders: 20,
  max_replication_slots: 20,
  max_logical_replication_workers: 10,
  max_worker_processes: 20,
  max_prepared_transactions: 10,
  fsync: 'on',
  shared_buffers: '64MB',
});

const HOST = '127.0.0.1';
const SUPERUSER = 'postgres';
const MARKER = 'pgsub-harness.json';
const PG_CTL_TIMEOUT_S = 60;
const PORT_MIN = 20000;
const PORT_MAX = 32000;
const START_ATTEMPTS = 5;

/** Environment for initdb/pg_ctl: C locale so messages are stable and no locale warnings. */
const CHILD_ENV: NodeJS.ProcessEnv = (() => {
  const env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: 'C', LANG: 'C' };
  for (const k of Object.keys(env)) if (k.startsWith('PG')) delete env[k];
  return env;
})();

const isRoot = (): boolean => process.getuid?.() === 0;

/** Base directory for cluster temp dirs. As root use /tmp (TMPDIR may not be traversable). */
function baseTmpDir(): string {
  return process.env.PGSUB_TEST_TMPDIR ?? (isRoot() ? '/tmp' : os.tmpdir());
}

// ---------------------------------------------------------------------------------------
// Running commands (as the server user when root)

interface ServerUser {
  name: string;
  uid: number;
  gid: number;
}

let serverUserCache: ServerUser | undefined;

function lookupUser(name: string): ServerUser | undefined {
  try {
    const uid = Number(
      execFileSync('id', ['-u', name], { stdio: ['ignore', 'pipe', 'ignore'] })
        .toString()
        .trim(),
    );
    const gid = Number(
      execFileSync('id', ['-g', name], { stdio: ['ignore', 'pipe', 'ignore'] })
        .toString()
        .trim(),
    );
    return { name, uid, gid };
  } catch {
    return undefined;
  }
}

/** Only meaningful when root. Synchronous so the exit handler can use the cached value. */
function serverUser(): ServerUser {
  if (serverUserCache) return serverUserCache;
  let u = lookupUser('postgres') ?? lookupUser('pgsub');
  if (!u) {
    try {
      execFileSync('useradd', ['--system', '--no-create-home', '--shell', '/usr/sbin/nologin', 'pgsub'], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
    } catch (err) {
      // A concurrent test process may have created it (exit code 9 = username in use).
      if (!lookupUser('pgsub')) {
        const e = err as { stderr?: Buffer; message: string };
        throw new Error(`cannot create unprivileged user pgsub for the test server: ${e.stderr?.toString() || e.message}`);
      }
    }
    u = lookupUser('pgsub');
    if (!u) throw new Error('useradd pgsub succeeded but `id -u pgsub` fails');
  }
  serverUserCache = u;
  return u;
}

function wrapCommand(cmd: string, args: string[]): [string, string[]] {
  if (!isRoot()) return [cmd, args];
  return ['runuser', ['-u', serverUser().name, '--', cmd, ...args]];
}

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], timeoutMs = (PG_CTL_TIMEOUT_S + 30) * 1000): Promise<RunResult> {
  const [c, a] = wrapCommand(cmd, args);
  return new Promise((resolve) => {
    execFile(c, a, { env: CHILD_ENV, cwd: '/', timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024, encoding: 'utf8' }, (err, stdout, stderr) => {
      let code = 0;
      if (err) {
        const e = err as NodeJS.ErrnoException & { code?: number | string; signal?: string };
        code = typeof e.code === 'number' ? e.code : -1;
        if (typeof e.code === 'string') stderr += `\n${e.code}: ${e.message}`;
        if (e.signal) stderr += `\nkilled by ${e.signal}`;
      }
      resolve({ code, stdout, stderr });
    });
  });
}

function runSync(cmd: string, args: string[]): void {
  const [c, a] = wrapCommand(cmd, args);
  execFileSync(c, a, { env: CHILD_ENV, cwd: '/', stdio: 'ignore', timeout: (PG_CTL_TIMEOUT_S + 5) * 1000 });
}

async function runOk(cmd: string, args: string[], what: string): Promise<RunResult> {
  const r = await run(cmd, args);
  if (r.code !== 0) {
    throw new Error(`${what} failed (exit ${r.code}): ${path.basename(cmd)} ${args.join(' ')}\n${r.stdout}${r.stderr}`);
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// Registry & cleanup

interface Entry {
  rootDir: string;
  dataDir: string;
  binDir: string;
  running: boolean;
}

const live = new Set<Entry>();
let handlersInstalled = false;

function immediateStopSync(e: Entry): void {
  if (e.running && existsSync(path.join(e.dataDir, 'postmaster.pid'))) {
    try {
      runSync(path.join(e.binDir, 'pg_ctl'), ['stop', '-D', e.dataDir, '-m', 'immediate', '-w', '-t', '30']);
    } catch {
      /* best effort */
    }
  }
  try {
    rmSync(e.rootDir, { recursive: true, force: true });
  } catch {
    /* best effort */
  }
}

function cleanupAllSync(): void {
  for (const e of live) immediateStopSync(e);
  live.clear();
}

function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  process.on('exit', cleanupAllSync);
  for (const [sig, num] of [
    ['SIGINT', 2],
    ['SIGTERM', 15],
  ] as const) {
    process.on(sig, () => {
      cleanupAllSync();
      process.exit(128 + num);
    });
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

let swept = false;

/** Remove clusters left behind by harness processes that died without cleaning up (e.g. SIGKILL). */
function sweepStale(): void {
  if (swept) return;
  swept = true;
  const base = baseTmpDir();
  let entries: string[];
  try {
    entries = readdirSync(base);
  } catch {
    return;
  }
  for (const name of entries) {
    if (!name.startsWith('pgsub-')) continue;
    const rootDir = path.join(base, name);
    let info: { ownerPid?: number; dataDir?: string; binDir?: string; uid?: number };
    try {
      info = JSON.parse(readFileSync(path.join(rootDir, MARKER), 'utf8')) as typeof info;
    } catch {
      continue;
    }
    if (typeof info.ownerPid !== 'number' || !info.dataDir || !info.binDir) continue;
    if (info.uid !== process.getuid?.()) continue;
    if (pidAlive(info.ownerPid)) continue;
    immediateStopSync({ rootDir, dataDir: info.dataDir, binDir: info.binDir, running: true });
  }
}

// ---------------------------------------------------------------------------------------
// Helpers

function quoteConfValue(v: string | number): string {
  return typeof v === 'number' ? String(v) : `'${v.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

function quoteIdent(s: string): string {
  return `"${s.replace(/"/g, '""')}"`;
}

const usedPorts = new Set<number>();

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = net.createServer();
    srv.unref();
    srv.once('error', () => resolve(false));
    srv.listen({ port, host: HOST, exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/** A free loopback port in the harness's range (below 32768, outside the ephemeral ports). */
export async function pickPort(): Promise<number> {
  for (let i = 0; i < 200; i++) {
    const port = PORT_MIN + Math.floor(Math.random() * (PORT_MAX - PORT_MIN));
    if (usedPorts.has(port)) continue;
    if (await portIsFree(port)) return port;
  }
  throw new Error(`no free TCP port found in ${PORT_MIN}-${PORT_MAX}`);
}

async function tail(file: string, lines = 60): Promise<string> {
  try {
    const text = await fsp.readFile(file, 'utf8');
    return text.split('\n').slice(-lines).join('\n');
  } catch (err) {
    return `(no ${file}: ${(err as Error).message})`;
  }
}

function looksLikePortClash(log: string): boolean {
  return /could not bind|Address already in use|could not create any TCP\/IP sockets|lock file .* already exists/i.test(log);
}

// ---------------------------------------------------------------------------------------

/** Start a fresh cluster of the given major. */
export async function startCluster(opts: ClusterOptions): Promise<Cluster> {
  const { major } = opts;
  const name = (opts.name ?? `pg${major}`).replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 40);
  installHandlers();
  sweepStale();
  const binDir = await pgBinDir(major);
  const pgCtl = path.join(binDir, 'pg_ctl');
  const initdb = path.join(binDir, 'initdb');

  const base = baseTmpDir();
  const rootDir = await fsp.mkdtemp(path.join(base, `pgsub-${name}-`));
  const dataDir = path.join(rootDir, 'data');
  const logFile = path.join(dataDir, 'server.log');
  const entry: Entry = { rootDir, dataDir, binDir, running: false };
  live.add(entry);

  let port = 0;
  try {
    await fsp.writeFile(path.join(rootDir, MARKER), JSON.stringify({ ownerPid: process.pid, uid: process.getuid?.(), dataDir, binDir, major }));
    if (isRoot()) {
      const u = serverUser();
      await fsp.chown(rootDir, u.uid, u.gid);
    }

    await runOk(initdb, ['-D', dataDir, '-U', SUPERUSER, '--auth=trust', '-E', 'UTF8', '--locale=C', '--no-sync'], `initdb (PostgreSQL ${major})`);

    // Harness settings live in their own file, included from postgresql.conf, so that the
    // port can be rewritten on a retry and everything survives restart(). ALTER SYSTEM
    // (postgresql.auto.conf) still overrides it.
    const serverOwned = async (file: string, content: string | Buffer) => {
      await fsp.writeFile(file, content, { mode: 0o600 });
      await fsp.chmod(file, 0o600);
      if (isRoot()) {
        const u = serverUser();
        await fsp.chown(file, u.uid, u.gid);
      }
    };
    if (opts.hba !== undefined) await serverOwned(path.join(dataDir, 'pg_hba.conf'), opts.hba);
    for (const [file, content] of Object.entries(opts.files ?? {})) await serverOwned(path.join(dataDir, file), content);
    const confFile = path.join(dataDir, 'postgresql.conf');
    const harnessConf = path.join(dataDir, 'pgsub_harness.conf');
    await fsp.appendFile(confFile, `\n# added by pgsub test harness\ninclude 'pgsub_harness.conf'\n`);
    const settings: Record<string, string | number> = {
      ...DEFAULT_SETTINGS,
      listen_addresses: HOST,
      unix_socket_directories: rootDir,
      ...(opts.settings ?? {}),
    };

    for (let attempt = 1; ; attempt++) {
      port = await pickPort();
      usedPorts.add(port);
      const lines = Object.entries({ ...settings, port }).map(([k, v]) => `${k} = ${quoteConfValue(v)}`);
      await fsp.writeFile(harnessConf, `${lines.join('\n')}\n`);
      if (isRoot()) {
        const u = serverUser();
        await fsp.chown(harnessConf, u.uid, u.gid);
      }
      entry.running = true; // from here on the exit handler must try to stop it
      const r = await run(pgCtl, ['start', '-D', dataDir, '-l', logFile, '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
      if (r.code === 0) break;
      const log = await tail(logFile);
      // Make sure nothing is left running before retrying / giving up.
      await run(pgCtl, ['stop', '-D', dataDir, '-m', 'immediate', '-w', '-t', '30']);
      entry.running = false;
      usedPorts.delete(port);
      if (attempt < START_ATTEMPTS && looksLikePortClash(log)) continue;
      throw new Error(`PostgreSQL ${major} failed to start (port ${port}, exit ${r.code}).\n` + `pg_ctl output:\n${r.stdout}${r.stderr}\n--- tail of ${logFile} ---\n${log}`);
    }
  } catch (err) {
    if (entry.running) await run(pgCtl, ['stop', '-D', dataDir, '-m', 'immediate', '-w', '-t', '30']);
    live.delete(entry);
    usedPorts.delete(port);
    // Read anything useful before deleting (errors above already carry the log tail).
    await fsp.rm(rootDir, { recursive: true, force: true }).catch(() => {});
    throw err;
  }

  let stopping: Promise<void> | undefined;

  const cluster: Cluster = {
    major,
    port,
    host: HOST,
    user: SUPERUSER,
    dataDir,
    binDir,
    name,
    socketDir: rootDir,
    url(database = 'postgres') {
      return `postgres://${SUPERUSER}@${HOST}:${port}/${encodeURIComponent(database)}`;
    },
    // biome-ignore lint/suspicious/noExplicitAny: as declared in Cluster
    async query<T = any>(sql: string, params?: unknown[], database = 'postgres'): Promise<T[]> {
      const client = new pg.Client({ host: HOST, port, user: SUPERUSER, database });
      client.on('error', () => {}); // e.g. server stopped while idle; the query itself rejects
      try {
        await client.connect();
        const res = (await client.query(sql, params)) as QueryResult | QueryResult[];
        const last = Array.isArray(res) ? res[res.length - 1] : res;
        return (last?.rows ?? []) as T[];
      } finally {
        await client.end().catch(() => {});
      }
    },
    async createDatabase(db: string) {
      await cluster.query(`CREATE DATABASE ${quoteIdent(db)}`);
    },
    async restart(mode: 'fast' | 'smart' | 'immediate' = 'fast') {
      if (stopping) throw new Error(`cluster ${name} is stopped`);
      const r = await run(pgCtl, ['restart', '-D', dataDir, '-l', logFile, '-m', mode, '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
      if (r.code !== 0) {
        throw new Error(`PostgreSQL ${major} restart failed (exit ${r.code}).\n${r.stdout}${r.stderr}\n` + `--- tail of ${logFile} ---\n${await tail(logFile)}`);
      }
    },
    async stopServer(mode: 'fast' | 'smart' | 'immediate' = 'fast') {
      if (stopping) throw new Error(`cluster ${name} is stopped`);
      const r = await run(pgCtl, ['stop', '-D', dataDir, '-m', mode, '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
      if (r.code !== 0) throw new Error(`PostgreSQL ${major} stop -m ${mode} failed (exit ${r.code}).\n${r.stdout}${r.stderr}`);
    },
    async startServer() {
      if (stopping) throw new Error(`cluster ${name} is stopped`);
      const r = await run(pgCtl, ['start', '-D', dataDir, '-l', logFile, '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
      if (r.code !== 0) {
        throw new Error(`PostgreSQL ${major} start failed (exit ${r.code}).\n${r.stdout}${r.stderr}\n--- tail of ${logFile} ---\n${await tail(logFile)}`);
      }
    },
    stop() {
      stopping ??= (async () => {
        try {
          if (entry.running) {
            const r = await run(pgCtl, ['stop', '-D', dataDir, '-m', 'fast', '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
            if (r.code !== 0 && existsSync(path.join(dataDir, 'postmaster.pid'))) {
              await run(pgCtl, ['stop', '-D', dataDir, '-m', 'immediate', '-w', '-t', '30']);
            }
            entry.running = false;
          }
        } finally {
          await fsp.rm(rootDir, { recursive: true, force: true });
          live.delete(entry);
          usedPorts.delete(port);
        }
      })();
      return stopping;
    },
  };
  return cluster;
}

/** Stop (fast) and remove every cluster started by this process that is still registered. */
export async function stopAllClusters(): Promise<void> {
  const entries = [...live];
  await Promise.all(
    entries.map(async (e) => {
      if (e.running) {
        const pgCtl = path.join(e.binDir, 'pg_ctl');
        const r = await run(pgCtl, ['stop', '-D', e.dataDir, '-m', 'fast', '-w', '-t', String(PG_CTL_TIMEOUT_S)]);
        if (r.code !== 0 && existsSync(path.join(e.dataDir, 'postmaster.pid'))) {
          await run(pgCtl, ['stop', '-D', e.dataDir, '-m', 'immediate', '-w', '-t', '30']);
        }
        e.running = false;
      }
      await fsp.rm(e.rootDir, { recursive: true, force: true });
      live.delete(e);
    }),
  );
}
