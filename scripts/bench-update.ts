/**
 * What a run of key-located UPDATEs costs the target, per way of sending them, on W3's
 * shape (id bigint pk, int, 100-character text, timestamptz; every row updated once in
 * one transaction, as W3's source transaction does): the target backend's CPU, this
 * process's CPU, wall time and WAL. Not a test: nothing is asserted.
 *
 *   sql            one UPDATE run by the server itself: the floor (heap, index, WAL)
 *   values:N       UPDATE … FROM (VALUES …) of N rows (multi-row.ts updateManyStatement, the
 *                  batches before update-rows.ts), in power-of-two pieces as batch.ts sent them
 *   arrays:N       UPDATE … FROM ROWS FROM (unnest($1::type[]), …) of N rows (update-rows.ts)
 *   …-d:N          the same with conflict detection (update_missing raised in the statement)
 *   …-text:N       values in text format, as without `binary`
 *
 * Each method starts from a freshly loaded, analyzed, checkpointed table. Others share the
 * machine; run under the bench lock:
 *
 *   flock /tmp/pgsub-bench.lock npx tsx scripts/bench-update.ts [rows] [major] [methods]
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { updateManyStatement } from '../src/apply/sql/multi-row.js';
import { updateArraysStatement } from '../src/apply/sql/update-rows.js';
import { WireConnection } from '../src/pgwire/wire.js';
import { parseConninfo } from '../src/config/conninfo.js';
import type { Tuple } from '../src/protocol/messages.js';
import { startCluster, stopAllClusters } from '../test/harness/index.js';
import { workloadRelation } from './bench-apply-workloads.js';

const ROWS = Number(process.argv[2] ?? 1_000_000);
const MAJOR = Number(process.argv[3] ?? 18);
const METHODS = (process.argv[4] ?? 'sql,values-d:128,arrays-d:128,arrays-d:1024,arrays-d:4096,arrays-text-d:1024').split(',');
/** Statements outstanding at most. */
const WINDOW = Number(process.env.PGSUB_BENCH_WINDOW ?? 8);
const CLK_TCK = 100;
const TS_BASE = 789_004_800_000_000n; // 2025-01-01 00:00:00+00, µs since 2000-01-01
const DAY = 86_400_000_000n;

const rel = workloadRelation('w3');
const ALL = [0, 1, 2, 3];

// As bench-apply-workloads.ts's rows after `SET n = n + 1, ts = ts + interval '1 day'`.
const LOAD = `INSERT INTO public.w3 SELECT i, (i % 1000)::int, substr(md5(i::text) || md5((i + 1)::text) || md5((i + 2)::text) || md5((i + 3)::text), 1, 100), timestamptz '2025-01-01 00:00:00+00' + i * interval '1 second' FROM generate_series(1, ${ROWS}) AS i`;
const md5 = (s: string) => createHash('md5').update(s).digest('hex');

function row(i: number, text: boolean): Tuple {
  if (text) {
    const payload = (md5(String(i)) + md5(String(i + 1)) + md5(String(i + 2)) + md5(String(i + 3))).slice(0, 100);
    return [
      { kind: 'text', value: String(i) },
      { kind: 'text', value: String((i % 1000) + 1) },
      { kind: 'text', value: payload },
      { kind: 'text', value: new Date(Date.UTC(2025, 0, 2) + i * 1000).toISOString() },
    ];
  }
  const id = Buffer.allocUnsafe(8);
  id.writeBigInt64BE(BigInt(i));
  const n = Buffer.allocUnsafe(4);
  n.writeInt32BE((i % 1000) + 1);
  const ts = Buffer.allocUnsafe(8);
  ts.writeBigInt64BE(TS_BASE + BigInt(i) * 1_000_000n + DAY);
  const payload = (md5(String(i)) + md5(String(i + 1)) + md5(String(i + 2)) + md5(String(i + 3))).slice(0, 100);
  return [
    { kind: 'binary', value: id },
    { kind: 'binary', value: n },
    { kind: 'binary', value: Buffer.from(payload) },
    { kind: 'binary', value: ts },
  ];
}

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

async function run(wire: WireConnection, backendPid: number, method: string): Promise<string> {
  await wire.simpleQuery(
    `DROP TABLE IF EXISTS public.w3; CREATE TABLE public.w3 (id bigint PRIMARY KEY, n integer NOT NULL, payload text NOT NULL, ts timestamptz NOT NULL); ${LOAD}; ANALYZE public.w3; CHECKPOINT`,
  );
  rel.statements.clear();
  const [how, size] = method.split(':') as [string, string | undefined];
  const batch = Number(size ?? 0);
  const via = how.split('-')[0]!;
  const detect = how.endsWith('-d') ? { originId: null, returningOld: true } : null;
  const rows = via === 'sql' ? [] : Array.from({ length: ROWS }, (_, i) => row(i + 1, how.includes('-text')));
  const lsn0 = (await wire.simpleQuery('SELECT pg_current_wal_insert_lsn() AS l')).rows[0]!.l!;
  const cpu0 = cpuTicks(backendPid);
  const me0 = process.cpuUsage();
  const t0 = performance.now();
  const window: Promise<unknown>[] = [];
  void wire.execute('BEGIN');
  if (via === 'sql') {
    window.push(wire.execute(`UPDATE public.w3 SET n = n + 1, ts = ts + interval '1 day'`));
  } else {
    for (let first = 0; first < rows.length; first += batch) {
      const tuples = rows.slice(first, first + batch);
      if (via === 'values') {
        // Power-of-two pieces, as batch.ts sends them.
        let rest = tuples;
        while (rest.length > 0) {
          let n = 1;
          while (n * 2 <= rest.length) n *= 2;
          const stmt = updateManyStatement(rel, rest.slice(0, n), ALL, detect);
          rest = rest.slice(n);
          window.push(wire.execute(stmt.text, stmt.params, stmt.paramTypes ? { paramTypes: stmt.paramTypes } : undefined));
        }
      } else {
        const stmt = updateArraysStatement(rel, tuples, ALL, detect);
        if (!stmt) throw new Error('updateArraysStatement returned null');
        window.push(wire.execute(stmt.text, stmt.params));
      }
      while (window.length > WINDOW) await window.shift();
    }
  }
  void wire.execute('COMMIT');
  await Promise.all(window.splice(0));
  await wire.sync();
  const wall = performance.now() - t0;
  const me = process.cpuUsage(me0);
  const cpu = (cpuTicks(backendPid) - cpu0) / CLK_TCK;
  const check = (
    await wire.simpleQuery(
      `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '${lsn0}') AS b, (SELECT count(*) FROM public.w3 WHERE n = (id % 1000) + 1 AND ts = timestamptz '2025-01-02 00:00:00+00' + id * interval '1 second') AS n`,
    )
  ).rows[0]!;
  if (Number(check.n) !== ROWS) throw new Error(`${method}: ${check.n} rows updated`);
  return `${method.padEnd(14)} wall ${(wall / 1000).toFixed(2).padStart(6)} s   backend CPU ${cpu.toFixed(2).padStart(6)} s   client CPU ${((me.user + me.system) / 1e6).toFixed(2).padStart(6)} s   WAL ${(Number(check.b) / 2 ** 20).toFixed(0).padStart(5)} MB`;
}

const cluster = await startCluster({ major: MAJOR, name: 'bench-update', settings: { shared_buffers: '128MB', max_wal_size: '4GB', checkpoint_timeout: '30min' } });
try {
  await cluster.createDatabase('bench');
  const wire = await WireConnection.connect(parseConninfo(cluster.url('bench'), 'target', {}), {
    applicationName: 'pgsub-bench-update',
    startupParameters: { search_path: '', session_replication_role: 'replica', synchronous_commit: 'off', datestyle: 'ISO', intervalstyle: 'postgres', extra_float_digits: '3' },
  });
  const pid = Number((await wire.simpleQuery('SELECT pg_backend_pid() AS p')).rows[0]!.p);
  await wire.simpleQuery(
    `CREATE SCHEMA pgsub; CREATE FUNCTION "pgsub"."conflict"(kind text) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = '' AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'PSC01', MESSAGE = 'pgsub conflict: ' || kind; END $$`,
  );
  console.log(`PostgreSQL ${MAJOR}, ${ROWS.toLocaleString('en')} rows updated in one transaction, backend pid ${pid}`);
  for (const round of [1, 2]) for (const m of METHODS) console.log(`round ${round}  ${await run(wire, pid, m)}`);
  await wire.close();
} finally {
  await stopAllClusters();
}
