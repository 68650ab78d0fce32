/**
 * What a role lacks on one server, and the statement that grants it: the probes the
 * per-command privilege checks are made of (privileges.ts), and the permission errors the
 * sequence sync meets (sequences.ts). Every probe asks the server itself (has_*_privilege,
 * pg_has_role, the role's attributes), so a superuser passes all of them and a role is
 * judged by what that server, at its version, would let it do. Catalog joins only, never a
 * regclass cast: a role without USAGE on a schema is told so instead of failing on it.
 * The result of a check is one PrivilegeError (exit 2) naming each server (side,
 * host:port, version), the role, what it lacks and why, and the statements to run there.
 */
import { PrivilegeError, type Side } from '../errors.js';
import { arrayLiteral, isTrue, relationsParam, type Db, type Row } from './db.js';
import { ident, qualified } from './findings.js';

/** A GRANT of `privileges` on one object; grants of the same privileges and kind are merged into one statement. */
export interface Grant {
  privileges: string;
  kind: 'TABLE' | 'SEQUENCE' | 'SCHEMA' | 'DATABASE' | 'FUNCTION' | 'PARAMETER';
  object: string;
}

export interface Lack {
  /** The privilege in words: `SELECT on sequence shop.orders_id_seq`. */
  what: string;
  /** What pgsub does with it. */
  why: string;
  /** Run on that server: a GRANT, or a statement (ALTER ROLE …, ALTER TABLE … OWNER TO …). */
  fix: Grant | string;
}

/** The role a check runs as on one server, and what it lacks there. */
export interface SideLacks {
  side: Side;
  db: Db;
  role: string;
  superuser: boolean;
  replication: boolean;
  lacks: Lack[];
}

/** Who is connected on `db`: the facts every probe starts from. */
export async function sideOf(db: Db): Promise<SideLacks> {
  const [r] = await db.query<Row>(
    `SELECT current_user::text AS role, r.rolsuper::text AS super, r.rolreplication::text AS repl
       FROM pg_catalog.pg_roles r WHERE r.rolname = current_user`,
  );
  return { side: db.side, db, role: r!.role!, superuser: isTrue(r!.super), replication: isTrue(r!.repl), lacks: [] };
}

export const serverName = (db: Db): string => `${db.info.host}:${db.info.port}`;

const KIND_WORD: Record<Grant['kind'], string> = { TABLE: '', SEQUENCE: 'SEQUENCE ', SCHEMA: 'SCHEMA ', DATABASE: 'DATABASE ', FUNCTION: 'FUNCTION ', PARAMETER: 'PARAMETER ' };

/** The statements that fix `lacks`, GRANTs merged (one per privileges and kind), in the order first needed. */
export function fixes(lacks: readonly Lack[], role: string): string[] {
  const out: string[] = [];
  const merged = new Map<string, { grant: Grant; objects: string[] }>();
  for (const l of lacks) {
    if (typeof l.fix === 'string') {
      if (!out.includes(l.fix)) out.push(l.fix);
      continue;
    }
    const key = `${l.fix.privileges}|${l.fix.kind}`;
    const m = merged.get(key);
    if (m) {
      if (!m.objects.includes(l.fix.object)) m.objects.push(l.fix.object);
      continue;
    }
    merged.set(key, { grant: l.fix, objects: [l.fix.object] });
    out.push(key);
  }
  return out.map((s) => {
    const m = merged.get(s);
    return m ? `GRANT ${m.grant.privileges} ON ${KIND_WORD[m.grant.kind]}${m.objects.join(', ')} TO ${ident(role)};` : s;
  });
}

/** Null when nothing lacks; else the error naming every server, what lacks there and the statements to run. */
export function privilegeError(command: string, sides: readonly SideLacks[]): PrivilegeError | null {
  const lacking = sides.filter((s) => s.lacks.length > 0);
  if (lacking.length === 0) return null;
  const parts = lacking.map((s) => {
    // One reason, the privileges it needs: "SELECT on sequence a, SELECT on sequence b (the sequence sync reads them)".
    // A privilege is named once, under the first reason that needs it.
    const byWhy = new Map<string, string[]>();
    const named = new Set<string>();
    for (const l of s.lacks) {
      if (named.has(l.what)) continue;
      named.add(l.what);
      byWhy.set(l.why, [...(byWhy.get(l.why) ?? []), l.what]);
    }
    const items = [...byWhy].map(([why, whats]) => `${whats.join(', ')} (${why})`);
    return `${s.side} ${serverName(s.db)} (PostgreSQL ${s.db.version}): role "${s.role}" lacks ${items.join('; ')}. Run on the ${s.side}: ${fixes(s.lacks, s.role).join(' ')}`;
  });
  return new PrivilegeError(lacking[0]!.side, `pgsub ${command} cannot run as these roles: ${parts.join(' — ')}`, {
    command,
    sides: lacking.map((s) => `${s.side} ${serverName(s.db)}`).join(', '),
    missing: lacking.reduce((n, s) => n + s.lacks.length, 0),
  });
}

/** The REPLICATION attribute (a superuser has it implicitly). */
export function needReplication(s: SideLacks, why: string): void {
  if (!s.superuser && !s.replication) s.lacks.push({ what: 'the REPLICATION attribute', why, fix: `ALTER ROLE ${ident(s.role)} REPLICATION;` });
}

export async function needCreateOnDatabase(s: SideLacks, why: string): Promise<void> {
  const [r] = await s.db.query<Row>(`SELECT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE')::text AS ok`);
  if (!isTrue(r!.ok)) s.lacks.push({ what: `CREATE on database ${s.db.info.database}`, why, fix: { privileges: 'CREATE', kind: 'DATABASE', object: ident(s.db.info.database) } });
}

/** Membership in a predefined role (pg_read_all_stats, pg_signal_backend; PostgreSQL 10+), with its privileges. */
export async function needRole(s: SideLacks, role: string, why: string): Promise<void> {
  const [r] = await s.db.query<Row>(`SELECT pg_catalog.pg_has_role(current_user, $1, 'USAGE')::text AS ok`, [role]);
  if (!isTrue(r!.ok)) s.lacks.push({ what: `membership in ${role}`, why, fix: `GRANT ${role} TO ${ident(s.role)};` });
}

export interface RelName {
  schema: string;
  table: string;
}

interface RelationNeeds {
  /** Table privileges needed on each relation that exists. */
  privileges?: readonly string[];
  /** Ownership needed (DROP/ALTER/CREATE INDEX on it). */
  own?: boolean;
  /** CREATE on the relation's schema (its indexes are rebuilt there). */
  createInSchema?: boolean;
  /** CREATE on the schema of each relation that does not exist yet (it is created there). */
  createWhereMissing?: boolean;
}

/**
 * USAGE on the schemas of `rels` and, per relation that exists there, `privileges`,
 * ownership, CREATE on its schema. `kind` is 'table' (any relation kind a table can be) or
 * 'sequence'. What does not exist is skipped: that is the schema checks' business, not a privilege.
 */
export async function needOnRelations(s: SideLacks, kind: 'table' | 'sequence', rels: readonly RelName[], why: string, opts: RelationNeeds): Promise<void> {
  if (rels.length === 0) return;
  const privileges = opts.privileges ?? [];
  const relkinds = kind === 'sequence' ? `'S'` : `'r', 'p', 'f', 'v', 'm'`;
  const has = kind === 'sequence' ? 'has_sequence_privilege' : 'has_table_privilege';
  const rows = await s.db.query<Row>(
    `SELECT x.schema, x.name, (n.oid IS NOT NULL)::text AS schema_exists, (c.oid IS NOT NULL)::text AS rel_exists,
            pg_catalog.has_schema_privilege(n.oid, 'USAGE')::text AS usage, pg_catalog.has_schema_privilege(n.oid, 'CREATE')::text AS create_in,
            pg_catalog.array_to_string(ARRAY(SELECT p FROM pg_catalog.unnest($2::text[]) p WHERE c.oid IS NOT NULL AND NOT pg_catalog.${has}(c.oid, p)), ',') AS missing,
            pg_catalog.pg_has_role(c.relowner, 'USAGE')::text AS owned
       FROM pg_catalog.json_to_recordset($1::json) AS x(schema text, name text)
       LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = x.schema
       LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = x.name AND c.relkind IN (${relkinds})`,
    [relationsParam(rels), arrayLiteral(privileges)],
  );
  const word = kind === 'sequence' ? 'sequence' : 'table';
  const grantKind = kind === 'sequence' ? 'SEQUENCE' : 'TABLE';
  for (const r of rows) {
    const name = qualified(r.schema!, r.name!);
    if (!isTrue(r.schema_exists)) continue;
    const createHere = opts.createInSchema || (opts.createWhereMissing && !isTrue(r.rel_exists));
    if (!isTrue(r.usage)) s.lacks.push({ what: `USAGE on schema ${ident(r.schema!)}`, why, fix: { privileges: 'USAGE', kind: 'SCHEMA', object: ident(r.schema!) } });
    if (createHere && !isTrue(r.create_in))
      s.lacks.push({ what: `CREATE on schema ${ident(r.schema!)}`, why, fix: { privileges: 'CREATE', kind: 'SCHEMA', object: ident(r.schema!) } });
    if (!isTrue(r.rel_exists)) continue;
    const missing = r.missing ? r.missing.split(',') : [];
    if (missing.length > 0) s.lacks.push({ what: `${missing.join(', ')} on ${word} ${name}`, why, fix: { privileges: missing.join(', '), kind: grantKind, object: name } });
    if (opts.own && !isTrue(r.owned))
      s.lacks.push({ what: `ownership of ${word} ${name}`, why, fix: `ALTER ${kind === 'sequence' ? 'SEQUENCE' : 'TABLE'} ${name} OWNER TO ${ident(s.role)};` });
  }
}

/** session_replication_role = replica, as the apply and verify's repair set it: a superuser before PostgreSQL 15, GRANT SET ON PARAMETER from 15. */
export async function needReplicaRole(s: SideLacks, why: string): Promise<void> {
  if (s.superuser) return;
  if (s.db.versionNum < 150000) {
    needSuperuser(s, `${why}: before PostgreSQL 15 only a superuser may set session_replication_role`);
    return;
  }
  const [r] = await s.db.query<Row>(`SELECT pg_catalog.has_parameter_privilege('session_replication_role', 'SET')::text AS ok`);
  if (!isTrue(r!.ok)) s.lacks.push({ what: 'SET on parameter session_replication_role', why, fix: { privileges: 'SET', kind: 'PARAMETER', object: 'session_replication_role' } });
}

function needSuperuser(s: SideLacks, why: string): void {
  if (!s.superuser && !s.lacks.some((l) => l.what === 'superuser')) s.lacks.push({ what: 'superuser', why, fix: `ALTER ROLE ${ident(s.role)} SUPERUSER;` });
}

/** The replication origin functions an apply session calls (origin/replorigin.ts). */
export const APPLY_ORIGIN_FUNCTIONS = [
  'pg_catalog.pg_replication_origin_create(text)',
  'pg_catalog.pg_replication_origin_oid(text)',
  'pg_catalog.pg_replication_origin_session_setup(text)',
  'pg_catalog.pg_replication_origin_xact_setup(pg_lsn, timestamptz)',
];
/** Apply lanes and parallel apply hand the origin from session to session. */
export const ORIGIN_SESSION_RESET = 'pg_catalog.pg_replication_origin_session_reset()';

/** What `pgsub drop` calls to remove the subscription's origin. */
export const DROP_ORIGIN_FUNCTIONS = ['pg_catalog.pg_replication_origin_oid(text)', 'pg_catalog.pg_replication_origin_drop(text)'];

/** EXECUTE on replication origin functions: a superuser before PostgreSQL 14. */
export async function needOriginFunctions(s: SideLacks, functions: readonly string[], why: string): Promise<void> {
  // A role that must be a superuser anyway (session_replication_role before 15) needs no grants besides.
  if (s.superuser || s.lacks.some((l) => l.what === 'superuser')) return;
  if (s.db.versionNum < 140000) {
    needSuperuser(s, `${why}: before PostgreSQL 14 the replication origin functions are a superuser's`);
    return;
  }
  const [r] = await s.db.query<Row>(
    `SELECT pg_catalog.array_to_string(ARRAY(SELECT f FROM pg_catalog.unnest($1::text[]) f WHERE NOT pg_catalog.has_function_privilege(f, 'EXECUTE')), ';') AS missing`,
    [arrayLiteral(functions)],
  );
  const missing = r!.missing ? r!.missing.split(';') : [];
  if (missing.length > 0) s.lacks.push({ what: `EXECUTE on ${missing.join(', ')}`, why, fix: { privileges: 'EXECUTE', kind: 'FUNCTION', object: missing.join(', ') } });
}

/**
 * pgsub's own schema "pgsub" on this server: created at first use (CREATE on the database),
 * or, once there, its tables readable and writable by this role (the role that created
 * them owns them).
 */
export async function needPgsubSchema(s: SideLacks, why: string): Promise<void> {
  const [r] = await s.db.query<Row>(
    `SELECT (n.oid IS NOT NULL)::text AS present, pg_catalog.has_schema_privilege(n.oid, 'USAGE')::text AS usage,
            pg_catalog.array_to_string(ARRAY(SELECT c.relname FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relkind = 'r'
                AND NOT (pg_catalog.has_table_privilege(c.oid, 'SELECT') AND pg_catalog.has_table_privilege(c.oid, 'INSERT')
                     AND pg_catalog.has_table_privilege(c.oid, 'UPDATE') AND pg_catalog.has_table_privilege(c.oid, 'DELETE')) ORDER BY 1), ',') AS unwritable
       FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = 'pgsub'`,
  );
  if (!isTrue(r!.present)) {
    await needCreateOnDatabase(s, `${why}: pgsub creates its schema "pgsub" at first use`);
    return;
  }
  if (!isTrue(r!.usage)) s.lacks.push({ what: 'USAGE on schema pgsub', why, fix: { privileges: 'USAGE', kind: 'SCHEMA', object: 'pgsub' } });
  for (const t of r!.unwritable ? r!.unwritable.split(',') : [])
    s.lacks.push({
      what: `SELECT, INSERT, UPDATE, DELETE on table pgsub.${ident(t)}`,
      why,
      fix: { privileges: 'SELECT, INSERT, UPDATE, DELETE', kind: 'TABLE', object: `pgsub.${ident(t)}` },
    });
}

/**
 * A permission error (42501) reading or setting sequences, as the error to show: which
 * server (side, host:port), which sequences lack what, and the GRANT to run there. Null
 * when the error is something else or no sequence lacks it (then the caller keeps its own).
 */
export async function sequencePermissionError(
  err: unknown,
  db: Db,
  seqs: readonly { schema: string; name: string }[],
  privilege: 'SELECT' | 'UPDATE',
): Promise<PrivilegeError | null> {
  if ((err as { code?: unknown })?.code !== '42501') return null;
  try {
    const s = await sideOf(db);
    const why = privilege === 'SELECT' ? 'the sequence sync reads them' : 'the sequence sync sets them with setval';
    await needOnRelations(
      s,
      'sequence',
      seqs.map((q) => ({ schema: q.schema, table: q.name })),
      why,
      { privileges: privilege === 'SELECT' ? ['SELECT'] : ['SELECT', 'UPDATE'] },
    );
    return privilegeError('sequence sync', [s]);
  } catch {
    return null;
  }
}
