/**
 * The cutover's count plan (migrate/cutover-counts.ts) without a server: what each
 * published table is counted through on the source (the publication's row filter, the
 * mapping's filter) and on the target (the mapping's table, a shard's slice with its value
 * as a parameter cast to the column's type, a soft-deleted table's live rows), tables merged
 * without a discriminator as one sum, and what is named "not counted" with why (truncate:
 * ignore, a key override without a discriminator, a table beside discriminated shards).
 * A missing target table refuses. Against real servers: cutover-mapped.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { MappingConfig } from '../../src/mapping/rules.js';
import type { PublishedTable } from '../../src/tablesync/catalog.js';
import { countDifferences, countPlanFrom, countSummary, renderCounts, type TableCount } from '../../src/migrate/cutover-counts.js';

const table = (name: string, rowFilter: string | null = null): PublishedTable => {
  const [schema, t] = name.split('.') as [string, string];
  return { schema, table: t, columns: ['id'], rowFilter, relkind: 'r' } as PublishedTable;
};
const mapping = (tables: MappingConfig['tables']): MappingConfig => ({ schemas: {}, tables });
const there = (n: number, type: string | null = null) => Array.from({ length: n }, () => ({ exists: true, type }));

test('a publication row filter and a mapping filter both filter the source; the target is counted under its mapped name', () => {
  const plan = countPlanFrom(mapping({ 'a.t': { target: 'b.u', filter: `kind = 'x'` } }), [table('a.t', `((region = 'eu'::text))`), table('a.plain')], there(2));
  assert.deepEqual(plan.notCounted, []);
  assert.deepEqual(
    plan.counted.map((c) => [c.table, c.sources, c.target, c.filters]),
    [
      [
        'a.t',
        [{ schema: 'a', table: 't', where: `(((region = 'eu'::text))) AND (kind = 'x')` }],
        { schema: 'b', table: 'u', where: null, params: [], slice: null },
        `counted through the publication's row filter ((region = 'eu'::text)) and the mapping's filter (kind = 'x')`,
      ],
      ['a.plain', [{ schema: 'a', table: 'plain', where: null }], { schema: 'a', table: 'plain', where: null, params: [], slice: null }, null],
    ],
  );
});

test("discriminator shards are their slices, the value a parameter cast to the column's type; an undiscriminated table beside them is named", () => {
  const plan = countPlanFrom(
    mapping({
      's1.items': { target: 'sales.items', discriminator: 'shard' },
      's2.items': { target: 'sales.items', discriminator: { column: 'shard', value: '2' }, key: ['shard', 'id'], soft_delete: { flag: 'gone', at: 'gone_at' } },
      's3.items': { target: 'sales.items' },
    }),
    [table('s1.items'), table('s2.items'), table('s3.items')],
    [
      { exists: true, type: 'character varying(10)' },
      { exists: true, type: 'integer' },
      { exists: true, type: null },
    ],
  );
  assert.deepEqual(
    plan.counted.map((c) => [c.table, c.target.where, c.target.params, c.target.slice]),
    [
      ['s1.items', `("shard" = $1::pg_catalog.text::character varying(10))`, ['s1.items'], `shard = 's1.items'`],
      // A key override on a shard does not keep it from being counted: its slice holds its own rows only.
      ['s2.items', `("shard" = $1::pg_catalog.text::integer) AND (("gone" IS NOT TRUE) AND ("gone_at" IS NULL))`, ['2'], `shard = '2'`],
    ],
  );
  assert.deepEqual(plan.notCounted, [
    { table: 's3.items', targetTable: 'sales.items', reason: 'sales.items also receives the rows of s1.items, s2.items, and this table has no discriminator to tell its own' },
  ]);
});

test('tables merged without a discriminator are counted as one sum; one not countable makes the others not counted', () => {
  const sum = countPlanFrom(mapping({ 'a.eu': { target: 'a.all' }, 'a.us': { target: 'a.all' } }), [table('a.eu'), table('a.us', '((x > 1))')], there(2));
  assert.deepEqual(
    sum.counted.map((c) => [c.table, c.sources.map((s) => s.where), c.target.table, c.filters]),
    [['a.eu + a.us', [null, '(((x > 1)))'], 'all', 'counted through their filters']],
  );
  const mixed = countPlanFrom(mapping({ 'a.eu': { target: 'a.all', truncate: 'ignore' }, 'a.us': { target: 'a.all' } }), [table('a.eu'), table('a.us')], there(2));
  assert.deepEqual(mixed.counted, []);
  assert.deepEqual(
    mixed.notCounted.map((n) => [n.table, n.reason]),
    [
      ['a.eu', 'truncate: ignore keeps the rows a source TRUNCATE removed'],
      ['a.us', 'a.all also receives rows of source tables that are not counted'],
    ],
  );
});

test('a key override without a discriminator and truncate: ignore are named, soft delete counts live rows', () => {
  const plan = countPlanFrom(
    mapping({ 'a.k': { key: ['code'] }, 'a.i': { truncate: 'ignore' }, 'a.s': { soft_delete: { lsn: 'del_lsn' }, truncate: 'soft_delete' } }),
    [table('a.k'), table('a.i'), table('a.s')],
    there(3),
  );
  assert.deepEqual(
    plan.notCounted.map((n) => [n.table, n.reason]),
    [
      ['a.k', 'key (code) overrides the replica identity: the target table may hold rows that did not come from this source'],
      ['a.i', 'truncate: ignore keeps the rows a source TRUNCATE removed'],
    ],
  );
  assert.deepEqual(
    plan.counted.map((c) => [c.table, c.target.where]),
    [['a.s', '("del_lsn" IS NULL)']],
  );
});

test('a missing target table refuses before the fence, naming where its rows would go', () => {
  assert.throws(
    () =>
      countPlanFrom(
        mapping({ 'a.t': { target: 'b.gone' } }),
        [table('a.t'), table('a.ok')],
        [
          { exists: false, type: null },
          { exists: true, type: null },
        ],
      ),
    /^Error: target table\(s\) missing, so their rows cannot be counted at the fence: a\.t → b\.gone$/,
  );
});

test('the step line, the differences and the summary rows', () => {
  const tables: TableCount[] = [
    { table: 'a.t', target_table: 'a.t', source: 5, target: 5, equal: true, status: 'equal', note: null },
    { table: 's1.items', target_table: "sales.items where shard = 's1'", source: 3, target: 2, equal: false, status: 'different', note: null },
    {
      table: 'a.i',
      target_table: 'a.i',
      source: null,
      target: null,
      equal: null,
      status: 'not counted',
      note: 'not counted: truncate: ignore keeps the rows a source TRUNCATE removed',
    },
  ];
  assert.equal(countSummary(tables), '2 table(s), 8 rows, equal on both sides; 1 not counted (row rules: see the summary)');
  assert.equal(countDifferences(tables), `s1.items source 3, target sales.items where shard = 's1' 2`);
  assert.equal(countDifferences(tables.slice(0, 1)), null);
  assert.deepEqual(renderCounts(tables).slice(1), [
    '  a.t                                         5            5',
    `  s1.items                                    3            2  → sales.items where shard = 's1'`,
    '  a.i                                         -            -  not counted: truncate: ignore keeps the rows a source TRUNCATE removed',
  ]);
});
