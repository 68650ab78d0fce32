/**
 * The ledger workload used by fault tests: each source transaction inserts one ledger
 * row (a table with no unique constraint, so a transaction applied twice shows as an
 * extra row), moves an account balance (UPDATE), and sometimes adds or deletes a tag
 * (INSERT/DELETE on a composite key). Deterministic per seed and client.
 */
import type pg from 'pg';
import type { Cluster } from './cluster.js';
import { compareTables, connect } from './compare.js';

export const LEDGER_SCHEMA = `
  CREATE SCHEMA app;
  CREATE TABLE app.ledger (client int NOT NULL, seq int NOT NULL, amount int NOT NULL, note text);
  CREATE TABLE app.accounts (id int PRIMARY KEY, balance bigint NOT NULL, touched int NOT NULL DEFAULT 0);
  CREATE TABLE app.tags (client int, seq int, tag text, PRIMARY KEY (client, seq));
  INSERT INTO app.accounts SELECT g, 0 FROM generate_series(1, 100) g;
`;
export const LEDGER_TABLES = ['app.ledger', 'app.accounts', 'app.tags'];

export function prng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 0x1_0000_0000;
  };
}

export interface LedgerWorkload {
  clients: number;
  transactionsPerClient: number;
  seed: number;
  /** Pause between transactions, to stretch a workload over time. */
  pauseMs?: number;
  /** Number of the first client; runs on the same tables need disjoint client ranges. */
  firstClient?: number;
}

export async function runLedgerWorkload(publisher: Cluster, database: string, w: LedgerWorkload): Promise<void> {
  await Promise.all(Array.from({ length: w.clients }, (_, i) => runLedgerClient(publisher, database, w, (w.firstClient ?? 0) + i)));
}

async function runLedgerClient(publisher: Cluster, database: string, w: LedgerWorkload, client: number): Promise<void> {
  const rand = prng(w.seed * 31 + client);
  const db: pg.Client = await connect(publisher, database);
  try {
    for (let seq = 0; seq < w.transactionsPerClient; seq++) {
      const account = 1 + Math.floor(rand() * 100);
      const amount = 1 + Math.floor(rand() * 1000);
      await db.query('BEGIN');
      await db.query('INSERT INTO app.ledger VALUES ($1, $2, $3, $4)', [client, seq, amount, `payment ${client}/${seq}`]);
      await db.query('UPDATE app.accounts SET balance = balance + $2, touched = touched + 1 WHERE id = $1', [account, amount]);
      if (seq % 4 === 0) await db.query('INSERT INTO app.tags VALUES ($1, $2, $3)', [client, seq, `t${seq}`]);
      if (seq % 12 === 8) await db.query('DELETE FROM app.tags WHERE client = $1 AND seq = $2', [client, seq - 8]);
      await db.query('COMMIT');
      if (w.pauseMs) await new Promise((r) => setTimeout(r, w.pauseMs));
    }
  } finally {
    await db.end();
  }
}

/** Exactly-once check: ledger rows neither lost nor duplicated, every table equal. */
export async function checkLedger(
  publisher: Cluster,
  sourceDb: string,
  target: Cluster,
  targetDb: string,
): Promise<{ sourceRows: number; targetRows: number; duplicates: unknown[]; equal: boolean }> {
  const [src] = await publisher.query(`SELECT count(*)::int AS n FROM app.ledger`, [], sourceDb);
  const [dst] = await target.query(`SELECT count(*)::int AS n FROM app.ledger`, [], targetDb);
  const duplicates = await target.query(`SELECT client, seq, count(*)::int AS n FROM app.ledger GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 5`, [], targetDb);
  const cmp = await compareTables(publisher, sourceDb, target, targetDb, LEDGER_TABLES);
  return { sourceRows: src.n, targetRows: dst.n, duplicates, equal: cmp.equal };
}
