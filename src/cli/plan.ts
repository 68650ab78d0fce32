/**
 * `pgsub plan`: per published table, the resolved mapping (source → target, where each
 * column goes, renames, excluded and computed columns) and the SQL pgsub runs for insert,
 * update, delete, truncate and the initial copy, from the real builders
 * (mapping/plan.ts). Exit 0 when every table's plan is valid, 2 when one is not.
 * Read-only on both sides.
 */
import type { Config } from '../config/config.js';
import { buildPlan, formatPlan } from '../mapping/plan.js';

export async function printPlan(config: Config, json: boolean): Promise<number> {
  const plan = await buildPlan(config, { onlyMapped: false, withSql: true });
  process.stdout.write(json ? `${JSON.stringify(plan, null, 2)}\n` : formatPlan(plan));
  return plan.tables.some((t) => t.problems.length > 0) ? 2 : 0;
}
