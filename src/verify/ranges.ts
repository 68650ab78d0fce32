/**
 * How `pgsub verify` cuts a table's key space (compare.ts): a single integer key by equal
 * widths between its smallest and largest value (the index ends, no scan), any other key
 * by boundaries sampled in key order; a range that differs is cut again the same way,
 * until its rows are few enough to compare one by one (a leaf). Pure.
 */
import type { KeyRange, TableShape } from './sql.js';

/** Rows per range at the first level: a range's hash is one index range scan of about this many rows. */
export const RANGE_ROWS = 50_000;
/** At most this many ranges at the first level (and per split below it). */
export const MAX_PARTS = 256;
/** Ranges a differing range is cut into. */
export const SPLIT_PARTS = 16;
/** A range with at most this many rows on each side is compared row by row. */
export const LEAF_ROWS = 256;

const INTEGER_TYPES = new Set(['int2', 'int4', 'int8']);

/** A single-column integer key: ranges by width. */
export function isIntegerKey(shape: Pick<TableShape, 'key' | 'columns'>): boolean {
  if (shape.key.length !== 1) return false;
  const c = shape.columns.find((col) => col.name === shape.key[0]);
  return c !== undefined && INTEGER_TYPES.has(c.base);
}

/** How many first-level ranges for a table of about `rows` rows. */
export function firstLevelParts(rows: number): number {
  return Math.max(1, Math.min(MAX_PARTS, Math.ceil(Math.max(0, rows) / RANGE_ROWS)));
}

/** [lo, hi) cut into at most `parts` non-empty ranges of equal width (the last may be shorter). */
export function splitInteger(lo: bigint, hi: bigint, parts: number): KeyRange[] {
  if (hi <= lo) return [];
  const span = hi - lo;
  const n = BigInt(Math.max(1, Math.floor(parts)));
  const width = (span + n - 1n) / n;
  const out: KeyRange[] = [];
  for (let start = lo; start < hi; start += width) {
    const end = start + width < hi ? start + width : hi;
    out.push({ lo: [String(start)], hi: [String(end)] });
  }
  return out;
}

/** An integer range's ends as numbers (a range from splitInteger always has both). */
export function integerEnds(range: KeyRange): [bigint, bigint] | null {
  if (range.lo === null || range.hi === null) return null;
  return [BigInt(range.lo[0]!), BigInt(range.hi[0]!)];
}

/** `range` cut at sampled boundaries (in key order; repeats and ends dropped). */
export function splitAt(range: KeyRange, boundaries: readonly string[][]): KeyRange[] {
  const same = (a: readonly string[] | null, b: readonly string[] | null) => a !== null && b !== null && a.length === b.length && a.every((v, i) => v === b[i]);
  const cuts: string[][] = [];
  for (const b of boundaries) {
    if (same(b, cuts[cuts.length - 1] ?? null) || same(b, range.lo) || same(b, range.hi)) continue;
    cuts.push([...b]);
  }
  const out: KeyRange[] = [];
  let lo = range.lo;
  for (const cut of cuts) {
    out.push({ lo, hi: cut });
    lo = cut;
  }
  out.push({ lo, hi: range.hi });
  return out;
}

/** The sampling step that cuts `rows` rows into about `parts` ranges. */
export function sampleStep(rows: number, parts: number): number {
  return Math.max(1, Math.ceil(rows / Math.max(1, parts)));
}

/** A range for reports: `[lo, hi)`. */
export function describeRange(range: KeyRange): string {
  const end = (v: string[] | null, open: string) => (v === null ? open : v.length === 1 ? v[0]! : `(${v.join(', ')})`);
  return `[${end(range.lo, '-inf')}, ${end(range.hi, '+inf')})`;
}
