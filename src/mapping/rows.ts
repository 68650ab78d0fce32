/**
 * Row semantics of a mapping rule (docs/mapping.md "Rows"): the key override, the row
 * filter, soft delete with its TRUNCATE policy, and the many-to-one discriminator,
 * compiled against the publisher's relation and the target's columns into a RowPlan
 * that the statement builders (statements.ts, row-statements.ts) and the change
 * handlers (handlers/rows.ts) read. Every check names the source table, the column and
 * the reason, as MappingError.
 *
 * What the replica identity sends decides what can be used: an UPDATE's or DELETE's old
 * row carries only the identity columns (all columns under REPLICA IDENTITY FULL), so a
 * filter may only read identity columns (PostgreSQL 15 requires the same of publication
 * row filters that publish UPDATE/DELETE), and every key column must be a directly
 * written identity column or a computed column all of whose inputs are identity columns
 * (a discriminator is a constant and always covered).
 */
import { MappingError } from '../errors.js';
import type { TableRule } from './rules.js';
import type { RelationMessage } from '../protocol/messages.js';
import { queryRows, type WireConnection } from '../pgwire/connect.js';
import { expressionColumns, type Reshape, type RowPlan, type TargetColumn, type KeyTerm } from './columns.js';

export type { KeyTerm, RowPlan } from './columns.js';

const BOOL = 16;

function names(list: readonly string[]): string {
  return list.map((n) => `"${n}"`).join(', ');
}

/** What the checks of one rule need to name the table, the identity and the reason. */
interface RowsScope {
  remote: RelationMessage;
  rule: TableRule;
  byName: ReadonlyMap<string, TargetColumn>;
  displayName: string;
  targetName: string;
  identityText: string;
  fail: (column: string, message: string) => never;
}

type Discriminator = RowPlan['discriminator'];

/** The row plan of `rule` for `remote` (see header); `reshape` is the rule's compiled columns. */
export function compileRows(
  remote: RelationMessage,
  rule: TableRule,
  reshape: Reshape,
  targetColumns: readonly TargetColumn[],
  byName: ReadonlyMap<string, TargetColumn>,
  displayName: string,
  targetName: string,
): RowPlan {
  const where = `mapping.tables.${rule.source}`;
  const rows = rule.rows;
  const identity = remote.columns.flatMap((c) => (c.isKey ? [c.name] : []));
  const s: RowsScope = {
    remote,
    rule,
    byName,
    displayName,
    targetName,
    identityText: identity.length > 0 ? `(${names(identity)})` : 'empty (REPLICA IDENTITY NOTHING)',
    fail: (column, message) => {
      throw new MappingError(`${where}: ${message}`, { relation: displayName, column });
    },
  };
  const filter = compileFilter(s);
  const filledBy = fillers(reshape, targetColumns);
  const disc = rows.discriminator ? { column: filledBy.get(rows.discriminator.column)!.column, value: rows.discriminator.value } : null;
  const { key, keyNames } = compileKey(s, filledBy, targetColumns, disc);
  const softDelete = compileSoftDelete(s, filledBy, keyNames);
  if (rows.truncate === 'soft_delete' && !softDelete) s.fail('truncate', `truncate: soft_delete needs soft_delete (the columns that mark a row deleted)`);
  return { key, keyNames, filter, softDelete, truncate: rows.truncate, discriminator: disc };
}

/** The names of the columns in `uses` that the replica identity does not carry. */
function outsideIdentity(remote: RelationMessage, uses: readonly number[]): string[] {
  return uses.filter((i) => !remote.columns[i]!.isKey).map((i) => remote.columns[i]!.name);
}

function compileFilter(s: RowsScope): RowPlan['filter'] {
  const expr = s.rule.rows.filter;
  if (!expr) return null;
  const uses = expressionColumns(expr, s.remote);
  const outside = outsideIdentity(s.remote, uses);
  if (outside.length > 0) {
    s.fail(
      outside.join(', '),
      `filter column ${names(outside)} of "${s.displayName}" is not in its replica identity ${s.identityText}: the old row of an UPDATE or DELETE carries only identity columns, so the filter could not be evaluated on it (PostgreSQL 15 requires the same of publication row filters)`,
    );
  }
  return { expr, uses };
}

/** Target column name → how it is filled. */
function fillers(reshape: Reshape, targetColumns: readonly TargetColumn[]): Map<string, KeyTerm> {
  const filledBy = new Map<string, KeyTerm>();
  reshape.direct.forEach((d, i) => {
    if (d) filledBy.set(targetColumns[i]!.name, { column: targetColumns[i]!, remote: i, expr: null, uses: [i] });
  });
  for (const c of reshape.computed) filledBy.set(c.column.name, { column: c.column, remote: null, expr: c.expr, uses: c.uses });
  return filledBy;
}

/** The key override checked against the identity, or the identity as sent (led by the discriminator if any). */
function compileKey(
  s: RowsScope,
  filledBy: ReadonlyMap<string, KeyTerm>,
  targetColumns: readonly TargetColumn[],
  disc: Discriminator,
): { key: KeyTerm[] | null; keyNames: string[] } {
  const { remote, rule, displayName, targetName } = s;
  const rows = rule.rows;
  if (rows.key) {
    const key = rows.key.map((name) => {
      const term = filledBy.get(name);
      if (!term) {
        if (rule.excluded.has(name)) s.fail(name, `key column "${name}" is an excluded column of "${displayName}": the target holds no value to locate the row by`);
        if (!s.byName.has(name)) s.fail(name, `key column "${name}" does not exist in "${targetName}"`);
        s.fail(name, `key column "${name}" of "${targetName}" is filled by nothing (neither a column of "${displayName}" nor an expression)`);
      }
      const outside = outsideIdentity(remote, term!.uses);
      if (outside.length > 0) {
        s.fail(
          name,
          `key column "${name}" of "${targetName}" is not covered by the replica identity ${s.identityText} of "${displayName}": it is filled from ${names(outside)}, which the old row of an UPDATE or DELETE does not carry`,
        );
      }
      return term!;
    });
    if (disc && !rows.key.includes(disc.column.name)) {
      s.fail(disc.column.name, `discriminator column "${disc.column.name}" must be part of the key (${names(rows.key)}): rows of different sources may share the other key values`);
    }
    return { key, keyNames: [...rows.key] };
  }
  const idTerms = remote.columns.flatMap((c, i) => (c.isKey ? [filledBy.get(targetColumns[i]!.name)!] : []));
  const keyNames = idTerms.map((t) => t.column.name);
  if (!disc) return { key: null, keyNames };
  if (remote.replicaIdentity === 'full') {
    s.fail(disc.column.name, `"${displayName}" has REPLICA IDENTITY FULL: with a discriminator, give the target key (key: [${disc.column.name}, …])`);
  }
  return { key: [filledBy.get(disc.column.name)!, ...idTerms], keyNames: [disc.column.name, ...keyNames] };
}

function compileSoftDelete(s: RowsScope, filledBy: ReadonlyMap<string, KeyTerm>, keyNames: readonly string[]): RowPlan['softDelete'] {
  const rows = s.rule.rows;
  if (!rows.softDelete) return null;
  const softDelete = { flag: softDeleteColumn(s, filledBy, 'flag'), at: softDeleteColumn(s, filledBy, 'at'), lsn: softDeleteColumn(s, filledBy, 'lsn') };
  if (!rows.key && s.remote.replicaIdentity === 'full') {
    s.fail(keyNames.join(', '), `"${s.displayName}" has REPLICA IDENTITY FULL: soft_delete revives rows by key, give it (key: […])`);
  }
  if (keyNames.length === 0) s.fail('', `soft_delete on "${s.displayName}" needs a key: its replica identity is ${s.identityText}`);
  return softDelete;
}

/** One soft_delete column: a plain target column the remote row does not fill (a boolean for the flag). */
function softDeleteColumn(s: RowsScope, filledBy: ReadonlyMap<string, KeyTerm>, role: 'flag' | 'at' | 'lsn'): TargetColumn | null {
  const name = s.rule.rows.softDelete![role];
  if (name === undefined) return null;
  const { targetName } = s;
  const c = s.byName.get(name);
  if (!c) return s.fail(name, `soft_delete ${role} column "${name}" does not exist in "${targetName}"`);
  if (filledBy.has(name)) s.fail(name, `soft_delete ${role} column "${name}" of "${targetName}" is also filled from the remote row`);
  if (c.generated) s.fail(name, `soft_delete ${role} column "${name}" of "${targetName}" is a generated column`);
  if (role === 'flag' && c.typeOid !== BOOL) s.fail(name, `soft_delete flag column "${name}" of "${targetName}" must be boolean`);
  return { ...c };
}

/**
 * Soft delete revives a row with INSERT … ON CONFLICT (key), which needs a unique index
 * (or constraint) on exactly the key columns, without predicate or expressions.
 */
export async function checkUniqueKey(conn: WireConnection, qualifiedName: string, plan: RowPlan, displayName: string, targetName: string, rule: TableRule): Promise<void> {
  if (!plan.softDelete) return;
  const rows = await queryRows<{ cols: string | null }>(
    conn,
    ['cols'],
    `SELECT (SELECT pg_catalog.json_agg(a.attname) FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE k.n <= i.indnkeyatts)::pg_catalog.text
       FROM pg_catalog.pg_index i
      WHERE i.indrelid = pg_catalog.to_regclass($1) AND i.indisunique AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL`,
    [qualifiedName],
  );
  const want = JSON.stringify([...plan.keyNames].sort());
  if (rows.some((r) => JSON.stringify((JSON.parse(r.cols ?? '[]') as string[]).sort()) === want)) return;
  throw new MappingError(
    `mapping.tables.${rule.source}: soft_delete on "${displayName}" needs a unique index on the key (${names(plan.keyNames)}) of "${targetName}": a later INSERT of the same key revives the row with INSERT … ON CONFLICT`,
    { relation: displayName, column: plan.keyNames.join(', ') },
  );
}
