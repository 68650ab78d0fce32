/**
 * streaming = parallel (PG18 → PG18, logical_decoding_work_mem = 64kB): a streamed
 * transaction is applied on a second target connection while the source transaction is
 * still open (proven by that connection's locks on the target), savepoints and ROLLBACK
 * TO SAVEPOINT take back exactly their subtransaction, a stream abort leaves nothing, the
 * commit carries the replication origin; when the leader would wait on the parallel
 * transaction's lock it falls back to the spool; a second concurrent streamed transaction
 * is spooled; SIGKILL with a parallel transaction open loses and duplicates nothing;
 * STREAM PREPARE of a parallel transaction prepares it under its gid. The eager
 * connection reads the spool behind the leader: while it waits on a lock the spool keeps
 * growing, and a COMMIT that fails, a statement that fails, a target restart and a SIGTERM
 * with megabytes spooled ahead of it each end with every row applied exactly once. A PG14
 * publisher is refused with a clear error.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { compareTables, connect, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `CREATE SCHEMA app;
  CREATE TABLE app.items (id int PRIMARY KEY, v text, n int);
  CREATE TABLE app.log (id bigserial PRIMARY KEY, who text, at int);`;
const TABLES = ['app.items', 'app.log'];
const SUB = 'par';

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;
const stateDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-parallel-'));

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'par-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: 'par-tgt', settings: { max_prepared_transactions: '10' } }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items, app.log;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
  start();
  await child!.waitForLog('streaming started');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(stateDir, { recursive: true, force: true });
});

function start(extra: Record<string, string> = {}): PgsubProcess {
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: SUB,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STREAMING: 'parallel',
    PGSUB_TWO_PHASE: 'true',
    PGSUB_STATE_DIR: stateDir,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_LOG_LEVEL: 'debug',
    ...extra,
  });
  return child;
}

const caughtUp = () => waitForCatchUp(publisher, 'src', SUB);

async function assertEqual(): Promise<void> {
  const cmp = await compareTables(publisher, 'src', target, 'dst', TABLES);
  assert.ok(cmp.equal, JSON.stringify(cmp));
}

/** Locks the parallel connection holds on app.items in the target: proof of eager apply. */
async function parallelHoldsItems(): Promise<boolean> {
  const rows = await target.query(
    `SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
      WHERE a.application_name = $1 AND l.relation = 'app.items'::regclass AND l.mode = 'RowExclusiveLock'`,
    [`pgsub_${SUB}_parallel`],
    'dst',
  );
  return rows.length > 0;
}

function logCount(msg: string): number {
  return child!
    .output()
    .split('\n')
    .filter((l) => l.includes(`"msg":"${msg}"`)).length;
}

async function withSource<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = await connect(publisher, 'src');
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

test('applied while the source transaction is open; savepoints, rollback to savepoint, nested; commit carries the origin', async () => {
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, repeat('a', 100), 0 FROM generate_series(1, 3000) g`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'the parallel connection to apply the open transaction' });
    await c.query(`SAVEPOINT s1;
      INSERT INTO app.items SELECT g, repeat('b', 100), 1 FROM generate_series(3001, 6000) g;
      SAVEPOINT s2;
        UPDATE app.items SET n = 2 WHERE id <= 1500;
      ROLLBACK TO SAVEPOINT s2;
      SAVEPOINT s3;
        DELETE FROM app.items WHERE id BETWEEN 100 AND 199;
        SAVEPOINT s4;
          INSERT INTO app.items SELECT g, repeat('c', 100), 4 FROM generate_series(6001, 8000) g;
        RELEASE SAVEPOINT s4;
      RELEASE SAVEPOINT s3;
      INSERT INTO app.log (who, at) SELECT 'sub', g FROM generate_series(1, 500) g;
    ROLLBACK TO SAVEPOINT s1;
    INSERT INTO app.items SELECT g, repeat('d', 100), 5 FROM generate_series(9001, 11000) g;
    UPDATE app.items SET n = 6 WHERE id BETWEEN 1 AND 50;`);
    // Not committed yet: the target must not show any of it.
    const [visible] = await target.query(`SELECT count(*)::int AS n FROM app.items`, [], 'dst');
    assert.equal(visible.n, 0);
    await c.query('COMMIT');
  });
  await caughtUp();
  await assertEqual();
  const [count] = await target.query(`SELECT count(*)::int AS n, count(*) FILTER (WHERE n = 5)::int AS d, count(*) FILTER (WHERE n = 6)::int AS u FROM app.items`, [], 'dst');
  assert.deepEqual(count, { n: 5000, d: 2000, u: 50 });
  assert.equal(logCount('parallel apply fell back to the spool'), 0, child!.output().slice(-3000));
  assert.ok(logCount('parallel transaction finished') >= 1);
  // The commit was stamped with the replication origin, as the leader's commits are.
  const [origin] = await target.query(
    `SELECT remote_lsn::text AS lsn FROM pg_replication_origin_status s JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = $1`,
    [`pgsub_${SUB}`],
    'dst',
  );
  // (remote_lsn of pgsub.origin may be a later idle position; the last commit is what the origin stamps.)
  const [recorded] = await target.query(`SELECT last_commit_end_lsn::text AS lsn FROM pgsub.origin WHERE subscription = $1`, [SUB], 'dst');
  assert.ok(origin?.lsn, 'replication origin has progress');
  assert.equal(origin.lsn, recorded.lsn);
  assert.deepEqual(fs.readdirSync(path.join(stateDir, 'spool')), [], 'spool files removed after use');
});

test('a stream abort rolls the parallel transaction back; the connection is reused', async () => {
  const before = logCount('parallel transaction finished');
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, 'gone', 0 FROM generate_series(50001, 55000) g`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'eager apply' });
    await c.query('ROLLBACK');
  });
  await publisher.query(`INSERT INTO app.log (who, at) VALUES ('after abort', 1)`, [], 'src');
  await caughtUp();
  await waitFor(async () => !(await parallelHoldsItems()), { timeoutMs: 10_000, intervalMs: 100, what: 'rollback on the target' });
  await assertEqual();
  assert.equal(logCount('parallel transaction finished'), before);
  const [conns] = await target.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle'`, [`pgsub_${SUB}_parallel`], 'dst');
  assert.equal(conns.n, 1, 'the parallel connection is idle, not in a transaction');
});

test('the leader waiting on a lock of the parallel transaction makes it fall back to the spool', async () => {
  // A target-only trigger makes the leader's transaction on app.log lock app.items, which
  // the open parallel transaction holds: the leader cannot proceed until it gives way.
  await target.query(
    `CREATE FUNCTION app.lock_items() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN LOCK TABLE app.items IN SHARE MODE; RETURN NEW; END $$;
     CREATE TRIGGER lock_items BEFORE INSERT ON app.log FOR EACH ROW EXECUTE FUNCTION app.lock_items();
     ALTER TABLE app.log ENABLE ALWAYS TRIGGER lock_items;`,
    [],
    'dst',
  );
  const fallbacks = logCount('parallel apply fell back to the spool');
  try {
    await withSource(async (c) => {
      await c.query('BEGIN');
      await c.query(`INSERT INTO app.items SELECT g, 'blocking', 7 FROM generate_series(60001, 65000) g`);
      await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'eager apply' });
      await publisher.query(`INSERT INTO app.log (who, at) VALUES ('leader', 2)`, [], 'src');
      // Applied while the big transaction is still open on the source.
      await waitFor(async () => (await target.query(`SELECT 1 FROM app.log WHERE who = 'leader'`, [], 'dst')).length === 1, {
        timeoutMs: 30_000,
        intervalMs: 100,
        what: 'the leader to get past the lock',
      });
      await c.query(`INSERT INTO app.items SELECT g, 'blocking', 8 FROM generate_series(65001, 66000) g`);
      await c.query('COMMIT');
    });
    await caughtUp();
    await assertEqual();
    assert.equal(logCount('parallel apply fell back to the spool'), fallbacks + 1);
    assert.match(child!.output(), /the leader or an apply lane waits for a lock the parallel transaction holds/);
  } finally {
    await target.query(`DROP TRIGGER lock_items ON app.log; DROP FUNCTION app.lock_items();`, [], 'dst');
  }
});

test('two concurrent streamed transactions: one parallel, the other spooled; interleaved with small ones', async () => {
  const finished = logCount('parallel transaction finished');
  const fallbacks = logCount('parallel apply fell back to the spool');
  const a = await connect(publisher, 'src');
  const b = await connect(publisher, 'src');
  try {
    await a.query('BEGIN');
    await b.query('BEGIN');
    for (let i = 0; i < 4; i++) {
      await a.query(`INSERT INTO app.items SELECT g, 'a', ${i} FROM generate_series(${100000 + i * 2000}, ${100000 + i * 2000 + 1999}) g`);
      await b.query(`INSERT INTO app.items SELECT g, 'b', ${i} FROM generate_series(${200000 + i * 2000}, ${200000 + i * 2000 + 1999}) g`);
      await publisher.query(`INSERT INTO app.log (who, at) VALUES ('small', ${i})`, [], 'src');
      if (i === 2) await b.query(`SAVEPOINT x; UPDATE app.items SET n = 99 WHERE id BETWEEN 200000 AND 200100; ROLLBACK TO SAVEPOINT x`);
    }
    await b.query('COMMIT');
    await a.query(`UPDATE app.items SET v = 'a2' WHERE id % 7 = 0 AND id >= 100000 AND id < 200000`);
    await a.query('COMMIT');
  } finally {
    await a.end();
    await b.end();
  }
  await caughtUp();
  await assertEqual();
  // One slot for eager apply: the first transaction took it, the second was spooled.
  assert.equal(logCount('parallel transaction finished'), finished + 1);
  assert.equal(logCount('parallel apply fell back to the spool'), fallbacks);
});

test('SIGKILL with a parallel transaction open: nothing lost, nothing duplicated', async () => {
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, 'killed', 1 FROM generate_series(300001, 305000) g`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'eager apply' });
    child!.kill('SIGKILL');
    await child!.exited;
    await c.query(`INSERT INTO app.items SELECT g, 'killed', 2 FROM generate_series(305001, 306000) g`);
    await c.query('COMMIT');
  });
  start();
  await caughtUp();
  await assertEqual();
  const [n] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'killed'`, [], 'dst');
  assert.equal(n.n, 6000);
});

test('STREAM PREPARE of a parallel transaction prepares it under its gid; COMMIT PREPARED commits it', async () => {
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, 'prepared', 3 FROM generate_series(400001, 405000) g`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'eager apply' });
    await c.query(`PREPARE TRANSACTION 'big'`);
  });
  await caughtUp();
  const gids = (await target.query<{ gid: string }>(`SELECT gid FROM pg_prepared_xacts WHERE database = 'dst'`, [], 'dst')).map((r) => r.gid);
  assert.equal(gids.length, 1);
  assert.match(gids[0]!, new RegExp(`^pgsub_${SUB}_\\d+$`));
  const [hidden] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'prepared'`, [], 'dst');
  assert.equal(hidden.n, 0);
  await publisher.query(`COMMIT PREPARED 'big'`, [], 'src');
  await caughtUp();
  await assertEqual();
  const left = await target.query(`SELECT gid FROM pg_prepared_xacts WHERE database = 'dst'`, [], 'dst');
  assert.equal(left.length, 0);
});

test('a batch of updates missing a row in the parallel transaction: it falls back to the spool, whose careful replay logs update_missing', async () => {
  // Rows 400001 … 405000 are on both sides; one goes on the target only, in the last
  // batch, which goes out with the commit.
  await target.query(`DELETE FROM app.items WHERE id = 404999`, [], 'dst');
  const fallbacks = logCount('parallel apply fell back to the spool');
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`UPDATE app.items SET n = 4 WHERE id BETWEEN 400001 AND 402000`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 100, what: 'eager apply' });
    await c.query(`UPDATE app.items SET n = 4 WHERE id BETWEEN 402001 AND 405000`);
    await c.query('COMMIT');
  });
  await caughtUp();
  // The eager transaction saw the batch's affected-row count fall short (no check inside
  // the statement there). The careful replay's session streams the transaction again and
  // applies it eagerly again, so it falls back once more before the spool resolves it.
  const fellBack = child!
    .output()
    .split('\n')
    .filter((l) => l.includes('"msg":"parallel apply fell back to the spool"'))
    .slice(fallbacks);
  assert.ok(fellBack.length >= 1);
  for (const l of fellBack) assert.match(l, /update_missing: 1 of \d+ rows to update in \\"app\.items\\" not found/);
  const [n] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'prepared' AND n = 4`, [], 'dst');
  assert.equal(n.n, 4999);
  const logged = await target.query<{ conflict_type: string; key: string; policy: string }>(
    `SELECT conflict_type, key::text AS key, policy FROM pgsub.conflict_log WHERE relation = 'app.items' AND conflict_type = 'update_missing'`,
    [],
    'dst',
  );
  assert.equal(logged.length, 1, JSON.stringify(logged));
  assert.match(logged[0]!.key, /404999/);
  assert.equal(logged[0]!.policy, 'skip');
  // Both sides agree again once the row is back.
  await target.query(`INSERT INTO app.items VALUES (404999, 'prepared', 4)`, [], 'dst');
  await assertEqual();
});

test('the target restarting while a large streamed transaction is applied in parallel, the loop yielding inside the stream: nothing lost, nothing duplicated', async () => {
  const yieldsBefore = loopYields();
  await withSource(async (c) => {
    await c.query('BEGIN');
    await c.query(`INSERT INTO app.items SELECT g, 'restarted', 1 FROM generate_series(500001, 530000) g`);
    await waitFor(parallelHoldsItems, { timeoutMs: 30_000, intervalMs: 50, what: 'eager apply' });
    // Immediate: the eager transaction's backend dies with its statements in flight.
    await target.restart('immediate');
    await c.query(`INSERT INTO app.items SELECT g, 'restarted', 2 FROM generate_series(530001, 535000) g`);
    await c.query('COMMIT');
  });
  await caughtUp();
  await assertEqual();
  const [n] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'restarted'`, [], 'dst');
  assert.equal(n.n, 35000);
  // The session the restart ended reported its loop's turns: the stream was applied yielding.
  await waitFor(() => loopYields() > yieldsBefore, { timeoutMs: 10_000, what: 'an apply loop report with yields' });
});

/** Turns the apply loops of this process gave the event loop inside streams, summed over their 'apply loop stopped' lines. */
function loopYields(): number {
  let sum = 0;
  for (const l of child!.output().split('\n')) {
    if (!l.includes('"msg":"apply loop stopped"')) continue;
    sum += Number((JSON.parse(l) as { yields?: number }).yields ?? 0);
  }
  return sum;
}

/** The parallel connection waits on a lock (held by a test session). */
async function eagerWaitsOnLock(): Promise<boolean> {
  const rows = await target.query(`SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, [`pgsub_${SUB}_parallel`], 'dst');
  return rows.length > 0;
}

/** Bytes in the spool's files now. */
function spoolBytes(): number {
  const dir = path.join(stateDir, 'spool');
  return fs.readdirSync(dir).reduce((n, f) => n + (fs.statSync(path.join(dir, f), { throwIfNoEntry: false })?.size ?? 0), 0);
}

/**
 * The read-ahead behind the leader: a target session locks app.items, so the eager
 * connection stops at its first statement; the source transaction goes on, and the spool
 * must keep growing while the eager connection waits (the leader does not wait for the
 * eager apply; before the read-ahead it stopped within max_in_flight rows plus the receive
 * queue, some 300 kB here). Then `fault` runs with the read-ahead megabytes behind.
 */
async function withReadAheadBehind(from: number, lastRow: string, fault: (c: pg.Client) => Promise<void>): Promise<void> {
  const locker = await connect(target, 'dst');
  // A restart of the target ends this session: its error is expected.
  locker.on('error', () => {});
  try {
    await locker.query('BEGIN');
    await locker.query('LOCK TABLE app.items IN SHARE MODE');
    await withSource(async (c) => {
      await c.query('BEGIN');
      await c.query(`INSERT INTO app.items SELECT g, 'ahead', 10 FROM generate_series(${from}, ${from + 2999}) g`);
      await waitFor(eagerWaitsOnLock, { timeoutMs: 30_000, intervalMs: 50, what: 'the parallel connection to wait on the lock' });
      const spooled = spoolBytes();
      await c.query(`INSERT INTO app.items SELECT g, 'ahead', 10 FROM generate_series(${from + 3000}, ${from + 59999}) g`);
      await c.query(`INSERT INTO app.items VALUES ${lastRow}`);
      await waitFor(() => spoolBytes() > spooled + 2_000_000, { timeoutMs: 30_000, intervalMs: 20, what: 'the spool to grow while the eager connection waits' });
      assert.ok(await eagerWaitsOnLock(), 'the eager connection still waits: the spool grew ahead of it');
      await fault(c);
      await locker.query('COMMIT').catch(() => {});
    });
  } finally {
    await locker.end().catch(() => {});
  }
}

/** A target-only trigger on app.items that raises for rows with n = `n` while app.fault says so. */
async function installFault(n: number, deferred: boolean): Promise<void> {
  const trigger = deferred ? `CONSTRAINT TRIGGER fault_check AFTER INSERT ON app.items DEFERRABLE INITIALLY DEFERRED` : `TRIGGER fault_check BEFORE INSERT ON app.items`;
  await target.query(
    `CREATE TABLE app.fault (fail boolean NOT NULL); INSERT INTO app.fault VALUES (true);
     CREATE FUNCTION app.fault_check() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       IF NEW.n = ${n} AND (SELECT fail FROM app.fault) THEN RAISE EXCEPTION 'fault row %', NEW.id; END IF;
       RETURN NEW;
     END $$;
     CREATE ${trigger} FOR EACH ROW EXECUTE FUNCTION app.fault_check();
     ALTER TABLE app.items ENABLE ALWAYS TRIGGER fault_check;`,
    [],
    'dst',
  );
}

async function removeFault(): Promise<void> {
  await target.query(`DROP TRIGGER IF EXISTS fault_check ON app.items; DROP FUNCTION IF EXISTS app.fault_check(); DROP TABLE IF EXISTS app.fault;`, [], 'dst');
}

async function countAhead(): Promise<number> {
  const [n] = await target.query(`SELECT count(*)::int AS n FROM app.items WHERE v = 'ahead'`, [], 'dst');
  return n.n;
}

test('the read-ahead behind the leader: the eager COMMIT failing on the target (deferred trigger) is retried; nothing before the fix, exactly once after', async () => {
  // From here in binary mode: binary values are views into the read-ahead's buffers
  // (decoder.ts), whose lifetime is tested too. A window of statements larger than the
  // test's transaction: the eager connection never waits for an answer while the test holds
  // its lock, so the watchdog's 5 s limit on lock waits cannot end it on a slow machine.
  child!.kill('SIGTERM');
  await child!.exited;
  start({ PGSUB_BINARY: 'true', PGSUB_MAX_IN_FLIGHT: '100000' });
  await child!.waitForLog('streaming started');
  await installFault(-1, true);
  const fallbacks = logCount('parallel apply fell back to the spool');
  const finished = logCount('parallel transaction finished');
  try {
    await withReadAheadBehind(600001, `(660001, 'ahead', -1)`, (c) => c.query('COMMIT').then(() => {}));
    // The eager connection applies all of it, and its COMMIT fails: the session ends and streams it again.
    await waitFor(() => child!.output().includes('fault row 660001'), { timeoutMs: 30_000, what: 'the failing COMMIT' });
    assert.equal(await countAhead(), 0, 'nothing of the failed transaction is visible');
    assert.equal(logCount('parallel transaction finished'), finished);
    await target.query(`UPDATE app.fault SET fail = false`, [], 'dst');
    await caughtUp();
    await assertEqual();
    assert.equal(await countAhead(), 60001);
    // Committed eagerly once the trigger let it pass, without falling back.
    assert.equal(logCount('parallel apply fell back to the spool'), fallbacks, child!.output().slice(-3000));
    assert.ok(logCount('parallel transaction finished') > finished);
  } finally {
    await removeFault();
    await publisher.query(`DELETE FROM app.items WHERE v = 'ahead'`, [], 'src');
    await caughtUp();
  }
});

test('the read-ahead behind the leader: a statement failing on the eager connection falls back to the spool, whose replay fails the same way until fixed; exactly once', async () => {
  await installFault(-2, false);
  const fallbacks = logCount('parallel apply fell back to the spool');
  try {
    await withReadAheadBehind(700001, `(760001, 'ahead', -2)`, (c) => c.query('COMMIT').then(() => {}));
    await waitFor(() => logCount('parallel apply fell back to the spool') > fallbacks, { timeoutMs: 30_000, what: 'the fallback' });
    assert.match(child!.output(), /fault row 760001/);
    assert.equal(await countAhead(), 0);
    await target.query(`UPDATE app.fault SET fail = false`, [], 'dst');
    await caughtUp();
    await assertEqual();
    assert.equal(await countAhead(), 60001);
  } finally {
    await removeFault();
    await publisher.query(`DELETE FROM app.items WHERE v = 'ahead'`, [], 'src');
    await caughtUp();
  }
});

test('the read-ahead behind the leader: the target restarting (immediate) with megabytes spooled and not applied; exactly once', async () => {
  try {
    await withReadAheadBehind(800001, `(860001, 'ahead', 11)`, async (c) => {
      await target.restart('immediate');
      await c.query(`INSERT INTO app.items SELECT g, 'ahead', 12 FROM generate_series(860002, 861000) g`);
      await c.query('COMMIT');
    });
    await caughtUp();
    await assertEqual();
    assert.equal(await countAhead(), 61000);
  } finally {
    await publisher.query(`DELETE FROM app.items WHERE v = 'ahead'`, [], 'src');
    await caughtUp();
  }
});

test('the read-ahead behind the leader: SIGTERM with megabytes spooled and not applied stops cleanly; the next run applies the transaction exactly once', async () => {
  const opts = { PGSUB_BINARY: 'true', PGSUB_MAX_IN_FLIGHT: '100000' };
  let running = true;
  try {
    await withReadAheadBehind(870001, `(930001, 'ahead', 13)`, async (c) => {
      child!.kill('SIGTERM');
      running = false;
      assert.equal(await child!.exited, 0, child!.output().slice(-3000));
      await c.query('COMMIT');
    });
    assert.equal(await countAhead(), 0, 'nothing of the open transaction was committed by the stop');
    assert.deepEqual(fs.readdirSync(path.join(stateDir, 'spool')), [], 'the stop removed its spool files');
    start(opts);
    running = true;
    await caughtUp();
    await assertEqual();
    assert.equal(await countAhead(), 60001);
  } finally {
    if (!running) start(opts);
    await publisher.query(`DELETE FROM app.items WHERE v = 'ahead'`, [], 'src');
    await caughtUp();
  }
});

test('binary = true (this child since the read-ahead tests): a conflict logs its key and values as text', async () => {
  await publisher.query(`INSERT INTO app.items VALUES (900001, 'key', 1)`, [], 'src');
  await caughtUp();
  await target.query(`DELETE FROM app.items WHERE id = 900001`, [], 'dst');
  await publisher.query(`UPDATE app.items SET n = 2 WHERE id = 900001`, [], 'src');
  await caughtUp();
  const [row] = await target.query(
    `SELECT key::text AS key, remote_tuple::text AS remote FROM pgsub.conflict_log WHERE conflict_type = 'update_missing' ORDER BY id DESC LIMIT 1`,
    [],
    'dst',
  );
  assert.equal(row.key, '{"id": "900001"}');
  assert.equal(row.remote, '{"n": "2", "v": "key", "id": "900001"}');
  await target.query(`INSERT INTO app.items VALUES (900001, 'key', 2)`, [], 'dst');
  await assertEqual();
});

test('a PG14 publisher is refused: streaming = parallel needs protocol 4', async () => {
  const old = await startCluster({ major: 14, name: 'par-pub14' });
  try {
    await old.createDatabase('src');
    await old.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items;`, [], 'src');
    const p = spawnPgsub({
      PGSUB_SOURCE: old.url('src'),
      PGSUB_TARGET: target.url('dst'),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: 'par14',
      PGSUB_COPY_DATA: 'false',
      PGSUB_STREAMING: 'parallel',
      PGSUB_STATE_DIR: stateDir,
    });
    // A setup the operator must fix: exit 2, as for a configuration error.
    assert.equal(await p.exited, 2);
    assert.match(p.output(), /streaming = parallel needs a PostgreSQL 16 or later publisher \(protocol 4\); this one is 14/);
  } finally {
    await old.stop();
  }
});
