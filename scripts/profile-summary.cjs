/**
 * The functions a .cpuprofile (scripts/profile-preload.cjs) spent its time in, by self time
 * and by inclusive time: `node scripts/profile-summary.cjs FILE [self rows] [inclusive rows]`.
 */
const fs = require('node:fs');

const [file, selfRows = '40', inclusiveRows = '40'] = process.argv.slice(2);
if (!file) {
  process.stderr.write('usage: node scripts/profile-summary.cjs FILE.cpuprofile [self rows] [inclusive rows]\n');
  process.exit(2);
}
const profile = JSON.parse(fs.readFileSync(file, 'utf8'));
const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
const parent = new Map();
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const name = (n) => `${n.callFrame.functionName || '(anonymous)'} ${n.callFrame.url.split('/').slice(-2).join('/')}:${n.callFrame.lineNumber + 1}`;

// Microseconds per sampled node, then per function: self, and inclusive (once per stack).
const perNode = new Map();
for (const [i, id] of profile.samples.entries()) perNode.set(id, (perNode.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
const total = profile.timeDeltas.reduce((a, b) => a + b, 0);
const self = new Map();
const inclusive = new Map();
for (const [id, us] of perNode) {
  const key = name(nodes.get(id));
  self.set(key, (self.get(key) ?? 0) + us);
  const seen = new Set();
  for (let at = id; at !== undefined; at = parent.get(at)) {
    const k = name(nodes.get(at));
    if (seen.has(k)) continue;
    seen.add(k);
    inclusive.set(k, (inclusive.get(k) ?? 0) + us);
  }
}
const top = (m, rows) =>
  [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, Number(rows))
    .map(([k, us]) => `${(us / 1000).toFixed(0).padStart(7)} ms ${((100 * us) / total).toFixed(1).padStart(5)}%  ${k}`)
    .join('\n');
process.stdout.write(`total ${(total / 1e6).toFixed(2)} s\n--- self\n${top(self, selfRows)}\n--- inclusive\n${top(inclusive, inclusiveRows)}\n`);
