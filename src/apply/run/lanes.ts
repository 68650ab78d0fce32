/**
 * Apply lanes (`apply_workers` > 1): independent source transactions applied in parallel
 * on several target connections while pgsub is behind, committed in source order.
 *
 * The leader (applier.ts) routes whole groups of consecutive source transactions — a group is
 * one target transaction, as in serial grouping — to lanes in turn; each lane runs the
 * usual handlers on its own connection, pipeline and relation map. Three rules keep the
 * result the serial one:
 *  - commit order: a group's target COMMIT, with its origin row and the replication origin
 *    stamp, goes out only after every earlier group committed (the `commitTurn` of its
 *    ApplyState, handlers.ts commitTarget). Commits stay at source commit boundaries in
 *    source order, so a crash leaves the origin at the last committed group and nothing
 *    after it: exactly once, as without lanes. Only one session may hold the replication
 *    origin: each lane takes it for its commit and releases it before its Sync answers;
 *    the main connection gives it up while lanes run and takes it back after.
 *  - dependencies: a change whose row identity (lane-keys.ts) an earlier group still
 *    uncommitted also touched waits until that group committed, so it sees that group's
 *    rows as a serial apply would. A change without a usable identity (no replica
 *    identity key, an unchanged TOAST key, TRUNCATE, a table with triggers that fire in
 *    replica mode) waits for every earlier group, and later changes to its table wait for it.
 *  - fallback: anything that is not a plain transaction on ready tables (streamed,
 *    prepared, skipped, careful, below the origin, while a table syncs) is applied by the
 *    main connection after all lanes committed. A failure in a lane ends the session with
 *    a group retry (loop.ts): the next one applies those transactions one by one, where
 *    conflicts are detected and resolved as usual. A watchdog ends the session the same way
 *    when the oldest group waits on a lock another lane holds (a uniqueness the keys do not
 *    cover): that wait would otherwise last forever, the later lane waiting for its turn.
 * This file is the leader: groups opened, routed to and closed, the serial path's converge,
 * the failure. A lane's task: lane-runner.ts; the commit order: lane-order.ts; a change's
 * dependencies: lane-dependencies.ts (row identities: lane-keys.ts); the watchdog: lane-watch.ts.
 */
import { peekBeginFinalLsn, peekTruncateRelationIds } from '../../protocol/peek.js';
import { originSessionResetStatement, originSessionSetupStatement } from '../../origin/replorigin.js';
import { TAG } from '../../protocol/tags.js';
import { ZERO_LSN, type Lsn } from '../../protocol/lsn.js';
import type { BeginMessage, PgOutputMessage } from '../../protocol/messages.js';
import type { ApplyOptions } from '../../config/apply-options.js';
import type { Logger } from '../../log.js';
import { settleTarget } from '../txn/commit.js';
import { LaneDependencies } from './lane-dependencies.js';
import { CommitOrder } from './lane-order.js';
import { Lane } from './lane-runner.js';
import { HeadWatch, type WatchedLanes } from './lane-watch.js';
import type { ApplyState, Dispatch } from '../txn/apply-state.js';
import { runAlone, type WireConnection } from '../../pgwire/connect.js';

/** A group ends after this many changes: lanes take turns at about this grain. */
const GROUP_CHANGES = 8192;
/**
 * This many groups in a row whose first transaction already waited for an earlier group
 * (every transaction touching one hot row, as pgbench's branch): lanes only add hand-offs
 * to what is serial anyway, so the next PAUSE_GROUPS groups' worth of transactions go the
 * serial way.
 */
const DEPENDENT_GROUPS = 4;
const PAUSE_GROUPS = 64;

export interface ApplyLanesOptions extends LaneConnections {
  /** The settings (applyWorkers lanes, groupTransactions per group, maxInFlight per lane). */
  options: ApplyOptions;
  /** The handler table (handlers/dispatch.ts), given by the loop. */
  dispatch: Dispatch;
  /** No lane for transactions finishing at or before this LSN (after a group retry). */
  noGroupUntil: Lsn | null;
  /** A lane failed: `untilLsn` is the last transaction routed to a lane. */
  onFailure(err: unknown, untilLsn: Lsn): void;
}

/** How a lane's connection is opened and set up, from the session. */
export interface LaneConnections {
  /** A target connection set up like the apply connection (target.ts). */
  openConnection(purpose: string): Promise<WireConnection>;
  originName: string;
  targetVersionNum: number;
}

interface OpenGroup {
  lane: Lane;
  seq: number;
  changes: number;
  transactions: number;
  inTransaction: boolean;
  /** A change of its first transaction waited for an earlier group: it could not start before that one committed. */
  dependent: boolean;
}

export interface LaneCounters {
  groups: number;
  /** Times lanes paused after DEPENDENT_GROUPS dependent groups in a row. */
  pauses: number;
  /** Changes that waited for an earlier group to commit. */
  dependencyWaits: number;
}

export class ApplyLanes {
  readonly counters: LaneCounters = { groups: 0, pauses: 0, dependencyWaits: 0 };
  #lanes: Lane[] | null = null;
  #unavailable = false;
  #open: OpenGroup | null = null;
  #lastSeq = 0;
  /** Groups commit in source order; what failed the lanes. */
  readonly #order = new CommitOrder();
  #originOnMain = true;
  /** Which earlier group each change waits for. */
  readonly #deps: LaneDependencies;
  #lastRoutedLsn: Lsn = ZERO_LSN;
  #dependentRun = 0;
  /** BEGINs still to go the serial way after a pause. */
  #pausedBegins = 0;

  /** The oldest group waiting on a lock a later lane holds. */
  readonly #watch: HeadWatch;

  constructor(
    private readonly main: ApplyState,
    private readonly opts: ApplyLanesOptions,
    private readonly log: Logger,
  ) {
    this.#watch = new HeadWatch(() => opts.openConnection('lane_watch'), log, this.#order, this.#watched());
    this.#deps = new LaneDependencies(main);
  }

  /** The lanes' backends (the parallel apply watchdog looks at what they wait for). */
  pids(): number[] {
    return (this.#lanes ?? []).map((lane) => lane.conn.processId);
  }

  /** Groups routed and not yet committed, or one still open. */
  get busy(): boolean {
    return this.#open !== null || this.#order.committedThrough < this.#lastSeq;
  }

  /** The serial path must call converge() first: lanes busy, or the origin not back on the main connection. */
  get needsConverge(): boolean {
    return this.busy || !this.#originOnMain;
  }

  /**
   * The leader's offer of the next message: true when a lane took it. False: the serial
   * path applies it, after converge() if busy. `message`: the leader's decoding of `raw`
   * (null for an insert, decoded only if it cannot be copied as sent); `queued`: items
   * behind it in the receive queue.
   */
  route(raw: Buffer, message: PgOutputMessage | null, queued: number): boolean | Promise<boolean> {
    this.#order.throwIfFailed();
    const tag = raw[0];
    const group = this.#open;
    if (group === null) {
      if (tag === TAG.BEGIN) {
        // Only while behind: a caught-up stream gains nothing from a second connection.
        if (queued === 0 || this.#unavailable || this.opts.options.applyWorkers < 2) return false;
        if (this.#pausedBegins > 0) {
          this.#pausedBegins--;
          return false;
        }
        return this.#openFor(raw, message as BeginMessage);
      }
      // Every lane's relation map follows the stream, whoever applies the transaction.
      if ((tag === TAG.RELATION || tag === TAG.TYPE) && this.#lanes !== null) return this.#broadcast(raw).then(() => false);
      return false;
    }
    return this.#routeInGroup(group, raw, message, queued);
  }

  /** A message while a group is open: it goes to the group's lane (a promise only when that lane's queue is full). */
  #routeInGroup(group: OpenGroup, raw: Buffer, message: PgOutputMessage | null, queued: number): boolean | Promise<boolean> {
    switch (raw[0]) {
      case TAG.INSERT:
      case TAG.UPDATE:
      case TAG.DELETE: {
        group.changes++;
        const waitFor = this.#deps.dependency(group.seq, raw);
        return typeof waitFor === 'number' ? this.#pushed(group, raw, message, waitFor) : waitFor.then((w) => this.#pushed(group, raw, message, w));
      }
      case TAG.BEGIN:
        if (!this.#eligible(message as BeginMessage)) {
          this.#closeGroup();
          return false;
        }
        this.#noteRouted(raw);
        group.inTransaction = true;
        return this.#pushed(group, raw, message, 0);
      case TAG.COMMIT: {
        group.transactions++;
        group.inTransaction = false;
        const ends = group.changes >= GROUP_CHANGES || group.transactions >= this.opts.options.groupTransactions || queued === 0;
        // The end marker goes after the COMMIT, also when that had to wait for room.
        const pushed = this.#push(group, raw, message, 0);
        if (pushed === undefined) {
          if (ends) this.#closeGroup();
          return true;
        }
        return pushed.then(() => {
          if (ends && this.#open === group) this.#closeGroup();
          return true;
        });
      }
      case TAG.RELATION:
      case TAG.TYPE: {
        const m = message!;
        if (m.tag === 'relation') {
          this.main.relations.onRelation(m);
          this.#deps.relationChanged(m.relationId);
        } else if (m.tag === 'type') this.main.relations.onType(m.typeOid, m.namespace, m.name);
        return this.#broadcast(raw).then(() => true);
      }
      case TAG.TRUNCATE: {
        // TRUNCATE names its relations after a count; it waits for everything before and
        // every later change to those tables waits for it. A mapped relation's key is its
        // target table's: resolved first, so that it is the key its later changes look up.
        const ids: number[] = [];
        peekTruncateRelationIds(raw, (relationId) => ids.push(relationId));
        const unknown = ids.filter((id) => this.#deps.unknown(id));
        const record = () => {
          this.#deps.wholeTables(group.seq, ids);
          group.changes++;
          return this.#pushed(group, raw, message, group.seq - 1);
        };
        if (unknown.length === 0) return record();
        return (async () => {
          for (const id of unknown) await this.#deps.resolve(id);
          return record();
        })();
      }
      case TAG.ORIGIN:
      case TAG.MESSAGE:
        return this.#pushed(group, raw, message, 0);
      default:
        // Not valid inside a transaction: the lane's handlers report it.
        if (group.inTransaction) return this.#pushed(group, raw, message, 0);
        this.#closeGroup();
        return false;
    }
  }

  /** A BEGIN with no group open: a new group on the next lane, if this transaction may have one. */
  async #openFor(raw: Buffer, begin: BeginMessage): Promise<boolean> {
    if (!(await this.#canOpen(begin))) return false;
    const opened = await this.#openGroup();
    if (opened === null) return false;
    this.#noteRouted(raw);
    opened.inTransaction = true;
    await this.#push(opened, raw, begin, 0);
    return true;
  }

  /** #push, answering true (taken) at once when the lane's queue had room. */
  #pushed(group: OpenGroup, raw: Buffer, message: PgOutputMessage | null, waitFor: number): true | Promise<boolean> {
    const pushed = this.#push(group, raw, message, waitFor);
    return pushed === undefined ? true : pushed.then(() => true);
  }

  /** Between transactions with nothing more queued: the open group commits now, not with the next arrival. */
  endIfIdle(queued: number): void {
    if (this.#open !== null && !this.#open.inTransaction && queued === 0) this.#closeGroup();
  }

  /** Before the serial path: every group committed, the replication origin back on the main connection. */
  async converge(): Promise<void> {
    if (this.#open !== null) this.#closeGroup();
    await this.#order.until(this.#lastSeq);
    this.#watch.stop();
    if (!this.#originOnMain) {
      await runAlone(this.main.conn, [originSessionSetupStatement(this.opts.originName)]);
      this.#originOnMain = true;
    }
  }

  async close(): Promise<void> {
    this.#watch.stop();
    if (this.counters.groups > 0) this.log.info({ ...this.counters, lanes: this.opts.options.applyWorkers }, 'apply lanes stopped');
    this.#fail(new Error('apply lanes closed'), false);
    const lanes = this.#lanes ?? [];
    for (const lane of lanes) lane.queue.close();
    // Open lane transactions roll back with their connections.
    await Promise.all(lanes.map((lane) => lane.conn.close().catch(() => {})));
    await Promise.all(lanes.map((lane) => lane.task.catch(() => {})));
    await this.#watch.close();
  }

  async #canOpen(begin: BeginMessage): Promise<boolean> {
    const main = this.main;
    if (main.tx.xact !== null || main.mode.streamXid !== null || main.mode.careful) return false;
    if (!this.#eligible(begin)) return false;
    // Tables still syncing have per-table positions the lanes do not keep.
    if (main.session.sync.all().some((t) => t.state !== 'r')) return false;
    // What the main connection has under way commits first (its errors are the loop's).
    await settleTarget(main);
    if (this.#originOnMain) {
      await runAlone(main.conn, [originSessionResetStatement()]);
      this.#originOnMain = false;
    }
    return true;
  }

  #eligible(m: BeginMessage): boolean {
    const main = this.main;
    const until = this.opts.noGroupUntil;
    if (m.finalLsn < main.session.progress.durable || (until !== null && m.finalLsn <= until)) return false;
    return main.mode.skipLsn !== m.finalLsn && main.mode.carefulLsn !== m.finalLsn;
  }

  /** A BEGIN going to a lane: a failure retries one by one up to its commit. */
  #noteRouted(begin: Buffer): void {
    const finalLsn = peekBeginFinalLsn(begin);
    if (finalLsn > this.#lastRoutedLsn) this.#lastRoutedLsn = finalLsn;
  }

  async #openGroup(): Promise<OpenGroup | null> {
    const lanes = await this.#ensureLanes();
    if (lanes === null) return null;
    const seq = this.#lastSeq + 1;
    const lane = lanes[(seq - 1) % lanes.length]!;
    // The lane's previous group must have ended (committed) first.
    if (lane.seq !== 0) await this.#order.until(lane.seq);
    this.#order.throwIfFailed();
    this.#lastSeq = seq;
    lane.assign(seq);
    this.counters.groups++;
    this.#open = { lane, seq, changes: 0, transactions: 0, inTransaction: false, dependent: false };
    this.#watch.start();
    return this.#open;
  }

  #closeGroup(): void {
    const group = this.#open!;
    this.#open = null;
    this.#dependentRun = group.dependent ? this.#dependentRun + 1 : 0;
    if (this.#dependentRun >= DEPENDENT_GROUPS) {
      this.#dependentRun = 0;
      this.#pausedBegins = PAUSE_GROUPS * this.opts.options.groupTransactions;
      this.counters.pauses++;
      this.log.debug({ groups: DEPENDENT_GROUPS, transactions: this.#pausedBegins }, 'apply lanes paused: each group waited for the one before');
    }
    // Never waits for space: the marker is tiny, and the lane frees its group with it.
    group.lane.queue.putAlways({ end: group.seq });
  }

  #push(group: OpenGroup, raw: Buffer, message: PgOutputMessage | null, waitFor: number): Promise<void> | undefined {
    const item = { raw, message, waitFor: waitFor > this.#order.committedThrough ? waitFor : 0 };
    if (item.waitFor > 0) {
      this.counters.dependencyWaits++;
      if (group.transactions === 0) group.dependent = true;
    }
    if (group.lane.queue.tryPut(item, raw.length)) return undefined;
    return group.lane.queue.put(item, raw.length).then(() => undefined);
  }

  async #broadcast(raw: Buffer): Promise<void> {
    // Each lane decodes its own copy: a relation map keeps the message it is given.
    for (const lane of this.#lanes ?? [])
      if (!lane.queue.tryPut({ raw, message: null, waitFor: 0 }, raw.length)) await lane.queue.put({ raw, message: null, waitFor: 0 }, raw.length);
  }

  async #ensureLanes(): Promise<Lane[] | null> {
    if (this.#lanes !== null) return this.#lanes;
    const lanes: Lane[] = [];
    try {
      for (let index = 0; index < this.opts.options.applyWorkers; index++)
        lanes.push(new Lane(index, await this.opts.openConnection(`lane${index + 1}`), this.main, this.opts, this.#order));
    } catch (err) {
      // No extra connections (e.g. max_connections): apply serially.
      this.log.warn({ err }, 'apply lane connections unavailable; applying serially');
      for (const lane of lanes) await lane.conn.close().catch(() => {});
      this.#unavailable = true;
      return null;
    }
    this.#lanes = lanes;
    for (const lane of lanes) lane.start((err: unknown) => this.#fail(err, true));
    this.log.info({ lanes: lanes.length }, 'apply lanes started');
    return lanes;
  }

  #fail(err: unknown, report: boolean): void {
    if (!this.#order.fail(err)) return;
    for (const lane of this.#lanes ?? []) lane.queue.close();
    // Not logged here: the service loop logs it once, where it decides what follows (runner.ts).
    if (report) this.opts.onFailure(err, this.#lastRoutedLsn);
  }

  /** What the watchdog reads of the leader (lane-watch.ts). */
  #watched(): WatchedLanes {
    return {
      lanes: () => this.#lanes,
      lastSeq: () => this.#lastSeq,
      fail: (err) => this.#fail(err, true),
    };
  }
}
