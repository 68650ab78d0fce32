/**
 * Update batches sent as one array per column (src/apply/update-rows.ts) against real
 * PostgreSQL (18 and 10 by default; PGSUB_UPDATE_MAJORS=16,12 picks others), with the
 * relation mapped from the target's catalog as the apply path maps it (relmap.ts). Values
 * are built as pgoutput sends them: binary values are the types' send output, text values
 * their output. Every row must end exactly as the VALUES statement the arrays replace
 * (multi-row.ts updateManyStatement) leaves it, in binary and in text, in a schema,
 * table and columns whose names need quoting; columns left out of the shape (unchanged
 * TOAST values) stay as they are; rows not found are what the affected-row count lacks,
 * and with detection they raise update_missing (PSC01) inside the statement; where only
 * the VALUES statement can carry a value (an array-typed column in binary, a remote type
 * other than the target's, an empty tsquery, binary and text mixed in one column) the
 * arrays statement is refused (null) and batch.ts sends VALUES.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { MappedRelation } from '../../src/apply/sql/mapped-relation.js';
import { RelationMap } from '../../src/apply/sql/relmap.js';
import type { Detect } from '../../src/apply/sql/detecting.js';
import { updateManyStatement } from '../../src/apply/sql/multi-row.js';
import type { Statement } from '../../src/pgwire/statement.js';
import { updateArraysStatement } from '../../src/apply/sql/update-rows.js';
import { WireConnection } from '../../src/pgwire/wire.js';
import { parseConninfo, type ConnInfo } from '../../src/config/conninfo.js';
import type { RelationMessage, Tuple, TupleValue } from '../../src/protocol/messages.js';
import { startCluster, stopAllClusters, type Cluster } from '../harness/index.js';

const MAJORS = (process.env.PGSUB_UPDATE_MAJORS ?? '18,10').split(',').map(Number);

/** Column name (quoting needed for some), type, send function; `array`: an array type (binary arrays refuse it). */
const COLUMNS = [
  { name: 'id', type: 'int8', send: 'int8send' },
  { name: 'a"b', type: 'int4', send: 'int4send' },
  { name: 'ünï', type: 'text', send: 'textsend' },
  { name: 'i2', type: 'int2', send: 'int2send' },
  { name: 'n', type: 'numeric', send: 'numeric_send' },
  { name: 'by', type: 'bytea', send: 'byteasend' },
  { name: 'bo', type: 'bool', send: 'boolsend' },
  { name: 'ts', type: 'timestamptz', send: 'timestamptz_send' },
  { name: 'd', type: 'date', send: 'date_send' },
  { name: 'iv', type: 'interval', send: 'interval_send' },
  { name: 'j', type: 'jsonb', send: 'jsonb_send' },
  { name: 'u', type: 'uuid', send: 'uuid_send' },
  { name: 'pt', type: 'point', send: 'point_send' },
  { name: 'vc', type: 'varchar(12)', send: 'varcharsend' },
  { name: 'tq', type: 'tsquery', send: 'tsquerysend' },
  { name: 'en', type: '"ü s".mood', send: 'enum_send' },
  { name: 'co', type: '"ü s".pair', send: 'record_send' },
  { name: 'dm', type: '"ü s".posint', send: 'int4send' },
  { name: 'big', type: 'text', send: 'textsend' },
  { name: 'ia', type: 'int4[]', send: 'array_send', array: true },
  { name: 'ta', type: 'text[]', send: 'array_send', array: true },
] as const;

const ROWS = 40;
const quote = (name: string) => `"${name.replace(/"/g, '""')}"`;
const TABLE = `${quote('ü s')}.${quote('t "q"')}`;
const SAME = `${quote('ü s')}.${quote('values path')}`;

/** Row k's new values (k = 0 … ROWS-1), edge values and NULLs among them. */
function newRow(k: number): string {
  const v = (i: number) => (k % 7 === 6 && i > 0 && i !== 18 ? 'NULL' : null);
  const values = [
    String(k + 1),
    v(1) ?? String(k % 2 ? -2147483648 + k : 2147483647 - k),
    v(2) ?? `E'tab\\there\\nnew\\\\back "dq" ''sq'' ünï 😀 ${k}'`,
    v(3) ?? String(-32768 + k),
    v(4) ?? (k % 5 === 0 ? `'NaN'` : `'-12345678901234567890.000123456789${k}'`),
    v(5) ?? `'\\x00ff0a5c09${(k % 256).toString(16).padStart(2, '0')}'::bytea`,
    v(6) ?? (k % 2 ? 'true' : 'false'),
    v(7) ?? (k % 9 === 0 ? `'infinity'` : `'2024-02-29 12:34:56.789012+05:30'::timestamptz + ${k} * interval '1 hour'`),
    v(8) ?? (k % 11 === 0 ? `'0044-03-15 BC'` : `'2024-02-29'::date + ${k}`),
    v(9) ?? `'${k} years 7 mons 2 days 03:04:05.678'`,
    v(10) ?? `'{"a": [1, "x\\ty", null], "ü": "\\\\n", "k": ${k}}'`,
    v(11) ?? `'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a${(k % 100).toString().padStart(2, '0')}'`,
    v(12) ?? `point(${k}.5, -${k})`,
    v(13) ?? `'vc ${k}'`,
    v(14) ?? `'fat & rat${k}'`,
    v(15) ?? (k % 3 ? `'happy'` : `'sad'`),
    v(16) ?? `ROW(${k}, 'p "${k}"')`,
    v(17) ?? String(k + 1),
    `repeat('b${k}', 3000)`,
    v(19) ?? `'{${k},NULL,-3}'`,
    v(20) ?? `'{"a b",NULL,"NULL","q\\"uote","back\\\\slash","",ünï${k}}'`,
  ];
  return `(${values.map((x, i) => `CAST(${x} AS ${COLUMNS[i]!.type})`).join(', ')})`;
}

/** The relation message pgoutput would send for TABLE (types are the target's own: same server). */
function relationMessage(relationId: number, name: string, oids: number[]): RelationMessage {
  return {
    tag: 'relation',
    relationId,
    namespace: 'ü s',
    name,
    replicaIdentity: 'default',
    columns: COLUMNS.map((c, i) => ({ isKey: i === 0, name: c.name, typeOid: oids[i]!, typeModifier: -1 })),
  };
}

for (const major of MAJORS) {
  describe(`update batches as column arrays, PostgreSQL ${major}`, () => {
    let cluster: Cluster;
    let info: ConnInfo;
    let wire: WireConnection;
    const db = 'upd';
    const sql = <T = Record<string, string | null>>(text: string) => cluster.query<T>(text, [], db);
    let binaryTuples: Tuple[];
    let textTuples: Tuple[];
    let relations: RelationMap;
    let oids: number[];

    async function mapped(id: number, name: string): Promise<MappedRelation> {
      relations.onRelation(relationMessage(id, name, oids));
      return relations.resolve(wire, id);
    }

    async function rowsOf(table: string): Promise<string[]> {
      return (await sql<{ r: string }>(`SELECT (x.*)::text AS r FROM ${table} x ORDER BY id`)).map((r) => r.r);
    }

    /** Both tables back to the same old rows: ids 1 … ROWS. */
    async function reset(): Promise<void> {
      const old = `SELECT id, 1, 'old', 1, 1, '\\x01'::bytea, false, now(), current_date, '1 day', '{}', gen_random_uuid(), point(0, 0), 'old', 'a', 'sad', CAST(ROW(0, 'old') AS "ü s".pair), 1, repeat('o', 5000), '{1}', '{old}' FROM generate_series(1, ${ROWS}) id`;
      await sql(`TRUNCATE ${TABLE}, ${SAME}; INSERT INTO ${TABLE} ${old}; INSERT INTO ${SAME} SELECT * FROM ${TABLE};`);
    }

    async function run(statement: Statement): Promise<number> {
      const result = wire.execute(statement.text, statement.params, statement.paramTypes ? { paramTypes: statement.paramTypes } : undefined);
      result.catch(() => {});
      await wire.sync();
      return (await result).rowCount;
    }

    before(async () => {
      cluster = await startCluster({ major, name: `updarr${major}` });
      await cluster.createDatabase(db);
      info = parseConninfo(cluster.url(db), 'target', {});
      const defs = COLUMNS.map((c) => `${quote(c.name)} ${c.type}${c.name === 'id' ? ' PRIMARY KEY' : ''}`).join(', ');
      await sql(`
        ${major < 13 ? 'CREATE EXTENSION IF NOT EXISTS pgcrypto;' : ''}
        CREATE SCHEMA "ü s";
        CREATE TYPE "ü s".mood AS ENUM ('sad', 'happy');
        CREATE TYPE "ü s".pair AS (a int, b text);
        CREATE DOMAIN "ü s".posint AS int CHECK (VALUE > 0);
        CREATE TABLE ${TABLE} (${defs});
        CREATE TABLE ${SAME} (${defs});
        CREATE TABLE "ü s".src (${defs});
        INSERT INTO "ü s".src VALUES ${Array.from({ length: ROWS }, (_, k) => newRow(k)).join(', ')};
        CREATE SCHEMA pgsub;
        CREATE FUNCTION "pgsub"."conflict"(kind text) RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = ''
          AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'PSC01', MESSAGE = 'pgsub conflict: ' || kind; END $$;`);
      oids = (await sql<{ oid: string }>(`SELECT atttypid::int::text AS oid FROM pg_attribute WHERE attrelid = '"ü s".src'::regclass AND attnum > 0 ORDER BY attnum`)).map((r) =>
        Number(r.oid),
      );
      // Text as the apply connection's session writes it (ISO dates, full float precision).
      const session = `SET datestyle = ISO; SET intervalstyle = postgres; SET extra_float_digits = 3;`;
      const binary = await cluster.query<Record<string, string | null>>(
        `SELECT ${COLUMNS.map((c, i) => `encode(${c.send}(${quote(c.name)}), 'hex') AS c${i}`).join(', ')} FROM "ü s".src ORDER BY id`,
        [],
        db,
      );
      const text = await cluster.query<Record<string, string | null>>(
        `${session} SELECT ${COLUMNS.map((c, i) => `${quote(c.name)}::text AS c${i}`).join(', ')} FROM "ü s".src ORDER BY id`,
        [],
        db,
      );
      const tuples = (rows: Record<string, string | null>[], value: (s: string) => TupleValue): Tuple[] =>
        rows.map((r) => COLUMNS.map((_, i) => (r[`c${i}`] === null ? { kind: 'null' } : value(r[`c${i}`]!))));
      binaryTuples = tuples(binary, (hex) => ({ kind: 'binary', value: Buffer.from(hex, 'hex') }));
      textTuples = tuples(Array.isArray(text) ? text : [], (value) => ({ kind: 'text', value }));
      assert.equal(textTuples.length, ROWS);
      wire = await WireConnection.connect(info, {
        applicationName: 'pgsub-update-arrays-test',
        startupParameters: { search_path: '', session_replication_role: 'replica', datestyle: 'ISO', intervalstyle: 'postgres', extra_float_digits: '3' },
      });
      relations = new RelationMap(wire.serverVersionNum, { binary: true });
      relations.onType(oids[15]!, 'ü s', 'mood');
      relations.onType(oids[16]!, 'ü s', 'pair');
    });

    after(async () => {
      await wire?.close().catch(() => {});
      await stopAllClusters();
    });

    const ALL = COLUMNS.map((_, i) => i).filter((i) => i !== 0);
    // Binary arrays: not of array-typed columns, nor of a domain before PostgreSQL 11 (no array type).
    const scalar = ALL.filter((i) => !('array' in COLUMNS[i]!) && (major >= 11 || COLUMNS[i]!.name !== 'dm'));

    for (const mode of ['binary', 'text'] as const) {
      test(`${mode}: every row ends as the VALUES statement leaves it, quoted and unicode names, NULLs, edge values`, async () => {
        await reset();
        const rel = await mapped(1, 't "q"');
        const same = await mapped(2, 'values path');
        // Binary: array-typed columns cannot be elements of an array parameter; text can.
        const set = mode === 'binary' ? scalar : ALL;
        const tuples = mode === 'binary' ? binaryTuples : textTuples;
        const statement = updateArraysStatement(rel, tuples, set, null);
        assert.ok(statement, 'arrays statement');
        assert.equal(statement.params.length, set.length + 1, 'one array per column');
        assert.match(statement.text, /^UPDATE ONLY "ü s"\."t ""q""" AS "pgsub_row" SET "a""b" = .* FROM \(SELECT pg_catalog\.unnest\(\$1::/);
        assert.equal(await run(statement), ROWS);
        assert.equal(await run(updateManyStatement(same, tuples.slice(0, 32), set, null)), 32);
        assert.equal(await run(updateManyStatement(same, tuples.slice(32), set, null)), ROWS - 32);
        const got = await rowsOf(TABLE);
        assert.deepEqual(got, await rowsOf(SAME));
        // And it is the source's new row (array columns too in text mode).
        const want = await sql<{ r: string }>(`SELECT (x.*)::text AS r FROM "ü s".src x ORDER BY id`);
        if (mode === 'text')
          assert.deepEqual(
            got,
            want.map((r) => r.r),
          );
        // The text does not depend on the row count: a batch of another size reuses it.
        const again = updateArraysStatement(rel, tuples.slice(0, 9), set, null)!;
        assert.equal(again.text, statement.text);
        assert.equal(await run(again), 9);
      });

      test(`${mode}: columns left out of the shape (unchanged TOAST) keep their values; missing rows are not counted; detection raises update_missing`, async () => {
        await reset();
        const rel = await mapped(3, 't "q"');
        const source = mode === 'binary' ? binaryTuples : textTuples;
        // `big` came as an unchanged TOAST value: the shape leaves it out.
        const bigIndex = COLUMNS.findIndex((c) => c.name === 'big');
        const set = (mode === 'binary' ? scalar : ALL).filter((i) => i !== bigIndex);
        const tuples: Tuple[] = source.map((t) => t.map((v, i) => (i === bigIndex ? { kind: 'unchanged' } : v)));
        // Keys 1001 … 1005 are not in the table.
        const missing: Tuple[] = source
          .slice(0, 5)
          .map((t, k) => [mode === 'binary' ? { kind: 'binary', value: int8(1001n + BigInt(k)) } : { kind: 'text', value: String(1001 + k) }, ...t.slice(1)]);
        const statement = updateArraysStatement(rel, [...tuples.slice(0, 20), ...missing], set, null)!;
        assert.ok(statement);
        assert.equal(await run(statement), 20);
        const big = await sql<{ id: string; big: string }>(`SELECT id::text, left(big, 3) AS big FROM ${TABLE} WHERE id <= 20 ORDER BY id`);
        assert.deepEqual(new Set(big.map((r) => r.big)), new Set(['ooo']));
        const [changed] = await sql<{ n: string }>(
          `SELECT count(*)::text AS n FROM ${TABLE} x JOIN "ü s".src s USING (id) WHERE x."ünï" IS NOT DISTINCT FROM s."ünï" AND x.id <= 20`,
        );
        assert.equal(changed!.n, '20');
        const detect: Detect = { originId: null, returningOld: major >= 18 };
        const detecting = updateArraysStatement(rel, [...tuples.slice(20, 30), ...missing.slice(0, 1)], set, detect)!;
        await assert.rejects(run(detecting), (e: Error & { code?: string }) => e.code === 'PSC01' && /update_missing/.test(e.message));
        // All found: the detecting statement passes and updates them.
        assert.equal(await run(updateArraysStatement(rel, tuples.slice(20, 30), set, detect)!), 1);
        const [after30] = await sql<{ n: string }>(
          `SELECT count(*)::text AS n FROM ${TABLE} x JOIN "ü s".src s USING (id) WHERE x."ünï" IS NOT DISTINCT FROM s."ünï" AND x.id <= 30`,
        );
        assert.equal(after30!.n, '30');
      });
    }

    test('refused where only the VALUES statement can carry the values', async () => {
      const rel = await mapped(4, 't "q"');
      const ia = COLUMNS.findIndex((c) => c.name === 'ia');
      const tq = COLUMNS.findIndex((c) => c.name === 'tq');
      assert.equal(rel.targetColumns[ia]!.arrayType, false, 'int4[] is an array');
      assert.equal(rel.targetColumns[COLUMNS.findIndex((c) => c.name === 'dm')]!.arrayType, major >= 11, 'a domain has an array type from PostgreSQL 11');
      assert.equal(updateArraysStatement(rel, binaryTuples, [ia], null), null, 'binary array-typed column');
      assert.ok(updateArraysStatement(rel, textTuples, [ia], null), 'text array-typed column');
      const mixed = binaryTuples.map((t, k) => (k === 3 ? textTuples[k]! : t));
      assert.equal(updateArraysStatement(rel, mixed, [1], null), null, 'binary and text in one column');
      const emptyQuery: Tuple[] = binaryTuples.map((t) => t.map((v, i) => (i === tq ? { kind: 'binary', value: Buffer.from([0, 0, 0, 0]) } : v)));
      assert.equal(updateArraysStatement(rel, emptyQuery, [tq], null), null, 'empty tsquery goes as text');
      // The publisher's column is int4 where the target's is int8: the value is read as int4 and cast.
      const widened = { ...rel, binary: { parseTypes: COLUMNS.map((_, i) => (i === 1 ? 23 : 0)), plans: null }, statements: new Map(), paramColumns: new Map() };
      assert.equal(updateArraysStatement(widened, binaryTuples, [1], null), null, 'remote type differs');
    });
  });
}

function int8(v: bigint): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigInt64BE(v);
  return b;
}
