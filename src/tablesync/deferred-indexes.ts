/**
 * Indexes built after the copy (`defer_indexes`). Loading rows into a table with a
 * primary key inserts every key into a btree one at a time — on PostgreSQL 18 that is more
 * than half of the target's work for a narrow table (docs/design-measurements.md) — and ranges copied in
 * parallel insert into the middle of the tree, splitting pages half-full. So when a table
 * is empty at the start of its copy, the copy's first transaction drops the indexes it can
 * safely drop and records their definitions in pgsub.deferred_index; the transaction that
 * marks the copy finished recreates them (one sorted build each) and deletes the record.
 * A crash in between leaves the table in datasync with the record, and whoever touches the
 * table next restores them: the next copy of it, `pgsub drop`, or the refresh that finds
 * the table gone from the publication.
 *
 * Dropped: plain indexes and PRIMARY KEY / UNIQUE constraints of a plain table (or a
 * partition's own ones). Kept, because dropping them would lose something their
 * definition does not say: an index anything else depends on (a foreign key of another
 * table, a partitioned parent index; a constraint's internal parts — its index, the
 * triggers of a deferrable one — come back with it), exclusion constraints, the replica-identity or
 * clustered index, one with a comment, a tablespace of its own or a statistics target,
 * inherited constraints, invalid or unfinished indexes. Names stay the same.
 */
import type { Sql } from '../pgwire/connect.js';
import { quoteIdent, quoteQualified } from '../quote.js';

/** maintenance_work_mem for the rebuild, when the target's setting is lower. */
const INDEX_BUILD_MEMORY_MB = 256;

/** A query on the target in the caller's transaction (pg.Client or postgres.js). */
export type Run = (text: string, params?: unknown[]) => Promise<Record<string, unknown>[]>;

/** Run for a postgres.js connection or transaction. */
export const runOnSql =
  (sql: Pick<Sql, 'unsafe'>): Run =>
  async (text, params) =>
    (await sql.unsafe(text, (params ?? []) as never[])) as unknown as Record<string, unknown>[];

interface Candidate {
  index_name: string;
  definition: string;
  /** The PRIMARY KEY / UNIQUE constraint the index backs, if any. */
  constraint_name: string | null;
}

/**
 * Drop what can be rebuilt later and record it, in the caller's transaction; the table
 * must be empty. Returns the names dropped now (earlier, still-recorded ones stay recorded).
 */
export async function deferIndexes(run: Run, subscription: string, schema: string, table: string): Promise<string[]> {
  const rows = (await run(
    `SELECT ic.relname::text AS index_name, k.conname::text AS constraint_name,
            CASE WHEN k.oid IS NOT NULL
                 THEN 'ALTER TABLE ONLY ' || pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
                      || ' ADD CONSTRAINT ' || pg_catalog.quote_ident(k.conname) || ' ' || pg_catalog.pg_get_constraintdef(k.oid)
                 ELSE pg_catalog.pg_get_indexdef(i.indexrelid) END AS definition
       FROM pg_catalog.pg_index i
       JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
       JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
       LEFT JOIN pg_catalog.pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid AND k.contype IN ('p', 'u', 'x')
      WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'r'
        AND i.indisvalid AND i.indisready AND i.indislive AND NOT i.indisreplident AND NOT i.indisclustered
        AND ic.reltablespace = 0
        AND (k.oid IS NULL OR (k.contype IN ('p', 'u') AND k.conislocal AND k.coninhcount = 0 AND k.conparentid = 0))
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits h WHERE h.inhrelid = i.indexrelid)
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                         WHERE (d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = i.indexrelid
                                AND NOT (d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid = k.oid))
                            OR (d.refclassid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.refobjid = k.oid AND d.deptype <> 'i'))
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_description ds
                         WHERE (ds.classoid = 'pg_catalog.pg_class'::pg_catalog.regclass AND ds.objoid = i.indexrelid)
                            OR (ds.classoid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND ds.objoid = k.oid))
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget >= 0)
      ORDER BY i.indexrelid`,
    [schema, table],
  )) as unknown as Candidate[];
  if (rows.length === 0) return [];
  const [next] = await run(`SELECT COALESCE(max("ord"), 0)::int AS ord FROM "pgsub"."deferred_index" WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`, [
    subscription,
    schema,
    table,
  ]);
  let ord = Number(next?.ord ?? 0);
  for (const r of rows) {
    await run(`INSERT INTO "pgsub"."deferred_index" ("subscription", "schema_name", "table_name", "ord", "index_name", "definition") VALUES ($1, $2, $3, $4, $5, $6)`, [
      subscription,
      schema,
      table,
      ++ord,
      r.index_name,
      r.definition,
    ]);
    await run(
      r.constraint_name !== null
        ? `ALTER TABLE ONLY ${quoteQualified(schema, table)} DROP CONSTRAINT ${quoteIdent(r.constraint_name)}`
        : `DROP INDEX ${quoteQualified(schema, r.index_name)}`,
    );
  }
  return rows.map((r) => r.index_name);
}

/**
 * Recreate what deferIndexes recorded for the table and forget the record, in the
 * caller's transaction. One whose name is taken meanwhile (someone created it) is skipped.
 * Returns the names rebuilt.
 */
export async function restoreIndexes(run: Run, subscription: string, schema: string, table: string): Promise<string[]> {
  const rows = await run(
    `SELECT "index_name", "definition", pg_catalog.to_regclass(pg_catalog.format('%I.%I', "schema_name", "index_name")) IS NOT NULL AS taken
       FROM "pgsub"."deferred_index" WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3 ORDER BY "ord"`,
    [subscription, schema, table],
  );
  const built: string[] = [];
  if (rows.some((r) => r.taken !== true)) {
    // Sorting in memory instead of on disk: 2,000,000 int8 keys took 0.9 s with the
    // default 64MB, 0.65 s with 256MB (PG18). Only for this transaction, never lowered.
    await run(
      `SELECT pg_catalog.set_config('maintenance_work_mem', '${INDEX_BUILD_MEMORY_MB}MB', true)
        WHERE pg_catalog.pg_size_bytes(pg_catalog.current_setting('maintenance_work_mem')) < ${INDEX_BUILD_MEMORY_MB} * 1024 * 1024`,
    );
    // One backend builds, not a parallel build, unless the target was configured for one:
    // parallel workers each sort into temporary files the leader then merges, and other
    // tables' copies run beside the build anyway (docs/design-measurements.md).
    await run(
      `SELECT pg_catalog.set_config('max_parallel_maintenance_workers', '0', true)
         FROM pg_catalog.pg_settings WHERE name = 'max_parallel_maintenance_workers' AND source = 'default'`,
    );
  }
  for (const r of rows) {
    if (r.taken === true) continue;
    await run(String(r.definition));
    built.push(String(r.index_name));
  }
  if (rows.length > 0) await run(`DELETE FROM "pgsub"."deferred_index" WHERE "subscription" = $1 AND "schema_name" = $2 AND "table_name" = $3`, [subscription, schema, table]);
  return built;
}

/** Tables of the subscription with a record (a copy cut short). */
export async function tablesWithDeferredIndexes(run: Run, subscription: string): Promise<{ schema: string; table: string }[]> {
  const rows = await run(`SELECT DISTINCT "schema_name", "table_name" FROM "pgsub"."deferred_index" WHERE "subscription" = $1`, [subscription]);
  return rows.map((r) => ({ schema: String(r.schema_name), table: String(r.table_name) }));
}
