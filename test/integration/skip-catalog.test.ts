/**
 * `pgsub skip` keeps the catalog (PostgreSQL 18 → 18, streaming = on, two_phase, binary): a
 * skipped transaction that carried the first Relation (and Type) message of its table in
 * the walsender session — a large streamed one, a prepared one, a plain one — still teaches
 * pgsub that relation, so the next transaction on the table, for which the publisher sends
 * no Relation again, replicates. worker.c handles Relation and Type messages while skipping;
 * for a streamed transaction the publisher counts the relation as described once the stream
 * commits (pgoutput's cleanup_rel_sync_cache), so pgsub takes them as they arrive.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { spawnPgsub, startCluster, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';
import { formatLsn, type Lsn } from '../../src/protocol/lsn.js';

const SUB = 'skipcat';
// One table per case: each case's skipped transaction is the first to touch its table in
// the session. `streamed` has a user-defined type, so its Relation comes with a Type message.
const TABLES = `CREATE TYPE public.mood AS ENUM ('calm', 'busy');
  CREATE TABLE public.streamed (id int PRIMARY KEY, mood public.mood NOT NULL, v text);
  CREATE TABLE public.prepared (id int PRIMARY KEY, v text);
  CREATE TABLE public.plain (id int PRIMARY KEY, v text);`;
let publisher: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [publisher, target] = await Promise.all([
    startCluster({ major: 18, name: 'skipcat-pub', settings: { logical_decoding_work_mem: '64kB' } }),
    startCluster({ major: 18, name: 'skipcat-tgt' }),
  ]);
  await Promise.all([publisher.createDatabase('src'), target.createDatabase('dst')]);
  await publisher.query(`${TABLES} CREATE PUBLICATION pub FOR TABLE public.streamed, public.prepared, public.plain;`, [], 'src');
  await target.query(TABLES, [], 'dst');
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
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
  PGSUB_BINARY: 'true',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
  PGSUB_STATUS_INTERVAL: '1',
});

async function cli(args: string[]): Promise<string> {
  const p = spawnPgsub(env(), args);
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  assert.equal(code, 0, p.output());
  return p.output();
}

async function stop(): Promise<string> {
  child!.kill('SIGTERM');
  assert.equal(await child!.exited, 0, child!.output().slice(-3000));
  const output = child!.output();
  child = null;
  return output;
}

/** The finish LSN of the next transaction in the slot (pgsub stopped): bytes 2-9 of its COMMIT or PREPARE message. */
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

const ids = async (table: string) => (await target.query<{ id: number }>(`SELECT id FROM public.${table} ORDER BY id`, [], 'dst')).map((r) => r.id);

/**
 * With pgsub stopped: `skipped` writes the transaction to skip (the first in the session to
 * touch `table`), `pgsub skip` names it, then one more row of the table is written. A new
 * session applies the skip and then that row, with no Relation message for it.
 */
async function skipFirstTouch(table: string, tag: 'C' | 'P', skipped: () => Promise<void>, after: () => Promise<void> = async () => {}): Promise<void> {
  await skipped();
  const lsn = await nextFinishLsn(tag);
  assert.match(await cli(['skip', '--lsn', lsn]), /will skip the remote transaction finishing at/);
  await after();
  await publisher.query(`INSERT INTO public.${table} (id, v${table === 'streamed' ? ', mood' : ''}) VALUES (100000, 'next'${table === 'streamed' ? `, 'busy'` : ''})`, [], 'src');
  child = spawnPgsub(env());
  await waitForCatchUp(publisher, 'src', SUB, 60_000).catch((err) => assert.fail(`${err}\n${child!.output().slice(-3000)}`));
  assert.deepEqual(await ids(table), [100000], `${table}: the skipped transaction left out, the next one applied`);
  const output = await stop();
  assert.ok(
    output.split('\n').some((l) => l.includes('"msg":"skipping remote transaction (pgsub skip)"') && l.includes(`"finishLsn":"${lsn}"`)),
    output.slice(-3000),
  );
  assert.doesNotMatch(output, /"level":50/, output.slice(-3000));
}

test('skipping the transaction that carried the first Relation of its table keeps replicating the next ones: streamed, prepared, plain', async () => {
  // The first session makes the slot (two_phase enabled once every table is ready).
  child = spawnPgsub(env());
  await child.waitForLog('streaming started');
  await waitForCatchUp(publisher, 'src', SUB, 60_000);
  await stop();

  // Large enough for logical_decoding_work_mem = 64kB: streamed, its Type and Relation messages inside the stream.
  await skipFirstTouch('streamed', 'C', () =>
    publisher.query(`INSERT INTO public.streamed SELECT g, 'calm', repeat('s', 100) FROM generate_series(1, 3000) g`, [], 'src').then(() => {}),
  );
  // Prepared (two_phase): the Relation comes between BEGIN PREPARE and PREPARE; committed before the next row.
  await skipFirstTouch(
    'prepared',
    'P',
    () => publisher.query(`BEGIN; INSERT INTO public.prepared VALUES (1, 'prepared'); PREPARE TRANSACTION 'skipcat';`, [], 'src').then(() => {}),
    () => publisher.query(`COMMIT PREPARED 'skipcat'`, [], 'src').then(() => {}),
  );
  await skipFirstTouch('plain', 'C', () => publisher.query(`INSERT INTO public.plain VALUES (1, 'plain')`, [], 'src').then(() => {}));

  assert.equal((await target.query(`SELECT count(*)::int AS n FROM pg_prepared_xacts`, [], 'dst'))[0].n, 0);
  const logged = await target.query(`SELECT count(*)::int AS n FROM pgsub.conflict_log WHERE subscription = $1 AND conflict_type = 'transaction_skipped'`, [SUB], 'dst');
  assert.equal(logged[0].n, 3);
});
