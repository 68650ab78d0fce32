/**
 * README's "Replicate between your own two servers", run as written: its SQL blocks for
 * the publisher (PostgreSQL 16) and the target (PostgreSQL 18) are read from README.md and
 * executed, its configuration file is used with the hosts replaced by the test servers, and
 * the steps follow — first start with roles that are not superusers, `pgsub status`,
 * SIGTERM, `pgsub drop`. So the privileges the README lists are enough, and stay so.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { spawnPgsub, startCluster, stopAllClusters, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const README = fs.readFileSync(path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'README.md'), 'utf8');
const SECTION = README.slice(README.indexOf('## Replicate between your own two servers'), README.indexOf('## Exit codes'));
const blocks = (lang: string) => [...SECTION.matchAll(new RegExp(`\`\`\`${lang}\\n([\\s\\S]*?)\`\`\``, 'g'))].map((m) => m[1]!);
const sqlFor = (side: string) => {
  const block = blocks('sql').find((b) => b.startsWith(`-- on the ${side}\n`));
  assert.ok(block, `README's walkthrough has an SQL block for the ${side}`);
  return block;
};

const SCHEMA = `CREATE SCHEMA shop;
  CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL);
  CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES shop.customers(id), amount numeric(12,2) NOT NULL);`;

let publisher: Cluster;
let target: Cluster;
let dir: string;
let configFile: string;
const children = new Set<PgsubProcess>();

function pgsub(args: string[]): PgsubProcess {
  const p = spawnPgsub({}, args);
  children.add(p);
  void p.exited.then(() => children.delete(p));
  return p;
}

async function finish(p: PgsubProcess): Promise<{ code: number | string; output: string }> {
  const code = await withTimeout(p.exited, 60_000, 'pgsub to exit');
  return { code, output: p.output() };
}

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 16, name: 'walk-pub' }), startCluster({ major: 18, name: 'walk-tgt' })]);
  await Promise.all([publisher.createDatabase('shop'), target.createDatabase('shop')]);
  await publisher.query(
    `${SCHEMA}
    INSERT INTO shop.customers SELECT g, 'c' || g FROM generate_series(1, 200) g;
    INSERT INTO shop.orders SELECT g, 1 + g % 200, g / 10.0 FROM generate_series(1, 1000) g;`,
    [],
    'shop',
  );
  // Step 2's "load the schema first", as pg_dump --schema-only would.
  await target.query(SCHEMA, [], 'shop');
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-walk-'));
});

after(async () => {
  for (const p of children) p.kill('SIGKILL');
  await Promise.all([...children].map((p) => withTimeout(p.exited, 10_000, 'leftover pgsub').catch(() => {})));
  await stopAllClusters();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('the README walkthrough: grants, first start, status, SIGTERM, drop', async () => {
  await publisher.query(sqlFor('publisher'), [], 'shop');
  await target.query(sqlFor('target'), [], 'shop');
  for (const [cluster, role] of [
    [publisher, 'pgsub_repl'],
    [target, 'pgsub'],
  ] as const) {
    const [r] = await cluster.query<{ rolsuper: boolean }>('SELECT rolsuper FROM pg_roles WHERE rolname = $1', [role]);
    assert.equal(r?.rolsuper, false, `${role} is not a superuser`);
  }

  // Step 3: the README's file, pointed at the test servers (no TLS on them).
  const [yaml] = blocks('yaml');
  assert.ok(yaml);
  configFile = path.join(dir, 'pgsub.yaml');
  fs.writeFileSync(
    configFile,
    yaml
      .replace('host=old-db', `host=${publisher.host} port=${publisher.port}`)
      .replace('host=new-db', `host=${target.host} port=${target.port}`)
      .replaceAll('sslmode=require', 'sslmode=disable'),
    { mode: 0o600 },
  );

  // Step 4: first start.
  const run = pgsub(['run', '--config', configFile]);
  const starting = await run.waitForLog('starting');
  assert.equal(starting.state_dir, path.join(process.env.HOME ?? '/tmp', '.local', 'state', 'pgsub', 'shop_sub'));
  await run.waitForLog('initial copy finished');
  await run.waitForLog('streaming started');
  await publisher.query(
    `INSERT INTO shop.customers VALUES (201, 'new'); UPDATE shop.orders SET amount = amount + 1 WHERE id <= 10; DELETE FROM shop.orders WHERE id = 1000;`,
    [],
    'shop',
  );
  await waitForCatchUp(publisher, 'shop', 'shop_sub');
  const [counts] = await target.query<{ c: number; o: number; a: string }>(
    'SELECT (SELECT count(*)::int FROM shop.customers) AS c, (SELECT count(*)::int FROM shop.orders) AS o, (SELECT sum(amount)::text FROM shop.orders) AS a',
    [],
    'shop',
  );
  const [want] = await publisher.query<{ a: string }>('SELECT sum(amount)::text AS a FROM shop.orders', [], 'shop');
  assert.deepEqual(counts, { c: 201, o: 999, a: want!.a });

  // Step 5: status.
  const status = await finish(pgsub(['status', '--config', configFile]));
  assert.equal(status.code, 0, status.output);
  assert.match(status.output, /^slot_active +true$/m);
  assert.match(status.output, /^shop\.customers +ready +200 /m);
  assert.match(status.output, /^shop\.orders +ready +1000 /m);
  assert.ok(!status.output.includes('change-me'), 'no password in the output');

  // Step 6: stop.
  run.kill('SIGTERM');
  assert.equal(await withTimeout(run.exited, 20_000, 'pgsub to stop'), 0, run.output().slice(-3000));
  assert.ok(!run.output().includes('change-me'), 'no password in the logs');

  // Step 7: remove.
  const drop = await finish(pgsub(['drop', '--config', configFile]));
  assert.equal(drop.code, 0, drop.output);
  assert.match(drop.output, /subscription shop_sub dropped: slot shop_sub dropped, [1-9]\d* row\(s\) of pgsub's schema deleted, replication origin dropped/);
  assert.equal((await publisher.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'shop_sub'`, [], 'shop')).length, 0);
  assert.equal((await target.query(`SELECT 1 FROM pg_replication_origin WHERE roname = 'pgsub_shop_sub'`, [], 'shop')).length, 0);
  await waitFor(async () => (await target.query(`SELECT 1 FROM pgsub.origin WHERE subscription = 'shop_sub'`, [], 'shop')).length === 0, { what: 'the origin row gone' });
});
