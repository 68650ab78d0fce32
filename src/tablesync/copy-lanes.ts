/**
 * Copy lanes: one publisher snapshot shared by the whole-table copies of one refresh, as
 * native's one-worker-per-table cannot. A lane is a walsender connection whose REPEATABLE
 * READ transaction took the snapshot of the temporary slot it created
 * (`CREATE_REPLICATION_SLOT … USE_SNAPSHOT`, as native's tablesync worker does), and a
 * target connection. Tables copied on a lane are read in that transaction, one after the
 * other, and all get the slot's consistent point as their sync LSN; the slot vanishes
 * with the connection.
 *
 * Before this, every table cost a walsender, a temporary slot, a second publisher
 * connection importing the exported snapshot, and two target connections — most of a
 * small table's job (docs/design-measurements.md), and four backends started per table.
 *
 * Why sharing is exact: a table's copy must hold every change that committed before its
 * sync LSN and none after, and the stream must still be able to deliver everything after
 * it. The first holds for any snapshot with its consistent point. For the second, the
 * feedback hold (origin/sync-state.ts: heldLsn) of every table of the batch is in place before any
 * lane of the batch creates its slot, so the subscription's slot cannot have confirmed
 * past a lane's consistent point (launcher.ts sets the holds, then schedules). Lanes serve
 * only the batch they were opened for.
 *
 * A lane is reused only while its snapshot is young (LANE_REUSE_MS): a table copied from
 * an old snapshot would have to take more from the stream afterwards, and an open
 * snapshot holds back the publisher's vacuum. A lane whose copy failed is closed.
 */
import type pg from 'pg';
import type { Config } from '../config/config.js';
import { connectPgClient } from '../connect/drivers.js';
import { SourceSetupError } from '../errors.js';
import { parseLsn, type Lsn } from '../protocol/lsn.js';
import { quoteIdent } from '../quote.js';
import { openCopyClient } from './copy.js';

/** A lane is given to the next table only while its snapshot is younger than this. */
export const LANE_REUSE_MS = 30_000;

export interface Lane {
  /** Walsender connection inside the snapshot's transaction; COPY … TO STDOUT runs here. */
  source: pg.Client;
  target: pg.Client;
  /** The temporary slot's consistent point: the sync LSN of every table copied here. */
  syncLsn: Lsn;
  openedAt: number;
}

let slotCounter = 0;

/** Open a lane: both connections, the temporary slot and its snapshot. */
export async function openLane(config: Config, applicationName: string): Promise<Lane> {
  const slotName = `pgsub_${config.subscription}_sync_${process.pid}_${++slotCounter}`
    .slice(0, 63)
    .toLowerCase()
    .replace(/[^a-z0-9_]/g, '_');
  const opening = Promise.allSettled([
    connectPgClient(config.source, {
      side: 'source',
      purpose: 'replication',
      what: 'a replication connection for table sync',
      applicationName,
      startup: { replication: 'database' },
      // As the other source connections of the table sync (copy.ts).
      options: '-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3 -c search_path=',
    }),
    openCopyClient(config.target, applicationName, 'target'),
  ]);
  const [s, t] = await opening;
  const target = t.status === 'fulfilled' ? t.value : null;
  const source = s.status === 'fulfilled' ? s.value : null;
  try {
    if (s.status === 'rejected' || !source) throw s.status === 'rejected' ? s.reason : new SourceSetupError('no source connection');
    if (t.status === 'rejected') throw t.reason;
    await source.query('BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ');
    const res = await source.query<{ consistent_point: string }>(`CREATE_REPLICATION_SLOT ${quoteIdent(slotName)} TEMPORARY LOGICAL pgoutput USE_SNAPSHOT`);
    const point = res.rows[0]?.consistent_point;
    if (!point) throw new SourceSetupError(`CREATE_REPLICATION_SLOT ${slotName} returned no consistent point`);
    return { source, target: target!, syncLsn: parseLsn(point), openedAt: Date.now() };
  } catch (err) {
    await Promise.all([source?.end().catch(() => {}), target?.end().catch(() => {})]);
    throw err;
  }
}

/** Close both connections; closing the walsender drops the temporary slot. */
export async function closeLane(lane: Lane): Promise<void> {
  await Promise.all([lane.source.end().catch(() => {}), lane.target.end().catch(() => {})]);
}

/**
 * The lanes of one batch of tables (one refresh). Every job of the batch calls enter()
 * once when it starts, whether it wants a lane or not, so that the pool knows when no
 * table is left to take an idle lane; a lane taken is given back with release().
 */
export class LanePool {
  private readonly idle: Lane[] = [];
  private unstarted: number;
  private closed = false;

  constructor(
    private readonly open: () => Promise<Lane>,
    tables: number,
  ) {
    this.unstarted = tables;
  }

  /** A job of the batch starts; with `want`, it gets a lane (an idle one, or a new one). */
  async enter(want: true): Promise<Lane>;
  async enter(want: false): Promise<null>;
  async enter(want: boolean): Promise<Lane | null> {
    this.unstarted--;
    const lane = want ? this.idle.pop() : undefined;
    if (this.unstarted <= 0) this.closeIdle();
    if (!want) return null;
    return lane ?? this.open();
  }

  /** Give a lane back: kept for the next table while young, healthy and wanted. */
  release(lane: Lane, healthy: boolean): void {
    if (healthy && !this.closed && this.unstarted > 0 && Date.now() - lane.openedAt < LANE_REUSE_MS) this.idle.push(lane);
    else void closeLane(lane);
  }

  /** No more lanes are kept; the idle ones are closed (the launcher stops). */
  close(): void {
    this.closed = true;
    this.closeIdle();
  }

  /** Whether the pool may still hold a lane (a job of its batch has not started yet). */
  get active(): boolean {
    return !this.closed && this.unstarted > 0;
  }

  private closeIdle(): void {
    for (const lane of this.idle.splice(0)) void closeLane(lane);
  }
}
