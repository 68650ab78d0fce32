/**
 * binary.ts without a server, on bytes captured from PostgreSQL 18.4: the same values sent
 * (array_send, record_send, range_send, multirange_send) by two databases whose
 * user-defined types have different OIDs. Rewriting the "publisher" bytes by the
 * "target" type's plan must give exactly the bytes the target itself sends for the value.
 *
 * Captured with, in both databases (the target created three other types first, so every
 * user-defined OID differs):
 *
 *   CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
 *   CREATE DOMAIN app.moods AS app.mood[];
 *   CREATE TYPE app.comp AS (t text, i int, m app.mood);
 *   CREATE TYPE app.nest AS (c app.comp, ms app.mood[], n int, cs app.comp[]);
 *   CREATE TYPE app.comprange AS RANGE (subtype = app.comp);
 *   CREATE DOMAIN app.posint AS int CHECK (VALUE > 0);
 *   CREATE TYPE app.dcomp AS (p app.posint, pa app.posint[]);
 *
 * and `SELECT encode(array_send(…), 'hex')` etc. for the values named in SENT below.
 * Then the statement builders in binary mode (params.ts): Buffers bound as they came, Parse types only where
 * the remote type differs from the target column's, rewritten OIDs, typed errors.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { BinaryLayoutError, FIRST_GENBKI_OID, oidPlan, rewriteOids, type TargetTypeInfo } from '../../src/apply/sql/binary.js';
import type { BinaryColumns, MappedRelation } from '../../src/apply/sql/mapped-relation.js';
import { insertStatement } from '../../src/apply/sql/insert.js';
import { updateStatement } from '../../src/apply/sql/update.js';
import { deleteStatement } from '../../src/apply/sql/delete.js';
import { SchemaMismatchError } from '../../src/errors.js';
import type { TupleValue } from '../../src/protocol/messages.js';

// Target OIDs (cap_tgt); publisher OIDs are mood 16483, _mood 16482, comp 16493, _comp 16492, …
const T = {
  mood: 16450,
  moodArr: 16449,
  moods: 16458,
  comp: 16461,
  compArr: 16460,
  nest: 16464,
  nestArr: 16463,
  comprange: 16468,
  compmultirange: 16466,
  posint: 16476,
  posintArr: 16475,
  dcomp: 16480,
} as const;
const TEXT = 25;
const INT4 = 23;
const INT4_ARRAY = 1007;

function info(oid: number, typtype: string, name: string, more: Partial<TargetTypeInfo> = {}): [number, TargetTypeInfo] {
  return [oid, { oid, typtype, elem: 0, base: 0, fields: [], inner: 0, name: `"app"."${name}"`, ...more }];
}

/** The target's catalog rows, as type-catalog.ts's targetTypes query returns them. */
const TYPES: ReadonlyMap<number, TargetTypeInfo> = new Map([
  info(TEXT, 'b', 'text'),
  info(INT4, 'b', 'int4'),
  info(INT4_ARRAY, 'b', '_int4', { elem: INT4 }),
  info(T.mood, 'e', 'mood'),
  info(T.moodArr, 'b', '_mood', { elem: T.mood }),
  info(T.moods, 'd', 'moods', { base: T.moodArr }),
  info(T.comp, 'c', 'comp', { fields: [TEXT, INT4, T.mood] }),
  info(T.compArr, 'b', '_comp', { elem: T.comp }),
  info(T.nest, 'c', 'nest', { fields: [T.comp, T.moodArr, INT4, T.compArr] }),
  info(T.nestArr, 'b', '_nest', { elem: T.nest }),
  info(T.comprange, 'r', 'comprange', { inner: T.comp }),
  info(T.compmultirange, 'm', 'compmultirange', { inner: T.comprange }),
  info(T.posint, 'd', 'posint', { base: INT4 }),
  info(T.posintArr, 'b', '_posint', { elem: T.posint }),
  info(T.dcomp, 'c', 'dcomp', { fields: [T.posint, T.posintArr] }),
]);

interface Capture {
  name: string;
  sql: string;
  type: number;
  publisher: string;
  target: string;
}

const SENT: Capture[] = [
  {
    name: '2-D enum array with a NULL element',
    sql: `array_send(ARRAY[['sad',NULL],['ok','happy']]::app.mood[])`,
    type: T.moodArr,
    publisher: '0000000200000001000040630000000200000001000000020000000100000003736164ffffffff000000026f6b000000056861707079',
    target: '0000000200000001000040420000000200000001000000020000000100000003736164ffffffff000000026f6b000000056861707079',
  },
  {
    name: 'empty enum array (no dimensions, element type still sent)',
    sql: `array_send('{}'::app.mood[])`,
    type: T.moodArr,
    publisher: '000000000000000000004063',
    target: '000000000000000000004042',
  },
  {
    name: 'enum array with lower bound 0',
    sql: `array_send('[0:1]={sad,ok}'::app.mood[])`,
    type: T.moodArr,
    publisher: '000000010000000000004063000000020000000000000003736164000000026f6b',
    target: '000000010000000000004042000000020000000000000003736164000000026f6b',
  },
  {
    name: 'domain over an enum array',
    sql: `array_send('{happy}'::app.moods)`,
    type: T.moods,
    publisher: '0000000100000000000040630000000100000001000000056861707079',
    target: '0000000100000000000040420000000100000001000000056861707079',
  },
  {
    name: 'composite with an enum field',
    sql: `record_send(row('x', 1, 'sad')::app.comp)`,
    type: T.comp,
    publisher: '000000030000001900000001780000001700000004000000010000406300000003736164',
    target: '000000030000001900000001780000001700000004000000010000404200000003736164',
  },
  {
    name: 'composite of NULL fields (field OIDs are sent for NULLs too)',
    sql: `record_send(row(NULL, NULL, NULL)::app.comp)`,
    type: T.comp,
    publisher: '0000000300000019ffffffff00000017ffffffff00004063ffffffff',
    target: '0000000300000019ffffffff00000017ffffffff00004042ffffffff',
  },
  {
    name: 'composite array with a NULL element and quotes/commas in text',
    sql: `array_send(ARRAY[row('a,"b"', 2, 'ok')::app.comp, NULL, row(NULL, 3, 'happy')::app.comp])`,
    type: T.compArr,
    publisher:
      '00000001000000010000406d000000030000000100000027000000030000001900000005612c22622200000017000000040000000200004063000000026f6bffffffff000000250000000300000019ffffffff00000017000000040000000300004063000000056861707079',
    target:
      '00000001000000010000404d000000030000000100000027000000030000001900000005612c22622200000017000000040000000200004042000000026f6bffffffff000000250000000300000019ffffffff00000017000000040000000300004042000000056861707079',
  },
  {
    name: 'composite nesting a composite, an enum array and a composite array',
    sql: `record_send(row(row('y', 2, 'ok')::app.comp, '{sad,NULL}'::app.mood[], 7, ARRAY[row('z', 3, 'happy')::app.comp])::app.nest)`,
    type: T.nest,
    publisher:
      '000000040000406d000000230000000300000019000000017900000017000000040000000200004063000000026f6b000040620000001f000000010000000100004063000000020000000100000003736164ffffffff0000001700000004000000070000406c0000003e00000001000000000000406d0000000100000001000000260000000300000019000000017a00000017000000040000000300004063000000056861707079',
    target:
      '000000040000404d000000230000000300000019000000017900000017000000040000000200004042000000026f6b000040410000001f000000010000000100004042000000020000000100000003736164ffffffff0000001700000004000000070000404c0000003e00000001000000000000404d0000000100000001000000260000000300000019000000017a00000017000000040000000300004042000000056861707079',
  },
  {
    name: 'array of that composite, with NULL and empty members',
    sql: `array_send(ARRAY[row(NULL, '{ok}', NULL, '{}')::app.nest])`,
    type: T.nestArr,
    publisher:
      '00000001000000000000407000000001000000010000004a000000040000406dffffffff000040620000001a0000000100000000000040630000000100000001000000026f6b00000017ffffffff0000406c0000000c00000000000000000000406d',
    target:
      '00000001000000000000405000000001000000010000004a000000040000404dffffffff000040410000001a0000000100000000000040420000000100000001000000026f6b00000017ffffffff0000404c0000000c00000000000000000000404d',
  },
  {
    name: 'range over a composite',
    sql: `range_send(app.comprange(row('a',1,'sad')::app.comp, row('b',2,'ok')::app.comp))`,
    type: T.comprange,
    publisher: '0200000024000000030000001900000001610000001700000004000000010000406300000003736164000000230000000300000019000000016200000017000000040000000200004063000000026f6b',
    target: '0200000024000000030000001900000001610000001700000004000000010000404200000003736164000000230000000300000019000000016200000017000000040000000200004042000000026f6b',
  },
  {
    name: 'range over a composite, upper bound unbounded',
    sql: `range_send(app.comprange(row('a',1,'sad')::app.comp, NULL, '[)'))`,
    type: T.comprange,
    publisher: '1200000024000000030000001900000001610000001700000004000000010000406300000003736164',
    target: '1200000024000000030000001900000001610000001700000004000000010000404200000003736164',
  },
  {
    name: 'empty range',
    sql: `range_send('empty'::app.comprange)`,
    type: T.comprange,
    publisher: '01',
    target: '01',
  },
  {
    name: 'multirange over a composite',
    sql: `multirange_send(app.compmultirange(app.comprange(row('a',1,'sad')::app.comp, row('b',2,'ok')::app.comp), app.comprange(row('c',3,'happy')::app.comp, NULL, '[]')))`,
    type: T.compmultirange,
    publisher:
      '00000002000000500200000024000000030000001900000001610000001700000004000000010000406300000003736164000000230000000300000019000000016200000017000000040000000200004063000000026f6b0000002b12000000260000000300000019000000016300000017000000040000000300004063000000056861707079',
    target:
      '00000002000000500200000024000000030000001900000001610000001700000004000000010000404200000003736164000000230000000300000019000000016200000017000000040000000200004042000000026f6b0000002b12000000260000000300000019000000016300000017000000040000000300004042000000056861707079',
  },
  {
    name: 'composite with a domain field and an array of that domain (domain OIDs are embedded)',
    sql: `record_send(row(5, '{1,2}')::app.dcomp)`,
    type: T.dcomp,
    publisher: '000000020000407c00000004000000050000407b0000002400000001000000000000407c000000020000000100000004000000010000000400000002',
    target: '000000020000405c00000004000000050000405b0000002400000001000000000000405c000000020000000100000004000000010000000400000002',
  },
];

const hex = (s: string) => Buffer.from(s, 'hex');

describe('oidPlan', () => {
  test('built-in types, enums, domains over built-ins and arrays of them need no rewriting', () => {
    for (const oid of [TEXT, INT4, INT4_ARRAY, T.mood, T.posint]) assert.equal(oidPlan(oid, TYPES), null, String(oid));
    assert.equal(oidPlan(424242, TYPES), null, 'unknown type');
  });

  test('arrays of user-defined types, composites, ranges and multiranges over them, domains over those', () => {
    assert.deepEqual(oidPlan(T.moodArr, TYPES), { kind: 'array', elemOid: T.mood, elem: null });
    assert.deepEqual(oidPlan(T.moods, TYPES), oidPlan(T.moodArr, TYPES), "a domain has its base type's plan");
    assert.equal(oidPlan(T.comp, TYPES)?.kind, 'record');
    assert.equal(oidPlan(T.comprange, TYPES)?.kind, 'range');
    assert.equal(oidPlan(T.compmultirange, TYPES)?.kind, 'multirange');
  });
});

describe('rewriteOids on bytes sent by PostgreSQL 18', () => {
  for (const c of SENT) {
    test(c.name, () => {
      const sent = hex(c.publisher);
      const before = Buffer.from(sent);
      const plan = oidPlan(c.type, TYPES);
      assert.ok(plan, 'has a plan');
      const out = rewriteOids(sent, plan);
      assert.equal(out.toString('hex'), c.target, c.sql);
      assert.deepEqual(sent, before, 'the input is not modified');
      // The target's own bytes are left as they are, and not copied.
      const own = hex(c.target);
      assert.equal(rewriteOids(own, plan), own);
    });
  }

  test('every truncation of every value passes through unchanged (the server reports it)', () => {
    for (const c of SENT) {
      const plan = oidPlan(c.type, TYPES)!;
      const full = hex(c.publisher);
      for (let n = 0; n < full.length; n++) {
        const cut = full.subarray(0, n);
        const out = rewriteOids(cut, plan);
        // A truncated value can still parse up to a patched OID only if nothing after it is
        // needed, which never holds for these layouts: the length prefixes overrun.
        assert.equal(out, cut, `${c.name}: first ${n} bytes`);
      }
    }
  });

  test('a built-in OID where another built-in type is expected is left for the server to report', () => {
    // comp's first field sent as varchar (1043) instead of text (25): a real type mismatch.
    const sent = hex(SENT[4]!.publisher);
    sent.writeUInt32BE(1043, 4);
    const out = rewriteOids(sent, oidPlan(T.comp, TYPES)!);
    assert.equal(out.readUInt32BE(4), 1043);
    assert.equal(out.readUInt32BE(4 + 4 + 4 + 1 + 4 + 4 + 4), T.mood, 'the enum field is still rewritten');
  });

  test('a user-defined OID where a built-in is expected is not rewritten', () => {
    const sent = hex(SENT[4]!.publisher);
    sent.writeUInt32BE(FIRST_GENBKI_OID + 5000, 4);
    assert.equal(rewriteOids(sent, oidPlan(T.comp, TYPES)!).readUInt32BE(4), FIRST_GENBKI_OID + 5000);
  });

  test('a composite with another field count is a schema mismatch naming the target type', () => {
    const twoFields = new Map(TYPES);
    twoFields.set(T.comp, { ...TYPES.get(T.comp)!, fields: [TEXT, INT4] });
    assert.throws(
      () => rewriteOids(hex(SENT[4]!.publisher), oidPlan(T.comp, twoFields)!),
      (e: unknown) => {
        assert.ok(e instanceof BinaryLayoutError);
        assert.ok(e instanceof SchemaMismatchError);
        assert.match(e.message, /composite value has 3 fields, target type "app"\."comp" has 2/);
        assert.equal(e.typeName, '"app"."comp"');
        return true;
      },
    );
  });

  test('nested composite field count mismatch inside an array is found too', () => {
    const fourFields = new Map(TYPES);
    fourFields.set(T.comp, { ...TYPES.get(T.comp)!, fields: [TEXT, INT4, T.mood, INT4] });
    assert.throws(() => rewriteOids(hex(SENT[6]!.publisher), oidPlan(T.compArr, fourFields)!), BinaryLayoutError);
  });
});

describe('statements in binary mode', () => {
  const INT8 = 20;
  const TSQUERY = 3615;
  /** Remote columns: id int4 (key) → int8 column, moods mood[] (remote OID 16482) → mood[], q tsquery, note text. */
  function rel(binary?: BinaryColumns): MappedRelation {
    const remoteTypes = [INT4, 16482, TSQUERY, TEXT];
    const targetTypes: [number, string][] = [
      [INT8, '"pg_catalog"."int8"'],
      [T.moodArr, '"app"."_mood"'],
      [TSQUERY, '"pg_catalog"."tsquery"'],
      [TEXT, '"pg_catalog"."text"'],
    ];
    const names = ['id', 'moods', 'q', 'note'];
    return {
      ordered: false,
      rowSecurity: false,
      remote: {
        tag: 'relation',
        relationId: 16400,
        namespace: 'app',
        name: 'bin',
        replicaIdentity: 'default',
        columns: names.map((name, i) => ({ isKey: i === 0, name, typeOid: remoteTypes[i]!, typeModifier: -1 })),
      },
      qualifiedName: '"app"."bin"',
      displayName: 'app.bin',
      relkind: 'r',
      targetColumns: names.map((name, i) => ({ name, typeOid: targetTypes[i]![0], typeName: targetTypes[i]![1], generated: false, hasEquality: true })),
      keyIndexes: [0],
      statements: new Map(),
      paramColumns: new Map(),
      ...(binary ? { binary } : {}),
    };
  }
  // What relmap.ts computes for it: id is read as int4 and cast; moods needs its OIDs rewritten.
  const BINARY: BinaryColumns = { parseTypes: [INT4, 0, 0, 0], plans: [null, oidPlan(T.moodArr, TYPES), null, null] };
  const int4 = (n: number): TupleValue => {
    const b = Buffer.alloc(4);
    b.writeInt32BE(n);
    return { kind: 'binary', value: b };
  };
  const bin = (h: string): TupleValue => ({ kind: 'binary', value: hex(h) });
  const text = (value: string): TupleValue => ({ kind: 'text', value });
  const NULL: TupleValue = { kind: 'null' };

  test('a tuple mixing binary, text and NULL binds Buffers in binary and strings in text format', () => {
    const s = insertStatement(rel(), [int4(7), NULL, text('fat & rat'), bin('6869')]);
    assert.equal(
      s.text,
      `INSERT INTO "app"."bin" ("id", "moods", "q", "note") VALUES ($1::"pg_catalog"."int8", $2::"app"."_mood", $3::"pg_catalog"."tsquery", $4::"pg_catalog"."text")`,
    );
    assert.deepEqual(s.params, [hex('00000007'), null, 'fat & rat', hex('6869')]);
    assert.equal(s.paramTypes, undefined, 'no binary bookkeeping: every type from its cast');
  });

  test("Parse types: the remote type for a binary value whose type differs from the column's, 0 for everything else", () => {
    const s = insertStatement(rel(BINARY), [int4(7), NULL, text('x'), text('y')]);
    assert.deepEqual(s.paramTypes, [INT4, 0, 0, 0]);
    // The same column in text (a type without binary send, or text mode): the cast's type reads it.
    assert.equal(insertStatement(rel(BINARY), [text('7'), NULL, text('x'), text('y')]).paramTypes, undefined);
    // UPDATE: SET parameters first, then the key; the key is the same int4 column.
    const u = updateStatement(rel(BINARY), 'key', [int4(1), NULL, NULL, NULL], [int4(2), NULL, text('x'), bin('6869')]);
    assert.match(u.text, /WHERE "id" = \$5::"pg_catalog"."int8"$/);
    assert.deepEqual(u.paramTypes, [INT4, 0, 0, 0, INT4]);
    assert.deepEqual(deleteStatement(rel(BINARY), 'key', [int4(1), NULL, NULL, NULL]).paramTypes, [INT4]);
  });

  test("embedded OIDs are rewritten to the target's before binding", () => {
    const s = insertStatement(rel(BINARY), [int4(1), bin(SENT[0]!.publisher), NULL, NULL]);
    assert.equal((s.params[1] as Buffer).toString('hex'), SENT[0]!.target);
  });

  test('the empty tsquery, which tsqueryrecv cannot read, goes as its text form', () => {
    const s = insertStatement(rel(BINARY), [int4(1), NULL, bin('00000000'), NULL]);
    assert.equal(s.params[2], '');
    assert.deepEqual(s.paramTypes, [INT4, 0, 0, 0]);
    assert.deepEqual(insertStatement(rel(BINARY), [int4(1), NULL, bin('000000010100006100'), NULL]).params[2], hex('000000010100006100'), "'a' stays binary");
  });

  test('a composite whose field count differs from the target type is a schema mismatch naming table and column', () => {
    const twoFields = new Map(TYPES);
    twoFields.set(T.comp, { ...TYPES.get(T.comp)!, fields: [TEXT, INT4] });
    const r = rel({ parseTypes: null, plans: [null, oidPlan(T.compArr, twoFields), null, null] });
    assert.throws(
      () => insertStatement(r, [int4(1), bin(SENT[6]!.publisher), NULL, NULL]),
      (e: unknown) =>
        e instanceof SchemaMismatchError &&
        /column "moods" of "app\.bin".*3 fields, target type "app"\."comp" has 2/.test(e.message) &&
        e.context.relation === 'app.bin' &&
        e.context.column === 'moods',
    );
  });
});
