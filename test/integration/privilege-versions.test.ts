/**
 * The privilege probes (src/migrate/grants.ts) against what PostgreSQL 10, 12, 14, 16 and 18
 * really let a role do: for each thing README's "Privileges" table says a command needs,
 * the statement pgsub runs is tried as a role without the privilege and with it (the GRANT
 * the probe prints), and the probe's verdict must match the server's, per version. So the
 * table's version limits are measured, not assumed: session_replication_role takes a
 * superuser before 15, the replication origin functions before 14; another role's session
 * is invisible to the fence without pg_read_all_stats on every version and cannot be ended
 * without pg_signal_backend (nor a superuser's by a non-superuser); pg_logical_emit_message
 * and pg_prepared_xacts take nothing; pg_dump's LOCK TABLE takes SELECT; setval takes
 * UPDATE; CREATE SCHEMA IF NOT EXISTS takes CREATE on the database even when the schema
 * exists; CREATE PUBLICATION … FOR TABLE takes the table's owner.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { parseConninfo } from '../../src/config/conninfo.js';
import { openPgDb, type Db } from '../../src/migrate/db.js';
import {
  APPLY_ORIGIN_FUNCTIONS,
  fixes,
  needCreateOnDatabase,
  needOnRelations,
  needOriginFunctions,
  needReplicaRole,
  needReplication,
  needRole,
  sideOf,
  type SideLacks,
} from '../../src/migrate/grants.js';
import { startCluster, stopAllClusters, type Cluster } from '../harness/index.js';

const MAJORS = [10, 12, 14, 16, 18];
let clusters: Cluster[] = [];

before(async () => {
  clusters = await Promise.all(MAJORS.map((major) => startCluster({ major, name: `pv${major}` })));
  for (const c of clusters) {
    await c.createDatabase('app');
    await c.query(
      `CREATE ROLE plain LOGIN; CREATE ROLE other LOGIN;
       CREATE SCHEMA s; GRANT USAGE ON SCHEMA s TO plain;
       CREATE TABLE s.t (id int PRIMARY KEY, v int); CREATE SEQUENCE s.q;`,
      [],
      'app',
    );
  }
});

after(async () => {
  await stopAllClusters();
});

/** Runs `sql` as `role` on its own connection: null when it worked, else the SQLSTATE. */
async function as(c: Cluster, role: string, sql: string): Promise<string | null> {
  const client = new pg.Client({ host: c.host, port: c.port, user: role, database: 'app' });
  client.on('error', () => {});
  await client.connect();
  try {
    await client.query(sql);
    return null;
  } catch (err) {
    return (err as { code?: string }).code ?? 'error';
  } finally {
    await client.end();
  }
}

/** The probe's verdict for `role`: what it lacks for `need`. */
async function probe(c: Cluster, role: string, need: (s: SideLacks) => Promise<void> | void): Promise<SideLacks> {
  const db: Db = await openPgDb(parseConninfo(`postgresql://${role}@${c.host}:${c.port}/app`, 'source', {}), 'pgsub_probe');
  try {
    const s = await sideOf(db);
    await need(s);
    return s;
  } finally {
    await db.close();
  }
}

/**
 * The probe and the server agree, before and after the fix the probe prints: without it
 * both say no (the statement fails with 42501), with it both say yes.
 */
async function agree(c: Cluster, what: string, need: (s: SideLacks) => Promise<void> | void, statement: string, setup = ''): Promise<string[]> {
  if (setup) await c.query(setup, [], 'app');
  const before = await probe(c, 'plain', need);
  const refused = await as(c, 'plain', statement);
  assert.ok(before.lacks.length > 0, `PG${c.major} ${what}: the probe finds nothing lacking`);
  assert.equal(refused, '42501', `PG${c.major} ${what}: the server let it through (${refused})`);
  // The statements pgsub's refusal prints, run as printed.
  const statements = fixes(before.lacks, 'plain');
  const superuser = statements.some((f) => /SUPERUSER/.test(f));
  for (const f of statements) await c.query(f, [], 'app');
  const afterFix = await probe(c, 'plain', need);
  const allowed = await as(c, 'plain', statement);
  assert.deepEqual(
    afterFix.lacks.map((l) => l.what),
    [],
    `PG${c.major} ${what}: still lacking after ${statements.join(' ')}`,
  );
  assert.equal(allowed, null, `PG${c.major} ${what}: refused after ${statements.join(' ')} (${allowed})`);
  if (superuser) await c.query('ALTER ROLE plain NOSUPERUSER', [], 'app');
  return statements;
}

test('session_replication_role and the replication origin functions: superuser before 15 and 14, grantable after', async () => {
  for (const c of clusters) {
    const fixes = await agree(c, 'session_replication_role', (s) => needReplicaRole(s, 'apply'), 'SET session_replication_role = replica');
    assert.deepEqual(fixes, c.major < 15 ? ['ALTER ROLE plain SUPERUSER;'] : ['GRANT SET ON PARAMETER session_replication_role TO plain;'], `PG${c.major}`);
    const origin = await agree(
      c,
      'origin functions',
      (s) => needOriginFunctions(s, APPLY_ORIGIN_FUNCTIONS, 'apply'),
      `SELECT pg_catalog.pg_replication_origin_create('pv_o') WHERE pg_catalog.pg_replication_origin_oid('pv_o') IS NULL`,
    );
    assert.equal(
      origin.some((f) => /SUPERUSER/.test(f)),
      c.major < 14,
      `PG${c.major}: ${origin.join(' ')}`,
    );
  }
});

test("the fence: another role's session is invisible without pg_read_all_stats and cannot be ended without pg_signal_backend, a superuser's not at all", async () => {
  for (const c of clusters) {
    const other = new pg.Client({ host: c.host, port: c.port, user: 'other', database: 'app' });
    other.on('error', () => {});
    await other.connect();
    const sup = new pg.Client({ host: c.host, port: c.port, user: 'postgres', database: 'app' });
    sup.on('error', () => {});
    await sup.connect();
    try {
      const seen = async () => {
        const client = new pg.Client({ host: c.host, port: c.port, user: 'plain', database: 'app' });
        await client.connect();
        try {
          const { rows } = await client.query(`SELECT backend_type, backend_start IS NOT NULL AS started FROM pg_stat_activity WHERE usename = 'other'`);
          return rows[0] as { backend_type: string | null; started: boolean };
        } finally {
          await client.end();
        }
      };
      // What the fence's query filters on (backend_type = 'client backend', backend_start before the fence).
      assert.deepEqual(await seen(), { backend_type: null, started: false }, `PG${c.major}: another role's session shows its type`);
      assert.deepEqual((await probe(c, 'plain', (s) => needRole(s, 'pg_read_all_stats', 'fence'))).lacks.length, 1);
      await c.query('GRANT pg_read_all_stats TO plain', [], 'app');
      assert.deepEqual(await seen(), { backend_type: 'client backend', started: true }, `PG${c.major}`);
      assert.equal((await probe(c, 'plain', (s) => needRole(s, 'pg_read_all_stats', 'fence'))).lacks.length, 0);

      await agree(c, 'pg_signal_backend', (s) => needRole(s, 'pg_signal_backend', 'fence'), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'other'`);
      assert.equal(
        await as(c, 'plain', `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'postgres' AND backend_type = 'client backend' AND pid <> pg_backend_pid()`),
        '42501',
        `PG${c.major}: a superuser's session ended by a non-superuser`,
      );
      // The cutover's other reads and its marker take nothing.
      assert.equal(await as(c, 'other', `SELECT pg_logical_emit_message(true, 'pgsub_cutover', 'x')`), null, `PG${c.major} pg_logical_emit_message`);
      assert.equal(await as(c, 'other', 'SELECT count(*) FROM pg_prepared_xacts'), null, `PG${c.major} pg_prepared_xacts`);
      assert.equal(await as(c, 'other', 'SELECT count(*) FROM pg_db_role_setting'), null, `PG${c.major} pg_db_role_setting`);
    } finally {
      await other.end().catch(() => {});
      await sup.end().catch(() => {});
    }
  }
});

test('slots, sequences, pg_dump, schema and publication creation take what the table says, on every version', async () => {
  for (const c of clusters) {
    await c.query(`SELECT pg_create_logical_replication_slot('pv_slot', 'pgoutput')`, [], 'app');
    await agree(c, 'REPLICATION (drop a slot)', (s) => needReplication(s, 'drop'), `SELECT pg_drop_replication_slot('pv_slot')`);
    await c.query('ALTER ROLE plain NOREPLICATION', [], 'app');
    const seq = [{ schema: 's', table: 'q' }];
    await agree(c, 'SELECT on a sequence', (s) => needOnRelations(s, 'sequence', seq, 'read', { privileges: ['SELECT'] }), 'SELECT last_value FROM s.q');
    await agree(c, 'UPDATE on a sequence', (s) => needOnRelations(s, 'sequence', seq, 'set', { privileges: ['SELECT', 'UPDATE'] }), `SELECT setval('s.q', 5, false)`);
    const table = [{ schema: 's', table: 't' }];
    await agree(
      c,
      "SELECT for pg_dump's lock",
      (s) => needOnRelations(s, 'table', table, 'pg_dump', { privileges: ['SELECT'] }),
      'BEGIN; LOCK TABLE s.t IN ACCESS SHARE MODE; COMMIT',
    );
    await agree(c, 'CREATE on the database (CREATE SCHEMA IF NOT EXISTS, existing schema)', (s) => needCreateOnDatabase(s, 'schema copy'), 'CREATE SCHEMA IF NOT EXISTS s');
    await agree(
      c,
      "the table's owner and CREATE on its schema (defer_indexes rebuilds indexes)",
      (s) => needOnRelations(s, 'table', table, 'defer_indexes', { own: true, createInSchema: true }),
      'CREATE INDEX pv_idx ON s.t (v); DROP INDEX s.pv_idx',
    );
    // CREATE on the database came with the test before; the owner is what CREATE PUBLICATION … FOR TABLE adds.
    await c.query('ALTER TABLE s.t OWNER TO postgres; GRANT CREATE ON DATABASE app TO plain', [], 'app');
    await agree(c, 'CREATE PUBLICATION … FOR TABLE (the owner)', (s) => needOnRelations(s, 'table', table, 'reverse', { own: true }), 'CREATE PUBLICATION pv_pub FOR TABLE s.t');
  }
});
