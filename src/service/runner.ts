/**
 * The service loop: run apply sessions until stopped. A retryable failure (lost
 * connection, a target that cannot take a change yet, a missing column the operator can
 * add) ends the session, rolls back what was in flight, and starts a new one after an
 * exponential backoff with jitter (backoff.ts) — resuming from the origin committed in
 * the target, so nothing is lost or applied twice. The backoff starts over after a session
 * that committed something; a slot still held by our own earlier walsender is retried
 * within a second. A fatal failure (bad protocol bytes, slot ahead of the target, setup
 * errors) ends the service with the error; so does, before the first session reached streaming, a refusal
 * the operator must fix (wrong password, pg_hba.conf, privileges, pgsub already running),
 * which later is retried and counted instead. Errors are logged here, once.
 *
 * Every apply error is also recorded in the target (conflict/control.ts): counted in
 * apply_error_count, the failing remote transaction's finish LSN kept for `pgsub skip`.
 * With disable_on_error, an error while applying a remote transaction disables the
 * subscription instead of retrying; a disabled subscription — found so at start, or
 * disabled here — leaves the process up and idle, polling the target until `pgsub
 * enable` (SIGTERM still exits 0). Connection losses never disable it.
 *
 * A subscription `pgsub cutover` finished (its walsender ended by the cutover, or found so
 * at start) is no failure: the service ends with CutOverError, "cut over at LSN X/Y", and
 * its own exit code 5, which systemd does not restart (RestartPreventExitStatus).
 *
 * The run lock taken by a session (preflight.ts) is the single-instance check: the slot
 * guard and the sequence sync start once it was first taken, and `started` tells `pgsub
 * run` it may bind the metrics port, so a second pgsub ends naming the first instead of
 * finding the port taken.
 *
 * The loop's state is ServiceRunner's private fields, each written in one method. What the
 * sessions stand on (table sync, progress line, verify hold) is stream-setup.ts; the visits
 * to the target's control row, target-control.ts; how an error is sorted, error-kinds.ts.
 */
import type { Config } from '../config/config.js';
import { ApplyConflictError, CutOverError, PgsubError, SubscriptionDisabledError } from '../errors.js';
import { isConflictType } from '../conflict/types.js';
import { CarefulReplayError, GroupRetryError } from '../apply/run/loop.js';
import { setMaintenanceTimeout } from '../pgwire/connect.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { Logger } from '../log.js';
import { newCounters, type ApplyCounters } from '../apply/txn/apply-state.js';
import type { Launcher } from '../tablesync/launcher.js';
import type { SyncStates } from '../origin/sync-state.js';
import type { VerifyOutcome } from '../verify/hold.js';
import { startSession, type SessionDeps, type SessionEvents, type SessionHandle } from './session.js';
import type { CopiedTotals } from './progress-log.js';
import { startSlotGuard, type SlotGuard } from './slot-guard.js';
import { TargetControl } from './target-control.js';
import { StreamSetup } from './stream-setup.js';
import type { SlotHealth } from './metrics.js';
import { checkRunPrivileges, OwnConnections } from './preflight.js';
import { connectionFailure, isRetryable, slotBusy } from './error-kinds.js';
import { startSequenceSync, type SequenceSyncService } from '../migrate/sequences.js';
import { Backoff, jitteredDelay } from '../backoff.js';

/** Between attempts while a slot is held by a walsender that is about to go (native's wal_retrieve_retry_interval is 5 s); jittered below it. */
const SLOT_BUSY_RETRY_MS = 1000;
/** How long the service's end waits for a session start it abandoned to let go of its connections. */
const ABANDONED_START_WAIT_MS = 10_000;

export interface Runner {
  /** Resolves when stopped cleanly; rejects with the fatal error otherwise. */
  done: Promise<void>;
  stop(): void;
  counters: ApplyCounters;
  current(): SessionHandle | null;
  sync: SyncStates;
  launcher: Launcher;
  /** What the table sync of this process copied (finished copies), for the `stopped` line. */
  copied(): CopiedTotals;
  /** Failed attempts by error code since the start (auth failures during a run, lost connections…). */
  failures: Record<string, number>;
  /** End the service with this error (it is logged here). */
  fail(err: unknown): void;
  /** Apply errors in this process (pg_stat_subscription_stats.apply_error_count). */
  applyErrors(): number;
  /** Failed sequence sync rounds in this process (sync_seq_error_count); null with sequences: off. */
  sequenceSyncErrors(): number | null;
  /** The slot's health as last read on the publisher (slot-guard.ts). */
  slotHealth(): SlotHealth | null;
  /** The last `pgsub verify` of this subscription, as the service last read it. */
  lastVerify(): VerifyOutcome | null;
  /**
   * Resolves once the single-instance check has its answer: the run lock is taken, or an
   * attempt failed in a way that is waited out (a target that does not answer cannot say).
   * A second pgsub ends (done rejects) without it; so does a service stopped before it.
   * `pgsub run` binds the metrics port only after it, racing it with `done`.
   */
  started: Promise<void>;
}

async function waitAtMost(p: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}

// The error classification lives in error-kinds.ts; this is part of runner.ts's API.
export { isRetryable } from './error-kinds.js';

/** The service loop's state; each field says which method writes it. */
class ServiceRunner {
  readonly counters: ApplyCounters;
  /** Failed attempts by error code since the start (written by #afterError). */
  readonly failures: Record<string, number> = {};
  readonly setup: StreamSetup;
  readonly done: Promise<void>;
  readonly #control: TargetControl;
  /** Given to every session; its carefulLsn and noGroupUntil are written by #takeReplayRequest. */
  readonly #deps: SessionDeps & { carefulLsn: Lsn | null; noGroupUntil: Lsn | null };
  readonly #backoff: Backoff;
  /** Started once the run lock was first taken (written by #runLockTaken). */
  #slotGuard: SlotGuard | null = null;
  /** Resolves `started` (called by #runLockTaken and #sleep). */
  readonly #answerStart: () => void;
  readonly started: Promise<void>;
  /** checkRunPrivileges passed (written by #runSession). */
  #privilegesChecked = false;
  /** Written by stop() only; never cleared. */
  #stopped = false;
  /** A session of this process reached streaming: refusals are retried from now on (written by #runSession). */
  #streamedOnce = false;
  /** The session running, or the last one once stopped (written by #runSession and #afterError). */
  #session: SessionHandle | null = null;
  /** When the current session started, for the backoff; null before (written by #runSession). */
  #sessionStartedAt: number | null = null;
  /** Ends a session start being waited for (set only while waiting, by #startSession). */
  #abandonStart: (() => void) | null = null;
  /** A start abandoned by stop(): settles once it has let go of its connections (written by #startSession). */
  #abandoned: Promise<void> | null = null;
  /** Ends the current #sleep at once (set only while sleeping, by #sleep). */
  #wake: (() => void) | null = null;
  /** A failure found beside the sessions (the slot guard): logged here, the service ends with it (written by fail). */
  #fatal: unknown = null;
  /** Apply errors in this process (written by #afterError). */
  #applyErrors = 0;
  /** Resolves when a session of this process first streams: the sequence sync's first round waits for it (answered by #runSession). */
  readonly #firstStream: Promise<void>;
  readonly #answerFirstStream: () => void;
  /** The published tables' sequences follow the stream to the target (sequences: sync), once the privileges are checked (written by #runSession). */
  #sequenceSync: SequenceSyncService | null = null;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    private readonly events: SessionEvents,
  ) {
    setMaintenanceTimeout(config.targetTimeoutMs);
    this.counters = newCounters();
    const own = new OwnConnections();
    this.#control = new TargetControl(config, log);
    this.setup = new StreamSetup(config, log, this.counters, { stopped: () => this.#stopped, streamedOnce: () => this.#streamedOnce, session: () => this.#session }, this.#control);
    this.#deps = {
      hold: this.setup.verifyHold,
      own,
      sync: this.setup.sync,
      beforeStreaming: (publisher, target) => this.setup.beforeStreaming(publisher, target),
      publications: () => this.setup.publications(),
      onUnknownTable: (schema, table) => this.setup.onUnknownTable(schema, table),
      carefulLsn: null,
      noGroupUntil: null,
      onRunLock: () => this.#runLockTaken(),
    };
    this.#backoff = new Backoff(config.retryMinDelayMs, config.retryMaxDelayMs);
    let answer!: () => void;
    this.started = new Promise<void>((resolve) => (answer = resolve));
    this.#answerStart = answer;
    let streamed!: () => void;
    this.#firstStream = new Promise<void>((resolve) => (streamed = resolve));
    this.#answerFirstStream = streamed;
    // Not answered at the loop's end: a caller racing `started` with `done` sees the end as the end.
    const loop = this.#loop();
    this.done = loop
      .finally(() => this.#close())
      .then(() => {
        if (this.#fatal !== null) throw this.#fatal;
      });
  }

  current(): SessionHandle | null {
    return this.#session;
  }

  applyErrors(): number {
    return this.#applyErrors;
  }

  sequenceSyncErrors(): number | null {
    if (this.config.sequences === 'off') return null;
    return this.#sequenceSync?.errors() ?? 0;
  }

  slotHealth(): SlotHealth | null {
    return this.#slotGuard?.health() ?? null;
  }

  stop(): void {
    this.#stopped = true;
    this.#abandonStart?.();
    this.#session?.stop();
    this.#wake?.();
  }

  fail(err: unknown): void {
    if (this.#fatal !== null || this.#stopped) return;
    this.#fatal = err;
    this.log.fatal({ err }, 'the subscription cannot go on');
    this.stop();
  }

  /** Sessions one after another until stopped; what #afterError throws ends the service. */
  async #loop(): Promise<void> {
    while (!this.#stopped) {
      try {
        await this.#runSession();
      } catch (err) {
        await this.#afterError(err);
      }
    }
  }

  /** One session, from its start to its end; its failure is thrown to #loop. */
  async #runSession(): Promise<void> {
    this.#sessionStartedAt = null;
    // Before anything is created (pgsub's schema, the origin, the slot, a sequence set): every
    // privilege on both sides; the session opens its connections meanwhile and waits for it.
    const privileges = this.#privilegesChecked ? undefined : checkRunPrivileges(this.config).then(() => void (this.#privilegesChecked = true));
    const current = await this.#startSession(privileges);
    if (current === null) return;
    this.#session = current;
    if (this.#stopped) current.stop();
    // A copy that finished while this session was starting waits for the next one.
    else this.setup.restartForFinishedCopies();
    this.#sessionStartedAt = Date.now();
    void current.started.then(() => {
      this.#streamedOnce = true;
      this.#answerFirstStream();
    });
    await this.#untilEnd(current);
    if (this.#stopped) return;
    // A session that ran a while, or committed something, resets the backoff.
    if (this.#madeProgress(current)) this.#backoff.reset();
    this.#session = null;
  }

  /**
   * A session took the run lock: this process is the subscription's one runner. The first
   * time, what works beside the sessions starts — the slot guard (a lost slot ends the
   * service) and the sequence sync — so that a second pgsub, refused at the lock, never
   * touched either, and `started` lets `pgsub run` bind the metrics port.
   */
  #runLockTaken(): void {
    this.setup.onRunLock();
    // A start stop() abandoned may still get this far: nothing new starts once the service ends.
    if (this.#slotGuard === null && !this.#stopped) {
      this.#slotGuard = startSlotGuard(this.config, this.log, {
        intervalMs: this.config.slotCheckIntervalMs,
        maxRetainedBytes: this.config.maxRetainedWalBytes,
        onLost: (err) => this.fail(err),
      });
      this.#sequenceSync = startSequenceSync(this.config, this.log, this.#firstStream);
    }
    this.#answerStart();
  }

  /** The started session, or null when stop() came first: a stop while connecting (a server that does not answer) is not kept waiting for it. */
  async #startSession(privilegesChecked: Promise<void> | undefined): Promise<SessionHandle | null> {
    const starting = startSession(this.config, this.counters, this.log, this.#deps, this.events, privilegesChecked).then(
      (handle) => ({ handle }),
      (error: unknown) => ({ error }),
    );
    const outcome = await new Promise<Awaited<typeof starting> | null>((resolve) => {
      this.#abandonStart = () => resolve(null);
      if (this.#stopped) resolve(null);
      void starting.then(resolve);
    }).finally(() => (this.#abandonStart = null));
    if (outcome === null) {
      // The start ends at its next step (beforeStreaming sees the stop), or its session is
      // stopped once started; the service's end waits for that, and its end never rejects unheard.
      this.#abandoned = starting.then(async (o) => {
        if (!('handle' in o)) return;
        o.handle.stop();
        await o.handle.done.catch(() => {});
      });
      return null;
    }
    if ('error' in outcome) throw outcome.error;
    return outcome.handle;
  }

  /** The session's end; the stream that enables two_phase starts once every table is ready (session.ts). */
  #untilEnd(current: SessionHandle): Promise<void> {
    const { sync, launcher } = this.setup;
    const twoPhaseTimer = current.twoPhasePending
      ? setInterval(() => {
          if (sync.all().every((t) => t.state === 'r') && !launcher.busy && this.#session === current) {
            this.log.info({}, 'every table is ready; restarting the stream to enable two_phase');
            current.stop();
          }
        }, 250)
      : null;
    return current.done.finally(() => {
      if (twoPhaseTimer) clearInterval(twoPhaseTimer);
    });
  }

  /** The session committed something, or ran longer than retry_max_delay. */
  #madeProgress(session: SessionHandle | null): boolean {
    return session?.madeProgress() || (this.#sessionStartedAt !== null && Date.now() - this.#sessionStartedAt > this.config.retryMaxDelayMs);
  }

  /** After a session's failure: the cutover's end, a wait, a re-stream, or a retry after the backoff; a throw ends the service. */
  async #afterError(err: unknown): Promise<void> {
    const { log, failures } = this;
    const failed = this.#session?.failedTransaction() ?? null;
    // A session that committed something shows the fault is new: start the backoff over.
    if (this.#madeProgress(this.#session)) this.#backoff.reset();
    this.#session = null;
    if (this.#stopped) return;
    const cut = err instanceof GroupRetryError || err instanceof CarefulReplayError ? null : await this.#control.cutOver(err);
    if (cut) this.#endCutOver(cut);
    const code = String((err as { code?: unknown })?.code ?? 'UNKNOWN');
    failures[code] = (failures[code] ?? 0) + 1;
    if (err instanceof SubscriptionDisabledError) {
      log.warn({ err }, 'subscription disabled; waiting for pgsub enable');
      await this.#waitForEnable();
      return;
    }
    if (this.#takeReplayRequest(err)) return;
    if (err instanceof PgsubError && err.fatalAtStartup && !this.#streamedOnce) {
      log.fatal({ err }, 'cannot start: fix this and start pgsub again');
      throw err;
    }
    if (slotBusy(err)) {
      const retryInMs = jitteredDelay(SLOT_BUSY_RETRY_MS);
      log.warn({ err, retryInMs, attempts: failures[code] }, 'replication slot still held by an earlier connection; retrying');
      await this.#sleep(retryInMs);
      return;
    }
    if (!connectionFailure(err)) this.#applyErrors++;
    // A conflict under `error` is detected and raises the apply error: both count, each time (as PostgreSQL; recordError does the same in the target).
    if (err instanceof ApplyConflictError && isConflictType(err.conflict)) this.counters.conflicts[err.conflict]++;
    const disabled = await this.#control.recordError(err, failed);
    if (this.#stopped) return;
    if (!isRetryable(err)) {
      log.fatal({ err }, 'apply stopped by a non-retryable error');
      throw err;
    }
    if (disabled) {
      log.error({ err, ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) }, 'apply failed; subscription disabled (disable_on_error)');
      await this.#waitForEnable();
      this.#backoff.reset();
      return;
    }
    // The wait actually slept (jittered, backoff.ts) is the one logged.
    const retryInMs = this.#backoff.next();
    log.error({ err, retryInMs, attempts: failures[code], ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) }, 'apply failed; retrying');
    // Not unref'd: between sessions this timer is what keeps the service alive.
    await this.#sleep(retryInMs);
  }

  /**
   * The cutover's end of the forward service: its normal end, not a failure — logged at info
   * (what happened and at which LSN), never as an error, and the service ends with exit 5.
   * The error that ended the session (the walsender the cutover terminated, 57P01) is not
   * logged: the cutover is what happened.
   */
  #endCutOver(cut: CutOverError): never {
    this.log.info({ subscription: this.config.subscription, lsn: cut.context.lsn, code: cut.code }, cut.message);
    throw cut;
  }

  /** Not yet an error: the apply asks for its transactions re-streamed, and the next session's deps say how. */
  #takeReplayRequest(err: unknown): boolean {
    if (err instanceof GroupRetryError) {
      // The failing transaction is found by applying the group one by one.
      // The one line of this failure (apply lanes hand theirs here unlogged): the cause is the statement's error.
      this.log.info({ err }, 'a grouped transaction failed; re-applying one transaction at a time');
      this.#deps.noGroupUntil = err.untilLsn;
      return true;
    }
    if (err instanceof CarefulReplayError) {
      // A large conflicting transaction is re-applied carefully from its start.
      this.log.info({ finishLsn: err.context.finishLsn }, 're-streaming a conflicting transaction to apply it carefully');
      this.#deps.carefulLsn = err.finishLsn;
      return true;
    }
    return false;
  }

  // A stop during the wait ends it at once, and clears its timer (which would hold the
  // process up to retry_max_delay); a stop just before it skips it.
  #sleep(ms: number): Promise<void> {
    // A failure the service waits out, not its end: the single-instance check has no better answer yet.
    this.#answerStart();
    if (this.#stopped) return Promise.resolve();
    let timer: NodeJS.Timeout | undefined;
    return new Promise<void>((resolve) => {
      this.#wake = resolve;
      timer = setTimeout(resolve, ms);
    }).finally(() => {
      clearTimeout(timer);
      this.#wake = null;
    });
  }

  /** Idle until `pgsub enable` (or stop): the subscription is disabled in the target. */
  async #waitForEnable(): Promise<void> {
    const pollMs = Math.min(this.config.retryMaxDelayMs, 5000);
    while (!this.#stopped) {
      await this.#sleep(pollMs);
      if (this.#stopped) return;
      const answer = await this.#control.enabled();
      if (answer instanceof CutOverError) this.#endCutOver(answer);
      if (answer) return;
    }
  }

  /** The service's end, once the loop's: what ran beside the sessions, in this order. */
  async #close(): Promise<void> {
    // Before what an abandoned start may still use (the launcher, the verify hold) is closed;
    // bounded, since a server that does not answer keeps a connection attempt pending.
    if (this.#abandoned !== null) await waitAtMost(this.#abandoned, ABANDONED_START_WAIT_MS);
    this.setup.stopProgressLog();
    await this.#sequenceSync?.stop();
    await this.#slotGuard?.stop();
    return this.setup.close();
  }
}

export function startRunner(config: Config, log: Logger, events: SessionEvents = {}): Runner {
  const runner = new ServiceRunner(config, log, events);
  const { setup } = runner;
  return {
    done: runner.done,
    sync: setup.sync,
    launcher: setup.launcher,
    counters: runner.counters,
    copied: () => setup.progressLog.copiedTotals(),
    failures: runner.failures,
    current: () => runner.current(),
    stop: () => runner.stop(),
    fail: (err) => runner.fail(err),
    slotHealth: () => runner.slotHealth(),
    applyErrors: () => runner.applyErrors(),
    sequenceSyncErrors: () => runner.sequenceSyncErrors(),
    lastVerify: () => setup.verifyHold.last,
    started: runner.started,
  };
}
