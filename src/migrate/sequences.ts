/**
 * Sequences follow the data (config `sequences: sync`, the default). Logical replication
 * carries no sequence changes, so a target promoted without this would hand out values
 * the source already used. Every sequence the published tables use — identity and serial
 * columns, nextval() in a default — and those named in `sequence_names` is read on the
 * source (`SELECT last_value, is_called`, PostgreSQL 10+) and set on the target with
 * setval to the source's next value plus `sequence_margin` increments: periodically while
 * pgsub runs (every `sequence_interval`; the margin covers what the source hands out in
 * between, so a failover at any moment finds the target ahead) and exactly at cutover,
 * when the fenced source no longer moves. A target sequence is only ever moved forward
 * (in the direction of its increment): one already ahead, by use or by an earlier sync,
 * is left alone.
 *
 * Nothing is stored: `pgsub status` reads both sides (sequenceStatus).
 */
import type { Config } from '../config/config.js';
import type { Logger } from '../log.js';
import { errorText, isTrue, openPgDb, openTargetDb, publishedTables, type Db, type Row } from './db.js';
import { sequencePermissionError } from './grants.js';
import { readDescendants, readSequenceUses, seqName, type Rel, type SequenceUse } from './objects.js';

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
  sequence: string;
  usedBy: string | null;
  kind: SequenceUse['kind'];
  /** The source's next value; null when the source lacks the sequence. */
  sourceNext: bigint | null;
  targetNextBefore: bigint | null;
  targetNextAfter: bigint | null;
  moved: boolean;
  /** Which side lacks it, if one does. */
  missing: 'source' | 'target' | null;
}

/** The sequences to sync: the published tables' (with their partitions') and sequence_names. */
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

/**
 * Set each target sequence to the source's next value plus `margin` increments, where
 * that is ahead of the target's own next value; never past the sequence's bounds.
 */
export async function syncSequences(source: Db, target: Db, seqs: readonly SequenceUse[], margin: number): Promise<SequenceSync[]> {
  const [src, tgt] = await Promise.all([readSequenceValues(source, seqs), readSequenceValues(target, seqs)]);
  const out: SequenceSync[] = [];
  for (const s of seqs) {
    const name = seqName(s);
    const a = src.get(name);
    const b = tgt.get(name);
    const base = { sequence: name, usedBy: s.usedBy, kind: s.kind };
    if (!a || !b) {
      out.push({
        ...base,
        sourceNext: a ? nextValue(a) : null,
        targetNextBefore: b ? nextValue(b) : null,
        targetNextAfter: b ? nextValue(b) : null,
        moved: false,
        missing: a ? 'target' : 'source',
      });
      continue;
    }
    const before = nextValue(b);
    let want = nextValue(a) + BigInt(margin) * a.increment;
    // setval takes a value within the target's bounds; an exhausted sequence stays at its end.
    if (want > b.max) want = b.max;
    if (want < b.min) want = b.min;
    const move = ahead(want, before, b.increment);
    if (move)
      await target
        .query(`SELECT pg_catalog.setval(pg_catalog.format('%I.%I', $1::text, $2::text)::pg_catalog.regclass, $3::pg_catalog.int8, false)::text`, [
          s.schema,
          s.name,
          want.toString(),
        ])
        .catch(async (err: unknown) => {
          throw (await sequencePermissionError(err, target, seqs, 'UPDATE')) ?? err;
        });
    out.push({ ...base, sourceNext: nextValue(a), targetNextBefore: before, targetNextAfter: move ? want : before, moved: move, missing: null });
  }
  return out;
}

export interface SequenceStatus {
  sequence: string;
  used_by: string | null;
  kind: string;
  source_last_value: string | null;
  target_last_value: string | null;
  /** What nextval() returns next on the target (a sync sets this, without using a value). */
  target_next_value: string | null;
  /** Increments the target's next value is ahead of the source's (negative: behind); null when a side lacks it. */
  ahead_by: number | null;
  /** The target's next value is at or ahead of the source's. */
  synced: boolean | null;
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
    const seqs = await listSyncedSequences(source, config);
    const [src, tgt] = await Promise.all([readSequenceValues(source, seqs), readSequenceValues(target, seqs)]);
    return seqs.map((s) => {
      const a = src.get(seqName(s));
      const b = tgt.get(seqName(s));
      const diff = a && b ? (nextValue(b) - nextValue(a)) / (a.increment === 0n ? 1n : a.increment) : null;
      return {
        sequence: seqName(s),
        used_by: s.usedBy,
        kind: s.kind,
        source_last_value: a ? (a.isCalled ? a.lastValue.toString() : null) : null,
        target_last_value: b ? (b.isCalled ? b.lastValue.toString() : null) : null,
        target_next_value: b ? nextValue(b).toString() : null,
        ahead_by: diff === null ? null : Number(diff),
        synced: a && b ? !ahead(nextValue(a), nextValue(b), a.increment) : null,
      };
    });
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
}

/**
 * The periodic sync inside `pgsub run`: a round every sequence_interval on connections of
 * its own (opened for the round, so a server restart costs one round). A failing round is
 * logged (at warn the first time a message is seen, at debug after) and retried next time.
 */
export function startSequenceSync(config: Config, log: Logger): SequenceSyncService {
  if (config.sequences === 'off') return { stop: async () => {}, last: () => null };
  const appName = `pgsub_${config.subscription}_sequences`;
  let stopped = false;
  let last: SequenceSync[] | null = null;
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
      const result = await syncSequences(source, target, await listSyncedSequences(source, config), config.sequenceMargin);
      last = result;
      const moved = result.filter((r) => r.moved);
      for (const r of result.filter((x) => x.missing !== null)) {
        const key = `missing:${r.sequence}:${r.missing}`;
        if (!warned.has(key)) log.warn({ sequence: r.sequence, side: r.missing }, `sequence missing on the ${r.missing}; not synced`);
        warned.add(key);
      }
      if (moved.length > 0) log.info({ sequences: moved.length, of: result.length, margin: config.sequenceMargin }, 'sequences synced to the target');
      else log.debug({ sequences: result.length }, 'sequences: the target is ahead already');
    } catch (err) {
      const e = { code: (err as { code?: unknown })?.code, message: errorText(err) };
      const key = `error:${e.message}`;
      if (warned.has(key)) log.debug({ err: e }, 'sequence sync failed; retrying at the next interval');
      else log.warn({ err: e }, 'sequence sync failed; retrying at the next interval');
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
  schedule(0);
  return {
    last: () => last,
    stop: async () => {
      stopped = true;
      if (timer) clearTimeout(timer);
      // A round in flight finishes on its own; the stop waits for it only briefly.
      await Promise.race([running, new Promise((r) => setTimeout(r, STOP_WAIT_MS).unref())]);
    },
  };
}
