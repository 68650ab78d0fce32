/**
 * The shape of the `pgsub` command line, as a child process (`node bin/pgsub.js`), no
 * servers needed: --version prints package.json's version; --help exits 0; an unknown
 * command, an unknown option or a missing argument is a usage error — commander's message
 * and usage on stderr, nothing on stdout, exit 2 like a configuration error (exit 1 means
 * "ran, and found a problem").
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnPgsub, withTimeout } from '../harness/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const VERSION = (JSON.parse(fs.readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

async function pgsub(args: string[]): Promise<{ code: number | string; stdout: string; stderr: string }> {
  const p = spawnPgsub({}, args);
  let stdout = '';
  let stderr = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  p.child.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const code = await withTimeout(p.exited, 30_000, `pgsub ${args.join(' ')} to exit`);
  return { code, stdout, stderr };
}

test('--version and -V print the version of package.json, exit 0', async () => {
  assert.match(VERSION, /^\d+\.\d+\.\d+/);
  for (const flag of ['--version', '-V']) {
    const r = await pgsub([flag]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${VERSION}\n`);
    assert.equal(r.stderr, '');
  }
});

test('--help (and help <command>) exit 0 with the usage on stdout', async () => {
  const top = await pgsub(['--help']);
  assert.equal(top.code, 0, top.stderr);
  assert.match(top.stdout, /^Usage: pgsub \[options\] \[command\]/);
  for (const command of ['run', 'status', 'drop', 'demo']) assert.match(top.stdout, new RegExp(`^  ${command}\\b`, 'm'));
  const status = await pgsub(['status', '--help']);
  assert.equal(status.code, 0);
  assert.match(status.stdout, /^Usage: pgsub status \[options\]/);
  assert.match(status.stdout, /--json/);
  const help = await pgsub(['help', 'run']);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /^Usage: pgsub run \[options\]/);
});

test("usage errors: commander's message and the usage on stderr, nothing on stdout, exit 2", async () => {
  const cases: { args: string[]; message: RegExp; usage: RegExp }[] = [
    { args: ['bogus'], message: /^error: unknown command 'bogus'$/m, usage: /^Usage: pgsub \[options\] \[command\]$/m },
    { args: ['run', '--bogus'], message: /^error: unknown option '--bogus'$/m, usage: /^Usage: pgsub run \[options\]$/m },
    { args: ['status', '--jsn'], message: /^error: unknown option '--jsn'\n\(Did you mean --json\?\)$/m, usage: /^Usage: pgsub status \[options\]$/m },
    { args: ['--bogus'], message: /^error: unknown option '--bogus'$/m, usage: /^Usage: pgsub \[options\] \[command\]$/m },
    { args: ['resync'], message: /^error: missing required argument 'table'$/m, usage: /^Usage: pgsub resync \[options\] <table>$/m },
    { args: ['skip'], message: /^error: required option '--lsn <lsn>' not specified$/m, usage: /^Usage: pgsub skip \[options\]$/m },
    { args: ['run', 'extra'], message: /^error: too many arguments for 'run'/m, usage: /^Usage: pgsub run \[options\]$/m },
    // No command at all: the usage, as an error.
    { args: [], message: /^Usage: pgsub \[options\] \[command\]$/m, usage: /^Commands:$/m },
  ];
  const results = await Promise.all(cases.map((c) => pgsub(c.args)));
  cases.forEach((c, i) => {
    const r = results[i]!;
    const what = `pgsub ${c.args.join(' ')}`;
    assert.equal(r.code, 2, `${what}: exit code; stderr:\n${r.stderr}`);
    assert.match(r.stderr, c.message, what);
    assert.match(r.stderr, c.usage, what);
    assert.equal(r.stdout, '', `${what}: nothing on stdout`);
    assert.doesNotMatch(r.stderr, /\n\s+at /, `${what}: no stack trace`);
  });
});
