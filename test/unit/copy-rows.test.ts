/**
 * copy-rows.ts without a server: the COPY texts (quoted names, the INSERT path's column
 * list), the exact bytes of the text and binary COPY inputs, when COPY cannot carry a
 * batch (null: the INSERT path applies it), and wire-tags.ts copyFrames, which frames
 * the input as CopyData/CopyDone messages.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { copyInsertStatement } from '../../src/apply/sql/copy-rows.js';
import type { BinaryColumns, MappedRelation } from '../../src/apply/sql/mapped-relation.js';
import { copyFrames } from '../../src/pgwire/wire-tags.js';
import { SchemaMismatchError } from '../../src/errors.js';
import type { Tuple, TupleValue } from '../../src/protocol/messages.js';

function relation(columns: { name: string; typeOid?: number }[], binary?: BinaryColumns): MappedRelation {
  const rel: MappedRelation = {
    remote: {
      tag: 'relation',
      relationId: 16384,
      namespace: 'a"b',
      name: 'ünï',
      replicaIdentity: 'default',
      columns: columns.map((c, i) => ({ isKey: i === 0, name: c.name, typeOid: c.typeOid ?? 25, typeModifier: -1 })),
    },
    qualifiedName: '"a""b"."ünï"',
    displayName: 'a"b.ünï',
    relkind: 'r',
    targetColumns: columns.map((c) => ({ name: c.name, typeOid: c.typeOid ?? 25, typeName: '"pg_catalog"."text"', generated: false, hasEquality: true })),
    keyIndexes: [0],
    statements: new Map(),
    paramColumns: new Map(),
    ordered: false,
    rowSecurity: false,
  };
  if (binary) rel.binary = binary;
  return rel;
}

const t = (value: string): TupleValue => ({ kind: 'text', value });
const b = (value: Buffer | number[]): TupleValue => ({ kind: 'binary', value: Buffer.isBuffer(value) ? value : Buffer.from(value) });
const NULL: TupleValue = { kind: 'null' };
const UNCHANGED: TupleValue = { kind: 'unchanged' };
const int4 = (n: number) => {
  const buf = Buffer.alloc(4);
  buf.writeInt32BE(n);
  return buf;
};
const SIGNATURE = Buffer.from('PGCOPY\n\xff\r\n\0', 'latin1');

describe('copyInsertStatement', () => {
  const rel = relation([{ name: 'id' }, { name: 'we"ird' }, { name: 'ünï' }]);

  test('text rows: tab-separated, \\N for NULL, specials escaped, UTF-8 kept', () => {
    const tuples: Tuple[] = [
      [t('1'), t('tab\there'), t('nl\nline cr\r back\\slash')],
      [t('2'), NULL, t('ünïcödé "quoted" \'single\' 😀')],
      [t('3'), t('\\.'), t('')],
    ];
    const copy = copyInsertStatement(rel, tuples)!;
    assert.equal(copy.text, 'COPY "a""b"."ünï" ("id", "we""ird", "ünï") FROM STDIN');
    assert.equal(copy.data.length, 1);
    assert.equal(copy.data[0]!.toString('utf8'), '1\ttab\\there\tnl\\nline cr\\r back\\\\slash\n' + '2\t\\N\tünïcödé "quoted" \'single\' 😀\n' + '3\t\\\\.\t\n');
  });

  test('rows of NULLs only go as text', () => {
    const copy = copyInsertStatement(rel, [[NULL, NULL, NULL]])!;
    assert.equal(copy.data[0]!.toString(), '\\N\t\\N\t\\N\n');
  });

  test('binary rows: signature, flags, per-row field count, lengths, -1 for NULL, trailer', () => {
    const brel = relation([
      { name: 'id', typeOid: 23 },
      { name: 'v', typeOid: 17 },
    ]);
    const copy = copyInsertStatement(brel, [
      [b(int4(7)), b([0xde, 0xad])],
      [b(int4(-1)), NULL],
    ])!;
    assert.equal(copy.text, 'COPY "a""b"."ünï" ("id", "v") FROM STDIN WITH (FORMAT binary)');
    const want = Buffer.concat([
      SIGNATURE,
      Buffer.from([0, 0, 0, 0, 0, 0, 0, 0]),
      Buffer.from([0, 2, 0, 0, 0, 4, 0, 0, 0, 7, 0, 0, 0, 2, 0xde, 0xad]),
      Buffer.from([0, 2, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
      Buffer.from([0xff, 0xff]),
    ]);
    assert.deepEqual(copy.data[0], want);
  });

  test('statement texts are cached per relation and format', () => {
    const r = relation([{ name: 'x' }]);
    copyInsertStatement(r, [[t('1')]]);
    copyInsertStatement(r, [[b([1])]]);
    assert.deepEqual([...r.statements.keys()].sort(), ['C|binary', 'C|text']);
  });

  test('null where only the INSERT path can apply the rows', () => {
    assert.equal(copyInsertStatement(rel, []), null, 'no rows');
    assert.equal(copyInsertStatement(rel, [[t('1'), b([1]), NULL]]), null, 'text and binary in one row');
    assert.equal(
      copyInsertStatement(rel, [
        [t('1'), t('x'), NULL],
        [b([1]), b([2]), NULL],
      ]),
      null,
      'text and binary in different rows',
    );
    assert.equal(copyInsertStatement(rel, [[t('1'), UNCHANGED, NULL]]), null, 'unchanged TOAST value');
    assert.equal(copyInsertStatement(rel, [[t('1'), t('x')]]), null, 'narrower tuple');
    assert.equal(copyInsertStatement(rel, [[t('1'), t('x'), t('y'), t('z')]]), null, 'wider tuple');
  });

  test('binary: null where the INSERT path reads a value as another type or sends it as text', () => {
    // Remote int4 into a target int8 column: the INSERT path's cast converts, COPY cannot.
    const widened = relation(
      [
        { name: 'id', typeOid: 23 },
        { name: 'n', typeOid: 23 },
      ],
      { parseTypes: [0, 23], plans: null },
    );
    assert.equal(copyInsertStatement(widened, [[b(int4(1)), b(int4(2))]]), null);
    // … but a column that only carries NULLs needs no conversion.
    assert.ok(copyInsertStatement(widened, [[b(int4(1)), NULL]]));
    // The empty tsquery, which tsqueryrecv rejects (binary.ts textForUnreceivable).
    const tsq = relation([{ name: 'q', typeOid: 3615 }]);
    assert.equal(copyInsertStatement(tsq, [[b([0, 0, 0, 0])]]), null);
    assert.ok(copyInsertStatement(tsq, [[b([0, 0, 0, 1, 1, 1, 0, 0x61, 0])]]));
  });

  test("binary: user-defined OIDs embedded in arrays are rewritten to the target's", () => {
    // int32 ndim 1, hasnull 0, elemtype 16483 (publisher's enum), dim 1, lbound 1, one element "ok"
    const sent = Buffer.from('00000001000000000000406300000001000000010000000' + '26f6b', 'hex');
    const rel2 = relation([{ name: 'moods', typeOid: 16482 }], { parseTypes: null, plans: [{ kind: 'array', elemOid: 16450, elem: null }] });
    const copy = copyInsertStatement(rel2, [[b(sent)]])!;
    const field = copy.data[0]!.subarray(SIGNATURE.length + 8 + 2 + 4, -2);
    assert.equal(field.readUInt32BE(8), 16450);
    assert.equal(sent.readUInt32BE(8), 16483, 'the input is not modified');
    // A composite whose field count differs is a typed schema mismatch, as on the INSERT path.
    const comp = relation([{ name: 'c', typeOid: 16493 }], { parseTypes: null, plans: [{ kind: 'record', typeName: '"app"."comp"', fields: [{ oid: 25, plan: null }] }] });
    assert.throws(() => copyInsertStatement(comp, [[b([0, 0, 0, 2])]]), SchemaMismatchError);
  });

  test('sizes are exact for many rows of mixed widths', () => {
    const tuples: Tuple[] = [];
    for (let i = 0; i < 2000; i++) tuples.push([t(String(i)), i % 7 === 0 ? NULL : t(`${'x'.repeat(i % 50)}\t\\é`), t('😀'.repeat(i % 3))]);
    const out = copyInsertStatement(rel, tuples)!.data[0]!.toString('utf8');
    const lines = out.split('\n');
    assert.equal(lines.length, 2001);
    assert.equal(lines[2000], '');
    assert.equal(lines[14], '14\t\\N\t😀😀');
    assert.equal(lines[15], `15\t${'x'.repeat(15)}\\t\\\\é\t`);
  });
});

describe('copyFrames', () => {
  test('small input: one buffer of CopyData messages and CopyDone, empty parts skipped', () => {
    const [only, ...rest] = copyFrames([Buffer.from('ab'), Buffer.alloc(0), Buffer.from('c')]);
    assert.equal(rest.length, 0);
    assert.deepEqual(only, Buffer.from([0x64, 0, 0, 0, 6, 0x61, 0x62, 0x64, 0, 0, 0, 5, 0x63, 0x63, 0, 0, 0, 4]));
    assert.deepEqual(copyFrames([]), [Buffer.from([0x63, 0, 0, 0, 4])]);
  });

  test('large input: chunked messages referencing the payload, same bytes as one message each', () => {
    const data = Buffer.alloc(200_000, 7);
    const frames = copyFrames([data, Buffer.from('xyz')], 65_536);
    const wire = Buffer.concat(frames);
    const payloads: Buffer[] = [];
    let at = 0;
    for (;;) {
      const type = wire[at]!;
      const len = wire.readInt32BE(at + 1);
      if (type === 0x63) {
        assert.equal(len, 4);
        assert.equal(at + 5, wire.length);
        break;
      }
      assert.equal(type, 0x64);
      assert.ok(len - 4 <= 65_536);
      payloads.push(wire.subarray(at + 5, at + 1 + len));
      at += 1 + len;
    }
    assert.equal(payloads.length, 5);
    assert.deepEqual(Buffer.concat(payloads), Buffer.concat([data, Buffer.from('xyz')]));
    assert.equal(frames[1]!.buffer, data.buffer, 'payload not copied');
  });
});
