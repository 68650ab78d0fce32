/**
 * The service loop: run apply sessions until stopped. A retryable failure (lost
 * connection, a target that cannot take a change yet, a missing column the operator can
 * add) ends the session, rolls back what was in flight, and starts a new one after an
 * exponential backoff — resuming from the origin committed in the target, so nothing is
 * lost or applied twice. A fatal failure (bad protocol bytes, slot ahead of the target,
 * setup errors) ends the service with the error. Errors are logged here, once.
 *
 * Every apply error is also recorded in the target (conflict/control.ts): counted in
 * apply_error_count, the failing remote transaction's finish LSN kept for `pgsub skip`.
 * With disable_on_error, an error while applying a remote transaction disables the
 * subscription instead of retrying; a disabled subscription — found so at start, or
 * disabled here — leaves the process up and idle, polling the target until `pgsub
 * enable` (SIGTERM still exits 0). Connection losses never disable it.
 */
import type { Config } from '../config/config.js';
import { ApplyConflictError, ConnectionLostError, PgsubError, SubscriptionDisabledError } from '../errors.js';
import { CarefulReplayError, GroupRetryError } from '../apply/loop.js';
import { openMaintenance } from '../apply/target.js';
import { loadControl, recordApplyError } from '../conflict/control.js';
import type { ConflictRecord } from '../conflict/report.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { redactSecrets } from '../config/conninfo.js';
import type { Logger } from '../log.js';
import { newCounters, type ApplyCounters } from '../apply/state.js';
import { Launcher } from '../tablesync/launcher.js';
import { ProgressReporter } from '../tablesync/progress.js';
import { SyncStates } from '../tablesync/state.js';
import { startSession, type SessionEvents, type SessionHandle } from './session.js';
import { ProgressLog, type CopiedTotals } from './progress-log.js';

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
}

export function isRetryable(err: unknown): boolean {
  if (err instanceof PgsubError) return err.retryable;
  // SQL errors from the target (unique violation, lock timeout, …) are retried like the
  // native worker, which exits and is restarted by the launcher.
  return true;
}

export function describeError(err: unknown): Record<string, unknown> {
  const e = err as { code?: string; message?: string; context?: unknown; detail?: string; table_name?: string; constraint_name?: string };
  return {
    code: e?.code,
    message: redactSecrets(String(e?.message ?? err)),
    ...(e?.context ? { context: e.context } : {}),
    ...(e?.detail ? { detail: redactSecrets(e.detail) } : {}),
    ...(e?.constraint_name ? { constraint: e.constraint_name } : {}),
  };
}

export function startRunner(config: Config, log: Logger, events: SessionEvents = {}): Runner {
  const counters = newCounters();
  let stopped = false;
  let session: SessionHandle | null = null;
  let wake: (() => void) | null = null;
  let streaming = false;
  const sync = new SyncStates(config.copyData);
  // A copy that finished behind the stream needs the stream restarted from its position;
  // wait until no copy runs, so one restart serves them all.
  const restartForFinishedCopies = () => {
    if (!streaming || launcher.busy || stopped) return;
    if (sync.all().some((t) => t.state === 'f')) {
      log.info({}, 'restarting the stream so finished copies catch up');
      session?.stop();
    }
  };
  // `pgsub skip` while running: the session takes the new skip LSN from the target.
  const onSkipRequested = () => {
    const sql = openMaintenance(config.target, appName);
    void loadControl(sql, config.subscription)
      .then((control) => {
        session?.setSkipLsn(control.skipLsn);
        if (control.skipLsn !== null) log.info({ skipLsn: formatLsn(control.skipLsn) }, 'remote transaction to skip');
      })
      .catch((err: unknown) => log.warn({ err: describeError(err) }, 'cannot read the skip request; it is taken at the next start'))
      .finally(() => sql.end({ timeout: 5 }).catch(() => {}));
  };
  // The 30 s progress line; it also counts the rows each finished copy brought.
  const progressLog = new ProgressLog(config, log, { counters, sync, session: () => session, copyRunning: () => launcher.busy });
  const launcher = new Launcher(config, log, sync, {
    onCopyFinished: (t) => {
      progressLog.copyFinished(launcher.progress.get(`${t.schema}.${t.table}`));
      restartForFinishedCopies();
    },
    onIdle: restartForFinishedCopies,
    onSkipRequested,
  });
  progressLog.start();
  let launcherStarted = false;
  const beforeStreaming = async () => {
    streaming = false;
    await launcher.load();
    await launcher.refresh();
    if (!launcherStarted) {
      launcherStarted = true;
      launcher.startPeriodicRefresh();
      new ProgressReporter(launcher.progress, log, null).start();
    }
    // The initial copy: nothing is ready yet, so streaming now would only be re-streamed.
    if (!sync.all().some((t) => t.state === 'r' || t.state === 's') && sync.copying().length > 0) {
      // Log events come from the runner-wide reporter; this one draws and summarises.
      const reporter = new ProgressReporter(launcher.progress, log, process.stderr.isTTY ? process.stderr : null, Infinity);
      reporter.start();
      // Woken by the last copy's end rather than a poll's next tick; still a poll while a
      // failed copy waits for its retry, and to notice a stop.
      while (!stopped && sync.copying().length > 0) {
        const tick = new Promise<void>((r) => setTimeout(r, 200));
        await (launcher.busy ? Promise.race([launcher.idle(), tick]) : tick);
      }
      reporter.finish();
      if (!stopped) log.info({ tables: sync.all().length }, 'initial copy finished');
    }
    streaming = true;
  };
  // Changes of a table not registered yet arrive row after row: one refresh per table name.
  const reportedUnknown = new Set<string>();
  const onUnknownTable = (schema: string, table: string) => {
    const name = `${schema}.${table}`;
    if (reportedUnknown.has(name)) return;
    reportedUnknown.add(name);
    void launcher.refresh().catch(() => {});
  };
  const deps: { sync: SyncStates; beforeStreaming: () => Promise<void>; onUnknownTable: typeof onUnknownTable; carefulLsn: Lsn | null; noGroupUntil: Lsn | null } = {
    sync,
    beforeStreaming,
    onUnknownTable,
    carefulLsn: null,
    noGroupUntil: null,
  };
  const appName = `pgsub_${config.subscription}`;

  const sleep = (ms: number) =>
    new Promise<void>((resolve) => {
      wake = resolve;
      setTimeout(resolve, ms);
    }).finally(() => (wake = null));

  /** Idle until `pgsub enable` (or stop): the subscription is disabled in the target. */
  const waitForEnable = async () => {
    const pollMs = Math.min(config.retryMaxDelayMs, 5000);
    while (!stopped) {
      await sleep(pollMs);
      if (stopped) return;
      const sql = openMaintenance(config.target, appName);
      try {
        if ((await loadControl(sql, config.subscription)).enabled) {
          log.info({ subscription: config.subscription }, 'subscription enabled; resuming');
          return;
        }
      } catch (err) {
        log.debug({ err: describeError(err) }, 'cannot read the subscription state; still waiting');
      } finally {
        await sql.end({ timeout: 5 }).catch(() => {});
      }
    }
  };

  /** Record the error in the target; returns whether the subscription is now disabled. */
  const recordError = async (err: unknown, failed: { finishLsn: Lsn; xid: number } | null): Promise<boolean> => {
    // A lost connection is not the target's data disagreeing, and the target may be unreachable.
    if (err instanceof ConnectionLostError) return false;
    const disable = config.disableOnError && failed !== null;
    const e = describeError(err);
    const sql = openMaintenance(config.target, appName);
    try {
      await recordApplyError(sql, config.subscription, {
        failed,
        code: String(e.code ?? 'UNKNOWN'),
        message: String(e.message),
        conflict: err instanceof ApplyConflictError ? (err.record as ConflictRecord) : null,
        disable,
      });
      return disable;
    } catch (recordErr) {
      // The target may be what failed; the error is still logged below.
      log.debug({ err: describeError(recordErr) }, 'cannot record the apply error in the target');
      return false;
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {});
    }
  };

  const done = (async () => {
    let delay = config.retryMinDelayMs;
    while (!stopped) {
      try {
        session = await startSession(config, counters, log, deps, events);
        if (stopped) session.stop();
        // A copy that finished while this session was starting waits for the next one.
        else restartForFinishedCopies();
        const startedAt = Date.now();
        const current = session;
        // The stream that enables two_phase starts once every table is ready (session.ts).
        const twoPhaseTimer = current.twoPhasePending
          ? setInterval(() => {
              if (sync.all().every((t) => t.state === 'r') && !launcher.busy && session === current) {
                log.info({}, 'every table is ready; restarting the stream to enable two_phase');
                current.stop();
              }
            }, 250)
          : null;
        await session.done.finally(() => {
          if (twoPhaseTimer) clearInterval(twoPhaseTimer);
        });
        if (stopped) return;
        // A session that ran a while before failing resets the backoff.
        if (Date.now() - startedAt > config.retryMaxDelayMs) delay = config.retryMinDelayMs;
      } catch (err) {
        const failed = session?.failedTransaction() ?? null;
        session = null;
        if (stopped) return;
        if (err instanceof SubscriptionDisabledError) {
          log.warn({ err: describeError(err) }, 'subscription disabled; waiting for pgsub enable');
          await waitForEnable();
          continue;
        }
        if (err instanceof GroupRetryError) {
          // Not yet an error: the failing transaction is found by applying the group one by one.
          log.info({ untilLsn: err.context.untilLsn, cause: describeError(err.cause).message }, 'a grouped transaction failed; re-applying one transaction at a time');
          deps.noGroupUntil = err.untilLsn;
          continue;
        }
        if (err instanceof CarefulReplayError) {
          // Not an error: a large conflicting transaction is re-applied carefully from its start.
          log.info({ finishLsn: err.context.finishLsn }, 're-streaming a conflicting transaction to apply it carefully');
          deps.carefulLsn = err.finishLsn;
          continue;
        }
        const disabled = await recordError(err, failed);
        if (!isRetryable(err)) {
          log.fatal({ err: describeError(err) }, 'apply stopped by a non-retryable error');
          throw err;
        }
        if (disabled) {
          log.error({ err: describeError(err), ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) }, 'apply failed; subscription disabled (disable_on_error)');
          await waitForEnable();
          delay = config.retryMinDelayMs;
          continue;
        }
        log.error({ err: describeError(err), retryInMs: delay, ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) }, 'apply failed; retrying');
        // Not unref'd: between sessions this timer is what keeps the service alive.
        await sleep(delay);
        delay = Math.min(delay * 2, config.retryMaxDelayMs);
      }
    }
  })();

  const finished = done.finally(() => {
    progressLog.stop();
    return launcher.stop();
  });
  return {
    done: finished,
    sync,
    launcher,
    counters,
    copied: () => progressLog.copiedTotals(),
    current: () => session,
    stop() {
      stopped = true;
      session?.stop();
      wake?.();
    },
  };
}
