import type { Cluster } from './cluster.js';
import { currentWalLsn, slotConfirmedLsn } from './compare.js';

export { pgBinDir, installedMajors, hydrateSymlinks, setBinRoot, SHARED_BIN_ROOT, PgBinariesNotFoundError } from './binaries.js';
export { startCluster, stopAllClusters, DEFAULT_SETTINGS, pickPort } from './cluster.js';
export type { Cluster, ClusterOptions } from './cluster.js';

/** Resolve/reject with `p`, or reject with a descriptive error after `ms` milliseconds. */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export interface WaitForOptions {
  /** Default 10000. */
  timeoutMs?: number;
  /** Default 50. */
  intervalMs?: number;
  /** Description used in the timeout error. */
  what?: string;
}

/**
 * Poll `cond` until it returns true. Errors thrown by `cond` count as "not yet"; the last
 * one is included in the timeout error.
 */
export async function waitFor(cond: () => Promise<boolean> | boolean, { timeoutMs = 10_000, intervalMs = 50, what = 'condition' }: WaitForOptions = {}): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  let attempts = 0;
  for (;;) {
    attempts++;
    try {
      if (await cond()) return;
      lastErr = undefined;
    } catch (err) {
      lastErr = err;
    }
    if (Date.now() >= deadline) {
      const detail = lastErr === undefined ? '' : `; last error: ${lastErr instanceof Error ? lastErr.message : String(lastErr)}`;
      throw new Error(`timed out after ${timeoutMs} ms (${attempts} checks) waiting for ${what}${detail}`);
    }
    await new Promise((r) => setTimeout(r, Math.min(intervalMs, Math.max(0, deadline - Date.now()))));
  }
}

/**
 * Wait until `slot` has confirmed the publisher's WAL position as of now in `database`:
 * the subscriber applied (and its target committed) everything written before the call.
 */
export async function waitForCatchUp(publisher: Cluster, database: string, slot: string, timeoutMs = 60_000): Promise<void> {
  const end = await currentWalLsn(publisher, database);
  await waitFor(async () => ((await slotConfirmedLsn(publisher, slot)) ?? 0n) >= end, { timeoutMs, intervalMs: 100, what: `slot ${slot} to catch up` });
}

export { tableChecksum, compareTables, currentWalLsn, slotConfirmedLsn, lsnToBigint, connect } from './compare.js';
export type { TableChecksum } from './compare.js';
export { spawnPgsub, PGSUB_BIN } from './pgsub-process.js';
export type { PgsubProcess } from './pgsub-process.js';
export { startProxy } from './proxy.js';
export type { Proxy } from './proxy.js';
export { LEDGER_SCHEMA, LEDGER_TABLES, prng, runLedgerWorkload, checkLedger } from './workload.js';
export type { LedgerWorkload } from './workload.js';
