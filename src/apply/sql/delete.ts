/**
 * Rows removed: DELETE of one located row (locator.ts), with conflict detection and the
 * mapping's row filter as a guard, and TRUNCATE of the relations a TRUNCATE message names.
 */
import type { Tuple } from '../../protocol/messages.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Statement } from '../../pgwire/statement.js';
import { Params } from './params.js';
import { cached, target } from './statement-text.js';
import { addFilterParams, addLocatorParams, filterGuard, locator, locatorParamCount, whereClause } from './locator.js';
import { type Detect, detecting } from './detecting.js';

export function deleteStatement(rel: MappedRelation, oldKind: 'key' | 'old', oldTuple: Tuple, detect: Detect | null = null, guard = false): Statement {
  const loc = locator(rel, 'DELETE', oldKind, oldTuple, undefined);
  const text = cached(rel, `D|${loc.shape}${detect ? `|d${detect.originId ?? ''}` : ''}${guard ? '|g' : ''}`, () => {
    const cond = guard ? filterGuard(rel, 1 + locatorParamCount(loc)) : null;
    const plain = `DELETE FROM ${target(rel)} WHERE ${whereClause(rel, loc, 1)}${cond ? ` AND ${cond}` : ''}`;
    return detect ? detecting(rel, loc, plain, 1, 'delete', detect, cond) : plain;
  });
  const params = new Params(rel);
  addLocatorParams(params, loc);
  if (guard) addFilterParams(params, rel, loc);
  return params.statement(text);
}

export function truncateStatement(relations: MappedRelation[], restartIdentity: boolean): Statement {
  // Native applies TRUNCATE with RESTRICT whatever the publisher's CASCADE said: the
  // publisher already listed every published relation the cascade reached. It truncates
  // the partitions of a partitioned table, never the inheritance children of a plain one.
  const names = relations.map((r) => target(r)).join(', ');
  return { text: `TRUNCATE ${names}${restartIdentity ? ' RESTART IDENTITY' : ''}`, params: [] };
}
