/**
 * The `mapping:` setting (docs/mapping.md): rules per source schema and per source table
 * that reshape changes on their way into the target. This module validates the shape of
 * the rules and merges a table's rule with its schema's; whether a rule fits the
 * publisher's relation and the target catalog is checked where both are known
 * (apply/sql/mapping.ts). Keys that are designed but not built yet are refused here by
 * name, so no option is ever silently ignored.
 */
import { z } from 'zod';
import { parseJsonString, showValue } from './issues.js';

const name = z.string({ error: (iss) => `${showValue(iss.input)} is not a name` }).min(1);
const expr = z.string({ error: (iss) => `${showValue(iss.input)} is not an SQL expression` }).min(1);

/** Designed in docs/mapping.md, not built yet: refused by rejectUnbuilt with PGSUB_NOT_IMPLEMENTED. */
export const UNBUILT_KEYS = ['key', 'filter', 'soft_delete', 'truncate', 'discriminator'] as const;

/** What a new publisher column does to a mapped table (docs/mapping.md "Schema drift"). */
export const DRIFT_POLICIES = ['stop', 'ignore', 'add'] as const;
export type DriftPolicy = (typeof DRIFT_POLICIES)[number];
const drift = z.enum(DRIFT_POLICIES, { error: (iss) => `${showValue(iss.input)} is not a drift policy (stop, ignore or add)` });

const unbuilt = Object.fromEntries(UNBUILT_KEYS.map((k) => [k, z.unknown().optional()])) as Record<(typeof UNBUILT_KEYS)[number], z.ZodOptional<z.ZodUnknown>>;

const tableRule = z
  .object({
    target: name.regex(/^[^.]+(\.[^.]+)?$/, { message: 'give the target as schema.table or table' }).optional(),
    columns: z.record(z.string(), name.nullable()).optional(),
    exclude: z.array(name).optional(),
    computed: z.record(z.string(), expr).optional(),
    drift: drift.optional(),
    ...unbuilt,
  })
  .strict();

const schemaRule = z
  .object({
    target: name.regex(/^[^.]+$/, { message: 'a schema rule names a target schema' }).optional(),
    drift: drift.optional(),
    ...unbuilt,
  })
  .strict();

export const mappingSchema = z.preprocess(
  parseJsonString,
  z
    .object({
      schemas: z.record(z.string(), schemaRule).default({}),
      tables: z
        .record(z.string(), tableRule)
        .superRefine((tables, ctx) => {
          for (const t of Object.keys(tables)) {
            if (!/^[^.]+\..+$/.test(t)) ctx.addIssue({ code: 'custom', path: [t], message: 'give tables as schema.table, as the publisher names them' });
          }
        })
        .default({}),
    })
    .strict(),
);

export type MappingInput = z.infer<typeof mappingSchema>;

/** The keys each level of `mapping:` accepts, for "did you mean" (config.ts keysAt). */
export function mappingKeysAt(at: readonly PropertyKey[]): readonly string[] {
  if (at.length === 1) return ['schemas', 'tables'];
  if (at.length === 3 && at[1] === 'schemas') return ['target', 'drift', ...UNBUILT_KEYS];
  return ['target', 'columns', 'exclude', 'computed', 'drift', ...UNBUILT_KEYS];
}

/** One source table's rule, merged from its schema's and its own. */
export interface TableRule {
  /** Source schema.table, for messages. */
  source: string;
  targetSchema: string;
  targetTable: string;
  /** Remote column → target column. */
  renames: ReadonlyMap<string, string>;
  /** Remote columns not written. */
  excluded: ReadonlySet<string>;
  /** Target column → SQL expression over the remote row. */
  computed: ReadonlyMap<string, string>;
  /** A new publisher column: the table's policy, else its schema's, else stop. */
  drift: DriftPolicy;
}

export interface MappingConfig {
  readonly schemas: Readonly<Record<string, { target?: string; drift?: DriftPolicy }>>;
  readonly tables: Readonly<Record<string, z.infer<typeof tableRule>>>;
}

export const NO_MAPPING: MappingConfig = Object.freeze({ schemas: Object.freeze({}), tables: Object.freeze({}) });

/** The first key of a rule that is designed but not built, as `mapping.tables.x.key`; null when none. */
export function unbuiltKey(m: MappingInput): string | null {
  for (const [level, rules] of [
    ['schemas', m.schemas],
    ['tables', m.tables],
  ] as const) {
    for (const [n, rule] of Object.entries(rules)) {
      for (const k of UNBUILT_KEYS) if ((rule as Record<string, unknown>)[k] !== undefined) return `mapping.${level}.${n}.${k}`;
    }
  }
  return null;
}

export function isEmptyMapping(m: MappingConfig): boolean {
  return Object.keys(m.schemas).length === 0 && Object.keys(m.tables).length === 0;
}

/**
 * The rule for a source table; null when neither its schema nor the table has one (the
 * table is applied as before, on the unmapped paths).
 */
export function ruleFor(m: MappingConfig, schema: string, table: string): TableRule | null {
  const t = m.tables[`${schema}.${table}`];
  const s = m.schemas[schema];
  if (!t && !s) return null;
  let targetSchema = s?.target ?? schema;
  let targetTable = table;
  if (t?.target) {
    const dot = t.target.indexOf('.');
    if (dot < 0) targetTable = t.target;
    else {
      targetSchema = t.target.slice(0, dot);
      targetTable = t.target.slice(dot + 1);
    }
  }
  const renames = new Map<string, string>();
  const excluded = new Set<string>(t?.exclude ?? []);
  for (const [from, to] of Object.entries(t?.columns ?? {})) {
    if (to === null) excluded.add(from);
    else renames.set(from, to);
  }
  return {
    source: `${schema}.${table}`,
    targetSchema,
    targetTable,
    renames,
    excluded,
    computed: new Map(Object.entries(t?.computed ?? {})),
    drift: t?.drift ?? s?.drift ?? 'stop',
  };
}
