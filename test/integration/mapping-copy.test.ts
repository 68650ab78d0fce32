/**
 * The initial copy of many-to-one tables (docs/mapping.md "Initial copy"), PG14 publisher →
 * PG18 target, binary: two shards copied in parallel into one target table, each row with
 * its shard's discriminator value; a row of a third source already in the table neither
 * blocks the copies (the emptiness check is the shard's rows) nor is touched; then
 * `pgsub resync` of one shard deletes and copies only that shard's rows while the other
 * keeps streaming, and both stream afterwards.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const ROWS = 20_000;
const PUBLISHER = `
  CREATE SCHEMA s;
  CREATE TABLE s.a (id int PRIMARY KEY, v text, n int);
  CREATE TABLE s.b (id int PRIMARY KEY, v text, n int);
  INSERT INTO s.a SELECT g, 'a' || g, g FROM generate_series(1, ${ROWS}) g;
  INSERT INTO s.b SELECT g, 'b' || g, g FROM generate_series(1, ${ROWS}) g;
  CREATE PUBLICATION pub FOR TABLE s.a, s.b;
`;
const TARGET = `
  CREATE SCHEMA t;
  CREATE TABLE t.m (shard text NOT NULL, id int NOT NULL, v text, n2 int, PRIMARY KEY (shard, id));
  INSERT INTO t.m VALUES ('other', 1, 'kept', 0);
`;
const MAPPING = {
  tables: {
    's.a': { target: 't.m', discriminator: { column: 'shard', value: 'a' }, columns: { n: null }, computed: { n2: 'n * 2' } },
    's.b': { target: 't.m', discriminator: { column: 'shard', value: 'b' }, columns: { n: null }, computed: { n2: 'n * 2' } },
  },
};

let pub: Cluster;
let tgt: Cluster;
let runner: Runner | undefined;
const lines: { msg: string; table?: string; level: number; err?: unknown }[] = [];

before(async () => {
  [pub, tgt] = await Promise.all([startCluster({ major: 14, name: 'mcopy-pub14' }), startCluster({ major: 18, name: 'mcopy-tgt18' })]);
  await Promise.all([pub.createDatabase('src'), tgt.createDatabase('dst')]);
  await pub.query(PUBLISHER, [], 'src');
  await tgt.query(TARGET, [], 'dst');
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await pub?.stop();
  await tgt?.stop();
});

const dst = (sql: string) => tgt.query(sql, [], 'dst');
const summary = () => dst(`SELECT shard, count(*)::int AS c, sum(n2)::int8::text AS s, count(*) FILTER (WHERE v = shard || id)::int AS ok FROM t.m GROUP BY 1 ORDER BY 1`);
const expected = (extraA = 0, extraB = 0) => [
  { shard: 'a', c: ROWS + extraA, s: String(ROWS * (ROWS + 1) + extraA * 2 * (ROWS + 1)), ok: ROWS + extraA },
  { shard: 'b', c: ROWS + extraB, s: String(ROWS * (ROWS + 1) + extraB * 2 * (ROWS + 1)), ok: ROWS + extraB },
  { shard: 'other', c: 1, s: '0', ok: 0 },
];

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(pub, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(pub, 'mc')) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: `the slot to confirm ${end}` });
}

const ready = async () => (await dst(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = 'mc' AND state = 'r'`))[0]!.n as number;

test('two shards copied in parallel into one table, each with its discriminator; a third source’s row kept', async () => {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: 'mc',
      source: pub.url('src'),
      target: tgt.url('dst'),
      publication: 'pub',
      copy_data: true,
      binary: true,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      mapping: MAPPING,
    },
  });
  runner = startRunner(
    config,
    createLogger('info', {
      write: (line: string) => {
        lines.push(JSON.parse(line));
        if (process.env.MAPDEBUG) console.error(line);
      },
    }),
  );
  await waitFor(async () => (await ready()) === 2, { timeoutMs: 90_000, what: 'both shards copied' });
  assert.deepEqual(await summary(), expected());
  // In parallel: both copies started before either finished.
  const events = lines.filter((l) => l.msg === 'table copy started' || l.msg === 'table copy finished').map((l) => `${l.msg === 'table copy started' ? '+' : '-'}${l.table}`);
  assert.deepEqual(events.slice(0, 2).sort(), ['+s.a', '+s.b'], events.join(' '));
  assert.deepEqual(await dst(`SELECT rows_copied::int AS r FROM pgsub.subscription_rel WHERE subscription = 'mc' ORDER BY table_name`), [{ r: ROWS }, { r: ROWS }]);
  await pub.query(`INSERT INTO s.a VALUES (${ROWS + 1}, 'a${ROWS + 1}', ${ROWS + 1}); INSERT INTO s.b VALUES (${ROWS + 1}, 'b${ROWS + 1}', ${ROWS + 1})`, [], 'src');
  await caughtUp();
  assert.deepEqual(await summary(), expected(1, 1));
});

test('pgsub resync of one shard copies only its rows again while the other streams', async () => {
  // A stray row of shard a on the target: the resync's cleanup removes it with the shard's rows.
  await dst(`INSERT INTO t.m VALUES ('a', -1, 'stray', 0)`);
  await runner!.launcher.resync('s', 'a');
  // Shard b streams meanwhile.
  for (let i = 2; i <= 20; i++) await pub.query(`INSERT INTO s.b VALUES (${ROWS + i}, 'b${ROWS + i}', ${ROWS + 1})`, [], 'src');
  await waitFor(
    async () =>
      (await dst(`SELECT state FROM pgsub.subscription_rel WHERE subscription = 'mc' AND table_name = 'a'`))[0]?.state === 'r' &&
      lines.filter((l) => l.msg === 'table copy finished' && l.table === 's.a').length === 2,
    { timeoutMs: 90_000, what: 'shard a copied again' },
  );
  await caughtUp();
  assert.deepEqual(await summary(), expected(1, 20));
  assert.equal(lines.filter((l) => l.msg === 'table copy started' && l.table === 's.b').length, 1, 'shard b was not copied again');
  assert.deepEqual(await dst(`SELECT count(*)::int AS n FROM t.m WHERE id = -1`), [{ n: 0 }]);
  assert.deepEqual(
    lines.filter((l) => l.level >= 50),
    [],
  );
});

test('shards without computed columns go as the straight COPY, the value read on the publisher; a discriminator the target does not take as text is staged', async () => {
  await pub.query(
    `CREATE TABLE s.c (id int PRIMARY KEY, v text);
     CREATE TABLE s.d (id int PRIMARY KEY, v text);
     CREATE TABLE s.e (id int PRIMARY KEY, v text);
     INSERT INTO s.c SELECT g, 'c' || g FROM generate_series(1, ${ROWS}) g;
     INSERT INTO s.d SELECT g, 'd' || g FROM generate_series(1, ${ROWS}) g;
     INSERT INTO s.e SELECT g, 'e' || g FROM generate_series(1, ${ROWS}) g;
     CREATE PUBLICATION pub2 FOR TABLE s.c, s.d, s.e;`,
    [],
    'src',
  );
  await dst(`CREATE TABLE t.k (shard varchar(8) NOT NULL, id int NOT NULL, v text, PRIMARY KEY (shard, id));
             CREATE TYPE t.origin AS ENUM ('e');
             CREATE TABLE t.x (shard t.origin NOT NULL, id int NOT NULL, v text, PRIMARY KEY (shard, id));
             -- The target fails the first straight copy of shard c half-way (a sequence is not rolled back: once).
             CREATE SEQUENCE t.fail_once;
             CREATE FUNCTION t.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 IF NEW.shard = 'c' AND NEW.id = ${ROWS / 2} AND nextval('t.fail_once') = 1 THEN RAISE EXCEPTION 'injected failure in the copy of shard c'; END IF;
                 RETURN NEW;
               END $$;
             CREATE TRIGGER fail_once BEFORE INSERT ON t.k FOR EACH ROW EXECUTE FUNCTION t.fail_once();
             ALTER TABLE t.k ENABLE ALWAYS TRIGGER fail_once`);
  const shapes: { table?: string; copy?: string }[] = [];
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: 'mc2',
      source: pub.url('src'),
      target: tgt.url('dst'),
      publication: 'pub2',
      copy_data: true,
      binary: true,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      mapping: {
        tables: {
          's.c': { target: 't.k', discriminator: { column: 'shard', value: 'c' } },
          's.d': { target: 't.k', discriminator: { column: 'shard', value: 'd' } },
          's.e': { target: 't.x', discriminator: { column: 'shard', value: 'e' } },
        },
      },
    },
  });
  const errors: unknown[] = [];
  const second = startRunner(
    config,
    createLogger('debug', {
      write: (line: string) => {
        const l = JSON.parse(line) as { msg: string; table?: string; copy?: string; level: number; err?: { message?: string } };
        if (l.msg === 'copy shape of a mapped table') shapes.push({ table: l.table, copy: l.copy });
        if (l.level >= 50) errors.push(l);
      },
    }),
  );
  try {
    const readyOf = async () => (await dst(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = 'mc2' AND state = 'r'`))[0]!.n as number;
    await waitFor(async () => (await readyOf()) === 3, { timeoutMs: 90_000, what: 'the three shards copied' });
    const byShard = (table: string) =>
      dst(
        `SELECT shard::text AS shard, count(*)::int AS c, sum(id)::int8::text AS s, count(*) FILTER (WHERE v = shard::text || id)::int AS ok FROM ${table} GROUP BY 1 ORDER BY 1`,
      );
    const sum = String((ROWS * (ROWS + 1)) / 2);
    assert.deepEqual(await byShard('t.k'), [
      { shard: 'c', c: ROWS, s: sum, ok: ROWS },
      { shard: 'd', c: ROWS, s: sum, ok: ROWS },
    ]);
    assert.deepEqual(await byShard('t.x'), [{ shard: 'e', c: ROWS, s: sum, ok: ROWS }]);
    const shapeOf = (table: string) => [...new Set(shapes.filter((s) => s.table === table).map((s) => s.copy))];
    assert.deepEqual(shapeOf('s.c'), ['straight']);
    assert.deepEqual(shapeOf('s.d'), ['straight']);
    assert.deepEqual(shapeOf('s.e'), ['staged'], 'an enum discriminator in binary mode');
    // And streaming goes on into both tables.
    await pub.query(`INSERT INTO s.c VALUES (${ROWS + 1}, 'c${ROWS + 1}'); INSERT INTO s.e VALUES (${ROWS + 1}, 'e${ROWS + 1}')`, [], 'src');
    await waitFor(async () => (await dst(`SELECT count(*)::int AS n FROM t.k k, t.x x WHERE k.id = ${ROWS + 1} AND x.id = ${ROWS + 1}`))[0]!.n === 1, {
      timeoutMs: 30_000,
      what: 'the streamed rows',
    });
    // The one error is the injected one, and its retry copied the shard exactly once (the counts above).
    assert.deepEqual(
      errors.map((e) => `${(e as { msg: string }).msg} ${(e as { table?: string }).table}: ${(e as { err?: { message?: string } }).err?.message}`),
      ['table copy failed; will retry s.c: injected failure in the copy of shard c'],
    );
    assert.deepEqual(await dst(`SELECT rows_copied::int AS r FROM pgsub.subscription_rel WHERE subscription = 'mc2' AND table_name = 'c'`), [{ r: ROWS }]);
  } finally {
    second.stop();
    await second.done.catch(() => undefined);
  }
});
