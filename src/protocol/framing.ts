/**
 * CopyBoth replication sub-protocol framing: the payloads of CopyData messages exchanged after
 * START_REPLICATION (PostgreSQL docs, "Streaming Replication Protocol"). Pure functions.
 *
 * In (server → client):
 *   'w' XLogData            Int64 walStart, Int64 walEnd, Int64 sendTime, Byten data
 *   'k' Primary keepalive   Int64 walEnd, Int64 sendTime, Byte1 replyRequested
 * Out (client → server):
 *   'r' Standby status      Int64 written, Int64 flushed, Int64 applied, Int64 clientTime,
 *                           Byte1 replyRequested                              (34 bytes total)
 *
 * Times are microseconds since 2000-01-01 (see messages.ts for conversions).
 *
 * `data` of an XLogData frame is a *view* (subarray) into the frame buffer, not a copy: it holds
 * one pgoutput message, which the caller normally hands straight to decode() (whose binary
 * tuple values are views into it too). Copy it yourself if you keep it after the frame buffer is reused.
 *
 * Unknown frame tags and short frames are ProtocolErrors; the socket loop that reads CopyData
 * and decides when to send feedback lives in src/apply/ and knows nothing about byte offsets.
 */
import { ProtocolError } from '../errors.js';
import type { Lsn } from './lsn.js';
import { Reader } from './reader.js';

export interface XLogDataFrame {
  kind: 'xlogData';
  walStart: Lsn;
  walEnd: Lsn;
  sendTime: bigint;
  /** View into the frame buffer (no copy). */
  data: Buffer;
}

export interface KeepaliveFrame {
  kind: 'keepalive';
  walEnd: Lsn;
  sendTime: bigint;
  replyRequested: boolean;
}

export type ReplicationFrame = XLogDataFrame | KeepaliveFrame;

export interface StandbyStatus {
  written: Lsn;
  flushed: Lsn;
  applied: Lsn;
  /** Microseconds since 2000-01-01. */
  clientTime: bigint;
  replyRequested?: boolean;
}

/** Size of a Standby Status Update ('r') message. */
export const STANDBY_STATUS_SIZE = 34;

export function parseReplicationFrame(buf: Buffer): ReplicationFrame {
  const r = new Reader(buf);
  const tag = r.u8('replication frame tag');
  switch (tag) {
    case 0x77 /* w */:
      {
        const walStart = r.lsn('XLogData walStart');
        const walEnd = r.lsn('XLogData walEnd');
        const sendTime = r.i64('XLogData sendTime');
        const data = r.bytes(r.remaining(), 'XLogData data');
        return { kind: 'xlogData', walStart, walEnd, sendTime, data };
      }
    case 0x6b /* k */:
      {
        const walEnd = r.lsn('keepalive walEnd');
        const sendTime = r.i64('keepalive sendTime');
        const replyRequested = r.u8('keepalive replyRequested') !== 0;
        r.end('keepalive');
        return { kind: 'keepalive', walEnd, sendTime, replyRequested };
      }
    default:
      throw new ProtocolError('PGSUB_PROTOCOL_UNKNOWN_MESSAGE', `unknown replication frame tag 0x${tag.toString(16).padStart(2, '0')}`, {
        tag: `0x${tag.toString(16).padStart(2, '0')}`,
      });
  }
}

export function encodeStandbyStatus(s: StandbyStatus): Buffer {
  const out = Buffer.allocUnsafe(STANDBY_STATUS_SIZE);
  out[0] = 0x72; /* r */
  out.writeBigUInt64BE(s.written, 1);
  out.writeBigUInt64BE(s.flushed, 9);
  out.writeBigUInt64BE(s.applied, 17);
  out.writeBigInt64BE(s.clientTime, 25);
  out[33] = s.replyRequested === true ? 1 : 0;
  return out;
}
