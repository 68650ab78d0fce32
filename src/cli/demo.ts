/**
 * `pgsub demo` / `npm run demo`: the whole job on an embedded default. Starts a
 * publisher and a target of different majors from the npm-installed binaries, creates a
 * sample schema and publication, runs a concurrent workload while pgsub replicates it,
 * shows live progress (transactions applied, lag), then checks that every table in the
 * target equals the source and exits 0 — or 1 with the differing tables. Run as root, it
 * copies the server binaries to a directory of its own under /tmp (the server runs as an
 * unprivileged user that may not reach node_modules) and removes it when it ends, also
 * after a failure or Ctrl-C.
 */
import fs from 'node:fs';
import { compareTables, connect, currentWalLsn, setBinRoot, slotConfirmedLsn, startCluster, stopAllClusters, waitFor } from '../../test/harness/index.js';
import type { Cluster } from '../../test/harness/index.js';
import { loadConfig } from '../config/config.js';
import { createLogger } from '../log.js';
import { startRunner } from '../service/runner.js';

export interface DemoOptions {
  publisherMajor: number;
  targetMajor: number;
  transactions: number;
  clients: number;
}

const SCHEMA = `
  CREATE SCHEMA shop;
  CREATE TABLE shop.customers (id bigint PRIMARY KEY, name text NOT NULL, email text, created_at timestamptz NOT NULL DEFAULT now());
  CREATE TABLE shop.orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES shop.customers(id), amount numeric(12,2) NOT NULL, status text NOT NULL, placed_at timestamptz NOT NULL);
  CREATE TABLE shop."order lines" (order_id bigint NOT NULL, line int NOT NULL, sku text NOT NULL, qty int NOT NULL, PRIMARY KEY (order_id, line));
`;
const TABLES = ['"shop"."customers"', '"shop"."orders"', '"shop"."order lines"'];

export async function runDemo(opts: DemoOptions): Promise<number> {
  const out = (line: string) => process.stdout.write(`${line}\n`);
  out(`pgsub demo: PostgreSQL ${opts.publisherMajor} publisher → PostgreSQL ${opts.targetMajor} target, ${opts.transactions} transactions from ${opts.clients} clients`);
  let publisher: Cluster | undefined;
  let target: Cluster | undefined;
  const binaries = ownBinaries();
  if (binaries.dir) out(`  binaries  ${binaries.dir} (removed at the end)`);
  try {
    // Both starts are waited for, also when one fails: a server still starting would
    // outlive the cleanup below.
    const starting = Promise.allSettled([startCluster({ major: opts.publisherMajor, name: 'demo-publisher' }), startCluster({ major: opts.targetMajor, name: 'demo-target' })]);
    // After startCluster registered the harness's exit handler (it stops the servers), so
    // this one runs after it: the servers' binaries go last.
    process.on('exit', binaries.remove);
    const servers = await starting;
    for (const s of servers) if (s.status === 'rejected') throw s.reason;
    [publisher, target] = servers.map((s) => (s as PromiseFulfilledResult<Cluster>).value) as [Cluster, Cluster];
    out(`  publisher ${publisher.url('shop')}\n  target    ${target.url('shop')}`);
    await publisher.createDatabase('shop');
    await target.createDatabase('shop');
    await publisher.query(`${SCHEMA} CREATE PUBLICATION demo_pub FOR TABLE ${TABLES.join(', ')};`, [], 'shop');
    await target.query(SCHEMA, [], 'shop');
    // Existing data, copied by the initial table sync while the workload below already runs.
    await publisher.query(
      `INSERT INTO shop.customers (id, name, email) SELECT 1000000 + g, 'existing ' || g, 'e' || g || '@example.com' FROM generate_series(1, 20000) g;
       INSERT INTO shop.orders SELECT 1000000 + g, 1000000 + 1 + g % 20000, (g % 500) + 0.5, 'archived', now() - interval '1 day' FROM generate_series(1, 100000) g;
       INSERT INTO shop."order lines" SELECT 1000000 + g, 1, 'sku-old', 1 FROM generate_series(1, 100000) g;`,
      [],
      'shop',
    );

    const config = loadConfig({
      env: {},
      overrides: { subscription: 'demo', source: publisher.url('shop'), target: target.url('shop'), publication: 'demo_pub', status_interval: 1 },
    });
    const runner = startRunner(config, createLogger(process.env.PGSUB_LOG_LEVEL ?? 'warn', process.stderr as never));
    await waitFor(async () => (await slotConfirmedLsn(publisher!, 'demo')) !== null, { timeoutMs: 30_000, what: 'pgsub to create its slot' });

    const started = Date.now();
    const progress = setInterval(() => void showProgress(publisher!, runner.counters, started, out), 500);
    await runWorkload(publisher, opts);
    const workloadEnd = await currentWalLsn(publisher, 'shop');
    await waitFor(async () => ((await slotConfirmedLsn(publisher!, 'demo')) ?? 0n) >= workloadEnd, { timeoutMs: 300_000, intervalMs: 200, what: 'pgsub to catch up' });
    clearInterval(progress);
    const seconds = (Date.now() - started) / 1000;
    await showProgress(publisher, runner.counters, started, out);
    runner.stop();
    await runner.done;

    const cmp = await compareTables(publisher, 'shop', target, 'shop', TABLES);
    out('');
    out(`  ${'table'.padEnd(24)} ${'source rows'.padStart(12)} ${'target rows'.padStart(12)}  checksum`);
    cmp.source.forEach((s, i) => {
      const d = cmp.target[i]!;
      out(`  ${s.table.padEnd(24)} ${String(s.rows).padStart(12)} ${String(d.rows).padStart(12)}  ${s.md5 === d.md5 ? 'equal' : 'DIFFERENT'}`);
    });
    const [copy] = await target.query<{ rows: string; seconds: string }>(
      `SELECT sum(rows_copied)::text AS rows, extract(epoch FROM max(copy_finished_at) - min(copy_started_at))::numeric(10,1)::text AS seconds FROM pgsub.subscription_rel WHERE subscription = 'demo'`,
      [],
      'shop',
    );
    out(`\n  initial copy: ${copy?.rows ?? 0} rows in ${copy?.seconds ?? '?'} s (in parallel, while the workload ran)`);
    const c = runner.counters;
    out(
      `  streamed: ${c.transactionsApplied} transactions (${c.changesApplied} changes) applied in ${seconds.toFixed(1)} s: ${Math.round(c.transactionsApplied / seconds)} tx/s, ${Math.round(c.changesApplied / seconds)} rows/s`,
    );
    out(cmp.equal ? '  target equals source ✔' : '  target differs from source ✘');
    return cmp.equal ? 0 : 1;
  } finally {
    await stopAllClusters();
    binaries.remove();
  }
}

/**
 * As root, a directory of this process's own for the server binaries (harness
 * setBinRoot), instead of the shared /tmp/pgsub-pgbin that test runs use at the same
 * time; `remove` deletes it (idempotent). Not root: the binaries run where npm put them.
 */
function ownBinaries(): { dir: string | null; remove: () => void } {
  if (process.getuid?.() !== 0) return { dir: null, remove: () => {} };
  const dir = fs.mkdtempSync('/tmp/pgsub-demo-bin-');
  setBinRoot(dir);
  const remove = () => {
    process.off('exit', remove);
    fs.rmSync(dir, { recursive: true, force: true });
  };
  return { dir, remove };
}

async function showProgress(publisher: Cluster, counters: { transactionsApplied: number; changesApplied: number }, started: number, out: (s: string) => void): Promise<void> {
  try {
    const [wal, confirmed] = await Promise.all([currentWalLsn(publisher, 'shop'), slotConfirmedLsn(publisher, 'demo')]);
    const lag = confirmed === null ? 0n : wal - confirmed;
    const line = `  ${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s  applied ${String(counters.transactionsApplied).padStart(7)} tx  ${String(counters.changesApplied).padStart(8)} changes  lag ${String(lag).padStart(10)} bytes`;
    if (process.stdout.isTTY) process.stdout.write(`\r${line}`);
    else out(line);
  } catch {
    // Progress is best effort; the final comparison is what counts.
  }
}

/** A shop: customers sign up, orders are placed with lines, updated, some cancelled (deleted). */
async function runWorkload(publisher: Cluster, opts: DemoOptions): Promise<void> {
  const perClient = Math.ceil(opts.transactions / opts.clients);
  await Promise.all(
    Array.from({ length: opts.clients }, async (_, client) => {
      const db = await connect(publisher, 'shop');
      try {
        for (let i = 0; i < perClient; i++) {
          const n = client * perClient + i;
          await db.query('BEGIN');
          if (i % 10 === 0) {
            await db.query('INSERT INTO shop.customers (id, name, email) VALUES ($1, $2, $3)', [n, `customer ${n}`, `c${n}@example.com`]);
          }
          const customer = client * perClient + (i - (i % 10));
          await db.query('INSERT INTO shop.orders VALUES ($1, $2, $3, $4, now())', [n, customer, (n % 997) + 0.99, 'new']);
          await db.query('INSERT INTO shop."order lines" SELECT $1, g, $2 || g, g FROM generate_series(1, 1 + $1::bigint % 3) g', [n, `sku-${n % 50}-`]);
          if (i > 0 && i % 3 === 0) await db.query(`UPDATE shop.orders SET status = 'paid', amount = amount + 1 WHERE id = $1`, [n - 1]);
          if (i > 1 && i % 7 === 0) {
            await db.query('DELETE FROM shop."order lines" WHERE order_id = $1', [n - 2]);
            await db.query('DELETE FROM shop.orders WHERE id = $1', [n - 2]);
          }
          await db.query('COMMIT');
        }
      } finally {
        await db.end();
      }
    }),
  );
}
