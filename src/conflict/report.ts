/**
 * What a detected conflict leaves behind in the target: one pgsub.conflict_log row and
 * one increment of its confl_* counter, as a single statement that rides in the apply
 * transaction resolving the conflict. Both commit with the change and the origin row or
 * vanish with them, so a transaction re-applied after a crash logs and counts once.
 * Tuples are JSON built on the client from what the publisher sent (column name → text
 * form; with binary = true the common built-in types are turned into theirs here, others
 * stay \x hex; unchanged TOAST values as null with the column listed in `detail`); the local row is the target's own to_jsonb of it. Errors under the
 * `error` policy are recorded on the maintenance connection instead (control.ts),
 * because their apply transaction never commits.
 */
import { formatLsn, type Lsn } from '../protocol/lsn.js';
import { formatPgTimestamp, schemaOf, type Tuple } from '../protocol/messages.js';
import type { RelationMessage } from '../protocol/messages.js';
import type { Statement } from '../pgwire/statement.js';
import { quoteIdent } from '../quote.js';
import { counterColumn, type ConflictType, type Policy } from './types.js';

/** What a conflict record says of the relation: the publisher's description of it, and its name for logs. */
export interface ConflictRelation {
  remote: RelationMessage;
  displayName: string;
}

export interface ConflictRecord {
  type: ConflictType | 'transaction_skipped';
  relation: ConflictRelation | null;
  key: Record<string, string | null> | null;
  remoteTuple: Record<string, string | null> | null;
  /** JSON text as the target rendered it (to_jsonb), or null. */
  localTuple: string | null;
  localOrigin: string | null;
  localCommitTs: string | null;
  remoteLsn: Lsn;
  remoteXid: number;
  remoteCommitTime: bigint | null;
  policy: Policy;
  detail: string | null;
}

/** Column name → text form of the sent value; `indexes` limits it (a key). */
export function tupleJson(rel: ConflictRelation, tuple: Tuple | undefined, indexes?: readonly number[]): Record<string, string | null> | null {
  if (!tuple) return null;
  const out: Record<string, string | null> = {};
  for (const i of indexes ?? tuple.map((_, k) => k)) {
    const v = tuple[i];
    const name = rel.remote.columns[i]?.name ?? `#${i}`;
    if (!v || v.kind === 'null' || v.kind === 'unchanged') out[name] = null;
    else if (v.kind === 'text') out[name] = v.value;
    else out[name] = binaryValueText(rel.remote.columns[i]?.typeOid, v.value);
  }
  return out;
}

/**
 * The text PostgreSQL prints for a binary-format value (binary = true) of a built-in type
 * that keys are mostly made of, so the log reads as in text mode; any other type, or a
 * value of an unexpected length, as `\x` and its bytes in hex. Built-in OIDs are the same
 * on every server.
 */
export function binaryValueText(typeOid: number | undefined, value: Buffer): string {
  const n = value.length;
  switch (typeOid) {
    case 16: // bool
      if (n === 1) return value[0] ? 't' : 'f';
      break;
    case 21: // int2
      if (n === 2) return String(value.readInt16BE(0));
      break;
    case 23: // int4
      if (n === 4) return String(value.readInt32BE(0));
      break;
    case 20: // int8
      if (n === 8) return value.readBigInt64BE(0).toString();
      break;
    case 26: // oid
      if (n === 4) return String(value.readUInt32BE(0));
      break;
    case 19: // name
    case 25: // text
    case 1042: // bpchar
    case 1043: // varchar
      // Sent in the replication connection's client encoding, UTF8.
      return value.toString('utf8');
    case 2950: // uuid
      if (n === 16) {
        const h = value.toString('hex');
        return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
      }
      break;
  }
  return `\\x${value.toString('hex')}`;
}

export function unchangedColumns(rel: ConflictRelation, tuple: Tuple | undefined): string[] {
  return (tuple ?? []).flatMap((v, i) => (v.kind === 'unchanged' ? [rel.remote.columns[i]?.name ?? `#${i}`] : []));
}

const LOG_COLUMNS =
  '"subscription", "conflict_type", "relation", "schema_name", "table_name", "key", "remote_tuple", "local_tuple", ' +
  '"local_origin", "local_commit_ts", "remote_lsn", "remote_xid", "remote_commit_ts", "policy", "detail"';
const LOG_VALUES =
  '$1, $2, $3, $4, $5, $6::pg_catalog.jsonb, $7::pg_catalog.jsonb, $8::pg_catalog.jsonb, $9, $10::pg_catalog.timestamptz, $11::pg_catalog.pg_lsn, $12::pg_catalog.int8, $13::pg_catalog.timestamptz, $14, $15';

function logParams(subscription: string, r: ConflictRecord): (string | null)[] {
  const schema = r.relation ? schemaOf(r.relation.remote) : null;
  return [
    subscription,
    r.type,
    r.relation?.displayName ?? null,
    schema,
    r.relation?.remote.name ?? null,
    r.key ? JSON.stringify(r.key) : null,
    r.remoteTuple ? JSON.stringify(r.remoteTuple) : null,
    r.localTuple,
    r.localOrigin,
    r.localCommitTs,
    formatLsn(r.remoteLsn),
    String(r.remoteXid),
    r.remoteCommitTime === null ? null : formatPgTimestamp(r.remoteCommitTime),
    r.policy,
    r.detail,
  ];
}

/** The log row and the counter, one statement (for the apply transaction). */
export function conflictLogStatement(subscription: string, r: ConflictRecord): Statement {
  const params = logParams(subscription, r);
  if (r.type === 'transaction_skipped') {
    return { text: `INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) VALUES (${LOG_VALUES})`, params };
  }
  const counter = quoteIdent(counterColumn(r.type));
  return {
    text:
      `WITH l AS (INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) VALUES (${LOG_VALUES})) ` +
      `INSERT INTO "pgsub"."subscription_stats" AS s ("subscription", ${counter}) VALUES ($1, 1) ` +
      `ON CONFLICT ("subscription") DO UPDATE SET ${counter} = s.${counter} + 1`,
    params,
  };
}

export { logParams, LOG_COLUMNS, LOG_VALUES };
