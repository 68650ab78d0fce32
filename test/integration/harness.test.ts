import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import pg from 'pg';
import { startCluster, stopAllClusters, type Cluster } from '../harness/index.js';

const MAJORS = [12, 14, 16, 18];

describe('test harness clusters', () => {
  after(() => stopAllClusters());

  for (const major of MAJORS) {
    test(`PostgreSQL ${major}: start, query, createDatabase, restart, stop`, async () => {
      let cluster: Cluster | undefined;
      try {
        cluster = await startCluster({ major, name: `harness${major}`, settings: { application_name: 'harness-test' } });
        assert.equal(cluster.host, '127.0.0.1');
        assert.equal(cluster.user, 'postgres');
        assert.ok(cluster.port > 0 && cluster.port < 32768, `port ${cluster.port}`);
        assert.ok(existsSync(cluster.dataDir), 'data dir exists while running');

        const [ver] = await cluster.query<{ server_version_num: string }>('SHOW server_version_num');
        assert.ok(ver);
        assert.equal(Math.floor(Number(ver.server_version_num) / 10000), major);

        const [wal] = await cluster.query<{ wal_level: string }>('SHOW wal_level');
        assert.equal(wal?.wal_level, 'logical');
        // settings from ClusterOptions are applied; defaults apply too
        const [mpt] = await cluster.query<{ max_prepared_transactions: string }>('SHOW max_prepared_transactions');
        assert.equal(mpt?.max_prepared_transactions, '10');

        // simple protocol with several statements returns the last result's rows
        const multi = await cluster.query<{ x: number }>('SELECT 1 AS x; SELECT 2 AS x');
        assert.deepEqual(multi, [{ x: 2 }]);
        const withParams = await cluster.query<{ s: string }>('SELECT $1::text AS s', ['hi']);
        assert.deepEqual(withParams, [{ s: 'hi' }]);

        await cluster.createDatabase('pgsub_Test');
        const [db] = await cluster.query<{ d: string }>('SELECT current_database() AS d', [], 'pgsub_Test');
        assert.equal(db?.d, 'pgsub_Test');
        assert.match(cluster.url('pgsub_Test'), new RegExp(`^postgres://postgres@127\\.0\\.0\\.1:${cluster.port}/pgsub_Test$`));

        // the URL works with a plain client, and a replication connection is allowed (pg_hba trust)
        const repl = new pg.Client({ connectionString: cluster.url('pgsub_Test'), replication: 'database' } as pg.ClientConfig);
        await repl.connect();
        try {
          const r = await repl.query('IDENTIFY_SYSTEM');
          assert.equal(r.rows.length, 1);
          assert.equal(r.rows[0].dbname, 'pgsub_Test');
        } finally {
          await repl.end();
        }

        await cluster.restart();
        const dbs = await cluster.query<{ datname: string }>("SELECT datname FROM pg_database WHERE datname = 'pgsub_Test'");
        assert.equal(dbs.length, 1, 'database survives restart');
        const [wal2] = await cluster.query<{ wal_level: string }>('SHOW wal_level');
        assert.equal(wal2?.wal_level, 'logical', 'settings survive restart');

        const dataDir = cluster.dataDir;
        await cluster.stop();
        assert.equal(existsSync(dataDir), false, 'stop() removes the data dir');
        await cluster.stop(); // idempotent
      } finally {
        await cluster?.stop();
      }
    });
  }
});
