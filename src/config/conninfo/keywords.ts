/**
 * libpq's connection keywords (PostgreSQL 18), each with its environment variable and what
 * pgsub does with it: checked here for a value libpq would accept, or refused by name with
 * the reason when pgsub cannot do what libpq does. Nothing in this list is accepted and
 * then ignored (docs/conninfo.md is the same table in prose). A keyword outside the list
 * is an error, as in libpq, so a misspelt `sslmode` cannot connect without TLS.
 */

export interface Keyword {
  env?: string;
  /** Why the value cannot be used (libpq would refuse it, or pgsub cannot honour it), or null. */
  check?: (value: string, side: 'source' | 'target') => string | null;
  /** Never echoed in an error message. */
  secret?: boolean;
}

const oneOf =
  (values: readonly string[]) =>
  (v: string): string | null =>
    values.includes(v) ? null : `is not one of ${values.join(', ')}`;

const wholeNumber = (v: string): string | null => (/^\s*-?\d+\s*$/.test(v) ? null : 'is not a whole number');

const bool01 = (v: string): string | null => (/^\s*-?\d+\s*$/.test(v) ? null : 'is not 0 or 1');

/** Socket options Node.js has no call for (it sets only SO_KEEPALIVE and TCP_KEEPIDLE). */
const zeroOnly =
  (socketOption: string) =>
  (v: string): string | null =>
    wholeNumber(v) ?? (Number(v) === 0 ? null : `is refused: Node.js cannot set ${socketOption} on a socket; leave it unset or 0 (the system default)`);

export const TLS_VERSIONS = ['TLSv1', 'TLSv1.1', 'TLSv1.2', 'TLSv1.3'] as const;

export const REQUIRE_AUTH_METHODS = ['password', 'md5', 'gss', 'sspi', 'scram-sha-256', 'oauth', 'none'] as const;

/** PostgreSQL 16's require_auth: a list of methods, or of negated ones ("!md5"), never both. */
export function checkRequireAuth(v: string): string | null {
  const items = v.split(',').map((s) => s.trim());
  const negated = items.filter((s) => s.startsWith('!'));
  if (negated.length > 0 && negated.length < items.length) return 'negative require_auth method cannot be mixed with non-negative methods';
  const seen = new Set<string>();
  for (const item of items) {
    const method = item.replace(/^!/, '');
    if (!(REQUIRE_AUTH_METHODS as readonly string[]).includes(method)) return `has invalid method "${item}" (one of ${REQUIRE_AUTH_METHODS.join(', ')}, each optionally with !)`;
    if (seen.has(method)) return `names method "${method}" more than once`;
    seen.add(method);
  }
  if (negated.length > 0 && seen.size === REQUIRE_AUTH_METHODS.length) return 'forbids every method';
  return null;
}

const refused = (reason: string) => (): string => `is refused: ${reason}`;

export const KEYWORDS: Readonly<Record<string, Keyword>> = {
  host: { env: 'PGHOST' },
  hostaddr: { env: 'PGHOSTADDR' },
  port: { env: 'PGPORT' },
  dbname: { env: 'PGDATABASE' },
  user: { env: 'PGUSER' },
  password: { env: 'PGPASSWORD', secret: true },
  passfile: { env: 'PGPASSFILE' },
  require_auth: { env: 'PGREQUIREAUTH', check: checkRequireAuth },
  channel_binding: { env: 'PGCHANNELBINDING', check: oneOf(['disable', 'prefer', 'require']) },
  connect_timeout: { env: 'PGCONNECT_TIMEOUT', check: wholeNumber },
  client_encoding: {
    env: 'PGCLIENTENCODING',
    check: (v) => (/^(utf-?8|unicode)$/i.test(v) ? null : 'is refused: pgsub exchanges all text with the server in UTF8; leave client_encoding unset or UTF8'),
  },
  options: { env: 'PGOPTIONS' },
  application_name: { env: 'PGAPPNAME' },
  fallback_application_name: {},
  keepalives: { check: bool01 },
  keepalives_idle: { check: wholeNumber },
  keepalives_interval: { check: zeroOnly('TCP_KEEPINTVL') },
  keepalives_count: { check: zeroOnly('TCP_KEEPCNT') },
  tcp_user_timeout: { check: zeroOnly('TCP_USER_TIMEOUT') },
  replication: { check: refused('pgsub opens replication connections itself where it needs them (replication=database for the source walsender)') },
  gssencmode: {
    env: 'PGGSSENCMODE',
    check: (v) =>
      oneOf(['disable', 'prefer', 'require'])(v) ??
      (v === 'require' ? 'is refused: pgsub has no GSSAPI; use disable or prefer (no GSSAPI encryption, as a libpq built without it)' : null),
  },
  sslmode: { env: 'PGSSLMODE', check: oneOf(['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full']) },
  sslnegotiation: { env: 'PGSSLNEGOTIATION', check: oneOf(['postgres', 'direct']) },
  sslcompression: { env: 'PGSSLCOMPRESSION', check: (v) => bool01(v) ?? (Number(v) === 0 ? null : 'is refused: Node.js TLS never compresses; leave it 0') },
  sslcert: { env: 'PGSSLCERT' },
  sslkey: {
    env: 'PGSSLKEY',
    check: (v) => (/^[^/][^:]*:/.test(v) ? 'is refused: OpenSSL engine keys (engine:key) cannot be loaded by Node.js; give a key file' : null),
  },
  sslpassword: { secret: true },
  sslkeylogfile: {},
  sslcertmode: {
    env: 'PGSSLCERTMODE',
    check: (v) =>
      oneOf(['disable', 'allow', 'require'])(v) ??
      (v === 'require' ? 'is refused: Node.js does not tell whether the server asked for a client certificate; use allow or disable' : null),
  },
  sslrootcert: { env: 'PGSSLROOTCERT' },
  sslcrl: { env: 'PGSSLCRL' },
  sslcrldir: { env: 'PGSSLCRLDIR' },
  sslsni: { env: 'PGSSLSNI', check: bool01 },
  requirepeer: { env: 'PGREQUIREPEER', check: refused('Node.js cannot read the peer credentials of a Unix-domain socket') },
  ssl_min_protocol_version: { env: 'PGSSLMINPROTOCOLVERSION', check: oneOf(TLS_VERSIONS) },
  ssl_max_protocol_version: { env: 'PGSSLMAXPROTOCOLVERSION', check: oneOf(TLS_VERSIONS) },
  krbsrvname: { env: 'PGKRBSRVNAME', check: refused('pgsub has no Kerberos/GSSAPI authentication') },
  gsslib: { env: 'PGGSSLIB', check: refused('pgsub has no GSSAPI/SSPI authentication') },
  gssdelegation: {
    env: 'PGGSSDELEGATION',
    check: (v) => bool01(v) ?? (Number(v) === 0 ? null : 'is refused: pgsub has no GSSAPI, so it has no credentials to delegate'),
  },
  service: { env: 'PGSERVICE' },
  target_session_attrs: {
    env: 'PGTARGETSESSIONATTRS',
    check: (v, side) =>
      oneOf(['any', 'read-write', 'read-only', 'primary', 'standby', 'prefer-standby'])(v) ??
      (side === 'target' && ['read-only', 'standby', 'prefer-standby'].includes(v) ? 'is refused for the target: pgsub writes into it, so it must be read-write' : null),
  },
  load_balance_hosts: { env: 'PGLOADBALANCEHOSTS', check: oneOf(['disable', 'random']) },
  min_protocol_version: {
    env: 'PGMINPROTOCOLVERSION',
    check: (v) => oneOf(['3.0', '3.2', 'latest'])(v) ?? (v === '3.0' ? null : 'is refused: pgsub speaks protocol 3.0 only'),
  },
  max_protocol_version: {
    env: 'PGMAXPROTOCOLVERSION',
    check: (v) => oneOf(['3.0', '3.2', 'latest'])(v) ?? (v === '3.0' ? null : 'is refused: pgsub speaks protocol 3.0 only; leave it unset or 3.0'),
  },
  scram_client_key: { secret: true, check: refused('SCRAM key pass-through is for postgres_fdw and dblink; give a password instead') },
  scram_server_key: { secret: true, check: refused('SCRAM key pass-through is for postgres_fdw and dblink; give a password instead') },
  oauth_issuer: { check: refused('pgsub has no OAuth device flow') },
  oauth_client_id: { check: refused('pgsub has no OAuth device flow') },
  oauth_client_secret: { secret: true, check: refused('pgsub has no OAuth device flow') },
  oauth_scope: { check: refused('pgsub has no OAuth device flow') },
};
