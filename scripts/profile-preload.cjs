/**
 * A CPU profile of a pgsub run, for benchmarks: `--pgsub-env "NODE_OPTIONS=--require
 * <repo>/scripts/profile-preload.cjs"` (Node 20 refuses --cpu-prof in NODE_OPTIONS). Starts
 * the inspector's sampling profiler before pgsub loads and writes
 * <tmpdir>/pgsub-profiles/pgsub-<pid>-<time>.cpuprofile at exit, for Chrome DevTools or
 * `node scripts/profile-summary.cjs FILE`.
 */
const inspector = require('node:inspector');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const dir = path.join(os.tmpdir(), 'pgsub-profiles');
const session = new inspector.Session();
session.connect();
session.post('Profiler.enable');
// 200 µs: fine enough for per-message costs of a few microseconds.
session.post('Profiler.setSamplingInterval', { interval: 200 });
session.post('Profiler.start');
let written = false;
process.on('exit', () => {
  if (written) return;
  written = true;
  session.post('Profiler.stop', (err, result) => {
    if (err) return;
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, `pgsub-${process.pid}-${Date.now()}.cpuprofile`), JSON.stringify(result.profile));
  });
});
