/**
 * The metrics endpoint (issue 17), scraped over HTTP while pgsub replicates, its values
 * checked against the databases: pg_stat_subscription's positions (never a flush the
 * target does not hold: latest_end_lsn at most the origin committed in the target, and the
 * slot confirms what it says), what this process applied and copied, the tables' sync
 * states, lag, the slot's health and pgsub_info; /healthz, and /readyz answering 503 while
 * the publisher is down and 200 once streaming again. The slot and WAL guard: retained WAL
 * above max_retained_wal_mb is a warning; a slot the publisher invalidated
 * (max_slot_wal_keep_size) stops pgsub with PGSUB_SLOT_LOST, exit 4.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  compareTables,
  connect,
  lsnToBigint,
  pickPort,
  slotConfirmedLsn,
  spawnPgsub,
  startCluster,
  waitFor,
  waitForCatchUp,
  withTimeout,
  type Cluster,
  type PgsubProcess,
} from '../harness/index.js';

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'met-pub', settings: { max_slot_wal_keep_size: '64MB' } }),
    startCluster({ major: 18, name: 'met-tgt' }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  const schema = `CREATE TABLE public.a (id int PRIMARY KEY, v text); CREATE TABLE public.b (id int PRIMARY KEY, v text);`;
  await publisher.query(
    `${schema} CREATE TABLE public.noise (x text); INSERT INTO public.a SELECT g, 'a' FROM generate_series(1, 1000) g; CREATE PUBLICATION pub FOR TABLE public.a, public.b;`,
    [],
    'src',
  );
  await target.query(schema, [], 'dst');
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, extra: Record<string, string> = {}): PgsubProcess {
  const p = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    ...extra,
  });
  children.push(p);
  return p;
}

async function scrape(port: number, what = '/metrics'): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}${what}`);
  return { status: res.status, body: await res.text() };
}

/** `name{labels} value` lines into a map keyed by name and labels as written. */
function parse(body: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return out;
}

const originLsn = async (sub: string) => lsnToBigint((await target.query(`SELECT remote_lsn::text AS l FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst'))[0].l);

test('metrics scraped during replication match the databases; healthz and readyz', { timeout: 300_000 }, async () => {
  const port = await pickPort();
  const p = start('met', { PGSUB_METRICS_LISTEN: `127.0.0.1:${port}` });
  const listening = await p.waitForLog('metrics endpoint listening');
  assert.equal(String(listening.listen), `127.0.0.1:${port}`);
  await p.waitForLog('streaming started', 120_000);
  for (let i = 0; i < 200; i++) await publisher.query(`INSERT INTO public.b VALUES (${i}, 'b')`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'met');
  // Idle: the confirmed position, the origin and what the metrics say settle together.
  let m = new Map<string, number>();
  await waitFor(
    async () => {
      m = parse((await scrape(port)).body);
      return m.get('pgsub_lag_bytes') === 0 && BigInt(m.get('pgsub_latest_end_lsn') ?? 0) === ((await slotConfirmedLsn(publisher, 'met')) ?? -1n);
    },
    { timeoutMs: 30_000, intervalMs: 200, what: 'settled metrics' },
  );
  assert.ok(BigInt(m.get('pgsub_latest_end_lsn')!) <= (await originLsn('met')), 'reported a flush the target does not hold');
  assert.ok(m.get('pgsub_received_lsn')! >= m.get('pgsub_latest_end_lsn')!);
  assert.equal(m.get('pgsub_transactions_applied_total'), 200);
  assert.equal(m.get('pgsub_changes_applied_total'), 200);
  assert.equal(m.get('pgsub_tablesync_rows_copied_total'), 1000);
  assert.equal(m.get('pgsub_tablesync_tables{state="ready"}'), 2);
  assert.equal(m.get('pgsub_lag_seconds'), 0);
  assert.equal(m.get('pgsub_streaming'), 1);
  assert.equal(m.get('pgsub_apply_error_count'), 0);
  assert.equal(m.get('pgsub_confl_insert_exists'), 0);
  assert.equal(m.get('pgsub_slot_wal_status{wal_status="reserved"}'), 1);
  assert.ok((m.get('pgsub_slot_retained_wal_bytes') ?? -1) >= 0);
  assert.ok(
    [...m.keys()].some((k) => /^pgsub_info\{version="[^"]+",subscription="met",slot="met"\}$/.test(k)),
    [...m.keys()].join('\n'),
  );
  const now = Date.now() / 1000;
  assert.ok(Math.abs(now - m.get('pgsub_last_msg_receipt_time')!) < 60);
  assert.equal((await scrape(port, '/healthz')).status, 200);
  assert.equal((await scrape(port, '/readyz')).status, 200);
  await compareTables(publisher, 'src', target, 'dst', ['public.a', 'public.b']).then((c) => assert.ok(c.equal, JSON.stringify(c)));

  // Not ready while the publisher is down; ready again once streaming.
  await publisher.stopServer('fast');
  await waitFor(async () => (await scrape(port, '/readyz')).status === 503, { timeoutMs: 30_000, what: 'readyz 503' });
  assert.equal((await scrape(port, '/healthz')).status, 200);
  await publisher.startServer();
  await waitFor(async () => (await scrape(port, '/readyz')).status === 200, { timeoutMs: 60_000, what: 'readyz 200 again' });
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
});

test('slot guard: retained WAL over max_retained_wal_mb is a warning; an invalidated slot stops pgsub with exit 4', { timeout: 300_000 }, async () => {
  const p = start('guard', { PGSUB_COPY_DATA: 'false', PGSUB_MAX_RETAINED_WAL_MB: '8', PGSUB_SLOT_CHECK_INTERVAL: '0.5' });
  await p.waitForLog('streaming started');
  // An open transaction with an xid keeps the slot's restart_lsn where it is.
  const holder = await connect(publisher, 'src');
  try {
    await holder.query('BEGIN');
    await holder.query(`INSERT INTO public.noise VALUES ('held')`);
    await publisher.query(`INSERT INTO public.noise SELECT repeat('n', 1000) FROM generate_series(1, 20000)`, [], 'src');
    await p.waitForLog('the slot retains more WAL on the publisher than max_retained_wal', 30_000);
    const status = spawnPgsub({ PGSUB_SOURCE: publisher.url('src'), PGSUB_TARGET: target.url('dst'), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: 'guard' }, ['status', '--json']);
    assert.equal(await status.exited, 0, status.output());
    const json = JSON.parse(status.output().slice(status.output().indexOf('{'))) as Record<string, unknown>;
    assert.ok((json.slot_retained_wal_bytes as number) > 8 * 1024 * 1024, JSON.stringify(json));
    assert.equal(json.slot_wal_status, 'reserved');
    // Past max_slot_wal_keep_size (64MB): the next checkpoint invalidates the slot.
    for (let i = 0; i < 8; i++) await publisher.query(`INSERT INTO public.noise SELECT repeat('n', 1000) FROM generate_series(1, 20000)`, [], 'src');
    await publisher.query('CHECKPOINT', [], 'src');
    const code = await withTimeout(p.exited, 60_000, 'pgsub to stop on the lost slot');
    assert.equal(code, 4, p.output().slice(-3000));
    assert.match(p.output(), /PGSUB_SLOT_LOST/);
    assert.match(p.output(), /Re-create the subscription/);
  } finally {
    await holder.query('ROLLBACK').catch(() => {});
    await holder.end();
  }
});
