/**
 * `npm run bench:copy-mapped`: the initial copy of one table unmapped against the same
 * table under a mapping (retarget + a rename + one computed column, which takes the
 * staged path: COPY into a temporary table, then INSERT … SELECT; tablesync/copy.ts), and
 * retarget + rename only (the straight COPY with a column list), and a shard of a
 * many-to-one table (retarget + rename + a discriminator: staged, its emptiness check and
 * cleanup scoped to the shard, no COPY FREEZE), in one run on the same
 * PostgreSQL 18 publisher and target (throw-away clusters from test/harness).
 *
 *   npm run bench:copy-mapped                       # 1,000,000 rows, 3 repetitions
 *   npm run bench:copy-mapped -- --rows 100000 --reps 1
 *   npm run bench:copy-mapped -- --variants unmapped,discriminator
 *
 * Each measurement: a fresh target database with the same DDL, pgsub in this process
 * (startRunner, binary), timed by its own 'table copy finished' log line (rows, bytes of
 * the publisher's COPY stream, seconds from datasync to finishedcopy, indexes rebuilt
 * included). Variants rotate their order per repetition; the median is printed. Rows and a
 * checksum are verified. A shared machine skews absolute numbers: compare variants of
 * the same run only.
 */
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config/config.js';
import { createLogger } from '../src/log.js';
import { replicationOriginName } from '../src/origin/replorigin.js';
import { startRunner } from '../src/service/runner.js';
import { startCluster, stopAllClusters, waitFor, type Cluster } from '../test/harness/index.js';

const { values } = parseArgs({
  options: {
    rows: { type: 'string', default: '1000000' },
    reps: { type: 'string', default: '3' },
    variants: { type: 'string', default: 'unmapped,renamed,computed,discriminator' },
  },
});
const ROWS = Number(values.rows);
const REPS = Number(values.reps);

const TARGET_DDL: Record<string, string> = {
  unmapped: `CREATE SCHEMA app; CREATE TABLE app.orders (id bigint PRIMARY KEY, customer int, amount_cents int, status text, note text, created timestamptz)`,
  renamed: `CREATE SCHEMA sales; CREATE TABLE sales.orders (id bigint PRIMARY KEY, client int, amount_cents int, status text, note text, created timestamptz)`,
  computed: `CREATE SCHEMA sales; CREATE TABLE sales.orders (id bigint PRIMARY KEY, client int, amount_cents int, status text, note text, created timestamptz, amount numeric)`,
  discriminator: `CREATE SCHEMA sales; CREATE TABLE sales.orders (shard text NOT NULL, id bigint, client int, amount_cents int, status text, note text, created timestamptz, PRIMARY KEY (shard, id))`,
};
const MAPPING: Record<string, unknown> = {
  unmapped: undefined,
  renamed: { tables: { 'app.orders': { target: 'sales.orders', columns: { customer: 'client' } } } },
  computed: { tables: { 'app.orders': { target: 'sales.orders', columns: { customer: 'client' }, computed: { amount: 'amount_cents / 100.0' } } } },
  discriminator: { tables: { 'app.orders': { target: 'sales.orders', columns: { customer: 'client' }, discriminator: { column: 'shard', value: 's1' } } } },
};
const CHECK: Record<string, string> = {
  unmapped: `SELECT count(*)::text AS n, sum(id)::text AS s FROM app.orders`,
  renamed: `SELECT count(*)::text AS n, sum(id)::text AS s FROM sales.orders`,
  computed: `SELECT count(*)::text AS n, sum(id)::text AS s FROM sales.orders WHERE amount = amount_cents / 100.0`,
  discriminator: `SELECT count(*)::text AS n, sum(id)::text AS s FROM sales.orders WHERE shard = 's1'`,
};

async function measure(pub: Cluster, tgt: Cluster, variant: string, n: number): Promise<{ rows: number; bytes: number; seconds: number }> {
  const db = `t_${variant}_${n}`;
  await tgt.createDatabase(db);
  await tgt.query(TARGET_DDL[variant]!, [], db);
  let finished: { rows: number; bytes: number; seconds: number } | null = null;
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: `b_${variant}_${n}`,
      source: pub.url('bench'),
      target: tgt.url(db),
      publication: 'pub',
      binary: true,
      ...(MAPPING[variant] ? { mapping: MAPPING[variant] } : {}),
    },
  });
  const runner = startRunner(
    config,
    createLogger('debug', {
      write: (line: string) => {
        const l = JSON.parse(line) as { msg: string; rows?: number; bytes?: number; seconds?: number; level: number; copy?: string };
        if (l.msg === 'table copy finished') finished = { rows: l.rows!, bytes: l.bytes!, seconds: l.seconds! };
        if (l.msg === 'copy shape of a mapped table' && n === 0) console.log(`${variant}: ${l.copy} copy`);
        if (l.level >= 50) console.error(line);
      },
    }),
  );
  try {
    await waitFor(() => finished !== null, { timeoutMs: 600_000, intervalMs: 100, what: `${variant} copy` });
  } finally {
    runner.stop();
    await runner.done.catch(() => undefined);
  }
  const [got] = await tgt.query(CHECK[variant]!, [], db);
  const want = { n: String(ROWS), s: String((ROWS * (ROWS + 1)) / 2) };
  if (got?.n !== want.n || got?.s !== want.s) throw new Error(`${variant}: wrong result ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  await pub.query(`SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, [config.slotName], 'bench');
  // Origins are the target cluster's, and PostgreSQL 18 keeps at most 10 active: each measurement's goes with it.
  await tgt.query(`SELECT pg_catalog.pg_replication_origin_drop($1)`, [replicationOriginName(config.subscription)], db);
  return finished!;
}

async function main(): Promise<void> {
  const [pub, tgt] = await Promise.all([startCluster({ major: 18, name: 'bench-cm-pub' }), startCluster({ major: 18, name: 'bench-cm-tgt' })]);
  try {
    await pub.createDatabase('bench');
    await pub.query(
      `CREATE SCHEMA app;
       CREATE TABLE app.orders (id bigint PRIMARY KEY, customer int, amount_cents int, status text, note text, created timestamptz);
       INSERT INTO app.orders SELECT g, g % 1000, g % 100000, (ARRAY['new','paid','shipped'])[1 + g % 3], md5(g::text), '2024-01-01'::timestamptz + g * interval '1 second'
         FROM generate_series(1, ${ROWS}) g;
       CREATE PUBLICATION pub FOR TABLE app.orders;`,
      [],
      'bench',
    );
    await pub.query(`VACUUM ANALYZE app.orders`, [], 'bench');
    const variants = values.variants.split(',');
    const results = new Map<string, { rows: number; bytes: number; seconds: number }[]>(variants.map((v) => [v, []]));
    for (let rep = 0; rep < REPS; rep++) {
      const order = variants.map((_, i) => variants[(i + rep) % variants.length]!);
      for (const v of order) {
        const r = await measure(pub, tgt, v, rep);
        results.get(v)!.push(r);
        console.log(`rep ${rep + 1} ${v.padEnd(9)} ${r.seconds.toFixed(2)} s  ${Math.round(r.rows / r.seconds)} rows/s  ${(r.bytes / 1048576 / r.seconds).toFixed(1)} MB/s`);
      }
    }
    const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    const base = med(results.get('unmapped')!.map((r) => r.seconds));
    console.log(`\n${ROWS} rows, ${REPS} repetitions, median:`);
    for (const v of variants) {
      const rs = results.get(v)!;
      const s = med(rs.map((r) => r.seconds));
      const bytes = rs[0]!.bytes;
      console.log(`${v.padEnd(9)} ${s.toFixed(2)} s  ${Math.round(ROWS / s)} rows/s  ${(bytes / 1048576 / s).toFixed(1)} MB/s  time ×${(s / base).toFixed(2)} of unmapped`);
    }
  } finally {
    await stopAllClusters();
  }
}

await main();
