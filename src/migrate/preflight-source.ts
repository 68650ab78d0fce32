/**
 * Preflight of the publisher: what would stop pgsub or the application once published,
 * what the slot's consistent point will wait for, and what logical replication does not
 * carry. Read-only (catalog and statistics views). Besides the findings it returns the
 * facts the target checks and the copy estimate compare against: the published tables and
 * their columns, the sequences, types, functions and extensions they depend on, the
 * database's encoding and locale.
 */
import type { Config } from '../config/config.js';
import type { PublishedTable } from '../tablesync/catalog.js';
import { quoteQualified } from '../quote.js';
import { arrayLiteral, isTrue, publishedTables, relationsParam, type Db, type Row } from './db.js';
import { type Findings, ident, qualified } from './findings.js';
import {
  readColumns,
  readDescendants,
  readExtensions,
  readFunctionDeps,
  readSequenceUses,
  readTypeDeps,
  seqName,
  type Column,
  type FunctionDep,
  type Rel,
  type SequenceUse,
  type TypeDep,
} from './objects.js';

export interface DatabaseLocale {
  encoding: string;
  collate: string;
  ctype: string;
  /** c libc, i icu, b builtin (PostgreSQL 15+; libc before). */
  provider: string;
  /** The ICU or builtin locale; null with libc. */
  locale: string | null;
}

export interface RelSize {
  rel: string;
  rows: number;
  tableBytes: number;
  indexBytes: number;
}

export interface SourceFacts {
  database: string;
  locale: DatabaseLocale;
  standardConformingStrings: boolean;
  tables: PublishedTable[];
  /** Published tables and their partitions. */
  rels: Rel[];
  columns: Map<string, Column[]>;
  sequences: SequenceUse[];
  types: TypeDep[];
  functions: FunctionDep[];
  extensions: Map<string, string>;
  sizes: RelSize[];
}

export interface SourceCheckOptions {
  /** A transaction with an xid older than this delays the slot's consistent point. */
  longTransactionSeconds: number;
  /** Published tables (schema.table) this subscription has copied already (preflight-target.ts readSubscribed): no copy slot is needed for them. */
  copied?: ReadonlySet<string>;
}

export async function readLocale(db: Db): Promise<DatabaseLocale> {
  const provider = db.versionNum >= 150000 ? 'datlocprovider::text' : `'c'`;
  const locale = db.versionNum >= 170000 ? 'datlocale::text' : db.versionNum >= 150000 ? 'daticulocale::text' : 'NULL::text';
  const [r] = await db.query<Row>(
    `SELECT pg_catalog.pg_encoding_to_char(encoding)::text AS encoding, datcollate::text AS collate, datctype::text AS ctype, ${provider} AS provider, ${locale} AS locale
       FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()`,
  );
  return { encoding: r!.encoding!, collate: r!.collate!, ctype: r!.ctype!, provider: r!.provider ?? 'c', locale: r!.locale ?? null };
}

export async function checkSource(db: Db, config: Config, opts: SourceCheckOptions, f: Findings): Promise<SourceFacts> {
  const settings = await readSettings(db);
  const role = await readRole(db);
  const superuser = isTrue(role.super);
  checkWal(db, settings, f);
  if (!superuser && !isTrue(role.replication)) {
    f.blocker(
      'SOURCE_ROLE_REPLICATION',
      'source',
      `role ${role.name}`,
      `role "${role.name}" has no REPLICATION attribute: it cannot open pgsub's replication connection`,
      `ALTER ROLE ${ident(role.name!)} REPLICATION;`,
    );
  }

  const tables = await checkPublications(db, config, f);
  // A running subscription needs copy slots only for the tables it has not copied yet.
  await checkSlots(db, config, settings, tables.filter((t) => !opts.copied?.has(`${t.schema}.${t.table}`)).length, f);
  const roots: Rel[] = tables.map((t) => ({ schema: t.schema, table: t.table }));
  const rels = [...roots, ...(await readDescendants(db, roots))];

  await checkTables(db, rels, tables, role.name!, f);
  const sequences = [...(await readSequenceUses(db, rels)), ...config.sequenceNames.map((s) => ({ ...s, kind: 'config' as const, usedBy: null }))];
  await checkSequences(db, config, sequences, role.name!, f);
  if (!superuser && !isTrue(role.read_stats)) {
    f.info(
      'SOURCE_NOT_CHECKED',
      'source',
      'other sessions',
      `role "${role.name}" sees only its own sessions' transactions: long-running transactions of other roles were not checked (pg_read_all_stats shows them)`,
      `GRANT pg_read_all_stats TO ${ident(role.name!)};`,
    );
  }
  await checkTransactions(db, opts, f);
  await checkNotReplicated(db, rels, f);
  return readFacts(db, settings, tables, rels, sequences);
}

async function readSettings(db: Db): Promise<Map<string, string>> {
  return new Map(
    (
      await db.query<Row>(
        `SELECT name::text, setting::text FROM pg_catalog.pg_settings
        WHERE name IN ('wal_level', 'max_replication_slots', 'max_wal_senders', 'max_slot_wal_keep_size', 'wal_sender_timeout', 'standard_conforming_strings')`,
      )
    ).map((r) => [r.name!, r.setting!]),
  );
}

/** The connecting role: its name, superuser, REPLICATION, and whether it sees every session (pg_read_all_stats). */
async function readRole(db: Db): Promise<Row> {
  const [role] = await db.query<Row>(
    `SELECT current_user::text AS name, r.rolsuper::text AS super, r.rolreplication::text AS replication,
            pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')::text AS read_stats
       FROM pg_catalog.pg_roles r WHERE r.rolname = current_user`,
  );
  return role!;
}

/** Each configured publication exists and together they publish tables; returns those tables. */
async function checkPublications(db: Db, config: Config, f: Findings): Promise<PublishedTable[]> {
  const pubs = await db.query<Row>(`SELECT pubname::text AS name, puballtables::text AS all_tables FROM pg_catalog.pg_publication WHERE pubname = ANY ($1::text[])`, [
    arrayLiteral(config.publications),
  ]);
  for (const p of config.publications) {
    if (!pubs.some((r) => r.name === p))
      f.blocker(
        'SOURCE_PUBLICATION_MISSING',
        'source',
        `publication ${p}`,
        `publication "${p}" does not exist in database ${db.info.database}`,
        `CREATE PUBLICATION ${ident(p)} FOR TABLE …;`,
      );
  }
  const tables = await publishedTables(db, config.publications);
  if (pubs.length > 0 && tables.length === 0)
    f.blocker(
      'SOURCE_NO_TABLES',
      'source',
      `publication ${config.publications.join(', ')}`,
      'the publications publish no tables',
      `ALTER PUBLICATION ${ident(config.publications[0]!)} ADD TABLE …;`,
    );
  return tables;
}

/** What the target checks and the copy estimate compare against, read after the checks. */
async function readFacts(db: Db, settings: Map<string, string>, tables: PublishedTable[], rels: Rel[], sequences: SequenceUse[]): Promise<SourceFacts> {
  const types = await readTypeDeps(db, rels);
  return {
    database: db.info.database,
    locale: await readLocale(db),
    standardConformingStrings: settings.get('standard_conforming_strings') !== 'off',
    tables,
    rels,
    columns: await readColumns(db, rels),
    sequences,
    types,
    functions: await readFunctionDeps(db, rels, types),
    extensions: await readExtensions(db),
    sizes: await readSizes(db, rels),
  };
}

function checkWal(db: Db, settings: Map<string, string>, f: Findings): void {
  const walLevel = settings.get('wal_level');
  if (walLevel !== 'logical') {
    f.blocker(
      'SOURCE_WAL_LEVEL',
      'source',
      'wal_level',
      `wal_level is ${walLevel}: logical replication needs logical`,
      'ALTER SYSTEM SET wal_level = logical;  -- then restart the publisher',
    );
  }
  const keep = settings.get('max_slot_wal_keep_size');
  if (keep === undefined) {
    f.warning(
      'SOURCE_SLOT_WAL_KEEP',
      'source',
      'max_slot_wal_keep_size',
      `PostgreSQL ${Math.floor(db.versionNum / 10000)} cannot limit the WAL a slot keeps (max_slot_wal_keep_size is 13+): while pgsub is stopped or behind, the publisher keeps all WAL since the slot's position, until its disk is full`,
      "watch the slot's retained WAL (pgsub status: slot_retained_wal_bytes; max_retained_wal_mb warns)",
    );
  } else if (Number(keep) < 0) {
    f.warning(
      'SOURCE_SLOT_WAL_KEEP',
      'source',
      'max_slot_wal_keep_size',
      "max_slot_wal_keep_size = -1: while pgsub is stopped or behind, the publisher keeps all WAL since the slot's position, without bound, until its disk is full",
      "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB';  SELECT pg_reload_conf();  -- a size your WAL disk can hold",
    );
  } else {
    f.info(
      'SOURCE_SLOT_WAL_KEEP',
      'source',
      'max_slot_wal_keep_size',
      `max_slot_wal_keep_size = ${keep} MB: a slot further behind is invalidated, and pgsub stops with PGSUB_SLOT_LOST (exit 4); the subscription must then be re-created and copied again`,
    );
  }
  const timeout = Number(settings.get('wal_sender_timeout') ?? '60000');
  if (timeout === 0) {
    f.warning(
      'SOURCE_WAL_SENDER_TIMEOUT',
      'source',
      'wal_sender_timeout',
      'wal_sender_timeout = 0: a pgsub connection lost without a close keeps holding the slot until the kernel gives up on it (pgsub restarted meanwhile is refused the slot)',
      "ALTER SYSTEM SET wal_sender_timeout = '60s';  SELECT pg_reload_conf();",
    );
  }
}

async function checkSlots(db: Db, config: Config, settings: Map<string, string>, toCopy: number, f: Findings): Promise<void> {
  const [slots] = await db.query<Row>(
    `SELECT count(*)::text AS used, count(*) FILTER (WHERE slot_name = $1)::text AS ours, COALESCE(bool_or(slot_name = $1 AND active), false)::text AS ours_active
       FROM pg_catalog.pg_replication_slots`,
    [config.slotName],
  );
  const [senders] = await db.query<Row>(`SELECT count(*)::text AS used FROM pg_catalog.pg_stat_replication`);
  const copies = config.copyData ? Math.min(config.maxSyncWorkers, toCopy) : 0;
  const slotsNeeded = (Number(slots!.ours) > 0 ? 0 : 1) + copies;
  const sendersNeeded = (isTrue(slots!.ours_active) ? 0 : 1) + copies;
  const maxSlots = Number(settings.get('max_replication_slots') ?? '0');
  const maxSenders = Number(settings.get('max_wal_senders') ?? '0');
  const freeSlots = maxSlots - Number(slots!.used);
  const freeSenders = maxSenders - Number(senders!.used);
  const why = `pgsub's slot${copies > 0 ? ` plus ${copies} temporary one(s) for the parallel initial copy (max_sync_workers)` : ''}`;
  if (freeSlots < slotsNeeded) {
    f.blocker(
      'SOURCE_SLOTS',
      'source',
      'max_replication_slots',
      `${freeSlots} free replication slot(s) of ${maxSlots} (${slots!.used} in use); pgsub needs ${slotsNeeded}: ${why}`,
      `ALTER SYSTEM SET max_replication_slots = ${Number(slots!.used) + slotsNeeded + 2};  -- then restart the publisher (or drop unused slots: SELECT pg_drop_replication_slot(slot_name) …)`,
    );
  }
  if (freeSenders < sendersNeeded) {
    f.blocker(
      'SOURCE_WALSENDERS',
      'source',
      'max_wal_senders',
      `${freeSenders} free walsender(s) of ${maxSenders} (${senders!.used} in use); pgsub needs ${sendersNeeded}: its streaming connection${copies > 0 ? ` plus ${copies} for the parallel initial copy` : ''}`,
      `ALTER SYSTEM SET max_wal_senders = ${Number(senders!.used) + sendersNeeded + 2};  -- then restart the publisher`,
    );
  }
}

/** SELECT for the copy, and the replica identity UPDATE/DELETE need once published. */
async function checkTables(db: Db, rels: Rel[], tables: PublishedTable[], role: string, f: Findings): Promise<void> {
  const rows = await db.query<Row>(
    `SELECT n.nspname::text AS schema, c.relname::text AS rel, c.relkind::text AS kind, c.relreplident::text AS ident,
            EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)::text AS has_pk,
            (pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND pg_catalog.has_table_privilege(c.oid, 'SELECT'))::text AS readable
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
       JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name`,
    [relationsParam(rels)],
  );
  // A partition is updated through its root when the root is what the publication publishes.
  const updates = new Map(tables.map((t) => [`${t.schema}.${t.table}`, t.publishesUpdates]));
  const publishesUpdates = tables.some((t) => t.publishesUpdates);
  for (const r of rows) {
    const name = `${r.schema}.${r.rel}`;
    const obj = qualified(r.schema!, r.rel!);
    if (!isTrue(r.readable)) {
      f.blocker(
        'SOURCE_TABLE_SELECT',
        'source',
        name,
        `role "${role}" cannot read ${name}: the initial copy needs SELECT on it (and USAGE on its schema)`,
        `GRANT USAGE ON SCHEMA ${ident(r.schema!)} TO ${ident(role)};  GRANT SELECT ON ${obj} TO ${ident(role)};`,
      );
    }
    if (r.kind === 'p') continue; // a partitioned table holds no rows; its partitions are checked
    const pubUpdates = updates.get(name) ?? publishesUpdates;
    if (pubUpdates && (r.ident === 'n' || (r.ident === 'd' && !isTrue(r.has_pk)))) {
      f.blocker(
        'SOURCE_NO_REPLICA_IDENTITY',
        'source',
        name,
        `${name} has no replica identity (${r.ident === 'n' ? 'REPLICA IDENTITY NOTHING' : 'no primary key'}): once it is published, every UPDATE and DELETE on it fails on the source ("cannot update table … because it does not have a replica identity and publishes updates")`,
        `ALTER TABLE ${obj} ADD PRIMARY KEY (…);  -- or: ALTER TABLE ${obj} REPLICA IDENTITY FULL;`,
      );
    } else if (r.ident === 'f') {
      f.warning(
        'SOURCE_REPLICA_IDENTITY_FULL',
        'source',
        name,
        `${name} has REPLICA IDENTITY FULL: every UPDATE and DELETE writes the whole old row to the WAL (more WAL, more to send) and is located on the target by comparing all columns, by a sequential scan unless the target has an index pgsub can use`,
        `ALTER TABLE ${obj} ADD PRIMARY KEY (…);  -- then: ALTER TABLE ${obj} REPLICA IDENTITY DEFAULT;`,
      );
    }
  }
}

async function checkSequences(db: Db, config: Config, sequences: SequenceUse[], role: string, f: Findings): Promise<void> {
  if (sequences.length === 0) return;
  const names = sequences.map(seqName);
  if (config.sequences === 'off') {
    f.warning(
      'SOURCE_SEQUENCES',
      'source',
      `${sequences.length} sequence(s)`,
      `sequences: off: ${names.slice(0, 5).join(', ')}${names.length > 5 ? ', …' : ''} are not copied; after the cutover the target hands out values the source already used`,
      'sequences: sync  (the default)',
    );
    return;
  }
  f.info(
    'SOURCE_SEQUENCES',
    'source',
    `${sequences.length} sequence(s)`,
    `synced by pgsub while streaming and exactly at cutover (sequences: sync): ${names.slice(0, 5).join(', ')}${names.length > 5 ? ', …' : ''}`,
  );
  const rows = await db.query<Row>(
    `SELECT x.schema || '.' || x.name AS name, (pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name)) IS NOT NULL)::text AS present,
            COALESCE(pg_catalog.has_sequence_privilege(pg_catalog.to_regclass(pg_catalog.format('%I.%I', x.schema, x.name)), 'SELECT'), false)::text AS readable
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)`,
    [JSON.stringify(sequences.map((s) => ({ schema: s.schema, name: s.name })))],
  );
  for (const r of rows) {
    const s = sequences.find((q) => seqName(q) === r.name)!;
    if (!isTrue(r.present)) f.blocker('SOURCE_SEQUENCE_MISSING', 'source', r.name!, `sequence ${r.name} (sequence_names) does not exist on the source`, 'fix sequence_names');
    else if (!isTrue(r.readable))
      f.blocker(
        'SOURCE_SEQUENCE_SELECT',
        'source',
        r.name!,
        `role "${role}" cannot read sequence ${r.name}: the sequence sync needs SELECT on it`,
        `GRANT SELECT ON SEQUENCE ${qualified(s.schema, s.name)} TO ${ident(role)};`,
      );
  }
}

/** What the consistent point of the slot (and of every copy's temporary slot) waits for. */
async function checkTransactions(db: Db, opts: SourceCheckOptions, f: Findings): Promise<void> {
  const long = await db.query<Row>(
    `SELECT pid::text, datname::text AS db, usename::text AS usr, application_name::text AS app, state::text,
            pg_catalog.floor(extract(epoch FROM pg_catalog.now() - xact_start))::text AS age
       FROM pg_catalog.pg_stat_activity
      WHERE pid <> pg_catalog.pg_backend_pid() AND backend_xid IS NOT NULL AND xact_start < pg_catalog.now() - pg_catalog.make_interval(secs => $1::float8)
      ORDER BY xact_start`,
    [String(opts.longTransactionSeconds)],
  );
  for (const r of long) {
    f.warning(
      'SOURCE_LONG_TRANSACTION',
      'source',
      `pid ${r.pid}`,
      `a transaction has been open for ${r.age} s (pid ${r.pid}, database ${r.db}, user ${r.usr}, application "${r.app ?? ''}", ${r.state}): creating pgsub's slot, and each copy's snapshot, waits until it ends`,
      `end it, or: SELECT pg_terminate_backend(${r.pid});`,
    );
  }
  const prepared = await db.query<Row>(
    `SELECT gid::text, database::text AS db, owner::text, pg_catalog.floor(extract(epoch FROM pg_catalog.now() - prepared))::text AS age FROM pg_catalog.pg_prepared_xacts ORDER BY prepared`,
  );
  for (const r of prepared) {
    f.warning(
      'SOURCE_PREPARED_TRANSACTION',
      'source',
      `gid ${r.gid}`,
      `transaction "${r.gid}" (database ${r.db}, owner ${r.owner}) has been prepared for ${r.age} s: creating pgsub's slot waits until it is committed or rolled back`,
      `COMMIT PREPARED '${r.gid!.replace(/'/g, "''")}';  -- or ROLLBACK PREPARED`,
    );
  }
}

/** In the published schemas: what logical replication does not carry. */
async function checkNotReplicated(db: Db, rels: Rel[], f: Findings): Promise<void> {
  const schemas = [...new Set(rels.map((r) => r.schema))];
  const rows = await db.query<Row>(
    `SELECT n.nspname::text AS schema, c.relname::text AS rel, c.relkind::text AS kind
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = ANY ($1::text[]) AND ((c.relkind IN ('r', 'p') AND c.relpersistence = 'u') OR c.relkind = 'm')
      ORDER BY 1, 2`,
    [arrayLiteral(schemas)],
  );
  for (const r of rows) {
    const name = `${r.schema}.${r.rel}`;
    if (r.kind === 'm')
      f.warning(
        'SOURCE_MATERIALIZED_VIEW',
        'source',
        name,
        `materialized view ${name} is not replicated: create it on the target (pg_dump --schema-only --table) and refresh it after the copy and at cutover`,
        `REFRESH MATERIALIZED VIEW ${qualified(r.schema!, r.rel!)};  -- on the target`,
      );
    else
      f.warning(
        'SOURCE_UNLOGGED_TABLE',
        'source',
        name,
        `unlogged table ${name} is not replicated (it writes no WAL) and cannot be published: its rows stay behind`,
        `ALTER TABLE ${qualified(r.schema!, r.rel!)} SET LOGGED;  -- then add it to the publication; or copy it by hand after the fence`,
      );
  }
  const [lo] = await db.query<Row>(`SELECT count(*)::text AS n FROM pg_catalog.pg_largeobject_metadata`);
  if (Number(lo!.n) > 0) {
    f.warning(
      'SOURCE_LARGE_OBJECTS',
      'source',
      `${lo!.n} large object(s)`,
      `the database holds ${lo!.n} large object(s) (pg_largeobject): logical replication does not carry them`,
      `after the fence: pg_dump --data-only --large-objects --table=<a table without rows> … | psql <target>;  or keep the data in bytea columns`,
    );
  }
  const triggers = await db.query<Row>(`SELECT evtname::text AS name, evtevent::text AS event, evtenabled::text AS enabled FROM pg_catalog.pg_event_trigger ORDER BY 1`);
  for (const t of triggers) {
    f.warning(
      'SOURCE_EVENT_TRIGGER',
      'source',
      `event trigger ${t.name}`,
      `event trigger ${t.name} (${t.event}${t.enabled === 'D' ? ', disabled' : ''}): DDL is not replicated — schema changes made on the source during the migration must be made on the target too (a column added on both sides first is picked up)`,
      null,
    );
  }
}

/** Tables up to this size without statistics are counted for the estimate; larger ones count as 0 rows (ANALYZE gives them one). */
const UNCOUNTED_BYTES = 64 * 1024 * 1024;

async function readSizes(db: Db, rels: Rel[]): Promise<RelSize[]> {
  const rows = await db.query<Row>(
    `SELECT n.nspname::text AS schema, c.relname::text AS name, n.nspname || '.' || c.relname AS rel, CASE WHEN c.reltuples >= 0 AND c.relpages > 0 THEN c.reltuples::bigint::text END AS rows,
            pg_catalog.pg_table_size(c.oid)::text AS table_bytes, pg_catalog.pg_indexes_size(c.oid)::text AS index_bytes
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
       JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name
      WHERE c.relkind <> 'p'`,
    [relationsParam(rels)],
  );
  // A table never vacuumed or analyzed has no row estimate: a small one is counted.
  for (const r of rows) {
    if (r.rows !== null || Number(r.table_bytes) > UNCOUNTED_BYTES) continue;
    const [n] = await db.query<Row>(`SELECT count(*)::text AS n FROM ${quoteQualified(r.schema!, r.name!)}`).catch(() => [{ n: '0' }]);
    r.rows = n?.n ?? '0';
  }
  return rows.map((r) => ({ rel: r.rel!, rows: Number(r.rows ?? 0), tableBytes: Number(r.table_bytes), indexBytes: Number(r.index_bytes) }));
}
