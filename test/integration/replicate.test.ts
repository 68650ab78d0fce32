/**
 * End to end: INSERT/UPDATE/DELETE/TRUNCATE replicate from a real publisher into a real
 * target of the same or a different major, and the target equals the source. Also the
 * apply session's native-like behaviour (replica role: FKs and ordinary triggers do not
 * fire, ALWAYS triggers do; columns matched by name; extra target columns take their
 * defaults) and the idle slot catching up to the publisher's WAL position.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, startCluster, tableChecksum, waitFor, type Cluster } from '../harness/index.js';

const PUBLISHER_SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.items (id bigint PRIMARY KEY, name text NOT NULL, qty int, price numeric(12,2), tags text[], meta jsonb, created timestamptz DEFAULT now());
  CREATE TABLE app.parent (id int PRIMARY KEY);
  CREATE TABLE app.child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES app.parent(id), label text);
  CREATE TABLE app.events (id bigserial PRIMARY KEY, kind text NOT NULL, stamped text);
  CREATE TABLE "Odd ""Schema"""."tbl.with dots" ("Key" int PRIMARY KEY, "ñame ü" text, "select" text);
`;
// The target differs on purpose: other column order, an extra column with a default,
// a foreign key whose parent rows are never replicated, and triggers.
const TARGET_SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.items (note text DEFAULT 'from default', created timestamptz, meta jsonb, tags text[], price numeric(12,2), qty int, name text NOT NULL, id bigint PRIMARY KEY);
  CREATE TABLE app.parent (id int PRIMARY KEY);
  CREATE TABLE app.child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES app.parent(id), label text);
  CREATE TABLE app.events (id bigserial PRIMARY KEY, kind text NOT NULL, stamped text);
  CREATE TABLE app.audit (item_id bigint, op text);
  CREATE FUNCTION app.audit_items() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO app.audit VALUES (NEW.id, TG_OP); RETURN NEW; END $$;
  CREATE TRIGGER audit_items AFTER INSERT OR UPDATE ON app.items FOR EACH ROW EXECUTE FUNCTION app.audit_items();
  CREATE FUNCTION app.stamp_events() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.stamped := 'stamped by trigger'; RETURN NEW; END $$;
  CREATE TRIGGER stamp_events BEFORE INSERT ON app.events FOR EACH ROW EXECUTE FUNCTION app.stamp_events();
  ALTER TABLE app.events ENABLE ALWAYS TRIGGER stamp_events;
  CREATE TABLE "Odd ""Schema"""."tbl.with dots" ("select" text, "ñame ü" text, "Key" int PRIMARY KEY);
`;
const TABLES = ['app.items', 'app.child', 'app.events', '"Odd ""Schema"""."tbl.with dots"'];
const ITEM_COLUMNS = 'id, name, qty, price, tags, meta, created';

for (const [publisherMajor, targetMajor] of [
  [18, 18],
  [14, 18],
] as const) {
  describe(`replication PG${publisherMajor} → PG${targetMajor}`, () => {
    let publisher: Cluster;
    let target: Cluster;
    let runner: Runner;

    before(async () => {
      [publisher, target] = await Promise.all([
        startCluster({ major: publisherMajor, name: `rep-pub${publisherMajor}` }),
        startCluster({ major: targetMajor, name: `rep-tgt${targetMajor}` }),
      ]);
      await publisher.createDatabase('src');
      await target.createDatabase('dst');
      await publisher.query(`CREATE SCHEMA "Odd ""Schema""";`, [], 'src');
      await publisher.query(PUBLISHER_SCHEMA, [], 'src');
      await publisher.query(`CREATE PUBLICATION pub FOR TABLE ${TABLES.join(', ')}`, [], 'src');
      await target.query(`CREATE SCHEMA "Odd ""Schema""";`, [], 'dst');
      await target.query(TARGET_SCHEMA, [], 'dst');
      const config = loadConfig({
        env: {},
        overrides: { subscription: 'rep', source: publisher.url('src'), target: target.url('dst'), publication: 'pub', copy_data: false, status_interval: 1 },
      });
      runner = startRunner(config, createLogger('warn'));
      await waitFor(async () => (await slotConfirmedLsn(publisher, 'rep')) !== null, { timeoutMs: 30_000, what: 'the slot' });
    });

    after(async () => {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      await publisher?.stop();
      await target?.stop();
    });

    async function caughtUp(): Promise<bigint> {
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, 'rep')) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: `slot to confirm ${end}` });
      return end;
    }

    test('inserts, updates (incl. key change), deletes; columns matched by name; defaults for extra columns', async () => {
      await publisher.query(
        `INSERT INTO app.items (id, name, qty, price, tags, meta)
           SELECT g, 'item ' || g, g % 7, g * 1.25, ARRAY['a', 'b' || g], jsonb_build_object('g', g, 'q', 'x"y')
             FROM generate_series(1, 500) g;
         UPDATE app.items SET qty = qty + 100, meta = meta || '{"updated": true}' WHERE id % 5 = 0;
         UPDATE app.items SET id = id + 10000 WHERE id BETWEEN 1 AND 10;
         DELETE FROM app.items WHERE id % 11 = 0;
         BEGIN; INSERT INTO app.items (id, name) VALUES (900001, 'in a tx'); UPDATE app.items SET name = 'renamed' WHERE id = 900001; COMMIT;
         BEGIN; INSERT INTO app.items (id, name) VALUES (900002, 'rolled back'); ROLLBACK;`,
        [],
        'src',
      );
      await caughtUp();
      const [s, d] = await Promise.all([tableChecksum(publisher, 'src', 'app.items', ITEM_COLUMNS), tableChecksum(target, 'dst', 'app.items', ITEM_COLUMNS)]);
      assert.equal(d.rows, s.rows);
      // ids 1-10 moved to 10001-10010 before the delete of multiples of 11 (10010 among them).
      assert.equal(s.rows, 500 - 46 + 1);
      assert.equal(d.md5, s.md5);
      const [note] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE note = 'from default'`, [], 'dst');
      assert.equal(note.n, s.rows, 'the extra target column takes its default');
      const moved = await target.query(`SELECT id FROM app.items WHERE id > 10000 AND id < 10011 ORDER BY id`, [], 'dst');
      assert.deepEqual(
        moved.map((r) => Number(r.id)),
        [10001, 10002, 10003, 10004, 10005, 10006, 10007, 10008, 10009],
      );
    });

    test('replica session: ordinary triggers and FKs do not fire, ENABLE ALWAYS triggers do', async () => {
      await publisher.query(
        `INSERT INTO app.parent VALUES (1), (2);
         INSERT INTO app.child VALUES (10, 1, 'one'), (20, 2, 'two');
         INSERT INTO app.events (kind) VALUES ('signup'), ('login');`,
        [],
        'src',
      );
      await caughtUp();
      // app.parent is not published: the target's FK would reject these rows outside replica mode.
      const children = await target.query(`SELECT id, parent_id FROM app.child ORDER BY id`, [], 'dst');
      assert.deepEqual(
        children.map((r) => [r.id, r.parent_id]),
        [
          [10, 1],
          [20, 2],
        ],
      );
      const [audit] = await target.query(`SELECT count(*)::int AS n FROM app.audit`, [], 'dst');
      assert.equal(audit.n, 0, 'ordinary trigger must not fire on applied rows');
      const events = await target.query(`SELECT kind, stamped FROM app.events ORDER BY id`, [], 'dst');
      assert.deepEqual(
        events.map((r) => [r.kind, r.stamped]),
        [
          ['signup', 'stamped by trigger'],
          ['login', 'stamped by trigger'],
        ],
      );
    });

    test('quoted, dotted and unicode identifiers', async () => {
      await publisher.query(
        `INSERT INTO "Odd ""Schema"""."tbl.with dots" VALUES (1, 'ü', 'x''); DROP TABLE app.items; --'), (2, NULL, '"quoted"');
         UPDATE "Odd ""Schema"""."tbl.with dots" SET "ñame ü" = 'ñ' WHERE "Key" = 2;`,
        [],
        'src',
      );
      await caughtUp();
      const rows = await target.query(`SELECT "Key", "ñame ü", "select" FROM "Odd ""Schema"""."tbl.with dots" ORDER BY 1`, [], 'dst');
      assert.deepEqual(
        rows.map((r) => [r.Key, r['ñame ü'], r.select]),
        [
          [1, 'ü', "x'); DROP TABLE app.items; --"],
          [2, 'ñ', '"quoted"'],
        ],
      );
    });

    test('truncate of several tables in one statement, then more changes; target equals source', async () => {
      await publisher.query(`TRUNCATE app.child, app.events RESTART IDENTITY`, [], 'src');
      await publisher.query(`INSERT INTO app.events (kind) VALUES ('after truncate')`, [], 'src');
      await caughtUp();
      const [events] = await target.query(`SELECT count(*)::int AS n FROM app.events`, [], 'dst');
      assert.equal(events.n, 1);
      const [child] = await target.query(`SELECT count(*)::int AS n FROM app.child`, [], 'dst');
      assert.equal(child.n, 0);
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.child']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      const odd = TABLES[3]!;
      const oddColumns = '"Key", "ñame ü", "select"';
      assert.deepEqual(await tableChecksum(target, 'dst', odd, oddColumns), await tableChecksum(publisher, 'src', odd, oddColumns));
      const [s, d] = await Promise.all([tableChecksum(publisher, 'src', 'app.events', 'id, kind'), tableChecksum(target, 'dst', 'app.events', 'id, kind')]);
      assert.deepEqual(d, s);
    });

    test('TRUNCATE … CASCADE reaches every published table it cascaded to; RESTART IDENTITY resets target sequences', async () => {
      const ddl = `CREATE TABLE app.t_parent (id int PRIMARY KEY);
        CREATE TABLE app.t_child (id int PRIMARY KEY, pid int REFERENCES app.t_parent(id));
        CREATE TABLE app.t_serial (id bigserial PRIMARY KEY, v text);`;
      await target.query(`${ddl} SELECT nextval('app.t_serial_id_seq') FROM generate_series(1, 5);`, [], 'dst');
      await publisher.query(`${ddl} ALTER PUBLICATION pub ADD TABLE app.t_parent, app.t_child, app.t_serial;`, [], 'src');
      // Part of the subscription only from a refresh (ALTER SUBSCRIPTION … REFRESH PUBLICATION).
      await runner.launcher.refresh();
      await publisher.query(
        `INSERT INTO app.t_parent VALUES (1), (2); INSERT INTO app.t_child VALUES (1, 1), (2, 2); INSERT INTO app.t_serial (v) VALUES ('a'), ('b');`,
        [],
        'src',
      );
      await caughtUp();
      const [beforeCount] = await target.query(`SELECT (SELECT count(*) FROM app.t_child)::int AS n`, [], 'dst');
      assert.equal(beforeCount.n, 2);
      await publisher.query(`TRUNCATE app.t_parent CASCADE; TRUNCATE app.t_serial RESTART IDENTITY;`, [], 'src');
      await caughtUp();
      const [counts] = await target.query(
        `SELECT (SELECT count(*) FROM app.t_parent)::int AS p, (SELECT count(*) FROM app.t_child)::int AS c, (SELECT count(*) FROM app.t_serial)::int AS s`,
        [],
        'dst',
      );
      assert.deepEqual(counts, { p: 0, c: 0, s: 0 });
      const [seq] = await target.query(`SELECT last_value::int AS v, is_called FROM app.t_serial_id_seq`, [], 'dst');
      assert.deepEqual(seq, { v: 1, is_called: false }, 'RESTART IDENTITY reset the target sequence');
    });

    test('63-byte unicode names and names crafted as SQL injection are plain identifiers', async () => {
      const longName = `${'ü'.repeat(31)}x`; // 63 bytes in UTF-8, PostgreSQL's limit
      assert.equal(Buffer.byteLength(longName), 63);
      const evil = `"; DROP TABLE app.items; --`;
      const q = (name: string) => `"${name.replace(/"/g, '""')}"`;
      const ddl = `CREATE TABLE app.${q(longName)} (${q(evil)} int PRIMARY KEY, ${q('a\'b"c')} text, ${q(longName)} text);`;
      await target.query(ddl, [], 'dst');
      await publisher.query(`${ddl} ALTER PUBLICATION pub ADD TABLE app.${q(longName)};`, [], 'src');
      await runner.launcher.refresh();
      await publisher.query(
        `INSERT INTO app.${q(longName)} VALUES (1, $$'); DELETE FROM app.items; --$$, 'v'), (2, NULL, 'w');
         UPDATE app.${q(longName)} SET ${q('a\'b"c')} = 'updated' WHERE ${q(evil)} = 2;
         DELETE FROM app.${q(longName)} WHERE ${q(evil)} = 1;
         INSERT INTO app.${q(longName)} VALUES (3, 'three', 'x');`,
        [],
        'src',
      );
      await caughtUp();
      const rows = await target.query(`SELECT ${q(evil)} AS k, ${q('a\'b"c')} AS a, ${q(longName)} AS l FROM app.${q(longName)} ORDER BY 1`, [], 'dst');
      assert.deepEqual(rows, [
        { k: 2, a: 'updated', l: 'w' },
        { k: 3, a: 'three', l: 'x' },
      ]);
      const [items] = await target.query(`SELECT count(*)::int AS n FROM app.items`, [], 'dst');
      assert.ok(items.n > 0, 'app.items untouched');
    });

    test("idle: the slot confirms the publisher's WAL position, never beyond the origin recorded in the target", async () => {
      // Unpublished activity moves the WAL without sending any change.
      await publisher.query(`CREATE TABLE app.unpublished (x int); INSERT INTO app.unpublished SELECT generate_series(1, 1000);`, [], 'src');
      const end = await caughtUp();
      const confirmed = (await slotConfirmedLsn(publisher, 'rep'))!;
      const [origin] = await target.query(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'rep'`, [], 'dst');
      const [hi, lo] = (origin.lsn as string).split('/');
      const originLsn = (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
      assert.ok(confirmed >= end, `confirmed ${confirmed} < end ${end}`);
      assert.ok(confirmed <= originLsn, `slot confirmed ${confirmed} beyond origin ${originLsn}`);
      assert.ok(runner.counters.transactionsApplied >= 5, `applied ${runner.counters.transactionsApplied}`);
    });
  });
}
