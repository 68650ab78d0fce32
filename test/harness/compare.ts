/**
 * Comparing source and target, shared by tests, the demo and benchmarks: an
 * order-independent checksum per table (row count + md5 over the sorted md5s of each
 * row's text form), and waiting until a subscriber has caught up with the publisher.
 */
import pg from 'pg';
import type { Cluster } from './cluster.js';

export interface TableChecksum {
  table: string;
  rows: number;
  md5: string | null;
}

/**
 * `table` is a quoted, schema-qualified name, e.g. '"shop"."orders"'. The whole-row alias
 * must not be a plausible column name: a column of that name would be hashed instead.
 */
export async function tableChecksum(cluster: Cluster, database: string, table: string, columns = '*'): Promise<TableChecksum> {
  const [row] = await cluster.query<{ rows: string; md5: string | null }>(
    `SELECT count(*) AS rows, md5(string_agg(h, '' ORDER BY h)) AS md5
       FROM (SELECT md5(${columns === '*' ? 'pgsub_compared_row' : `ROW(${columns})`}::text) AS h FROM ${table} AS pgsub_compared_row) s`,
    [],
    database,
  );
  return { table, rows: Number(row?.rows ?? 0), md5: row?.md5 ?? null };
}

export async function compareTables(
  source: Cluster,
  sourceDb: string,
  target: Cluster,
  targetDb: string,
  tables: string[],
): Promise<{ equal: boolean; source: TableChecksum[]; target: TableChecksum[] }> {
  const s = await Promise.all(tables.map((t) => tableChecksum(source, sourceDb, t)));
  const d = await Promise.all(tables.map((t) => tableChecksum(target, targetDb, t)));
  const equal = s.every((x, i) => x.rows === d[i]!.rows && x.md5 === d[i]!.md5);
  return { equal, source: s, target: d };
}

/** The publisher's current WAL position, as a bigint. */
export async function currentWalLsn(cluster: Cluster, database = 'postgres'): Promise<bigint> {
  const [row] = await cluster.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn', [], database);
  return lsnToBigint(row!.lsn);
}

export async function slotConfirmedLsn(cluster: Cluster, slot: string): Promise<bigint | null> {
  const [row] = await cluster.query<{ lsn: string | null }>('SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = $1', [slot]);
  return row?.lsn ? lsnToBigint(row.lsn) : null;
}

export function lsnToBigint(text: string): bigint {
  const [hi, lo] = text.split('/');
  return (BigInt(`0x${hi}`) << 32n) | BigInt(`0x${lo}`);
}

/** Run SQL on a long-lived client (for workloads); the caller ends it. */
export async function connect(cluster: Cluster, database: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: cluster.url(database) });
  await client.connect();
  return client;
}
