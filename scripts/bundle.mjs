/**
 * `npm run build`'s second step: src/cli/main.ts and everything it imports (dependencies
 * included) as one ES module, dist/bundle/main.js, which bin/pgsub.js prefers. Why: Node
 * 20 resolves, reads and compiles each of the ~150 files separately at every start, about
 * 0.2 s of CPU before the first statement (half of pgsub's startup; noticeable in short
 * runs such as catching up a small backlog). Lazily imported commands (demo, drop) become
 * chunks beside it, two directories below the repository root like test/harness, so
 * paths they find from import.meta.url (migrations/, node_modules/) stay the same.
 */
import { build } from 'esbuild';
import { rmSync } from 'node:fs';

const outdir = 'dist/bundle';
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: { main: 'src/cli/main.ts' },
  outdir,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  sourcemap: 'linked',
  logLevel: 'warning',
  // CommonJS dependencies (pg, pino…) call require(); give the bundle one.
  banner: { js: "import { createRequire as pgsubCreateRequire } from 'node:module'; const require = pgsubCreateRequire(import.meta.url);" },
});
