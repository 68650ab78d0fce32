/**
 * libpq's password file (passfile, PGPASSFILE, default ~/.pgpass): lines
 * hostname:port:database:username:password, `*` matching anything, `\` escaping ':' and
 * '\'; the first matching line wins. A file readable or writable by group or others is
 * ignored with libpq's warning, as is one that is not a plain file. A Unix-socket host
 * matches the name "localhost"; a host given only by hostaddr matches that address.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { ConnInfo, HostSpec } from '../config/conninfo.js';

export interface PassfileAnswer {
  password?: string;
  /** libpq's warning about a file it ignored. */
  warning?: string;
}

function fields(line: string): string[] {
  const out: string[] = [];
  let cur = '';
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (c === '\\' && i + 1 < line.length) cur += line[++i];
    else if (c === ':' && out.length < 4) {
      out.push(cur);
      cur = '';
    } else cur += c;
  }
  out.push(cur);
  return out;
}

export function passfilePath(info: ConnInfo): string {
  return info.settings.passfile || path.join(info.home, '.pgpass');
}

export function passfilePassword(info: ConnInfo, spec: HostSpec): PassfileAnswer {
  const file = passfilePath(info);
  let st: fs.Stats;
  try {
    st = fs.statSync(file);
  } catch {
    return {};
  }
  if (!st.isFile()) return { warning: `password file "${file}" is not a plain file` };
  if ((st.mode & 0o077) !== 0) return { warning: `password file "${file}" has group or world access; permissions should be u=rw (0600) or less` };
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return {};
  }
  const host = spec.host.startsWith('/') ? 'localhost' : spec.host || spec.hostaddr || 'localhost';
  const want = [host, String(spec.port), info.database, info.user];
  for (const line of text.split(/\r?\n/)) {
    if (line === '' || line.startsWith('#')) continue;
    const f = fields(line);
    if (f.length < 5) continue;
    if (want.every((w, i) => f[i] === '*' || f[i] === w)) return { password: f[4]! };
  }
  return {};
}
