/**
 * `pgsub skip --lsn` as ALTER SUBSCRIPTION … SKIP (issue 16.7): after an earlier skip the
 * failing-transaction record no longer names the skipped transaction, and the finish LSN
 * of a transaction that has not failed yet — here a large streamed one, and a prepared one
 * (its prepare LSN) — is accepted and skips exactly that transaction when it arrives,
 * whether pgsub is stopped or running. An LSN the origin has passed is refused (exit 2).
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { connect, spawnPgsub, startCluster, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';
import { formatLsn, type Lsn } from '../../src/protocol/lsn.js';

const SUB = 'skips';
let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'skip-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: 'skip-tgt' }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`CREATE TABLE public.t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE public.t;`, [], 'src');
  // Rows only the target has: each remote insert of one of these ids conflicts (insert_exists, policy error).
  await target.query(`CREATE TABLE public.t (id int PRIMARY KEY, v text); INSERT INTO public.t VALUES (1, 'local'), (1000, 'local'), (9000, 'local');`, [], 'dst');
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

const env = () => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url('dst'),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: SUB,
  PGSUB_COPY_DATA: 'false',
  PGSUB_STREAMING: 'on',
  PGSUB_TWO_PHASE: 'true',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
  PGSUB_STATUS_INTERVAL: '1',
});

function run(args = ['run']): PgsubProcess {
  const child = spawnPgsub(env(), args);
  children.push(child);
  return child;
}

async function cli(args: string[]): Promise<{ code: number | string; output: string }> {
  const p = run(args);
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  return { code, output: p.output() };
}

const control = async () =>
  (await target.query(`SELECT error_lsn::text AS error_lsn, skip_lsn::text AS skip_lsn FROM pgsub.subscription WHERE subscription = $1`, [SUB], 'dst'))[0];
const ids = async () => (await target.query<{ id: number }>(`SELECT id FROM public.t ORDER BY id`, [], 'dst')).map((r) => r.id);

/**
 * The finish LSN of the next transaction in the slot (pgsub stopped): its COMMIT (or
 * PREPARE) message as pgoutput protocol 3 sends it, bytes 2-9 the commit/prepare LSN.
 */
async function nextFinishLsn(tag: 'C' | 'P'): Promise<string> {
  const rows = await publisher.query<{ data: Buffer }>(
    `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, 'proto_version', '3', 'publication_names', 'pub', 'two_phase', 'on')`,
    [SUB],
    'src',
  );
  const message = rows.map((r) => r.data).find((d) => d[0] === tag.charCodeAt(0));
  assert.ok(message, `no ${tag} message in the slot`);
  return formatLsn(message.readBigUInt64BE(2) as Lsn);
}

test('skip after an earlier skip: a streamed transaction and a prepared one that have not failed yet are skipped exactly', async () => {
  let p = run();
  await p.waitForLog('streaming started');
  // The first failure: skipped by its recorded LSN.
  await publisher.query(`INSERT INTO public.t VALUES (1, 'remote')`, [], 'src');
  await waitFor(async () => (await control())?.error_lsn != null, { timeoutMs: 30_000, what: 'the first failure recorded' });
  const first = (await control()).error_lsn as string;
  const skipped = await cli(['skip', '--lsn', first]);
  assert.equal(skipped.code, 0, skipped.output);
  await waitForCatchUp(publisher, 'src', SUB);
  assert.equal((await control()).error_lsn, null, 'the skipped failure is no longer recorded');
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0);

  // Written while pgsub is stopped: a large (streamed) transaction that will conflict on 1000.
  await publisher.query(`INSERT INTO public.t SELECT g, repeat('s', 100) FROM generate_series(1000, 3000) g`, [], 'src');
  const streamed = await nextFinishLsn('C');
  const accepted = await cli(['skip', '--lsn', streamed]);
  assert.equal(accepted.code, 0, accepted.output);
  assert.match(accepted.output, /will skip the remote transaction finishing at .* when it arrives/);
  await publisher.query(`INSERT INTO public.t VALUES (5000, 'after')`, [], 'src');
  p = run();
  await waitForCatchUp(publisher, 'src', SUB);
  assert.deepEqual(await ids(), [1, 1000, 5000, 9000]);
  assert.equal((await control()).skip_lsn, null);

  // A prepared transaction that would apply cleanly, behind an ordinary one that pgsub is
  // held on (a lock the test holds on the target): the skip reaches the running service
  // while it waits, and the prepare is skipped when it arrives.
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0);
  await publisher.query(`INSERT INTO public.t VALUES (8999, 'before')`, [], 'src');
  await publisher.query(`BEGIN; INSERT INTO public.t VALUES (9001, 'prepared'); PREPARE TRANSACTION 'skipme';`, [], 'src');
  const prepared = await nextFinishLsn('P');
  const holder = await connect(target, 'dst');
  try {
    await holder.query('BEGIN');
    await holder.query('LOCK TABLE public.t IN ACCESS EXCLUSIVE MODE');
    p = run();
    await p.waitForLog('streaming started');
    const refused = await cli(['skip', '--lsn', '0/10']);
    assert.equal(refused.code, 2, refused.output);
    assert.match(refused.output, /must be greater than the origin LSN/);
    const live = await cli(['skip', '--lsn', prepared]);
    assert.equal(live.code, 0, live.output);
    // Logged by the running service's reload: the session started with no skip set.
    await p.waitForLog('remote transaction to skip');
  } finally {
    await holder.query('COMMIT');
    await holder.end();
  }
  await publisher.query(`COMMIT PREPARED 'skipme'`, [], 'src');
  await publisher.query(`INSERT INTO public.t VALUES (9002, 'after')`, [], 'src');
  await waitForCatchUp(publisher, 'src', SUB);
  assert.deepEqual(await ids(), [1, 1000, 5000, 8999, 9000, 9002]);
  assert.equal((await target.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst'))[0].n, 0);
  assert.doesNotMatch(p.output(), /"level":50/, p.output().slice(-3000));
  const logged = await target.query(`SELECT count(*)::int AS n FROM pgsub.conflict_log WHERE subscription = $1 AND conflict_type = 'transaction_skipped'`, [SUB], 'dst');
  assert.equal(logged[0].n, 3);
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0);
});
