/**
 * Every builtin type round-trips, in text and in binary mode, across versions: a table with
 * one column per type (edge values: int/float limits, NaN, ±Infinity, -0 and denormals,
 * numeric NaN/±Infinity and 1000-digit values, bytea with all 256 byte values, text from
 * every UTF-8 length class and astral planes, json with unicode escapes, dates and
 * timestamps at ±infinity and in BC, extreme intervals, empty and unbounded ranges,
 * multiranges, geometric types with NaN, xml, tsvector/tsquery, money at its limits,
 * 2-D arrays with NULL elements and lower bounds ≠ 1, arrays of strings needing quotes…)
 * plus user-defined enums, domains and composites (and arrays, domains over arrays,
 * composites nesting both), which binary mode resolves by name on the target. Some
 * columns change type on the way (int4 → int8, varchar → text, enum → text, int4[] →
 * int8[]): text mode reads them with the target type's input function as native does,
 * binary mode reads them as the publisher's type and casts. An aclitem column has no
 * binary send function and arrives as text inside binary tuples.
 *
 * INSERT, UPDATE of every column (values → other values, NULL → values, values → NULL,
 * key change), DELETE, and an update leaving an out-of-line value unchanged, into a table
 * with a primary key and one with REPLICA IDENTITY FULL (old rows located by every column,
 * in binary mode too). After each step every column of every row is compared as text
 * (md5 would hide the diff; sessions on both sides use the same DateStyle,
 * IntervalStyle, TimeZone and extra_float_digits), except float-bearing columns when a
 * PostgreSQL older than 12 is involved, whose text output differs from 12+ for the same
 * value; those compare their binary send output.
 *
 * Every publisher database runs with DateStyle 'SQL, DMY' and IntervalStyle
 * 'sql_standard' (ALTER DATABASE): pgsub's walsender session must force ISO/postgres as
 * native does, or dates like 03/02/2001 and intervals like -1-0 +2 … arrive misread.
 *
 * Routes: `npm test` runs PG18→PG18 text and binary, PG14→PG18 binary, PG10→PG18 text.
 * PGSUB_MATRIX=full (`npm run test:matrix`) adds PG12→PG18 text, PG16→PG18 binary,
 * PG18→PG16 text and binary. Columns exist only where both ends know the type or value
 * (multiranges and numeric ±Infinity need 14, infinite intervals 17…); binary mode needs
 * a PG14+ publisher.
 *
 * PostgreSQL 14+ ignore the OIDs of user-defined types embedded in binary arrays and
 * records; 12 and 13 refuse a mismatch. The last test sends what a PG18 publisher sends
 * for the user-defined container types into a PG12 target through the relation map,
 * statements and the wire (no walsender: the table sync's catalog queries need a PG13+
 * target), proving the OID rewrite where it matters.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { RelationMap } from '../../src/apply/sql/relmap.js';
import { insertStatement } from '../../src/apply/sql/insert.js';
import { openApplyConnection } from '../../src/pgwire/connect.js';
import { loadConfig } from '../../src/config/config.js';
import { parseConninfo } from '../../src/config/conninfo.js';
import type { RelationColumn, Tuple } from '../../src/protocol/messages.js';
import { createLogger } from '../../src/log.js';
import { startRunner, type Runner } from '../../src/service/runner.js';
import { currentWalLsn, slotConfirmedLsn, startCluster, waitFor, type Cluster } from '../harness/index.js';

type Mode = 'text' | 'binary';
interface Route {
  publisher: number;
  target: number;
  mode: Mode;
}

const FULL_MATRIX = process.env.PGSUB_MATRIX === 'full';
const ROUTES: Route[] = [
  { publisher: 18, target: 18, mode: 'text' },
  { publisher: 18, target: 18, mode: 'binary' },
  { publisher: 14, target: 18, mode: 'binary' },
  { publisher: 10, target: 18, mode: 'text' },
  ...(FULL_MATRIX
    ? ([
        { publisher: 12, target: 18, mode: 'text' },
        { publisher: 16, target: 18, mode: 'binary' },
        { publisher: 18, target: 16, mode: 'text' },
        { publisher: 18, target: 16, mode: 'binary' },
      ] as const)
    : []),
];

interface Column {
  name: string;
  type: string;
  /** The target column's type when it differs from the publisher's. */
  targetType?: string;
  /** SQL expressions of the three non-NULL values (rows 1–3; row 4 is all NULL). */
  values: [string, string, string];
  /** Oldest major, on both ends, that has the type or the values. */
  since?: number;
  /** Binary send function to compare with when a pre-12 server prints floats differently. */
  send?: string;
  /** Compare this expression instead of `name::text`. */
  compareAs?: string;
}

const q = (s: string) => `'${s.replace(/'/g, "''")}'`;
const BYTES_0_255 = `(SELECT decode(string_agg(lpad(to_hex(g), 2, '0'), '' ORDER BY g), 'hex') FROM generate_series(0, 255) g)`;
// ~128 kB of md5 hex: stored out of line, so an update of another column sends it as unchanged ('u').
const BIG = `(SELECT string_agg(md5(g::text), '' ORDER BY g) FROM generate_series(1, 4000) g)`;

const COLUMNS: Column[] = [
  { name: 'b', type: 'bool', values: ['true', 'false', 'true'] },
  { name: 'i2', type: 'int2', values: ['-32768', '32767', '0'] },
  { name: 'i4', type: 'int4', values: ['-2147483648', '2147483647', '0'] },
  { name: 'i8', type: 'int8', values: [q('-9223372036854775808'), q('9223372036854775807'), '0'] },
  { name: 'f4a', type: 'float4', values: [q('NaN'), q('Infinity'), q('-Infinity')], send: 'float4send' },
  { name: 'f4b', type: 'float4', values: [q('-0'), q('1.4e-45'), q('3.4028235e38')], send: 'float4send' },
  { name: 'f4c', type: 'float4', values: [q('0.1'), q('1.17549435e-38'), q('-1.5')], send: 'float4send' },
  { name: 'f8a', type: 'float8', values: [q('NaN'), q('Infinity'), q('-Infinity')], send: 'float8send' },
  { name: 'f8b', type: 'float8', values: [q('-0'), q('4.9e-324'), q('1.7976931348623157e308')], send: 'float8send' },
  { name: 'f8c', type: 'float8', values: [q('0.1'), q('2.2250738585072014e-308'), q('-1e-310')], send: 'float8send' },
  { name: 'num', type: 'numeric', values: [q('123456789012345678901234567890.123456789012345678901234567890'), q('-0.000000000000000000000000000001'), q('NaN')] },
  { name: 'num_big', type: 'numeric', values: [`('1' || repeat('0', 1000))`, `('-' || repeat('9', 500) || '.' || repeat('9', 500))`, q('1.000')] },
  { name: 'num_mod', type: 'numeric(12,2)', values: [q('1234567890.12'), q('-0.01'), '0'] },
  { name: 'num_inf', type: 'numeric', values: [q('Infinity'), q('-Infinity'), q('NaN')], since: 14 },
  { name: 'mon', type: 'money', values: [q('-92233720368547758.08'), q('92233720368547758.07'), q('0.01')] },
  { name: 'ch', type: 'char(5)', values: [q('ab'), q(''), q('ü ñ')] },
  { name: 'vc', type: 'varchar(20)', values: [q('x'), q(''), q('ünïcödé')] },
  { name: 'nm', type: 'name', values: [q('n'.repeat(63)), q('ü'), q('')] },
  { name: 'qc', type: '"char"', values: [q('a'), q(' '), q('Z')] },
  // High-bit bytes: PostgreSQL 15+ print them as \ooo; 10–14 print the raw byte, which is not
  // UTF-8 (see the report on text-mode decoding), and a 14- target would read "\" of \ooo.
  { name: 'qc_hi', type: '"char"', values: ['CAST(-56 AS "char")', 'CAST(-1 AS "char")', 'CAST(-128 AS "char")'], since: 15 },
  // 1-, 2-, 3- and 4-byte UTF-8; planes 1, 2, 3, 14, 15, 16; U+FFFD, BOM, U+10FFFF; escapes.
  {
    name: 'tx',
    type: 'text',
    values: [`E'a\\u00e9\\u20ac\\U0001F600'`, `E'\\U00010000\\U00020000\\U00030000\\U000E0001\\U000F0000\\U0010FFFF\\uFFFD\\uFEFF'`, `E'tab\\there\\nnewline \\\\ ''quote'' "dq"'`],
  },
  { name: 'by', type: 'bytea', values: [BYTES_0_255, `'\\x'::bytea`, `'\\x00'::bytea`] },
  { name: 'js', type: 'json', values: [q('{"a":"\\u00e9\\ud83d\\ude00","b":[1,2.50,{"c":null}],  "d" : "x"}'), q('[]'), q('"\\u0000 nul escape"')] },
  { name: 'jb', type: 'jsonb', values: [q('{"b":[1,2.50,1e400],"a":"é😀 \\u00e9","n":null}'), q('[]'), q('{"deep":{"deeper":[[[]]]}}')] },
  { name: 'jp', type: 'jsonpath', values: [q('$.a[*] ? (@ > 1)'), q('strict $.b'), q('$')], since: 12 },
  // xml::text is the stored text; xml_out (which pgoutput and xml_send use) drops a bare
  // <?xml version="1.0"?> declaration, so compare the output function's text.
  {
    name: 'x',
    type: 'xml',
    compareAs: `CASE WHEN x IS NULL THEN NULL ELSE format('%s', x) END`,
    values: [q('<a b="1">ü &amp; <![CDATA[x<y]]><!-- c --></a>'), q('plain text fragment <b/>'), q('<?xml version="1.0"?><r/>')],
  },
  { name: 'u', type: 'uuid', values: [q('00000000-0000-0000-0000-000000000000'), q('ffffffff-ffff-ffff-ffff-ffffffffffff'), q('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')] },
  { name: 'd', type: 'date', values: [q('infinity'), q('-infinity'), q('4714-11-24 BC')] },
  { name: 'd2', type: 'date', values: [q('5874897-12-31'), q('2000-02-29'), q('0001-01-01')] },
  // Misread if the walsender used the publisher database's DateStyle 'SQL, DMY'.
  { name: 'dmy', type: 'date', values: [q('2001-02-03'), q('2001-12-11'), q('1999-01-02 BC')] },
  { name: 't', type: 'time', values: [q('00:00:00'), q('24:00:00'), q('23:59:59.999999')] },
  { name: 'tz', type: 'timetz', values: [q('00:00:00+1559'), q('24:00:00-1559'), q('12:34:56.789+05:30')] },
  { name: 'ts', type: 'timestamp', values: [q('infinity'), q('-infinity'), q('4714-11-24 00:00:00 BC')] },
  { name: 'ts2', type: 'timestamp', values: [q('294276-12-31 23:59:59.999999'), q('2000-01-01 00:00:00.000001'), q('0001-12-31 23:59:59.5 BC')] },
  { name: 'tstz', type: 'timestamptz', values: [q('infinity'), q('-infinity'), q('4714-11-24 00:00:00+00 BC')] },
  { name: 'tstz2', type: 'timestamptz', values: [q('294276-12-31 23:59:59.999999+00'), q('2000-01-01 00:00:00.000001+14'), q('1970-01-01 00:00:00-12')] },
  { name: 'iv', type: 'interval', values: [q('178956970 years 7 mons 2147483647 days'), q('-178956970 years -8 mons -2147483648 days'), q('-1 years +2 days -03:04:05.000006')] },
  {
    name: 'iv2',
    type: 'interval',
    values: ['make_interval(hours => 2147483647, mins => 59, secs => 59.999999)', '-make_interval(hours => 2147483647, mins => 59, secs => 59.999999)', q('1 microsecond')],
  },
  { name: 'iv_inf', type: 'interval', values: [q('infinity'), q('-infinity'), q('1 day -00:00:01')], since: 17 },
  { name: 'r4', type: 'int4range', values: [q('empty'), q('(,)'), q('[1,10)')] },
  { name: 'r8', type: 'int8range', values: [q('[-9223372036854775808,9223372036854775807)'), q('(,5]'), q('empty')] },
  { name: 'rn', type: 'numrange', values: [q('(1.5,NaN]'), q('[-1.5,2.25)'), q('(,)')] },
  { name: 'rts', type: 'tsrange', values: [q('[2000-01-01,infinity)'), q('(-infinity,2000-01-01 00:00:00.5]'), q('empty')] },
  { name: 'rtz', type: 'tstzrange', values: [q('[2000-01-01 00:00+00,2000-01-02 00:00+00)'), q('(,)'), q('[-infinity,infinity]')] },
  { name: 'rd', type: 'daterange', values: [q('[2000-01-01,2000-01-01]'), q('empty'), q('(,2000-01-01)')] },
  { name: 'mr4', type: 'int4multirange', values: [q('{}'), q('{[1,3), [5,7)}'), q('{(,)}')], since: 14 },
  { name: 'mr8', type: 'int8multirange', values: [q('{[-9223372036854775808,0)}'), q('{}'), q('{(,1], [3,)}')], since: 14 },
  { name: 'mrn', type: 'nummultirange', values: [q('{[1.5,2.5]}'), q('{}'), q('{(,0), [1,NaN]}')], since: 14 },
  { name: 'mrd', type: 'datemultirange', values: [q('{[2000-01-01,2000-01-05), [2000-02-01,infinity)}'), q('{}'), q('{(,)}')], since: 14 },
  { name: 'mrts', type: 'tsmultirange', values: [q('{[2000-01-01,2000-01-02)}'), q('{(,)}'), q('{}')], since: 14 },
  { name: 'mrtz', type: 'tstzmultirange', values: [q('{[-infinity,2000-01-01 00:00+00)}'), q('{}'), q('{(,)}')], since: 14 },
  { name: 'ip', type: 'inet', values: [q('192.168.1.5/24'), q('::ffff:1.2.3.4/128'), q('2001:db8::1/64')] },
  { name: 'cr', type: 'cidr', values: [q('10.0.0.0/8'), q('2001:db8::/32'), q('0.0.0.0/0')] },
  { name: 'mac', type: 'macaddr', values: [q('08:00:2b:01:02:03'), q('ff:ff:ff:ff:ff:ff'), q('00:00:00:00:00:00')] },
  { name: 'mac8', type: 'macaddr8', values: [q('08:00:2b:01:02:03:04:05'), q('08:00:2b:01:02:03'), q('ff:ff:ff:ff:ff:ff:ff:ff')] },
  { name: 'bt', type: 'bit(10)', values: [q('1010101010'), q('0000000000'), q('1111111111')] },
  { name: 'vb', type: 'varbit', values: [q(''), q('1'), `repeat('10', 50)`] },
  { name: 'pt', type: 'point', values: [q('(1.5,-2.25)'), q('(NaN,Infinity)'), q('(0.1,1e-300)')], send: 'point_send' },
  { name: 'ln', type: 'line', values: [q('{1,-1,0}'), q('{0.1,2,-0.3}'), q('{1,0,5}')], send: 'line_send' },
  { name: 'ls', type: 'lseg', values: [q('[(0,0),(1,1)]'), q('[(0.1,0.2),(-1e10,1e-10)]'), q('[(1,1),(1,1)]')], send: 'lseg_send' },
  { name: 'bx', type: 'box', values: [q('(1,1),(0,0)'), q('(0.1,0.2),(-0.3,-0.4)'), q('(0,0),(0,0)')], send: 'box_send' },
  { name: 'pa', type: 'path', values: [q('[(0,0),(1,1),(2,0)]'), q('((0,0),(0.1,1),(2,0.3))'), q('[(1,1)]')], send: 'path_send' },
  { name: 'pg', type: 'polygon', values: [q('((0,0),(1,1),(2,0))'), q('((0.1,0.2))'), q('((0,0),(0,1),(1,1),(1,0))')], send: 'poly_send' },
  { name: 'ci', type: 'circle', values: [q('<(0,0),1.5>'), q('<(0.1,-0.2),0>'), q('<(1e300,1),1e-300>')], send: 'circle_send' },
  { name: 'tsv', type: 'tsvector', values: [q("a fat cat:1A sat:2B,4C on:3 a:4 mat:5D ü 'it''s'"), q(''), q('x:16383')] },
  { name: 'tsq', type: 'tsquery', values: [q("fat & (rat | cat) & !mat:*AB <-> x <2> 'y''z'"), q(''), q('ü:*')] },
  { name: 'o', type: 'oid', values: ['0', q('4294967295'), '12345'] },
  { name: 'xi', type: 'xid', values: [q('0'), q('4294967295'), q('3')] },
  { name: 'ti', type: 'tid', values: [q('(0,1)'), q('(4294967295,65535)'), q('(7,0)')] },
  { name: 'lsn', type: 'pg_lsn', values: [q('0/0'), q('FFFFFFFF/FFFFFFFF'), q('16/B374D848')] },
  { name: 'snap', type: 'txid_snapshot', values: [q('10:20:10,14,15'), q('1:1:'), q('100:200:')] },
  { name: 'psnap', type: 'pg_snapshot', values: [q('10:20:10,14,15'), q('1:1:'), q('100:200:')], since: 13 },
  // No binary send function: sent as text inside binary tuples (and refused by binary COPY).
  { name: 'acl', type: 'aclitem', values: [q('postgres=arwd/postgres'), q('=r/postgres'), q('postgres=arwdDxt/postgres')] },
  { name: 'ia', type: 'int4[]', values: [q('{{1,NULL,3},{4,5,NULL}}'), q('[0:1][2:3]={{1,2},{3,4}}'), q('{}')] },
  { name: 'ta', type: 'text[]', values: [`ARRAY['a,b', 'c"d', 'NULL', NULL, '', E'e\\\\f', ' sp ', '{}', 'ü']`, q('{}'), `ARRAY[['x', 'y'], ['z', NULL]]`] },
  { name: 'na', type: 'numeric[]', values: [q('{1.5,NaN,NULL,-0.000001}'), q('{{1},{2}}'), q('{}')] },
  { name: 'fa', type: 'float8[]', values: [q('{NaN,Infinity,-0,1e-310,0.1}'), q('{}'), q('{{1.5},{NULL}}')], send: 'array_send' },
  { name: 'tsa', type: 'timestamptz[]', values: [q('{infinity,-infinity,NULL,"2000-01-01 00:00:00+00"}'), q('{}'), q('{"4714-11-24 00:00:00+00 BC"}')] },
  { name: 'm', type: 'ty.mood', values: [q('sad'), q('ünï "q"'), q('happy')] },
  { name: 'ma', type: 'ty.mood[]', values: [q('{sad,NULL,happy}'), q('{}'), `ARRAY[['ok', 'sad'], ['ünï "q"', NULL]]::ty.mood[]`] },
  { name: 'mas', type: 'ty.moods', values: [q('{ok}'), q('{}'), `ARRAY['ünï "q"']::ty.mood[]`] },
  { name: 'pi', type: 'ty.posint', values: ['1', '2147483647', '42'] },
  { name: 'tg', type: 'ty.tags', values: [q('{a,"b c"}'), q('{}'), `ARRAY[NULL, 'x']`] },
  { name: 'c', type: 'ty.comp', values: [`ROW('x,"y"', 1, 'sad')`, 'ROW(NULL, NULL, NULL)', `ROW('', -1, 'ünï "q"')`] },
  { name: 'ca', type: 'ty.comp[]', values: [`ARRAY[ROW('a', 1, 'ok')::ty.comp, NULL, ROW(NULL, NULL, NULL)::ty.comp]`, q('{}'), `ARRAY[ROW('(x)', 2, 'happy')::ty.comp]`] },
  {
    name: 'ne',
    type: 'ty.nest',
    values: [
      `ROW(ROW('y', 2, 'ok')::ty.comp, '{sad,NULL}'::ty.mood[], ARRAY[ROW('z', 3, 'happy')::ty.comp])`,
      'ROW(NULL, NULL, NULL)',
      `ROW(NULL, '{}'::ty.mood[], '{}'::ty.comp[])`,
    ],
  },
  {
    name: 'nea',
    type: 'ty.nest[]',
    values: [`ARRAY[ROW(NULL, '{ok}'::ty.mood[], '{}'::ty.comp[])::ty.nest, NULL]`, q('{}'), `ARRAY[ROW(ROW('a', 1, 'sad')::ty.comp, NULL, NULL)::ty.nest]`],
  },
  // Types that differ on the target: text mode reads the text with the target type's input
  // function; binary mode reads the publisher's type and casts.
  { name: 'w_i8', type: 'int4', targetType: 'int8', values: ['2147483647', '-1', '0'] },
  { name: 'w_num', type: 'int4', targetType: 'numeric', values: ['-2147483648', '7', '0'] },
  { name: 'w_text', type: 'varchar(20)', targetType: 'text', values: [q('abc'), q(''), q('ü')] },
  { name: 'w_moodtext', type: 'ty.mood', targetType: 'text', values: [q('sad'), q('ünï "q"'), q('happy')] },
  { name: 'w_i8arr', type: 'int4[]', targetType: 'int8[]', values: [q('{1,NULL}'), q('{}'), q('{{1,2},{3,4}}')] },
  { name: 'big', type: 'text', values: [BIG, q('small'), q('x')] },
];

const TYPES_DDL = `
  CREATE TYPE ty.mood AS ENUM ('sad', 'ok', 'happy', 'ünï "q"');
  CREATE DOMAIN ty.posint AS int CHECK (VALUE > 0);
  CREATE DOMAIN ty.tags AS text[];
  CREATE DOMAIN ty.moods AS ty.mood[];
  CREATE TYPE ty.comp AS (t text, i int, m ty.mood);
  CREATE TYPE ty.nest AS (c ty.comp, ms ty.mood[], cs ty.comp[]);
`;
// Created first on the target so that no user-defined type OID matches the publisher's.
const TARGET_FILLER = `CREATE TYPE ty.filler_enum AS ENUM ('f'); CREATE TYPE ty.filler_comp AS (a int); CREATE TABLE ty.filler (a int);`;
const TABLES = ['ty.keyed', 'ty.full_identity'] as const;
const SESSION = `SET datestyle = 'ISO, YMD'; SET intervalstyle = 'postgres'; SET extra_float_digits = 3; SET timezone = 'UTC'; SET bytea_output = 'hex';`;

function columnsFor(major: number): Column[] {
  return COLUMNS.filter((c) => (c.since ?? 0) <= major);
}

function tablesDdl(columns: Column[], side: 'publisher' | 'target'): string {
  const defs = columns.map((c) => `${c.name} ${side === 'target' ? (c.targetType ?? c.type) : c.type}`).join(', ');
  return `CREATE TABLE ty.keyed (id int PRIMARY KEY, ${defs});
    CREATE TABLE ty.full_identity (id int NOT NULL, ${defs});
    ALTER TABLE ty.full_identity REPLICA IDENTITY FULL;`;
}

/** SET every column of row `id` to value set `k` (0–2), or to NULL. */
function setRow(table: string, columns: Column[], id: number, k: number | null): string {
  const sets = columns.map((c) => `${c.name} = ${k === null ? 'NULL' : `CAST(${c.values[k]} AS ${c.type})`}`).join(', ');
  return `UPDATE ${table} SET ${sets} WHERE id = ${id};`;
}

function insertRow(table: string, columns: Column[], id: number, k: number | null): string {
  if (k === null) return `INSERT INTO ${table} (id) VALUES (${id});`;
  return `INSERT INTO ${table} (id, ${columns.map((c) => c.name).join(', ')}) VALUES (${id}, ${columns.map((c) => `CAST(${c.values[k]} AS ${c.type})`).join(', ')});`;
}

interface Subscription {
  route: Route;
  name: string;
  publisher: Cluster;
  sourceDb: string;
  target: Cluster;
  targetDb: string;
  columns: Column[];
  runner: Runner;
  errors: string[];
}

/** The target of the OID rewrite test: a major whose array_recv/record_recv check embedded OIDs. */
const REWRITE_TARGET = 12;

const label = (r: Route) => `PG${r.publisher} → PG${r.target} ${r.mode}`;

describe(`types round-trip: ${ROUTES.map(label).join(', ')}`, () => {
  const clusters = new Map<number, Cluster>();
  const subs: Subscription[] = [];
  /** Source databases: one per (publisher, target major), shared by the text and binary routes. */
  const sources = new Map<string, { cluster: Cluster; db: string; columns: Column[] }>();

  before(async () => {
    const majors = [...new Set([...ROUTES.flatMap((r) => [r.publisher, r.target]), REWRITE_TARGET])];
    await Promise.all(
      majors.map(async (major) => {
        clusters.set(major, await startCluster({ major, name: `types${major}` }));
      }),
    );
    for (const route of ROUTES) {
      const publisher = clusters.get(route.publisher)!;
      const target = clusters.get(route.target)!;
      const columns = columnsFor(Math.min(route.publisher, route.target));
      const sourceDb = `src_t${route.target}`;
      const sourceKey = `${route.publisher}/${sourceDb}`;
      if (!sources.has(sourceKey)) {
        await publisher.createDatabase(sourceDb);
        await publisher.query(
          `CREATE SCHEMA ty; ${TYPES_DDL} ${tablesDdl(columns, 'publisher')}
           ALTER TABLE ty.keyed ALTER COLUMN big SET STORAGE EXTERNAL;
           ALTER TABLE ty.full_identity ALTER COLUMN big SET STORAGE EXTERNAL;
           CREATE PUBLICATION types_pub FOR TABLE ${TABLES.join(', ')};
           ALTER DATABASE ${sourceDb} SET datestyle = 'SQL, DMY';
           ALTER DATABASE ${sourceDb} SET intervalstyle = 'sql_standard';`,
          [],
          sourceDb,
        );
        sources.set(sourceKey, { cluster: publisher, db: sourceDb, columns });
      }
      const targetDb = `dst_p${route.publisher}_${route.mode}`;
      await target.createDatabase(targetDb);
      await target.query(`CREATE SCHEMA ty; ${TARGET_FILLER} ${TYPES_DDL} ${tablesDdl(columns, 'target')}`, [], targetDb);
      const name = `types_${route.publisher}_${route.target}_${route.mode}`;
      const config = loadConfig({
        env: {},
        overrides: {
          subscription: name,
          source: publisher.url(sourceDb),
          target: target.url(targetDb),
          publication: 'types_pub',
          copy_data: false,
          binary: route.mode === 'binary',
          status_interval: 1,
        },
      });
      const errors: string[] = [];
      // Errors are retried with backoff: keep them to explain a timeout.
      const log = createLogger('warn', {
        write(line: string) {
          errors.push(line);
          if (errors.length > 20) errors.shift();
        },
      });
      subs.push({ route, name, publisher, sourceDb, target, targetDb, columns, runner: startRunner(config, log), errors });
    }
    await Promise.all(subs.map((s) => waitFor(async () => (await slotConfirmedLsn(s.publisher, s.name)) !== null, { timeoutMs: 60_000, what: `slot ${s.name}` })));
  });

  after(async () => {
    for (const s of subs) s.runner.stop();
    await Promise.all(subs.map((s) => s.runner.done.catch(() => undefined)));
    await Promise.all([...clusters.values()].map((c) => c.stop()));
  });

  /** Run `sql(columns)` on every source database, then wait until every subscription has applied it. */
  async function onPublishers(sql: (columns: Column[]) => string): Promise<void> {
    await Promise.all([...sources.values()].map((s) => s.cluster.query(`${SESSION} ${sql(s.columns)}`, [], s.db)));
    await Promise.all(
      subs.map(async (s) => {
        const end = await currentWalLsn(s.publisher, s.sourceDb);
        await waitFor(async () => ((await slotConfirmedLsn(s.publisher, s.name)) ?? 0n) >= end, {
          timeoutMs: 60_000,
          intervalMs: 100,
          what: `${label(s.route)} to confirm ${end}`,
        }).catch((err: Error) => {
          throw new Error(`${err.message}\nlast pgsub log lines:\n${s.errors.join('')}`);
        });
      }),
    );
  }

  /** Every column of every row, source against target, as text (see the header). */
  async function compare(s: Subscription): Promise<void> {
    const oldServer = Math.min(s.route.publisher, s.route.target) < 12;
    const exprs = s.columns.map((c) => (oldServer && c.send ? `encode(${c.send}(${c.name}), 'hex')` : (c.compareAs ?? `(${c.name})::text`)));
    const diffs: string[] = [];
    for (const table of TABLES) {
      const sql = `${SESSION} SELECT id, ${exprs.map((e, i) => `${e} AS c${i}`).join(', ')} FROM ${table} ORDER BY id`;
      const [src, dst] = await Promise.all([
        s.publisher.query<Record<string, string | null>>(sql, [], s.sourceDb),
        s.target.query<Record<string, string | null>>(sql, [], s.targetDb),
      ]);
      assert.deepEqual(
        dst.map((r) => r.id),
        src.map((r) => r.id),
        `${table}: row ids`,
      );
      src.forEach((row, k) => {
        s.columns.forEach((c, i) => {
          const a = row[`c${i}`] ?? null;
          const b = dst[k]![`c${i}`] ?? null;
          if (a !== b) diffs.push(`${table} id=${row.id} ${c.name} (${c.type}): source ${JSON.stringify(a)?.slice(0, 300)}, target ${JSON.stringify(b)?.slice(0, 300)}`);
        });
      });
    }
    assert.deepEqual(diffs, [], `${label(s.route)}: ${diffs.length} value(s) differ`);
  }

  test('binary routes asked the publisher for binary values', async () => {
    for (const s of subs) {
      let query = '';
      await waitFor(
        async () => {
          const rows = await s.publisher.query<{ query: string }>(`SELECT query FROM pg_stat_activity WHERE backend_type = 'walsender' AND query LIKE $1`, [
            `%START_REPLICATION SLOT "${s.name}"%`,
          ]);
          query = rows[0]?.query ?? '';
          return rows.length === 1;
        },
        { timeoutMs: 30_000, what: `${label(s.route)}: its walsender` },
      );
      assert.equal(query.includes(`binary 'true'`), s.route.mode === 'binary', query);
    }
  });

  test('INSERT: three rows of edge values and an all-NULL row', async (t) => {
    await onPublishers((columns) => TABLES.map((table) => [0, 1, 2].map((k) => insertRow(table, columns, k + 1, k)).join(' ') + insertRow(table, columns, 4, null)).join(' '));
    for (const s of subs) await t.test(label(s.route), () => compare(s));
  });

  test('UPDATE of every column: values to other values, NULL to values, values to NULL, key change', async (t) => {
    await onPublishers((columns) =>
      TABLES.map(
        (table) =>
          `BEGIN; ${setRow(table, columns, 1, 1)} ${setRow(table, columns, 2, 2)} ${setRow(table, columns, 3, 0)} ${setRow(table, columns, 4, 0)} COMMIT;
           ${setRow(table, columns, 3, null)}
           UPDATE ${table} SET id = 20 WHERE id = 2;`,
      ).join(' '),
    );
    for (const s of subs) await t.test(label(s.route), () => compare(s));
  });

  test('DELETE located by key, and by every column (REPLICA IDENTITY FULL)', async (t) => {
    await onPublishers(() => TABLES.map((table) => `DELETE FROM ${table} WHERE id IN (1, 4);`).join(' '));
    for (const s of subs) {
      await t.test(label(s.route), async () => {
        await compare(s);
        const [n] = await s.target.query<{ n: number }>(`SELECT (SELECT count(*) FROM ty.keyed)::int + (SELECT count(*) FROM ty.full_identity)::int AS n`, [], s.targetDb);
        assert.equal(n!.n, 4, 'rows 3 and 20 left in each table');
      });
    }
  });

  test('an out-of-line value stays as it is when another column changes (unchanged TOAST in a mixed tuple)', async (t) => {
    await onPublishers((columns) => TABLES.map((table) => `${insertRow(table, columns, 5, 0)} UPDATE ${table} SET i4 = 5, m = 'ok' WHERE id = 5;`).join(' '));
    for (const s of subs) {
      await t.test(label(s.route), async () => {
        await compare(s);
        const [row] = await s.target.query<{ len: number; i4: number }>(`SELECT length(big) AS len, i4 FROM ty.keyed WHERE id = 5`, [], s.targetDb);
        assert.deepEqual(row, { len: 128_000, i4: 5 });
      });
    }
  });

  test('a run of INSERTs in one transaction (COPY in text mode; binary mode keeps INSERT where a column changes type)', async (t) => {
    const copiedBefore = subs.map((s) => s.runner.counters.rowsCopied);
    await onPublishers((columns) =>
      TABLES.map((table) => `BEGIN; ${Array.from({ length: 24 }, (_, i) => insertRow(table, columns, 1000 + i, i % 4 === 3 ? null : i % 4)).join(' ')} COMMIT;`).join(' '),
    );
    for (const [i, s] of subs.entries()) {
      await t.test(label(s.route), async () => {
        await compare(s);
        if (s.route.mode === 'text') assert.ok(s.runner.counters.rowsCopied >= copiedBefore[i]! + 48, `rows copied: ${s.runner.counters.rowsCopied - copiedBefore[i]!}`);
      });
    }
  });

  test('runs of UPDATEs in one transaction, of whole rows and of rows whose out-of-line value stays (column arrays where the values allow)', async (t) => {
    await onPublishers((columns) =>
      TABLES.map(
        (table) =>
          `BEGIN; ${Array.from({ length: 24 }, (_, i) => setRow(table, columns, 1000 + i, i % 4 === 3 ? null : (i + 1) % 3)).join(' ')} COMMIT;
           UPDATE ${table} SET big = ${BIG} WHERE id BETWEEN 1000 AND 1023;
           UPDATE ${table} SET i4 = id, m = 'happy' WHERE id BETWEEN 1000 AND 1023;`,
      ).join(' '),
    );
    for (const s of subs) {
      await t.test(label(s.route), async () => {
        await compare(s);
        const [row] = await s.target.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM ty.keyed WHERE id BETWEEN 1000 AND 1023 AND length(big) = 128000 AND i4 = id AND m = 'happy'`,
          [],
          s.targetDb,
        );
        assert.equal(row!.n, 24);
      });
    }
  });

  test("publisher databases with DateStyle 'SQL, DMY' and IntervalStyle sql_standard: dates and intervals arrive unchanged", async () => {
    for (const { cluster, db } of sources.values()) {
      const [style] = await cluster.query<{ datestyle: string; intervalstyle: string }>(
        `SELECT current_setting('datestyle') AS datestyle, current_setting('intervalstyle') AS intervalstyle`,
        [],
        db,
      );
      assert.deepEqual(style, { datestyle: 'SQL, DMY', intervalstyle: 'sql_standard' }, `${db} on PG${cluster.major}`);
    }
    for (const s of subs) {
      const [row] = await s.target.query<{ dmy: string; iv: string }>(`${SESSION} SELECT dmy::text, iv::text FROM ty.keyed WHERE id = 5`, [], s.targetDb);
      assert.deepEqual(row, { dmy: '2001-02-03', iv: '178956970 years 7 mons 2147483647 days' }, label(s.route));
    }
  });

  test(`binary arrays, composites and domains of user-defined types from PG18 into PG${REWRITE_TARGET}, which checks the type OIDs they embed`, async () => {
    const publisher = clusters.get(18)!;
    const sourceDb = 'src_t18';
    const target = clusters.get(REWRITE_TARGET)!;
    const db = 'oid_rewrite';
    const columns = COLUMNS.filter((c) => c.type.startsWith('ty.') && !c.targetType);
    await target.createDatabase(db);
    await target.query(`CREATE SCHEMA ty; ${TARGET_FILLER} ${TYPES_DDL} CREATE TABLE ty.rw (id int PRIMARY KEY, ${columns.map((c) => `${c.name} ${c.type}`).join(', ')})`, [], db);
    // What pgoutput sends: a Type message per user-defined column type (a domain named by its
    // base type, logicalrep_write_typ), the column type OIDs, each value's send output.
    const types = await publisher.query<{ oid: number; nsp: string; name: string }>(
      `SELECT t.oid::int AS oid, n.nspname AS nsp, b.typname AS name
         FROM pg_type t JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
         JOIN pg_namespace n ON n.oid = b.typnamespace
        WHERE t.typnamespace = 'ty'::regnamespace`,
      [],
      sourceDb,
    );
    const remote: RelationColumn[] = [{ isKey: true, name: 'id', typeOid: 23, typeModifier: -1 }];
    const sends: string[] = [];
    for (const c of columns) {
      const [t] = await publisher.query<{ oid: number; send: string }>(`SELECT oid::int AS oid, typsend::text AS send FROM pg_type WHERE oid = '${c.type}'::regtype`, [], sourceDb);
      remote.push({ isKey: false, name: c.name, typeOid: t!.oid, typeModifier: -1 });
      sends.push(t!.send);
    }
    const rows: Tuple[] = [];
    for (let k = 0; k < 3; k++) {
      const [sent] = await publisher.query<Record<string, Buffer>>(
        `SELECT ${columns.map((c, i) => `${sends[i]}(CAST(${c.values[k]} AS ${c.type})) AS c${i}`).join(', ')}`,
        [],
        sourceDb,
      );
      rows.push([{ kind: 'text', value: String(k + 1) }, ...columns.map((_, i) => ({ kind: 'binary', value: sent![`c${i}`]! }) as const)]);
    }

    const conn = await openApplyConnection(parseConninfo(target.url(db), 'target', {}), { applicationName: 'pgsub_oid_rewrite_test', synchronousCommit: 'on' });
    try {
      const relations = new RelationMap(conn.serverVersionNum);
      for (const t of types) relations.onType(t.oid, t.nsp, t.name);
      relations.onRelation({ tag: 'relation', relationId: 1, namespace: 'ty', name: 'rw', replicaIdentity: 'default', columns: remote });
      const rel = await relations.resolve(conn, 1);
      for (const row of rows) {
        const st = insertStatement(rel, row);
        await Promise.all([conn.execute(st.text, st.params, st.paramTypes ? { paramTypes: st.paramTypes } : undefined), conn.sync()]);
      }
      // The same bytes unchanged are refused: this is what the rewrite is for.
      const ma = columns.findIndex((c) => c.name === 'ma');
      const raw = assert.rejects(conn.execute(`SELECT $1::ty.mood[]`, [(rows[0]![ma + 1] as { value: Buffer }).value]), /wrong element type/);
      await conn.sync();
      await raw;
    } finally {
      await conn.close();
    }
    const expected = await publisher.query<Record<string, string>>(
      `${SESSION} SELECT ${columns.map((c, i) => `ARRAY[${[0, 1, 2].map((k) => `CAST(${c.values[k]} AS ${c.type})::text`).join(', ')}] AS c${i}`).join(', ')}`,
      [],
      sourceDb,
    );
    const got = await target.query<Record<string, string>>(
      `${SESSION} SELECT ${columns.map((c, i) => `array_agg(${c.name}::text ORDER BY id) AS c${i}`).join(', ')} FROM ty.rw`,
      [],
      db,
    );
    for (const [i, c] of columns.entries()) assert.deepEqual(got[0]![`c${i}`], expected[0]![`c${i}`], c.name);
  });
});
