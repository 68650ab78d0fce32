/**
 * The apply's settings, built once per session from the config (applyOptions) and passed
 * whole to the loop, its lanes, its parallel worker and the handlers (ApplySession.options):
 * one spelling per setting from the YAML key to the hot path, the Config field's name, and
 * no copy of a field under another name on the way down.
 */
import type { ConflictConfig } from '../conflict/types.js';
import type { Config } from './config.js';

export interface ApplyOptions {
  readonly subscription: string;
  /** pgoutput's binary option: values as the types' send/recv forms. */
  readonly binary: boolean;
  readonly streaming: Config['streaming'];
  /** 'off': apply transactions commit asynchronously, feedback follows the target's WAL flush. */
  readonly synchronousCommit: Config['synchronousCommit'];
  /** Feedback spacing: the config's status_interval, within a third of the publisher's wal_sender_timeout. */
  readonly statusIntervalMs: number;
  readonly receiveTimeoutMs: number;
  /** Statements in flight on one target connection (pgwire/pipeline.ts). */
  readonly maxInFlight: number;
  /** Items between the stream reader and the applier (run/queue.ts). */
  readonly queueSize: number;
  /** Most source transactions per target transaction while behind (1: one each). */
  readonly groupTransactions: number;
  /** Target connections applying independent transactions while behind (run/lanes.ts); 1: none. */
  readonly applyWorkers: number;
  /** Most rows per multi-row INSERT (1: one statement per row). */
  readonly batchRows: number;
  /** Batched INSERTs as COPY … FROM STDIN where the values allow it (sql/copy-rows.ts). */
  readonly copyInserts: boolean;
  readonly conflicts: ConflictConfig;
}

/** What the publisher says that shapes the options: its wal_sender_timeout (0: none). */
export interface PublisherTimeouts {
  walSenderTimeoutMs: number;
}

export function applyOptions(config: Config, publisher: PublisherTimeouts): ApplyOptions {
  const { walSenderTimeoutMs } = publisher;
  return Object.freeze({
    subscription: config.subscription,
    binary: config.binary,
    streaming: config.streaming,
    synchronousCommit: config.synchronousCommit,
    // The walsender drops a subscriber silent for wal_sender_timeout, even one that is
    // busy applying (not reading keepalives): report well within it.
    statusIntervalMs: walSenderTimeoutMs > 0 ? Math.min(config.statusIntervalMs, Math.floor(walSenderTimeoutMs / 3)) : config.statusIntervalMs,
    receiveTimeoutMs: config.receiveTimeoutMs,
    maxInFlight: config.maxInFlight,
    queueSize: config.queueSize,
    groupTransactions: config.groupTransactions,
    applyWorkers: config.applyWorkers,
    batchRows: config.batchRows,
    copyInserts: config.copyInserts,
    conflicts: config.conflicts,
  });
}
