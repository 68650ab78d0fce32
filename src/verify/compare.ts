/**
 * The comparison of one table in the two snapshots (docs/verify.md): the key space cut into
 * ranges (ranges.ts), each range's count and hash computed by each database (sql.ts) on a
 * pair of connections, the two answers compared; a range that differs is cut again, down
 * to leaves whose keys and row hashes are read and matched here. A range that one side does
 * not have at all is listed by key without further cutting. A table without a key is one
 * multiset hash and two counts. Work items go through a shared queue served by `parallel`
 * connection pairs, so a large table uses them all; both sides of a range are asked at once.
 */
import type { KeyRange, Query, TableShape } from './sql.js';
import { boundariesQuery, hashQuery, keysQuery, leafQuery, minMaxQuery } from './sql.js';
import { firstLevelParts, integerEnds, isIntegerKey, LEAF_ROWS, sampleStep, splitAt, splitInteger, SPLIT_PARTS } from './ranges.js';

export type SideName = 'source' | 'target';

/** One connection inside a snapshot: rows as arrays of text. */
export interface SideConnection {
  rows(q: Query): Promise<(string | null)[][]>;
}

export interface ConnectionPair {
  source: SideConnection;
  target: SideConnection;
}

export type DifferenceKind = 'missing' | 'extra' | 'different';

export interface Difference {
  kind: DifferenceKind;
  key: Record<string, string | null>;
}

export interface TableReport {
  table: string;
  status: 'equal' | 'different' | 'not compared';
  reason: string | null;
  keyed: boolean;
  sourceRows: number;
  targetRows: number;
  missing: number;
  extra: number;
  different: number;
  /** The first differences found, at most the listing limit. */
  listed: Difference[];
  ranges: number;
  ms: number;
}

/** Per-side throttle: at most `perSecond` units (rows or bytes) per second, on average. */
export class RateLimit {
  #spent = 0;
  readonly #started = performance.now();
  constructor(
    readonly perSecond: number,
    readonly unit: 'rows' | 'bytes',
  ) {}

  async wait(): Promise<void> {
    const ahead = this.#spent / this.perSecond - (performance.now() - this.#started) / 1000;
    if (ahead > 0) await new Promise((r) => setTimeout(r, ahead * 1000));
  }

  spend(rows: number, bytes: number): void {
    this.#spent += this.unit === 'rows' ? rows : bytes;
  }
}

export interface CompareOptions {
  /** Differences listed per table. */
  listLimit: number;
  /** Keys kept per table for --repair (beyond: the table is too different to repair by key). */
  repairLimit: number;
  limits: { source: RateLimit | null; target: RateLimit | null };
  onRows(rows: number): void;
}

interface RangeHash {
  count: number;
  h1: string;
  h2: string;
  bytes: number;
}

type Task = (pair: ConnectionPair) => Promise<void>;

/** The queue the connection pairs serve; a task may add tasks. Rejects with the first failure. */
export class WorkQueue {
  #tasks: Task[] = [];
  #active = 0;
  #wake: (() => void) | null = null;
  #failure: unknown = null;

  push(task: Task): void {
    this.#tasks.push(task);
    this.#wake?.();
  }

  async run(pairs: readonly ConnectionPair[]): Promise<void> {
    await Promise.all(pairs.map((pair) => this.#serve(pair)));
    if (this.#failure !== null) throw this.#failure;
  }

  async #serve(pair: ConnectionPair): Promise<void> {
    for (;;) {
      if (this.#failure !== null) return;
      const task = this.#tasks.shift();
      if (task === undefined) {
        if (this.#active === 0) {
          this.#wake?.();
          return;
        }
        await new Promise<void>((resolve) => {
          const previous = this.#wake;
          this.#wake = () => {
            this.#wake = null;
            previous?.();
            resolve();
          };
        });
        continue;
      }
      this.#active++;
      try {
        await task(pair);
      } catch (err) {
        this.#failure ??= err;
      } finally {
        this.#active--;
        this.#wake?.();
      }
    }
  }
}

/** One table's comparison: its report, and the keys a repair would re-copy. */
export class TableComparison {
  readonly report: TableReport;
  /** key (JSON of its text values) → the key values and what differs. */
  readonly repairKeys = new Map<string, { key: string[]; kind: DifferenceKind }>();
  repairOverflow = false;
  readonly #started = performance.now();

  constructor(
    readonly shape: TableShape,
    readonly estimatedRows: number,
    private readonly opts: CompareOptions,
  ) {
    this.report = {
      table: `${shape.schema}.${shape.table}`,
      status: 'equal',
      reason: shape.key.length === 0 ? 'no primary key: compared as a multiset (row count and hash)' : null,
      keyed: shape.key.length > 0,
      sourceRows: 0,
      targetRows: 0,
      missing: 0,
      extra: 0,
      different: 0,
      listed: [],
      ranges: 0,
      ms: 0,
    };
  }

  /** The table's first work item: cut it (keyed) or hash it whole (keyless). */
  start(queue: WorkQueue, finished: () => void): void {
    let open = 0;
    const track = (task: Task): Task => {
      open++;
      return async (pair) => {
        try {
          await task(pair);
        } finally {
          if (--open === 0) {
            this.report.ms = Math.round(performance.now() - this.#started);
            if (this.report.missing + this.report.extra + this.report.different > 0) this.report.status = 'different';
            finished();
          }
        }
      };
    };
    const range = (r: KeyRange, depth: number): Task => track((pair) => this.#range(pair, r, depth, (sub) => queue.push(range(sub, depth + 1))));
    queue.push(
      track(async (pair) => {
        if (this.shape.key.length === 0) return this.#keyless(pair);
        for (const r of await this.#firstRanges(pair)) queue.push(range(r, 0));
      }),
    );
  }

  async #rows(pair: ConnectionPair, side: SideName, q: Query): Promise<(string | null)[][]> {
    await this.opts.limits[side]?.wait();
    return pair[side].rows(q);
  }

  async #hash(pair: ConnectionPair, side: SideName, range: KeyRange | null): Promise<RangeHash> {
    const [row] = await this.#rows(pair, side, hashQuery(this.shape, range, side));
    const h = { count: Number(row?.[0] ?? 0), h1: String(row?.[1] ?? '0'), h2: String(row?.[2] ?? '0'), bytes: Number(row?.[3] ?? 0) };
    this.opts.limits[side]?.spend(h.count, h.bytes);
    return h;
  }

  async #firstRanges(pair: ConnectionPair): Promise<KeyRange[]> {
    const parts = firstLevelParts(this.estimatedRows);
    if (isIntegerKey(this.shape)) {
      const [[s], [t]] = await Promise.all([this.#rows(pair, 'source', minMaxQuery(this.shape, 'source')), this.#rows(pair, 'target', minMaxQuery(this.shape, 'target'))]);
      const lows = [s?.[0], t?.[0]].filter((v): v is string => v != null).map(BigInt);
      const highs = [s?.[1], t?.[1]].filter((v): v is string => v != null).map(BigInt);
      if (lows.length === 0) return [{ lo: null, hi: null }];
      const [lo, hi] = [lows.sort(bigintOrder)[0]!, highs.sort(bigintOrder)[highs.length - 1]! + 1n];
      return splitInteger(lo, hi, parts);
    }
    const whole: KeyRange = { lo: null, hi: null };
    if (parts === 1) return [whole];
    const bounds = await this.#rows(pair, 'source', boundariesQuery(this.shape, null, 'source', sampleStep(this.estimatedRows, parts)));
    return splitAt(whole, bounds as string[][]);
  }

  async #keyless(pair: ConnectionPair): Promise<void> {
    const [s, t] = await Promise.all([this.#hash(pair, 'source', null), this.#hash(pair, 'target', null)]);
    this.report.ranges++;
    this.report.sourceRows = s.count;
    this.report.targetRows = t.count;
    this.opts.onRows(s.count);
    if (s.count > t.count) this.report.missing = s.count - t.count;
    else if (t.count > s.count) this.report.extra = t.count - s.count;
    else if (s.h1 !== t.h1 || s.h2 !== t.h2) this.report.different = 1;
  }

  async #range(pair: ConnectionPair, range: KeyRange, depth: number, split: (sub: KeyRange) => void): Promise<void> {
    const [s, t] = await Promise.all([this.#hash(pair, 'source', range), this.#hash(pair, 'target', range)]);
    this.report.ranges++;
    if (s.count === t.count && s.h1 === t.h1 && s.h2 === t.h2) {
      this.#counted(s.count, t.count);
      return;
    }
    if (s.count === 0 || t.count === 0) {
      // One side has none of it: every key of the other side differs, no need to cut further.
      const side: SideName = s.count > 0 ? 'source' : 'target';
      const kind: DifferenceKind = side === 'source' ? 'missing' : 'extra';
      const keys = await this.#rows(pair, side, keysQuery(this.shape, range, side, Math.max(this.opts.listLimit, this.opts.repairLimit + 1)));
      for (const k of keys) this.#record(kind, k as string[]);
      this.report[kind] += Math.max(s.count, t.count) - keys.length;
      if (keys.length < Math.max(s.count, t.count)) this.repairOverflow = true;
      this.#counted(s.count, t.count);
      return;
    }
    const most = Math.max(s.count, t.count);
    if (most > LEAF_ROWS && depth < 48) {
      let subs: KeyRange[] = [];
      const ends = integerEnds(range);
      if (isIntegerKey(this.shape)) {
        if (ends && ends[1] - ends[0] > 1n) subs = splitInteger(ends[0], ends[1], SPLIT_PARTS);
      } else {
        const side: SideName = s.count >= t.count ? 'source' : 'target';
        subs = splitAt(range, (await this.#rows(pair, side, boundariesQuery(this.shape, range, side, sampleStep(most, SPLIT_PARTS)))) as string[][]);
      }
      if (subs.length > 1) {
        for (const sub of subs) split(sub);
        return;
      }
    }
    await this.#leaf(pair, range);
    this.#counted(s.count, t.count);
  }

  async #leaf(pair: ConnectionPair, range: KeyRange): Promise<void> {
    const [sourceRows, targetRows] = await Promise.all([
      this.#rows(pair, 'source', leafQuery(this.shape, range, 'source')),
      this.#rows(pair, 'target', leafQuery(this.shape, range, 'target')),
    ]);
    const n = this.shape.key.length;
    const target = new Map(targetRows.map((r) => [JSON.stringify(r.slice(0, n)), r[n]]));
    for (const r of sourceRows) {
      const id = JSON.stringify(r.slice(0, n));
      const hash = target.get(id);
      if (hash === undefined) this.#record('missing', r.slice(0, n) as string[]);
      else if (hash !== r[n]) this.#record('different', r.slice(0, n) as string[]);
      target.delete(id);
    }
    for (const [id] of target) this.#record('extra', JSON.parse(id) as string[]);
  }

  #counted(source: number, target: number): void {
    this.report.sourceRows += source;
    this.report.targetRows += target;
    this.opts.onRows(source);
  }

  #record(kind: DifferenceKind, key: string[]): void {
    this.report[kind]++;
    if (this.report.listed.length < this.opts.listLimit) this.report.listed.push({ kind, key: Object.fromEntries(this.shape.key.map((k, i) => [k, key[i] ?? null])) });
    if (this.repairKeys.size < this.opts.repairLimit) this.repairKeys.set(JSON.stringify(key), { key, kind });
    else this.repairOverflow = true;
  }
}

function bigintOrder(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
