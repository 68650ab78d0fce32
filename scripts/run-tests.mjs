#!/usr/bin/env node
// Runs Node's test runner over an explicit, sorted list of test files.
// Node 20 neither discovers .ts files nor expands recursive globs, so we list them here.
//
//   node scripts/run-tests.mjs                 all test/**/*.test.ts (unit first, then the rest)
//   node scripts/run-tests.mjs --unit          only test/unit/
//   node scripts/run-tests.mjs --integration   only test/integration/
//   node scripts/run-tests.mjs harness decode  only files whose path contains "harness" or "decode"
//   node scripts/run-tests.mjs --test-name-pattern=foo   other --flags are passed to node
import { spawn, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
process.chdir(root);

let unit = false;
let integration = false;
const filters = [];
const nodeFlags = [];
for (const arg of process.argv.slice(2)) {
  if (arg === '--unit') unit = true;
  else if (arg === '--integration') integration = true;
  else if (arg.startsWith('--')) nodeFlags.push(arg);
  else filters.push(arg);
}

function findTests(dir) {
  const out = [];
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return out;
  }
  for (const e of entries) {
    const p = path.posix.join(dir, e.name);
    if (e.isDirectory()) {
      if (e.name !== 'node_modules' && !e.name.startsWith('.')) out.push(...findTests(p));
    } else if (e.isFile() && e.name.endsWith('.test.ts')) {
      out.push(p);
    }
  }
  return out;
}

const group = (f) => (f.startsWith('test/unit/') ? 0 : f.startsWith('test/integration/') ? 2 : 1);
let files = findTests('test').sort((a, b) => group(a) - group(b) || (a < b ? -1 : a > b ? 1 : 0));
if (unit || integration) {
  files = files.filter((f) => (unit && f.startsWith('test/unit/')) || (integration && f.startsWith('test/integration/')));
}
if (filters.length) files = files.filter((f) => filters.some((s) => f.includes(s)));

if (files.length === 0) {
  // Never call `node --test` without files: it would fall back to its own discovery.
  const what = [unit && '--unit', integration && '--integration', ...filters].filter(Boolean).join(' ');
  console.error(`run-tests: no test files match ${what || 'test/**/*.test.ts'}`);
  process.exit(filters.length ? 1 : 0);
}

// Integration tests spawn pgsub hundreds of times: bundled once from the sources here, a
// start costs a fraction of tsx compiling them at every spawn (PGSUB_TEST_FROM_SOURCE=1: no bundle).
const env = { ...process.env };
if (files.some((f) => !f.startsWith('test/unit/')) && !process.env.PGSUB_TEST_FROM_SOURCE) {
  const outdir = path.join('.test-build', 'bundle');
  const built = spawnSync(process.execPath, ['scripts/bundle.mjs', '--outdir', outdir], { stdio: 'inherit' });
  if (built.status !== 0) {
    console.error('run-tests: bundling the sources failed');
    process.exit(1);
  }
  env.PGSUB_TEST_BIN = path.join(root, outdir, 'main.js');
}

// Two files at a time: integration tests mostly wait on servers (the whole suite used about
// 40% of two cores run one by one); every file starts its own clusters on free ports.
// PGSUB_TEST_CONCURRENCY=1 runs them one by one.
const concurrency = Number(process.env.PGSUB_TEST_CONCURRENCY ?? 2);
const args = ['--import', 'tsx', '--test', `--test-concurrency=${concurrency}`, '--test-timeout=600000', ...nodeFlags, ...files];
console.error(`run-tests: ${files.length} file(s): ${files.join(' ')}`);
const child = spawn(process.execPath, args, { stdio: 'inherit', env });
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => child.kill(sig));
}
child.on('exit', (code, signal) => {
  if (signal) {
    const num = { SIGINT: 2, SIGTERM: 15, SIGKILL: 9 }[signal] ?? 1;
    process.exit(128 + num);
  }
  process.exit(code ?? 1);
});
