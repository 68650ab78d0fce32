/**
 * The pure parts of `pgsub verify`: how key spaces are cut (ranges.ts), the SQL built from a
 * table's shape (sql.ts: normalisation per type, range predicates with their parameters,
 * collatable keys compared bytewise), table patterns and rate limits of the command, and
 * the commit LSN the apply's hold looks at (protocol/peek.ts).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { describeRange, firstLevelParts, isIntegerKey, sampleStep, splitAt, splitInteger } from '../../src/verify/ranges.js';
import { hashQuery, keysIn, normalisedColumn, parseColumns, rangeWhere, rowText, type ColumnInfo, type TableShape } from '../../src/verify/sql.js';
import { deleteStatement, insertStatement, updateStatement } from '../../src/verify/repair-sql.js';
import { treeText, typeTrees } from '../../src/verify/normalise.js';
import { repairFailure, syncingReason } from '../../src/verify/repair.js';
import { globToRegExp, selectTables } from '../../src/verify/verify.js';
import { parseRateLimit } from '../../src/cli/verify-command.js';
import { peekVisibleCommitLsn } from '../../src/protocol/peek.js';

const col = (name: string, base: string, extra: Partial<ColumnInfo> = {}): ColumnInfo => ({
  name,
  type: base === 'int4' ? 'integer' : base,
  base,
  collatable: base === 'text',
  generated: false,
  identityAlways: false,
  ...extra,
});

const shape = (columns: ColumnInfo[], key: string[], rowFilter: string | null = null): TableShape => ({ schema: 'public', table: 'T', columns, key, rowFilter });

test('integer ranges: equal widths covering [lo, hi) exactly, never empty', () => {
  assert.deepEqual(splitInteger(1n, 11n, 3), [
    { lo: ['1'], hi: ['5'] },
    { lo: ['5'], hi: ['9'] },
    { lo: ['9'], hi: ['11'] },
  ]);
  assert.deepEqual(splitInteger(5n, 6n, 16), [{ lo: ['5'], hi: ['6'] }]);
  assert.deepEqual(splitInteger(5n, 5n, 4), []);
  const big = splitInteger(-(2n ** 63n), 2n ** 63n - 1n, 256);
  assert.equal(big.length, 256);
  assert.equal(big[0]!.lo![0], String(-(2n ** 63n)));
  assert.equal(big[255]!.hi![0], String(2n ** 63n - 1n));
  for (let i = 1; i < big.length; i++) assert.deepEqual(big[i]!.lo, big[i - 1]!.hi);
});

test('sampled boundaries cut a range; repeats and the ends themselves are dropped', () => {
  const r = { lo: ['b'], hi: ['y'] };
  assert.deepEqual(splitAt(r, [['b'], ['d'], ['d'], ['m'], ['y']]), [
    { lo: ['b'], hi: ['d'] },
    { lo: ['d'], hi: ['m'] },
    { lo: ['m'], hi: ['y'] },
  ]);
  assert.deepEqual(splitAt({ lo: null, hi: null }, []), [{ lo: null, hi: null }]);
  assert.equal(describeRange({ lo: null, hi: ['1', 'a'] }), '[-inf, (1, a))');
  assert.equal(firstLevelParts(0), 1);
  assert.equal(firstLevelParts(2_000_000), 40);
  assert.equal(firstLevelParts(1e12), 256);
  assert.equal(sampleStep(1000, 16), 63);
  assert.ok(isIntegerKey({ key: ['id'], columns: [col('id', 'int8')] }));
  assert.ok(!isIntegerKey({ key: ['id', 'x'], columns: [col('id', 'int8'), col('x', 'int4')] }));
  assert.ok(!isIntegerKey({ key: ['id'], columns: [col('id', 'uuid')] }));
});

test('normalisation: floats by binary form without -0 and every NaN alike, numeric without trailing zeros, json through jsonb', () => {
  assert.equal(
    normalisedColumn(col('f', 'float8')),
    `CASE WHEN "f" OPERATOR(pg_catalog.=) 'NaN'::pg_catalog.float8 THEN 'NaN' ELSE pg_catalog.encode(pg_catalog.float8send("f" OPERATOR(pg_catalog.+) 0::pg_catalog.float8), 'hex') END`,
  );
  assert.match(normalisedColumn(col('f', 'float4')), /pg_catalog\.float4send\("f" OPERATOR\(pg_catalog\.\+\) 0::pg_catalog\.float4\)/);
  assert.match(normalisedColumn(col('n', 'numeric')), /rtrim\(pg_catalog\.rtrim\("n"::pg_catalog\.text, '0'\), '\.'\)/);
  assert.match(normalisedColumn(col('m', 'money')), /"m"::pg_catalog\.numeric::pg_catalog\.text/);
  assert.equal(normalisedColumn(col('j', 'json')), '"j"::pg_catalog.jsonb::pg_catalog.text');
  assert.equal(normalisedColumn(col('t', 'timestamptz')), `("t" AT TIME ZONE 'UTC')::pg_catalog.text`);
  assert.equal(normalisedColumn(col('x"y', 'text')), '"x""y"::pg_catalog.text');
  assert.equal(rowText([col('a', 'int4'), col('b', 'text')]), 'ROW("a"::pg_catalog.text, "b"::pg_catalog.text)::pg_catalog.text');
});

test('range predicates: parameters cast to the key types, collatable keys bytewise, the row filter on the source only', () => {
  const one = shape([col('id', 'int4'), col('v', 'text')], ['id'], "v <> 'x'");
  assert.deepEqual(rangeWhere(one, { lo: ['10'], hi: ['20'] }, 'source'), { text: ` WHERE (v <> 'x') AND "id" >= $1::integer AND "id" < $2::integer`, params: ['10', '20'] });
  assert.deepEqual(rangeWhere(one, { lo: null, hi: ['20'] }, 'target'), { text: ` WHERE "id" < $1::integer`, params: ['20'] });
  assert.deepEqual(rangeWhere(one, null, 'target'), { text: '', params: [] });
  const two = shape([col('code', 'text'), col('n', 'int4')], ['code', 'n']);
  assert.deepEqual(rangeWhere(two, { lo: ['a', '1'], hi: null }, 'target', 3), { text: ` WHERE ROW("code" COLLATE "C", "n") >= ROW($3::text, $4::integer)`, params: ['a', '1'] });
  assert.deepEqual(
    keysIn(two, [
      ['a', '1'],
      ['b', '2'],
    ]),
    { text: 'ROW("code", "n") IN (ROW($1::text, $2::integer), ROW($3::text, $4::integer))', params: ['a', '1', 'b', '2'] },
  );
  const h = hashQuery(one, { lo: ['1'], hi: ['2'] }, 'target');
  assert.match(h.text, /^SELECT pg_catalog\.count\(\*\)/);
  assert.match(h.text, /pg_catalog\.md5\(r\)/);
  assert.deepEqual(h.params, ['1', '2']);
});

test('catalog rows: key columns in key order; repair statements write only the compared columns', () => {
  const parsed = parseColumns([
    ['b', 'integer', 'int4', 'false', 'false', 'true', '2', '23'],
    ['a', 'text', 'text', 'true', 'false', 'false', '1', '25'],
    ['g', 'integer', 'int4', 'false', 'true', 'false', '0', '23'],
    ['v', 'numeric(10,2)', 'numeric', 'false', 'false', 'false', '0', '1700'],
  ]);
  assert.deepEqual(parsed.key, ['a', 'b']);
  assert.equal(parsed.columns[3]!.typeOid, '1700');
  // The compared columns (the source's): b, a, v. The target also has g (generated) and local.
  const s = shape([parsed.columns[0]!, parsed.columns[1]!, parsed.columns[3]!], parsed.key);
  const target = [...parsed.columns, col('local', 'text')];
  const rows = [
    ['1', 'x', '9.50'],
    ['2', null, null],
  ];
  const ins = insertStatement(s, target, rows);
  assert.equal(
    ins.text,
    'INSERT INTO "public"."T" ("b", "a", "v") OVERRIDING SYSTEM VALUE SELECT v.c0::integer, v.c1::text, v.c2::numeric(10,2) FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.text[])) AS v(c0, c1, c2)',
  );
  assert.deepEqual(ins.params, [
    ['1', '2'],
    ['x', null],
    ['9.50', null],
  ]);
  // UPDATE: matched by the key, sets v only (b is a key column and identity; local is the target's own).
  const upd = updateStatement(s, target, rows)!;
  assert.equal(
    upd.text,
    'UPDATE "public"."T" AS pgsub_t SET "v" = v.c0::numeric(10,2) FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.text[])) AS v(k0, k1, c0) WHERE pgsub_t."a" = v.k0::text AND pgsub_t."b" = v.k1::integer',
  );
  assert.deepEqual(upd.params, [
    ['x', null],
    ['1', '2'],
    ['9.50', null],
  ]);
  assert.equal(updateStatement(shape([parsed.columns[0]!, parsed.columns[1]!], parsed.key), target, rows), null);
  assert.deepEqual(deleteStatement(s, [['x', '1']]), { text: 'DELETE FROM "public"."T" WHERE ROW("a", "b") IN (ROW($1::text, $2::integer))', params: ['x', '1'] });
  // Under a mapping: the target's table and column names.
  const mapped: TableShape = { ...s, target: { schema: 'app', table: 'T2', names: ['b', 'a', 'value'] } };
  const upd2 = updateStatement(mapped, [...target.filter((c) => c.name !== 'v'), col('value', 'numeric')], rows)!;
  assert.match(upd2.text, /^UPDATE "app"\."T2" AS pgsub_t SET "value" = v\.c0::numeric /);
});

test('nested types: arrays element by element with their bounds, composites field by field, only where a normalised type is inside', () => {
  // typeTreeQuery rows: oid, typtype, typname, format_type, typbasetype, array element, fields.
  const trees = typeTrees([
    ['701', 'b', 'float8', 'double precision', '0', '0', null],
    ['1022', 'b', '_float8', 'double precision[]', '0', '701', null],
    ['23', 'b', 'int4', 'integer', '0', '0', null],
    ['1007', 'b', '_int4', 'integer[]', '0', '23', null],
    ['9001', 'd', 'ratios', 'ratios', '1022', '0', null],
    ['9002', 'c', 'pt', 'pt', '0', '0', '[["x","701"],["n","23"]]'],
    ['9003', 'b', '_pt', 'pt[]', '0', '9002', null],
    ['9004', 'c', 'ints', 'ints', '0', '0', '[["n","23"]]'],
  ]);
  assert.deepEqual(trees.get('1022'), { kind: 'array', type: 'double precision[]', elem: { kind: 'scalar', base: 'float8' } });
  assert.deepEqual(trees.get('9001'), trees.get('1022'), 'a domain over float8[] as float8[]');
  assert.equal(trees.get('1007'), undefined, 'int4[] is compared by its text');
  assert.equal(trees.get('9004'), undefined, 'a composite of integers by its text');
  assert.deepEqual(trees.get('9003'), {
    kind: 'array',
    type: 'pt[]',
    elem: {
      kind: 'composite',
      fields: [
        { name: 'x', tree: { kind: 'scalar', base: 'float8' } },
        { name: 'n', tree: { kind: 'scalar', base: 'int4' } },
      ],
    },
  });
  const text = treeText('"c"', trees.get('9003')!);
  assert.match(text, /^CASE WHEN "c" IS NULL THEN NULL ELSE COALESCE\(pg_catalog\.array_dims\(\("c"\)::pt\[\]\), ''\) \|\| /);
  // Elements unnested in the select list, beside their positions (in FROM a composite would be expanded).
  assert.match(text, /FROM \(SELECT pg_catalog\.unnest\(\("c"\)::pt\[\]\) AS e, pg_catalog\.generate_series\(1, pg_catalog\.cardinality\(\("c"\)::pt\[\]\)\) AS i\) AS u0\)/);
  assert.match(text, /pg_catalog\.num_nulls\(u0\.e\) OPERATOR\(pg_catalog\.=\) 1 THEN NULL ELSE ROW\(CASE WHEN \(u0\.e\)\."x" OPERATOR/);
  assert.match(text, /\(u0\.e\)\."n"::pg_catalog\.text\)::pg_catalog\.text END/);
  // A float array: its binary form unless it holds a NaN or a zero (then element by element).
  const floats = treeText('"r"', trees.get('9001')!);
  assert.match(
    floats,
    /^CASE WHEN "r" IS NULL THEN NULL WHEN 'NaN'::pg_catalog\.float8 OPERATOR\(pg_catalog\.=\) ANY \(\("r"\)::double precision\[\]\) OR 0::pg_catalog\.float8 OPERATOR/,
  );
  assert.match(
    floats,
    / ELSE 'b' \|\| pg_catalog\.encode\(pg_catalog\.overlay\(pg_catalog\.array_send\(\("r"\)::pg_catalog\.float8\[\]\), pg_catalog\.decode\('00000000', 'hex'\), 5, 4\), 'hex'\) END$/,
  );
  assert.equal(rowText([{ ...col('r', 'float8'), tree: trees.get('1022')! }]).startsWith('ROW(CASE WHEN "r" IS NULL'), true);
});

test('repair failures name the table and the key; syncing states are named', () => {
  const dup = Object.assign(new Error('duplicate key value violates unique constraint "slow_pkey"'), {
    code: '23505',
    detail: 'Key (id)=(17) already exists.',
    constraint: 'slow_pkey',
  });
  const e = repairFailure('public.slow', dup);
  assert.equal(e.code, 'PGSUB_VERIFY_REPAIR_FAILED');
  assert.equal(e.message, 'repair of public.slow failed at key (id)=(17): duplicate key value violates unique constraint "slow_pkey" (SQLSTATE 23505)');
  assert.deepEqual([e.context.relation, e.context.key, e.context.sqlstate], ['public.slow', '(id)=(17)', '23505']);
  const lock = repairFailure('public.t', Object.assign(new Error('canceling statement due to lock timeout'), { code: '55P03' }));
  assert.equal(lock.message, 'repair of public.t failed: canceling statement due to lock timeout (SQLSTATE 55P03)');
  assert.equal(syncingReason('d'), 'syncing (state d: datasync)');
  assert.match(syncingReason(null), /^not subscribed yet/);
});

test('table patterns and rate limits', () => {
  assert.ok(globToRegExp('public.acc*').test('public.accounts'));
  assert.ok(globToRegExp('accounts').test('app.accounts'));
  assert.ok(!globToRegExp('public.a.b').test('publicXa.b'));
  const tables = [
    { schema: 'public', table: 'a' },
    { schema: 'public', table: 'b' },
    { schema: 'app', table: 'a' },
  ];
  assert.deepEqual(
    selectTables(tables, ['a'], ['app.*']).map((t) => `${t.schema}.${t.table}`),
    ['public.a'],
  );
  assert.deepEqual(parseRateLimit('50000'), { perSecond: 50000, unit: 'rows' });
  assert.deepEqual(parseRateLimit('2000rows/s'), { perSecond: 2000, unit: 'rows' });
  assert.deepEqual(parseRateLimit('20MB'), { perSecond: 20 * 1024 * 1024, unit: 'bytes' });
  assert.throws(() => parseRateLimit('fast'), /--rate-limit/);
});

test('the commit LSN the hold looks at: Begin, Stream Commit, Commit Prepared; nothing else', () => {
  const begin = Buffer.alloc(21);
  begin[0] = 0x42;
  begin.writeBigUInt64BE(0x1_0000_0010n, 1);
  assert.equal(peekVisibleCommitLsn(begin), 0x1_0000_0010n);
  const streamCommit = Buffer.alloc(30);
  streamCommit[0] = 0x63;
  streamCommit.writeBigUInt64BE(0x20n, 6);
  assert.equal(peekVisibleCommitLsn(streamCommit), 0x20n);
  const commitPrepared = Buffer.alloc(40);
  commitPrepared[0] = 0x4b;
  commitPrepared.writeBigUInt64BE(0x30n, 2);
  assert.equal(peekVisibleCommitLsn(commitPrepared), 0x30n);
  assert.equal(peekVisibleCommitLsn(Buffer.from([0x49, 0, 0, 0, 1])), null);
});
