/**
 * Table sync across crashes (PG18 → PG18, pgsub as a child process, SIGKILL):
 *  1. the initial copy of a large table (split into page ranges under one snapshot) plus
 *     the ledger tables, while a ledger workload writes: killed right after the large
 *     table enters datasync, and again once some of its ranges have committed; the
 *     third run finishes. Every table must equal the source, the ledger must hold each
 *     source transaction once, rows_copied must count one whole copy, and nothing may be
 *     left behind: no temporary sync slot on the publisher, no backend of a killed run.
 *  2. a table added to the publication while pgsub streams, written to throughout, picked
 *     up by the periodic refresh, killed once it is finishedcopy/syncdone (the hand-off
 *     to the stream), and again in syncdone while the next run re-streams what it missed
 *     (when the poll catches that window): the table and the ledger must still be exact.
 * All along, a sampler checks the feedback rules: the slot's confirmed_flush_lsn (read
 * first) never exceeds the origin committed in the target, nor the position of a table in
 * datasync/finishedcopy/syncdone (its sync_lsn, or a later one appended to
 * pgsub.sync_progress; both read after confirmed_flush, in one snapshot of the target).
 * Reading confirmed_flush first makes the check conservative: the origin and a syncing
 * table's position only move forward, except that a restarted copy replaces them with a
 * new snapshot's consistent point, which lies beyond every WAL position, confirmed or
 * not, that existed before that snapshot was taken.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import {
  checkLedger,
  compareTables,
  connect,
  currentWalLsn,
  LEDGER_SCHEMA,
  LEDGER_TABLES,
  lsnToBigint,
  prng,
  runLedgerWorkload,
  slotConfirmedLsn,
  spawnPgsub,
  startCluster,
  waitFor,
  type Cluster,
  type PgsubProcess,
} from '../harness/index.js';

const SUB = 'tscrash';
const BIG_ROWS = 1_000_000;
const MID_ROWS = 200_000;
const SEED = Number(process.env.PGSUB_CRASH_SEED ?? Date.now() % 100_000);
const TABLES = `
  CREATE TABLE app.big (id bigint PRIMARY KEY, payload text NOT NULL, n int NOT NULL);
  CREATE TABLE app.mid (id int PRIMARY KEY, v int NOT NULL, note text);
`;

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];
/** The run that is still alive, with the time it was started on each server's clock. */
let current: { proc: PgsubProcess; pubSince: string; tgtSince: string } | null = null;

let sampling = true;
let samples = 0;
const violations: string[] = [];
let sampler: Promise<void> = Promise.resolve();

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'tscrash-pub' }), startCluster({ major: 18, name: 'tscrash-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${LEDGER_SCHEMA} ${TABLES}`, [], 'src');
  await target.query(`${LEDGER_SCHEMA} ${TABLES} TRUNCATE app.accounts;`, [], 'dst');
  // ~130 MB of heap: the copy takes seconds, long enough to be killed in.
  await publisher.query(
    `INSERT INTO app.big SELECT g, repeat(md5(g::text), 3), g % 1000 FROM generate_series(1, ${BIG_ROWS}) g;
     INSERT INTO app.mid SELECT g, 0, md5(g::text) FROM generate_series(1, ${MID_ROWS}) g;
     CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags, app.big;`,
    [],
    'src',
  );
  await publisher.query(`VACUUM ANALYZE app.big, app.mid`, [], 'src');
  sampler = sampleFlushInvariant();
});

after(async () => {
  sampling = false;
  await sampler;
  for (const c of children) c.kill('SIGKILL');
  await Promise.all(children.map((c) => c.exited));
  await publisher?.stop();
  await target?.stop();
});

const env = () => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url('dst'),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: SUB,
  PGSUB_MAX_SYNC_WORKERS: '4',
  // Small ranges, so that the large table is split as the test needs.
  PGSUB_SYNC_RANGE_MIN_MB: '0',
  PGSUB_REFRESH_INTERVAL: '1',
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '1',
  PGSUB_LOG_LEVEL: 'info',
});

async function clock(cluster: Cluster, db: string): Promise<string> {
  const [row] = await cluster.query<{ t: string }>(`SELECT clock_timestamp()::text AS t`, [], db);
  return row!.t;
}

async function spawn(): Promise<PgsubProcess> {
  const pubSince = await clock(publisher, 'src');
  const tgtSince = await clock(target, 'dst');
  const proc = spawnPgsub(env());
  children.push(proc);
  current = { proc, pubSince, tgtSince };
  return proc;
}

async function kill(proc: PgsubProcess): Promise<void> {
  proc.kill('SIGKILL');
  assert.equal(await proc.exited, 'SIGKILL', proc.output().slice(-3000));
  current = null;
}

interface Rel {
  state: string;
  syncLsn: string | null;
  rows: number;
}

async function rels(db: pg.Client): Promise<Record<string, Rel>> {
  const { rows } = await db.query<{ t: string; state: string; sync_lsn: string | null; rows: string }>(
    `SELECT schema_name || '.' || table_name AS t, state, sync_lsn::text AS sync_lsn, rows_copied::text AS rows FROM pgsub.subscription_rel WHERE subscription = $1`,
    [SUB],
  );
  return Object.fromEntries(rows.map((r) => [r.t, { state: r.state, syncLsn: r.sync_lsn, rows: Number(r.rows) }]));
}

/** Poll the target until `cond` holds for the tables' rows (the schema may not exist yet). */
async function pollRels(db: pg.Client, cond: (r: Record<string, Rel>) => boolean, what: string, timeoutMs = 60_000): Promise<Record<string, Rel>> {
  let seen: Record<string, Rel> = {};
  await waitFor(
    async () => {
      seen = await rels(db);
      return cond(seen);
    },
    { timeoutMs, intervalMs: 10, what },
  );
  return seen;
}

/**
 * confirmed_flush (read first) <= origin and <= every syncing table's position (read
 * after): the greatest of its sync_lsn and the positions appended to pgsub.sync_progress.
 */
async function sampleFlushInvariant(): Promise<void> {
  const pub = await connect(publisher, 'postgres');
  const tgt = await connect(target, 'dst');
  try {
    while (sampling) {
      try {
        const slot = await pub.query<{ lsn: string | null }>(`SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = $1`, [SUB]);
        const confirmedText = slot.rows[0]?.lsn;
        if (confirmedText) {
          const confirmed = lsnToBigint(confirmedText);
          // One statement, one snapshot of the target.
          const { rows } = await tgt.query<{ origin: string | null; syncing: { t: string; state: string; lsn: string }[] }>(
            `SELECT (SELECT remote_lsn::text FROM pgsub.origin WHERE subscription = $1) AS origin,
                    (SELECT coalesce(json_agg(json_build_object('t', r.schema_name || '.' || r.table_name, 'state', r.state, 'lsn', GREATEST(r.sync_lsn, p.lsn)::text)), '[]')
                       FROM pgsub.subscription_rel r
                       LEFT JOIN LATERAL (SELECT max(lsn) AS lsn FROM pgsub.sync_progress p
                                           WHERE p.subscription = r.subscription AND p.schema_name = r.schema_name AND p.table_name = r.table_name) p ON true
                      WHERE r.subscription = $1 AND r.state IN ('d', 'f', 's') AND r.sync_lsn IS NOT NULL) AS syncing`,
            [SUB],
          );
          const row = rows[0];
          if (row?.origin) {
            samples++;
            if (confirmed > lsnToBigint(row.origin)) violations.push(`confirmed_flush ${confirmedText} > origin ${row.origin}`);
            for (const s of row.syncing) {
              if (confirmed > lsnToBigint(s.lsn)) violations.push(`confirmed_flush ${confirmedText} > sync_lsn ${s.lsn} of ${s.t} in state ${s.state}`);
            }
          }
        }
      } catch {
        // pgsub's schema is not there yet: sample again.
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  } finally {
    await pub.end().catch(() => {});
    await tgt.end().catch(() => {});
  }
}

/** Ledger transactions in batches of disjoint clients, until stopped. */
function ledgerWorkload(firstClient: number, seed: number): { stop(): Promise<number> } {
  let stopped = false;
  let batches = 0;
  const done = (async () => {
    while (!stopped) {
      await runLedgerWorkload(publisher, 'src', { clients: 2, transactionsPerClient: 25, seed: seed + batches, firstClient: firstClient + batches * 2, pauseMs: 10 });
      batches++;
    }
  })();
  return {
    async stop() {
      stopped = true;
      await done;
      return batches * 2 * 25;
    },
  };
}

interface MidWrite {
  txn: number;
  op: string;
  /** WAL insert positions just before and just after the COMMIT: they bracket its commit LSN. */
  before: string;
  after: string;
}

/** Updates, inserts and deletes on app.mid in small transactions, until stopped; remembers which transaction wrote which row. */
function midWorkload(seed: number): { stop(): Promise<number>; writes: Map<number, MidWrite[]> } {
  let stopped = false;
  let transactions = 0;
  const writes = new Map<number, MidWrite[]>();
  const done = (async () => {
    const rand = prng(seed);
    const db = await connect(publisher, 'src');
    try {
      let next = MID_ROWS + 1;
      while (!stopped) {
        const txn = transactions;
        const ops: [number, string][] = [];
        await db.query('BEGIN');
        const updated = 1 + Math.floor(rand() * MID_ROWS);
        await db.query('UPDATE app.mid SET v = v + 1, note = $2 WHERE id = $1', [updated, `u${txn}`]);
        ops.push([updated, 'update']);
        await db.query('INSERT INTO app.mid VALUES ($1, $2, $3)', [next, txn, `i${txn}`]);
        ops.push([next++, 'insert']);
        if (txn % 3 === 0) {
          const deleted = 1 + Math.floor(rand() * MID_ROWS);
          await db.query('DELETE FROM app.mid WHERE id = $1', [deleted]);
          ops.push([deleted, 'delete']);
        }
        const before = (await db.query<{ l: string }>('SELECT pg_current_wal_insert_lsn()::text AS l')).rows[0]!.l;
        await db.query('COMMIT');
        const after = (await db.query<{ l: string }>('SELECT pg_current_wal_insert_lsn()::text AS l')).rows[0]!.l;
        for (const [id, op] of ops) writes.set(id, [...(writes.get(id) ?? []), { txn, op, before, after }]);
        transactions++;
        await new Promise((r) => setTimeout(r, 5));
      }
    } finally {
      await db.end();
    }
  })();
  return {
    writes,
    async stop() {
      stopped = true;
      await done;
      return transactions;
    },
  };
}

/** Rows of app.mid that differ between source and target, with the workload transactions that wrote them. */
async function diffMid(writes: Map<number, MidWrite[]>): Promise<string> {
  const q = `SELECT id, md5(t::text) AS h FROM app.mid t`;
  const [src, dst] = await Promise.all([publisher.query<{ id: number; h: string }>(q, [], 'src'), target.query<{ id: number; h: string }>(q, [], 'dst')]);
  const s = new Map(src.map((r) => [r.id, r.h]));
  const d = new Map(dst.map((r) => [r.id, r.h]));
  const ids = new Set([...s.keys(), ...d.keys()]);
  const out: string[] = [];
  for (const id of [...ids].sort((a, b) => a - b)) {
    const kind = !d.has(id) ? 'missing in target' : !s.has(id) ? 'extra in target' : s.get(id) !== d.get(id) ? 'differs' : null;
    if (kind) out.push(`id ${id} ${kind}; written by ${JSON.stringify(writes.get(id) ?? [])}`);
  }
  return `${out.length} rows differ:\n${out.slice(0, 40).join('\n')}`;
}

async function caughtUp(): Promise<void> {
  const end = await currentWalLsn(publisher, 'src');
  await waitFor(async () => ((await slotConfirmedLsn(publisher, SUB)) ?? 0n) >= end, {
    timeoutMs: 120_000,
    intervalMs: 100,
    what: 'the slot to confirm the publisher WAL position',
  });
}

/**
 * Nothing of the killed runs is left: no temporary or sync slot on the publisher, and
 * every pgsub backend on either server belongs to the running process (started after it).
 */
async function assertNoLeftovers(): Promise<void> {
  assert.ok(current, 'a pgsub run is alive');
  const { pubSince, tgtSince } = current;
  let report = '';
  await waitFor(
    async () => {
      const slots = await publisher.query(`SELECT slot_name, temporary, active_pid FROM pg_replication_slots WHERE temporary OR slot_name LIKE 'pgsub\\_%\\_sync\\_%'`);
      const pubOld = await publisher.query(
        `SELECT pid, application_name, backend_type, state FROM pg_stat_activity WHERE (application_name LIKE 'pgsub%' OR application_name = $2) AND (backend_start < $1::timestamptz OR application_name LIKE '%\\_sync')`,
        [pubSince, SUB],
      );
      const tgtOld = await target.query(
        `SELECT pid, application_name, state, query FROM pg_stat_activity WHERE application_name LIKE 'pgsub%' AND (backend_start < $1::timestamptz OR application_name LIKE '%\\_sync')`,
        [tgtSince],
      );
      report = JSON.stringify({ slots, pubOld, tgtOld });
      return slots.length === 0 && pubOld.length === 0 && tgtOld.length === 0;
    },
    { timeoutMs: 30_000, intervalMs: 200, what: 'leftovers of killed runs to go away' },
  ).catch((err: Error) => assert.fail(`${err.message}: ${report}`));
  // The running process is there, on both sides.
  const [live] = await target.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1`, [`pgsub_${SUB}`], 'dst');
  assert.ok(live!.n >= 1, 'the running pgsub has its apply backend on the target');
  const walsenders = await publisher.query(`SELECT pid FROM pg_stat_replication WHERE application_name = $1`, [SUB]);
  assert.equal(walsenders.length, 1, 'one walsender streams to the running pgsub');
}

async function assertExact(tables: string[]): Promise<void> {
  const ledger = await checkLedger(publisher, 'src', target, 'dst');
  assert.deepEqual(ledger.duplicates, [], 'duplicated ledger transactions in the target');
  assert.equal(ledger.targetRows, ledger.sourceRows, 'ledger rows lost or duplicated');
  const cmp = await compareTables(publisher, 'src', target, 'dst', [...LEDGER_TABLES, ...tables]);
  assert.ok(cmp.equal, `target differs from source: ${JSON.stringify(cmp)}`);
}

function logRecords(proc: PgsubProcess, msg: string): Record<string, unknown>[] {
  return proc
    .output()
    .split('\n')
    .filter((l) => l.startsWith('{') && l.includes(msg))
    .map((l) => JSON.parse(l) as Record<string, unknown>)
    .filter((r) => r.msg === msg);
}

function logTail(): string {
  const runs = children
    .map(
      (c, i) =>
        `--- run ${i + 1} ---\n${c
          .output()
          .split('\n')
          .filter((l) => !l.includes('table copy progress'))
          .slice(-40)
          .join('\n')}`,
    )
    .join('\n');
  return `${runs}\n--- flush invariant: ${samples} samples, ${violations.length} violations${violations.length > 0 ? `, first: ${violations.slice(0, 5).join('; ')}` : ''}`;
}

test('SIGKILL during the initial copy, twice: the copy restarts cleanly and ends exact', { timeout: 150_000 }, async () => {
  const db = await connect(target, 'dst');
  const workload = ledgerWorkload(0, SEED);
  try {
    // Run 1: killed as soon as app.big is in datasync.
    const run1 = await spawn();
    const first = await pollRels(db, (r) => r['app.big']?.state === 'd', 'app.big in datasync (run 1)');
    await kill(run1);
    const firstLsn = first['app.big']!.syncLsn;
    const afterKill1 = (await rels(db))['app.big']!;
    assert.equal(afterKill1.state, 'd', 'killed in datasync');

    // Run 2: killed once its own copy of app.big has committed some ranges.
    const run2 = await spawn();
    const second = await pollRels(
      db,
      (r) => {
        const big = r['app.big'];
        return (big?.state === 'd' && big.syncLsn !== firstLsn && big.rows > 0) || (big !== undefined && big.state !== 'd');
      },
      'app.big in datasync with committed ranges (run 2)',
      90_000,
    );
    await kill(run2);
    const big2 = second['app.big']!;
    assert.equal(big2.state, 'd', `app.big finished its copy before a partial one was seen: ${JSON.stringify(big2)}`);
    assert.ok(big2.rows < BIG_ROWS, `killed mid-copy (${big2.rows} rows committed)`);
    assert.equal((await rels(db))['app.big']!.state, 'd');
    const [partial] = await target.query<{ n: number }>(`SELECT count(*)::int AS n FROM app.big`, [], 'dst');
    assert.ok(partial!.n > 0 && partial!.n < BIG_ROWS, `a partial copy is in the target (${partial!.n} rows)`);

    // Run 3: finishes the copy from a new snapshot and streams.
    const run3 = await spawn();
    await run3.waitForLog('initial copy finished', 120_000);
    await pollRels(db, (r) => Object.keys(r).length === 4 && Object.values(r).every((t) => t.state === 'r'), 'all tables ready', 90_000);
    const written = await workload.stop();
    assert.ok(written > 0);
    await caughtUp();

    await assertExact(['app.big']);
    const final = await rels(db);
    assert.equal(final['app.big']!.rows, BIG_ROWS, 'rows_copied counts one whole copy');
    const copies = logRecords(run3, 'table copy started').filter((r) => r.table === 'app.big');
    assert.equal(copies.length, 1, 'run 3 copied app.big once');
    assert.ok(![firstLsn, big2.syncLsn].includes(String(copies[0]!.lsn)), 'run 3 copied app.big from a snapshot of its own');
    await assertNoLeftovers();
    assert.deepEqual(violations, [], 'the slot confirmed a position the target had not committed');
    process.stdout.write(
      `# tablesync crash: run 1 killed in d at ${firstLsn}, run 2 at ${big2.syncLsn} with ${big2.rows} rows committed; ${written} ledger transactions; ${samples} samples\n`,
    );
  } catch (err) {
    process.stdout.write(`${logTail()}\n`);
    throw err;
  } finally {
    await workload.stop().catch(() => 0);
    await db.end();
  }
});

test('SIGKILL at the hand-off of a table added later: exact after restart', { timeout: 90_000 }, async () => {
  assert.ok(current, 'the run of the first test is still streaming');
  const db = await connect(target, 'dst');
  const workload = ledgerWorkload(100_000, SEED + 1);
  const mid = midWorkload(SEED);
  const seen: string[] = [];
  const note = (r: Record<string, Rel>) => {
    const s = r['app.mid']?.state;
    if (s && seen.at(-1) !== s) seen.push(s);
    return s;
  };
  const kills: Rel[] = [];
  try {
    await new Promise((r) => setTimeout(r, 500));
    await publisher.query(`ALTER PUBLICATION pub ADD TABLE app.mid`, [], 'src');
    // The periodic refresh (every second) finds it and copies it while the others stream.
    await pollRels(db, (r) => ['f', 's', 'r'].includes(note(r) ?? ''), 'app.mid to finish its copy', 60_000);
    await kill(current!.proc);
    // What the dead process left (it may have moved on between the poll and the kill).
    kills.push((await rels(db))['app.mid']!);
    seen.push('†');

    // The next run re-streams what app.mid missed from its sync_lsn; killed again in
    // syncdone when the poll catches it (the window can be short).
    let run = await spawn();
    const catching = await pollRels(db, (r) => ['s', 'r'].includes(note(r) ?? ''), 'app.mid syncdone or ready', 60_000);
    if (catching['app.mid']!.state === 's') {
      await kill(run);
      kills.push((await rels(db))['app.mid']!);
      seen.push('†');
      run = await spawn();
    }
    await run.waitForLog('streaming started', 60_000);
    await pollRels(db, (r) => note(r) === 'r', 'app.mid ready after restart', 60_000);
    const midTransactions = await mid.stop();
    const written = await workload.stop();
    await pollRels(db, (r) => Object.values(r).every((t) => t.state === 'r'), 'all tables ready', 30_000);
    await caughtUp();

    const story = `killed in ${kills.map((k) => `${k.state} at ${k.syncLsn}`).join(', then ')}; states seen ${seen.join('→')}`;
    const cmpMid = await compareTables(publisher, 'src', target, 'dst', ['app.mid']);
    if (!cmpMid.equal) {
      const relRows = await target.query(
        `SELECT table_name, state, sync_lsn::text, rows_copied, copy_started_at, copy_finished_at, ready_at FROM pgsub.subscription_rel WHERE subscription = $1`,
        [SUB],
        'dst',
      );
      assert.fail(`app.mid differs (${story}): ${await diffMid(mid.writes)}\n${JSON.stringify(relRows)}`);
    }
    await assertExact(['app.big', 'app.mid']);
    await assertNoLeftovers();
    assert.deepEqual(violations, [], 'the slot confirmed a position the target had not committed');
    assert.ok(samples > 100, `only ${samples} samples of the flush invariant`);
    // Last: the first kill must have hit the hand-off, not a table already ready (which
    // is what a copy promoted by the live stream without re-streaming looks like).
    assert.ok(kills[0]!.state === 'f' || kills[0]!.state === 's', `the hand-off window was missed: ${story}`);
    process.stdout.write(`# tablesync crash: app.mid ${story}; ${midTransactions} app.mid and ${written} ledger transactions; ${samples} samples\n`);
    run.kill('SIGTERM');
    assert.equal(await run.exited, 0, run.output().slice(-3000));
    current = null;
  } catch (err) {
    process.stdout.write(`${logTail()}\n`);
    throw err;
  } finally {
    await mid.stop().catch(() => 0);
    await workload.stop().catch(() => 0);
    await db.end();
  }
});
