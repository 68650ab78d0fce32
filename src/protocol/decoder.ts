/**
 * pgoutput decoder: one message's bytes → one `PgOutputMessage`. Pure and synchronous.
 *
 * Owns: the byte layout of every pgoutput message of protocol versions 1–4 (PostgreSQL's
 * src/backend/replication/logical/proto.c and the "Logical Replication Message Formats" page),
 * and the validations proto.c's readers perform, so a malformed message is rejected here, with
 * a typed ProtocolError, before anything is applied:
 *  - flags bytes that proto.c requires to be 0 (Commit, Stream Commit, Prepare, Commit Prepared,
 *    Rollback Prepared, Stream Prepare) → PGSUB_PROTOCOL_BAD_FIELD;
 *  - LSNs proto.c requires to be set (Begin final_lsn, the prepare family's LSNs) and the
 *    prepare family's xid → BAD_FIELD;
 *  - Update: optional 'K'/'O' old tuple then a required 'N'; Delete: 'K' or 'O'; Insert: 'N';
 *  - tuple column kinds n/u/t/b only; replica identity d/n/f/i only (stricter than proto.c);
 *  - negative counts and lengths → BAD_FIELD; counts larger than the remaining bytes could hold
 *    → TRUNCATED *before* any loop or allocation (a forged count of 65535 fails in O(1));
 *  - every message must be consumed exactly (TRAILING_BYTES otherwise); unknown tag →
 *    UNKNOWN_MESSAGE naming the byte in hex.
 *
 * What the bytes alone do not say comes from `DecodeContext`: whether we are inside a
 * Stream Start … Stream Stop block (then Relation/Type/Insert/Update/Delete/Truncate/Message
 * carry a leading xid) and whether Stream Abort carries abort_lsn/abort_time (protocol 4 with
 * streaming = parallel). Tracking that state is the dispatcher's job, not this module's.
 *
 * Output ownership: text values are JS strings (UTF-8 decoded); binary values and logical
 * message contents are *copies*, so the caller may reuse the input buffer after decode()
 * returns. Null/unchanged column values are shared frozen objects (do not mutate them).
 *
 * CopyBoth framing ('w'/'k' in, 'r' out) lives in framing.ts; dispatch in src/apply/.
 */
import { ProtocolError } from '../errors.js';
import type { Lsn } from './lsn.js';
import type {
  BeginMessage,
  BeginPrepareMessage,
  CommitMessage,
  CommitPreparedMessage,
  DecodeContext,
  DeleteMessage,
  InsertMessage,
  LogicalMessage,
  OriginMessage,
  PgOutputMessage,
  PrepareMessage,
  RelationColumn,
  RelationMessage,
  ReplicaIdentity,
  RollbackPreparedMessage,
  StreamAbortMessage,
  StreamCommitMessage,
  StreamPrepareMessage,
  StreamStartMessage,
  StreamStopMessage,
  Tuple,
  TupleValue,
  TruncateMessage,
  TypeMessage,
  UpdateMessage,
} from './messages.js';
import { Reader } from './reader.js';

const NULL_VALUE: TupleValue = Object.freeze({ kind: 'null' }) as TupleValue;
const UNCHANGED_VALUE: TupleValue = Object.freeze({ kind: 'unchanged' }) as TupleValue;

// Smallest encodings, used to reject counts the remaining bytes cannot possibly hold.
const MIN_TUPLE_COLUMN_BYTES = 1; // kind byte ('n' / 'u')
const MIN_RELATION_COLUMN_BYTES = 1 + 1 + 4 + 4; // flags, "" name, type oid, typmod
const RELID_BYTES = 4;

function badField(what: string, detail: string, offset: number): never {
  throw new ProtocolError('PGSUB_PROTOCOL_BAD_FIELD', `${what}: ${detail}`, { field: what, offset });
}

function hex(byte: number): string {
  return `0x${byte.toString(16).padStart(2, '0')}`;
}

function printable(byte: number): string {
  return byte >= 0x20 && byte < 0x7f ? ` '${String.fromCharCode(byte)}'` : '';
}

function zeroFlags(r: Reader, what: string): number {
  const at = r.offset;
  const flags = r.u8(what);
  if (flags !== 0) badField(what, `unrecognized flags ${flags}, expected 0`, at);
  return flags;
}

function setLsn(r: Reader, what: string): Lsn {
  const at = r.offset;
  const v = r.lsn(what);
  if (v === 0n) badField(what, 'LSN not set (0/0)', at);
  return v;
}

/**
 * A column or relation count. Read signed: proto.c reads column counts as uint16, but no relation
 * can have more than MaxTupleAttributeNumber (1664) columns, so 0x8000–0xFFFF can only be damage.
 */
function count(r: Reader, what: string, width: 2 | 4): number {
  const at = r.offset;
  const n = width === 2 ? r.i16(what) : r.i32(what);
  if (n < 0) badField(what, `negative count ${n}`, at);
  return n;
}

function length(r: Reader, what: string): number {
  const at = r.offset;
  const n = r.i32(what);
  if (n < 0) badField(what, `negative length ${n}`, at);
  return n;
}

function replicaIdentity(r: Reader): ReplicaIdentity {
  const at = r.offset;
  const b = r.u8('RELATION replica identity');
  switch (b) {
    case 0x64 /* d */:
      return 'default';
    case 0x6e /* n */:
      return 'nothing';
    case 0x66 /* f */:
      return 'full';
    case 0x69 /* i */:
      return 'index';
    default:
      return badField('RELATION replica identity', `unknown setting ${hex(b)}${printable(b)}`, at);
  }
}

function readColumns(r: Reader): RelationColumn[] {
  const n = count(r, 'RELATION column count', 2);
  r.need(n, MIN_RELATION_COLUMN_BYTES, 'RELATION columns');
  const cols: RelationColumn[] = new Array<RelationColumn>(n);
  for (let i = 0; i < n; i++) {
    const flags = r.u8('RELATION column flags');
    const name = r.cstring('RELATION column name');
    const typeOid = r.u32('RELATION column type oid');
    const typeModifier = r.i32('RELATION column type modifier');
    cols[i] = { isKey: (flags & 1) !== 0, name, typeOid, typeModifier };
  }
  return cols;
}

/** Field names for one TupleData position, built once so the hot loop does not format strings. */
interface TupleLabels {
  count: string;
  columns: string;
  kind: string;
  textLength: string;
  text: string;
  binaryLength: string;
  binary: string;
}

function tupleLabels(what: string): TupleLabels {
  return {
    count: `${what} column count`,
    columns: `${what} columns`,
    kind: `${what} column kind`,
    textLength: `${what} text length`,
    text: `${what} text value`,
    binaryLength: `${what} binary length`,
    binary: `${what} binary value`,
  };
}

const INSERT_NEW = tupleLabels('INSERT new tuple');
const UPDATE_OLD = tupleLabels('UPDATE old tuple');
const UPDATE_NEW = tupleLabels('UPDATE new tuple');
const DELETE_OLD = tupleLabels('DELETE old tuple');

function readTuple(r: Reader, l: TupleLabels): Tuple {
  const n = count(r, l.count, 2);
  r.need(n, MIN_TUPLE_COLUMN_BYTES, l.columns);
  const tuple: Tuple = new Array<TupleValue>(n);
  for (let i = 0; i < n; i++) {
    const kind = r.u8(l.kind);
    switch (kind) {
      case 0x6e /* n */:
        tuple[i] = NULL_VALUE;
        break;
      case 0x75 /* u */:
        tuple[i] = UNCHANGED_VALUE;
        break;
      case 0x74 /* t */:
        {
          const len = length(r, l.textLength);
          tuple[i] = { kind: 'text', value: r.utf8(len, l.text) };
          break;
        }
      case 0x62 /* b */:
        {
          const len = length(r, l.binaryLength);
          // A view into the message, not a copy (a copy per value cost ~10% of the apply's
          // CPU): the frame's memory is held as long as the value, which is until its
          // batch is sent, and nothing writes into it (binary.ts copies before rewriting).
          tuple[i] = { kind: 'binary', value: r.bytes(len, l.binary) };
          break;
        }
      default:
        badField(l.kind, `unrecognized data representation ${hex(kind)}${printable(kind)} in column ${i}`, r.offset - 1);
    }
  }
  return tuple;
}

type PrepareLabels = ReturnType<typeof prepareLabels>;

function prepareLabels(message: string) {
  return {
    message,
    flags: `${message} flags`,
    prepareLsn: `${message} prepare_lsn`,
    endLsn: `${message} end_lsn`,
    prepareTime: `${message} prepare_time`,
    xid: `${message} xid`,
    gid: `${message} gid`,
  };
}

const PREPARE = prepareLabels('PREPARE');
const STREAM_PREPARE = prepareLabels('STREAM PREPARE');

/**
 * Decode one pgoutput message. Throws ProtocolError (and only ProtocolError) on bad input.
 * One small function per message, as pg-protocol's Parser does: each reads its fields in wire
 * order and builds its object literal with one fixed property order, so every kind keeps one shape.
 */
export function decode(buf: Buffer, ctx: DecodeContext): PgOutputMessage {
  const r = new Reader(buf);
  const tag = r.u8('message tag');
  switch (tag) {
    case 0x42 /* B */:
      return decodeBegin(r);
    case 0x43 /* C */:
      return decodeCommit(r);
    case 0x4f /* O */:
      return decodeOrigin(r);
    case 0x52 /* R */:
      return decodeRelation(r, ctx.inStream);
    case 0x59 /* Y */:
      return decodeType(r, ctx.inStream);
    case 0x49 /* I */:
      return decodeInsert(r, ctx.inStream);
    case 0x55 /* U */:
      return decodeUpdate(r, ctx.inStream);
    case 0x44 /* D */:
      return decodeDelete(r, ctx.inStream);
    case 0x54 /* T */:
      return decodeTruncate(r, ctx.inStream);
    case 0x4d /* M */:
      return decodeLogicalMessage(r, ctx.inStream);
    case 0x53 /* S */:
      return decodeStreamStart(r);
    case 0x45 /* E */:
      return decodeStreamStop(r);
    case 0x63 /* c */:
      return decodeStreamCommit(r);
    case 0x41 /* A */:
      return decodeStreamAbort(r, ctx.streamAbortInfo === true);
    case 0x62 /* b */:
      return decodeBeginPrepare(r);
    case 0x50 /* P */:
      return decodePrepare(r, 'prepare', PREPARE);
    case 0x70 /* p */:
      return decodePrepare(r, 'streamPrepare', STREAM_PREPARE);
    case 0x4b /* K */:
      return decodeCommitPrepared(r);
    case 0x72 /* r */:
      return decodeRollbackPrepared(r);
    default:
      throw new ProtocolError('PGSUB_PROTOCOL_UNKNOWN_MESSAGE', `unknown pgoutput message tag ${hex(tag)}${printable(tag)}`, { tag: hex(tag) });
  }
}

function decodeBegin(r: Reader): BeginMessage {
  const finalLsn = setLsn(r, 'BEGIN final_lsn');
  const commitTime = r.i64('BEGIN commit_time');
  const xid = r.u32('BEGIN xid');
  r.end('BEGIN');
  return { tag: 'begin', finalLsn, commitTime, xid };
}

function decodeCommit(r: Reader): CommitMessage {
  const flags = zeroFlags(r, 'COMMIT flags');
  const commitLsn = r.lsn('COMMIT commit_lsn');
  const endLsn = r.lsn('COMMIT end_lsn');
  const commitTime = r.i64('COMMIT commit_time');
  r.end('COMMIT');
  return { tag: 'commit', flags, commitLsn, endLsn, commitTime };
}

function decodeOrigin(r: Reader): OriginMessage {
  const originLsn = r.lsn('ORIGIN origin_lsn');
  const originName = r.cstring('ORIGIN name');
  r.end('ORIGIN');
  return { tag: 'origin', originLsn, originName };
}

// Inside a stream block the xid leads; without one the message has no xid property at all
// (not `xid: undefined`), hence the two literals in each change decoder.
function decodeRelation(r: Reader, inStream: boolean): RelationMessage {
  const xid = inStream ? r.u32('RELATION xid') : undefined;
  const relationId = r.u32('RELATION relation id');
  const namespace = r.cstring('RELATION namespace');
  const name = r.cstring('RELATION name');
  const replicaIdent = replicaIdentity(r);
  const columns = readColumns(r);
  r.end('RELATION');
  return xid === undefined
    ? { tag: 'relation', relationId, namespace, name, replicaIdentity: replicaIdent, columns }
    : { tag: 'relation', xid, relationId, namespace, name, replicaIdentity: replicaIdent, columns };
}

function decodeType(r: Reader, inStream: boolean): TypeMessage {
  const xid = inStream ? r.u32('TYPE xid') : undefined;
  const typeOid = r.u32('TYPE type oid');
  const namespace = r.cstring('TYPE namespace');
  const name = r.cstring('TYPE name');
  r.end('TYPE');
  return xid === undefined ? { tag: 'type', typeOid, namespace, name } : { tag: 'type', xid, typeOid, namespace, name };
}

function decodeInsert(r: Reader, inStream: boolean): InsertMessage {
  const xid = inStream ? r.u32('INSERT xid') : undefined;
  const relationId = r.u32('INSERT relation id');
  const at = r.offset;
  const marker = r.u8('INSERT tuple marker');
  if (marker !== 0x4e /* N */) badField('INSERT tuple marker', `expected 'N', got ${hex(marker)}${printable(marker)}`, at);
  const newTuple = readTuple(r, INSERT_NEW);
  r.end('INSERT');
  return xid === undefined ? { tag: 'insert', relationId, newTuple } : { tag: 'insert', xid, relationId, newTuple };
}

function decodeUpdate(r: Reader, inStream: boolean): UpdateMessage {
  const xid = inStream ? r.u32('UPDATE xid') : undefined;
  const relationId = r.u32('UPDATE relation id');
  let at = r.offset;
  let marker = r.u8('UPDATE tuple marker');
  let oldKind: 'key' | 'old' | undefined;
  let oldTuple: Tuple | undefined;
  if (marker === 0x4b /* K */ || marker === 0x4f /* O */) {
    oldKind = marker === 0x4b ? 'key' : 'old';
    oldTuple = readTuple(r, UPDATE_OLD);
    at = r.offset;
    marker = r.u8('UPDATE new tuple marker');
    if (marker !== 0x4e) badField('UPDATE new tuple marker', `expected 'N', got ${hex(marker)}${printable(marker)}`, at);
  } else if (marker !== 0x4e /* N */) {
    badField('UPDATE tuple marker', `expected 'K', 'O' or 'N', got ${hex(marker)}${printable(marker)}`, at);
  }
  const newTuple = readTuple(r, UPDATE_NEW);
  r.end('UPDATE');
  if (oldKind === undefined) {
    return xid === undefined ? { tag: 'update', relationId, newTuple } : { tag: 'update', xid, relationId, newTuple };
  }
  return xid === undefined ? { tag: 'update', relationId, oldKind, oldTuple: oldTuple!, newTuple } : { tag: 'update', xid, relationId, oldKind, oldTuple: oldTuple!, newTuple };
}

function decodeDelete(r: Reader, inStream: boolean): DeleteMessage {
  const xid = inStream ? r.u32('DELETE xid') : undefined;
  const relationId = r.u32('DELETE relation id');
  const at = r.offset;
  const marker = r.u8('DELETE tuple marker');
  if (marker !== 0x4b /* K */ && marker !== 0x4f /* O */) {
    badField('DELETE tuple marker', `expected 'K' or 'O', got ${hex(marker)}${printable(marker)}`, at);
  }
  const oldKind = marker === 0x4b ? 'key' : 'old';
  const oldTuple = readTuple(r, DELETE_OLD);
  r.end('DELETE');
  return xid === undefined ? { tag: 'delete', relationId, oldKind, oldTuple } : { tag: 'delete', xid, relationId, oldKind, oldTuple };
}

function decodeTruncate(r: Reader, inStream: boolean): TruncateMessage {
  const xid = inStream ? r.u32('TRUNCATE xid') : undefined;
  const n = count(r, 'TRUNCATE relation count', 4);
  const options = r.u8('TRUNCATE options');
  r.need(n, RELID_BYTES, 'TRUNCATE relation ids');
  const relationIds = new Array<number>(n);
  for (let i = 0; i < n; i++) relationIds[i] = r.u32('TRUNCATE relation id');
  r.end('TRUNCATE');
  const cascade = (options & 1) !== 0;
  const restartIdentity = (options & 2) !== 0;
  return xid === undefined ? { tag: 'truncate', cascade, restartIdentity, relationIds } : { tag: 'truncate', xid, cascade, restartIdentity, relationIds };
}

function decodeLogicalMessage(r: Reader, inStream: boolean): LogicalMessage {
  const xid = inStream ? r.u32('MESSAGE xid') : undefined;
  const flags = r.u8('MESSAGE flags');
  const lsn = r.lsn('MESSAGE lsn');
  const prefix = r.cstring('MESSAGE prefix');
  const len = length(r, 'MESSAGE content length');
  const content = r.copy(len, 'MESSAGE content');
  r.end('MESSAGE');
  const transactional = (flags & 1) !== 0;
  return xid === undefined ? { tag: 'message', transactional, lsn, prefix, content } : { tag: 'message', xid, transactional, lsn, prefix, content };
}

function decodeStreamStart(r: Reader): StreamStartMessage {
  const xid = r.u32('STREAM START xid');
  const firstSegment = r.u8('STREAM START first_segment') === 1;
  r.end('STREAM START');
  return { tag: 'streamStart', xid, firstSegment };
}

function decodeStreamStop(r: Reader): StreamStopMessage {
  r.end('STREAM STOP');
  return { tag: 'streamStop' };
}

function decodeStreamCommit(r: Reader): StreamCommitMessage {
  const xid = r.u32('STREAM COMMIT xid');
  const flags = zeroFlags(r, 'STREAM COMMIT flags');
  const commitLsn = r.lsn('STREAM COMMIT commit_lsn');
  const endLsn = r.lsn('STREAM COMMIT end_lsn');
  const commitTime = r.i64('STREAM COMMIT commit_time');
  r.end('STREAM COMMIT');
  return { tag: 'streamCommit', xid, flags, commitLsn, endLsn, commitTime };
}

/** `withInfo`: protocol 4 with streaming = parallel, where the abort LSN and time follow. */
function decodeStreamAbort(r: Reader, withInfo: boolean): StreamAbortMessage {
  const xid = r.u32('STREAM ABORT xid');
  const subXid = r.u32('STREAM ABORT subxid');
  if (withInfo) {
    const abortLsn = r.lsn('STREAM ABORT abort_lsn');
    const abortTime = r.i64('STREAM ABORT abort_time');
    r.end('STREAM ABORT');
    return { tag: 'streamAbort', xid, subXid, abortLsn, abortTime };
  }
  r.end('STREAM ABORT');
  return { tag: 'streamAbort', xid, subXid };
}

function decodeBeginPrepare(r: Reader): BeginPrepareMessage {
  const prepareLsn = setLsn(r, 'BEGIN PREPARE prepare_lsn');
  const endLsn = setLsn(r, 'BEGIN PREPARE end_lsn');
  const prepareTime = r.i64('BEGIN PREPARE prepare_time');
  const xid = r.u32('BEGIN PREPARE xid');
  const gid = r.cstring('BEGIN PREPARE gid');
  r.end('BEGIN PREPARE');
  return { tag: 'beginPrepare', prepareLsn, endLsn, prepareTime, xid, gid };
}

/** proto.c: logicalrep_read_prepare_common, shared by PREPARE and STREAM PREPARE. */
function decodePrepare(r: Reader, tag: 'prepare' | 'streamPrepare', l: PrepareLabels): PrepareMessage | StreamPrepareMessage {
  const flags = zeroFlags(r, l.flags);
  const prepareLsn = setLsn(r, l.prepareLsn);
  const endLsn = setLsn(r, l.endLsn);
  const prepareTime = r.i64(l.prepareTime);
  const at = r.offset;
  const xid = r.u32(l.xid);
  if (xid === 0) badField(l.xid, 'invalid two-phase transaction id 0', at);
  const gid = r.cstring(l.gid);
  r.end(l.message);
  return { tag, flags, prepareLsn, endLsn, prepareTime, xid, gid };
}

function decodeCommitPrepared(r: Reader): CommitPreparedMessage {
  const flags = zeroFlags(r, 'COMMIT PREPARED flags');
  const commitLsn = setLsn(r, 'COMMIT PREPARED commit_lsn');
  const endLsn = setLsn(r, 'COMMIT PREPARED end_lsn');
  const commitTime = r.i64('COMMIT PREPARED commit_time');
  const xid = r.u32('COMMIT PREPARED xid');
  const gid = r.cstring('COMMIT PREPARED gid');
  r.end('COMMIT PREPARED');
  return { tag: 'commitPrepared', flags, commitLsn, endLsn, commitTime, xid, gid };
}

function decodeRollbackPrepared(r: Reader): RollbackPreparedMessage {
  const flags = zeroFlags(r, 'ROLLBACK PREPARED flags');
  const prepareEndLsn = setLsn(r, 'ROLLBACK PREPARED prepare_end_lsn');
  const rollbackEndLsn = setLsn(r, 'ROLLBACK PREPARED rollback_end_lsn');
  const prepareTime = r.i64('ROLLBACK PREPARED prepare_time');
  const rollbackTime = r.i64('ROLLBACK PREPARED rollback_time');
  const xid = r.u32('ROLLBACK PREPARED xid');
  const gid = r.cstring('ROLLBACK PREPARED gid');
  r.end('ROLLBACK PREPARED');
  return { tag: 'rollbackPrepared', flags, prepareEndLsn, rollbackEndLsn, prepareTime, rollbackTime, xid, gid };
}
