/**
 * The checks a session makes before it streams (session.ts): the publisher's version against
 * the configured options, its publications, the target's prepared-transaction setting and
 * origin tracking, and the slot against the origin the target recorded. Each fails with the
 * typed error that says what to fix on which side; none keeps a connection of its own.
 */
import type { Config } from '../config/config.js';
import { ConfigError, SlotAheadError, SourceSetupError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { ReplicationConnection } from '../protocol/replication.js';
import { existingPublications } from '../tablesync/catalog.js';
import { createOrigin, flushTargetWal, loadOrigin } from '../origin/store.js';
import { runAlone, type Sql, type WireConnection } from '../pgwire/connect.js';
import { claimSlot, type OwnConnections } from './preflight.js';

/**
 * Where to start streaming: the origin recorded in the target, checked against the slot.
 * Returns once the target's WAL is flushed past the origin row read (flushTargetWal; a
 * session reports that position as durable from its start) and `whileFlushing` (the start's
 * next steps, run beside that flush) is done; the first failure of either is thrown.
 */
export async function reconcileSlot(
  config: Config,
  replication: ReplicationConnection,
  sql: Sql,
  log: Logger,
  streamingName: string,
  own: OwnConnections,
  whileFlushing: () => Promise<void> = async () => {},
): Promise<Lsn> {
  // Two servers: both reads at once.
  const [origin, slot] = await Promise.all([loadOrigin(sql, config.subscription), replication.getSlot(config.slotName)]);
  if (slot) await claimSlot(replication, slot, config, streamingName, own, log);
  if (slot && (slot.slotType !== 'logical' || slot.plugin !== 'pgoutput')) {
    throw new SourceSetupError(`replication slot "${config.slotName}" exists but is a ${slot.slotType} slot with plugin ${slot.plugin ?? 'none'}, not a logical pgoutput slot`, {
      slot: config.slotName,
    });
  }
  if (!slot && origin) {
    throw new SourceSetupError(
      `replication slot "${config.slotName}" is missing on the publisher, but the target holds progress of subscription "${config.subscription}" at ${formatLsn(origin.remoteLsn)}; a new slot would silently miss changes. Re-create the subscription from scratch (drop its row in pgsub.origin and re-sync the tables).`,
      { slot: config.slotName },
    );
  }
  if (!slot) {
    if (!config.createSlot) throw new SourceSetupError(`replication slot "${config.slotName}" does not exist and create_slot is false`, { slot: config.slotName });
    const created = await replication.createSlot(config.slotName);
    log.info({ slot: config.slotName, lsn: formatLsn(created.consistentPoint) }, 'replication slot created');
    // The slot's own position, which the publisher already has: nothing to flush for it.
    await createOrigin(sql, config.subscription, config.slotName, created.consistentPoint);
    await whileFlushing();
    return created.consistentPoint;
  }
  const slotLsn = slot.confirmedFlushLsn;
  if (!origin) {
    if (slotLsn === null) throw new SourceSetupError(`replication slot "${config.slotName}" has no confirmed position yet`, { slot: config.slotName });
    log.warn({ slot: config.slotName, lsn: formatLsn(slotLsn) }, 'using an existing slot with no progress recorded in the target; streaming from the slot position');
    await createOrigin(sql, config.subscription, config.slotName, slotLsn);
    await whileFlushing();
    return slotLsn;
  }
  if (origin.slotName !== config.slotName) {
    throw new SourceSetupError(`subscription "${config.subscription}" was recorded with slot "${origin.slotName}", config says "${config.slotName}"`, { slot: config.slotName });
  }
  if (slotLsn !== null && slotLsn > origin.remoteLsn) {
    throw new SlotAheadError(
      `replication slot "${config.slotName}" has confirmed ${formatLsn(slotLsn)}, beyond the ${formatLsn(origin.remoteLsn)} recorded in the target: changes in between would be missing. Was the target restored from a backup, or the slot used by another consumer?`,
      { slot: config.slotName, slotLsn: formatLsn(slotLsn), originLsn: formatLsn(origin.remoteLsn) },
    );
  }
  // The session reports this position as durable from its start: it must be on the target's disk.
  const steps = await Promise.allSettled([flushTargetWal(sql, config.subscription), whileFlushing()]);
  for (const step of steps) if (step.status === 'rejected') throw step.reason;
  return origin.remoteLsn;
}

/** Options the publisher's protocol cannot carry are startup errors, never silent downgrades. */
export function checkOptionsAgainstPublisher(config: Config, serverVersionNum: number): void {
  const major = Math.floor(serverVersionNum / 10000);
  if (config.origin === 'none' && serverVersionNum < 160000) {
    throw new ConfigError(`origin = none needs a PostgreSQL 16 or later publisher; this one is ${major}`, { key: 'origin' });
  }
  if (config.streaming !== 'off' && serverVersionNum < 140000) {
    throw new ConfigError(`streaming = ${config.streaming} needs a PostgreSQL 14 or later publisher (protocol 2); this one is ${major}`, { key: 'streaming' });
  }
  if (config.streaming === 'parallel' && serverVersionNum < 160000) {
    throw new ConfigError(`streaming = parallel needs a PostgreSQL 16 or later publisher (protocol 4); this one is ${major}`, { key: 'streaming' });
  }
  if (config.twoPhase && serverVersionNum < 150000) {
    throw new ConfigError(`two_phase = true needs a PostgreSQL 15 or later publisher (protocol 3); this one is ${major}`, { key: 'two_phase' });
  }
  if (config.messages && serverVersionNum < 140000) {
    throw new ConfigError(`messages = true needs a PostgreSQL 14 or later publisher; this one is ${major}`, { key: 'messages' });
  }
  // pgoutput's binary option came with PostgreSQL 14 (older walsenders reject it).
  if (config.binary && serverVersionNum < 140000) {
    throw new ConfigError(`binary = true needs a PostgreSQL 14 or later publisher; this one is ${major}`, { key: 'binary' });
  }
}

/**
 * At least one configured publication must exist: with none, there is nothing to
 * replicate (exit 2 at startup, retried once a session has streamed). A missing one beside
 * existing ones is the launcher's warning, looked at again at each refresh (launcher.ts).
 */
export async function checkPublications(config: Config, replication: ReplicationConnection): Promise<void> {
  const existing = await existingPublications(replication, config.publications);
  if (existing.length === 0) {
    const missing = config.publications;
    throw new SourceSetupError(
      `publication${missing.length > 1 ? 's' : ''} ${missing.map((m) => `"${m}"`).join(', ')} not found in the publisher's database: none of the configured publications exists`,
      { publication: missing.join(', ') },
    );
  }
}

/**
 * two_phase prepares transactions on the target, which must allow some. As native, that is
 * a warning here and an apply error (retried, in status) at the first PREPARE: ordinary
 * transactions before it are applied, and a fixed target is used at the next attempt.
 */
export async function checkPreparedTransactions(conn: WireConnection, log: Logger): Promise<void> {
  const [result] = await runAlone(conn, [{ text: `SELECT pg_catalog.current_setting('max_prepared_transactions')`, params: [], wantRows: true }]);
  if (Number(result?.rows[0]?.[0] ?? 0) > 0) return;
  log.warn(
    { key: 'two_phase', side: 'target' },
    "two_phase = true prepares transactions on the target, but its max_prepared_transactions is 0: the first PREPARE will fail until max_prepared_transactions is set (at least max_connections is safe) in the target's postgresql.conf and the target restarted",
  );
}

/**
 * This session's replication origin id, when the target can tell who last wrote a row:
 * track_commit_timestamp = on and pg_xact_commit_timestamp_origin (PostgreSQL 16+).
 * Otherwise null, and *_origin_differs are not detected.
 */
export async function trackedOriginId(conn: WireConnection, originName: string): Promise<number | null> {
  if (conn.serverVersionNum < 160000) return null;
  const [result] = await runAlone(conn, [
    {
      text: `SELECT pg_catalog.current_setting('track_commit_timestamp'), pg_catalog.pg_replication_origin_oid($1)::pg_catalog.int8::pg_catalog.text`,
      params: [originName],
      wantRows: true,
    },
  ]);
  const row = result?.rows[0];
  if (row?.[0] !== 'on' || row?.[1] == null) return null;
  return Number(row[1]);
}
