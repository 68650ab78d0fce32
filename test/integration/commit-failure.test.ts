/**
 * A target COMMIT that fails while commits are pipelined (issue 15.1): a deferred
 * constraint trigger, enabled ALWAYS so it fires in replica mode, raises at COMMIT for one
 * row of a backlog of one-row transactions. Nothing after the failing transaction may be
 * committed, the origin and the slot stay before it, the error is logged at error level
 * naming the transaction, and once the trigger lets the row pass, the backlog is applied
 * exactly once. Run with the defaults (grouping, batches, COPY inserts) and with the
 * fastest settings (asynchronous commit, apply lanes, no grouping). A commit sent when the
 * queue has run dry is not waited for either (apply/run/applier.ts): its failure must stop
 * the apply while it waits for the next message, and nothing sent later may commit.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, currentWalLsn, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SCHEMA = `CREATE TABLE public.acct (id int PRIMARY KEY, v int NOT NULL);`;
const TARGET_EXTRA = `
  CREATE TABLE public.fault (fail boolean NOT NULL);
  INSERT INTO public.fault VALUES (true);
  CREATE FUNCTION public.check_v() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF NEW.v < 0 AND (SELECT fail FROM public.fault) THEN RAISE EXCEPTION 'negative v for id %', NEW.id; END IF;
    RETURN NULL;
  END $$;
  CREATE CONSTRAINT TRIGGER acct_check AFTER INSERT OR UPDATE ON public.acct DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.check_v();
  ALTER TABLE public.acct ENABLE ALWAYS TRIGGER acct_check;`;

let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'cf-pub' }), startCluster({ major: 18, name: 'cf-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.acct;`, [], 'src');
  await target.query(SCHEMA + TARGET_EXTRA, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await publisher?.stop();
  await target?.stop();
});

function start(sub: string, extra: Record<string, string>): PgsubProcess {
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

async function stop(): Promise<void> {
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-2000));
  child = null;
}

const applied = async (sub: string) => Number((await target.query(`SELECT transactions_applied FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst'))[0].transactions_applied);
const originLsn = async (sub: string) => {
  const [row] = await target.query(`SELECT remote_lsn::text AS lsn FROM pgsub.origin WHERE subscription = $1`, [sub], 'dst');
  const [hi, lo] = String(row.lsn).split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
};
const count = async (where: string, base: number) => Number((await target.query(`SELECT count(*)::int AS n FROM public.acct WHERE id > $1 AND ${where}`, [base], 'dst'))[0].n);

/** `n` one-row transactions in one simple query; returns the WAL position after them. */
async function transactions(base: number, from: number, to: number, v: (i: number) => number): Promise<bigint> {
  const statements = [];
  for (let i = from; i <= to; i++) statements.push(`BEGIN; INSERT INTO public.acct VALUES (${base + i}, ${v(i)}); COMMIT;`);
  await publisher.query(statements.join('\n'), [], 'src');
  return currentWalLsn(publisher, 'src');
}

for (const [name, extra, expectLog] of [
  ['defaults', {}, 'a grouped transaction failed; re-applying one transaction at a time'],
  ['asynchronous commit and apply lanes', { PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_APPLY_WORKERS: '3' }, 'apply lanes started'],
  ['asynchronous commit, no grouping', { PGSUB_SYNCHRONOUS_COMMIT: 'off', PGSUB_GROUP_TRANSACTIONS: '1' }, null],
] as const) {
  test(`a COMMIT failing in the middle of a pipelined backlog commits nothing after it (${name})`, async () => {
    const sub = `cf_${name.replace(/[^a-z]+/g, '_')}`.slice(0, 40);
    const base = (await target.query(`SELECT coalesce(max(id), 0)::int AS m FROM public.acct`, [], 'dst'))[0].m + 10_000;
    await target.query(`UPDATE public.fault SET fail = true`, [], 'dst');
    start(sub, extra);
    await child!.waitForLog('streaming started');
    await waitForCatchUp(publisher, 'src', sub);
    await stop();
    const appliedBefore = await applied(sub);
    // 4,000 one-row transactions written while pgsub is stopped; only id 2500 has v = -1.
    const beforeBad = await transactions(base, 1, 2499, () => 1);
    const afterBad = await transactions(base, 2500, 2500, () => -1);
    await transactions(base, 2501, 4000, () => 1);
    start(sub, extra);
    await waitFor(async () => /negative v for id/.test(child!.output()), { timeoutMs: 60_000, intervalMs: 100, what: 'the commit failure' }).catch(async (err) =>
      assert.fail(`${err}: ${await count('true', base)} rows\n${child!.output().slice(-5000)}`),
    );
    // Everything before the failing transaction is applied, one by one where it must be.
    await waitFor(async () => (await count('true', base)) === 2499, { timeoutMs: 60_000, intervalMs: 100, what: 'the 2,499 transactions before the failing one' }).catch(
      async (err) => assert.fail(`${err}: ${await count('true', base)} rows, ${await count(`id > ${base + 2499}`, base)} after the failing one\n${child!.output().slice(-5000)}`),
    );
    // Let it retry a few times: nothing after the failure gets in, nothing is confirmed past it.
    await new Promise((r) => setTimeout(r, 2000));
    assert.equal(await count(`id > ${base + 2499}`, base), 0, 'rows after the failing transaction were committed');
    const origin = await originLsn(sub);
    assert.ok(origin >= beforeBad - 200n && origin < afterBad, `origin ${origin} must be before the failing transaction (${beforeBad}..${afterBad})`);
    const confirmed = (await slotConfirmedLsn(publisher, sub)) ?? 0n;
    assert.ok(confirmed < afterBad, `slot confirmed ${confirmed} past the failing transaction ending at ${afterBad}`);
    // Logged as an error that names the failing transaction.
    const failure = child!
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((r) => r.msg === 'apply failed; retrying' && /negative v for id/.test(JSON.stringify(r.err)));
    assert.ok(failure, child!.output().slice(-4000));
    assert.equal(failure.level, 50);
    if (expectLog) assert.match(child!.output(), new RegExp(`"msg":"${expectLog}"`));
    assert.ok(typeof failure.finishLsn === 'string' && typeof failure.xid === 'number', JSON.stringify(failure));
    // Fixed on the target: the retry applies the rest exactly once.
    await target.query(`UPDATE public.fault SET fail = false`, [], 'dst');
    await waitForCatchUp(publisher, 'src', sub, 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
    const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.acct']);
    assert.ok(cmp.equal, JSON.stringify(cmp));
    assert.equal((await applied(sub)) - appliedBefore, 4000);
    await stop();
  });
}

test('a COMMIT failing after the queue ran dry is seen at once; nothing sent later commits', async () => {
  const sub = 'cf_dry_queue';
  const base = (await target.query(`SELECT coalesce(max(id), 0)::int AS m FROM public.acct`, [], 'dst'))[0].m + 10_000;
  await target.query(`UPDATE public.fault SET fail = true`, [], 'dst');
  start(sub, { PGSUB_SYNCHRONOUS_COMMIT: 'off' });
  await child!.waitForLog('streaming started');
  // Caught up: each transaction arrives to an empty queue, and its commit goes out unanswered.
  const good = await transactions(base, 1, 20, () => 1);
  await waitForCatchUp(publisher, 'src', sub);
  const appliedBefore = await applied(sub);
  const bad = await transactions(base, 21, 21, () => -1);
  // Nothing arrives after it: the failure is found while the applier waits for the queue.
  await waitFor(async () => /negative v for id/.test(child!.output()), { timeoutMs: 30_000, intervalMs: 100, what: 'the commit failure' }).catch((err) =>
    assert.fail(`${err}\n${child!.output().slice(-5000)}`),
  );
  await transactions(base, 22, 60, () => 1);
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(await count(`id > ${base + 20}`, base), 0, 'rows after the failing transaction were committed');
  const origin = await originLsn(sub);
  assert.ok(origin >= good - 200n && origin < bad, `origin ${origin} must be before the failing transaction (${good}..${bad})`);
  assert.ok(((await slotConfirmedLsn(publisher, sub)) ?? 0n) < bad, 'slot confirmed past the failing transaction');
  await target.query(`UPDATE public.fault SET fail = false`, [], 'dst');
  await waitForCatchUp(publisher, 'src', sub, 120_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.acct']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  assert.equal((await applied(sub)) - appliedBefore, 40);
  assert.equal(await count('true', base), 60);
  await stop();
});
