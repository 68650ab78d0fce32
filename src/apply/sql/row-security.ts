/**
 * Row-level security on the target tables, refused as the native apply worker refuses it
 * (worker.c's TargetPrivilegesCheck: "user … cannot replicate into relation with row-level
 * security enabled"). A policy that hides a row from pgsub's role makes a replicated UPDATE
 * or DELETE find nothing — it would count as update_missing / delete_missing while the
 * source's change is lost — and the initial copy's emptiness check see an empty table. So a
 * table whose row-level security applies to the applying role (row_security_active: RLS
 * enabled, and the role neither superuser nor BYPASSRLS nor, without FORCE ROW LEVEL
 * SECURITY, its owner) is a RowSecurityError naming the table, its policies and the fix:
 * at startup (service/preflight.ts, exit 2), whenever a Relation message is mapped
 * (relmap.ts, retried with backoff), before a table's copy (tablesync/job.ts), and as a
 * blocker of `pgsub preflight`. The apply connections also run with row_security = off
 * (pgwire/connect.ts): a policy created while a relation's mapping is cached makes the
 * statement fail instead of filtering rows.
 */
import { RowSecurityError } from '../../errors.js';
import { quoteIdent, quoteQualified } from '../../quote.js';

/** A target table whose row-level security applies to the current role (text columns, as every driver returns them). */
export interface RowSecurityRow extends Record<string, string | null> {
  schema: string;
  table: string;
  role: string;
  /** 'true' when the role owns the table (or is a member of its owner): only FORCE makes the policies apply then. */
  owns: string;
  forced: string;
  /** The policies' names, comma-separated; null when there is none (every row hidden). */
  policies: string | null;
}

export const ROW_SECURITY_COLUMNS = ['schema', 'table', 'role', 'owns', 'forced', 'policies'] as const;

/** $1: JSON array of {schema, name} (migrate/db.ts relationsParam); one row per table whose row-level security applies to the current role. */
export const ROW_SECURITY_SQL = `SELECT n.nspname::text AS schema, c.relname::text AS "table", current_user::text AS role,
        pg_catalog.pg_has_role(c.relowner, 'USAGE')::text AS owns, c.relforcerowsecurity::text AS forced,
        (SELECT pg_catalog.string_agg(p.polname::text, ', ' ORDER BY p.polname) FROM pg_catalog.pg_policy p WHERE p.polrelid = c.oid) AS policies
   FROM pg_catalog.json_to_recordset($1::pg_catalog.json) AS t(schema text, name text)
   JOIN pg_catalog.pg_namespace n ON n.nspname = t.schema
   JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.name
  WHERE c.relkind IN ('r', 'p') AND c.relrowsecurity AND pg_catalog.row_security_active(c.oid)
  ORDER BY 1, 2`;

/** The statement that ends the refusal, on the target. */
export function rowSecurityFix(r: RowSecurityRow): string {
  const table = quoteQualified(r.schema, r.table);
  if (r.owns === 'true') return `ALTER TABLE ${table} NO FORCE ROW LEVEL SECURITY;  -- or DISABLE ROW LEVEL SECURITY`;
  return `ALTER ROLE ${quoteIdent(r.role)} BYPASSRLS;  -- as a superuser; or ALTER TABLE ${table} DISABLE ROW LEVEL SECURITY`;
}

/** Why the policies apply to the role, and which they are. */
export function rowSecurityReason(r: RowSecurityRow): string {
  const policies = r.policies === null ? 'no policy, so every row is hidden' : `${r.policies.includes(',') ? 'policies' : 'policy'} ${r.policies}`;
  const why = r.owns === 'true' ? `FORCE ROW LEVEL SECURITY applies them to its owner "${r.role}"` : `"${r.role}" neither owns it nor has BYPASSRLS`;
  return `${policies}; ${why}`;
}

export function rowSecurityError(r: RowSecurityRow, context: Record<string, unknown> = {}): RowSecurityError {
  return new RowSecurityError(
    `user "${r.role}" cannot replicate into relation with row-level security enabled: "${r.schema}.${r.table}" (${rowSecurityReason(r)}): an UPDATE or DELETE would miss the rows the policies hide and lose the change. On the target: ${rowSecurityFix(r)}`,
    { ...context, table: `${r.schema}.${r.table}`, policies: r.policies ?? '', role: r.role },
  );
}

/** The $1 of ROW_SECURITY_SQL. */
export function tablesParam(tables: readonly { schema: string; table: string }[]): string {
  return JSON.stringify(tables.map((t) => ({ schema: t.schema, name: t.table })));
}
