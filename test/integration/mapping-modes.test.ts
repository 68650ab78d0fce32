/**
 * A mapping combined with the apply modes that reorder or split work (PG18 → PG18):
 * streaming = parallel with two_phase (a streamed transaction applied on the parallel
 * connection while the source transaction is still open, a prepared transaction committed
 * and one rolled back), and apply lanes (apply_workers = 4) on a backlog. The mapped
 * tables retarget, rename, exclude and compute; the target must end equal to the source
 * read through the mapping, every transaction once. Then the operator's commands on a
 * mapped subscription: a conflict on a reshaped table skipped with `pgsub skip --lsn`, a
 * renamed table copied again with `pgsub resync`, and a mapped table added to the
 * publication picked up by `pgsub refresh` and copied into its target name.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { connect, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SOURCE = `CREATE SCHEMA app;
  CREATE TABLE app.items (id int PRIMARY KEY, v text, n int, secret text);
  CREATE TABLE app.plain (id int PRIMARY KEY, label text);
  CREATE TABLE app.later (id int PRIMARY KEY, what text);
  CREATE TABLE app.flt (id int PRIMARY KEY, v text);
  CREATE TABLE app.shard_a (id int PRIMARY KEY, v int);
  CREATE TABLE app.shard_b (id int PRIMARY KEY, v int);`;
const TARGET = `CREATE SCHEMA mirror;
  CREATE TABLE mirror.things (id int PRIMARY KEY, body text, n int, n_plus int, v_len int);
  CREATE TABLE mirror.plain_renamed (id int PRIMARY KEY, title text);
  CREATE TABLE mirror.later_renamed (id int PRIMARY KEY, note text);
  CREATE TABLE mirror.flt (id int PRIMARY KEY, v text, gone boolean NOT NULL DEFAULT false);
  CREATE TABLE mirror.orders (shard text, id int, v int, PRIMARY KEY (shard, id));`;
const MAPPING = JSON.stringify({
  tables: {
    'app.items': { target: 'mirror.things', columns: { v: 'body' }, exclude: ['secret'], computed: { n_plus: 'n + 1', v_len: 'pg_catalog.length(v)' } },
    'app.plain': { target: 'mirror.plain_renamed', columns: { label: 'title' } },
    'app.later': { target: 'mirror.later_renamed', columns: { what: 'note' } },
    'app.flt': { target: 'mirror.flt', filter: 'id % 3 <> 0', soft_delete: 'gone' },
    'app.shard_a': { target: 'mirror.orders', discriminator: { column: 'shard', value: 'a' }, key: ['shard', 'id'] },
    'app.shard_b': { target: 'mirror.orders', discriminator: { column: 'shard', value: 'b' }, key: ['shard', 'id'] },
  },
});

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;
const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-mapping-modes-'));

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'mapm-pub', settings: { logical_decoding_work_mem: '64kB', max_prepared_transactions: '10' } }),
    startCluster({ major: 18, name: 'mapm-tgt', settings: { max_prepared_transactions: '10' } }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(
    `${SOURCE} CREATE PUBLICATION pub FOR TABLE app.items, app.plain, app.flt, app.shard_a, app.shard_b; CREATE PUBLICATION pubops FOR TABLE app.items, app.plain;`,
    [],
    'src',
  );
  await target.query(TARGET, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(stateDir, { recursive: true, force: true });
});

function start(sub: string, extra: Record<string, string>): PgsubProcess {
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATE_DIR: stateDir,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    PGSUB_MAPPING: MAPPING,
    ...extra,
  });
  return child;
}

async function stop(): Promise<string> {
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-2000));
  const output = child!.output();
  child = null;
  return output;
}

/** The source read through the mapping and the target, row for row. */
async function assertMappedEqual(): Promise<void> {
  const [src] = await publisher.query(
    `SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s', id, v, n, n + 1, length(v)), ',' ORDER BY id), '') AS items,
            (SELECT coalesce(string_agg(format('%s|%s', id, label), ',' ORDER BY id), '') FROM app.plain) AS plain,
            count(*)::int AS c FROM app.items`,
    [],
    'src',
  );
  const [dst] = await target.query(
    `SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s', id, body, n, n_plus, v_len), ',' ORDER BY id), '') AS items,
            (SELECT coalesce(string_agg(format('%s|%s', id, title), ',' ORDER BY id), '') FROM mirror.plain_renamed) AS plain,
            count(*)::int AS c FROM mirror.things`,
    [],
    'dst',
  );
  assert.equal(dst.c, src.c);
  assert.ok(dst.items === src.items, 'mirror.things differs from app.items read through the mapping');
  assert.ok(dst.plain === src.plain, 'mirror.plain_renamed differs from app.plain');
}

const applied = async (sub: string) => Number((await target.query(`SELECT transactions_applied FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst'))[0].transactions_applied);

test('streaming = parallel and two_phase with a mapping: applied while open, prepared, committed and rolled back', async () => {
  start('mapp', { PGSUB_STREAMING: 'parallel', PGSUB_TWO_PHASE: 'true', PGSUB_LOG_LEVEL: 'debug' });
  await child!.waitForLog('streaming started');
  const c = await connect(publisher, 'src');
  try {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, repeat('a', 50 + g % 7), g, 's' FROM generate_series(1, 3000) g`);
    // Eager apply of the mapped table on the parallel connection, before the source commits.
    await waitFor(
      async () =>
        (
          await target.query(
            `SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
              WHERE a.application_name = 'pgsub_mapp_parallel' AND l.relation = 'mirror.things'::regclass AND l.mode = 'RowExclusiveLock'`,
            [],
            'dst',
          )
        ).length > 0,
      { timeoutMs: 30_000, intervalMs: 100, what: 'the parallel connection to apply the open transaction into mirror.things' },
    );
    await c.query(`SAVEPOINT s1; UPDATE app.items SET n = -n WHERE id <= 100; ROLLBACK TO SAVEPOINT s1;
                   UPDATE app.items SET v = 'upd' WHERE id BETWEEN 200 AND 299; DELETE FROM app.items WHERE id > 2900;
                   INSERT INTO app.plain SELECT g, 'p' || g FROM generate_series(1, 50) g;
                   INSERT INTO app.flt SELECT g, 'f' FROM generate_series(1, 3000) g;
                   DELETE FROM app.flt WHERE id <= 300;
                   UPDATE app.flt SET id = id + 10000 WHERE id BETWEEN 301 AND 330`);
    await c.query('COMMIT');
    await c.query(`BEGIN; UPDATE app.items SET n = n * 10 WHERE id <= 10; INSERT INTO app.plain VALUES (100, 'prepared'); PREPARE TRANSACTION 'mapgid1'`);
    await c.query(`BEGIN; DELETE FROM app.items WHERE id BETWEEN 1001 AND 2000; UPDATE app.plain SET label = 'gone'; PREPARE TRANSACTION 'mapgid2'`);
    await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst'))[0].n === 2, {
      timeoutMs: 30_000,
      what: 'both prepared on the target',
    });
    await c.query(`COMMIT PREPARED 'mapgid1'`);
    await c.query(`ROLLBACK PREPARED 'mapgid2'`);
  } finally {
    await c.end();
  }
  await waitForCatchUp(publisher, 'src', 'mapp');
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst'))[0].n === 0, { what: 'no prepared transaction left' });
  await assertMappedEqual();
  const out = await stop();
  assert.ok(out.includes('"msg":"parallel transaction finished"'), out.slice(-3000));
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM mirror.things WHERE n_plus = n + 1 AND v_len = length(body)`, [], 'dst'))[0].n, 2900);
  // The filter (id % 3 <> 0) with a soft delete, streamed: live rows are the source's that
  // pass; deleted ones that had passed are marked gone, and so is each row an UPDATE of its
  // key moved out of the filter (old passes, new fails: a DELETE).
  const [flt] = await target.query(
    `SELECT (SELECT string_agg(id::text, ',' ORDER BY id) FROM mirror.flt WHERE NOT gone) AS live,
            (SELECT string_agg(id::text, ',' ORDER BY id) FROM mirror.flt WHERE gone) AS gone`,
    [],
    'dst',
  );
  const [want] = await publisher.query(
    `SELECT (SELECT string_agg(id::text, ',' ORDER BY id) FROM app.flt WHERE id % 3 <> 0) AS live,
            (SELECT string_agg(g::text, ',' ORDER BY g) FROM generate_series(1, 330) g
              WHERE g % 3 <> 0 AND (g <= 300 OR (g + 10000) % 3 = 0)) AS gone`,
    [],
    'src',
  );
  assert.deepEqual(flt, want);
  await publisher.query(`SELECT pg_drop_replication_slot('mapp'); TRUNCATE app.items, app.plain, app.flt`, [], 'src');
  await target.query(`TRUNCATE mirror.things, mirror.plain_renamed, mirror.flt`, [], 'dst');
});

test('apply lanes (apply_workers = 4) on a backlog of mapped transactions: equal, each once', async () => {
  const lanes = { PGSUB_APPLY_WORKERS: '4', PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_GROUP_TRANSACTIONS: '40' };
  start('mapl', lanes);
  await child!.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', 'mapl');
  await stop();
  const before = await applied('mapl');
  const txs: string[] = [];
  for (let i = 1; i <= 1200; i++) {
    const s = [`INSERT INTO app.items VALUES (${i}, 'v${i}', ${i}, 'x')`, `INSERT INTO app.plain VALUES (${i}, 'l${i}')`];
    if (i % 10 === 0) s.push(`UPDATE app.items SET n = n + 1, v = v || '+' WHERE id = ${i - 5}`);
    if (i % 17 === 0) s.push(`DELETE FROM app.items WHERE id = ${i - 3}`);
    if (i % 23 === 0) s.push(`UPDATE app.plain SET id = id + 100000 WHERE id = ${i - 2}`);
    // Two shards into one table (discriminator): the same ids in both, updated and deleted.
    s.push(`INSERT INTO app.${i % 2 ? 'shard_a' : 'shard_b'} VALUES (${i >> 1}, ${i})`);
    if (i % 9 === 0) s.push(`UPDATE app.shard_a SET v = v + 1 WHERE id = ${(i >> 1) - 2}`, `DELETE FROM app.shard_b WHERE id = ${(i >> 1) - 3}`);
    txs.push(`BEGIN; ${s.join('; ')}; COMMIT;`);
  }
  await publisher.query(txs.join('\n'), [], 'src');
  start('mapl', lanes);
  await waitForCatchUp(publisher, 'src', 'mapl', 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const out = await stop();
  await assertMappedEqual();
  const shards = async (c: Cluster, db: string, sql: string) => (await c.query(sql, [], db))[0].s as string;
  assert.equal(
    await shards(target, 'dst', `SELECT string_agg(format('%s|%s|%s', shard, id, v), ',' ORDER BY shard, id) AS s FROM mirror.orders`),
    await shards(
      publisher,
      'src',
      `SELECT string_agg(format('%s|%s|%s', s, id, v), ',' ORDER BY s, id) AS s FROM (SELECT 'a' AS s, * FROM app.shard_a UNION ALL SELECT 'b', * FROM app.shard_b) u`,
    ),
  );
  assert.equal((await applied('mapl')) - before, 1200);
  assert.ok(out.includes('apply lanes stopped'), out.slice(-3000));
});

test('skip, resync and refresh on a mapped subscription', async () => {
  await publisher.query(`TRUNCATE app.items, app.plain; INSERT INTO app.plain SELECT g, 'p' || g FROM generate_series(1, 500) g`, [], 'src');
  await target.query(`TRUNCATE mirror.things, mirror.plain_renamed`, [], 'dst');
  const env = (sub: string) => ({ PGSUB_PUBLICATION: 'pubops', PGSUB_COPY_DATA: 'true', PGSUB_REFRESH_INTERVAL: '3600', PGSUB_SUBSCRIPTION: sub });
  start('mapo', env('mapo'));
  await child!.waitForLog('streaming started');
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM mirror.plain_renamed`, [], 'dst'))[0].n === 500, {
    timeoutMs: 60_000,
    what: 'the copy of app.plain',
  });
  // Both tables copied (app.items empty, through the staged copy of its computed columns); then a row only the target has.
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = 'mapo' AND state = 'r'`, [], 'dst'))[0].n === 2, {
    timeoutMs: 60_000,
    what: 'both tables ready',
  });
  await target.query(`INSERT INTO mirror.things VALUES (7, 'local', 0, 0, 0)`, [], 'dst');
  const cli = async (args: string[]) => {
    const p = spawnPgsub(
      { PGSUB_SOURCE: publisher.url('src'), PGSUB_TARGET: target.url('dst'), PGSUB_SUBSCRIPTION: 'mapo', PGSUB_PUBLICATION: 'pubops', PGSUB_MAPPING: MAPPING },
      args,
    );
    const code = await p.exited;
    return { code, out: p.output() };
  };
  // A remote insert of a key the target already has: insert_exists, policy error, recorded.
  await publisher.query(`INSERT INTO app.items VALUES (7, 'remote', 1, 's')`, [], 'src');
  await publisher.query(`INSERT INTO app.items VALUES (8, 'after', 2, 's')`, [], 'src');
  const failed = async () => (await target.query(`SELECT error_lsn::text AS lsn FROM pgsub.subscription WHERE subscription = 'mapo'`, [], 'dst'))[0]?.lsn as string | null;
  await waitFor(async () => (await failed()) != null, { timeoutMs: 30_000, what: 'the conflict recorded' });
  const skip = await cli(['skip', '--lsn', (await failed())!]);
  assert.equal(skip.code, 0, skip.out);
  await waitForCatchUp(publisher, 'src', 'mapo');
  assert.deepEqual(await target.query(`SELECT id, body, n_plus FROM mirror.things ORDER BY id`, [], 'dst'), [
    { id: 7, body: 'local', n_plus: 0 },
    { id: 8, body: 'after', n_plus: 3 },
  ]);
  // resync copies the renamed table again, into its target name.
  await target.query(`DELETE FROM mirror.plain_renamed WHERE id <= 100`, [], 'dst');
  const resync = await cli(['resync', 'app.plain']);
  assert.equal(resync.code, 0, resync.out);
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM mirror.plain_renamed`, [], 'dst'))[0].n === 500, { timeoutMs: 60_000, what: 'the copy again' });
  // refresh: a mapped table added to the publication is copied into its target name, then streams.
  await publisher.query(`INSERT INTO app.later SELECT g, 'w' || g FROM generate_series(1, 300) g; ALTER PUBLICATION pubops ADD TABLE app.later`, [], 'src');
  const refresh = await cli(['refresh']);
  assert.equal(refresh.code, 0, refresh.out);
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM mirror.later_renamed`, [], 'dst'))[0].n === 300, {
    timeoutMs: 60_000,
    what: 'the added table copied',
  });
  await publisher.query(`UPDATE app.later SET what = 'changed' WHERE id = 1`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'mapo');
  assert.deepEqual(await target.query(`SELECT note FROM mirror.later_renamed WHERE id = 1`, [], 'dst'), [{ note: 'changed' }]);
  await stop();
});
