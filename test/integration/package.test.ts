/**
 * Installable (issue 17): `npm pack` of a copy of the repository builds the bundle
 * (prepack) and gives a tarball that `npm install -g` puts into an empty prefix; the
 * installed `pgsub` runs from the bundle — no tsx, no dev dependencies, no sources —
 * prints its version, and replicates between two servers.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { compareTables, startCluster, waitFor, waitForCatchUp, type Cluster } from '../harness/index.js';
import { spawn } from 'node:child_process';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '..', '..');
let work: string;
let publisher: Cluster;
let target: Cluster;

before(async () => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-pack-'));
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'pack-pub' }), startCluster({ major: 16, name: 'pack-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  const schema = `CREATE TABLE public.items (id int PRIMARY KEY, v text);`;
  await publisher.query(`${schema} INSERT INTO public.items SELECT g, 'v' || g FROM generate_series(1, 1000) g; CREATE PUBLICATION pub FOR TABLE public.items;`, [], 'src');
  await target.query(schema, [], 'dst');
});

after(async () => {
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

test('npm pack, npm install -g into an empty prefix: the installed pgsub runs from its bundle and replicates', { timeout: 600_000 }, async () => {
  // A copy, so that building the bundle leaves the working tree as it is.
  const copy = path.join(work, 'repo');
  fs.mkdirSync(copy);
  for (const entry of ['bin', 'src', 'migrations', 'packaging', 'scripts', 'test', 'package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'README.md']) {
    fs.cpSync(path.join(REPO, entry), path.join(copy, entry), { recursive: true });
  }
  fs.symlinkSync(path.join(REPO, 'node_modules'), path.join(copy, 'node_modules'));
  const { stdout: packed } = await run('npm', ['pack', '--json', '--pack-destination', work], { cwd: copy, maxBuffer: 16 * 1024 * 1024 });
  const info = JSON.parse(packed) as { filename: string; files: { path: string }[] }[];
  const files = info[0]!.files.map((f) => f.path);
  assert.ok(files.includes('dist/bundle/main.js'), files.join('\n'));
  assert.ok(files.includes('packaging/systemd/pgsub@.service'));
  assert.ok(!files.some((f) => f.startsWith('src/') || f.startsWith('test/')), 'sources are not shipped');

  const prefix = path.join(work, 'prefix');
  await run('npm', ['install', '-g', '--prefix', prefix, '--no-audit', '--no-fund', path.join(work, info[0]!.filename)], { cwd: work, maxBuffer: 16 * 1024 * 1024 });
  const installed = path.join(prefix, 'lib', 'node_modules', 'pgsub');
  assert.ok(!fs.existsSync(path.join(installed, 'node_modules', 'tsx')), 'tsx is a dev dependency');
  const bin = path.join(prefix, 'bin', 'pgsub');
  const env = { PATH: process.env.PATH ?? '', HOME: work };
  const version = await run(bin, ['--version'], { env });
  assert.equal(version.stdout.trim(), JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')).version);

  const child = spawn(bin, ['run'], {
    env: {
      ...env,
      PGSUB_SOURCE: publisher.url('src'),
      PGSUB_TARGET: target.url('dst'),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: 'packed',
      PGSUB_STATE_DIR: path.join(work, 'state'),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b));
  child.stderr.on('data', (b: Buffer) => (output += b));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  try {
    await waitFor(async () => output.includes('"msg":"streaming started"'), { timeoutMs: 120_000, what: 'the installed pgsub streaming' }).catch((err) =>
      assert.fail(`${err}\n${output.slice(-3000)}`),
    );
    await publisher.query(`INSERT INTO public.items VALUES (1001, 'streamed')`, [], 'src');
    await waitForCatchUp(publisher, 'src', 'packed', 120_000).catch((err) => assert.fail(`${err}\n${output.slice(-3000)}`));
    const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.items']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
  } finally {
    child.kill('SIGTERM');
  }
  assert.equal(await exited, 0, output.slice(-3000));
});
