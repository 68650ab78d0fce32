/**
 * Row semantics of a mapping (docs/mapping.md "Rows"), PG14 publisher → PG18 target in
 * binary mode, and one case PG18 → PG18 (a database of the target cluster publishes):
 *  - a row filter on an identity column with PostgreSQL 15's semantics: inserts and
 *    deletes filtered, and the four UPDATE transitions (UPDATE, DELETE, INSERT, skip);
 *  - a key override (tenant, code) whose tenant is computed from the identity;
 *  - soft delete with the commit time and LSN, revive by a later INSERT, and each
 *    TRUNCATE policy (soft_delete, ignore, truncate);
 *  - many-to-one: two shards into one target with a discriminator, a per-shard
 *    TRUNCATE, and a cross-shard key conflict — `error` stops naming it, then
 *    apply_remote and keep_local resolve it, logged with the remote and target names;
 *  - the initial copy of a filtered table (the filter pushed down to the publisher);
 *  - PG18 → PG18 in text mode, conflict detection off: a filter combined with soft delete;
 *  - every new key's mistakes, each a clear PGSUB_MAPPING_INVALID naming table, column, reason.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import type { MappingConfig } from '../../src/mapping/rules.js';
import { parseConninfo } from '../../src/config/conninfo.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { RelationMap } from '../../src/apply/sql/relmap.js';
import { openApplyConnection, rolledBackOn } from '../../src/pgwire/connect.js';
import type { RelationMessage } from '../../src/protocol/messages.js';
import { formatLsn } from '../../src/protocol/lsn.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const PUBLISHER = `
  CREATE SCHEMA r;
  CREATE TABLE r.items (region text, id int, qty int, PRIMARY KEY (region, id));
  CREATE TABLE r.accounts (code text PRIMARY KEY, name text);
  CREATE TABLE r.docs (id int PRIMARY KEY, body text);
  CREATE TABLE r.notes (id int PRIMARY KEY, body text);
  CREATE TABLE r.logs (id int PRIMARY KEY, body text);
  CREATE TABLE r.orders_2024 (id int PRIMARY KEY, amount int);
  CREATE TABLE r.orders_2025 (id int PRIMARY KEY, amount int);
  CREATE PUBLICATION pub FOR TABLE r.items, r.accounts, r.docs, r.notes, r.logs;
  CREATE PUBLICATION pub_orders FOR TABLE r.orders_2024, r.orders_2025;
  CREATE TABLE r.seeded (region text, id int, qty int, PRIMARY KEY (region, id));
  INSERT INTO r.seeded SELECT CASE WHEN g % 3 = 0 THEN 'eu' ELSE 'us' END, g, g FROM generate_series(1, 300) g;
  CREATE PUBLICATION pub_seed FOR TABLE r.seeded;
`;
const TARGET = `
  CREATE SCHEMA r;
  CREATE SCHEMA acct;
  CREATE SCHEMA sales;
  CREATE TABLE r.items (region text, id int, qty int, PRIMARY KEY (region, id));
  CREATE TABLE acct.accounts (tenant text, code text, name text, PRIMARY KEY (tenant, code));
  INSERT INTO acct.accounts VALUES ('other', 'acme-1', 'local row, same code, other tenant');
  CREATE TABLE r.docs (id int PRIMARY KEY, body text, deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, deleted_lsn pg_lsn);
  CREATE TABLE r.notes (id int PRIMARY KEY, body text, gone boolean DEFAULT false);
  CREATE TABLE r.logs (id int PRIMARY KEY, body text, removed_at timestamptz);
  CREATE TABLE sales.orders (shard text NOT NULL, id int PRIMARY KEY, amount int);
  CREATE TABLE r.seeded (region text, id int, qty int, PRIMARY KEY (region, id));
`;
const MAPPING = {
  tables: {
    'r.items': { filter: `region = 'eu'` },
    'r.seeded': { filter: `region = 'eu'` },
    'r.accounts': { target: 'acct.accounts', computed: { tenant: `split_part(code, '-', 1)` }, key: ['tenant', 'code'] },
    'r.docs': { soft_delete: { flag: 'deleted', at: 'deleted_at', lsn: 'deleted_lsn' }, truncate: 'soft_delete' },
    'r.notes': { soft_delete: 'gone', truncate: 'ignore' },
    'r.logs': { soft_delete: { at: 'removed_at' } },
    'r.orders_2024': { target: 'sales.orders', discriminator: 'shard' },
    'r.orders_2025': { target: 'sales.orders', discriminator: { column: 'shard', value: '2025' } },
  },
};

let pub14: Cluster;
let tgt: Cluster;
const runners: Runner[] = [];
let orders: Runner | undefined;
const errors: { msg: string; err?: { code?: string; message?: string } }[] = [];
const warnings: Record<string, unknown>[] = [];

function config(subscription: string, source: string, target: string, publication: string, extra: Record<string, unknown> = {}) {
  return loadConfig({
    env: {},
    overrides: {
      subscription,
      source,
      target,
      publication,
      copy_data: false,
      binary: true,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      mapping: MAPPING,
      ...extra,
    },
  });
}

const destination = {
  write: (line: string) => {
    const l = JSON.parse(line) as { level: number; msg: string; err?: { code?: string; message?: string } };
    if (l.level >= 50) errors.push(l);
    else if (l.level >= 40) warnings.push(l);
    if (process.env.MAPDEBUG) console.error(line);
  },
};

function ordersRunner(policies: Record<string, Record<string, string>>): Runner {
  return startRunner(config('orders', pub14.url('src'), tgt.url('dst'), 'pub_orders', { conflicts: { tables: policies } }), createLogger('warn', destination));
}

before(async () => {
  [pub14, tgt] = await Promise.all([startCluster({ major: 14, name: 'rows-pub14' }), startCluster({ major: 18, name: 'rows-tgt18' })]);
  await Promise.all([pub14.createDatabase('src'), tgt.createDatabase('dst'), tgt.createDatabase('src18'), tgt.createDatabase('dst18')]);
  await pub14.query(PUBLISHER, [], 'src');
  await tgt.query(TARGET, [], 'dst');
  await tgt.query(`CREATE TABLE items (region text, id int, qty int, PRIMARY KEY (region, id)); CREATE PUBLICATION pub18 FOR TABLE items`, [], 'src18');
  await tgt.query(`CREATE TABLE items (region text, id int, qty int, gone boolean NOT NULL DEFAULT false, PRIMARY KEY (region, id))`, [], 'dst18');
  runners.push(startRunner(config('rows', pub14.url('src'), tgt.url('dst'), 'pub'), createLogger('warn', destination)));
  const pg18 = { tables: { 'public.items': { filter: `region <> 'us'`, soft_delete: 'gone' } } };
  // Detection off: every filter verdict is asked of the target first (handlers/rows.ts).
  runners.push(
    startRunner(config('rows18', tgt.url('src18'), tgt.url('dst18'), 'pub18', { binary: false, mapping: pg18, conflicts: { detect: false } }), createLogger('warn', destination)),
  );
  orders = ordersRunner({});
  // The initial copy of a filtered table: the filter is pushed down to the publisher's COPY (SELECT …).
  runners.push(startRunner(config('rowsseed', pub14.url('src'), tgt.url('dst'), 'pub_seed', { copy_data: true }), createLogger('warn', destination)));
  await waitFor(async () => (await slotConfirmedLsn(pub14, 'rows')) !== null && (await slotConfirmedLsn(pub14, 'orders')) !== null, { timeoutMs: 30_000, what: 'the slots' });
  await waitFor(async () => (await slotConfirmedLsn(tgt, 'rows18')) !== null, { timeoutMs: 30_000, what: 'the PG18 slot' });
});

after(async () => {
  for (const r of [...runners, orders]) r?.stop();
  for (const r of [...runners, orders]) await r?.done.catch(() => undefined);
  await pub14?.stop();
  await tgt?.stop();
});

async function caughtUp(slot = 'rows', cluster = () => pub14, db = 'src'): Promise<void> {
  const end = await currentWalLsn(cluster(), db);
  await waitFor(async () => ((await slotConfirmedLsn(cluster(), slot)) ?? 0n) >= end, {
    timeoutMs: 30_000,
    intervalMs: 100,
    what: `slot ${slot} to confirm ${end} (errors: ${JSON.stringify(errors.slice(-2))})`,
  });
}

const src = (sql: string) => pub14.query(sql, [], 'src');
const dst = (sql: string) => tgt.query(sql, [], 'dst');

test('row filter on an identity column: inserts and deletes filtered, the four UPDATE transitions', async () => {
  await src(`INSERT INTO r.items VALUES ('eu', 1, 10), ('eu', 2, 20), ('us', 3, 30), ('us', 4, 40), ('eu', 5, 50), ('us', 6, 60)`);
  await caughtUp();
  assert.deepEqual(await dst(`SELECT region, id, qty FROM r.items ORDER BY id`), [
    { region: 'eu', id: 1, qty: 10 },
    { region: 'eu', id: 2, qty: 20 },
    { region: 'eu', id: 5, qty: 50 },
  ]);
  await src(`UPDATE r.items SET qty = 11 WHERE id = 1;                      -- old passes, new passes: UPDATE (no old tuple: key unchanged)
             UPDATE r.items SET region = 'us', qty = 21 WHERE id = 2;       -- old passes, new fails: DELETE
             UPDATE r.items SET region = 'eu', qty = 31 WHERE id = 3;       -- old fails, new passes: INSERT
             UPDATE r.items SET qty = 41 WHERE id = 4;                      -- neither: skipped
             UPDATE r.items SET region = 'eu ', qty = 61 WHERE id = 6;      -- old fails, new fails (key changed): skipped
             DELETE FROM r.items WHERE id = 5;                              -- old passes: DELETE
             DELETE FROM r.items WHERE id = 4;                              -- old fails: skipped`);
  await caughtUp();
  assert.deepEqual(await dst(`SELECT region, id, qty FROM r.items ORDER BY id`), [
    { region: 'eu', id: 1, qty: 11 },
    { region: 'eu', id: 3, qty: 31 },
  ]);
  // A filtered change is no conflict: nothing missing was reported or logged.
  assert.deepEqual(
    warnings.filter((w) => w.table === 'r.items'),
    [],
  );
  assert.deepEqual(await dst(`SELECT conflict_type FROM pgsub.conflict_log WHERE subscription = 'rows'`), []);
  assert.deepEqual(errors, []);
});

test('the initial copy of a filtered table copies only the rows that pass, then streams filtered', async () => {
  await waitFor(async () => (await dst(`SELECT state FROM pgsub.subscription_rel WHERE subscription = 'rowsseed'`))[0]?.state === 'r', { timeoutMs: 30_000, what: 'the copy' });
  await src(`INSERT INTO r.seeded VALUES ('eu', 1000, 1), ('us', 1001, 1)`);
  await caughtUp('rowsseed');
  assert.deepEqual(await dst(`SELECT count(*)::int AS n, count(*) FILTER (WHERE region = 'eu')::int AS eu, max(id) AS top FROM r.seeded`), [{ n: 101, eu: 101, top: 1000 }]);
  assert.deepEqual(errors, []);
});

test('key override: rows located by (tenant, code) where tenant is computed from the identity', async () => {
  await src(`INSERT INTO r.accounts VALUES ('acme-1', 'Acme one'), ('beta-7', 'Beta');
             UPDATE r.accounts SET name = 'Acme 1' WHERE code = 'acme-1';
             UPDATE r.accounts SET code = 'beta-8' WHERE code = 'beta-7'`);
  await caughtUp();
  assert.deepEqual(await dst(`SELECT tenant, code, name FROM acct.accounts ORDER BY tenant, code`), [
    { tenant: 'acme', code: 'acme-1', name: 'Acme 1' },
    { tenant: 'beta', code: 'beta-8', name: 'Beta' },
    { tenant: 'other', code: 'acme-1', name: 'local row, same code, other tenant' },
  ]);
  await src(`DELETE FROM r.accounts WHERE code = 'acme-1'`);
  await caughtUp();
  assert.deepEqual(await dst(`SELECT tenant, code FROM acct.accounts ORDER BY tenant, code`), [
    { tenant: 'beta', code: 'beta-8' },
    { tenant: 'other', code: 'acme-1' },
  ]);
  assert.deepEqual(errors, []);
});

test('soft delete: flag, commit time and LSN; a later INSERT revives; TRUNCATE policies soft_delete, ignore, truncate', async () => {
  await src(`INSERT INTO r.docs VALUES (1, 'a'), (2, 'b'), (3, 'c'); INSERT INTO r.notes VALUES (1, 'n'); INSERT INTO r.logs VALUES (1, 'l'), (2, 'm')`);
  const before = await currentWalLsn(pub14, 'src');
  await src(`DELETE FROM r.docs WHERE id = 2; DELETE FROM r.logs WHERE id = 2`);
  await caughtUp();
  const [gone] = await dst(`SELECT deleted, deleted_at > now() - interval '1 minute' AS recent, deleted_lsn > '${formatLsn(before)}'::pg_lsn AS later FROM r.docs WHERE id = 2`);
  assert.deepEqual(gone, { deleted: true, recent: true, later: true });
  assert.deepEqual(await dst(`SELECT id, removed_at IS NOT NULL AS removed FROM r.logs ORDER BY id`), [
    { id: 1, removed: false },
    { id: 2, removed: true },
  ]);
  // Revive: the same key inserted again clears the marks and takes the new values.
  await src(`INSERT INTO r.docs VALUES (2, 'b again')`);
  await caughtUp();
  assert.deepEqual(await dst(`SELECT id, body, deleted, deleted_at, deleted_lsn FROM r.docs WHERE id = 2`), [
    { id: 2, body: 'b again', deleted: false, deleted_at: null, deleted_lsn: null },
  ]);
  await src(`DELETE FROM r.docs WHERE id = 3`);
  await caughtUp();
  const at3 = ((await dst(`SELECT deleted_at::text AS at3 FROM r.docs WHERE id = 3`)) as { at3: string }[])[0]!.at3;
  await src(`TRUNCATE r.docs, r.notes, r.logs`);
  await caughtUp();
  // soft_delete: every live row marked, an already deleted one keeps its time.
  assert.deepEqual(await dst(`SELECT id, deleted, deleted_at::text = '${at3}' AS kept FROM r.docs ORDER BY id`), [
    { id: 1, deleted: true, kept: false },
    { id: 2, deleted: true, kept: false },
    { id: 3, deleted: true, kept: true },
  ]);
  assert.deepEqual(await dst(`SELECT id, gone FROM r.notes`), [{ id: 1, gone: false }]);
  assert.deepEqual(await dst(`SELECT count(*)::int AS n FROM r.logs`), [{ n: 0 }]);
  assert.deepEqual(errors, []);
});

test('many-to-one: two shards, a per-shard truncate, a cross-shard key conflict under error, apply_remote and keep_local', async () => {
  await src(`INSERT INTO r.orders_2024 VALUES (1, 100), (2, 200); INSERT INTO r.orders_2025 VALUES (3, 300), (4, 400);
             UPDATE r.orders_2024 SET amount = 101 WHERE id = 1; DELETE FROM r.orders_2025 WHERE id = 4`);
  await caughtUp('orders');
  assert.deepEqual(await dst(`SELECT shard, id, amount FROM sales.orders ORDER BY id`), [
    { shard: 'r.orders_2024', id: 1, amount: 101 },
    { shard: 'r.orders_2024', id: 2, amount: 200 },
    { shard: '2025', id: 3, amount: 300 },
  ]);
  await src(`TRUNCATE r.orders_2024`);
  await caughtUp('orders');
  assert.deepEqual(await dst(`SELECT shard, id FROM sales.orders ORDER BY id`), [{ shard: '2025', id: 3 }]);
  // Shard 2024 writes id 3, which shard 2025 holds: insert_exists on the target's key, `error` by default.
  await src(`INSERT INTO r.orders_2024 VALUES (3, 999)`);
  await waitFor(async () => errors.some((e) => e.err?.code === 'PGSUB_APPLY_CONFLICT'), { timeoutMs: 30_000, what: 'the conflict error' });
  const conflict = errors.find((e) => e.err?.code === 'PGSUB_APPLY_CONFLICT')!;
  assert.match(conflict.err!.message!, /relation "r\.orders_2024": conflict=insert_exists \(key already exists in unique index sales\.orders_pkey; target "sales"\."orders"\)/);
  assert.deepEqual(await dst(`SELECT shard, id, amount FROM sales.orders ORDER BY id`), [{ shard: '2025', id: 3, amount: 300 }]);
  orders!.stop();
  await orders!.done.catch(() => undefined);
  errors.length = 0;
  // apply_remote: the row takes shard 2024's values; then keep_local keeps shard 2024's id 5 against shard 2025.
  orders = ordersRunner({ 'r.orders_2024': { insert_exists: 'apply_remote' }, 'r.orders_2025': { insert_exists: 'keep_local' } });
  await caughtUp('orders');
  await src(`INSERT INTO r.orders_2024 VALUES (5, 500)`);
  await src(`INSERT INTO r.orders_2025 VALUES (5, 555)`);
  await src(`DELETE FROM r.orders_2025 WHERE id = 5`);
  await caughtUp('orders');
  assert.deepEqual(await dst(`SELECT shard, id, amount FROM sales.orders ORDER BY id`), [
    { shard: 'r.orders_2024', id: 3, amount: 999 },
    { shard: 'r.orders_2024', id: 5, amount: 500 },
  ]);
  const log = await dst(`SELECT relation, conflict_type, policy, detail FROM pgsub.conflict_log WHERE subscription = 'orders' AND policy <> 'error' ORDER BY id`);
  assert.deepEqual(
    log.map((l) => ({ ...l, detail: String(l.detail).replace(/ index [^;\s]+/, ' index …') })),
    [
      { relation: 'r.orders_2024', conflict_type: 'insert_exists', policy: 'apply_remote', detail: 'key already exists in unique index …; target "sales"."orders"' },
      { relation: 'r.orders_2025', conflict_type: 'insert_exists', policy: 'keep_local', detail: 'key already exists in unique index …; target "sales"."orders"' },
      // Shard 2025's DELETE of id 5 finds no row of its own (the row is shard 2024's): delete_missing, skipped.
      { relation: 'r.orders_2025', conflict_type: 'delete_missing', policy: 'skip', detail: 'target "sales"."orders"' },
    ],
  );
  assert.deepEqual(errors, []);
});

test('PG18 → PG18 in text mode, detection off: a filter with soft delete (a row leaving the filter is soft-deleted)', async () => {
  const q = (sql: string) => tgt.query(sql, [], 'src18');
  await q(`INSERT INTO items VALUES ('eu', 1, 1), ('us', 2, 2), ('ap', 3, 3)`);
  await q(`UPDATE items SET region = 'us' WHERE id = 1; UPDATE items SET region = 'eu' WHERE id = 2; DELETE FROM items WHERE id = 3`);
  await q(`INSERT INTO items VALUES ('ap', 3, 33)`);
  await q(`UPDATE items SET qty = 22 WHERE id = 2; UPDATE items SET qty = 11 WHERE id = 1; DELETE FROM items WHERE id = 1`);
  await caughtUp('rows18', () => tgt, 'src18');
  assert.deepEqual(await tgt.query(`SELECT region, id, qty, gone FROM items ORDER BY id, region`, [], 'dst18'), [
    { region: 'eu', id: 1, qty: 1, gone: true },
    { region: 'eu', id: 2, qty: 22, gone: false },
    { region: 'ap', id: 3, qty: 33, gone: false },
  ]);
  assert.deepEqual(errors, []);
});

function relation(columns: [string, number, boolean][], name = 'accounts', replicaIdentity: RelationMessage['replicaIdentity'] = 'default'): RelationMessage {
  return { tag: 'relation', relationId: 1, namespace: 'r', name, replicaIdentity, columns: columns.map(([n, typeOid, isKey]) => ({ name: n, typeOid, isKey, typeModifier: -1 })) };
}

test('each new key is checked against the relation and the target, naming table, column and reason', async () => {
  const info = parseConninfo(tgt.url('dst'), 'target', {});
  const conn = await openApplyConnection(info, { applicationName: 'rows_check', synchronousCommit: 'on' });
  const accounts = relation([
    ['code', 25, true],
    ['name', 25, false],
  ]);
  const docs = relation(
    [
      ['id', 23, true],
      ['body', 25, false],
    ],
    'docs',
  );
  const check = async (table: string, rule: Record<string, unknown>, pattern: RegExp, rel = accounts) => {
    const mapping = { schemas: {}, tables: { [table]: rule } } as unknown as MappingConfig;
    const map = new RelationMap(180000, { mapping, probe: rolledBackOn(info, 'rows_probe') });
    map.onRelation(rel);
    await assert.rejects(map.resolve(conn, 1), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'PGSUB_MAPPING_INVALID', err.message);
      assert.match(err.message, pattern);
      return true;
    });
  };
  const acct = { target: 'acct.accounts', computed: { tenant: `split_part(code, '-', 1)` } };
  try {
    await check('r.accounts', { ...acct, filter: `name <> 'x'` }, /mapping\.tables\.r\.accounts: filter column "name" of "r\.accounts" is not in its replica identity \("code"\)/);
    await check('r.accounts', { ...acct, filter: `random() > 0.5` }, /expression for filter .* is not immutable/);
    await check(
      'r.accounts',
      { ...acct, computed: { tenant: 'name' }, key: ['tenant', 'code'] },
      /key column "tenant" of "acct\.accounts" is not covered by the replica identity \("code"\).*filled from "name"/,
    );
    await check('r.accounts', { ...acct, exclude: ['name'], key: ['name'] }, /key column "name" is an excluded column of "r\.accounts"/);
    await check('r.accounts', { ...acct, key: ['nope'] }, /key column "nope" does not exist in "acct\.accounts"/);
    await check('r.docs', { soft_delete: 'deleted', key: ['body'] }, /key column "body".*not covered by the replica identity \("id"\)/, docs);
    await check('r.docs', { soft_delete: 'body' }, /soft_delete flag column "body" of "r\.docs" is also filled from the remote row/, docs);
    await check('r.docs', { soft_delete: { at: 'nothere' } }, /soft_delete at column "nothere" does not exist in "r\.docs"/, docs);
    await check('r.docs', { soft_delete: 'deleted_at' }, /soft_delete flag column "deleted_at" of "r\.docs" must be boolean/, docs);
    await check('r.docs', { truncate: 'soft_delete' }, /truncate: soft_delete needs soft_delete/, docs);
    await check('r.accounts', { ...acct, key: ['tenant', 'code'], soft_delete: 'name' }, /soft_delete flag column "name".*also filled/);
    // acct.accounts has no unique index on (code) alone: soft delete could not revive by it.
    await check(
      'r.accounts',
      { target: 'acct.accounts', computed: { tenant: `'t'` }, exclude: ['name'], key: ['code'], soft_delete: { at: 'name' } },
      /soft_delete.*needs a unique index on the key \("code"\) of "acct\.accounts"/,
    );
    await check(
      'r.orders',
      { target: 'sales.orders', discriminator: 'shard', key: ['id'] },
      /discriminator column "shard" must be part of the key \("id"\)/,
      relation([['id', 23, true]], 'orders'),
    );
    await check(
      'r.orders',
      { target: 'sales.orders', discriminator: 'region' },
      /discriminator column "region" does not exist in "sales\.orders"/,
      relation([['id', 23, true]], 'orders'),
    );
    await check(
      'r.orders',
      { target: 'sales.orders', discriminator: 'shard' },
      /REPLICA IDENTITY FULL: with a discriminator, give the target key/,
      relation(
        [
          ['id', 23, true],
          ['amount', 23, true],
        ],
        'orders',
        'full',
      ),
    );
  } finally {
    await conn.close();
  }
  // Shapes are refused when the config loads.
  const load = (mapping: unknown) => () => loadConfig({ env: {}, overrides: { subscription: 's', source: 'postgres://x/y', target: 'postgres://x/z', publication: 'p', mapping } });
  assert.throws(load({ tables: { 'r.docs': { soft_delete: {} } } }), /soft_delete names at least one of flag, at, lsn/);
  assert.throws(load({ tables: { 'r.docs': { truncate: 'drop' } } }), /truncate/);
  assert.throws(load({ tables: { 'r.docs': { drift: 'merge' } } }), /"merge" is not a drift policy/);
});
