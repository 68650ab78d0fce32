/**
 * `npm run bench:floor`: the decoding floor of each `npm run bench` workload — how fast
 * the publisher's walsender delivers the backlog to a consumer that does nothing with it
 * (pgsub's own replication connection and CopyBoth reader, every batch dropped). No
 * subscriber can confirm a backlog sooner than this, so it is the yardstick for the apply
 * benchmark's goals (issue 27: within 1.1× the floor). `npm run bench -- --contestants
 * …,floor` measures the same floor inside the apply benchmark's rounds, on their backlogs.
 *
 *   npm run bench:floor                       # W1-W4, PostgreSQL 18, 3 reads of each backlog
 *   npm run bench:floor -- --workloads W4 --reads 5 --major 16
 *
 * One publisher (the apply benchmark's settings); the reader is scripts/bench-floor-read.ts.
 * Per workload: starting rows, one slot per read (created before the backlog), the
 * backlog, then each slot is read from start to a logical message written after the
 * backlog, with the options pgsub streams with
 * (binary; streaming on for W3, whose one transaction is streamed). Measured per read:
 * seconds from START_REPLICATION until that message arrived, and the walsender's CPU
 * seconds.
 * Prints min and median; writes bench-results/floor-<timestamp>.json.
 */
import { parseArgs } from 'node:util';
import type pg from 'pg';
import { startCluster, stopAllClusters } from '../test/harness/index.js';
import { WORKLOAD_IDS, runBacklog, workloads, type WorkloadId } from './bench-apply-workloads.js';
import { readToEndMessage } from './bench-floor-read.js';
import { benchClient, CpuSampler, formatTable, headerText, median, min, pollUntil, postmasterPid, round, writeBenchResult } from './bench-lib.js';

const { values: opts } = parseArgs({
  options: {
    workloads: { type: 'string', default: WORKLOAD_IDS.filter((w) => !w.endsWith('m')).join(',') },
    reads: { type: 'string', default: '3' },
    major: { type: 'string', default: '18' },
    help: { type: 'boolean', default: false },
  },
});
if (opts.help) {
  process.stdout.write(headerText(import.meta.url));
  process.exit(0);
}
const READS = Number(opts.reads);
const MAJOR = Number(opts.major);
const IDS = opts.workloads.split(',') as WorkloadId[];
for (const id of IDS) if (!WORKLOAD_IDS.includes(id)) throw new Error(`--workloads: unknown ${id}`);

const log = (line: string) => process.stderr.write(`[floor ${new Date().toISOString().slice(11, 19)}] ${line}\n`);
const out = (line = '') => process.stdout.write(`${line}\n`);

interface Read {
  workload: WorkloadId;
  read: number;
  seconds: number;
  walsenderCpu: number;
  batches: number;
  messages: number;
}

const started = Date.now();
const pub = await startCluster({ major: MAJOR, name: `bench-floor-pub${MAJOR}`, settings: { shared_buffers: '128MB', max_wal_size: '4GB', checkpoint_timeout: '30min' } });
const reads: Read[] = [];
try {
  await pub.createDatabase('src');
  const sessions: pg.Client[] = await Promise.all([1, 2, 3, 4].map(() => benchClient(pub.url('src'))));
  const c = sessions[0]!;
  for (const w of workloads(1).filter((x) => IDS.includes(x.id))) {
    await c.query(`ALTER SYSTEM SET logical_decoding_work_mem = '${w.decodingWorkMem}'`);
    await c.query('SELECT pg_catalog.pg_reload_conf()');
    await c.query(w.ddl);
    if (w.publisherDdl) await c.query(w.publisherDdl);
    if (w.initialRows) await c.query(w.initialRows);
    await c.query(`CREATE PUBLICATION ${w.publication} FOR TABLE ${w.tables.join(', ')}`);
    const slots = Array.from({ length: READS }, (_, i) => `floor_${w.id.toLowerCase()}_${i}`);
    for (const slot of slots) await c.query(`SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, [slot]);
    await c.query('CHECKPOINT');
    const t = performance.now();
    await runBacklog(w, sessions);
    // The end mark: a non-transactional message is sent as soon as decoding reaches it,
    // after every transaction committed before it.
    await c.query(`SELECT pg_catalog.pg_logical_emit_message(false, 'floor', 'end')`);
    log(`${w.id}: backlog generated in ${round((performance.now() - t) / 1000)} s`);
    for (const [i, slot] of slots.entries()) {
      const cpu = new CpuSampler({ publisher: postmasterPid(pub.dataDir) });
      cpu.start();
      const {
        seconds: elapsed,
        batches,
        messages,
      } = await readToEndMessage(
        pub.url('src'),
        slot,
        w.publication,
        w.modes.includes('on') ? 'on' : 'off',
        async () => (await c.query<{ pid: number | null }>('SELECT active_pid AS pid FROM pg_catalog.pg_replication_slots WHERE slot_name = $1', [slot])).rows[0]?.pid ?? null,
        (pid) => cpu.addProcess('walsender', pid, true),
      );
      const seconds = round(elapsed);
      const report = cpu.stop();
      await pollUntil(
        async () => !(await c.query<{ active: boolean }>('SELECT active FROM pg_catalog.pg_replication_slots WHERE slot_name = $1', [slot])).rows[0]!.active,
        10_000,
        20,
      );
      await c.query('SELECT pg_catalog.pg_drop_replication_slot($1)', [slot]);
      const r: Read = { workload: w.id, read: i + 1, seconds, walsenderCpu: report.groups.walsender ?? 0, batches, messages };
      reads.push(r);
      log(`  read ${i + 1}: ${seconds} s, walsender CPU ${r.walsenderCpu} s, ${messages.toLocaleString('en-US')} messages in ${batches.toLocaleString('en-US')} reads`);
    }
  }
  await Promise.all(sessions.map((s) => s.end()));
} finally {
  await stopAllClusters();
}

const rows = IDS.map((id) => {
  const rs = reads.filter((r) => r.workload === id);
  const s = rs.map((r) => r.seconds);
  const cpu = rs.map((r) => r.walsenderCpu);
  return [id, rs.length, min(s), median(s), median(cpu)];
});
out(`\nPostgreSQL ${MAJOR} publisher; seconds from START_REPLICATION until everything up to the end mark arrived, every message dropped`);
out(formatTable(['workload', 'reads', 'min s', 'median s', 'walsender CPU s (median)'], rows));
writeBenchResult('floor', started, {}, { major: MAJOR, reads }, out);
