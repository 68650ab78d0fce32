/**
 * A mapping rule (mapping/rules.ts) checked against the publisher's relation and the
 * target's columns, and compiled into what the statement builders need. relmap.ts calls
 * matchColumns for every relation, mapped or not: without a rule it matches columns by
 * name, as native's logicalrep_rel_open, and the result carries no Reshape, so the
 * unmapped paths (batches, COPY of insert runs, UPDATE arrays) stay exactly as they were.
 *
 * A rule that only retargets and renames needs no Reshape either: the target names ride
 * in MappedRelation.targetColumns and every builder uses them. Excluded and computed
 * columns do need one: their statements are built per change from it (apply/sql/insert.ts
 * reshapedInsert, update.ts reshapedUpdate), with the remote row as a subquery `r` in which the
 * expressions see the remote columns by their remote names. Values are still bind
 * parameters; an expression is the only raw SQL, and it comes from the config.
 *
 * Expressions are checked on the target (checkExpressions): each becomes a generated
 * column of a temporary table, in a transaction that is rolled back, on a connection of
 * its own — PostgreSQL then parses it, resolves its columns and functions, refuses it if
 * it is not immutable and checks that its type can be stored in the column. A separate
 * connection, because a transaction that touched a temporary table cannot be prepared
 * (two_phase) and a failed probe would abort the apply transaction.
 */
import { MappingError, SchemaMismatchError } from '../errors.js';
import { hasRowRules, type RowRule, type TableRule } from './rules.js';
import type { RelationMessage } from '../protocol/messages.js';
import { quoteIdent, quoteLiteral } from '../quote.js';

export interface TargetColumn {
  name: string;
  typeOid: number;
  /** Schema-qualified, quoted type name for casts ("pg_catalog"."int8"); search_path is empty. */
  typeName: string;
  generated: boolean;
  /** GENERATED ALWAYS AS IDENTITY: an INSERT gives it with OVERRIDING SYSTEM VALUE, an UPDATE leaves it (it cannot change). */
  identityAlways?: boolean;
  /**
   * The type has the equality operator native's tuples_equal looks up (a default btree or
   * hash opclass, element/field types included). Only computed for REPLICA IDENTITY FULL
   * relations, whose rows are located by comparing every column; true otherwise.
   */
  hasEquality: boolean;
  /**
   * The type can be the element of a one-dimensional array parameter (update-rows.ts): it
   * has an array type and is not an array itself (nor a domain over one, whose category
   * is its base type's). Absent: unknown, treated as no.
   */
  arrayType?: boolean;
}

/** What the statement builders (apply/sql/) need to build the statements of a reshaped relation. */
export interface Reshape {
  /** Per remote column index: written as it is into targetColumns[i]. */
  direct: readonly boolean[];
  /** Per remote column index: its quoted type in the row subquery `r`; null: not in `r`. */
  rowTypes: (string | null)[];
  /** Target columns filled by expressions over `r`, with the remote column indexes each uses. */
  computed: { column: TargetColumn; expr: string; uses: number[] }[];
  /** Row semantics (key, filter, soft delete, discriminator; rows.ts); absent: none. */
  rows?: RowPlan;
}

/** One target key column and where its value comes from. */
export interface KeyTerm {
  column: TargetColumn;
  /** Remote column index written directly into it; null: an expression. */
  remote: number | null;
  /** Expression over `r` (computed or discriminator); null: direct. */
  expr: string | null;
  /** Remote column indexes the value reads. */
  uses: number[];
}

/** Row semantics compiled by rows.ts (compileRows), which also explains them. */
export interface RowPlan {
  /** Locate rows by these target columns (a key override or a discriminator); null: by the replica identity as sent. */
  key: KeyTerm[] | null;
  /** The target columns of the key, for ON CONFLICT and messages. */
  keyNames: string[];
  filter: { expr: string; uses: number[] } | null;
  softDelete: { flag: TargetColumn | null; at: TargetColumn | null; lsn: TargetColumn | null } | null;
  truncate: RowRule['truncate'];
  discriminator: { column: TargetColumn; value: string } | null;
}

export interface MatchedColumns {
  /** Per remote column index; for a column not written directly, a stand-in naming the remote column. */
  targetColumns: TargetColumn[];
  reshape?: Reshape;
}

/** Runs SQL in a transaction that is rolled back, on a target connection of its own (see header). */
export type Probe = (sql: string) => Promise<void>;

function plural(n: number, word: string): string {
  return n > 1 ? `${word}s` : word;
}

/** Where a rule's errors point: the config entry, the source table and the target table. */
interface RuleScope {
  rule: TableRule;
  where: string;
  displayName: string;
  targetName: string;
}

/**
 * The remote columns of `relation` matched to the target's `byName`. `displayName` names
 * the source table; `targetName` the target table (equal without a rule).
 */
export function matchColumns(remote: RelationMessage, byName: Map<string, TargetColumn>, displayName: string, targetName: string, rule: TableRule | null): MatchedColumns {
  if (!rule) return matchByName(remote, byName, displayName);
  const s: RuleScope = { rule, where: `mapping.tables.${rule.source}`, displayName, targetName };
  checkRuleNames(s, remote);
  const exprs = ruleExpressions(s, byName);
  const rowRules = hasRowRules(rule.rows);
  const direct = remote.columns.map((c) => !rule.excluded.has(c.name) && !exprs.has(rule.renames.get(c.name) ?? c.name));
  // Target column name → the remote column written into it.
  const filled = new Map<string, string>();
  const targetColumns = directColumns(s, remote, byName, direct, filled);
  rejectGenerated(
    targetColumns.filter((_, i) => direct[i]),
    targetName,
  );
  checkIdentityWritten(s, remote, direct);
  if (exprs.size === 0 && direct.every(Boolean) && !rowRules) return { targetColumns };
  const computed = computedColumns(s, remote, byName, exprs, filled);
  const used = new Set(computed.flatMap((c) => c.uses));
  // The filter reads the remote row as sent, like expressions.
  if (rule.rows.filter) for (const i of expressionColumns(rule.rows.filter, remote)) used.add(i);
  const rowTypes = remote.columns.map((_, i) => (used.has(i) ? '' : direct[i] ? targetColumns[i]!.typeName : null));
  return { targetColumns, reshape: { direct, rowTypes, computed } };
}

/** Without a rule: every remote column by its own name, as native's logicalrep_rel_open. */
function matchByName(remote: RelationMessage, byName: Map<string, TargetColumn>, displayName: string): MatchedColumns {
  const missing = remote.columns.filter((c) => !byName.has(c.name)).map((c) => c.name);
  if (missing.length > 0) {
    throw new SchemaMismatchError(
      `logical replication target relation "${displayName}" is missing replicated ${plural(missing.length, 'column')}: ${missing.map((m) => `"${m}"`).join(', ')}`,
      { relation: displayName, column: missing.join(', ') },
    );
  }
  const targetColumns = remote.columns.map((c) => ({ ...byName.get(c.name)! }));
  rejectGenerated(targetColumns, displayName);
  return { targetColumns };
}

/** Renamed and excluded columns must be columns the publisher sends. */
function checkRuleNames(s: RuleScope, remote: RelationMessage): void {
  const remoteNames = new Set(remote.columns.map((c) => c.name));
  for (const name of [...s.rule.renames.keys(), ...s.rule.excluded]) {
    if (!remoteNames.has(name)) {
      throw new MappingError(
        `${s.where}: column "${name}" is not a column the publisher sends for "${s.displayName}" (it sends ${[...remoteNames].map((n) => `"${n}"`).join(', ')})`,
        {
          relation: s.displayName,
          column: name,
        },
      );
    }
  }
}

/** Target column name → expression: the computed columns, and the discriminator. */
function ruleExpressions(s: RuleScope, byName: Map<string, TargetColumn>): Map<string, string> {
  // A discriminator is a computed column of a constant (the config's value, as a literal like
  // any expression of the config; never a remote value).
  const disc = s.rule.rows.discriminator;
  const exprs = new Map(s.rule.computed);
  if (disc) {
    if (exprs.has(disc.column))
      throw new MappingError(`${s.where}: discriminator column "${disc.column}" is also a computed column`, { relation: s.displayName, column: disc.column });
    exprs.set(disc.column, `CAST(${quoteLiteral(disc.value)} AS ${byName.get(disc.column)?.typeName ?? 'pg_catalog.text'})`);
  }
  return exprs;
}

/** Per remote column: its target column when written directly, else a stand-in naming it. Fills `filled`. */
function directColumns(s: RuleScope, remote: RelationMessage, byName: Map<string, TargetColumn>, direct: readonly boolean[], filled: Map<string, string>): TargetColumn[] {
  const { rule, where, displayName, targetName } = s;
  const missing: string[] = [];
  const targetColumns = remote.columns.map((c, i): TargetColumn => {
    const to = rule.renames.get(c.name) ?? c.name;
    if (!direct[i]) return { name: c.name, typeOid: 0, typeName: '', generated: false, hasEquality: false };
    const col = byName.get(to);
    if (!col) {
      missing.push(to === c.name ? `"${c.name}"` : `"${to}" (renamed from "${c.name}")`);
      return { name: to, typeOid: 0, typeName: '', generated: false, hasEquality: false };
    }
    const other = filled.get(to);
    if (other !== undefined) {
      throw new MappingError(`${where}: target column "${to}" of "${targetName}" is filled by both "${other}" and "${c.name}"`, { relation: displayName, column: to });
    }
    filled.set(to, c.name);
    return { ...col };
  });
  if (missing.length > 0) {
    throw new SchemaMismatchError(
      `logical replication target relation "${targetName}" (for "${displayName}") is missing replicated ${plural(missing.length, 'column')}: ${missing.join(', ')} (rename ${missing.length > 1 ? 'them' : 'it'}, or exclude ${missing.length > 1 ? 'them' : 'it'} in ${where} to only feed expressions)`,
      {
        relation: displayName,
        column: missing.join(', '),
      },
    );
  }
  return targetColumns;
}

/** Replica identity columns must be written as sent: the target locates rows by them. */
function checkIdentityWritten(s: RuleScope, remote: RelationMessage, direct: readonly boolean[]): void {
  // With a key override the row is located by the key (rows.ts checks that the identity covers it).
  const keyLost = s.rule.rows.key ? [] : remote.columns.filter((c, i) => c.isKey && !direct[i]).map((c) => c.name);
  if (keyLost.length > 0) {
    throw new MappingError(
      `${s.where}: replica identity ${plural(keyLost.length, 'column')} ${keyLost.map((k) => `"${k}"`).join(', ')} of "${s.displayName}" must be written as ${keyLost.length > 1 ? 'they are' : 'it is'} (not excluded or computed): the target locates rows by ${keyLost.length > 1 ? 'them' : 'it'}`,
      { relation: s.displayName, column: keyLost.join(', ') },
    );
  }
}

/** The target columns filled by expressions, each checked against the target and the direct columns. */
function computedColumns(s: RuleScope, remote: RelationMessage, byName: Map<string, TargetColumn>, exprs: Map<string, string>, filled: Map<string, string>): Reshape['computed'] {
  const { where, displayName, targetName } = s;
  const disc = s.rule.rows.discriminator;
  const computed: Reshape['computed'] = [];
  for (const [name, expr] of exprs) {
    const col = byName.get(name);
    const what = disc?.column === name ? 'discriminator' : 'computed';
    if (!col) throw new MappingError(`${where}: ${what} column "${name}" does not exist in "${targetName}"`, { relation: displayName, column: name });
    if (col.generated) throw new MappingError(`${where}: computed column "${name}" of "${targetName}" is a generated column`, { relation: displayName, column: name });
    const other = filled.get(name);
    if (other !== undefined)
      throw new MappingError(`${where}: target column "${name}" of "${targetName}" is filled by both "${other}" and an expression`, { relation: displayName, column: name });
    computed.push({ column: { ...col }, expr, uses: disc?.column === name ? [] : expressionColumns(expr, remote) });
  }
  return computed;
}

function rejectGenerated(columns: TargetColumn[], name: string): void {
  const generated = columns.filter((c) => c.generated).map((c) => c.name);
  if (generated.length > 0) {
    // relation.c's wording; PostgreSQL 18 is the first publisher that can send generated columns.
    throw new SchemaMismatchError(
      `logical replication target relation "${name}" has incompatible generated ${plural(generated.length, 'column')}: ${generated.map((m) => `"${m}"`).join(', ')}`,
      {
        relation: name,
        column: generated.join(', '),
      },
    );
  }
}

/**
 * The remote columns an expression may name: its identifiers outside string literals,
 * bare ones folded to lower case as PostgreSQL folds them. A function or keyword that
 * happens to share a column's name only adds an input, which at worst leaves a computed
 * column unset on an UPDATE that did not send that column (unchanged TOAST).
 */
export function expressionColumns(expr: string, remote: RelationMessage): number[] {
  const names = new Set<string>();
  const re = /'(?:[^']|'')*'|"((?:[^"]|"")*)"|\$(\w*)\$[\s\S]*?\$\2\$|([A-Za-z_\u0080-\uffff][\w$\u0080-\uffff]*)/g;
  for (const m of expr.matchAll(re)) {
    if (m[1] !== undefined) names.add(m[1].replace(/""/g, '"'));
    else if (m[3] !== undefined) names.add(m[3].toLowerCase());
  }
  return remote.columns.flatMap((c, i) => (names.has(c.name) ? [i] : []));
}

/**
 * Check every computed column on the target (see header). `remoteTypes`: the quoted type
 * of each remote column as the target knows it; null where the target has no such type.
 */
export async function checkExpressions(probe: Probe, reshape: Reshape, remote: RelationMessage, displayName: string, rule: TableRule): Promise<void> {
  const filter = reshape.rows?.filter;
  const checks = [
    ...reshape.computed.map((c) => ({ ...c, what: `computed column "${c.column.name}"` })),
    ...(filter ? [{ column: { name: 'filter', typeName: '"pg_catalog"."bool"' }, expr: filter.expr, uses: filter.uses, what: 'filter' }] : []),
  ];
  for (const c of checks) {
    const inputs = c.uses.map((i) => {
      const type = reshape.rowTypes[i];
      if (!type) {
        throw new MappingError(`mapping.tables.${rule.source}: ${c.what} uses "${remote.columns[i]!.name}", whose type the target does not have`, {
          relation: displayName,
          column: c.column.name,
        });
      }
      return `${quoteIdent(remote.columns[i]!.name)} ${type}`;
    });
    const value = quoteIdent('pgsub computed value');
    const sql = `CREATE TEMPORARY TABLE "pgsub_mapping_probe" (${[...inputs, `${value} ${c.column.typeName} GENERATED ALWAYS AS ((${c.expr})) STORED`].join(', ')})`;
    try {
      await probe(sql);
    } catch (err) {
      const e = err as { code?: string; message?: string };
      const reason =
        e.code === '42P17'
          ? 'is not immutable (only immutable functions and operators may be used)'
          : e.code === '42703'
            ? `names a column the publisher does not send: ${e.message}`
            : (e.message ?? String(err));
      throw new MappingError(`mapping.tables.${rule.source}: expression for ${c.what} (${c.expr}) ${reason}`, { relation: displayName, column: c.column.name }, { cause: err });
    }
  }
}
