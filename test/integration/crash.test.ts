/**
 * Exactly once across crashes: pgsub is SIGKILLed at random moments while a workload of
 * more than 10,000 source transactions runs, and restarted each time. At the end the
 * target equals the source with nothing lost and nothing duplicated — the ledger table
 * has no unique constraint, so a transaction applied twice would show as extra rows.
 * Throughout, the slot's confirmed_flush_lsn is sampled and must never exceed the origin
 * LSN committed in the target (read after it, so the comparison is conservative).
 * Run five times: with the defaults, with the fastest configuration (binary, asynchronous
 * commit with flush tracking, grouping and multi-row inserts), with apply lanes
 * (apply_workers = 3), and with the fastest configuration, without and with lanes, where
 * a backlog of 4,000 more one-row transactions is then applied while the target itself fails
 * commits at random — a deferred constraint trigger, ENABLE ALWAYS, raises at COMMIT for
 * about one ledger row in 1,000 until a flag is cleared — each into its own database.
 * One more run applies through a mapping (docs/mapping.md): the tables retargeted into
 * another schema, columns renamed and excluded, computed columns filled by expressions,
 * and two source tables merged into one with a discriminator in a key override — the
 * reshaped statements, one per change — checked against the source read through the mapping;
 * two shards into one soft-deleting table move keys all along (onto keys the target holds
 * marked deleted), their live rows checked equal to the source's; a reshaped table without
 * row rules takes UPDATEs, batched as column arrays, also in the backlog applied while commits fail.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  checkLedger,
  connect,
  currentWalLsn,
  LEDGER_SCHEMA,
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

// npm test runs three of the runs (the defaults, the fastest configuration with target
// commit failures, and the mapping with target commit failures) on half the work; npm run test:faults runs all in full.
const FULL = process.env.PGSUB_FAULTS === 'full';
const SEED = Number(process.env.PGSUB_CRASH_SEED ?? Date.now() % 100_000);
const CLIENTS = 4;
const TRANSACTIONS_PER_CLIENT = FULL ? 2600 : 1300;
const MIN_KILLS = 5;
/** Transactions of the backlog applied while the target fails commits (fault runs). */
const FAULT_BACKLOG = FULL ? 4000 : 2000;
/** Chance a ledger row fails its commit while faults are on: about six failures per backlog (a run with none: e^-6, 0.25%). */
const FAULT_RATE = 6 / FAULT_BACKLOG;

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];
/** The mapped run's target: the ledger tables retargeted, renamed and with computed columns. */
const MAPPED_SCHEMA = `
  CREATE SCHEMA books;
  CREATE TABLE books.entries (client_id int NOT NULL, seq int NOT NULL, amount int NOT NULL, memo text, amount_x2 int);
  CREATE TABLE books.journal (src text, k1 int, k2 int, payload text, PRIMARY KEY (src, k1, k2));
  INSERT INTO books.journal SELECT 'accounts', g, 0, '0/0' FROM generate_series(1, 100) g;
  CREATE TABLE books.merged (shard text NOT NULL, id int NOT NULL, v text, deleted boolean NOT NULL DEFAULT false, PRIMARY KEY (shard, id));
  CREATE TABLE books.counters (id int PRIMARY KEY, n int, memo text, n_x2 int);
  INSERT INTO books.counters SELECT g, 0, NULL, 0 FROM generate_series(1, 50) g;`;
/** The mapped run's shards on the publisher: rows inserted, deleted and moving keys (onto keys soft-deleted on the target). */
const SHARDS_SCHEMA = `CREATE TABLE app.sa (id int PRIMARY KEY, v text); CREATE TABLE app.sb (id int PRIMARY KEY, v text);
  CREATE TABLE app.counters (id int PRIMARY KEY, n int, note text); INSERT INTO app.counters SELECT g, 0 FROM generate_series(1, 50) g;`;
/** Transactions per shard of the mapped run's key workload. */
const SHARD_TRANSACTIONS = FULL ? 1200 : 600;
/** Ledger renamed with a computed column; accounts and tags both into books.journal (many-to-one). */
const MAPPING = JSON.stringify({
  tables: {
    'app.ledger': { target: 'books.entries', columns: { client: 'client_id', note: 'memo' }, computed: { amount_x2: 'amount * 2' } },
    'app.accounts': {
      target: 'books.journal',
      columns: { id: 'k1', balance: null, touched: null },
      computed: { k2: '0', payload: `balance::text || '/' || touched::text` },
      discriminator: { column: 'src', value: 'accounts' },
      key: ['src', 'k1', 'k2'],
    },
    'app.tags': { target: 'books.journal', columns: { client: 'k1', seq: 'k2', tag: 'payload' }, discriminator: { column: 'src', value: 'tags' }, key: ['src', 'k1', 'k2'] },
    'app.sa': { target: 'books.merged', discriminator: { column: 'shard', value: 'a' }, soft_delete: 'deleted' },
    'app.sb': { target: 'books.merged', discriminator: { column: 'shard', value: 'b' }, soft_delete: 'deleted' },
    // Reshaped without row rules: its UPDATEs are batched as column arrays (update-rows.ts).
    'app.counters': { target: 'books.counters', columns: { note: 'memo' }, computed: { n_x2: 'n * 2' } },
  },
});

const RUNS: { name: string; sub: string; db: string; env: Record<string, string>; faults?: boolean; mapped?: boolean }[] = [
  { name: 'defaults', sub: 'crash', db: 'crash', env: {} as Record<string, string> },
  { name: 'fastest configuration', sub: 'crashfast', db: 'crashfast', env: { PGSUB_BINARY: 'true', PGSUB_SYNCHRONOUS_COMMIT: 'off' } as Record<string, string> },
  // Lanes commit in source order from several connections; small groups keep them all busy after each restart.
  {
    name: 'apply lanes',
    sub: 'crashlanes',
    db: 'crashlanes',
    env: { PGSUB_BINARY: 'true', PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_APPLY_WORKERS: '3', PGSUB_GROUP_TRANSACTIONS: '32' } as Record<string, string>,
  },
  // Commits pipelined on the apply connection, grouped, batched and COPY'd, asynchronous.
  {
    name: 'target commits failing at random',
    sub: 'crashfault',
    db: 'crashfault',
    env: { PGSUB_BINARY: 'true', PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_RETRY_MAX_DELAY: '0.5' } as Record<string, string>,
    faults: true,
  },
  {
    name: 'target commits failing at random, apply lanes',
    sub: 'crashfaultl',
    db: 'crashfaultl',
    env: { PGSUB_BINARY: 'true', PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_APPLY_WORKERS: '3', PGSUB_GROUP_TRANSACTIONS: '32', PGSUB_RETRY_MAX_DELAY: '0.5' } as Record<
      string,
      string
    >,
    faults: true,
  },
  // Reshaped inserts batched (column arrays, VALUES lists) and grouped while target commits fail.
  {
    name: 'mapping, target commits failing at random',
    sub: 'crashmap',
    db: 'crashmap',
    env: { PGSUB_BINARY: 'true', PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_MAPPING: MAPPING, PGSUB_RETRY_MAX_DELAY: '0.5' },
    faults: true,
    mapped: true,
  },
];

/** Fails a target commit for about FAULT_RATE of ledger rows while public.fault says so. */
const FAULTS = `
  CREATE TABLE public.fault (on_ boolean NOT NULL); INSERT INTO public.fault VALUES (false);
  CREATE FUNCTION app.flaky() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF (SELECT on_ FROM public.fault) AND pg_catalog.random() < ${FAULT_RATE} THEN RAISE EXCEPTION 'injected commit failure'; END IF;
    RETURN NULL;
  END $$;
  CREATE CONSTRAINT TRIGGER ledger_flaky AFTER INSERT ON app.ledger DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION app.flaky();
  ALTER TABLE app.ledger ENABLE ALWAYS TRIGGER ledger_flaky;`;

// PGSUB_CRASH_RUN=<sub> runs that one run alone (while working on it).
const SELECTED = RUNS.filter((r) =>
  process.env.PGSUB_CRASH_RUN ? r.sub === process.env.PGSUB_CRASH_RUN : FULL || r.sub === 'crash' || r.sub === 'crashfault' || r.sub === 'crashmap',
);

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'crash-pub' }), startCluster({ major: 18, name: 'crash-tgt' })]);
  for (const run of SELECTED) {
    await publisher.createDatabase(run.db);
    await target.createDatabase(run.db);
    await publisher.query(
      run.mapped
        ? `${LEDGER_SCHEMA} ${SHARDS_SCHEMA} CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags, app.sa, app.sb, app.counters;`
        : `${LEDGER_SCHEMA} CREATE PUBLICATION pub FOR TABLE app.ledger, app.accounts, app.tags;`,
      [],
      run.db,
    );
    await target.query(run.mapped ? MAPPED_SCHEMA : LEDGER_SCHEMA, [], run.db);
    // The mapped run's ledger is books.entries on the target.
    if (run.faults) await target.query(run.mapped ? FAULTS.replace(/app\.ledger/g, 'books.entries').replace(/app\.flaky/g, 'books.flaky') : FAULTS, [], run.db);
  }
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

/**
 * One shard's key workload: each transaction inserts an absent id, updates, deletes, or
 * moves a row to an absent id — often one the target holds soft-deleted, so the move
 * revives it — sometimes two of these at once.
 */
async function runShardWorkload(db: string, table: 'app.sa' | 'app.sb', seed: number): Promise<void> {
  const rand = prng(seed);
  const present = new Set<number>();
  const client = await connect(publisher, db);
  const absent = () => {
    for (;;) {
      const id = 1 + Math.floor(rand() * 40);
      if (!present.has(id)) return id;
    }
  };
  try {
    for (let t = 0; t < SHARD_TRANSACTIONS; t++) {
      await client.query('BEGIN');
      for (let k = rand() < 0.25 ? 2 : 1; k > 0; k--) {
        const ids = [...present];
        const id = ids[Math.floor(rand() * ids.length)];
        // Between 10 and 30 of the 40 ids present: an absent one is always there to insert or move to.
        const op = id === undefined || present.size < 10 ? 0 : present.size >= 30 ? 2 : Math.floor(rand() * 4);
        if (op === 0) {
          const n = absent();
          await client.query(`INSERT INTO ${table} VALUES ($1, $2)`, [n, `i${t}`]);
          present.add(n);
        } else if (op === 1) {
          await client.query(`UPDATE ${table} SET v = $2 WHERE id = $1`, [id, `u${t}`]);
        } else if (op === 2) {
          await client.query(`DELETE FROM ${table} WHERE id = $1`, [id]);
          present.delete(id!);
        } else {
          const n = absent();
          await client.query(`UPDATE ${table} SET id = $2, v = $3 WHERE id = $1`, [id, n, `m${t}`]);
          present.delete(id!);
          present.add(n);
        }
      }
      // One counter row per transaction (two clients never deadlock): reshaped updates, batched.
      await client.query(`UPDATE app.counters SET n = n + 1, note = $2 WHERE id = $1`, [1 + Math.floor(rand() * 50), `${table} ${t}`]);
      await client.query('COMMIT');
    }
  } finally {
    await client.end();
  }
}

/** checkLedger through the mapping: the source read with the mapping's expressions against the target's tables. */
async function checkMappedLedger(db: string): Promise<{ sourceRows: number; targetRows: number; duplicates: unknown[]; equal: boolean }> {
  const read = (c: Cluster, sql: string) => c.query<{ n: number; ledger: string; accounts: string; tags: string }>(sql, [], db);
  const [src] = await read(
    publisher,
    `SELECT (SELECT count(*)::int FROM app.ledger) AS n,
            (SELECT md5(string_agg(format('%s|%s|%s|%s|%s', client, seq, amount, note, amount * 2), ',' ORDER BY client, seq)) FROM app.ledger) AS ledger,
            (SELECT md5(string_agg(format('%s|%s', id, balance || '/' || touched), ',' ORDER BY id)) FROM app.accounts) AS accounts,
            (SELECT md5(string_agg(format('%s|%s|%s', client, seq, tag), ',' ORDER BY client, seq)) FROM app.tags) AS tags`,
  );
  const [dst] = await read(
    target,
    `SELECT (SELECT count(*)::int FROM books.entries) AS n,
            (SELECT md5(string_agg(format('%s|%s|%s|%s|%s', client_id, seq, amount, memo, amount_x2), ',' ORDER BY client_id, seq)) FROM books.entries) AS ledger,
            (SELECT md5(string_agg(format('%s|%s', k1, payload), ',' ORDER BY k1)) FROM books.journal WHERE src = 'accounts' AND k2 = 0) AS accounts,
            (SELECT md5(string_agg(format('%s|%s|%s', k1, k2, payload), ',' ORDER BY k1, k2)) FROM books.journal WHERE src = 'tags') AS tags`,
  );
  const duplicates = await target.query(`SELECT client_id, seq, count(*)::int AS n FROM books.entries GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 5`, [], db);
  // The shards: the target's live rows are the source's rows; the rest are marked deleted.
  const shards = async (c: Cluster, sql: string) => (await c.query<{ h: string | null }>(sql, [], db))[0]!.h;
  const srcShards = await shards(
    publisher,
    `SELECT md5(string_agg(format('%s|%s|%s', s, id, v), ',' ORDER BY s, id)) AS h FROM (SELECT 'a' AS s, * FROM app.sa UNION ALL SELECT 'b', * FROM app.sb) u`,
  );
  const dstShards = await shards(target, `SELECT md5(string_agg(format('%s|%s|%s', shard, id, v), ',' ORDER BY shard, id)) AS h FROM books.merged WHERE NOT deleted`);
  const srcCounters = await shards(publisher, `SELECT md5(string_agg(format('%s|%s|%s|%s', id, n, note, n * 2), ',' ORDER BY id)) AS h FROM app.counters`);
  const dstCounters = await shards(target, `SELECT md5(string_agg(format('%s|%s|%s|%s', id, n, memo, n_x2), ',' ORDER BY id)) AS h FROM books.counters`);
  return {
    sourceRows: src!.n,
    targetRows: dst!.n,
    duplicates,
    equal: src!.ledger === dst!.ledger && src!.accounts === dst!.accounts && src!.tags === dst!.tags && srcShards === dstShards && srcCounters === dstCounters,
  };
}

async function originLsn(sub: string, db: string): Promise<bigint | null> {
  const rows = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = $1`, [sub], db).catch(() => []);
  return rows[0] ? lsnToBigint(rows[0].lsn) : null;
}

for (const run of SELECTED) {
  test(`SIGKILL at random moments during ${CLIENTS * TRANSACTIONS_PER_CLIENT} transactions, ${run.name}: nothing lost, nothing duplicated (seed ${SEED})`, {
    timeout: 600_000,
  }, async () => {
    const rand = prng(SEED);
    const env = {
      PGSUB_SOURCE: publisher.url(run.db),
      PGSUB_TARGET: target.url(run.db),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: run.sub,
      PGSUB_COPY_DATA: 'false',
      PGSUB_STATUS_INTERVAL: '1',
      PGSUB_RETRY_MIN_DELAY: '0.2',
      PGSUB_LOG_LEVEL: 'info',
      ...run.env,
    };

    // Sample the invariant for the whole run: confirmed_flush (read first) <= origin (read after).
    let samples = 0;
    const violations: string[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const confirmed = await slotConfirmedLsn(publisher, run.sub).catch(() => null);
        const origin = await originLsn(run.sub, run.db);
        if (confirmed !== null && origin !== null) {
          samples++;
          if (confirmed > origin) violations.push(`confirmed ${confirmed} > origin ${origin}`);
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    })();

    const first = spawnPgsub(env);
    children.push(first);
    await first.waitForLog('streaming started');
    let workloadDone = false;
    const workload = Promise.all([
      runLedgerWorkload(publisher, run.db, { clients: CLIENTS, transactionsPerClient: TRANSACTIONS_PER_CLIENT, seed: SEED }),
      ...(run.mapped ? [runShardWorkload(run.db, 'app.sa', SEED + 1), runShardWorkload(run.db, 'app.sb', SEED + 2)] : []),
    ]).then(() => {
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
    let expected = CLIENTS * TRANSACTIONS_PER_CLIENT;
    if (run.faults) {
      // A backlog written while pgsub is down is applied the fast way — grouped, pipelined,
      // batched — while the target fails commits at random (each failure retried), with one
      // more SIGKILL in the middle; then the target takes everything.
      current.kill('SIGKILL');
      await current.exited;
      // One-row transactions, as many as fit in flight: the pipelining at its deepest.
      // The mapped run's backlog also updates the reshaped counters: batched updates while commits fail.
      const counter = (seq: number) => (run.mapped ? ` UPDATE app.counters SET n = n + 1, note = 'backlog ${seq}' WHERE id = ${1 + (seq % 50)};` : '');
      const backlog = Array.from(
        { length: FAULT_BACKLOG },
        (_, seq) => `BEGIN; INSERT INTO app.ledger VALUES (${CLIENTS}, ${seq}, ${1 + (seq % 997)}, 'backlog ${seq}');${counter(seq)} COMMIT;`,
      );
      await publisher.query(backlog.join('\n'), [], run.db);
      expected += FAULT_BACKLOG;
      await target.query(`UPDATE public.fault SET on_ = true`, [], run.db);
      current = spawnPgsub(env);
      children.push(current);
      await current.waitForLog('streaming started');
      await new Promise((r) => setTimeout(r, 500 + Math.floor(rand() * 1500)));
      current.kill('SIGKILL');
      await current.exited;
      kills++;
      current = spawnPgsub(env);
      children.push(current);
      const end = await currentWalLsn(publisher, run.db);
      await waitFor(async () => ((await slotConfirmedLsn(publisher, run.sub)) ?? 0n) >= end, { timeoutMs: 300_000, intervalMs: 200, what: 'catch-up while commits fail' }).catch(
        (err: Error) => {
          throw new Error(`${err.message}; pgsub's last output: ${current.output().slice(-4000)}`);
        },
      );
      await target.query(`UPDATE public.fault SET on_ = false`, [], run.db);
    }

    // Last run: let it catch up, then stop it cleanly (once it runs: a process still loading
    // has no signal handler yet, and the killed one may have confirmed everything already).
    await current.waitForLog('streaming started');
    const end = await currentWalLsn(publisher, run.db);
    await waitFor(async () => ((await slotConfirmedLsn(publisher, run.sub)) ?? 0n) >= end, { timeoutMs: 180_000, intervalMs: 200, what: 'catch-up after the last restart' });
    current.kill('SIGTERM');
    assert.equal(await current.exited, 0, current.output().slice(-3000));
    sampling = false;
    await sampler;

    assert.ok(kills >= MIN_KILLS, `only ${kills} kills`);
    const injected = children.reduce((n, c) => n + (c.output().match(/injected commit failure/g) ?? []).length, 0);
    if (run.faults) {
      assert.ok(injected > 0, 'no commit failed');
      process.stdout.write(`# crash test (${run.name}): ${injected} log lines of injected commit failures\n`);
    }
    if (run.env.PGSUB_APPLY_WORKERS) {
      // Lanes run while behind: after a restart there is always a backlog.
      const withLanes = children.filter((c) => c.output().includes('apply lanes started')).length;
      assert.ok(withLanes > 0, 'no process ever applied through lanes');
      process.stdout.write(`# crash test (${run.name}): ${withLanes} processes applied through lanes\n`);
    }
    assert.deepEqual(violations, [], 'the slot confirmed a position the target had not committed');
    assert.ok(samples > 50, `only ${samples} samples of the flush invariant`);

    const ledger = run.mapped ? await checkMappedLedger(run.db) : await checkLedger(publisher, run.db, target, run.db);
    assert.equal(ledger.sourceRows, expected);
    assert.deepEqual(ledger.duplicates, [], 'duplicated transactions in the target');
    assert.equal(ledger.targetRows, ledger.sourceRows, 'lost transactions in the target');
    assert.ok(ledger.equal, 'target differs from source');
    const [applied] = await target.query(`SELECT transactions_applied::int AS n FROM pgsub.origin WHERE subscription = $1`, [run.sub], run.db);
    assert.equal(applied.n, expected + (run.mapped ? 2 * SHARD_TRANSACTIONS : 0), 'each source transaction counted exactly once in the origin row');
    process.stdout.write(`# crash test (${run.name}): seed ${SEED}, ${kills} kills, ${samples} invariant samples, ${ledger.targetRows} ledger rows\n`);
  });
}
