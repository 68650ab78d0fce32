/**
 * Failures an operator must fix stop pgsub at startup with exit 2 and one stderr line that
 * names the side and the fix, within seconds, never retried forever and never labelled a
 * lost connection: a wrong password (28P01) and a pg_hba.conf refusal (28000) on either
 * side; a source role without REPLICATION, a target role without CREATE on the database,
 * without SET of session_replication_role, or without privileges on the replicated tables
 * (the privilege check before the first session, migrate/privileges.ts: the server, the
 * role, what it lacks, and the GRANTs — which, run as printed, make it start); a missing
 * publication, a second pgsub for the same subscription (named by pid and host), a slot
 * streaming to someone else. The full table of privileges per command is
 * least-privilege.test.ts's.
 * The same refusals during a run (a rotated password, a pg_hba.conf edit) are retried,
 * logged at error level each attempt and counted, and pgsub resumes once they are undone.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { parseConninfo } from '../../src/config/conninfo.js';
import { createLogger } from '../../src/log.js';
import { ReplicationConnection } from '../../src/protocol/replication.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { compareTables, currentWalLsn, pickPort, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const PW = 'right-Pw-1';
const SCHEMA = 'CREATE SCHEMA app; CREATE TABLE app.items (id int PRIMARY KEY, v text NOT NULL);';
const TARGET_DBS = ['app', 'd_nocreate', 'd_noset', 'd_notable'];

let publisher: Cluster;
let target: Cluster;
const hbaOriginal = new Map<Cluster, string>();
const children = new Set<PgsubProcess>();

/** pg_hba.conf = these lines, then the harness's (trust for everyone else); reloaded. */
async function setHba(cluster: Cluster, lines: string[]): Promise<void> {
  const file = path.join(cluster.dataDir, 'pg_hba.conf');
  if (!hbaOriginal.has(cluster)) hbaOriginal.set(cluster, fs.readFileSync(file, 'utf8'));
  fs.writeFileSync(file, `${lines.join('\n')}\n${hbaOriginal.get(cluster)}`);
  await cluster.query('SELECT pg_reload_conf()');
  // The postmaster reloads on SIGHUP, a moment later.
  await new Promise((r) => setTimeout(r, 300));
}

function url(cluster: Cluster, user: string, db: string, password?: string): string {
  return `postgresql://${user}${password ? `:${encodeURIComponent(password)}` : ''}@${cluster.host}:${cluster.port}/${db}`;
}

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'refuse-pub' }), startCluster({ major: 18, name: 'refuse-tgt' })]);
  await publisher.createDatabase('app');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE app.items;`, [], 'app');
  await publisher.query(`
    CREATE ROLE pw_src LOGIN REPLICATION PASSWORD '${PW}';
    CREATE ROLE hba_src LOGIN REPLICATION;
    CREATE ROLE norepl LOGIN;`);
  for (const db of TARGET_DBS) {
    await target.createDatabase(db);
    await target.query(SCHEMA, [], db);
  }
  const origins = `GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text), pg_replication_origin_oid(text), pg_replication_origin_session_setup(text), pg_replication_origin_xact_setup(pg_lsn, timestamptz)`;
  await target.query(`
    CREATE ROLE pw_tgt LOGIN SUPERUSER PASSWORD '${PW}';
    CREATE ROLE hba_tgt LOGIN SUPERUSER;
    CREATE ROLE rot_tgt LOGIN SUPERUSER;
    CREATE ROLE nocreate LOGIN;
    GRANT SET ON PARAMETER session_replication_role TO nocreate;
    CREATE ROLE noset LOGIN;
    GRANT CREATE ON DATABASE d_noset TO noset;
    CREATE ROLE notable LOGIN;
    GRANT CREATE ON DATABASE d_notable TO notable;
    GRANT SET ON PARAMETER session_replication_role TO notable;`);
  // Function privileges are per database.
  await target.query(`${origins} TO notable`, [], 'd_notable');
  await setHba(publisher, ['host all pw_src 127.0.0.1/32 scram-sha-256', 'host all hba_src 127.0.0.1/32 reject']);
  await setHba(target, ['host all pw_tgt 127.0.0.1/32 scram-sha-256', 'host all hba_tgt 127.0.0.1/32 reject']);
});

after(async () => {
  for (const p of children) p.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function env(subscription: string, source: string, targetUrl: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    PGSUB_SOURCE: source,
    PGSUB_TARGET: targetUrl,
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: subscription,
    PGSUB_COPY_DATA: 'false',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
    ...extra,
  };
}

function spawn(e: Record<string, string>): PgsubProcess & { stderr(): string } {
  const p = spawnPgsub(e);
  children.add(p);
  let err = '';
  p.child.stderr!.on('data', (c: Buffer) => (err += c.toString('utf8')));
  void p.exited.then(() => children.delete(p));
  return Object.assign(p, { stderr: () => err });
}

/**
 * Runs pgsub and expects it to stop with exit 2 within seconds, with this code and message on
 * stderr, and the refusal logged once as a JSON line naming the error's class, code and stack.
 */
async function expectExit2(e: Record<string, string>, code: string, message: RegExp, check?: (p: PgsubProcess) => void): Promise<string> {
  const p = spawn(e);
  const startedAt = Date.now();
  const exit = await withTimeout(p.exited, 20_000, `pgsub to exit (${code}); output:\n${p.output().slice(-3000)}`).catch((err: Error) => {
    p.kill('SIGKILL');
    throw err;
  });
  const line =
    p
      .stderr()
      .split('\n')
      .find((l) => l.startsWith('pgsub: ')) ?? '';
  assert.equal(exit, 2, p.output().slice(-3000));
  assert.ok(line.startsWith(`pgsub: ${code}: `), `stderr line: ${line}\n${p.output().slice(-2000)}`);
  assert.match(line, message);
  assert.doesNotMatch(p.output(), /PGSUB_CONNECTION_LOST/, 'reported as a lost connection');
  assert.doesNotMatch(p.output(), /streaming started/);
  assert.ok(!p.output().includes(PW), 'a password in the output');
  const logged = p
    .output()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { level: number; msg: string; err?: { type?: string; code?: string; message?: string; stack?: string } })
    .filter((l) => l.level >= 50);
  assert.equal(logged.length, 1, JSON.stringify(logged));
  const [fatal] = logged;
  assert.match(fatal!.msg, /^(cannot start: fix this and start pgsub again|apply stopped by a non-retryable error)$/);
  assert.equal(fatal!.err?.code, code);
  assert.match(fatal!.err?.type ?? '', /^[A-Z]\w+Error$/, JSON.stringify(fatal));
  assert.ok(fatal!.err?.stack?.startsWith(`${fatal!.err.type}: ${fatal!.err.message}\n`), JSON.stringify(fatal));
  assert.match(fatal!.err.stack ?? '', /\n +at .*src\/|\n +at .*bundle/, 'the stack names where it was thrown');
  check?.(p);
  console.log(`${code} after ${Date.now() - startedAt} ms: ${line}`);
  return line;
}

const superSource = () => publisher.url('app');
const superTarget = () => target.url('app');

describe('refused at startup: exit 2 naming the side and the fix', () => {
  test('source: wrong password (28P01)', async () => {
    await expectExit2(
      env('r_src_pw', url(publisher, 'pw_src', 'app', 'wrong'), superTarget()),
      'PGSUB_AUTH_FAILED',
      /^pgsub: \S+: source: password authentication failed .*fix the password of user "pw_src" in the source conninfo/,
    );
  });

  test('source: refused by pg_hba.conf (28000)', async () => {
    await expectExit2(
      env('r_src_hba', url(publisher, 'hba_src', 'app'), superTarget()),
      'PGSUB_AUTH_FAILED',
      /source: the publisher refused the connection .*pg_hba\.conf.*add a line to the publisher's pg_hba\.conf that lets user "hba_src" connect to database "app"/,
    );
  });

  test('target: wrong password (28P01)', async () => {
    await expectExit2(
      env('r_tgt_pw', superSource(), url(target, 'pw_tgt', 'app', 'wrong')),
      'PGSUB_AUTH_FAILED',
      /target: password authentication failed .*user "pw_tgt" in the target conninfo/,
    );
  });

  test('target: refused by pg_hba.conf (28000)', async () => {
    await expectExit2(env('r_tgt_hba', superSource(), url(target, 'hba_tgt', 'app')), 'PGSUB_AUTH_FAILED', /target: the target server refused the connection .*pg_hba\.conf/);
  });

  test('source: a role without REPLICATION', async () => {
    await expectExit2(
      env('r_norepl', url(publisher, 'norepl', 'app'), superTarget()),
      'PGSUB_PRIVILEGE_MISSING',
      /^pgsub: \S+: pgsub run cannot run as these roles: source 127\.0\.0\.1:\d+ \(PostgreSQL 18\.\d+\): role "norepl" lacks the REPLICATION attribute \(.*\)\. Run on the source: ALTER ROLE norepl REPLICATION;$/,
    );
  });

  test('target: a role without CREATE on the database', async () => {
    await expectExit2(
      env('r_nocreate', superSource(), url(target, 'nocreate', 'd_nocreate')),
      'PGSUB_PRIVILEGE_MISSING',
      /target 127\.0\.0\.1:\d+ \(PostgreSQL 18\.\d+\): role "nocreate" lacks CREATE on database d_nocreate \(pgsub's progress.*Run on the target: GRANT CREATE ON DATABASE d_nocreate TO nocreate;/,
    );
  });

  test('target: a role that may not set session_replication_role', async () => {
    await expectExit2(
      env('r_noset', superSource(), url(target, 'noset', 'd_noset')),
      'PGSUB_PRIVILEGE_MISSING',
      /target 127\.0\.0\.1:\d+ \(PostgreSQL 18\.\d+\): role "noset" lacks SET on parameter session_replication_role.*Run on the target: GRANT SET ON PARAMETER session_replication_role TO noset;/,
    );
  });

  test('target: a role without privileges on the replicated tables; the GRANTs it prints make it run', async () => {
    const e = env('r_notable', superSource(), url(target, 'notable', 'd_notable'));
    const line = await expectExit2(
      e,
      'PGSUB_PRIVILEGE_MISSING',
      /target 127\.0\.0\.1:\d+ \(PostgreSQL 18\.\d+\): role "notable" lacks USAGE on schema app, SELECT, INSERT, UPDATE, DELETE, TRUNCATE on table app\.items \(pgsub applies changes to them\)/,
    );
    const grants = line.slice(line.indexOf('Run on the target: ') + 'Run on the target: '.length);
    assert.match(grants, /^GRANT USAGE ON SCHEMA app TO notable; GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON app\.items TO notable;$/);
    await target.query(grants, [], 'd_notable');
    const p = spawn(e);
    await p.waitForLog('streaming started', 30_000);
    await publisher.query(`INSERT INTO app.items VALUES (1, 'granted')`, [], 'app');
    await waitFor(async () => (await target.query(`SELECT 1 FROM app.items WHERE id = 1`, [], 'd_notable')).length === 1, {
      timeoutMs: 30_000,
      what: 'the row applied by notable',
    });
    await publisher.query(`UPDATE app.items SET v = 'updated' WHERE id = 1`, [], 'app');
    const end = await currentWalLsn(publisher, 'app');
    await waitFor(async () => ((await slotConfirmedLsn(publisher, 'r_notable')) ?? 0n) >= end, { timeoutMs: 30_000, what: 'catch-up' });
    const cmp = await compareTables(publisher, 'app', target, 'd_notable', ['app.items']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    p.kill('SIGTERM');
    assert.equal(await withTimeout(p.exited, 20_000, 'pgsub to stop'), 0);
  });

  test('publication missing', async () => {
    await expectExit2({ ...env('r_nopub', superSource(), superTarget()), PGSUB_PUBLICATION: 'no_such_pub' }, 'PGSUB_SOURCE_SETUP', /publication "no_such_pub" not found/);
  });

  test('a second pgsub for a running subscription is named by pid and host, before it binds the metrics port', async () => {
    // The same configuration twice, metrics_listen included: the run lock answers first.
    const port = await pickPort();
    const e = env('r_twice', superSource(), superTarget(), { PGSUB_METRICS_LISTEN: `127.0.0.1:${port}` });
    const first = spawn(e);
    await first.waitForLog('streaming started', 30_000);
    await first.waitForLog('metrics endpoint listening', 30_000);
    const scrape = async () => {
      const res = await fetch(`http://127.0.0.1:${port}/metrics`);
      return { status: res.status, body: await res.text() };
    };
    assert.equal((await scrape()).status, 200);
    await expectExit2(
      e,
      'PGSUB_ALREADY_RUNNING',
      new RegExp(
        `subscription r_twice is already running under pgsub pid ${first.child.pid} on host ${os.hostname().replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(target backend pid \\d+\\): stop that process first`,
      ),
      (second) => {
        assert.doesNotMatch(second.output(), /EADDRINUSE|metrics_listen/, 'the port, not the running pgsub, reported');
        assert.doesNotMatch(second.output(), /metrics endpoint listening/);
      },
    );
    // The first one did not notice, and still serves its metrics.
    assert.equal(first.child.exitCode, null);
    const after = await scrape();
    assert.equal(after.status, 200);
    assert.match(after.body, /^pgsub_info\{/m);
    first.kill('SIGTERM');
    assert.equal(await withTimeout(first.exited, 20_000, 'the first pgsub to stop'), 0);
  });

  test('a slot streaming to another client', async () => {
    await publisher.query(`SELECT pg_create_logical_replication_slot('r_taken', 'pgoutput')`, [], 'app');
    const intruder = await ReplicationConnection.open(parseConninfo(publisher.url('app'), 'source', {}), 'intruder');
    const [slot] = await publisher.query<{ lsn: string }>(`SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = 'r_taken'`);
    const [hi, lo] = slot!.lsn.split('/');
    const stream = intruder.startReplication({ slotName: 'r_taken', startLsn: (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`), protoVersion: 4, publications: ['pub'] } as never);
    try {
      await waitFor(async () => (await publisher.query(`SELECT 1 FROM pg_replication_slots WHERE slot_name = 'r_taken' AND active`)).length === 1, {
        what: 'the intruder to hold the slot',
      });
      await expectExit2(
        env('r_taken', superSource(), superTarget()),
        'PGSUB_SLOT_IN_USE',
        /source: replication slot "r_taken" is in use by another client \(walsender pid \d+, application_name "intruder"/,
      );
    } finally {
      stream.destroy();
      await intruder.close();
    }
  });
});

describe('the same refusals during a run: retried, logged, counted, then resumed', () => {
  let runner: Runner | null = null;
  after(async () => {
    runner?.stop();
    await runner?.done.catch(() => undefined);
  });

  test('source password rotated, target pg_hba.conf edited: pgsub waits and resumes once undone', async () => {
    const logs: { level: number; msg: string; err?: { code?: string; message?: string } }[] = [];
    // copy_data is off: the target starts with what the source has now (rows of the tests above).
    const rows = await publisher.query<{ id: number; v: string }>('SELECT id, v FROM app.items', [], 'app');
    await target.query(
      `TRUNCATE app.items; INSERT INTO app.items SELECT * FROM json_populate_recordset(NULL::app.items, '${JSON.stringify(rows).replace(/'/g, "''")}')`,
      [],
      'app',
    );
    const config = loadConfig({
      env: {},
      overrides: {
        subscription: 'r_run',
        source: url(publisher, 'pw_src', 'app', PW),
        target: url(target, 'rot_tgt', 'app'),
        publication: 'pub',
        copy_data: false,
        retry_min_delay: 0.2,
        retry_max_delay: 0.5,
      },
    });
    runner = startRunner(config, createLogger('info', { write: (line: string) => void logs.push(JSON.parse(line) as (typeof logs)[number]) }));
    let settled = false;
    void runner.done.then(
      () => (settled = true),
      () => (settled = true),
    );
    await waitFor(() => logs.some((l) => l.msg === 'streaming started'), { timeoutMs: 30_000, what: 'streaming' });
    const authErrors = () => logs.filter((l) => l.level === 50 && l.err?.code === 'PGSUB_AUTH_FAILED');
    let id = 100;
    const writeAndWait = async () => {
      const row = id++;
      await publisher.query(`INSERT INTO app.items VALUES ($1, 'run')`, [row], 'app');
      await waitFor(async () => (await target.query(`SELECT 1 FROM app.items WHERE id = $1`, [row], 'app')).length === 1, { timeoutMs: 30_000, what: `row ${row} applied` });
    };
    await writeAndWait();

    // The source password is rotated and the walsender ends: every reconnect is refused.
    await publisher.query(`ALTER ROLE pw_src PASSWORD 'rotated-Pw-2'`);
    await publisher.query(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'r_run' AND active_pid IS NOT NULL`);
    await publisher.query(`INSERT INTO app.items VALUES (1000, 'while refused')`, [], 'app');
    await waitFor(() => authErrors().length >= 3, { timeoutMs: 20_000, what: 'three refused attempts logged at error level' });
    assert.match(authErrors()[0]!.err!.message!, /^source: password authentication failed/);
    assert.ok((runner.failures.PGSUB_AUTH_FAILED ?? 0) >= 3, JSON.stringify(runner.failures));
    assert.equal(settled, false, 'pgsub stopped on a refusal during a run');
    await publisher.query(`ALTER ROLE pw_src PASSWORD '${PW}'`);
    await writeAndWait();

    // The target's pg_hba.conf now rejects pgsub's role, and its sessions end.
    const before = authErrors().length;
    await setHba(target, ['host all pw_tgt 127.0.0.1/32 scram-sha-256', 'host all hba_tgt 127.0.0.1/32 reject', 'host all rot_tgt 127.0.0.1/32 reject']);
    await target.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'rot_tgt'`);
    await publisher.query(`INSERT INTO app.items VALUES (1001, 'while rejected')`, [], 'app');
    await waitFor(() => authErrors().length >= before + 3, { timeoutMs: 20_000, what: 'three rejected attempts logged at error level' });
    assert.match(authErrors().at(-1)!.err!.message!, /^target: the target server refused the connection/);
    assert.equal(settled, false);
    await setHba(target, ['host all pw_tgt 127.0.0.1/32 scram-sha-256', 'host all hba_tgt 127.0.0.1/32 reject']);
    await writeAndWait();

    const end = await currentWalLsn(publisher, 'app');
    await waitFor(async () => ((await slotConfirmedLsn(publisher, 'r_run')) ?? 0n) >= end, { timeoutMs: 30_000, what: 'catch-up' });
    const cmp = await compareTables(publisher, 'app', target, 'app', ['app.items']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    assert.ok(!logs.some((l) => l.level >= 60), 'a fatal log line');
    runner.stop();
    await runner.done;
    runner = null;
  });
});

describe('a target without a free replication origin state', () => {
  test('exit 2 at startup naming max_active_replication_origins, not a retry loop', async () => {
    // One origin state, held by another origin's progress (as a dropped-without-cleanup subscription leaves it).
    const full = await startCluster({ major: 18, name: 'refuse-origins', settings: { max_active_replication_origins: '1' } });
    try {
      await full.createDatabase('app');
      await full.query(SCHEMA, [], 'app');
      await full.query(`SELECT pg_replication_origin_create('someone_else'); SELECT pg_replication_origin_advance('someone_else', '0/1')`, [], 'app');
      await expectExit2(
        env('r_origins', superSource(), full.url('app')),
        'PGSUB_ORIGIN_LIMIT',
        /no free replication origin state for origin "pgsub_r_origins".*max_active_replication_origins/,
      );
    } finally {
      await full.stop();
    }
  });
});
