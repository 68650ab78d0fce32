/**
 * The two textual forms of a libpq connection string, turned into keyword → value pairs
 * and nothing more: `key=value` (values single-quoted with \' and \\ escapes) and the
 * `postgresql://` URI, including libpq's multi-host form (`h1:p1,h2:p2`, `[::1]` for
 * IPv6) and its `ssl=true` alias. Which keywords exist and what they mean is keywords.ts's
 * concern; defaults from service files and the environment are conninfo.ts's.
 */
import { ConfigError } from '../../errors.js';

export type Pairs = Record<string, string>;

export function isUri(text: string): boolean {
  return /^postgres(ql)?:\/\//i.test(text.trim());
}

export function parseConninfoText(text: string, what: string): Pairs {
  return isUri(text) ? parseUri(text.trim(), what) : parseKeyValue(text, what);
}

function decode(part: string, what: string, field: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new ConfigError(`${what}: bad percent-encoding in the URI's ${field}`, { key: what });
  }
}

/** libpq's conninfo_uri_parse_options: scheme, [user[:password]@], host list, /dbname, ?params. */
export function parseUri(text: string, what: string): Pairs {
  const out: Pairs = {};
  let rest = text.replace(/^postgres(ql)?:\/\//i, '');
  const hash = rest.indexOf('#');
  if (hash >= 0) throw new ConfigError(`${what}: a URI fragment (#…) is not part of a postgresql:// URI`, { key: what });
  const q = rest.indexOf('?');
  const query = q >= 0 ? rest.slice(q + 1) : '';
  if (q >= 0) rest = rest.slice(0, q);
  const slash = rest.indexOf('/');
  let netloc = slash >= 0 ? rest.slice(0, slash) : rest;
  const db = slash >= 0 ? rest.slice(slash + 1) : '';
  // libpq takes the user info up to the first '@' (a raw '@' in a password must be %40).
  const at = netloc.indexOf('@');
  if (at >= 0) {
    const userinfo = netloc.slice(0, at);
    netloc = netloc.slice(at + 1);
    const colon = userinfo.indexOf(':');
    const user = colon >= 0 ? userinfo.slice(0, colon) : userinfo;
    if (user) out.user = decode(user, what, 'user name');
    if (colon >= 0) out.password = decode(userinfo.slice(colon + 1), what, 'password');
  }
  const hosts: string[] = [];
  const ports: string[] = [];
  if (netloc !== '') {
    for (const spec of netloc.split(',')) {
      let host: string;
      let port = '';
      if (spec.startsWith('[')) {
        const close = spec.indexOf(']');
        if (close < 0) throw new ConfigError(`${what}: missing "]" in the URI's IPv6 host address`, { key: what });
        host = spec.slice(1, close);
        if (host === '') throw new ConfigError(`${what}: empty IPv6 host address in the URI`, { key: what });
        const after = spec.slice(close + 1);
        if (after !== '' && !after.startsWith(':')) throw new ConfigError(`${what}: unexpected ${JSON.stringify(after[0])} after the URI's IPv6 host address`, { key: what });
        port = after.slice(1);
      } else {
        const colon = spec.lastIndexOf(':');
        host = colon >= 0 ? spec.slice(0, colon) : spec;
        port = colon >= 0 ? spec.slice(colon + 1) : '';
      }
      hosts.push(decode(host, what, 'host'));
      ports.push(decode(port, what, 'port'));
    }
    if (hosts.some((h) => h !== '')) out.host = hosts.join(',');
    if (ports.some((p) => p !== '')) out.port = ports.join(',');
  }
  if (db !== '') out.dbname = decode(db, what, 'database name');
  // Not URLSearchParams: that is form decoding, which turns '+' into a space; libpq only percent-decodes.
  for (const pair of query.split('&')) {
    if (!pair) continue;
    const eq = pair.indexOf('=');
    if (eq < 0) throw new ConfigError(`${what}: URI query parameter ${JSON.stringify(pair)} has no value`, { key: what });
    let key = decode(pair.slice(0, eq), what, 'query');
    let value = decode(pair.slice(eq + 1), what, 'query');
    // libpq's alias for JDBC-style URIs.
    if (key === 'ssl' && value === 'true') {
      key = 'sslmode';
      value = 'require';
    }
    out[key] = value;
  }
  return out;
}

/** libpq's key=value form: values may be single-quoted with \' and \\ escapes. */
export function parseKeyValue(text: string, what: string): Pairs {
  const out: Pairs = {};
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

/** A value written so parseKeyValue reads it back unchanged. */
export function quoteValue(v: string): string {
  return /^[^\s'\\]+$/.test(v) ? v : `'${v.replace(/(['\\])/g, '\\$1')}'`;
}
