/**
 * dist/bundle/main.js (scripts/bundle.mjs copies this file there): runs the bundle, main.cjs,
 * compiled with the V8 code cache made at build time, main.cjs.cache. Why: V8 otherwise
 * parses and compiles the 2.3 MB bundle at every start, about a quarter of pgsub's time
 * before its first connection; with the cache it deserialises what was compiled while the
 * build ran `--version` (medians of 15 on the 2-core VM: `pgsub --version` 0.37 → 0.30 s).
 * V8 refuses a cache made by another V8 version or with other flags (another Node): the
 * bundle is then compiled as usual. The cache starts with the SHA-256 of the bundle it was
 * made from, because V8 itself checks only the source's length. 'starting' logs which case
 * it was (`code_cache`: accepted, rejected, stale, none).
 */
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setFlagsFromString } from 'node:v8';
import { Script } from 'node:vm';

// No allocation-site pretenuring: V8 allocates straight into the old generation from sites whose
// objects survived young collections, and while a stream outruns the target (the receive queue
// full) messages do survive for a while. With it on, W3 parallel's peak RSS was 198–214 MB in
// about a third of runs (and 25–40% more CPU); with it off 134–136 MB in 5 of 5
// (docs/benchmarks.md, "W3 again"). Set before the bundle is compiled: V8 accepts a code cache
// only under the flags it was made with, and the build makes it through this file.
setFlagsFromString('--no-allocation-site-pretenuring');

const filename = fileURLToPath(new URL('./main.cjs', import.meta.url));
const cacheFile = `${filename}.cache`;

/** The cache's V8 data when it was made from this very bundle (`digest`), and what became of it. */
function readCache(digest) {
  let file;
  try {
    file = readFileSync(cacheFile);
  } catch {
    return { cachedData: undefined, state: 'none' };
  }
  if (file.length <= digest.length || !file.subarray(0, digest.length).equals(digest)) return { cachedData: undefined, state: 'stale' };
  return { cachedData: file.subarray(digest.length), state: 'accepted' };
}

/**
 * The bundle compiled (`building`: without a cache, one written at exit). In a function so that
 * the file's bytes and the cache's (3.8 MB) are not kept for the process's life.
 */
function compile(building) {
  const source = readFileSync(filename);
  const digest = createHash('sha256').update(source).digest();
  const cache = building ? { cachedData: undefined, state: 'none' } : readCache(digest);
  // CommonJS's wrapper, as Node's own loader gives a module.
  const script = new Script(`(function (exports, require, module, __filename, __dirname) {${source.toString('utf8')}\n})`, { filename, cachedData: cache.cachedData });
  globalThis[Symbol.for('pgsub.codeCache')] = cache.cachedData !== undefined && script.cachedDataRejected ? 'rejected' : cache.state;
  // After the run, so that the functions it compiled are in the cache too.
  if (building) process.once('exit', () => writeFileSync(cacheFile, Buffer.concat([digest, script.createCachedData()])));
  return script;
}

// The build's own run (scripts/bundle.mjs): compile without a cache, write one at exit. Taken
// out of the environment so that the configuration and pgsub's children never see it.
const building = process.env.PGSUB_BUILD_CODE_CACHE === '1';
delete process.env.PGSUB_BUILD_CODE_CACHE;
const module = { exports: {} };
compile(building).runInThisContext()(module.exports, createRequire(filename), module, filename, path.dirname(filename));
