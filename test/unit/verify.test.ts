/**
 * The pure parts of `pgsub verify`: how key spaces are cut (ranges.ts), the SQL built from a
 * table's shape (sql.ts: normalisation per type, range predicates with their parameters,
 * collatable keys compared bytewise), table patterns and rate limits of the command, and
 * the commit LSN the apply's hold looks at (protocol/peek.ts).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { describeRange, firstLevelParts, isIntegerKey, sampleStep, splitAt, splitInteger } from '../../src/verify/ranges.js';
import { hashQuery, insertQuery, keysIn, normalisedColumn, parseColumns, rangeWhere, rowText, type ColumnInfo, type TableShape } from '../../src/verify/sql.js';
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

test('normalisation: floats by binary form without -0, numeric without trailing zeros, json through jsonb', () => {
  assert.equal(normalisedColumn(col('f', 'float8')), `pg_catalog.encode(pg_catalog.float8send("f" + 0::pg_catalog.float8), 'hex')`);
  assert.equal(normalisedColumn(col('f', 'float4')), `pg_catalog.encode(pg_catalog.float4send("f" + 0::pg_catalog.float4), 'hex')`);
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

test('catalog rows: key columns in key order; a repair insert skips generated columns and overrides identity', () => {
  const parsed = parseColumns([
    ['b', 'integer', 'int4', 'false', 'false', 'true', '2'],
    ['a', 'text', 'text', 'true', 'false', 'false', '1'],
    ['g', 'integer', 'int4', 'false', 'true', 'false', '0'],
  ]);
  assert.deepEqual(parsed.key, ['a', 'b']);
  const s = shape(parsed.columns, parsed.key);
  const q = insertQuery(s, parsed.columns, [
    ['1', 'x', '9'],
    ['2', null, '9'],
  ]);
  assert.equal(q.text, 'INSERT INTO "public"."T" ("b", "a") OVERRIDING SYSTEM VALUE VALUES ($1::integer, $2::text), ($3::integer, $4::text)');
  assert.deepEqual(q.params, ['1', 'x', '2', null]);
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
