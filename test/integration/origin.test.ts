/**
 * Loop safety and origin filtering, as with native subscriptions: pgsub tags what it
 * applies with a replication origin on the target session, so a bidirectional pair of
 * subscriptions with `origin: none` does not ping-pong rows, and a cascade A → B → C
 * forwards A's rows with `origin: any` but not with `origin: none`. Also logical decoding
 * messages (`messages: true`) are received and ignored by apply, and a target role that
 * may not use replication origins gets a clear startup error.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../src/config/config.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

const TABLE = 'CREATE TABLE public.notes (id int PRIMARY KEY, body text, written_on text)';

let a: Cluster;
let b: Cluster;
let c: Cluster;
const runners: Runner[] = [];

function subscribe(name: string, from: Cluster, to: Cluster, publication: string, extra: Record<string, unknown> = {}): Runner {
  const config = loadConfig({
    env: {},
    overrides: {
      subscription: name,
      source: from.url('db'),
      target: to.url('db'),
      publication,
      copy_data: false,
      status_interval: 1,
      retry_min_delay: 0.2,
      retry_max_delay: 1,
      ...extra,
    },
  });
  const runner = startRunner(config, createLogger('warn'));
  runners.push(runner);
  return runner;
}

async function caughtUp(from: Cluster, slot: string): Promise<void> {
  const end = await currentWalLsn(from, 'db');
  await waitFor(async () => ((await slotConfirmedLsn(from, slot)) ?? 0n) >= end, { timeoutMs: 30_000, intervalMs: 100, what: `${slot} to catch up` });
}

async function ids(cluster: Cluster): Promise<number[]> {
  const rows = await cluster.query<{ id: number }>('SELECT id FROM public.notes ORDER BY id', [], 'db');
  return rows.map((r) => r.id);
}

before(async () => {
  [a, b, c] = (await Promise.all([16, 18, 18].map((major, i) => startCluster({ major, name: `origin-${i}` })))) as [Cluster, Cluster, Cluster];
  for (const node of [a, b, c]) {
    await node.createDatabase('db');
    await node.query(`${TABLE}; CREATE PUBLICATION pub FOR TABLE public.notes;`, [], 'db');
  }
});

after(async () => {
  for (const r of runners) r.stop();
  await Promise.all(runners.map((r) => r.done.catch(() => undefined)));
  await Promise.all([a, b, c].map((n) => n?.stop()));
});

test('bidirectional A ⇄ B with origin none: each row once on both sides, no loop', async () => {
  const ab = subscribe('a_to_b', a, b, 'pub', { origin: 'none' });
  const ba = subscribe('b_to_a', b, a, 'pub', { origin: 'none' });
  await waitFor(async () => (await slotConfirmedLsn(a, 'a_to_b')) !== null && (await slotConfirmedLsn(b, 'b_to_a')) !== null, { timeoutMs: 30_000, what: 'both slots' });
  await a.query(`INSERT INTO public.notes VALUES (1, 'from a', 'a'), (2, 'from a', 'a')`, [], 'db');
  await b.query(`INSERT INTO public.notes VALUES (101, 'from b', 'b')`, [], 'db');
  await a.query(`UPDATE public.notes SET body = 'edited on a' WHERE id = 1`, [], 'db');
  for (let i = 0; i < 2; i++) {
    await caughtUp(a, 'a_to_b');
    await caughtUp(b, 'b_to_a');
  }
  assert.deepEqual(await ids(a), [1, 2, 101]);
  assert.deepEqual(await ids(b), [1, 2, 101]);
  const [edited] = await b.query(`SELECT body FROM public.notes WHERE id = 1`, [], 'db');
  assert.equal(edited.body, 'edited on a');
  // A loop would have hit insert_exists and stalled a subscription; both kept applying.
  assert.equal(ab.counters.transactionsApplied, 2);
  assert.equal(ba.counters.transactionsApplied, 1);
  // The target's own origin bookkeeping shows the remote commit LSN, as for a native subscription.
  const [status] = await b.query(
    `SELECT remote_lsn::text AS lsn FROM pg_replication_origin_status s JOIN pg_replication_origin o ON o.roident = s.local_id WHERE o.roname = 'pgsub_a_to_b'`,
    [],
    'db',
  );
  const [own] = await b.query(`SELECT last_commit_end_lsn::text AS lsn FROM pgsub.origin WHERE subscription = 'a_to_b'`, [], 'db');
  assert.equal(status.lsn, own.lsn);
});

test("cascade B → C: origin any forwards rows B received from A, origin none only B's own", async () => {
  subscribe('b_to_c_any', b, c, 'pub', { origin: 'any' });
  await waitFor(async () => (await slotConfirmedLsn(b, 'b_to_c_any')) !== null, { timeoutMs: 30_000, what: 'slot b_to_c_any' });
  await a.query(`INSERT INTO public.notes VALUES (3, 'from a, cascaded', 'a')`, [], 'db');
  await caughtUp(a, 'a_to_b');
  await b.query(`INSERT INTO public.notes VALUES (102, 'from b', 'b')`, [], 'db');
  await caughtUp(b, 'b_to_c_any');
  // Only changes made after the slot existed reach C (no initial copy here).
  assert.deepEqual(await ids(c), [3, 102]);

  await c.query(`TRUNCATE public.notes`, [], 'db');
  for (const r of runners.splice(2)) {
    r.stop();
    await r.done;
  }
  subscribe('b_to_c_none', b, c, 'pub', { origin: 'none' });
  await waitFor(async () => (await slotConfirmedLsn(b, 'b_to_c_none')) !== null, { timeoutMs: 30_000, what: 'slot b_to_c_none' });
  await a.query(`INSERT INTO public.notes VALUES (4, 'from a, not forwarded', 'a')`, [], 'db');
  await caughtUp(a, 'a_to_b');
  await b.query(`INSERT INTO public.notes VALUES (103, 'from b', 'b')`, [], 'db');
  await caughtUp(b, 'b_to_c_none');
  assert.deepEqual(await ids(c), [103]);
  assert.deepEqual(await ids(b), [1, 2, 3, 4, 101, 102, 103]);
});

test('logical decoding messages are received and ignored by apply', async () => {
  const runner = subscribe('a_to_c_messages', a, c, 'pub', { messages: true });
  await waitFor(async () => (await slotConfirmedLsn(a, 'a_to_c_messages')) !== null, { timeoutMs: 30_000, what: 'slot a_to_c_messages' });
  await a.query(
    `SELECT pg_logical_emit_message(false, 'app', 'outside a transaction');
     BEGIN; INSERT INTO public.notes VALUES (5, 'with a message', 'a'); SELECT pg_logical_emit_message(true, 'app', 'inside'); COMMIT;`,
    [],
    'db',
  );
  await caughtUp(a, 'a_to_c_messages');
  const rows = await c.query(`SELECT id FROM public.notes WHERE id = 5`, [], 'db');
  assert.equal(rows.length, 1);
  assert.ok(runner.counters.transactionsApplied >= 1);
});

test('a target role without replication-origin privileges gets a clear startup error', async () => {
  await c.createDatabase('lim');
  await c.query(
    `${TABLE}; CREATE ROLE limited LOGIN; GRANT ALL ON SCHEMA public TO limited; GRANT ALL ON public.notes TO limited;
     GRANT CREATE ON DATABASE lim TO limited; GRANT SET ON PARAMETER session_replication_role TO limited;`,
    [],
    'lim',
  );
  const config = loadConfig({
    env: {},
    overrides: { subscription: 'limited', source: a.url('db'), target: c.url('lim').replace('postgres@', 'limited@'), publication: 'pub', copy_data: false },
  });
  const runner = startRunner(config, createLogger('silent'));
  await assert.rejects(runner.done, (err: Error & { code?: string }) => {
    // The privilege check before the first session (migrate/privileges.ts) names the GRANT.
    assert.equal(err.code, 'PGSUB_PRIVILEGE_MISSING');
    assert.match(err.message, /GRANT EXECUTE ON FUNCTION pg_catalog\.pg_replication_origin_create\(text\)/);
    return true;
  });
});
