/**
 * The reverse subscription of a cutover (`pgsub cutover --reverse`): replication from the
 * new primary (the forward target) back to the old one (the forward source), so that a
 * rollback after the switch loses none of the writes made on the new primary. Set up
 * while the fence is up, before the application moves:
 *  - on the new primary, a publication of the same tables (`pgsub_reverse_<sub>`, kept
 *    when it exists) and a logical slot created now: its consistent point follows every
 *    change the forward stream applied, so nothing needs copying back;
 *  - on the old primary, pgsub's schema with the reverse subscription's origin at that
 *    consistent point and every table ready (copy_data = false): `pgsub run` with the
 *    reverse config streams from there. The old primary stays fenced read-only for the
 *    application; pgsub's target sessions set default_transaction_read_only = off.
 *  - origin = none: the forward stream's changes on the new primary carry pgsub's
 *    replication origin and are not sent back (PostgreSQL 16+ publisher).
 * The forward subscription must not stream changes of the old primary onward meanwhile:
 * a publisher before 16 cannot filter by origin, so the reverse stream's writes would come
 * back. The cutover disables the forward subscription at its end (cli/cutover.ts).
 * `undoReverse` removes all of it, for a cutover that fails — and so does a setup that
 * fails half-way (a slot that cannot be created leaves no publication behind). A mapped
 * subscription is refused before the fence: its tables have other names on the new primary.
 */
import fs from 'node:fs';
import YAML from 'yaml';
import type { Config } from '../config/config.js';
import { isEmptyMapping } from '../mapping/rules.js';
import { type ConnInfo, conninfoKeywords, conninfoText } from '../config/conninfo.js';
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteIdent, quoteQualified } from '../quote.js';
import { createOrigin, migrateTarget } from '../origin/store.js';
import { markReadyWithoutCopy } from '../tablesync/launcher.js';
import { openMaintenance } from '../pgwire/connect.js';
import type { Db } from './db.js';
import type { Rel } from './objects.js';

export interface ReverseNames {
  subscription: string;
  slot: string;
  publication: string;
}

/** What a reverse setup creates, known before it starts (the cutover records it first: cutover-record.ts). */
export interface ReversePlan extends ReverseNames {
  configFile: string | null;
  /** The publication does not exist yet: the setup creates it, an undo drops it. */
  createdPublication: boolean;
}

export interface ReverseSetup extends ReversePlan {
  consistentPoint: Lsn;
  /** The reverse subscription's settings, as written to the config file. */
  settings: Record<string, unknown>;
}

export function reverseNames(config: Config): ReverseNames {
  const base = `${config.subscription}_reverse`.slice(0, 63);
  return { subscription: base, slot: `${config.slotName}_reverse`.slice(0, 63), publication: `pgsub_${base}`.slice(0, 63) };
}

/** A keyword conninfo without the password (it comes from PGPASSFILE or credential: as for the forward one). */
function reverseConninfo(info: ConnInfo): string {
  return conninfoText(conninfoKeywords(info));
}

/** What would stop the reverse setup, checked before the fence: a null answer means none. */
export async function reverseRefusal(config: Config, target: Db): Promise<string | null> {
  const names = reverseNames(config);
  if (!isEmptyMapping(config.mapping))
    return `--reverse replicates every table back under the name it has on the new primary, and subscription ${config.subscription} maps tables or columns (mapping:): a reverse stream would need the inverse mapping. Cut over without --reverse`;
  if (target.versionNum < 160000) return `--reverse needs origin = none on the new primary, a PostgreSQL 16 or later server; the target is ${target.version}`;
  const [s] = await target.query(
    `SELECT pg_catalog.current_setting('wal_level') AS wal_level, (SELECT count(*) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)::text AS slots`,
    [names.slot],
  );
  if (s!.wal_level !== 'logical')
    return `--reverse streams from the new primary, whose wal_level is ${s!.wal_level}: ALTER SYSTEM SET wal_level = logical on the target and restart it first`;
  if (s!.slots !== '0')
    return `replication slot ${names.slot} exists on the target already (an earlier reverse setup?): drop it first (SELECT pg_drop_replication_slot('${names.slot}'))`;
  return null;
}

export async function reversePlan(config: Config, target: Db, configFile: string | null): Promise<ReversePlan> {
  const names = reverseNames(config);
  const [pub] = await target.query(`SELECT count(*)::text AS n FROM pg_catalog.pg_publication WHERE pubname = $1`, [names.publication]);
  return { ...names, configFile, createdPublication: pub!.n === '0' };
}

/** Creates what `plan` names; on any failure removes all of it again (the publication too) before it throws. */
export async function setupReverse(config: Config, target: Db, tables: readonly Rel[], plan: ReversePlan): Promise<ReverseSetup> {
  const appName = `pgsub_${config.subscription}_cutover`;
  const setup: ReverseSetup = { ...plan, consistentPoint: 0n as Lsn, settings: {} };
  let slotCreated = false;
  try {
    if (plan.createdPublication)
      await target.query(`CREATE PUBLICATION ${quoteIdent(plan.publication)} FOR TABLE ${tables.map((t) => quoteQualified(t.schema, t.table)).join(', ')}`);
    const replication = await ReplicationConnection.open(config.target, appName);
    try {
      ({ consistentPoint: setup.consistentPoint } = await replication.createSlot(plan.slot));
      slotCreated = true;
    } finally {
      await replication.close();
    }
    await migrateTarget(config.source, appName);
    const sql = openMaintenance(config.source, appName);
    try {
      await createOrigin(sql, plan.subscription, plan.slot, setup.consistentPoint);
      await markReadyWithoutCopy(sql, plan.subscription, [...tables]);
    } finally {
      await sql.end({ timeout: 5 }).catch(() => {});
    }
    setup.settings = {
      subscription: plan.subscription,
      slot_name: plan.slot,
      source: reverseConninfo(config.target),
      target: reverseConninfo(config.source),
      publication: plan.publication,
      origin: 'none',
      copy_data: false,
      create_slot: false,
      sequences: 'sync',
    };
    if (plan.configFile) {
      const header = `# pgsub reverse subscription written by pgsub cutover (${new Date().toISOString()}): new primary -> old primary, from ${formatLsn(setup.consistentPoint)}.\n# Start it with: pgsub run -c ${plan.configFile}   (passwords as for the forward subscription: PGPASSFILE or password=credential:NAME)\n`;
      fs.writeFileSync(plan.configFile, header + YAML.stringify(setup.settings), { mode: 0o600 });
    }
    return setup;
  } catch (err) {
    // A slot of that name that was there before is not this setup's to drop.
    await undoReverse(config, target, setup, { dropSlot: slotCreated }).catch(() => {});
    throw err;
  }
}

/** Remove what setupReverse made (the slot, a publication it created, the rows on the old primary). */
export async function undoReverse(config: Config, target: Db, setup: ReversePlan, opts = { dropSlot: true }): Promise<void> {
  if (opts.dropSlot) await target.query(`SELECT pg_catalog.pg_drop_replication_slot(slot_name)::text FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, [setup.slot]);
  if (setup.createdPublication) await target.query(`DROP PUBLICATION IF EXISTS ${quoteIdent(setup.publication)}`);
  const sql = openMaintenance(config.source, `pgsub_${config.subscription}_cutover`);
  try {
    await sql.unsafe(`DELETE FROM "pgsub"."subscription_rel" WHERE subscription = $1`, [setup.subscription]).catch(() => {});
    await sql.unsafe(`DELETE FROM "pgsub"."origin" WHERE subscription = $1`, [setup.subscription]).catch(() => {});
  } finally {
    await sql.end({ timeout: 5 }).catch(() => {});
  }
  if (setup.configFile) fs.rmSync(setup.configFile, { force: true });
}
