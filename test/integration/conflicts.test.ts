/**
 * Conflicts against real PostgreSQL 18 servers: a publisher, and a target with
 * track_commit_timestamp = on whose databases were written locally before and during
 * the stream. One publisher workload provokes every PostgreSQL 18 conflict type once
 * (insert_exists, multiple_unique_conflicts, update_missing, delete_missing,
 * update_origin_differs, delete_origin_differs, update_exists); one subscription per
 * policy (skip, keep_local, apply_remote, error) applies it into its own target
 * database, plus one with disable_on_error. Checked: the resolved data, the conflict
 * log rows (type, relation, key, tuples, LSN, policy) and confl_* counters, that under
 * `error` each failing transaction is retried, logged once, and applied exactly once
 * after the operator fixes the row, that `pgsub skip --lsn` refuses a wrong LSN and
 * skips exactly the failing transaction, and that disable_on_error stops retrying until
 * `pgsub enable`. The table name carries quotes and non-ASCII letters on purpose.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { binaryValueText } from '../../src/conflict/report.js';
import { currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, stopAllClusters, waitFor, withTimeout, type Cluster } from '../harness/index.js';

const TABLE_NAME = 'Cønflict "t"';
const TABLE = `public."Cønflict ""t"""`;
const DISPLAY = `public.${TABLE_NAME}`;
const DDL = `CREATE TABLE ${TABLE} (id int PRIMARY KEY, u int UNIQUE, v text)`;

let pub: Cluster;
let tgt: Cluster;
const runners: Runner[] = [];
/** Finish LSN (commit LSN) of each workload transaction, by name. */
const lsns: Record<string, string> = {};

function subscribe(db: string, extra: Record<string, unknown> = {}): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: `sub_${db}`,
      source: pub.url('src'),
      target: tgt.url(db),
      publication: 'pub',
      copy_data: false,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      ...extra,
    },
  });
  const runner = startRunner(config, createLogger('silent'));
  runners.push(runner);
  return runner;
}

function cliEnv(db: string): Record<string, string> {
  return { PGSUB_SOURCE: pub.url('src'), PGSUB_TARGET: tgt.url(db), PGSUB_PUBLICATION: 'pub', PGSUB_SUBSCRIPTION: `sub_${db}` };
}

async function cli(db: string, args: string[]): Promise<{ code: number | string; output: string }> {
  const p = spawnPgsub(cliEnv(db), args);
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  return { code, output: p.output() };
}

async function rows(db: string): Promise<string[]> {
  const r = await tgt.query<{ r: string }>(`SELECT format('%s|%s|%s', id, u, v) AS r FROM ${TABLE} ORDER BY id`, [], db);
  return r.map((x) => x.r);
}

async function publisherRows(): Promise<string[]> {
  const r = await pub.query<{ r: string }>(`SELECT format('%s|%s|%s', id, u, v) AS r FROM ${TABLE} ORDER BY id`, [], 'src');
  return r.map((x) => x.r);
}

type LogRow = {
  conflict_type: string;
  relation: string | null;
  table_name: string | null;
  key: unknown;
  remote_tuple: unknown;
  local_tuple: unknown;
  local_origin: string | null;
  remote_lsn: string;
  remote_xid: string;
  policy: string;
  detail: string | null;
};
async function conflictLog(db: string): Promise<LogRow[]> {
  return tgt.query<LogRow>(
    'SELECT conflict_type, relation, table_name, key, remote_tuple, local_tuple, local_origin, remote_lsn::text AS remote_lsn, remote_xid::text AS remote_xid, policy, detail FROM pgsub.conflict_log ORDER BY id',
    [],
    db,
  );
}

async function stats(db: string): Promise<Record<string, number>> {
  const [row] = await tgt.query<Record<string, string>>('SELECT * FROM pgsub.subscription_stats', [], db);
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(row ?? {})) if (k.startsWith('confl_') || k === 'apply_error_count') out[k] = Number(v);
  return out;
}

async function control(db: string): Promise<{ enabled: boolean; error_lsn: string | null; error_conflict: string | null; skip_lsn: string | null }> {
  const [row] = await tgt.query('SELECT enabled, error_lsn::text AS error_lsn, error_conflict, skip_lsn::text AS skip_lsn FROM pgsub.subscription', [], db);
  return row ?? { enabled: true, error_lsn: null, error_conflict: null, skip_lsn: null };
}

async function markerApplied(db: string): Promise<boolean> {
  return (await tgt.query(`SELECT 1 FROM ${TABLE} WHERE id = 10`, [], db)).length === 1;
}

/** One publisher transaction (one DML statement); records its commit LSN, what pgsub skip takes. */
async function remote(name: string, dml: string): Promise<void> {
  const [x] = await pub.query<{ xid: string }>(`WITH w AS (${dml} RETURNING 1) SELECT pg_current_xact_id()::xid::text AS xid FROM (SELECT count(*) FROM w) c`, [], 'src');
  const [c] = await pub.query<{ lsn: string }>(
    `SELECT start_lsn::text AS lsn FROM pg_get_wal_records_info(pg_current_wal_lsn() - 1048576, pg_current_wal_lsn())
      WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $1`,
    [x!.xid],
    'src',
  );
  lsns[name] = c!.lsn;
}

const DBS = ['skip', 'keep_local', 'apply_remote', 'error', 'disable'] as const;

before(async () => {
  [pub, tgt] = await Promise.all([startCluster({ major: 18, name: 'confl-pub' }), startCluster({ major: 18, name: 'confl-tgt', settings: { track_commit_timestamp: 'on' } })]);
  await pub.createDatabase('src');
  await pub.query(
    `${DDL}; CREATE PUBLICATION pub FOR TABLE ${TABLE}; CREATE EXTENSION pg_walinspect;
    INSERT INTO ${TABLE} VALUES (4, 404, 'p4'), (5, 505, 'p5'), (6, 606, 'p6'), (7, 707, 'p7');`,
    [],
    'src',
  );
  for (const db of DBS) {
    await tgt.createDatabase(db);
    await tgt.query(DDL, [], db);
  }
  const everything = (policy: string) => ({
    conflicts: {
      tables: {
        [DISPLAY]: Object.fromEntries(
          ['insert_exists', 'update_origin_differs', 'update_exists', 'update_missing', 'delete_origin_differs', 'delete_missing', 'multiple_unique_conflicts'].map((t) => [
            t,
            policy,
          ]),
        ),
      },
    },
  });
  subscribe('skip', everything('skip'));
  subscribe('keep_local', everything('keep_local'));
  // delete_missing cannot take apply_remote (nothing to apply); the subscription default covers it.
  const applyRemote = everything('apply_remote');
  delete (applyRemote.conflicts.tables[DISPLAY] as Record<string, string>).delete_missing;
  subscribe('apply_remote', applyRemote);
  subscribe('error', everything('error'));
  subscribe('disable', { disable_on_error: true });
  await waitFor(
    async () => {
      for (const db of DBS) if ((await slotConfirmedLsn(pub, `sub_${db}`)) === null) return false;
      return true;
    },
    { timeoutMs: 60_000, what: 'all slots' },
  );
  // A row pgsub writes (origin pgsub_<sub>), then rows written locally in every target.
  await remote('T1', `INSERT INTO ${TABLE} VALUES (8, 808, 'r8')`);
  await waitFor(
    async () => {
      for (const db of DBS) if ((await tgt.query(`SELECT 1 FROM ${TABLE} WHERE id = 8`, [], db)).length === 0) return false;
      return true;
    },
    { timeoutMs: 30_000, what: 'T1 everywhere' },
  );
  for (const db of DBS) {
    await tgt.query(`INSERT INTO ${TABLE} VALUES (1, 1001, 'local'), (2, 2002, 'l2'), (3, 202, 'l3'), (6, 606, 'l6'), (7, 707, 'l7'), (9, 909, 'l9')`, [], db);
  }
  await remote('insert_exists', `INSERT INTO ${TABLE} VALUES (1, 101, 'remote')`);
  await remote('multiple_unique_conflicts', `INSERT INTO ${TABLE} VALUES (2, 202, 'remote')`);
  await remote('update_missing', `UPDATE ${TABLE} SET v = 'r4' WHERE id = 4`);
  await remote('delete_missing', `DELETE FROM ${TABLE} WHERE id = 5`);
  await remote('update_origin_differs', `UPDATE ${TABLE} SET v = 'r6' WHERE id = 6`);
  await remote('delete_origin_differs', `DELETE FROM ${TABLE} WHERE id = 7`);
  await remote('update_exists', `UPDATE ${TABLE} SET u = 909 WHERE id = 8`);
  await remote('marker', `INSERT INTO ${TABLE} VALUES (10, 1010, 'marker')`);
});

after(async () => {
  for (const r of runners) r.stop();
  await Promise.all(runners.map((r) => r.done.catch(() => undefined)));
  await stopAllClusters();
});

const TYPES_IN_ORDER = ['insert_exists', 'multiple_unique_conflicts', 'update_missing', 'delete_missing', 'update_origin_differs', 'delete_origin_differs', 'update_exists'];

describe('conflicts against PostgreSQL 18', () => {
  for (const policy of ['skip', 'keep_local'] as const) {
    test(`policy ${policy}: every type detected, logged and counted; the local rows stay`, async () => {
      await waitFor(() => markerApplied(policy), { timeoutMs: 60_000, what: `${policy}: marker` });
      assert.deepEqual(await rows(policy), ['1|1001|local', '2|2002|l2', '3|202|l3', '6|606|l6', '7|707|l7', '8|808|r8', '9|909|l9', '10|1010|marker']);
      const log = await conflictLog(policy);
      assert.deepEqual(
        log.map((l) => l.conflict_type),
        TYPES_IN_ORDER,
      );
      for (const l of log) {
        assert.equal(l.policy, policy);
        assert.equal(l.relation, DISPLAY);
        assert.equal(l.table_name, TABLE_NAME);
        assert.equal(l.remote_lsn, lsns[l.conflict_type], `${l.conflict_type}: finish LSN`);
      }
      const byType = Object.fromEntries(log.map((l) => [l.conflict_type, l]));
      assert.deepEqual(byType.insert_exists!.key, { id: '1' });
      assert.deepEqual(byType.insert_exists!.remote_tuple, { id: '1', u: '101', v: 'remote' });
      assert.deepEqual(byType.insert_exists!.local_tuple, { id: 1, u: 1001, v: 'local' });
      assert.equal(byType.insert_exists!.local_origin, '0');
      assert.deepEqual(byType.multiple_unique_conflicts!.local_tuple, [
        { id: 2, u: 2002, v: 'l2' },
        { id: 3, u: 202, v: 'l3' },
      ]);
      assert.equal(byType.update_missing!.local_tuple, null);
      assert.deepEqual(byType.update_exists!.local_tuple, { id: 9, u: 909, v: 'l9' });
      assert.deepEqual(byType.delete_origin_differs!.local_tuple, { id: 7, u: 707, v: 'l7' });
      const s = await stats(policy);
      for (const t of TYPES_IN_ORDER) assert.equal(s[`confl_${t}`], 1, `confl_${t}`);
      assert.equal(s.apply_error_count, 0);
    });
  }

  test('policy apply_remote: the remote change wins everywhere, the target ends equal to the publisher', async () => {
    await waitFor(() => markerApplied('apply_remote'), { timeoutMs: 60_000, what: 'apply_remote: marker' });
    assert.deepEqual(await rows('apply_remote'), await publisherRows());
    assert.deepEqual(await rows('apply_remote'), ['1|101|remote', '2|202|remote', '4|404|r4', '6|606|r6', '8|909|r8', '10|1010|marker']);
    const log = await conflictLog('apply_remote');
    assert.deepEqual(
      log.map((l) => `${l.conflict_type}:${l.policy}`),
      TYPES_IN_ORDER.map((t) => `${t}:${t === 'delete_missing' ? 'skip' : 'apply_remote'}`),
    );
    const s = await stats('apply_remote');
    for (const t of TYPES_IN_ORDER) assert.equal(s[`confl_${t}`], 1, `confl_${t}`);
    // After the conflicts before it on this table, update_origin_differs is resolved by the
    // UPDATE itself (update-conflicts.ts updateLoggingConflicts): its row says what the careful path's would.
    const uod = log.find((l) => l.conflict_type === 'update_origin_differs')!;
    assert.deepEqual(uod.key, { id: '6' });
    assert.deepEqual(uod.remote_tuple, { id: '6', u: '606', v: 'r6' });
    assert.deepEqual(uod.local_tuple, { id: 6, u: 606, v: 'l6' });
    assert.equal(uod.local_origin, '0');
    assert.equal(uod.remote_lsn, lsns.update_origin_differs);
    assert.ok(Number(uod.remote_xid) > 0, `remote_xid ${uod.remote_xid}`);
    assert.match(String(uod.detail), /^row last written by origin 0 at \d{4}-/);
  });

  test('policy error: each failing transaction retried and logged once; a fixed row is applied exactly once; pgsub skip --lsn for the others', async () => {
    const db = 'error';
    const failingWith = async (type: string) => {
      await waitFor(async () => (await control(db)).error_conflict === type && (await control(db)).error_lsn === lsns[type], {
        timeoutMs: 30_000,
        what: `error: ${type} recorded`,
      });
      // Retried with backoff: more errors are counted, the log keeps one row for the transaction.
      const before = (await stats(db)).apply_error_count ?? 0;
      await waitFor(async () => ((await stats(db)).apply_error_count ?? 0) > before, { timeoutMs: 10_000, what: `error: ${type} retried` });
      const logged = (await conflictLog(db)).filter((l) => l.conflict_type === type);
      assert.equal(logged.length, 1, `${type}: one log row`);
      assert.equal(logged[0]!.policy, 'error');
      assert.equal(logged[0]!.remote_lsn, lsns[type]);
      assert.ok((await stats(db))[`confl_${type}`]! >= 2, `${type}: counted per occurrence`);
    };
    const skipVia = async (type: string) => {
      const r = await cli(db, ['skip', '--lsn', lsns[type]!]);
      assert.equal(r.code, 0, r.output);
      await waitFor(async () => (await conflictLog(db)).some((l) => l.conflict_type === 'transaction_skipped' && l.remote_lsn === lsns[type]), {
        timeoutMs: 30_000,
        what: `${type} skipped`,
      });
      assert.equal((await control(db)).skip_lsn, null);
      // Its failure is no longer pending: the record is cleared with the skip (the next failure may be recorded since).
      assert.notEqual((await control(db)).error_lsn, lsns[type]);
    };

    await failingWith('insert_exists');
    assert.deepEqual(await rows(db), ['1|1001|local', '2|2002|l2', '3|202|l3', '6|606|l6', '7|707|l7', '8|808|r8', '9|909|l9']);
    // The operator fixes the target: the retried transaction applies, once.
    await tgt.query(`DELETE FROM ${TABLE} WHERE id = 1`, [], db);
    await failingWith('multiple_unique_conflicts');
    assert.deepEqual(
      (await rows(db)).filter((r) => r.startsWith('1|')),
      ['1|101|remote'],
    );
    await tgt.query(`DELETE FROM ${TABLE} WHERE id IN (2, 3)`, [], db);

    await failingWith('update_missing');
    // An LSN the origin has passed is refused; the failing transaction's is accepted and skips exactly it.
    const wrong = await cli(db, ['skip', '--lsn', '0/10']);
    assert.equal(wrong.code, 2);
    assert.match(wrong.output, /PGSUB_CONTROL_REFUSED: skip LSN 0\/10 must be greater than the origin LSN .* \(the failing remote transaction finishes at /);
    await skipVia('update_missing');
    await failingWith('delete_missing');
    await skipVia('delete_missing');
    await failingWith('update_origin_differs');
    await skipVia('update_origin_differs');
    await failingWith('delete_origin_differs');
    await skipVia('delete_origin_differs');
    await failingWith('update_exists');
    await tgt.query(`DELETE FROM ${TABLE} WHERE id = 9`, [], db);
    await waitFor(() => markerApplied(db), { timeoutMs: 30_000, what: 'error: marker' });
    assert.deepEqual(await rows(db), ['1|101|remote', '2|202|remote', '6|606|l6', '7|707|l7', '8|909|r8', '10|1010|marker']);
    const status = await cli(db, ['status', '--json']);
    const json = JSON.parse(status.output.slice(status.output.indexOf('{'))) as Record<string, unknown>;
    assert.equal(json.confl_insert_exists, (await stats(db)).confl_insert_exists);
    assert.ok((json.apply_error_count as number) >= 14);
    assert.equal(json.last_error_pending, false);
    assert.equal(json.enabled, true);
  });

  test('disable_on_error: the first apply error disables the subscription; no retries until pgsub enable', async () => {
    const db = 'disable';
    await waitFor(async () => (await control(db)).enabled === false, { timeoutMs: 30_000, what: 'disabled' });
    const c = await control(db);
    assert.equal(c.error_conflict, 'insert_exists');
    assert.equal(c.error_lsn, lsns.insert_exists);
    await new Promise((r) => setTimeout(r, 3000));
    assert.equal((await stats(db)).apply_error_count, 1, 'no retry while disabled');
    const status = await cli(db, ['status', '--json']);
    const json = JSON.parse(status.output.slice(status.output.indexOf('{'))) as Record<string, unknown>;
    assert.equal(json.enabled, false);
    assert.equal(json.last_error_lsn, lsns.insert_exists);
    await tgt.query(`DELETE FROM ${TABLE} WHERE id = 1`, [], db);
    const r = await cli(db, ['enable']);
    assert.equal(r.code, 0, r.output);
    assert.match(r.output, /enabled/);
    // Resumed: the fixed transaction applies; the next one (native default: error) disables it again.
    await waitFor(async () => (await rows(db)).includes('1|101|remote'), { timeoutMs: 30_000, what: 'applied after enable' });
    await waitFor(async () => (await control(db)).enabled === false && (await control(db)).error_conflict === 'multiple_unique_conflicts', {
      timeoutMs: 30_000,
      what: 'disabled again',
    });
    assert.equal((await stats(db)).apply_error_count, 2);
  });

  test('a conflict-free stream keeps the fast path: no careful replay', async () => {
    const caughtUp = async (slot: string) => {
      const end = await currentWalLsn(pub, 'src');
      await waitFor(async () => ((await slotConfirmedLsn(pub, slot)) ?? 0n) >= end, { timeoutMs: 30_000, what: `${slot} caught up` });
    };
    const runner = runners[2]!; // apply_remote
    const replays = runner.counters.carefulReplays;
    await pub.query(`INSERT INTO ${TABLE} SELECT g, g + 10000, 'bulk' FROM generate_series(100, 199) g`, [], 'src');
    await pub.query(`UPDATE ${TABLE} SET v = 'bulk2' WHERE id BETWEEN 100 AND 199`, [], 'src');
    await pub.query(`DELETE FROM ${TABLE} WHERE id BETWEEN 100 AND 149`, [], 'src');
    await caughtUp('sub_apply_remote');
    assert.equal(runner.counters.carefulReplays, replays);
    assert.deepEqual(await rows('apply_remote'), await publisherRows());
  });
});

test('binary = true: conflict log values of common built-in types read as PostgreSQL prints them, others as \\x hex', async () => {
  // Each value's binary form (typsend) and its text (the type's output function), from the server itself.
  const values = await pub.query<{ oid: number; send: Buffer; text: string }>(
    `SELECT oid::int AS oid, send, text FROM (VALUES
       (16::oid, boolsend(true), format('%s', true)), (16, boolsend(false), format('%s', false)),
       (21, int2send((-32768)::int2), format('%s', (-32768)::int2)),
       (23, int4send(404999), format('%s', 404999)), (23, int4send(-1), format('%s', -1)),
       (20, int8send(-9223372036854775808), format('%s', -9223372036854775808)),
       (26, oidsend(4294967295::oid), format('%s', 4294967295::oid)),
       (25, textsend('Cønflict "t" ✓'), format('%s', 'Cønflict "t" ✓'::text)),
       (1043, varcharsend('v'::varchar), format('%s', 'v'::varchar)),
       (1042, bpcharsend('ab'::char(4)), format('%s', 'ab'::char(4))),
       (19, namesend('nm'::name), format('%s', 'nm'::name)),
       (2950, uuid_send('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'), format('%s', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid)),
       (1700, numeric_send(1.5), '\\x' || encode(numeric_send(1.5), 'hex'))
     ) v(oid, send, text)`,
    [],
    'postgres',
  );
  assert.equal(values.length, 13);
  for (const v of values) assert.equal(binaryValueText(v.oid, v.send), v.text, `type ${v.oid}`);
  // A value of the wrong length for its type is not misread.
  assert.equal(binaryValueText(23, Buffer.from([1, 2])), '\\x0102');
});
