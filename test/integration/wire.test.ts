/**
 * WireConnection against a real PostgreSQL 18: pipelined extended-query protocol with
 * binary parameters, error/abort semantics up to Sync and statement-cache consistency
 * after a failed segment, startup parameters, server-side termination, LRU eviction,
 * target_timeout (a lock wait is not a dead connection; a loss while idle is reported),
 * and a throughput print (pipelined vs awaited one by one).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, statSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { parseConninfo, type ConnInfo } from '../../src/config/conninfo.js';
import { ConnectionLostError } from '../../src/errors.js';
import { PipelineAbortedError, WireConnection, WireUsageError, type WireNotice, type WireOptions } from '../../src/pgwire/wire.js';
import { openMaintenance, setMaintenanceTimeout } from '../../src/pgwire/connect.js';
import { startCluster, startProxy, stopAllClusters, waitFor, withTimeout, type Cluster } from '../harness/index.js';

let cluster: Cluster;
let info: ConnInfo;
const open: WireConnection[] = [];

async function connect(opts: Partial<WireOptions> = {}): Promise<WireConnection> {
  const wire = await WireConnection.connect(info, { applicationName: 'pgsub-wire-test', ...opts });
  open.push(wire);
  return wire;
}

function int4(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
}

function int8(n: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(n);
  return b;
}

before(async () => {
  cluster = await startCluster({ major: 18, name: 'wire' });
  await cluster.createDatabase('wire');
  info = parseConninfo(cluster.url('wire'), 'target', {});
});

after(async () => {
  for (const w of open) await w.close().catch(() => {});
  await stopAllClusters();
});

test('10,000 pipelined INSERTs inside BEGIN/COMMIT, then sync → idle', async () => {
  await cluster.query('CREATE TABLE public.pipe (id int PRIMARY KEY, v text)', [], 'wire');
  const wire = await connect();
  const results = [wire.execute('BEGIN')];
  for (let i = 1; i <= 10_000; i++) results.push(wire.execute('INSERT INTO public.pipe (id, v) VALUES ($1, $2)', [String(i), `row ${i}`]));
  results.push(wire.execute('COMMIT'));
  assert.ok(wire.pending >= 10_002);
  assert.equal(await wire.sync(), 'I');
  const done = await Promise.all(results);
  assert.equal(done[0]?.command, 'BEGIN');
  assert.deepEqual(done[1], { command: 'INSERT', rowCount: 1, rows: [] });
  assert.equal(done.at(-1)?.command, 'COMMIT');
  assert.equal(wire.pending, 0);
  const [count] = await cluster.query<{ n: string }>('SELECT count(*) AS n, sum(id) AS s FROM public.pipe', [], 'wire');
  assert.equal(count?.n, '10000');

  const upd = await wire.execute('UPDATE public.pipe SET v = v WHERE id <= $1', ['250']);
  const sel = await wire.execute('SELECT id, v FROM public.pipe WHERE id IN ($1, $2) ORDER BY id', ['7', '9'], { wantRows: true });
  assert.equal(await wire.sync(), 'I');
  assert.deepEqual(upd, { command: 'UPDATE', rowCount: 250, rows: [] });
  assert.deepEqual(sel, {
    command: 'SELECT',
    rowCount: 2,
    rows: [
      ['7', 'row 7'],
      ['9', 'row 9'],
    ],
  });
});

test('binary parameters reach typed columns with inferred types; mixed text/binary/NULL', async () => {
  await cluster.query('CREATE TABLE public.bin (i4 int4, i8 int8, b bytea, n numeric, t text, ts timestamptz, f8 float8)', [], 'wire');
  const wire = await connect();
  const numeric = '-12345678901234567890.000123456789';
  const sent = await wire.simpleQuery(`SELECT numeric_send('${numeric}'::numeric) AS n`);
  const numericBin = Buffer.from(sent.rows[0]!.n!.slice(2), 'hex');
  const f8 = Buffer.alloc(8);
  f8.writeDoubleBE(Math.PI);
  const insert = 'INSERT INTO public.bin (i4, i8, b, n, t, ts, f8) VALUES ($1, $2, $3, $4, $5, $6, $7)';
  const bytes = Buffer.from([0, 1, 2, 0xfe, 0xff]);
  await wire.execute(insert, [int4(-123456), int8(9007199254740993n), bytes, numericBin, Buffer.from('héllo wörld', 'utf8'), null, f8]);
  // mixed: text for int4 and timestamptz, binary for int8 and text, NULL bytea
  await wire.execute(insert, ['42', int8(-1n), null, '3.5', Buffer.from('binary text'), '2024-02-29 12:34:56.789+00', '2.5']);
  // paramTypes pins a type for a parameter the server could not infer
  const pinned = await wire.execute('SELECT $1 AS x', [int4(7)], { paramTypes: [23], wantRows: true });
  assert.equal(await wire.sync(), 'I');
  assert.deepEqual(pinned.rows, [['7']]);

  const rows = await wire.execute(
    `SELECT i4::text, i8::text, encode(b, 'hex'), n::text, t, to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS'), f8::text FROM public.bin ORDER BY i4`,
    [],
    { wantRows: true },
  );
  await wire.sync();
  assert.deepEqual(rows.rows, [
    ['-123456', '9007199254740993', '000102feff', numeric, 'héllo wörld', null, String(Math.PI)],
    ['42', '-1', null, '3.5', 'binary text', '2024-02-29 12:34:56.789', '2.5'],
  ]);
  await assert.rejects(wire.execute('SELECT 1', [42 as unknown as string]), WireUsageError);
});

test('an error mid-pipeline rejects that statement, aborts the rest until Sync, and keeps the cache consistent', async () => {
  await cluster.query('CREATE TABLE public.uniq (id int PRIMARY KEY, v text)', [], 'wire');
  const wire = await connect();
  const ins = 'INSERT INTO public.uniq (id, v) VALUES ($1, $2)';
  const firstSeenInFailedSegment = 'INSERT INTO public.uniq (v, id) VALUES ($2, $1)';
  const begin = wire.execute('BEGIN');
  const before = [1, 2, 3, 4, 5].map((i) => wire.execute(ins, [String(i), 'x']));
  const dup = wire.execute(ins, ['3', 'dup']);
  const later = [6, 7].map((i) => wire.execute(ins, [String(i), 'x']));
  const fresh = wire.execute(firstSeenInFailedSegment, ['8', 'x']);
  const commit = wire.execute('COMMIT');
  await begin;
  await Promise.all(before);

  const err = await dup.then(
    () => assert.fail('duplicate insert succeeded'),
    (e: unknown) => e as { code?: string; constraint?: string; table?: string; detail?: string },
  );
  assert.equal(err.code, '23505');
  assert.equal(err.constraint, 'uniq_pkey');
  assert.equal(err.table, 'uniq');
  assert.match(err.detail ?? '', /\(id\)=\(3\)/);
  // Skipped statements settle without a Sync (awaiting one before sync() must not hang) …
  for (const p of [...later, fresh, commit]) {
    const e = await withTimeout(
      p.then(
        () => assert.fail('skipped statement succeeded'),
        (x: unknown) => x,
      ),
      5000,
      'aborted statement',
    );
    assert.ok(e instanceof PipelineAbortedError, String(e));
    assert.equal(e.code, 'PGSUB_PIPELINE_ABORTED');
    assert.equal((e.cause as { code?: string }).code, '23505');
  }
  // … and so does anything queued before the Sync, without reaching the server.
  await assert.rejects(wire.execute(ins, ['9', 'x']), PipelineAbortedError);
  await assert.rejects(wire.simpleQuery('SELECT 1'), PipelineAbortedError);

  assert.equal(await wire.sync(), 'E');
  assert.equal(wire.txStatus, 'E');
  await assert.rejects(wire.execute('SELECT 1'), (e: { code?: string }) => e.code === '25P02');
  assert.equal(await wire.sync(), 'E');
  await wire.execute('ROLLBACK');
  assert.equal(await wire.sync(), 'I');

  // The statement first parsed in the failed segment was never prepared: it must Parse again.
  const ok = await wire.execute(firstSeenInFailedSegment, ['8', 'again']);
  const ok2 = await wire.execute(ins, ['9', 'again']);
  assert.equal(await wire.sync(), 'I');
  assert.equal(ok.rowCount, 1);
  assert.equal(ok2.rowCount, 1);
  const rows = await cluster.query<{ id: number }>('SELECT id FROM public.uniq ORDER BY id', [], 'wire');
  assert.deepEqual(
    rows.map((r) => r.id),
    [8, 9],
  );

  // A Parse error: that statement carries the server error; the same text fails the same way next time.
  const bad = 'SELEC 1';
  await assert.rejects(wire.execute(bad), (e: { code?: string; position?: string }) => e.code === '42601' && e.position === '1');
  await wire.sync();
  await assert.rejects(wire.execute(bad), (e: { code?: string }) => e.code === '42601');
  await wire.sync();
  assert.equal(wire.pending, 0);
});

test('a Parse whose outcome is unknown is not relied on by the next segment', async () => {
  const wire = await connect();
  const text = 'SELECT $1::int * 2 AS x';
  // The segment fails before the Parse of `text`; the next segment is queued before any result.
  const bad = wire.execute('SELECT 1/0');
  const skipped = wire.execute(text, ['21'], { wantRows: true });
  const s1 = wire.sync();
  const again = wire.execute(text, ['21'], { wantRows: true });
  const s2 = wire.sync();
  await assert.rejects(bad, (e: { code?: string }) => e.code === '22012');
  await assert.rejects(skipped, PipelineAbortedError);
  assert.equal(await s1, 'I');
  assert.deepEqual((await again).rows, [['42']]);
  assert.equal(await s2, 'I');
  // Same with a segment that succeeds: the re-Parse under a new name is harmless, the old one is Closed.
  const text2 = 'SELECT $1::int * 3 AS x';
  const a = wire.execute(text2, ['1'], { wantRows: true });
  void wire.sync();
  const b = wire.execute(text2, ['2'], { wantRows: true });
  await wire.sync();
  assert.deepEqual([(await a).rows, (await b).rows], [[['3']], [['6']]]);
  const names = await wire.simpleQuery('SELECT statement FROM pg_prepared_statements ORDER BY statement');
  // 'SELECT 1/0' parsed fine (it fails at execution), so it stays prepared; nothing else is left over.
  assert.deepEqual(
    names.rows.map((r) => r.statement),
    [text, text2, 'SELECT 1/0'],
  );
});

test('a deferred constraint failing at an implicit commit rejects sync()', async () => {
  await cluster.query('CREATE TABLE public.deferred (id int, CONSTRAINT deferred_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)', [], 'wire');
  const wire = await connect();
  const a = wire.execute('INSERT INTO public.deferred VALUES ($1)', ['1']);
  const b = wire.execute('INSERT INTO public.deferred VALUES ($1)', ['1']);
  await assert.rejects(wire.sync(), (e: { code?: string }) => e.code === '23505');
  assert.equal((await a).rowCount, 1);
  assert.equal((await b).rowCount, 1);
  assert.equal(wire.txStatus, 'I');
  assert.equal((await wire.simpleQuery('SELECT count(*) AS n FROM public.deferred')).rows[0]?.n, '0');
});

test('startup parameters are in effect; simple query protocol', async () => {
  const notices: WireNotice[] = [];
  const wire = await connect({
    startupParameters: { search_path: '', session_replication_role: 'replica', synchronous_commit: 'off' },
    onNotice: (n) => notices.push(n),
  });
  assert.ok(wire.serverVersionNum >= 180000 && wire.serverVersionNum < 190000, String(wire.serverVersionNum));
  const show = async (name: string) => (await wire.simpleQuery(`SHOW ${name}`)).rows[0]?.[name];
  // An empty startup value is an empty list (SHOW prints ''); SET search_path = '' prints '""'.
  assert.equal(await show('search_path'), '');
  assert.equal(await show('session_replication_role'), 'replica');
  assert.equal(await show('synchronous_commit'), 'off');
  assert.equal(await show('application_name'), 'pgsub-wire-test');
  // unqualified names do not resolve with an empty search_path
  await assert.rejects(wire.simpleQuery('SELECT * FROM pipe'), (e: { code?: string }) => e.code === '42P01');

  const multi = await wire.simpleQuery("SELECT 1 AS a; SELECT 'x' AS b, NULL AS c UNION ALL SELECT 'y', 'z'");
  assert.deepEqual(multi, {
    command: 'SELECT',
    rowCount: 2,
    rows: [
      { b: 'x', c: null },
      { b: 'y', c: 'z' },
    ],
  });
  assert.deepEqual(await wire.simpleQuery(''), { command: '', rowCount: 0, rows: [] });
  await wire.simpleQuery("DO $$ BEGIN RAISE NOTICE 'hello %', 'notice'; END $$");
  assert.equal(notices[0]?.message, 'hello notice');

  const p = wire.execute('SELECT 1');
  await assert.rejects(wire.simpleQuery('SELECT 1'), WireUsageError);
  await wire.sync();
  await p;
});

test('server-side termination rejects pending and later calls with ConnectionLostError', async () => {
  const wire = await connect();
  const sleeping = wire.execute('SELECT pg_sleep(30)');
  const queued = wire.execute('SELECT 1');
  const synced = wire.sync();
  // pg_stat_activity shows the sleeping statement once the server has started it
  await waitFor(async () => (await cluster.query(`SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%'`, [wire.processId])).length === 1, {
    what: 'pg_sleep running',
  });
  await cluster.query('SELECT pg_terminate_backend($1)', [wire.processId]);
  for (const p of [sleeping, queued, synced]) {
    const e = await withTimeout(
      p.then(
        () => assert.fail('succeeded after termination'),
        (x: unknown) => x,
      ),
      10_000,
      'termination',
    );
    assert.ok(e instanceof ConnectionLostError, String(e));
    assert.equal(e.retryable, true);
    assert.match(e.message, /57P01|terminat/);
  }
  assert.equal(wire.pending, 0);
  await assert.rejects(wire.execute('SELECT 1'), ConnectionLostError);
  await assert.rejects(wire.sync(), ConnectionLostError);
  await assert.rejects(wire.simpleQuery('SELECT 1'), ConnectionLostError);

  // Idle connection: the loss is noticed without a request in flight.
  const idle = await connect();
  await cluster.query('SELECT pg_terminate_backend($1)', [idle.processId]);
  await waitFor(
    () =>
      idle.execute('SELECT 1').then(
        () => false,
        (e: unknown) => e instanceof ConnectionLostError,
      ),
    { what: 'idle loss noticed' },
  );
  await idle.close();
});

test('target_timeout: a lock wait longer than it is not a dead connection (the probe sees the backend busy); an idle connection stays usable; one lost while idle resolves `lost`', async () => {
  await cluster.query('CREATE TABLE public.locked (id int PRIMARY KEY)', [], 'wire');
  await cluster.query('INSERT INTO public.locked VALUES (1)', [], 'wire');
  const probes: number[] = [];
  const holder = await connect();
  const probe = async (pid: number) => {
    probes.push(pid);
    const [row] = await cluster.query<{ state: string; wait_event_type: string | null }>('SELECT state, wait_event_type FROM pg_stat_activity WHERE pid = $1', [pid]);
    return row?.state === 'active' && row.wait_event_type !== 'Client';
  };
  const waiter = await connect({ timeoutMs: 600, probe });
  const begin = holder.execute('BEGIN');
  const lock = holder.execute('SELECT 1 FROM public.locked WHERE id = 1 FOR UPDATE');
  await holder.sync();
  await Promise.all([begin, lock]);
  const blocked = waiter.execute('UPDATE public.locked SET id = 1 WHERE id = 1');
  const synced = waiter.sync();
  await new Promise((r) => setTimeout(r, 2000));
  await Promise.all([holder.execute('COMMIT'), holder.sync()]);
  assert.deepEqual(await blocked, { command: 'UPDATE', rowCount: 1, rows: [] });
  assert.equal(await synced, 'I');
  assert.ok(probes.length >= 1 && probes.every((p) => p === waiter.processId), `probes ${probes.join(',')}`);

  // Idle for several timeouts: the pings are answered, nothing times out, still usable.
  await new Promise((r) => setTimeout(r, 2000));
  const [one] = await Promise.all([waiter.execute('SELECT 1', [], { wantRows: true }), waiter.sync()]);
  assert.deepEqual(one.rows, [['1']]);

  // Terminated while idle: `lost` resolves without anyone sending anything.
  await cluster.query('SELECT pg_terminate_backend($1)', [waiter.processId]);
  const lost = await withTimeout(waiter.lost, 5000, 'lost to resolve');
  assert.ok(lost instanceof ConnectionLostError);
});

test('close() lets queued statements finish, then later calls reject', async () => {
  const wire = await connect();
  const first = wire.execute('SELECT 1', [], { wantRows: true });
  const q = wire.execute('SELECT $1::text', ['x'], { wantRows: true });
  const s = wire.sync();
  const closed = wire.close();
  assert.deepEqual((await first).rows, [['1']]);
  assert.deepEqual((await q).rows, [['x']]);
  assert.equal(await s, 'I');
  await closed;
  await assert.rejects(wire.execute('SELECT 1'), ConnectionLostError);
  await wire.close();
});

test('statement cache LRU eviction (size 3, 10 texts) keeps results correct and Closes old statements', async () => {
  const wire = await connect({ statementCacheSize: 3 });
  const text = (k: number) => `SELECT $1::int + ${k} AS v`;
  for (let round = 0; round < 3; round++) {
    // pipelined: evictions and re-Parses inside one segment
    const batch = [];
    for (let k = 0; k < 10; k++) batch.push(wire.execute(text(k), [String(round * 100)], { wantRows: true }));
    for (let k = 9; k >= 0; k--) batch.push(wire.execute(text(k), [String(round * 100 + 1)], { wantRows: true }));
    await wire.sync();
    const got = (await Promise.all(batch)).map((r) => r.rows[0]?.[0]);
    const want = [...Array(10).keys()].map((k) => String(round * 100 + k)).concat([...Array(10).keys()].reverse().map((k) => String(round * 100 + 1 + k)));
    assert.deepEqual(got, want);
    // awaited one by one
    for (let k = 0; k < 10; k++) assert.deepEqual((await wire.execute(text(k % 4), ['5'], { wantRows: true })).rows, [[String(5 + (k % 4))]]);
    await wire.sync();
  }
  const prepared = await wire.simpleQuery('SELECT count(*) AS n FROM pg_prepared_statements');
  assert.ok(Number(prepared.rows[0]?.n) <= 3, `prepared statements on the server: ${prepared.rows[0]?.n}`);
});

test('TLS (sslmode=require): the pipelined protocol runs over the upgraded stream', async (t) => {
  const dir = cluster.dataDir;
  try {
    execFileSync(
      'openssl',
      ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1', '-keyout', path.join(dir, 'wire.key'), '-out', path.join(dir, 'wire.crt')],
      { stdio: 'ignore' },
    );
    const owner = statSync(dir);
    for (const f of ['wire.key', 'wire.crt']) chownSync(path.join(dir, f), owner.uid, owner.gid);
    chmodSync(path.join(dir, 'wire.key'), 0o600);
  } catch (err) {
    t.skip(`cannot make a server certificate: ${(err as Error).message}`);
    return;
  }
  await cluster.query("ALTER SYSTEM SET ssl_cert_file = 'wire.crt'");
  await cluster.query("ALTER SYSTEM SET ssl_key_file = 'wire.key'");
  await cluster.query('ALTER SYSTEM SET ssl = on');
  await cluster.query('SELECT pg_reload_conf()');
  await waitFor(async () => (await cluster.query<{ ssl: string }>('SHOW ssl'))[0]?.ssl === 'on', { what: 'ssl = on' });
  const tlsInfo = parseConninfo(`${cluster.url('wire')}?sslmode=require`, 'target', {});
  const wire = await WireConnection.connect(tlsInfo, { applicationName: 'pgsub-wire-tls' });
  open.push(wire);
  const ssl = await wire.execute('SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()', [], { wantRows: true });
  const all = [];
  for (let i = 0; i < 2000; i++) all.push(wire.execute('SELECT $1::int8 + 1', [int8(BigInt(i))], { wantRows: true }));
  assert.equal(await wire.sync(), 'I');
  assert.deepEqual(ssl.rows, [['t']]);
  assert.deepEqual(
    (await Promise.all(all)).map((r) => r.rows[0]?.[0]),
    [...Array(2000).keys()].map((i) => String(i + 1)),
  );
});

test('a maintenance pool whose connect failed (a black-holed network) connects again once the network heals', async () => {
  // postgres.js keeps a pool whose socket factory rejected waiting for good; src/connect hands it a failing socket instead.
  const proxy = await startProxy(cluster.port);
  const sql = openMaintenance(parseConninfo(`postgres://postgres@127.0.0.1:${proxy.port}/wire?connect_timeout=1`, 'target'), 'pgsub-wire-test-maint');
  try {
    proxy.blackhole({ newConnections: true });
    await assert.rejects(
      withTimeout(sql.unsafe('SELECT 1'), 10_000, 'the first query'),
      (err: Error) => err instanceof ConnectionLostError && /timeout expired \(connect_timeout 2 s\)/.test(err.message),
    );
    proxy.heal();
    const rows = await withTimeout(sql.unsafe<{ n: string }[]>('SELECT 2 AS n'), 10_000, 'the query after the heal');
    assert.equal(String(rows[0]?.n), '2');
  } finally {
    await sql.end({ timeout: 1 }).catch(() => undefined);
    await proxy.close();
  }
});

test('a maintenance connection that goes silent after its login fails at target_timeout, and the next query connects again', async () => {
  // The watchdog wraps socket.write over the login hand-over's own wrapper: it must outlive the login.
  const proxy = await startProxy(cluster.port);
  setMaintenanceTimeout(1500);
  const sql = openMaintenance(parseConninfo(`postgres://postgres@127.0.0.1:${proxy.port}/wire`, 'target'), 'pgsub-wire-test-silent');
  try {
    assert.equal(String((await sql.unsafe<{ n: string }[]>('SELECT 1 AS n'))[0]?.n), '1');
    proxy.blackhole();
    const started = Date.now();
    await assert.rejects(withTimeout(sql.unsafe('SELECT 2'), 10_000, 'the query on the silent connection'), /no answer from the target for 2 s \(target_timeout\)/);
    const waitedMs = Date.now() - started;
    console.log(`silent maintenance connection given up after ${waitedMs} ms (target_timeout 1.5 s)`);
    assert.ok(waitedMs >= 1400 && waitedMs < 4000, `${waitedMs} ms`);
    proxy.heal();
    const rows = await withTimeout(sql.unsafe<{ n: string }[]>('SELECT 3 AS n'), 10_000, 'the query after the heal');
    assert.equal(String(rows[0]?.n), '3');
  } finally {
    setMaintenanceTimeout(60_000);
    await sql.end({ timeout: 1 }).catch(() => undefined);
    await proxy.close();
  }
});

test('throughput: 50,000 single-row INSERTs pipelined vs awaited one by one (printed, not asserted)', async (t) => {
  await cluster.query('CREATE TABLE public.speed (id int8 PRIMARY KEY, a int4, b text)', [], 'wire');
  const wire = await connect();
  const n = 50_000;
  const insert = 'INSERT INTO public.speed (id, a, b) VALUES ($1, $2, $3)';
  const payload = Buffer.from('some payload text');

  let t0 = process.hrtime.bigint();
  void wire.execute('BEGIN');
  const all: Promise<unknown>[] = [];
  for (let i = 0; i < n; i++) all.push(wire.execute(insert, [int8(BigInt(i)), int4(i), payload]));
  all.push(wire.execute('COMMIT'));
  assert.equal(await wire.sync(), 'I');
  await Promise.all(all);
  const pipelinedMs = Number(process.hrtime.bigint() - t0) / 1e6;

  t0 = process.hrtime.bigint();
  await wire.execute('BEGIN');
  for (let i = n; i < 2 * n; i++) await wire.execute(insert, [int8(BigInt(i)), int4(i), payload]);
  await wire.execute('COMMIT');
  assert.equal(await wire.sync(), 'I');
  const awaitedMs = Number(process.hrtime.bigint() - t0) / 1e6;

  const [count] = await cluster.query<{ n: string }>('SELECT count(*) AS n FROM public.speed', [], 'wire');
  assert.equal(count?.n, String(2 * n));
  const rate = (ms: number) => Math.round(n / (ms / 1000)).toLocaleString('en-US');
  const line = `wire throughput: pipelined ${rate(pipelinedMs)} stmt/s (${pipelinedMs.toFixed(0)} ms), awaited one by one ${rate(awaitedMs)} stmt/s (${awaitedMs.toFixed(0)} ms)`;
  t.diagnostic(line);
});
