/**
 * One apply session, from connect to stop or failure: migrate pgsub's schema in the
 * target, open the apply and replication connections, check the publisher (version,
 * wal_level), find or create the slot, reconcile the slot with the origin recorded in
 * the target, and stream from that origin. The slot must never be ahead of what the
 * target recorded — that would mean changes the target never got — so that is fatal.
 * Before touching the origin or the slot it takes the subscription's run lock and claims
 * the slot (preflight.ts). A lost apply connection ends the session at once, even idle.
 * `Session` runs these as named steps and owns the connections; the checks are session-checks.ts.
 */
import { isEmptyMapping } from '../mapping/rules.js';
import { applyOptions } from '../config/apply-options.js';
import type { Config } from '../config/config.js';
import { SlotAheadError, SourceSetupError, SubscriptionDisabledError } from '../errors.js';
import { clearPassedError, cutOverAt, forwardServiceEnds, loadControl, type Control } from '../conflict/control.js';
import type { SyncStates } from '../origin/sync-state.js';
import { StreamSpool } from '../apply/txn/spool.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection, type ReplicationStream, type SystemIdentity } from '../protocol/replication.js';
import { protoVersionFor } from '../protocol/proto-version.js';
import { Progress } from '../origin/positions.js';
import { replicationOriginName, setupSessionOrigin } from '../origin/replorigin.js';
import { migrateWith, schemaIsCurrent } from '../origin/store.js';
import { startApplyLoop, type ApplyHealth, type ApplyLoop } from '../apply/run/loop.js';
import type { ApplyHold } from '../apply/run/hold.js';
import { RelationMap } from '../apply/sql/relmap.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { CONFLICT_TYPES } from '../conflict/types.js';
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
  /** The publications this session streams: those of the configured ones that existed at its start. */
  publications: readonly string[];
  /** Something was committed in the target (a transaction, an idle position) during this session. */
  madeProgress(): boolean;
}

export interface SessionEvents {
  /** Streaming has started from `startLsn`. */
  onStreaming?(info: { startLsn: Lsn; protoVersion: number; publisherVersion: number }): void;
}

export interface SessionDeps {
  sync: SyncStates;
  /** After the slot and origin exist, before streaming: register tables, run the initial copy; `target`: the session's target session, lent. */
  beforeStreaming(publisher: ReplicationConnection, target: Sql): Promise<void>;
  /** The configured publications that exist, as the launcher last found them (at beforeStreaming at the latest). */
  publications(): readonly string[];
  onUnknownTable(schema: string, table: string): void;
  /** Finish LSN of a conflicting transaction to apply carefully from its start. */
  carefulLsn?: Lsn | null;
  /** Apply one source transaction per target transaction up to this LSN (after a GroupRetryError). */
  noGroupUntil?: Lsn | null;
  /** Backends this process opened (preflight.ts): only those are terminated as stale. */
  own: OwnConnections;
  /** The hold of `pgsub verify` (verify/hold.ts). */
  hold?: ApplyHold | null;
  /** The run lock is taken (preflight.ts): this process is the subscription's one runner. */
  onRunLock?(): void;
}

/**
 * The streaming connection's application_name: the source conninfo's, else the subscription
 * name, as native's walreceiver. The publisher's synchronous_standby_names names it; helper
 * connections (table sync, refresh, CLI) carry pgsub_<subscription>_<purpose>, never this.
 */
export function streamingApplicationName(config: Config): string {
  return config.source.applicationName ?? config.subscription;
}

/** `privilegesChecked`: checkRunPrivileges of the process's first session, run beside the connections' opening. */
export async function startSession(
  config: Config,
  counters: ApplyCounters,
  log: Logger,
  deps: SessionDeps,
  events: SessionEvents = {},
  privilegesChecked?: Promise<void>,
): Promise<SessionHandle> {
  const session = new Session(config, counters, log, deps, events);
  // The connections are opened while the privileges are checked: a restart costs one round
  // of connection setup, not one per connection (startup is part of every catch-up).
  // Nothing is created before `privilegesChecked` resolves.
  session.open();
  const control = await session.prepareTarget(privilegesChecked);
  return session.start(control);
}

/** What the three openings settled to, in the order open() started them. */
type Opened = [PromiseSettledResult<WireConnection>, PromiseSettledResult<ReplicationConnection>, PromiseSettledResult<WireConnection | null>];

/** What checkPublisher() learnt from the publisher that streaming needs. */
interface Publisher {
  protoVersion: number;
  walSenderTimeoutMs: number;
  identity: SystemIdentity;
}

/** Built before the stream starts; the apply loop and the handle share them. */
interface ApplyParts {
  spool: StreamSpool;
  progress: Progress;
  relations: RelationMap;
}

/**
 * One session's steps, in the order startSession runs them, and the connections it holds.
 * Until start() returns a handle a failed step closes every connection opened; after that
 * the apply loop's end closes them.
 */
class Session {
  readonly #appName: string;
  /**
   * synchronous_commit = off applies to the apply transactions only (SET LOCAL, with flush
   * tracking); the session itself commits idle records and two-phase steps synchronously.
   */
  readonly #sessionCommit: string;
  readonly #streamingName: string;
  /** Set by open(): the apply, replication and flush-tracker openings, each settled on its own. */
  #opened!: Promise<Opened>;
  /** The connections that opened, taken by start(); closed on a failed start or at the loop's end. */
  #conn: WireConnection | null = null;
  #replication: ReplicationConnection | null = null;
  #flushTracker: WireConnection | null = null;
  /** stop() was called: a lost apply connection after that is not a failure. */
  #stopped = false;
  /** The apply connection lost while running: the session's end rejects with it. */
  #lost: Error | null = null;
  /** The target session of the steps before streaming (#openMaintenance), ended after #reconcile. */
  #maintenance: Sql | null = null;

  constructor(
    private readonly config: Config,
    private readonly counters: ApplyCounters,
    private readonly log: Logger,
    private readonly deps: SessionDeps,
    private readonly events: SessionEvents,
  ) {
    this.#appName = `pgsub_${config.subscription}`;
    this.#sessionCommit = config.synchronousCommit === 'off' ? 'on' : config.synchronousCommit;
    this.#streamingName = streamingApplicationName(config);
  }

  /** Starts opening the connections; start() waits for them. */
  open(): void {
    const { config, deps } = this;
    const applyOpening = this.#openTarget(this.#appName, this.#sessionCommit);
    const replicationOpening = ReplicationConnection.open(config.source, this.#streamingName).then((opened) => {
      deps.own.add('source', opened.backendPid);
      return opened;
    });
    const trackerOpening = config.synchronousCommit === 'off' ? this.#openTarget(`${this.#appName}_flush`, 'on') : Promise.resolve(null);
    this.#opened = Promise.allSettled([applyOpening, replicationOpening, trackerOpening]);
  }

  /**
   * Migrates pgsub's schema in the target and reads the subscription's control; closes what
   * open() opened if that fails. Whether the schema is current is read while the privileges
   * are checked (`privilegesChecked`): nothing is written before they passed, and their
   * refusal is the one reported.
   */
  async prepareTarget(privilegesChecked: Promise<void> | undefined): Promise<Control> {
    const { config } = this;
    try {
      // Disabled (disable_on_error) until `pgsub enable`; the skip LSN is re-read at every start.
      const sql = this.#openMaintenance();
      const [checked, current] = await Promise.allSettled([privilegesChecked, schemaIsCurrent(sql)]);
      if (checked.status === 'rejected') throw checked.reason;
      const control = await (async () => {
        if (current.status === 'rejected') throw current.reason;
        await migrateWith(sql, current.value);
        // A failure recorded for a transaction applied since is no longer pending.
        await clearPassedError(sql, config.subscription);
        // The control row first: the cutover records its end and disables the subscription in
        // one transaction, so a subscription read disabled by it is read cut over too (the other
        // order could read "not cut over", then "disabled": a wait for pgsub enable, for ever).
        const control = await loadControl(sql, config.subscription);
        const cut = await cutOverAt(sql, config.subscription);
        if (cut) throw forwardServiceEnds(cut.lsn);
        return control;
      })().catch((err: unknown) => {
        // A wrong password, a pg_hba.conf line, no CREATE for pgsub's schema: say which.
        throw refusal('target', config.target, err, 'schema') ?? err;
      });
      if (!control.enabled) {
        throw new SubscriptionDisabledError(`subscription ${config.subscription} is disabled (${control.disabledReason ?? 'by the operator'}); run pgsub enable to resume`);
      }
      return control;
    } catch (err) {
      await this.#endMaintenance();
      await this.#closeOpened();
      throw err;
    }
  }

  /** Every step from the opened connections to a running apply loop; a failed step closes the connections. */
  async start(control: Control): Promise<SessionHandle> {
    try {
      const { conn, replication } = await this.#takeConnections();
      // The run lock and origin on the target, the publisher's checks on its own connection: side by side.
      const [origin, checked] = await Promise.allSettled([this.#prepareOrigin(conn), this.#checkPublisher(replication)]);
      // A second pgsub refused at the run lock is told that first.
      if (origin.status === 'rejected') throw origin.reason;
      if (checked.status === 'rejected') throw checked.reason;
      const [originId, publisher] = [origin.value, checked.value];
      const originLsn = await this.#reconcile(replication);
      const twoPhase = this.#twoPhaseNow();
      const startLsn = await this.#streamStart(replication, originLsn);
      const parts = this.#applyParts(conn, originLsn);
      const publications = this.#publications();
      const stream = this.#startStreaming(replication, startLsn, twoPhase, publisher, publications);
      const loop = this.#startApplyLoop(conn, stream, parts, { control, originId, originLsn, startLsn, walSenderTimeoutMs: publisher.walSenderTimeoutMs });
      return this.#handle(conn, loop, stream, parts, originLsn, twoPhase, publications);
    } catch (err) {
      await this.#close();
      throw err;
    }
  }

  async #openTarget(applicationName: string, synchronousCommit: string): Promise<WireConnection> {
    const opened = await openApplyConnection(this.config.target, { applicationName, synchronousCommit, timeoutMs: this.config.targetTimeoutMs });
    this.deps.own.add('target', opened.processId);
    return opened;
  }

  /** Keeps every connection that opened (for #close), then throws the first opening's failure. */
  async #takeConnections(): Promise<{ conn: WireConnection; replication: ReplicationConnection }> {
    const [a, r, t] = await this.#opened;
    this.#conn = a.status === 'fulfilled' ? a.value : null;
    this.#replication = r.status === 'fulfilled' ? r.value : null;
    this.#flushTracker = t.status === 'fulfilled' ? t.value : null;
    for (const result of [a, r, t]) if (result.status === 'rejected') throw result.reason;
    return { conn: this.#conn!, replication: this.#replication! };
  }

  /** The run lock, the session's replication origin and the target's settings; the origin id when conflicts are detected. */
  async #prepareOrigin(conn: WireConnection): Promise<number | null> {
    const { config, log } = this;
    // Before the origin and the slot: a second pgsub for this subscription is named, not guessed at.
    await takeRunLock(conn, config, this.deps.own, log);
    this.deps.onRunLock?.();
    await setupSessionOrigin((text, params) => runAlone(conn, [{ text, params }]), replicationOriginName(config.subscription));
    if (config.twoPhase) await checkPreparedTransactions(conn, log);
    return config.conflicts.detect ? await trackedOriginId(conn, replicationOriginName(config.subscription)) : null;
  }

  /** The publisher's version against the options, its wal_level, its identity and the publications. */
  async #checkPublisher(replication: ReplicationConnection): Promise<Publisher> {
    const protoVersion = protoVersionFor(replication.serverVersionNum);
    checkOptionsAgainstPublisher(this.config, replication.serverVersionNum);
    const { walLevel, walSenderTimeoutMs } = await replication.settings();
    if (walLevel !== 'logical') {
      throw new SourceSetupError(`publisher has wal_level = ${walLevel}; logical replication needs wal_level = logical (restart the publisher after changing it)`);
    }
    const identity = await replication.identifySystem();
    await checkPublications(this.config, replication);
    return { protoVersion, walSenderTimeoutMs, identity };
  }

  /** The slot against the origin (the stream's origin LSN), then the tables' registration and initial copy. */
  async #reconcile(replication: ReplicationConnection): Promise<Lsn> {
    const { config, deps } = this;
    const maintenance = this.#openMaintenance();
    try {
      // The tables' steps run while the target flushes the origin read; the stream starts after both.
      const originLsn = await reconcileSlot(config, replication, maintenance, this.log, this.#streamingName, deps.own, () => deps.beforeStreaming(replication, maintenance));
      // Finished copies are now caught up by this stream, which starts at or before them.
      const finished = deps.sync.all().filter((t) => t.state === 'f');
      if (finished.length > 0) {
        await maintenance.unsafe(`UPDATE "pgsub"."subscription_rel" SET state = 's', updated_at = now() WHERE subscription = $1 AND state = 'f'`, [config.subscription]);
        for (const t of finished) deps.sync.set({ ...t, state: 's' });
      }
      return originLsn;
    } finally {
      await this.#endMaintenance();
    }
  }

  /**
   * two_phase stays pending until every table is ready, as native's (worker.c, "TWO_PHASE
   * TRANSACTIONS"): a transaction prepared while a table syncs would be prepared without
   * that table's changes. Until then prepared transactions arrive at COMMIT PREPARED as
   * ordinary ones; the runner restarts the stream once every table is ready.
   */
  #twoPhaseNow(): boolean {
    const notReady = this.deps.sync.all().filter((t) => t.state !== 'r');
    const twoPhase = this.config.twoPhase && notReady.length === 0;
    if (this.config.twoPhase && !twoPhase) {
      this.log.info({ tables: notReady.length }, 'two_phase pending until every table is ready; prepared transactions are applied at COMMIT PREPARED meanwhile');
    }
    return twoPhase;
  }

  /** Where the stream starts: the origin, or before it for a table catching up, which the slot must still have. */
  async #streamStart(replication: ReplicationConnection, originLsn: Lsn): Promise<Lsn> {
    const { config, deps } = this;
    const startLsn = deps.sync.streamStart(originLsn);
    if (startLsn < originLsn) {
      // A table catching up needs the stream from before the origin: the slot must still have it.
      const confirmed = (await replication.getSlot(config.slotName))?.confirmedFlushLsn ?? null;
      if (confirmed !== null && confirmed > startLsn) {
        const behind = deps.sync.all().filter((t) => (t.state === 's' || t.state === 'f') && t.syncLsn !== null && t.syncLsn < confirmed);
        throw new SlotAheadError(
          `replication slot "${config.slotName}" has confirmed ${formatLsn(confirmed)}, beyond ${formatLsn(startLsn)} where ${behind.map((t) => `${t.schema}.${t.table}`).join(', ')} must catch up from; resync ${behind.length > 1 ? 'those tables' : 'that table'} (pgsub resync)`,
          { slot: config.slotName, slotLsn: formatLsn(confirmed), startLsn: formatLsn(startLsn) },
        );
      }
    }
    return startLsn;
  }

  /** The spool (emptied of an earlier run's files), the progress from the origin, the relation map. */
  #applyParts(conn: WireConnection, originLsn: Lsn): ApplyParts {
    const { config, log } = this;
    // Streamed transactions not committed before a restart are streamed again from the start.
    const spool = new StreamSpool(config.spoolDir, config.subscription);
    const orphans = spool.prepare();
    if (orphans > 0) log.info({ files: orphans, dir: config.spoolDir }, 'removed spool files of an earlier run');
    const progress = new Progress(originLsn);
    const relations = new RelationMap(conn.serverVersionNum, {
      binary: config.binary,
      ...(isEmptyMapping(config.mapping) ? {} : { mapping: config.mapping, probe: rolledBackOn(config.target, this.#appName), subscription: config.subscription }),
    });
    return { spool, progress, relations };
  }

  /**
   * Only the configured publications that exist go to START_REPLICATION: pgoutput before 18
   * fails on a missing one, 18 skips it with a warning only in its own log. The launcher
   * found them after this session's checks; a later change restarts the stream (stream-setup.ts).
   */
  #publications(): readonly string[] {
    const publications = this.deps.publications();
    if (publications.length === 0) {
      throw new SourceSetupError(`none of the publications ${this.config.publications.map((m) => `"${m}"`).join(', ')} exists in the publisher's database`, {
        publication: this.config.publications.join(', '),
      });
    }
    return publications;
  }

  /** START_REPLICATION with the options this publisher and the tables' states allow. */
  #startStreaming(replication: ReplicationConnection, startLsn: Lsn, twoPhase: boolean, publisher: Publisher, publications: readonly string[]): ReplicationStream {
    const { config } = this;
    const { protoVersion, identity } = publisher;
    const stream = replication.startReplication({
      slotName: config.slotName,
      startLsn,
      protoVersion,
      publications: [...publications],
      origin: config.origin === 'none' ? 'none' : undefined,
      streaming: config.streaming,
      twoPhase,
      messages: config.messages,
      binary: config.binary,
    });
    this.log.info(
      {
        subscription: config.subscription,
        slot: config.slotName,
        lsn: formatLsn(startLsn),
        protoVersion,
        publications,
        publisher: replication.describe,
        systemId: identity.systemId,
      },
      'streaming started',
    );
    this.events.onStreaming?.({ startLsn, protoVersion, publisherVersion: replication.serverVersionNum });
    return stream;
  }

  #startApplyLoop(
    conn: WireConnection,
    stream: ReplicationStream,
    parts: ApplyParts,
    at: { control: Control; originId: number | null; originLsn: Lsn; startLsn: Lsn; walSenderTimeoutMs: number },
  ): ApplyLoop {
    const { config, deps, log } = this;
    const { control, originId } = at;
    const options = applyOptions(config, { walSenderTimeoutMs: at.walSenderTimeoutMs });
    const laneConnections = {
      openConnection: (purpose: string) => this.#openTarget(`${this.#appName}_${purpose}`, this.#sessionCommit),
      originName: replicationOriginName(config.subscription),
      targetVersionNum: conn.serverVersionNum,
    };
    const loop: ApplyLoop = startApplyLoop({
      options,
      flushTracker: this.#flushTracker,
      stream,
      conn,
      relations: parts.relations,
      progress: parts.progress,
      counters: this.counters,
      sync: deps.sync,
      spool: parts.spool,
      onUnknownTable: deps.onUnknownTable,
      log,
      noGroupUntil: deps.noGroupUntil ?? null,
      lanes: config.applyWorkers > 1 ? laneConnections : null,
      // A session re-streaming from below the origin (a table catching up) would receive
      // applied streamed transactions again; those are only ever replayed from the spool.
      parallel: config.streaming === 'parallel' && at.startLsn >= at.originLsn ? laneConnections : null,
      originId,
      skipLsn: control.skipLsn,
      carefulLsn: deps.carefulLsn ?? null,
      hold: deps.hold ?? null,
    });
    if (control.skipLsn !== null) log.info({ skipLsn: formatLsn(control.skipLsn) }, 'remote transaction to skip');
    // What the conflicts metric may report (service/metrics.ts): a type not detected has no count to show.
    // Without detection only a missing row is still seen (the statement changes nothing; skipped, as native's default).
    this.counters.detectedConflicts = config.conflicts.detect
      ? CONFLICT_TYPES.filter((t) => originId !== null || !t.endsWith('_origin_differs'))
      : ['update_missing', 'delete_missing'];
    if (config.conflicts.detect)
      log.info({ originDiffers: originId !== null }, originId !== null ? 'conflict detection on, with origin checks (track_commit_timestamp)' : 'conflict detection on');
    return loop;
  }

  /** The running session's handle; its `done` settles after the connections are closed. */
  #handle(conn: WireConnection, loop: ApplyLoop, stream: ReplicationStream, parts: ApplyParts, originLsn: Lsn, twoPhase: boolean, publications: readonly string[]): SessionHandle {
    const { spool, progress } = parts;
    // A dead target is noticed when it happens, not at the next statement (idle for hours).
    void conn.lost.then((err) => {
      if (this.#stopped) return;
      this.#lost = err;
      loop.stop();
    });
    const done = loop.done
      .then(() => {
        if (this.#lost !== null) throw this.#lost;
      })
      .finally(async () => {
        spool.close();
        await this.#close();
      });
    return {
      done,
      stop: () => {
        this.#stopped = true;
        loop.stop();
      },
      progress,
      failedTransaction: () => loop.failedTransaction(),
      twoPhasePending: this.config.twoPhase && !twoPhase,
      started: stream.started,
      publications,
      madeProgress: () => progress.durable > originLsn,
      setSkipLsn: (lsn) => loop.setSkipLsn(lsn),
      health: () => loop.health(),
      spoolBytes: () => spool.bytes,
    };
  }

  /** After prepareTarget failed: whatever open() managed to open. */
  async #closeOpened(): Promise<void> {
    const [a, r, t] = await this.#opened;
    if (a.status === 'fulfilled') await a.value.close().catch(() => {});
    if (r.status === 'fulfilled') await r.value.close();
    if (t.status === 'fulfilled') await t.value?.close().catch(() => {});
  }

  /**
   * One session on the target for the steps before streaming (migrations, control, the
   * slot's reconciliation, the tables' states): one login instead of one per step.
   */
  #openMaintenance(): Sql {
    this.#maintenance ??= openMaintenance(this.config.target, this.#appName);
    return this.#maintenance;
  }

  async #endMaintenance(): Promise<void> {
    const sql = this.#maintenance;
    this.#maintenance = null;
    await sql?.end({ timeout: 5 }).catch(() => {});
  }

  /** The connections start() took, after a failed step or at the loop's end. */
  async #close(): Promise<void> {
    await this.#endMaintenance();
    await this.#replication?.close();
    await this.#conn?.close().catch(() => {});
    await this.#flushTracker?.close().catch(() => {});
  }
}
