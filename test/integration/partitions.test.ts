/**
 * Partitioned tables end to end, PG18 → PG18. The publisher's tables are partitioned by
 * range (two partitions each), one with a primary key and one with REPLICA IDENTITY FULL
 * and duplicate rows. Three subscriptions of the same publisher, three target databases:
 *  (a) publish_via_partition_root = true into tables partitioned differently (by hash);
 *  (b) publish_via_partition_root = true into plain tables — which also have an
 *      inheritance child the publisher never heard of: like native, apply writes only the
 *      named table (UPDATE/DELETE/TRUNCATE ONLY), never the child's rows;
 *  (c) publish_via_partition_root = false into the same leaf partitions (native requires
 *      the target to have tables named as the publisher's leaves).
 * The workload moves rows between partitions on the publisher and truncates the
 * partitioned root; every target must equal the source.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, tableChecksum, waitFor, type Cluster } from '../harness/index.js';

const RANGE_PARTITIONED = `
  CREATE SCHEMA pt;
  CREATE TABLE pt.m (id int, day date, v text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
  CREATE TABLE pt.m_2024 PARTITION OF pt.m FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
  CREATE TABLE pt.m_2025 PARTITION OF pt.m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
  CREATE TABLE pt.f (k int, day date, note text) PARTITION BY RANGE (day);
  CREATE TABLE pt.f_2024 PARTITION OF pt.f FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
  CREATE TABLE pt.f_2025 PARTITION OF pt.f FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
  ALTER TABLE pt.f REPLICA IDENTITY FULL;
  ALTER TABLE pt.f_2024 REPLICA IDENTITY FULL;
  ALTER TABLE pt.f_2025 REPLICA IDENTITY FULL;
`;
const PUBLICATIONS = `
  CREATE PUBLICATION pub_root FOR TABLE pt.m, pt.f WITH (publish_via_partition_root = true);
  CREATE PUBLICATION pub_leaf FOR TABLE pt.m, pt.f WITH (publish_via_partition_root = false);
`;
// (a) Other partitioning: by hash of another column, three partitions. Rows that are the
// first in their partitions share a ctid, which a FULL-identity lookup must not confuse.
const HASH_PARTITIONED = `
  CREATE SCHEMA pt;
  CREATE TABLE pt.m (id int, day date, v text, PRIMARY KEY (id, day)) PARTITION BY HASH (id);
  CREATE TABLE pt.m_h0 PARTITION OF pt.m FOR VALUES WITH (MODULUS 3, REMAINDER 0);
  CREATE TABLE pt.m_h1 PARTITION OF pt.m FOR VALUES WITH (MODULUS 3, REMAINDER 1);
  CREATE TABLE pt.m_h2 PARTITION OF pt.m FOR VALUES WITH (MODULUS 3, REMAINDER 2);
  CREATE TABLE pt.f (k int, day date, note text) PARTITION BY HASH (k);
  CREATE TABLE pt.f_h0 PARTITION OF pt.f FOR VALUES WITH (MODULUS 2, REMAINDER 0);
  CREATE TABLE pt.f_h1 PARTITION OF pt.f FOR VALUES WITH (MODULUS 2, REMAINDER 1);
`;
// (b) Plain tables, each with an inheritance child holding rows with the same keys.
const PLAIN = `
  CREATE SCHEMA pt;
  CREATE TABLE pt.m (id int, day date, v text, PRIMARY KEY (id, day));
  CREATE TABLE pt.f (k int, day date, note text);
  CREATE TABLE pt.m_local () INHERITS (pt.m);
  CREATE TABLE pt.f_local () INHERITS (pt.f);
  INSERT INTO pt.m_local SELECT g, DATE '2024-01-01' + g * 3, 'local' FROM generate_series(1, 40) g;
  INSERT INTO pt.f_local VALUES (3, '2024-02-01', 'dup'), (3, '2024-02-01', 'dup');
`;
const TARGETS = [
  { db: 'dst_a', schema: HASH_PARTITIONED, publication: 'pub_root' },
  { db: 'dst_b', schema: PLAIN, publication: 'pub_root' },
  { db: 'dst_c', schema: RANGE_PARTITIONED, publication: 'pub_leaf' },
] as const;

let publisher: Cluster;
let target: Cluster;
const runners: Runner[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'part-pub18' }), startCluster({ major: 18, name: 'part-tgt18' })]);
  await publisher.createDatabase('src');
  await publisher.query(RANGE_PARTITIONED + PUBLICATIONS, [], 'src');
  for (const t of TARGETS) {
    await target.createDatabase(t.db);
    await target.query(t.schema, [], t.db);
    const config = loadConfig({
      env: {},
      overrides: { subscription: `part_${t.db}`, source: publisher.url('src'), target: target.url(t.db), publication: t.publication, copy_data: false, status_interval: 1 },
    });
    runners.push(startRunner(config, createLogger('warn')));
  }
  await waitFor(async () => (await Promise.all(TARGETS.map((t) => slotConfirmedLsn(publisher, `part_${t.db}`)))).every((l) => l !== null), {
    timeoutMs: 30_000,
    what: 'three slots',
  });
});

after(async () => {
  for (const r of runners) r.stop();
  await Promise.all(runners.map((r) => r.done.catch(() => undefined)));
  await publisher?.stop();
  await target?.stop();
});

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  for (const t of TARGETS) {
    const slot = `part_${t.db}`;
    await waitFor(async () => ((await slotConfirmedLsn(publisher, slot)) ?? 0n) >= end, { timeoutMs: 30_000, intervalMs: 100, what: `${slot} to confirm ${end}` });
  }
}

/** Every target equals the source; in (b) only the named table counts (ONLY), its child is separate. */
async function assertTargetsEqualSource(): Promise<void> {
  for (const [table, columns] of [
    ['pt.m', 'id, day, v'],
    ['pt.f', 'k, day, note'],
  ] as const) {
    const s = await tableChecksum(publisher, 'src', table, columns);
    for (const t of TARGETS) {
      const d = await tableChecksum(target, t.db, t.db === 'dst_b' ? `ONLY ${table}` : table, columns);
      assert.deepEqual({ rows: d.rows, md5: d.md5 }, { rows: s.rows, md5: s.md5 }, `${table} in ${t.db}`);
    }
  }
}

test('inserts, updates, moves between partitions, deletes; FULL identity with duplicates across partitions', async () => {
  await publisher.query(
    `INSERT INTO pt.m SELECT g, DATE '2024-01-01' + g * 3, 'v' || g FROM generate_series(1, 200) g;
     INSERT INTO pt.f VALUES (3, '2024-02-01', 'dup'), (2, '2024-02-01', 'dup'), (2, '2024-02-01', 'dup'),
                             (1, '2025-03-01', NULL), (4, '2025-03-01', 'x');`,
    [],
    'src',
  );
  await caughtUp();
  await assertTargetsEqualSource();
  const parts = await target.query(`SELECT k, tableoid::regclass::text AS part, ctid::text AS ctid FROM pt.f WHERE k IN (2, 3) ORDER BY k, ctid`, [], 'dst_a');
  assert.deepEqual(
    parts.map((r) => [r.k, r.part, r.ctid]),
    [
      [2, 'pt.f_h0', '(0,1)'],
      [2, 'pt.f_h0', '(0,2)'],
      [3, 'pt.f_h1', '(0,1)'],
    ],
    'same ctid in two partitions',
  );
  // A ctid names a row only within one partition: `ctid = (SELECT ctid …)` on a partitioned
  // table would hit a row in every partition, so one of the two identical rows is (tableoid, ctid).
  await publisher.query(
    `UPDATE pt.m SET v = v || '!' WHERE id % 5 = 0;
     UPDATE pt.m SET day = day + 365 WHERE id BETWEEN 1 AND 30 AND day < '2025-01-01';
     UPDATE pt.m SET day = day - 200, v = 'back' WHERE id BETWEEN 150 AND 160;
     DELETE FROM pt.m WHERE id % 13 = 0;
     DELETE FROM pt.f WHERE k = 3;
     UPDATE pt.f SET note = 'one of two' WHERE (tableoid, ctid) = (SELECT tableoid, ctid FROM pt.f WHERE k = 2 LIMIT 1);
     UPDATE pt.f SET day = '2024-06-30' WHERE k = 1;
     UPDATE pt.f SET k = 5 WHERE k = 4;`,
    [],
    'src',
  );
  await caughtUp();
  await assertTargetsEqualSource();
  const [moved] = await publisher.query(`SELECT count(*)::int AS n FROM pt.m_2025 WHERE id <= 30`, [], 'src');
  assert.ok(moved.n > 0, 'some rows moved partitions on the publisher');
  // (a): (3, dup) and (2, dup) are the first rows of their hash partitions; deleting the one
  // must not delete the other through an equal ctid.
  const a = await target.query(`SELECT k, note, tableoid::regclass::text AS part FROM pt.f ORDER BY k, note`, [], 'dst_a');
  assert.deepEqual(
    a.map((r) => [r.k, r.note]),
    [
      [1, null],
      [2, 'dup'],
      [2, 'one of two'],
      [5, 'x'],
    ],
  );
  // (b): the inheritance child is untouched.
  const [local] = await target.query(`SELECT count(*)::int AS m, (SELECT count(*)::int FROM pt.f_local) AS f FROM pt.m_local WHERE v = 'local'`, [], 'dst_b');
  assert.deepEqual(local, { m: 40, f: 2 });
  // (c): rows sit in the same leaves as on the publisher.
  for (const leaf of ['pt.m_2024', 'pt.m_2025', 'pt.f_2024', 'pt.f_2025']) {
    const columns = leaf.startsWith('pt.m') ? 'id, day, v' : 'k, day, note';
    assert.deepEqual(await tableChecksum(target, 'dst_c', leaf, columns), await tableChecksum(publisher, 'src', leaf, columns), leaf);
  }
});

test('TRUNCATE of the partitioned root, then more changes', async () => {
  await publisher.query(`TRUNCATE pt.m`, [], 'src');
  await publisher.query(`INSERT INTO pt.m VALUES (1, '2024-05-05', 'after'), (2, '2025-05-05', 'after'); UPDATE pt.m SET day = '2024-07-07' WHERE id = 2;`, [], 'src');
  await caughtUp();
  await assertTargetsEqualSource();
  for (const t of TARGETS) {
    const [n] = await target.query(`SELECT count(*)::int AS n FROM ${t.db === 'dst_b' ? 'ONLY ' : ''}pt.m`, [], t.db);
    assert.equal(n.n, 2, t.db);
  }
  const [local] = await target.query(`SELECT count(*)::int AS n FROM pt.m_local`, [], 'dst_b');
  assert.equal(local.n, 40, 'TRUNCATE of a plain table leaves its inheritance children alone, like native');
});
