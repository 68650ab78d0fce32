/**
 * The metrics endpoint (issues 17, 29, 31), scraped over HTTP while pgsub replicates, its
 * values checked against the databases: pg_stat_subscription's positions (never a flush the
 * target does not hold: latest_end_lsn at most the origin committed in the target, and the
 * slot confirms what it says), what this process applied and copied, the tables' sync
 * states, lag, the slot's health and the _info series; /healthz, and /readyz answering 503
 * while the publisher is down and 200 once streaming again. The names and types are the
 * list below (Prometheus conventions: every counter ends in _total), README's metrics
 * table lists exactly them, and a value that is unknown has no sample: safe_wal_size with
 * an unlimited max_slot_wal_keep_size (the default -1), the verify series before any
 * verify, conflict types not detected. The Grafana dashboard and the alert rules of
 * packaging/monitoring parse and name only metrics the scrape has. A conflict is counted as
 * PostgreSQL counts it: insert_exists under the default `error` policy in
 * pgsub_conflicts_total and pgsub_apply_errors_total, once per attempt, equal to the
 * target's pgsub.subscription_stats; a delete_missing resolved by `skip` once. The slot and
 * WAL guard: retained WAL above max_retained_wal_mb is a warning; a slot the publisher
 * invalidated (max_slot_wal_keep_size) stops pgsub with PGSUB_SLOT_LOST, exit 4.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import { parse as parseYaml } from 'yaml';
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

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Every pgsub_ metric family and its type: the scrape must have exactly these. */
const EXPECTED: Record<string, 'gauge' | 'counter'> = {
  pgsub_received_lsn_bytes: 'gauge',
  pgsub_latest_end_lsn_bytes: 'gauge',
  pgsub_last_msg_send_timestamp_seconds: 'gauge',
  pgsub_last_msg_receipt_timestamp_seconds: 'gauge',
  pgsub_latest_end_timestamp_seconds: 'gauge',
  pgsub_flushed_lsn_bytes: 'gauge',
  pgsub_lag_bytes: 'gauge',
  pgsub_lag_seconds: 'gauge',
  pgsub_clock_offset_seconds: 'gauge',
  pgsub_apply_errors_total: 'counter',
  pgsub_sync_table_errors_total: 'counter',
  pgsub_sync_seq_errors_total: 'counter',
  pgsub_conflicts_total: 'counter',
  pgsub_transactions_applied_total: 'counter',
  pgsub_transactions_skipped_total: 'counter',
  pgsub_changes_applied_total: 'counter',
  pgsub_tablesync_tables: 'gauge',
  pgsub_tablesync_copied_bytes: 'gauge',
  pgsub_tablesync_rows_copied_total: 'counter',
  pgsub_spool_bytes: 'gauge',
  pgsub_streaming: 'gauge',
  pgsub_slot_wal_status: 'gauge',
  pgsub_slot_safe_wal_size_bytes: 'gauge',
  pgsub_slot_retained_wal_bytes: 'gauge',
  pgsub_verify_last_lsn_bytes: 'gauge',
  pgsub_verify_last_equal: 'gauge',
  pgsub_verify_last_differences: 'gauge',
  pgsub_verify_last_timestamp_seconds: 'gauge',
  pgsub_build_info: 'gauge',
  pgsub_info: 'gauge',
};

/** prom-client's default metrics, some of them: registered beside pgsub's. */
const DEFAULT_METRICS: Record<string, string> = {
  process_cpu_seconds_total: 'counter',
  process_start_time_seconds: 'gauge',
  process_resident_memory_bytes: 'gauge',
  nodejs_eventloop_lag_seconds: 'gauge',
  nodejs_heap_size_used_bytes: 'gauge',
};

let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  // max_slot_wal_keep_size stays at its default (-1, unlimited) until the slot guard's test.
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'met-pub' }), startCluster({ major: 18, name: 'met-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await target.createDatabase('dst2');
  const schema = `CREATE TABLE public.a (id int PRIMARY KEY, v text); CREATE TABLE public.b (id int PRIMARY KEY, v text);`;
  await publisher.query(
    `${schema} CREATE TABLE public.noise (x text); INSERT INTO public.a SELECT g, 'a' FROM generate_series(1, 1000) g; CREATE PUBLICATION pub FOR TABLE public.a, public.b;`,
    [],
    'src',
  );
  await target.query(schema, [], 'dst');
  await target.query(schema, [], 'dst2');
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, extra: Record<string, string> = {}, db = 'dst'): PgsubProcess {
  const p = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url(db),
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

/** The families of a scrape: `# TYPE name type` lines, and the sample names (histograms add _bucket, _sum, _count). */
function families(body: string): { types: Map<string, string>; sampleNames: Set<string> } {
  const types = new Map<string, string>();
  const sampleNames = new Set<string>();
  for (const line of body.split('\n')) {
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) types.set(t[1]!, t[2]!);
    else if (line !== '' && !line.startsWith('#')) sampleNames.add(/^[a-zA-Z_:][a-zA-Z0-9_:]*/.exec(line)![0]);
  }
  return { types, sampleNames };
}

async function metricsWhen(port: number, what: string, ok: (m: Map<string, number>) => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<Map<string, number>> {
  let m = new Map<string, number>();
  await waitFor(
    async () => {
      m = parse((await scrape(port)).body);
      return ok(m);
    },
    { timeoutMs, intervalMs: 200, what },
  );
  return m;
}

const PROMQL_WORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'offset', 'bool', 'inf', 'nan', 'atan2']);

/**
 * The metric names a PromQL expression reads, by a small tokenizer: strings, label
 * matchers `{…}`, ranges `[…]`, Grafana variables `$x` / `${x}`, numbers and durations are
 * skipped; a name followed by `(` (or by `by (…)` / `without (…)`) is a function or aggregation; the parenthesised label
 * list after by/without/on/ignoring/group_left/group_right is skipped; keywords are not names.
 */
function promqlMetricNames(expr: string): string[] {
  const names: string[] = [];
  let i = 0;
  let skipLabelList = false;
  const closing = (open: string, close: string): number => {
    let depth = 0;
    for (let j = i; j < expr.length; j++) {
      const c = expr[j]!;
      if (c === '"' || c === "'" || c === '`') {
        const end = expr.indexOf(c, j + 1);
        assert.ok(end > 0, `unterminated string in ${expr}`);
        j = end;
      } else if (c === open) depth++;
      else if (c === close && --depth === 0) return j;
    }
    assert.fail(`unbalanced ${open}${close} in ${expr}`);
  };
  while (i < expr.length) {
    const c = expr[i]!;
    if (c === '"' || c === "'" || c === '`') {
      const end = expr.indexOf(c, i + 1);
      assert.ok(end > 0, `unterminated string in ${expr}`);
      i = end + 1;
    } else if (c === '{') i = closing('{', '}') + 1;
    else if (c === '[') i = closing('[', ']') + 1;
    else if (c === '$') {
      const m = /^\$(\{[^}]*\}|[A-Za-z0-9_]+)/.exec(expr.slice(i));
      assert.ok(m, `bad variable in ${expr}`);
      i += m[0].length;
    } else if (/[0-9.]/.test(c)) i += /^[0-9.][0-9a-zA-Z_.+-]*/.exec(expr.slice(i))![0].replace(/[+-].*$/, '').length || 1;
    else if (/[A-Za-z_:]/.test(c)) {
      const word = /^[A-Za-z_:][A-Za-z0-9_:]*/.exec(expr.slice(i))![0];
      i += word.length;
      const rest = expr.slice(i);
      if (['by', 'without', 'on', 'ignoring', 'group_left', 'group_right'].includes(word)) skipLabelList = /^\s*\(/.test(rest);
      // A function call, or an aggregation with its grouping first (`sum by (l) (…)`).
      else if (!/^\s*(\(|(by|without)\s*\()/.test(rest) && !PROMQL_WORDS.has(word.toLowerCase())) names.push(word);
    } else if (c === '(' && skipLabelList) {
      i = closing('(', ')') + 1;
      skipLabelList = false;
    } else i++;
  }
  return names;
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
  // Idle: the confirmed position, the origin and what the metrics say settle together; the slot guard has read the slot.
  const m = await metricsWhen(
    port,
    'settled metrics',
    async (s) =>
      s.get('pgsub_lag_bytes') === 0 &&
      s.has('pgsub_slot_wal_status{wal_status="reserved"}') &&
      BigInt(s.get('pgsub_latest_end_lsn_bytes') ?? 0) === ((await slotConfirmedLsn(publisher, 'met')) ?? -1n),
  );
  assert.ok(BigInt(m.get('pgsub_latest_end_lsn_bytes')!) <= (await originLsn('met')), 'reported a flush the target does not hold');
  assert.ok(m.get('pgsub_received_lsn_bytes')! >= m.get('pgsub_latest_end_lsn_bytes')!);
  assert.ok(m.get('pgsub_flushed_lsn_bytes')! >= m.get('pgsub_latest_end_lsn_bytes')!);
  assert.equal(m.get('pgsub_transactions_applied_total'), 200);
  assert.equal(m.get('pgsub_changes_applied_total'), 200);
  assert.equal(m.get('pgsub_tablesync_rows_copied_total'), 1000);
  assert.equal(m.get('pgsub_tablesync_tables{state="ready"}'), 2);
  assert.equal(m.get('pgsub_lag_seconds'), 0);
  assert.equal(m.get('pgsub_streaming'), 1);
  assert.equal(m.get('pgsub_apply_errors_total'), 0);
  assert.equal(m.get('pgsub_sync_table_errors_total'), 0);
  assert.equal(m.get('pgsub_sync_seq_errors_total'), 0);
  assert.equal(m.get('pgsub_conflicts_total{conflict="insert_exists"}'), 0);
  assert.equal(m.get('pgsub_slot_wal_status{wal_status="reserved"}'), 1);
  assert.ok((m.get('pgsub_slot_retained_wal_bytes') ?? -1) >= 0);
  assert.ok(m.has(`pgsub_build_info{version="${JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')).version}"}`), [...m.keys()].join('\n'));
  assert.equal(m.get('pgsub_info{subscription="met",slot="met"}'), 1, [...m.keys()].join('\n'));
  const now = Date.now() / 1000;
  assert.ok(Math.abs(now - m.get('pgsub_last_msg_receipt_timestamp_seconds')!) < 60);
  assert.ok(Math.abs(now - m.get('pgsub_latest_end_timestamp_seconds')!) < 60);

  // Unknown is absent, never 0: max_slot_wal_keep_size = -1 makes safe_wal_size NULL; no verify ran;
  // the target has no track_commit_timestamp (no origin checks); update_deleted is never detected.
  const [setting] = await publisher.query<{ keep: string }>(`SELECT current_setting('max_slot_wal_keep_size') AS keep`, [], 'src');
  assert.equal(setting?.keep, '-1');
  const [slot] = await publisher.query<{ safe: string | null }>(`SELECT safe_wal_size::text AS safe FROM pg_replication_slots WHERE slot_name = 'met'`, [], 'src');
  assert.equal(slot?.safe, null);
  const body = (await scrape(port)).body;
  const { types, sampleNames } = families(body);
  for (const name of [
    'pgsub_slot_safe_wal_size_bytes',
    'pgsub_verify_last_lsn_bytes',
    'pgsub_verify_last_equal',
    'pgsub_verify_last_differences',
    'pgsub_verify_last_timestamp_seconds',
  ])
    assert.ok(!sampleNames.has(name), `${name} has a sample although its value is unknown:\n${body}`);
  for (const type of ['update_origin_differs', 'delete_origin_differs', 'update_deleted']) assert.ok(!body.includes(`conflict="${type}"`), `${type} reported:\n${body}`);
  for (const type of ['insert_exists', 'update_exists', 'update_missing', 'delete_missing', 'multiple_unique_conflicts'])
    assert.equal(parse(body).get(`pgsub_conflicts_total{conflict="${type}"}`), 0, type);

  // Names and types: exactly the list, every counter ends in _total, the default process metrics beside them.
  const pgsub = new Map([...types].filter(([n]) => n.startsWith('pgsub_')));
  assert.deepEqual(Object.fromEntries([...pgsub].sort()), Object.fromEntries(Object.entries(EXPECTED).sort()));
  for (const [name, type] of Object.entries(DEFAULT_METRICS)) assert.equal(types.get(name), type, name);
  for (const [name, type] of types) if (type === 'counter') assert.match(name, /_total$/, `counter ${name}`);
  // (prom-client's own nodejs_active_resources_total is a gauge: only pgsub's names are held to the reverse.)
  for (const [name, type] of pgsub) if (type === 'gauge') assert.doesNotMatch(name, /_total$/, `gauge ${name}`);

  // README's metrics table lists exactly these, with their types.
  const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const rows = [...readme.matchAll(/^\| `(pgsub_[a-z_]+)(?:\{[a-z_,]+\})?` \| (gauge|counter) \|/gm)].map((r) => [r[1]!, r[2]!]);
  assert.deepEqual(Object.fromEntries(rows.sort()), Object.fromEntries(Object.entries(EXPECTED).sort()));

  // packaging/monitoring: the dashboard and the alert rules parse and read only metrics the scrape has.
  const known = new Set([...types.keys(), ...sampleNames, 'up']);
  const dashboard = JSON.parse(readFileSync(path.join(ROOT, 'packaging/monitoring/pgsub-dashboard.json'), 'utf8')) as {
    panels: { title: string; targets: { expr: string }[] }[];
    templating: { list: { definition?: string }[] };
  };
  const exprs: string[] = dashboard.panels.flatMap((panel) => panel.targets.map((t) => t.expr));
  for (const v of dashboard.templating.list) if (v.definition) exprs.push(/^label_values\(([^,]+),/.exec(v.definition)![1]!);
  const rules = parseYaml(readFileSync(path.join(ROOT, 'packaging/monitoring/pgsub-alerts.yml'), 'utf8')) as {
    groups: { name: string; rules: { alert: string; expr: string; for?: string; labels: { severity: string }; annotations: Record<string, string> }[] }[];
  };
  assert.ok(rules.groups.length > 0);
  const alerts = rules.groups.flatMap((g) => g.rules);
  for (const r of alerts) {
    assert.match(r.alert, /^Pgsub[A-Za-z]+$/);
    assert.ok(['critical', 'warning', 'info'].includes(r.labels.severity), r.alert);
    assert.ok(r.annotations.summary && r.annotations.description, r.alert);
    if (r.for !== undefined) assert.match(r.for, /^\d+[smh]$/, r.alert);
    exprs.push(r.expr);
  }
  // What the issue asks the rules to watch.
  for (const needed of ['pgsub_lag_seconds', 'pgsub_slot_safe_wal_size_bytes', 'pgsub_apply_errors_total', 'pgsub_streaming', 'up', 'pgsub_build_info'])
    assert.ok(
      alerts.some((r) => promqlMetricNames(r.expr).includes(needed)),
      `no alert reads ${needed}`,
    );
  assert.ok(exprs.length > 20);
  for (const expr of exprs) {
    const names = promqlMetricNames(expr);
    assert.ok(names.length > 0, `no metric in ${expr}`);
    for (const name of names) assert.ok(known.has(name), `${name} (in ${expr}) is not in the scrape`);
  }
  // The tokenizer itself, on what it must not take for a metric.
  assert.deepEqual(promqlMetricNames('sum by (instance, conflict) (increase(x_total{a="b}"}[5m] offset 1h)) > 2 * 1e3 and on (instance) y == bool 0'), ['x_total', 'y']);

  assert.equal((await scrape(port, '/healthz')).status, 200);
  assert.equal((await scrape(port, '/readyz')).status, 200);
  await compareTables(publisher, 'src', target, 'dst', ['public.a', 'public.b']).then((c) => assert.ok(c.equal, JSON.stringify(c)));

  // Not ready while the publisher is down; ready again once streaming.
  await publisher.stopServer('fast');
  await waitFor(async () => (await scrape(port, '/readyz')).status === 503, { timeoutMs: 30_000, what: 'readyz 503' });
  assert.equal((await scrape(port, '/healthz')).status, 200);
  await publisher.startServer();
  await waitFor(async () => (await scrape(port, '/readyz')).status === 200, { timeoutMs: 60_000, what: 'readyz 200 again' });
  // A lost connection is not an apply error.
  assert.equal(parse((await scrape(port)).body).get('pgsub_apply_errors_total'), 0);
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
});

test('conflicts count as pg_stat_subscription_stats does: insert_exists under error with each apply error, delete_missing under skip once', { timeout: 300_000 }, async () => {
  const port = await pickPort();
  const p = start('conf', { PGSUB_METRICS_LISTEN: `127.0.0.1:${port}`, PGSUB_COPY_DATA: 'false' }, 'dst2');
  await p.waitForLog('streaming started', 120_000);
  const stats = async () => {
    const [row] = await target.query<{ apply: string; ins: string; del: string }>(
      `SELECT apply_error_count::text AS apply, confl_insert_exists::text AS ins, confl_delete_missing::text AS del FROM pgsub.subscription_stats WHERE subscription = 'conf'`,
      [],
      'dst2',
    );
    return { apply: Number(row?.apply ?? 0), ins: Number(row?.ins ?? 0), del: Number(row?.del ?? 0) };
  };

  // delete_missing, resolved by its default policy (skip): counted once, when its transaction commits.
  await publisher.query(`INSERT INTO public.b VALUES (6000, 'x')`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'conf');
  await target.query(`DELETE FROM public.b WHERE id = 6000`, [], 'dst2');
  await publisher.query(`DELETE FROM public.b WHERE id = 6000`, [], 'src');
  await waitForCatchUp(publisher, 'src', 'conf');
  let m = await metricsWhen(port, 'delete_missing counted', (s) => s.get('pgsub_conflicts_total{conflict="delete_missing"}') === 1);
  assert.equal(m.get('pgsub_apply_errors_total'), 0);
  assert.equal((await stats()).del, 1);

  // insert_exists under the default error policy: every attempt meets it, counts it and the apply error.
  await target.query(`INSERT INTO public.b VALUES (5000, 'local')`, [], 'dst2');
  await publisher.query(`INSERT INTO public.b VALUES (5000, 'remote')`, [], 'src');
  m = await metricsWhen(port, 'insert_exists retried', (s) => (s.get('pgsub_apply_errors_total') ?? 0) >= 3);
  assert.ok((m.get('pgsub_conflicts_total{conflict="insert_exists"}') ?? 0) >= 2, [...m].join('\n'));
  // The local row goes: the next attempt applies the insert.
  await target.query(`DELETE FROM public.b WHERE id = 5000`, [], 'dst2');
  await waitForCatchUp(publisher, 'src', 'conf');
  await waitFor(async () => (await target.query(`SELECT v FROM public.b WHERE id = 5000`, [], 'dst2'))[0]?.v === 'remote', { what: 'the remote row applied' });
  m = parse((await scrape(port)).body);
  const errors = m.get('pgsub_apply_errors_total')!;
  assert.ok(errors >= 3);
  assert.equal(m.get('pgsub_conflicts_total{conflict="insert_exists"}'), errors, 'one insert_exists per apply error');
  assert.equal(m.get('pgsub_conflicts_total{conflict="delete_missing"}'), 1, 'the resolved conflict was not counted again');
  for (const type of ['update_exists', 'update_missing', 'multiple_unique_conflicts']) assert.equal(m.get(`pgsub_conflicts_total{conflict="${type}"}`), 0, type);
  // The same counts as the target's (recorded at each error on the maintenance connection, and in the resolving transaction).
  await waitFor(async () => (await stats()).apply === errors, { what: 'the target recorded every error' });
  assert.deepEqual(await stats(), { apply: errors, ins: errors, del: 1 });
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
});

test('slot guard: retained WAL over max_retained_wal_mb is a warning; an invalidated slot stops pgsub with exit 4', { timeout: 300_000 }, async () => {
  await publisher.query(`ALTER SYSTEM SET max_slot_wal_keep_size = '64MB'`, [], 'src');
  await publisher.query(`SELECT pg_reload_conf()`, [], 'src');
  const port = await pickPort();
  const p = start('guard', {
    PGSUB_COPY_DATA: 'false',
    PGSUB_MAX_RETAINED_WAL_MB: '8',
    PGSUB_SLOT_CHECK_INTERVAL: '0.5',
    PGSUB_METRICS_LISTEN: `127.0.0.1:${port}`,
  });
  await p.waitForLog('streaming started');
  // With a limit, safe_wal_size is known: the series is there, at most the limit plus the current WAL segment (16MB).
  const m = await metricsWhen(port, 'safe_wal_size exported', (s) => s.has('pgsub_slot_safe_wal_size_bytes'));
  assert.ok(m.get('pgsub_slot_safe_wal_size_bytes')! > 0 && m.get('pgsub_slot_safe_wal_size_bytes')! <= 80 * 1024 * 1024, String(m.get('pgsub_slot_safe_wal_size_bytes')));
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
