#!/usr/bin/env node
// Runs the build when `npm run build` has been done (the one-file bundle, else tsc's output),
// else the TypeScript sources via tsx.
import { existsSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';

// No allocation-site pretenuring: V8 allocates straight into the old generation from sites whose
// objects survived young collections, and while a stream outruns the target (the receive queue
// full) messages do survive for a while. With it on, W3 parallel's peak RSS was 198–214 MB in
// about a third of runs (and 25–40% more CPU); with it off 134–136 MB in 5 of 5
// (docs/benchmarks.md, "W3 again"). Set before any of pgsub is loaded.
setFlagsFromString('--no-allocation-site-pretenuring');

const bundle = fileURLToPath(new URL('../dist/bundle/main.js', import.meta.url));
const built = fileURLToPath(new URL('../dist/src/cli/main.js', import.meta.url));
if (existsSync(bundle)) {
  await import(pathToFileURL(bundle).href);
} else if (existsSync(built)) {
  await import(pathToFileURL(built).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(new URL('../src/cli/main.ts', import.meta.url).href);
}
