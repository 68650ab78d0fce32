/**
 * Checks a session makes before it streams, each turning a condition the operator must
 * fix into an error that says what to change, instead of a retry loop that never ends:
 *  - the run lock: an advisory lock in the target, keyed by the subscription and held by
 *    the apply connection for the session's life, so a second pgsub for the same
 *    subscription is told which process (pid, host: the pgsub.runner row) runs it — before
 *    `pgsub run` binds its metrics port, before READY=1 and before any slot is touched;
 *  - the slot's holder: a walsender of this process's earlier session (a connection the
 *    publisher has not noticed gone) is terminated, one with pgsub's application_name but
 *    not ours is waited for on a short interval, anyone else's is a SlotInUseError;
 *  - the roles' privileges: everything `pgsub run` needs on both sides before the first
 *    session (checkRunPrivileges, migrate/privileges.ts), the tables a session registered
 *    at its start (checkTablePrivileges), and that no row-level security of theirs applies
 *    to the applying role (checkTableAccess does both; apply/sql/row-security.ts).
 * Backends this process opened are remembered (OwnConnections), so only its own stale
 * connections are ever terminated, never another pgsub's.
 */
import { createHash } from 'node:crypto';
import os from 'node:os';
import type { Config } from '../config/config.js';
import { AlreadyRunningError, SlotBusyError, SlotInUseError } from '../errors.js';
import type { Logger } from '../log.js';
import { openTargetDb, targetDbOver, type Db } from '../migrate/db.js';
import { connectFailure } from '../connect-failure.js';
import { needOnRelations, privilegeError, sideOf } from '../migrate/grants.js';
import type { ReplicationConnection, SlotInfo } from '../protocol/replication.js';
import { runAlone, type Sql, type WireConnection } from '../pgwire/connect.js';
import { ruleFor } from '../mapping/rules.js';
import { ROW_SECURITY_SQL, rowSecurityError, tablesParam, type RowSecurityRow } from '../apply/sql/row-security.js';

/** What `pgsub run` needs on both sides, checked before its first session changes anything (migrate/privileges.ts). */
export { checkRunPrivileges } from '../migrate/privileges.js';

/** First half of the run lock's key: "pgsu" (the migrations' lock is one bigint, objsubid 1; this is two int4s, objsubid 2). */
const RUN_LOCK_CLASS = 0x70677375;
/** How long a terminated stale backend gets to let go of a lock or slot. */
const STALE_WAIT_MS = 5000;
const REMEMBERED = 64;

/** Backend pids this process opened on each side: the only ones it may terminate as stale. */
export class OwnConnections {
  readonly #pids = { source: new Set<number>(), target: new Set<number>() };

  add(side: 'source' | 'target', pid: number): void {
    const set = this.#pids[side];
    set.add(pid);
    if (set.size > REMEMBERED) set.delete(set.values().next().value!);
  }

  has(side: 'source' | 'target', pid: number): boolean {
    return this.#pids[side].has(pid);
  }
}

/** The run lock's key for a subscription: two non-negative int4s (pg_locks shows them as classid/objid). */
export function runLockKey(subscription: string): [number, number] {
  return [RUN_LOCK_CLASS, createHash('sha256').update(subscription).digest().readUInt32BE(0) & 0x7fffffff];
}

/**
 * Take the subscription's run lock on the apply connection (released with it) and record
 * this process as its runner. Held by a stale backend of this process: terminated, then
 * taken. Held by anyone else: AlreadyRunningError naming them.
 */
export async function takeRunLock(conn: WireConnection, config: Config, own: OwnConnections, log: Logger): Promise<void> {
  const [classId, objId] = runLockKey(config.subscription);
  const tryLock = async () => {
    const [result] = await runAlone(conn, [
      { text: 'SELECT pg_catalog.pg_try_advisory_lock($1::pg_catalog.int4, $2::pg_catalog.int4)', params: [String(classId), String(objId)], wantRows: true },
    ]);
    return result?.rows[0]?.[0] === 't';
  };
  let locked = await tryLock();
  if (!locked) {
    const holder = await lockHolder(conn, config.subscription, classId, objId);
    const ours = holder !== null && (own.has('target', holder.backendPid) || (holder.pid === process.pid && holder.host === os.hostname()));
    if (holder !== null && !ours) {
      const who =
        holder.pid !== null
          ? `pgsub pid ${holder.pid} on host ${holder.host}`
          : `a session of application_name "${holder.applicationName ?? ''}" from ${holder.clientAddr ?? 'a local socket'}`;
      throw new AlreadyRunningError(
        `subscription ${config.subscription} is already running under ${who} (target backend pid ${holder.backendPid}): stop that process first, or give this one another subscription name`,
        { subscription: config.subscription, pid: holder.pid ?? undefined, host: holder.host ?? undefined, backendPid: holder.backendPid },
      );
    }
    if (holder !== null) {
      log.warn({ backendPid: holder.backendPid }, 'terminating a target session this process left behind (it still holds the subscription lock)');
      await runAlone(conn, [{ text: 'SELECT pg_catalog.pg_terminate_backend($1::pg_catalog.int4)', params: [String(holder.backendPid)] }]);
    }
    const deadline = Date.now() + STALE_WAIT_MS;
    while (!(locked = await tryLock()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    if (!locked)
      throw new AlreadyRunningError(
        `subscription ${config.subscription} is already running: its run lock is held by another session in the target that did not let go within ${STALE_WAIT_MS / 1000} s`,
        {
          subscription: config.subscription,
        },
      );
  }
  await runAlone(conn, [
    {
      text: `INSERT INTO "pgsub"."runner" (subscription, pid, host, backend_pid, started_at) VALUES ($1, $2, $3, pg_catalog.pg_backend_pid(), pg_catalog.now())
             ON CONFLICT (subscription) DO UPDATE SET pid = EXCLUDED.pid, host = EXCLUDED.host, backend_pid = EXCLUDED.backend_pid, started_at = EXCLUDED.started_at`,
      params: [config.subscription, String(process.pid), os.hostname()],
    },
  ]);
}

interface LockHolder {
  backendPid: number;
  applicationName: string | null;
  clientAddr: string | null;
  /** From pgsub.runner, when its row was written by the lock's holder. */
  pid: number | null;
  host: string | null;
}

async function lockHolder(conn: WireConnection, subscription: string, classId: number, objId: number): Promise<LockHolder | null> {
  const [result] = await runAlone(conn, [
    {
      text: `SELECT l.pid::text, a.application_name, a.client_addr::text, r.pid::text, r.host
       FROM pg_catalog.pg_locks l
       LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
       LEFT JOIN "pgsub"."runner" r ON r.subscription = $3 AND r.backend_pid = l.pid
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.classid = $1::pg_catalog.int4::pg_catalog.oid AND l.objid = $2::pg_catalog.int4::pg_catalog.oid
        AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())`,
      params: [String(classId), String(objId), subscription],
      wantRows: true,
    },
  ]);
  const row = result?.rows[0] as (string | null)[] | undefined;
  if (!row) return null;
  const [backendPid, applicationName, clientAddr, pid, host] = row;
  return { backendPid: Number(backendPid), applicationName: applicationName ?? null, clientAddr: clientAddr ?? null, pid: pid == null ? null : Number(pid), host: host ?? null };
}

/**
 * Make sure the slot is free for this connection: a walsender of this process's earlier
 * session is terminated and waited for; one with our application_name that this process
 * does not know (an earlier run's, not noticed gone yet) is a SlotBusyError, retried on a
 * short interval; anyone else's, a SlotInUseError naming it.
 */
export async function claimSlot(replication: ReplicationConnection, slot: SlotInfo, config: Config, applicationName: string, own: OwnConnections, log: Logger): Promise<void> {
  const pid = slot.activePid;
  if (!slot.active || pid === null || pid === replication.backendPid) return;
  const holder = await replication.walsender(pid);
  if (holder === null) return; // gone meanwhile
  if (own.has('source', pid)) {
    log.warn({ slot: config.slotName, walsenderPid: pid }, 'terminating the walsender of an earlier connection of this process that still holds the slot');
    await replication.terminateBackend(pid);
    const deadline = Date.now() + STALE_WAIT_MS;
    while (Date.now() < deadline) {
      if (!(await replication.getSlot(config.slotName))?.active) return;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new SlotBusyError(`replication slot "${config.slotName}" is still held by walsender pid ${pid} after it was terminated`, { slot: config.slotName, walsenderPid: pid });
  }
  if (holder.applicationName === applicationName) {
    throw new SlotBusyError(
      `replication slot "${config.slotName}" is active for walsender pid ${pid} with pgsub's application_name "${applicationName}" (an earlier connection the publisher has not noticed gone yet?); retrying until it exits (wal_sender_timeout)`,
      { slot: config.slotName, walsenderPid: pid },
    );
  }
  throw new SlotInUseError(
    `source: replication slot "${config.slotName}" is in use by another client (walsender pid ${pid}, application_name "${holder.applicationName ?? ''}", client ${holder.clientAddr ?? 'local socket'}): stop that client, or give this subscription its own slot (slot_name)`,
    { slot: config.slotName, walsenderPid: pid, applicationName: holder.applicationName ?? undefined },
  );
}

/**
 * The target role must be able to apply every change to every replicated table: USAGE on
 * its schema, INSERT/UPDATE/DELETE/TRUNCATE, and SELECT (UPDATE and DELETE locate rows
 * with WHERE on the key). Tables missing from the target are not this check's business.
 * The whole of what `pgsub run` needs on both sides is checkRunPrivileges (before the
 * first session); this is the same probe for the tables a session registered.
 */
export async function checkTablePrivileges(config: Config, tables: readonly { schema: string; table: string }[]): Promise<void> {
  if (tables.length === 0) return;
  const db = await openTargetDb(config.target, `pgsub_${config.subscription}_check`);
  try {
    await tablePrivileges(db, tables);
  } finally {
    await db.close();
  }
}

async function tablePrivileges(db: Db, tables: readonly { schema: string; table: string }[]): Promise<void> {
  const side = await sideOf(db);
  await needOnRelations(side, 'table', tables, 'pgsub applies changes to it', { privileges: ['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'] });
  const err = privilegeError('run', [side]);
  if (err) throw err;
}

/**
 * A session's tables at its start: checkTablePrivileges, then that no row-level security
 * applies to the applying role (a RowSecurityError for the first table, under its target
 * name; exit 2). Both probes side by side on `target`, the session start's own target session
 * (no login of their own at a start). A missing privilege is named before row security.
 */
export async function checkTableAccess(config: Config, tables: readonly { schema: string; table: string }[], target: Sql): Promise<void> {
  if (tables.length === 0) return;
  const db = await targetDbOver(target, config.target).catch((err: unknown) => {
    throw connectFailure('target', config.target, err, 'apply', 'a connection');
  });
  try {
    const [privileges, security] = await Promise.allSettled([tablePrivileges(db, tables), rowSecurity(db, config, tables)]);
    if (privileges.status === 'rejected') throw privileges.reason;
    if (security.status === 'rejected') throw security.reason;
  } finally {
    await db.close();
  }
}

async function rowSecurity(db: Db, config: Config, tables: readonly { schema: string; table: string }[]): Promise<void> {
  const targets = tables.map((t) => {
    const rule = ruleFor(config.mapping, t.schema, t.table);
    return rule ? { schema: rule.targetSchema, table: rule.targetTable } : t;
  });
  const [applies] = await db.query<RowSecurityRow>(ROW_SECURITY_SQL, [tablesParam(targets)]);
  if (applies) throw rowSecurityError(applies);
}
