/**
 * A SQL statement for the target: its text and its values, always bound as parameters,
 * never spliced into the text. The one shape every module hands the pipelined client
 * (wire.ts) — statement builders (apply/sql), the origin and sync-state rows, control rows.
 */
import type { WireValue } from './wire-ops.js';

export interface Statement {
  text: string;
  /** A string is bound in text format, a Buffer in binary format, null as NULL. */
  params: readonly WireValue[];
  /** Parse types per parameter (0: from the cast), present only when a binary value needs one. */
  paramTypes?: number[];
  /** Its rows are read (otherwise only the command tag and row count come back). */
  wantRows?: boolean;
}
