/**
 * COPY FREEZE in the table sync (copy_freeze, on by default): a table copied whole into
 * an empty target table is truncated in the COPY's own transaction and loaded frozen —
 * checked on the target's heap pages (pageinspect: every tuple's xmin frozen). Where
 * TRUNCATE is not possible or not wanted the copy falls back to a plain COPY, and the
 * rows must be exact either way: a table another table's foreign key references, one
 * with a TRUNCATE trigger that fires for the replica role, one published on the target,
 * a partitioned target table, a table whose lock another session holds (the lock is not
 * granted within a second), and every table with copy_freeze off. A resync of a filled
 * table is loaded frozen too. The whole tables share the snapshots of two lanes (lanes.ts),
 * one of them written to throughout the copy. Publisher and target at the oldest supported
 * majors (10 → 12) and at 18 → 18.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const SOURCE_SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.plain (id int PRIMARY KEY, v text NOT NULL);
  CREATE TABLE app.parent (id int PRIMARY KEY, name text);
  CREATE TABLE app.child (id int PRIMARY KEY, parent_id int NOT NULL, note text);
  CREATE TABLE app.trig (id int PRIMARY KEY, v text);
  CREATE TABLE app.pubd (id int PRIMARY KEY, v text);
  CREATE TABLE app.parted (id int PRIMARY KEY, v text);
  CREATE TABLE app.locked (id int PRIMARY KEY, v text);
  CREATE TABLE app.busy (id int PRIMARY KEY, n int NOT NULL);
  INSERT INTO app.busy SELECT g, 0 FROM generate_series(1, 200) g;
  INSERT INTO app.plain SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
  INSERT INTO app.parent SELECT g, 'p' || g FROM generate_series(1, 500) g;
  INSERT INTO app.child SELECT g, 1 + g % 500, 'c' || g FROM generate_series(1, 3000) g;
  INSERT INTO app.trig SELECT g, 't' || g FROM generate_series(1, 1000) g;
  INSERT INTO app.pubd SELECT g, 'u' || g FROM generate_series(1, 1000) g;
  INSERT INTO app.parted SELECT g, 'r' || g FROM generate_series(1, 2000) g;
  INSERT INTO app.locked SELECT g, 'l' || g FROM generate_series(1, 1000) g;
`;
// The target's own objects decide what may be truncated. app.locked has no index, so
// nothing but the copy's TRUNCATE needs a lock stronger than the holder's ACCESS SHARE.
const TARGET_SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.plain (id int PRIMARY KEY, v text NOT NULL);
  CREATE TABLE app.parent (id int PRIMARY KEY, name text);
  CREATE TABLE app.child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES app.parent, note text);
  CREATE TABLE app.trig (id int PRIMARY KEY, v text);
  CREATE TABLE app.truncations (at timestamptz);
  CREATE FUNCTION app.note_truncate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO app.truncations VALUES (now()); RETURN NULL; END $$;
  CREATE TRIGGER note_truncate AFTER TRUNCATE ON app.trig FOR EACH STATEMENT EXECUTE PROCEDURE app.note_truncate();
  ALTER TABLE app.trig ENABLE ALWAYS TRIGGER note_truncate;
  CREATE TABLE app.pubd (id int PRIMARY KEY, v text);
  CREATE PUBLICATION cascade FOR TABLE app.pubd;
  CREATE TABLE app.parted (id int NOT NULL, v text) PARTITION BY RANGE (id);
  CREATE TABLE app.parted_1 PARTITION OF app.parted FOR VALUES FROM (MINVALUE) TO (1000);
  CREATE TABLE app.parted_2 PARTITION OF app.parted FOR VALUES FROM (1000) TO (MAXVALUE);
  CREATE TABLE app.locked (id int NOT NULL, v text);
  CREATE TABLE app.busy (id int PRIMARY KEY, n int NOT NULL);
  CREATE EXTENSION pageinspect;
  DO $$ DECLARE r regclass; BEGIN
    -- No autovacuum to freeze anything behind the test's back.
    FOR r IN SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'app'::regnamespace AND c.relkind = 'r' LOOP
      EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r);
    END LOOP;
  END $$;
`;
const TABLES = ['app.plain', 'app.parent', 'app.child', 'app.trig', 'app.pubd', 'app.parted', 'app.locked', 'app.busy'];
/** Loaded frozen with copy_freeze on; the others must fall back to a plain COPY. */
const FROZEN = ['app.plain', 'app.child'];

for (const [publisherMajor, targetMajor] of [
  [10, 12],
  [18, 18],
] as const) {
  describe(`COPY FREEZE in the table sync, PG${publisherMajor} → PG${targetMajor}`, () => {
    let publisher: Cluster;
    let target: Cluster;
    let runner: Runner | null = null;
    const sub = `freeze${publisherMajor}`;

    before(async () => {
      [publisher, target] = await Promise.all([
        startCluster({ major: publisherMajor, name: `freeze-pub${publisherMajor}` }),
        startCluster({ major: targetMajor, name: `freeze-tgt${targetMajor}` }),
      ]);
      await publisher.createDatabase('src');
      await target.createDatabase('dst');
      await publisher.query(`${SOURCE_SCHEMA} CREATE PUBLICATION pub FOR TABLE ${TABLES.join(', ')};`, [], 'src');
      await target.query(TARGET_SCHEMA, [], 'dst');
    });

    after(async () => {
      await stopRunner();
      await publisher?.stop();
      await target?.stop();
    });

    function start(extra: Record<string, unknown> = {}): Runner {
      const config = loadConfig({
        env: {},
        overrides: {
          subscription: sub,
          source: publisher.url('src'),
          target: target.url('dst'),
          publication: 'pub',
          status_interval: 1,
          max_sync_workers: 2,
          retry_min_delay: 0.2,
          retry_max_delay: 1,
          ...extra,
        },
      });
      return startRunner(config, createLogger('warn'));
    }

    async function stopRunner(): Promise<void> {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      runner = null;
    }

    async function states(): Promise<Record<string, string>> {
      const rows = await target.query(`SELECT schema_name || '.' || table_name AS t, state FROM pgsub.subscription_rel WHERE subscription = $1`, [sub], 'dst').catch(() => []);
      return Object.fromEntries(rows.map((r) => [r.t, r.state]));
    }

    async function allReady(): Promise<void> {
      await waitFor(async () => Object.keys(await states()).length === TABLES.length && Object.values(await states()).every((s) => s === 'r'), {
        timeoutMs: 120_000,
        intervalMs: 100,
        what: 'all tables ready',
      });
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, sub)) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: 'catch-up' });
    }

    /** Tuples on the table's own heap pages, and how many of them have a frozen xmin. */
    async function frozenShare(table: string): Promise<{ tuples: number; frozen: number }> {
      const [r] = await target.query<{ tuples: number; frozen: number }>(
        `SELECT count(*)::int AS tuples, count(*) FILTER (WHERE (i.t_infomask & 768) = 768)::int AS frozen
           FROM generate_series(0, (pg_relation_size($1::text::regclass) / current_setting('block_size')::int)::int - 1) AS b,
                heap_page_items(get_raw_page($1::text, b)) AS i
          WHERE i.lp_flags = 1`,
        [table],
        'dst',
      );
      return r!;
    }

    test('initial copy: whole tables loaded frozen where they can be truncated, plain COPY elsewhere, all exact', async () => {
      // Another session reads app.locked for the whole copy: its ACCESS SHARE lock keeps the
      // copy from truncating the table (ACCESS EXCLUSIVE), not from inserting into it.
      const holder = new pg.Client({ connectionString: target.url('dst') });
      await holder.connect();
      // app.busy, the smallest table, is written to until every copy has finished: it is
      // copied last, from a snapshot its lane took before (lanes.ts), and must still end exact.
      let writing = true;
      let written = 0;
      const writes = (async () => {
        for (let i = 0; writing; i++, written++) {
          await publisher.query(
            `INSERT INTO app.busy VALUES (${1000 + i}, ${i}); UPDATE app.busy SET n = n + 1 WHERE id = ${1 + (i % 200)}; DELETE FROM app.busy WHERE id = ${1000 + i - 3};`,
            [],
            'src',
          );
        }
      })();
      try {
        await holder.query(`BEGIN; SELECT count(*) FROM app.locked;`);
        runner = start();
        await waitFor(async () => Object.keys(await states()).length === TABLES.length && Object.values(await states()).every((s) => s !== 'i' && s !== 'd'), {
          timeoutMs: 120_000,
          intervalMs: 50,
          what: 'copies finished',
        });
        writing = false;
        await writes;
        await allReady();
        await holder.query('COMMIT');
      } finally {
        writing = false;
        await writes.catch(() => {});
        await holder.end();
      }
      assert.ok(written > 0);
      const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      // Whole tables share the snapshots of at most max_sync_workers lanes.
      const lsns = new Set([...runner!.launcher.progress.values()].map((p) => p.syncLsn));
      assert.ok(lsns.size <= 2, `${lsns.size} snapshots for ${TABLES.length} tables`);
      for (const table of TABLES.filter((t) => t !== 'app.parted' && t !== 'app.busy')) {
        const { tuples, frozen } = await frozenShare(table);
        assert.ok(tuples > 0, `${table} has tuples`);
        if (FROZEN.includes(table)) assert.equal(frozen, tuples, `${table} loaded frozen`);
        else assert.equal(frozen, 0, `${table} copied without FREEZE`);
      }
      for (const part of ['app.parted_1', 'app.parted_2']) assert.equal((await frozenShare(part)).frozen, 0, `${part} (partitioned target) copied without FREEZE`);
      const [fired] = await target.query(`SELECT count(*)::int AS n FROM app.truncations`, [], 'dst');
      assert.equal(fired!.n, 0, 'no TRUNCATE fired the trigger of app.trig');
      // The primary keys came back after the copy and serve the stream.
      await publisher.query(
        `UPDATE app.plain SET v = v || '!' WHERE id % 100 = 0; DELETE FROM app.child WHERE id % 7 = 0; INSERT INTO app.plain VALUES (30000, 'new');`,
        [],
        'src',
      );
      await allReady();
      const again = await compareTables(publisher, 'src', target, 'dst', TABLES);
      assert.ok(again.equal, JSON.stringify(again));
    });

    test('a resync empties the filled table and loads it frozen again', async () => {
      await target.query(`DELETE FROM app.plain WHERE id < 100`, [], 'dst'); // drift
      await runner!.launcher.resync('app', 'plain');
      await allReady();
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.plain']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      const { tuples, frozen } = await frozenShare('app.plain');
      assert.equal(frozen, tuples);
    });

    test('copy_freeze off: a resync copies plainly', async () => {
      await stopRunner();
      runner = start({ copy_freeze: false });
      await allReady();
      await runner.launcher.resync('app', 'plain');
      // A change to move the stream past the copy's position (an idle publisher only sends keepalives).
      await waitFor(async () => (await states())['app.plain'] !== 'd', { timeoutMs: 60_000, intervalMs: 50, what: 'app.plain copied' });
      await publisher.query(`INSERT INTO app.plain VALUES (40000, 'after resync')`, [], 'src');
      await allReady();
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.plain']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      assert.equal((await frozenShare('app.plain')).frozen, 0);
    });
  });
}
