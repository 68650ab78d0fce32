/**
 * A migration split over three pgsub instances (issue 30): one PostgreSQL 16 source database,
 * three table groups (orders with their items — a foreign key inside the group —, customers,
 * events), each with its own publication, slot, config file and `pgsub run -c <file>`
 * process (what the systemd template pgsub@<name>.service runs), into one PostgreSQL 18
 * target, under a writer whose every transaction touches all three groups.
 *  - `pgsub status -c a -c b -c c --json` shows the three together;
 *  - `pgsub verify -c a -c b -c c` compares every table at one LSN while the writer runs;
 *  - one `cutover` of the three fences once and drains all three to the same fence LSN,
 *    with instance b killed (-9) and started again during the drain; every instance ends
 *    with exit 5 and the target equals the source at the fence.
 * Each instance's peak RSS and connections are printed (the README's cost of an instance).
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { runCutover } from '../../src/cli/cutover.js';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { compareTables, lsnToBigint, spawnPgsub, startCluster, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const DB = 'shop';
const SCHEMA = `CREATE SCHEMA shop;
  CREATE TABLE shop.orders (id bigserial PRIMARY KEY, customer int NOT NULL, total numeric(12,2) NOT NULL);
  CREATE TABLE shop.order_items (id bigserial PRIMARY KEY, order_id bigint NOT NULL REFERENCES shop.orders (id), qty int NOT NULL);
  CREATE TABLE shop.customers (id int PRIMARY KEY, name text NOT NULL, balance bigint NOT NULL DEFAULT 0);
  CREATE TABLE shop.events (id bigserial PRIMARY KEY, kind text NOT NULL, payload text);`;
const GROUPS = { a: ['shop.orders', 'shop.order_items'], b: ['shop.customers'], c: ['shop.events'] } as const;
type Name = keyof typeof GROUPS;
const NAMES = Object.keys(GROUPS) as Name[];
const TABLES = NAMES.flatMap((n) => [...GROUPS[n]]);

let source: Cluster;
let target: Cluster;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-split-'));
const instances = new Map<Name, PgsubProcess>();
const peakRss = new Map<Name, number>();

const configFile = (name: Name) => path.join(tmp, `${name}.yaml`);
const log = createLogger('warn', process.stderr as never);

before(async () => {
  [source, target] = await Promise.all([startCluster({ major: 16, name: 'split-src' }), startCluster({ major: 18, name: 'split-tgt' })]);
  await source.createDatabase(DB);
  await target.createDatabase(DB);
  await source.query(
    `${SCHEMA}
     INSERT INTO shop.customers SELECT g, 'customer ' || g FROM generate_series(1, 2000) g;
     INSERT INTO shop.orders (customer, total) SELECT 1 + g % 2000, g FROM generate_series(1, 5000) g;
     INSERT INTO shop.order_items (order_id, qty) SELECT 1 + g % 5000, g % 7 FROM generate_series(1, 10000) g;
     INSERT INTO shop.events (kind) SELECT 'seed' FROM generate_series(1, 3000);
     ${NAMES.map((n) => `CREATE PUBLICATION pub_${n} FOR TABLE ${GROUPS[n].join(', ')};`).join('\n')}`,
    [],
    DB,
  );
  await target.query(SCHEMA, [], DB);
  for (const name of NAMES) {
    fs.writeFileSync(
      configFile(name),
      [
        `subscription: split_${name}`,
        `source: "${source.url(DB)}"`,
        `target: "${target.url(DB)}"`,
        `publication: [pub_${name}]`,
        `state_dir: ${path.join(tmp, `state-${name}`)}`,
        'status_interval: 1',
        'retry_min_delay: 0.2',
        'retry_max_delay: 1',
        '',
      ].join('\n'),
    );
  }
});

after(async () => {
  for (const p of instances.values()) p.kill('SIGKILL');
  await Promise.all([...instances.values()].map((p) => p.exited));
  await source?.stop();
  await target?.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
});

function start(name: Name): PgsubProcess {
  const p = spawnPgsub({}, ['run', '-c', configFile(name)]);
  instances.set(name, p);
  return p;
}

/** VmHWM of each running instance: its peak RSS so far, in MB. */
function sampleRss(): void {
  for (const [name, p] of instances) {
    try {
      const kb = Number(/VmHWM:\s+(\d+)/.exec(fs.readFileSync(`/proc/${p.child.pid}/status`, 'utf8'))?.[1] ?? 0);
      peakRss.set(name, Math.max(peakRss.get(name) ?? 0, kb / 1024));
    } catch {
      // exited
    }
  }
}

async function cli(args: string[]): Promise<{ code: number | string; stdout: string; output: string }> {
  const p = spawnPgsub({}, args);
  let stdout = '';
  p.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  const code = await withTimeout(p.exited, 90_000, `pgsub ${args.join(' ')}`);
  return { code, stdout, output: p.output() };
}

const configArgs = NAMES.flatMap((n) => ['-c', configFile(n)]);

/** Every transaction touches all three groups; a new session each time, so the fence stops it. */
function startWriter(): { stop(): Promise<{ committed: number; readOnly: number }> } {
  let stopped = false;
  let committed = 0;
  let readOnly = 0;
  const client = async (seed: number) => {
    for (let i = seed; !stopped; i += 2) {
      const c = new pg.Client({ connectionString: source.url(DB) });
      c.on('error', () => {});
      try {
        await c.connect();
        await c.query('BEGIN');
        const order = await c.query('INSERT INTO shop.orders (customer, total) VALUES ($1, $2) RETURNING id', [1 + (i % 2000), i % 1000]);
        await c.query('INSERT INTO shop.order_items (order_id, qty) VALUES ($1, 1), ($1, 2)', [order.rows[0].id]);
        await c.query('UPDATE shop.customers SET balance = balance + $1 WHERE id = $2', [i % 100, 1 + (i % 2000)]);
        await c.query(`INSERT INTO shop.events (kind, payload) VALUES ('order', $1)`, [String(order.rows[0].id)]);
        await c.query('COMMIT');
        committed++;
      } catch (err) {
        if ((err as { code?: string }).code === '25006') readOnly++;
        await new Promise((r) => setTimeout(r, 20));
      } finally {
        await c.end().catch(() => {});
      }
    }
  };
  const clients = [client(0), client(1)];
  return {
    stop: async () => {
      stopped = true;
      await Promise.all(clients);
      return { committed, readOnly };
    },
  };
}

interface StatusReport {
  subscription: string;
  tables: { table: string; state: string }[] | null;
}

test('three instances, one status, one verify at one LSN, one cutover with kill -9 of one instance during the drain', async () => {
  for (const name of NAMES) start(name);
  const sampler = setInterval(sampleRss, 200);
  try {
    // status of the three together, until every table is ready.
    let reports: StatusReport[] = [];
    await waitFor(
      async () => {
        const r = await cli(['status', '--json', ...configArgs]);
        if (r.code !== 0) return false;
        reports = JSON.parse(r.stdout) as StatusReport[];
        return reports.every((s) => s.tables !== null && s.tables.length > 0 && s.tables.every((t) => t.state === 'ready'));
      },
      { timeoutMs: 90_000, intervalMs: 500, what: 'every table of the three subscriptions ready' },
    );
    assert.deepEqual(
      reports.map((s) => s.subscription),
      NAMES.map((n) => `split_${n}`),
    );
    assert.deepEqual(
      reports.map((s) => s.tables!.map((t) => t.table).sort()),
      NAMES.map((n) => [...GROUPS[n]].sort()),
    );

    const writer = startWriter();
    let stopped: { committed: number; readOnly: number } | null = null;
    try {
      await new Promise((r) => setTimeout(r, 2000));
      // One verify of the three while the writer runs: one LSN for all of them.
      const verify = await cli(['verify', '--json', ...configArgs]);
      assert.equal(verify.code, 0, verify.output.slice(-3000));
      const result = JSON.parse(verify.stdout) as { lsn: string; equal: boolean; subscription: string; tables: { table: string; status: string }[] };
      assert.equal(result.equal, true);
      assert.equal(result.subscription, NAMES.map((n) => `split_${n}`).join(', '));
      assert.deepEqual(result.tables.map((t) => `${t.table} ${t.status}`).sort(), TABLES.map((t) => `${t} equal`).sort());
      for (const name of NAMES) {
        const [row] = await target.query<{ last_lsn: string; last_result: string }>(
          `SELECT last_lsn::text, last_result FROM pgsub.verify WHERE subscription = $1`,
          [`split_${name}`],
          DB,
        );
        assert.deepEqual(row, { last_lsn: result.lsn, last_result: 'equal' }, `split_${name}'s recorded verify`);
      }
      const perInstance = await target.query<{ app: string; n: number }>(
        `SELECT application_name AS app, count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'pgsub%' GROUP BY 1 ORDER BY 1`,
        [DB],
        DB,
      );
      const walsenders = await source.query<{ app: string; n: number }>(
        `SELECT application_name AS app, count(*)::int AS n FROM pg_stat_replication GROUP BY 1 ORDER BY 1`,
        [],
        DB,
      );
      console.log(
        `# target connections per application_name: ${perInstance.map((r) => `${r.app}=${r.n}`).join(', ')}; walsenders: ${walsenders.map((r) => `${r.app}=${r.n}`).join(', ')}`,
      );

      // One cutover of the three; b is killed during the drain and started again (systemd's Restart=).
      const configs = NAMES.map((n) => loadConfig({ file: configFile(n), env: {} }));
      let killed = false;
      const report = await runCutover(
        configs,
        {
          fence: 'read-only',
          maxLagBytes: 16 * 1024 * 1024,
          lagTimeoutMs: 60_000,
          applyTimeoutMs: 60_000,
          reverse: false,
          reverseConfigFile: null,
          hooks: {
            beforeWait: async () => {
              const b = instances.get('b')!;
              b.kill('SIGKILL');
              await b.exited;
              killed = true;
              start('b');
            },
          },
        },
        () => {},
        log,
      );
      assert.ok(killed);
      stopped = await writer.stop();
      assert.deepEqual(
        report.subscriptions,
        NAMES.map((n) => `split_${n}`),
      );
      console.log(
        `# cutover of three instances: write downtime ${report.write_downtime_ms} ms, fence LSN ${report.fence_lsn}; writer committed ${stopped.committed}, refused read-only ${stopped.readOnly}`,
      );
      assert.ok(stopped.readOnly > 0, 'the fence refused writes');
      for (const name of NAMES) {
        const code = await withTimeout(instances.get(name)!.exited, 30_000, `instance ${name} to end`);
        assert.equal(code, 5, `instance ${name}: ${instances.get(name)!.output().slice(-1500)}`);
        const [origin] = await target.query<{ lsn: string }>(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = $1`, [`split_${name}`], DB);
        assert.ok(lsnToBigint(origin!.lsn) >= lsnToBigint(report.fence_lsn), `split_${name} drained to the fence LSN ${report.fence_lsn}: at ${origin!.lsn}`);
      }
    } finally {
      if (!stopped) await writer.stop();
    }
    const cmp = await compareTables(source, DB, target, DB, TABLES);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    // The foreign key inside group a holds on the target.
    const [orphans] = await target.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM shop.order_items i LEFT JOIN shop.orders o ON o.id = i.order_id WHERE o.id IS NULL`,
      [],
      DB,
    );
    assert.equal(orphans!.n, 0);
  } finally {
    clearInterval(sampler);
    console.log(`# peak RSS per instance: ${NAMES.map((n) => `${n} ${(peakRss.get(n) ?? 0).toFixed(0)} MB`).join(', ')}`);
  }
});
