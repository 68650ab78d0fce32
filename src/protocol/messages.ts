/**
 * The pgoutput messages, protocol versions 1–4, as a discriminated union on `tag`.
 * Field names follow the "Logical Replication Message Formats" documentation page and
 * proto.c. Timestamps are microseconds since 2000-01-01 (PostgreSQL's epoch) as bigint;
 * use `pgTimestampToDate` to show them. Transaction ids are unsigned 32-bit numbers.
 * `xid` on a change/relation/type/message is present only inside a streamed block
 * (between Stream Start and Stream Stop), where pgoutput prefixes it.
 */
import type { Lsn } from './lsn.js';

/** One column value of a TupleData: null, unchanged TOAST, text, or binary. */
export type TupleValue = { kind: 'null' } | { kind: 'unchanged' } | { kind: 'text'; value: string } | { kind: 'binary'; value: Buffer };

export type Tuple = TupleValue[];

export interface RelationColumn {
  /** Part of the replica identity key (flags & 1). */
  isKey: boolean;
  name: string;
  typeOid: number;
  typeModifier: number;
}

/** Replica identity setting as pgoutput sends it: relreplident. */
export type ReplicaIdentity = 'default' | 'nothing' | 'full' | 'index';

export interface BeginMessage {
  tag: 'begin';
  finalLsn: Lsn;
  commitTime: bigint;
  xid: number;
}
export interface CommitMessage {
  tag: 'commit';
  flags: number;
  commitLsn: Lsn;
  endLsn: Lsn;
  commitTime: bigint;
}
export interface OriginMessage {
  tag: 'origin';
  originLsn: Lsn;
  originName: string;
}
export interface RelationMessage {
  tag: 'relation';
  xid?: number;
  relationId: number;
  /** Empty string means pg_catalog, as on the wire; resolvers must map it. */
  namespace: string;
  name: string;
  replicaIdentity: ReplicaIdentity;
  columns: RelationColumn[];
}
/** The schema a Relation or Type message names: pgoutput sends pg_catalog as an empty namespace. */
export function schemaOf(message: { namespace: string }): string {
  return message.namespace === '' ? 'pg_catalog' : message.namespace;
}

export interface TypeMessage {
  tag: 'type';
  xid?: number;
  typeOid: number;
  namespace: string;
  name: string;
}
export interface InsertMessage {
  tag: 'insert';
  xid?: number;
  relationId: number;
  newTuple: Tuple;
}
export interface UpdateMessage {
  tag: 'update';
  xid?: number;
  relationId: number;
  /** 'key' (K: identity columns only) or 'old' (O: REPLICA IDENTITY FULL) old tuple, when sent. */
  oldKind?: 'key' | 'old';
  oldTuple?: Tuple;
  newTuple: Tuple;
}
export interface DeleteMessage {
  tag: 'delete';
  xid?: number;
  relationId: number;
  oldKind: 'key' | 'old';
  oldTuple: Tuple;
}
export interface TruncateMessage {
  tag: 'truncate';
  xid?: number;
  cascade: boolean;
  restartIdentity: boolean;
  relationIds: number[];
}
export interface LogicalMessage {
  tag: 'message';
  xid?: number;
  transactional: boolean;
  lsn: Lsn;
  prefix: string;
  content: Buffer;
}
export interface StreamStartMessage {
  tag: 'streamStart';
  xid: number;
  firstSegment: boolean;
}
export interface StreamStopMessage {
  tag: 'streamStop';
}
export interface StreamCommitMessage {
  tag: 'streamCommit';
  xid: number;
  flags: number;
  commitLsn: Lsn;
  endLsn: Lsn;
  commitTime: bigint;
}
export interface StreamAbortMessage {
  tag: 'streamAbort';
  xid: number;
  subXid: number;
  /** Protocol 4 with streaming = parallel only. */
  abortLsn?: Lsn;
  abortTime?: bigint;
}
export interface BeginPrepareMessage {
  tag: 'beginPrepare';
  prepareLsn: Lsn;
  endLsn: Lsn;
  prepareTime: bigint;
  xid: number;
  gid: string;
}
export interface PrepareMessage {
  tag: 'prepare';
  flags: number;
  prepareLsn: Lsn;
  endLsn: Lsn;
  prepareTime: bigint;
  xid: number;
  gid: string;
}
export interface CommitPreparedMessage {
  tag: 'commitPrepared';
  flags: number;
  commitLsn: Lsn;
  endLsn: Lsn;
  commitTime: bigint;
  xid: number;
  gid: string;
}
export interface RollbackPreparedMessage {
  tag: 'rollbackPrepared';
  flags: number;
  prepareEndLsn: Lsn;
  rollbackEndLsn: Lsn;
  prepareTime: bigint;
  rollbackTime: bigint;
  xid: number;
  gid: string;
}
export interface StreamPrepareMessage {
  tag: 'streamPrepare';
  flags: number;
  prepareLsn: Lsn;
  endLsn: Lsn;
  prepareTime: bigint;
  xid: number;
  gid: string;
}

export type PgOutputMessage =
  | BeginMessage
  | CommitMessage
  | OriginMessage
  | RelationMessage
  | TypeMessage
  | InsertMessage
  | UpdateMessage
  | DeleteMessage
  | TruncateMessage
  | LogicalMessage
  | StreamStartMessage
  | StreamStopMessage
  | StreamCommitMessage
  | StreamAbortMessage
  | BeginPrepareMessage
  | PrepareMessage
  | CommitPreparedMessage
  | RollbackPreparedMessage
  | StreamPrepareMessage;

export type MessageTag = PgOutputMessage['tag'];

/** What the decoder must know that the bytes alone do not say. */
export interface DecodeContext {
  /** Inside Stream Start … Stream Stop: changes carry an xid prefix. */
  inStream: boolean;
  /** Stream Abort carries abort LSN and time (protocol 4, streaming = parallel). */
  streamAbortInfo?: boolean;
}

/** PostgreSQL timestamps count microseconds from 2000-01-01 00:00:00 UTC. */
export const PG_EPOCH_MS = 946_684_800_000;

export function pgTimestampToDate(micros: bigint): Date {
  return new Date(PG_EPOCH_MS + Number(micros / 1000n));
}

export function dateToPgTimestamp(date: Date | number): bigint {
  const ms = typeof date === 'number' ? date : date.getTime();
  return BigInt(ms - PG_EPOCH_MS) * 1000n;
}

/** ISO 8601 text of a PostgreSQL timestamp with its full microsecond precision. */
export function formatPgTimestamp(micros: bigint): string {
  const ms = micros / 1000n;
  let rest = micros % 1000n;
  let date = new Date(PG_EPOCH_MS + Number(ms));
  if (rest < 0n) {
    rest += 1000n;
    date = new Date(date.getTime() - 1);
  }
  return date.toISOString().replace('Z', `${rest.toString().padStart(3, '0')}Z`);
}
