/**
 * Preflight of the target against what the source publishes: each published table present
 * with columns pgsub can fill (name and type; missing, extra, different), the types,
 * collations and extensions they need, the database's encoding and locale, the privileges
 * pgsub's apply needs (the startup check of service/preflight.ts, plus pgsub's schema,
 * session_replication_role, the replication origin functions, table ownership for
 * defer_indexes, UPDATE on the sequences it sets), max_prepared_transactions for
 * two_phase, tables whose row-level security applies to pgsub's role, tables that are not empty (but for those this subscription has copied
 * already, readSubscribed), and free disk for the copy where it can be seen. Read-only.
 */
import fs from 'node:fs';
import type { Config } from '../config/config.js';
import { PrivilegeError } from '../errors.js';
import { formatBytes } from '../tablesync/copy-report.js';
import { isTrue, relationsParam, type Db, type Row } from './db.js';
import { type Findings, ident, qualified } from './findings.js';
import { existing, readColumns, readExtensions, relName, seqName } from './objects.js';
import { readLocale, type SourceFacts } from './preflight-source.js';
import { ROW_SECURITY_SQL, rowSecurityFix, rowSecurityReason, tablesParam, type RowSecurityRow } from '../apply/sql/row-security.js';

export interface TargetCheck {
  /** What could not be checked, and why. */
  notChecked: string[];
  /** Free bytes where the target keeps its data, when it could be seen. */
  freeBytes: number | null;
}

/** The apply's own startup check of the target role's table privileges (service/preflight.ts, given by the CLI: migrate sits below service). */
export type TablePrivilegeCheck = (config: Config, tables: readonly { schema: string; table: string }[]) => Promise<void>;

/**
 * The tables this subscription already has in pgsub.subscription_rel on the target, with
 * their sync state: a running (or stopped) subscription. Empty when pgsub's schema is not
 * there yet or cannot be read.
 */
export async function readSubscribed(db: Db, config: Config): Promise<Map<string, string>> {
  try {
    const [present] = await db.query<Row>(`SELECT (pg_catalog.to_regclass('"pgsub"."subscription_rel"') IS NOT NULL)::text AS ok`);
    if (!isTrue(present?.ok)) return new Map();
    const rows = await db.query<Row>(`SELECT schema_name || '.' || table_name AS rel, state::text AS state FROM "pgsub"."subscription_rel" WHERE subscription = $1`, [
      config.subscription,
    ]);
    return new Map(rows.map((r) => [r.rel!, r.state!]));
  } catch {
    return new Map();
  }
}

/** States in which the table holds this subscription's own copy (done, or under way: a retry empties it first). */
export const COPIED_STATES = new Set(['d', 'f', 's', 'r']);

export async function checkTarget(
  db: Db,
  config: Config,
  src: SourceFacts,
  neededBytes: number,
  checkTablePrivileges: TablePrivilegeCheck,
  f: Findings,
  subscribed: ReadonlyMap<string, string> = new Map(),
): Promise<TargetCheck> {
  const notChecked: string[] = [];
  const [role] = await db.query<Row>(`SELECT current_user::text AS name, r.rolsuper::text AS super FROM pg_catalog.pg_roles r WHERE r.rolname = current_user`);
  const superuser = isTrue(role!.super);
  const roleName = role!.name!;
  const present = await readColumns(db, src.rels);
  const existingRels = src.rels.filter((r) => present.has(relName(r)));
  for (const r of src.rels) {
    const name = relName(r);
    const targetCols = present.get(name);
    if (!targetCols) {
      f.blocker('TARGET_TABLE_MISSING', 'target', name, `${name} does not exist on the target`, 'pgsub schema copy  (creates the published tables from pg_dump --schema-only)');
      continue;
    }
    const published = src.tables.find((t) => t.schema === r.schema && t.table === r.table)?.columns;
    const sourceCols = (src.columns.get(name) ?? []).filter((c) => (published ? published.includes(c.name) : c.generated === ''));
    const obj = qualified(r.schema, r.table);
    for (const c of sourceCols) {
      const t = targetCols.find((x) => x.name === c.name);
      if (!t)
        f.blocker(
          'TARGET_COLUMN_MISSING',
          'target',
          `${name}.${c.name}`,
          `column ${c.name} (${c.type}) of ${name} is missing on the target: changes to the table fail to apply`,
          `ALTER TABLE ${obj} ADD COLUMN ${ident(c.name)} ${c.type};`,
        );
      else if (t.type !== c.type)
        f.warning(
          'TARGET_COLUMN_TYPE',
          'target',
          `${name}.${c.name}`,
          `column ${c.name} of ${name} is ${c.type} on the source and ${t.type} on the target: values are converted by their text form (binary mode: cast), and one the target type cannot take fails to apply`,
          `ALTER TABLE ${obj} ALTER COLUMN ${ident(c.name)} TYPE ${c.type};`,
        );
    }
    for (const t of targetCols) {
      if (sourceCols.some((c) => c.name === t.name) || t.generated !== '') continue;
      const filled = t.default !== null || t.identity !== '';
      if (t.notNull && !filled)
        f.blocker(
          'TARGET_COLUMN_EXTRA',
          'target',
          `${name}.${t.name}`,
          `column ${t.name} of ${name} exists only on the target, is NOT NULL and has no default: every row the source sends fails to insert`,
          `ALTER TABLE ${obj} ALTER COLUMN ${ident(t.name)} DROP NOT NULL;  -- or SET DEFAULT …`,
        );
      else
        f.info(
          'TARGET_COLUMN_EXTRA',
          'target',
          `${name}.${t.name}`,
          `column ${t.name} of ${name} exists only on the target: rows from the source get ${filled ? 'its default' : 'NULL'}`,
        );
    }
  }
  await checkDependencies(db, src, f);
  await checkLocale(db, src, f);
  await checkPrivileges(db, config, src, existingRels, roleName, superuser, checkTablePrivileges, f);
  await checkRowSecurity(db, existingRels, f);
  await checkSettings(db, config, f);
  await checkEmpty(
    db,
    config,
    existingRels.filter((r) => !COPIED_STATES.has(subscribed.get(relName(r)) ?? '')),
    f,
    notChecked,
  );
  const freeBytes = await checkDisk(db, neededBytes, f, notChecked);
  return { notChecked, freeBytes };
}

/** Tables whose row-level security applies to pgsub's role: the apply refuses them (apply/sql/row-security.ts). */
async function checkRowSecurity(db: Db, rels: { schema: string; table: string }[], f: Findings): Promise<void> {
  if (rels.length === 0) return;
  for (const r of await db.query<RowSecurityRow>(ROW_SECURITY_SQL, [tablesParam(rels)]))
    f.blocker(
      'TARGET_ROW_SECURITY',
      'target',
      `${r.schema}.${r.table}`,
      `row-level security of ${r.schema}.${r.table} applies to ${r.role} (${rowSecurityReason(r)}): pgsub refuses to apply into it (PGSUB_ROW_SECURITY), since its UPDATEs and DELETEs would miss the rows the policies hide`,
      rowSecurityFix(r),
    );
}

async function checkDependencies(db: Db, src: SourceFacts, f: Findings): Promise<void> {
  const ownTypes = src.types.filter((t) => t.extension === null);
  const haveTypes = await existing(db, 'type', ownTypes);
  for (const t of ownTypes) {
    if (!haveTypes.has(`${t.schema}.${t.name}`))
      f.blocker(
        'TARGET_TYPE_MISSING',
        'target',
        `${t.schema}.${t.name}`,
        `type ${t.schema}.${t.name} (${KIND[t.kind] ?? t.kind}), used by the published tables, is missing on the target`,
        'pgsub schema copy  (creates it with the tables)',
      );
  }
  const extensions = await readExtensions(db);
  const available = new Set((await db.query<Row>(`SELECT name::text FROM pg_catalog.pg_available_extensions`)).map((r) => r.name!));
  const used = new Set([...src.types, ...src.functions].map((o) => o.extension).filter((e): e is string => e !== null));
  for (const [name, version] of src.extensions) {
    if (name === 'plpgsql' || extensions.has(name)) continue;
    const install = available.has(name)
      ? `CREATE EXTENSION ${ident(name)};`
      : `install the package with extension ${name} for PostgreSQL ${Math.floor(db.versionNum / 10000)} on the target host, then: CREATE EXTENSION ${ident(name)};`;
    if (used.has(name))
      f.blocker(
        'TARGET_EXTENSION_MISSING',
        'target',
        `extension ${name}`,
        `extension ${name} (${version} on the source) is not installed on the target, and the published tables use its types or functions`,
        install,
      );
    else
      f.warning(
        'TARGET_EXTENSION_MISSING',
        'target',
        `extension ${name}`,
        `extension ${name} (${version} on the source) is not installed on the target: the application may use it`,
        install,
      );
  }
  const collations = [
    ...new Set(
      [...src.columns.values()]
        .flat()
        .map((c) => c.collation)
        .filter((c): c is string => c !== null),
    ),
  ];
  const asNames = collations.map((c) => ({ schema: c.slice(0, c.indexOf('.')), name: c.slice(c.indexOf('.') + 1) }));
  const haveCollations = await existing(db, 'collation', asNames);
  for (const c of collations) {
    if (!haveCollations.has(c))
      f.blocker(
        'TARGET_COLLATION_MISSING',
        'target',
        `collation ${c}`,
        `collation ${c}, used by a published column, is missing on the target`,
        c.startsWith('pg_catalog.') ? `the target's operating system lacks the locale: install it, or CREATE COLLATION` : 'pgsub schema copy  (creates it with the tables)',
      );
  }
}

const KIND: Record<string, string> = { e: 'enum', d: 'domain', c: 'composite', r: 'range', b: 'base type', m: 'multirange' };

async function checkLocale(db: Db, src: SourceFacts, f: Findings): Promise<void> {
  const t = await readLocale(db);
  const s = src.locale;
  if (t.encoding !== s.encoding) {
    f.warning(
      'TARGET_ENCODING',
      'target',
      `database ${db.info.database}`,
      `the source database is ${s.encoding} and the target ${t.encoding}: text the target encoding cannot represent fails to apply`,
      `create the target database with ENCODING '${s.encoding}'`,
    );
  }
  const sLocale = `${s.provider === 'i' ? 'icu' : s.provider === 'b' ? 'builtin' : 'libc'} ${s.locale ?? `${s.collate}/${s.ctype}`}`;
  const tLocale = `${t.provider === 'i' ? 'icu' : t.provider === 'b' ? 'builtin' : 'libc'} ${t.locale ?? `${t.collate}/${t.ctype}`}`;
  if (sLocale !== tLocale) {
    f.warning(
      'TARGET_LOCALE',
      'target',
      `database ${db.info.database}`,
      `the databases sort text differently (source: ${sLocale}, target: ${tLocale}): ORDER BY results, text index order and what a unique text index treats as equal can differ`,
      `create the target database with LC_COLLATE '${s.collate}' LC_CTYPE '${s.ctype}'${s.provider !== 'c' ? ` LOCALE_PROVIDER ${s.provider === 'i' ? 'icu' : 'builtin'}` : ''}`,
    );
  }
}

async function checkPrivileges(
  db: Db,
  config: Config,
  src: SourceFacts,
  rels: { schema: string; table: string }[],
  role: string,
  superuser: boolean,
  checkTablePrivileges: TablePrivilegeCheck,
  f: Findings,
): Promise<void> {
  await checkTableGrants(config, rels, role, checkTablePrivileges, f);
  if (superuser) return;
  await checkApplyPrivileges(db, role, f);
  if (config.deferIndexes && rels.length > 0) await checkOwnership(db, rels, role, f);
  if (config.sequences === 'sync' && src.sequences.length > 0) await checkSequenceUpdate(db, src, role, f);
}

/** The apply's startup check of the tables, its PrivilegeError turned into a finding with its GRANTs. */
async function checkTableGrants(config: Config, rels: { schema: string; table: string }[], role: string, checkTablePrivileges: TablePrivilegeCheck, f: Findings): Promise<void> {
  try {
    await checkTablePrivileges(config, rels);
  } catch (err) {
    if (!(err instanceof PrivilegeError)) throw err;
    const at = err.message.indexOf('Run on the target: ');
    f.blocker(
      'TARGET_PRIVILEGES',
      'target',
      `role ${role}`,
      at >= 0 ? err.message.slice(0, at).trim() : err.message,
      at >= 0 ? err.message.slice(at + 'Run on the target: '.length) : null,
    );
  }
}

/** pgsub's schema, session_replication_role and the replication origin functions. */
async function checkApplyPrivileges(db: Db, role: string, f: Findings): Promise<void> {
  const [p] = await db.query<Row>(
    `SELECT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')::text AS create_db,
            (SELECT pg_catalog.has_schema_privilege(n.oid, 'CREATE') AND pg_catalog.has_schema_privilege(n.oid, 'USAGE') FROM pg_catalog.pg_namespace n WHERE n.nspname = 'pgsub')::text AS own_schema,
            ${db.versionNum >= 150000 ? `pg_catalog.has_parameter_privilege('session_replication_role', 'SET')` : 'false'}::text AS set_role,
            pg_catalog.has_function_privilege('pg_catalog.pg_replication_origin_session_setup(text)', 'EXECUTE')::text AS origin`,
  );
  if (!isTrue(p!.create_db) && !isTrue(p!.own_schema)) {
    f.blocker(
      'TARGET_CREATE_SCHEMA',
      'target',
      `database ${db.info.database}`,
      `role "${role}" cannot create pgsub's schema "pgsub" (progress, table states) in database ${db.info.database}`,
      `GRANT CREATE ON DATABASE ${ident(db.info.database)} TO ${ident(role)};`,
    );
  }
  if (!isTrue(p!.set_role)) {
    f.blocker(
      'TARGET_REPLICATION_ROLE',
      'target',
      `role ${role}`,
      `role "${role}" may not set session_replication_role, which pgsub's apply sessions set to replica`,
      db.versionNum >= 150000
        ? `GRANT SET ON PARAMETER session_replication_role TO ${ident(role)};`
        : `ALTER ROLE ${ident(role)} SUPERUSER;  -- before PostgreSQL 15 only a superuser may`,
    );
  }
  if (!isTrue(p!.origin)) {
    f.blocker(
      'TARGET_ORIGIN_FUNCTIONS',
      'target',
      `role ${role}`,
      `role "${role}" may not use the replication origin functions (applied changes carry the origin pgsub_<subscription>, as a native subscriber's)`,
      `GRANT EXECUTE ON FUNCTION pg_catalog.pg_replication_origin_create(text), pg_catalog.pg_replication_origin_oid(text), pg_catalog.pg_replication_origin_session_setup(text), pg_catalog.pg_replication_origin_session_reset(), pg_catalog.pg_replication_origin_xact_setup(pg_lsn, timestamptz), pg_catalog.pg_replication_origin_drop(text) TO ${ident(role)};`,
    );
  }
}

/** defer_indexes drops a table's indexes for the copy: the role must own the table. */
async function checkOwnership(db: Db, rels: { schema: string; table: string }[], role: string, f: Findings): Promise<void> {
  const notOwned = await db.query<Row>(
    `SELECT n.nspname || '.' || c.relname AS rel FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
         JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name
        WHERE NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') ORDER BY 1`,
    [relationsParam(rels)],
  );
  for (const r of notOwned) {
    const [schema, ...rest] = r.rel!.split('.');
    f.warning(
      'TARGET_NOT_OWNER',
      'target',
      r.rel!,
      `role "${role}" does not own ${r.rel}: defer_indexes (dropping its indexes for the copy) needs ownership, so its copy will fail until it does`,
      `ALTER TABLE ${qualified(schema!, rest.join('.'))} OWNER TO ${ident(role)};  -- or set defer_indexes: false`,
    );
  }
}

/** `sequences: sync` sets the target's sequences: setval needs UPDATE on each that exists. */
async function checkSequenceUpdate(db: Db, src: SourceFacts, role: string, f: Findings): Promise<void> {
  const rows = await db.query<Row>(
    `SELECT x.schema || '.' || x.name AS name FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
        WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name)) IS NOT NULL
          AND NOT pg_catalog.has_sequence_privilege(pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name)), 'UPDATE')`,
    [JSON.stringify(src.sequences.map((s) => ({ schema: s.schema, name: s.name })))],
  );
  for (const r of rows) {
    const s = src.sequences.find((q) => seqName(q) === r.name)!;
    f.blocker(
      'TARGET_SEQUENCE_UPDATE',
      'target',
      r.name!,
      `role "${role}" may not set sequence ${r.name} (setval needs UPDATE on it)`,
      `GRANT UPDATE ON SEQUENCE ${qualified(s.schema, s.name)} TO ${ident(role)};`,
    );
  }
}

async function checkSettings(db: Db, config: Config, f: Findings): Promise<void> {
  const settings = new Map(
    (await db.query<Row>(`SELECT name::text, setting::text FROM pg_catalog.pg_settings WHERE name IN ('max_prepared_transactions', 'wal_level')`)).map((r) => [
      r.name!,
      r.setting!,
    ]),
  );
  if (config.twoPhase && Number(settings.get('max_prepared_transactions') ?? '0') === 0) {
    f.blocker(
      'TARGET_PREPARED_TRANSACTIONS',
      'target',
      'max_prepared_transactions',
      'two_phase = true prepares transactions on the target, but its max_prepared_transactions is 0: the first PREPARE fails',
      'ALTER SYSTEM SET max_prepared_transactions = 100;  -- at least max_connections is safe; then restart the target',
    );
  }
  if (settings.get('wal_level') !== 'logical') {
    f.info(
      'TARGET_WAL_LEVEL',
      'target',
      'wal_level',
      `wal_level is ${settings.get('wal_level')} on the target: replicating back to the old primary after the cutover (pgsub cutover --reverse) needs logical`,
      'ALTER SYSTEM SET wal_level = logical;  -- then restart the target, before the cutover',
    );
  }
}

/**
 * The initial copy refuses a table that already has rows (unless truncate_before_copy);
 * `rels` are the tables this subscription has not copied (its own copies have rows by right).
 */
async function checkEmpty(db: Db, config: Config, rels: { schema: string; table: string }[], f: Findings, notChecked: string[]): Promise<void> {
  if (!config.copyData || config.truncateBeforeCopy) return;
  for (const r of rels) {
    const obj = qualified(r.schema, r.table);
    try {
      const [row] = await db.query<Row>(`SELECT EXISTS (SELECT 1 FROM ${obj}) ::text AS rows`);
      if (isTrue(row?.rows))
        f.blocker(
          'TARGET_TABLE_NOT_EMPTY',
          'target',
          relName(r),
          `${relName(r)} already has rows on the target: the initial copy refuses it`,
          `TRUNCATE ${obj};  -- or set truncate_before_copy: true`,
        );
    } catch {
      notChecked.push(`whether ${relName(r)} is empty on the target (no SELECT on it)`);
    }
  }
}

/**
 * Free space cannot be read over SQL. When the target runs on this host and its data
 * directory can be read (superuser or pg_read_all_settings), it is measured there;
 * otherwise it is named as not checked, with the size needed.
 */
async function checkDisk(db: Db, neededBytes: number, f: Findings, notChecked: string[]): Promise<number | null> {
  const local = db.info.host.startsWith('/') || ['127.0.0.1', 'localhost', '::1'].includes(db.info.host);
  let dataDir: string | null = null;
  try {
    const [r] = await db.query<Row>(`SELECT pg_catalog.current_setting('data_directory')::text AS dir`);
    dataDir = r?.dir ?? null;
  } catch {
    dataDir = null;
  }
  if (!local || dataDir === null || !fs.existsSync(dataDir)) {
    notChecked.push(
      `free disk space on the target: not readable over SQL${dataDir === null ? ' (data_directory needs pg_read_all_settings)' : ''} and the target is not on this host; it needs about ${formatBytes(neededBytes)} for the copy (tables and indexes as on the source) plus WAL up to its max_wal_size`,
    );
    return null;
  }
  const st = fs.statfsSync(dataDir);
  const free = Number(st.bavail) * Number(st.bsize);
  if (free < neededBytes * 1.2) {
    f.blocker(
      'TARGET_DISK',
      'target',
      dataDir,
      `${formatBytes(free)} free where the target keeps its data; the copy needs about ${formatBytes(neededBytes)} (tables and indexes as on the source) plus WAL`,
      'free space there, or move the tables to a tablespace on a larger disk',
    );
  } else {
    f.info('TARGET_DISK', 'target', dataDir, `${formatBytes(free)} free where the target keeps its data; the copy needs about ${formatBytes(neededBytes)}`);
  }
  return free;
}
