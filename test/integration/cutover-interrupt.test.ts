/**
 * `pgsub cutover` stopped at five points (PGSUB_FAULT=pause:<step> holds it there, then
 * the test sends SIGTERM), PostgreSQL 14 → 18: before the fence, after it,
 * after the fence LSN and after the apply it undoes itself — exit 1
 * (PGSUB_CUTOVER_INTERRUPTED), the source database's setting as before (read back), writes
 * accepted again, the forward service still streaming; past the point of no return it
 * finishes (exit 0). A cutover killed outright (SIGKILL) with its fence up leaves the
 * source read-only: the next run undoes it to the recorded value, never to the `on` its
 * fence left (the application's own `off` here); `--abort` does the same. After it is
 * done, a re-run finishes only the slot work, `--abort` is refused (exit 2), the forward
 * service has ended with exit 5 and its slot is gone. A reverse setup that fails after it
 * created its publication drops it again; `--reverse` is refused before the fence for a
 * subscription with a mapping. A fence that cannot end a session (a superuser's, for the
 * database's owner) fails at --fence-timeout naming it, and is lifted.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { loadConfig, type Config } from '../../src/config/config.js';
import { runCutover } from '../../src/cli/cutover.js';
import { CutoverError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { openTargetDb } from '../../src/migrate/db.js';
import { reversePlan, setupReverse } from '../../src/migrate/reverse.js';
import { spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, currentWalLsn, lsnToBigint, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'shop';
let source: Cluster;
let target: Cluster;
let service: PgsubProcess;
const children: PgsubProcess[] = [];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-cut-int-'));

const env = (): Record<string, string> => ({
  PGSUB_SOURCE: source.url(DB),
  PGSUB_TARGET: target.url(DB),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: 'shop',
  PGSUB_COPY_DATA: 'false',
  PGSUB_STATE_DIR: path.join(tmp, 'state'),
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '1',
});

/** The database's own default_transaction_read_only (pg_db_role_setting), or null when not set. */
async function setting(): Promise<string | null> {
  const rows = await source.query<{ s: string }>(
    `SELECT unnest(setconfig) AS s FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1 AND s.setrole = 0`,
    [DB],
  );
  return rows.find((r) => r.s.startsWith('default_transaction_read_only='))?.s.split('=')[1] ?? null;
}

/** A write from a new session, as the application's next connection. */
async function write(who: string): Promise<void> {
  const c = new pg.Client({ connectionString: source.url(DB) });
  await c.connect();
  try {
    await c.query(`INSERT INTO orders (who) VALUES ($1)`, [who]);
  } finally {
    await c.end();
  }
}

async function record(): Promise<{ step: string; fence_raised: boolean } | undefined> {
  return (await target.query<{ step: string; fence_raised: boolean }>(`SELECT step, fence_raised FROM pgsub.cutover WHERE subscription = 'shop'`, [], DB))[0];
}

/** `pgsub cutover` held at `point`, then sent `signal`; its exit code and output. */
async function cutoverStoppedAt(point: string, signal: NodeJS.Signals, args: string[] = []): Promise<{ code: number | string; out: string }> {
  const p = spawnPgsub({ ...env(), PGSUB_FAULT: `pause:${point}` }, ['cutover', '--timeout', '20', ...args]);
  children.push(p);
  await waitFor(() => p.output().includes(`paused at ${point}`), { timeoutMs: 30_000, intervalMs: 50, what: `the cutover to pause at ${point}` }).catch((err: Error) => {
    throw new Error(`${err.message}; output:\n${p.output()}`);
  });
  p.kill(signal);
  const code = await withTimeout(p.exited, 30_000, `the cutover to exit after ${signal} at ${point}`);
  return { code, out: p.output() };
}

async function cli(args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnPgsub(env(), args);
  children.push(p);
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  return { code, out: p.output() };
}

/** The source takes writes again and the forward service carries them: as before the cutover. */
async function asBefore(who: string): Promise<void> {
  await write(who);
  const end = await currentWalLsn(source, DB);
  await waitFor(
    async () => {
      const [o] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'shop'`, [], DB);
      return lsnToBigint(o!.lsn) >= end;
    },
    { timeoutMs: 30_000, intervalMs: 100, what: 'the forward service to apply the write' },
  );
  assert.equal((await target.query(`SELECT 1 FROM orders WHERE who = $1`, [who], DB)).length, 1);
}

before(async () => {
  [source, target] = await Promise.all([startCluster({ major: 14, name: 'cutint-src14' }), startCluster({ major: 18, name: 'cutint-tgt18' })]);
  await Promise.all([source.createDatabase(DB), target.createDatabase(DB)]);
  const schema = `CREATE TABLE orders (id bigserial PRIMARY KEY, who text NOT NULL)`;
  await source.query(`${schema}; CREATE PUBLICATION pub FOR TABLE orders`, [], DB);
  await target.query(schema, [], DB);
  service = spawnPgsub(env());
  children.push(service);
  await service.waitForLog('streaming started', 60_000);
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await stopAllClusters();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('an interrupted cutover', () => {
  for (const point of ['preflight', 'fence', 'fence-lsn', 'apply']) {
    test(`SIGTERM at ${point}: undone, the source as before`, async () => {
      const { code, out } = await cutoverStoppedAt(point, 'SIGTERM');
      assert.equal(code, 1, out);
      assert.match(out, /PGSUB_CUTOVER_INTERRUPTED: interrupted by SIGTERM/);
      if (point !== 'preflight') assert.match(out, /fence lifted on database shop \(default_transaction_read_only not set, read back\)/);
      else assert.match(out, /nothing was changed on the source/);
      assert.equal(await setting(), null);
      assert.equal((await record())?.step, 'lifted');
      await asBefore(`after SIGTERM at ${point}`);
    });
  }

  test('a reverse setup that fails half-way leaves no publication behind', async () => {
    const config = loadConfig({ env: env() });
    const db = await openTargetDb(config.target, 'pgsub_test');
    try {
      const plan = await reversePlan(config, db, null);
      assert.equal(plan.createdPublication, true);
      // Its slot taken already: the setup fails after it created the publication.
      await target.query(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, [plan.slot], DB);
      await assert.rejects(setupReverse(config, db, [{ schema: 'public', table: 'orders' }], plan), /already exists/);
      assert.equal((await target.query(`SELECT 1 FROM pg_publication WHERE pubname = $1`, [plan.publication], DB)).length, 0, 'the publication it created is dropped');
      assert.equal((await target.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = $1`, [plan.slot], DB)).length, 1, 'a slot it did not create is kept');
    } finally {
      await db.close();
      await target.query(`SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE '%_reverse'`, [], DB);
    }
  });

  test('--reverse for a mapped subscription is refused before the fence (exit 2)', async () => {
    const mapped = { ...loadConfig({ env: env() }), mapping: { schemas: {}, tables: { 'public.orders': { target: 'public.orders' } } } } as unknown as Config;
    const options = { fence: 'read-only' as const, maxLagBytes: 1 << 24, lagTimeoutMs: 30_000, applyTimeoutMs: 30_000, reverse: true, reverseConfigFile: null };
    await assert.rejects(
      runCutover([mapped], options, () => {}, createLogger('warn', process.stderr as never)),
      (err: unknown) => {
        assert.ok(err instanceof CutoverError && err.code === 'PGSUB_CUTOVER_REFUSED' && err.exitCode === 2, String(err));
        assert.match(err.message, /maps tables or columns \(mapping:\).*Cut over without --reverse/);
        return true;
      },
    );
    assert.equal(await setting(), null, 'before the fence');
    assert.equal((await target.query(`SELECT 1 FROM pg_publication`, [], DB)).length, 0, 'no reverse publication');
  });

  test('a fence that cannot end a session from before it fails at --fence-timeout naming it, and is lifted', async () => {
    // The cutover as the database's owner, not a superuser: a superuser's session is not its to end.
    await source.query(`CREATE ROLE fence_owner LOGIN REPLICATION; GRANT pg_read_all_stats, pg_signal_backend TO fence_owner; ALTER DATABASE ${DB} OWNER TO fence_owner`);
    await source.query(`GRANT SELECT ON ALL TABLES IN SCHEMA public TO fence_owner; GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO fence_owner`, [], DB);
    const admin = new pg.Client({ connectionString: source.url(DB) });
    await admin.connect();
    try {
      const config = loadConfig({ env: { ...env(), PGSUB_SOURCE: source.url(DB).replace('postgres://postgres@', 'postgres://fence_owner@') } });
      const options = {
        fence: 'read-only' as const,
        maxLagBytes: 1 << 24,
        lagTimeoutMs: 30_000,
        applyTimeoutMs: 30_000,
        reverse: false,
        reverseConfigFile: null,
        fenceTimeoutMs: 1500,
      };
      await assert.rejects(
        runCutover([config], options, () => {}, createLogger('fatal', process.stderr as never)),
        (err: unknown) => {
          assert.ok(err instanceof CutoverError && err.code === 'PGSUB_CUTOVER_FAILED' && err.exitCode === 1, String(err));
          assert.match(err.message, /the fence could not be established within 1.5 s: .*of role postgres, which this role cannot end/);
          assert.match(err.message, /fence lifted on database shop \(default_transaction_read_only not set, read back\)/);
          return true;
        },
      );
      assert.equal(await setting(), null);
      assert.equal((await admin.query('SELECT 1 AS one')).rows[0].one, 1, "the superuser's session was left alone");
    } finally {
      await admin.end();
      await source.query(`ALTER DATABASE ${DB} OWNER TO postgres`);
    }
    await asBefore('after a fence that timed out');
  });

  test("a cutover killed with its fence up: the next run lifts it to the application's own value, not to the fence's on; --abort too", async () => {
    // The application's own setting, which the fence must restore.
    await source.query(`ALTER DATABASE ${DB} SET default_transaction_read_only = off`);
    const crash = await cutoverStoppedAt('fence', 'SIGKILL');
    assert.equal(crash.code, 'SIGKILL');
    assert.equal(await setting(), 'on', 'a crash leaves the fence up');
    assert.deepEqual(await record(), { step: 'fence', fence_raised: true });
    // The next run undoes it first, then is itself interrupted: both restore off, not on.
    const again = await cutoverStoppedAt('fence', 'SIGINT');
    assert.equal(again.code, 1, again.out);
    assert.match(again.out, /an earlier cutover stopped at step fence: fence lifted on database shop \(default_transaction_read_only = off, read back\)/);
    assert.match(again.out, /interrupted by SIGINT after the fence/);
    assert.equal(await setting(), 'off');
    // Killed again; --abort lifts it.
    await cutoverStoppedAt('fence-lsn', 'SIGKILL');
    assert.equal(await setting(), 'on');
    const abort = await cli(['cutover', '--abort']);
    assert.equal(abort.code, 0, abort.out);
    assert.match(abort.out, /the cutover stopped at step fence-lsn is undone/);
    assert.equal(await setting(), 'off');
    assert.match((await cli(['cutover', '--abort'])).out, /no cutover to abort/);
    await asBefore('after --abort');
  });

  test('SIGTERM past the point of no return: the cutover finishes; a re-run only finishes the slot; --abort refused', async () => {
    const { code, out } = await cutoverStoppedAt('done', 'SIGTERM');
    assert.equal(code, 0, out);
    assert.match(out, /SIGTERM received past the point of no return: finishing the cutover/);
    assert.match(out, /cutover done: shop at \d+\/[0-9A-F]+/);
    assert.equal(await setting(), 'on', 'the old primary stays read-only');
    await assert.rejects(write('after the cutover'), (err: { code?: string }) => err.code === '25006');
    assert.equal(await withTimeout(service.exited, 30_000, 'the forward service to end'), 5);
    assert.match(service.output(), /PGSUB_CUT_OVER: cut over at LSN/);
    assert.equal((await source.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'shop'`)).length, 0, 'the forward slot is dropped');
    const rerun = await cli(['cutover']);
    assert.equal(rerun.code, 0, rerun.out);
    assert.match(rerun.out, /already cut over at .*slot shop was already gone/);
    const abort = await cli(['cutover', '--abort']);
    assert.equal(abort.code, 2, abort.out);
    assert.match(abort.out, /past the point of no return/);
  });
});
