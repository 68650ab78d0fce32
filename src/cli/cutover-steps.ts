/**
 * The steps of `pgsub cutover` (cutover.ts) that are not its order: the options and the
 * report, the sessions it holds (a run: the fencing session on the source, one maintenance
 * session per target), the preconditions, the waits — for the lag, for each service to
 * apply the fence LSN — each cut short by SIGINT/SIGTERM before the point of no return
 * (Interrupted), the undo of a cutover an earlier run left half-done, and the finish of one
 * it left done (the forward slot).
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { CutoverError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { openPgClient, openTargetDb, dbFromClient, type Db } from '../migrate/db.js';
import { halfDone, recordStep, type CutoverRecord, type CutoverStep } from '../migrate/cutover-record.js';
import { describePrepared, targetPrepared, waitNoPrepared } from '../migrate/cutover-prepared.js';
import { finishForwardSlot, undoCutover, type UndoWhat } from '../migrate/cutover-undo.js';
import type { Rel } from '../migrate/objects.js';
import type { SequenceSync } from '../migrate/sequences.js';
import type { CountPlan, TableCount } from '../migrate/cutover-counts.js';
import type { SequencePlan } from '../migrate/sequence-plan.js';
import { runLockKey } from '../service/preflight.js';

export interface CutoverOptions {
  fence: 'read-only' | 'none';
  maxLagBytes: number;
  /** How long step 1 waits for the lag to come under maxLagBytes. */
  lagTimeoutMs: number;
  /** How long step 4 waits for the services to reach the fence LSN. */
  applyTimeoutMs: number;
  reverse: boolean;
  reverseConfigFile: string | null;
  /** How long the fence may take to end every session from before it (default 10 s). */
  fenceTimeoutMs?: number;
  /** How long to wait, fenced, for the source's prepared transactions to be resolved (default 30 s). */
  preparedTimeoutMs?: number;
  /** Refuse before the fence while the source has prepared transactions. */
  refusePrepared?: boolean;
  /** Keep the forward slot on the old primary (default: dropped at the end). */
  keepSlot?: boolean;
  /** SIGINT/SIGTERM: before the point of no return the cutover is undone, after it finished. */
  signal?: AbortSignal;
  /** For tests: called right after the fence (step 2), before the wait (step 4) and before the sequences (step 5). */
  hooks?: { afterFence?: () => Promise<void>; beforeWait?: () => Promise<void>; beforeSequences?: () => Promise<void> };
}

export interface StepTiming {
  step: string;
  ms: number;
}

export interface CutoverReport {
  subscriptions: string[];
  fence: CutoverOptions['fence'];
  fence_lsn: string;
  /** From the fence raised to the summary: the time the application could not write. */
  write_downtime_ms: number;
  sessions_terminated: number;
  steps: StepTiming[];
  tables: TableCount[];
  sequences: (Omit<SequenceSync, 'sourceNext' | 'targetNextBefore' | 'targetNextAfter'> & {
    source_next: string | null;
    target_next_before: string | null;
    target_next_after: string | null;
  })[];
  reverse: { subscription: string; slot: string; publication: string; from_lsn: string; config_file: string | null } | null;
  /** Prepared transactions of the source waited for after the fence. */
  prepared_waited: number;
  /** What became of the forward slot(s) on the old primary. */
  slots: string[];
  /** A re-run that found the cutover done already (only its slot work was finished). */
  resumed: boolean;
}

export interface Sub {
  config: Config;
  target: Db;
  tables: Rel[];
  /** What step 6 counts (migrate/cutover-counts.ts) and step 5 sets (migrate/sequence-plan.ts), planned before the fence. */
  counts: CountPlan;
  sequencePlan: SequencePlan | null;
}

export const refused = (message: string, context = {}) => new CutoverError('PGSUB_CUTOVER_REFUSED', message, context);

/** A signal before the point of no return. */
export class Interrupted extends Error {}

/** A sleep that a signal cuts short. */
export const sleepOr = (signal: AbortSignal | undefined) => (ms: number) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    });
  });

export async function sourceLsn(source: Db): Promise<Lsn> {
  const [r] = await source.query(`SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn`);
  return parseLsn(r!.lsn!);
}

export async function originLsn(sub: Sub): Promise<Lsn> {
  const [r] = await sub.target.query(`SELECT remote_lsn::text AS lsn FROM "pgsub"."origin" WHERE subscription = $1`, [sub.config.subscription]);
  if (!r) throw refused(`subscription ${sub.config.subscription} has no progress in the target: start pgsub run first`);
  return parseLsn(r.lsn!);
}

/** The service holds the subscription's run lock in the target while it runs (service/preflight.ts). */
export async function serviceRunning(sub: Sub): Promise<boolean> {
  const [classId, objId] = runLockKey(sub.config.subscription);
  const [r] = await sub.target.query(
    `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
        AND classid = $1::pg_catalog.int4::pg_catalog.oid AND objid = $2::pg_catalog.int4::pg_catalog.oid
        AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()))::text AS held`,
    [String(classId), String(objId)],
  );
  return r?.held === 'true';
}

export async function preconditions(subs: Sub[]): Promise<void> {
  const first = subs[0]!.config.source;
  for (const { config } of subs) {
    if (config.source.host !== first.host || config.source.port !== first.port || config.source.database !== first.database) {
      throw refused(`subscriptions ${subs[0]!.config.subscription} and ${config.subscription} replicate different source databases: one cutover fences one database`);
    }
  }
  for (const sub of subs) {
    if (!(await serviceRunning(sub)))
      throw refused(
        `pgsub run is not running for subscription ${sub.config.subscription} (its run lock is not held in the target): start the service, let it catch up, then cut over`,
        { subscription: sub.config.subscription },
      );
    const notReady = await sub.target.query(
      `SELECT schema_name || '.' || table_name AS rel, state::text FROM "pgsub"."subscription_rel" WHERE subscription = $1 AND state <> 'r' ORDER BY 1`,
      [sub.config.subscription],
    );
    if (notReady.length > 0)
      throw refused(
        `subscription ${sub.config.subscription}: ${notReady.length} table(s) not ready yet (${notReady
          .slice(0, 5)
          .map((r) => `${r.rel} ${r.state}`)
          .join(', ')}): wait until pgsub status shows every table ready`,
      );
  }
}

export interface Run {
  opts: CutoverOptions;
  out: (line: string) => void;
  log: Logger;
  fenceClient: pg.Client;
  source: Db;
  subs: Sub[];
  steps: StepTiming[];
  /** Logs, prints and times a step. */
  done: (step: string, detail: string, fields?: Record<string, unknown>) => void;
  /** Throws Interrupted once a signal came (before the point of no return). */
  check: (where: string) => void;
  sleep: (ms: number) => Promise<void>;
  record: (step: CutoverStep, fenceLsn?: Lsn) => Promise<void>;
}

export async function openRun(configs: Config[], opts: CutoverOptions, out: (line: string) => void, log: Logger): Promise<Run> {
  const primary = configs[0]!;
  const appName = `pgsub_${primary.subscription}_cutover`;
  // The fencing session opens first: it must predate the fence (and is never terminated by it).
  const fenceClient: pg.Client = await openPgClient(primary.source, appName, 'source');
  // A session of its own setting: after a cutover that could not lift its fence, new sessions start read-only.
  await fenceClient.query('SET default_transaction_read_only = off');
  const source = await dbFromClient(fenceClient, primary.source, 'source');
  const subs: Sub[] = [];
  try {
    for (const config of configs)
      subs.push({ config, target: await openTargetDb(config.target, appName), tables: [], counts: { counted: [], notCounted: [] }, sequencePlan: null });
  } catch (err) {
    await closeAll(source, subs);
    throw err;
  }
  const steps: StepTiming[] = [];
  let stepStart = Date.now();
  const run: Run = {
    opts,
    out,
    log,
    fenceClient,
    source,
    subs,
    steps,
    done: (step, detail, fields = {}) => {
      const ms = Date.now() - stepStart;
      steps.push({ step, ms });
      log.info({ step, ms, ...fields }, `cutover: ${step}`);
      out(`  ${step.padEnd(12)} ${(ms / 1000).toFixed(2).padStart(7)} s  ${detail}`);
      stepStart = Date.now();
    },
    check: (where) => {
      if (opts.signal?.aborted) throw new Interrupted(`interrupted by ${String(opts.signal.reason ?? 'a signal')} ${where}`);
    },
    sleep: sleepOr(opts.signal),
    record: async (step, fenceLsn) => {
      for (const sub of subs) await recordStep(sub.target, sub.config.subscription, step, fenceLsn);
    },
  };
  return run;
}

/** 1. Lag small enough to start. */
export async function waitLag(run: Run): Promise<void> {
  const { subs, opts } = run;
  const lagDeadline = Date.now() + opts.lagTimeoutMs;
  for (;;) {
    run.check('while waiting for the lag');
    const wal = await sourceLsn(run.source);
    const lags = await Promise.all(subs.map(async (s) => wal - (await originLsn(s))));
    // biome-ignore lint/complexity/useMathMinMax: bigints (Math.max takes numbers)
    const worst = lags.reduce((a, b) => (a > b ? a : b), 0n);
    if (worst <= BigInt(opts.maxLagBytes)) {
      run.done('lag', `${worst} bytes behind (at most ${opts.maxLagBytes})`, { lagBytes: Number(worst) });
      return;
    }
    if (Date.now() > lagDeadline)
      throw refused(
        `the target is ${worst} bytes behind the source, more than --max-lag ${opts.maxLagBytes} bytes, after ${opts.lagTimeoutMs / 1000} s: let pgsub catch up first`,
        { lagBytes: Number(worst) },
      );
    await run.sleep(200);
  }
}

/** 4. Each service applied and recorded the fence LSN; with two_phase, its prepared transactions on the target resolved. */
export async function waitApplied(run: Run, fenceLsn: Lsn): Promise<void> {
  const { subs, opts, out } = run;
  const applyDeadline = Date.now() + opts.applyTimeoutMs;
  let lastShown = 0;
  for (;;) {
    run.check('while waiting for the services');
    const at = await Promise.all(subs.map((s) => originLsn(s)));
    if (at.every((l) => l >= fenceLsn)) break;
    // A service that stopped (crashed, killed) is waited for: its unit's Restart= brings it
    // back and it resumes from its origin; only the deadline ends the wait, naming it.
    const stopped: string[] = [];
    for (const [i, sub] of subs.entries()) if (at[i]! < fenceLsn && !(await serviceRunning(sub))) stopped.push(sub.config.subscription);
    if (Date.now() - lastShown > 1000) {
      lastShown = Date.now();
      const where = subs.map((s, i) => `${s.config.subscription} at ${formatLsn(at[i]!)}${stopped.includes(s.config.subscription) ? ' (its service is not running)' : ''}`);
      out(`  ${'apply'.padEnd(12)} waiting: ${where.join(', ')} of ${formatLsn(fenceLsn)}`);
    }
    if (Date.now() > applyDeadline) {
      const why = stopped.length > 0 ? `: the pgsub service of ${stopped.join(', ')} is not running (start it, or let its unit restart it, and run the cutover again)` : '';
      throw new Error(`the target did not reach the fence LSN ${formatLsn(fenceLsn)} within ${opts.applyTimeoutMs / 1000} s${why}`);
    }
    await run.sleep(50);
  }
  for (const sub of subs.filter((s) => s.config.twoPhase)) {
    await waitNoPrepared(() => targetPrepared(sub.target, sub.config.subscription), `pgsub prepared transaction(s) of ${sub.config.subscription} on the target`, {
      timeoutMs: Math.max(1000, applyDeadline - Date.now()),
      signal: opts.signal,
      sleep: run.sleep,
      show: (xs) => out(`  ${'apply'.padEnd(12)} waiting for pgsub's prepared transaction(s) on the target: ${describePrepared(xs)}`),
    });
  }
}

/** After the point of no return: each forward walsender ended and its slot dropped (or kept). */
export async function finishSlots(run: Run): Promise<string[]> {
  const lines: string[] = [];
  for (const sub of run.subs) lines.push(await finishForwardSlot(run.source, sub.config.slotName, run.opts.keepSlot ?? false));
  return lines;
}

/** A cutover that stopped half-way before this run: undone first (the fence to its recorded value). */
export async function cleanUpHalfDone(run: Run, records: (CutoverRecord | null)[]): Promise<void> {
  const half = records.filter(halfDone);
  if (half.length === 0) return;
  const r = half[0]!;
  const what: UndoWhat = {
    fence: half.some((h) => h.fenceRaised) ? { database: r.sourceDatabase, previous: r.sourceSetting } : null,
    reverse: half.find((h) => h.reverse)?.reverse ?? null,
  };
  const undone = await undoCutover(run.fenceClient, run.subs, what);
  run.out(`  ${'undo'.padEnd(12)} an earlier cutover stopped at step ${r.step}: ${undone.lines.join(', ') || 'nothing was changed'}`);
  if (!undone.ok) throw refused(`an earlier cutover stopped at step ${r.step} and could not be undone: ${undone.lines.join(', ')}`);
}

/** A re-run after the point of no return: only the forward slot is left to finish. */
export async function resumeDone(run: Run, records: CutoverRecord[]): Promise<CutoverReport> {
  const slots = await finishSlots(run);
  const lsn = formatLsn(records[0]!.fenceLsn ?? (0n as Lsn));
  run.done('finish', `already cut over at ${lsn} (${records[0]!.doneAt}); ${slots.join('; ')}`);
  return {
    subscriptions: run.subs.map((s) => s.config.subscription),
    fence: run.opts.fence,
    fence_lsn: lsn,
    write_downtime_ms: 0,
    sessions_terminated: 0,
    steps: run.steps,
    tables: [],
    sequences: [],
    reverse: null,
    prepared_waited: 0,
    slots,
    resumed: true,
  };
}

export async function closeAll(source: Db, subs: Sub[]): Promise<void> {
  await source.close();
  for (const s of subs) await s.target.close();
}
