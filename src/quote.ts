/**
 * Quoting for SQL text built from remote names. Every identifier that comes from the
 * publisher or the config is quoted with quoteIdent (`"a""b"`); values go as bind
 * parameters, and quoteLiteral is only for the replication protocol's commands and the
 * walsender's simple-query SQL, which take no parameters.
 */
export function quoteIdent(name: string): string {
  if (name.includes('\0')) throw new RangeError('identifier contains a NUL byte');
  return `"${name.replace(/"/g, '""')}"`;
}

export function quoteQualified(schema: string, name: string): string {
  return `${quoteIdent(schema)}.${quoteIdent(name)}`;
}

/** A standard-conforming string literal; E'' is avoided so backslashes stay literal. */
export function quoteLiteral(value: string): string {
  if (value.includes('\0')) throw new RangeError('literal contains a NUL byte');
  return `'${value.replace(/'/g, "''")}'`;
}
