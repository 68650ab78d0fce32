/**
 * A whole migration, PostgreSQL 14 → 18, under a running workload (pgbench with a bank
 * script when the system has one, else an in-process writer of the same transactions):
 * preflight ready, schema copy, the initial copy and streaming by a `pgsub run` child, the
 * foreign key at post-data, sequences synced while streaming; then
 *  - a cutover whose target is stopped while it waits for the fence LSN fails and lifts
 *    the fence: the source takes writes again, the service catches up after the restart;
 *  - the real cutover with the read-only fence under the workload: a sequence moved during
 *    the fence (by a session that overrides read-only) is synced exactly at the cutover,
 *    the workload's writes are rejected after the fence, the target equals the source at
 *    the fence LSN, every sequence is ahead of its last used value, and the reverse
 *    subscription carries writes on the new primary back to the old one.
 * The measured write downtime is printed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { loadConfig, type Config } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { CutoverError } from '../../src/errors.js';
import { runCutover, type CutoverReport } from '../../src/cli/cutover.js';
import { sequenceStatus } from '../../src/migrate/sequences.js';
import { compareTables, currentWalLsn, lsnToBigint, spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'bank';
const TABLES = ['bank.branches', 'bank.accounts', 'bank.history'];
const SCHEMA = `
  CREATE SCHEMA bank;
  CREATE TABLE bank.branches (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
  CREATE TABLE bank.accounts (id serial PRIMARY KEY, branch_id int NOT NULL REFERENCES bank.branches (id), balance bigint NOT NULL DEFAULT 0, filler text);
  CREATE TABLE bank.history (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account_id int NOT NULL, branch_id int NOT NULL, delta int NOT NULL, at timestamptz NOT NULL DEFAULT now());
  INSERT INTO bank.branches SELECT g FROM generate_series(1, 5) g;
  INSERT INTO bank.accounts (branch_id, filler) SELECT 1 + g % 5, repeat('x', 80) FROM generate_series(1, 20000) g;
  CREATE PUBLICATION bank_pub FOR TABLE bank.branches, bank.accounts, bank.history;
`;
const SCRIPT = `\\set aid random(1, 20000)
\\set bid random(1, 5)
\\set delta random(-5000, 5000)
BEGIN;
UPDATE bank.accounts SET balance = balance + :delta WHERE id = :aid;
UPDATE bank.branches SET balance = balance + :delta WHERE id = :bid;
INSERT INTO bank.history (account_id, branch_id, delta) VALUES (:aid, :bid, :delta);
COMMIT;
`;

let source: Cluster;
let target: Cluster;
let service: PgsubProcess;
const children: PgsubProcess[] = [];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-migrate-'));

const env = (): Record<string, string> => ({
  PGSUB_SOURCE: source.url(DB),
  PGSUB_TARGET: target.url(DB),
  PGSUB_PUBLICATION: 'bank_pub',
  PGSUB_SUBSCRIPTION: 'mig',
  PGSUB_SEQUENCE_INTERVAL: '1',
  PGSUB_SEQUENCE_MARGIN: '1000',
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '1',
  PGSUB_STATE_DIR: path.join(tmp, 'forward'),
});
const config = (): Config => loadConfig({ env: env() });

async function cli(args: string[]): Promise<{ code: number | string; stdout: string }> {
  const p = spawnPgsub(env(), args);
  let stdout = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  return { code, stdout: stdout || p.output() };
}

/** pgbench from the system's PostgreSQL, if there is one. */
function findPgbench(): string | null {
  for (const dir of ['/usr/lib/postgresql'].filter(fs.existsSync)) {
    for (const v of fs.readdirSync(dir).sort().reverse()) {
      const p = path.join(dir, v, 'bin', 'pgbench');
      if (fs.existsSync(p)) return p;
    }
  }
  return null;
}

interface Workload {
  kind: string;
  /** Stops it; what it saw: writes rejected as read-only, and its error output. */
  stop(): Promise<{ readOnly: number; output: string }>;
}

/** Two clients, a new connection per transaction (pgbench -C): after the fence, each new session is read-only. */
function startWorkload(): Workload {
  const pgbench = findPgbench();
  if (pgbench) {
    const script = path.join(tmp, 'bank.sql');
    fs.writeFileSync(script, SCRIPT);
    const child: ChildProcess = spawn(pgbench, ['-n', '-C', '-c', '2', '-j', '2', '-T', '300', '-f', script, '-h', source.host, '-p', String(source.port), '-U', 'postgres', DB], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH ?? '' },
    });
    let output = '';
    child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    const exited = new Promise<void>((r) => child.on('exit', () => r()));
    return {
      kind: `pgbench (${pgbench})`,
      stop: async () => {
        child.kill('SIGINT');
        await exited;
        return { readOnly: (output.match(/read-only transaction/g) ?? []).length, output };
      },
    };
  }
  let stopped = false;
  let readOnly = 0;
  let output = '';
  const client = async () => {
    while (!stopped) {
      const c = new pg.Client({ connectionString: source.url(DB) });
      c.on('error', () => {});
      try {
        await c.connect();
        const aid = 1 + Math.floor(Math.random() * 20000);
        const bid = 1 + Math.floor(Math.random() * 5);
        const delta = Math.floor(Math.random() * 10001) - 5000;
        await c.query('BEGIN');
        await c.query('UPDATE bank.accounts SET balance = balance + $1 WHERE id = $2', [delta, aid]);
        await c.query('UPDATE bank.branches SET balance = balance + $1 WHERE id = $2', [delta, bid]);
        await c.query('INSERT INTO bank.history (account_id, branch_id, delta) VALUES ($1, $2, $3)', [aid, bid, delta]);
        await c.query('COMMIT');
      } catch (err) {
        if ((err as { code?: string }).code === '25006') readOnly++;
        output += `${(err as Error).message}\n`;
      } finally {
        await c.end().catch(() => {});
      }
    }
  };
  const clients = [client(), client()];
  return {
    kind: 'in-process writer',
    stop: async () => {
      stopped = true;
      await Promise.all(clients);
      return { readOnly, output };
    },
  };
}

async function originLsn(): Promise<bigint> {
  const [r] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'mig'`, [], DB);
  return lsnToBigint(r!.lsn);
}

const log = createLogger('warn', process.stderr as never);
const cutoverOptions = { fence: 'read-only' as const, maxLagBytes: 16 * 1024 * 1024, lagTimeoutMs: 60_000, applyTimeoutMs: 30_000, reverse: false, reverseConfigFile: null };

before(async () => {
  [source, target] = await Promise.all([
    startCluster({ major: 14, name: 'mig-src14', settings: { max_slot_wal_keep_size: '1GB' } }),
    startCluster({ major: 18, name: 'mig-tgt18' }),
  ]);
  await Promise.all([source.createDatabase(DB), target.createDatabase(DB)]);
  await source.query(SCHEMA, [], DB);
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await stopAllClusters();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('a migration from PostgreSQL 14 to 18', () => {
  test('preflight, schema copy, initial copy and streaming under the workload', async () => {
    // Before the schema copy the target lacks the tables, and that is all that is missing.
    const pre = await cli(['preflight', '--json']);
    assert.equal(pre.code, 1, pre.stdout);
    const blockers = (JSON.parse(pre.stdout) as { findings: { severity: string; code: string }[] }).findings.filter((f) => f.severity === 'blocker');
    assert.deepEqual([...new Set(blockers.map((f) => f.code))], ['TARGET_TABLE_MISSING']);
    const copy = await cli(['schema', 'copy']);
    assert.equal(copy.code, 0, copy.stdout);
    const ready = await cli(['preflight', '--json']);
    assert.equal(ready.code, 0, ready.stdout);
    const workload = startWorkload();
    service = spawnPgsub(env());
    children.push(service);
    await service.waitForLog('streaming started', 60_000);
    await waitFor(
      async () =>
        (await target.query<{ ok: boolean }>(`SELECT count(*) = 3 AND bool_and(state = 'r') AS ok FROM pgsub.subscription_rel WHERE subscription = 'mig'`, [], DB))[0]!.ok,
      { timeoutMs: 60_000, intervalMs: 200, what: 'every table ready' },
    ).catch((err: Error) => {
      throw new Error(`${err.message}; pgsub run:\n${service.output().slice(-3000)}`);
    });
    const post = await cli(['schema', 'copy', '--step', 'post-data']);
    assert.equal(post.code, 0, post.stdout);
    assert.match(post.stdout, /1 object\(s\) created/, 'the foreign key');
    // Synced while streaming: the target's sequences are ahead of what the source handed out.
    await waitFor(
      async () => {
        const seqs = (await sequenceStatus(config())) ?? [];
        return seqs.length === 2 && seqs.every((q) => q.synced);
      },
      { timeoutMs: 30_000, intervalMs: 500, what: 'the sequences synced while streaming' },
    );
    const seen = await workload.stop();
    assert.equal(seen.readOnly, 0, seen.output.slice(-2000));
    const [h] = await source.query<{ n: string }>(`SELECT count(*)::text AS n FROM bank.history`, [], DB);
    assert.ok(Number(h!.n) > 0, `${workload.kind} wrote`);
  });

  test('a cutover whose target stops while it waits lifts the fence', async () => {
    await assert.rejects(
      runCutover([config()], { ...cutoverOptions, hooks: { beforeWait: () => target.stopServer('fast') } }, () => {}, log),
      (err: unknown) => err instanceof CutoverError && err.code === 'PGSUB_CUTOVER_FAILED' && /fence lifted on database bank/.test(err.message) && err.exitCode === 1,
    );
    const [setting] = await source.query<{ n: string }>(`SELECT count(*)::text AS n FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1`, [
      DB,
    ]);
    assert.equal(setting!.n, '0', 'the database setting is as it was');
    await source.query(`INSERT INTO bank.history (account_id, branch_id, delta) VALUES (1, 1, 1)`, [], DB);
    await target.startServer();
    const end = await currentWalLsn(source, DB);
    await waitFor(async () => (await originLsn()) >= end, { timeoutMs: 60_000, intervalMs: 200, what: 'the service to catch up after the target restart' });
  });

  test('the fenced cutover under the workload: equal at the fence, sequences ahead, replication back', async () => {
    const workload = startWorkload();
    await new Promise((r) => setTimeout(r, 1500));
    const serviceBefore = service.output().length;
    const reverseFile = path.join(tmp, 'reverse.yaml');
    let movedTo = 0n;
    const report: CutoverReport = await runCutover(
      [config()],
      {
        ...cutoverOptions,
        reverse: true,
        reverseConfigFile: reverseFile,
        hooks: {
          // Fenced, a session that overrides the fence moves a sequence far past the margin.
          beforeSequences: async () => {
            const c = new pg.Client({ connectionString: source.url(DB) });
            await c.connect();
            try {
              await c.query('BEGIN READ WRITE');
              const { rows } = await c.query<{ v: string }>(`SELECT setval('bank.history_id_seq', nextval('bank.history_id_seq') + 5000)::text AS v`);
              await c.query('COMMIT');
              movedTo = BigInt(rows[0]!.v);
            } finally {
              await c.end();
            }
          },
        },
      },
      (line) => console.log(line),
      log,
    );
    console.log(
      `write downtime of the cutover under ${workload.kind}: ${report.write_downtime_ms} ms (fence LSN ${report.fence_lsn}; steps ${report.steps.map((s) => `${s.step} ${s.ms} ms`).join(', ')})`,
    );
    const seen = await workload.stop();
    // The workload's writes after the fence are rejected; so is any new session's.
    assert.match(seen.output, /read-only transaction|terminating connection due to administrator command/, seen.output.slice(-2000));
    await assert.rejects(source.query(`INSERT INTO bank.history (account_id, branch_id, delta) VALUES (1, 1, 1)`, [], DB), (err: { code?: string }) => err.code === '25006');

    // Equal at the fence: the source has not moved since, the target applied up to it.
    assert.ok((await originLsn()) >= lsnToBigint(report.fence_lsn));
    const cmp = await compareTables(source, DB, target, DB, TABLES);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    assert.ok(report.tables.every((t) => t.equal) && report.tables.length === 3);
    // Every sequence ahead of its last used value, the one moved during the fence too.
    for (const [seq, column, table] of [
      ['bank.history_id_seq', 'id', 'bank.history'],
      ['bank.accounts_id_seq', 'id', 'bank.accounts'],
    ] as const) {
      const [s] = await source.query<{ last: string }>(`SELECT last_value::text AS last FROM ${seq}`, [], DB);
      const [t] = await target.query<{ next: string; max: string }>(
        `SELECT (SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM ${seq})::text AS next, (SELECT max(${column}) FROM ${table})::text AS max`,
        [],
        DB,
      );
      assert.ok(BigInt(t!.next) > BigInt(s!.last) && BigInt(t!.next) > BigInt(t!.max), `${seq}: target next ${t!.next}, source last ${s!.last}`);
    }
    assert.ok(movedTo > 0n);
    const history = report.sequences.find((s) => s.sequence === 'bank.history_id_seq')!;
    // Moved at the cutover, unless the service's own periodic sync (it runs while fenced too) got there first.
    assert.ok(history.moved || BigInt(history.target_next_before!) === movedTo + 1n + 1000n, 'moved at the cutover or just before by the service');
    assert.equal(BigInt(history.target_next_after!), movedTo + 1n + 1000n, 'exactly the source plus the margin');

    // The forward service ends on its own, cut over (exit 5, no apply error), its slot dropped on the old primary.
    assert.equal(await withTimeout(service.exited, 30_000, 'the forward service to end'), 5, service.output().slice(-3000));
    const ending = service.output().slice(serviceBefore);
    assert.match(ending, new RegExp(`PGSUB_CUT_OVER: cut over at LSN ${report.fence_lsn}`));
    assert.doesNotMatch(ending, /57P01|apply failed|pgsub enable/);
    // Its JSON lines: the end is one info line saying what happened, and none is an error.
    const endLines = ending
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { level: number; msg: string; code?: string });
    assert.deepEqual(
      endLines.filter((l) => l.level >= 50),
      [],
    );
    assert.deepEqual(
      endLines.filter((l) => l.code === 'PGSUB_CUT_OVER').map((l) => [l.level, l.msg]),
      [[30, `cut over at LSN ${report.fence_lsn}: the target is the primary now; the forward service ends`]],
    );
    assert.deepEqual(report.slots, ['slot mig dropped on the old primary']);
    assert.equal((await source.query(`SELECT slot_name FROM pg_replication_slots WHERE slot_name = 'mig'`, [], DB)).length, 0);
    const status = await cli(['status', '--json']);
    assert.equal((JSON.parse(status.stdout) as { cut_over_lsn: string | null }).cut_over_lsn, report.fence_lsn);
    const enable = await cli(['enable']);
    assert.equal(enable.code, 2, 'enable refuses a cut-over subscription');
    // Replication back: the reverse one carries writes on the new primary.
    const reverse = spawnPgsub({ PATH: process.env.PATH ?? '', PGSUB_STATE_DIR: path.join(tmp, 'reverse'), PGSUB_STATUS_INTERVAL: '1' }, ['run', '-c', reverseFile]);
    children.push(reverse);
    await reverse.waitForLog('streaming started', 60_000);
    const [row] = await target.query<{ id: string }>(`INSERT INTO bank.history (account_id, branch_id, delta) VALUES (7, 2, 42) RETURNING id::text`, [], DB);
    await target.query(`UPDATE bank.accounts SET balance = balance + 42 WHERE id = 7`, [], DB);
    await waitFor(async () => (await source.query(`SELECT 1 FROM bank.history WHERE id = $1 AND delta = 42`, [row!.id], DB)).length === 1, {
      timeoutMs: 30_000,
      intervalMs: 100,
      what: 'the write on the new primary on the old one',
    });
    assert.ok(BigInt(row!.id) > movedTo, 'the new primary hands out ids the old one never used');
    await waitFor(async () => (await compareTables(source, DB, target, DB, TABLES)).equal, { timeoutMs: 30_000, intervalMs: 200, what: 'the old primary equal to the new one' });
    reverse.kill('SIGTERM');
    assert.equal(await withTimeout(reverse.exited, 30_000, 'the reverse service to stop'), 0);
  });
});
