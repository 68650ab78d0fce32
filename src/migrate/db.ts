/**
 * Sessions of the migration commands (preflight, schema, sequences, cutover). The source
 * gets a plain `pg` session, not a walsender: it takes none of the publisher's wal sender
 * slots, it takes bind parameters, and it works for a role without REPLICATION — which
 * preflight must be able to report rather than fail on. The target gets a postgres.js
 * maintenance session (pgwire/connect.ts), which already sets default_transaction_read_only
 * = off, so these commands also work against an old primary fenced read-only.
 *
 * Every query of src/migrate returns text columns only (the maintenance connection hands
 * booleans and int8 back unparsed, `pg` parses them): SQL casts, callers parse.
 */
import type pg from 'pg';
import { redactSecrets, type ConnInfo } from '../config/conninfo.js';
import { connectPgClient } from '../connect/drivers.js';
import { connectFailure } from '../connect-failure.js';
import { openMaintenance, type Sql } from '../pgwire/connect.js';
import type { Side } from '../errors.js';
import type { ReplicationConnection } from '../protocol/replication.js';
import { listPublishedTables, type PublishedTable } from '../tablesync/catalog.js';

export type Row = Record<string, string | null>;

export interface Db {
  side: Side;
  info: ConnInfo;
  /** server_version_num, e.g. 140011. */
  versionNum: number;
  /** server_version as the server words it, e.g. "14.11". */
  version: string;
  query<T extends Row = Row>(text: string, params?: unknown[]): Promise<T[]>;
  close(): Promise<void>;
}

export const major = (versionNum: number): number => Math.floor(versionNum / 10000);

/** A plain session to the source (or to any server given by `side`) through `pg`. */
export async function openPgDb(info: ConnInfo, applicationName: string, side: Side = 'source'): Promise<Db> {
  return dbFromClient(await openPgClient(info, applicationName, side), info, side);
}

/** A connected `pg` client as a Db; close() ends the client. */
export async function dbFromClient(client: pg.Client, info: ConnInfo, side: Side): Promise<Db> {
  const query = async <T extends Row>(text: string, params?: unknown[]) => (await client.query<T>(text, params as unknown[])).rows;
  const [v] = await query<{ num: string; version: string }>(
    `SELECT pg_catalog.current_setting('server_version_num') AS num, pg_catalog.current_setting('server_version') AS version`,
  );
  return {
    side,
    info,
    versionNum: Number(v!.num),
    version: String(v!.version).split(' ')[0]!,
    query,
    close: async () => {
      await client.end().catch(() => {});
    },
  };
}

/** The raw `pg` client for statements that need the simple protocol (several in one string). */
export async function openPgClient(info: ConnInfo, applicationName: string, side: Side): Promise<pg.Client> {
  return connectPgClient(info, { side, purpose: 'apply', what: 'a connection', applicationName });
}

/** A maintenance session to the target (postgres.js); the first query connects. */
export async function openTargetDb(info: ConnInfo, applicationName: string): Promise<Db> {
  const sql: Sql = openMaintenance(info, applicationName);
  try {
    return await targetDbOver(sql, info, () => sql.end({ timeout: 5 }));
  } catch (err) {
    await sql.end({ timeout: 1 }).catch(() => {});
    throw connectFailure('target', info, err, 'apply', 'a connection');
  }
}

/** A Db over a target session the caller holds; `end` is what close() does (nothing: the session stays the caller's). */
export async function targetDbOver(sql: Sql, info: ConnInfo, end: () => Promise<void> = async () => {}): Promise<Db> {
  const query = <T extends Row>(text: string, params?: unknown[]) => sql.unsafe<T[]>(text, (params ?? []) as never[]) as unknown as Promise<T[]>;
  const [v] = await query<{ num: string; version: string }>(
    `SELECT pg_catalog.current_setting('server_version_num') AS num, pg_catalog.current_setting('server_version') AS version`,
  );
  return {
    side: 'target',
    info,
    versionNum: Number(v!.num),
    version: String(v!.version).split(' ')[0]!,
    query,
    close: async () => {
      await end().catch(() => {});
    },
  };
}

/**
 * The published tables as the table sync sees them (tablesync/catalog.ts), read on a
 * plain session: listPublishedTables only runs simple SQL and reads the version, which a
 * plain session serves as well as a walsender.
 */
export function publishedTables(db: Db, publications: string[]): Promise<PublishedTable[]> {
  const asWalsender = { sql: (text: string) => db.query(text), serverVersionNum: db.versionNum };
  return listPublishedTables(asWalsender as unknown as ReplicationConnection, publications);
}

/** The error's own words for a report line, without any password. */
export function errorText(err: unknown): string {
  const e = err as { message?: string; detail?: string };
  return redactSecrets(`${e?.message ?? String(err)}${e?.detail ? ` (${e.detail})` : ''}`);
}

/** `schema.table` → JSON for json_to_recordset($1::json) AS t(schema text, name text). */
export function relationsParam(tables: readonly { schema: string; table: string }[]): string {
  return JSON.stringify(tables.map((t) => ({ schema: t.schema, name: t.table })));
}

export const isTrue = (v: string | null | undefined): boolean => v === 'true' || v === 't';

/** A text[] literal for a `$n::text[]` parameter, the same for both drivers. */
export function arrayLiteral(values: readonly string[]): string {
  return `{${values.map((v) => `"${v.replace(/(["\\])/g, '\\$1')}"`).join(',')}}`;
}
