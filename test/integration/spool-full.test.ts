/**
 * The spool directory filling during a streamed transaction (issue 30): state_dir on a real
 * 2 MB tmpfs, a 6 MB transaction streamed by the publisher (streaming = on,
 * logical_decoding_work_mem = 64kB). Writing its spool file fails with ENOSPC: pgsub logs
 * PGSUB_SPOOL_FULL naming the directory, `status` shows it, nothing of the transaction is
 * on the target and the slot is not confirmed past it; the session's own spool file is
 * deleted. Once the file system grows (remount), the retry streams the transaction again
 * and applies it exactly once. Mounting a tmpfs needs root (the CI machine runs as root).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { compareTables, currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const root = process.getuid?.() === 0;
const SCHEMA = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;
const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-spool-full-'));
let mounted = false;
/** Why a root that may not mount (a container without CAP_SYS_ADMIN) cannot run this test. */
let mountError = '';

before(async () => {
  if (!root) return;
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'spoolfull-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: 'spoolfull-tgt' }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m,mode=0700', 'tmpfs', stateDir], { stdio: 'pipe' });
    mounted = true;
  } catch (err) {
    mountError = String((err as { stderr?: Buffer }).stderr ?? err).trim();
  }
});

after(async () => {
  child?.kill('SIGKILL');
  if (child) await child.exited;
  if (mounted) execFileSync('umount', [stateDir]);
  fs.rmSync(stateDir, { recursive: true, force: true });
  await publisher?.stop();
  await target?.stop();
});

const logLines = (out: string) =>
  out
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { msg: string; err?: { code?: string; message?: string } });

test('a full spool file system: PGSUB_SPOOL_FULL, nothing applied or confirmed, then exactly once after space is freed', {
  skip: !root && 'mounting a 2 MB tmpfs needs root',
}, async (t) => {
  if (!mounted) {
    t.skip(`cannot mount a tmpfs here: ${mountError}`);
    return;
  }
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'spoolfull',
    PGSUB_STREAMING: 'on',
    PGSUB_STATE_DIR: stateDir,
    PGSUB_RETRY_MIN_DELAY: '0.5',
    PGSUB_RETRY_MAX_DELAY: '1',
  });
  await child.waitForLog('streaming started', 60_000);
  await publisher.query(`INSERT INTO app.items VALUES (0, 'before')`, [], 'src');
  await waitFor(async () => (await target.query('SELECT count(*)::int AS n FROM app.items', [], 'dst'))[0].n === 1, { timeoutMs: 30_000, what: 'the first row' });
  // 6 MB in one transaction: streamed in 64 kB chunks, three times what the tmpfs holds.
  await publisher.query(`INSERT INTO app.items SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, 20000) g`, [], 'src');
  const bigEnd = await currentWalLsn(publisher, 'src');

  await waitFor(() => logLines(child!.output()).filter((l) => l.err?.code === 'PGSUB_SPOOL_FULL').length >= 2, {
    timeoutMs: 60_000,
    intervalMs: 200,
    what: 'PGSUB_SPOOL_FULL, retried',
  });
  const full = logLines(child.output()).find((l) => l.err?.code === 'PGSUB_SPOOL_FULL')!;
  assert.match(full.err!.message!, /no space is left on the device in the spool directory .*spool-full.*free space there or set state_dir/);
  // Nothing of the transaction applied, the slot not confirmed past it, the retries' files deleted.
  assert.equal((await target.query('SELECT count(*)::int AS n FROM app.items', [], 'dst'))[0].n, 1);
  assert.ok(((await slotConfirmedLsn(publisher, 'spoolfull')) ?? 0n) < bigEnd, 'the slot was confirmed past an unapplied transaction');
  const status = spawnPgsub({ PGSUB_SOURCE: publisher.url('src'), PGSUB_TARGET: target.url('dst'), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: 'spoolfull' }, [
    'status',
    '--json',
  ]);
  assert.equal(await withTimeout(status.exited, 30_000, 'pgsub status'), 0, status.output());
  assert.equal((JSON.parse(status.output()) as { last_error_code: string }).last_error_code, 'PGSUB_SPOOL_FULL');

  // Space freed: the same mount grows, and the next retry streams the transaction again.
  execFileSync('mount', ['-o', 'remount,size=64m', stateDir]);
  await publisher.query(`INSERT INTO app.items VALUES (30000, 'after')`, [], 'src');
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, 'spoolfull')) ?? 0n) >= end, { timeoutMs: 120_000, intervalMs: 200, what: 'catch-up after the remount' });
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.items']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  assert.equal((await target.query('SELECT count(*)::int AS n FROM app.items', [], 'dst'))[0].n, 20002);
  await waitFor(() => fs.readdirSync(path.join(stateDir, 'spool')).length === 0, { timeoutMs: 10_000, intervalMs: 100, what: 'spool files removed after use' });
  child.kill('SIGTERM');
  assert.equal(await withTimeout(child.exited, 20_000, 'pgsub to stop'), 0);
  child = null;
});
