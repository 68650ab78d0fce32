/**
 * The command's side of the hold (the service's is hold.ts, whose header gives the
 * argument): take the verify lock, check that a service runs the subscription, post the
 * request, and once the service has closed its gate read the source's WAL position W,
 * create the temporary slot (its exported snapshot is the source at L) and tell the service
 * L. In snapshot mode the service answers with the target's exported snapshot at L; in
 * repair mode it stays held at L until `release`. The control connection is a plain pg
 * client: its backend holds the verify lock, so the request dies with this process.
 */
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { connectPgClient } from '../connect/drivers.js';
import { VerifyError } from '../errors.js';
import { formatLsn, parseLsn, type Lsn } from '../protocol/lsn.js';
import { ReplicationConnection } from '../protocol/replication.js';
import { quoteIdent } from '../quote.js';
import { moveVerifyRow, readVerifyRow, verifyChannel, verifyLockKey, type Query, type VerifyRow, type VerifyState } from './channel.js';

export interface Control {
  client: pg.Client;
  query: Query;
  requestId: string | null;
  close(): Promise<void>;
}

export interface Held {
  lsn: Lsn;
  /** The source snapshot at `lsn` (valid while `replication` stays open and idle). */
  sourceSnapshot: string;
  /** Snapshot mode: the target's, exported by the service. */
  targetSnapshot: string | null;
  /** How long the service's apply waited at the gate (snapshot mode; repair mode: when released). */
  pauseMs: number | null;
  replication: ReplicationConnection;
  /** Time from the request to the answer. */
  handshakeMs: number;
  /** Where the handshake's time went: to the gate closing, creating the slot (the gate held commits past W meanwhile), to the answer. */
  steps: { armedMs: number; slotMs: number; answerMs: number };
}

/** How long the service may take to answer a step of the handshake. */
const ANSWER_MS = 15_000;

export async function openControl(config: Config): Promise<Control> {
  const client = await connectPgClient(config.target, { side: 'target', purpose: 'apply', what: 'a connection', applicationName: `pgsub_${config.subscription}_verify_cli` });
  const query: Query = async (text, params = []) => (await client.query({ text, values: params })).rows as Record<string, unknown>[];
  const control: Control = {
    client,
    query,
    requestId: null,
    close: async () => {
      await client.end().catch(() => {});
    },
  };
  try {
    const [classId, objId] = verifyLockKey(config.subscription);
    const locked = await query('SELECT pg_catalog.pg_try_advisory_lock($1::int4, $2::int4) AS ok', [classId, objId]);
    if (locked[0]?.ok !== true) throw new VerifyError(`another pgsub verify is running for subscription "${config.subscription}"; wait for it to finish`);
    const exists = await query(`SELECT pg_catalog.to_regclass('"pgsub"."verify"') IS NOT NULL AS ok`);
    if (exists[0]?.ok !== true) throw new VerifyError(`the target has no pgsub.verify table: start the service (pgsub run) with this version once, so it migrates pgsub's schema`);
    const runner = await query(`SELECT r.pid, r.host FROM "pgsub"."runner" r JOIN pg_catalog.pg_stat_activity a ON a.pid = r.backend_pid WHERE r.subscription = $1`, [
      config.subscription,
    ]).catch(() => []);
    if (runner.length === 0) throw new VerifyError(`no pgsub service is running for subscription "${config.subscription}": start it (pgsub run, or systemctl start) and try again`);
    await client.query(`LISTEN ${quoteIdent(verifyChannel(config.subscription))}`);
  } catch (err) {
    await control.close();
    throw err;
  }
  return control;
}

/**
 * Waits for the row to reach one of `states`: woken by NOTIFY, polled as well. The listener
 * is in place before the row is read, so an answer arriving with the read is not missed.
 */
async function waitFor(control: Control, config: Config, states: readonly VerifyState[], what: string): Promise<VerifyRow> {
  const deadline = Date.now() + ANSWER_MS;
  for (;;) {
    let wake: () => void = () => {};
    let notified = false;
    const onNotification = () => {
      notified = true;
      wake();
    };
    control.client.on('notification', onNotification);
    try {
      const row = await readVerifyRow(control.query, config.subscription);
      if (row && row.request_id === control.requestId) {
        if (states.includes(row.state)) return row;
        if (row.state === 'refused') throw new VerifyError(`the service refused the verify hold: ${row.detail ?? 'no reason given'}`);
        if (row.state === 'abandoned') throw new VerifyError(`the service abandoned the verify hold: ${row.detail ?? 'no reason given'}`);
      }
      if (Date.now() > deadline) {
        throw new VerifyError(
          `the service did not answer (${what}) within ${ANSWER_MS / 1000} s; is pgsub run streaming for subscription "${config.subscription}"? (pgsub status)`,
        );
      }
      if (!notified) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 100);
          wake = () => {
            clearTimeout(timer);
            resolve();
          };
        });
      }
    } finally {
      control.client.removeListener('notification', onNotification);
    }
  }
}

/** One subscription taking part in a hold: its config and its control connection. */
export interface HoldParty {
  config: Config;
  control: Control;
}

/**
 * The handshake: the source snapshot and the LSN, and in snapshot mode the target's. The
 * replication connection is opened first, so the gates are closed only for a query and the
 * slot's creation. Several subscriptions of one source database (a split migration) are
 * held at the same L: every gate closes before W is read, one slot gives L and the source
 * snapshot, and every service holds at L before the answer. The target snapshot is then the
 * service's when there is one subscription; with several (asked in repair mode, so that
 * each stays held until released), the caller exports its own while all of them hold
 * (targetSnapshot null): each service's snapshot shows only its own progress.
 */
export async function holdAtLsn(parties: readonly HoldParty[], source: pg.Client, mode: 'snapshot' | 'repair', holdTimeoutMs: number): Promise<Held> {
  const first = parties[0]!.config;
  const replication = await ReplicationConnection.open(first.source, `pgsub_${first.subscription}_verify`);
  try {
    const started = performance.now();
    for (const { config, control } of parties) await request(config, control, mode, holdTimeoutMs);
    for (const { config, control } of parties) await waitFor(control, config, ['armed'], 'closing its gate');
    const armedAt = performance.now();
    // Read after every 'armed': every commit the services applied or started is below it.
    const w = parseLsn(String((await source.query('SELECT pg_catalog.pg_current_wal_lsn()::text AS w')).rows[0].w));
    for (const { config, control } of parties) await moveVerifyRow(control.query, config.subscription, control.requestId!, ['armed'], 'bounded', { bound_lsn: formatLsn(w) });
    const slotStarted = performance.now();
    const tag = parties[0]!.control.requestId!.slice(0, 8);
    const slot = await replication.createSnapshotSlot(`pgsub_verify_${process.pid}_${tag}`);
    const slotAt = performance.now();
    for (const { config, control } of parties)
      await moveVerifyRow(control.query, config.subscription, control.requestId!, ['bounded'], 'located', { slot_lsn: formatLsn(slot.consistentPoint) });
    const rows: VerifyRow[] = [];
    for (const { config, control } of parties) rows.push(await waitFor(control, config, [mode === 'snapshot' ? 'snapshot' : 'held'], 'holding at the slot position'));
    const pauses = rows.map((r) => r.pause_ms).filter((ms): ms is number => ms !== null);
    return {
      lsn: slot.consistentPoint,
      sourceSnapshot: slot.snapshotName,
      targetSnapshot: mode === 'snapshot' ? rows[0]!.snapshot : null,
      pauseMs: pauses.length > 0 ? Math.max(...pauses) : null,
      replication,
      handshakeMs: performance.now() - started,
      steps: { armedMs: round(armedAt - started), slotMs: round(slotAt - slotStarted), answerMs: round(performance.now() - slotAt) },
    };
  } catch (err) {
    await replication.close();
    for (const { config, control } of parties) if (control.requestId) await moveVerifyRow(control.query, config.subscription, control.requestId, null, 'done').catch(() => {});
    throw err;
  }
}

/** Post a hold request for one subscription and wake its service. */
async function request(config: Config, control: Control, mode: 'snapshot' | 'repair', holdTimeoutMs: number): Promise<void> {
  control.requestId = randomUUID();
  await control.query(
    `INSERT INTO "pgsub"."verify" (subscription, request_id, mode, state, holder_pid, hold_timeout_ms) VALUES ($1, $2, $3, 'requested', pg_catalog.pg_backend_pid(), $4) ` +
      `ON CONFLICT (subscription) DO UPDATE SET request_id = $2, mode = $3, state = 'requested', holder_pid = pg_catalog.pg_backend_pid(), hold_timeout_ms = $4, ` +
      `bound_lsn = NULL, slot_lsn = NULL, applied_lsn = NULL, snapshot = NULL, pause_ms = NULL, detail = NULL, updated_at = now()`,
    [config.subscription, control.requestId, mode, holdTimeoutMs],
  );
  await control.query('SELECT pg_catalog.pg_notify($1, $2)', [verifyChannel(config.subscription), 'requested']);
}

/** Snapshot mode: the snapshot is imported, the service may end its exporting transaction. */
export async function imported(config: Config, control: Control): Promise<void> {
  if (control.requestId) await moveVerifyRow(control.query, config.subscription, control.requestId, null, 'imported');
}

/** Repair mode: the repair is written; the apply goes on. */
export async function release(config: Config, control: Control): Promise<void> {
  if (control.requestId) await moveVerifyRow(control.query, config.subscription, control.requestId, null, 'released');
}

/** The end of a verify: the result for `pgsub status` and the metrics. */
export async function finish(config: Config, control: Control, lsn: Lsn, result: string, differences: number): Promise<void> {
  if (!control.requestId) return;
  await moveVerifyRow(control.query, config.subscription, control.requestId, null, 'done', {
    last_lsn: formatLsn(lsn),
    last_result: result,
    last_differences: differences,
  });
  await control.query(`UPDATE "pgsub"."verify" SET last_at = now() WHERE subscription = $1`, [config.subscription]);
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
