/**
 * Exactly once across crashes: pgsub is SIGKILLed at random moments while a workload of
 * more than 10,000 source transactions runs, and restarted each time. At the end the
 * target equals the source with nothing lost and nothing duplicated — the ledger table
 * has no unique constraint, so a transaction applied twice would show as extra rows.
 * Throughout, the slot's confirmed_flush_lsn is sampled and must never exceed the origin
 * LSN committed in the target (read after it, so the comparison is conservative).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { compareTables, connect, currentWalLsn, lsnToBigint, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, type Cluster, type PgsubProcess } from '../harness/index.js';

const SEED = Number(process.env.PGSUB_CRASH_SEED ?? Date.now() % 100_000);
const CLIENTS = 4;
const TRANSACTIONS_PER_CLIENT = 2600;
const MIN_KILLS = 5;

function prng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 0x1_0000_0000;
  };
}

const SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.ledger (client int NOT NULL, seq int NOT NULL, amount int NOT NULL, note text);
  CREATE TABLE app.accounts (id int PRIMARY KEY, balance bigint NOT NULL, touched int NOT NULL DEFAULT 0);
  CREATE TABLE app.tags (client int, seq int, tag text, PRIMARY KEY (client, seq));
`;

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'crash-pub' }), startCluster({ major: 18, name: 'crash-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} INSERT INTO app.accounts SELECT g, 0 FROM generate_series(1, 100) g; CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags;`, [], 'src');
  await target.query(`${SCHEMA} INSERT INTO app.accounts SELECT g, 0 FROM generate_series(1, 100) g;`, [], 'dst');
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

async function originLsn(): Promise<bigint | null> {
  const rows = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'crash'`, [], 'dst').catch(() => []);
  return rows[0] ? lsnToBigint(rows[0].lsn) : null;
}

async function runClient(client: number): Promise<void> {
  const rand = prng(SEED * 31 + client);
  const db: pg.Client = await connect(publisher, 'src');
  try {
    for (let seq = 0; seq < TRANSACTIONS_PER_CLIENT; seq++) {
      const account = 1 + Math.floor(rand() * 100);
      const amount = 1 + Math.floor(rand() * 1000);
      await db.query('BEGIN');
      await db.query('INSERT INTO app.ledger VALUES ($1, $2, $3, $4)', [client, seq, amount, `payment ${client}/${seq}`]);
      await db.query('UPDATE app.accounts SET balance = balance + $2, touched = touched + 1 WHERE id = $1', [account, amount]);
      if (seq % 4 === 0) await db.query('INSERT INTO app.tags VALUES ($1, $2, $3)', [client, seq, `t${seq}`]);
      if (seq % 12 === 8) await db.query('DELETE FROM app.tags WHERE client = $1 AND seq = $2', [client, seq - 8]);
      await db.query('COMMIT');
    }
  } finally {
    await db.end();
  }
}

test(`SIGKILL at random moments during ${CLIENTS * TRANSACTIONS_PER_CLIENT} transactions: nothing lost, nothing duplicated (seed ${SEED})`, { timeout: 600_000 }, async () => {
  const rand = prng(SEED);
  const env = {
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'crash',
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_LOG_LEVEL: 'info',
  };

  // Sample the invariant for the whole run: confirmed_flush (read first) <= origin (read after).
  let samples = 0;
  const violations: string[] = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const confirmed = await slotConfirmedLsn(publisher, 'crash').catch(() => null);
      const origin = await originLsn();
      if (confirmed !== null && origin !== null) {
        samples++;
        if (confirmed > origin) violations.push(`confirmed ${confirmed} > origin ${origin}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  })();

  let first = spawnPgsub(env);
  children.push(first);
  await first.waitForLog('streaming started');
  let workloadDone = false;
  const workload = Promise.all(Array.from({ length: CLIENTS }, (_, c) => runClient(c))).then(() => {
    workloadDone = true;
  });

  let kills = 0;
  let current = first;
  while (!workloadDone || kills < MIN_KILLS) {
    // Let it apply for a random while (after its startup), then kill it mid-flight.
    await current.waitForLog('streaming started');
    await new Promise((r) => setTimeout(r, 200 + Math.floor(rand() * 1500)));
    current.kill('SIGKILL');
    assert.equal(await current.exited, 'SIGKILL');
    kills++;
    current = spawnPgsub(env);
    children.push(current);
  }
  await workload;

  // Last run: let it catch up, then stop it cleanly.
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, 'crash')) ?? 0n) >= end, { timeoutMs: 180_000, intervalMs: 200, what: 'catch-up after the last restart' });
  current.kill('SIGTERM');
  assert.equal(await current.exited, 0, current.output().slice(-3000));
  sampling = false;
  await sampler;

  assert.ok(kills >= MIN_KILLS, `only ${kills} kills`);
  assert.deepEqual(violations, [], 'the slot confirmed a position the target had not committed');
  assert.ok(samples > 50, `only ${samples} samples of the flush invariant`);

  const [src] = await publisher.query(`SELECT count(*)::int AS n FROM app.ledger`, [], 'src');
  assert.equal(src.n, CLIENTS * TRANSACTIONS_PER_CLIENT);
  const dupes = await target.query(`SELECT client, seq, count(*)::int AS n FROM app.ledger GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 5`, [], 'dst');
  assert.deepEqual(dupes, [], 'duplicated transactions in the target');
  const [dst] = await target.query(`SELECT count(*)::int AS n FROM app.ledger`, [], 'dst');
  assert.equal(dst.n, src.n, 'lost transactions in the target');
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['app.ledger', 'app.accounts', 'app.tags']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  const [applied] = await target.query(`SELECT transactions_applied::int AS n FROM pgsub.origin WHERE subscription = 'crash'`, [], 'dst');
  assert.equal(applied.n, CLIENTS * TRANSACTIONS_PER_CLIENT, 'each source transaction counted exactly once in the origin row');
  process.stdout.write(`# crash test: seed ${SEED}, ${kills} kills, ${samples} invariant samples, ${dst.n} ledger rows\n`);
});
