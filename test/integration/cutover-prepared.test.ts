/**
 * A cutover with a transaction prepared on the source before the fence and committed
 * after it (as an XA transaction manager does), under a writer: the cutover waits for it
 * after the fence, before it reads the fence LSN, so its row reaches the target — with
 * two_phase off (PostgreSQL 14 → 18: the transaction is decoded at COMMIT PREPARED) and on
 * (16 → 18: pgsub prepares it on the target too, and the cutover waits until that is
 * resolved). One left pending fails the cutover after --prepared-timeout naming its gid,
 * with the fence lifted; `--refuse-prepared` refuses before the fence (exit 2). The write
 * downtime of the cutover with the prepared transaction pending is printed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { loadConfig, type Config } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { CutoverError } from '../../src/errors.js';
import { runCutover, type CutoverOptions } from '../../src/cli/cutover.js';
import { compareTables, spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `CREATE TABLE t (id bigserial PRIMARY KEY, who text NOT NULL, at timestamptz NOT NULL DEFAULT now())`;
const log = createLogger('warn', process.stderr as never);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-cut-prep-'));
const children: PgsubProcess[] = [];
let src14: Cluster;
let src16: Cluster;
let target: Cluster;

const options = (o: Partial<CutoverOptions> = {}): CutoverOptions => ({
  fence: 'read-only',
  maxLagBytes: 16 * 1024 * 1024,
  lagTimeoutMs: 30_000,
  applyTimeoutMs: 30_000,
  reverse: false,
  reverseConfigFile: null,
  ...o,
});

interface Pair {
  source: Cluster;
  db: string;
  config: Config;
  env: Record<string, string>;
  service: PgsubProcess;
}

async function startPair(source: Cluster, db: string, twoPhase: boolean): Promise<Pair> {
  await Promise.all([source.createDatabase(db), target.createDatabase(db)]);
  await source.query(`${SCHEMA}; CREATE PUBLICATION pub FOR TABLE t`, [], db);
  await target.query(SCHEMA, [], db);
  const env = {
    PGSUB_SOURCE: source.url(db),
    PGSUB_TARGET: target.url(db),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: db,
    PGSUB_COPY_DATA: 'false',
    PGSUB_TWO_PHASE: String(twoPhase),
    PGSUB_STATE_DIR: path.join(tmp, db),
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
  };
  const service = spawnPgsub(env);
  children.push(service);
  await service.waitForLog('streaming started', 60_000);
  return { source, db, config: loadConfig({ env }), env, service };
}

/** A writer opening a new session per insert, as an application behind a pooler; counts writes refused read-only. */
function startWriter(source: Cluster, db: string) {
  let stopped = false;
  let readOnly = 0;
  let written = 0;
  const loop = (async () => {
    while (!stopped) {
      const c = new pg.Client({ connectionString: source.url(db) });
      c.on('error', () => {});
      try {
        await c.connect();
        await c.query(`INSERT INTO t (who) VALUES ('writer')`);
        written++;
      } catch (err) {
        if ((err as { code?: string }).code === '25006') readOnly++;
      } finally {
        await c.end().catch(() => {});
      }
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
      return { readOnly, written };
    },
  };
}

async function prepare(source: Cluster, db: string, gid: string): Promise<void> {
  const c = new pg.Client({ connectionString: source.url(db) });
  await c.connect();
  try {
    await c.query(`BEGIN; INSERT INTO t (who) VALUES ($$prepared ${gid}$$)`);
    await c.query(`PREPARE TRANSACTION '${gid}'`);
  } finally {
    await c.end();
  }
}

/** COMMIT PREPARED from a new session: after the fence, a read-only one, which PostgreSQL lets finish it. */
async function finish(source: Cluster, db: string, gid: string, how: 'COMMIT' | 'ROLLBACK'): Promise<void> {
  const c = new pg.Client({ connectionString: source.url(db) });
  await c.connect();
  try {
    await c.query(`${how} PREPARED '${gid}'`);
  } finally {
    await c.end();
  }
}

const settingCount = async (source: Cluster, db: string) =>
  (await source.query<{ n: string }>(`SELECT count(*)::text AS n FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1`, [db]))[0]!.n;

before(async () => {
  [src14, src16, target] = await Promise.all([
    startCluster({ major: 14, name: 'cutprep-src14' }),
    startCluster({ major: 16, name: 'cutprep-src16' }),
    startCluster({ major: 18, name: 'cutprep-tgt18' }),
  ]);
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await stopAllClusters();
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe('a cutover with a transaction prepared before the fence', () => {
  test('two_phase off (14 → 18): one left pending fails after --prepared-timeout, --refuse-prepared refuses, one committed after the fence reaches the target', async () => {
    const pair = await startPair(src14, 'off', false);
    await prepare(src14, 'off', 'xa-stuck');
    await assert.rejects(
      runCutover([pair.config], options({ refusePrepared: true }), () => {}, log),
      (err: unknown) => {
        assert.ok(err instanceof CutoverError && err.code === 'PGSUB_CUTOVER_REFUSED' && err.exitCode === 2, String(err));
        assert.match(err.message, /--refuse-prepared: .*gid "xa-stuck" owner postgres age \d+ s/);
        return true;
      },
    );
    assert.equal(await settingCount(src14, 'off'), '0', 'refused before the fence');
    const shown: string[] = [];
    await assert.rejects(
      runCutover([pair.config], options({ preparedTimeoutMs: 1500 }), (l) => shown.push(l), log),
      (err: unknown) => {
        assert.ok(err instanceof CutoverError && err.code === 'PGSUB_CUTOVER_FAILED' && err.exitCode === 1, String(err));
        assert.match(err.message, /1 prepared transaction\(s\) on the source still pending after 1.5 s: gid "xa-stuck"/);
        assert.match(err.message, /fence lifted on database off \(default_transaction_read_only not set, read back\)/);
        return true;
      },
    );
    assert.ok(
      shown.some((l) => /prepared +waiting for 1: gid "xa-stuck"/.test(l)),
      shown.join('\n'),
    );
    assert.equal(await settingCount(src14, 'off'), '0', 'the fence lifted');
    await finish(src14, 'off', 'xa-stuck', 'ROLLBACK');

    const writer = startWriter(src14, 'off');
    await new Promise((r) => setTimeout(r, 500));
    await prepare(src14, 'off', 'xa-1');
    let committed = false;
    const report = await runCutover(
      [pair.config],
      options(),
      (line) => {
        console.log(line);
        if (!committed && /prepared +waiting for 1: gid "xa-1"/.test(line)) {
          committed = true;
          void finish(src14, 'off', 'xa-1', 'COMMIT');
        }
      },
      log,
    );
    const seen = await writer.stop();
    console.log(
      `write downtime of a PostgreSQL 14 → 18 cutover under a writer with a prepared transaction pending: ${report.write_downtime_ms} ms (steps ${report.steps.map((s) => `${s.step} ${s.ms} ms`).join(', ')}); writer: ${seen.written} writes, ${seen.readOnly} refused read-only`,
    );
    assert.ok(committed);
    assert.equal(report.prepared_waited, 1);
    assert.ok(seen.written > 0 && seen.readOnly > 0, JSON.stringify(seen));
    const [row] = await target.query<{ n: string }>(`SELECT count(*)::text AS n FROM t WHERE who = 'prepared xa-1'`, [], 'off');
    assert.equal(row!.n, '1', 'the transaction prepared before the fence and committed after it is on the target');
    const cmp = await compareTables(src14, 'off', target, 'off', ['public.t']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    assert.equal(await withTimeout(pair.service.exited, 30_000, 'the forward service to end'), 5);
  });

  test('two_phase on (16 → 18): the transaction prepared on the target too is committed there before the cutover is done', async () => {
    const pair = await startPair(src16, 'on', true);
    const writer = startWriter(src16, 'on');
    await new Promise((r) => setTimeout(r, 500));
    await prepare(src16, 'on', 'xa-2');
    // pgsub prepared it on the target as well: it holds its row there until COMMIT PREPARED arrives.
    await waitFor(async () => (await target.query(`SELECT 1 FROM pg_prepared_xacts WHERE gid LIKE 'pgsub_on_%'`, [], 'on')).length === 1, {
      timeoutMs: 30_000,
      intervalMs: 100,
      what: 'the transaction prepared on the target by pgsub',
    });
    let committed = false;
    const report = await runCutover(
      [pair.config],
      options({ keepSlot: true }),
      (line) => {
        if (!committed && /prepared +waiting for 1: gid "xa-2"/.test(line)) {
          committed = true;
          void finish(src16, 'on', 'xa-2', 'COMMIT');
        }
      },
      log,
    );
    await writer.stop();
    assert.equal(report.prepared_waited, 1);
    assert.equal((await target.query(`SELECT 1 FROM pg_prepared_xacts`, [], 'on')).length, 0, 'nothing left prepared on the new primary');
    const [row] = await target.query<{ n: string }>(`SELECT count(*)::text AS n FROM t WHERE who = 'prepared xa-2'`, [], 'on');
    assert.equal(row!.n, '1');
    const cmp = await compareTables(src16, 'on', target, 'on', ['public.t']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    // --keep-slot: the forward slot stays, and status shows it beside the cutover, with the WAL it pins.
    assert.deepEqual(report.slots, ['slot on kept (--keep-slot): it retains WAL on the old primary until dropped; pgsub status shows how much']);
    assert.equal(await withTimeout(pair.service.exited, 30_000, 'the forward service to end'), 5);
    const status = spawnPgsub(pair.env, ['status', '--json']);
    let stdout = '';
    status.child.stdout!.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
    assert.equal(await withTimeout(status.exited, 60_000, 'pgsub status'), 0, status.output());
    const st = JSON.parse(stdout) as { cut_over_lsn: string | null; slot_exists: boolean; slot_active: boolean; slot_retained_wal_bytes: number | null };
    assert.equal(st.cut_over_lsn, report.fence_lsn);
    assert.equal(st.slot_exists, true);
    assert.equal(st.slot_active, false);
    assert.ok(st.slot_retained_wal_bytes !== null && st.slot_retained_wal_bytes > 0, stdout);
  });
});
