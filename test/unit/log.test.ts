/**
 * How an error reaches the log (log.ts serializeError, pino's `err` serializer): its class,
 * code, context fields, a server error's fields and its stack on one JSON line, and never a
 * password, through a real pino logger writing to a string.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DatabaseError } from 'pg-protocol';
import { ApplyError, ConnectionLostError } from '../../src/errors.js';
import { createLogger, serializeError } from '../../src/log.js';

function logged(write: (log: ReturnType<typeof createLogger>) => void): Record<string, unknown>[] {
  const lines: string[] = [];
  const log = createLogger('debug', { write: (s: string) => void lines.push(s) });
  write(log);
  return lines.map((l) => JSON.parse(l) as Record<string, unknown>);
}

/** A server error as pg's parser builds it from an ErrorResponse. */
function uniqueViolation(): DatabaseError {
  const e = new DatabaseError('duplicate key value violates unique constraint "item_pkey"', 100, 'error');
  Object.assign(e, {
    severity: 'ERROR',
    code: '23505',
    detail: 'Key (id)=(7) already exists.',
    schema: 'public',
    table: 'item',
    constraint: 'item_pkey',
    routine: '_bt_check_unique',
  });
  return e;
}

test('a typed error: its class, code, context fields and stack on one line', () => {
  const err = new ApplyError('cannot apply INSERT on "public.item"', { relation: 'public.item', command: 'INSERT', finishLsn: '0/1A2B3C4' }, { cause: uniqueViolation() });
  const [line] = logged((log) => log.error({ err, retryInMs: 1000 }, 'apply failed; retrying'));
  const e = line!.err as Record<string, unknown>;
  assert.equal(line!.level, 50);
  assert.equal(e.type, 'ApplyError');
  assert.equal(e.code, 'PGSUB_APPLY_FAILED');
  assert.equal(e.message, 'cannot apply INSERT on "public.item"');
  assert.deepEqual([e.relation, e.command, e.finishLsn], ['public.item', 'INSERT', '0/1A2B3C4']);
  assert.match(String(e.stack), /^ApplyError: cannot apply INSERT on "public\.item"\n +at /);
  // The server's error as the cause, with PostgreSQL's fields, without its stack.
  assert.deepEqual(e.cause, {
    type: 'DatabaseError',
    code: '23505',
    message: 'duplicate key value violates unique constraint "item_pkey"',
    severity: 'ERROR',
    detail: 'Key (id)=(7) already exists.',
    schema: 'public',
    table: 'item',
    constraint: 'item_pkey',
    routine: '_bt_check_unique',
  });
  assert.equal(line!.retryInMs, 1000);
});

test("a server error: the SQLSTATE as code and postgres.js's field names mapped to the same ones", () => {
  const e = serializeError(uniqueViolation());
  assert.equal(e.type, 'DatabaseError');
  assert.equal(e.code, '23505');
  assert.equal(e.constraint, 'item_pkey');
  class PostgresError extends Error {}
  const pj = Object.assign(new PostgresError('permission denied for table item'), { code: '42501', schema_name: 'public', table_name: 'item', hint: 'GRANT it' });
  const s = serializeError(pj);
  assert.deepEqual([s.type, s.code, s.schema, s.table, s.hint], ['PostgresError', '42501', 'public', 'item', 'GRANT it']);
});

test('no password or conninfo: redacted in the message, the stack and the context, keys that name one dropped', () => {
  const err = new ConnectionLostError('target connection lost (postgresql://app:s3cret@db/x password=hunter2)', {
    target: 'host=db port=5432 dbname=x user=app sslmode=prefer',
    conninfo: 'host=db password=hunter2',
    password: 'hunter2',
    url: 'postgres://app:s3cret@db/x',
  });
  const [line] = logged((log) => log.warn({ err }, 'lost'));
  const text = JSON.stringify(line);
  assert.doesNotMatch(text, /s3cret|hunter2/);
  const e = line!.err as Record<string, unknown>;
  assert.equal(e.type, 'ConnectionLostError');
  assert.equal(e.target, 'host=db port=5432 dbname=x user=app sslmode=prefer');
  assert.equal(e.conninfo, undefined);
  assert.equal(e.password, undefined);
  assert.equal(e.url, 'postgres://app:****@db/x');
});

test('what is not an Error: a string, a plain object, a Node system error', () => {
  assert.deepEqual(serializeError('boom'), { type: 'string', message: 'boom' });
  assert.deepEqual(serializeError({ code: 'X', message: 'plain' }), { type: 'Object', code: 'X', message: 'plain' });
  const sys = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED', syscall: 'connect', address: '127.0.0.1', port: 1, errno: -111 });
  const s = serializeError(sys);
  assert.deepEqual([s.type, s.code, s.syscall, s.address, s.port], ['Error', 'ECONNREFUSED', 'connect', '127.0.0.1', 1]);
  assert.ok(typeof s.stack === 'string');
});
