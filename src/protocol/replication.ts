/**
 * The replication connection to the publisher (`pg` with replication=database):
 * IDENTIFY_SYSTEM, slot lookup and creation, and START_REPLICATION … LOGICAL with
 * pgoutput options, after which the connection is in CopyBoth mode, read off the socket
 * by copyboth.ts. Framing ('w'/'k' in, 'r' out) is in framing.ts and message decoding in
 * decoder.ts.
 */
import type pg from 'pg';
import { redactConninfo, redactSecrets, type ConnInfo } from '../config/conninfo.js';
import { connectPgClient } from '../connect/drivers.js';
import { ConnectionLostError, SourceSetupError } from '../errors.js';
import { quoteIdent, quoteLiteral } from '../quote.js';
import { CopyBothReader, type ReceivedBatch } from './copyboth.js';
import { encodeStandbyStatus } from './framing.js';
import { formatLsn, parseLsn, type Lsn } from './lsn.js';

// pg-copy-streams ships `both` but its type package does not declare it.

export interface SystemIdentity {
  systemId: string;
  timeline: number;
  walPosition: Lsn;
  database: string | null;
}

export interface SlotInfo {
  plugin: string | null;
  slotType: string;
  database: string | null;
  active: boolean;
  /** The walsender holding the slot, if any. */
  activePid: number | null;
  confirmedFlushLsn: Lsn | null;
  /** Prepared transactions are decoded at PREPARE (set by the first START_REPLICATION asking two_phase; PG14+ slots). */
  twoPhase: boolean;
  /** pg_replication_slots.wal_status and safe_wal_size (PG13+; null before), restart_lsn. */
  walStatus: string | null;
  safeWalSize: number | null;
  restartLsn: Lsn | null;
}

export interface StartOptions {
  slotName: string;
  startLsn: Lsn;
  protoVersion: number;
  publications: string[];
  binary?: boolean;
  messages?: boolean;
  streaming?: 'off' | 'on' | 'parallel';
  twoPhase?: boolean;
  origin?: 'any' | 'none';
}

export interface StandbyStatus {
  written: Lsn;
  flushed: Lsn;
  applied: Lsn;
  replyRequested?: boolean;
}

/** A walsender seen from another session (pg_stat_activity). */
export interface WalsenderInfo {
  pid: number;
  applicationName: string | null;
  clientAddr: string | null;
}

/** How long close() waits for the server to end the connection before dropping the socket. */
const CLOSE_TIMEOUT_MS = 2000;

export class ReplicationConnection {
  private constructor(
    private readonly client: pg.Client,
    readonly serverVersionNum: number,
    readonly describe: string,
    /** This connection's walsender (BackendKeyData). */
    readonly backendPid: number,
  ) {}

  static async open(info: ConnInfo, applicationName: string): Promise<ReplicationConnection> {
    // Errors after connect surface through the stream; connectPgClient keeps pg from throwing globally.
    const client = await connectPgClient(info, {
      side: 'source',
      purpose: 'replication',
      what: 'replication connection',
      applicationName,
      startup: { replication: 'database' },
      // As native's walreceiver: pgoutput's text output must not depend on the publisher
      // database's DateStyle/IntervalStyle, and floats must round-trip exactly.
      options: '-c datestyle=ISO -c intervalstyle=postgres -c extra_float_digits=3',
    });
    const version = await client.query<{ server_version_num: string }>('SHOW server_version_num');
    const num = Number(version.rows[0]?.server_version_num);
    return new ReplicationConnection(client, num, redactConninfo(info), (client as unknown as { processID: number }).processID);
  }

  async identifySystem(): Promise<SystemIdentity> {
    const res = await this.client.query<{ systemid: string; timeline: string; xlogpos: string; dbname: string | null }>('IDENTIFY_SYSTEM');
    const row = res.rows[0];
    if (!row) throw new SourceSetupError('IDENTIFY_SYSTEM returned no row');
    return { systemId: row.systemid, timeline: Number(row.timeline), walPosition: parseLsn(row.xlogpos), database: row.dbname };
  }

  /** Simple-query SQL on the walsender (allowed with replication=database; no parameters). */
  async sql<T extends pg.QueryResultRow>(text: string): Promise<T[]> {
    return (await this.client.query<T>(text)).rows;
  }

  async settings(): Promise<{ walLevel: string; walSenderTimeoutMs: number }> {
    const rows = await this.sql<{ name: string; setting: string }>(`SELECT name, setting FROM pg_catalog.pg_settings WHERE name IN ('wal_level', 'wal_sender_timeout')`);
    const get = (name: string) => rows.find((r) => r.name === name)?.setting;
    return { walLevel: get('wal_level') ?? 'unknown', walSenderTimeoutMs: Number(get('wal_sender_timeout') ?? 60000) };
  }

  async getSlot(name: string): Promise<SlotInfo | null> {
    const twoPhase = this.serverVersionNum >= 140000 ? 'two_phase' : 'false AS two_phase';
    const walStatus = this.serverVersionNum >= 130000 ? 'wal_status, safe_wal_size::text' : 'NULL::text AS wal_status, NULL::text AS safe_wal_size';
    const rows = await this.sql<{
      plugin: string | null;
      slot_type: string;
      database: string | null;
      active: boolean;
      active_pid: string | null;
      confirmed_flush_lsn: string | null;
      two_phase: boolean;
      wal_status: string | null;
      safe_wal_size: string | null;
      restart_lsn: string | null;
    }>(
      `SELECT plugin, slot_type, database, active, active_pid, confirmed_flush_lsn::text AS confirmed_flush_lsn, ${twoPhase}, ${walStatus}, restart_lsn::text AS restart_lsn
         FROM pg_catalog.pg_replication_slots WHERE slot_name = ${quoteLiteral(name)}`,
    );
    const row = rows[0];
    if (!row) return null;
    return {
      plugin: row.plugin,
      slotType: row.slot_type,
      database: row.database,
      active: row.active === true || (row.active as unknown) === 't',
      activePid: row.active_pid == null ? null : Number(row.active_pid),
      confirmedFlushLsn: row.confirmed_flush_lsn ? parseLsn(row.confirmed_flush_lsn) : null,
      twoPhase: row.two_phase === true || (row.two_phase as unknown) === 't',
      walStatus: row.wal_status,
      safeWalSize: row.safe_wal_size === null ? null : Number(row.safe_wal_size),
      restartLsn: row.restart_lsn ? parseLsn(row.restart_lsn) : null,
    };
  }

  /** Who another backend is: application_name and client address (null when it is gone). */
  async walsender(pid: number): Promise<WalsenderInfo | null> {
    const rows = await this.sql<{ application_name: string | null; client_addr: string | null }>(
      `SELECT application_name, pg_catalog.host(client_addr) AS client_addr FROM pg_catalog.pg_stat_activity WHERE pid = ${Number(pid)}`,
    );
    const row = rows[0];
    return row ? { pid, applicationName: row.application_name, clientAddr: row.client_addr } : null;
  }

  /** pg_terminate_backend: allowed for a walsender of the same role (our own stale connection). */
  async terminateBackend(pid: number): Promise<boolean> {
    const rows = await this.sql<{ done: boolean | string }>(`SELECT pg_catalog.pg_terminate_backend(${Number(pid)}) AS done`);
    return rows[0]?.done === true || rows[0]?.done === 't';
  }

  /** CREATE_REPLICATION_SLOT … LOGICAL pgoutput; the pre-15 syntax every version 10–18 accepts. */
  async createSlot(name: string): Promise<{ consistentPoint: Lsn }> {
    const res = await this.client.query<{ consistent_point: string }>(`CREATE_REPLICATION_SLOT ${quoteIdent(name)} LOGICAL pgoutput NOEXPORT_SNAPSHOT`);
    const row = res.rows[0];
    if (!row) throw new SourceSetupError(`CREATE_REPLICATION_SLOT ${name} returned no row`);
    return { consistentPoint: parseLsn(row.consistent_point) };
  }

  /**
   * A temporary slot whose only use is its exported snapshot: a view of the database
   * consistent with `consistentPoint`, importable by other sessions (SET TRANSACTION
   * SNAPSHOT) while this connection stays idle. The slot vanishes with the connection.
   */
  async createSnapshotSlot(name: string): Promise<{ consistentPoint: Lsn; snapshotName: string }> {
    const res = await this.client.query<{ consistent_point: string; snapshot_name: string }>(
      `CREATE_REPLICATION_SLOT ${quoteIdent(name)} TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT`,
    );
    const row = res.rows[0];
    if (!row?.snapshot_name) throw new SourceSetupError(`CREATE_REPLICATION_SLOT ${name} exported no snapshot`);
    return { consistentPoint: parseLsn(row.consistent_point), snapshotName: row.snapshot_name };
  }

  /** Enter CopyBoth mode. The returned stream yields one Buffer per CopyData frame. */
  startReplication(opts: StartOptions): ReplicationStream {
    const options: string[] = [`proto_version ${quoteLiteral(String(opts.protoVersion))}`, `publication_names ${quoteLiteral(opts.publications.map(quoteIdent).join(','))}`];
    if (opts.binary) options.push(`binary 'true'`);
    if (opts.messages) options.push(`messages 'true'`);
    if (opts.streaming && opts.streaming !== 'off') options.push(`streaming ${quoteLiteral(opts.streaming)}`);
    if (opts.twoPhase) options.push(`two_phase 'true'`);
    if (opts.origin) options.push(`origin ${quoteLiteral(opts.origin)}`);
    const command = `START_REPLICATION SLOT ${quoteIdent(opts.slotName)} LOGICAL ${formatLsn(opts.startLsn)} (${options.join(', ')})`;
    const reader = new CopyBothReader(command);
    this.client.query(reader);
    return new ReplicationStream(reader, this.client);
  }

  /** End the connection; a peer that does not answer (a silent network) gets the socket dropped. */
  async close(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([this.client.end(), new Promise<void>((resolve) => (timer = setTimeout(resolve, CLOSE_TIMEOUT_MS)))]);
    } catch {
      // Already broken; nothing more to release.
    } finally {
      clearTimeout(timer);
      (this.client as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    }
  }
}

/** CopyBoth in: pgoutput messages and keepalives; out: standby status updates. */
export class ReplicationStream {
  private failure: Error | null = null;

  constructor(
    private readonly reader: CopyBothReader,
    client: pg.Client,
  ) {
    const lost = (why: string) => (err?: Error) => {
      const e = new ConnectionLostError(`replication connection ${why}${err ? `: ${redactSecrets(err.message)}` : ''}`, {}, { cause: err });
      this.failure ??= e;
      reader.destroy(e);
    };
    client.on('error', lost('failed'));
    client.on('end', lost('closed by the publisher'));
  }

  /**
   * What has been received, a socket read at a time: one wake-up per read instead of a
   * promise per frame (a W1-like stream has a frame per row). Ends when the stream ends;
   * throws its error when it fails. Not pulling applies back-pressure down to the socket.
   */
  async *batches(): AsyncGenerator<ReceivedBatch> {
    for (;;) {
      let batch: ReceivedBatch | null;
      try {
        batch = await this.reader.next();
      } catch (err) {
        // The server's own error (e.g. the walsender terminated) as pg reports it: the
        // runner retries it like any SQL error; a lost connection is already ours.
        this.failure ??= err as Error;
        throw this.failure;
      }
      if (batch === null) {
        // The server ended CopyBoth itself: a stop to reconnect after, like a lost connection.
        const end = this.reader.serverEnd;
        if (end === null) return;
        this.failure ??= new ConnectionLostError(
          end === 'command-complete'
            ? 'the publisher ended the replication stream: its walsender stopped (server shutdown or restart)'
            : 'the publisher ended the replication stream (CopyDone)',
          { serverEnd: end },
        );
        throw this.failure;
      }
      yield batch;
    }
  }

  get error(): Error | null {
    return this.failure ?? this.reader.error;
  }

  /** Resolves once the publisher accepted START_REPLICATION (CopyBothResponse); never rejects. */
  get started(): Promise<void> {
    return this.reader.started;
  }

  sendStandbyStatus(status: StandbyStatus): void {
    this.reader.write(
      encodeStandbyStatus({
        written: status.written,
        flushed: status.flushed,
        applied: status.applied,
        clientTime: BigInt(Date.now() - 946_684_800_000) * 1000n,
        replyRequested: status.replyRequested ?? false,
      }),
    );
  }

  destroy(err?: Error): void {
    this.reader.destroy(err);
  }
}
