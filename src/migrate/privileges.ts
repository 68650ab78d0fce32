/**
 * Least privilege, checked per command before it changes anything (README "Privileges"):
 * each check opens its own sessions, asks both servers what the configured roles may do
 * (grants.ts), and throws one PrivilegeError (exit 2) naming every server, what its role
 * lacks and why, and the statements to run there. What each command needs, on which side:
 *
 *   run        source: REPLICATION; SELECT on the published tables (copy_data) and on the
 *              synced sequences (sequences: sync).
 *              target: pgsub's schema (CREATE on the database at first); the apply session
 *              (session_replication_role, the replication origin functions); SELECT, INSERT,
 *              UPDATE, DELETE, TRUNCATE on the tables (the mapping's target names); their
 *              ownership and CREATE in their schema for tables still to copy (defer_indexes);
 *              SELECT, UPDATE on the sequences it sets.
 *   preflight  USAGE on the schemas of the published tables, on both sides (it reads their
 *              catalogs; everything else it reports as findings, the cutover's needs too:
 *              cutoverFindings).
 *   schema copy source: SELECT on every table pg_dump dumps (it locks them).
 *              target: CREATE on the database and in the tables' schemas (tables step), the
 *              tables' ownership (post-data, and --force which drops them).
 *   verify     source: REPLICATION (a temporary slot exports the snapshot), SELECT on the
 *              tables. target: pgsub's schema (the request row), SELECT on the tables;
 *              --repair: session_replication_role, INSERT, UPDATE, DELETE.
 *   cutover    everything but the fence's own ALTER DATABASE: see checkCutoverPrivileges.
 *   drop       source: REPLICATION (the slot, unless --keep-slot). target: pgsub's schema,
 *              EXECUTE on the origin functions it drops the origin with.
 *   skip, enable, resync, refresh: target: pgsub's schema; source: REPLICATION where they
 *              read the slot or the publication (resync with two_phase, refresh --no-copy).
 */
import type { Config } from '../config/config.js';
import { ruleFor } from '../mapping/rules.js';
import { PrivilegeError } from '../errors.js';
import type { Logger } from '../log.js';
import { arrayLiteral, openPgDb, openTargetDb, type Db, type Row } from './db.js';
import {
  APPLY_ORIGIN_FUNCTIONS,
  DROP_ORIGIN_FUNCTIONS,
  fixes,
  ORIGIN_SESSION_RESET,
  needCreateOnDatabase,
  needOnRelations,
  needOriginFunctions,
  needPgsubSchema,
  needReplicaRole,
  needReplication,
  needRole,
  privilegeError,
  sideOf,
  type RelName,
  type SideLacks,
} from './grants.js';
import { ident, type Findings } from './findings.js';
import { readAncestors, readDescendants, readSequenceUses, seqName, type Rel } from './objects.js';
import { reverseNames } from './reverse.js';

const APPLY_TABLE_PRIVILEGES = ['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'];
const WHY = {
  stream: 'the replication connection and its slot',
  copy: 'the initial copy reads them',
  readSequence: 'sequences: sync reads them',
  setSequence: 'sequences: sync sets them with setval',
  pgsub: "pgsub's progress, table states and conflict log",
  apply: 'pgsub applies changes to them',
  apply_session: 'the apply sessions set session_replication_role = replica and tag changes with origin pgsub_<subscription>',
  defer: 'defer_indexes drops their indexes for the initial copy and rebuilds them; or set defer_indexes: false',
};

/** The origin functions the apply calls; apply lanes and parallel apply also hand the origin on (session_reset). */
function applyOriginFunctions(config: Config): string[] {
  return config.applyWorkers > 1 || config.streaming === 'parallel' ? [...APPLY_ORIGIN_FUNCTIONS, ORIGIN_SESSION_RESET] : [...APPLY_ORIGIN_FUNCTIONS];
}

/** The published tables as the catalog names them (pg_publication_tables needs no USAGE on their schemas, unlike a regclass). */
export async function publishedRels(db: Db, publications: readonly string[]): Promise<Rel[]> {
  const rows = await db.query<Row>(
    `SELECT DISTINCT schemaname::text AS schema, tablename::text AS name FROM pg_catalog.pg_publication_tables WHERE pubname = ANY ($1::text[]) ORDER BY 1, 2`,
    [arrayLiteral(publications)],
  );
  return rows.map((r) => ({ schema: r.schema!, table: r.name! }));
}

/** Where a published table is applied on the target: the mapping's target, else the same name. */
export function targetRels(config: Config, rels: readonly Rel[]): Rel[] {
  const out = new Map<string, Rel>();
  for (const r of rels) {
    const rule = ruleFor(config.mapping, r.schema, r.table);
    const t = rule ? { schema: rule.targetSchema, table: rule.targetTable } : r;
    out.set(`${t.schema}.${t.table}`, t);
  }
  return [...out.values()];
}

/** The sequences a sync reads on the source: the published tables' (with their partitions') and sequence_names. */
async function sourceSequences(db: Db, config: Config, rels: readonly Rel[]): Promise<RelName[]> {
  const uses = await readSequenceUses(db, [...rels, ...(await readDescendants(db, rels))]);
  const names = new Map(uses.map((u) => [seqName(u), { schema: u.schema, table: u.name }]));
  for (const s of config.sequenceNames) names.set(seqName(s), { schema: s.schema, table: s.name });
  return [...names.values()];
}

/**
 * The sequences a sync sets on the target (sequence-plan.ts): the target tables' own — a
 * column's values set the sequence feeding its target, under the mapping's names, not the
 * source's — and sequence_names by name.
 */
async function targetSequences(db: Db, config: Config, rels: readonly Rel[]): Promise<RelName[]> {
  const names = new Map(config.sequenceNames.map((s) => [seqName(s), { schema: s.schema, table: s.name }]));
  for (const u of await readSequenceUses(db, rels)) names.set(seqName(u), { schema: u.schema, table: u.name });
  return [...names.values()];
}

/** Opens the sides `fn` needs, runs the probes, throws what lacks; sessions closed either way. */
async function withSides(
  config: Config,
  purpose: string,
  sides: { source: boolean; target: boolean },
  fn: (source: SideLacks | null, target: SideLacks | null) => Promise<void>,
): Promise<void> {
  const appName = `pgsub_${config.subscription}_${purpose}`;
  let source: Db | null = null;
  let target: Db | null = null;
  try {
    // Both sides at once (each a connection's round trips; every `pgsub run` starts here);
    // what opened is kept for the finally, then the source's failure is named first.
    const [openedSource, openedTarget] = await Promise.allSettled([
      sides.source ? openPgDb(config.source, appName) : null,
      sides.target ? openTargetDb(config.target, appName) : null,
    ]);
    source = openedSource.status === 'fulfilled' ? openedSource.value : null;
    target = openedTarget.status === 'fulfilled' ? openedTarget.value : null;
    if (openedSource.status === 'rejected') throw openedSource.reason;
    if (openedTarget.status === 'rejected') throw openedTarget.reason;
    const [s, t] = await Promise.all([source ? sideOf(source) : null, target ? sideOf(target) : null]);
    await fn(s, t);
    const err = privilegeError(
      purpose.replace('_', ' '),
      [s, t].filter((x): x is SideLacks => x !== null),
    );
    if (err) throw err;
  } finally {
    await source?.close();
    await target?.close();
  }
}

/** Published tables not yet copied (no row, or state i/d in pgsub.subscription_rel): defer_indexes touches only those. */
async function tablesToCopy(target: Db, subscription: string, rels: readonly Rel[]): Promise<Rel[]> {
  const done = await target
    .query<Row>(`SELECT schema_name::text AS schema, table_name::text AS name FROM "pgsub"."subscription_rel" WHERE subscription = $1 AND state NOT IN ('i', 'd')`, [subscription])
    .catch(() => [] as Row[]);
  const copied = new Set(done.map((r) => `${r.schema}.${r.name}`));
  return rels.filter((r) => !copied.has(`${r.schema}.${r.table}`));
}

/** `pgsub run`, before its first session creates anything (pgsub's schema, the origin, the slot). */
export async function checkRunPrivileges(config: Config): Promise<void> {
  await withSides(config, 'run', { source: true, target: true }, async (s, t) => {
    // The target's checks that need no published table run beside the source's (each side
    // collects its own lacks, in the order it checks them).
    const targetSessionChecks = (async () => {
      await needPgsubSchema(t!, WHY.pgsub);
      await needReplicaRole(t!, WHY.apply_session);
      await needOriginFunctions(t!, applyOriginFunctions(config), WHY.apply_session);
    })();
    const sourceSide = (async () => {
      needReplication(s!, WHY.stream);
      const rels = await publishedRels(s!.db, config.publications);
      if (config.copyData) await needOnRelations(s!, 'table', rels, WHY.copy, { privileges: ['SELECT'] });
      const seqs = config.sequences === 'sync' ? await sourceSequences(s!.db, config, rels) : [];
      await needOnRelations(s!, 'sequence', seqs, WHY.readSequence, { privileges: ['SELECT'] });
      return { rels, seqs };
    })();
    // Both settled before anything is thrown: withSides closes the sessions after this.
    const [source, target] = await Promise.allSettled([sourceSide, targetSessionChecks]);
    if (source.status === 'rejected') throw source.reason;
    if (target.status === 'rejected') throw target.reason;
    const { rels, seqs } = source.value;
    const applied = targetRels(config, rels);
    await needOnRelations(t!, 'table', applied, WHY.apply, { privileges: APPLY_TABLE_PRIVILEGES });
    if (config.copyData && config.deferIndexes) {
      await needOnRelations(t!, 'table', targetRels(config, await tablesToCopy(t!.db, config.subscription, rels)), WHY.defer, { own: true, createInSchema: true });
    }
    if (seqs.length > 0) await needOnRelations(t!, 'sequence', await targetSequences(t!.db, config, applied), WHY.setSequence, { privileges: ['SELECT', 'UPDATE'] });
  });
}

/** `pgsub preflight` reads the published tables' catalogs on both sides: USAGE on their schemas. It reports the rest. */
export async function checkPreflightPrivileges(config: Config): Promise<void> {
  await withSides(config, 'preflight', { source: true, target: true }, async (s, t) => {
    const rels = await publishedRels(s!.db, config.publications);
    await needOnRelations(s!, 'table', rels, 'preflight reads their catalog entries', {});
    await needOnRelations(t!, 'table', rels, 'preflight compares them with the source', {});
  }).catch((err: unknown) => {
    // A side it cannot connect to is one of preflight's own findings (SOURCE_UNREACHABLE …).
    if (err instanceof PrivilegeError) throw err;
  });
}

/** `pgsub schema copy`: pg_dump on the source, the DDL on the target (not with --print). */
export async function checkSchemaCopyPrivileges(config: Config, opts: { step: 'tables' | 'post-data'; force: boolean; print: boolean }): Promise<void> {
  await withSides(config, 'schema_copy', { source: true, target: !opts.print }, async (s, t) => {
    const roots = await publishedRels(s!.db, config.publications);
    const tree = [...roots, ...(await readDescendants(s!.db, roots))];
    const rels = [...(await readAncestors(s!.db, tree)), ...tree];
    await needOnRelations(s!, 'table', rels, 'pg_dump locks every table it dumps, LOCK TABLE … IN ACCESS SHARE MODE', { privileges: ['SELECT'] });
    if (!t) return;
    if (opts.step === 'tables') {
      await needCreateOnDatabase(t, "the tables step runs CREATE SCHEMA IF NOT EXISTS for the tables' schemas");
      await needOnRelations(t, 'table', rels, 'the tables step creates the tables and their sequences there', { createWhereMissing: true });
      if (opts.force) await needOnRelations(t, 'table', rels, '--force drops and re-creates them', { own: true });
    } else {
      await needOnRelations(t, 'table', rels, 'the post-data step adds their foreign keys, triggers, rules and policies', { own: true });
    }
  });
}

/** `pgsub verify [--repair]`: both snapshots, the request row, and the writes of a repair. */
export async function checkVerifyPrivileges(config: Config, opts: { repair: boolean; tables?: (rels: Rel[]) => Rel[] }): Promise<void> {
  await withSides(config, 'verify', { source: true, target: true }, async (s, t) => {
    needReplication(s!, 'verify takes its source snapshot from a temporary replication slot');
    const all = await publishedRels(s!.db, config.publications);
    const rels = opts.tables ? opts.tables(all) : all;
    await needOnRelations(s!, 'table', rels, 'verify reads them', { privileges: ['SELECT'] });
    await needPgsubSchema(t!, "verify's request to the running service (pgsub.verify)");
    const compared = targetRels(config, rels);
    await needOnRelations(t!, 'table', compared, 'verify reads them', { privileges: ['SELECT'] });
    if (opts.repair) {
      await needReplicaRole(t!, 'the repair writes with session_replication_role = replica, as the apply does');
      await needOnRelations(t!, 'table', compared, 'the repair writes the differing rows', { privileges: ['SELECT', 'INSERT', 'UPDATE', 'DELETE'] });
    }
  });
}

/** `pgsub drop`: the slot on the source (unless kept), pgsub's rows and the origin on the target. */
export async function checkDropPrivileges(config: Config, opts: { keepSlot: boolean }): Promise<void> {
  await withSides(config, 'drop', { source: !opts.keepSlot, target: true }, async (s, t) => {
    if (s) needReplication(s, "pg_drop_replication_slot drops the subscription's slot; or give --keep-slot");
    const [present] = await t!.db.query<Row>(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'pgsub')::text AS yes`);
    if (present!.yes === 'true') await needPgsubSchema(t!, "drop deletes the subscription's rows");
    await needOriginFunctions(t!, DROP_ORIGIN_FUNCTIONS, "drop removes the subscription's replication origin");
  });
}

/** `pgsub skip|enable|resync|refresh`: requests written into pgsub's schema; the source only where they read the slot or the publication. */
export async function checkControlPrivileges(config: Config, command: 'skip' | 'enable' | 'resync' | 'refresh', opts: { source: boolean }): Promise<void> {
  await withSides(config, command, { source: opts.source, target: true }, async (s, t) => {
    if (s) needReplication(s, command === 'resync' ? 'resync reads the slot (two_phase)' : 'refresh --no-copy lists the published tables over a replication connection');
    await needPgsubSchema(t!, `${command} writes its request into pgsub's schema`);
  });
}

export interface CutoverSub {
  config: Config;
  target: Db;
}

/**
 * `pgsub cutover`, before its fence: everything it does after the fence except the fence's
 * own statement (ALTER DATABASE needs the database's owner; the fence checks that itself).
 * Source: with a fence that terminates sessions, pg_read_all_stats (other roles' sessions
 * show no backend type or start without it, so the fence would not see them) and
 * pg_signal_backend; the forward walsender terminated at the end (pg_signal_backend when it
 * runs as another role); SELECT on the tables (counts) and the sequences; with --reverse,
 * pgsub's schema (the reverse subscription's progress). pg_prepared_xacts and the marker
 * message (pg_logical_emit_message) need nothing. Target: pgsub's schema (the forward
 * subscription disabled), SELECT on the tables, SELECT and UPDATE on the sequences; with
 * --reverse, REPLICATION (its slot), and for a publication it creates CREATE on the
 * database and the tables' ownership. What the reverse subscription's own `pgsub run`
 * will need is logged as a warning: it is checked when it starts.
 */
export async function checkCutoverPrivileges(source: Db, subs: readonly CutoverSub[], opts: { fence: string; reverse: boolean; keepSlot?: boolean }, log?: Logger): Promise<void> {
  const s = await sideOf(source);
  const sides: SideLacks[] = [s];
  if (!opts.keepSlot) needReplication(s, 'the cutover drops the forward slot on the old primary at its end (or --keep-slot)');
  if (opts.fence !== 'none') {
    await needRole(s, 'pg_read_all_stats', "the fence finds the database's other sessions: another role's show no backend type or start without it");
    await needRole(s, 'pg_signal_backend', "the fence terminates other roles' sessions");
  }
  for (const sub of subs) {
    const { config } = sub;
    const rels = await publishedRels(source, config.publications);
    await needOnRelations(s, 'table', rels, 'the cutover counts their rows at the fence', { privileges: ['SELECT'] });
    const seqs = config.sequences === 'sync' ? await sourceSequences(source, config, rels) : [];
    await needOnRelations(s, 'sequence', seqs, 'the cutover reads them at the fence', { privileges: ['SELECT'] });
    const [walsender] = await source.query<Row>(
      `SELECT (NOT pg_catalog.pg_has_role(a.usesysid, 'USAGE'))::text AS other FROM pg_catalog.pg_replication_slots r JOIN pg_catalog.pg_stat_activity a ON a.pid = r.active_pid WHERE r.slot_name = $1`,
      [config.slotName],
    );
    if (walsender?.other === 'true') await needRole(s, 'pg_signal_backend', "the cutover ends the forward subscription's walsender, which runs as another role");

    const t = await sideOf(sub.target);
    sides.push(t);
    await needPgsubSchema(t, 'the cutover disables the forward subscription there');
    const applied = targetRels(config, rels);
    await needOnRelations(t, 'table', applied, 'the cutover counts their rows at the fence', { privileges: ['SELECT'] });
    if (seqs.length > 0)
      await needOnRelations(t, 'sequence', await targetSequences(t.db, config, applied), 'the cutover sets them with setval', { privileges: ['SELECT', 'UPDATE'] });
    if (opts.reverse) {
      await needPgsubSchema(s, "--reverse records the reverse subscription's progress on the old primary");
      needReplication(t, "--reverse creates the reverse subscription's slot on the new primary");
      const [pub] = await t.db.query<Row>(`SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)::text AS yes`, [reverseNames(config).publication]);
      if (pub!.yes !== 'true') {
        await needCreateOnDatabase(t, '--reverse creates a publication of the tables on the new primary');
        await needOnRelations(t, 'table', applied, '--reverse publishes them: CREATE PUBLICATION … FOR TABLE takes their owner', { own: true });
      }
      if (log) await warnReverseRun(config, s.db, t.db, rels, log);
    }
  }
  const err = privilegeError('cutover', sides);
  if (err) throw err;
}

/** The reverse subscription's `pgsub run` (new primary → old primary) as these roles: what it will lack, logged. */
async function warnReverseRun(config: Config, oldPrimary: Db, newPrimary: Db, rels: readonly Rel[], log: Logger): Promise<void> {
  const into = { ...(await sideOf(oldPrimary)), side: 'target' as const };
  const from = { ...(await sideOf(newPrimary)), side: 'source' as const };
  await needReplicaRole(into, WHY.apply_session);
  await needOriginFunctions(into, applyOriginFunctions(config), WHY.apply_session);
  await needOnRelations(into, 'table', rels, WHY.apply, { privileges: APPLY_TABLE_PRIVILEGES });
  const applied = targetRels(config, rels);
  if (config.sequences === 'sync') {
    const seqs = await sourceSequences(newPrimary, config, applied);
    await needOnRelations(from, 'sequence', seqs, WHY.readSequence, { privileges: ['SELECT'] });
    await needOnRelations(into, 'sequence', seqs, WHY.setSequence, { privileges: ['SELECT', 'UPDATE'] });
  }
  const err = privilegeError('run (the reverse subscription)', [from, into]);
  if (err) log.warn({ err }, 'the reverse subscription will not start as these roles: grant this before pgsub run -c <reverse config>');
}

/**
 * For `pgsub preflight`: what the cutover will need beyond what `run` needs, as findings
 * (preflight runs long before the cutover): the read-only fence's database ownership,
 * pg_read_all_stats and pg_signal_backend on the source (a warning, with `--fence none` as
 * the alternative), and `--reverse`'s REPLICATION and CREATE on the new primary's and the
 * old primary's databases (a note).
 */
export async function cutoverFindings(config: Config, f: Findings): Promise<void> {
  const appName = `pgsub_${config.subscription}_preflight`;
  let source: Db | null = null;
  let target: Db | null = null;
  try {
    source = await openPgDb(config.source, appName);
    target = await openTargetDb(config.target, appName);
    const s = await sideOf(source);
    const [owner] = await source.query<Row>(
      `SELECT pg_catalog.pg_has_role(d.datdba, 'USAGE')::text AS ok FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()`,
    );
    if (owner!.ok !== 'true')
      s.lacks.push({
        what: `ownership of database ${source.info.database}`,
        why: 'ALTER DATABASE … SET default_transaction_read_only',
        fix: `ALTER DATABASE ${ident(source.info.database)} OWNER TO ${ident(s.role)};`,
      });
    await needRole(s, 'pg_read_all_stats', "the fence finds the database's other sessions");
    await needRole(s, 'pg_signal_backend', "the fence terminates other roles' sessions");
    if (s.lacks.length > 0)
      f.warning(
        'CUTOVER_FENCE_PRIVILEGES',
        'source',
        `role ${s.role}`,
        `role "${s.role}" cannot raise pgsub cutover's read-only fence: it lacks ${s.lacks.map((l) => `${l.what} (${l.why})`).join(', ')}. Fence the application yourself and cut over with --fence none (README "Privileges"), or grant it`,
        fixes(s.lacks, s.role).join(' '),
      );
    const t = await sideOf(target);
    const r = await sideOf(source);
    needReplication(t, "the reverse subscription's slot on the new primary");
    await needCreateOnDatabase(t, 'the publication of the tables on the new primary');
    await needPgsubSchema(r, "the reverse subscription's progress on the old primary");
    for (const side of [t, r].filter((x) => x.lacks.length > 0))
      f.info(
        'CUTOVER_REVERSE_PRIVILEGES',
        side.side,
        `role ${side.role}`,
        `pgsub cutover --reverse would be refused: role "${side.role}" lacks ${side.lacks.map((l) => `${l.what} (${l.why})`).join(', ')}`,
        fixes(side.lacks, side.role).join(' '),
      );
  } finally {
    await source?.close();
    await target?.close();
  }
}
