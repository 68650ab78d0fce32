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
 * PGSUB_CUTOVER_INTERRUPTED for a signal). This file holds the order of the steps; the
 * waits, the preconditions and the undo of an earlier run are cutover-steps.ts.
 */
import type { Config } from '../config/config.js';
import { CutoverError, PgsubError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { errorText, publishedTables } from '../migrate/db.js';
import { currentDatabase, databaseSetting, fenceMarker, raiseFence, writingWorkers, type FenceState } from '../migrate/fence.js';
import { beginRecord, halfDone, readRecord, recordDone, recordFence, recordReverse, type CutoverRecord } from '../migrate/cutover-record.js';
import { describePrepared, sourcePrepared, waitNoPrepared } from '../migrate/cutover-prepared.js';
import { undoCutover, type UndoWhat } from '../migrate/cutover-undo.js';
import { faultPause } from '../faults.js';
import { syncAtFence, type SequenceSync } from '../migrate/sequences.js';
import { planSequences } from '../migrate/sequence-plan.js';
import { countAtFence, countDifferences, countSummary, planCounts, renderCounts, type TableCount } from '../migrate/cutover-counts.js';
import { reversePlan, reverseRefusal, setupReverse, type ReverseSetup } from '../migrate/reverse.js';
import { checkCutoverPrivileges } from '../migrate/privileges.js';
import {
  cleanUpHalfDone,
  closeAll,
  finishSlots,
  Interrupted,
  openRun,
  preconditions,
  refused,
  resumeDone,
  waitApplied,
  waitLag,
  type CutoverOptions,
  type CutoverReport,
  type Run,
} from './cutover-steps.js';

export type { CutoverOptions, CutoverReport, StepTiming } from './cutover-steps.js';

export async function runCutover(configs: Config[], opts: CutoverOptions, out: (line: string) => void, log: Logger): Promise<CutoverReport> {
  const cutover = new Cutover(configs[0]!, await openRun(configs, opts, out, log));
  const resumed = await cutover.beforeFence();
  return resumed ?? (await cutover.fenceAndFinish());
}

/**
 * One run of the steps above, one method per step. What a failure must undo and what the
 * summary reports are its fields, each written by the step that makes it true and read by
 * the error paths of beforeFence and fenceAndFinish.
 */
class Cutover {
  /** What a failure before the point of no return lifts or removes, filled in as each is recorded. */
  readonly #undo: UndoWhat = { fence: null, reverse: null };
  #fence: FenceState | null = null;
  #fencedAt = 0;
  #reverse: ReverseSetup | null = null;
  #preparedWaited = 0;
  #pastNoReturn = false;

  constructor(
    private readonly primary: Config,
    private readonly run: Run,
  ) {}

  /** Steps 0 and 1; the report of a cutover found done already, else null to go on to the fence. */
  async beforeFence(): Promise<CutoverReport | null> {
    const { fenceClient, source, subs } = this.run;
    try {
      await checkCutoverPrivileges(source, subs, this.run.opts, this.run.log);
      const resumed = await this.#resumeOrCleanUp();
      if (resumed) return resumed;
      await this.#preflight();
      await waitLag(this.run);
      return null;
    } catch (err) {
      if (!(err instanceof Interrupted)) {
        await closeAll(source, subs);
        throw err instanceof PgsubError ? err : refused(`before the fence: ${errorText(err)}`);
      }
      // Interrupted before the fence: only the record to clear.
      const undone = await undoCutover(fenceClient, subs, this.#undo);
      await closeAll(source, subs);
      throw new CutoverError('PGSUB_CUTOVER_INTERRUPTED', `${err.message}, before the fence: nothing was changed on the source`, { undone: undone.lines });
    }
  }

  /** Steps 2 to 8; any failure before step 8 undoes what was recorded, the sessions are closed either way. */
  async fenceAndFinish(): Promise<CutoverReport> {
    try {
      await this.#raiseFence();
      const fenceLsn = await this.#fenceLsn();
      await this.#waitApplied(fenceLsn);
      const sequences = await this.#syncSequences();
      const tables = await this.#countRows();
      await this.#setupReverse();
      return await this.#finish(fenceLsn, sequences, tables);
    } catch (err) {
      throw await this.#failed(err);
    } finally {
      await closeAll(this.run.source, this.run.subs);
    }
  }

  /** A re-run: one done before is only finished, one stopped half-way is undone first. */
  async #resumeOrCleanUp(): Promise<CutoverReport | null> {
    const { source, subs } = this.run;
    const records = await Promise.all(subs.map((s) => readRecord(s.target, s.config.subscription)));
    if (records.some((r) => r?.step === 'done')) {
      if (records.every((r) => r?.step === 'done')) {
        const report = await resumeDone(this.run, records as CutoverRecord[]);
        await closeAll(source, subs);
        return report;
      }
      throw refused(
        `subscriptions ${subs.map((s, i) => `${s.config.subscription} (${records[i]?.step ?? 'no cutover'})`).join(', ')} were not cut over together: cut over each on its own`,
      );
    }
    await cleanUpHalfDone(this.run, records);
    return null;
  }

  /** 0. Preconditions, the plans of steps 5 and 6, and every refusal, then the cutover recorded begun. */
  async #preflight(): Promise<void> {
    const { fenceClient, source, subs, opts } = this.run;
    for (const sub of subs) sub.tables = (await publishedTables(source, sub.config.publications)).map((t) => ({ schema: t.schema, table: t.table }));
    await preconditions(subs);
    for (const sub of subs) {
      sub.counts = await planCounts(sub.target, sub.config, await publishedTables(source, sub.config.publications));
      if (sub.config.sequences !== 'off') sub.sequencePlan = await planSequences(source, sub.target, sub.config);
    }
    if (opts.reverse) {
      if (subs.length > 1) throw refused('--reverse takes one subscription');
      const why = await reverseRefusal(this.primary, subs[0]!.target);
      if (why) throw refused(why);
    }
    const pending = await sourcePrepared(source);
    if (opts.refusePrepared && pending.length > 0)
      throw refused(
        `--refuse-prepared: the source database has ${pending.length} prepared transaction(s): ${describePrepared(pending)}: COMMIT PREPARED or ROLLBACK PREPARED them first`,
      );
    await this.#warnUnfencedWorkers();
    const database = await currentDatabase(fenceClient);
    for (const sub of subs) await beginRecord(sub.target, sub.config.subscription, database);
    this.run.done('preflight', `${subs.length} subscription(s) running, every table ready${pending.length > 0 ? `, ${pending.length} prepared transaction(s) to wait for` : ''}`);
    await faultPause('preflight', opts.signal);
    this.run.check('before the fence');
  }

  /** Background workers keep writing through a read-only default: named, not refused. */
  async #warnUnfencedWorkers(): Promise<void> {
    const workers = await writingWorkers(this.run.fenceClient);
    if (workers.length === 0) return;
    const named = workers.map((w) => `pid ${w.pid} ${w.type}${w.name !== w.type ? ` (${w.name})` : ''}`).join(', ');
    this.run.log.warn({ workers }, 'background workers attached to the source database are not fenced');
    this.run.out(`  ${'workers'.padEnd(12)} not fenced, stop them if they write: ${named}`);
  }

  /** 2. The fence, recorded first: its `on` is pgsub's, the value found is what a lift restores. */
  async #raiseFence(): Promise<void> {
    const { fenceClient, subs, opts, done } = this.run;
    this.#fencedAt = Date.now();
    if (opts.fence === 'read-only') {
      const database = await currentDatabase(fenceClient);
      const previous = await databaseSetting(fenceClient);
      for (const sub of subs) await recordFence(sub.target, sub.config.subscription, previous);
      this.#undo.fence = { database, previous };
      const fence = await raiseFence(fenceClient, previous, opts.fenceTimeoutMs ?? 10_000, opts.signal);
      this.#fence = fence;
      done('fence', `database ${fence.database} read-only for new sessions, ${fence.terminated} session(s) terminated, none left (checked twice)`, {
        terminated: fence.terminated,
      });
    } else {
      await this.run.record('fence');
      done('fence', 'none (fenced by the operator)');
    }
    await opts.hooks?.afterFence?.();
    await faultPause('fence', opts.signal);
    this.run.check('after the fence');
  }

  /** 3. No prepared transaction left to commit past the fence, then the position everything before which must be on the target. */
  async #fenceLsn(): Promise<Lsn> {
    const { fenceClient, source, subs, opts, out, log, done } = this.run;
    await this.run.record('prepared');
    this.#preparedWaited = await waitNoPrepared(() => sourcePrepared(source), 'prepared transaction(s) on the source', {
      timeoutMs: opts.preparedTimeoutMs ?? 30_000,
      signal: opts.signal,
      sleep: this.run.sleep,
      show: (xs) => {
        log.warn({ prepared: xs }, 'waiting for prepared transactions on the source before the fence LSN');
        out(`  ${'prepared'.padEnd(12)} waiting for ${xs.length}: ${describePrepared(xs)}`);
      },
    });
    if (this.#preparedWaited > 0) done('prepared', `${this.#preparedWaited} prepared transaction(s) resolved on the source`);
    this.run.check('while waiting for prepared transactions');
    const fenceLsn = await fenceMarker(fenceClient, `cutover of ${subs.map((s) => s.config.subscription).join(', ')}`);
    await this.run.record('fence-lsn', fenceLsn);
    done('fence-lsn', formatLsn(fenceLsn), { lsn: formatLsn(fenceLsn) });
    await opts.hooks?.beforeWait?.();
    await faultPause('fence-lsn', opts.signal);
    return fenceLsn;
  }

  /** 4. Each service applied and recorded it. */
  async #waitApplied(fenceLsn: Lsn): Promise<void> {
    const { subs, opts } = this.run;
    await waitApplied(this.run, fenceLsn);
    this.run.done(
      'apply',
      `every service applied up to ${formatLsn(fenceLsn)}${subs.some((s) => s.config.twoPhase) ? ', none of its prepared transactions left on the target' : ''}`,
    );
    await this.run.record('sequences');
    await faultPause('apply', opts.signal);
    this.run.check('after the apply');
  }

  /** 5. Sequences, exactly from the fenced source, plus the margin. */
  async #syncSequences(): Promise<SequenceSync[]> {
    const { source, subs, opts } = this.run;
    await opts.hooks?.beforeSequences?.();
    const sequences: SequenceSync[] = [];
    for (const sub of subs) if (sub.sequencePlan) sequences.push(...(await syncAtFence(source, sub.target, sub.sequencePlan, sub.config.sequenceMargin)));
    this.run.done('sequences', `${sequences.filter((s) => s.moved).length} of ${sequences.length} moved, each at least the margin ahead of the source`);
    return sequences;
  }

  /** 6. Row counts at the fence. */
  async #countRows(): Promise<TableCount[]> {
    const tables: TableCount[] = [];
    for (const sub of this.run.subs) tables.push(...(await countAtFence(this.run.source, sub.target, sub.counts)));
    const unequal = countDifferences(tables);
    if (unequal !== null) throw new Error(`row counts differ at the fence: ${unequal}`);
    this.run.done('verify', countSummary(tables));
    return tables;
  }

  /** 7. Replication back, recorded before it creates anything. */
  async #setupReverse(): Promise<void> {
    const { subs, opts } = this.run;
    if (opts.reverse) {
      const plan = await reversePlan(this.primary, subs[0]!.target, opts.reverseConfigFile);
      await recordReverse(subs[0]!.target, this.primary.subscription, plan);
      this.#undo.reverse = plan;
      const reverse = await setupReverse(this.primary, subs[0]!.target, subs[0]!.tables, plan);
      this.#reverse = reverse;
      this.run.done(
        'reverse',
        `slot ${reverse.slot} on the new primary from ${formatLsn(reverse.consistentPoint)}; ${opts.reverseConfigFile ? `start it: pgsub run -c ${opts.reverseConfigFile}` : 'config not written (--reverse-config)'}`,
      );
    }
    await faultPause('reverse', opts.signal);
    this.run.check('before the point of no return');
  }

  /** 8. The point of no return: done and the forward subscription disabled, in one target transaction each. */
  async #finish(fenceLsn: Lsn, sequences: SequenceSync[], tables: TableCount[]): Promise<CutoverReport> {
    const { subs, opts, out } = this.run;
    for (const sub of subs) await recordDone(sub.target, sub.config.subscription, fenceLsn);
    this.#pastNoReturn = true;
    const downtime = Date.now() - this.#fencedAt;
    const finishing = () => out(`  ${String(opts.signal?.reason)} received past the point of no return: finishing the cutover`);
    if (opts.signal?.aborted) finishing();
    else opts.signal?.addEventListener('abort', finishing, { once: true });
    await faultPause('done', opts.signal);
    const slots = await finishSlots(this.run);
    this.run.done('finish', `subscription(s) ${subs.map((s) => s.config.subscription).join(', ')} cut over at ${formatLsn(fenceLsn)}; ${slots.join('; ')}`);
    return this.#report(fenceLsn, downtime, sequences, tables, slots);
  }

  /** The summary (renderCutover prints it, --json as it is). */
  #report(fenceLsn: Lsn, downtime: number, sequences: SequenceSync[], tables: TableCount[], slots: string[]): CutoverReport {
    const reverse = this.#reverse;
    return {
      subscriptions: this.run.subs.map((s) => s.config.subscription),
      fence: this.run.opts.fence,
      fence_lsn: formatLsn(fenceLsn),
      write_downtime_ms: downtime,
      sessions_terminated: this.#fence?.terminated ?? 0,
      steps: this.run.steps,
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
      prepared_waited: this.#preparedWaited,
      slots,
      resumed: false,
    };
  }

  /** A failure after the fence as the error to throw: undone before the point of no return, only reported after it. */
  async #failed(err: unknown): Promise<CutoverError> {
    const { log } = this.run;
    if (this.#pastNoReturn) {
      // The target is the primary already: nothing is undone; a re-run finishes the slot.
      log.error({ err }, 'cutover done, but its last step failed');
      return new CutoverError(
        'PGSUB_CUTOVER_FAILED',
        `the cutover is done (the target is the primary), but finishing failed: ${errorText(err)}; run pgsub cutover again to finish`,
        {},
        { cause: err },
      );
    }
    // A setup that failed removed itself already (reverse.ts); one that finished is undone here.
    if (!this.#reverse && this.#undo.reverse) this.#undo.reverse = null;
    const undone = await undoCutover(this.run.fenceClient, this.run.subs, this.#undo);
    const lines = undone.lines.join(', ') || 'nothing to undo';
    log.error({ err, undone: undone.lines }, err instanceof Interrupted ? 'cutover interrupted' : 'cutover failed');
    if (err instanceof Interrupted) return new CutoverError('PGSUB_CUTOVER_INTERRUPTED', `${err.message}, before the point of no return: ${lines}`, { undone: undone.lines });
    return new CutoverError('PGSUB_CUTOVER_FAILED', `cutover failed after the fence: ${errorText(err)}; ${lines}`, { undone: undone.lines }, { cause: err });
  }
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
