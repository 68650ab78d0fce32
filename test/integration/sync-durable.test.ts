/**
 * synchronous_commit = off while a table catches up (issue 15.3): the positions a table
 * being synced has reached hold the feedback back, so a commit that moves one must be on
 * the target's disk before the publisher hears of it. A resync copies public.t while
 * writes go on; the copy finishes behind the stream, and the transactions it missed are
 * applied again to public.t alone. As soon as the slot has confirmed a position past the
 * one the copy recorded, pgsub is frozen (SIGSTOP) and the target crashes (immediate
 * shutdown: its unflushed WAL is lost; wal_writer_delay 10 s keeps asynchronous commits
 * unflushed meanwhile). A new pgsub must find the slot no further than the target's own
 * positions — no PGSUB_SLOT_AHEAD — and end with the target equal to the source.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, connect, lsnToBigint, slotConfirmedLsn, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const SUB = 'sdur';
const SCHEMA = `CREATE TABLE public.t (id int PRIMARY KEY, v int NOT NULL); CREATE TABLE public.u (id int PRIMARY KEY, v int NOT NULL);`;
let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'sdur-pub' }),
    startCluster({ major: 18, name: 'sdur-tgt', settings: { wal_writer_delay: '10s', wal_writer_flush_after: '1GB' } }),
  ]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  await publisher.query(`${SCHEMA} INSERT INTO public.t SELECT g, 0 FROM generate_series(1, 200000) g; CREATE PUBLICATION pub FOR TABLE public.t, public.u;`, [], 'src');
  await target.query(SCHEMA, [], 'dst');
});

after(async () => {
  for (const c of children) {
    c.kill('SIGCONT');
    c.kill('SIGKILL');
  }
  await publisher?.stop();
  await target?.stop();
});

const env = () => ({
  PGSUB_SOURCE: publisher.url('src'),
  PGSUB_TARGET: target.url('dst'),
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: SUB,
  PGSUB_SYNCHRONOUS_COMMIT: 'off',
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
});

function start(args: string[] = ['run']): PgsubProcess {
  const child = spawnPgsub(env(), args);
  children.push(child);
  return child;
}

async function tState(): Promise<{ state: string; syncLsn: bigint | null } | null> {
  const [row] = await target.query<{ state: string; lsn: string | null }>(
    `SELECT state, sync_lsn::text AS lsn FROM pgsub.subscription_rel WHERE subscription = $1 AND table_name = 't'`,
    [SUB],
    'dst',
  );
  return row ? { state: row.state, syncLsn: row.lsn ? lsnToBigint(row.lsn) : null } : null;
}

test('a target crash while a resynced table catches up with asynchronous commits: the slot is never ahead of the target', { timeout: 300_000 }, async () => {
  const first = start();
  await waitFor(async () => (await tState())?.state === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'public.t ready after the initial copy' });
  await waitForCatchUp(publisher, 'src', SUB);

  // Writes to both tables throughout the resync: those to t during its copy are what the
  // catch-up re-applies; those to u move the origin ahead of t's copy position.
  let writing = true;
  const writer = (async () => {
    const db = await connect(publisher, 'src');
    try {
      for (let i = 1; writing && i <= 20_000; i++) {
        await db.query('BEGIN');
        await db.query('UPDATE public.t SET v = v + 1 WHERE id = $1', [i]);
        await db.query('INSERT INTO public.u VALUES ($1, $1)', [i]);
        await db.query('COMMIT');
      }
    } finally {
      await db.end();
    }
  })();
  const resync = start(['resync', 'public.t']);
  assert.equal(await resync.exited, 0, resync.output());

  // The window: t catches up (state s) and the slot has confirmed past t's recorded copy position.
  let observed: { state: string; syncLsn: bigint | null; confirmed: bigint } | null = null;
  await waitFor(
    async () => {
      const s = await tState();
      if (s?.state !== 's' || s.syncLsn === null) return false;
      const confirmed = (await slotConfirmedLsn(publisher, SUB)) ?? 0n;
      if (confirmed <= s.syncLsn) return false;
      observed = { ...s, confirmed };
      return true;
    },
    { timeoutMs: 120_000, intervalMs: 5, what: 'public.t catching up with the slot confirmed past its copy position' },
  );
  first.kill('SIGSTOP');
  writing = false;
  await target.restart('immediate');
  first.kill('SIGCONT');
  first.kill('SIGKILL');
  await first.exited;
  await writer;
  assert.ok(observed, 'window observed');

  const second = start();
  await waitFor(async () => (await tState())?.state === 'r', { timeoutMs: 120_000, intervalMs: 200, what: 'public.t ready after the crash' }).catch((err) =>
    assert.fail(`${err}\n${second.output().slice(-4000)}`),
  );
  await waitForCatchUp(publisher, 'src', SUB, 120_000).catch((err) => assert.fail(`${err}\n${second.output().slice(-4000)}`));
  assert.doesNotMatch(second.output(), /PGSUB_SLOT_AHEAD/);
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.t', 'public.u']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  second.kill('SIGTERM');
  assert.equal(await second.exited, 0, second.output().slice(-2000));
});
