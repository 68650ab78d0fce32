/**
 * Row identities of raw changes for apply lanes (src/apply/lane-keys.ts): equal keys hash
 * equal whatever the other columns, a key-changing update names both rows, and what
 * cannot be known (an unchanged TOAST key, a keyless update, short bytes) is null, which
 * makes the change wait for everything before it.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { changeKeys as changeKeysInto, keyColumns } from '../../src/protocol/peek.js';
import type { RelationMessage } from '../../src/protocol/messages.js';

type Column = string | null | 'unchanged';

function tuple(kind: string, columns: Column[]): Buffer {
  const parts: Buffer[] = [Buffer.from(kind), Buffer.alloc(2)];
  parts[1]!.writeUInt16BE(columns.length);
  for (const c of columns) {
    if (c === null) parts.push(Buffer.from('n'));
    else if (c === 'unchanged') parts.push(Buffer.from('u'));
    else {
      const value = Buffer.from(c);
      const length = Buffer.alloc(4);
      length.writeInt32BE(value.length);
      parts.push(Buffer.from('t'), length, value);
    }
  }
  return Buffer.concat(parts);
}

function message(tag: string, relationId: number, ...tuples: Buffer[]): Buffer {
  const head = Buffer.alloc(5);
  head.write(tag, 0);
  head.writeUInt32BE(relationId, 1);
  return Buffer.concat([head, ...tuples]);
}

function relation(keys: boolean[], replicaIdentity: RelationMessage['replicaIdentity'] = 'default'): RelationMessage {
  return {
    tag: 'relation',
    relationId: 7,
    namespace: 'public',
    name: 't',
    replicaIdentity,
    columns: keys.map((isKey, i) => ({ isKey, name: `c${i}`, typeOid: 25, typeModifier: -1 })),
  };
}

/** The identities as an array; null for "not known" (-1). */
function changeKeys(raw: Buffer, remote: RelationMessage, columns: readonly number[]): number[] | null {
  const out = [0, 0];
  const n = changeKeysInto(raw, remote, columns, out);
  return n < 0 ? null : out.slice(0, n);
}

const keyed = relation([true, false]);
const keys = keyColumns(keyed);

test('inserts, updates and deletes of one key share its identity; other columns do not matter', () => {
  const insert = changeKeys(message('I', 7, tuple('N', ['1', 'a'])), keyed, keys);
  const update = changeKeys(message('U', 7, tuple('N', ['1', 'b'])), keyed, keys);
  const remove = changeKeys(message('D', 7, tuple('K', ['1', null])), keyed, keys);
  assert.equal(insert?.length, 1);
  assert.deepEqual(update, insert);
  assert.deepEqual(remove, insert);
  assert.notDeepEqual(changeKeys(message('I', 7, tuple('N', ['2', 'a'])), keyed, keys), insert);
  // The relation id is part of the identity.
  assert.notDeepEqual(changeKeys(message('I', 8, tuple('N', ['1', 'a'])), keyed, keys), insert);
});

test('an update that changes the key names the old and the new row', () => {
  const moved = changeKeys(message('U', 7, tuple('K', ['1', null]), tuple('N', ['2', 'a'])), keyed, keys);
  const one = changeKeys(message('I', 7, tuple('N', ['1', 'x'])), keyed, keys)![0];
  const two = changeKeys(message('I', 7, tuple('N', ['2', 'x'])), keyed, keys)![0];
  assert.deepEqual(moved, [one, two]);
});

test('an unchanged TOAST key is known through the old key only; otherwise the change depends on everything', () => {
  const withOld = changeKeys(message('U', 7, tuple('K', ['1', null]), tuple('N', ['unchanged', 'a'])), keyed, keys);
  assert.deepEqual(withOld, changeKeys(message('D', 7, tuple('K', ['1', null])), keyed, keys));
  assert.equal(changeKeys(message('U', 7, tuple('N', ['unchanged', 'a'])), keyed, keys), null);
});

test('a table without a key: inserts touch no earlier row, updates and deletes are unknown', () => {
  const keyless = relation([false, false]);
  assert.deepEqual(changeKeys(message('I', 7, tuple('N', ['1', 'a'])), keyless, keyColumns(keyless)), []);
  assert.equal(changeKeys(message('D', 7, tuple('O', ['1', 'a'])), keyless, keyColumns(keyless)), null);
});

test('REPLICA IDENTITY FULL: the whole old row is the identity', () => {
  const full = relation([true, true], 'full');
  const columns = keyColumns(full);
  const insert = changeKeys(message('I', 7, tuple('N', ['1', 'a'])), full, columns)![0];
  const update = changeKeys(message('U', 7, tuple('O', ['1', 'a']), tuple('N', ['1', 'b'])), full, columns);
  assert.equal(update?.length, 2);
  assert.equal(update![0], insert);
});

test('bytes it cannot read give null (the lane decoder reports them)', () => {
  const good = message('I', 7, tuple('N', ['1', 'a']));
  assert.equal(changeKeys(good.subarray(0, good.length - 2), keyed, keys), null);
  assert.equal(changeKeys(message('I', 7, Buffer.from('X')), keyed, keys), null);
  assert.equal(changeKeys(message('T', 7), keyed, keys), null);
});
