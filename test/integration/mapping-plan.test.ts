/**
 * The compiled mapping plan and schema drift (docs/mapping.md), PG14 publisher → PG18
 * target: startup exits 2 naming table, column and reason for each mapping mistake (in one
 * run: every failure is listed); `pgsub plan` prints the real SQL of each operation (and
 * runs PG18 → PG18 too, the target cluster publishing from a database of its own); the
 * initial copy of a table with computed columns (staging table + INSERT … SELECT); and
 * each drift policy while streaming — stop (status shows the diff and the fix, apply
 * resumes by itself once the target has the column, no row lost), ignore, add (the column
 * added in the apply transaction) — a rename recognised as a rename, a dropped column
 * (the target column's default; a NOT NULL one without default named clearly).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, withTimeout, type Cluster } from '../harness/index.js';

const PUBLISHER = `
  CREATE SCHEMA shop;
  CREATE TABLE shop.items (id int PRIMARY KEY, name text, price_cents int, note text);
  INSERT INTO shop.items SELECT g, 'item ' || g, g * 10, 'n' || g FROM generate_series(1, 500) g;
  CREATE TABLE shop.tags (id int PRIMARY KEY, label text, n int);
  CREATE TABLE shop.notes (id int PRIMARY KEY, body text);
  CREATE PUBLICATION pub FOR TABLE shop.items, shop.tags, shop.notes;
  CREATE TABLE shop.m_unknown (id int PRIMARY KEY, a text);
  CREATE TABLE shop.m_missing (id int PRIMARY KEY, a text, b text);
  CREATE TABLE shop.m_notnull (id int PRIMARY KEY, a text);
  CREATE TABLE shop.m_volatile (id int PRIMARY KEY, a text);
  CREATE TABLE shop.m_parse (id int PRIMARY KEY, a text);
  CREATE TABLE shop.m_lossy (id int PRIMARY KEY, big bigint, s text);
  CREATE TABLE shop.m_key (id int PRIMARY KEY, a text);
  CREATE PUBLICATION pub_bad FOR TABLE shop.m_unknown, shop.m_missing, shop.m_notnull, shop.m_volatile, shop.m_parse, shop.m_lossy, shop.m_key;
`;
const TARGET = `
  CREATE SCHEMA crm;
  CREATE TABLE crm.items_t (id int PRIMARY KEY, title text, note text, price numeric, name_upper text);
  CREATE TABLE crm.tags_t (id int PRIMARY KEY, title text, n int NOT NULL);
  CREATE TABLE crm.notes_t (id int PRIMARY KEY, body text);
  CREATE SCHEMA bad;
  CREATE TABLE bad.m_unknown (id int PRIMARY KEY, a text);
  CREATE TABLE bad.m_missing (id int PRIMARY KEY, a text);
  CREATE TABLE bad.m_notnull (id int PRIMARY KEY, a text, must text NOT NULL);
  CREATE TABLE bad.m_volatile (id int PRIMARY KEY, a text, r text);
  CREATE TABLE bad.m_parse (id int PRIMARY KEY, a text, r text);
  CREATE TABLE bad.m_lossy (id int PRIMARY KEY, big int, s varchar(5));
  CREATE TABLE bad.m_key (id int PRIMARY KEY, a text);
`;

const MAPPING = {
  tables: {
    'shop.items': { target: 'crm.items_t', columns: { name: 'title' }, exclude: ['price_cents'], computed: { price: 'price_cents / 100.0', name_upper: 'upper(name)' } },
    'shop.tags': { target: 'crm.tags_t', columns: { label: 'title' }, drift: 'add' },
    'shop.notes': { target: 'crm.notes_t', drift: 'ignore' },
    'shop.nowhere': { target: 'crm.nowhere' },
  },
};

const BAD_MAPPING = {
  schemas: { shop: { target: 'bad' } },
  tables: {
    'shop.m_unknown': { columns: { nope: 'a' } },
    'shop.m_volatile': { computed: { r: 'random()::text' } },
    'shop.m_parse': { computed: { r: 'upper(a' } },
    'shop.m_key': { exclude: ['id'] },
  },
};

let publisher: Cluster;
let target: Cluster;
let runner: Runner;
const logs: { level: number; msg: string; err?: { code?: string; message?: string } }[] = [];

const env = (extra: Record<string, string> = {}) => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url('dst'),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: 'mp',
  PGSUB_BINARY: 'true',
  PGSUB_MAPPING: JSON.stringify(MAPPING),
  ...extra,
});

async function runCli(e: Record<string, string>, args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnPgsub(e, args);
  const code = await withTimeout(p.exited, 30_000, `pgsub ${args.join(' ')}`).catch((err: Error) => {
    p.kill('SIGKILL');
    throw err;
  });
  return { code, out: p.output() };
}

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 14, name: 'mplan-pub14' }), startCluster({ major: 18, name: 'mplan-tgt18' })]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst'), target.createDatabase('src18'), target.createDatabase('fresh')]);
  await publisher.query(PUBLISHER, [], 'src');
  await target.query(TARGET, [], 'dst');
  await target.query(TARGET, [], 'fresh');
});

after(async () => {
  runner?.stop();
  await runner?.done.catch(() => undefined);
  await publisher?.stop();
  await target?.stop();
});

const rows = (sql: string) => target.query(sql, [], 'dst');

async function caughtUp(timeoutMs = 30_000): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  try {
    await waitFor(async () => ((await slotConfirmedLsn(publisher, 'mp')) ?? 0n) >= end, { timeoutMs, intervalMs: 100, what: `slot to confirm ${end}` });
  } catch (err) {
    const sessions = await target.query(
      `SELECT application_name, state, wait_event_type, wait_event, left(query, 120) AS query FROM pg_stat_activity WHERE datname = 'dst'`,
      [],
      'dst',
    );
    throw new Error(`${(err as Error).message}; logs: ${JSON.stringify(logs.slice(-2))}; target sessions: ${JSON.stringify(sessions)}`);
  }
}

/** The subscription `mp` in this process; a new config each time, as a restarted pgsub has. */
function startMp(): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: 'mp',
      source: publisher.url('src'),
      target: target.url('dst'),
      publication: 'pub',
      copy_data: true,
      binary: true,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      mapping: MAPPING,
    },
  });
  return startRunner(
    config,
    createLogger(process.env.MAPDEBUG ? 'debug' : 'warn', {
      write: (line: string) => {
        const l = JSON.parse(line);
        if (l.level >= 40) logs.push(l);
        if (process.env.MAPDEBUG) console.error(line);
      },
    }),
  );
}

test('pgsub plan on a target pgsub never ran on: exit 0, the SQL printed, nothing created', async () => {
  const { code, out } = await runCli(env({ PGSUB_TARGET: target.url('fresh'), PGSUB_SUBSCRIPTION: 'mp_fresh' }), ['plan']);
  assert.equal(code, 0, out);
  assert.doesNotMatch(out, /PIPELINE_ABORTED|ERROR/);
  assert.match(out, /shop\.items → crm\.items_t \(mapped, drift: stop\)/);
  assert.match(out, /insert: +INSERT INTO "crm"\."items_t" \("id", "title", "note", "price", "name_upper"\)/);
  assert.match(out, /shop\.tags → crm\.tags_t[\s\S]*update: +UPDATE ONLY "crm"\."tags_t"/);
  assert.match(out, /shop\.notes → crm\.notes_t[\s\S]*delete: +DELETE FROM ONLY "crm"\."notes_t" WHERE "id" = \$1/);
  // Read-only: pgsub's schema is still absent.
  assert.deepEqual(await target.query(`SELECT to_regnamespace('pgsub') IS NULL AS absent`, [], 'fresh'), [{ absent: true }]);
});

test('startup: every mapping mistake is named with table, column and reason, exit 2 before streaming', async () => {
  const { code, out } = await runCli(env({ PGSUB_PUBLICATION: 'pub_bad', PGSUB_SUBSCRIPTION: 'mp_bad', PGSUB_MAPPING: JSON.stringify(BAD_MAPPING) }), ['run']);
  const line = out.split('\n').find((l) => l.startsWith('pgsub: ')) ?? '';
  assert.equal(code, 2, out.slice(-3000));
  assert.match(line, /^pgsub: PGSUB_MAPPING_INVALID: /);
  assert.match(line, /shop\.m_unknown column nope: .*column "nope" is not a column the publisher sends/);
  assert.match(line, /shop\.m_missing column "b": .*"bad\.m_missing" \(for "shop\.m_missing"\) is missing replicated column: "b"/);
  assert.match(line, /shop\.m_notnull column must: .*"bad\.m_notnull"\."must" is NOT NULL without a default and nothing fills it/);
  assert.match(line, /shop\.m_volatile column r: .*is not immutable/);
  assert.match(line, /shop\.m_parse column r: .*syntax error/);
  assert.match(line, /shop\.m_lossy column big: .*"big" → "bad\.m_lossy"\."big" is a lossy cast/);
  assert.match(line, /shop\.m_key column id: .*replica identity column "id".*must be written/);
  assert.doesNotMatch(out, /streaming started/);
  // The varchar(5) column is the second lossy cast: fixed the first, it is the one named.
  await target.query(`ALTER TABLE bad.m_lossy ALTER COLUMN big TYPE bigint`, [], 'dst');
  const plan = await runCli(env({ PGSUB_PUBLICATION: 'pub_bad', PGSUB_SUBSCRIPTION: 'mp_bad', PGSUB_MAPPING: JSON.stringify(BAD_MAPPING) }), ['plan']);
  assert.equal(plan.code, 2);
  assert.match(plan.out, /shop\.m_lossy → bad\.m_lossy[\s\S]*ERROR PGSUB_MAPPING_INVALID \(s\): .*holds at most 5 characters/);
});

test('pgsub plan prints the resolved mapping and the real SQL of each operation (PG14 → PG18, then PG18 → PG18)', async () => {
  const { code, out } = await runCli(env(), ['plan']);
  assert.equal(code, 0, out);
  assert.match(out, /warning: mapping\.tables\.shop\.nowhere: the publications do not publish shop\.nowhere/);
  assert.match(out, /shop\.items → crm\.items_t \(mapped, drift: stop\)/);
  assert.match(out, /name text → title {2}\[renamed\]/);
  assert.match(out, /price_cents integer {2}\[excluded\]/);
  assert.match(out, /price = price_cents \/ 100\.0 {2}\[computed\]/);
  assert.match(
    out,
    /insert: +INSERT INTO "crm"\."items_t" \("id", "title", "note", "price", "name_upper"\) SELECT r\."id", r\."name", r\."note", \(price_cents \/ 100\.0\), \(upper\(name\)\) FROM \(SELECT/,
  );
  assert.match(out, /update: +UPDATE ONLY "crm"\."items_t"/);
  assert.match(out, /delete: +DELETE FROM ONLY "crm"\."items_t" WHERE "id" = \$1/);
  assert.match(out, /truncate: +TRUNCATE ONLY "crm"\."items_t"/);
  assert.match(out, /copy: +CREATE TEMPORARY TABLE "pgsub_copy_staging" \("id" integer, "name" text, "price_cents" integer, "note" text\) ON COMMIT DROP/);
  assert.match(out, /COPY "shop"\."items" \("id", "name", "price_cents", "note"\) TO STDOUT \(FORMAT binary\) → COPY pg_temp\."pgsub_copy_staging"/);
  assert.match(
    out,
    /INSERT INTO "crm"\."items_t" \("id", "title", "note", "price", "name_upper"\) OVERRIDING SYSTEM VALUE SELECT r\."id", r\."name", r\."note", \(price_cents \/ 100\.0\), \(upper\(name\)\) FROM pg_temp\."pgsub_copy_staging" AS r/,
  );
  assert.match(
    out,
    /shop\.tags → crm\.tags_t[\s\S]*copy: +COPY "shop"\."tags" \("id", "label", "n"\) TO STDOUT \(FORMAT binary\) → COPY "crm"\."tags_t" \("id", "title", "n"\) FROM STDIN \(FORMAT binary\)/,
  );
  const json = JSON.parse((await runCli(env(), ['plan', '--json'])).out) as { tables: { source: string; sql: Record<string, unknown> }[] };
  assert.deepEqual(
    json.tables.map((t) => t.source),
    ['shop.items', 'shop.notes', 'shop.tags'],
  );
  // PG18 → PG18: the target cluster publishes from a database of its own (PG18 column lists).
  await target.query(
    `CREATE SCHEMA shop; CREATE TABLE shop.items (id int PRIMARY KEY, name text, price_cents int, note text, hidden text); CREATE PUBLICATION pub18 FOR TABLE shop.items (id, name, price_cents, note);`,
    [],
    'src18',
  );
  const p18 = await runCli(env({ PGSUB_SOURCE: target.url('src18'), PGSUB_PUBLICATION: 'pub18', PGSUB_SUBSCRIPTION: 'mp18' }), ['plan']);
  assert.equal(p18.code, 0, p18.out);
  assert.match(p18.out, /COPY "shop"\."items" \("id", "name", "price_cents", "note"\) TO STDOUT/);
  assert.doesNotMatch(p18.out, /hidden/);
});

test('the initial copy of a table with computed columns: rows and values right, then streaming', async () => {
  runner = startMp();
  await waitFor(async () => (await rows(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = 'mp' AND state = 'r'`))[0]?.n === 3, {
    timeoutMs: 60_000,
    what: 'the initial copy',
  });
  assert.deepEqual(await rows(`SELECT count(*)::int AS c, sum(price)::numeric(12,2)::text AS p, count(*) FILTER (WHERE name_upper = upper(title))::int AS u FROM crm.items_t`), [
    { c: 500, p: `${(10 * 500 * 501) / 2 / 100}.00`, u: 500 },
  ]);
  assert.deepEqual(await rows(`SELECT title, price::text, name_upper, note FROM crm.items_t WHERE id = 7`), [
    { title: 'item 7', price: '0.70000000000000000000', name_upper: 'ITEM 7', note: 'n7' },
  ]);
  assert.deepEqual(await rows(`SELECT rows_copied::int AS r FROM pgsub.subscription_rel WHERE subscription = 'mp' AND table_name = 'items'`), [{ r: 500 }]);
  await publisher.query(`INSERT INTO shop.items VALUES (501, 'late', 5, 'x')`, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT name_upper, price::text FROM crm.items_t WHERE id = 501`), [{ name_upper: 'LATE', price: '0.05000000000000000000' }]);
});

test('drift: stop → status shows the diff and the fix → fixed on the target, apply resumes by itself, no row lost', async () => {
  // One transaction each (a multi-statement query would be one).
  for (const sql of [
    `INSERT INTO shop.items VALUES (502, 'before', 1, 'b')`,
    `ALTER TABLE shop.items ADD COLUMN color text`,
    `INSERT INTO shop.items VALUES (503, 'red one', 2, 'c', 'red')`,
    `INSERT INTO shop.items VALUES (504, 'blue one', 3, 'd', 'blue')`,
  ])
    await publisher.query(sql, [], 'src');
  await waitFor(async () => (await rows(`SELECT error_code FROM pgsub.subscription WHERE subscription = 'mp'`))[0]?.error_code === 'PGSUB_SCHEMA_DRIFT', {
    timeoutMs: 30_000,
    what: 'the drift error recorded',
  });
  // Stopped at the transaction boundary: the row before is in, the ones carrying the column are not.
  assert.deepEqual(await rows(`SELECT id FROM crm.items_t WHERE id > 501 ORDER BY id`), [{ id: 502 }]);
  const status = await runCli(env(), ['status']);
  assert.match(status.out, /schema drift: shop\.items → crm\.items_t/);
  assert.match(status.out, /\+ "color" text {4}\(on the publisher; missing on crm\.items_t\)/);
  assert.match(status.out, /fix: ALTER TABLE "crm"\."items_t" ADD COLUMN "color" text;/);
  await target.query(`ALTER TABLE crm.items_t ADD COLUMN color text`, [], 'dst');
  // The next retry (backoff up to retry_max_delay) starts a session; generous on a loaded machine.
  await caughtUp(60_000);
  assert.deepEqual(await rows(`SELECT id, color FROM crm.items_t WHERE id > 501 ORDER BY id`), [
    { id: 502, color: null },
    { id: 503, color: 'red' },
    { id: 504, color: 'blue' },
  ]);
  assert.deepEqual(await rows(`SELECT count(*)::int AS c FROM crm.items_t`), [{ c: 504 }]);
});

test('drift: ignore drops the new column; add adds it in the apply transaction; a rename is a rename; a drop leaves the default', async () => {
  for (const sql of [
    `INSERT INTO shop.notes VALUES (1, 'one')`,
    `ALTER TABLE shop.notes ADD COLUMN secret text`,
    `INSERT INTO shop.notes VALUES (2, 'two', 's')`,
    `INSERT INTO shop.tags VALUES (1, 'a', 1)`,
    `ALTER TABLE shop.tags ADD COLUMN extra int`,
    `INSERT INTO shop.tags VALUES (2, 'b', 2, 5)`,
  ])
    await publisher.query(sql, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT * FROM crm.notes_t ORDER BY id`), [
    { id: 1, body: 'one' },
    { id: 2, body: 'two' },
  ]);
  assert.deepEqual(await rows(`SELECT id, title, n, extra FROM crm.tags_t ORDER BY id`), [
    { id: 1, title: 'a', n: 1, extra: null },
    { id: 2, title: 'b', n: 2, extra: 5 },
  ]);
  assert.deepEqual(await rows(`SELECT format_type(atttypid, atttypmod) AS t FROM pg_attribute WHERE attrelid = 'crm.tags_t'::regclass AND attname = 'extra'`), [{ t: 'integer' }]);
  // The ALTER committed in the transaction that brought row 2 (same xmin as the catalog row).
  const [same] = await rows(
    `SELECT (SELECT xmin::text FROM crm.tags_t WHERE id = 2) = (SELECT xmin::text FROM pg_attribute WHERE attrelid = 'crm.tags_t'::regclass AND attname = 'extra') AS s`,
  );
  assert.deepEqual(same, { s: true });
  for (const sql of [`ALTER TABLE shop.tags RENAME COLUMN label TO caption`, `INSERT INTO shop.tags VALUES (3, 'c', 3, 6)`, `UPDATE shop.tags SET caption = 'a2' WHERE id = 1`])
    await publisher.query(sql, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT id, title FROM crm.tags_t ORDER BY id`), [
    { id: 1, title: 'a2' },
    { id: 2, title: 'b' },
    { id: 3, title: 'c' },
  ]);
  assert.deepEqual(await rows(`SELECT count(*)::int AS c FROM pg_attribute WHERE attrelid = 'crm.tags_t'::regclass AND attname = 'caption'`), [{ c: 0 }]);
  // Restarted (a new process's memory): the rename is known from pgsub.relation_columns, so drift: add does not add "caption".
  runner.stop();
  await runner.done.catch(() => undefined);
  runner = startMp();
  await publisher.query(`INSERT INTO shop.tags VALUES (5, 'e', 5, 8)`, [], 'src');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT title FROM crm.tags_t WHERE id = 5`), [{ title: 'e' }]);
  assert.deepEqual(await rows(`SELECT count(*)::int AS c FROM pg_attribute WHERE attrelid = 'crm.tags_t'::regclass AND attname = 'caption'`), [{ c: 0 }]);
  // A dropped column: its NOT NULL target column without a default is named, and fixed with a default.
  await publisher.query(`ALTER TABLE shop.tags DROP COLUMN n`, [], 'src');
  await publisher.query(`INSERT INTO shop.tags VALUES (4, 'd', 7)`, [], 'src');
  await waitFor(
    () => logs.some((l) => /the publisher dropped column "n", and target column "crm\.tags_t"\."n" it filled is NOT NULL without a default/.test(l.err?.message ?? '')),
    {
      timeoutMs: 30_000,
      what: 'the dropped-column error',
    },
  );
  await target.query(`ALTER TABLE crm.tags_t ALTER COLUMN n SET DEFAULT -1`, [], 'dst');
  await caughtUp();
  assert.deepEqual(await rows(`SELECT id, title, n, extra FROM crm.tags_t WHERE id = 4`), [{ id: 4, title: 'd', n: -1, extra: 7 }]);
  assert.deepEqual(await rows(`SELECT count(*)::int AS c FROM crm.tags_t`), [{ c: 5 }]);
});
