/**
 * The layering of src/ (ARCHITECTURE.md, scripts/check-layers.mjs): the tree as it is has
 * no import circle and nothing imports upward; and the checker does catch both.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
// @ts-expect-error: a plain ES module script without type declarations
import { checkLayers, layerProblems } from '../../scripts/check-layers.mjs';

const problems = layerProblems as (modules: Map<string, string>) => string[];

test('src/ has no import circle and no upward import', () => {
  assert.deepEqual((checkLayers as () => string[])(), []);
});

test('the checker finds an upward import, a circle, and a module in no layer', () => {
  const upward = problems(new Map([['src/apply/sql/relmap.ts', "import { runLoop } from '../run/loop.js';"]]));
  assert.equal(upward.length, 1);
  assert.match(upward[0]!, /src\/apply\/sql\/relmap\.ts \(apply\/sql\) imports src\/apply\/run\/loop\.ts \(apply\/run\), a layer above/);

  const circle = problems(
    new Map([
      ['src/apply/txn/a.ts', "import { b } from './b.js';"],
      ['src/apply/txn/b.ts', "export { a } from './a.js';"],
    ]),
  );
  assert.deepEqual(circle, ['import circle: src/apply/txn/a.ts → src/apply/txn/b.ts']);

  const stray = problems(new Map([['src/elsewhere/x.ts', "import { quoteIdent } from '../quote.js';"]]));
  assert.match(stray[0]!, /in no layer/);

  assert.deepEqual(problems(new Map([['src/apply/run/loop.ts', "import type { Lsn } from '../../protocol/lsn.js';"]])), []);
});
