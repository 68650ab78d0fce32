/**
 * Key movement under soft delete and many-to-one (docs/mapping.md "Keys that move"),
 * PG14 publisher → PG18 target, binary: two shards into one table with a discriminator,
 * soft delete and a row filter.
 *  - an UPDATE moving a row onto a key that is soft-deleted on the target: the row at the
 *    new key is live with the new values (as an INSERT of that key would revive it), the
 *    old key is gone as on the source, the other shard's row with the same id untouched;
 *  - filter + key change + soft delete in one source transaction (the four filter
 *    transitions of a moving key, a move onto the tombstone the same transaction made);
 *  - TRUNCATE of one shard then re-insert: only that shard's rows go, the re-insert lands;
 *  - a cross-shard collision (a unique index without the discriminator) with a row marked
 *    deleted or live: a conflict under the table's policy (logged), never a retry loop.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const PUBLISHER = `
  CREATE SCHEMA s;
  CREATE TABLE s.a (id int PRIMARY KEY, v text);
  CREATE TABLE s.b (id int PRIMARY KEY, v text);
  CREATE PUBLICATION pub FOR TABLE s.a, s.b;
  CREATE TABLE s.c (id int PRIMARY KEY, v text);
  CREATE TABLE s.d (id int PRIMARY KEY, v text);
  CREATE PUBLICATION pub_x FOR TABLE s.c, s.d;
`;
const TARGET = `
  CREATE SCHEMA t;
  CREATE TABLE t.m (shard text NOT NULL, id int NOT NULL, v text, deleted boolean NOT NULL DEFAULT false, PRIMARY KEY (shard, id));
  CREATE TABLE t.x (shard text NOT NULL, id int NOT NULL UNIQUE, v text, deleted boolean NOT NULL DEFAULT false, PRIMARY KEY (shard, id));
`;
const shard = (value: string) => ({ target: 't.m', discriminator: { column: 'shard', value }, soft_delete: 'deleted', filter: 'id < 1000' });
const MAPPING = {
  tables: {
    's.a': shard('a'),
    's.b': shard('b'),
    's.c': { target: 't.x', discriminator: { column: 'shard', value: 'c' }, soft_delete: 'deleted' },
    's.d': { target: 't.x', discriminator: { column: 'shard', value: 'd' }, soft_delete: 'deleted' },
  },
};

let pub: Cluster;
let tgt: Cluster;
const runners: Runner[] = [];
const errors: { msg: string; err?: { code?: string; message?: string } }[] = [];

function start(subscription: string, publication: string, extra: Record<string, unknown> = {}): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription,
      source: pub.url('src'),
      target: tgt.url('dst'),
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
  const runner = startRunner(
    config,
    createLogger('warn', {
      write: (line: string) => {
        const l = JSON.parse(line) as { level: number; msg: string; err?: { code?: string; message?: string } };
        if (l.level >= 50) errors.push(l);
        if (process.env.MAPDEBUG) console.error(line);
      },
    }),
  );
  runners.push(runner);
  return runner;
}

before(async () => {
  [pub, tgt] = await Promise.all([startCluster({ major: 14, name: 'keys-pub14' }), startCluster({ major: 18, name: 'keys-tgt18' })]);
  await Promise.all([pub.createDatabase('src'), tgt.createDatabase('dst')]);
  await pub.query(PUBLISHER, [], 'src');
  await tgt.query(TARGET, [], 'dst');
  start('keys', 'pub');
  start('xkeys', 'pub_x', { conflicts: { tables: { 's.c': { update_exists: 'skip', insert_exists: 'apply_remote' } } } });
  await waitFor(async () => (await slotConfirmedLsn(pub, 'keys')) !== null && (await slotConfirmedLsn(pub, 'xkeys')) !== null, { timeoutMs: 30_000, what: 'the slots' });
});

after(async () => {
  for (const r of runners) r.stop();
  for (const r of runners) await r.done.catch(() => undefined);
  await pub?.stop();
  await tgt?.stop();
});

const src = (sql: string) => pub.query(sql, [], 'src');
const dst = (sql: string) => tgt.query(sql, [], 'dst');

async function caughtUp(slot: string): Promise<void> {
  const end = await currentWalLsn(pub, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(pub, slot)) ?? 0n) >= end, {
    timeoutMs: 30_000,
    intervalMs: 100,
    what: `slot ${slot} to confirm ${end} (errors: ${JSON.stringify(errors.slice(-2))})`,
  });
}

const m = () => dst(`SELECT shard, id, v, deleted FROM t.m ORDER BY shard, id`);

test('an UPDATE moving a key onto a soft-deleted key revives it with the new values; the old key is gone; the other shard untouched', async () => {
  await src(`INSERT INTO s.a VALUES (1, 'one'), (2, 'two'), (3, 'three'); INSERT INTO s.b VALUES (1, 'b-one')`);
  await src(`DELETE FROM s.a WHERE id = 1`);
  await src(`UPDATE s.a SET id = 1, v = 'moved' WHERE id = 2`);
  // Moving away onto a fresh key, then deleting the moved row: a tombstone at the new key only.
  await src(`UPDATE s.a SET id = 4 WHERE id = 3`);
  await src(`DELETE FROM s.a WHERE id = 4`);
  await caughtUp('keys');
  assert.deepEqual(await m(), [
    { shard: 'a', id: 1, v: 'moved', deleted: false },
    { shard: 'a', id: 4, v: 'three', deleted: true },
    { shard: 'b', id: 1, v: 'b-one', deleted: false },
  ]);
  assert.deepEqual(errors, []);
});

test('filter + key change + soft delete in one transaction', async () => {
  await src(`BEGIN;
    INSERT INTO s.a VALUES (10, 'ten');
    UPDATE s.a SET id = 2000 WHERE id = 10;          -- out of the filter: a soft delete of (a,10)
    INSERT INTO s.a VALUES (11, 'eleven');
    UPDATE s.a SET id = 10 WHERE id = 11;            -- onto that tombstone: revived with 'eleven'
    UPDATE s.a SET id = 12, v = 'back' WHERE id = 2000; -- into the filter: an INSERT of (a,12)
    DELETE FROM s.a WHERE id = 12;                   -- a tombstone
    UPDATE s.a SET id = 4, v = 'four again' WHERE id = 1; -- onto the tombstone of the first test
    UPDATE s.a SET id = 3000 WHERE id = 4;           -- and out of the filter again
    INSERT INTO s.a VALUES (4, 'reinserted');         -- revived by the INSERT
    COMMIT`);
  await caughtUp('keys');
  assert.deepEqual(
    (await m()).filter((r) => r.shard === 'a'),
    [
      { shard: 'a', id: 4, v: 'reinserted', deleted: false },
      { shard: 'a', id: 10, v: 'eleven', deleted: false },
      { shard: 'a', id: 12, v: 'back', deleted: true },
    ],
  );
  assert.deepEqual(errors, []);
});

test('TRUNCATE of one shard, then a re-insert: only that shard’s rows go, the re-insert lands', async () => {
  await src(`INSERT INTO s.b VALUES (2, 'b-two'), (3, 'b-three'); DELETE FROM s.b WHERE id = 3`);
  await src(`TRUNCATE s.b`);
  await src(`INSERT INTO s.b VALUES (1, 'b-again'), (3, 'b-three again')`);
  await src(`UPDATE s.b SET id = 2 WHERE id = 3`);
  await caughtUp('keys');
  assert.deepEqual(
    (await m()).filter((r) => r.shard === 'b'),
    [
      { shard: 'b', id: 1, v: 'b-again', deleted: false },
      { shard: 'b', id: 2, v: 'b-three again', deleted: false },
    ],
  );
  assert.equal((await m()).filter((r) => r.shard === 'a').length, 3);
  assert.deepEqual(errors, []);
});

test('a cross-shard collision (unique index without the discriminator) is a conflict under the policy, never a retry loop', async () => {
  await src(`INSERT INTO s.c VALUES (1, 'c-one'), (5, 'c-five'); INSERT INTO s.d VALUES (2, 'd-two'), (3, 'd-three'), (4, 'd-four')`);
  await src(`DELETE FROM s.d WHERE id IN (2, 4)`);
  // Onto d's tombstone (2) and d's live row (3): update_exists, skipped (the policy).
  await src(`UPDATE s.c SET id = 2 WHERE id = 1`);
  await src(`UPDATE s.c SET id = 3, v = 'c-three' WHERE id = 5`);
  // An INSERT onto d's tombstone (4): insert_exists, apply_remote (the row becomes c's, live).
  await src(`INSERT INTO s.c VALUES (4, 'c-four')`);
  await src(`INSERT INTO s.c VALUES (7, 'after')`);
  await caughtUp('xkeys');
  assert.deepEqual(await dst(`SELECT shard, id, v, deleted FROM t.x ORDER BY id`), [
    { shard: 'c', id: 1, v: 'c-one', deleted: false },
    { shard: 'd', id: 2, v: 'd-two', deleted: true },
    { shard: 'd', id: 3, v: 'd-three', deleted: false },
    { shard: 'c', id: 4, v: 'c-four', deleted: false },
    { shard: 'c', id: 5, v: 'c-five', deleted: false },
    { shard: 'c', id: 7, v: 'after', deleted: false },
  ]);
  assert.deepEqual(await dst(`SELECT conflict_type, policy FROM pgsub.conflict_log WHERE subscription = 'xkeys' ORDER BY id`), [
    { conflict_type: 'update_exists', policy: 'skip' },
    { conflict_type: 'update_exists', policy: 'skip' },
    { conflict_type: 'insert_exists', policy: 'apply_remote' },
  ]);
  assert.deepEqual(errors, []);
});
