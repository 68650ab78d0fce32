/**
 * The write fence of a cutover on the old primary: `ALTER DATABASE … SET
 * default_transaction_read_only = on` for the replicated database — new sessions start
 * read-only — and every other client session of that database that started before it is
 * terminated, since a session keeps the setting it started with. Walsenders are not client
 * sessions and are never touched (pgsub's stream must drain through the fence); nor is the
 * fencing session itself. The fence holds only once no session from before it is left,
 * checked twice with a pause between (a backend still starting has no database yet and is
 * waited for); a fence that cannot be established within its timeout is an error, never
 * a silent return. The fence LSN is then the position of a transactional marker written
 * after it (`pg_logical_emit_message`): the insert position, past every commit record any
 * earlier session inserted, even an asynchronous one not yet written out.
 * `liftFence` restores the database's own setting as it was (RESET, or the value it had)
 * and reads it back. An application that sets default_transaction_read_only = off
 * itself, or connects to another database, is not fenced: use `--fence none` and fence
 * it yourself. Background workers are not client sessions either: `writingWorkers` names
 * those attached to the database, for the plan.
 */
import type pg from 'pg';
import { parseLsn, type Lsn } from '../protocol/lsn.js';
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
/** Between the two checks that no session from before the fence is left. */
const RECHECK_PAUSE_MS = 100;

/** The database's own value of the setting (ALTER DATABASE … SET), not the session's. */
export async function databaseSetting(client: pg.Client): Promise<string | null> {
  const { rows } = await client.query<{ setting: string | null }>(
    `SELECT (SELECT s FROM pg_catalog.unnest(d.setconfig) AS s WHERE s LIKE $1 LIMIT 1) AS setting
       FROM pg_catalog.pg_db_role_setting d
      WHERE d.setdatabase = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()) AND d.setrole = 0`,
    [`${SETTING}=%`],
  );
  const s = rows[0]?.setting ?? null;
  return s === null ? null : s.slice(SETTING.length + 1);
}

export async function currentDatabase(client: pg.Client): Promise<string> {
  const { rows } = await client.query<{ db: string }>('SELECT pg_catalog.current_database()::text AS db');
  return rows[0]!.db;
}

/**
 * Raise the fence (the caller recorded `previous` in the target first). Throws when a
 * session from before the fence is still there after `timeoutMs`; the caller lifts it.
 */
export async function raiseFence(client: pg.Client, previous: string | null, timeoutMs: number, signal?: AbortSignal): Promise<FenceState> {
  const database = await currentDatabase(client);
  const raisedAt = Date.now();
  await client.query(`ALTER DATABASE ${quoteIdent(database)} SET ${SETTING} = on`);
  const { rows: at } = await client.query<{ now: string }>('SELECT pg_catalog.clock_timestamp()::text AS now');
  const terminated = new Set<string>();
  const deadline = Date.now() + timeoutMs;
  let clean = 0;
  let left: string[] = [];
  while (clean < 2) {
    if (signal?.aborted) throw new Error('interrupted while raising the fence');
    if (Date.now() > deadline) throw new Error(`the fence could not be established within ${timeoutMs / 1000} s: session(s) from before it still there: ${left.join('; ')}`);
    // Sessions of this database from before the fence are ended; a client backend with no
    // database yet that started before it may still be authenticating into this one: it is
    // waited for until it shows its database.
    // A superuser's session is not a non-superuser's to end (pg_terminate_backend would
    // raise): it is left, named, and the fence fails at its timeout unless it goes.
    const { rows } = await client.query<{ pid: string; db: string | null; app: string; role: string; done: string | null }>(
      `SELECT a.pid::text, a.datname::text AS db, coalesce(a.application_name, '') AS app, coalesce(a.usename::text, '') AS role,
              CASE WHEN a.datname IS NOT NULL AND (NOT coalesce(r.rolsuper, false) OR me.rolsuper) THEN pg_catalog.pg_terminate_backend(a.pid)::text END AS done
         FROM pg_catalog.pg_stat_activity a
         LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.usesysid
         CROSS JOIN (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) me
        WHERE (a.datname = pg_catalog.current_database() OR a.datname IS NULL) AND a.pid <> pg_catalog.pg_backend_pid()
          AND a.backend_type = 'client backend' AND a.backend_start < $1::timestamptz`,
      [at[0]!.now],
    );
    for (const k of rows) if (isTrue(k.done)) terminated.add(k.pid);
    left = rows.map(
      (r) =>
        `pid ${r.pid}${r.app ? ` (${r.app})` : ''}${r.role ? ` of role ${r.role}` : ''}${r.db === null ? ' still starting' : r.done === null ? ', which this role cannot end' : ''}`,
    );
    clean = rows.length === 0 ? clean + 1 : 0;
    await new Promise((r) => setTimeout(r, rows.length === 0 ? RECHECK_PAUSE_MS : 20));
  }
  return { database, previous, raisedAt, terminated: terminated.size };
}

/**
 * The fence LSN: a transactional marker written after the fence. Its position is past the
 * commit record of every transaction that committed before it (sessions from before the
 * fence are gone, prepared transactions resolved), written out or not.
 */
export async function fenceMarker(client: pg.Client, label: string): Promise<Lsn> {
  const { rows } = await client.query<{ lsn: string }>(`SELECT pg_catalog.pg_logical_emit_message(true, 'pgsub-fence', $1)::text AS lsn`, [label]);
  return parseLsn(rows[0]!.lsn);
}

/** Put the database's setting back as it was before raiseFence, and read it back; returns what it now is. */
export async function liftFence(client: pg.Client, fence: Pick<FenceState, 'database' | 'previous'>): Promise<string | null> {
  if (fence.previous === null) await client.query(`ALTER DATABASE ${quoteIdent(fence.database)} RESET ${SETTING}`);
  else await client.query(`ALTER DATABASE ${quoteIdent(fence.database)} SET ${SETTING} = ${fence.previous === 'on' || fence.previous === 'true' ? 'on' : 'off'}`);
  const now = await databaseSetting(client);
  if (now !== fence.previous)
    throw new Error(`database ${fence.database}'s ${SETTING} reads ${now ?? 'not set'} after the lift, not ${fence.previous ?? 'not set'} as before the fence`);
  return now;
}

export interface Worker {
  pid: string;
  type: string;
  name: string;
}

/**
 * Processes attached to the database that are neither client sessions nor walsenders nor
 * autovacuum: background workers (a native subscription's apply worker, pg_cron, …) keep
 * writing through the fence, which only reaches client sessions.
 */
export async function writingWorkers(client: pg.Client): Promise<Worker[]> {
  const { rows } = await client.query<Worker>(
    `SELECT pid::text, backend_type::text AS type, coalesce(nullif(application_name, ''), backend_type)::text AS name
       FROM pg_catalog.pg_stat_activity
      WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid()
        AND backend_type NOT IN ('client backend', 'walsender', 'autovacuum worker', 'autovacuum launcher')
      ORDER BY pid`,
  );
  return rows;
}
