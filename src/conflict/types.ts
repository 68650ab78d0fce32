/**
 * Conflict vocabulary and policies. The conflict names are PostgreSQL 18's (conflict.c
 * ConflictTypeNames, and the confl_* columns of pg_stat_subscription_stats), so an
 * operator who knows native logical replication reads pgsub's log and counters the same
 * way. A policy says what to do when one is detected; the subscription has one per
 * conflict type (native defaults unless configured) and a table may override any of
 * them. Which policy makes sense depends on the type, so the allowed set is per type:
 * apply_remote on delete_missing has nothing to apply and is refused at config load.
 * Detection and resolution live in detect.ts (the pipelined fast path) and resolve.ts
 * (the one-change-at-a-time careful path); the log and counters in report.ts.
 */
export const CONFLICT_TYPES = [
  'insert_exists',
  'update_origin_differs',
  'update_exists',
  'update_missing',
  'delete_origin_differs',
  'delete_missing',
  'multiple_unique_conflicts',
] as const;
export type ConflictType = (typeof CONFLICT_TYPES)[number];

export function isConflictType(s: string): s is ConflictType {
  return (CONFLICT_TYPES as readonly string[]).includes(s);
}

export const POLICIES = ['error', 'skip', 'apply_remote', 'keep_local'] as const;
export type Policy = (typeof POLICIES)[number];

/**
 * Native's behaviour: *_exists and multiple_unique_conflicts raise an error, the missing
 * row cases skip the change (logged), *_origin_differs apply the remote change (logged).
 */
export const NATIVE_DEFAULTS: Readonly<Record<ConflictType, Policy>> = Object.freeze({
  insert_exists: 'error',
  update_origin_differs: 'apply_remote',
  update_exists: 'error',
  update_missing: 'skip',
  delete_origin_differs: 'apply_remote',
  delete_missing: 'skip',
  multiple_unique_conflicts: 'error',
});

/** Policies each type accepts; apply_remote needs something to apply. */
export const ALLOWED: Readonly<Record<ConflictType, readonly Policy[]>> = Object.freeze({
  insert_exists: POLICIES,
  update_origin_differs: POLICIES,
  update_exists: POLICIES,
  update_missing: POLICIES,
  delete_origin_differs: POLICIES,
  delete_missing: ['error', 'skip', 'keep_local'],
  multiple_unique_conflicts: POLICIES,
});

/** The pg_stat_subscription_stats column counting a type. */
export function counterColumn(type: ConflictType): string {
  return `confl_${type}`;
}

export type PolicySet = Partial<Record<ConflictType, Policy>>;

export interface ConflictConfig {
  /** false: plain statements, no conflict log (the pre-detection behaviour, for comparison). */
  detect: boolean;
  /** The subscription's policies, native defaults filled in. */
  defaults: Readonly<Record<ConflictType, Policy>>;
  /** Overrides by "schema.table" as the publisher names it. */
  tables: Readonly<Record<string, PolicySet>>;
}

export const DEFAULT_CONFLICT_CONFIG: ConflictConfig = Object.freeze({ detect: true, defaults: NATIVE_DEFAULTS, tables: Object.freeze({}) });

export function policyFor(config: ConflictConfig, table: string, type: ConflictType): Policy {
  return config.tables[table]?.[type] ?? config.defaults[type];
}
