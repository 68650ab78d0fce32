/**
 * The mapping's statement builders (docs/mapping.md), text and parameters for each rule and
 * combination: reshaped inserts and updates (one row, VALUES lists, column arrays), the row
 * rules (filter verdicts and guards, key override, soft delete with its revive and the
 * tombstone a moving key replaces, TRUNCATE policies, discriminator), the careful path's
 * reshaped row update and collision search, and the initial copy's shape (staged copy,
 * discriminator scoped). Relations are built here as relmap.ts would resolve them.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { MappedRelation, TargetColumn } from '../../src/apply/sql/mapped-relation.js';
import type { Reshape, RowPlan } from '../../src/mapping/columns.js';
import type { RelationMessage, Tuple } from '../../src/protocol/messages.js';
import { reshapedUpdateArraysStatement } from '../../src/apply/sql/update-rows.js';
import { locator } from '../../src/apply/sql/locator.js';
import { insertStatement } from '../../src/apply/sql/insert.js';
import { updateStatement } from '../../src/apply/sql/update.js';
import { insertManyStatement } from '../../src/apply/sql/multi-row.js';
import { deleteStatement } from '../../src/apply/sql/delete.js';
import {
  reshapedHitsStatement,
  reshapedRowUpdate,
  softDeleteRow,
  softDeleteStatement,
  tombstoneDelete,
  truncatePolicyStatement,
  verdictStatement,
} from '../../src/mapping/row-statements.js';
import type { Lsn } from '../../src/protocol/lsn.js';
import type { Statement } from '../../src/pgwire/statement.js';
import { mapTable, type PublishedTable } from '../../src/tablesync/catalog.js';
import { sourceCopySql, stagedCopySql, targetCopySql } from '../../src/tablesync/copy.js';
import { ruleFor, type MappingConfig } from '../../src/mapping/rules.js';

const INT4 = '"pg_catalog"."int4"';
const TEXT = '"pg_catalog"."text"';
const t = (value: string) => ({ kind: 'text', value }) as const;
const NULL = { kind: 'null' } as const;
const UNCHANGED = { kind: 'unchanged' } as const;
const BOOL = '"pg_catalog"."bool"';
const TSTZ = '"pg_catalog"."timestamptz"';

function col(name: string, typeName = TEXT, typeOid = 25): TargetColumn {
  return { name, typeOid, typeName, generated: false, hasEquality: true, arrayType: true, identityAlways: false };
}

/**
 * Remote s.items (id int4 key, name text, cents int4) → target t.items (id, title, price
 * computed from cents, plus whatever `extra` adds: row rules, more computed columns).
 */
function items(extra: { rows?: RowPlan; computed?: Reshape['computed'] } = {}): MappedRelation {
  const remote: RelationMessage = {
    tag: 'relation',
    relationId: 16400,
    namespace: 's',
    name: 'items',
    replicaIdentity: 'default',
    columns: [
      { isKey: true, name: 'id', typeOid: 23, typeModifier: -1 },
      { isKey: false, name: 'name', typeOid: 25, typeModifier: -1 },
      { isKey: false, name: 'cents', typeOid: 23, typeModifier: -1 },
    ],
  };
  const reshape: Reshape = {
    direct: [true, true, false],
    rowTypes: [INT4, TEXT, INT4],
    computed: [{ column: col('price', '"pg_catalog"."numeric"', 1700), expr: 'cents / 100.0', uses: [2] }, ...(extra.computed ?? [])],
  };
  if (extra.rows) reshape.rows = extra.rows;
  return {
    remote,
    ordered: extra.rows !== undefined,
    rowSecurity: false,
    qualifiedName: '"t"."items"',
    displayName: 's.items',
    relkind: 'r',
    targetColumns: [col('id', INT4, 23), col('title'), col('cents', INT4, 23)],
    keyIndexes: [0],
    statements: new Map(),
    paramColumns: new Map(),
    reshape,
  };
}

/** A text[] parameter (array_send layout) back as its elements. */
function textArray(param: unknown): (string | null)[] {
  const b = param as Buffer;
  const n = b.readInt32BE(12);
  const out: (string | null)[] = [];
  let at = 20;
  for (let i = 0; i < n; i++) {
    const len = b.readInt32BE(at);
    at += 4;
    if (len < 0) out.push(null);
    else {
      out.push(b.toString('utf8', at, at + len));
      at += len;
    }
  }
  return out;
}

describe('reshaped updates as column arrays (update-rows.ts)', () => {
  const rows: Tuple[] = [
    [t('1'), t('a'), t('150')],
    [t('2'), NULL, t('99')],
  ];

  test('every column sent: direct and computed columns set from r, joined by the key', () => {
    const s = reshapedUpdateArraysStatement(items(), items().reshape!, rows, [0, 1, 2], null)!;
    assert.equal(
      s.text,
      `UPDATE ONLY "t"."items" AS "pgsub_row" SET "id" = "pgsub_values"."v0", "title" = "pgsub_values"."v1", "price" = "pgsub_values"."v2" ` +
        `FROM (SELECT r."id" AS "v0", r."name" AS "v1", (cents / 100.0) AS "v2", r."id" AS "k0" FROM (SELECT pg_catalog.unnest($1::"pg_catalog"."text"[])::${INT4} AS "id", ` +
        `pg_catalog.unnest($2::"pg_catalog"."text"[])::${TEXT} AS "name", pg_catalog.unnest($3::"pg_catalog"."text"[])::${INT4} AS "cents") AS r) AS "pgsub_values" ` +
        `WHERE "pgsub_row"."id" = "pgsub_values"."k0"`,
    );
    assert.deepEqual(s.params.map(textArray), [
      ['1', '2'],
      ['a', null],
      ['150', '99'],
    ]);
  });

  test('an input not sent: its computed column is left alone; with detection a short count is update_missing', () => {
    const s = reshapedUpdateArraysStatement(items(), items().reshape!, rows, [0, 1], { originId: null, returningOld: false })!;
    assert.doesNotMatch(s.text, /price/);
    assert.match(s.text, /^WITH pgsub_changed AS \(UPDATE ONLY "t"\."items" AS "pgsub_row" SET "id" = "pgsub_values"\."v0", "title" = "pgsub_values"\."v1" FROM /);
    assert.match(
      s.text,
      /RETURNING 1\) SELECT CASE WHEN \(SELECT pg_catalog\.count\(\*\) FROM pgsub_changed\) <> pg_catalog\.cardinality\(\$1::"pg_catalog"\."text"\[\]\) THEN "pgsub"\."conflict"\('update_missing'\) END$/,
    );
    assert.equal(s.params.length, 2);
  });

  test('values that cannot go as arrays (an unchanged TOAST value in a sent column): null, rows go one by one', () => {
    assert.equal(reshapedUpdateArraysStatement(items(), items().reshape!, [[t('1'), UNCHANGED, t('1')]], [0, 1, 2], null), null);
  });
});

/** Filter (id < 1000), soft delete (flag and time), discriminator shard = 'a' in the key (shard, id). */
const SHARD = { column: col('shard'), expr: "'a'", uses: [] as number[] };
const ROWS: RowPlan = {
  key: [
    { column: col('shard'), remote: null, expr: "'a'", uses: [] },
    { column: col('id', INT4, 23), remote: 0, expr: null, uses: [0] },
  ],
  keyNames: ['shard', 'id'],
  filter: { expr: 'id < 1000', uses: [0] },
  softDelete: { flag: col('deleted', BOOL, 16), at: col('deleted_at', TSTZ, 1184), lsn: null },
  truncate: 'truncate',
  discriminator: { column: col('shard'), value: 'a' },
};
const SOFT = ROWS.softDelete!;
const ROW: Tuple = [t('7'), t('x'), t('150')];
const KEY: Tuple = [t('6'), NULL, NULL];
const COMMIT_TIME = 1_000_000n;
const LSN = 0x16b374d848n as Lsn;

function expect(s: Statement | 'ignore' | null, text: string, params: unknown[]): void {
  assert.ok(s !== null && s !== 'ignore');
  assert.equal(s.text, text);
  assert.deepEqual(s.params, params);
}

describe('statement builders per rule and combination (statements.ts, row-statements.ts)', () => {
  const rel = items({ rows: ROWS, computed: [SHARD] });

  test('computed column: one INSERT … SELECT over the row subquery', () => {
    expect(
      insertStatement(items(), ROW),
      'INSERT INTO "t"."items" ("id", "title", "price") SELECT r."id", r."name", (cents / 100.0) FROM (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents") AS r',
      ['7', 'x', '150'],
    );
  });

  test('computed column: a batch as a VALUES list under the remote names', () => {
    expect(
      insertManyStatement(items(), [ROW, ROW]),
      'INSERT INTO "t"."items" ("id", "title", "price") SELECT r."id", r."name", (cents / 100.0) FROM (VALUES ($1::"pg_catalog"."int4", $2::"pg_catalog"."text", $3::"pg_catalog"."int4"), ($4::"pg_catalog"."int4", $5::"pg_catalog"."text", $6::"pg_catalog"."int4")) AS r ("id", "name", "cents")',
      ['7', 'x', '150', '7', 'x', '150'],
    );
  });

  test('computed column: UPDATE sets the row from the subquery, located by the identity', () => {
    expect(
      updateStatement(items(), undefined, undefined, ROW),
      'UPDATE ONLY "t"."items" SET ("id", "title", "price") = (SELECT r."id", r."name", (cents / 100.0) FROM (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents") AS r) WHERE "id" = $4::"pg_catalog"."int4"',
      ['7', 'x', '150', '7'],
    );
  });

  test('computed column: DELETE by the identity', () => {
    expect(deleteStatement(items(), 'key', KEY), 'DELETE FROM ONLY "t"."items" WHERE "id" = $1::"pg_catalog"."int4"', ['6']);
  });

  test('filter + soft delete + discriminator: INSERT filtered in itself, reviving a row marked deleted, insert_exists on a live one', () => {
    expect(
      insertStatement(rel, ROW),
      'WITH r AS (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents"), pgsub_changed AS (INSERT INTO "t"."items" AS "pgsub_row" ("id", "title", "price", "shard") SELECT r."id", r."name", (cents / 100.0), (\'a\') FROM r WHERE (id < 1000) IS TRUE ON CONFLICT ("shard", "id") DO UPDATE SET "id" = EXCLUDED."id", "title" = EXCLUDED."title", "price" = EXCLUDED."price", "shard" = EXCLUDED."shard", "deleted" = false, "deleted_at" = NULL WHERE "pgsub_row"."deleted" IS TRUE RETURNING 1) SELECT CASE WHEN NOT EXISTS (SELECT FROM pgsub_changed) AND EXISTS (SELECT FROM r WHERE (id < 1000) IS TRUE) THEN "pgsub"."conflict"(\'insert_exists\') END',
      ['7', 'x', '150'],
    );
  });

  test('key with a discriminator: UPDATE located by the key over the old row', () => {
    expect(
      updateStatement(rel, 'key', KEY, ROW),
      'UPDATE ONLY "t"."items" SET ("id", "title", "price", "shard") = (SELECT r."id", r."name", (cents / 100.0), (\'a\') FROM (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents") AS r) WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $4::"pg_catalog"."int4"',
      ['7', 'x', '150', '6'],
    );
  });

  test('filter guard with detection (origin known, PostgreSQL 18)', () => {
    expect(
      updateStatement(rel, undefined, undefined, ROW, { originId: 3, returningOld: true }, true),
      'WITH pgsub_changed AS (UPDATE ONLY "t"."items" SET ("id", "title", "price", "shard") = (SELECT r."id", r."name", (cents / 100.0), (\'a\') FROM (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents") AS r) WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $4::"pg_catalog"."int4" AND (SELECT (id < 1000) IS TRUE FROM (SELECT $5::"pg_catalog"."int4" AS "id") AS r) RETURNING WITH (OLD AS pgsub_old) (pg_catalog.pg_xact_commit_timestamp_origin(pgsub_old.xmin)).roident AS r) SELECT CASE WHEN (SELECT (id < 1000) IS TRUE FROM (SELECT $5::"pg_catalog"."int4" AS "id") AS r) AND NOT EXISTS (SELECT FROM pgsub_changed) THEN "pgsub"."conflict"(\'update_missing\') WHEN (SELECT (id < 1000) IS TRUE FROM (SELECT $5::"pg_catalog"."int4" AS "id") AS r) AND EXISTS (SELECT FROM pgsub_changed WHERE r <> 3) THEN "pgsub"."conflict"(\'update_origin_differs\') END',
      ['7', 'x', '150', '7', '7'],
    );
  });

  test('DELETE with the filter guard and detection', () => {
    expect(
      deleteStatement(rel, 'key', [t('7'), NULL, NULL], { originId: null, returningOld: false }, true),
      'WITH pgsub_changed AS (DELETE FROM ONLY "t"."items" WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $1::"pg_catalog"."int4" AND (SELECT (id < 1000) IS TRUE FROM (SELECT $2::"pg_catalog"."int4" AS "id") AS r) RETURNING 1) SELECT CASE WHEN (SELECT (id < 1000) IS TRUE FROM (SELECT $2::"pg_catalog"."int4" AS "id") AS r) AND NOT EXISTS (SELECT FROM pgsub_changed) THEN "pgsub"."conflict"(\'delete_missing\') END',
      ['7', '7'],
    );
  });

  test('filter verdicts of two rows in one query', () => {
    expect(
      verdictStatement(rel, rel.reshape!, [ROW, ROW]),
      'SELECT (SELECT (id < 1000) IS TRUE FROM (SELECT $1::"pg_catalog"."int4" AS "id") AS r)::pg_catalog.text, (SELECT (id < 1000) IS TRUE FROM (SELECT $2::"pg_catalog"."int4" AS "id") AS r)::pg_catalog.text',
      ['7', '7'],
    );
  });

  test('soft delete: the located row marked with flag and commit time', () => {
    expect(
      softDeleteStatement(rel, SOFT, locator(rel, 'DELETE', 'key', [t('7'), NULL, NULL], undefined), COMMIT_TIME, LSN, null),
      'UPDATE ONLY "t"."items" SET "deleted" = true, "deleted_at" = $1::pg_catalog.timestamptz WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $2::"pg_catalog"."int4"',
      ['2000-01-01T00:00:01.000000Z', '7'],
    );
  });

  test('soft delete of one local row (careful path)', () => {
    expect(
      softDeleteRow(rel, SOFT, '16400', '(0,1)', COMMIT_TIME, LSN),
      'UPDATE ONLY "t"."items" SET "deleted" = true, "deleted_at" = $1::pg_catalog.timestamptz WHERE tableoid = $2::pg_catalog.oid AND ctid = $3::pg_catalog.tid',
      ['2000-01-01T00:00:01.000000Z', '16400', '(0,1)'],
    );
  });

  test('TRUNCATE of a shard: its rows only', () => {
    expect(truncatePolicyStatement(rel, COMMIT_TIME, LSN), 'DELETE FROM ONLY "t"."items" WHERE "shard" = \'a\'', []);
  });

  test('TRUNCATE as soft delete of a shard: its live rows marked', () => {
    expect(
      truncatePolicyStatement(items({ rows: { ...ROWS, truncate: 'soft_delete' }, computed: [SHARD] }), COMMIT_TIME, LSN),
      'UPDATE ONLY "t"."items" SET "deleted" = true, "deleted_at" = $1::pg_catalog.timestamptz WHERE NOT ("deleted" IS TRUE) AND "shard" = \'a\'',
      ['2000-01-01T00:00:01.000000Z'],
    );
  });

  test('careful path: a local row takes the mapped values, revived', () => {
    expect(
      reshapedRowUpdate(rel, rel.reshape!, ROW, '16400', '(0,1)', true),
      'UPDATE ONLY "t"."items" SET ("id", "title", "price", "shard") = (SELECT r."id", r."name", (cents / 100.0), (\'a\') FROM (SELECT $1::"pg_catalog"."int4" AS "id", $2::"pg_catalog"."text" AS "name", $3::"pg_catalog"."int4" AS "cents") AS r), "deleted" = false, "deleted_at" = NULL WHERE tableoid = $4::pg_catalog.oid AND ctid = $5::pg_catalog.tid',
      ['7', 'x', '150', '16400', '(0,1)'],
    );
  });

  test('careful path: collisions in a unique index without the discriminator; a row marked deleted under the own key is not one', () => {
    expect(
      reshapedHitsStatement(rel, rel.reshape!, [{ name: 't.items_id_key', columns: ['id'], nullsNotDistinct: false }], ROW, 'pgsub_local.ctid', null)!.statement,
      'WITH pgsub_new AS (SELECT r."id" AS "v0", CAST((\'a\') AS "pg_catalog"."text") AS "v1" FROM (SELECT $1::"pg_catalog"."int4" AS "id") AS r) SELECT 0, pgsub_local.ctid FROM ONLY "t"."items" AS pgsub_local, pgsub_new WHERE pgsub_local."id" = pgsub_new."v0" AND NOT (pgsub_local."deleted" IS TRUE AND pgsub_local."shard" = pgsub_new."v1" AND pgsub_local."id" = pgsub_new."v0")',
      ['7'],
    );
  });

  test('a key moving onto one marked deleted: that row gives way', () => {
    expect(
      tombstoneDelete(rel, SOFT, ROW),
      'DELETE FROM ONLY "t"."items" WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $1::"pg_catalog"."int4" AND "deleted" IS TRUE',
      ['7'],
    );
  });

  test('the same on the careful path, never the located row itself', () => {
    expect(
      tombstoneDelete(rel, SOFT, ROW, { reloid: '16400', tid: '(0,2)' }),
      'DELETE FROM ONLY "t"."items" WHERE "shard" = CAST((\'a\') AS "pg_catalog"."text") AND "id" = $1::"pg_catalog"."int4" AND "deleted" IS TRUE AND NOT (tableoid = $2::pg_catalog.oid AND ctid = $3::pg_catalog.tid)',
      ['7', '16400', '(0,2)'],
    );
  });

  test('TRUNCATE with the policy ignore: nothing; without a discriminator the plain TRUNCATE', () => {
    assert.equal(truncatePolicyStatement(items({ rows: { ...ROWS, truncate: 'ignore' }, computed: [SHARD] }), COMMIT_TIME, LSN), 'ignore');
    assert.equal(truncatePolicyStatement(items({ rows: { ...ROWS, discriminator: null } }), COMMIT_TIME, LSN), null);
  });
});

describe('the initial copy’s shape (catalog.ts mapTable, copy.ts)', () => {
  const table: PublishedTable = {
    schema: 's',
    table: 'items',
    columns: ['id', 'name', 'cents', 'secret'],
    rowFilter: null,
    relkind: 'r',
    estimatedRows: 0,
    estimatedBytes: 0,
    pages: 0,
    generated: false,
    replicaIdentity: 'd',
    hasPrimaryKey: true,
    publishesUpdates: true,
  };
  const rule = (extra: Record<string, unknown>) =>
    ruleFor({ schemas: {}, tables: { 's.items': { target: 't.items', columns: { name: 'title' }, exclude: ['secret'], ...extra } } } as unknown as MappingConfig, 's', 'items');

  test('renames and excludes: the straight COPY with column lists', () => {
    const m = mapTable(table, rule({}));
    assert.equal(sourceCopySql(m, { fromPage: null, toPage: null }, true), 'COPY "s"."items" ("id", "name", "cents") TO STDOUT (FORMAT binary)');
    assert.equal(targetCopySql(m, true), 'COPY "t"."items" ("id", "title", "cents") FROM STDIN (FORMAT binary)');
  });

  test('a filter is pushed down to the publisher', () => {
    const m = mapTable(table, rule({ filter: 'id < 1000' }));
    assert.equal(sourceCopySql(m, { fromPage: null, toPage: null }, false), 'COPY (SELECT "id", "name", "cents" FROM ONLY "s"."items" WHERE ((id < 1000))) TO STDOUT');
  });

  test('a discriminator: staged, its value a computed constant, the shard named for the scoped cleanup', () => {
    const m = mapTable(table, rule({ discriminator: { column: 'shard', value: "it's a" } }));
    assert.deepEqual(m.target!.discriminator, { column: 'shard', value: "it's a" });
    const sql = stagedCopySql(m, ['integer', 'text', 'integer'], new Map(), true);
    assert.equal(sql.create, 'CREATE TEMPORARY TABLE "pgsub_copy_staging" ("id" integer, "name" text, "cents" integer) ON COMMIT DROP');
    assert.equal(sql.copyIn, 'COPY pg_temp."pgsub_copy_staging" ("id", "name", "cents") FROM STDIN (FORMAT binary)');
    assert.equal(
      sql.insert,
      `INSERT INTO "t"."items" ("id", "title", "cents", "shard") OVERRIDING SYSTEM VALUE SELECT r."id", r."name", r."cents", ('it''s a') FROM pg_temp."pgsub_copy_staging" AS r`,
    );
  });

  test('computed columns with a type change: staged, the direct column read through text', () => {
    const m = mapTable(table, rule({ computed: { price: 'cents / 100.0' }, exclude: ['secret', 'cents'] }));
    const sql = stagedCopySql(m, ['integer', 'text', 'integer'], new Map([['id', 'bigint']]), false);
    assert.equal(
      sql.insert,
      'INSERT INTO "t"."items" ("id", "title", "price") OVERRIDING SYSTEM VALUE SELECT r."id"::pg_catalog.text::bigint, r."name", (cents / 100.0) FROM pg_temp."pgsub_copy_staging" AS r',
    );
  });
});
