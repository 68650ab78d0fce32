/**
 * The write fence of a cutover on the old primary: `ALTER DATABASE … SET
 * default_transaction_read_only = on` for the replicated database — new sessions start
 * read-only — and every other client session of that database that started before it is
 * terminated, since a session keeps the setting it started with. Walsenders are not client
 * sessions and are never touched (pgsub's stream must drain through the fence); nor is the
 * fencing session itself. Termination is repeated until no session from before the fence
 * is left, so a commit from one can only happen before the fence LSN is read. `lift`
 * restores the database's own setting as it was (RESET, or the value it had), for a
 * cutover that fails. An application that sets default_transaction_read_only = off itself,
 * or connects to another database, is not fenced: use `--fence none` and fence it yourself.
 */
import type pg from 'pg';
import { quoteIdent } from '../quote.js';
import { isTrue } from './db.js';

export interface FenceState {
  database: string;
  /** The database-level value before the fence, as in pg_db_role_setting; null: not set. */
  previous: string | null;
  raisedAt: number;
  terminated: number;
}

const SETTING = 'default_transaction_read_only';
/** Rounds of termination before giving up on sessions that do not go (they would be fenced-out anyway: read-only at their next start). */
const TERMINATE_ROUNDS = 50;

/** The database's own value of the setting (ALTER DATABASE … SET), not the session's. */
async function databaseSetting(client: pg.Client): Promise<string | null> {
  const { rows } = await client.query<{ setting: string | null }>(
    `SELECT (SELECT s FROM pg_catalog.unnest(d.setconfig) AS s WHERE s LIKE $1 LIMIT 1) AS setting
       FROM pg_catalog.pg_db_role_setting d
      WHERE d.setdatabase = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()) AND d.setrole = 0`,
    [`${SETTING}=%`],
  );
  const s = rows[0]?.setting ?? null;
  return s === null ? null : s.slice(SETTING.length + 1);
}

export async function raiseFence(client: pg.Client): Promise<FenceState> {
  const { rows } = await client.query<{ db: string }>('SELECT pg_catalog.current_database()::text AS db');
  const database = rows[0]!.db;
  const previous = await databaseSetting(client);
  const raisedAt = Date.now();
  await client.query(`ALTER DATABASE ${quoteIdent(database)} SET ${SETTING} = on`);
  const { rows: at } = await client.query<{ now: string }>('SELECT pg_catalog.clock_timestamp()::text AS now');
  const terminated = new Set<string>();
  for (let round = 0; round < TERMINATE_ROUNDS; round++) {
    const { rows: killed } = await client.query<{ pid: string; done: boolean }>(
      `SELECT pid::text, pg_catalog.pg_terminate_backend(pid) AS done FROM pg_catalog.pg_stat_activity
        WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() AND backend_type = 'client backend' AND backend_start < $1::timestamptz`,
      [at[0]!.now],
    );
    for (const k of killed) if (isTrue(String(k.done))) terminated.add(k.pid);
    if (killed.length === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  return { database, previous, raisedAt, terminated: terminated.size };
}

/** Put the database's setting back as it was before raiseFence. */
export async function liftFence(client: pg.Client, fence: Pick<FenceState, 'database' | 'previous'>): Promise<void> {
  if (fence.previous === null) await client.query(`ALTER DATABASE ${quoteIdent(fence.database)} RESET ${SETTING}`);
  else await client.query(`ALTER DATABASE ${quoteIdent(fence.database)} SET ${SETTING} = ${fence.previous === 'on' || fence.previous === 'true' ? 'on' : 'off'}`);
}
