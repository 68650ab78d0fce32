/**
 * The service loop: run apply sessions until stopped. A retryable failure (lost
 * connection, a target that cannot take a change yet, a missing column the operator can
 * add) ends the session, rolls back what was in flight, and starts a new one after an
 * exponential backoff — resuming from the origin committed in the target, so nothing is
 * lost or applied twice. A fatal failure (bad protocol bytes, slot ahead of the target,
 * setup errors) ends the service with the error. Errors are logged here, once.
 */
import type { Config } from '../config/config.js';
import { PgsubError } from '../errors.js';
import { redactSecrets } from '../config/conninfo.js';
import type { Logger } from '../log.js';
import { newCounters, type ApplyCounters } from '../apply/state.js';
import { Launcher } from '../tablesync/launcher.js';
import { ProgressReporter } from '../tablesync/progress.js';
import { SyncStates } from '../tablesync/state.js';
import { startSession, type SessionEvents, type SessionHandle } from './session.js';

export interface Runner {
  /** Resolves when stopped cleanly; rejects with the fatal error otherwise. */
  done: Promise<void>;
  stop(): void;
  counters: ApplyCounters;
  current(): SessionHandle | null;
  sync: SyncStates;
  launcher: Launcher;
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
  const launcher = new Launcher(config, log, sync, { onCopyFinished: restartForFinishedCopies, onIdle: restartForFinishedCopies });
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
      while (!stopped && sync.copying().length > 0) await new Promise((r) => setTimeout(r, 200));
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
  const deps = { sync, beforeStreaming, onUnknownTable };

  const done = (async () => {
    let delay = config.retryMinDelayMs;
    while (!stopped) {
      try {
        session = await startSession(config, counters, log, deps, events);
        if (stopped) session.stop();
        // A copy that finished while this session was starting waits for the next one.
        else restartForFinishedCopies();
        const startedAt = Date.now();
        await session.done;
        if (stopped) return;
        // A session that ran a while before failing resets the backoff.
        if (Date.now() - startedAt > config.retryMaxDelayMs) delay = config.retryMinDelayMs;
      } catch (err) {
        session = null;
        if (stopped) return;
        if (!isRetryable(err)) {
          log.fatal({ err: describeError(err) }, 'apply stopped by a non-retryable error');
          throw err;
        }
        log.error({ err: describeError(err), retryInMs: delay }, 'apply failed; retrying');
        // Not unref'd: between sessions this timer is what keeps the service alive.
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, delay);
        });
        wake = null;
        delay = Math.min(delay * 2, config.retryMaxDelayMs);
      }
    }
  })();

  const finished = done.finally(() => launcher.stop());
  return {
    done: finished,
    sync,
    launcher,
    counters,
    current: () => session,
    stop() {
      stopped = true;
      session?.stop();
      wake?.();
    },
  };
}
