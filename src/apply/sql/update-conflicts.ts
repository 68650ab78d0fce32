/**
 * The UPDATE that resolves its own conflicts under the default policies on a PostgreSQL
 * 18 target (update_origin_differs: apply_remote; update_missing: skip): when it applies,
 * the parameters that name the subscription, the relation and the remote transaction,
 * and the text that logs and counts the conflict in the same statement. update.ts builds
 * the statement around it and marks it (resolvesConflicts).
 */
import { formatPgTimestamp, schemaOf } from '../../protocol/messages.js';
import { formatLsn } from '../../protocol/lsn.js';
import { LOG_COLUMNS } from '../../conflict/report.js';
import { counterColumn, type ConflictType } from '../../conflict/types.js';
import { quoteIdent } from '../../quote.js';
import type { MappedRelation } from './mapped-relation.js';
import type { Params } from './params.js';
import { param } from './statement-text.js';
import type { Detect, RemoteRef } from './detecting.js';

/** In-line resolution applies: detection with origins on PostgreSQL 18, apply_remote for this table, a plain relation whose key columns are all set. */
export function inlinesOriginDiffers(rel: MappedRelation, detect: Detect, setIndexes: number[]): boolean {
  if (detect.originId === null || !detect.returningOld || !detect.inlineOriginDiffers || detect.subscription === undefined || rel.reshape) return false;
  // The relation's recent conflicts first: for a table nobody else writes that answers at once (a per-row check).
  return detect.inlineOriginDiffers(rel) && rel.keyIndexes.length > 0 && rel.keyIndexes.every((i) => setIndexes.includes(i));
}

/** Names as the conflict rows show them (JSON arrays, bound as values): every column, the key's. */
const INLINE_NAMES = new WeakMap<MappedRelation, { all: string; key: string }>();

export function addInlineParams(params: Params, rel: MappedRelation, subscription: string, remote: RemoteRef): void {
  let names = INLINE_NAMES.get(rel);
  if (!names) {
    const columnName = (i: number) => rel.remote.columns[i]?.name ?? `#${i}`;
    names = { all: JSON.stringify(rel.remote.columns.map((_, i) => columnName(i))), key: JSON.stringify(rel.keyIndexes.map(columnName)) };
    INLINE_NAMES.set(rel, names);
  }
  params.addText(subscription);
  params.addText(rel.displayName);
  params.addText(schemaOf(rel.remote));
  params.addText(rel.remote.name);
  params.addText(names.all);
  params.addText(names.key);
  params.addText(formatLsn(remote.finalLsn));
  params.addText(String(remote.xid));
  params.addText(formatPgTimestamp(remote.commitTime));
}

/**
 * An UPDATE that applies the remote change whoever wrote the row last, and when that was
 * another origin writes the conflict's log row and counter in the same statement — the
 * careful path's apply_remote for update_origin_differs without rolling back: a target
 * with local writers, where such conflicts come every other transaction, keeps the
 * pipelined pace. A missing row is logged the same way where its policy is skip, and
 * raises otherwise (the careful path resolves it). The result has one row per conflict
 * logged, naming it ('update_origin_differs' or 'update_missing'). The JSON of the sent
 * values is built from the bound parameters, in SQL, only for a row that is logged.
 */
export function updateLoggingConflicts(rel: MappedRelation, plain: string, setIndexes: number[], first: number, detect: Detect): string {
  // Keep in step with the text's cache key (updateStatement's inlineShape).
  const $ = (k: number) => `$${first + k}`;
  const sentText = (i: number) => {
    const n = setIndexes.indexOf(i);
    return n < 0 ? 'NULL' : `(${param(rel, i, n + 1)})::pg_catalog.text`;
  };
  const json = (names: string, indexes: number[]) =>
    `(SELECT pg_catalog.jsonb_object_agg(n.name, v.value) FROM pg_catalog.jsonb_array_elements_text(${names}::pg_catalog.jsonb) WITH ORDINALITY AS n(name, i) ` +
    `JOIN pg_catalog.unnest(ARRAY[${indexes.map(sentText).join(', ')}]::pg_catalog.text[]) WITH ORDINALITY AS v(value, i) USING (i))`;
  const remoteRef = `${$(6)}::pg_catalog.pg_lsn, ${$(7)}::pg_catalog.int8, ${$(8)}::pg_catalog.timestamptz`;
  const tuples = `${json($(5), rel.keyIndexes)}, ${json(
    $(4),
    rel.remote.columns.map((_, i) => i),
  )}`;
  const logRow = (type: ConflictType) => `${$(0)}, '${type}', ${$(1)}, ${$(2)}, ${$(3)}, ${tuples}`;
  const origin = '(pg_catalog.pg_xact_commit_timestamp_origin(pgsub_old.xmin))';
  const differs = quoteIdent(counterColumn('update_origin_differs'));
  const missing = quoteIdent(counterColumn('update_missing'));
  const logsMissing = detect.inlineMissing?.(rel) === true;
  return (
    `WITH pgsub_changed AS (${plain} RETURNING WITH (OLD AS pgsub_old) ${origin}.roident AS r, ${origin}.timestamp AS ts, pg_catalog.to_jsonb(pgsub_old.*) AS j), ` +
    `pgsub_differs AS (INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) ` +
    `SELECT ${logRow('update_origin_differs')}, j, r::pg_catalog.text, ts, ${remoteRef}, 'apply_remote', 'row last written by origin ' || r || ' at ' || ts ` +
    `FROM pgsub_changed WHERE r <> ${detect.originId} RETURNING 'update_origin_differs'::pg_catalog.text AS c), ` +
    (logsMissing
      ? `pgsub_missing AS (INSERT INTO "pgsub"."conflict_log" (${LOG_COLUMNS}) SELECT ${logRow('update_missing')}, NULL, NULL, NULL, ${remoteRef}, 'skip', NULL ` +
        `WHERE NOT EXISTS (SELECT FROM pgsub_changed) RETURNING 'update_missing'::pg_catalog.text AS c), `
      : '') +
    `pgsub_logged AS (SELECT c FROM pgsub_differs${logsMissing ? ' UNION ALL SELECT c FROM pgsub_missing' : ''}), ` +
    `pgsub_counted AS (INSERT INTO "pgsub"."subscription_stats" AS s ("subscription", ${differs}, ${missing}) ` +
    `SELECT ${$(0)}, pg_catalog.count(*) FILTER (WHERE c = 'update_origin_differs'), pg_catalog.count(*) FILTER (WHERE c = 'update_missing') FROM pgsub_logged HAVING pg_catalog.count(*) > 0 ` +
    `ON CONFLICT ("subscription") DO UPDATE SET ${differs} = s.${differs} + EXCLUDED.${differs}, ${missing} = s.${missing} + EXCLUDED.${missing}) ` +
    (logsMissing ? '' : `SELECT "pgsub"."conflict"('update_missing')::pg_catalog.text WHERE NOT EXISTS (SELECT FROM pgsub_changed) UNION ALL `) +
    'SELECT c FROM pgsub_logged'
  );
}
