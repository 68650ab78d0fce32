/**
 * The refusal of migrate/grants.ts without a server: GRANTs of the same privileges and
 * object kind merged into one statement, other statements once each, in the order first
 * needed; the message names each server, groups privileges under their reason, names a
 * privilege once, and is null when nothing lacks. The probes themselves are tested against
 * real servers (privilege-versions.test.ts, least-privilege.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseConninfo } from '../../src/config/conninfo.js';
import type { Db } from '../../src/migrate/db.js';
import { fixes, privilegeError, type Lack, type SideLacks } from '../../src/migrate/grants.js';

const db = (side: 'source' | 'target', host: string, version: string): Db => ({
  side,
  info: parseConninfo(`host=${host} port=5432 dbname=shop user=x sslmode=disable`, 'source', {}),
  versionNum: Number(version.split('.')[0]) * 10000,
  version,
  query: async () => [],
  close: async () => {},
});

const side = (s: 'source' | 'target', role: string, lacks: Lack[]): SideLacks => ({
  side: s,
  db: db(s, `${s}-db`, s === 'source' ? '14.23' : '18.4'),
  role,
  superuser: false,
  replication: false,
  lacks,
});

test('GRANTs of the same privileges and kind are merged; statements kept once, in order', () => {
  const lacks: Lack[] = [
    { what: 'the REPLICATION attribute', why: 'a', fix: 'ALTER ROLE "Repl" REPLICATION;' },
    { what: 'SELECT on table shop.a', why: 'b', fix: { privileges: 'SELECT', kind: 'TABLE', object: 'shop.a' } },
    { what: 'SELECT on sequence shop.s', why: 'c', fix: { privileges: 'SELECT', kind: 'SEQUENCE', object: 'shop.s' } },
    { what: 'SELECT on table shop.b', why: 'b', fix: { privileges: 'SELECT', kind: 'TABLE', object: 'shop.b' } },
    { what: 'SELECT on table shop.a', why: 'd', fix: { privileges: 'SELECT', kind: 'TABLE', object: 'shop.a' } },
    { what: 'the REPLICATION attribute', why: 'e', fix: 'ALTER ROLE "Repl" REPLICATION;' },
    { what: 'SELECT, UPDATE on sequence shop.t', why: 'c', fix: { privileges: 'SELECT, UPDATE', kind: 'SEQUENCE', object: 'shop.t' } },
  ];
  assert.deepEqual(fixes(lacks, 'Repl'), [
    'ALTER ROLE "Repl" REPLICATION;',
    'GRANT SELECT ON shop.a, shop.b TO "Repl";',
    'GRANT SELECT ON SEQUENCE shop.s TO "Repl";',
    'GRANT SELECT, UPDATE ON SEQUENCE shop.t TO "Repl";',
  ]);
});

test('the refusal names each server, groups privileges under their first reason, and is null when nothing lacks', () => {
  assert.equal(privilegeError('run', [side('source', 'r', []), side('target', 't', [])]), null);
  const err = privilegeError('run', [
    side('source', 'r', [
      { what: 'SELECT on sequence shop.s', why: 'the sync reads them', fix: { privileges: 'SELECT', kind: 'SEQUENCE', object: 'shop.s' } },
      { what: 'SELECT on sequence shop.t', why: 'the sync reads them', fix: { privileges: 'SELECT', kind: 'SEQUENCE', object: 'shop.t' } },
      { what: 'SELECT on sequence shop.s', why: 'the cutover reads them', fix: { privileges: 'SELECT', kind: 'SEQUENCE', object: 'shop.s' } },
    ]),
    side('target', 't', []),
    side('target', 'u', [{ what: 'superuser', why: 'before 15', fix: 'ALTER ROLE u SUPERUSER;' }]),
  ]);
  assert.ok(err);
  assert.equal(err.code, 'PGSUB_PRIVILEGE_MISSING');
  assert.equal(err.exitCode, 2);
  assert.equal(err.side, 'source');
  assert.equal(
    err.message,
    'pgsub run cannot run as these roles: source source-db:5432 (PostgreSQL 14.23): role "r" lacks SELECT on sequence shop.s, SELECT on sequence shop.t (the sync reads them). Run on the source: GRANT SELECT ON SEQUENCE shop.s, shop.t TO r;' +
      ' — target target-db:5432 (PostgreSQL 18.4): role "u" lacks superuser (before 15). Run on the target: ALTER ROLE u SUPERUSER;',
  );
  assert.deepEqual(err.context, { command: 'run', sides: 'source source-db:5432, target target-db:5432', missing: 4, side: 'source' });
});
