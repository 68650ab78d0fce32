/**
 * Table sync end to end: the initial copy of prefilled tables (one large enough to be
 * split into page ranges copied in parallel under one snapshot) while the publisher keeps
 * writing, then the hand-off to streaming with no gap and no overlap; a table added to
 * the publication later, synced while the others keep streaming; a non-empty target
 * table refused unless truncate_before_copy; resync of one table.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import type { SessionEvents } from '../../src/service/session.js';
import { checkLedger, compareTables, currentWalLsn, LEDGER_SCHEMA, runLedgerWorkload, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const BIG_ROWS = 200_000;
const EXTRA = `
  CREATE TABLE app.big (id bigint PRIMARY KEY, payload text NOT NULL, n int);
  CREATE TABLE app.late (id int PRIMARY KEY, v text);
`;

for (const [publisherMajor, targetMajor] of [
  [18, 18],
  [14, 18],
] as const) {
  describe(`table sync PG${publisherMajor} → PG${targetMajor}`, () => {
    let publisher: Cluster;
    let target: Cluster;
    let runner: Runner | null = null;
    const sub = `sync${publisherMajor}`;

    before(async () => {
      [publisher, target] = await Promise.all([
        startCluster({ major: publisherMajor, name: `sync-pub${publisherMajor}` }),
        startCluster({ major: targetMajor, name: `sync-tgt${targetMajor}` }),
      ]);
      await publisher.createDatabase('src');
      await target.createDatabase('dst');
      await publisher.query(`${LEDGER_SCHEMA} ${EXTRA}`, [], 'src');
      await target.query(`${LEDGER_SCHEMA} ${EXTRA}`, [], 'dst');
      // The target's accounts rows would collide with the copy: the target starts empty.
      await target.query(`TRUNCATE app.accounts`, [], 'dst');
      await publisher.query(
        `INSERT INTO app.big SELECT g, repeat(md5(g::text), 3), g % 1000 FROM generate_series(1, ${BIG_ROWS}) g;
         INSERT INTO app.late SELECT g, 'late ' || g FROM generate_series(1, 1000) g;
         CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags, app.big;`,
        [],
        'src',
      );
      await runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 200, seed: 1, firstClient: 0 });
    });

    after(async () => {
      runner?.stop();
      await runner?.done.catch(() => undefined);
      await publisher?.stop();
      await target?.stop();
    });

    function start(extra: Record<string, unknown> = {}, events: SessionEvents = {}): Runner {
      const config = loadConfig({
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
      return startRunner(config, createLogger('warn'), events);
    }

    async function caughtUp(): Promise<void> {
      const end = await currentWalLsn(publisher, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(publisher, sub)) ?? 0n) >= end, { timeoutMs: 120_000, intervalMs: 100, what: 'catch-up' });
    }

    async function states(): Promise<Record<string, string>> {
      const rows = await target.query(`SELECT schema_name || '.' || table_name AS t, state FROM pgsub.subscription_rel WHERE subscription = $1`, [sub], 'dst');
      return Object.fromEntries(rows.map((r) => [r.t, r.state]));
    }

    test('a non-empty target table is refused at initial copy; a stop during the copy ends the session start', async () => {
      await target.query(`INSERT INTO app.tags VALUES (999, 999, 'local')`, [], 'dst');
      let streamed = false;
      runner = start({}, { onStreaming: () => (streamed = true) });
      await waitFor(async () => runner!.launcher.progress.size > 0, { timeoutMs: 30_000, what: 'copies to start' });
      // The other tables copy; app.tags keeps failing with a clear error and stays in init.
      await waitFor(async () => (await states())['app.big'] === 'f' || (await states())['app.big'] === 'd', { timeoutMs: 60_000, what: 'big to copy' });
      assert.equal((await states())['app.tags'], 'i');
      runner.stop();
      await runner.done;
      // The session was starting (waiting for the initial copy) when stopped: it goes no
      // further, and once the runner is done nothing of it is left on either side.
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(streamed, false, 'a session abandoned during its start went on to stream');
      const left = async (cluster: Cluster, db: string) =>
        (await cluster.query(`SELECT application_name FROM pg_stat_activity WHERE application_name IN ($1, $2, $3)`, [sub, `pgsub_${sub}`, `pgsub_${sub}_verify`], db)).map(
          (r) => r.application_name,
        );
      assert.deepEqual([...(await left(publisher, 'src')), ...(await left(target, 'dst'))], []);
      await target.query(`DELETE FROM app.tags`, [], 'dst');
    });

    test('initial copy under concurrent writes, split ranges, hand-off to streaming: exactly once', async () => {
      const writes = runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 400, seed: 2, firstClient: 10, pauseMs: 1 });
      runner = start();
      await writes;
      await publisher.query(`UPDATE app.big SET n = n + 1 WHERE id % 1000 = 0; DELETE FROM app.big WHERE id % 777 = 0;`, [], 'src');
      await waitFor(async () => Object.values(await states()).every((s) => s === 'r'), { timeoutMs: 120_000, intervalMs: 200, what: 'all tables ready' });
      await caughtUp();
      const ledger = await checkLedger(publisher, 'src', target, 'dst');
      assert.deepEqual(ledger.duplicates, []);
      assert.equal(ledger.targetRows, ledger.sourceRows);
      assert.ok(ledger.equal);
      const big = await compareTables(publisher, 'src', target, 'dst', ['app.big']);
      assert.ok(big.equal, JSON.stringify(big));
      const [copied] = await target.query(
        `SELECT rows_copied::int AS rows, bytes_copied::bigint AS bytes FROM pgsub.subscription_rel WHERE subscription = $1 AND table_name = 'big'`,
        [sub],
        'dst',
      );
      assert.equal(copied.rows, BIG_ROWS);
    });

    test('a table added to the publication later is synced while the others keep streaming', async () => {
      const writes = runLedgerWorkload(publisher, 'src', { clients: 1, transactionsPerClient: 300, seed: 3, firstClient: 20, pauseMs: 2 });
      await publisher.query(`ALTER PUBLICATION pub ADD TABLE app.late`, [], 'src');
      await publisher.query(`INSERT INTO app.late SELECT g, 'after add ' || g FROM generate_series(1001, 1500) g; UPDATE app.late SET v = v || '!' WHERE id % 10 = 0;`, [], 'src');
      await runner!.launcher.refresh();
      await publisher.query(`DELETE FROM app.late WHERE id % 7 = 0; INSERT INTO app.late VALUES (5000, 'during');`, [], 'src');
      await writes;
      await waitFor(async () => (await states())['app.late'] === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'app.late ready' });
      await caughtUp();
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.late']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
      const ledger = await checkLedger(publisher, 'src', target, 'dst');
      assert.deepEqual(ledger.duplicates, []);
      assert.ok(ledger.equal);
    });

    test('resync of one table while the others stream', async () => {
      await target.query(`DELETE FROM app.late WHERE id < 100`, [], 'dst'); // drift the target
      await runner!.launcher.resync('app', 'late');
      await publisher.query(`INSERT INTO app.late VALUES (6000, 'during resync')`, [], 'src');
      await waitFor(async () => (await states())['app.late'] === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'app.late ready again' });
      await caughtUp();
      const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.late', 'app.big']);
      assert.ok(cmp.equal, JSON.stringify(cmp));
    });
  });
}
