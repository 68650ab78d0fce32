/**
 * `pgsub demo` (small), as a child process: it migrates (preflight, schema copy, copy,
 * streaming, the fenced cutover) and says the target equals the source; run as root it copies the server binaries to a directory of its own under /tmp
 * and removes it when it ends — after success and after a failure (a target major that is
 * not installed, while the publisher's copy is made and its server starts). The shared
 * /tmp/pgsub-pgbin of the test runs is left alone.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { SHARED_BIN_ROOT, spawnPgsub, withTimeout } from '../harness/index.js';

const isRoot = process.getuid?.() === 0;

/** Runs the demo; watches its binaries directory while it runs. */
async function demo(args: string[]): Promise<{ code: number | string; output: string; dir: string | null; sawServerBinary: boolean }> {
  const p = spawnPgsub({}, ['demo', ...args]);
  let dir: string | null = null;
  let sawServerBinary = false;
  const watch = setInterval(() => {
    dir ??= /^ {2}binaries {2}(\/tmp\/pgsub-demo-bin-\S+) \(removed at the end\)$/m.exec(p.output())?.[1] ?? null;
    if (dir && !sawServerBinary) {
      try {
        sawServerBinary = fs.readdirSync(dir).some((v) => fs.existsSync(path.join(dir!, v, 'bin', 'postgres')));
      } catch {
        // not there yet, or gone
      }
    }
  }, 20);
  try {
    const code = await withTimeout(p.exited, 300_000, `pgsub demo ${args.join(' ')}`);
    return { code, output: p.output(), dir, sawServerBinary };
  } finally {
    clearInterval(watch);
  }
}

function leftovers(): string[] {
  return fs.readdirSync('/tmp').filter((n) => n.startsWith('pgsub-demo-bin-'));
}

test('the demo replicates, then removes the binaries it copied', async () => {
  const before = leftovers();
  const sharedBefore = fs.existsSync(SHARED_BIN_ROOT) ? fs.readdirSync(SHARED_BIN_ROOT).sort() : null;
  const r = await demo(['--publisher', '14', '--target', '18', '--transactions', '200', '--clients', '2']);
  assert.equal(r.code, 0, r.output.slice(-3000));
  assert.match(r.output, /target equals source ✔/);
  assert.match(r.output, /cutover done: demo at \S+, write downtime \d+\.\d+ s/);
  assert.match(r.output, /\d+ write\(s\) refused after the fence/);
  if (isRoot) {
    assert.ok(r.dir, `the demo names its binaries directory:\n${r.output.slice(0, 1000)}`);
    assert.ok(r.sawServerBinary, 'the servers ran from it');
    assert.equal(fs.existsSync(r.dir!), false, `${r.dir} removed`);
  } else {
    assert.equal(r.dir, null, 'not root: the binaries run from node_modules, nothing is copied');
  }
  assert.deepEqual(leftovers(), before);
  assert.deepEqual(fs.existsSync(SHARED_BIN_ROOT) ? fs.readdirSync(SHARED_BIN_ROOT).sort() : null, sharedBefore, 'the shared copy untouched');
});

test('a demo that fails removes them too', async () => {
  const before = leftovers();
  const r = await demo(['--publisher', '18', '--target', '99']);
  assert.notEqual(r.code, 0);
  assert.match(r.output, /PostgreSQL 99 binaries not found/);
  if (isRoot) {
    assert.ok(r.dir);
    assert.ok(r.sawServerBinary, "the publisher's binaries were copied before the failure");
    assert.equal(fs.existsSync(r.dir!), false, `${r.dir} removed after the failure`);
  }
  assert.deepEqual(leftovers(), before);
  // Nothing of the publisher's server is left either.
  assert.equal(fs.readdirSync('/tmp').filter((n) => n.startsWith('pgsub-demo-publisher-')).length, 0);
});
