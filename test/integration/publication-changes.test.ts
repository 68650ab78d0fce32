/**
 * Publications that change under a running subscription, against PostgreSQL 18's subscriber
 * behaviour (issue 31): a table that appears in a FOR ALL TABLES or FOR TABLES IN SCHEMA
 * publication is not part of the subscription until `pgsub refresh` (its changes skipped,
 * the slot still confirmed; `status` lists it), then copied and streamed; a publication
 * dropped from the config and added back at a restart (ADD/DROP PUBLICATION) re-registers
 * its table, whose non-empty target refuses the copy as that table's error only — the
 * others stream and the slot is confirmed — until `pgsub resync` empties and copies it; a
 * configured publication that does not exist is a warning, the others replicate (on a 14
 * publisher, whose pgoutput fails on a missing name), and it is picked up once created and
 * refreshed; none existing, and `run_as_owner: false`, are refused with exit 2.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { compareTables, currentWalLsn, pickPort, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, type Cluster, type PgsubProcess } from '../harness/index.js';

let pub18: Cluster;
let pub14: Cluster;
let target: Cluster;
const running = new Set<PgsubProcess>();

before(async () => {
  [pub18, pub14, target] = await Promise.all([
    startCluster({ major: 18, name: 'pubchg-pub18' }),
    startCluster({ major: 14, name: 'pubchg-pub14' }),
    startCluster({ major: 18, name: 'pubchg-tgt' }),
  ]);
});

after(async () => {
  for (const p of running) p.kill('SIGKILL');
  await Promise.all([pub18?.stop(), pub14?.stop(), target?.stop()]);
});

function envFor(publisher: Cluster, db: string, publication: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PGSUB_SOURCE: publisher.url(db),
    PGSUB_TARGET: target.url(db),
    PGSUB_PUBLICATION: publication,
    PGSUB_SUBSCRIPTION: db,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
    // Only `pgsub refresh` (or a start with another publication list) adds tables here.
    PGSUB_REFRESH_INTERVAL: '0',
    ...extra,
  };
}

function service(env: Record<string, string>): PgsubProcess {
  const p = spawnPgsub(env);
  running.add(p);
  void p.exited.then(() => running.delete(p));
  return p;
}

async function stop(p: PgsubProcess): Promise<void> {
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-3000));
}

async function cli(env: Record<string, string>, args: string[]): Promise<{ code: number | string; out: string }> {
  const p = spawnPgsub(env, args);
  const code = await p.exited;
  return { code, out: p.output() };
}

interface Status {
  tables: { table: string; state: string; last_error: string | null; error_count: number }[];
  tables_not_subscribed: string[] | null;
  publications_missing: string[] | null;
}

async function status(env: Record<string, string>): Promise<Status> {
  const { code, out } = await cli(env, ['status', '--json']);
  assert.equal(code, 0, out);
  return JSON.parse(out) as Status;
}

/** The log records printed so far that match. */
function records(p: PgsubProcess, match: (r: Record<string, unknown>) => boolean): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of p.output().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const r = JSON.parse(line) as Record<string, unknown>;
      if (match(r)) out.push(r);
    } catch {
      // a partial line
    }
  }
  return out;
}

async function waitForRecord(p: PgsubProcess, msg: string, fields: Record<string, unknown>, timeoutMs = 60_000): Promise<Record<string, unknown>> {
  const match = (r: Record<string, unknown>) => r.msg === msg && Object.entries(fields).every(([k, v]) => JSON.stringify(r[k]) === JSON.stringify(v));
  await waitFor(() => records(p, match).length > 0, { timeoutMs, intervalMs: 100, what: `log "${msg}" ${JSON.stringify(fields)}\n${p.output().slice(-3000)}` });
  return records(p, match)[0]!;
}

async function count(db: string, table: string): Promise<number> {
  const [row] = await target.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`, [], db);
  return row!.n;
}

/** The slot has confirmed the publisher's WAL position as of now: everything before it was applied or skipped. */
async function confirmed(publisher: Cluster, db: string): Promise<void> {
  const end = await currentWalLsn(publisher, db);
  await waitFor(async () => ((await slotConfirmedLsn(publisher, db)) ?? 0n) >= end, { timeoutMs: 60_000, intervalMs: 100, what: `slot ${db} confirmed past ${end}` });
}

const SKIPPED = 'changes skipped: the table is published but not part of the subscription yet; pgsub refresh (or the periodic refresh) adds it';
const ADDED = 'table added to the subscription; its copy starts';

for (const kind of ['FOR ALL TABLES', 'FOR TABLES IN SCHEMA'] as const) {
  const db = kind === 'FOR ALL TABLES' ? 'pubchg_all' : 'pubchg_schema';
  test(`${kind}: a table created later gets no rows until pgsub refresh (its changes skipped, the slot confirmed, status lists it); then it is copied and streams`, async () => {
    const publisher = pub18;
    await Promise.all([publisher.createDatabase(db), target.createDatabase(db)]);
    const schema = 'CREATE SCHEMA s; CREATE TABLE s.t0 (id int PRIMARY KEY, v text);';
    await target.query(schema, [], db);
    await publisher.query(`${schema} INSERT INTO s.t0 VALUES (1, 'a'); CREATE PUBLICATION pub ${kind === 'FOR ALL TABLES' ? kind : `${kind} s`};`, [], db);
    const env = envFor(publisher, db, 'pub');
    const p = service(env);
    await p.waitForLog('streaming started');
    await waitFor(async () => (await count(db, 's.t0')) === 1, { timeoutMs: 30_000, what: 's.t0 copied' });

    await target.query('CREATE TABLE s.t_new (id int PRIMARY KEY, v text)', [], db);
    await publisher.query(`CREATE TABLE s.t_new (id int PRIMARY KEY, v text); INSERT INTO s.t_new SELECT g, 'n' || g FROM generate_series(1, 500) g;`, [], db);
    assert.equal((await p.waitForLog(SKIPPED, 30_000)).table, 's.t_new');
    await publisher.query(`UPDATE s.t_new SET v = 'u' WHERE id <= 10; INSERT INTO s.t0 VALUES (2, 'b');`, [], db);
    // The stream passed the new table's changes: skipped, and confirmed like any other.
    await confirmed(publisher, db);
    assert.equal(await count(db, 's.t0'), 2);
    // Longer than the second in which pgsub used to copy such a table by itself.
    await new Promise((r) => setTimeout(r, 2500));
    assert.equal(await count(db, 's.t_new'), 0);
    assert.deepEqual(
      records(p, (r) => r.msg === ADDED && r.table === 's.t_new'),
      [],
    );
    const before = await status(env);
    assert.deepEqual(before.tables_not_subscribed, ['s.t_new']);
    assert.deepEqual(before.publications_missing, []);
    assert.deepEqual(
      before.tables.map((t) => t.table),
      ['s.t0'],
    );

    const refresh = await cli(env, ['refresh']);
    assert.equal(refresh.code, 0, refresh.out);
    assert.equal((await waitForRecord(p, ADDED, { table: 's.t_new' })).copy, true);
    await waitForRecord(p, 'table copy started', { table: 's.t_new' });
    await waitFor(async () => (await count(db, 's.t_new')) === 500, { timeoutMs: 60_000, what: 's.t_new copied' });
    await publisher.query(`INSERT INTO s.t_new VALUES (501, 'streamed'); DELETE FROM s.t_new WHERE id = 1; UPDATE s.t0 SET v = 'bb' WHERE id = 2;`, [], db);
    await confirmed(publisher, db);
    assert.ok((await compareTables(publisher, db, target, db, ['s.t0', 's.t_new'])).equal);
    // syncdone turns ready with the apply's next commit past the copy's position.
    await waitFor(async () => (await status(env)).tables.every((t) => t.state === 'ready'), { timeoutMs: 30_000, intervalMs: 300, what: 'every table ready' });
    const after = await status(env);
    assert.deepEqual(after.tables_not_subscribed, []);
    assert.deepEqual(
      after.tables.map((t) => [t.table, t.state]),
      [
        ['s.t0', 'ready'],
        ['s.t_new', 'ready'],
      ],
    );
    await stop(p);
  });
}

test('a publication dropped from the config and added back (at restarts, as DROP/ADD PUBLICATION): its non-empty table is refused as its own error while the others stream and the slot is confirmed; pgsub resync empties and copies it', async () => {
  const publisher = pub18;
  const db = 'pubchg_readd';
  await Promise.all([publisher.createDatabase(db), target.createDatabase(db)]);
  const schema = 'CREATE SCHEMA r; CREATE TABLE r.a (id int PRIMARY KEY, v text); CREATE TABLE r.b (id int PRIMARY KEY, v text);';
  await target.query(schema, [], db);
  await publisher.query(
    `${schema} INSERT INTO r.a SELECT g, 'a' || g FROM generate_series(1, 1000) g; INSERT INTO r.b SELECT g, 'b' || g FROM generate_series(1, 2000) g;
     CREATE PUBLICATION pub_a FOR TABLE r.a; CREATE PUBLICATION pub_b FOR TABLE r.b;`,
    [],
    db,
  );
  const first = service(envFor(publisher, db, 'pub_a,pub_b'));
  await first.waitForLog('initial copy finished');
  await first.waitForLog('streaming started');
  await confirmed(publisher, db);
  assert.ok((await compareTables(publisher, db, target, db, ['r.a', 'r.b'])).equal);
  await stop(first);

  // DROP PUBLICATION pub_b: its table leaves the subscription and keeps its rows on the target.
  const dropped = service(envFor(publisher, db, 'pub_a'));
  assert.deepEqual((await dropped.waitForLog('publications changed since the last refresh; refreshing (as ALTER SUBSCRIPTION … SET PUBLICATION)')).dropped, ['pub_b']);
  await waitForRecord(dropped, 'table no longer published; not applied any more', { table: 'r.b' });
  await dropped.waitForLog('streaming started');
  await publisher.query(`INSERT INTO r.b VALUES (2001, 'while dropped'); INSERT INTO r.a VALUES (1001, 'a');`, [], db);
  await confirmed(publisher, db);
  assert.equal(await count(db, 'r.a'), 1001);
  assert.equal(await count(db, 'r.b'), 2000);
  await stop(dropped);

  // ADD PUBLICATION pub_b (copy_data): r.b is registered again and its copy refused — that table's error only.
  const metricsPort = await pickPort();
  const env = envFor(publisher, db, 'pub_a,pub_b', { PGSUB_METRICS_LISTEN: `127.0.0.1:${metricsPort}` });
  const readded = service(env);
  assert.deepEqual((await readded.waitForLog('publications changed since the last refresh; refreshing (as ALTER SUBSCRIPTION … SET PUBLICATION)')).added, ['pub_b']);
  await waitForRecord(readded, ADDED, { table: 'r.b' });
  await readded.waitForLog('streaming started');
  const failed = await waitForRecord(readded, 'table copy failed; will retry', { table: 'r.b' });
  assert.match(String((failed.err as { message: string }).message), /target table "r\.b" is not empty/);
  await publisher.query(`INSERT INTO r.a SELECT g, 'a' || g FROM generate_series(1002, 1100) g; UPDATE r.a SET v = 'x' WHERE id <= 5;`, [], db);
  // Streams on, and the slot keeps being confirmed while r.b waits for its retry.
  await confirmed(publisher, db);
  await publisher.query(`INSERT INTO r.a VALUES (1101, 'later')`, [], db);
  await confirmed(publisher, db);
  assert.ok((await compareTables(publisher, db, target, db, ['r.a'])).equal);
  const refusedStatus = await status(env);
  const b = refusedStatus.tables.find((t) => t.table === 'r.b')!;
  assert.equal(b.state, 'init');
  assert.match(b.last_error ?? '', /is not empty; the initial copy would duplicate rows/);
  assert.ok(b.error_count >= 1, JSON.stringify(b));
  assert.equal(refusedStatus.tables.find((t) => t.table === 'r.a')!.state, 'ready');
  const metrics = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text();
  const syncErrors = Number(/^pgsub_sync_table_errors_total(?:\{[^}]*\})? (\d+)/m.exec(metrics)?.[1]);
  assert.ok(syncErrors >= 1, metrics);

  // The documented way back: resync empties the table and copies it again.
  const resync = await cli(env, ['resync', 'r.b']);
  assert.equal(resync.code, 0, resync.out);
  await waitFor(async () => (await status(env)).tables.find((t) => t.table === 'r.b')?.state === 'ready', { timeoutMs: 60_000, intervalMs: 300, what: 'r.b ready after resync' });
  await publisher.query(`INSERT INTO r.b VALUES (2002, 'after resync'); UPDATE r.b SET v = 'y' WHERE id <= 3;`, [], db);
  await confirmed(publisher, db);
  assert.ok((await compareTables(publisher, db, target, db, ['r.a', 'r.b'])).equal);
  assert.equal(await count(db, 'r.b'), 2002);
  await stop(readded);
});

describe('a configured publication that does not exist (publisher 14: pgoutput fails on a missing name)', () => {
  const db = 'pubchg_missing';

  test('none of them exists, or run_as_owner: false: exit 2 naming it', async () => {
    await Promise.all([pub14.createDatabase(db), target.createDatabase(db)]);
    const none = await cli(envFor(pub14, db, 'pub_nope'), ['run']);
    assert.equal(none.code, 2, none.out);
    assert.match(none.out, /PGSUB_SOURCE_SETUP: publication "pub_nope" not found in the publisher's database: none of the configured publications exists/);
    const owner = await cli(envFor(pub14, db, 'pub_nope', { PGSUB_RUN_AS_OWNER: 'false' }), ['run']);
    assert.equal(owner.code, 2, owner.out);
    assert.match(owner.out, /PGSUB_NOT_IMPLEMENTED: run_as_owner = false is not implemented yet/);
  });

  test('a warning with its name; the others replicate; once created it is picked up at pgsub refresh and the stream restarts with it', async () => {
    const schema = 'CREATE SCHEMA m; CREATE TABLE m.x (id int PRIMARY KEY, v text); CREATE TABLE m.y (id int PRIMARY KEY, v text);';
    await target.query(schema, [], db);
    await pub14.query(
      `${schema} INSERT INTO m.x VALUES (1, 'x'); INSERT INTO m.y SELECT g, 'y' || g FROM generate_series(1, 300) g; CREATE PUBLICATION pub_x FOR TABLE m.x;`,
      [],
      db,
    );
    const env = envFor(pub14, db, 'pub_x,pub_y');
    const p = service(env);
    const warning = await p.waitForLog('publication "pub_y" not found on the publisher; replicating the others, and looking again at each refresh');
    assert.deepEqual(warning.publications, ['pub_y']);
    assert.deepEqual((await p.waitForLog('streaming started')).publications, ['pub_x']);
    await pub14.query(`INSERT INTO m.x VALUES (2, 'streamed'); INSERT INTO m.y VALUES (301, 'not published yet');`, [], db);
    await confirmed(pub14, db);
    assert.equal(await count(db, 'm.x'), 2);
    assert.deepEqual((await status(env)).publications_missing, ['pub_y']);

    await pub14.query(`CREATE PUBLICATION pub_y FOR TABLE m.y; INSERT INTO m.y VALUES (302, 'after create');`, [], db);
    const refresh = await cli(env, ['refresh']);
    assert.equal(refresh.code, 0, refresh.out);
    await p.waitForLog('publication now exists on the publisher; its tables are registered at this refresh');
    await waitForRecord(p, ADDED, { table: 'm.y' });
    await waitForRecord(p, 'streaming started', { publications: ['pub_x', 'pub_y'] });
    await waitFor(async () => (await status(env)).tables.find((t) => t.table === 'm.y')?.state === 'ready', { timeoutMs: 60_000, intervalMs: 300, what: 'm.y ready' });
    await pub14.query(`INSERT INTO m.y VALUES (303, 'streamed'); UPDATE m.y SET v = 'u' WHERE id <= 3; INSERT INTO m.x VALUES (3, 'x');`, [], db);
    await confirmed(pub14, db);
    assert.ok((await compareTables(pub14, db, target, db, ['m.x', 'm.y'])).equal);
    assert.equal(await count(db, 'm.y'), 303);
    assert.deepEqual((await status(env)).publications_missing, []);
    assert.equal(records(p, (r) => r.msg === 'apply failed; retrying').length, 0, p.output().slice(-3000));
    await stop(p);
  });
});
