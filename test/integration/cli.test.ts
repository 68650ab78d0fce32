/**
 * The `pgsub` command as an operator runs it: a child process (`node bin/pgsub.js`)
 * configured through PGSUB_* environment variables only, against a PostgreSQL 18
 * publisher and a PostgreSQL 18 target (one database each). Covers:
 *  - `run` replicating an INSERT, SIGTERM → exit 0 with a 'stopped' log line, and no
 *    password (source or target) anywhere in its output, also after forced errors;
 *  - SIGTERM while a 300k-row source transaction is being applied: the target holds none
 *    or all of it, the origin agrees, and a restart completes it exactly once;
 *  - configuration errors: one stderr line `pgsub: CODE: message`, exit 2;
 *  - `status --json` from the environment alone and from a config file.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { connect, lsnToBigint, spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'app';
const TARGET_ROLE = 'pgsub_apply';
// Characters that must be percent-encoded in a URI, so both spellings are checked for leaks.
const TARGET_PASSWORD = 'Tgt#S3cr3t@pw';
const SOURCE_PASSWORD = 'Src-Pa55-w0rd';
const SECRETS = [TARGET_PASSWORD, encodeURIComponent(TARGET_PASSWORD), SOURCE_PASSWORD, 'S3cr3t', 'Pa55'];
const BIG_ROWS = 300_000;

let publisher: Cluster;
let target: Cluster;
const children = new Set<PgsubProcess>();

function sourceUri(): string {
  return `postgresql://postgres:${SOURCE_PASSWORD}@${publisher.host}:${publisher.port}/${DB}`;
}
function targetUri(): string {
  return `postgresql://${TARGET_ROLE}:${encodeURIComponent(TARGET_PASSWORD)}@${target.host}:${target.port}/${DB}?application_name=cli_test`;
}

/** Env for a subscription; every setting comes from PGSUB_* (no config file). */
function pgsubEnv(subscription: string, publication: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PGSUB_SOURCE: sourceUri(),
    PGSUB_TARGET: targetUri(),
    PGSUB_PUBLICATION: publication,
    PGSUB_SUBSCRIPTION: subscription,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
    ...extra,
  };
}

interface Spawned extends PgsubProcess {
  stderr(): string;
  stdout(): string;
}

function start(env: Record<string, string>, args: string[] = ['run']): Spawned {
  const p = spawnPgsub(env, args);
  children.add(p);
  let err = '';
  let out = '';
  p.child.stderr!.on('data', (c: Buffer) => (err += c.toString('utf8')));
  p.child.stdout!.on('data', (c: Buffer) => (out += c.toString('utf8')));
  void p.exited.then(() => children.delete(p));
  return Object.assign(p, { stderr: () => err, stdout: () => out });
}

/** Every JSON log record printed so far. */
function logRecords(output: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // an unfinished line
    }
  }
  return out;
}

function assertNoSecrets(output: string, what: string): void {
  for (const s of SECRETS) assert.ok(!output.includes(s), `${what}: output contains ${JSON.stringify(s)}:\n${output.slice(-3000)}`);
}

async function sigterm(p: Spawned, timeoutMs = 20_000): Promise<number | string> {
  p.kill('SIGTERM');
  return withTimeout(p.exited, timeoutMs, `pgsub to exit after SIGTERM; output:\n${p.output().slice(-3000)}`);
}

async function originRow(subscription: string): Promise<{ remote_lsn: string; transactions_applied: string } | undefined> {
  const rows = await target.query<{ remote_lsn: string; transactions_applied: string }>(
    'SELECT remote_lsn::text AS remote_lsn, transactions_applied::text AS transactions_applied FROM pgsub.origin WHERE subscription = $1',
    [subscription],
    DB,
  );
  return rows[0];
}

async function slotLsn(slot: string): Promise<bigint | null> {
  const [row] = await publisher.query<{ lsn: string | null }>('SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = $1', [slot], DB);
  return row?.lsn ? lsnToBigint(row.lsn) : null;
}

async function count(cluster: Cluster, table: string): Promise<number> {
  const [row] = await cluster.query<{ n: string }>(`SELECT count(*) AS n FROM ${table}`, [], DB);
  return Number(row!.n);
}

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'cli-pub' }), startCluster({ major: 18, name: 'cli-tgt' })]);
  await Promise.all([publisher.createDatabase(DB), target.createDatabase(DB)]);
  // Superuser: the apply session sets session_replication_role. Trust auth accepts any
  // password; what matters is that pgsub is handed one and never prints it.
  await target.query(`CREATE ROLE ${TARGET_ROLE} LOGIN SUPERUSER PASSWORD '${TARGET_PASSWORD}'`);
  const schema = `
    CREATE TABLE public.items (id int PRIMARY KEY, v text NOT NULL);
    CREATE TABLE public.late (id int PRIMARY KEY, v text);
    CREATE TABLE public.big (id int PRIMARY KEY, pad text NOT NULL);`;
  await publisher.query(
    `${schema}
    CREATE PUBLICATION pub_items FOR TABLE public.items;
    CREATE PUBLICATION pub_big FOR TABLE public.big;
    CREATE EXTENSION pg_walinspect;`,
    [],
    DB,
  );
  // In the target, `big` has no key: a transaction applied twice would show as extra rows
  // instead of a unique violation. `late` is created only later, by the test.
  await target.query(
    `
    CREATE TABLE public.items (id int PRIMARY KEY, v text NOT NULL);
    CREATE TABLE public.big (id int NOT NULL, pad text NOT NULL);`,
    [],
    DB,
  );
});

after(async () => {
  for (const p of children) p.kill('SIGKILL');
  await Promise.all([...children].map((p) => withTimeout(p.exited, 10_000, 'leftover pgsub to die').catch(() => {})));
  await stopAllClusters();
});

describe('pgsub CLI against PostgreSQL 18', () => {
  test('run from PGSUB_* env only: replicates, survives forced errors without printing a password, SIGTERM exits 0', async () => {
    const p = start(pgsubEnv('cli_a', 'pub_items'));
    const streaming = await p.waitForLog('streaming started');
    assert.equal(streaming.slot, 'cli_a');
    // The state directory, logged once at start: the per-user default (spawnPgsub passes HOME only).
    const starting = logRecords(p.output()).filter((r) => r.msg === 'starting');
    assert.equal(starting.length, 1, 'one starting line');
    assert.equal(starting[0]!.level, 30, 'at info');
    assert.equal(starting[0]!.state_dir, path.join(process.env.HOME ?? '/tmp', '.local', 'state', 'pgsub', 'cli_a'));
    assert.match(String(streaming.publisher), /host=127\.0\.0\.1 .* user=postgres/);

    await publisher.query("INSERT INTO public.items VALUES (1, 'one'), (2, 'two')", [], DB);
    await waitFor(async () => (await count(target, 'public.items')) === 2, { timeoutMs: 20_000, what: 'the INSERT to reach the target' });
    const rows = await target.query<{ id: number; v: string }>('SELECT id, v FROM public.items ORDER BY id', [], DB);
    assert.deepEqual(rows, [
      { id: 1, v: 'one' },
      { id: 2, v: 'two' },
    ]);

    // A table published since the start is not part of the subscription: its change is
    // skipped (native: no pg_subscription_rel row) until pgsub refresh adds it.
    await publisher.query("ALTER PUBLICATION pub_items ADD TABLE public.late; INSERT INTO public.late VALUES (9, 'before the refresh')", [], DB);
    const skipped = await p.waitForLog('changes skipped: the table is published but not part of the subscription yet; pgsub refresh (or the periodic refresh) adds it', 30_000);
    assert.equal(skipped.table, 'public.late');
    const refresh = start(pgsubEnv('cli_a', 'pub_items'), ['refresh']);
    assert.equal(await withTimeout(refresh.exited, 30_000, 'pgsub refresh'), 0, refresh.output());
    const added = (r: Record<string, unknown>) => r.msg === 'table added to the subscription without a copy (copy_data = false); applied from now on' && r.table === 'public.late';
    await waitFor(() => logRecords(p.output()).some(added), { timeoutMs: 30_000, what: `public.late added at the refresh:\n${p.output().slice(-2000)}` });
    assert.equal(logRecords(p.output()).find(added)!.copy, false);

    // Forced error: a table of the subscription that the target lacks. Retryable; pgsub keeps trying.
    await publisher.query("INSERT INTO public.late VALUES (10, 'late')", [], DB);
    await p.waitForLog('apply failed; retrying', 30_000);
    const failure = logRecords(p.output()).find((r) => r.msg === 'apply failed; retrying')!;
    assert.equal((failure.err as { code?: string }).code, 'PGSUB_SCHEMA_MISMATCH');
    assert.match(String((failure.err as { message?: string }).message), /"public"\."late"|public\.late/);
    assertNoSecrets(p.output(), 'after a schema mismatch');

    // Once the operator creates it, apply resumes by itself; nothing is lost or doubled.
    await target.query('CREATE TABLE public.late (id int PRIMARY KEY, v text)', [], DB);
    await waitFor(async () => (await count(target, 'public.late')) === 1, { timeoutMs: 30_000, what: 'apply to resume after the table was created' });
    await publisher.query("INSERT INTO public.items VALUES (3, 'three')", [], DB);
    await waitFor(async () => (await count(target, 'public.items')) === 3, { timeoutMs: 20_000, what: 'the next INSERT' });
    // The change skipped before the refresh stays skipped across the session's restart: its
    // transaction was committed with the origin (as native's), so no re-stream brings it back.
    assert.deepEqual(await target.query('SELECT id FROM public.late ORDER BY id', [], DB), [{ id: 10 }]);

    assert.equal(await sigterm(p), 0, p.output().slice(-3000));
    const records = logRecords(p.output());
    assert.ok(
      records.some((r) => r.msg === 'stopping' && r.signal === 'SIGTERM'),
      'logs the signal',
    );
    assert.ok(
      records.some((r) => r.msg === 'stopped'),
      `a 'stopped' line:\n${p.output().slice(-2000)}`,
    );
    assert.equal(records.filter((r) => Number(r.level) >= 60).length, 0, 'no fatal lines');
    assertNoSecrets(p.output(), 'whole run');
    const origin = await originRow('cli_a');
    assert.ok(origin && Number(origin.transactions_applied) >= 3, `origin ${JSON.stringify(origin)}`);
  });

  test('forced errors at startup do not print a password either', async () => {
    // A target database that does not exist (the URI keeps its password).
    const wrongDb = start({
      ...pgsubEnv('cli_wrongdb', 'pub_items'),
      PGSUB_TARGET: `postgresql://${TARGET_ROLE}:${encodeURIComponent(TARGET_PASSWORD)}@${target.host}:${target.port}/no_such_db`,
    });
    // Nothing listening on the source port.
    const noSource = start({ ...pgsubEnv('cli_nosource', 'pub_items'), PGSUB_SOURCE: `postgresql://postgres:${SOURCE_PASSWORD}@127.0.0.1:1/${DB}` });

    for (const [p, mentions] of [
      [wrongDb, /no_such_db/],
      [noSource, /ECONNREFUSED|127\.0\.0\.1/],
    ] as const) {
      await p.waitForLog('apply failed; retrying', 30_000);
      // It keeps retrying (a second attempt is logged) rather than exiting.
      await waitFor(() => logRecords(p.output()).filter((r) => r.msg === 'apply failed; retrying').length >= 2, { timeoutMs: 10_000, what: 'a second attempt' });
      const failure = logRecords(p.output()).find((r) => r.msg === 'apply failed; retrying')!;
      assert.match(String((failure.err as { message?: string }).message), mentions);
      assert.equal(p.child.exitCode, null, 'still running');
      assert.equal(await sigterm(p), 0);
      assertNoSecrets(p.output(), p === wrongDb ? 'wrong target database' : 'unreachable source');
    }
  });

  test('a wrong publication name is reported', async () => {
    const p = start(pgsubEnv('cli_wrongpub', 'no_such_pub'));
    try {
      await waitFor(() => p.child.exitCode !== null, { timeoutMs: 30_000, what: 'pgsub to stop on a missing publication' });
      // A setup error the operator must fix: exit 2 and one stderr line, as a configuration error.
      assert.equal(p.child.exitCode, 2);
      assert.match(p.output(), /"code":"PGSUB_SOURCE_SETUP","message":"publication \\"no_such_pub\\" not found/);
      assert.match(p.stderr(), /^pgsub: PGSUB_SOURCE_SETUP: publication "no_such_pub" not found/m);
      assert.doesNotMatch(p.output(), /streaming started/);
    } finally {
      if (p.child.exitCode === null) await sigterm(p);
      assertNoSecrets(p.output(), 'wrong publication');
    }
  });

  test('SIGTERM during a 300k-row transaction: none or all of it, origin agrees, a restart completes it exactly once', async (t) => {
    // First run: create the slot and the origin, then stop, so the transaction below is a backlog.
    const first = start(pgsubEnv('cli_big', 'pub_big'));
    await first.waitForLog('streaming started');
    assert.equal(await sigterm(first), 0);

    const client = await connect(publisher, DB);
    let commitEnd: bigint;
    try {
      await client.query('BEGIN');
      await client.query(`INSERT INTO public.big SELECT i, md5(i::text) FROM generate_series(1, ${BIG_ROWS}) AS i`);
      const {
        rows: [inTx],
      } = await client.query<{ xid: string; pre: string }>('SELECT pg_current_xact_id()::text AS xid, pg_current_wal_insert_lsn()::text AS pre');
      await client.query('COMMIT');
      const {
        rows: [post],
      } = await client.query<{ post: string }>('SELECT pg_current_wal_flush_lsn()::text AS post');
      // The commit record's end: what pgoutput sends as the commit's end_lsn.
      const {
        rows: [commit],
      } = await client.query<{ end_lsn: string }>(
        "SELECT end_lsn::text FROM pg_get_wal_records_info($1, $2) WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $3",
        [inTx!.pre, post!.post, inTx!.xid],
      );
      assert.ok(commit, 'found the commit record');
      commitEnd = lsnToBigint(commit.end_lsn);
    } finally {
      await client.end();
    }

    // Second run: stop it while the transaction is being applied. Uncommitted rows are
    // invisible, but the pages they fill are not: wait until the target table grows.
    const second = start(pgsubEnv('cli_big', 'pub_big'));
    await second.waitForLog('streaming started');
    const startedAt = Date.now();
    await waitFor(
      async () => {
        const [row] = await target.query<{ size: string }>("SELECT pg_relation_size('public.big') AS size", [], DB);
        return Number(row!.size) > 2 * 1024 * 1024;
      },
      { timeoutMs: 60_000, intervalMs: 20, what: 'the target table to fill while the transaction is applied' },
    );
    const signalledAt = Date.now();
    assert.equal(await sigterm(second, 30_000), 0, second.output().slice(-3000));
    const stopMs = Date.now() - signalledAt;
    assert.ok(
      logRecords(second.output()).some((r) => r.msg === 'stopped'),
      'a stopped line',
    );
    assertNoSecrets(second.output(), 'big transaction');

    const rowsAfterStop = await count(target, 'public.big');
    const originAfterStop = lsnToBigint((await originRow('cli_big'))!.remote_lsn);
    const slotAfterStop = await slotLsn('cli_big');
    assert.ok(rowsAfterStop === 0 || rowsAfterStop === BIG_ROWS, `partial transaction in the target: ${rowsAfterStop} rows`);
    if (rowsAfterStop === 0) assert.ok(originAfterStop < commitEnd, `no rows but origin ${originAfterStop} >= commit end ${commitEnd}`);
    else assert.ok(originAfterStop >= commitEnd, `all rows but origin ${originAfterStop} < commit end ${commitEnd}`);
    assert.ok(slotAfterStop !== null && slotAfterStop <= originAfterStop, `slot ${slotAfterStop} ahead of origin ${originAfterStop}`);

    // Third run: catch up.
    const third = start(pgsubEnv('cli_big', 'pub_big'));
    await waitFor(async () => (await count(target, 'public.big')) >= BIG_ROWS, { timeoutMs: 90_000, intervalMs: 250, what: 'the restarted pgsub to apply the transaction' });
    await waitFor(async () => ((await slotLsn('cli_big')) ?? 0n) >= commitEnd, { timeoutMs: 20_000, what: 'the slot to be confirmed past the commit' });
    const [check] = await target.query<{ n: string; ids: string; lo: number; hi: number; bad: string }>(
      `SELECT count(*) AS n, count(DISTINCT id) AS ids, min(id) AS lo, max(id) AS hi, count(*) FILTER (WHERE pad <> md5(id::text)) AS bad FROM public.big`,
      [],
      DB,
    );
    assert.deepEqual(check, { n: String(BIG_ROWS), ids: String(BIG_ROWS), lo: 1, hi: BIG_ROWS, bad: '0' });
    const originFinal = lsnToBigint((await originRow('cli_big'))!.remote_lsn);
    assert.ok(originFinal >= commitEnd, `origin ${originFinal} < commit end ${commitEnd}`);
    assert.ok(((await slotLsn('cli_big')) ?? 0n) <= originFinal, 'slot never ahead of the origin');
    assert.equal(await sigterm(third), 0);
    assertNoSecrets(third.output(), 'catch-up');
    t.diagnostic(`big transaction: SIGTERM ${signalledAt - startedAt} ms after streaming started; ${rowsAfterStop} rows in the target after exit; exit took ${stopMs} ms`);
  });

  test('configuration errors: one stderr line naming the problem, exit 2', async () => {
    const { PGSUB_TARGET: _t, ...noTarget } = pgsubEnv('cli_cfg', 'pub_items');
    const cases = [
      { env: noTarget, args: ['run'], line: /^pgsub: PGSUB_CONFIG_INVALID: invalid configuration: target is required/ },
      { env: pgsubEnv('cli_cfg', 'pub_items', { PGSUB_FAILOVER: 'true' }), args: ['run'], line: /^pgsub: PGSUB_NOT_IMPLEMENTED: failover = true is not implemented yet/ },
      {
        env: pgsubEnv('cli_cfg', 'pub_items', { PGSUB_SOURCE: `postgresql://postgres:${SOURCE_PASSWORD}@127.0.0.1:99999/${DB}` }),
        args: ['run'],
        line: /^pgsub: PGSUB_CONFIG_INVALID: source: /,
      },
      {
        env: pgsubEnv('cli_cfg', 'pub_items', { PGSUB_TARGET: `${targetUri()}&sslmode=sometimes` }),
        args: ['run'],
        line: /^pgsub: PGSUB_CONFIG_INVALID: target: sslmode "sometimes"/,
      },
      {
        env: pgsubEnv('cli_cfg', 'pub_items', { PGSUB_PUBLICATON: 'typo' }),
        args: ['status', '--json'],
        line: /^pgsub: PGSUB_CONFIG_INVALID: environment variable PGSUB_PUBLICATON is not a pgsub setting; did you mean PGSUB_PUBLICATION\?$/,
      },
      {
        env: pgsubEnv('cli_cfg', 'pub_items', { PGSUB_STREAMING: 'maybe' }),
        args: ['run'],
        line: /^pgsub: PGSUB_CONFIG_INVALID: invalid configuration: streaming: "maybe" is not one of off, on, parallel \(from PGSUB_STREAMING\)$/,
      },
    ];
    const runs = cases.map((c) => ({ ...c, p: start(c.env, c.args) }));
    for (const { p, line } of runs) {
      assert.equal(await withTimeout(p.exited, 30_000, 'pgsub to exit on a config error'), 2, p.output());
      const lines = p.stderr().split('\n').filter(Boolean);
      assert.equal(lines.length, 1, `exactly one stderr line:\n${p.stderr()}`);
      assert.match(lines[0]!, line);
      assert.equal(p.stdout(), '', 'nothing on stdout');
      assertNoSecrets(p.output(), lines[0]!);
    }
  });

  test('status --json, from the environment alone and from a config file', async () => {
    // cli_a has applied transactions (first test); check it while it is not running.
    const fromEnv = start(pgsubEnv('cli_a', 'pub_items'), ['status', '--json']);
    assert.equal(await withTimeout(fromEnv.exited, 30_000, 'status to exit'), 0, fromEnv.output());
    const status = JSON.parse(fromEnv.stdout()) as Record<string, unknown>;
    assert.equal(status.subscription, 'cli_a');
    assert.equal(status.slot, 'cli_a');
    assert.equal(status.slot_exists, true);
    assert.equal(status.slot_active, false);
    assert.match(String(status.origin_remote_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
    assert.match(String(status.slot_confirmed_flush_lsn), /^[0-9A-F]+\/[0-9A-F]+$/);
    const origin = lsnToBigint(String(status.origin_remote_lsn));
    assert.ok(lsnToBigint(String(status.slot_confirmed_flush_lsn)) <= origin, 'slot not ahead of origin');
    assert.equal(origin, lsnToBigint((await originRow('cli_a'))!.remote_lsn), 'origin as stored in the target');
    assert.ok(Number(status.transactions_applied) >= 3, `transactions_applied ${status.transactions_applied}`);
    assert.equal(typeof status.lag_bytes, 'number');
    assert.equal(fromEnv.stderr(), '');
    assertNoSecrets(fromEnv.output(), 'status from env');

    // The same from a YAML file, with no PGSUB_* variables at all.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-cli-'));
    try {
      const file = path.join(dir, 'pgsub.yaml');
      fs.writeFileSync(file, `subscription: cli_a\nsource: "${sourceUri()}"\ntarget: "${targetUri()}"\npublication: [pub_items]\ncopy_data: false\n`);
      const fromFile = start({}, ['status', '--config', file, '--json']);
      assert.equal(await withTimeout(fromFile.exited, 30_000, 'status to exit'), 0, fromFile.output());
      const fileStatus = JSON.parse(fromFile.stdout()) as Record<string, unknown>;
      assert.equal(fileStatus.origin_remote_lsn, status.origin_remote_lsn);
      assert.equal(fileStatus.slot_confirmed_flush_lsn, status.slot_confirmed_flush_lsn);
      assertNoSecrets(fromFile.output(), 'status from file');

      // Plain text form: one "key value" line per field.
      const text = start(pgsubEnv('cli_a', 'pub_items'), ['status']);
      assert.equal(await withTimeout(text.exited, 30_000, 'status to exit'), 0, text.output());
      assert.match(text.stdout(), new RegExp(`^origin_remote_lsn +${String(status.origin_remote_lsn).replace('/', '\\/')}$`, 'm'));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('drop: refused while the slot is in use; then slot, rows and replication origin are gone; a second drop finds nothing', async () => {
    const env = pgsubEnv('cli_drop', 'pub_items');
    const running = start(env);
    await running.waitForLog('streaming started');
    const refused = start(env, ['drop']);
    assert.equal(await withTimeout(refused.exited, 30_000, 'drop to exit'), 2, refused.output());
    assert.match(refused.stderr(), /^pgsub: PGSUB_CONTROL_REFUSED: replication slot "cli_drop" is in use by walsender PID \d+/);
    running.kill('SIGTERM');
    assert.equal(await running.exited, 0, running.output());

    const drop = start(env, ['drop']);
    assert.equal(await withTimeout(drop.exited, 30_000, 'drop to exit'), 0, drop.output());
    assert.match(drop.stdout(), /^subscription cli_drop dropped: slot cli_drop dropped, [1-9]\d* row\(s\) of pgsub's schema deleted, replication origin dropped/);
    assertNoSecrets(drop.output(), 'drop');
    assert.equal((await publisher.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'cli_drop'`, [], DB)).length, 0);
    assert.equal((await target.query(`SELECT 1 FROM pg_replication_origin WHERE roname = 'pgsub_cli_drop'`, [], DB)).length, 0);
    assert.equal((await target.query(`SELECT 1 FROM pgsub.origin WHERE subscription = 'cli_drop'`, [], DB)).length, 0);
    // Other subscriptions keep theirs.
    assert.ok(await originRow('cli_a'));

    const again = start(env, ['drop']);
    assert.equal(await withTimeout(again.exited, 30_000, 'drop to exit'), 0, again.output());
    assert.match(again.stdout(), /slot cli_drop absent, 0 row\(s\) of pgsub's schema deleted, replication origin absent/);
  });
});
