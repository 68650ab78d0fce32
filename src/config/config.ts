/**
 * pgsub's configuration: one validated, frozen object built from a YAML/JSON file,
 * then the environment (PGSUB_*), then command-line overrides, in that order of
 * precedence. Subscription options keep the names users know from CREATE SUBSCRIPTION;
 * an option whose value this version cannot honour is a startup error naming the key —
 * never silently ignored or downgraded.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import YAML from 'yaml';
import { z } from 'zod';
import { ConfigError, NotImplementedError } from '../errors.js';
import { describeIssue, didYouMean, parseJsonString, showValue } from './issues.js';
import { parseConninfo, type ConnInfo } from './conninfo.js';
import { mappingKeysAt, mappingSchema, NO_MAPPING, unbuiltKey, type MappingConfig } from '../mapping/rules.js';
import { ALLOWED, CONFLICT_TYPES, NATIVE_DEFAULTS, POLICIES, type ConflictConfig, type ConflictType, type PolicySet } from '../conflict/types.js';

// Each schema words its own value problem (with the value given); issues.ts adds the key
// and where it came from.
const BOOL_WORDS = ['true', 'false', 'on', 'off', '1', '0', 'yes', 'no'] as const;
const boolish = z.union([z.boolean(), z.enum(BOOL_WORDS).transform((v) => ['true', 'on', '1', 'yes'].includes(v))], {
  error: (iss) => `${showValue(iss.input)} is not a boolean (true/false, on/off, yes/no, 1/0)`,
});
/** An enum setting that PostgreSQL also accepts as a boolean (`streaming: false` in JSON or YAML); `shown`: the values to list. */
const boolEnum = <const T extends readonly [string, ...string[]]>(values: T, shown: readonly string[] = values) =>
  z.union([z.boolean().transform((b) => (b ? 'on' : 'off')), z.enum(values)], { error: (iss) => `${showValue(iss.input)} is not one of ${shown.join(', ')}` });
const oneOf = <const T extends readonly [string, ...string[]]>(values: T) => z.enum(values, { error: (iss) => `${showValue(iss.input)} is not one of ${values.join(', ')}` });
const text = () => z.string({ error: (iss) => `${showValue(iss.input)} is not a string` });
/** A number, or a string holding one (environment variables); an empty string is not 0. */
const numeric = z.union(
  [
    z.number(),
    z
      .string()
      .trim()
      .regex(/^[-+]?(\d+(\.\d*)?|\.\d+)(e[-+]?\d+)?$/i)
      .transform(Number),
  ],
  {
    error: (iss) => `${showValue(iss.input)} is not a number`,
  },
);
const atLeast = (min: number) => ({ error: (iss: { input?: unknown }) => `must be at least ${min}, got ${showValue(iss.input)}` });
const atMost = (max: number) => ({ error: (iss: { input?: unknown }) => `must be at most ${max}, got ${showValue(iss.input)}` });
const int = (min: number, max: number) =>
  numeric.pipe(
    z
      .number()
      .int({ error: (iss) => `must be a whole number, got ${showValue(iss.input)}` })
      .min(min, atLeast(min))
      .max(max, atMost(max)),
  );
const range = (min: number, max: number) => numeric.pipe(z.number().min(min, atLeast(min)).max(max, atMost(max)));
const seconds = numeric.pipe(z.number().positive({ error: (iss) => `must be more than 0 (seconds), got ${showValue(iss.input)}` }));
const identifier = text().min(1).max(63);

/** Policies by conflict type; unknown types and policies a type cannot take are refused. */
const policySet = z
  .object(Object.fromEntries(CONFLICT_TYPES.map((t) => [t, oneOf(POLICIES).optional()])) as Record<ConflictType, z.ZodOptional<z.ZodEnum<{ [K in (typeof POLICIES)[number]]: K }>>>)
  .strict()
  .superRefine((set, ctx) => {
    for (const [type, policy] of Object.entries(set)) {
      if (policy !== undefined && !ALLOWED[type as ConflictType].includes(policy)) {
        ctx.addIssue({ code: 'custom', path: [type], message: `${type} cannot take policy ${policy} (allowed: ${ALLOWED[type as ConflictType].join(', ')})` });
      }
    }
  });
/** `conflicts:` — a JSON string when it comes from PGSUB_CONFLICTS. */
const conflictsSchema = z.preprocess(
  parseJsonString,
  z
    .object({
      detect: boolish.default(true),
      default: policySet.default({}),
      tables: z
        .record(z.string(), policySet)
        .superRefine((tables, ctx) => {
          for (const name of Object.keys(tables)) {
            if (!/^[^.]+\..+$/.test(name)) ctx.addIssue({ code: 'custom', path: [name], message: 'give tables as schema.table, as the publisher names them' });
          }
        })
        .default({}),
    })
    .strict(),
);

/** Keys accepted in the file, each also settable as PGSUB_<KEY uppercased>. */
const fileSchema = z
  .object({
    subscription: identifier.default('pgsub'),
    source: text().min(1),
    target: text().min(1),
    publication: z.union([text().min(1), z.array(text().min(1)).min(1)], { error: (iss) => `${showValue(iss.input)} is not a publication name or a list of them` }),
    slot_name: identifier.optional(),
    // CREATE SUBSCRIPTION options.
    copy_data: boolish.default(true),
    truncate_before_copy: boolish.default(false),
    defer_indexes: boolish.default(true),
    copy_freeze: boolish.default(true),
    max_sync_workers: int(1, 64).default(4),
    sync_range_min_mb: range(0, 1_000_000).default(256),
    // 0: tables published later are added only by `pgsub refresh`.
    refresh_interval: numeric.pipe(z.number().min(0, { error: (iss) => `must be 0 (refresh only by command) or more (seconds), got ${showValue(iss.input)}` })).default(60),
    create_slot: boolish.default(true),
    enabled: boolish.default(true),
    connect: boolish.default(true),
    binary: boolish.default(false),
    streaming: boolEnum(['off', 'on', 'parallel', 'false', 'true'], ['off', 'on', 'parallel']).default('off'),
    synchronous_commit: boolEnum(['on', 'off', 'local', 'remote_write', 'remote_apply']).default('on'),
    two_phase: boolish.default(false),
    disable_on_error: boolish.default(false),
    conflicts: conflictsSchema.optional(),
    // Reshaping into a differently shaped target (mapping/rules.ts, docs/mapping.md).
    mapping: mappingSchema.optional(),
    origin: oneOf(['any', 'none']).default('any'),
    messages: boolish.default(false),
    password_required: boolish.default(true),
    // pgsub applies as its own target role: native's run_as_owner = true, its default here.
    run_as_owner: boolish.default(true),
    failover: boolish.default(false),
    // pgsub's own settings.
    status_interval: seconds.default(10),
    receive_timeout: seconds.default(60),
    target_timeout: seconds.default(60),
    retry_min_delay: seconds.default(1),
    retry_max_delay: seconds.default(60),
    max_in_flight: int(1, 1_000_000).default(4000),
    // 2,000, not 10,000: while the target is the slower side the queue stays full, and every
    // message waiting in it outlived the young generation (docs/benchmarks.md, "A shorter queue").
    queue_size: int(1, 10_000_000).default(2_000),
    group_transactions: int(1, 100_000).default(256),
    apply_workers: int(1, 32).default(1),
    batch_rows: int(1, 4096).default(128),
    copy_inserts: boolish.default(true),
    state_dir: text().min(1).optional(),
    // Service: metrics endpoint (off unless set), readiness, the slot and WAL guard.
    metrics_listen: text()
      .regex(/^(\[[^\]]+\]|[^:\s]*):\d{1,5}$/, { message: 'give host:port, e.g. 127.0.0.1:9187' })
      .optional(),
    ready_max_lag_mb: range(0, 1_000_000).default(16),
    max_retained_wal_mb: range(0, 100_000_000).default(0),
    slot_check_interval: seconds.default(10),
    // Migration: sequences copied to the target (migrate/sequences.ts), and the pg_dump of schema copy.
    sequences: oneOf(['sync', 'off']).default('sync'),
    sequence_interval: seconds.default(30),
    sequence_margin: int(0, 1_000_000_000).default(1000),
    sequence_names: z.union([text(), z.array(text())], { error: (iss) => `${showValue(iss.input)} is not a sequence name or a list of them` }).default([]),
    pg_dump: text().min(1).optional(),
    log_level: oneOf(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  })
  .strict();

type FileConfig = z.infer<typeof fileSchema>;

export interface Config {
  subscription: string;
  source: ConnInfo;
  target: ConnInfo;
  publications: string[];
  slotName: string;
  copyData: boolean;
  /** Empty a non-empty target table before its initial copy instead of refusing. */
  truncateBeforeCopy: boolean;
  /** Drop an empty table's indexes for its copy and build them after it (tablesync/deferred-indexes.ts). */
  deferIndexes: boolean;
  /** A table copied whole into an empty target table is truncated and loaded with COPY … FREEZE in one transaction (tablesync/job.ts). */
  copyFreeze: boolean;
  /** Parallel COPY streams for the table sync (tables and ranges of large tables). */
  maxSyncWorkers: number;
  /** A table is split into page ranges only if each range gets at least this many MB of heap. */
  syncRangeMinMb: number;
  refreshIntervalMs: number;
  createSlot: boolean;
  binary: boolean;
  streaming: 'off' | 'on' | 'parallel';
  synchronousCommit: 'on' | 'local' | 'remote_write' | 'remote_apply' | 'off';
  twoPhase: boolean;
  /** Stop retrying after an apply error and mark the subscription disabled until `pgsub enable`. */
  disableOnError: boolean;
  /** Conflict detection and the policies per type and table (conflict/types.ts). */
  conflicts: ConflictConfig;
  /** Table and column mapping rules (mapping/rules.ts); empty: every table as the publisher names it. */
  mapping: MappingConfig;
  origin: 'any' | 'none';
  /** Ask for logical decoding messages (pg_logical_emit_message); logged, not applied. */
  messages: boolean;
  statusIntervalMs: number;
  receiveTimeoutMs: number;
  /** A target connection silent this long with operations outstanding (and not busy running them) is dropped (pgwire/wire-watchdog.ts). */
  targetTimeoutMs: number;
  retryMinDelayMs: number;
  retryMaxDelayMs: number;
  maxInFlight: number;
  queueSize: number;
  /** Most source transactions applied in one target transaction while behind (1: one each). */
  groupTransactions: number;
  /** Target connections applying independent transactions in parallel while behind (1: the apply connection only; apply/run/lanes.ts). */
  applyWorkers: number;
  /** Most rows per multi-row INSERT for a run of inserts into one table (1: one statement per row). */
  batchRows: number;
  /** Batched INSERTs go out as COPY … FROM STDIN where the values allow it (apply/copy-rows.ts). */
  copyInserts: boolean;
  logLevel: FileConfig['log_level'];
  /** Local state (resolveStateDir): state_dir, $STATE_DIRECTORY, or a per-user directory. */
  stateDir: string;
  /** Where streamed transactions are spooled: <state_dir>/spool. */
  spoolDir: string;
  /** host:port of the metrics and health endpoints (service/metrics.ts); null: off. */
  metricsListen: string | null;
  /** /readyz answers ready while streaming with lag at or below this. */
  readyMaxLagBytes: number;
  /** Retained WAL on the publisher above this is warned about (service/slot-guard.ts); 0: never. */
  maxRetainedWalBytes: number;
  slotCheckIntervalMs: number;
  /** `sync`: the published tables' sequences are copied to the target while streaming and at cutover (migrate/sequences.ts). */
  sequences: 'sync' | 'off';
  sequenceIntervalMs: number;
  /** Increments the target's sequences are set ahead of the source's. */
  sequenceMargin: number;
  /** Sequences synced besides the tables' own (schema.name). */
  sequenceNames: readonly { schema: string; name: string }[];
  /** The pg_dump of `pgsub schema` (migrate/pgdump.ts); null: the first on PATH. */
  pgDump: string | null;
}

export const CONFIG_KEYS = Object.keys(fileSchema.shape) as (keyof FileConfig)[];

/** Environment names: PGSUB_<KEY>, plus the short aliases documented in README. */
const ENV_ALIASES: Record<string, keyof FileConfig> = {
  PGSUB_SLOT: 'slot_name',
  PGSUB_PUBLICATIONS: 'publication',
  PGSUB_PUBLICATION_NAMES: 'publication',
};

/**
 * PGSUB_ variables that are not settings: the fault-test crash point (service/faults.ts)
 * and the intervals of the progress line and of systemd's STATUS=, which tests shorten
 * (service/progress-log.ts, service/supervise.ts).
 */
const NOT_SETTINGS = new Set(['PGSUB_FAULT', 'PGSUB_PROGRESS_INTERVAL_MS', 'PGSUB_NOTIFY_INTERVAL_MS']);
const ENV_NAMES = [...CONFIG_KEYS.map((k) => `PGSUB_${k.toUpperCase()}`), ...Object.keys(ENV_ALIASES)];

export interface LoadOptions {
  file?: string;
  env?: NodeJS.ProcessEnv;
  overrides?: Partial<Record<keyof FileConfig, unknown>>;
}

export function loadConfig(opts: LoadOptions = {}): Config {
  const env = opts.env ?? process.env;
  const raw: Record<string, unknown> = {};
  // Where each key came from, so a bad value points at the file or the variable to fix.
  const origins: Record<string, string> = {};
  if (opts.file) {
    for (const [key, value] of Object.entries(readConfigFile(opts.file))) {
      raw[key] = value;
      origins[key] = opts.file;
    }
  }
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith('PGSUB_') || value === undefined || NOT_SETTINGS.has(name)) continue;
    const key = ENV_ALIASES[name] ?? (name.slice('PGSUB_'.length).toLowerCase() as keyof FileConfig);
    if (!(CONFIG_KEYS as string[]).includes(key)) {
      const hint = didYouMean(name, ENV_NAMES) || ` (known: ${CONFIG_KEYS.join(', ')})`;
      throw new ConfigError(`environment variable ${name} is not a pgsub setting${hint}`, { key: name });
    }
    raw[key] =
      key === 'publication'
        ? value
            .split(',')
            .map((s) => s.trim())
            .filter(Boolean)
        : value;
    origins[key] = name;
  }
  for (const [key, value] of Object.entries(opts.overrides ?? {})) {
    if (value === undefined) continue;
    raw[key] = value;
    delete origins[key];
  }
  return validate(raw, origins, env);
}

/** The keys a mapping at `path` of the settings accepts, for "did you mean". */
function keysAt(at: readonly PropertyKey[]): readonly string[] {
  if (at.length === 0) return CONFIG_KEYS;
  if (at.length === 1 && at[0] === 'conflicts') return ['detect', 'default', 'tables'];
  if (at[0] === 'mapping') return mappingKeysAt(at);
  return CONFLICT_TYPES;
}

/**
 * Local state: `state_dir` when set; else systemd's `$STATE_DIRECTORY` (StateDirectory=;
 * the first, if it lists several); else a per-user directory for this subscription, as the
 * XDG base directory spec puts state: `$XDG_STATE_HOME/pgsub/<subscription>` (an absolute
 * XDG_STATE_HOME only, per the spec), or `~/.local/state/pgsub/<subscription>`. Never the
 * working directory: where a service is started from says nothing about where its state
 * belongs.
 */
export function resolveStateDir(subscription: string, stateDir: string | undefined, env: NodeJS.ProcessEnv): string {
  if (stateDir) return path.resolve(stateDir);
  const systemd = env.STATE_DIRECTORY?.split(':').find(Boolean);
  if (systemd) return systemd;
  const xdg = env.XDG_STATE_HOME;
  const base = xdg && path.isAbsolute(xdg) ? xdg : path.join(env.HOME || os.homedir(), '.local', 'state');
  return path.join(base, 'pgsub', subscription);
}

function readConfigFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read config file ${file}: ${(err as Error).message}`, { file });
  }
  let parsed: unknown;
  try {
    parsed = path.extname(file) === '.json' ? JSON.parse(text) : YAML.parse(text);
  } catch (err) {
    throw new ConfigError(`config file ${file} is not valid ${path.extname(file) === '.json' ? 'JSON' : 'YAML'}: ${(err as Error).message}`, { file });
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new ConfigError(`config file ${file} must hold a mapping of settings`, { file });
  }
  return parsed as Record<string, unknown>;
}

function validate(raw: Record<string, unknown>, origins: Record<string, string>, env: NodeJS.ProcessEnv): Config {
  const result = fileSchema.safeParse(raw);
  if (!result.success) {
    const problems = result.error.issues.map((i) => describeIssue(i, { raw, origins, keysAt }));
    const first = result.error.issues[0];
    const key = first?.code === 'unrecognized_keys' ? first.keys[0] : first?.path.map(String).join('.');
    throw new ConfigError(`invalid configuration: ${problems.join('; ')}`, { problems, ...(key ? { key } : {}) });
  }
  const c = result.data;
  const streaming = c.streaming === 'true' ? 'on' : c.streaming === 'false' ? 'off' : c.streaming;
  const stateDir = resolveStateDir(c.subscription, c.state_dir, env);
  const config: Config = {
    subscription: c.subscription,
    source: parseConninfo(c.source, 'source', env),
    target: parseConninfo(c.target, 'target', env),
    publications: Array.isArray(c.publication)
      ? c.publication
      : c.publication
          .split(',')
          .map((s) => s.trim())
          .filter(Boolean),
    slotName: c.slot_name ?? c.subscription,
    copyData: c.copy_data,
    truncateBeforeCopy: c.truncate_before_copy,
    deferIndexes: c.defer_indexes,
    copyFreeze: c.copy_freeze,
    maxSyncWorkers: c.max_sync_workers,
    syncRangeMinMb: c.sync_range_min_mb,
    refreshIntervalMs: c.refresh_interval * 1000,
    createSlot: c.create_slot,
    binary: c.binary,
    streaming,
    synchronousCommit: c.synchronous_commit,
    twoPhase: c.two_phase,
    disableOnError: c.disable_on_error,
    conflicts: conflictConfig(c.conflicts),
    mapping: c.mapping ? Object.freeze({ schemas: Object.freeze(c.mapping.schemas), tables: Object.freeze(c.mapping.tables) }) : NO_MAPPING,
    origin: c.origin,
    messages: c.messages,
    statusIntervalMs: c.status_interval * 1000,
    receiveTimeoutMs: c.receive_timeout * 1000,
    targetTimeoutMs: c.target_timeout * 1000,
    metricsListen: c.metrics_listen ?? null,
    readyMaxLagBytes: Math.round(c.ready_max_lag_mb * 1024 * 1024),
    maxRetainedWalBytes: Math.round(c.max_retained_wal_mb * 1024 * 1024),
    slotCheckIntervalMs: c.slot_check_interval * 1000,
    sequences: c.sequences,
    sequenceIntervalMs: c.sequence_interval * 1000,
    sequenceMargin: c.sequence_margin,
    sequenceNames: Object.freeze(sequenceNames(c.sequence_names)),
    pgDump: c.pg_dump ?? null,
    retryMinDelayMs: c.retry_min_delay * 1000,
    retryMaxDelayMs: c.retry_max_delay * 1000,
    maxInFlight: c.max_in_flight,
    queueSize: c.queue_size,
    groupTransactions: c.group_transactions,
    applyWorkers: c.apply_workers,
    batchRows: c.batch_rows,
    copyInserts: c.copy_inserts,
    logLevel: c.log_level,
    stateDir,
    spoolDir: path.join(stateDir, 'spool'),
  };
  if (!/^[a-z0-9_]+$/.test(config.slotName)) {
    // The walsender only accepts these characters in slot names.
    throw new ConfigError(`slot_name ${JSON.stringify(config.slotName)} may contain only lower-case letters, digits and underscores`, { key: 'slot_name' });
  }
  rejectUnimplemented(c);
  Object.freeze(config.source);
  Object.freeze(config.target);
  Object.freeze(config.publications);
  return Object.freeze(config);
}

/** `schema.name` entries (a comma-separated string from PGSUB_SEQUENCE_NAMES); a name without a schema is refused. */
function sequenceNames(value: string | string[]): { schema: string; name: string }[] {
  const names = (Array.isArray(value) ? value : value.split(',')).map((s) => s.trim()).filter(Boolean);
  return names.map((n) => {
    const dot = n.indexOf('.');
    if (dot <= 0 || dot === n.length - 1)
      throw new ConfigError(`invalid configuration: sequence_names: give sequences as schema.name, not ${JSON.stringify(n)}`, { key: 'sequence_names' });
    return { schema: n.slice(0, dot), name: n.slice(dot + 1) };
  });
}

function conflictConfig(c: FileConfig['conflicts']): ConflictConfig {
  const tables: Record<string, PolicySet> = {};
  for (const [name, set] of Object.entries(c?.tables ?? {})) tables[name] = Object.freeze({ ...set });
  return Object.freeze({
    detect: c?.detect ?? true,
    defaults: Object.freeze({ ...NATIVE_DEFAULTS, ...(c?.default ?? {}) }),
    tables: Object.freeze(tables),
  });
}

/** Options users know from CREATE SUBSCRIPTION whose non-default values are not built yet. */
function rejectUnimplemented(c: FileConfig): void {
  const refuse = (key: string, value: unknown, hint: string) => {
    throw new NotImplementedError(`${key} = ${String(value)} is not implemented yet: ${hint}`, { key });
  };
  if (!c.enabled) refuse('enabled', false, 'remove the setting to run the subscription');
  if (!c.connect) refuse('connect', false, 'pgsub always connects to the publisher');
  if (!c.password_required) refuse('password_required', false, "pgsub connects as a client; authentication is the server's choice");
  if (!c.run_as_owner)
    refuse(
      'run_as_owner',
      false,
      "pgsub applies every table's changes as the target user of its conninfo (native's run_as_owner = true), not as each table's owner; remove the setting or set it to true",
    );
  if (c.failover) refuse('failover', true, 'failover slots are not built yet');
  const unbuilt = c.mapping ? unbuiltKey(c.mapping) : null;
  if (unbuilt) throw new NotImplementedError(`${unbuilt} is not implemented yet (docs/mapping.md lists what is)`, { key: unbuilt });
}
