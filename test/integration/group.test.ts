/**
 * Grouping while behind: a backlog of small source transactions is applied in far fewer
 * target transactions (counted by the target's pg_stat_database), each committing at a
 * source commit boundary with the origin at the last one; pgsub.origin still counts every
 * source transaction, and the target equals the source. With group_transactions = 1 every
 * source transaction is a target transaction of its own. A conflict inside a group is
 * resolved inside it (under the `error` policy: the transactions before it commit, the
 * conflicting one fails alone, no retry one by one); any other failure inside a group
 * rolls back the whole group and retries one by one; after the fix the backlog is applied
 * exactly once either way.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, connect, lsnToBigint, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `CREATE TABLE public.acct (id int PRIMARY KEY, balance bigint NOT NULL);`;
let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'grp-pub' }), startCluster({ major: 18, name: 'grp-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.acct;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, extra: Record<string, string> = {}): PgsubProcess {
  child = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    ...extra,
  });
  return child;
}

let lastOutput = '';
async function stop(): Promise<void> {
  lastOutput = child!.output();
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-2000));
  child = null;
}

const caughtUp = (sub: string) => waitForCatchUp(publisher, 'src', sub, 120_000);

/** A backlog of `n` one-row transactions, written while pgsub is stopped. */
async function backlog(firstId: number, n: number): Promise<void> {
  const statements = [];
  // One simple query is one implicit transaction unless it says BEGIN/COMMIT itself.
  for (let i = 0; i < n; i++) statements.push(`BEGIN; INSERT INTO public.acct VALUES (${firstId + i}, ${i}); COMMIT;`);
  await publisher.query(statements.join('\n'), [], 'src');
}

/**
 * Target transactions that wrote the origin row: every commit of applied changes does, in
 * the same transaction. (pg_stat_database's xact_commit also counts each autocommit
 * statement, e.g. the flush tracker's reads every 50 ms, so it grows with the time a slow
 * machine takes to catch up.) A backend's counts reach the statistics when it exits.
 */
const targetCommits = async () =>
  Number((await target.query(`SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'pgsub' AND relname = 'origin'`, [], 'dst'))[0].n_tup_upd);
const applied = async (sub: string) => Number((await target.query(`SELECT transactions_applied FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst'))[0].transactions_applied);

async function equal(): Promise<void> {
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.acct']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
}

async function measure(sub: string, firstId: number, extra: Record<string, string>): Promise<{ commits: number; applied: number }> {
  start(sub, extra);
  await child!.waitForLog('streaming started');
  await caughtUp(sub);
  await stop();
  await backlog(firstId, 2000);
  const commitsBefore = await targetCommits();
  const appliedBefore = await applied(sub);
  start(sub, extra);
  await caughtUp(sub);
  // A busy backend reports its statistics late; one that exits reports them at once.
  await stop();
  await new Promise((r) => setTimeout(r, 500));
  return { commits: (await targetCommits()) - commitsBefore, applied: (await applied(sub)) - appliedBefore };
}

test('a backlog of 2,000 one-row transactions is applied in grouped target transactions, counted one by one', async () => {
  const grouped = await measure('grp', 1, {});
  await equal();
  assert.equal(grouped.applied, 2000);
  assert.ok(grouped.commits < 400, `target commits while grouping: ${grouped.commits}`);
});

test('group_transactions = 1: one target transaction per source transaction', async () => {
  const single = await measure('single', 100_001, { PGSUB_GROUP_TRANSACTIONS: '1' });
  await equal();
  assert.equal(single.applied, 2000);
  assert.ok(single.commits >= 2000, `target commits without grouping: ${single.commits}`);
});

test('a conflict inside a group under the error policy: the transactions before it commit, no retry one by one; after the fix the backlog is applied exactly once', async () => {
  // The target already holds id 300500: the 500th transaction of the backlog meets insert_exists (native default: error).
  await target.query(`INSERT INTO public.acct VALUES (300500, -1)`, [], 'dst');
  start('grp3');
  await child!.waitForLog('streaming started');
  await caughtUp('grp3').catch(() => undefined);
  const appliedBefore = await applied('grp3');
  await stop().catch(() => undefined);
  await backlog(300_001, 1000);
  start('grp3');
  // Named in this session, by the careful replay of the conflicting transaction inside its group.
  await waitFor(async () => (await target.query(`SELECT 1 FROM pgsub.conflict_log WHERE subscription = 'grp3' AND conflict_type = 'insert_exists'`, [], 'dst')).length > 0, {
    timeoutMs: 60_000,
    intervalMs: 100,
    what: 'the conflict log row',
  });
  const [logged] = await target.query(`SELECT key::text AS key FROM pgsub.conflict_log WHERE subscription = 'grp3' AND conflict_type = 'insert_exists'`, [], 'dst');
  assert.match(logged.key, /300500/);
  // What came before it in the group committed; nothing after it did.
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM public.acct WHERE id BETWEEN 300001 AND 300499`, [], 'dst'))[0].n === 499, {
    timeoutMs: 30_000,
    what: 'the 499 transactions before the conflicting one',
  });
  const [{ n }] = await target.query(`SELECT count(*)::int AS n FROM public.acct WHERE id > 300500 AND id <= 301000`, [], 'dst');
  assert.equal(n, 0);
  await waitFor(() => /conflict=insert_exists/.test(child!.output()), { timeoutMs: 10_000, what: 'the apply error' });
  assert.doesNotMatch(child!.output(), /a grouped transaction failed; re-applying one transaction at a time/);
  await target.query(`DELETE FROM public.acct WHERE id = 300500`, [], 'dst');
  await caughtUp('grp3').catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await equal();
  assert.equal((await applied('grp3')) - appliedBefore, 1000);
  await stop();
});

test('a failure inside a group that is no conflict rolls the group back and retries one by one; after the fix the backlog is applied exactly once', async () => {
  // A target-only CHECK fails the 300th transaction of the backlog (23514: nothing the careful path resolves).
  await target.query(`ALTER TABLE public.acct ADD CONSTRAINT not_400300 CHECK (id <> 400300) NOT VALID`, [], 'dst');
  start('grp4');
  await child!.waitForLog('streaming started');
  await caughtUp('grp4').catch(() => undefined);
  const appliedBefore = await applied('grp4');
  await stop().catch(() => undefined);
  await backlog(400_001, 1000);
  start('grp4');
  await waitFor(async () => /violates check constraint/.test(child!.output()), { timeoutMs: 60_000, intervalMs: 100, what: 'the check violation' });
  const [{ n }] = await target.query(`SELECT count(*)::int AS n FROM public.acct WHERE id > 400300 AND id <= 401000`, [], 'dst');
  assert.equal(n, 0);
  await waitFor(() => /a grouped transaction failed; re-applying one transaction at a time/.test(child!.output()), { timeoutMs: 10_000, what: 'the retry one by one' });
  // One by one, everything before the failing transaction commits.
  await waitFor(async () => (await target.query(`SELECT count(*)::int AS n FROM public.acct WHERE id BETWEEN 400001 AND 400299`, [], 'dst'))[0].n === 299, {
    timeoutMs: 30_000,
    what: 'the 299 transactions before the failing one',
  });
  await target.query(`ALTER TABLE public.acct DROP CONSTRAINT not_400300`, [], 'dst');
  await caughtUp('grp4').catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  await equal();
  assert.equal((await applied('grp4')) - appliedBefore, 1000);
  await stop();
});

for (const [name, extra, check] of [
  // Batches on (default): the 400 updates of the row coalesce in the pending UPDATE batch, so
  // groups stay long (up to group_transactions) and the row gets one version per group.
  ['hot row updates coalesce inside a batch: few commits; the row ends right', {}, (commits: number) => commits <= 10] as const,
  // Without batches each update is a statement: a group ends after 8 updates of the row (400 / 8).
  ['without batches a hot row ends a group after 8 updates of it; the row ends right', { PGSUB_BATCH_ROWS: '1' }, (commits: number) => commits >= 50 && commits <= 60] as const,
]) {
  test(name, async () => {
    const sub = `hot${Object.keys(extra).length}`;
    start(sub, extra);
    await child!.waitForLog('streaming started');
    await publisher.query(`INSERT INTO public.acct VALUES (900000, 0) ON CONFLICT (id) DO UPDATE SET balance = 0`, [], 'src');
    await caughtUp(sub);
    await stop();
    const statements = [];
    for (let i = 0; i < 399; i++) statements.push(`BEGIN; UPDATE public.acct SET balance = balance + 1 WHERE id = 900000; COMMIT;`);
    await publisher.query(statements.join('\n'), [], 'src');
    // Where the 400th transaction starts: the walsender passes it once it has sent the 399 before.
    const [{ lsn }] = await publisher.query(`SELECT pg_current_wal_insert_lsn()::text AS lsn`, [], 'src');
    const end = lsnToBigint(lsn);
    await publisher.query(`UPDATE public.acct SET balance = balance + 1 WHERE id = 900000`, [], 'src');
    // Backends of the processes stopped before report their statistics as they exit.
    await new Promise((r) => setTimeout(r, 1000));
    const commitsBefore = await targetCommits();
    // Groups end where the queue runs dry, which on a slow machine depends on how fast the
    // walsender decodes. So the row is locked on the target until the whole backlog was sent:
    // pgsub's first write waits while its reader queues the rest, and what follows is grouped
    // by the rules under test alone (group_transactions, the hot-row cap), not by timing.
    const holder = await connect(target, 'dst');
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM public.acct WHERE id = 900000 FOR UPDATE');
      start(sub, extra);
      await waitFor(async () => (await sentLsn(sub)) >= end, { timeoutMs: 60_000, intervalMs: 50, what: 'the backlog sent to pgsub' });
      // What the walsender sent is read from the socket at once: the applier waits on the lock, not the reader.
      await new Promise((r) => setTimeout(r, 300));
      await holder.query('COMMIT');
    } finally {
      await holder.end();
    }
    await caughtUp(sub);
    await stop();
    await new Promise((r) => setTimeout(r, 500));
    const commits = (await targetCommits()) - commitsBefore;
    assert.ok(check(commits), `target commits: ${commits}\n${lastOutput.slice(-6000)}`);
    const [row] = await target.query(`SELECT balance::int AS b FROM public.acct WHERE id = 900000`, [], 'dst');
    assert.equal(row.b, 400);
  });
}

/** What the publisher's walsender has sent on the slot's connection. */
async function sentLsn(slot: string): Promise<bigint> {
  const rows = await publisher.query<{ lsn: string | null }>(
    `SELECT r.sent_lsn::text AS lsn FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1`,
    [slot],
  );
  return rows[0]?.lsn ? lsnToBigint(rows[0].lsn) : 0n;
}
