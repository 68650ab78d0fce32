/**
 * One apply session, from connect to stop or failure: migrate pgsub's schema in the
 * target, open the apply and replication connections, check the publisher (version,
 * wal_level), find or create the slot, reconcile the slot with the origin recorded in
 * the target, and stream from that origin. The slot must never be ahead of what the
 * target recorded — that would mean changes the target never got — so that is fatal.
 * Before touching the origin or the slot it takes the subscription's run lock and claims
 * the slot (preflight.ts). A lost apply connection ends the session at once, even idle.
 */
import { isEmptyMapping } from '../mapping/rules.js';
import { applyOptions } from '../config/apply-options.js';
import type { Config } from '../config/config.js';
import { CutOverError, SlotAheadError, SourceSetupError, SubscriptionDisabledError } from '../errors.js';
import { clearPassedError, cutOverAt, loadControl } from '../conflict/control.js';
import type { SyncStates } from '../origin/sync-state.js';
import { StreamSpool } from '../apply/txn/spool.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { protoVersionFor } from '../protocol/proto-version.js';
import { Progress } from '../origin/positions.js';
import { replicationOriginName, setupSessionOrigin } from '../origin/replorigin.js';
import { migrateWith } from '../origin/store.js';
import { startApplyLoop, type ApplyHealth, type ApplyLoop } from '../apply/run/loop.js';
import type { ApplyHold } from '../apply/run/hold.js';
import { RelationMap } from '../apply/sql/relmap.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { openApplyConnection, openMaintenance, rolledBackOn, runAlone, type Sql, type WireConnection } from '../pgwire/connect.js';
import { refusal } from '../connect-failure.js';
import { takeRunLock, type OwnConnections } from './preflight.js';
import { checkOptionsAgainstPublisher, checkPreparedTransactions, checkPublications, reconcileSlot, trackedOriginId } from './session-checks.js';

export interface SessionHandle {
  /** Resolves when stopped, rejects on failure. */
  done: Promise<void>;
  stop(): void;
  progress: Progress;
  /** After `done` rejected: the remote transaction being applied, if any. */
  failedTransaction(): { finishLsn: Lsn; xid: number } | null;
  /** two_phase is configured but not enabled yet: some table was not ready at the start. */
  twoPhasePending: boolean;
  /** The remote transaction to skip (`pgsub skip` while this session runs). */
  setSkipLsn(lsn: Lsn | null): void;
  /** The apply loop's progress, for the watchdog (loop.ts). */
  health(): ApplyHealth;
  /** Bytes of streamed transactions in the spool (metrics). */
  spoolBytes(): number;
  /** Resolves once the publisher accepted START_REPLICATION (never rejects). */
  started: Promise<void>;
  /** Something was committed in the target (a transaction, an idle position) during this session. */
  madeProgress(): boolean;
}

export interface SessionEvents {
  /** Streaming has started from `startLsn`. */
  onStreaming?(info: { startLsn: Lsn; protoVersion: number; publisherVersion: number }): void;
}

export interface SessionDeps {
  sync: SyncStates;
  /** After the slot and origin exist, before streaming: register tables, run the initial copy. */
  beforeStreaming(): Promise<void>;
  onUnknownTable(schema: string, table: string): void;
  /** Finish LSN of a conflicting transaction to apply carefully from its start. */
  carefulLsn?: Lsn | null;
  /** Apply one source transaction per target transaction up to this LSN (after a GroupRetryError). */
  noGroupUntil?: Lsn | null;
  /** Backends this process opened (preflight.ts): only those are terminated as stale. */
  own: OwnConnections;
  /** The hold of `pgsub verify` (verify/hold.ts). */
  hold?: ApplyHold | null;
}

/**
 * The streaming connection's application_name: the source conninfo's, else the subscription
 * name, as native's walreceiver. The publisher's synchronous_standby_names names it; helper
 * connections (table sync, refresh, CLI) carry pgsub_<subscription>_<purpose>, never this.
 */
export function streamingApplicationName(config: Config): string {
  return config.source.applicationName ?? config.subscription;
}

export async function startSession(config: Config, counters: ApplyCounters, log: Logger, deps: SessionDeps, events: SessionEvents = {}): Promise<SessionHandle> {
  const appName = `pgsub_${config.subscription}`;
  // synchronous_commit = off applies to the apply transactions only (SET LOCAL, with flush
  // tracking); the session itself commits idle records and two-phase steps synchronously.
  const sessionCommit = config.synchronousCommit === 'off' ? 'on' : config.synchronousCommit;
  const streamingName = streamingApplicationName(config);
  const timeoutMs = config.targetTimeoutMs;
  const openTarget = async (applicationName: string, synchronousCommit: string) => {
    const opened = await openApplyConnection(config.target, { applicationName, synchronousCommit, timeoutMs });
    deps.own.add('target', opened.processId);
    return opened;
  };
  // The connections are opened while the migrations run: a restart costs one round of
  // connection setup, not one per connection (startup is part of every catch-up).
  const applyOpening = openTarget(appName, sessionCommit);
  const replicationOpening = ReplicationConnection.open(config.source, streamingName).then((opened) => {
    deps.own.add('source', opened.backendPid);
    return opened;
  });
  const trackerOpening = config.synchronousCommit === 'off' ? openTarget(`${appName}_flush`, 'on') : Promise.resolve(null);
  const opened = Promise.allSettled([applyOpening, replicationOpening, trackerOpening]);
  const closeOpened = async () => {
    const [a, r, t] = await opened;
    if (a.status === 'fulfilled') await a.value.close().catch(() => {});
    if (r.status === 'fulfilled') await r.value.close();
    if (t.status === 'fulfilled') await t.value?.close().catch(() => {});
  };
  let control: Awaited<ReturnType<typeof loadControl>>;
  try {
    // Disabled (disable_on_error) until `pgsub enable`; the skip LSN is re-read at every start.
    control = await withMaintenanceConn(config, appName, async (sql) => {
      await migrateWith(sql);
      // A failure recorded for a transaction applied since is no longer pending.
      await clearPassedError(sql, config.subscription);
      const cut = await cutOverAt(sql, config.subscription);
      if (cut) throw new CutOverError(`cut over at LSN ${formatLsn(cut.lsn)}: the target is the primary now; the forward service ends`, { lsn: formatLsn(cut.lsn) });
      return loadControl(sql, config.subscription);
    }).catch((err: unknown) => {
      // A wrong password, a pg_hba.conf line, no CREATE for pgsub's schema: say which.
      throw refusal('target', config.target, err, 'schema') ?? err;
    });
    if (!control.enabled) {
      throw new SubscriptionDisabledError(`subscription ${config.subscription} is disabled (${control.disabledReason ?? 'by the operator'}); run pgsub enable to resume`);
    }
  } catch (err) {
    await closeOpened();
    throw err;
  }
  let conn: WireConnection | null = null;
  let replication: ReplicationConnection | null = null;
  let flushTracker: WireConnection | null = null;
  try {
    const [a, r, t] = await opened;
    conn = a.status === 'fulfilled' ? a.value : null;
    replication = r.status === 'fulfilled' ? r.value : null;
    flushTracker = t.status === 'fulfilled' ? t.value : null;
    for (const result of [a, r, t]) if (result.status === 'rejected') throw result.reason;
    const applyConn = conn!;
    // Before the origin and the slot: a second pgsub for this subscription is named, not guessed at.
    await takeRunLock(applyConn, config, deps.own, log);
    await setupSessionOrigin((text, params) => runAlone(applyConn, [{ text, params }]), replicationOriginName(config.subscription));
    if (config.twoPhase) await checkPreparedTransactions(applyConn, log);
    const originId = config.conflicts.detect ? await trackedOriginId(applyConn, replicationOriginName(config.subscription)) : null;
    replication = replication!;
    const protoVersion = protoVersionFor(replication.serverVersionNum);
    checkOptionsAgainstPublisher(config, replication.serverVersionNum);
    const { walLevel, walSenderTimeoutMs } = await replication.settings();
    if (walLevel !== 'logical') {
      throw new SourceSetupError(`publisher has wal_level = ${walLevel}; logical replication needs wal_level = logical (restart the publisher after changing it)`);
    }
    const identity = await replication.identifySystem();
    await checkPublications(config, replication);
    const openReplicationConn = replication;
    const maintenance = openMaintenance(config.target, appName);
    let originLsn: Lsn;
    try {
      originLsn = await reconcileSlot(config, openReplicationConn, maintenance, log, streamingName, deps.own);
      await deps.beforeStreaming();
      // Finished copies are now caught up by this stream, which starts at or before them.
      await maintenance.unsafe(`UPDATE "pgsub"."subscription_rel" SET state = 's', updated_at = now() WHERE subscription = $1 AND state = 'f'`, [config.subscription]);
      for (const t of deps.sync.all()) if (t.state === 'f') deps.sync.set({ ...t, state: 's' });
    } finally {
      await maintenance.end({ timeout: 5 });
    }
    // two_phase stays pending until every table is ready, as native's (worker.c, "TWO_PHASE
    // TRANSACTIONS"): a transaction prepared while a table syncs would be prepared without
    // that table's changes. Until then prepared transactions arrive at COMMIT PREPARED as
    // ordinary ones; the runner restarts the stream once every table is ready.
    const notReady = deps.sync.all().filter((t) => t.state !== 'r');
    const twoPhase = config.twoPhase && notReady.length === 0;
    if (config.twoPhase && !twoPhase) {
      log.info({ tables: notReady.length }, 'two_phase pending until every table is ready; prepared transactions are applied at COMMIT PREPARED meanwhile');
    }
    const startLsn = deps.sync.streamStart(originLsn);
    if (startLsn < originLsn) {
      // A table catching up needs the stream from before the origin: the slot must still have it.
      const confirmed = (await openReplicationConn.getSlot(config.slotName))?.confirmedFlushLsn ?? null;
      if (confirmed !== null && confirmed > startLsn) {
        const behind = deps.sync.all().filter((t) => (t.state === 's' || t.state === 'f') && t.syncLsn !== null && t.syncLsn < confirmed);
        throw new SlotAheadError(
          `replication slot "${config.slotName}" has confirmed ${formatLsn(confirmed)}, beyond ${formatLsn(startLsn)} where ${behind.map((t) => `${t.schema}.${t.table}`).join(', ')} must catch up from; resync ${behind.length > 1 ? 'those tables' : 'that table'} (pgsub resync)`,
          { slot: config.slotName, slotLsn: formatLsn(confirmed), startLsn: formatLsn(startLsn) },
        );
      }
    }
    // Streamed transactions not committed before a restart are streamed again from the start.
    const spool = new StreamSpool(config.spoolDir, config.subscription);
    const orphans = spool.prepare();
    if (orphans > 0) log.info({ files: orphans, dir: config.spoolDir }, 'removed spool files of an earlier run');
    const progress = new Progress(originLsn);
    const relations = new RelationMap(applyConn.serverVersionNum, {
      binary: config.binary,
      ...(isEmptyMapping(config.mapping) ? {} : { mapping: config.mapping, probe: rolledBackOn(config.target, appName), subscription: config.subscription }),
    });
    const stream = replication.startReplication({
      slotName: config.slotName,
      startLsn,
      protoVersion,
      publications: config.publications,
      origin: config.origin === 'none' ? 'none' : undefined,
      streaming: config.streaming,
      twoPhase,
      messages: config.messages,
      binary: config.binary,
    });
    log.info(
      { subscription: config.subscription, slot: config.slotName, lsn: formatLsn(startLsn), protoVersion, publisher: replication.describe, systemId: identity.systemId },
      'streaming started',
    );
    events.onStreaming?.({ startLsn, protoVersion, publisherVersion: replication.serverVersionNum });
    const tracker = flushTracker;
    const options = applyOptions(config, { walSenderTimeoutMs });
    const laneConnections = {
      openConnection: (purpose: string) => openTarget(`${appName}_${purpose}`, sessionCommit),
      originName: replicationOriginName(config.subscription),
      targetVersionNum: applyConn.serverVersionNum,
    };
    const loop: ApplyLoop = startApplyLoop({
      options,
      flushTracker: tracker,
      stream,
      conn: applyConn,
      relations,
      progress,
      counters,
      sync: deps.sync,
      spool,
      onUnknownTable: deps.onUnknownTable,
      log,
      noGroupUntil: deps.noGroupUntil ?? null,
      lanes: config.applyWorkers > 1 ? laneConnections : null,
      // A session re-streaming from below the origin (a table catching up) would receive
      // applied streamed transactions again; those are only ever replayed from the spool.
      parallel: config.streaming === 'parallel' && startLsn >= originLsn ? laneConnections : null,
      originId,
      skipLsn: control.skipLsn,
      carefulLsn: deps.carefulLsn ?? null,
      hold: deps.hold ?? null,
    });
    if (control.skipLsn !== null) log.info({ skipLsn: formatLsn(control.skipLsn) }, 'remote transaction to skip');
    if (config.conflicts.detect)
      log.info({ originDiffers: originId !== null }, originId !== null ? 'conflict detection on, with origin checks (track_commit_timestamp)' : 'conflict detection on');
    // A dead target is noticed when it happens, not at the next statement (idle for hours).
    let stopped = false;
    let lost: Error | null = null;
    void applyConn.lost.then((err) => {
      if (stopped) return;
      lost = err;
      loop.stop();
    });
    const done = loop.done
      .then(() => {
        if (lost !== null) throw lost;
      })
      .finally(async () => {
        spool.close();
        await openReplicationConn.close();
        await applyConn.close().catch(() => {});
        await tracker?.close().catch(() => {});
      });
    return {
      done,
      stop: () => {
        stopped = true;
        loop.stop();
      },
      progress,
      failedTransaction: () => loop.failedTransaction(),
      twoPhasePending: config.twoPhase && !twoPhase,
      started: stream.started,
      madeProgress: () => progress.durable > originLsn,
      setSkipLsn: (lsn) => loop.setSkipLsn(lsn),
      health: () => loop.health(),
      spoolBytes: () => spool.bytes,
    };
  } catch (err) {
    await replication?.close();
    await conn?.close().catch(() => {});
    await flushTracker?.close().catch(() => {});
    throw err;
  }
}

async function withMaintenanceConn<T>(config: Config, appName: string, fn: (sql: Sql) => Promise<T>): Promise<T> {
  const sql = openMaintenance(config.target, appName);
  try {
    return await fn(sql);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
