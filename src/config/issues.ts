/**
 * Configuration problems in words an operator can act on: which key, the value given,
 * what it may be, and where the key came from (the file or a PGSUB_* variable). zod's
 * issues are turned into one sentence each; an unknown key or variable that is a near
 * miss of a real one gets "did you mean …?" (edit distance), since a typo is the usual
 * reason a key is unknown.
 */
import type { z } from 'zod';

/** A value as the operator wrote it: strings quoted, numbers and booleans bare. */
export function showValue(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v);
  if (v === undefined) return 'nothing';
  try {
    return JSON.stringify(v) ?? String(v);
  } catch {
    return String(v);
  }
}

/**
 * Optimal string alignment distance: insertions, deletions, substitutions and swaps of
 * two neighbouring characters each cost 1 (a swap is the commonest typing slip).
 */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[i - 1]![j]! + 1, d[i]![j - 1]! + 1, d[i - 1]![j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) v = Math.min(v, d[i - 2]![j - 2]! + 1);
      d[i]![j] = v;
    }
  }
  return d[a.length]![b.length]!;
}

/** The candidate `name` is most likely a typo of, if one is close enough; case is ignored. */
export function nearestName(name: string, candidates: readonly string[]): string | null {
  const wanted = name.toLowerCase();
  // Short names allow one slip, longer ones a few; beyond that a suggestion is a guess.
  const limit = wanted.length <= 4 ? 1 : wanted.length <= 10 ? 2 : 3;
  let best: string | null = null;
  let bestDistance = Infinity;
  for (const c of candidates) {
    const dist = editDistance(wanted, c.toLowerCase());
    if (dist < bestDistance) {
      best = c;
      bestDistance = dist;
    }
  }
  return bestDistance <= limit ? best : null;
}

/** `; did you mean X?` or nothing. */
export function didYouMean(name: string, candidates: readonly string[]): string {
  const near = nearestName(name, candidates);
  return near === null ? '' : `; did you mean ${near}?`;
}

export interface IssueContext {
  /** The raw settings handed to the schema (file, then environment, then overrides). */
  raw: Record<string, unknown>;
  /** Where each top-level key came from, e.g. `PGSUB_STREAMING` or the file's path. */
  origins: Record<string, string>;
  /** The keys a mapping at `path` accepts (for "did you mean"). */
  keysAt(path: readonly PropertyKey[]): readonly string[];
}

/**
 * One sentence per issue: `streaming: "maybe" is not one of off, on, parallel (from
 * PGSUB_STREAMING)`, `source is required`, `unknown key copydata (from pgsub.yaml); did you mean copy_data?`.
 * The schema's own error functions word the value problems (config.ts); this adds the key,
 * the origin, and the cases zod words generically.
 */
export function describeIssue(issue: z.core.$ZodIssue, ctx: IssueContext): string {
  const key = issue.path.map(String).join('.');
  const top = issue.path.length > 0 ? String(issue.path[0]) : '';
  const from = ctx.origins[top] ? ` (from ${ctx.origins[top]})` : '';
  if (issue.code === 'unrecognized_keys') {
    const where = key ? ` in ${key}` : '';
    const fromOf = (k: string) => {
      const origin = issue.path.length === 0 ? ctx.origins[k] : ctx.origins[top];
      return origin ? ` (from ${origin})` : '';
    };
    return issue.keys.map((k) => `unknown key ${k}${where}${fromOf(k)}${didYouMean(k, ctx.keysAt(issue.path))}`).join('; ');
  }
  // A required key given nowhere: zod words it as a type error about `undefined`.
  if (issue.path.length === 1 && ctx.raw[top] === undefined && (issue.code === 'invalid_type' || issue.code === 'invalid_union' || issue.code === 'invalid_value')) {
    return `${key} is required (in the config file, or as PGSUB_${key.toUpperCase()})`;
  }
  if (issue.code === 'too_small' && issue.origin === 'string') return `${key}: must not be empty${from}`;
  if (issue.code === 'too_big' && issue.origin === 'string') return `${key}: must be at most ${String(issue.maximum)} characters${from}`;
  if (issue.code === 'too_small' && issue.origin === 'array') return `${key}: must hold at least ${String(issue.minimum)} value${Number(issue.minimum) === 1 ? '' : 's'}${from}`;
  return `${key || '(config)'}: ${issue.message}${from}`;
}

/** A structured key given as a JSON string (from a PGSUB_* variable) is parsed; anything else is left to the schema. */
export function parseJsonString(v: unknown): unknown {
  if (typeof v !== 'string') return v;
  try {
    return JSON.parse(v) as unknown;
  } catch {
    return v;
  }
}
