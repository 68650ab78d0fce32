/**
 * What a target error was about, as worker.c's apply_error_callback says it: the relation,
 * the column at fault, the change kind. The target names a bad parameter ("portal
 * parameter $3", from a type's input function or the encoding conversion) or a COPY line
 * and column; the statement's text, which the wire attaches to its error, leads back to
 * the relation and to the column each parameter carries (statement-text.ts records that when
 * it builds a text). Runs only on the error path.
 */
import type { RelationMap } from './relmap.js';

export interface FailureContext {
  relation?: string;
  column?: string;
  command?: string;
}

interface TargetError {
  message?: string;
  statementText?: string;
  statementParams?: readonly (string | Buffer | null)[];
  where?: string;
  schema?: string;
  table?: string;
  column?: string;
  context?: Record<string, unknown>;
}

const COMMAND = /^(?:WITH pgsub_changed AS \()?(INSERT|UPDATE|DELETE|COPY|TRUNCATE)\b/;

/** The error's context completed with what the failing statement tells (never overwriting what it has). */
export function annotateTargetError(err: unknown, relations: RelationMap): void {
  if (typeof err !== 'object' || err === null) return;
  const e = err as TargetError;
  if (e.statementText === undefined) return;
  const found = describe(e, relations);
  if (Object.keys(found).length === 0) return;
  e.context = { ...found, ...(e.context ?? {}) };
}

function describe(e: TargetError, relations: RelationMap): FailureContext {
  const text = e.statementText!;
  const out: FailureContext = {};
  const command = COMMAND.exec(text)?.[1];
  if (command) out.command = command;
  const rel = relations.byStatement(text);
  if (rel) out.relation = rel.displayName;
  else if (e.table) out.relation = e.schema ? `${e.schema}.${e.table}` : e.table;
  if (e.column) {
    out.column = e.column;
    return out;
  }
  const where = e.where ?? '';
  const copyColumn = /^COPY [^,]+, line \d+, column ([^:]+):/.exec(where)?.[1];
  if (copyColumn) out.column = copyColumn;
  const n = /parameter \$(\d+)/.exec(where)?.[1];
  const param = n !== undefined ? Number(n) : valueParam(e);
  const index = param === undefined || !rel ? undefined : rel.paramColumns.get(text)?.[param];
  if (index !== undefined) out.column = rel!.remote.columns[index]?.name ?? rel!.targetColumns[index]?.name;
  return out;
}

/**
 * An input function's error inside the statement (a value cast from an array of texts,
 * update-rows.ts) quotes the value but names no parameter: the first parameter holding it.
 */
function valueParam(e: TargetError): number | undefined {
  const quoted = /: "(.*)"$/.exec(e.message ?? '')?.[1];
  if (quoted === undefined || quoted === '' || !e.statementParams) return undefined;
  const bytes = Buffer.from(quoted, 'utf8');
  const at = e.statementParams.findIndex((v) => (typeof v === 'string' ? v === quoted : v?.includes(bytes)));
  return at < 0 ? undefined : at + 1;
}
