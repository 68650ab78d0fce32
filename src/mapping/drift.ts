/**
 * Schema drift on the publisher for mapped relations (docs/mapping.md "Schema drift"):
 * the bookkeeping of each relation's Relation messages (the last one, the one before it
 * that differed, the renames recognised — plan-checks.ts detectRename), kept in memory for
 * the process and in pgsub.relation_columns for restarts; the rule with the renames
 * applied; and what a source column the target lacks becomes under the rule's `drift:`
 * policy (stop, ignore, add). relmap.ts calls it for relations with a rule only: unmapped
 * tables keep native's behaviour.
 */
import { DriftError } from '../errors.js';
import type { MappingConfig, TableRule } from './rules.js';
import { schemaOf, type RelationMessage } from '../protocol/messages.js';
import { quoteIdent, quoteQualified } from '../quote.js';
import { queryRows, type WireConnection } from '../pgwire/connect.js';
import { FIRST_GENBKI_OID } from '../apply/sql/binary.js';
import type { TargetColumn } from './columns.js';
import { detectRename } from './plan-checks.js';

/** What schema drift did to a mapped relation (docs/mapping.md "Schema drift"), for plan and logs. */
export interface DriftOutcome {
  /** Remote column names excluded by `drift: ignore` (or to be added, when planning). */
  ignored: string[];
  /** Remote column names added to the target by `drift: add` (with their types). */
  added: { column: string; type: string }[];
  /** New remote name → the remote name the mapping knew (a recognised rename). */
  renamed: ReadonlyMap<string, string>;
}

/**
 * Drift bookkeeping of one subscription's mapped relations, kept for the process's life
 * (a session restarted after an error must still know that a column is new, or renamed):
 * the last Relation message per relation id, the one before it that differed, and the
 * renames recognised. Keyed by the mapping config object, which a runner's sessions
 * share; with a subscription, also in pgsub.relation_columns (migrations/0008_drift.sql),
 * so that it survives a restart.
 */
interface RelationMemory {
  last: Map<number, RelationMessage>;
  previous: Map<number, RelationMessage>;
  renamed: Map<number, Map<string, string>>;
  /** Read from pgsub.relation_columns (once per process). */
  loaded: boolean;
}

type StoredColumn = { name: string; typeOid: number; typeModifier: number };
const stored = (m: RelationMessage): StoredColumn[] => m.columns.map((c) => ({ name: c.name, typeOid: c.typeOid, typeModifier: c.typeModifier }));
const fromStored = (id: number, columns: StoredColumn[]): RelationMessage => ({
  tag: 'relation',
  relationId: id,
  namespace: '',
  name: '',
  replicaIdentity: 'default',
  columns: columns.map((c) => ({ ...c, isKey: false })),
});
const memories = new WeakMap<MappingConfig, RelationMemory>();

function sameColumns(a: RelationMessage, b: RelationMessage): boolean {
  return (
    a.columns.length === b.columns.length &&
    a.columns.every((c, i) => {
      const d = b.columns[i]!;
      return c.name === d.name && c.typeOid === d.typeOid && c.typeModifier === d.typeModifier;
    })
  );
}

/** Whether pgsub's drift bookkeeping table exists on the target (it does once pgsub has run there). */
async function pgsubRelationColumnsExist(conn: WireConnection): Promise<boolean> {
  const [row] = await queryRows<{ present: string }>(conn, ['present'], `SELECT (pg_catalog.to_regclass('"pgsub"."relation_columns"') IS NOT NULL)::text AS present`);
  return row?.present === 'true';
}

function plural(n: number, word: string): string {
  return n > 1 ? `${word}s` : word;
}

export class Drift {
  private readonly memory: RelationMemory;

  constructor(
    private readonly options: { mapping?: MappingConfig; planOnly?: boolean; subscription?: string },
    /** The relation map's Type messages: OID → namespace and name. */
    private readonly types: ReadonlyMap<number, { namespace: string; name: string }>,
  ) {
    const key = options.mapping;
    let memory = key && !options.planOnly ? memories.get(key) : undefined;
    if (!memory) {
      memory = { last: new Map(), previous: new Map(), renamed: new Map(), loaded: false };
      if (key && !options.planOnly) memories.set(key, memory);
    }
    this.memory = memory;
  }

  /** The Relation message before the current one that differed from it; undefined when none is known. */
  previous(relationId: number): RelationMessage | undefined {
    return this.memory.previous.get(relationId);
  }

  /**
   * Take a mapped relation's Relation message into the drift bookkeeping (RelationMemory):
   * against the last one seen, a difference makes that one `previous` and may be a rename
   * (plan-checks.ts detectRename). With a subscription, the bookkeeping is read from
   * pgsub.relation_columns once and a change written back on `conn` — in the apply
   * transaction, so it commits (or not) with the changes that used it.
   */
  async observe(conn: WireConnection, relationId: number, message: RelationMessage): Promise<void> {
    const subscription = this.options.subscription;
    if (subscription && !this.memory.loaded) {
      // Planning on a target pgsub has not run on yet (no pgsub schema): nothing is known. The
      // table is looked up first rather than its read allowed to fail: a failed statement would
      // abort the catalog reads pipelined behind it. The apply path has migrated first.
      const present = !this.options.planOnly || (await pgsubRelationColumnsExist(conn));
      const rows = present
        ? await queryRows<{ id: string; columns: string; previous: string | null; renamed: string }>(
            conn,
            ['id', 'columns', 'previous', 'renamed'],
            `SELECT "relation_id"::text, "columns"::text, "previous"::text, "renamed"::text FROM "pgsub"."relation_columns" WHERE "subscription" = $1`,
            [subscription],
          )
        : [];
      for (const r of rows) {
        const id = Number(r.id);
        if (this.memory.last.has(id)) continue;
        this.memory.last.set(id, fromStored(id, JSON.parse(r.columns) as StoredColumn[]));
        if (r.previous) this.memory.previous.set(id, fromStored(id, JSON.parse(r.previous) as StoredColumn[]));
        const renamed = Object.entries(JSON.parse(r.renamed) as Record<string, string>);
        if (renamed.length > 0) this.memory.renamed.set(id, new Map(renamed));
      }
      this.memory.loaded = true;
    }
    const before = this.memory.last.get(relationId);
    if (before === message) return;
    this.memory.last.set(relationId, message);
    if (before && sameColumns(before, message)) return;
    if (before) {
      this.memory.previous.set(relationId, before);
      const rename = detectRename(before, message);
      if (rename) {
        const names = this.memory.renamed.get(relationId) ?? new Map<string, string>();
        const original = names.get(rename.from) ?? rename.from;
        names.delete(rename.from);
        if (original !== rename.to) names.set(rename.to, original);
        this.memory.renamed.set(relationId, names);
      }
    }
    if (!subscription || this.options.planOnly) return;
    const previous = this.memory.previous.get(relationId);
    await conn.execute(
      `INSERT INTO "pgsub"."relation_columns" ("subscription", "relation_id", "columns", "previous", "renamed", "updated_at")
       VALUES ($1, $2::pg_catalog.int8, $3::pg_catalog.jsonb, $4::pg_catalog.jsonb, $5::pg_catalog.jsonb, pg_catalog.now())
       ON CONFLICT ("subscription", "relation_id") DO UPDATE
         SET "columns" = EXCLUDED."columns", "previous" = EXCLUDED."previous", "renamed" = EXCLUDED."renamed", "updated_at" = EXCLUDED."updated_at"`,
      [
        subscription,
        String(relationId),
        JSON.stringify(stored(message)),
        previous ? JSON.stringify(stored(previous)) : null,
        JSON.stringify(Object.fromEntries(this.memory.renamed.get(relationId) ?? [])),
      ],
    );
  }

  /** The rule with this relation's recognised renames (plan-checks.ts detectRename): a renamed remote column goes where its old name went. */
  withRenames(relationId: number, rule: TableRule): TableRule {
    const names = this.memory.renamed.get(relationId);
    if (!names || names.size === 0) return rule;
    const renames = new Map(rule.renames);
    const excluded = new Set(rule.excluded);
    for (const [now, was] of names) {
      renames.delete(was);
      if (rule.excluded.has(was)) excluded.add(now);
      else renames.set(now, rule.renames.get(was) ?? was);
    }
    return { ...rule, renames, excluded };
  }

  /**
   * Remote columns the target lacks under a mapping rule, by its drift policy: `ignore`
   * excludes them; `add` adds each to the target with the remote type, on `conn` — the
   * apply transaction, before the first change that carries it, so the DDL commits with
   * the data — unless the target lacks the type (then as `stop`); `stop` is a DriftError
   * for a column new since the previous Relation message (the transaction rolls back and is
   * retried until the target has it). A column missing at the first Relation message is a
   * plain mismatch (matchColumns), under `stop`.
   */
  async apply(
    conn: WireConnection,
    relationId: number,
    remote: RelationMessage,
    rule: TableRule,
    byName: Map<string, TargetColumn>,
    target: { schema: string; table: string },
    displayName: string,
  ): Promise<{ rule: TableRule; drift: DriftOutcome }> {
    const drift: DriftOutcome = { ignored: [], added: [], renamed: new Map(this.memory.renamed.get(relationId) ?? []) };
    const missing = remote.columns.filter((c) => {
      const to = rule.renames.get(c.name) ?? c.name;
      return !rule.excluded.has(c.name) && !rule.computed.has(to) && !byName.has(to);
    });
    if (missing.length === 0) return { rule, drift };
    const targetName = quoteQualified(target.schema, target.table);
    const before = this.memory.previous.get(relationId);
    const stop = async (reason: string | null) => {
      const fresh = missing.filter((c) => before && !before.columns.some((b) => b.name === c.name));
      if (fresh.length === 0) return; // matchColumns reports the mismatch
      const typed = await Promise.all(fresh.map(async (c) => ({ c, type: await this.remoteTypeName(conn, c) })));
      const diff = typed.map(({ c, type }) => `+ "${c.name}" ${type ?? `(type oid ${c.typeOid})`}`).join(', ');
      const fixes = typed.map(({ c, type }) => `ALTER TABLE ${targetName} ADD COLUMN ${quoteIdent(rule.renames.get(c.name) ?? c.name)} ${type ?? '<type>'};`).join(' ');
      throw new DriftError(
        `schema drift on "${displayName}": the publisher sends ${plural(fresh.length, 'new column')} ${diff} that "${target.schema}.${target.table}" lacks${reason ? ` (${reason})` : ''}; apply stopped before the first change carrying ${fresh.length > 1 ? 'them' : 'it'} (drift: ${rule.drift}). Fix: ${fixes} or add ${fresh.map((c) => `"${c.name}"`).join(', ')} to mapping.tables.${rule.source}.exclude (or set drift: ignore or add); apply resumes by itself once fixed`,
        {
          relation: displayName,
          column: fresh.map((c) => c.name).join(', '),
          target: `${target.schema}.${target.table}`,
          diff: typed.map(({ c, type }) => ({ column: c.name, type, missingOn: `${target.schema}.${target.table}` })),
          fix: fixes,
        },
      );
    };
    if (rule.drift === 'stop') {
      await stop(null);
      return { rule, drift };
    }
    const excluded = new Set(rule.excluded);
    if (rule.drift === 'ignore' || this.options.planOnly) {
      for (const c of missing) excluded.add(c.name);
      drift.ignored.push(...missing.map((c) => c.name));
      return { rule: { ...rule, excluded }, drift };
    }
    for (const c of missing) {
      const type = await this.remoteTypeName(conn, c);
      if (type === null) {
        await stop(`drift: add, and the target has no type ${this.types.get(c.typeOid)?.name ?? `of oid ${c.typeOid}`}`);
        throw new DriftError(`schema drift on "${displayName}": the target has no type for new column "${c.name}" (drift: add); create the type or the column`, {
          relation: displayName,
          column: c.name,
        });
      }
      // IF NOT EXISTS: an apply lane resolves outside the apply transaction (lanes.ts), and a retry may meet a column a commit already added.
      await conn.execute(`ALTER TABLE ${targetName} ADD COLUMN IF NOT EXISTS ${quoteIdent(rule.renames.get(c.name) ?? c.name)} ${type}`, []);
      drift.added.push({ column: c.name, type });
    }
    return { rule, drift };
  }

  /** A remote column's type as the target spells it (with its modifier); null when the target has no such type. */
  private async remoteTypeName(conn: WireConnection, c: RelationMessage['columns'][number]): Promise<string | null> {
    const named = c.typeOid >= FIRST_GENBKI_OID ? this.types.get(c.typeOid) : undefined;
    if (c.typeOid >= FIRST_GENBKI_OID && !named) return null;
    const [row] = await queryRows<{ name: string | null }>(
      conn,
      ['name'],
      named
        ? `SELECT pg_catalog.format_type(t.oid, $3::pg_catalog.int4) AS name FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = $1 AND t.typname = $2`
        : `SELECT pg_catalog.format_type(t.oid, $1::pg_catalog.int4) AS name FROM pg_catalog.pg_type t WHERE t.oid = $2::pg_catalog.oid`,
      named ? [schemaOf(named), named.name, String(c.typeModifier)] : [String(c.typeModifier), String(c.typeOid)],
    );
    return row?.name ?? null;
  }
}
