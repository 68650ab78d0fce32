/** Pure helpers of the apply wire: CommandComplete tags and server_version parsing. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseServerVersion, tagCommand, tagRowCount } from '../../src/pgwire/wire.js';

const TAGS: [tag: string, command: string, rowCount: number][] = [
  ['INSERT 0 1', 'INSERT', 1],
  ['INSERT 0 250', 'INSERT', 250],
  ['UPDATE 3', 'UPDATE', 3],
  ['DELETE 0', 'DELETE', 0],
  ['SELECT 12', 'SELECT', 12],
  ['MERGE 2', 'MERGE', 2],
  ['COPY 100000', 'COPY', 100000],
  ['FETCH 5', 'FETCH', 5],
  ['BEGIN', 'BEGIN', 0],
  ['CREATE TABLE', 'CREATE TABLE', 0],
  ['CREATE TABLE AS', 'CREATE TABLE AS', 0],
  ['SELECT 0', 'SELECT', 0],
  ['', '', 0],
];

for (const [tag, command, rowCount] of TAGS) {
  test(`tag ${JSON.stringify(tag)} → ${command} / ${rowCount}`, () => {
    assert.equal(tagCommand(tag), command);
    assert.equal(tagRowCount(tag), rowCount);
  });
}

test('server_version → server_version_num', () => {
  assert.equal(parseServerVersion('18.4'), 180004);
  assert.equal(parseServerVersion('16.2 (Debian 16.2-1.pgdg120+2)'), 160002);
  assert.equal(parseServerVersion('17beta1'), 170000);
  assert.equal(parseServerVersion('10.23'), 100023);
  assert.equal(parseServerVersion('9.6.24'), 90624);
  assert.equal(parseServerVersion(''), 0);
});
