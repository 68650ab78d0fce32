/**
 * The quick verification of a cutover (step 6): every published table counted on both
 * sides once the source is fenced and the target has applied up to the fence, so the two
 * counts are of the same moment and must be equal. A table the target lacks counts as a
 * difference. The full online verify (checksums by key range) is a separate command; this
 * is the check that costs one sequential scan per table and side.
 */
import { quoteQualified } from '../quote.js';
import type { Db, Row } from './db.js';
import { relName, type Rel } from './objects.js';

export interface TableCount {
  table: string;
  source: number;
  /** null: the table cannot be read on the target. */
  target: number | null;
  equal: boolean;
}

async function count(db: Db, rel: Rel): Promise<number> {
  const [r] = await db.query<Row>(`SELECT count(*)::text AS n FROM ${quoteQualified(rel.schema, rel.table)}`);
  return Number(r!.n);
}

/** Row counts of each table on both sides, read side by side. */
export async function countRows(source: Db, target: Db, rels: readonly Rel[]): Promise<TableCount[]> {
  const out: TableCount[] = [];
  for (const rel of rels) {
    const [s, t] = await Promise.all([count(source, rel), count(target, rel).catch(() => null)]);
    out.push({ table: relName(rel), source: s, target: t, equal: s === t });
  }
  return out;
}
