/**
 * The `mapping:` setting (docs/mapping.md): rules per source schema and per source table
 * that reshape changes on their way into the target. This module validates the shape of
 * the rules and merges a table's rule with its schema's; whether a rule fits the
 * publisher's relation and the target catalog is checked where both are known
 * (mapping/columns.ts). Keys that are designed but not built yet are refused here by
 * name, so no option is ever silently ignored.
 */
import { z } from 'zod';
import { parseJsonString, showValue } from '../config/issues.js';

const name = z.string({ error: (iss) => `${showValue(iss.input)} is not a name` }).min(1);
const expr = z.string({ error: (iss) => `${showValue(iss.input)} is not an SQL expression` }).min(1);

/** Designed in docs/mapping.md, not built yet: refused by rejectUnbuilt with PGSUB_NOT_IMPLEMENTED. */
/** Designed in docs/mapping.md, not built yet: refused by rejectUnbuilt with PGSUB_NOT_IMPLEMENTED (none today). */
export const UNBUILT_KEYS = [] as const;

/** What a new publisher column does to a mapped table (docs/mapping.md "Schema drift"). */
export const DRIFT_POLICIES = ['stop', 'ignore', 'add'] as const;
export type DriftPolicy = (typeof DRIFT_POLICIES)[number];
const drift = z.enum(DRIFT_POLICIES, { error: (iss) => `${showValue(iss.input)} is not a drift policy (stop, ignore or add)` });

const unbuilt = Object.fromEntries(UNBUILT_KEYS.map((k) => [k, z.unknown().optional()])) as Record<(typeof UNBUILT_KEYS)[number], z.ZodOptional<z.ZodUnknown>>;

/**
 * Row semantics (docs/mapping.md "Rows"): accepted on a table rule and on a schema rule
 * (every table of the schema), a table's own value winning. Checked against the relation
 * and the target in mapping/rows.ts.
 */
const rowKeys = {
  key: z.array(name).min(1).optional(),
  filter: expr.optional(),
  soft_delete: z
    .union([
      name,
      z
        .object({ flag: name.optional(), at: name.optional(), lsn: name.optional() })
        .strict()
        .refine((v) => v.flag !== undefined || v.at !== undefined || v.lsn !== undefined, { message: 'soft_delete names at least one of flag, at, lsn' }),
    ])
    .optional(),
  truncate: z.enum(['truncate', 'soft_delete', 'ignore']).optional(),
  discriminator: z.union([name, z.object({ column: name, value: z.string().optional() }).strict()]).optional(),
};
const ROW_KEYS = Object.keys(rowKeys);

const tableRule = z
  .object({
    target: name.regex(/^[^.]+(\.[^.]+)?$/, { message: 'give the target as schema.table or table' }).optional(),
    columns: z.record(z.string(), name.nullable()).optional(),
    exclude: z.array(name).optional(),
    computed: z.record(z.string(), expr).optional(),
    ...rowKeys,
    drift: drift.optional(),
    ...unbuilt,
  })
  .strict();

const schemaRule = z
  .object({
    target: name.regex(/^[^.]+$/, { message: 'a schema rule names a target schema' }).optional(),
    ...rowKeys,
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
  if (at.length === 3 && at[1] === 'schemas') return ['target', 'drift', ...ROW_KEYS, ...UNBUILT_KEYS];
  return ['target', 'columns', 'exclude', 'computed', 'drift', ...ROW_KEYS, ...UNBUILT_KEYS];
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
  /** Row semantics (mapping/rows.ts); absent keys: native behaviour. */
  rows: RowRule;
  /** A new publisher column: the table's policy, else its schema's, else stop. */
  drift: DriftPolicy;
}

/** The row-semantics keys of a rule, merged (a table's own over its schema's). */
export interface RowRule {
  /** Target columns that locate a row for UPDATE/DELETE; absent: the replica identity. */
  key?: readonly string[];
  /** Predicate over the remote row, PostgreSQL 15 publication semantics. */
  filter?: string;
  /** DELETE as an UPDATE of these target columns. */
  softDelete?: { flag?: string; at?: string; lsn?: string };
  truncate: 'truncate' | 'soft_delete' | 'ignore';
  /** Many-to-one: the target column naming the source; value defaults to `schema.table`. */
  discriminator?: { column: string; value: string };
}

type RowInput = z.infer<typeof schemaRule>;

export interface MappingConfig {
  readonly schemas: Readonly<Record<string, RowInput>>;
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
  const rows = rowRule(t ?? {}, s ?? {}, `${schema}.${table}`);
  return {
    source: `${schema}.${table}`,
    targetSchema,
    targetTable,
    renames,
    excluded,
    computed: new Map(Object.entries(t?.computed ?? {})),
    rows,
    drift: t?.drift ?? s?.drift ?? 'stop',
  };
}

function rowRule(t: RowInput, s: RowInput, source: string): RowRule {
  const out: RowRule = { truncate: t.truncate ?? s.truncate ?? 'truncate' };
  const key = t.key ?? s.key;
  if (key) out.key = key;
  const filter = t.filter ?? s.filter;
  if (filter) out.filter = filter;
  const soft = t.soft_delete ?? s.soft_delete;
  if (soft) out.softDelete = typeof soft === 'string' ? { flag: soft } : soft;
  const d = t.discriminator ?? s.discriminator;
  if (d) out.discriminator = typeof d === 'string' ? { column: d, value: source } : { column: d.column, value: d.value ?? source };
  return out;
}

/** Whether a rule asks for any row semantics (then its statements are built per change). */
export function hasRowRules(r: RowRule): boolean {
  return r.key !== undefined || r.filter !== undefined || r.softDelete !== undefined || r.truncate !== 'truncate' || r.discriminator !== undefined;
}
