/**
 * The statement builders (insert.ts, update.ts, delete.ts, multi-row.ts) without a server: the SQL texts and parameters built for each change on
 * fabricated relation-map entries — identifiers quoted, values bound and cast to the
 * target column types, rows located by key or (REPLICA IDENTITY FULL) by every sent
 * column with NULLs matching NULLs, text comparison for types without equality, ONLY for
 * plain tables — and the typed errors for changes that cannot be applied.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { MappedRelation, TargetColumn } from '../../src/apply/sql/mapped-relation.js';
import { insertStatement } from '../../src/apply/sql/insert.js';
import { resolvesConflicts, updateStatement } from '../../src/apply/sql/update.js';
import { insertManyStatement, maxBatchRows, updateManyStatement } from '../../src/apply/sql/multi-row.js';
import { deleteStatement, truncateStatement } from '../../src/apply/sql/delete.js';
import { insertArraysStatement } from '../../src/apply/sql/update-rows.js';
import { ApplyError } from '../../src/errors.js';
import type { RelationMessage, ReplicaIdentity, Tuple } from '../../src/protocol/messages.js';

interface ColumnSpec {
  name: string;
  type?: string;
  key?: boolean;
  equality?: boolean;
  always?: boolean;
}

function relation(spec: { schema?: string; name: string; identity: ReplicaIdentity; relkind?: 'r' | 'p'; columns: ColumnSpec[] }): MappedRelation {
  const schema = spec.schema ?? 'app';
  const remote: RelationMessage = {
    tag: 'relation',
    relationId: 16384,
    namespace: schema,
    name: spec.name,
    replicaIdentity: spec.identity,
    columns: spec.columns.map((c) => ({ isKey: c.key ?? false, name: c.name, typeOid: 25, typeModifier: -1 })),
  };
  const targetColumns: TargetColumn[] = spec.columns.map((c) => ({
    name: c.name,
    typeOid: 25,
    typeName: c.type ?? '"pg_catalog"."text"',
    generated: false,
    hasEquality: c.equality ?? true,
    identityAlways: c.always ?? false,
  }));
  return {
    remote,
    ordered: false,
    rowSecurity: false,
    qualifiedName: `"${schema.replace(/"/g, '""')}"."${spec.name.replace(/"/g, '""')}"`,
    displayName: `${schema}.${spec.name}`,
    relkind: spec.relkind ?? 'r',
    targetColumns,
    keyIndexes: remote.columns.flatMap((c, i) => (c.isKey ? [i] : [])),
    statements: new Map(),
    paramColumns: new Map(),
  };
}

const t = (value: string) => ({ kind: 'text', value }) as const;
const NULL = { kind: 'null' } as const;
const UNCHANGED = { kind: 'unchanged' } as const;
const INT4 = '"pg_catalog"."int4"';
const INT8 = '"pg_catalog"."int8"';
const TEXT = '"pg_catalog"."text"';
const JSON_T = '"pg_catalog"."json"';
const POINT = '"pg_catalog"."point"';

describe('statements', () => {
  const orders = relation({
    name: 'orders',
    identity: 'default',
    columns: [
      { name: 'region', type: INT4, key: true },
      { name: 'id', type: INT8, key: true },
      { name: 'note', type: TEXT },
    ],
  });

  test('INSERT: quoted columns, every value a parameter cast to the target type', () => {
    const s = insertStatement(orders, [t('1'), t('2'), t("x'); DROP TABLE y; --")]);
    assert.equal(s.text, `INSERT INTO "app"."orders" ("region", "id", "note") VALUES ($1::${INT4}, $2::${INT8}, $3::${TEXT})`);
    assert.deepEqual(s.params, ['1', '2', "x'); DROP TABLE y; --"]);
  });

  test('GENERATED ALWAYS identity: INSERT overrides it with the sent value, UPDATE leaves it alone', () => {
    const users = relation({
      name: 'users',
      identity: 'default',
      columns: [
        { name: 'id', type: INT8, key: true, always: true },
        { name: 'name', type: TEXT },
      ],
    });
    assert.equal(insertStatement(users, [t('7'), t('a')]).text, `INSERT INTO "app"."users" ("id", "name") OVERRIDING SYSTEM VALUE VALUES ($1::${INT8}, $2::${TEXT})`);
    assert.match(
      insertManyStatement(users, [
        [t('7'), t('a')],
        [t('8'), t('b')],
      ]).text,
      /^INSERT INTO "app"."users" \("id", "name"\) OVERRIDING SYSTEM VALUE VALUES \(/,
    );
    const u = updateStatement(users, undefined, undefined, [t('7'), t('b')]);
    assert.equal(u.text, `UPDATE ONLY "app"."users" SET "name" = $1::${TEXT} WHERE "id" = $2::${INT8}`);
    assert.deepEqual(u.params, ['b', '7']);
    // Reshaped (a computed column): the same two rules in the statements over the row subquery.
    const shaped = {
      ...users,
      statements: new Map(),
      paramColumns: new Map(),
      reshape: {
        direct: [true, true],
        rowTypes: [INT8, TEXT],
        computed: [{ column: { name: 'lname', typeOid: 25, typeName: TEXT, generated: false, hasEquality: true }, expr: 'lower("name")', uses: [1] }],
      },
    } as MappedRelation;
    assert.match(insertStatement(shaped, [t('7'), t('A')]).text, /^INSERT INTO "app"\."users" \("id", "name", "lname"\) OVERRIDING SYSTEM VALUE SELECT /);
    // A batch of them: the remote rows as a VALUES list under their remote names, the expression per row.
    const many = insertManyStatement(shaped, [
      [t('7'), t('A')],
      [t('8'), t('B')],
    ]);
    assert.equal(
      many.text,
      `INSERT INTO "app"."users" ("id", "name", "lname") OVERRIDING SYSTEM VALUE SELECT r."id", r."name", (lower("name")) FROM (VALUES ($1::${INT8}, $2::${TEXT}), ($3::${INT8}, $4::${TEXT})) AS r ("id", "name")`,
    );
    assert.deepEqual(many.params, ['7', 'A', '8', 'B']);
    // Or as column arrays (text values: text[] cast per element), one parameter per column whatever the row count.
    const arrays = insertArraysStatement(shaped, shaped.reshape!, [
      [t('7'), t('A')],
      [t('8'), { kind: 'null' }],
    ])!;
    assert.equal(
      arrays.text,
      `INSERT INTO "app"."users" ("id", "name", "lname") OVERRIDING SYSTEM VALUE SELECT r."id", r."name", (lower("name")) FROM (SELECT pg_catalog.unnest($1::"pg_catalog"."text"[])::${INT8} AS "id", pg_catalog.unnest($2::"pg_catalog"."text"[])::${TEXT} AS "name") AS r`,
    );
    assert.equal(arrays.params.length, 2);
    // array_send layout: 1 dimension, has-nulls, element OID 25 (text), 2 elements from 1.
    const second = arrays.params[1] as Buffer;
    assert.deepEqual([second.readInt32BE(0), second.readInt32BE(4), second.readUInt32BE(8), second.readInt32BE(12), second.readInt32BE(16)], [1, 1, 25, 2, 1]);
    // An unchanged TOAST value cannot be inserted: no array statement (the per-row path names it).
    assert.equal(insertArraysStatement(shaped, shaped.reshape!, [[t('9'), { kind: 'unchanged' }]]), null);
    const su = updateStatement(shaped, undefined, undefined, [t('7'), t('B')]).text;
    assert.match(su, /^UPDATE ONLY "app"\."users" SET \("name", "lname"\) = \(SELECT /, su);
    assert.doesNotMatch(
      updateManyStatement(
        users,
        [
          [t('7'), t('b')],
          [t('8'), t('c')],
        ],
        [0, 1],
        null,
      ).text,
      /SET "id"/,
    );
  });

  test('multi-row INSERT: parameters numbered row by row, text cached per row count, capped by the protocol', () => {
    const s = insertManyStatement(orders, [
      [t('1'), t('2'), t('a')],
      [t('3'), t('4'), { kind: 'null' }],
    ]);
    assert.equal(s.text, `INSERT INTO "app"."orders" ("region", "id", "note") VALUES ($1::${INT4}, $2::${INT8}, $3::${TEXT}), ($4::${INT4}, $5::${INT8}, $6::${TEXT})`);
    assert.deepEqual(s.params, ['1', '2', 'a', '3', '4', null]);
    assert.equal(
      insertManyStatement(orders, [
        [t('5'), t('6'), t('b')],
        [t('7'), t('8'), t('c')],
      ]).text,
      s.text,
    );
    assert.equal(insertManyStatement(orders, [[t('5'), t('6'), t('b')]]).text, insertStatement(orders, [t('5'), t('6'), t('b')]).text);
    assert.equal(maxBatchRows(3, 128), 128);
    assert.equal(maxBatchRows(3, 100_000), 21845);
    assert.throws(() => insertManyStatement(orders, [[t('1'), t('2'), t('a')], [t('3')]]), ApplyError);
  });

  test('multi-row UPDATE: sent columns and keys as VALUES joined on the key; detection counts the rows', () => {
    const rows: Tuple[] = [
      [t('1'), t('2'), t('a')],
      [t('1'), t('3'), { kind: 'null' }],
    ];
    const s = updateManyStatement(orders, rows, [0, 1, 2], null);
    assert.equal(
      s.text,
      `UPDATE ONLY "app"."orders" AS "pgsub_row" SET "region" = "pgsub_values"."p0", "id" = "pgsub_values"."p1", "note" = "pgsub_values"."p2" ` +
        `FROM (VALUES ($1::${INT4}, $2::${INT8}, $3::${TEXT}, $4::${INT4}, $5::${INT8}), ($6::${INT4}, $7::${INT8}, $8::${TEXT}, $9::${INT4}, $10::${INT8})) ` +
        `AS "pgsub_values" ("p0", "p1", "p2", "p3", "p4") WHERE "pgsub_row"."region" = "pgsub_values"."p3" AND "pgsub_row"."id" = "pgsub_values"."p4"`,
    );
    assert.deepEqual(s.params, ['1', '2', 'a', '1', '2', '1', '3', null, '1', '3']);
    const detected = updateManyStatement(orders, rows, [0, 1, 2], { originId: null, returningOld: true });
    assert.match(
      detected.text,
      /^WITH pgsub_changed AS \(UPDATE .* RETURNING 1\) SELECT CASE WHEN \(SELECT pg_catalog\.count\(\*\) FROM pgsub_changed\) <> 2 THEN "pgsub"\."conflict"\('update_missing'\) END$/,
    );
    // One row: the single-row statement.
    assert.equal(updateManyStatement(orders, [rows[0]!], [0, 1, 2], null).text, updateStatement(orders, undefined, undefined, rows[0]!).text);
  });

  test('UPDATE by composite key from the new tuple, or from the old key tuple when the key changed', () => {
    const same = updateStatement(orders, undefined, undefined, [t('1'), t('2'), t('n')]);
    assert.equal(same.text, `UPDATE ONLY "app"."orders" SET "region" = $1::${INT4}, "id" = $2::${INT8}, "note" = $3::${TEXT} WHERE "region" = $4::${INT4} AND "id" = $5::${INT8}`);
    assert.deepEqual(same.params, ['1', '2', 'n', '1', '2']);
    const moved = updateStatement(orders, 'key', [t('1'), t('2'), NULL], [t('1'), t('3'), t('n')]);
    assert.equal(moved.text, same.text);
    assert.deepEqual(moved.params, ['1', '3', 'n', '1', '2']);
  });

  test("UPDATE resolving the default policies' conflicts itself: PostgreSQL 18 with origins, the policy allows, the key sent; nine values more", () => {
    const remote = { xid: 745, finalLsn: 0x1_0000_0010n, commitTime: 0n };
    const tuple = [t('1'), t('2'), t('n')];
    const base = { originId: 3, returningOld: true, subscription: 'sub', inlineOriginDiffers: () => true, inlineMissing: () => true };
    const inline = updateStatement(orders, undefined, undefined, tuple, base, false, remote);
    assert.match(inline.text, /^WITH pgsub_changed AS \(UPDATE ONLY "app"\."orders" SET .* RETURNING WITH \(OLD AS pgsub_old\) /);
    assert.match(inline.text, /pgsub_differs AS \(INSERT INTO "pgsub"\."conflict_log" .* WHERE r <> 3 RETURNING 'update_origin_differs'/);
    assert.match(inline.text, /pgsub_missing AS \(INSERT INTO "pgsub"\."conflict_log" .* WHERE NOT EXISTS \(SELECT FROM pgsub_changed\)/);
    assert.doesNotMatch(inline.text, /"pgsub"\."conflict"\(/, 'a missing row is logged, not raised');
    assert.equal(resolvesConflicts(inline), true);
    // The sent values, then the key, then subscription, relation, schema, table, the names (JSON), LSN, xid, commit time.
    assert.deepEqual(inline.params, [
      '1',
      '2',
      'n',
      '1',
      '2',
      'sub',
      'app.orders',
      'app',
      'orders',
      '["region","id","note"]',
      '["region","id"]',
      '1/10',
      '745',
      '2000-01-01T00:00:00.000000Z',
    ]);
    // update_missing under another policy: raised as before (the careful path resolves it).
    const raising = updateStatement(orders, undefined, undefined, tuple, { ...base, inlineMissing: () => false }, false, remote);
    assert.match(raising.text, /SELECT "pgsub"\."conflict"\('update_missing'\)::pg_catalog\.text WHERE NOT EXISTS/);
    assert.doesNotMatch(raising.text, /pgsub_missing/);
    // Not for this relation, before PostgreSQL 18, without origins, without the transaction, or with the key moving: the lean detecting UPDATE.
    const lean = (d: typeof base | { originId: number | null; returningOld: boolean }, r: typeof remote | null = remote, oldKind?: 'key') =>
      updateStatement(orders, oldKind, oldKind ? [t('1'), t('1'), NULL] : undefined, tuple, d, false, r).text;
    for (const text of [
      lean({ ...base, inlineOriginDiffers: () => false }),
      lean({ ...base, returningOld: false }),
      lean({ ...base, originId: null }),
      lean(base, null),
      lean(base, remote, 'key'),
    ]) {
      assert.doesNotMatch(text, /conflict_log/);
      assert.match(text, /"pgsub"\."conflict"\('update_missing'\)/);
    }
  });

  test('UPDATE leaves unchanged TOAST columns out of SET', () => {
    const s = updateStatement(orders, undefined, undefined, [t('1'), t('2'), UNCHANGED]);
    assert.equal(s.text, `UPDATE ONLY "app"."orders" SET "region" = $1::${INT4}, "id" = $2::${INT8} WHERE "region" = $3::${INT4} AND "id" = $4::${INT8}`);
    assert.deepEqual(s.params, ['1', '2', '1', '2']);
  });

  test('DELETE by key; texts are cached per shape', () => {
    const a = deleteStatement(orders, 'key', [t('1'), t('2'), NULL]);
    assert.equal(a.text, `DELETE FROM ONLY "app"."orders" WHERE "region" = $1::${INT4} AND "id" = $2::${INT8}`);
    assert.deepEqual(a.params, ['1', '2']);
    const b = deleteStatement(orders, 'key', [t('5'), t('6'), NULL]);
    assert.equal(b.text, a.text);
    assert.ok(orders.statements.has('D|K'));
  });

  const dup = relation({
    schema: 'we"ird',
    name: 'no key',
    identity: 'full',
    columns: [
      { name: 'a', type: INT4 },
      { name: 'b', type: TEXT },
      { name: 'doc', type: JSON_T, equality: false },
      { name: 'pt', type: POINT, equality: false },
    ],
  });

  test('FULL: one row at most, NULLs matched with IS NULL, types without equality compared as text', () => {
    const s = deleteStatement(dup, 'old', [t('1'), NULL, t('{"k": 1}'), t('(1,2)')]);
    assert.equal(
      s.text,
      `DELETE FROM ONLY "we""ird"."no key" WHERE ctid = (SELECT ctid FROM ONLY "we""ird"."no key" WHERE "a" = $1::${INT4} AND "b" IS NULL AND ` +
        `"doc"::pg_catalog.text = ($2::${JSON_T})::pg_catalog.text AND "pt"::pg_catalog.text = ($3::${POINT})::pg_catalog.text LIMIT 1)`,
    );
    assert.deepEqual(s.params, ['1', '{"k": 1}', '(1,2)']);
    // Another NULL pattern is another shape (and another prepared statement).
    const u = updateStatement(dup, 'old', [NULL, t('x'), NULL, NULL], [t('2'), t('x'), NULL, NULL]);
    assert.equal(
      u.text,
      `UPDATE ONLY "we""ird"."no key" SET "a" = $1::${INT4}, "b" = $2::${TEXT}, "doc" = $3::${JSON_T}, "pt" = $4::${POINT} ` +
        `WHERE ctid = (SELECT ctid FROM ONLY "we""ird"."no key" WHERE "a" IS NULL AND "b" = $5::${TEXT} AND "doc" IS NULL AND "pt" IS NULL LIMIT 1)`,
    );
    assert.deepEqual(u.params, ['2', 'x', null, null, 'x']);
  });

  test('FULL: every sent value unchanged still updates the row (to itself)', () => {
    const big = relation({ name: 'big', identity: 'full', columns: [{ name: 'body', type: TEXT }] });
    const s = updateStatement(big, 'old', [t('long text')], [UNCHANGED]);
    assert.equal(s.text, `UPDATE ONLY "app"."big" SET "body" = "body" WHERE ctid = (SELECT ctid FROM ONLY "app"."big" WHERE "body" = $1::${TEXT} LIMIT 1)`);
    assert.deepEqual(s.params, ['long text']);
  });

  test('partitioned target: no ONLY, and a FULL match pins partition and ctid together', () => {
    const parted = relation({
      name: 'measure',
      identity: 'full',
      relkind: 'p',
      columns: [
        { name: 'day', type: INT4 },
        { name: 'v', type: TEXT },
      ],
    });
    const s = deleteStatement(parted, 'old', [t('3'), t('x')]);
    assert.equal(
      s.text,
      `DELETE FROM "app"."measure" WHERE (tableoid, ctid) = (SELECT tableoid, ctid FROM "app"."measure" WHERE "day" = $1::${INT4} AND "v" = $2::${TEXT} LIMIT 1)`,
    );
    const keyed = relation({ name: 'k', identity: 'default', relkind: 'p', columns: [{ name: 'id', type: INT4, key: true }] });
    assert.equal(updateStatement(keyed, undefined, undefined, [t('1')]).text, `UPDATE "app"."k" SET "id" = $1::${INT4} WHERE "id" = $2::${INT4}`);
  });

  test('TRUNCATE: ONLY for plain tables, partitioned ones with their partitions; RESTART IDENTITY kept', () => {
    const parted = relation({ name: 'measure', identity: 'default', relkind: 'p', columns: [{ name: 'id', key: true }] });
    assert.deepEqual(truncateStatement([orders, parted], true), { text: 'TRUNCATE ONLY "app"."orders", "app"."measure" RESTART IDENTITY', params: [] });
    assert.equal(truncateStatement([orders], false).text, 'TRUNCATE ONLY "app"."orders"');
  });

  test('REPLICA IDENTITY NOTHING: UPDATE and DELETE fail with a typed ApplyError naming the table', () => {
    const nothing = relation({ name: 'log', identity: 'nothing', columns: [{ name: 'line' }, { name: 'at' }] });
    // Inserts need no identity.
    assert.equal(insertStatement(nothing, [t('x'), t('y')]).params.length, 2);
    for (const run of [() => updateStatement(nothing, undefined, undefined, [t('x'), t('y')]), () => deleteStatement(nothing, 'key', [t('x'), t('y')])]) {
      assert.throws(run, (err: unknown) => {
        assert.ok(err instanceof ApplyError);
        assert.equal(err.code, 'PGSUB_APPLY_FAILED');
        assert.equal(err.context.relation, 'app.log');
        assert.match(err.message, /"app\.log"/);
        assert.match(err.message, /replica identity/);
        return true;
      });
    }
  });

  test('tuples that do not fit the Relation message, or carry values the mode cannot take, are ApplyErrors', () => {
    assert.throws(() => insertStatement(orders, [t('1'), t('2')] as Tuple), ApplyError);
    assert.throws(() => insertStatement(orders, [t('1'), t('2'), UNCHANGED]), /unchanged TOAST value.*"note"/);
    // Binary mode: a binary value is bound as it came (binary format); see test/unit/binary.test.ts.
    assert.deepEqual(insertStatement(orders, [t('1'), t('2'), { kind: 'binary', value: Buffer.from('x') }]).params, ['1', '2', Buffer.from('x')]);
    assert.throws(() => updateStatement(orders, undefined, undefined, [t('1'), UNCHANGED, t('n')]), /unchanged TOAST value.*"id"/);
  });

  test('mapping row semantics: rows located by the key with a computed column, the filter as a guard, the soft delete revive', () => {
    const base = relation({
      name: 'accounts',
      identity: 'default',
      columns: [
        { name: 'code', type: TEXT, key: true },
        { name: 'name', type: TEXT },
      ],
    });
    const col = (name: string, typeName = TEXT, typeOid = 25) => ({ name, typeOid, typeName, generated: false, hasEquality: true });
    const tenant = { column: col('tenant'), expr: `split_part(code, '-', 1)`, uses: [0] };
    const rel = {
      ...base,
      reshape: {
        direct: [true, true],
        rowTypes: [TEXT, TEXT],
        computed: [tenant],
        rows: {
          key: [
            { column: tenant.column, remote: null, expr: tenant.expr, uses: [0] },
            { column: base.targetColumns[0]!, remote: 0, expr: null, uses: [0] },
          ],
          keyNames: ['tenant', 'code'],
          filter: { expr: `code <> 'x'`, uses: [0] },
          softDelete: { flag: col('deleted', '"pg_catalog"."bool"', 16), at: null, lsn: null },
          truncate: 'truncate',
          discriminator: null,
        },
      },
    } as MappedRelation;
    const key = `"tenant" = (SELECT CAST((split_part(code, '-', 1)) AS ${TEXT}) FROM (SELECT $1::${TEXT} AS "code") AS r) AND "code" = $1::${TEXT}`;
    const d = deleteStatement(rel, 'key', [t('a-1'), { kind: 'null' }]);
    assert.equal(d.text, `DELETE FROM ONLY "app"."accounts" WHERE ${key}`);
    assert.deepEqual(d.params, ['a-1']);
    const g = deleteStatement(rel, 'key', [t('a-1'), { kind: 'null' }], null, true);
    assert.equal(g.text, `DELETE FROM ONLY "app"."accounts" WHERE ${key} AND (SELECT (code <> 'x') IS TRUE FROM (SELECT $2::${TEXT} AS "code") AS r)`);
    assert.deepEqual(g.params, ['a-1', 'a-1']);
    // Detection: a row the guard filters out is not missing.
    assert.match(
      deleteStatement(rel, 'key', [t('a-1'), { kind: 'null' }], { originId: null, returningOld: true }, true).text,
      /WHEN \(SELECT \(code <> 'x'\) IS TRUE .*\) AND NOT EXISTS/,
    );
    const i = insertStatement(rel, [t('a-1'), t('n')]).text;
    assert.match(
      i,
      /FROM r WHERE \(code <> 'x'\) IS TRUE ON CONFLICT \("tenant", "code"\) DO UPDATE SET "code" = EXCLUDED\."code", "name" = EXCLUDED\."name", "tenant" = EXCLUDED\."tenant", "deleted" = false WHERE "pgsub_row"\."deleted" IS TRUE/,
    );
    assert.match(i, /NOT EXISTS \(SELECT FROM pgsub_changed\) AND EXISTS \(SELECT FROM r WHERE .*\) THEN "pgsub"\."conflict"\('insert_exists'\)/);
  });
});
