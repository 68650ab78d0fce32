/**
 * Connection strings as libpq users write them — `postgresql://` URIs or `key=value`
 * conninfo — resolved as libpq resolves them: the string first, then the service file's
 * section (`service`/PGSERVICE), then the PG* environment variables, then the defaults.
 * Every keyword of libpq's list is either checked here for a value libpq would take or
 * refused by name (conninfo/keywords.ts); what each means at connect time is src/connect/.
 * `redactConninfo` is the only form of a conninfo that may reach a log line.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { ConfigError } from '../errors.js';
import { KEYWORDS } from './conninfo/keywords.js';
import { homeDir, serviceSettings } from './conninfo/service.js';
import { type Pairs, parseConninfoText, quoteValue } from './conninfo/text.js';

export type SslMode = 'disable' | 'allow' | 'prefer' | 'require' | 'verify-ca' | 'verify-full';

/** One server to try, in order: the name (for TLS and the password file) and where to connect. */
export interface HostSpec {
  /** A host name, an IP address, or a Unix-socket directory (starts with '/'). */
  host: string;
  /** hostaddr: the numeric address to connect to instead of resolving `host`. */
  hostaddr?: string;
  port: number;
}

export interface ConnInfo {
  /** The first server (messages, pg_dump, preflight); `hosts` is what is tried. */
  host: string;
  port: number;
  hosts: readonly HostSpec[];
  database: string;
  user: string;
  password?: string;
  sslmode: SslMode;
  sslrootcert?: string;
  applicationName?: string;
  connectTimeoutSeconds?: number;
  /** Every other keyword that was set (conninfo, service file, environment), checked; sslpassword included. */
  settings: Readonly<Record<string, string>>;
  /** $HOME as it was when parsed: libpq's default file locations (~/.pgpass, ~/.postgresql/). */
  home: string;
  /** Keywords whose value came from the conninfo or the service file, not the environment or a default. */
  explicit: ReadonlySet<string>;
}

/** Parse a URI or key=value conninfo; service file and libpq environment variables fill what it omits. */
export function parseConninfo(text: string, what: 'source' | 'target' | string, env: NodeJS.ProcessEnv = process.env): ConnInfo {
  const side = what === 'target' ? 'target' : 'source';
  const given = parseConninfoText(text, what);
  checkKeywords(given, what, 'connection option');
  const serviceName = given.service ?? env.PGSERVICE;
  const service = serviceName ? serviceSettings(serviceName, env, what) : {};
  checkKeywords(service, what, `keyword of service "${serviceName}"`);
  const explicit = new Set([...Object.keys(given), ...Object.keys(service)]);
  const all: Pairs = { ...service, ...given };
  for (const [key, kw] of Object.entries(KEYWORDS)) {
    if (all[key] === undefined && kw.env && env[kw.env] !== undefined) all[key] = env[kw.env]!;
  }
  for (const [key, value] of Object.entries(all)) {
    const problem = KEYWORDS[key]!.check?.(value, side);
    if (problem) {
      const shown = KEYWORDS[key]!.secret ? key : `${key} ${JSON.stringify(value)}`;
      throw new ConfigError(`${what}: ${shown} ${problem}`, { key: what, option: key });
    }
  }
  if (all.sslrootcert === 'system' && all.sslmode === undefined) all.sslmode = 'verify-full';
  const sslmode = (all.sslmode ?? 'prefer') as SslMode;
  crossChecks(all, sslmode, what);
  const user = all.user ?? env.USER ?? 'postgres';
  const hosts = hostList(all, what);
  const info: ConnInfo = {
    host: hosts[0]!.host,
    port: hosts[0]!.port,
    hosts,
    user,
    database: all.dbname ?? user,
    sslmode,
    settings: Object.fromEntries(Object.entries(all).filter(([k]) => !['host', 'hostaddr', 'port', 'user', 'dbname', 'password', 'sslmode', 'service'].includes(k))),
    home: homeDir(env),
    explicit,
  };
  if (all.password !== undefined) info.password = credentialPassword(all.password, what, env);
  if (all.sslrootcert !== undefined) info.sslrootcert = all.sslrootcert;
  if (all.application_name !== undefined) info.applicationName = all.application_name;
  if (all.connect_timeout !== undefined) info.connectTimeoutSeconds = Math.max(0, Number(all.connect_timeout));
  return info;
}

function checkKeywords(pairs: Pairs, what: string, kind: string): void {
  for (const key of Object.keys(pairs)) {
    if (!Object.hasOwn(KEYWORDS, key)) throw new ConfigError(`${what}: invalid ${kind} ${JSON.stringify(key)}`, { key: what, option: key });
  }
}

/** Combinations libpq refuses before it connects (connectOptions2). */
function crossChecks(all: Pairs, sslmode: SslMode, what: string): void {
  const fail = (message: string) => {
    throw new ConfigError(`${what}: ${message}`, { key: what });
  };
  if (all.sslrootcert === 'system' && sslmode !== 'verify-full') fail(`weak sslmode "${sslmode}" may not be used with sslrootcert=system (use "verify-full")`);
  if (all.sslnegotiation === 'direct' && !['require', 'verify-ca', 'verify-full'].includes(sslmode)) {
    fail(`weak sslmode "${sslmode}" may not be used with sslnegotiation=direct (use "require", "verify-ca", or "verify-full")`);
  }
  if (all.channel_binding === 'require' && sslmode === 'disable') fail('channel_binding=require needs TLS, but sslmode is disable');
  const versions = ['TLSv1', 'TLSv1.1', 'TLSv1.2', 'TLSv1.3'];
  if (all.ssl_min_protocol_version && all.ssl_max_protocol_version && versions.indexOf(all.ssl_min_protocol_version) > versions.indexOf(all.ssl_max_protocol_version)) {
    fail('invalid SSL protocol version range (ssl_min_protocol_version above ssl_max_protocol_version)');
  }
}

/** host, hostaddr and port lists as libpq pairs them: one port for all, or one per host. */
function hostList(all: Pairs, what: string): HostSpec[] {
  const hostNames = all.host !== undefined ? all.host.split(',') : null;
  const addrs = all.hostaddr !== undefined ? all.hostaddr.split(',') : null;
  const count = hostNames?.length ?? addrs?.length ?? 1;
  if (hostNames && addrs && hostNames.length !== addrs.length) {
    throw new ConfigError(`${what}: could not match ${hostNames.length} host names to ${addrs.length} hostaddr values`, { key: what });
  }
  const portTexts = (all.port ?? '').split(',');
  if (portTexts.length !== 1 && portTexts.length !== count) {
    throw new ConfigError(`${what}: could not match ${portTexts.length} port numbers to ${count} hosts`, { key: what });
  }
  const hosts: HostSpec[] = [];
  for (let i = 0; i < count; i++) {
    const portText = (portTexts.length === 1 ? portTexts[0] : portTexts[i])!.trim() || '5432';
    const port = Number(portText);
    if (!/^\d+$/.test(portText) || port <= 0 || port > 65535) throw new ConfigError(`${what}: port ${JSON.stringify(portText)} is not a TCP port`, { key: what });
    const addr = addrs?.[i]?.trim();
    if (addr && net.isIP(addr) === 0) throw new ConfigError(`${what}: hostaddr ${JSON.stringify(addr)} is not a numeric IP address`, { key: what });
    // libpq's default without host or hostaddr is its Unix-socket directory; pgsub's is localhost (docs/conninfo.md).
    const host = hostNames?.[i]?.trim() || (addr ? addr : 'localhost');
    hosts.push(addr ? { host, hostaddr: addr, port } : { host, port });
  }
  return hosts;
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

/** A conninfo fit for logs: everything but the password and the sslpassword. */
export function redactConninfo(info: ConnInfo): string {
  const hosts = info.hosts.length > 1 ? info.hosts.map((h) => `${h.host}:${h.port}`).join(',') : null;
  return hosts
    ? `host=${hosts} dbname=${info.database} user=${info.user} sslmode=${info.sslmode}`
    : `host=${info.host} port=${info.port} dbname=${info.database} user=${info.user} sslmode=${info.sslmode}`;
}

/** Remove passwords from free text (error messages echo conninfo strings sometimes). */
export function redactSecrets(text: string): string {
  return (
    text
      // Up to the last '@' of the authority: a password may hold a raw '@'.
      .replace(/(postgres(?:ql)?:\/\/[^:/@\s]*:)[^/?#\s]*@/gi, '$1****@')
      .replace(/((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)/gi, '$1****')
  );
}

/**
 * The conninfo as key=value text for a libpq program (pg_dump), every setting included
 * but the password and the sslpassword, which travel separately (never in argv).
 */
export function conninfoKeywords(info: ConnInfo): Pairs {
  const out: Pairs = {
    host: info.hosts.map((h) => h.host).join(','),
    port: info.hosts.map((h) => String(h.port)).join(','),
    dbname: info.database,
    user: info.user,
    sslmode: info.sslmode,
  };
  if (info.hosts.some((h) => h.hostaddr)) out.hostaddr = info.hosts.map((h) => h.hostaddr ?? '').join(',');
  for (const [k, v] of Object.entries(info.settings)) if (k !== 'sslpassword') out[k] = v;
  return out;
}

export function conninfoText(pairs: Pairs): string {
  return Object.entries(pairs)
    .map(([k, v]) => `${k}=${quoteValue(v)}`)
    .join(' ');
}
