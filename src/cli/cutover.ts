/**
 * `pgsub cutover`: the switch from the old primary (the source) to the new one (the
 * target) as one command, each step logged and timed:
 *   0. preconditions: one source database for every subscription given, each one's
 *      service running (its run lock held in the target), every table ready;
 *   1. lag: the target's recorded origin within --max-lag of the source's WAL, waited for;
 *   2. fence: `read-only` (migrate/fence.ts: the database read-only for new sessions, the
 *      others terminated) or `none` (the operator fenced, e.g. at the pooler);
 *   3. the fence LSN: the source's WAL position after the fence;
 *   4. wait until each running service has applied and recorded exactly that position —
 *      read from its origin row in the target, which it commits with the data;
 *   5. sequences set from the fenced source exactly, plus sequence_margin, each target
 *      column's own sequence past every source merged into it (migrate/sequence-plan.ts);
 *   6. row counts through the publication's filters and the mapping (migrate/cutover-counts.ts);
 *   7. --reverse: a reverse subscription from the new primary back to the old
 *      (migrate/reverse.ts), and the forward subscription disabled so the two cannot loop;
 *   8. the summary: write downtime from fence to done, LSN, rows, sequences moved.
 * Any failure before the summary lifts the fence (the database's setting as it was) and
 * removes a reverse setup: the source is left as it was. A refusal before the fence exits
 * 2 (PGSUB_CUTOVER_REFUSED), a failure after it 1 (PGSUB_CUTOVER_FAILED).
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { CutoverError, PgsubError } from '../errors.js';
import type { Logger } from '../log.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { errorText, openPgClient, openTargetDb, dbFromClient, publishedTables, type Db } from '../migrate/db.js';
import { liftFence, raiseFence, type FenceState } from '../migrate/fence.js';
import type { Rel } from '../migrate/objects.js';
import { syncAtFence, type SequenceSync } from '../migrate/sequences.js';
import { planSequences, type SequencePlan } from '../migrate/sequence-plan.js';
import { countAtFence, countDifferences, countSummary, planCounts, renderCounts, type CountPlan, type TableCount } from '../migrate/cutover-counts.js';
import { reverseRefusal, setupReverse, undoReverse, type ReverseSetup } from '../migrate/reverse.js';
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
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

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

export async function runCutover(configs: Config[], opts: CutoverOptions, out: (line: string) => void, log: Logger): Promise<CutoverReport> {
  const primary = configs[0]!;
  const appName = `pgsub_${primary.subscription}_cutover`;
  const steps: StepTiming[] = [];
  let stepStart = Date.now();
  const done = (step: string, detail: string, fields: Record<string, unknown> = {}) => {
    const ms = Date.now() - stepStart;
    steps.push({ step, ms });
    log.info({ step, ms, ...fields }, `cutover: ${step}`);
    out(`  ${step.padEnd(12)} ${(ms / 1000).toFixed(2).padStart(7)} s  ${detail}`);
    stepStart = Date.now();
  };
  // The fencing session opens first: it must predate the fence (and is never terminated by it).
  const fenceClient: pg.Client = await openPgClient(primary.source, appName, 'source');
  // A session of its own setting: after a cutover that could not lift its fence, new sessions start read-only.
  await fenceClient.query('SET default_transaction_read_only = off');
  const source = await dbFromClient(fenceClient, primary.source, 'source');
  const subs: Sub[] = [];
  let fence: FenceState | null = null;
  let fencedAt: number | null = null;
  let reverse: ReverseSetup | null = null;
  try {
    for (const config of configs) {
      const target = await openTargetDb(config.target, appName);
      subs.push({ config, target, tables: [], counts: { counted: [], notCounted: [] }, sequencePlan: null });
    }
    await checkCutoverPrivileges(source, subs, opts, log);
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
    done('preflight', `${subs.length} subscription(s) running, every table ready`);

    // 1. Lag small enough to start.
    const lagDeadline = Date.now() + opts.lagTimeoutMs;
    for (;;) {
      const wal = await sourceLsn(source);
      const lags = await Promise.all(subs.map(async (s) => wal - (await originLsn(s))));
      // biome-ignore lint/complexity/useMathMinMax: bigints (Math.max takes numbers)
      const worst = lags.reduce((a, b) => (a > b ? a : b), 0n);
      if (worst <= BigInt(opts.maxLagBytes)) {
        done('lag', `${worst} bytes behind (at most ${opts.maxLagBytes})`, { lagBytes: Number(worst) });
        break;
      }
      if (Date.now() > lagDeadline)
        throw refused(
          `the target is ${worst} bytes behind the source, more than --max-lag ${opts.maxLagBytes} bytes, after ${opts.lagTimeoutMs / 1000} s: let pgsub catch up first`,
          { lagBytes: Number(worst) },
        );
      await sleep(200);
    }
  } catch (err) {
    await closeAll(source, subs);
    throw err instanceof PgsubError ? err : refused(`before the fence: ${errorText(err)}`);
  }

  try {
    // 2. The fence.
    fencedAt = Date.now();
    if (opts.fence === 'read-only') {
      fence = await raiseFence(fenceClient);
      done('fence', `database ${fence.database} read-only for new sessions, ${fence.terminated} session(s) terminated`, { terminated: fence.terminated });
    } else done('fence', 'none (fenced by the operator)');
    await opts.hooks?.afterFence?.();

    // 3. The position everything before which must be on the target.
    const fenceLsn = await sourceLsn(source);
    // A transaction after it: a publisher before 15 sends even an empty one, whose commit
    // the service records at once instead of at its next idle keepalive (needs REPLICATION).
    await source.query(`SELECT pg_catalog.pg_logical_emit_message(true, 'pgsub_cutover', $1)::text`, [formatLsn(fenceLsn)]).catch(() => {});
    done('fence-lsn', formatLsn(fenceLsn), { lsn: formatLsn(fenceLsn) });
    await opts.hooks?.beforeWait?.();

    // 4. Each service applied and recorded it.
    const applyDeadline = Date.now() + opts.applyTimeoutMs;
    let lastShown = 0;
    for (;;) {
      const at = await Promise.all(subs.map((s) => originLsn(s)));
      if (at.every((l) => l >= fenceLsn)) break;
      if (Date.now() - lastShown > 1000) {
        lastShown = Date.now();
        out(`  ${'apply'.padEnd(12)} waiting: ${subs.map((s, i) => `${s.config.subscription} at ${formatLsn(at[i]!)}`).join(', ')} of ${formatLsn(fenceLsn)}`);
      }
      for (const sub of subs)
        if (!(await serviceRunning(sub))) throw new Error(`the pgsub service of subscription ${sub.config.subscription} stopped before it reached the fence LSN`);
      if (Date.now() > applyDeadline) throw new Error(`the target did not reach the fence LSN ${formatLsn(fenceLsn)} within ${opts.applyTimeoutMs / 1000} s`);
      await sleep(50);
    }
    done('apply', `every service applied up to ${formatLsn(fenceLsn)}`);

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

    // 7. Replication back, and the forward subscription(s) disabled.
    if (opts.reverse) {
      reverse = await setupReverse(primary, subs[0]!.target, subs[0]!.tables, opts.reverseConfigFile);
      done(
        'reverse',
        `slot ${reverse.slot} on the new primary from ${formatLsn(reverse.consistentPoint)}; ${opts.reverseConfigFile ? `start it: pgsub run -c ${opts.reverseConfigFile}` : 'config not written (--reverse-config)'}`,
      );
    }
    for (const sub of subs) await finishForward(sub, source, fenceLsn);
    done('finish', `subscription(s) ${subs.map((s) => s.config.subscription).join(', ')} disabled: cut over at ${formatLsn(fenceLsn)}`);

    const downtime = Date.now() - fencedAt;
    return {
      subscriptions: subs.map((s) => s.config.subscription),
      fence: opts.fence,
      fence_lsn: formatLsn(fenceLsn),
      write_downtime_ms: downtime,
      sessions_terminated: fence?.terminated ?? 0,
      steps,
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
    };
  } catch (err) {
    const undone: string[] = [];
    if (reverse) {
      await undoReverse(primary, subs[0]!.target, reverse).then(
        () => undone.push('reverse setup removed'),
        (e) => undone.push(`reverse setup NOT removed (${errorText(e)})`),
      );
    }
    if (fence) {
      await liftFence(fenceClient, fence).then(
        () => undone.push(`fence lifted on database ${fence!.database}`),
        (e) => undone.push(`fence NOT lifted (${errorText(e)}): run ALTER DATABASE ${fence!.database} RESET default_transaction_read_only on the source`),
      );
    }
    log.error({ err: errorText(err), undone }, 'cutover failed');
    throw new CutoverError('PGSUB_CUTOVER_FAILED', `cutover failed after the fence: ${errorText(err)}; ${undone.join(', ') || 'nothing to undo'}`, { undone }, { cause: err });
  } finally {
    await closeAll(source, subs);
  }
}

/**
 * The forward subscription is done: disabled in the target (its service idles until
 * `pgsub enable`), and its walsender on the old primary ended so the running service
 * notices now. Without this, a publisher before 16 would send the reverse stream's writes
 * forward again.
 */
async function finishForward(sub: Sub, source: Db, fenceLsn: Lsn): Promise<void> {
  await sub.target.query(
    `INSERT INTO "pgsub"."subscription" (subscription, enabled, disabled_reason, disabled_at) VALUES ($1, false, $2, pg_catalog.now())
     ON CONFLICT (subscription) DO UPDATE SET enabled = false, disabled_reason = EXCLUDED.disabled_reason, disabled_at = EXCLUDED.disabled_at`,
    [sub.config.subscription, `cut over at ${formatLsn(fenceLsn)}: the target is the primary now`],
  );
  await source.query(`SELECT pg_catalog.pg_terminate_backend(active_pid)::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, [
    sub.config.slotName,
  ]);
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
  lines.push('  the application may now write to the target; the source stays read-only');
  return `${lines.join('\n')}\n`;
}
