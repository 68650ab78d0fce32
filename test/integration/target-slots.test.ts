/**
 * A target out of connection slots (issue 30's stress item): PostgreSQL 18 with
 * max_connections = 8 and no reserved slots, every slot held by idle sessions.
 *  - At startup: pgsub's connects fail with 53300 ("too many clients already"); it logs the
 *    server's words naming the target and retries with backoff (not exit 2: the condition
 *    passes), and starts streaming once slots are freed.
 *  - While running: the apply keeps the connection it holds, so changes still arrive with
 *    every other slot taken; when its target connections are then terminated, it cannot
 *    reconnect until slots free up, and nothing is lost or applied twice.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { compareTables, connect, currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';
const MAX_CONNECTIONS = 8;

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;
const holders: pg.Client[] = [];

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'slots-pub' }),
    startCluster({ major: 18, name: 'slots-tgt', settings: { max_connections: String(MAX_CONNECTIONS), superuser_reserved_connections: '0', reserved_connections: '0' } }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items; INSERT INTO app.items SELECT g, 'initial' FROM generate_series(1, 1000) g;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  if (child) await child.exited;
  await Promise.all(holders.splice(0).map((c) => c.end().catch(() => undefined)));
  await publisher?.stop();
  await target?.stop();
});

/** Take every free connection slot of the target with idle sessions. */
async function fillSlots(): Promise<void> {
  for (;;) {
    try {
      holders.push(await connect(target, 'dst'));
    } catch (err) {
      assert.equal((err as { code?: string }).code, '53300', String(err));
      return;
    }
  }
}

async function release(n: number): Promise<void> {
  await Promise.all(holders.splice(0, n).map((c) => c.end()));
}

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, 'slots')) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
}

const tooManyClients = (out: string) => out.split('\n').filter((l) => l.startsWith('{') && /too many clients already/.test(l));

test('a target with no free connection slot: retried with the server’s words, streaming once slots free up, exactly once', async () => {
  await fillSlots();
  assert.equal(holders.length, MAX_CONNECTIONS);
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'slots',
    PGSUB_RETRY_MIN_DELAY: '0.5',
    PGSUB_RETRY_MAX_DELAY: '1',
  });
  await waitFor(() => tooManyClients(child!.output()).length >= 2, { timeoutMs: 30_000, intervalMs: 100, what: 'two attempts refused with 53300' });
  const line = JSON.parse(tooManyClients(child.output())[0]!) as { level: number; msg: string };
  assert.ok(line.level >= 40, `logged at warn or error level: ${JSON.stringify(line)}`);
  assert.match(JSON.stringify(line), /target|dst/);
  assert.equal(child.child.exitCode, null, `pgsub gave up:\n${child.output().slice(-2000)}`);

  await release(MAX_CONNECTIONS);
  await child.waitForLog('streaming started', 60_000);
  await caughtUp();

  // Every other slot taken while pgsub runs: its apply connection is its own.
  await fillSlots();
  await publisher.query(`UPDATE app.items SET v = 'while full' WHERE id <= 500; INSERT INTO app.items SELECT g, 'while full' FROM generate_series(1001, 2000) g;`, [], 'src');
  await caughtUp();
  // Read through a held session: the target has no slot for another.
  assert.equal((await holders[0]!.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'while full'`)).rows[0].n, 1500);

  // Its connections ended by the server while none is free: it cannot reconnect until one is.
  const before = tooManyClients(child.output()).length;
  const own = holders.map((c) => (c as unknown as { processID: number }).processID);
  await holders[0]!.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'dst' AND pid <> ALL($1::int[]) AND backend_type = 'client backend'`, [own]);
  // The slots they held are taken at once (pgsub waits retry_min_delay before reconnecting).
  await fillSlots();
  await publisher.query(`INSERT INTO app.items SELECT g, 'after terminate' FROM generate_series(2001, 3000) g; DELETE FROM app.items WHERE id <= 100;`, [], 'src');
  await waitFor(() => tooManyClients(child!.output()).length > before, { timeoutMs: 30_000, intervalMs: 100, what: 'a reconnect refused with 53300' });
  await release(4);
  await caughtUp();
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.items']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  assert.equal((await target.query('SELECT count(*)::int AS n FROM app.items', [], 'dst'))[0].n, 2900);
  child.kill('SIGTERM');
  assert.equal(await withTimeout(child.exited, 20_000, 'pgsub to stop'), 0);
  child = null;
});
