#!/usr/bin/env node
// Runs the build when `npm run build` has been done (the one-file bundle, else tsc's output),
// else the TypeScript sources via tsx.
import { existsSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setFlagsFromString } from 'node:v8';

const bundle = fileURLToPath(new URL('../dist/bundle/main.js', import.meta.url));
const built = fileURLToPath(new URL('../dist/src/cli/main.js', import.meta.url));
if (existsSync(bundle)) {
  // Its loader sets V8's flags itself (scripts/bundle-loader.mjs), as its code cache needs.
  await import(pathToFileURL(bundle).href);
} else {
  // The bundle's V8 flags (scripts/bundle-loader.mjs says why), before any of pgsub is loaded.
  setFlagsFromString('--no-allocation-site-pretenuring');
  if (existsSync(built)) {
    await import(pathToFileURL(built).href);
  } else {
    const { register } = await import('tsx/esm/api');
    register();
    await import(new URL('../src/cli/main.ts', import.meta.url).href);
  }
}
