#!/usr/bin/env node
/**
 * The layering of src/ (ARCHITECTURE.md), checked over every relative import: no import
 * circle anywhere, and no module imports from a layer above its own. Prints each violation
 * and exits 1; `npm run lint` runs it, and test/unit/layers.test.ts asserts it passes.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** Lowest first; a module may import its own layer or a lower one. */
export const LAYERS = [
  [
    'ground',
    [
      'src/errors.ts',
      'src/quote.ts',
      'src/log.ts',
      'src/faults.ts',
      'src/backoff.ts',
      'src/connect-failure.ts',
      'src/connect/',
      'src/protocol/',
      'src/config/',
      'src/conflict/types.ts',
      'src/mapping/rules.ts',
    ],
  ],
  ['pgwire', ['src/pgwire/']],
  ['origin, conflict, sync states', ['src/origin/', 'src/conflict/']],
  // The mapping's home (docs/mapping.md): its rule model is ground, its plan a service, the rest beside the statement builders.
  ['apply/sql', ['src/apply/sql/', 'src/mapping/']],
  ['apply/txn', ['src/apply/txn/']],
  ['apply/handlers', ['src/apply/handlers/']],
  ['apply/run', ['src/apply/run/']],
  ['tablesync', ['src/tablesync/']],
  ['migrate, verify', ['src/migrate/', 'src/verify/']],
  ['service', ['src/service/', 'src/mapping/plan.ts']],
  ['cli', ['src/cli/']],
];

export function layerOf(file) {
  let best = null;
  for (let i = 0; i < LAYERS.length; i++) {
    for (const prefix of LAYERS[i][1]) {
      if ((prefix.endsWith('/') ? file.startsWith(prefix) : file === prefix) && (best === null || prefix.length > best.len)) best = { index: i, len: prefix.length };
    }
  }
  return best?.index ?? null;
}

function sources(dir) {
  const out = [];
  for (const e of readdirSync(path.join(root, dir), { withFileTypes: true })) {
    const p = `${dir}/${e.name}`;
    if (e.isDirectory()) out.push(...sources(p));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

/** The problems of src/ as it is on disk. */
export function checkLayers() {
  return layerProblems(new Map(sources('src').map((file) => [file, readFileSync(path.join(root, file), 'utf8')])));
}

/** The problems of a set of modules: path (from the repository root) → source text. */
export function layerProblems(modules) {
  const graph = new Map();
  const problems = [];
  const spec = /(?:^|\n)\s*(?:import|export)\s[^;]*?from\s+['"](\.[^'"]+)['"]|import\(\s*['"](\.[^'"]+)['"]\s*\)/g;
  for (const [file, text] of modules) {
    const deps = [];
    for (const m of text.matchAll(spec)) {
      const target = path.posix.normalize(path.posix.join(path.posix.dirname(file), (m[1] ?? m[2]).replace(/\.js$/, '.ts')));
      deps.push(target);
      const from = layerOf(file);
      const to = layerOf(target);
      if (from === null) problems.push(`${file}: in no layer (add it to scripts/check-layers.mjs)`);
      else if (to !== null && to > from) problems.push(`${file} (${LAYERS[from][0]}) imports ${target} (${LAYERS[to][0]}), a layer above`);
    }
    graph.set(file, deps);
  }
  // Circles: strongly connected components of more than one module (Tarjan).
  let index = 0;
  const idx = new Map();
  const low = new Map();
  const stack = [];
  const on = new Set();
  const visit = (v) => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    on.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v), idx.get(w)));
    }
    if (low.get(v) === idx.get(v)) {
      const scc = [];
      let w;
      do {
        w = stack.pop();
        on.delete(w);
        scc.push(w);
      } while (w !== v);
      if (scc.length > 1) problems.push(`import circle: ${scc.sort().join(' → ')}`);
    }
  };
  for (const f of graph.keys()) if (!idx.has(f)) visit(f);
  return [...new Set(problems)];
}

if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  const problems = checkLayers();
  for (const p of problems) console.error(p);
  if (problems.length > 0) process.exit(1);
  console.log('layers: no import circle, nothing imports upward');
}
