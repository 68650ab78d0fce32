/**
 * `pgsub verify` (issue 21) against real servers, with the service running and pgbench
 * (or an in-process writer) writing to the source all along: equal at one exact LSN for
 * PostgreSQL 18 → 18 and 14 → 18, pgbench_history (no key, insert-only, busy) compared as a
 * multiset; injected differences on the target — a deleted row, an extra row, a changed
 * value, a changed TOAST value, a table dropped and recreated empty, an extra row in a table
 * without a key — each found and listed by key; --repair re-copies them (logged as repairs)
 * and a second verify is equal — public.tagged is replicated through a mapping (retargeted,
 * a column renamed, one excluded) and compared and repaired under the target's names; the hold is tied to the verify session: while a request is
 * armed nothing is applied, and once its session is gone (as after kill -9) the service
 * applies again, and a verify killed with -9 mid-comparison leaves it applying.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { pickPort, spawnPgsub, startCluster, stopAllClusters, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';
import { verifyChannel, verifyLockKey } from '../../src/verify/channel.js';
import { rowText, SESSION_OPTIONS } from '../../src/verify/sql.js';

let pub18: Cluster;
let pub14: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];
const workloads: { stop(): Promise<void> }[] = [];

const EXTRA = `
CREATE TABLE public.items (id bigint PRIMARY KEY, label text, price numeric(12,4), ratio float8, meta json, body text);
CREATE TABLE public.static (id int PRIMARY KEY, v text);
CREATE TABLE public.nokey (a int, b text);
CREATE TABLE public.tagged (code text PRIMARY KEY, n int, secret text);`;
const FILL = `
INSERT INTO public.items SELECT g, 'item ' || g, g / 7.0, g / 3.0, '{"a": 1,  "b": [1, 2]}', CASE WHEN g % 50 = 0 THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 200) i) ELSE 'short' END FROM generate_series(1, 3000) g;
INSERT INTO public.static SELECT g, 'static ' || g FROM generate_series(1, 400) g;
INSERT INTO public.nokey SELECT g % 10, 'dup' FROM generate_series(1, 300) g;
INSERT INTO public.tagged SELECT 'k' || g, g, 's' FROM generate_series(1, 1500) g;`;
/** The target of public.tagged under MAPPING: another name, a renamed column, the excluded one absent. */
const TARGET_EXTRA = EXTRA.replace(
  'CREATE TABLE public.tagged (code text PRIMARY KEY, n int, secret text);',
  "CREATE TABLE public.tagged_m (code text PRIMARY KEY, qty int, local text DEFAULT 't');",
);
const MAPPING = JSON.stringify({ tables: { 'public.tagged': { target: 'public.tagged_m', columns: { n: 'qty' }, exclude: ['secret'] } } });
const TABLES = 'pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history, public.items, public.static, public.nokey, public.tagged';

function pgbenchBin(): string | null {
  for (const dir of ['/usr/lib/postgresql'].filter(fs.existsSync)) {
    for (const v of fs.readdirSync(dir).sort().reverse()) {
      const p = path.join(dir, v, 'bin', 'pgbench');
      if (fs.existsSync(p)) return p;
    }
  }
  return null;
}

async function run(bin: string, args: string[]): Promise<void> {
  const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: process.env.PATH ?? '' } });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c));
  child.stderr!.on('data', (c: Buffer) => (out += c));
  const code = await new Promise<number | null>((r) => child.on('exit', r));
  assert.equal(code, 0, `${bin} ${args.join(' ')}: ${out}`);
}

const conn = (c: Cluster, db: string) => ['-h', c.host, '-p', String(c.port), '-U', 'postgres', db];

/** pgbench's tpcb-like transactions at a modest rate (or an in-process writer doing the same). */
function startWorkload(c: Cluster, db: string): { stop(): Promise<void> } {
  const bin = pgbenchBin();
  if (bin) {
    const child: ChildProcess = spawn(bin, ['-n', '-c', '2', '-j', '1', '-R', '150', '-T', '600', ...conn(c, db)], { stdio: 'ignore', env: { PATH: process.env.PATH ?? '' } });
    const exited = new Promise<void>((r) => child.on('exit', () => r()));
    const w = {
      stop: async () => {
        child.kill('SIGINT');
        await exited;
      },
    };
    workloads.push(w);
    return w;
  }
  let stopped = false;
  const loop = (async () => {
    const client = new pg.Client({ connectionString: c.url(db) });
    await client.connect();
    while (!stopped) {
      const aid = 1 + Math.floor(Math.random() * 100000);
      await client.query('BEGIN');
      await client.query('UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = $1', [aid]);
      await client.query('INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, $1, 1, now())', [aid]);
      await client.query('COMMIT');
      await new Promise((r) => setTimeout(r, 5));
    }
    await client.end();
  })();
  const w = {
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
  workloads.push(w);
  return w;
}

const env = (publisher: Cluster, sub: string) => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url(sub),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: sub,
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
  PGSUB_GROUP_TRANSACTIONS: '20',
  PGSUB_MAPPING: MAPPING,
});

interface VerifyJson {
  lsn: string;
  equal: boolean;
  differences: number;
  pauseMs: number;
  handshakeSteps: { slotMs: number };
  tables: {
    table: string;
    status: string;
    keyed: boolean;
    sourceRows: number;
    missing: number;
    extra: number;
    different: number;
    listed: { kind: string; key: Record<string, string> }[];
  }[];
  repair: { complete: boolean; tables: { table: string; keys: number }[]; skipped: unknown[] } | null;
}

async function verify(publisher: Cluster, sub: string, args: string[] = []): Promise<{ code: number | string; result: VerifyJson | null; output: string }> {
  const p = spawnPgsub({ ...env(publisher, sub), PGSUB_LOG_LEVEL: 'warn' }, ['verify', '--json', ...args]);
  let stdout = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  const code = await withTimeout(p.exited, 120_000, `pgsub verify ${args.join(' ')}`);
  let result: VerifyJson | null = null;
  try {
    result = JSON.parse(stdout) as VerifyJson;
  } catch {
    // no result: the code and output say why
  }
  return { code, result, output: p.output() };
}

const pauses: string[] = [];

let metricsPort = 0;

async function setUp(publisher: Cluster, sub: string): Promise<PgsubProcess> {
  const bin = pgbenchBin();
  await target.createDatabase(sub);
  if (bin) {
    await run(bin, ['-i', '-q', '-s', '1', '-I', 'dtgp', ...conn(publisher, 'src')]);
    await run(bin, ['-i', '-q', '-I', 'dtp', ...conn(target, sub)]);
  } else {
    const ddl = `CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84));
      CREATE TABLE pgbench_branches (bid int PRIMARY KEY, bbalance int, filler char(88));
      CREATE TABLE pgbench_tellers (tid int PRIMARY KEY, bid int, tbalance int, filler char(84));
      CREATE TABLE pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22));`;
    await publisher.query(
      `${ddl} INSERT INTO pgbench_accounts SELECT g, 1, 0, '' FROM generate_series(1, 100000) g; INSERT INTO pgbench_branches VALUES (1, 0, ''); INSERT INTO pgbench_tellers SELECT g, 1, 0, '' FROM generate_series(1, 10) g;`,
      [],
      'src',
    );
    await target.query(ddl, [], sub);
  }
  await publisher.query(`${EXTRA} ${FILL} CREATE PUBLICATION pub FOR TABLE ${TABLES};`, [], 'src');
  await target.query(TARGET_EXTRA, [], sub);
  const service = spawnPgsub({ ...env(publisher, sub), ...(sub === 'v18' ? { PGSUB_METRICS_LISTEN: `127.0.0.1:${metricsPort}` } : {}) });
  children.push(service);
  await service.waitForLog('streaming started', 120_000);
  await waitFor(async () => (await target.query(`SELECT count(*) = 8 AND bool_and(state = 'r') AS ok FROM pgsub.subscription_rel WHERE subscription = $1`, [sub], sub))[0].ok, {
    timeoutMs: 120_000,
    intervalMs: 200,
    what: 'every table ready',
  });
  return service;
}

before(async () => {
  [pub18, pub14, target] = await Promise.all([
    startCluster({ major: 18, name: 'ver-pub18' }),
    startCluster({ major: 14, name: 'ver-pub14' }),
    startCluster({ major: 18, name: 'ver-tgt' }),
  ]);
  await Promise.all([pub18.createDatabase('src'), pub14.createDatabase('src')]);
  metricsPort = await pickPort();
});

after(async () => {
  for (const w of workloads) await w.stop().catch(() => {});
  for (const c of children) c.kill('SIGKILL');
  await stopAllClusters();
  if (pauses.length > 0) process.stderr.write(`verify: apply pauses observed by the service (ms): ${pauses.join(', ')}\n`);
});

const historyCount = async (sub: string) => Number((await target.query(`SELECT count(*) AS n FROM pgbench_history`, [], sub))[0].n);

describe('pgsub verify', () => {
  let service18: PgsubProcess;

  test('the normalised row text agrees across PostgreSQL 14 and 18 and across text forms of one value', async () => {
    const columns = ['float8', 'float4', 'numeric', 'json', 'timestamptz', 'bytea', 'money'].map((base, i) => ({ name: `c${i}`, base }));
    const hashOf = async (c: Cluster, values: string[], timezone: string) => {
      const client = new pg.Client({ connectionString: c.url('src'), options: SESSION_OPTIONS.replace('timezone=UTC', `timezone=${timezone}`) });
      await client.connect();
      try {
        const casts = ['float8', 'float4', 'numeric', 'json', 'timestamptz', 'bytea', 'money'];
        const select = values.map((v, i) => `${v}::${casts[i]} AS c${i}`).join(', ');
        // The session's own zone never matters: normalisation reads timestamptz at UTC.
        const rows = await client.query(`SET lc_monetary = 'C'; SELECT md5(${rowText(columns)}) AS h FROM (SELECT ${select}) AS v`);
        return (rows as unknown as { rows: { h: string }[] }[])[1]!.rows[0]!.h;
      } finally {
        await client.end();
      }
    };
    const a = ["'0.1'", "'-0'", "'1.50'", `'{"a": 1, "b": [1,2]}'`, "'2024-01-02 03:04:05.5+00'", "'\\x00ff'", "'12.30'"];
    const b = ["'1e-1'", "'0'", "'1.5'", `'{"b":[1, 2],"a":1}'`, "'2024-01-02 05:04:05.5+02'", "'\\x00FF'", "'12.3'"];
    const h14 = await hashOf(pub14, a, 'UTC');
    assert.equal(await hashOf(pub18, a, 'Asia/Tokyo'), h14);
    assert.equal(await hashOf(pub18, b, 'UTC'), h14);
    assert.notEqual(await hashOf(pub18, [...b.slice(0, 2), "'1.51'", ...b.slice(3)], 'UTC'), h14);
  });

  test('equal under a running pgbench workload: PostgreSQL 18 → 18 and 14 → 18', { timeout: 400_000 }, async () => {
    const [s18, s14] = await Promise.all([setUp(pub18, 'v18'), setUp(pub14, 'v14')]);
    service18 = s18;
    startWorkload(pub18, 'src');
    startWorkload(pub14, 'src');
    for (const [publisher, sub, service] of [
      [pub18, 'v18', s18],
      [pub14, 'v14', s14],
    ] as const) {
      // Rows arriving while the verify runs: the comparison is at an LSN, not on a quiet pair.
      await waitFor(async () => (await historyCount(sub)) > 20, { timeoutMs: 60_000, intervalMs: 200, what: `${sub}: the workload arriving` });
      const before = await historyCount(sub);
      const v = await verify(publisher, sub, ['--parallel', '2']);
      assert.equal(v.code, 0, v.output);
      assert.ok(v.result?.equal, v.output);
      const history = v.result.tables.find((t) => t.table === 'public.pgbench_history')!;
      assert.equal(history.keyed, false);
      assert.equal(history.status, 'equal');
      assert.ok(v.result.tables.find((t) => t.table === 'public.pgbench_accounts')!.sourceRows === 100000);
      assert.equal(typeof v.result.pauseMs, 'number');
      pauses.push(`${sub} ${v.result.pauseMs} (slot ${v.result.handshakeSteps.slotMs})`);
      // The service logged the same pause, and went on applying.
      const logged = await service.waitForLog('verify: target snapshot taken; apply resumed');
      assert.equal(typeof logged.pauseMs, 'number');
      await waitFor(async () => (await historyCount(sub)) > before + 20, { timeoutMs: 30_000, intervalMs: 200, what: `${sub}: rows after the verify` });
      // pgsub status and the metrics show it.
      const st = spawnPgsub(env(publisher, sub), ['status', '--json']);
      let out = '';
      st.child.stdout!.on('data', (c: Buffer) => (out += c));
      await st.exited;
      const status = JSON.parse(out) as Record<string, unknown>;
      assert.equal(status.last_verify_result, 'equal');
      assert.equal(status.last_verify_lsn, v.result.lsn);
      if (sub === 'v18') {
        await waitFor(async () => /\npgsub_verify_last_equal 1\n/.test(await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text()), {
          timeoutMs: 10_000,
          what: 'verify metrics',
        });
      }
    }
  });

  test('injected differences are listed by key, --repair fixes them', { timeout: 300_000 }, async () => {
    const db = 'v18';
    const longValue = (await pub18.query(`SELECT string_agg(md5(i::text || 'x'), '') AS v FROM generate_series(1, 300) i`, [], 'src'))[0].v as string;
    await target.query(
      `DELETE FROM public.items WHERE id = 17;
       INSERT INTO public.items (id, label) VALUES (99999, 'extra');
       UPDATE public.items SET price = price + 1 WHERE id = 23;
       UPDATE public.items SET body = '${longValue}' WHERE id = 100;
       UPDATE public.tagged_m SET qty = -1 WHERE code = 'k777';
       DROP TABLE public.static; CREATE TABLE public.static (id int PRIMARY KEY, v text);
       INSERT INTO public.nokey VALUES (1, 'not on the source');`,
      [],
      db,
    );
    const v = await verify(pub18, db, ['--list', '5']);
    assert.equal(v.code, 1, v.output);
    const byTable = new Map(v.result!.tables.map((t) => [t.table, t]));
    const items = byTable.get('public.items')!;
    assert.deepEqual(
      items.listed.map((d) => `${d.kind} ${d.key.id}`).sort(),
      ['different 100', 'different 23', 'extra 99999', 'missing 17'],
      JSON.stringify(v.result!.tables, null, 1),
    );
    assert.deepEqual(items.listed.map((d) => `${d.kind} ${d.key.id}`).sort(), ['different 100', 'different 23', 'extra 99999', 'missing 17']);
    assert.deepEqual(byTable.get('public.tagged')!.listed, [{ kind: 'different', key: { code: 'k777' } }]);
    const st = byTable.get('public.static')!;
    assert.equal(st.missing, 400);
    assert.equal(st.listed.length, 5);
    const nokey = byTable.get('public.nokey')!;
    assert.equal(nokey.status, 'different');
    assert.equal(nokey.extra, 1);
    for (const t of ['public.pgbench_accounts', 'public.pgbench_history']) assert.equal(byTable.get(t)!.status, 'equal', t);
    assert.equal(v.result!.differences, 4 + 1 + 400 + 1);

    // No key: not repairable; removed by hand. The rest by --repair.
    await target.query(`DELETE FROM public.nokey WHERE b = 'not on the source'`, [], db);
    const r = await verify(pub18, db, ['--repair']);
    assert.equal(r.code, 1, r.output);
    assert.equal(r.result!.repair?.complete, true, r.output);
    assert.deepEqual(r.result!.repair!.tables.map((t) => `${t.table} ${t.keys}`).sort(), ['public.items 4', 'public.static 400', 'public.tagged 1']);
    const logged = await target.query(`SELECT count(*)::int AS n FROM pgsub.conflict_log WHERE conflict_type = 'verify_repair' AND policy = 'repair'`, [], db);
    assert.equal(logged[0].n, 405);
    // The mapped table was repaired under its target's names; the column only the target has kept its default.
    assert.deepEqual(await target.query(`SELECT qty, local FROM public.tagged_m WHERE code = 'k777'`, [], db), [{ qty: 777, local: 't' }]);
    const again = await verify(pub18, db);
    assert.equal(again.code, 0, again.output);
    assert.ok(again.result!.equal);
    pauses.push(`v18 after repair ${again.result!.pauseMs} (slot ${again.result!.handshakeSteps.slotMs})`);
  });

  test('the hold is tied to the verify session; a verify killed with -9 leaves the service applying', { timeout: 200_000 }, async () => {
    const db = 'v18';
    // A request as verify makes it, from a session that then dies.
    const holder = new pg.Client({ connectionString: target.url(db) });
    holder.on('error', () => {});
    await holder.connect();
    const [classId, objId] = verifyLockKey(db);
    await holder.query('SELECT pg_advisory_lock($1, $2)', [classId, objId]);
    await holder.query(
      `UPDATE pgsub.verify SET request_id = 'test-request', mode = 'snapshot', state = 'requested', holder_pid = pg_backend_pid(), hold_timeout_ms = 120000 WHERE subscription = $1`,
      [db],
    );
    await holder.query('SELECT pg_notify($1, $2)', [verifyChannel(db), 'requested']);
    await waitFor(async () => (await target.query(`SELECT state FROM pgsub.verify WHERE subscription = $1`, [db], db))[0].state === 'armed', { timeoutMs: 10_000, what: 'armed' });
    // Armed without a bound: nothing is applied.
    const held = await historyCount(db);
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(await historyCount(db), held, 'applied while held');
    holder.connection.stream.destroy();
    await waitFor(async () => (await historyCount(db)) > held + 10, { timeoutMs: 10_000, intervalMs: 100, what: 'rows after the holder died' });
    assert.equal((await target.query(`SELECT state FROM pgsub.verify WHERE subscription = $1`, [db], db))[0].state, 'abandoned');
    await service18.waitForLog('verify request abandoned; apply goes on');

    // A real verify, slowed down, killed after it has its snapshots.
    const p = spawnPgsub({ ...env(pub18, db), PGSUB_LOG_LEVEL: 'info' }, ['verify', '--rate-limit', '2000rows', '--parallel', '1']);
    await p.waitForLog('verify: snapshots taken at the same LSN', 60_000);
    p.kill('SIGKILL');
    await p.exited;
    const after = await historyCount(db);
    await waitFor(async () => (await historyCount(db)) > after + 10, { timeoutMs: 10_000, intervalMs: 100, what: 'rows after verify was killed' });
    // Its exporting transaction on the target is ended too.
    await waitFor(
      async () =>
        (await target.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%verify_snapshot' AND state = 'idle in transaction'`, [], db))[0].n === 0,
      {
        timeoutMs: 10_000,
        what: 'the exported snapshot released',
      },
    );
    await waitForCatchUp(pub18, 'src', db);

    // A quiet source: no commit comes past L, the service asks the publisher for a position.
    await workloads[1]!.stop();
    await waitForCatchUp(pub14, 'src', 'v14');
    const quiet = await verify(pub14, 'v14');
    assert.equal(quiet.code, 0, quiet.output);
    pauses.push(`v14 quiet source ${quiet.result!.pauseMs} (slot ${quiet.result!.handshakeSteps.slotMs})`);

    // No service for the subscription: exit 2, saying what to do.
    const p2 = spawnPgsub({ ...env(pub18, db), PGSUB_SUBSCRIPTION: 'nosuch' }, ['verify']);
    assert.equal(await withTimeout(p2.exited, 60_000, 'verify without a service'), 2);
    assert.match(p2.output(), /PGSUB_VERIFY_REFUSED: no pgsub service is running for subscription "nosuch": start it/);
  });
});
