/**
 * libpq's connection service file (pg_service.conf): `service=NAME` (or PGSERVICE) fills
 * every keyword the conninfo leaves unset from section [NAME] of PGSERVICEFILE (default
 * ~/.pg_service.conf) or, when that file has no such section, of
 * PGSYSCONFDIR/pg_service.conf. A named service found in neither is an error, like libpq's
 * "definition of service not found"; so is a `service` line inside a section.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError } from '../../errors.js';
import type { Pairs } from './text.js';

/** Debian's libpq looks in /etc/postgresql-common when PGSYSCONFDIR is unset. */
export const DEFAULT_SYSCONFDIR = '/etc/postgresql-common';

export function homeDir(env: NodeJS.ProcessEnv): string {
  return env.HOME ?? os.homedir();
}

/** The settings of service `name`, or a ConfigError naming the files searched. */
export function serviceSettings(name: string, env: NodeJS.ProcessEnv, what: string): Pairs {
  const userFile = env.PGSERVICEFILE ?? path.join(homeDir(env), '.pg_service.conf');
  const systemFile = path.join(env.PGSYSCONFDIR ?? DEFAULT_SYSCONFDIR, 'pg_service.conf');
  for (const file of [userFile, systemFile]) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
      throw new ConfigError(`${what}: cannot read service file ${file}: ${(err as Error).message}`, { key: what });
    }
    const found = section(text, name, file, what);
    if (found) return found;
  }
  throw new ConfigError(`${what}: definition of service "${name}" not found (searched ${userFile} and ${systemFile}; PGSERVICEFILE and PGSYSCONFDIR choose them)`, {
    key: what,
  });
}

function section(text: string, name: string, file: string, what: string): Pairs | null {
  let inSection = false;
  let found: Pairs | null = null;
  const lines = text.split(/\r?\n/);
  for (let n = 0; n < lines.length; n++) {
    const line = lines[n]!.trim();
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith('[')) {
      if (found) return found;
      inSection = line.slice(1, line.indexOf(']') >= 0 ? line.indexOf(']') : undefined) === name;
      if (inSection) found = {};
      continue;
    }
    if (!inSection || !found) continue;
    const eq = line.indexOf('=');
    if (eq <= 0) throw new ConfigError(`${what}: syntax error in service file ${file}, line ${n + 1}`, { key: what });
    const key = line.slice(0, eq).trim();
    if (key === 'service') throw new ConfigError(`${what}: nested "service" specifications not supported in service file ${file}, line ${n + 1}`, { key: what });
    found[key] ??= line.slice(eq + 1).trim();
  }
  return found;
}
