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
import { startSession, type SessionEvents, type SessionHandle } from './session.js';

export interface Runner {
  /** Resolves when stopped cleanly; rejects with the fatal error otherwise. */
  done: Promise<void>;
  stop(): void;
  counters: ApplyCounters;
  current(): SessionHandle | null;
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

  const done = (async () => {
    let delay = config.retryMinDelayMs;
    while (!stopped) {
      try {
        session = await startSession(config, counters, log, events);
        if (stopped) session.stop();
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

  return {
    done,
    counters,
    current: () => session,
    stop() {
      stopped = true;
      session?.stop();
      wake?.();
    },
  };
}
