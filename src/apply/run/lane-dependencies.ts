/**
 * The group a change routed to an apply lane must wait for (lanes.ts), worked out per
 * relation: a change of a resolved, unmapped relation by its row identities (`Writers`,
 * lane-keys.ts); a mapped relation, one whose target lookup failed and a TRUNCATE by whole
 * target table. The leader calls it alone, in stream order, and resolves a relation first
 * seen on the main connection, which is idle while lanes run.
 */
import type { RelationMessage } from '../../protocol/messages.js';
import { peekRelationId } from '../../protocol/peek.js';
import type { ApplyState } from '../txn/apply-state.js';
import { Writers } from './lane-keys.js';

export class LaneDependencies {
  readonly #writers = new Writers();
  /** Relations whose target lookup failed: every change waits for all before. */
  #unresolvable = new Set<number>();
  readonly #targetKeys = new Map<string, number>();

  constructor(private readonly main: ApplyState) {}

  /**
   * The group a row change must wait for (0: none), recording this group as its rows'
   * last writer. A promise only the first time a relation is seen (its target lookup).
   */
  dependency(seq: number, raw: Buffer): number | Promise<number> {
    const relationId = peekRelationId(raw);
    const mapped = this.main.relations.cached(relationId);
    if (mapped === undefined) {
      if (this.#unresolvable.has(relationId)) return this.#writers.wholeTable(seq, relationId);
      return this.resolve(relationId).then(() => this.dependency(seq, raw));
    }
    let remote: RelationMessage;
    try {
      remote = this.main.relations.remoteRelation(relationId);
    } catch {
      return seq - 1; // the lane reports the missing Relation message
    }
    // A mapped relation may share its target table with other source relations (many-to-one):
    // its changes are ordered against every change to that table, whatever their row keys.
    if (mapped.rule) return this.#writers.wholeTable(seq, this.#tableKey(relationId));
    return this.#writers.record(seq, raw, remote, mapped.ordered, this.#tableKey(relationId));
  }

  /** Whether a relation's target table is still to be looked up (neither resolved nor failed). */
  unknown(relationId: number): boolean {
    return this.main.relations.cached(relationId) === undefined && !this.#unresolvable.has(relationId);
  }

  /** A TRUNCATE of `relationIds` by group `seq`: it waits for every group before, and later changes to those tables wait for it. */
  wholeTables(seq: number, relationIds: readonly number[]): void {
    for (const id of relationIds) this.#writers.wholeTable(seq, this.#tableKey(id));
  }

  /** A new Relation message: its target table is looked up again. */
  relationChanged(relationId: number): void {
    this.#unresolvable.delete(relationId);
  }

  /**
   * The key of a relation's target table for whole-table writes: the relation id for an
   * unmapped relation, one number per target table (above every OID) for a mapped one, so
   * that source relations mapped into one table wait for each other.
   */
  #tableKey(relationId: number): number {
    const mapped = this.main.relations.cached(relationId);
    // Unmapped: the target table is the source's, one relation id each.
    if (mapped?.rule === undefined) return relationId;
    let key = this.#targetKeys.get(mapped.qualifiedName);
    if (key === undefined) this.#targetKeys.set(mapped.qualifiedName, (key = 2 ** 32 + this.#targetKeys.size));
    return key;
  }

  /** The target table of a relation first seen; the main connection is idle while lanes run. */
  async resolve(relationId: number): Promise<void> {
    try {
      await this.main.relations.resolve(this.main.conn, relationId);
    } catch {
      // The lane reports what is wrong with the table; until then its changes wait for all before.
      this.#unresolvable.add(relationId);
    }
  }
}
