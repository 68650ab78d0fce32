/**
 * `npm run bench:conflicts`: what conflict detection costs on a conflict-free workload.
 * The same pre-generated publisher workload — ROWS inserts, then ROWS updates, then ROWS
 * deletes, in transactions of BATCH rows — is applied by a fresh subscription in each
 * mode, and the apply rate (changes per second, from pgsub's start until its slot has
 * confirmed the workload's end) is compared:
 *   off      conflicts.detect = false: plain statements, counts checked client-side;
 *   on       detection on, target with track_commit_timestamp = off (missing rows);
 *   off+ts   detection off, target with track_commit_timestamp = on (what the setting
 *            itself costs the target, detection aside);
 *   on+orig  detection on, target with track_commit_timestamp = on (missing rows and
 *            *_origin_differs: the changed row's last writer looked up per UPDATE/DELETE).
 * Modes alternate, REPEAT rounds; the median rate per mode is printed. The workload is
 * written while the subscription is stopped, so only apply is timed. Nothing asserts
 * anything about speed.
 *
 *   npm run bench:conflicts                       # 20,000 rows, batches of 100, 3 rounds
 *   npm run bench:conflicts -- --rows 50000 --batch 1000 --repeat 5
 */
import { parseArgs } from 'node:util';
import { loadConfig } from '../src/config/config.js';
import { createLogger } from '../src/log.js';
import { startRunner } from '../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, stopAllClusters, waitFor, type Cluster } from '../test/harness/index.js';

const { values: args } = parseArgs({
  options: { rows: { type: 'string', default: '20000' }, batch: { type: 'string', default: '100' }, repeat: { type: 'string', default: '3' } },
});
const ROWS = Number(args.rows);
const BATCH = Number(args.batch);
const REPEAT = Number(args.repeat);
const DDL = 'CREATE TABLE public.bench (id int PRIMARY KEY, u int UNIQUE, v text)';

type Mode = 'off' | 'on' | 'off+ts' | 'on+orig';
const MODES: Mode[] = ['off', 'on', 'off+ts', 'on+orig'];

async function measure(pub: Cluster, target: Cluster, mode: Mode, round: number): Promise<number> {
  const db = `b_${mode.replace('+', '_')}_${round}`;
  const name = `bench_${mode.replace('+', '_')}_${round}`;
  const detect = mode === 'on' || mode === 'on+orig';
  await target.createDatabase(db);
  await target.query(DDL, [], db);
  const config = loadConfig({
    env: {},
    overrides: { subscription: name, source: pub.url('src'), target: target.url(db), publication: 'pub', copy_data: false, conflicts: { detect }, status_interval: 1 },
  });
  const log = createLogger('warn');
  let runner = startRunner(config, log);
  await waitFor(async () => (await slotConfirmedLsn(pub, name)) !== null, { timeoutMs: 60_000, what: 'slot' });
  runner.stop();
  await runner.done;
  await pub.query('TRUNCATE public.bench', [], 'src');
  for (let i = 0; i < ROWS; i += BATCH) {
    await pub.query(`INSERT INTO public.bench SELECT g, g, 'inserted' FROM generate_series(${i}, ${i + BATCH - 1}) g`, [], 'src');
  }
  for (let i = 0; i < ROWS; i += BATCH) {
    await pub.query(`UPDATE public.bench SET v = 'updated' WHERE id BETWEEN ${i} AND ${i + BATCH - 1}`, [], 'src');
  }
  for (let i = 0; i < ROWS; i += BATCH) {
    await pub.query(`DELETE FROM public.bench WHERE id BETWEEN ${i} AND ${i + BATCH - 1}`, [], 'src');
  }
  const end = await currentWalLsn(pub, 'src');
  const started = process.hrtime.bigint();
  runner = startRunner(config, log);
  await waitFor(async () => ((await slotConfirmedLsn(pub, name)) ?? 0n) >= end, { timeoutMs: 600_000, intervalMs: 20, what: 'catch-up' });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const replays = runner.counters.carefulReplays;
  runner.stop();
  await runner.done;
  await pub.query(`SELECT pg_drop_replication_slot($1)`, [name], 'src');
  if (replays !== 0) throw new Error(`${mode}: ${replays} careful replays on a conflict-free workload`);
  const left = await target.query<{ n: string }>('SELECT count(*) AS n FROM public.bench', [], db);
  if (Number(left[0]!.n) !== 0) throw new Error(`${mode}: ${left[0]!.n} rows left in the target`);
  return (3 * ROWS) / seconds;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

try {
  const [pub, plain, tracked] = await Promise.all([
    startCluster({ major: 18, name: 'bench-confl-pub' }),
    startCluster({ major: 18, name: 'bench-confl-plain', settings: { track_commit_timestamp: 'off' } }),
    startCluster({ major: 18, name: 'bench-confl-tracked', settings: { track_commit_timestamp: 'on' } }),
  ]);
  await pub.createDatabase('src');
  await pub.query(`${DDL}; CREATE PUBLICATION pub FOR TABLE public.bench`, [], 'src');
  const rates: Record<Mode, number[]> = { off: [], on: [], 'off+ts': [], 'on+orig': [] };
  for (let round = 0; round < REPEAT; round++) {
    for (const mode of MODES) {
      const rate = await measure(pub, mode.endsWith('ts') || mode.endsWith('orig') ? tracked : plain, mode, round);
      rates[mode].push(rate);
      process.stdout.write(`round ${round + 1} ${mode.padEnd(8)} ${Math.round(rate)} changes/s\n`);
    }
  }
  const base = median(rates.off);
  const baseTs = median(rates['off+ts']);
  process.stdout.write(`\n${ROWS} rows × (insert, update, delete), transactions of ${BATCH} rows, median of ${REPEAT}:\n`);
  for (const mode of MODES) {
    const m = median(rates[mode]);
    const vs = mode === 'on+orig' ? `${((m / baseTs - 1) * 100).toFixed(1).padStart(6)} % vs off+ts` : `${((m / base - 1) * 100).toFixed(1).padStart(6)} % vs off`;
    process.stdout.write(`  ${mode.padEnd(8)} ${String(Math.round(m)).padStart(8)} changes/s  ${vs}\n`);
  }
} finally {
  await stopAllClusters();
}
