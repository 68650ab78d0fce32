/**
 * UPDATE of one remote row, located as locator.ts says: the sent columns SET, unchanged
 * TOAST values and GENERATED ALWAYS identity columns left as they are, with conflict
 * detection (detecting.ts) or, on a PostgreSQL 18 target under the default policies, the
 * in-line resolution of update-conflicts.ts; for a reshaped relation the columns SET from
 * the row subquery. multi-row.ts builds runs of them.
 */
import type { Tuple } from '../../protocol/messages.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Reshape } from '../../mapping/columns.js';
import type { Statement } from '../../pgwire/statement.js';
import { Params } from './params.js';
import { cached, checkWidth, column, param, rowColumns, rowSubquery, rowValue, target } from './statement-text.js';
import { addFilterParams, addLocatorParams, filterGuard, type Locator, locator, locatorParamCount, whereClause } from './locator.js';
import { type Detect, detecting, type RemoteRef } from './detecting.js';
import { addInlineParams, inlinesOriginDiffers, updateLoggingConflicts } from './update-conflicts.js';

/** `guard`: the statement itself checks the mapping's row filter over the located row's tuple (filterGuard). */
export function updateStatement(
  rel: MappedRelation,
  oldKind: 'key' | 'old' | undefined,
  oldTuple: Tuple | undefined,
  newTuple: Tuple,
  detect: Detect | null = null,
  guard = false,
  remote: RemoteRef | null = null,
): Statement {
  checkWidth(rel, newTuple);
  const loc = locator(rel, 'UPDATE', oldKind, oldTuple, newTuple);
  if (rel.reshape) return reshapedUpdate(rel, rel.reshape, loc, newTuple, detect, guard);
  // Unchanged TOAST columns ('u') are left as they are in the target.
  const setIndexes = newTuple.flatMap((v, i) => (v.kind === 'unchanged' || rel.targetColumns[i]!.identityAlways ? [] : [i]));
  const inline = remote !== null && oldKind === undefined && !guard && detect !== null && inlinesOriginDiffers(rel, detect, setIndexes);
  const inlineShape = inline ? (detect.inlineMissing?.(rel) ? 'im' : 'i') : '';
  const shape = `U${setIndexes.join(',')}|${loc.shape}${detect ? `|d${detect.originId ?? ''}${inlineShape}` : ''}`;
  const text = cached(rel, shape, () => {
    // Every sent value unchanged (FULL identity, only toasted columns): native still
    // updates the row to itself, firing its triggers; an empty SET is not SQL.
    const first = (rel.targetColumns.find((c) => !c.identityAlways) ?? rel.targetColumns[0]!).name;
    const sets = setIndexes.length > 0 ? setIndexes.map((i, n) => `${column(rel, i)} = ${param(rel, i, n + 1)}`).join(', ') : `${quoteIdent(first)} = ${quoteIdent(first)}`;
    const plain = `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, setIndexes.length + 1)}`;
    if (inline) return updateLoggingConflicts(rel, plain, setIndexes, setIndexes.length + locatorParamCount(loc) + 1, detect);
    return detect ? detecting(rel, loc, plain, setIndexes.length + 1, 'update', detect) : plain;
  });
  const params = new Params(rel);
  for (const i of setIndexes) params.add(newTuple, i);
  addLocatorParams(params, loc);
  if (!inline) return params.statement(text);
  addInlineParams(params, rel, detect!.subscription!, remote!);
  const statement = params.statement(text);
  RESOLVING.add(statement);
  return statement;
}

/** The UPDATEs built to resolve conflicts themselves: their result rows name the conflicts met. */
const RESOLVING = new WeakSet<Statement>();

/** Whether `statement` resolves the default policies' conflicts itself (its rows name them); else its result has nothing to read. */
export function resolvesConflicts(statement: Statement): boolean {
  return RESOLVING.has(statement);
}

/**
 * UPDATE of a reshaped relation: the sent direct columns, and the computed columns all of
 * whose inputs were sent (an unchanged TOASTed input leaves an immutable result as it is).
 */
function reshapedUpdate(rel: MappedRelation, reshape: Reshape, loc: Locator, newTuple: Tuple, detect: Detect | null, guard: boolean): Statement {
  const sent = (i: number) => newTuple[i]!.kind !== 'unchanged';
  // A GENERATED ALWAYS identity column is never SET (428C9), as in updateStatement.
  const direct = reshape.direct.flatMap((d, i) => (d && sent(i) && !rel.targetColumns[i]!.identityAlways ? [i] : []));
  const computed = reshape.computed.filter((c) => c.uses.every(sent));
  const inRow = rowColumns(direct, computed);
  const shape = `RU${newTuple.map((v) => (v.kind === 'unchanged' ? 'u' : '')).join(',')}|${loc.shape}${detect ? `|d${detect.originId ?? ''}` : ''}${guard ? '|g' : ''}`;
  const text = cached(rel, shape, () => {
    const cols = [...direct.map((i) => column(rel, i)), ...computed.map((c) => quoteIdent(c.column.name))];
    const values = [...direct.map((i) => rowValue(rel, reshape, i)), ...computed.map((c) => `(${c.expr})`)];
    const first = quoteIdent(rel.targetColumns[reshape.direct.indexOf(true)]!.name);
    const sets = cols.length > 0 ? `(${cols.join(', ')}) = (SELECT ${values.join(', ')} FROM ${rowSubquery(rel, reshape, inRow, 1)})` : `${first} = ${first}`;
    const firstLoc = cols.length > 0 ? inRow.length + 1 : 1;
    const cond = guard ? filterGuard(rel, firstLoc + locatorParamCount(loc)) : null;
    const plain = `UPDATE ${target(rel)} SET ${sets} WHERE ${whereClause(rel, loc, firstLoc)}${cond ? ` AND ${cond}` : ''}`;
    return detect ? detecting(rel, loc, plain, firstLoc, 'update', detect, cond) : plain;
  });
  const params = new Params(rel);
  if (direct.length + computed.length > 0) for (const i of inRow) params.add(newTuple, i);
  addLocatorParams(params, loc);
  if (guard) addFilterParams(params, rel, loc);
  return params.statement(text);
}
