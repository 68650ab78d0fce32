/**
 * pg_dump for `pgsub schema`: found on PATH or where config `pg_dump` / `--pg-dump` says,
 * refused when older than the source server (pg_dump reads only servers of its own major
 * or older; an older one fails part-way or misses what it does not know), run with the
 * source's connection given keyword by keyword in a private service file (the password
 * too, never on its command line, in its environment or in a log), and its plain-text output split into
 * the entries pg_dump heads with `-- Name: …; Type: …; Schema: …` — the unit schema copy
 * selects, orders and applies. psql meta-commands (`\restrict`, pg_dump 17.6/16.10/15.14
 * and later) are dropped: the SQL runs through the driver, where no meta-command could run.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { type ConnInfo, conninfoKeywords, redactSecrets } from '../config/conninfo.js';
import { PgDumpError } from '../errors.js';

export interface PgDump {
  path: string;
  /** e.g. "15.18"; the full --version line in `banner`. */
  version: string;
  major: number;
  banner: string;
}

export interface DumpEntry {
  name: string;
  type: string;
  schema: string | null;
  sql: string;
}

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  error?: NodeJS.ErrnoException;
}

function run(file: string, args: string[], env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(file, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => out.push(c));
    child.stderr.on('data', (c: Buffer) => err.push(c));
    child.on('error', (error: NodeJS.ErrnoException) => resolve({ code: null, stdout: '', stderr: '', error }));
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') }));
  });
}

/** "pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" → 15.18; "pg_dump (PostgreSQL) 10.23" → 10.23; "18beta1" → 18. */
export function parseVersion(banner: string): { version: string; major: number } | null {
  const m = /\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?/.exec(banner);
  if (!m) return null;
  return { version: m[2] === undefined ? m[1]! : `${m[1]}.${m[2]}`, major: Number(m[1]) };
}

/**
 * The pg_dump to use for a source server of `sourceVersionNum`: `configured`, else the
 * first `pg_dump` on PATH. Missing, unreadable or older than the source: PgDumpError (exit
 * 2) naming both versions and how to give another one.
 */
export async function findPgDump(configured: string | null, source: { versionNum: number; version: string }): Promise<PgDump> {
  const file = configured ?? 'pg_dump';
  const r = await run(file, ['--version'], { PATH: process.env.PATH ?? '/usr/bin:/bin', LANG: 'C', LC_ALL: 'C' });
  if (r.error) {
    throw new PgDumpError(
      `${configured ? `pg_dump ${configured}` : 'pg_dump (not on PATH)'} cannot be run (${r.error.code ?? r.error.message}): install the PostgreSQL ${Math.floor(source.versionNum / 10000)} client or later, or give its path (config pg_dump, or --pg-dump)`,
      { key: 'pg_dump' },
    );
  }
  const where = resolvePath(file);
  const parsed = parseVersion(r.stdout);
  if (r.code !== 0 || !parsed) throw new PgDumpError(`${file} --version did not name a PostgreSQL version: ${(r.stdout + r.stderr).trim().slice(0, 200)}`, { key: 'pg_dump' });
  const sourceMajor = Math.floor(source.versionNum / 10000);
  if (parsed.major < sourceMajor) {
    throw new PgDumpError(
      `pg_dump ${parsed.version} (${where}) is older than the source server, PostgreSQL ${source.version}: pg_dump can dump servers of its own major version or older only. Use the pg_dump of PostgreSQL ${sourceMajor} or later (config pg_dump, or --pg-dump)`,
      { key: 'pg_dump', pgDumpVersion: parsed.version, sourceVersion: source.version },
    );
  }
  return { path: where, version: parsed.version, major: parsed.major, banner: r.stdout.trim() };
}

/** Where PATH finds `file` (what the messages name); the name itself when it has a slash or is not found. */
function resolvePath(file: string): string {
  if (file.includes('/')) return file;
  for (const dir of (process.env.PATH ?? '').split(':')) {
    const candidate = path.join(dir || '.', file);
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return candidate;
    } catch {
      // not in this directory
    }
  }
  return file;
}

/**
 * The child's connection: every setting of the source conninfo (src/config/conninfo.ts
 * conninfoKeywords: hosts, TLS files, require_auth, target_session_attrs …) and the
 * password in a service file of its own — a 0700 directory, a 0600 file, removed when
 * pg_dump ends — named by PGSERVICEFILE/PGSERVICE. Nothing secret is in argv or the
 * environment, and no PG* variable of ours reaches the child.
 */
async function withDumpEnv<T>(info: ConnInfo, use: (env: NodeJS.ProcessEnv) => Promise<T>): Promise<T> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-dump-'));
  try {
    const file = path.join(dir, 'pg_service.conf');
    const keywords = conninfoKeywords(info);
    keywords.application_name = 'pgsub_schema';
    keywords.connect_timeout ??= String(info.connectTimeoutSeconds ?? 30);
    if (info.password !== undefined) keywords.password = info.password;
    if (info.settings.sslpassword !== undefined) keywords.sslpassword = info.settings.sslpassword;
    const lines = Object.entries(keywords).map(([k, v]) => `${k}=${v}`);
    fs.writeFileSync(file, `[pgsub]\n${lines.join('\n')}\n`, { mode: 0o600 });
    const env: NodeJS.ProcessEnv = { PATH: process.env.PATH ?? '/usr/bin:/bin', LANG: 'C', LC_ALL: 'C', PGSERVICEFILE: file, PGSERVICE: 'pgsub' };
    if (process.env.HOME) env.HOME = process.env.HOME;
    return await use(env);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** `pg_dump --schema-only … args` against the source; the plain SQL it prints. */
export async function runPgDump(dump: PgDump, info: ConnInfo, args: string[]): Promise<string> {
  const r = await withDumpEnv(info, (env) => run(dump.path, ['--schema-only', '--no-owner', '--no-privileges', ...args], env));
  if (r.error || r.code !== 0) {
    throw new PgDumpError(`pg_dump ${dump.version} failed (exit ${r.code ?? r.error?.code}): ${redactSecrets(r.stderr.trim() || String(r.error?.message ?? ''))}`, {
      pgDumpVersion: dump.version,
    });
  }
  return r.stdout;
}

/** A pattern for `pg_dump -t/-n` that matches this exact name (quoted: no wildcards, case kept). */
export function dumpPattern(schema: string, name?: string): string {
  const q = (s: string) => `"${s.replace(/"/g, '""')}"`;
  return name === undefined ? q(schema) : `${q(schema)}.${q(name)}`;
}

const HEADER = /^-- (?:Data for )?Name: (.*); Type: ([^;]+); Schema: ([^;]+); Owner: [^\n]*$/;

/**
 * The dump's preamble (its SET statements) and entries, in the dump's order (pg_dump
 * orders them by dependency). Each entry's SQL runs from its header's frame to the next
 * header's, as pg_dump wrote it (comments inside a function body stay).
 */
export function splitDump(text: string): { preamble: string; entries: DumpEntry[] } {
  const lines = text.split('\n').filter((l) => !l.startsWith('\\'));
  const end = lines.indexOf('-- PostgreSQL database dump complete');
  const body = end >= 0 ? lines.slice(0, end - 1) : lines;
  // A header is framed by `--` lines: "--", "-- Name: …", "--".
  const headers: { at: number; m: RegExpExecArray }[] = [];
  body.forEach((line, i) => {
    const m = HEADER.exec(line);
    if (m && body[i - 1] === '--' && body[i + 1] === '--') headers.push({ at: i, m });
  });
  const preamble = body
    .slice(0, headers.length > 0 ? headers[0]!.at - 1 : body.length)
    .filter((l) => !/^--( |$)/.test(l))
    .join('\n')
    .trim();
  const entries = headers.map(({ at, m }, k) => {
    const until = k + 1 < headers.length ? headers[k + 1]!.at - 1 : body.length;
    const [, name, type, schema] = m;
    return {
      name: name!,
      type: type!.trim(),
      schema: schema === '-' ? null : schema!,
      sql: body
        .slice(at + 2, until)
        .join('\n')
        .trim(),
    };
  });
  return { preamble, entries };
}
