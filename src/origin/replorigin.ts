/**
 * The target session's replication origin, as the native apply worker sets one up:
 * every change pgsub applies is tagged with origin `pgsub_<subscription>`, so a
 * publication on the target with `origin = none` does not send those changes back
 * (bidirectional and cascaded set-ups), and the target's pg_replication_origin_status
 * shows the remote commit LSN too. The functions are superuser-only unless granted:
 *   GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text),
 *     pg_replication_origin_session_setup(text), pg_replication_origin_xact_setup(pg_lsn, timestamptz),
 *     pg_replication_origin_oid(text) TO <pgsub role>;
 */
import { OriginLimitError, TargetSetupError } from '../errors.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { formatPgTimestamp } from '../protocol/messages.js';
import type { Statement } from '../pgwire/statement.js';

export function replicationOriginName(subscription: string): string {
  return `pgsub_${subscription}`;
}

export type OriginSetupRunner = (text: string, params: (string | null)[]) => Promise<unknown>;

/** Create the origin if needed and bind it to this session. */
export async function setupSessionOrigin(run: OriginSetupRunner, name: string): Promise<void> {
  try {
    await run('SELECT pg_catalog.pg_replication_origin_create($1) WHERE pg_catalog.pg_replication_origin_oid($1) IS NULL', [name]);
    const setup = originSessionSetupStatement(name);
    await run(setup.text, [name]);
  } catch (err) {
    const e = err as { code?: string; message?: string; hint?: string };
    if (e.code === '53400') {
      // The server's hint names the setting of its version (max_active_replication_origins from 18).
      throw new OriginLimitError(
        `the target has no free replication origin state for origin "${name}" (${e.message}${e.hint ? `; ${e.hint}` : ''}): every one holds another subscription's or pgsub's progress. Raise max_active_replication_origins (PostgreSQL 18; max_replication_slots before) on the target and restart it, or drop what is gone (pgsub drop, DROP SUBSCRIPTION, pg_replication_origin_drop)`,
        { origin: name },
        { cause: err },
      );
    }
    if (e.code === '42501') {
      throw new TargetSetupError(
        `the target role may not use replication origins (${e.message}); pgsub tags applied changes with origin "${name}" like a native subscription. Run pgsub as a superuser or GRANT EXECUTE ON FUNCTION pg_replication_origin_create(text), pg_replication_origin_oid(text), pg_replication_origin_session_setup(text), pg_replication_origin_xact_setup(pg_lsn, timestamptz) TO the pgsub role`,
        { origin: name },
        { cause: err },
      );
    }
    throw err;
  }
}

/** Statement stamping the current target transaction with the remote commit it applies. */
export function originXactSetupStatement(endLsn: Lsn, commitTime: bigint): Statement {
  return {
    text: 'SELECT pg_catalog.pg_replication_origin_xact_setup($1::pg_catalog.pg_lsn, $2::pg_catalog.timestamptz)',
    params: [formatLsn(endLsn), formatPgTimestamp(commitTime)],
  };
}

/** Bind the session to the origin: its commits carry the origin (lanes and parallel workers take it in turn). */
export function originSessionSetupStatement(name: string): Statement {
  return { text: 'SELECT pg_catalog.pg_replication_origin_session_setup($1)', params: [name] };
}

/** Release the session's origin, so that another session of the same origin can take it. */
export function originSessionResetStatement(): Statement {
  return { text: 'SELECT pg_catalog.pg_replication_origin_session_reset()', params: [] };
}
