/**
 * `npm run bench:verify`: how long `pgsub verify` takes on a pgbench_accounts-like table,
 * against a plain full-table `SELECT md5(string_agg(t::text, ',' ORDER BY aid))` on both
 * sides (in parallel, as verify reads both sides), in the same run on the same servers; and
 * the apply pause the service reports for the verify's snapshot (docs/verify.md).
 *
 *   npm run bench:verify                              # 2,000,000 rows
 *   npm run bench:verify -- --rows 100000             # a smoke run
 *   npm run bench:verify -- --parallel 4 --tps 200    # verify's connection pairs; writer rate
 *
 * Servers: a PostgreSQL 18 publisher and target (throw-away clusters from test/harness). The
 * table is filled on the publisher, copied by `pgsub run`, and a writer keeps updating random
 * rows at --tps transactions per second during the measurements (0: none), so verify runs
 * under writes as it would in a migration. Each measurement runs --reps times (default 1);
 * the result is a table on stdout and bench-results/verify-<timestamp>.json. Nothing is
 * asserted about speed; a verify that does not report equal aborts the run.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { startCluster, stopAllClusters } from '../test/harness/index.js';
import { formatTable, median, pollUntil, REPO_ROOT, round, writeBenchResult } from './bench-lib.js';

const { values: args } = parseArgs({
  options: {
    rows: { type: 'string', default: '2000000' },
    parallel: { type: 'string', default: '2' },
    tps: { type: 'string', default: '100' },
    reps: { type: 'string', default: '1' },
  },
});
const rows = Number(args.rows);
const parallel = Number(args.parallel);
const tps = Number(args.tps);
const reps = Number(args.reps);
const started = Date.now();
const say = (line: string) => process.stdout.write(`${line}\n`);

const DDL = `CREATE TABLE public.pgbench_accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84));`;

async function client(url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, application_name: 'bench-verify' });
  await c.connect();
  return c;
}

function pgsub(env: Record<string, string>, args: string[]): { done: Promise<{ code: number | null; stdout: string; output: string }>; kill(): void } {
  const child = spawn(process.execPath, [path.join(REPO_ROOT, 'bin', 'pgsub.js'), ...args], {
    cwd: REPO_ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let output = '';
  child.stdout.on('data', (c: Buffer) => {
    stdout += c;
    output += c;
  });
  child.stderr.on('data', (c: Buffer) => (output += c));
  return { done: new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout, output }))), kill: () => child.kill('SIGTERM') };
}

async function main(): Promise<void> {
  say(`bench:verify: ${rows.toLocaleString('en-US')} rows, verify --parallel ${parallel}, writer ${tps} tps, ${reps} repetition(s)`);
  const [source, target] = await Promise.all([startCluster({ major: 18, name: 'bv-src' }), startCluster({ major: 18, name: 'bv-tgt' })]);
  await Promise.all([source.createDatabase('bench'), target.createDatabase('bench')]);
  await source.query(
    `${DDL} INSERT INTO public.pgbench_accounts SELECT g, 1 + (g - 1) / 100000, 0, '' FROM generate_series(1, ${rows}) g; CREATE PUBLICATION pub FOR TABLE public.pgbench_accounts; CHECKPOINT;`,
    [],
    'bench',
  );
  await target.query(DDL, [], 'bench');
  const env = {
    PGSUB_SOURCE: source.url('bench'),
    PGSUB_TARGET: target.url('bench'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'bv',
    PGSUB_LOG_LEVEL: 'warn',
  };
  const service = pgsub({ ...env, PGSUB_LOG_LEVEL: process.env.BENCH_SERVICE_LOG ?? 'warn' }, ['run']);
  const tgt = await client(target.url('bench'));
  await pollUntil(
    async () => {
      const r = await tgt.query(`SELECT bool_and(state = 'r') AS ok FROM pgsub.subscription_rel WHERE subscription = 'bv'`).catch(() => ({ rows: [{ ok: false }] }));
      return r.rows[0]?.ok === true;
    },
    3_600_000,
    500,
  );
  say(`copied in ${round((Date.now() - started) / 1000, 1)} s (setup included)`);

  // The writer: updates of random rows, as pgbench's accounts updates.
  let writing = tps > 0;
  const writer = (async () => {
    if (!writing) return 0;
    const c = await client(source.url('bench'));
    let n = 0;
    while (writing) {
      await c.query('UPDATE public.pgbench_accounts SET abalance = abalance + 1 WHERE aid = $1', [1 + Math.floor(Math.random() * rows)]);
      n++;
      await new Promise((r) => setTimeout(r, 1000 / tps));
    }
    await c.end();
    return n;
  })();

  const plain: number[] = [];
  const verifies: { seconds: number; elapsedSeconds: number; pauseMs: number; slotMs: number; handshakeMs: number; rows: number }[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const t0 = performance.now();
    const md5 = async (url: string) => {
      const c = await client(url);
      try {
        return (await c.query(`SELECT md5(string_agg(t::text, ',' ORDER BY aid)) AS h FROM public.pgbench_accounts t`)).rows[0].h as string;
      } finally {
        await c.end();
      }
    };
    await Promise.all([md5(source.url('bench')), md5(target.url('bench'))]);
    plain.push((performance.now() - t0) / 1000);
    const t1 = performance.now();
    const v = await pgsub(env, ['verify', '--json', '--parallel', String(parallel)]).done;
    const seconds = (performance.now() - t1) / 1000;
    if (v.code !== 0) throw new Error(`pgsub verify exited ${v.code}:\n${v.output.slice(-4000)}`);
    const result = JSON.parse(v.stdout) as { pauseMs: number; handshakeMs: number; handshakeSteps: { slotMs: number }; rows: number; elapsedMs: number };
    verifies.push({
      seconds,
      elapsedSeconds: result.elapsedMs / 1000,
      pauseMs: result.pauseMs,
      slotMs: result.handshakeSteps.slotMs,
      handshakeMs: result.handshakeMs,
      rows: result.rows,
    });
    say(
      `rep ${rep + 1}: plain md5 both sides ${round(plain[rep]!, 2)} s; verify ${round(seconds, 2)} s as a command, ${round(result.elapsedMs / 1000, 2)} s inside (apply pause ${result.pauseMs} ms, slot ${result.handshakeSteps.slotMs} ms)`,
    );
  }
  writing = false;
  const writes = await writer;
  service.kill();
  const serviceRun = await service.done;
  if (process.env.BENCH_SERVICE_LOG) for (const line of serviceRun.output.split('\n')) if (line.includes('verify')) say(line);
  await tgt.end();
  await stopAllClusters();
  say('');
  say(
    formatTable(
      ['rows', 'plain md5(string_agg) both sides, s', 'pgsub verify, s', 'verify inside, s', 'apply pause, ms', 'slot creation, ms'],
      [
        [
          rows,
          round(median(plain), 2),
          round(median(verifies.map((v) => v.seconds)), 2),
          round(median(verifies.map((v) => v.elapsedSeconds)), 2),
          round(median(verifies.map((v) => v.pauseMs)), 1),
          round(median(verifies.map((v) => v.slotMs)), 1),
        ],
      ],
    ),
  );
  writeBenchResult('verify', started, {}, { rows, parallel, tps, writes, plainSeconds: plain, verifies }, say);
}

main().catch(async (err) => {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  await stopAllClusters().catch(() => {});
  process.exitCode = 1;
});
