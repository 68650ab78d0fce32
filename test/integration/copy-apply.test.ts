/**
 * COPY on the apply connection against real PostgreSQL (18 and 10 by default;
 * PGSUB_COPY_MAJORS=18,12 picks others): copy-rows.ts encodes tuples as pgoutput sends
 * them (binary values are the types' send output, text values their output) and
 * WireConnection.copyIn pipelines the COPY with its data. Rows must round-trip exactly in
 * both formats, into a table and columns whose names need quoting; a failing COPY follows
 * the pipeline's abort-until-Sync rules and the connection recovers; a COPY keeps its
 * place among other statements in one transaction; a multi-megabyte COPY works.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { parseConninfo, type ConnInfo } from '../../src/config/conninfo.js';
import { copyFromInsertMessages, insertsCopyAsSent } from '../../src/apply/sql/copy-messages.js';
import { copyInsertStatement } from '../../src/apply/sql/copy-rows.js';
import type { MappedRelation } from '../../src/apply/sql/mapped-relation.js';
import { PipelineAbortedError, WireConnection, WireUsageError } from '../../src/pgwire/wire.js';
import type { Tuple, TupleValue } from '../../src/protocol/messages.js';
import { startCluster, stopAllClusters, withTimeout, type Cluster } from '../harness/index.js';

const MAJORS = (process.env.PGSUB_COPY_MAJORS ?? '18,10').split(',').map(Number);

/** Remote column, target column name, type, OID, and the send function giving its binary form. */
const COLUMNS = [
  { name: 'id', target: 'id', type: 'int8', oid: 20, send: 'int8send' },
  { name: 'i2', target: 'i2', type: 'int2', oid: 21, send: 'int2send' },
  { name: 'i4', target: 'a"b', type: 'int4', oid: 23, send: 'int4send' },
  { name: 'i8', target: 'i8', type: 'int8', oid: 20, send: 'int8send' },
  { name: 'n', target: 'n', type: 'numeric', oid: 1700, send: 'numeric_send' },
  { name: 't', target: 'ünï', type: 'text', oid: 25, send: 'textsend' },
  { name: 'by', target: 'by', type: 'bytea', oid: 17, send: 'byteasend' },
  { name: 'bo', target: 'bo', type: 'bool', oid: 16, send: 'boolsend' },
  { name: 'ts', target: 'ts', type: 'timestamptz', oid: 1184, send: 'timestamptz_send' },
  { name: 'd', target: 'd', type: 'date', oid: 1082, send: 'date_send' },
  { name: 'j', target: 'j', type: 'jsonb', oid: 3802, send: 'jsonb_send' },
  { name: 'u', target: 'u', type: 'uuid', oid: 2950, send: 'uuid_send' },
  { name: 'ia', target: 'ia', type: 'int4[]', oid: 1007, send: 'array_send' },
  { name: 'ta', target: 'ta', type: 'text[]', oid: 1009, send: 'array_send' },
] as const;

/** A pgoutput Insert message (outside streams) carrying `tuple`. */
function insertMessage(tuple: Tuple): Buffer {
  const parts: Buffer[] = [Buffer.from([0x49, 0, 0, 0x40, 0, 0x4e]), Buffer.from([tuple.length >> 8, tuple.length & 0xff])];
  for (const v of tuple) {
    if (v.kind === 'null') parts.push(Buffer.from('n'));
    else if (v.kind === 'unchanged') parts.push(Buffer.from('u'));
    else {
      const value = v.kind === 'binary' ? v.value : Buffer.from(v.value);
      const head = Buffer.alloc(5);
      head.write(v.kind === 'binary' ? 'b' : 't', 0, 'latin1');
      head.writeInt32BE(value.length, 1);
      parts.push(head, value);
    }
  }
  return Buffer.concat(parts);
}

const quote = (name: string) => `"${name.replace(/"/g, '""')}"`;

/** A relation-map entry as relmap.ts builds it for a target table whose types match the publisher's. */
function mapped(schema: string, table: string, columns: readonly { name: string; target: string; oid: number; type: string }[]): MappedRelation {
  return {
    remote: {
      tag: 'relation',
      relationId: 16384,
      namespace: schema,
      name: table,
      replicaIdentity: 'default',
      columns: columns.map((c, i) => ({ isKey: i === 0, name: c.target, typeOid: c.oid, typeModifier: -1 })),
    },
    qualifiedName: `${quote(schema)}.${quote(table)}`,
    displayName: `${schema}.${table}`,
    relkind: 'r',
    targetColumns: columns.map((c) => ({ name: c.target, typeOid: c.oid, typeName: c.type, generated: false, hasEquality: true })),
    keyIndexes: [0],
    statements: new Map(),
    paramColumns: new Map(),
    ordered: false,
    rowSecurity: false,
  };
}

for (const major of MAJORS) {
  describe(`COPY on the apply connection, PostgreSQL ${major}`, () => {
    let cluster: Cluster;
    let info: ConnInfo;
    const open: WireConnection[] = [];
    const db = 'copy';
    const sql = <T = Record<string, string | null>>(text: string) => cluster.query<T>(text, [], db);

    async function connect(): Promise<WireConnection> {
      const wire = await WireConnection.connect(info, { applicationName: 'pgsub-copy-test' });
      open.push(wire);
      return wire;
    }

    /** The rows of `table` as text, for exact comparison. */
    async function rowsOf(table: string): Promise<string[]> {
      return (await sql<{ r: string }>(`SELECT (x.*)::text AS r FROM ${table} x ORDER BY 1`)).map((r) => r.r);
    }

    before(async () => {
      cluster = await startCluster({ major, name: `copy${major}` });
      await cluster.createDatabase(db);
      info = parseConninfo(cluster.url(db), 'target', {});
      const defs = (names: 'name' | 'target') => COLUMNS.map((c) => `${quote(c[names])} ${c.type}${c.name === 'id' ? ' PRIMARY KEY' : ''}`).join(', ');
      await sql(`
        CREATE TABLE public.src (${defs('name')});
        CREATE SCHEMA "a""b";
        CREATE TABLE "a""b"."ünï" (${defs('target')});
        CREATE TABLE "a""b"."ünï_text" (${defs('target')});
        INSERT INTO public.src VALUES
          (1, 1, 2, 3, '-12345678901234567890.000123456789',
           E'tab\\there\\nnew\\\\back\\rcr "dq" ''sq'' ünï 😀 \\\\. \\\\N end',
           '\\x00ff0a5c09'::bytea, true, '2024-02-29 12:34:56.789012+05:30', '2024-02-29',
           '{"a": [1, "x\\ty", null], "ü": "\\\\n"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
           '{1,NULL,-3}', '{"a b",NULL,"NULL","q\\"uote","back\\\\slash","",ünï}'),
          (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
          (3, -32768, 2147483647, -9223372036854775808, 'NaN', '', ''::bytea, false, 'infinity', '-infinity',
           '[]', '00000000-0000-0000-0000-000000000000', '{}', '{{a,b},{c,NULL}}'),
          (4, 32767, -2147483648, 9223372036854775807, '0.1', E'only\\ttab', '\\x5c4e'::bytea, true,
           '1999-12-31 23:59:59.999999+00', '0044-03-15 BC', '"\\\\"', 'ffffffff-ffff-ffff-ffff-ffffffffffff',
           '{2147483647}', '{"\\\\N"}');`);
    });

    after(async () => {
      for (const w of open) await w.close().catch(() => {});
      await stopAllClusters();
    });

    test('binary and text COPY of every column type round-trip exactly, quoted and unicode names', async () => {
      const binary = await sql<Record<string, string | null>>(
        `SELECT ${COLUMNS.map((c, i) => `encode(${c.send}(${c.name}), 'hex') AS c${i}`).join(', ')} FROM public.src ORDER BY id`,
      );
      const text = await sql<Record<string, string | null>>(`SELECT ${COLUMNS.map((c, i) => `${c.name}::text AS c${i}`).join(', ')} FROM public.src ORDER BY id`);
      const tuples = (rows: Record<string, string | null>[], value: (s: string) => TupleValue): Tuple[] =>
        rows.map((r) => COLUMNS.map((_, i) => (r[`c${i}`] === null ? { kind: 'null' } : value(r[`c${i}`]!))));
      const binTuples = tuples(binary, (hex) => ({ kind: 'binary', value: Buffer.from(hex, 'hex') }));
      const textTuples = tuples(text, (value) => ({ kind: 'text', value }));

      const wire = await connect();
      const binCopy = copyInsertStatement(mapped('a"b', 'ünï', COLUMNS), binTuples)!;
      const textCopy = copyInsertStatement(mapped('a"b', 'ünï_text', COLUMNS), textTuples)!;
      assert.match(binCopy.text, /^COPY "a""b"."ünï" \("id", "i2", "a""b", .*"ünï".*\) FROM STDIN WITH \(FORMAT binary\)$/);
      assert.match(textCopy.text, /^COPY "a""b"."ünï_text" \(.*\) FROM STDIN$/);
      // The same rows as Insert messages make the same COPY input without being decoded (copy-messages.ts).
      const asSentRel = mapped('a"b', 'ünï', COLUMNS);
      assert.ok(insertsCopyAsSent(asSentRel));
      const asSent = copyFromInsertMessages(asSentRel, binTuples.map(insertMessage))!;
      assert.equal(asSent.text, binCopy.text);
      assert.deepEqual(Buffer.concat(asSent.data), Buffer.concat(binCopy.data));
      const results = [wire.copyIn(binCopy.text, binCopy.data), wire.copyIn(textCopy.text, textCopy.data)];
      assert.equal(await wire.sync(), 'I');
      assert.deepEqual(await Promise.all(results), [
        { command: 'COPY', rowCount: 4, rows: [] },
        { command: 'COPY', rowCount: 4, rows: [] },
      ]);
      const want = await rowsOf('public.src');
      assert.equal(want.length, 4);
      assert.deepEqual(await rowsOf('"a""b"."ünï"'), want);
      assert.deepEqual(await rowsOf('"a""b"."ünï_text"'), want);
      // The same prepared COPY statements serve the next batch.
      const again = copyInsertStatement(
        mapped('a"b', 'ünï', COLUMNS),
        binTuples.map((t, k) => [{ kind: 'binary', value: int8(100n + BigInt(k)) }, ...t.slice(1)]),
      )!;
      assert.equal((await Promise.all([wire.copyIn(again.text, again.data), wire.sync()]))[0].rowCount, 4);
      const prepared = await wire.simpleQuery(`SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE 'COPY %'`);
      assert.equal(prepared.rows[0]?.n, '2');
    });

    test('a failing COPY rejects with the server error, aborts the rest of the segment, and sync() recovers', async () => {
      await sql('CREATE TABLE public.uq (id int PRIMARY KEY, v text)');
      const rel = mapped('public', 'uq', [
        { name: 'id', target: 'id', oid: 23, type: 'int4' },
        { name: 'v', target: 'v', oid: 25, type: 'text' },
      ]);
      const rows = (ids: number[]): Tuple[] =>
        ids.map((id) => [
          { kind: 'text', value: String(id) },
          { kind: 'text', value: `v${id}` },
        ]);
      const wire = await connect();
      const begin = wire.execute('BEGIN');
      const ins = wire.execute('INSERT INTO public.uq VALUES ($1, $2)', ['1', 'first']);
      // The duplicate comes early in a large COPY: the server fails while megabytes of CopyData still follow.
      const big = copyInsertStatement(rel, rows([2, 1, ...Array.from({ length: 100_000 }, (_, k) => k + 10)]))!;
      assert.ok(big.data[0]!.length > 1_000_000);
      const dup = wire.copyIn(big.text, big.data);
      const after1 = wire.execute('INSERT INTO public.uq VALUES ($1, $2)', ['5', 'x']);
      const copy2 = copyInsertStatement(rel, rows([6, 7]))!;
      const after2 = wire.copyIn(copy2.text, copy2.data);
      const commit = wire.execute('COMMIT');
      await begin;
      await ins;
      const err = await dup.then(
        () => assert.fail('duplicate COPY succeeded'),
        (e: unknown) => e as { code?: string; constraint?: string },
      );
      assert.equal(err.code, '23505');
      assert.equal(err.constraint, 'uq_pkey');
      for (const p of [after1, after2, commit]) {
        const e = await withTimeout(
          p.then(
            () => assert.fail('skipped statement succeeded'),
            (x: unknown) => x,
          ),
          5000,
          'aborted statement',
        );
        assert.ok(e instanceof PipelineAbortedError, String(e));
        assert.equal((e.cause as { code?: string }).code, '23505');
      }
      await assert.rejects(wire.copyIn(copy2.text, copy2.data), PipelineAbortedError);
      assert.equal(await wire.sync(), 'E');
      await wire.execute('ROLLBACK');
      assert.equal(await wire.sync(), 'I');

      // A COPY failing at Execute (before any copy state): same rules, its data is dropped.
      const badCol = wire.copyIn('COPY public.uq (id, nope) FROM STDIN', copy2.data);
      const skipped = wire.execute('SELECT 1');
      await assert.rejects(badCol, (e: { code?: string }) => e.code === '42703');
      await assert.rejects(skipped, PipelineAbortedError);
      assert.equal(await wire.sync(), 'I');

      // A statement that reads no COPY data is a usage error; the server ignored the data.
      await assert.rejects(wire.copyIn('SELECT 1', copy2.data), WireUsageError);
      assert.equal(await wire.sync(), 'I');

      // The connection works afterwards, prepared COPY statements included.
      const ok = await Promise.all([wire.copyIn(copy2.text, copy2.data), wire.copyIn(big.text, copyInsertStatement(rel, rows([8]))!.data), wire.sync()]);
      assert.equal(ok[0].rowCount, 2);
      assert.equal(ok[1].rowCount, 1);
      assert.deepEqual(await rowsOf('public.uq'), ['(6,v6)', '(7,v7)', '(8,v8)']);
      assert.equal(wire.pending, 0);
    });

    test('a COPY keeps its place among pipelined statements in one transaction', async () => {
      await sql('CREATE TABLE public.ord (id int PRIMARY KEY, v text)');
      const rel = mapped('public', 'ord', [
        { name: 'id', target: 'id', oid: 23, type: 'int4' },
        { name: 'v', target: 'v', oid: 25, type: 'text' },
      ]);
      const copy = copyInsertStatement(rel, [
        [
          { kind: 'binary', value: int4(2) },
          { kind: 'binary', value: Buffer.from('b') },
        ],
        [
          { kind: 'binary', value: int4(3) },
          { kind: 'binary', value: Buffer.from('b') },
        ],
      ])!;
      const wire = await connect();
      const results = [
        wire.execute('BEGIN'),
        wire.execute('INSERT INTO public.ord VALUES ($1, $2)', ['1', 'a']),
        wire.copyIn(copy.text, copy.data),
        wire.execute(`UPDATE public.ord SET v = v || '!' WHERE id <= $1`, ['2']),
        wire.execute('SELECT count(*) FROM public.ord', [], { wantRows: true }),
        wire.execute('COMMIT'),
      ];
      assert.equal(await wire.sync(), 'I');
      const done = await Promise.all(results);
      assert.deepEqual(
        done.map((r) => `${r.command} ${r.rowCount}`),
        ['BEGIN 0', 'INSERT 1', 'COPY 2', 'UPDATE 2', 'SELECT 1', 'COMMIT 0'],
      );
      assert.deepEqual(done[4]!.rows, [['3']]);
      assert.deepEqual(await rowsOf('public.ord'), ['(1,a!)', '(2,b!)', '(3,b)']);
    });

    test('a 50,000-row COPY of several megabytes, binary and text', async () => {
      await sql(`CREATE TABLE public.w1 (id bigint PRIMARY KEY, n integer NOT NULL, payload text NOT NULL, ts timestamptz NOT NULL);
                 CREATE TABLE public.w1_text (LIKE public.w1 INCLUDING ALL)`);
      const cols = [
        { name: 'id', target: 'id', oid: 20, type: 'int8' },
        { name: 'n', target: 'n', oid: 23, type: 'int4' },
        { name: 'payload', target: 'payload', oid: 25, type: 'text' },
        { name: 'ts', target: 'ts', oid: 1184, type: 'timestamptz' },
      ];
      const N = 50_000;
      const base = 789_004_800_000_000n; // 2025-01-01 00:00:00+00 in µs since 2000-01-01
      const payload = (i: number) => `${createHash('md5').update(String(i)).digest('hex')}ü\t\\${'x'.repeat(60)}`;
      const bin: Tuple[] = [];
      const txt: Tuple[] = [];
      for (let i = 1; i <= N; i++) {
        const ts = Buffer.alloc(8);
        ts.writeBigInt64BE(base + BigInt(i) * 1_000_000n);
        bin.push([
          { kind: 'binary', value: int8(BigInt(i)) },
          { kind: 'binary', value: int4(i % 1000) },
          { kind: 'binary', value: Buffer.from(payload(i)) },
          { kind: 'binary', value: ts },
        ]);
        txt.push([
          { kind: 'text', value: String(i) },
          { kind: 'text', value: String(i % 1000) },
          { kind: 'text', value: payload(i) },
          { kind: 'text', value: new Date(Date.UTC(2025, 0, 1) + i * 1000).toISOString() },
        ]);
      }
      const b = copyInsertStatement(mapped('public', 'w1', cols), bin)!;
      const t = copyInsertStatement(mapped('public', 'w1_text', cols), txt)!;
      assert.ok(b.data[0]!.length > 5_000_000, `binary input ${b.data[0]!.length} bytes`);
      const wire = await connect();
      const res = [wire.execute('BEGIN'), wire.copyIn(b.text, b.data), wire.copyIn(t.text, t.data), wire.execute('COMMIT')];
      assert.equal(await wire.sync(), 'I');
      const done = await Promise.all(res);
      assert.equal(done[1]!.rowCount, N);
      assert.equal(done[2]!.rowCount, N);
      const digest = createHash('md5');
      for (let i = 1; i <= N; i++) digest.update(payload(i));
      for (const table of ['public.w1', 'public.w1_text']) {
        const [s] = await sql<{ n: string; sn: string; md5: string; lo: string; hi: string }>(
          `SELECT count(*) AS n, sum(n) AS sn, md5(string_agg(payload, '' ORDER BY id)) AS md5,
                  min(ts) = '2025-01-01 00:00:01+00' AS lo, max(ts) = timestamptz '2025-01-01 00:00:00+00' + ${N} * interval '1 second' AS hi
             FROM ${table}`,
        );
        assert.deepEqual(
          s,
          { n: String(N), sn: String(Array.from({ length: N }, (_, k) => (k + 1) % 1000).reduce((x, y) => x + y, 0)), md5: digest.copy().digest('hex'), lo: true, hi: true },
          table,
        );
      }
    });
  });
}

function int4(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
}

function int8(n: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(n);
  return b;
}

test('Insert messages with a text or unchanged value, or a malformed tuple, are not COPY input as sent; the relation is then decoded', () => {
  const bin = (n: number): TupleValue => ({ kind: 'binary', value: Buffer.from([0, 0, 0, n]) });
  const cols = [
    { name: 'id', target: 'id', type: 'int4', oid: 23 },
    { name: 'v', target: 'v', type: 'int4', oid: 23 },
  ];
  const ok = mapped('public', 't', cols);
  const good = copyFromInsertMessages(ok, [insertMessage([bin(1), bin(2)]), insertMessage([bin(3), { kind: 'null' }])])!;
  // Header, then per row: field count, (length, bytes) per field; -1 for NULL; -1 ends it.
  assert.equal(good.data[0]!.subarray(19).toString('hex'), '0002' + '00000004' + '00000001' + '00000004' + '00000002' + '0002' + '00000004' + '00000003' + 'ffffffff' + 'ffff');
  for (const [why, message] of [
    ['text value', insertMessage([bin(1), { kind: 'text', value: '2' }])],
    ['unchanged value', insertMessage([bin(1), { kind: 'unchanged' }])],
    ['narrower tuple', insertMessage([bin(1)])],
    ['truncated value', insertMessage([bin(1), bin(2)]).subarray(0, -1)],
  ] as const) {
    const rel = mapped('public', 't', cols);
    assert.equal(copyFromInsertMessages(rel, [insertMessage([bin(1), bin(2)]), message]), null, why);
    assert.equal(insertsCopyAsSent(rel), false, why);
  }
  // A tsquery column may need its text form (binary.ts textForUnreceivable): never as sent.
  assert.equal(insertsCopyAsSent(mapped('public', 'q', [cols[0]!, { name: 'q', target: 'q', type: 'tsquery', oid: 3615 }])), false);
});
