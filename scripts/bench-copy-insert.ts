/**
 * What a run of INSERTs costs the target as multi-row INSERT … VALUES versus COPY, sent
 * the way the apply path sends them (multi-row.ts insertManyStatement / copy-rows.ts
 * copyInsertStatement through one pipelined WireConnection, pgoutput-style binary or
 * text values). Rows have W1's shape (id bigint pk, int, 100-character text,
 * timestamptz), in transactions of TX_ROWS; at most WINDOW statements are outstanding,
 * so encoding overlaps the server's work as in the apply loop.
 *
 * Prints, per method: wall time, the target backend's CPU (utime+stime of
 * pg_backend_pid() from /proc/<pid>/stat), this process's CPU, and WAL written. Not a
 * test: nothing is asserted. PGSUB_BENCH_METHODS, _WINDOW, _PREBUILD and _SPLIT (below)
 * vary what is sent. Others share the machine; run under the bench lock:
 *
 *   flock /tmp/pgsub-bench.lock npx tsx scripts/bench-copy-insert.ts [rows] [major]
 */
import { readFileSync } from 'node:fs';
import { copyInsertStatement } from '../src/apply/sql/copy-rows.js';
import { insertManyStatement } from '../src/apply/sql/multi-row.js';
import { WireConnection, type WireResult } from '../src/pgwire/wire.js';
import { parseConninfo } from '../src/config/conninfo.js';
import type { Tuple } from '../src/protocol/messages.js';
import { startCluster, stopAllClusters } from '../test/harness/index.js';
import { workloadRelation } from './bench-apply-workloads.js';

const ROWS = Number(process.argv[2] ?? 1_000_000);
const MAJOR = Number(process.argv[3] ?? 18);
const TX_ROWS = 100_000;
/** Statements outstanding at most (PGSUB_BENCH_WINDOW; 0: a whole transaction). */
const WINDOW = Number(process.env.PGSUB_BENCH_WINDOW ?? 8) || Infinity;
/** PGSUB_BENCH_SPLIT=n: send the COPY data as CopyData messages of at most n bytes. */
const SPLIT = Number(process.env.PGSUB_BENCH_SPLIT ?? 0);
const split = (b: Buffer, n: number) => Array.from({ length: Math.ceil(b.length / n) }, (_, k) => b.subarray(k * n, (k + 1) * n));
const PREBUILD = process.env.PGSUB_BENCH_PREBUILD === '1';
const CLK_TCK = 100; // sysconf(_SC_CLK_TCK) on Linux
const TS_BASE = 789_004_800_000_000n; // 2025-01-01 00:00:00+00, µs since 2000-01-01

type Method = { name: string; batch: number; format: 'binary' | 'text'; via: 'insert' | 'copy' };
// PGSUB_BENCH_METHODS=copy:binary:1024,insert:binary:128 picks others.
const METHODS: Method[] = process.env.PGSUB_BENCH_METHODS
  ? process.env.PGSUB_BENCH_METHODS.split(',').map((spec) => {
      const [via, format, batch] = spec.split(':') as ['insert' | 'copy', 'binary' | 'text', string];
      return { name: `${via === 'copy' ? 'COPY' : 'INSERT'} ${format} ${batch} rows/stmt`, batch: Number(batch), format, via };
    })
  : [
      { name: 'INSERT 128 rows/stmt, binary params', batch: 128, format: 'binary', via: 'insert' },
      { name: 'COPY binary 1024 rows/stmt', batch: 1024, format: 'binary', via: 'copy' },
      { name: 'COPY text 1024 rows/stmt', batch: 1024, format: 'text', via: 'copy' },
      { name: 'COPY binary 128 rows/stmt', batch: 128, format: 'binary', via: 'copy' },
    ];

const rel = workloadRelation('w1');

const payload = (i: number) => `${i.toString(16).padStart(8, '0')}${'abcdef0123456789'.repeat(6)}`.slice(0, 100);

function row(i: number, format: 'binary' | 'text'): Tuple {
  if (format === 'text') {
    return [
      { kind: 'text', value: String(i) },
      { kind: 'text', value: String(i % 1000) },
      { kind: 'text', value: payload(i) },
      { kind: 'text', value: new Date(Date.UTC(2025, 0, 1) + i * 1000).toISOString() },
    ];
  }
  const id = Buffer.allocUnsafe(8);
  id.writeBigInt64BE(BigInt(i));
  const n = Buffer.allocUnsafe(4);
  n.writeInt32BE(i % 1000);
  const ts = Buffer.allocUnsafe(8);
  ts.writeBigInt64BE(TS_BASE + BigInt(i) * 1_000_000n);
  return [
    { kind: 'binary', value: id },
    { kind: 'binary', value: n },
    { kind: 'binary', value: Buffer.from(payload(i)) },
    { kind: 'binary', value: ts },
  ];
}

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]); // utime, stime (fields 14, 15)
}

async function run(wire: WireConnection, backendPid: number, m: Method): Promise<string> {
  await wire.simpleQuery('TRUNCATE public.w1; CHECKPOINT');
  const lsn0 = (await wire.simpleQuery('SELECT pg_current_wal_insert_lsn() AS l')).rows[0]!.l!;
  const cpu0 = cpuTicks(backendPid);
  const me0 = process.cpuUsage();
  const t0 = performance.now();
  const window: Promise<WireResult>[] = [];
  for (let tx = 1; tx <= ROWS; tx += TX_ROWS) {
    const last = Math.min(ROWS, tx + TX_ROWS - 1);
    // PGSUB_BENCH_PREBUILD=1: encode the whole transaction first, so the server never waits for the client.
    const sends: (() => Promise<WireResult>)[] = [];
    const later = (send: () => Promise<WireResult>) => (PREBUILD ? sends.push(send) : window.push(send()));
    if (!PREBUILD) void wire.execute('BEGIN');
    for (let first = tx; first <= last; first += m.batch) {
      const tuples: Tuple[] = [];
      for (let i = first; i <= Math.min(last, first + m.batch - 1); i++) tuples.push(row(i, m.format));
      if (m.via === 'copy') {
        const copy = copyInsertStatement(rel, tuples);
        if (!copy) throw new Error('copyInsertStatement returned null');
        later(() => wire.copyIn(copy.text, SPLIT ? split(copy.data[0]!, SPLIT) : copy.data));
      } else {
        const stmt = insertManyStatement(rel, tuples);
        later(() => wire.execute(stmt.text, stmt.params, stmt.paramTypes ? { paramTypes: stmt.paramTypes } : undefined));
      }
      if (window.length > WINDOW) await window.shift();
    }
    if (PREBUILD) {
      void wire.execute('BEGIN');
      for (const send of sends) window.push(send());
    }
    void wire.execute('COMMIT');
    await Promise.all(window.splice(0));
    await wire.sync();
  }
  const wall = performance.now() - t0;
  const me = process.cpuUsage(me0);
  const cpu = (cpuTicks(backendPid) - cpu0) / CLK_TCK;
  const wal = (await wire.simpleQuery(`SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '${lsn0}') AS b, (SELECT count(*) FROM public.w1) AS n`)).rows[0]!;
  if (Number(wal.n) !== ROWS) throw new Error(`${m.name}: ${wal.n} rows`);
  return `${m.name.padEnd(38)} wall ${(wall / 1000).toFixed(2).padStart(6)} s   backend CPU ${cpu.toFixed(2).padStart(6)} s   client CPU ${((me.user + me.system) / 1e6).toFixed(2).padStart(6)} s   WAL ${(Number(wal.b) / 2 ** 20).toFixed(0).padStart(5)} MB`;
}

const cluster = await startCluster({ major: MAJOR, name: 'bench-copy', settings: { shared_buffers: '128MB', max_wal_size: '4GB', checkpoint_timeout: '30min' } });
try {
  await cluster.createDatabase('bench');
  await cluster.query('CREATE TABLE public.w1 (id bigint PRIMARY KEY, n integer NOT NULL, payload text NOT NULL, ts timestamptz NOT NULL)', [], 'bench');
  const wire = await WireConnection.connect(parseConninfo(cluster.url('bench'), 'target', {}), {
    applicationName: 'pgsub-bench-copy',
    // As the apply connection (target.ts).
    startupParameters: { search_path: '', session_replication_role: 'replica', synchronous_commit: 'off', datestyle: 'ISO', intervalstyle: 'postgres', extra_float_digits: '3' },
  });
  const pid = Number((await wire.simpleQuery('SELECT pg_backend_pid() AS p')).rows[0]!.p);
  console.log(`PostgreSQL ${MAJOR}, ${ROWS.toLocaleString('en')} rows, transactions of ${TX_ROWS.toLocaleString('en')}, backend pid ${pid}`);
  for (const round of [1, 2]) for (const m of METHODS) console.log(`round ${round}  ${await run(wire, pid, m)}`);
  await wire.close();
} finally {
  await stopAllClusters();
}
