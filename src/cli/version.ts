/**
 * pgsub's version for `pgsub --version`: package.json's, found by walking up from this
 * module, which sits at a different depth in the sources (src/cli), tsc's output
 * (dist/src/cli) and the bundle (dist/bundle) — so no fixed relative path serves all three.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export function packageVersion(from: string = import.meta.url): string {
  let dir = path.dirname(fileURLToPath(from));
  for (;;) {
    const file = path.join(dir, 'package.json');
    if (fs.existsSync(file)) {
      try {
        const pkg = JSON.parse(fs.readFileSync(file, 'utf8')) as { name?: string; version?: string };
        if (pkg.name === 'pgsub' && typeof pkg.version === 'string') return pkg.version;
      } catch {
        // not ours, or unreadable: keep looking above
      }
    }
    const parent = path.dirname(dir);
    if (parent === dir) return 'unknown';
    dir = parent;
  }
}

/**
 * How the bundle's loader compiled pgsub (scripts/bundle-loader.mjs): with the V8 code cache
 * made at build time ('accepted'), or without it ('rejected' by this Node's V8, 'stale',
 * 'none'); undefined when not run from the bundle (tsc's output, tsx).
 */
export function bundleCodeCache(): string | undefined {
  const state = (globalThis as Record<symbol, unknown>)[Symbol.for('pgsub.codeCache')];
  return typeof state === 'string' ? state : undefined;
}
