/**
 * pgsub's schema in the target (migrations/, origin/store.ts): a first start creates it;
 * a target behind the newest migration is brought up to date under the advisory lock
 * (another pgsub migrating holds it: this one waits); a target that has the newest
 * migration is left alone without taking the lock (the fast path of every restart).
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { parseConninfo } from '../../src/config/conninfo.js';
import { migrateTarget } from '../../src/origin/store.js';
import { startCluster, type Cluster } from '../harness/index.js';

const LOCK_KEY = String(0x7067737562);
let target: Cluster;

before(async () => {
  target = await startCluster({ major: 18, name: 'migrations' });
  await target.createDatabase('dst');
});

after(async () => {
  await target?.stop();
});

const info = () => parseConninfo(target.url('dst'), 'target');
const applied = async () => (await target.query<{ n: string }>('SELECT count(*)::text AS n FROM pgsub.schema_migrations', [], 'dst'))[0]!.n;
/** How many migrations there are, and the column the newest one (0010_publications) adds. */
const MIGRATIONS = String(
  (JSON.parse(fs.readFileSync(path.join(import.meta.dirname, '..', '..', 'migrations', 'meta', '_journal.json'), 'utf8')) as { entries: unknown[] }).entries.length,
);
const BEHIND = String(Number(MIGRATIONS) - 1);
const hasNewestTable = async () =>
  (
    await target.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_attribute WHERE attrelid = 'pgsub.origin'::regclass AND attname = 'publications' AND NOT attisdropped`,
      [],
      'dst',
    )
  )[0]!.n === 1;

/** Another session holding the migration lock, as a second pgsub migrating would. */
async function holdLock(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: target.url('dst') });
  await c.connect();
  await c.query('SELECT pg_advisory_lock($1)', [LOCK_KEY]);
  return c;
}

test('a first start creates the schema; an up-to-date schema is left alone even while another session holds the lock', async () => {
  await migrateTarget(info(), 'pgsub_test');
  assert.equal(await applied(), MIGRATIONS);
  assert.ok(await hasNewestTable());
  const holder = await holdLock();
  try {
    // Up to date: returns without waiting for the lock.
    const outcome = await Promise.race([migrateTarget(info(), 'pgsub_test').then(() => 'done'), new Promise((r) => setTimeout(() => r('blocked'), 5000))]);
    assert.equal(outcome, 'done');
  } finally {
    await holder.end();
  }
  assert.equal(await applied(), MIGRATIONS);
});

test('a target behind the newest migration waits for the lock, then gets the missing migration', async () => {
  // As a target last migrated by an older pgsub: the newest migration not applied.
  await target.query(
    `ALTER TABLE pgsub.origin DROP COLUMN publications; DELETE FROM pgsub.schema_migrations WHERE created_at = (SELECT max(created_at) FROM pgsub.schema_migrations)`,
    undefined,
    'dst',
  );
  assert.equal(await applied(), BEHIND);
  const holder = await holdLock();
  let finished = false;
  const migrating = migrateTarget(info(), 'pgsub_test').then(() => (finished = true));
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(finished, false, 'migrated while another session held the migration lock');
  await holder.end();
  await migrating;
  assert.equal(await applied(), MIGRATIONS);
  assert.ok(await hasNewestTable());
});
