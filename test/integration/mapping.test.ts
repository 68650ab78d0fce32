/**
 * Reshaping (docs/mapping.md), PG14 publisher → PG18 target in binary mode: a table
 * retargeted and renamed only (the unmapped paths: batches, COPY of insert runs, UPDATE
 * arrays, with a text → jsonb and an int → bigint type change read in binary), and a
 * table copied first (COPY of the kept columns into the target's names) and then
 * streamed, and a table with excluded and computed columns (lower(email), cents to numeric, timestamp to
 * timestamptz, a constant) through inserts, updates with an unchanged TOASTed input,
 * deletes and a truncate. Then the plan checks against the target's catalog: a volatile
 * expression, an unknown column, an excluded key column and a target column that does
 * not exist are each a PGSUB_MAPPING_INVALID or PGSUB_SCHEMA_MISMATCH naming table and column.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { ruleFor, type MappingConfig } from '../../src/mapping/rules.js';
import { parseConninfo } from '../../src/config/conninfo.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { RelationMap } from '../../src/apply/sql/relmap.js';
import { openApplyConnection, rolledBackOn } from '../../src/pgwire/connect.js';
import type { RelationMessage } from '../../src/protocol/messages.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const PUBLISHER = `
  CREATE SCHEMA shop;
  CREATE TABLE shop.events (id int PRIMARY KEY, payload text, n int);
  CREATE TABLE shop.customers (id int PRIMARY KEY, cust_name text, email text, secret text, amount_cents int, created timestamp, bio text);
  ALTER TABLE shop.customers ALTER COLUMN bio SET STORAGE EXTERNAL;
  CREATE TABLE shop.seeded (id int PRIMARY KEY, label text, secret text, qty int);
  INSERT INTO shop.seeded SELECT g, 'l' || g, 's' || g, g FROM generate_series(1, 2000) g;
  CREATE PUBLICATION pub FOR TABLE shop.events, shop.customers;
  CREATE PUBLICATION pub_seed FOR TABLE shop.seeded;
`;
const TARGET = `
  CREATE SCHEMA archive;
  CREATE SCHEMA crm;
  CREATE TABLE archive.seeded_copy (id int PRIMARY KEY, title text, qty int, extra text DEFAULT 'd');
  CREATE TABLE archive.events_log (id bigint PRIMARY KEY, body jsonb, n bigint, note text DEFAULT 'from shop');
  CREATE TABLE crm.clients (id bigint PRIMARY KEY, name text, email text, email_lower text, amount numeric,
                            created timestamptz, region text, bio text, bio_len int);
`;

const MAPPING = {
  tables: {
    'shop.seeded': { target: 'archive.seeded_copy', columns: { label: 'title', secret: null } },
    'shop.events': { target: 'archive.events_log', columns: { payload: 'body' } },
    'shop.customers': {
      target: 'crm.clients',
      columns: { cust_name: 'name' },
      exclude: ['secret', 'amount_cents'],
      computed: {
        email_lower: 'lower(email)',
        amount: 'amount_cents / 100.0',
        created: `created AT TIME ZONE 'UTC'`,
        region: `'eu-1'`,
        bio_len: 'pg_catalog.length("bio")',
      },
    },
  },
};

let publisher: Cluster;
let target: Cluster;
let runner: Runner;
let seeder: Runner;
const errors: { msg: string; err?: { code?: string; message?: string } }[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 14, name: 'map-pub14' }), startCluster({ major: 18, name: 'map-tgt18' })]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
  await publisher.query(PUBLISHER, [], 'src');
  await target.query(TARGET, [], 'dst');
  const config = (subscription: string, publication: string, copyData: boolean) =>
    loadConfig({
      env: {},
      overrides: {
        subscription,
        source: publisher.url('src'),
        target: target.url('dst'),
        publication,
        copy_data: copyData,
        binary: true,
        status_interval: 1,
        retry_min_delay: 0.2,
        retry_max_delay: 1,
        mapping: MAPPING,
      },
    });
  const destination = {
    write: (line: string) => {
      const l = JSON.parse(line) as { level: number; msg: string; err?: { code?: string; message?: string } };
      // Each runner publishes some of the mapped tables: the others' rules are warned about, as designed.
      if (l.level >= 40 && !/the publications do not publish/.test(l.msg)) errors.push(l);
      if (process.env.MAPDEBUG) console.error(line);
    },
  };
  // The table with computed columns cannot be copied yet: the copy runs in a subscription of its own.
  runner = startRunner(config('map', 'pub', false), createLogger('warn', destination));
  seeder = startRunner(config('mapseed', 'pub_seed', true), createLogger('warn', destination));
  await waitFor(async () => (await slotConfirmedLsn(publisher, 'map')) !== null, { timeoutMs: 30_000, what: 'the slot' });
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = 'mapseed' AND state = 'r'`, [], 'dst'))[0]?.n === 1, {
    timeoutMs: 30_000,
    what: 'the initial copy',
  });
});

after(async () => {
  runner?.stop();
  seeder?.stop();
  await runner?.done.catch(() => undefined);
  await seeder?.done.catch(() => undefined);
  await publisher?.stop();
  await target?.stop();
});

async function caughtUp(timeoutMs = 30_000, slot = 'map'): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, slot)) ?? 0n) >= end, {
    timeoutMs,
    intervalMs: 100,
    what: `slot to confirm ${end} (errors: ${JSON.stringify(errors.slice(-2))})`,
  });
}

const rows = (sql: string) => target.query(sql, [], 'dst');

test('a retargeted and renamed table takes the usual paths, with type changes read in binary', async () => {
  await publisher.query(
    `INSERT INTO shop.events SELECT g, pg_catalog.format('{"k": %s}', g), g FROM generate_series(1, 300) g;
     UPDATE shop.events SET n = n * 1000000 WHERE id <= 100;
     BEGIN; UPDATE shop.events SET payload = '{"k": "changed"}' WHERE id = 7; DELETE FROM shop.events WHERE id = 8; COMMIT;`,
    [],
    'src',
  );
  await caughtUp();
  assert.deepEqual(errors, []);
  const [summary] = await rows(`SELECT count(*)::int AS c, sum(n)::text AS s, count(*) FILTER (WHERE note = 'from shop')::int AS d FROM archive.events_log`);
  assert.deepEqual(summary, { c: 299, s: String(1_000_000 * (5050 - 8) + (45150 - 5050)), d: 299 });
  assert.deepEqual(await rows(`SELECT body->>'k' AS k FROM archive.events_log WHERE id IN (7, 9) ORDER BY id`), [{ k: 'changed' }, { k: '9' }]);
});

test('the initial copy of a renamed table with an excluded column is a COPY into the target names, then streams', async () => {
  await publisher.query(`UPDATE shop.seeded SET qty = qty + 1 WHERE id <= 10; DELETE FROM shop.seeded WHERE id = 2000`, [], 'src');
  await caughtUp(30_000, 'mapseed');
  assert.deepEqual(await rows(`SELECT count(*)::int AS c, sum(qty)::int AS q, min(title) AS t, count(*) FILTER (WHERE extra = 'd')::int AS d FROM archive.seeded_copy`), [
    { c: 1999, q: (1999 * 2000) / 2 + 10, t: 'l1', d: 1999 },
  ]);
});

test('excluded and computed columns: insert, update (unchanged TOAST input), delete, truncate', async () => {
  const bio = 'x'.repeat(100_000);
  await publisher.query(
    `INSERT INTO shop.customers VALUES (1, 'Ann', 'Ann@Example.COM', 's1', 1999, '2024-03-01 10:00', $1),
                                       (2, 'Bob', NULL, 's2', 5, '2024-03-02 23:30', 'short');
     UPDATE shop.customers SET email = 'ANN@new.example', amount_cents = 250 WHERE id = 1;
     UPDATE shop.customers SET cust_name = 'Robert', bio = 'longer' WHERE id = 2;`.replace('$1', `'${bio}'`),
    [],
    'src',
  );
  await caughtUp();
  assert.deepEqual(errors, []);
  const got = await rows(`SELECT id::int, name, email, email_lower, amount::text, (created AT TIME ZONE 'UTC')::text AS created, region, bio_len FROM crm.clients ORDER BY id`);
  assert.deepEqual(got, [
    // bio was not sent in the update of row 1 (unchanged TOAST): bio_len kept its value.
    {
      id: 1,
      name: 'Ann',
      email: 'ANN@new.example',
      email_lower: 'ann@new.example',
      amount: '2.5000000000000000',
      created: '2024-03-01 10:00:00',
      region: 'eu-1',
      bio_len: 100_000,
    },
    { id: 2, name: 'Robert', email: null, email_lower: null, amount: '0.05000000000000000000', created: '2024-03-02 23:30:00', region: 'eu-1', bio_len: 6 },
  ]);
  await publisher.query(`DELETE FROM shop.customers WHERE id = 1`, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT id::int FROM crm.clients ORDER BY id`), [{ id: 2 }]);
  await publisher.query(`TRUNCATE shop.customers`, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT count(*)::int AS c FROM crm.clients`), [{ c: 0 }]);
  assert.deepEqual(errors, []);
});

function relation(columns: [string, number, boolean][]): RelationMessage {
  return {
    tag: 'relation',
    relationId: 1,
    namespace: 'shop',
    name: 'customers',
    replicaIdentity: 'default',
    columns: columns.map(([name, typeOid, isKey]) => ({ name, typeOid, isKey, typeModifier: -1 })),
  };
}

test('the plan is checked against the relation and the target catalog, naming table, column and reason', async () => {
  const info = parseConninfo(target.url('dst'), 'target', {});
  const conn = await openApplyConnection(info, { applicationName: 'map_check', synchronousCommit: 'on' });
  const base = relation([
    ['id', 23, true],
    ['cust_name', 25, false],
    ['email', 25, false],
  ]);
  const check = async (rule: Record<string, unknown>, code: string, pattern: RegExp, rel = base) => {
    const mapping: MappingConfig = { schemas: {}, tables: { 'shop.customers': { target: 'crm.clients', ...rule } } };
    assert.ok(ruleFor(mapping, 'shop', 'customers'));
    const map = new RelationMap(180000, { mapping, probe: rolledBackOn(info, 'map_probe') });
    map.onRelation(rel);
    await assert.rejects(map.resolve(conn, 1), (err: Error & { code?: string }) => {
      assert.equal(err.code, code, err.message);
      assert.match(err.message, pattern);
      return true;
    });
  };
  try {
    await check({ columns: { cust_name: 'name' }, computed: { email_lower: 'random()::text' } }, 'PGSUB_MAPPING_INVALID', /shop\.customers.*"email_lower".*not immutable/);
    await check({ columns: { cust_name: 'name' }, computed: { email_lower: 'lower(mail)' } }, 'PGSUB_MAPPING_INVALID', /"email_lower".*mail/);
    await check({ columns: { cust_name: 'name' }, computed: { email_lower: 'lower(email' } }, 'PGSUB_MAPPING_INVALID', /"email_lower".*syntax/);
    await check({ columns: { cust_name: 'name', nope: 'x' } }, 'PGSUB_MAPPING_INVALID', /column "nope" is not a column the publisher sends/);
    await check({ columns: { cust_name: 'name' }, exclude: ['id'] }, 'PGSUB_MAPPING_INVALID', /replica identity column "id".*must be written/);
    await check({}, 'PGSUB_SCHEMA_MISMATCH', /"crm\.clients" \(for "shop\.customers"\) is missing replicated column: "cust_name"/);
    await check({ columns: { cust_name: 'name' }, computed: { nickname: `'x'` } }, 'PGSUB_MAPPING_INVALID', /computed column "nickname" does not exist in "crm\.clients"/);
    await check({ columns: { cust_name: 'name', email: 'name' } }, 'PGSUB_MAPPING_INVALID', /"name".*filled by both "cust_name" and "email"/);
  } finally {
    await conn.close();
  }
});
