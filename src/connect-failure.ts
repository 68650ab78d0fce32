/**
 * What a failed connection (or the first statements on it) means for the operator, decided
 * here once for every command: a TLS or certificate check (PGSUB_TLS_FAILED), the login
 * (PGSUB_AUTH_FAILED: a password 28P01, a pg_hba.conf line 28000, require_auth,
 * channel_binding), a setting that cannot work (PGSUB_CONFIG_INVALID), a missing
 * privilege (42501) — all exit 2 at startup, naming the side and what to change — or, for
 * anything else (refused, reset, timed out, the server starting up), a ConnectionLostError
 * to retry.
 * Messages carry the redacted conninfo only, never a password.
 */
import { redactConninfo, redactSecrets, type ConnInfo } from './config/conninfo.js';
import { HandshakeFailure } from './connect/failure.js';
import { AuthenticationError, ConfigError, ConnectionLostError, PgsubError, PrivilegeError, type Side, TlsError } from './errors.js';

/** What was being opened: the walsender, an apply session (session_replication_role), or pgsub's schema. */
export type ConnectionPurpose = 'replication' | 'apply' | 'schema';

/**
 * The SQLSTATE of a server error from either driver (pg's DatabaseError, postgres.js's
 * PostgresError), also when wrapped (drizzle's migrator reports "Failed query" with the
 * server's error as its cause).
 */
export function sqlstateOf(err: unknown): string | null {
  for (let e = err as { code?: unknown; cause?: unknown } | null, depth = 0; e && depth < 5; e = e.cause as typeof e, depth++) {
    if (typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
  }
  return null;
}

/** The message of the error that carries the SQLSTATE (the server's own words). */
function serverMessage(err: unknown): string {
  for (let e = err as { code?: unknown; cause?: unknown; message?: unknown } | null, depth = 0; e && depth < 5; e = e.cause as typeof e, depth++) {
    if (typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return String(e.message);
  }
  return String((err as Error)?.message ?? err);
}

/** The typed refusal for a server error, or null when it is none of those (retry it as it is). */
export function refusal(side: Side, info: ConnInfo, err: unknown, purpose: ConnectionPurpose): PgsubError | null {
  const code = sqlstateOf(err);
  const detail = redactSecrets(serverMessage(err));
  const where = redactConninfo(info);
  const context = { [side]: where, sqlstate: code ?? undefined };
  const options = { cause: err };
  const server = side === 'source' ? 'publisher' : 'target server';
  if (err instanceof PgsubError) return err;
  if (err instanceof HandshakeFailure) {
    const message = `${side}: ${detail} (${where})`;
    if (err.kind === 'tls')
      return new TlsError(
        side,
        `${message}: fix the TLS settings of the ${side} conninfo (sslmode, sslrootcert, sslcert/sslkey, sslcrl) or the ${server}'s certificate`,
        context,
        options,
      );
    if (err.kind === 'auth')
      return new AuthenticationError(side, `${message}: fix the ${side} conninfo's password, require_auth or channel_binding, or the ${server}'s pg_hba.conf`, context, options);
    if (err.kind === 'config') return new ConfigError(message, { ...context, key: side }, options);
    return null;
  }
  // The server itself refuses a connection without the client certificate its pg_hba.conf line asks for.
  if (code === '28000' && /certificate/i.test(detail)) {
    return new TlsError(
      side,
      `${side}: the ${server} refused the connection (${detail}; ${where}): give a client certificate it accepts (sslcert, sslkey in the ${side} conninfo, or ~/.postgresql/postgresql.crt and .key)`,
      context,
      options,
    );
  }
  // pg throws this one itself when the server asks for a password and none was given.
  if (code === '28P01' || (code === null && /client password must be a string/.test(detail))) {
    const what = code === null ? 'the server asks for a password and none is given' : detail;
    return new AuthenticationError(
      side,
      `${side}: password authentication failed (${what}; ${where}): fix the password of user "${info.user}" in the ${side} conninfo, PGPASSWORD or the password file`,
      context,
      options,
    );
  }
  if (code === '28000') {
    const fix = /does not exist/.test(detail)
      ? `fix the user in the ${side} conninfo, or create role "${info.user}" on the ${server}`
      : `add a line to the ${server}'s pg_hba.conf that lets user "${info.user}" connect to database "${info.database}" from this host${side === 'source' ? ' (the streaming connection matches the database name, not "replication")' : ''}, and reload it`;
    return new AuthenticationError(side, `${side}: the ${server} refused the connection (${detail}; ${where}): ${fix}`, context, options);
  }
  if (code === '42501') {
    if (purpose === 'replication') {
      return new PrivilegeError(
        side,
        `source: role "${info.user}" may not open a replication connection (${detail}): ALTER ROLE ${quoteRole(info.user)} REPLICATION on the publisher, or connect as a role that has REPLICATION`,
        context,
        options,
      );
    }
    if (purpose === 'apply' && /session_replication_role/.test(detail)) {
      return new PrivilegeError(
        side,
        `target: role "${info.user}" may not set session_replication_role, which pgsub's apply sessions set to replica (${detail}): make it a superuser, or on PostgreSQL 15+ GRANT SET ON PARAMETER session_replication_role TO ${quoteRole(info.user)}`,
        context,
        options,
      );
    }
    if (purpose === 'schema') {
      return new PrivilegeError(
        side,
        `target: role "${info.user}" cannot create or use pgsub's schema "pgsub" in database "${info.database}" (${detail}): GRANT CREATE ON DATABASE ${quoteRole(info.database)} TO ${quoteRole(info.user)} so pgsub can create it at its first start, or make that role the owner of an existing schema pgsub and its tables`,
        context,
        options,
      );
    }
    return new PrivilegeError(side, `${side}: permission denied for role "${info.user}" (${detail}; ${where})`, context, options);
  }
  return null;
}

/** A failed connect as the caller should throw it: a refusal, else a lost connection to retry. */
export function connectFailure(side: Side, info: ConnInfo, err: unknown, purpose: ConnectionPurpose, what: string): PgsubError {
  return (
    refusal(side, info, err, purpose) ??
    new ConnectionLostError(
      redactSecrets(`cannot open ${what} to ${redactConninfo(info)}: ${(err as Error)?.message ?? String(err)}`),
      { [side]: redactConninfo(info) },
      { cause: err },
    )
  );
}

function quoteRole(name: string): string {
  return /^[a-z_][a-z0-9_$]*$/.test(name) ? name : `"${name.replace(/"/g, '""')}"`;
}
