/**
 * Replica identity end to end, PG18 → PG18 and PG14 → PG18: how the target finds the row
 * an UPDATE or DELETE means.
 *  - DEFAULT with a composite primary key, including key changes (old key tuple 'K');
 *  - USING INDEX on NOT NULL columns other than the primary key;
 *  - FULL on a table without key holding exact duplicates and NULLs: changing one of two
 *    identical rows on the publisher changes exactly one on the target, NULLs match NULLs;
 *    FULL with json and point columns, types without an equality operator (native fails
 *    such changes with "could not identify an equality operator"; pgsub compares text);
 *  - NOTHING with a publication that publishes inserts only;
 *  - unchanged TOAST values ('u'): an out-of-line value survives updates of other columns
 *    untouched, with DEFAULT and FULL identity, and replicates when it does change;
 *  - update_missing / delete_missing: skipped, counted, and apply goes on.
 * The typed error for an UPDATE/DELETE without identity columns is in test/unit/statements.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, tableChecksum, waitFor, type Cluster } from '../harness/index.js';

const SCHEMA = `
  CREATE SCHEMA idt;
  CREATE TABLE idt.pk2 (region int, id bigint, label text, qty int, PRIMARY KEY (region, id));
  CREATE TABLE idt.byidx (id int PRIMARY KEY, code text NOT NULL, sub int NOT NULL, v text);
  CREATE UNIQUE INDEX byidx_code_sub ON idt.byidx (code, sub);
  ALTER TABLE idt.byidx REPLICA IDENTITY USING INDEX byidx_code_sub;
  CREATE TABLE idt.dups (a int, b text, c numeric);
  ALTER TABLE idt.dups REPLICA IDENTITY FULL;
  CREATE TABLE idt.docs (doc json, pt point, note text);
  ALTER TABLE idt.docs REPLICA IDENTITY FULL;
  CREATE TABLE idt.nothing_t (line text, at int);
  ALTER TABLE idt.nothing_t REPLICA IDENTITY NOTHING;
  CREATE TABLE idt.toast_def (id int PRIMARY KEY, big text, n int);
  CREATE TABLE idt.toast_full (id int, big text, n int);
  ALTER TABLE idt.toast_full REPLICA IDENTITY FULL;
  CREATE TABLE idt.missing (id int PRIMARY KEY, v text);
`;
// Out of line for sure: EXTERNAL means never compressed, always toasted past ~2 kB.
const PUBLISHER_ONLY = `
  ALTER TABLE idt.toast_def ALTER COLUMN big SET STORAGE EXTERNAL;
  ALTER TABLE idt.toast_full ALTER COLUMN big SET STORAGE EXTERNAL;
  CREATE PUBLICATION pub FOR TABLE idt.pk2, idt.byidx, idt.dups, idt.docs, idt.toast_def, idt.toast_full, idt.missing;
  CREATE PUBLICATION pub_ins FOR TABLE idt.nothing_t WITH (publish = 'insert');
`;
const COLUMNS: Record<string, string> = {
  'idt.pk2': 'region, id, label, qty',
  'idt.byidx': 'id, code, sub, v',
  'idt.dups': 'a, b, c',
  'idt.docs': 'doc::text, pt::text, note',
  'idt.nothing_t': 'line, at',
  'idt.toast_def': 'id, big, n',
  'idt.toast_full': 'id, big, n',
  'idt.missing': 'id, v',
};
// ~8 kB of hex: md5 output does not compress, and it is stored EXTERNAL anyway.
const BIG = `(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 256))`;

for (const publisherMajor of [18, 14] as const) {
  describe(`replica identity PG${publisherMajor} → PG18`, () => {
    let publisher: Cluster;
    let target: Cluster;
    let runner: Runner;

    before(async () => {
      [publisher, target] = await Promise.all([startCluster({ major: publisherMajor, name: `ident-pub${publisherMajor}` }), startCluster({ major: 18, name: 'ident-tgt18' })]);
      await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
      await publisher.query(SCHEMA + PUBLISHER_ONLY, [], 'src');
      // The target has the same tables, indexes and identities (native requires the target's
      // identity columns to be among the ones the publisher sends).
      await target.query(SCHEMA, [], 'dst');
      const config = loadConfig({
        env: {},
        overrides: { subscription: 'ident', source: publisher.url('src'), target: target.url('dst'), publication: 'pub,pub_ins', copy_data: false, status_interval: 1 },
      });
      runner = startRunner(config, createLogger('warn'));
      await waitFor(async () => (await slotConfirmedLsn(publisher, 'ident')) !== null, { timeoutMs: 30_000, what: 'the slot' });
    });

    after(async () => {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      await publisher?.stop();
      await target?.stop();
    });

    async function caughtUp(): Promise<void> {
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, 'ident')) ?? 0n) >= end, { timeoutMs: 30_000, intervalMs: 100, what: `slot to confirm ${end}` });
    }

    async function assertSame(table: string): Promise<void> {
      const columns = COLUMNS[table]!;
      const [s, d] = await Promise.all([tableChecksum(publisher, 'src', table, columns), tableChecksum(target, 'dst', table, columns)]);
      assert.deepEqual(d, s, `${table}: target differs from source`);
    }

    test('DEFAULT with a composite primary key: updates, key changes (old key K), deletes', async () => {
      await publisher.query(
        `INSERT INTO idt.pk2 SELECT g % 3, g, 'l' || g, g FROM generate_series(1, 300) g;
         UPDATE idt.pk2 SET label = label || '!', qty = qty * 2 WHERE id % 4 = 0;
         UPDATE idt.pk2 SET id = id + 1000 WHERE id BETWEEN 1 AND 20;
         UPDATE idt.pk2 SET region = region + 10, label = 'moved' WHERE id BETWEEN 21 AND 30;
         DELETE FROM idt.pk2 WHERE id % 7 = 0;
         BEGIN; UPDATE idt.pk2 SET id = -id WHERE id = 1003; UPDATE idt.pk2 SET id = 1003 WHERE id = 1004; UPDATE idt.pk2 SET id = 1004 WHERE id = -1003; COMMIT;`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.pk2');
      const [moved] = await target.query(`SELECT count(*)::int AS n FROM idt.pk2 WHERE region >= 10 AND label = 'moved'`, [], 'dst');
      assert.equal(moved.n, 8, 'ids 21..30 but the deleted 21 and 28 moved to regions 10..12');
    });

    test('USING INDEX: rows found by a unique index on NOT NULL columns other than the primary key', async () => {
      await publisher.query(
        `INSERT INTO idt.byidx SELECT g, 'c' || (g % 10), g, 'v' || g FROM generate_series(1, 200) g;
         UPDATE idt.byidx SET v = 'changed' WHERE sub % 3 = 0;
         UPDATE idt.byidx SET code = 'recoded', sub = sub + 1000 WHERE id BETWEEN 1 AND 15;
         UPDATE idt.byidx SET id = id + 5000 WHERE id BETWEEN 16 AND 25;
         DELETE FROM idt.byidx WHERE sub % 11 = 0;`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.byidx');
      const [recoded] = await target.query(`SELECT count(*)::int AS n FROM idt.byidx WHERE code = 'recoded'`, [], 'dst');
      assert.equal(recoded.n, 13, 'ids 1..15 recoded, less subs 1001 and 1012 deleted');
    });

    test('FULL without key: one of two identical rows changes, exactly one on the target; NULLs match NULLs', async () => {
      await publisher.query(
        `INSERT INTO idt.dups VALUES (1, 'x', NULL), (1, 'x', NULL), (1, 'x', 1.5), (1, 'x', 1.5), (NULL, NULL, NULL), (NULL, NULL, NULL), (2, 'y', 2), (3, NULL, 3.25);`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.dups');
      // ctid picks one of each identical pair on the publisher; pgoutput sends the whole old row.
      await publisher.query(
        `UPDATE idt.dups SET c = 99 WHERE ctid = (SELECT ctid FROM idt.dups WHERE a = 1 AND c IS NULL LIMIT 1);
         DELETE FROM idt.dups WHERE ctid = (SELECT ctid FROM idt.dups WHERE a IS NULL AND b IS NULL AND c IS NULL LIMIT 1);
         UPDATE idt.dups SET b = 'z' WHERE ctid = (SELECT ctid FROM idt.dups WHERE c = 1.5 LIMIT 1);
         UPDATE idt.dups SET a = 4 WHERE a = 3 AND b IS NULL;
         DELETE FROM idt.dups WHERE a = 2;`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.dups');
      const rows = await target.query<{ r: string; n: number }>(`SELECT ROW(a, b, c)::text AS r, count(*)::int AS n FROM idt.dups GROUP BY 1 ORDER BY 1`, [], 'dst');
      assert.deepEqual(
        rows.map((x) => [x.r, x.n]),
        [
          ['(,,)', 1],
          ['(1,x,)', 1],
          ['(1,x,1.5)', 1],
          ['(1,x,99)', 1],
          ['(1,z,1.5)', 1],
          ['(4,,3.25)', 1],
        ],
      );
    });

    test('FULL with json and point columns (no equality operator): compared by text, one row at a time', async () => {
      await publisher.query(
        `INSERT INTO idt.docs VALUES ('{"a":  1, "b": [1, 2]}', '(1,2)', 'one'), ('{"a":  1, "b": [1, 2]}', '(1,2)', 'one'),
           ('{"a": 1}', '(1.5,-2.25)', 'two'), (NULL, NULL, 'three'), ('[]', NULL, NULL);`,
        [],
        'src',
      );
      await caughtUp();
      await publisher.query(
        `UPDATE idt.docs SET note = 'one changed' WHERE ctid = (SELECT ctid FROM idt.docs WHERE note = 'one' LIMIT 1);
         UPDATE idt.docs SET pt = '(3,4)', doc = '{"c": "ü"}' WHERE note = 'two';
         UPDATE idt.docs SET note = 'three changed' WHERE note = 'three';
         DELETE FROM idt.docs WHERE doc::text = '[]';`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.docs');
      const rows = await target.query(`SELECT doc::text AS doc, pt::text AS pt, note FROM idt.docs ORDER BY note`, [], 'dst');
      assert.deepEqual(
        rows.map((r) => [r.doc, r.pt, r.note]),
        [
          ['{"a":  1, "b": [1, 2]}', '(1,2)', 'one'],
          ['{"a":  1, "b": [1, 2]}', '(1,2)', 'one changed'],
          [null, null, 'three changed'],
          ['{"c": "ü"}', '(3,4)', 'two'],
        ],
      );
    });

    test('NOTHING with publish = insert: inserts replicate; updates and deletes are not published', async () => {
      await publisher.query(`INSERT INTO idt.nothing_t SELECT 'line ' || g, g FROM generate_series(1, 50) g;`, [], 'src');
      await caughtUp();
      await assertSame('idt.nothing_t');
      // Allowed on the publisher because this publication does not publish updates/deletes.
      await publisher.query(`UPDATE idt.nothing_t SET at = -at WHERE at <= 10; DELETE FROM idt.nothing_t WHERE at > 40; INSERT INTO idt.nothing_t VALUES ('after', 0);`, [], 'src');
      await caughtUp();
      const [t] = await target.query(
        `SELECT count(*)::int AS n, count(*) FILTER (WHERE at < 0)::int AS neg, count(*) FILTER (WHERE line = 'after')::int AS after FROM idt.nothing_t`,
        [],
        'dst',
      );
      assert.deepEqual(t, { n: 51, neg: 0, after: 1 });
    });

    test('unchanged TOAST: an out-of-line value is kept as is when other columns change (DEFAULT and FULL)', async () => {
      await publisher.query(
        `INSERT INTO idt.toast_def SELECT g, ${BIG}, g FROM generate_series(1, 5) g;
         INSERT INTO idt.toast_full SELECT g, ${BIG}, g FROM generate_series(1, 5) g;`,
        [],
        'src',
      );
      // The values really live in the TOAST tables (so updates send them as 'u').
      for (const table of ['toast_def', 'toast_full']) {
        const [toast] = await publisher.query(`SELECT reltoastrelid::regclass::text AS t FROM pg_class WHERE oid = 'idt.${table}'::regclass`, [], 'src');
        const [chunks] = await publisher.query(`SELECT count(DISTINCT chunk_id)::int AS n FROM ${toast.t}`, [], 'src');
        assert.equal(chunks.n, 5, `${table} values stored out of line`);
      }
      await caughtUp();
      const before = await target.query(`SELECT id, md5(big) AS h FROM idt.toast_def ORDER BY id`, [], 'dst');
      await publisher.query(
        `UPDATE idt.toast_def SET n = n + 100;
         UPDATE idt.toast_full SET n = n + 100 WHERE id <= 3;
         UPDATE idt.toast_def SET big = ${BIG} WHERE id = 5;
         UPDATE idt.toast_full SET big = big || 'tail', n = -1 WHERE id = 4;`,
        [],
        'src',
      );
      await caughtUp();
      await assertSame('idt.toast_def');
      await assertSame('idt.toast_full');
      const after = await target.query(`SELECT id, md5(big) AS h, n, length(big) AS len FROM idt.toast_def ORDER BY id`, [], 'dst');
      assert.deepEqual(
        after.slice(0, 4).map((r) => r.h),
        before.slice(0, 4).map((r) => r.h),
        'untouched values kept',
      );
      assert.notEqual(after[4].h, before[4].h, 'a changed toasted value replicates');
      assert.deepEqual(
        after.map((r) => [r.n, r.len]),
        [
          [101, 8192],
          [102, 8192],
          [103, 8192],
          [104, 8192],
          [105, 8192],
        ],
      );
      const [full] = await target.query(`SELECT length(big) AS len, n FROM idt.toast_full WHERE id = 4`, [], 'dst');
      assert.deepEqual(full, { len: 8196, n: -1 });
    });

    test('update_missing / delete_missing: the change is skipped and counted, apply goes on', async () => {
      await publisher.query(`INSERT INTO idt.missing VALUES (1, 'a'), (2, 'b'), (3, 'c');`, [], 'src');
      await caughtUp();
      await target.query(`DELETE FROM idt.missing WHERE id IN (2, 3)`, [], 'dst');
      const updateMissing = runner.counters.updateMissing;
      const deleteMissing = runner.counters.deleteMissing;
      await publisher.query(
        `BEGIN; UPDATE idt.missing SET v = 'b2' WHERE id = 2; DELETE FROM idt.missing WHERE id = 3; UPDATE idt.missing SET v = 'a2' WHERE id = 1; INSERT INTO idt.missing VALUES (4, 'd'); COMMIT;`,
        [],
        'src',
      );
      await publisher.query(`INSERT INTO idt.missing VALUES (5, 'e');`, [], 'src');
      await caughtUp();
      assert.equal(runner.counters.updateMissing - updateMissing, 1);
      assert.equal(runner.counters.deleteMissing - deleteMissing, 1);
      const rows = await target.query(`SELECT id, v FROM idt.missing ORDER BY id`, [], 'dst');
      assert.deepEqual(
        rows.map((r) => [r.id, r.v]),
        [
          [1, 'a2'],
          [4, 'd'],
          [5, 'e'],
        ],
      );
    });
  });
}
