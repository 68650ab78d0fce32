/**
 * `npm run build`'s second step: src/cli/main.ts and everything it imports (dependencies
 * included) as one CommonJS file, dist/bundle/main.cjs, with the V8 code cache of its start
 * beside it (main.cjs.cache) and its loader (main.js, from scripts/bundle-loader.mjs), which
 * bin/pgsub.js prefers. Why: Node 20 resolves, reads and compiles each of the ~150 files
 * separately at every start, about 0.2 s of CPU before the first statement (half of pgsub's
 * startup; noticeable in short runs such as catching up a small backlog); one file loads
 * faster, and one compiled with a cache faster still. CommonJS because Node 20 gives a code
 * cache to a script (vm.Script) but not to an ES module. Lazily imported commands (demo,
 * drop) are inside it too, run when called. It sits two directories below the repository
 * root like test/harness, so paths found from import.meta.url (migrations/, node_modules/)
 * stay the same.
 *
 * The bundle holds every dependency, so the published package declares none (package.json:
 * all are devDependencies) and installs without a registry. Source maps only with
 * PGSUB_SOURCEMAP=1 (`PGSUB_SOURCEMAP=1 npm run build`, then `node --enable-source-maps`):
 * they were 5.5 MB of the 8.4 MB package, and Node reads them only under that flag.
 */
import { build } from 'esbuild';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';

/**
 * pg asks at load time whether it runs in a Cloudflare Worker. Node 20 has no `navigator`,
 * so pg constructs a `Response` to find out, and that loads undici: about 25 ms of every
 * start, for an answer that is always no here.
 */
const nodeOnlyPg = {
  name: 'pg-node-only',
  setup(b) {
    b.onLoad({ filter: /[\\/]node_modules[\\/]pg[\\/]lib[\\/]stream\.js$/ }, (args) => {
      const source = readFileSync(args.path, 'utf8');
      const patched = source.replace('function isCloudflareRuntime() {', 'function isCloudflareRuntime() {\n  return false // pgsub: Node only (scripts/bundle.mjs)');
      if (patched === source) return { contents: source, loader: 'js', warnings: [{ text: 'pg/lib/stream.js has no isCloudflareRuntime(): left as it is' }] };
      return { contents: patched, loader: 'js' };
    });
  },
};

// --outdir DIR: elsewhere, two directories below the root too (the tests' .test-build/bundle).
const at = process.argv.indexOf('--outdir');
const outdir = at > 0 ? process.argv[at + 1] : 'dist/bundle';
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: ['src/cli/main.ts'],
  outfile: path.join(outdir, 'main.cjs'),
  bundle: true,
  format: 'cjs',
  platform: 'node',
  target: 'node20',
  sourcemap: process.env.PGSUB_SOURCEMAP === '1' ? 'linked' : false,
  logLevel: 'warning',
  plugins: [nodeOnlyPg],
  // Class names as written: a logged error's `type` is its class (log.ts), which esbuild
  // would otherwise rename where two modules use the same one (pg's DatabaseError → DatabaseError2).
  keepNames: true,
  // Whitespace and syntax minified, identifiers kept (stack traces still name functions): V8
  // reads and compiles every byte of the bundle at each start; 3.1 → 2.2 MB, and `pgsub
  // --version` 420 → 372 ms (medians of 20, interleaved, 2-core VM). Lines stay short: on an
  // uncaught error Node prints the throwing line, which must not be a whole module.
  minifyWhitespace: true,
  minifySyntax: true,
  lineLimit: 120,
  // The sources' import.meta.url (where migrations/ and package.json are): the bundle's own.
  define: { 'import.meta.url': 'pgsubBundleUrl' },
  banner: { js: "var pgsubBundleUrl = require('node:url').pathToFileURL(__filename).href;" },
});
copyFileSync('scripts/bundle-loader.mjs', path.join(outdir, 'main.js'));

// The code cache: the loader compiles the bundle and writes what V8 compiled once `--version`
// has run — under the loader's V8 flags, which V8 requires of a cache it accepts.
const made = spawnSync(process.execPath, [path.join(outdir, 'main.js'), '--version'], { env: { ...process.env, PGSUB_BUILD_CODE_CACHE: '1' }, encoding: 'utf8' });
if (made.status !== 0 || !existsSync(path.join(outdir, 'main.cjs.cache'))) {
  throw new Error(`the bundle did not run to make its code cache (exit ${made.status}): ${made.stderr}`);
}
