/**
 * `pgsub cutover`: the switch from the old primary (the source) to the new one (the
 * target) as one command, each step logged and timed:
 *   0. preconditions: one source database for every subscription given, each one's
 *      service running (its run lock held in the target), every table ready;
 *   1. lag: the target's recorded origin within --max-lag of the source's WAL, waited for;
 *   2. fence: `read-only` (migrate/fence.ts: the database read-only for new sessions, the
 *      others terminated, checked twice, within --fence-timeout) or `none` (the operator
 *      fenced, e.g. at the pooler);
 *   3. prepared transactions: none left in the source database (migrate/cutover-prepared.ts),
 *      waited for up to --prepared-timeout, then the fence LSN: the position of a marker
 *      written after the fence;
 *   4. wait until each running service has applied and recorded exactly that position —
 *      read from its origin row in the target, which it commits with the data — and, with
 *      two_phase, resolved its own prepared transactions on the target;
 *   5. sequences set from the fenced source exactly, plus sequence_margin, each target
 *      column's own sequence past every source merged into it (migrate/sequence-plan.ts);
 *   6. row counts through the publication's filters and the mapping (migrate/cutover-counts.ts);
 *   7. --reverse: a reverse subscription from the new primary back to the old
 *      (migrate/reverse.ts);
 *   8. done, the point of no return: the forward subscription disabled and the cutover
 *      recorded done in one target transaction; then its walsender ended and its slot
 *      dropped (--keep-slot keeps it), and the summary: write downtime from fence to done.
 * Every step is recorded in the target before it acts (migrate/cutover-record.ts). Any
 * failure or SIGINT/SIGTERM before step 8 lifts the fence (to the value recorded before
 * it, read back) and removes a reverse setup: the source is left as it was; after it, the
 * cutover finishes. A cutover that died half-way is undone by the next run before it
 * starts again, or by `--abort`. A refusal before the fence exits 2
 * (PGSUB_CUTOVER_REFUSED), a failure after it 1 (PGSUB_CUTOVER_FAILED, or
 * PGSUB_CUTOVER_INTERRUPTED for a signal).
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { CutoverError, PgsubError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { errorText, openPgClient, openTargetDb, dbFromClient, publishedTables, type Db } from '../migrate/db.js';
import { currentDatabase, databaseSetting, fenceMarker, raiseFence, writingWorkers, type FenceState } from '../migrate/fence.js';
import { beginRecord, halfDone, readRecord, recordDone, recordFence, recordReverse, recordStep, type CutoverRecord, type CutoverStep } from '../migrate/cutover-record.js';
import { describePrepared, sourcePrepared, targetPrepared, waitNoPrepared } from '../migrate/cutover-prepared.js';
import { finishForwardSlot, undoCutover, type UndoWhat } from '../migrate/cutover-undo.js';
import { faultPause } from '../faults.js';
import type { Rel } from '../migrate/objects.js';
import { syncAtFence, type SequenceSync } from '../migrate/sequences.js';
import { planSequences, type SequencePlan } from '../migrate/sequence-plan.js';
import { countAtFence, countDifferences, countSummary, planCounts, renderCounts, type CountPlan, type TableCount } from '../migrate/cutover-counts.js';
import { reversePlan, reverseRefusal, setupReverse, type ReverseSetup } from '../migrate/reverse.js';
import { runLockKey } from '../service/preflight.js';
import { checkCutoverPrivileges } from '../migrate/privileges.js';

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

interface Sub {
  config: Config;
  target: Db;
  tables: Rel[];
  /** What step 6 counts (migrate/cutover-counts.ts) and step 5 sets (migrate/sequence-plan.ts), planned before the fence. */
  counts: CountPlan;
  sequencePlan: SequencePlan | null;
}

const refused = (message: string, context = {}) => new CutoverError('PGSUB_CUTOVER_REFUSED', message, context);

/** A signal before the point of no return. */
class Interrupted extends Error {}

/** A sleep that a signal cuts short. */
const sleepOr = (signal: AbortSignal | undefined) => (ms: number) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    });
  });

async function sourceLsn(source: Db): Promise<Lsn> {
  const [r] = await source.query(`SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn`);
  return parseLsn(r!.lsn!);
}

async function originLsn(sub: Sub): Promise<Lsn> {
  const [r] = await sub.target.query(`SELECT remote_lsn::text AS lsn FROM "pgsub"."origin" WHERE subscription = $1`, [sub.config.subscription]);
  if (!r) throw refused(`subscription ${sub.config.subscription} has no progress in the target: start pgsub run first`);
  return parseLsn(r.lsn!);
}

/** The service holds the subscription's run lock in the target while it runs (service/preflight.ts). */
async function serviceRunning(sub: Sub): Promise<boolean> {
  const [classId, objId] = runLockKey(sub.config.subscription);
  const [r] = await sub.target.query(
    `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
        AND classid = $1::pg_catalog.int4::pg_catalog.oid AND objid = $2::pg_catalog.int4::pg_catalog.oid
        AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()))::text AS held`,
    [String(classId), String(objId)],
  );
  return r?.held === 'true';
}

async function preconditions(subs: Sub[]): Promise<void> {
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

interface Run {
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

async function openRun(configs: Config[], opts: CutoverOptions, out: (line: string) => void, log: Logger): Promise<Run> {
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

export async function runCutover(configs: Config[], opts: CutoverOptions, out: (line: string) => void, log: Logger): Promise<CutoverReport> {
  const primary = configs[0]!;
  const run = await openRun(configs, opts, out, log);
  const { fenceClient, source, subs, done, check } = run;
  let fence: FenceState | null = null;
  let fencedAt: number | null = null;
  let reverse: ReverseSetup | null = null;
  const undo: UndoWhat = { fence: null, reverse: null };
  let preparedWaited = 0;
  try {
    await checkCutoverPrivileges(source, subs, opts, log);
    const records = await Promise.all(subs.map((s) => readRecord(s.target, s.config.subscription)));
    if (records.some((r) => r?.step === 'done')) {
      if (records.every((r) => r?.step === 'done')) {
        const report = await resumeDone(run, records as CutoverRecord[]);
        await closeAll(source, subs);
        return report;
      }
      throw refused(
        `subscriptions ${subs.map((s, i) => `${s.config.subscription} (${records[i]?.step ?? 'no cutover'})`).join(', ')} were not cut over together: cut over each on its own`,
      );
    }
    await cleanUpHalfDone(run, records);
    for (const sub of subs) sub.tables = (await publishedTables(source, sub.config.publications)).map((t) => ({ schema: t.schema, table: t.table }));
    await preconditions(subs);
    for (const sub of subs) {
      sub.counts = await planCounts(sub.target, sub.config, await publishedTables(source, sub.config.publications));
      if (sub.config.sequences !== 'off') sub.sequencePlan = await planSequences(source, sub.target, sub.config);
    }
    if (opts.reverse) {
      if (subs.length > 1) throw refused('--reverse takes one subscription');
      const why = await reverseRefusal(primary, subs[0]!.target);
      if (why) throw refused(why);
    }
    const pending = await sourcePrepared(source);
    if (opts.refusePrepared && pending.length > 0)
      throw refused(
        `--refuse-prepared: the source database has ${pending.length} prepared transaction(s): ${describePrepared(pending)}: COMMIT PREPARED or ROLLBACK PREPARED them first`,
      );
    const workers = await writingWorkers(fenceClient);
    if (workers.length > 0) {
      const named = workers.map((w) => `pid ${w.pid} ${w.type}${w.name !== w.type ? ` (${w.name})` : ''}`).join(', ');
      log.warn({ workers }, 'background workers attached to the source database are not fenced');
      out(`  ${'workers'.padEnd(12)} not fenced, stop them if they write: ${named}`);
    }
    const database = await currentDatabase(fenceClient);
    for (const sub of subs) await beginRecord(sub.target, sub.config.subscription, database);
    done('preflight', `${subs.length} subscription(s) running, every table ready${pending.length > 0 ? `, ${pending.length} prepared transaction(s) to wait for` : ''}`);
    await faultPause('preflight', opts.signal);
    check('before the fence');
    await waitLag(run);
  } catch (err) {
    if (!(err instanceof Interrupted)) {
      await closeAll(source, subs);
      throw err instanceof PgsubError ? err : refused(`before the fence: ${errorText(err)}`);
    }
    // Interrupted before the fence: only the record to clear.
    const undone = await undoCutover(fenceClient, subs, undo);
    await closeAll(source, subs);
    throw new CutoverError('PGSUB_CUTOVER_INTERRUPTED', `${err.message}, before the fence: nothing was changed on the source`, { undone: undone.lines });
  }

  let pastNoReturn = false;
  try {
    // 2. The fence, recorded first: its `on` is pgsub's, the value found is what a lift restores.
    fencedAt = Date.now();
    if (opts.fence === 'read-only') {
      const database = await currentDatabase(fenceClient);
      const previous = await databaseSetting(fenceClient);
      for (const sub of subs) await recordFence(sub.target, sub.config.subscription, previous);
      undo.fence = { database, previous };
      fence = await raiseFence(fenceClient, previous, opts.fenceTimeoutMs ?? 10_000, opts.signal);
      done('fence', `database ${fence.database} read-only for new sessions, ${fence.terminated} session(s) terminated, none left (checked twice)`, {
        terminated: fence.terminated,
      });
    } else {
      await run.record('fence');
      done('fence', 'none (fenced by the operator)');
    }
    await opts.hooks?.afterFence?.();
    await faultPause('fence', opts.signal);
    check('after the fence');

    // 3. No prepared transaction left to commit past the fence, then the position everything before which must be on the target.
    await run.record('prepared');
    preparedWaited = await waitNoPrepared(() => sourcePrepared(source), 'prepared transaction(s) on the source', {
      timeoutMs: opts.preparedTimeoutMs ?? 30_000,
      signal: opts.signal,
      sleep: run.sleep,
      show: (xs) => {
        log.warn({ prepared: xs }, 'waiting for prepared transactions on the source before the fence LSN');
        out(`  ${'prepared'.padEnd(12)} waiting for ${xs.length}: ${describePrepared(xs)}`);
      },
    });
    if (preparedWaited > 0) done('prepared', `${preparedWaited} prepared transaction(s) resolved on the source`);
    check('while waiting for prepared transactions');
    const fenceLsn = await fenceMarker(fenceClient, `cutover of ${subs.map((s) => s.config.subscription).join(', ')}`);
    await run.record('fence-lsn', fenceLsn);
    done('fence-lsn', formatLsn(fenceLsn), { lsn: formatLsn(fenceLsn) });
    await opts.hooks?.beforeWait?.();
    await faultPause('fence-lsn', opts.signal);

    // 4. Each service applied and recorded it.
    await waitApplied(run, fenceLsn);
    done('apply', `every service applied up to ${formatLsn(fenceLsn)}${subs.some((s) => s.config.twoPhase) ? ', none of its prepared transactions left on the target' : ''}`);
    await run.record('sequences');
    await faultPause('apply', opts.signal);
    check('after the apply');

    // 5. Sequences, exactly from the fenced source, plus the margin.
    await opts.hooks?.beforeSequences?.();
    const sequences: SequenceSync[] = [];
    for (const sub of subs) if (sub.sequencePlan) sequences.push(...(await syncAtFence(source, sub.target, sub.sequencePlan, sub.config.sequenceMargin)));
    done('sequences', `${sequences.filter((s) => s.moved).length} of ${sequences.length} moved, each at least the margin ahead of the source`);

    // 6. Row counts at the fence.
    const tables: TableCount[] = [];
    for (const sub of subs) tables.push(...(await countAtFence(source, sub.target, sub.counts)));
    const unequal = countDifferences(tables);
    if (unequal !== null) throw new Error(`row counts differ at the fence: ${unequal}`);
    done('verify', countSummary(tables));

    // 7. Replication back, recorded before it creates anything.
    if (opts.reverse) {
      const plan = await reversePlan(primary, subs[0]!.target, opts.reverseConfigFile);
      await recordReverse(subs[0]!.target, primary.subscription, plan);
      undo.reverse = plan;
      reverse = await setupReverse(primary, subs[0]!.target, subs[0]!.tables, plan);
      done(
        'reverse',
        `slot ${reverse.slot} on the new primary from ${formatLsn(reverse.consistentPoint)}; ${opts.reverseConfigFile ? `start it: pgsub run -c ${opts.reverseConfigFile}` : 'config not written (--reverse-config)'}`,
      );
    }
    await faultPause('reverse', opts.signal);
    check('before the point of no return');

    // 8. The point of no return: done and the forward subscription disabled, in one target transaction each.
    for (const sub of subs) await recordDone(sub.target, sub.config.subscription, fenceLsn);
    pastNoReturn = true;
    const downtime = Date.now() - fencedAt;
    const finishing = () => out(`  ${String(opts.signal?.reason)} received past the point of no return: finishing the cutover`);
    if (opts.signal?.aborted) finishing();
    else opts.signal?.addEventListener('abort', finishing, { once: true });
    await faultPause('done', opts.signal);
    const slots = await finishSlots(run);
    done('finish', `subscription(s) ${subs.map((s) => s.config.subscription).join(', ')} cut over at ${formatLsn(fenceLsn)}; ${slots.join('; ')}`);

    return {
      subscriptions: subs.map((s) => s.config.subscription),
      fence: opts.fence,
      fence_lsn: formatLsn(fenceLsn),
      write_downtime_ms: downtime,
      sessions_terminated: fence?.terminated ?? 0,
      steps: run.steps,
      tables,
      sequences: sequences.map(({ sourceNext, targetNextBefore, targetNextAfter, ...rest }) => ({
        ...rest,
        source_next: sourceNext?.toString() ?? null,
        target_next_before: targetNextBefore?.toString() ?? null,
        target_next_after: targetNextAfter?.toString() ?? null,
      })),
      reverse: reverse && {
        subscription: reverse.subscription,
        slot: reverse.slot,
        publication: reverse.publication,
        from_lsn: formatLsn(reverse.consistentPoint),
        config_file: reverse.configFile,
      },
      prepared_waited: preparedWaited,
      slots,
      resumed: false,
    };
  } catch (err) {
    if (pastNoReturn) {
      // The target is the primary already: nothing is undone; a re-run finishes the slot.
      log.error({ err: errorText(err) }, 'cutover done, but its last step failed');
      throw new CutoverError(
        'PGSUB_CUTOVER_FAILED',
        `the cutover is done (the target is the primary), but finishing failed: ${errorText(err)}; run pgsub cutover again to finish`,
        {},
        { cause: err },
      );
    }
    // A setup that failed removed itself already (reverse.ts); one that finished is undone here.
    if (!reverse && undo.reverse) undo.reverse = null;
    const undone = await undoCutover(fenceClient, subs, undo);
    const lines = undone.lines.join(', ') || 'nothing to undo';
    log.error({ err: errorText(err), undone: undone.lines }, err instanceof Interrupted ? 'cutover interrupted' : 'cutover failed');
    if (err instanceof Interrupted) throw new CutoverError('PGSUB_CUTOVER_INTERRUPTED', `${err.message}, before the point of no return: ${lines}`, { undone: undone.lines });
    throw new CutoverError('PGSUB_CUTOVER_FAILED', `cutover failed after the fence: ${errorText(err)}; ${lines}`, { undone: undone.lines }, { cause: err });
  } finally {
    await closeAll(source, subs);
  }
}

/** 1. Lag small enough to start. */
async function waitLag(run: Run): Promise<void> {
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
async function waitApplied(run: Run, fenceLsn: Lsn): Promise<void> {
  const { subs, opts, out } = run;
  const applyDeadline = Date.now() + opts.applyTimeoutMs;
  let lastShown = 0;
  for (;;) {
    run.check('while waiting for the services');
    const at = await Promise.all(subs.map((s) => originLsn(s)));
    if (at.every((l) => l >= fenceLsn)) break;
    if (Date.now() - lastShown > 1000) {
      lastShown = Date.now();
      out(`  ${'apply'.padEnd(12)} waiting: ${subs.map((s, i) => `${s.config.subscription} at ${formatLsn(at[i]!)}`).join(', ')} of ${formatLsn(fenceLsn)}`);
    }
    for (const sub of subs)
      if (!(await serviceRunning(sub))) throw new Error(`the pgsub service of subscription ${sub.config.subscription} stopped before it reached the fence LSN`);
    if (Date.now() > applyDeadline) throw new Error(`the target did not reach the fence LSN ${formatLsn(fenceLsn)} within ${opts.applyTimeoutMs / 1000} s`);
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
async function finishSlots(run: Run): Promise<string[]> {
  const lines: string[] = [];
  for (const sub of run.subs) lines.push(await finishForwardSlot(run.source, sub.config.slotName, run.opts.keepSlot ?? false));
  return lines;
}

/** A cutover that stopped half-way before this run: undone first (the fence to its recorded value). */
async function cleanUpHalfDone(run: Run, records: (CutoverRecord | null)[]): Promise<void> {
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
async function resumeDone(run: Run, records: CutoverRecord[]): Promise<CutoverReport> {
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

/**
 * `pgsub cutover --abort`: undo a cutover that stopped half-way (the fence lifted to the
 * value recorded before it, a reverse setup removed). One that is done is refused: the
 * target is the primary.
 */
export async function abortCutover(configs: Config[], out: (line: string) => void, log: Logger): Promise<string> {
  const run = await openRun(configs, { fence: 'read-only', maxLagBytes: 0, lagTimeoutMs: 0, applyTimeoutMs: 0, reverse: false, reverseConfigFile: null }, out, log);
  try {
    const records = await Promise.all(run.subs.map((s) => readRecord(s.target, s.config.subscription)));
    const done = records.filter((r) => r?.step === 'done');
    if (done.length > 0)
      throw refused(
        `subscription(s) ${done.map((r) => r!.subscription).join(', ')} cut over at ${formatLsn(done[0]!.fenceLsn ?? (0n as Lsn))}: past the point of no return, nothing to abort`,
      );
    const half = records.filter(halfDone);
    if (half.length === 0) return 'no cutover to abort';
    await cleanUpHalfDone(run, records);
    return `the cutover stopped at step ${half[0]!.step} is undone`;
  } finally {
    await closeAll(run.source, run.subs);
  }
}

async function closeAll(source: Db, subs: Sub[]): Promise<void> {
  await source.close();
  for (const s of subs) await s.target.close();
}

/** The human summary (step 8). */
export function renderCutover(r: CutoverReport): string {
  const lines = [
    '',
    `cutover done: ${r.subscriptions.join(', ')} at ${r.fence_lsn}, write downtime ${(r.write_downtime_ms / 1000).toFixed(2)} s (fence ${r.fence}${r.fence === 'read-only' ? `, ${r.sessions_terminated} session(s) terminated` : ''})`,
  ];
  lines.push(...renderCounts(r.tables));
  if (r.sequences.length > 0) {
    lines.push(`  ${'sequence'.padEnd(32)} ${'source next'.padStart(12)} ${'target next'.padStart(12)}  moved`);
    for (const s of r.sequences)
      lines.push(
        `  ${s.sequence.slice(0, 32).padEnd(32)} ${(s.source_next ?? '-').padStart(12)} ${(s.target_next_after ?? '-').padStart(12)}  ${s.reason ? `no: ${s.reason}` : s.moved ? 'yes' : 'no (ahead)'}`,
      );
  }
  if (r.reverse)
    lines.push(
      `  reverse: ${r.reverse.subscription} (slot ${r.reverse.slot}, publication ${r.reverse.publication}) from ${r.reverse.from_lsn}${r.reverse.config_file ? `: pgsub run -c ${r.reverse.config_file}` : ''}`,
    );
  if (r.prepared_waited > 0) lines.push(`  ${r.prepared_waited} prepared transaction(s) resolved on the source after the fence, before the fence LSN`);
  for (const slot of r.slots) lines.push(`  ${slot}`);
  lines.push('  the application may now write to the target; the source stays read-only');
  return `${lines.join('\n')}\n`;
}
