/**
 * One relation as the relation map resolved it (relmap.ts, logicalrep_rel_open) and as
 * the statement builders, COPY rows and handlers read it: the publisher's Relation
 * message, the target table it is applied to, the target column receiving each remote
 * column, how binary values are bound, the mapping rule and reshape, and the SQL texts
 * built for it (filled by statement-text.ts).
 */
import type { OidPlan } from './binary.js';
import type { RelationMessage } from '../../protocol/messages.js';
import type { TableRule } from '../../mapping/rules.js';
import type { Reshape, TargetColumn } from '../../mapping/columns.js';
import type { DriftOutcome } from '../../mapping/drift.js';

export type { DriftOutcome } from '../../mapping/drift.js';

export type { TargetColumn } from '../../mapping/columns.js';

export interface MappedRelation {
  remote: RelationMessage;
  /** Schema-qualified, quoted target name. */
  qualifiedName: string;
  /** For messages and logs: schema.table as the publisher named it. */
  displayName: string;
  /** 'r' plain table, 'p' partitioned table (rows are routed to and found in its partitions). */
  relkind: 'r' | 'p';
  /** Per remote column index, the target column receiving it. */
  targetColumns: TargetColumn[];
  /** Remote column indexes of the replica identity key. */
  keyIndexes: number[];
  /**
   * The target table (or a partition of it) has triggers or rules that fire in replica
   * mode (ENABLE ALWAYS / ENABLE REPLICA): they may observe the order of changes, so its
   * changes are never batched or reordered (batch.ts). Read when the relation is mapped.
   */
  ordered: boolean;
  /** Row-level security is enabled on the target table (COPY FROM refuses it; INSERT applies the policies). */
  rowSecurity: boolean;
  /** Built SQL texts by shape (see statement-text.ts), cached for the relation's lifetime. */
  statements: Map<string, string>;
  /** Per built text, the remote column index of each parameter number (error messages name the column). */
  paramColumns: Map<string, number[]>;
  /** How binary values are bound, per remote column index; absent: as they are, types inferred from the casts. */
  binary?: BinaryColumns;
  /** The mapping rule of the source table (config mapping:); absent: none applies. */
  rule?: TableRule;
  /** Excluded or computed columns: statements are built from this (mapping/columns.ts); absent: the plain builders. */
  reshape?: Reshape;
  /** Mapped relations: what schema drift changed in the rule (plan-checks.ts). */
  drift?: DriftOutcome;
}

export interface BinaryColumns {
  /**
   * Parse type of a binary value: the target OID of the remote column's type where it
   * differs from the target column's type (the cast then converts, e.g. int4 → int8);
   * 0 where the cast alone gives the right type. Null when every entry would be 0.
   * Text values always leave their parameter's type to the cast (the target type's
   * input function reads them, as native's slot_store_data).
   */
  parseTypes: readonly number[] | null;
  /** OID rewrite plan per column (binary.ts); null when no column has one. */
  plans: readonly (OidPlan | null)[] | null;
}
