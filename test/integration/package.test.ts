/**
 * Installable (issues 17, 29): `npm pack` of a copy of the repository builds the bundle
 * (prepack) and gives a tarball with no dependencies and no source maps (the bundle holds
 * everything), so `npm install -g --offline` puts it into an empty prefix without a
 * registry, in a few MB (46 MB when the dependencies were installed beside the bundle). The
 * installed `pgsub` runs from the bundle — no tsx, no node_modules, no sources — prints its
 * version, replicates between two servers and shows its status; its `demo`, which needs the
 * server binaries of the checkout's devDependencies, exits 2 saying to run it from a
 * checkout, without a stack trace. Packed and installed once, in `before`.
 */
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { compareTables, startCluster, waitFor, waitForCatchUp, type Cluster } from '../harness/index.js';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '..', '..');
/** The installed package's size must stay near its 4 MB (1.5 MB of it the code cache), far from the 46 MB with dependencies. */
const MAX_INSTALLED_BYTES = 6 * 1024 * 1024;
let work: string;
let publisher: Cluster;
let target: Cluster;
/** From `npm pack --json`: the tarball and its files. */
let packed: { filename: string; files: { path: string }[] };
let prefix: string;
let bin: string;
let env: Record<string, string>;

async function pack(): Promise<void> {
  // A copy, so that building the bundle leaves the working tree as it is.
  const copy = path.join(work, 'repo');
  fs.mkdirSync(copy);
  for (const entry of ['bin', 'src', 'migrations', 'packaging', 'scripts', 'test', 'package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'README.md']) {
    fs.cpSync(path.join(REPO, entry), path.join(copy, entry), { recursive: true });
  }
  fs.symlinkSync(path.join(REPO, 'node_modules'), path.join(copy, 'node_modules'));
  // PGSUB_SOURCEMAP unset, as for a release: scripts/bundle.mjs writes no maps.
  const { PGSUB_SOURCEMAP: _, ...packEnv } = process.env;
  const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', work], { cwd: copy, env: packEnv, maxBuffer: 16 * 1024 * 1024 });
  packed = (JSON.parse(stdout) as (typeof packed)[])[0]!;
  prefix = path.join(work, 'prefix');
  // --offline: a tarball without dependencies needs no registry.
  await run('npm', ['install', '-g', '--offline', '--prefix', prefix, '--no-audit', '--no-fund', path.join(work, packed.filename)], {
    cwd: work,
    maxBuffer: 16 * 1024 * 1024,
  });
  bin = path.join(prefix, 'bin', 'pgsub');
  env = { PATH: process.env.PATH ?? '', HOME: work };
}

before(
  async () => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-pack-'));
    const servers = Promise.all([startCluster({ major: 18, name: 'pack-pub' }), startCluster({ major: 16, name: 'pack-tgt' })]);
    await pack();
    [publisher, target] = await servers;
    await publisher.createDatabase('src');
    await target.createDatabase('dst');
    const schema = `CREATE TABLE public.items (id int PRIMARY KEY, v text);`;
    await publisher.query(`${schema} INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, 1000) g; CREATE PUBLICATION pub FOR TABLE public.items;`, [], 'src');
    await target.query(schema, [], 'dst');
  },
  { timeout: 600_000 },
);

after(async () => {
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

/** The installed pgsub's `run` against the test servers, its output collected; resolves once it streams. */
async function runInstalled(what: string): Promise<{ output: () => string; stop: () => Promise<number | null>; runEnv: Record<string, string> }> {
  const runEnv = {
    ...env,
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'packed',
    PGSUB_STATE_DIR: path.join(work, 'state'),
  };
  const child = spawn(bin, ['run'], { env: runEnv, stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b));
  child.stderr.on('data', (b: Buffer) => (output += b));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const stop = () => {
    child.kill('SIGTERM');
    return exited;
  };
  try {
    await waitFor(async () => output.includes('"msg":"streaming started"'), { timeoutMs: 120_000, what });
  } catch (err) {
    await stop();
    assert.fail(`${err}\n${output.slice(-3000)}`);
  }
  return { output: () => output, stop, runEnv };
}

/** The 'starting' log line of a run's output. */
function startingLine(output: string): Record<string, unknown> {
  const line = output.split('\n').find((l) => l.includes('"msg":"starting"'));
  assert.ok(line, `no 'starting' line in\n${output.slice(0, 2000)}`);
  return JSON.parse(line) as Record<string, unknown>;
}

/** Bytes of the files under dir (symlinks not followed). */
function treeBytes(dir: string): number {
  let total = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += treeBytes(p);
    else total += fs.lstatSync(p).size;
  }
  return total;
}

test('the tarball: the bundle without source maps, no dependencies; installed offline into a few MB with no node_modules', () => {
  const files = packed.files.map((f) => f.path);
  // The loader, the bundle and the V8 code cache made when it was built (scripts/bundle.mjs).
  for (const f of ['dist/bundle/main.js', 'dist/bundle/main.cjs', 'dist/bundle/main.cjs.cache']) assert.ok(files.includes(f), `${f} in\n${files.join('\n')}`);
  assert.ok(files.includes('packaging/systemd/pgsub@.service'));
  assert.ok(!files.some((f) => f.startsWith('src/') || f.startsWith('test/')), 'sources are not shipped');
  assert.deepEqual(
    files.filter((f) => f.endsWith('.map')),
    [],
    'no source maps',
  );
  const installed = path.join(prefix, 'lib', 'node_modules', 'pgsub');
  const manifest = JSON.parse(fs.readFileSync(path.join(installed, 'package.json'), 'utf8')) as Record<string, unknown>;
  for (const key of ['dependencies', 'optionalDependencies', 'peerDependencies']) assert.equal(manifest[key], undefined, `the package has no ${key}`);
  assert.equal(fs.existsSync(path.join(installed, 'node_modules')), false, 'nothing installed beside the bundle');
  const bytes = treeBytes(prefix);
  assert.ok(bytes < MAX_INSTALLED_BYTES, `installed: ${bytes} bytes`);
});

test('the installed pgsub prints its version, replicates from its bundle and shows the status', { timeout: 600_000 }, async () => {
  const version = await run(bin, ['--version'], { env });
  assert.equal(version.stdout.trim(), JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')).version);

  const pgsub = await runInstalled('the installed pgsub streaming');
  let exitCode: number | null = null;
  try {
    // Compiled from the code cache the package was built with (the same Node here).
    assert.equal(startingLine(pgsub.output()).code_cache, 'accepted', pgsub.output().slice(0, 2000));
    await publisher.query(`INSERT INTO public.items VALUES (1001, 'streamed')`, [], 'src');
    await waitForCatchUp(publisher, 'src', 'packed', 120_000).catch((err) => assert.fail(`${err}\n${pgsub.output().slice(-3000)}`));
    const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.items']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    const status = await run(bin, ['status', '--json'], { env: pgsub.runEnv });
    const json = JSON.parse(status.stdout) as { subscription: string; slot_active: boolean | null };
    assert.equal(json.subscription, 'packed');
    assert.equal(json.slot_active, true, status.stdout);
  } finally {
    exitCode = await pgsub.stop();
  }
  assert.equal(exitCode, 0, pgsub.output().slice(-3000));
});

test('the installed pgsub demo exits 2 saying it runs from a checkout, without a stack trace', async () => {
  const demo = await run(bin, ['demo'], { env }).then(
    () => assert.fail('the installed demo succeeded without server binaries'),
    (err: { code: number; stdout: string; stderr: string }) => err,
  );
  const output = `${demo.stdout}${demo.stderr}`;
  assert.equal(demo.code, 2, output);
  assert.match(demo.stderr, /^pgsub: PGSUB_DEMO_NO_SERVERS: PostgreSQL 14 binaries not found: .*installed pgsub does not include.*npm ci && npm run demo\n$/);
  assert.doesNotMatch(output, /^\s+at /m, 'no stack trace');
  assert.equal(demo.stdout, '', 'said before anything was made or started');
});

test('a code cache that does not fit the bundle is not used: a stale one (another build) or one V8 refuses; pgsub runs all the same', { timeout: 300_000 }, async () => {
  const bundleDir = path.join(prefix, 'lib', 'node_modules', 'pgsub', 'dist', 'bundle');
  const cacheFile = path.join(bundleDir, 'main.cjs.cache');
  const made = fs.readFileSync(cacheFile);
  const digest = createHash('sha256')
    .update(fs.readFileSync(path.join(bundleDir, 'main.cjs')))
    .digest();
  assert.deepEqual(made.subarray(0, 32), digest, 'the cache names the bundle it was made from');
  const cases: [string, Buffer][] = [
    // Made from another build: V8 alone would take it, as it compares only the source's length.
    ['stale', Buffer.concat([createHash('sha256').update('another bundle').digest(), made.subarray(32)])],
    ['rejected', Buffer.concat([digest, Buffer.alloc(4096, 0x5a)])],
  ];
  try {
    for (const [expected, content] of cases) {
      fs.writeFileSync(cacheFile, content);
      const pgsub = await runInstalled(`pgsub streaming with a ${expected} cache`);
      const exitCode = await pgsub.stop();
      assert.equal(startingLine(pgsub.output()).code_cache, expected, pgsub.output().slice(0, 2000));
      assert.equal(exitCode, 0, pgsub.output().slice(-3000));
    }
  } finally {
    fs.writeFileSync(cacheFile, made);
  }
});
