/**
 * Sequences follow the data (config `sequences: sync`, the default). Logical replication
 * carries no sequence changes, so a target promoted without this would hand out values
 * the source already used. Which target sequence each source sequence moves is planned by
 * sequence-plan.ts: the sequence feeding the column's target (under the mapping's names,
 * found with pg_get_serial_sequence on the target), several sources where tables merge
 * many-to-one, and `sequence_names` under their own names. Each source is read
 * (`SELECT last_value, is_called`, PostgreSQL 10+) and the target sequence set with setval
 * to the furthest source's next value plus `sequence_margin` increments — at the cutover
 * also past max(column) by the margin, whatever wrote the column: periodically while
 * pgsub runs (every `sequence_interval`; the margin covers what the source hands out in
 * between, so a failover at any moment finds the target ahead) and exactly at cutover,
 * when the fenced source no longer moves. A target sequence is only ever moved forward
 * (in the direction of its increment): one already ahead, by use or by an earlier sync,
 * is left alone. A permission error names the server, the sequences and the GRANT
 * (grants.ts sequencePermissionError).
 *
 * Nothing is stored: `pgsub status` reads both sides (sequenceStatus).
 */
import type { Config } from '../config/config.js';
import type { Logger } from '../log.js';
import { errorText, isTrue, openPgDb, openTargetDb, publishedTables, type Db, type Row } from './db.js';
import { sequencePermissionError } from './grants.js';
import { readDescendants, readSequenceUses, seqName, type Rel, type SequenceUse } from './objects.js';
import { planSequences, planSources, type PlannedSequence, type SequencePlan } from './sequence-plan.js';
import { quoteIdent, quoteQualified } from '../quote.js';

export interface SequenceValue {
  lastValue: bigint;
  isCalled: boolean;
  increment: bigint;
  min: bigint;
  max: bigint;
}

/** The value nextval() would return next. */
export function nextValue(v: SequenceValue): bigint {
  return v.isCalled ? v.lastValue + v.increment : v.lastValue;
}

/** Whether `a` is ahead of `b` in the sequence's direction. */
export const ahead = (a: bigint, b: bigint, increment: bigint): boolean => (increment > 0n ? a > b : a < b);

export interface SequenceSync {
  /** The target's sequence (schema.name). */
  sequence: string;
  /** The target column it feeds; for one not planned, the source column. */
  usedBy: string | null;
  kind: SequenceUse['kind'];
  /** The source sequences merged into it (one, or several many-to-one). */
  sources: string[];
  /** The furthest source's next value; null when the source lacks them. */
  sourceNext: bigint | null;
  /** The column's largest value (smallest for a descending sequence), as text, where the floor was read. */
  columnLast: string | null;
  targetNextBefore: bigint | null;
  targetNextAfter: bigint | null;
  moved: boolean;
  /** Which side lacks it, if one does. */
  missing: 'source' | 'target' | null;
  /** Why it is not synced (sequence-plan.ts), or null. */
  reason: string | null;
}

/** The sequences to sync as the source names them: the published tables' (with their partitions') and sequence_names. */
export async function listSyncedSequences(source: Db, config: Config): Promise<SequenceUse[]> {
  const roots: Rel[] = (await publishedTables(source, config.publications)).map((t) => ({ schema: t.schema, table: t.table }));
  const rels = [...roots, ...(await readDescendants(source, roots))];
  const uses = await readSequenceUses(source, rels);
  for (const s of config.sequenceNames) if (!uses.some((u) => seqName(u) === seqName(s))) uses.push({ ...s, kind: 'config', usedBy: null });
  return uses;
}

/** Current values of the sequences that exist on this side (one statement for all of them). */
export async function readSequenceValues(db: Db, seqs: readonly { schema: string; name: string }[]): Promise<Map<string, SequenceValue>> {
  if (seqs.length === 0) return new Map();
  const meta = await db
    .query<Row>(
      `SELECT x.schema || '.' || x.name AS name, pg_catalog.format('%I.%I', x.schema, x.name) AS qualified,
            s.seqincrement::text AS inc, s.seqmin::text AS min, s.seqmax::text AS max
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
       JOIN pg_catalog.pg_sequence s ON s.seqrelid = pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name))`,
      [JSON.stringify(seqs.map((s) => ({ schema: s.schema, name: s.name })))],
    )
    .catch(async (err: unknown) => {
      // Which server, which sequences, and the GRANT to run there: not a bare "permission denied".
      throw (await sequencePermissionError(err, db, seqs, 'SELECT')) ?? err;
    });
  if (meta.length === 0) return new Map();
  // format('%I.%I') above quoted the names; they are interpolated as identifiers only.
  const values = await db
    .query<Row>(meta.map((m, i) => `SELECT ${i}::text AS i, last_value::text AS last, is_called::text AS called FROM ${m.qualified}`).join(' UNION ALL '))
    .catch(async (err: unknown) => {
      throw (await sequencePermissionError(err, db, seqs, 'SELECT')) ?? err;
    });
  const out = new Map<string, SequenceValue>();
  for (const v of values) {
    const m = meta[Number(v.i)]!;
    out.set(m.name!, { lastValue: BigInt(v.last!), isCalled: isTrue(v.called), increment: BigInt(m.inc!), min: BigInt(m.min!), max: BigInt(m.max!) });
  }
  return out;
}

/** The value a sequence must hand out next to be past `value` plus `margin` increments. */
const pastBy = (value: bigint, increment: bigint, margin: number): bigint => value + increment * BigInt(1 + margin);

/**
 * Each planned column's largest value (smallest for a descending sequence) on the target:
 * the values its sequence must get past, whichever source they came from (max(column): one
 * index probe on a key), all in one statement. Absent for an empty column or one whose
 * values are not integers.
 */
async function columnLasts(target: Db, plan: SequencePlan, tgt: Map<string, SequenceValue>): Promise<Map<string, bigint>> {
  const parts = plan.sequences.flatMap((p, i) => {
    const b = tgt.get(seqName(p));
    if (!p.column || !b) return [];
    const fn = b.increment > 0n ? 'max' : 'min';
    return [`(SELECT ${i}::text AS i, pg_catalog.${fn}(${quoteIdent(p.column.column)})::text AS v FROM ${quoteQualified(p.column.schema, p.column.table)})`];
  });
  const out = new Map<string, bigint>();
  if (parts.length === 0) return out;
  for (const r of await target.query<Row>(parts.join(' UNION ALL '))) {
    if (r.v != null && /^-?\d+$/.test(r.v)) out.set(seqName(plan.sequences[Number(r.i)]!), BigInt(r.v));
  }
  return out;
}

/** What the sync wants a target sequence's next value to be: past every source by the margin (and past the column). */
function wanted(p: PlannedSequence, src: Map<string, SequenceValue>, b: SequenceValue, margin: number, last: bigint | null): { want: bigint; sourceNext: bigint } | null {
  let want: bigint | null = null;
  let sourceNext: bigint | null = null;
  for (const s of p.sources) {
    const a = src.get(seqName(s));
    if (!a) continue;
    const next = nextValue(a);
    const w = next + BigInt(margin) * a.increment;
    if (want === null || ahead(w, want, b.increment)) want = w;
    if (sourceNext === null || ahead(next, sourceNext, b.increment)) sourceNext = next;
  }
  if (want === null || sourceNext === null) return null;
  if (last !== null && ahead(pastBy(last, b.increment, margin), want, b.increment)) want = pastBy(last, b.increment, margin);
  // setval takes a value within the target's bounds; an exhausted sequence stays at its end.
  if (want > b.max) want = b.max;
  if (want < b.min) want = b.min;
  return { want, sourceNext };
}

export interface SyncOptions {
  /** Also past max(column) + margin on the target (at the cutover and in one-off syncs; the periodic one skips the scan). */
  columnFloor?: boolean;
}

/**
 * Set each planned target sequence to the furthest of its sources' next values plus
 * `margin` increments (and, with columnFloor, past its column's values by the margin),
 * where that is ahead of the target's own next value; never past the sequence's bounds.
 * What the plan could not place is returned with its reason, unmoved.
 */
export async function syncSequences(source: Db, target: Db, plan: SequencePlan, margin: number, opts: SyncOptions = {}): Promise<SequenceSync[]> {
  const targets = plan.sequences.map((p) => ({ schema: p.schema, name: p.name }));
  const [src, tgt] = await Promise.all([readSequenceValues(source, planSources(plan)), readSequenceValues(target, targets)]);
  const lasts = opts.columnFloor ? await columnLasts(target, plan, tgt) : new Map<string, bigint>();
  const out: SequenceSync[] = [];
  for (const p of plan.sequences) {
    const name = seqName(p);
    const b = tgt.get(name);
    const base = { sequence: name, usedBy: p.usedBy, kind: p.kind, sources: p.sources.map(seqName), reason: null };
    const last = lasts.get(name) ?? null;
    const w = b ? wanted(p, src, b, margin, last) : null;
    if (!b || !w) {
      const firstSource = p.sources.map((s) => src.get(seqName(s))).find((v) => v !== undefined);
      out.push({
        ...base,
        sourceNext: firstSource ? nextValue(firstSource) : null,
        columnLast: null,
        targetNextBefore: b ? nextValue(b) : null,
        targetNextAfter: b ? nextValue(b) : null,
        moved: false,
        missing: b ? 'source' : 'target',
      });
      continue;
    }
    const before = nextValue(b);
    const move = ahead(w.want, before, b.increment);
    if (move)
      await target
        .query(`SELECT pg_catalog.setval(pg_catalog.format('%I.%I', $1::text, $2::text)::pg_catalog.regclass, $3::pg_catalog.int8, false)::text`, [
          p.schema,
          p.name,
          w.want.toString(),
        ])
        .catch(async (err: unknown) => {
          throw (await sequencePermissionError(err, target, targets, 'UPDATE')) ?? err;
        });
    out.push({
      ...base,
      sourceNext: w.sourceNext,
      columnLast: last?.toString() ?? null,
      targetNextBefore: before,
      targetNextAfter: move ? w.want : before,
      moved: move,
      missing: null,
    });
  }
  for (const u of plan.unplanned)
    out.push({
      sequence: u.sequence,
      usedBy: u.usedBy,
      kind: u.kind,
      sources: [u.sequence],
      sourceNext: null,
      columnLast: null,
      targetNextBefore: null,
      targetNextAfter: null,
      moved: false,
      missing: 'target',
      reason: u.reason,
    });
  return out;
}

/**
 * The cutover's sync (its step 5): the plan made before the fence, applied to the fenced
 * source exactly (with the column floor), then read back: a planned target sequence not
 * at or past every one of its sources is a failure. Unplanned ones are reported, not
 * failed: no target sequence of theirs could hand out a used value.
 */
export async function syncAtFence(source: Db, target: Db, plan: SequencePlan, margin: number): Promise<SequenceSync[]> {
  const synced = await syncSequences(source, target, plan, margin, { columnFloor: true });
  const [src, tgt] = await Promise.all([
    readSequenceValues(source, planSources(plan)),
    readSequenceValues(
      target,
      plan.sequences.map((p) => ({ schema: p.schema, name: p.name })),
    ),
  ]);
  const behind = plan.sequences.filter((p) => {
    const b = tgt.get(seqName(p));
    return (
      !b ||
      p.sources.some((s) => {
        const a = src.get(seqName(s));
        return !a || ahead(nextValue(a), nextValue(b), b.increment);
      })
    );
  });
  if (behind.length > 0)
    throw new Error(
      `sequence(s) ${behind.map((p) => `${seqName(p)} (from ${p.sources.map(seqName).join(', ')})`).join(', ')} could not be set ahead of the source on the target (missing on a side?)`,
    );
  return synced;
}

export interface SequenceStatus {
  /** The target's sequence; for one not planned, the source's. */
  sequence: string;
  used_by: string | null;
  kind: string;
  /** The source sequences merged into it. */
  sources: string[];
  /** The furthest source's last value. */
  source_last_value: string | null;
  target_last_value: string | null;
  /** What nextval() returns next on the target (a sync sets this, without using a value). */
  target_next_value: string | null;
  /** Increments the target's next value is ahead of the furthest source's (negative: behind); null when a side lacks it. */
  ahead_by: number | null;
  /** The target's next value is at or ahead of every source's. */
  synced: boolean | null;
  /** Why it is not synced (no target sequence for it), or null. */
  reason: string | null;
}

/** One planned sequence's status from both sides' values. */
function statusOf(p: PlannedSequence, src: Map<string, SequenceValue>, b: SequenceValue | undefined): SequenceStatus {
  let a: SequenceValue | undefined;
  for (const s of p.sources) {
    const v = src.get(seqName(s));
    if (v && (!a || ahead(nextValue(v), nextValue(a), v.increment))) a = v;
  }
  const diff = a && b ? (nextValue(b) - nextValue(a)) / (a.increment === 0n ? 1n : a.increment) : null;
  return {
    sequence: seqName(p),
    used_by: p.usedBy,
    kind: p.kind,
    sources: p.sources.map(seqName),
    source_last_value: a ? (a.isCalled ? a.lastValue.toString() : null) : null,
    target_last_value: b ? (b.isCalled ? b.lastValue.toString() : null) : null,
    target_next_value: b ? nextValue(b).toString() : null,
    ahead_by: diff === null ? null : Number(diff),
    synced: a && b ? !ahead(nextValue(a), nextValue(b), a.increment) : null,
    reason: null,
  };
}

/** For `pgsub status`: both sides read now; a side that cannot be read rejects (status shows why). */
export async function sequenceStatus(config: Config): Promise<SequenceStatus[]> {
  const appName = `pgsub_${config.subscription}_status`;
  const withTimeout = (info: Config['source']) => ({ ...info, connectTimeoutSeconds: info.connectTimeoutSeconds ?? 10 });
  let source: Db | null = null;
  let target: Db | null = null;
  try {
    source = await openPgDb(withTimeout(config.source), appName);
    target = await openTargetDb(withTimeout(config.target), appName);
    const plan = await planSequences(source, target, config);
    const [src, tgt] = await Promise.all([
      readSequenceValues(source, planSources(plan)),
      readSequenceValues(
        target,
        plan.sequences.map((p) => ({ schema: p.schema, name: p.name })),
      ),
    ]);
    return [
      ...plan.sequences.map((p) => statusOf(p, src, tgt.get(seqName(p)))),
      ...plan.unplanned.map((u) => ({
        sequence: u.sequence,
        used_by: u.usedBy,
        kind: u.kind,
        sources: [u.sequence],
        source_last_value: null,
        target_last_value: null,
        target_next_value: null,
        ahead_by: null,
        synced: null,
        reason: u.reason,
      })),
    ];
  } finally {
    await source?.close();
    await target?.close();
  }
}

/** How long a stop waits for a round in flight. */
const STOP_WAIT_MS = 1000;

const shortConnect = (info: Config['source']): Config['source'] => ({ ...info, connectTimeoutSeconds: Math.min(info.connectTimeoutSeconds ?? 10, 10) });

export interface SequenceSyncService {
  stop(): Promise<void>;
  /** The last round's result (null before the first). */
  last(): SequenceSync[] | null;
  /** Rounds that failed (pg_stat_subscription_stats.sync_seq_error_count; a fence ending the session is not one). */
  errors(): number;
}

/** The longest the first round waits for `firstRoundAfter`. */
const FIRST_ROUND_WAIT_MS = 5000;

/**
 * The periodic sync inside `pgsub run`: a round every sequence_interval on connections of
 * its own (opened for the round, so a server restart costs one round). A failing round is
 * logged (at warn the first time a message is seen, at debug after) and retried next time.
 * The first round starts once `firstRoundAfter` settles (the stream started) or after 5 s:
 * it reads the catalogs of both servers as the session's start does, and would slow it.
 */
export function startSequenceSync(config: Config, log: Logger, firstRoundAfter: Promise<void> = Promise.resolve()): SequenceSyncService {
  if (config.sequences === 'off') return { stop: async () => {}, last: () => null, errors: () => 0 };
  const appName = `pgsub_${config.subscription}_sequences`;
  let stopped = false;
  let last: SequenceSync[] | null = null;
  let errors = 0;
  let timer: NodeJS.Timeout | null = null;
  let running: Promise<void> | null = null;
  const warned = new Set<string>();
  const round = async () => {
    let source: Db | null = null;
    let target: Db | null = null;
    try {
      // A server that does not answer delays one round, not the service's stop, by long.
      source = await openPgDb(shortConnect(config.source), appName);
      target = await openTargetDb(shortConnect(config.target), appName);
      const result = await syncSequences(source, target, await planSequences(source, target, config), config.sequenceMargin);
      last = result;
      const moved = result.filter((r) => r.moved);
      for (const r of result.filter((x) => x.missing !== null)) {
        const key = `missing:${r.sequence}:${r.missing}`;
        if (!warned.has(key))
          log.warn({ sequence: r.sequence, side: r.missing, reason: r.reason }, r.reason ? `sequence not synced: ${r.reason}` : `sequence missing on the ${r.missing}; not synced`);
        warned.add(key);
      }
      if (moved.length > 0) log.info({ sequences: moved.length, of: result.length, margin: config.sequenceMargin }, 'sequences synced to the target');
      else log.debug({ sequences: result.length }, 'sequences: the target is ahead already');
    } catch (err) {
      // A cutover's fence ends every source session, this round's too: expected, not a fault.
      if ((err as { code?: unknown })?.code === '57P01') {
        log.info('sequence sync: its session was ended by the server (a fence ends sessions); retrying at the next interval');
        return;
      }
      errors++;
      const key = `error:${errorText(err)}`;
      if (warned.has(key)) log.debug({ err }, 'sequence sync failed; retrying at the next interval');
      else log.warn({ err }, 'sequence sync failed; retrying at the next interval');
      warned.add(key);
    } finally {
      await source?.close();
      await target?.close();
    }
  };
  const schedule = (ms: number) => {
    if (stopped) return;
    timer = setTimeout(() => {
      running = round().finally(() => {
        running = null;
        schedule(config.sequenceIntervalMs);
      });
    }, ms);
    timer.unref();
  };
  let waitTimer: NodeJS.Timeout | null = null;
  let scheduled = false;
  const first = () => {
    if (scheduled) return;
    scheduled = true;
    if (waitTimer) clearTimeout(waitTimer);
    schedule(0);
  };
  waitTimer = setTimeout(first, FIRST_ROUND_WAIT_MS);
  waitTimer.unref();
  void firstRoundAfter.then(first, first);
  return {
    last: () => last,
    errors: () => errors,
    stop: async () => {
      stopped = true;
      scheduled = true;
      if (waitTimer) clearTimeout(waitTimer);
      if (timer) clearTimeout(timer);
      // A round in flight finishes on its own; the stop waits for it only briefly.
      await Promise.race([running, new Promise((r) => setTimeout(r, STOP_WAIT_MS).unref())]);
    },
  };
}
