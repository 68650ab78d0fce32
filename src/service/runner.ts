/**
 * The service loop: run apply sessions until stopped. A retryable failure (lost
 * connection, a target that cannot take a change yet, a missing column the operator can
 * add) ends the session, rolls back what was in flight, and starts a new one after an
 * exponential backoff — resuming from the origin committed in the target, so nothing is
 * lost or applied twice. The backoff starts over after a session that committed
 * something; a slot still held by our own earlier walsender is retried every second. A
 * fatal failure (bad protocol bytes, slot ahead of the target, setup errors) ends the
 * service with the error; so does, before the first session reached streaming, a refusal
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
 */
import type { Config } from '../config/config.js';
import { PgsubError, SubscriptionDisabledError } from '../errors.js';
import { CarefulReplayError, GroupRetryError } from '../apply/run/loop.js';
import { setMaintenanceTimeout } from '../pgwire/connect.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import type { Logger } from '../log.js';
import { newCounters, type ApplyCounters } from '../apply/txn/apply-state.js';
import type { Launcher } from '../tablesync/launcher.js';
import type { SyncStates } from '../origin/sync-state.js';
import type { VerifyHold, VerifyOutcome } from '../verify/hold.js';
import { startSession, type SessionEvents, type SessionHandle } from './session.js';
import type { CopiedTotals } from './progress-log.js';
import { startSlotGuard } from './slot-guard.js';
import { TargetControl } from './target-control.js';
import { StreamSetup } from './stream-setup.js';
import type { SlotHealth } from './metrics.js';
import { checkRunPrivileges, OwnConnections } from './preflight.js';
import { connectionFailure, describeError, isRetryable, slotBusy } from './error-kinds.js';
import { startSequenceSync, type SequenceSyncService } from '../migrate/sequences.js';

/** Between attempts while a slot is held by a walsender that is about to go (native's wal_retrieve_retry_interval is 5 s). */
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
  /** The slot's health as last read on the publisher (slot-guard.ts). */
  slotHealth(): SlotHealth | null;
  /** The last `pgsub verify` of this subscription, as the service last read it. */
  lastVerify(): VerifyOutcome | null;
}

async function waitAtMost(p: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}

// The error classification lives in error-kinds.ts; these two are part of runner.ts's API.
export { describeError, isRetryable } from './error-kinds.js';

export function startRunner(config: Config, log: Logger, events: SessionEvents = {}): Runner {
  setMaintenanceTimeout(config.targetTimeoutMs);
  const counters = newCounters();
  const failures: Record<string, number> = {};
  const own = new OwnConnections();
  const control = new TargetControl(config, log);
  /** A session of this process reached streaming: refusals are retried from now on. */
  let streamedOnce = false;
  let stopped = false;
  /** Ends a session start being waited for (set only while waiting). */
  let abandonStart: (() => void) | null = null;
  /** A start abandoned by stop(): settles once it has let go of its connections. */
  let abandoned: Promise<void> | null = null;
  let session: SessionHandle | null = null;
  let wake: (() => void) | null = null;
  const setup = new StreamSetup(config, log, counters, { stopped: () => stopped, streamedOnce: () => streamedOnce, session: () => session }, control);
  const { sync, launcher, progressLog, verifyHold } = setup;
  const deps: {
    sync: SyncStates;
    beforeStreaming: () => Promise<void>;
    onUnknownTable: (schema: string, table: string) => void;
    carefulLsn: Lsn | null;
    noGroupUntil: Lsn | null;
    own: OwnConnections;
    hold: VerifyHold;
  } = {
    hold: verifyHold,
    own,
    sync,
    beforeStreaming: () => setup.beforeStreaming(),
    onUnknownTable: (schema, table) => setup.onUnknownTable(schema, table),
    carefulLsn: null,
    noGroupUntil: null,
  };

  // A stop during the wait ends it at once, and clears its timer (which would hold the
  // process up to retry_max_delay); a stop just before it skips it.
  const sleep = (ms: number) => {
    if (stopped) return Promise.resolve();
    let timer: NodeJS.Timeout | undefined;
    return new Promise<void>((resolve) => {
      wake = resolve;
      timer = setTimeout(resolve, ms);
    }).finally(() => {
      clearTimeout(timer);
      wake = null;
    });
  };

  /** Idle until `pgsub enable` (or stop): the subscription is disabled in the target. */
  const waitForEnable = async () => {
    const pollMs = Math.min(config.retryMaxDelayMs, 5000);
    while (!stopped) {
      await sleep(pollMs);
      if (stopped) return;
      if (await control.enabled()) return;
    }
  };

  function stop(): void {
    stopped = true;
    abandonStart?.();
    session?.stop();
    wake?.();
  }
  /** A failure found beside the sessions (the slot guard): logged here, the service ends with it. */
  let fatal: unknown = null;
  let applyErrors = 0;
  function fail(err: unknown): void {
    if (fatal !== null || stopped) return;
    fatal = err;
    log.fatal({ err: describeError(err) }, 'the subscription cannot go on');
    stop();
  }

  // The published tables' sequences follow the stream to the target (sequences: sync), once the privileges are checked.
  let sequenceSync: SequenceSyncService | null = null;
  const done = (async () => {
    let delay = config.retryMinDelayMs;
    while (!stopped) {
      let startedAt: number | null = null;
      try {
        // Before anything is created (pgsub's schema, the origin, the slot, a sequence set): every privilege on both sides.
        if (sequenceSync === null) {
          await checkRunPrivileges(config);
          sequenceSync = startSequenceSync(config, log);
        }
        // A stop while connecting (a server that does not answer) is not kept waiting for it.
        const starting = startSession(config, counters, log, deps, events).then(
          (handle) => ({ handle }),
          (error: unknown) => ({ error }),
        );
        const outcome = await new Promise<Awaited<typeof starting> | null>((resolve) => {
          abandonStart = () => resolve(null);
          if (stopped) resolve(null);
          void starting.then(resolve);
        }).finally(() => (abandonStart = null));
        if (outcome === null) {
          // The start ends at its next step (beforeStreaming sees the stop), or its session is
          // stopped once started; the service's end waits for that, and its end never rejects unheard.
          abandoned = starting.then(async (o) => {
            if (!('handle' in o)) return;
            o.handle.stop();
            await o.handle.done.catch(() => {});
          });
          return;
        }
        if ('error' in outcome) throw outcome.error;
        session = outcome.handle;
        if (stopped) session.stop();
        // A copy that finished while this session was starting waits for the next one.
        else setup.restartForFinishedCopies();
        startedAt = Date.now();
        const current = session;
        void current.started.then(() => (streamedOnce = true));
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
        // A session that ran a while, or committed something, resets the backoff.
        if (current.madeProgress() || Date.now() - startedAt > config.retryMaxDelayMs) delay = config.retryMinDelayMs;
        session = null;
      } catch (err) {
        const failed = session?.failedTransaction() ?? null;
        // A session that committed something shows the fault is new: start the backoff over.
        if (session?.madeProgress() || (startedAt !== null && Date.now() - startedAt > config.retryMaxDelayMs)) delay = config.retryMinDelayMs;
        session = null;
        if (stopped) return;
        const cut = err instanceof GroupRetryError || err instanceof CarefulReplayError ? null : await control.cutOver(err);
        if (cut) {
          log.info({ subscription: config.subscription, lsn: cut.context.lsn, code: cut.code }, cut.message);
          throw cut;
        }
        const code = String((err as { code?: unknown })?.code ?? 'UNKNOWN');
        failures[code] = (failures[code] ?? 0) + 1;
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
        if (err instanceof PgsubError && err.fatalAtStartup && !streamedOnce) {
          log.fatal({ err: describeError(err) }, 'cannot start: fix this and start pgsub again');
          throw err;
        }
        if (slotBusy(err)) {
          log.warn({ err: describeError(err), retryInMs: SLOT_BUSY_RETRY_MS, attempts: failures[code] }, 'replication slot still held by an earlier connection; retrying');
          await sleep(SLOT_BUSY_RETRY_MS);
          continue;
        }
        if (!connectionFailure(err)) applyErrors++;
        const disabled = await control.recordError(err, failed);
        if (stopped) return;
        if (!isRetryable(err)) {
          log.fatal({ err: describeError(err) }, 'apply stopped by a non-retryable error');
          throw err;
        }
        if (disabled) {
          log.error(
            { err: describeError(err), ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) },
            'apply failed; subscription disabled (disable_on_error)',
          );
          await waitForEnable();
          delay = config.retryMinDelayMs;
          continue;
        }
        log.error(
          { err: describeError(err), retryInMs: delay, attempts: failures[code], ...(failed ? { xid: failed.xid, finishLsn: formatLsn(failed.finishLsn) } : {}) },
          'apply failed; retrying',
        );
        // Not unref'd: between sessions this timer is what keeps the service alive.
        await sleep(delay);
        delay = Math.min(delay * 2, config.retryMaxDelayMs);
      }
    }
  })();

  // The slot on the publisher, watched beside the sessions: a lost one ends the service.
  const slotGuard = startSlotGuard(config, log, {
    intervalMs: config.slotCheckIntervalMs,
    maxRetainedBytes: config.maxRetainedWalBytes,
    onLost: (err) => fail(err),
  });
  const finished = done
    .finally(async () => {
      // Before what an abandoned start may still use (the launcher, the verify hold) is closed;
      // bounded, since a server that does not answer keeps a connection attempt pending.
      if (abandoned !== null) await waitAtMost(abandoned, ABANDONED_START_WAIT_MS);
      setup.stopProgressLog();
      await sequenceSync?.stop();
      await slotGuard.stop();
      return setup.close();
    })
    .then(() => {
      if (fatal !== null) throw fatal;
    });
  return {
    done: finished,
    sync,
    launcher,
    counters,
    copied: () => progressLog.copiedTotals(),
    failures,
    current: () => session,
    stop,
    fail,
    slotHealth: () => slotGuard.health(),
    applyErrors: () => applyErrors,
    lastVerify: () => verifyHold.last,
  };
}
