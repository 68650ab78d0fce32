/**
 * Connection strings as libpq users write them — `postgresql://` URIs or `key=value`
 * conninfo — normalised into one explicit shape that both drivers (`pg` for the
 * replication connection, `postgres` for the apply connection) are given field by field.
 * Neither driver implements libpq's sslmode semantics, so TLS options are decided here.
 * `redactConninfo` is the only form of a conninfo that may reach a log line.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ConnectionOptions as TlsOptions } from 'node:tls';
import type pg from 'pg';
import { ConfigError } from '../errors.js';

export type SslMode = 'disable' | 'allow' | 'prefer' | 'require' | 'verify-ca' | 'verify-full';

export interface ConnInfo {
  host: string;
  port: number;
  database: string;
  user: string;
  password?: string;
  sslmode: SslMode;
  sslrootcert?: string;
  applicationName?: string;
  connectTimeoutSeconds?: number;
}

const SSL_MODES: readonly SslMode[] = ['disable', 'allow', 'prefer', 'require', 'verify-ca', 'verify-full'];

/** libpq's connection keywords (PostgreSQL 18). Like libpq, any other key is an error, so a
 *  misspelt `sslmode` cannot silently connect without TLS. Keys outside ConnInfo are ignored. */
const LIBPQ_KEYWORDS = new Set([
  'host',
  'hostaddr',
  'port',
  'dbname',
  'user',
  'password',
  'passfile',
  'require_auth',
  'channel_binding',
  'connect_timeout',
  'client_encoding',
  'options',
  'application_name',
  'fallback_application_name',
  'keepalives',
  'keepalives_idle',
  'keepalives_interval',
  'keepalives_count',
  'tcp_user_timeout',
  'replication',
  'gssencmode',
  'sslmode',
  'sslnegotiation',
  'sslcompression',
  'sslcert',
  'sslkey',
  'sslpassword',
  'sslcertmode',
  'sslrootcert',
  'sslcrl',
  'sslcrldir',
  'sslsni',
  'requirepeer',
  'ssl_min_protocol_version',
  'ssl_max_protocol_version',
  'krbsrvname',
  'gsslib',
  'gssdelegation',
  'service',
  'target_session_attrs',
  'load_balance_hosts',
  'min_protocol_version',
  'max_protocol_version',
  'scram_client_key',
  'scram_server_key',
  'oauth_issuer',
  'oauth_client_id',
  'oauth_client_secret',
  'oauth_scope',
]);

/** Parse a URI or key=value conninfo; libpq environment variables fill what it omits. */
export function parseConninfo(text: string, what: string, env: NodeJS.ProcessEnv = process.env): ConnInfo {
  const raw = /^postgres(ql)?:\/\//i.test(text.trim()) ? parseUri(text.trim(), what) : parseKeyValue(text, what);
  for (const key of Object.keys(raw)) {
    if (!LIBPQ_KEYWORDS.has(key)) throw new ConfigError(`${what}: invalid connection option ${JSON.stringify(key)}`, { key: what, option: key });
  }
  const get = (key: string, envKey: string) => raw[key] ?? env[envKey];
  const host = get('host', 'PGHOST') ?? 'localhost';
  const portText = get('port', 'PGPORT') ?? '5432';
  const port = Number(portText);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new ConfigError(`${what}: port ${JSON.stringify(portText)} is not a TCP port`, { key: what });
  }
  const user = get('user', 'PGUSER') ?? env.USER ?? 'postgres';
  const sslmode = (get('sslmode', 'PGSSLMODE') ?? 'prefer') as SslMode;
  if (!SSL_MODES.includes(sslmode)) {
    throw new ConfigError(`${what}: sslmode ${JSON.stringify(sslmode)} is not one of ${SSL_MODES.join(', ')}`, { key: what });
  }
  const info: ConnInfo = { host, port, user, database: get('dbname', 'PGDATABASE') ?? user, sslmode };
  const password = get('password', 'PGPASSWORD');
  if (password !== undefined) info.password = credentialPassword(password, what, env);
  const rootCert = get('sslrootcert', 'PGSSLROOTCERT');
  if (rootCert !== undefined) info.sslrootcert = rootCert;
  const app = get('application_name', 'PGAPPNAME');
  if (app !== undefined) info.applicationName = app;
  const timeout = get('connect_timeout', 'PGCONNECT_TIMEOUT');
  if (timeout !== undefined) {
    const secondsValue = Number(timeout);
    if (timeout.trim() === '' || !Number.isInteger(secondsValue) || secondsValue < 0) {
      throw new ConfigError(`${what}: connect_timeout ${JSON.stringify(timeout)} is not a whole number of seconds`, { key: what });
    }
    info.connectTimeoutSeconds = secondsValue;
  }
  return info;
}

/**
 * `password=credential:NAME` reads the password from systemd's credential NAME
 * ($CREDENTIALS_DIRECTORY/NAME, LoadCredential= in the unit): readable only by the
 * service, never in the environment or the config file. A trailing newline is dropped.
 */
function credentialPassword(value: string, what: string, env: NodeJS.ProcessEnv): string {
  if (!value.startsWith('credential:')) return value;
  const name = value.slice('credential:'.length);
  const dir = env.CREDENTIALS_DIRECTORY;
  if (!/^[A-Za-z0-9_.@-]+$/.test(name)) throw new ConfigError(`${what}: credential name ${JSON.stringify(name)} is not a file name`, { key: what });
  if (!dir) throw new ConfigError(`${what}: password names credential ${name}, but $CREDENTIALS_DIRECTORY is not set (LoadCredential=${name}:… in the unit)`, { key: what });
  try {
    return fs.readFileSync(path.join(dir, name), 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    throw new ConfigError(`${what}: cannot read credential ${name} from $CREDENTIALS_DIRECTORY: ${(err as Error).message}`, { key: what });
  }
}

function parseUri(text: string, what: string): Record<string, string> {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new ConfigError(`${what}: not a valid postgresql:// URI`, { key: what });
  }
  const out: Record<string, string> = {};
  if (url.hostname) out.host = decodeURIComponent(url.hostname.replace(/^\[|\]$/g, ''));
  if (url.port) out.port = url.port;
  if (url.username) out.user = decodeURIComponent(url.username);
  if (url.password) out.password = decodeURIComponent(url.password);
  const db = decodeURIComponent(url.pathname.replace(/^\//, ''));
  if (db) out.dbname = db;
  // Not url.searchParams: that is form decoding, which turns '+' into a space; libpq
  // only percent-decodes.
  for (const pair of url.search.replace(/^\?/, '').split('&')) {
    if (!pair) continue;
    const eq = pair.indexOf('=');
    if (eq < 0) throw new ConfigError(`${what}: URI query parameter ${JSON.stringify(pair)} has no value`, { key: what });
    try {
      out[decodeURIComponent(pair.slice(0, eq))] = decodeURIComponent(pair.slice(eq + 1));
    } catch {
      throw new ConfigError(`${what}: bad percent-encoding in the URI query`, { key: what });
    }
  }
  return out;
}

/** libpq's key=value form: values may be single-quoted with \' and \\ escapes. */
function parseKeyValue(text: string, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  const skipSpace = () => {
    while (i < text.length && /\s/.test(text[i]!)) i++;
  };
  while (true) {
    skipSpace();
    if (i >= text.length) break;
    const keyStart = i;
    while (i < text.length && /[A-Za-z0-9_]/.test(text[i]!)) i++;
    const key = text.slice(keyStart, i);
    skipSpace();
    if (!key || text[i] !== '=') {
      throw new ConfigError(`${what}: expected key=value at character ${keyStart + 1}`, { key: what });
    }
    i++;
    skipSpace();
    let value = '';
    if (text[i] === "'") {
      i++;
      while (i < text.length && text[i] !== "'") {
        if (text[i] === '\\' && i + 1 < text.length) i++;
        value += text[i++];
      }
      if (text[i] !== "'") throw new ConfigError(`${what}: unterminated quoted value for ${key}`, { key: what });
      i++;
    } else {
      while (i < text.length && !/\s/.test(text[i]!)) {
        if (text[i] === '\\' && i + 1 < text.length) i++;
        value += text[i++];
      }
    }
    out[key] = value;
  }
  return out;
}

/** A conninfo fit for logs: everything but the password. */
export function redactConninfo(info: ConnInfo): string {
  return `host=${info.host} port=${info.port} dbname=${info.database} user=${info.user} sslmode=${info.sslmode}`;
}

/** Remove a password from free text (error messages echo conninfo strings sometimes). */
export function redactSecrets(text: string): string {
  return (
    text
      // Up to the last '@' of the authority: a password may hold a raw '@' (URL parsing accepts it).
      .replace(/(postgres(?:ql)?:\/\/[^:/@\s]*:)[^/?#\s]*@/gi, '$1****@')
      .replace(/(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)/gi, '$1****')
  );
}

/** TLS options for sslmode, identical for both drivers (libpq semantics). */
export function tlsOptions(info: ConnInfo): TlsOptions | false {
  switch (info.sslmode) {
    case 'disable':
    case 'allow':
    case 'prefer':
      // Neither driver can fall back from TLS to plain; these modes connect without TLS.
      return false;
    case 'require':
      return { rejectUnauthorized: false };
    case 'verify-ca':
    case 'verify-full': {
      const tls: TlsOptions = { rejectUnauthorized: true, servername: info.host };
      if (info.sslrootcert) tls.ca = fs.readFileSync(info.sslrootcert);
      if (info.sslmode === 'verify-ca') tls.checkServerIdentity = () => undefined;
      return tls;
    }
  }
}

/**
 * TCP keepalive idle time of pgsub's connections: a peer that vanished (host down, cable
 * cut) is found by the kernel's probes instead of a send that waits for hours. Silence on
 * a live socket is what receive_timeout and target_timeout are for.
 */
export const KEEPALIVE_IDLE_MS = 10_000;

/** node-postgres client settings for a conninfo; `extra` adds what the caller needs. */
export function pgClientConfig(info: ConnInfo, applicationName: string, extra: Partial<pg.ClientConfig> & Record<string, unknown> = {}): pg.ClientConfig {
  return {
    host: info.host,
    port: info.port,
    user: info.user,
    password: info.password,
    database: info.database,
    ssl: tlsOptions(info),
    application_name: applicationName,
    connectionTimeoutMillis: (info.connectTimeoutSeconds ?? 30) * 1000,
    keepAlive: true,
    keepAliveInitialDelayMillis: KEEPALIVE_IDLE_MS,
    ...extra,
  } as pg.ClientConfig;
}
