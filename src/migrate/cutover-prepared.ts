/**
 * Prepared transactions at a cutover. A transaction PREPAREd on the source before the
 * fence is no session the fence can end, and PostgreSQL accepts its COMMIT PREPARED in a
 * read-only session after it: its commit would land past the fence LSN and never reach
 * the target. So after the fence the cutover waits until the source database has none
 * (naming each gid, owner and age while it waits) before it takes the fence LSN, and
 * fails after a bound (the fence is lifted); `--refuse-prepared` refuses before the fence
 * if any exist. With two_phase, pgsub's own prepared transactions on the target (gids
 * `pgsub_<subscription>_<xid>`, apply/handlers/twophase.ts) must be resolved too before
 * the target is declared primary: each holds its rows' locks there.
 */
import type { Db, Row } from './db.js';

export interface PreparedXact {
  gid: string;
  owner: string;
  /** Seconds since PREPARE TRANSACTION. */
  ageSeconds: number;
}

export const describePrepared = (xs: readonly PreparedXact[]): string => xs.map((x) => `gid ${JSON.stringify(x.gid)} owner ${x.owner} age ${x.ageSeconds} s`).join('; ');

/** The prepared transactions of the session's database. */
export async function sourcePrepared(source: Db): Promise<PreparedXact[]> {
  const rows = await source.query<Row>(
    `SELECT gid, owner::text AS owner, floor(extract(epoch FROM pg_catalog.now() - prepared))::text AS age
       FROM pg_catalog.pg_prepared_xacts WHERE database = pg_catalog.current_database() ORDER BY prepared`,
  );
  return rows.map((r) => ({ gid: r.gid!, owner: r.owner!, ageSeconds: Number(r.age) }));
}

/** pgsub's own prepared transactions for `subscription` on the target. */
export async function targetPrepared(target: Db, subscription: string): Promise<PreparedXact[]> {
  const prefix = `pgsub_${subscription}_`;
  const rows = await target.query<Row>(
    `SELECT gid, owner::text AS owner, floor(extract(epoch FROM pg_catalog.now() - prepared))::text AS age
       FROM pg_catalog.pg_prepared_xacts
      WHERE database = pg_catalog.current_database() AND pg_catalog.left(gid, $2) = $1 AND pg_catalog.substr(gid, $2 + 1) ~ '^[0-9]+$'
      ORDER BY prepared`,
    [prefix, prefix.length],
  );
  return rows.map((r) => ({ gid: r.gid!, owner: r.owner!, ageSeconds: Number(r.age) }));
}

export interface WaitOptions {
  timeoutMs: number;
  signal?: AbortSignal;
  /** Called with the list each time it is shown (first, then every few seconds). */
  show: (xs: PreparedXact[]) => void;
  sleep: (ms: number) => Promise<void>;
}

/** Polls `list` until it is empty; returns how many were waited for, or throws naming those left. */
export async function waitNoPrepared(list: () => Promise<PreparedXact[]>, what: string, o: WaitOptions): Promise<number> {
  const deadline = Date.now() + o.timeoutMs;
  const seen = new Set<string>();
  let shownAt = 0;
  for (;;) {
    const xs = await list();
    for (const x of xs) seen.add(x.gid);
    if (xs.length === 0) return seen.size;
    if (o.signal?.aborted) throw new Error(`interrupted while waiting for ${what}: ${describePrepared(xs)}`);
    if (Date.now() > deadline)
      throw new Error(`${xs.length} ${what} still pending after ${o.timeoutMs / 1000} s: ${describePrepared(xs)}: COMMIT PREPARED or ROLLBACK PREPARED them, then cut over again`);
    if (Date.now() - shownAt >= 5000) {
      shownAt = Date.now();
      o.show(xs);
    }
    await o.sleep(100);
  }
}
