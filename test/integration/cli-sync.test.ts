/**
 * The table-sync commands against a pgsub service running in another process:
 * `pgsub status --json` shows every table's state, rows and bytes; `pgsub refresh` wakes
 * the service (NOTIFY) to pick up a table added to the publication; `pgsub resync` copies
 * one table again while the others keep streaming.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, type Cluster, type PgsubProcess } from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
let service: PgsubProcess | null = null;
let env: Record<string, string>;

const SCHEMA = `CREATE SCHEMA app;
  CREATE TABLE app.t1 (id int PRIMARY KEY, v text);
  CREATE TABLE app.t2 (id int PRIMARY KEY, v text);`;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'clisync-pub' }), startCluster({ major: 16, name: 'clisync-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(
    `${SCHEMA} INSERT INTO app.t1 SELECT g, 'one ' || g FROM generate_series(1, 5000) g;
    INSERT INTO app.t2 SELECT g, 'two ' || g FROM generate_series(1, 3000) g; CREATE PUBLICATION pub FOR TABLE app.t1;`,
    [],
    'src',
  );
  await target.query(SCHEMA, [], 'dst');
  env = {
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'clisync',
    PGSUB_STATUS_INTERVAL: '1',
    // Only the NOTIFY from `pgsub refresh` can make it notice app.t2 within the test.
    PGSUB_REFRESH_INTERVAL: '3600',
  };
});

after(async () => {
  service?.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

async function cli(args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnPgsub(env, args);
  const code = await p.exited;
  return { code, out: p.output() };
}

async function tableStates(): Promise<Record<string, { state: string; rows: number; bytes: number }>> {
  const { code, out } = await cli(['status', '--json']);
  assert.equal(code, 0, out);
  const status = JSON.parse(out) as { tables: { table: string; state: string; rows: number; bytes: number }[] };
  return Object.fromEntries(status.tables.map((t) => [t.table, t]));
}

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, 'clisync')) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
}

test('status shows the initial copy; refresh picks up an added table; resync copies one table again', async () => {
  service = spawnPgsub(env);
  await service.waitForLog('initial copy finished');
  await service.waitForLog('streaming started');
  await waitFor(async () => (await tableStates())['app.t1']?.state === 'ready', { timeoutMs: 30_000, intervalMs: 300, what: 'app.t1 ready' });
  const t1 = (await tableStates())['app.t1']!;
  assert.equal(t1.rows, 5000);
  assert.ok(t1.bytes > 50_000);

  await publisher.query(`ALTER PUBLICATION pub ADD TABLE app.t2; INSERT INTO app.t2 VALUES (3001, 'after add');`, [], 'src');
  assert.equal((await cli(['refresh'])).code, 0);
  await waitFor(async () => (await tableStates())['app.t2']?.state === 'ready', { timeoutMs: 60_000, intervalMs: 300, what: 'app.t2 ready after refresh' });
  await publisher.query(`UPDATE app.t2 SET v = 'changed' WHERE id <= 10; INSERT INTO app.t1 VALUES (5001, 'streamed');`, [], 'src');
  await caughtUp();
  assert.ok((await compareTables(publisher, 'src', target, 'dst', ['app.t1', 'app.t2'])).equal);

  await target.query(`DELETE FROM app.t1 WHERE id <= 100`, [], 'dst');
  const resync = await cli(['resync', 'app.t1']);
  assert.equal(resync.code, 0, resync.out);
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM app.t1`, [], 'dst'))[0].n === 5001, {
    timeoutMs: 60_000,
    intervalMs: 300,
    what: 'app.t1 copied again',
  });
  await waitFor(async () => (await tableStates())['app.t1']?.state === 'ready', { timeoutMs: 60_000, intervalMs: 300, what: 'app.t1 ready after resync' });
  await caughtUp();
  assert.ok((await compareTables(publisher, 'src', target, 'dst', ['app.t1', 'app.t2'])).equal);

  const bad = await cli(['resync', 'app.nope']);
  assert.equal(bad.code, 2);
  assert.match(bad.out, /PGSUB_CONFIG_INVALID: resync: app.nope is not a table of subscription clisync/);

  service.kill('SIGTERM');
  assert.equal(await service.exited, 0);
});
