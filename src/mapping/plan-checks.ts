/**
 * Checks of a mapped relation (a table with a `mapping:` rule) beyond column matching
 * (columns.ts): a target column nothing fills that is NOT NULL without a default, a lossy
 * cast from a remote column type to its target column type, and what schema drift on the
 * publisher means for the rule (a renamed column, a new one). relmap.ts runs them when it
 * resolves a relation, so they hold at startup (mapping/plan.ts resolves every
 * published table from the publisher's catalog) and at every Relation message alike.
 * Unmapped tables are never checked here: they keep native's behaviour.
 */
import type { TableRule } from './rules.js';
import { MappingError } from '../errors.js';
import type { RelationMessage } from '../protocol/messages.js';
import type { Reshape, TargetColumn } from './columns.js';

/** Built-in type OIDs (pg_type.dat) the lossy-cast table names. */
const T = {
  int2: 21,
  int4: 23,
  int8: 20,
  float4: 700,
  float8: 701,
  numeric: 1700,
  text: 25,
  varchar: 1043,
  bpchar: 1042,
  timestamp: 1114,
  timestamptz: 1184,
  date: 1082,
  time: 1083,
  timetz: 1266,
  json: 114,
  jsonb: 3802,
} as const;

const INTS: number[] = [T.int2, T.int4, T.int8];
const STRINGS: number[] = [T.text, T.varchar, T.bpchar];

/**
 * Remote type → target types that lose values (out of range, digits, time zone, length),
 * by OID. Widening casts, text ↔ its own kinds without a length, and everything not listed
 * are accepted; docs/mapping.md lists this table. An explicit cast in a computed column
 * (named like the remote column) is the way to take a lossy cast on purpose.
 */
const LOSSY: ReadonlyMap<number, readonly number[]> = new Map<number, number[]>([
  [T.int8, [T.int4, T.int2, T.float4, T.float8]],
  [T.int4, [T.int2, T.float4]],
  [T.numeric, [...INTS, T.float4, T.float8]],
  [T.float8, [...INTS, T.float4]],
  [T.float4, INTS],
  [T.timestamptz, [T.timestamp, T.date, T.time, T.timetz]],
  [T.timestamp, [T.date, T.time]],
  [T.timetz, [T.time]],
  [T.jsonb, []],
  [T.json, [T.jsonb]],
]);

const VARHDRSZ = 4;

/** Why a remote value of (oid, typmod) may not survive the target column's (oid, typmod); null when it does. */
export function lossyCast(remoteOid: number, remoteMod: number, targetOid: number, targetMod: number): string | null {
  if (LOSSY.get(remoteOid)?.includes(targetOid)) return 'the target type cannot hold every value of the remote type';
  // Lengths: a bounded target string shorter than the remote's bound (or than an unbounded remote string).
  if (STRINGS.includes(remoteOid) && (targetOid === T.varchar || targetOid === T.bpchar) && targetMod >= 0) {
    const remoteLen = (remoteOid === T.varchar || remoteOid === T.bpchar) && remoteMod >= 0 ? remoteMod - VARHDRSZ : Infinity;
    if (remoteLen > targetMod - VARHDRSZ) return `the target column holds at most ${targetMod - VARHDRSZ} characters${remoteLen === Infinity ? '' : `, the remote ${remoteLen}`}`;
  }
  if (remoteOid === T.numeric && targetOid === T.numeric && targetMod >= 0) {
    const [tp, ts] = numericMod(targetMod);
    if (remoteMod < 0) return `the target column is numeric(${tp},${ts}), the remote numeric is unconstrained`;
    const [rp, rs] = numericMod(remoteMod);
    if (rs > ts || rp - rs > tp - ts) return `the target column is numeric(${tp},${ts}), the remote numeric(${rp},${rs})`;
  }
  if ((remoteOid === T.timestamptz || remoteOid === T.timestamp || remoteOid === T.time || remoteOid === T.timetz) && targetOid === remoteOid && targetMod >= 0) {
    if (remoteMod < 0 || remoteMod > targetMod) return `the target column keeps ${targetMod} fractional digits of seconds, the remote ${remoteMod < 0 ? 6 : remoteMod}`;
  }
  return null;
}

function numericMod(mod: number): [number, number] {
  const m = mod - VARHDRSZ;
  return [(m >> 16) & 0xffff, m & 0xffff];
}

/**
 * The rename pgoutput implies between two Relation messages of one relation, as
 * new name → old name. pgoutput sends no attribute numbers, so a rename is recognised
 * only by position: both messages have the same columns in the same order except at
 * exactly one position, where the name differs and type and modifier are the same. Any
 * other difference (a column added, dropped, retyped, or two renamed at once) is not a
 * rename; neither is a name change that also moves (it cannot, in PostgreSQL). Dropping
 * the last column and adding one of the same type between two changes looks the same as
 * a rename and is taken for one.
 */
export function detectRename(before: RelationMessage, after: RelationMessage): { from: string; to: string } | null {
  if (before.columns.length !== after.columns.length) return null;
  let found: { from: string; to: string } | null = null;
  for (let i = 0; i < after.columns.length; i++) {
    const a = before.columns[i]!;
    const b = after.columns[i]!;
    if (a.typeOid !== b.typeOid || a.typeModifier !== b.typeModifier) return null;
    if (a.name === b.name) continue;
    if (found) return null;
    found = { from: a.name, to: b.name };
  }
  if (found && before.columns.some((c) => c.name === found!.to)) return null;
  return found;
}

/** Per target column, what the mapped checks (plan-checks.ts) need beyond TargetColumn. */
export interface TargetExtra {
  typeMod: number;
  /** NOT NULL, no default, not identity nor generated: something must fill it. */
  required: boolean;
}

/**
 * The checks of a mapped relation beyond matchColumns (plan-checks.ts): every target
 * column that is NOT NULL without a default is filled, and no direct column goes through
 * a lossy cast. A required column left unfilled because the publisher dropped its source
 * column says so.
 */
export function checkMapped(
  remote: RelationMessage,
  rule: TableRule,
  targetColumns: TargetColumn[],
  reshape: Reshape | undefined,
  extra: Map<string, TargetExtra>,
  displayName: string,
  targetName: string,
  before: RelationMessage | undefined,
): void {
  const where = `mapping.tables.${rule.source}`;
  const filled = new Set<string>();
  remote.columns.forEach((c, i) => {
    if (reshape && !reshape.direct[i]) return;
    const col = targetColumns[i]!;
    filled.add(col.name);
    const x = extra.get(col.name);
    const lossy = x ? lossyCast(c.typeOid, c.typeModifier, col.typeOid, x.typeMod) : null;
    if (lossy) {
      throw new MappingError(
        `${where}: column "${c.name}" → "${targetName}"."${col.name}" is a lossy cast: ${lossy} (widen the target column, or write the cast yourself as a computed column named "${col.name}")`,
        { relation: displayName, column: c.name },
      );
    }
  });
  for (const c of reshape?.computed ?? []) filled.add(c.column.name);
  for (const [name, x] of extra) {
    if (!x.required || filled.has(name)) continue;
    const dropped = before?.columns.find((c) => (rule.renames.get(c.name) ?? c.name) === name && !remote.columns.some((r) => r.name === c.name));
    throw new MappingError(
      dropped
        ? `${where}: the publisher dropped column "${dropped.name}", and target column "${targetName}"."${name}" it filled is NOT NULL without a default, so every new row would fail: give it a default (ALTER TABLE … ALTER COLUMN "${name}" SET DEFAULT …), drop NOT NULL, or fill it with a computed expression`
        : `${where}: target column "${targetName}"."${name}" is NOT NULL without a default and nothing fills it (map a remote column to it, compute it, or give it a default)`,
      { relation: displayName, column: name },
    );
  }
}
