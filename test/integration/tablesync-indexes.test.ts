/**
 * Indexes built after the copy (defer_indexes, tablesync/deferred-indexes.ts), PG18 → PG18
 * and PG18 → PG16: an empty target table loses its droppable indexes for the copy and gets
 * them back, equal to the originals (definitions, constraint names and kinds, deferrability,
 * NOT NULL), with the rows copied exactly while the publisher keeps writing; what must not be
 * dropped keeps its OID (a key other tables reference, an exclusion constraint, the replica
 * identity index, a commented index). A copy cut short after the drop (what a crash leaves)
 * gets them back from the next copy, even with defer_indexes turned off meanwhile, and from
 * `pgsub drop`. With defer_indexes off, no index is touched. The rebuild runs without
 * parallel workers unless the target's max_parallel_maintenance_workers was configured.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { dropSubscription } from '../../src/cli/drop.js';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { deferIndexes, restoreIndexes, type Run } from '../../src/tablesync/deferred-indexes.js';
import { compareTables, currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.t1 (id bigint PRIMARY KEY, code text NOT NULL, email text, n int,
    CONSTRAINT t1_code_key UNIQUE (code),
    CONSTRAINT "t1 email/n" UNIQUE NULLS NOT DISTINCT (email, code) DEFERRABLE INITIALLY DEFERRED);
  CREATE INDEX t1_lower_email ON app.t1 (lower(email)) WHERE n > 0;
  CREATE INDEX t1_n_hash ON app.t1 USING hash (n);
  CREATE INDEX "T1 Odd" ON app.t1 (n DESC NULLS LAST) INCLUDE (code) WITH (fillfactor = 70);
  CREATE INDEX t1_commented ON app.t1 (code, n);
  COMMENT ON INDEX app.t1_commented IS 'kept: a comment is not in the definition';
  CREATE UNIQUE INDEX t1_ident ON app.t1 (code, id);
  CREATE TABLE app.parent (id int PRIMARY KEY, name text NOT NULL UNIQUE);
  CREATE TABLE app.child (id int PRIMARY KEY, parent_id int REFERENCES app.parent (id), note text);
  CREATE INDEX child_parent ON app.child (parent_id);
  CREATE TABLE app.rooms (id int PRIMARY KEY, during tsrange NOT NULL, EXCLUDE USING gist (during WITH &&));
`;
// The replica identity index only on the target: the publisher sends the key it has.
const TARGET_ONLY = `ALTER TABLE app.t1 REPLICA IDENTITY USING INDEX t1_ident;`;
const TABLES = ['app.t1', 'app.parent', 'app.child', 'app.rooms'];
const FILL = `
  INSERT INTO app.t1 SELECT g, 'c' || g, CASE WHEN g % 5 = 0 THEN NULL ELSE 'u' || g || '@x' END, g % 97 FROM generate_series(1, 50000) g;
  INSERT INTO app.parent SELECT g, 'p' || g FROM generate_series(1, 2000) g;
  INSERT INTO app.child SELECT g, 1 + g % 2000, 'n' || g FROM generate_series(1, 20000) g;
  INSERT INTO app.rooms SELECT g, tsrange(timestamp '2024-01-01' + g * interval '1 hour', timestamp '2024-01-01' + (g + 1) * interval '1 hour') FROM generate_series(1, 5000) g;`;
const KEPT = ['t1_commented', 't1_ident', 'parent_pkey', 'rooms_during_excl'];
const DEFERRED = ['t1_pkey', 't1_code_key', 't1 email/n', 't1_lower_email', 't1_n_hash', 'T1 Odd', 'parent_name_key', 'child_pkey', 'child_parent', 'rooms_pkey'];

/** Everything about the app schema's indexes and constraints a rebuild could get wrong. */
async function schemaShape(c: Cluster, db: string): Promise<unknown> {
  const indexes = await c.query(
    `SELECT ic.relname AS idx, pg_get_indexdef(i.indexrelid) AS def, i.indisprimary, i.indisunique, i.indisreplident, i.indimmediate, i.indisvalid,
            obj_description(i.indexrelid, 'pg_class') AS comment
       FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class c ON c.oid = i.indrelid
      WHERE c.relnamespace = 'app'::regnamespace ORDER BY ic.relname`,
    [],
    db,
  );
  const constraints = await c.query(
    `SELECT conrelid::regclass::text AS tbl, conname, contype, condeferrable, condeferred, pg_get_constraintdef(oid) AS def, conindid::regclass::text AS idx
       FROM pg_constraint WHERE connamespace = 'app'::regnamespace ORDER BY 1, 2`,
    [],
    db,
  );
  const columns = await c.query(
    `SELECT a.attrelid::regclass::text AS tbl, a.attname, a.attnotnull FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      WHERE c.relnamespace = 'app'::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1, 2`,
    [],
    db,
  );
  const tables = await c.query(`SELECT relname, relreplident FROM pg_class WHERE relnamespace = 'app'::regnamespace AND relkind = 'r' ORDER BY 1`, [], db);
  return { indexes, constraints, columns, tables };
}

async function indexOids(c: Cluster, db: string): Promise<Record<string, number>> {
  const rows = await c.query(`SELECT c.relname, c.oid::int AS oid FROM pg_class c WHERE c.relnamespace = 'app'::regnamespace AND c.relkind = 'i'`, [], db);
  return Object.fromEntries(rows.map((r) => [r.relname, r.oid]));
}

for (const targetMajor of [18, 16]) {
  describe(`indexes built after the copy, PG18 → PG${targetMajor}`, () => {
    let publisher: Cluster;
    let target: Cluster;
    let runner: Runner | null = null;
    let original: unknown;
    const sub = `defer${targetMajor}`;

    before(async () => {
      [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'defer-pub' }), startCluster({ major: targetMajor, name: `defer-tgt${targetMajor}` })]);
      await publisher.createDatabase('src');
      await target.createDatabase('dst');
      await publisher.query(`${SCHEMA} ${FILL} CREATE PUBLICATION pub FOR TABLE ${TABLES.join(', ')};`, [], 'src');
      await target.query(`${SCHEMA} ${TARGET_ONLY}`, [], 'dst');
      original = await schemaShape(target, 'dst');
    });

    after(async () => {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      await publisher?.stop();
      await target?.stop();
    });

    const configFor = (extra: Record<string, unknown> = {}) =>
      loadConfig({
        env: {},
        overrides: {
          subscription: sub,
          source: publisher.url('src'),
          target: target.url('dst'),
          publication: 'pub',
          status_interval: 1,
          max_sync_workers: 4,
          sync_range_min_mb: 0,
          retry_min_delay: 0.2,
          retry_max_delay: 1,
          ...extra,
        },
      });

    async function stopRunner(): Promise<void> {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      runner = null;
    }

    /** One runner at a time, stopped even when the test fails. */
    async function withRunner(extra: Record<string, unknown>, body: (r: Runner) => Promise<void>): Promise<void> {
      await stopRunner();
      runner = startRunner(configFor(extra), createLogger('warn'));
      try {
        await body(runner);
      } finally {
        await stopRunner();
      }
    }

    async function allReady(): Promise<void> {
      await waitFor(
        async () => {
          const rows = await target
            .query(`SELECT count(*) FILTER (WHERE state <> 'r')::int AS waiting, count(*)::int AS total FROM pgsub.subscription_rel WHERE subscription = $1`, [sub], 'dst')
            .catch(() => [{ waiting: 1, total: 0 }]);
          return rows[0].total === TABLES.length && rows[0].waiting === 0;
        },
        { timeoutMs: 120_000, intervalMs: 100, what: 'all tables ready' },
      );
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, sub)) ?? 0n) >= end, { timeoutMs: 120_000, intervalMs: 100, what: 'catch-up' });
    }

    async function assertExact(): Promise<void> {
      const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      assert.deepEqual(await schemaShape(target, 'dst'), original);
      const left = await target.query(`SELECT count(*)::int AS n FROM pgsub.deferred_index`, [], 'dst');
      assert.equal(left[0].n, 0);
    }

    /** What a crash right after a copy's first transaction leaves: indexes dropped and recorded, table in datasync. */
    async function cutShort(table: string): Promise<void> {
      const client = new pg.Client({ connectionString: target.url('dst') });
      await client.connect();
      try {
        await client.query('BEGIN');
        await client.query(`DELETE FROM app.${table}`);
        const dropped = await deferIndexes(async (text, params) => (await client.query(text, params)).rows, sub, 'app', table);
        assert.ok(dropped.length > 0);
        await client.query(`UPDATE pgsub.subscription_rel SET state = 'd' WHERE subscription = $1 AND table_name = $2`, [sub, table]);
        await client.query('COMMIT');
      } finally {
        await client.end();
      }
    }

    test('initial copy under concurrent writes: indexes dropped, rebuilt equal, rows exact', async () => {
      const before = await indexOids(target, 'dst');
      await withRunner({}, async () => {
        // Keys, unique values and the exclusion constraint all in play while the copy runs.
        let writing = true;
        const writes = (async () => {
          for (let i = 0; writing && i < 2000; i++) {
            await publisher.query(
              `INSERT INTO app.t1 VALUES (${100000 + i}, 'new${i}', 'n${i}@x', ${i % 97});
             UPDATE app.t1 SET n = n + 1, email = email || '.' WHERE id = ${1 + ((i * 37) % 50000)};
             DELETE FROM app.t1 WHERE id = ${1 + ((i * 101) % 50000)};
             INSERT INTO app.child VALUES (${100000 + i}, ${1 + (i % 2000)}, 'w');
             UPDATE app.parent SET name = name || '+' WHERE id = ${1 + (i % 2000)};
             DELETE FROM app.rooms WHERE id = ${1 + (i % 5000)};`,
              [],
              'src',
            );
          }
        })();
        await waitFor(
          async () =>
            (
              await target.query(`SELECT count(*)::int AS n FROM pgsub.subscription_rel WHERE subscription = $1 AND state IN ('f', 's', 'r')`, [sub], 'dst').catch(() => [{ n: 0 }])
            )[0].n === TABLES.length,
          {
            timeoutMs: 120_000,
            intervalMs: 50,
            what: 'copies finished',
          },
        );
        writing = false;
        await writes;
        await allReady();
        await assertExact();
        const now = await indexOids(target, 'dst');
        for (const name of KEPT) assert.equal(now[name], before[name], `${name} must not have been dropped`);
        for (const name of DEFERRED) assert.notEqual(now[name], before[name], `${name} should have been built after the copy`);
        // The rebuilt key serves the stream.
        await publisher.query(`UPDATE app.t1 SET code = code || '!' WHERE id % 1000 = 0; DELETE FROM app.child WHERE id % 3 = 0;`, [], 'src');
        await allReady();
        await assertExact();
      });
    });

    test('a copy cut short after the drop gets its indexes back from the next copy, even with defer_indexes off', async () => {
      await cutShort('t1');
      assert.notDeepEqual(await schemaShape(target, 'dst'), original);
      await withRunner({ defer_indexes: false }, async () => {
        await allReady();
        await assertExact();
      });
    });

    test('defer_indexes off: a resync touches no index', async () => {
      const before = await indexOids(target, 'dst');
      await withRunner({ defer_indexes: false }, async (r) => {
        await allReady();
        await r.launcher.resync('app', 't1');
        await publisher.query(`UPDATE app.t1 SET n = n + 1 WHERE id % 500 = 0`, [], 'src');
        await allReady();
        await assertExact();
        assert.deepEqual(await indexOids(target, 'dst'), before);
      });
    });

    test('pgsub drop puts back the indexes of a copy cut short', async () => {
      await cutShort('child');
      await dropSubscription(configFor(), { keepSlot: false });
      assert.deepEqual(await schemaShape(target, 'dst'), original);
      const left = await target.query(`SELECT count(*)::int AS n FROM pgsub.deferred_index`, [], 'dst');
      assert.equal(left[0].n, 0);
    });

    test('the rebuild runs without parallel workers unless the target configured them', async () => {
      await target.query(`CREATE TABLE app.scratch (id int PRIMARY KEY)`, [], 'dst');
      const workersDuringRebuild = async (): Promise<unknown> => {
        const client = new pg.Client({ connectionString: target.url('dst') });
        await client.connect();
        try {
          const run: Run = async (text, params) => (await client.query(text, params)).rows as Record<string, unknown>[];
          await client.query('BEGIN');
          assert.deepEqual(await deferIndexes(run, 'settings', 'app', 'scratch'), ['scratch_pkey']);
          assert.deepEqual(await restoreIndexes(run, 'settings', 'app', 'scratch'), ['scratch_pkey']);
          const [row] = await run(`SELECT pg_catalog.current_setting('max_parallel_maintenance_workers') AS n`);
          await client.query('COMMIT');
          return row?.n;
        } finally {
          await client.end();
        }
      };
      try {
        assert.equal(await workersDuringRebuild(), '0');
        await target.query(`ALTER DATABASE dst SET max_parallel_maintenance_workers = 3`);
        assert.equal(await workersDuringRebuild(), '3');
      } finally {
        await target.query(`ALTER DATABASE dst RESET max_parallel_maintenance_workers`);
        await target.query(`DROP TABLE app.scratch`, [], 'dst');
      }
    });
  });
}
