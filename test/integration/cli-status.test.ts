/**
 * `pgsub status` as an operator meets it, as a child process against a PostgreSQL 18
 * publisher and a PostgreSQL 16 target:
 *  - a table whose copy fails (the target lacks a column) shows its last error, when, and
 *    how many attempts failed, in the JSON and in the text form;
 *  - an unknown subscription is an error (exit 2), not a record of defaults;
 *  - output into a pipe closed early ends quietly with the command's exit code;
 *  - with the target down, then with the publisher down: what the other side holds, which
 *    side is unreachable (host:port, no password), exit 3, no stack trace.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { PGSUB_BIN, spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'app';
// Trust auth accepts any password; what matters is that status never prints it.
const PASSWORD = 'St4tus-S3cret';

let publisher: Cluster;
let target: Cluster;
const children = new Set<PgsubProcess>();

function env(subscription: string, publication: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PGSUB_SOURCE: `postgresql://postgres:${PASSWORD}@${publisher.host}:${publisher.port}/${DB}`,
    PGSUB_TARGET: `postgresql://postgres:${PASSWORD}@${target.host}:${target.port}/${DB}`,
    PGSUB_PUBLICATION: publication,
    PGSUB_SUBSCRIPTION: subscription,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
    ...extra,
  };
}

interface Result {
  code: number | string;
  stdout: string;
  stderr: string;
}

function start(e: Record<string, string>, args: string[] = ['run']): PgsubProcess {
  const p = spawnPgsub(e, args);
  children.add(p);
  void p.exited.then(() => children.delete(p));
  return p;
}

async function cli(e: Record<string, string>, args: string[]): Promise<Result> {
  const p = start(e, args);
  let stdout = '';
  let stderr = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  p.child.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')} to exit`);
  return { code, stdout, stderr };
}

function assertClean(r: Result, what: string): void {
  const all = r.stdout + r.stderr;
  assert.ok(!all.includes(PASSWORD), `${what}: output contains the password:\n${all}`);
  assert.doesNotMatch(all, /\n\s+at [^\n]+:\d+:\d+/, `${what}: a stack trace:\n${all}`);
}

type Json = Record<string, unknown> & {
  source: { host: string; reachable: boolean; error: string | null };
  target: { host: string; reachable: boolean; error: string | null };
  tables: { table: string; state: string; last_error: string | null; last_error_at: string | null; error_count: number }[] | null;
};

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'status-pub' }), startCluster({ major: 16, name: 'status-tgt' })]);
  await Promise.all([publisher.createDatabase(DB), target.createDatabase(DB)]);
  await publisher.query(
    `CREATE TABLE public.good (id int PRIMARY KEY, v text);
     CREATE TABLE public.broken (id int PRIMARY KEY, extra text);
     INSERT INTO public.good SELECT g, 'v' || g FROM generate_series(1, 100) g;
     INSERT INTO public.broken SELECT g, 'x' FROM generate_series(1, 10) g;
     CREATE PUBLICATION pub_good FOR TABLE public.good;
     CREATE PUBLICATION pub_broken FOR TABLE public.broken;`,
    [],
    DB,
  );
  // The target's `broken` lacks the column `extra`: its copy fails until it is added.
  await target.query('CREATE TABLE public.good (id int PRIMARY KEY, v text); CREATE TABLE public.broken (id int PRIMARY KEY);', [], DB);

  // st_good: copied and streaming, then stopped; it has an origin and a slot.
  const good = start(env('st_good', 'pub_good'));
  await good.waitForLog('streaming started');
  await publisher.query(`INSERT INTO public.good VALUES (101, 'streamed')`, [], DB);
  await waitFor(async () => (await target.query<{ n: number }>('SELECT count(*)::int AS n FROM public.good', [], DB))[0]!.n === 101, {
    timeoutMs: 30_000,
    what: 'st_good to apply',
  });
  good.kill('SIGTERM');
  assert.equal(await withTimeout(good.exited, 20_000, 'st_good to stop'), 0);
});

after(async () => {
  for (const p of children) p.kill('SIGKILL');
  await Promise.all([...children].map((p) => withTimeout(p.exited, 10_000, 'leftover pgsub').catch(() => {})));
  await stopAllClusters();
});

describe('pgsub status', () => {
  test('a table whose copy fails shows its last error, its time and the failed attempts', async () => {
    const broken = start(env('st_broken', 'pub_broken'));
    let json: Json | undefined;
    await waitFor(
      async () => {
        const r = await cli(env('st_broken', 'pub_broken'), ['status', '--json']);
        if (r.code !== 0) return false;
        json = JSON.parse(r.stdout) as Json;
        return (json.tables?.find((t) => t.table === 'public.broken')?.error_count ?? 0) >= 2;
      },
      { timeoutMs: 60_000, intervalMs: 500, what: 'two failed copies of public.broken' },
    );
    const t = json!.tables!.find((x) => x.table === 'public.broken')!;
    assert.notEqual(t.state, 'ready');
    assert.match(String(t.last_error), /extra/, 'the error names the missing column');
    assert.match(String(t.last_error_at), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$/, 'ISO 8601 time');
    assert.ok(Math.abs(Date.parse(String(t.last_error_at)) - Date.now()) < 120_000, `recent: ${t.last_error_at}`);

    const text = await cli(env('st_broken', 'pub_broken'), ['status']);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, /^public\.broken +(init|datasync) +\d+ +\d+(\.\d)? [kMG]?B +\S+ s +[1-9]\d*$/m, text.stdout);
    assert.match(text.stdout, /^ {2}last error \(\d{4}-[^)]+\): .*extra/m, text.stdout);
    assertClean(text, 'status of a failing copy');

    // Fixed on the target: the next attempt copies it, and the error is cleared.
    await target.query('ALTER TABLE public.broken ADD COLUMN extra text', [], DB);
    await waitFor(
      async () => {
        const r = await cli(env('st_broken', 'pub_broken'), ['status', '--json']);
        const row = (JSON.parse(r.stdout) as Json).tables?.find((x) => x.table === 'public.broken');
        return row?.state === 'ready' && row.last_error === null && row.error_count === 0;
      },
      { timeoutMs: 60_000, intervalMs: 500, what: 'public.broken copied and its error cleared' },
    );
    broken.kill('SIGTERM');
    assert.equal(await withTimeout(broken.exited, 20_000, 'st_broken to stop'), 0);
  });

  test('an unknown subscription is an error, exit 2, nothing on stdout', async () => {
    for (const args of [['status', '--json'], ['status']]) {
      const r = await cli(env('st_nope', 'pub_good'), args);
      assert.equal(r.code, 2, r.stderr);
      assert.equal(r.stdout, '');
      assert.equal(r.stderr, 'pgsub: PGSUB_SUBSCRIPTION_NOT_FOUND: subscription st_nope not found in the target (pgsub run creates it)\n');
    }
  });

  test('a pipe closed early ends quietly, with the exit code', async () => {
    // The reader is gone before pgsub writes anything: every write meets EPIPE.
    for (const args of [['status'], ['status', '--json']]) {
      const p = start(env('st_good', 'pub_good'), args);
      p.child.stdout!.destroy();
      let stderr = '';
      p.child.stderr!.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
      assert.equal(await withTimeout(p.exited, 60_000, 'status into a closed pipe'), 0, stderr);
      assert.equal(stderr, '', 'no stack trace, nothing at all on stderr');
    }
    // And as a shell pipeline: `pgsub status | head -1`.
    const sh = spawn('sh', ['-c', `"${process.execPath}" "${PGSUB_BIN}" status | head -1`], {
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env('st_good', 'pub_good') },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    sh.stdout.on('data', (c: Buffer) => (out += c.toString('utf8')));
    sh.stderr.on('data', (c: Buffer) => (err += c.toString('utf8')));
    const code = await withTimeout(new Promise<number | null>((resolve) => sh.on('close', resolve)), 60_000, 'the pipeline');
    assert.equal(code, 0);
    assert.match(out, /^subscription +st_good\n$/);
    assert.equal(err, '');
  });

  test('with the target down: the publisher side, the target named unreachable, exit 3', async () => {
    await target.stopServer('fast');
    try {
      const r = await cli(env('st_good', 'pub_good'), ['status', '--json']);
      assert.equal(r.code, 3, r.stderr);
      const json = JSON.parse(r.stdout) as Json;
      assert.deepEqual(json.source, { host: `${publisher.host}:${publisher.port}`, reachable: true, error: null });
      assert.equal(json.target.host, `127.0.0.1:${target.port}`);
      assert.equal(json.target.reachable, false);
      assert.match(String(json.target.error), /ECONNREFUSED/);
      assert.equal(json.slot_exists, true);
      assert.equal(json.slot_active, false);
      assert.match(String(json.slot_confirmed_flush_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
      assert.match(String(json.publisher_wal_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
      for (const key of ['origin_remote_lsn', 'transactions_applied', 'lag_bytes', 'enabled', 'apply_error_count', 'tables']) assert.equal(json[key], null, key);
      assert.match(r.stderr, new RegExp(`^pgsub: target unreachable \\(127\\.0\\.0\\.1:${target.port}\\): .*ECONNREFUSED.*\\n$`));
      assertClean(r, 'target down, JSON');

      const text = await cli(env('st_good', 'pub_good'), ['status']);
      assert.equal(text.code, 3);
      assert.match(text.stdout, new RegExp(`^target +127\\.0\\.0\\.1:${target.port} UNREACHABLE: .*ECONNREFUSED`, 'm'));
      assert.match(text.stdout, new RegExp(`^source +127\\.0\\.0\\.1:${publisher.port} reachable$`, 'm'));
      assert.match(text.stdout, /^slot_exists +true$/m);
      assertClean(text, 'target down, text');
    } finally {
      await target.startServer();
    }
  });

  test('with the publisher down: what the target holds, the source named unreachable, exit 3', async () => {
    const [origin] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'st_good'`, [], DB);
    await publisher.stopServer('fast');
    try {
      const r = await cli(env('st_good', 'pub_good'), ['status', '--json']);
      assert.equal(r.code, 3, r.stderr);
      const json = JSON.parse(r.stdout) as Json;
      assert.deepEqual(json.target, { host: `127.0.0.1:${target.port}`, reachable: true, error: null });
      assert.equal(json.source.host, `127.0.0.1:${publisher.port}`);
      assert.equal(json.source.reachable, false);
      assert.match(String(json.source.error), /ECONNREFUSED/);
      assert.equal(json.origin_remote_lsn, origin!.lsn);
      assert.ok(Number(json.transactions_applied) >= 1, `transactions_applied ${json.transactions_applied}`);
      assert.equal(json.enabled, true);
      assert.deepEqual(
        json.tables!.map((t) => [t.table, t.state, t.error_count]),
        [['public.good', 'ready', 0]],
      );
      for (const key of ['slot_exists', 'slot_active', 'slot_confirmed_flush_lsn', 'publisher_wal_lsn', 'lag_bytes']) assert.equal(json[key], null, key);
      assert.match(r.stderr, new RegExp(`^pgsub: source unreachable \\(127\\.0\\.0\\.1:${publisher.port}\\): .*ECONNREFUSED.*\\n$`));
      assertClean(r, 'publisher down, JSON');

      const text = await cli(env('st_good', 'pub_good'), ['status']);
      assert.equal(text.code, 3);
      assert.match(text.stdout, new RegExp(`^source +127\\.0\\.0\\.1:${publisher.port} UNREACHABLE: `, 'm'));
      assert.match(text.stdout, new RegExp(`^origin_remote_lsn +${origin!.lsn.replace('/', '\\/')}$`, 'm'));
      assert.match(text.stdout, /^public\.good +ready /m);
      assertClean(text, 'publisher down, text');
    } finally {
      await publisher.startServer();
    }
    // Both up again: exit 0.
    const r = await cli(env('st_good', 'pub_good'), ['status', '--json']);
    assert.equal(r.code, 0, r.stderr);
  });
});
