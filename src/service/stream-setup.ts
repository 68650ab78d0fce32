/**
 * What the service's sessions stand on beside their stream: the table sync (launcher,
 * sync states, copy reporters), the 30 s progress line and the `pgsub verify` hold, and
 * the steps every session start runs through it before streaming (SessionDeps.beforeStreaming
 * in session.ts): the startup checks, the tables' refresh (at the process's first session,
 * when the publication list changed) or resume, the initial copy, the hold's start. It
 * restarts the running session when finished copies must catch up or a refresh finds
 * another set of the configured publications existing (the stream carries only those);
 * which session runs, and whether the service is stopping, it reads from the service loop
 * (runner.ts). Changes of a table published but not part of the subscription are skipped
 * by the apply (origin/sync-state.ts); this names each such table once.
 */
import type { Config } from '../config/config.js';
import { PgsubError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { ApplyCounters } from '../apply/txn/apply-state.js';
import { Launcher } from '../tablesync/launcher.js';
import type { ReplicationConnection } from '../protocol/replication.js';
import type { Sql } from '../pgwire/connect.js';
import { ProgressReporter } from '../tablesync/copy-report.js';
import { SyncStates } from '../origin/sync-state.js';
import { VerifyHold } from '../verify/hold.js';
import { checkMappingsAtStartup } from '../mapping/plan.js';
import { ProgressLog } from './progress-log.js';
import { checkTableAccess } from './preflight.js';
import type { SessionHandle } from './session.js';
import type { TargetControl } from './target-control.js';

/** Ends a session start the service no longer waits for (stop() during it): never reported. */
class StoppedWhileStartingError extends PgsubError {
  readonly code = 'PGSUB_STOPPED_WHILE_STARTING';
  readonly retryable = false;
}

/** Waits for every step, then throws the first failure in the order given (null: a step not run). */
async function settledInOrder(steps: (Promise<unknown> | null)[]): Promise<void> {
  for (const result of await Promise.allSettled(steps)) if (result.status === 'rejected') throw result.reason;
}

/** The service loop's state this reads (runner.ts writes it). */
export interface LoopView {
  stopped(): boolean;
  /** A session of this process reached streaming: refusals are retried from now on. */
  streamedOnce(): boolean;
  session(): SessionHandle | null;
}

export class StreamSetup {
  readonly sync: SyncStates;
  readonly launcher: Launcher;
  readonly progressLog: ProgressLog;
  readonly verifyHold: VerifyHold;
  /** The current session is past beforeStreaming (written only there). */
  #streaming = false;
  #launcherStarted = false;
  #verifyStarted = false;
  /** Changes of a table not registered yet arrive row after row: one log line per table name. */
  readonly #reportedUnknown = new Set<string>();
  /** The configured publications that exist, as the launcher last found them. */
  #publications: readonly string[] = [];
  /** The session a publication change will restart (one wait per session). */
  #restartPending: SessionHandle | null = null;

  constructor(
    private readonly config: Config,
    private readonly log: Logger,
    counters: ApplyCounters,
    private readonly loop: LoopView,
    control: TargetControl,
  ) {
    this.sync = new SyncStates();
    // The 30 s progress line; it also counts the rows each finished copy brought.
    this.progressLog = new ProgressLog(log, { counters, sync: this.sync, session: () => loop.session(), copyRunning: () => this.launcher.busy });
    this.launcher = new Launcher(config, log, this.sync, {
      onCopyFinished: (t) => {
        this.progressLog.copyFinished(this.launcher.progress.get(`${t.schema}.${t.table}`));
        this.restartForFinishedCopies();
      },
      onIdle: () => this.restartForFinishedCopies(),
      onSkipRequested: () => control.takeSkipRequest(() => loop.session()),
      onPublications: (existing, seenAt) => this.#publicationsFound(existing, seenAt),
    });
    this.progressLog.start();
    // `pgsub verify` holds the apply at an LSN through this (verify/hold.ts); apply lanes and
    // parallel apply commit where its gate does not look, so the request is refused then.
    this.verifyHold = new VerifyHold({
      target: config.target,
      subscription: config.subscription,
      log,
      refusal:
        config.applyWorkers > 1
          ? `apply_workers = ${config.applyWorkers}: the verify hold does not cover apply lanes yet; run the verify with apply_workers = 1`
          : config.streaming === 'parallel'
            ? 'streaming = parallel: the verify hold does not cover parallel apply yet; run the verify with streaming = on'
            : null,
    });
  }

  // A copy that finished behind the stream needs the stream restarted from its position;
  // wait until no copy runs, so one restart serves them all.
  restartForFinishedCopies(): void {
    if (!this.#streaming || this.launcher.busy || this.loop.stopped()) return;
    if (this.sync.all().some((t) => t.state === 'f')) {
      this.log.info({}, 'restarting the stream so finished copies catch up');
      this.loop.session()?.stop();
    }
  }

  /**
   * A change of a table the subscription does not have (published since the last refresh):
   * skipped, as native's apply worker skips a relation without a pg_subscription_rel row.
   * Named once per process; `pgsub refresh` or the periodic refresh adds it.
   */
  onUnknownTable(schema: string, table: string): void {
    const name = `${schema}.${table}`;
    if (this.#reportedUnknown.has(name)) return;
    this.#reportedUnknown.add(name);
    this.log.info(
      { table: name, refreshInterval: this.config.refreshIntervalMs / 1000 },
      'changes skipped: the table is published but not part of the subscription yet; pgsub refresh (or the periodic refresh) adds it',
    );
  }

  /** The configured publications that exist (START_REPLICATION's list, session.ts). */
  publications(): readonly string[] {
    return this.#publications;
  }

  /**
   * A refresh's look at the publications: a streaming session with another set is restarted
   * (an ordinary re-stream from the origin) once its origin has passed `seenAt`, the WAL
   * position at which the refresh saw them: a walsender before PostgreSQL 18 fails on a
   * publication missing in the catalog as of a change it decodes, so the new stream must
   * start after the publication's creation.
   */
  #publicationsFound(existing: readonly string[], seenAt: Lsn): void {
    this.#publications = existing;
    const session = this.loop.session();
    if (!this.#streaming || !session || this.loop.stopped() || this.#restartPending === session) return;
    const same = session.publications.length === existing.length && session.publications.every((p) => existing.includes(p));
    if (same || existing.length === 0) return;
    this.#restartPending = session;
    this.log.info({ was: session.publications, now: existing, after: formatLsn(seenAt) }, 'the publications to stream changed; restarting the stream');
    const restart = async () => {
      while (!this.loop.stopped() && this.loop.session() === session && session.progress.durable < seenAt) await new Promise((r) => setTimeout(r, 200));
      if (!this.loop.stopped() && this.loop.session() === session) session.stop();
    };
    void restart();
  }

  /** A session took the run lock: the launcher's target session opens while the session checks the publisher and the slot. */
  onRunLock(): void {
    this.launcher.connect();
  }

  /**
   * `publisher`: the session's replication connection, lent to the launcher until
   * START_REPLICATION; `target`: the session's target session for the steps before streaming,
   * lent for the table checks.
   */
  async beforeStreaming(publisher: ReplicationConnection, target: Sql): Promise<void> {
    this.#streaming = false;
    // A start abandoned by stop() goes no further: its session closes what it opened.
    this.#endIfStopped();
    const { config, launcher, sync } = this;
    const first = !this.loop.streamedOnce();
    // The verify hold listens and reads on connections of its own: beside the steps below
    // (each a connection's round trips at a start), awaited before streaming.
    const holdStarting = this.#verifyStarted ? null : this.verifyHold.start();
    this.#verifyStarted = true;
    // Before any copy or stream: a mapping that does not fit the publisher's tables or the target (mapping-plan.ts).
    await settledInOrder([first ? checkMappingsAtStartup(config, this.log) : null, launcher.load()]);
    // A refresh only where the publication list changed since the last one (or a new
    // subscription); every other session start only resumes the copies due.
    const register = !this.#launcherStarted && (await launcher.refreshDueAtStart());
    // At startup, before any copy: a role that cannot write the tables is a setup error, and
    // so is one whose row-level security would hide rows from the apply (row-security.ts).
    const checks = () => checkTableAccess(config, sync.all(), target);
    // A resume with no copy due keeps the tables just loaded: the checks run beside it.
    if (first && !register && sync.copying().length === 0) await settledInOrder([launcher.atSessionStart(false, publisher), checks()]);
    else {
      await launcher.atSessionStart(register, publisher);
      if (first) await checks();
    }
    if (!this.#launcherStarted) {
      this.#launcherStarted = true;
      launcher.startPeriodicRefresh();
      new ProgressReporter(launcher.progress, this.log, null).start();
    }
    // The initial copy: nothing is ready yet, so streaming now would only be re-streamed.
    if (!sync.all().some((t) => t.state === 'r' || t.state === 's') && sync.copying().length > 0) await this.#waitForInitialCopy();
    // Only after the check for an initial copy above: an await between the launcher's
    // refresh and that check let a small table's copy finish unseen (no 'initial copy finished').
    this.#endIfStopped();
    await holdStarting;
    this.#endIfStopped();
    this.#streaming = true;
  }

  async #waitForInitialCopy(): Promise<void> {
    const { launcher, sync } = this;
    // Log events come from the runner-wide reporter; this one draws and summarises.
    const reporter = new ProgressReporter(launcher.progress, this.log, process.stderr.isTTY ? process.stderr : null, Infinity);
    reporter.start();
    // Woken by the last copy's end rather than a poll's next tick; still a poll while a
    // failed copy waits for its retry, and to notice a stop.
    while (!this.loop.stopped() && sync.copying().length > 0) {
      const tick = new Promise<void>((r) => setTimeout(r, 200));
      await (launcher.busy ? Promise.race([launcher.idle(), tick]) : tick);
    }
    reporter.finish();
    this.#endIfStopped();
    this.log.info({ tables: sync.all().length }, 'initial copy finished');
  }

  #endIfStopped(): void {
    if (this.loop.stopped()) throw new StoppedWhileStartingError('the service is stopping');
  }

  /** At the service's end, after the abandoned start let go and before the sequences and the slot guard stop. */
  stopProgressLog(): void {
    this.progressLog.stop();
  }

  /** Last at the service's end: the verify hold, then the table sync. */
  async close(): Promise<void> {
    await this.verifyHold.close();
    return this.launcher.stop();
  }
}
