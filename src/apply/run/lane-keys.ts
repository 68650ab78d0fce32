/**
 * Which earlier group of transactions a change must wait for, for apply lanes (lanes.ts,
 * lane-dependencies.ts): two transactions may be applied in parallel only if no row
 * identity of one is one of the other's. A change's identities (its replica identity key hashed with the relation
 * id, read from the raw bytes by protocol/peek.ts changeKeys) are looked up in `Writers`,
 * which keeps, per identity, the last group that wrote it: the group a change waits for.
 * A hash collision only makes a transaction wait when it need not, never the reverse.
 */
import type { RelationMessage } from '../../protocol/messages.js';
import { changeKeys, keyColumns, peekRelationId } from '../../protocol/peek.js';

/**
 * Slots of the row-writer table (a power of two). Far more than the row identities of
 * the groups in flight (a few lanes × a group's changes), so two rarely share a slot.
 */
const WRITER_SLOTS = 1 << 20;

/**
 * The last writer (group number, increasing) of every row identity, and of tables whose
 * changes had none. Lossy on purpose: rows sharing a slot share the latest writer, which
 * is at least the true one, and groups commit in order — so a shared slot can only make a
 * change wait longer, never less. No keys are stored: one array read and write per row.
 */
export class Writers {
  readonly #rows = new Int32Array(WRITER_SLOTS);
  /** Relation id → the last group with a change to it that had no row identity. */
  readonly #tables = new Map<number, number>();
  readonly #keyColumns = new WeakMap<RelationMessage, number[]>();
  readonly #keys = [0, 0];

  /**
   * The group the change in `raw` by group `seq` must wait for (0: none; seq - 1: all
   * before it), recording `seq` as the writer of what it touches. `ordered`: the target
   * table has triggers that would see the order of its rows. `table`: the target table's
   * key for whole-table writes (lane-dependencies.ts tableKey; several source relations may share one).
   */
  record(seq: number, raw: Buffer, remote: RelationMessage, ordered: boolean, table: number = peekRelationId(raw)): number {
    let count = -1;
    if (!ordered) {
      let columns = this.#keyColumns.get(remote);
      if (columns === undefined) this.#keyColumns.set(remote, (columns = keyColumns(remote)));
      count = changeKeys(raw, remote, columns, this.#keys);
    }
    if (count < 0) return this.wholeTable(seq, table);
    const tableWriter = this.#tables.get(table);
    let waitFor = tableWriter !== undefined && tableWriter !== seq ? tableWriter : 0;
    const rows = this.#rows;
    for (let i = 0; i < count; i++) {
      const slot = this.#keys[i]! & (WRITER_SLOTS - 1);
      const writer = rows[slot]!;
      if (writer !== seq && writer > waitFor) waitFor = writer;
      rows[slot] = seq;
    }
    return waitFor;
  }

  /** A change to a whole table (TRUNCATE, or rows without identity): waits for every group before; later changes to the table wait for it. */
  wholeTable(seq: number, table: number): number {
    this.#tables.set(table, seq);
    return seq - 1;
  }
}
