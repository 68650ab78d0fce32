/**
 * Schema changes while streaming, PG18 → PG18. Relation messages arrive mid-stream and
 * the relation map follows them: ADD COLUMN, DROP COLUMN, RENAME COLUMN and a type
 * change (int → bigint, with values only bigint holds) done on both sides replicate
 * without a single apply error. A column added on the publisher only stops apply with
 * PGSUB_SCHEMA_MISMATCH naming table and column: nothing of that transaction is
 * committed, neither the origin in the target nor the slot moves past it, later
 * transactions wait behind it; once the column exists on the target, apply resumes by
 * itself and the data converges. Generated columns: a target-only STORED generated
 * column is computed by the target, and PG18's publish_generated_columns = stored fills
 * a plain target column.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, lsnToBigint, slotConfirmedLsn, startCluster, tableChecksum, waitFor, type Cluster } from '../harness/index.js';

const COMMON = `
  CREATE SCHEMA sc;
  CREATE TABLE sc.t (id int PRIMARY KEY, a text);
  CREATE TABLE sc.other (id int PRIMARY KEY, note text);
`;
const PUBLISHER = `${COMMON}
  CREATE TABLE sc.gen_tgt (id int PRIMARY KEY, price int, qty int);
  CREATE TABLE sc.gen_pub (id int PRIMARY KEY, a int, doubled int GENERATED ALWAYS AS (a * 2) STORED);
  CREATE TABLE sc.gen_both (id int PRIMARY KEY, a int, b int);
  CREATE PUBLICATION pub FOR TABLE sc.t, sc.other, sc.gen_tgt, sc.gen_both;
  CREATE PUBLICATION pub_gen FOR TABLE sc.gen_pub WITH (publish_generated_columns = stored);
`;
const TARGET = `${COMMON}
  CREATE TABLE sc.gen_tgt (id int PRIMARY KEY, price int, qty int, total int GENERATED ALWAYS AS (price * qty) STORED);
  CREATE TABLE sc.gen_pub (id int PRIMARY KEY, a int, doubled int);
  CREATE TABLE sc.gen_both (id int PRIMARY KEY, a int, b int GENERATED ALWAYS AS (a + 1) STORED);
`;

interface LogLine {
  level: number;
  msg: string;
  err?: { code?: string; message?: string; type?: string; relation?: string; column?: string; stack?: string };
}

let publisher: Cluster;
let target: Cluster;
let runner: Runner;
const logs: LogLine[] = [];
const errors = () => logs.filter((l) => l.level >= 50);

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'schema-pub18' }), startCluster({ major: 18, name: 'schema-tgt18' })]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
  await publisher.query(PUBLISHER, [], 'src');
  await target.query(TARGET, [], 'dst');
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: 'sc',
      source: publisher.url('src'),
      target: target.url('dst'),
      publication: 'pub,pub_gen',
      copy_data: false,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
    },
  });
  const destination = { write: (line: string) => void logs.push(JSON.parse(line) as LogLine) };
  runner = startRunner(config, createLogger('warn', destination));
  await waitFor(async () => (await slotConfirmedLsn(publisher, 'sc')) !== null, { timeoutMs: 30_000, what: 'the slot' });
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await publisher?.stop();
  await target?.stop();
});

async function caughtUp(timeoutMs = 30_000): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, 'sc')) ?? 0n) >= end, { timeoutMs, intervalMs: 100, what: `slot to confirm ${end}` });
}

async function assertSame(table: string, columns: string): Promise<void> {
  const [s, d] = await Promise.all([tableChecksum(publisher, 'src', table, columns), tableChecksum(target, 'dst', table, columns)]);
  assert.deepEqual(d, s, `${table} (${columns})`);
}

async function originLsn(): Promise<bigint> {
  const [row] = await target.query(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'sc'`, [], 'dst');
  return lsnToBigint(row.lsn);
}

test('ADD, DROP, RENAME COLUMN and int → bigint on both sides replicate, without an apply error', async () => {
  await publisher.query(`INSERT INTO sc.t SELECT g, 'a' || g FROM generate_series(1, 20) g;`, [], 'src');
  await caughtUp();

  // ADD COLUMN: target first (until the publisher has it too, it takes its default).
  await target.query(`ALTER TABLE sc.t ADD COLUMN b int`, [], 'dst');
  await publisher.query(`INSERT INTO sc.t VALUES (21, 'before b');`, [], 'src');
  await publisher.query(
    `ALTER TABLE sc.t ADD COLUMN b int; INSERT INTO sc.t SELECT g, 'with b', g * 10 FROM generate_series(22, 40) g; UPDATE sc.t SET b = -id WHERE id <= 5;`,
    [],
    'src',
  );
  await caughtUp();
  await assertSame('sc.t', 'id, a, b');

  // DROP COLUMN: publisher first; the target's column meanwhile gets NULL for new rows.
  await publisher.query(`ALTER TABLE sc.t DROP COLUMN a; INSERT INTO sc.t VALUES (41, 41); UPDATE sc.t SET b = b + 1 WHERE id BETWEEN 30 AND 35;`, [], 'src');
  await caughtUp();
  const [dropped] = await target.query(`SELECT a FROM sc.t WHERE id = 41`, [], 'dst');
  assert.equal(dropped.a, null);
  await target.query(`ALTER TABLE sc.t DROP COLUMN a`, [], 'dst');
  await publisher.query(`INSERT INTO sc.t VALUES (42, 42); DELETE FROM sc.t WHERE id = 1;`, [], 'src');
  await caughtUp();
  await assertSame('sc.t', 'id, b');

  // RENAME COLUMN on both, then changes under the new name.
  await target.query(`ALTER TABLE sc.t RENAME COLUMN b TO c`, [], 'dst');
  await publisher.query(`ALTER TABLE sc.t RENAME COLUMN b TO c`, [], 'src');
  await publisher.query(`INSERT INTO sc.t VALUES (43, 43), (44, NULL); UPDATE sc.t SET c = c * 2 WHERE id BETWEEN 10 AND 12;`, [], 'src');
  await caughtUp();
  await assertSame('sc.t', 'id, c');

  // int → bigint on both; the values that follow only fit a bigint. The apply session's
  // prepared INSERT/UPDATE from before must not keep parsing them as int4.
  await target.query(`ALTER TABLE sc.t ALTER COLUMN c TYPE bigint`, [], 'dst');
  await publisher.query(`ALTER TABLE sc.t ALTER COLUMN c TYPE bigint`, [], 'src');
  await publisher.query(`INSERT INTO sc.t VALUES (45, 3000000000); UPDATE sc.t SET c = 5000000000 + id WHERE id BETWEEN 2 AND 4; DELETE FROM sc.t WHERE id = 45;`, [], 'src');
  await publisher.query(`INSERT INTO sc.t VALUES (46, -9000000000000);`, [], 'src');
  await caughtUp();
  await assertSame('sc.t', 'id, c');
  const [big] = await target.query(`SELECT c::text AS c FROM sc.t WHERE id = 46`, [], 'dst');
  assert.equal(big.c, '-9000000000000');
  assert.deepEqual(errors(), [], 'no apply error on the way');
});

test('a column only the publisher has: apply stops before the transaction, commits none of it, resumes once the target has it', async () => {
  const errorsBefore = errors().length;
  const before = await originLsn();
  // A transaction whose first statements are fine for the target; the ALTER makes
  // pgoutput send a new Relation message for sc.t in the middle of it.
  await publisher.query(
    `BEGIN;
     INSERT INTO sc.other VALUES (1, 'first in the transaction');
     INSERT INTO sc.t VALUES (100, 100);
     UPDATE sc.t SET c = 0 WHERE id = 2;
     ALTER TABLE sc.t ADD COLUMN extra text;
     INSERT INTO sc.t VALUES (101, 101, 'needs extra');
     COMMIT;`,
    [],
    'src',
  );
  const commitEnd = await currentWalLsn(publisher, 'src');
  // A later transaction waits behind the failed one.
  await publisher.query(`INSERT INTO sc.other VALUES (2, 'later');`, [], 'src');

  await waitFor(() => errors().length >= errorsBefore + 2, { timeoutMs: 20_000, what: 'apply to fail (and be retried)' });
  const mismatch = errors().slice(errorsBefore);
  for (const e of mismatch) {
    assert.equal(e.err?.code, 'PGSUB_SCHEMA_MISMATCH', JSON.stringify(e));
    assert.match(e.err?.message ?? '', /"sc\.t" is missing replicated column: "extra"/);
    assert.equal(e.err?.relation, 'sc.t');
    assert.equal(e.err?.column, 'extra');
    // The class and where it was thrown, on the same one line.
    assert.equal(e.err?.type, 'SchemaMismatchError', JSON.stringify(e));
    assert.match(e.err?.stack ?? '', /^SchemaMismatchError: .*\n +at /);
  }
  // Nothing of the transaction, nor of the later one, is in the target; no position moved past it.
  const other = await target.query(`SELECT id FROM sc.other ORDER BY id`, [], 'dst');
  assert.deepEqual(other, []);
  const t = await target.query(`SELECT id, c::text AS c FROM sc.t WHERE id IN (2, 100, 101) ORDER BY id`, [], 'dst');
  assert.deepEqual(
    t.map((r) => [r.id, r.c]),
    [[2, '5000000002']],
  );
  const origin = await originLsn();
  const confirmed = (await slotConfirmedLsn(publisher, 'sc'))!;
  assert.ok(origin >= before && origin < commitEnd, `origin ${origin} must stay below the commit end ${commitEnd}`);
  assert.ok(confirmed <= origin, `slot confirmed ${confirmed} beyond origin ${origin}`);

  await target.query(`ALTER TABLE sc.t ADD COLUMN extra text`, [], 'dst');
  await caughtUp();
  await assertSame('sc.t', 'id, c, extra');
  await assertSame('sc.other', 'id, note');
  const [row] = await target.query(`SELECT extra FROM sc.t WHERE id = 101`, [], 'dst');
  assert.equal(row.extra, 'needs extra');
});

test('generated columns: a target-only one is computed there; publish_generated_columns = stored fills a plain column', async () => {
  await publisher.query(
    `INSERT INTO sc.gen_tgt SELECT g, g, 3 FROM generate_series(1, 10) g;
     UPDATE sc.gen_tgt SET price = price + 100 WHERE id <= 3;
     INSERT INTO sc.gen_pub (id, a) SELECT g, g * 7 FROM generate_series(1, 10) g;
     UPDATE sc.gen_pub SET a = -a WHERE id % 2 = 0;
     DELETE FROM sc.gen_pub WHERE id = 10;`,
    [],
    'src',
  );
  await caughtUp();
  await assertSame('sc.gen_tgt', 'id, price, qty');
  const [totals] = await target.query(`SELECT count(*)::int AS n, count(*) FILTER (WHERE total = price * qty)::int AS ok, sum(total)::int AS sum FROM sc.gen_tgt`, [], 'dst');
  assert.deepEqual(totals, { n: 10, ok: 10, sum: (55 + 300) * 3 });
  // The publisher sent its generated values (PG18); the target stored them as plain data.
  await assertSame('sc.gen_pub', 'id, a, doubled');
  const [doubled] = await target.query(`SELECT count(*)::int AS n, count(*) FILTER (WHERE doubled = a * 2)::int AS ok FROM sc.gen_pub`, [], 'dst');
  assert.deepEqual(doubled, { n: 9, ok: 9 });
});

test('a published column that is generated on the target: a schema mismatch naming it, until the target makes it plain', async () => {
  const errorsBefore = errors().length;
  await publisher.query(`INSERT INTO sc.gen_both VALUES (1, 10, 500)`, [], 'src');
  await waitFor(() => errors().length > errorsBefore, { timeoutMs: 20_000, what: 'apply to fail' });
  const [e] = errors().slice(errorsBefore);
  assert.equal(e!.err?.code, 'PGSUB_SCHEMA_MISMATCH', JSON.stringify(e));
  assert.match(e!.err?.message ?? '', /"sc\.gen_both" has incompatible generated column: "b"/);
  assert.equal(e!.err?.column, 'b');
  assert.deepEqual(await target.query(`SELECT id FROM sc.gen_both`, [], 'dst'), []);
  await target.query(`ALTER TABLE sc.gen_both ALTER COLUMN b DROP EXPRESSION`, [], 'dst');
  await caughtUp();
  await assertSame('sc.gen_both', 'id, a, b');
});
