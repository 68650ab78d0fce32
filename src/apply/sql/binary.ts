/**
 * Binary-mode values whose format embeds type OIDs. pgoutput sends a column in binary with
 * the publisher's typsend (proto.c logicalrep_write_tuple: binary requested and the type
 * has a send function, else text — decided per column, PostgreSQL 14–18 alike); pgsub
 * hands the bytes to the target as a binary bind parameter, where the type's receive
 * function reads them. Two formats carry OIDs of the sending cluster:
 *
 *   array_send   int32 ndim, int32 hasnull, oid elemtype, ndim × (int32 dim, int32 lbound),
 *                then per element int32 length (-1 = NULL) + element bytes
 *   record_send  int32 ncolumns (non-dropped), then per column oid atttypid,
 *                int32 length (-1 = NULL) + field bytes
 *
 * and ranges (uint8 flags, then each present bound as int32 length + bytes) and
 * multiranges (int32 count, then int32 length + range_send bytes each) nest them. Built-in
 * OIDs (below FirstGenbkiObjectId, 10000) are the same in every cluster; user-defined ones
 * (enums, composites, domains) are not, and PostgreSQL 12/13's array_recv/record_recv
 * reject a mismatch ("wrong element type", "wrong data type: 16390, expected 16402";
 * 14+ complain only when both OIDs are built-in, and otherwise read the value as the type
 * they expect). So before sending, the OIDs of user-defined types are rewritten to the
 * target's, following the target type's structure (an OidPlan, built from catalog rows
 * relmap.ts fetches once per relation).
 *
 * Rewriting is conservative: an embedded OID is replaced only when the target expects a
 * user-defined type there and the value names a user-defined type too. A built-in OID
 * where another built-in one is expected is a real type mismatch and is left for the
 * server to report. A composite whose field count differs from the target's is a
 * BinaryLayoutError (params.ts names the table and column); bytes that do not parse
 * as the expected layout are passed through unchanged, and the server's receive function
 * has the last word. These are pure functions over Buffers; the input is never modified.
 */

import { SchemaMismatchError } from '../../errors.js';

/** OIDs below this are assigned by genbki and identical in every cluster of a major and across majors. */
export const FIRST_GENBKI_OID = 10000;

/** What the relation map fetches about a target type (type-catalog.ts targetTypes: pg_type, pg_attribute, pg_range). */
export interface TargetTypeInfo {
  oid: number;
  /** pg_type.typtype: b base, c composite, d domain, e enum, r range, m multirange, p pseudo. */
  typtype: string;
  /** Element type of a true array (array_send format), else 0. */
  elem: number;
  /** Base type of a domain, else 0. */
  base: number;
  /** Composite: the types of its non-dropped attributes in attnum order. */
  fields: readonly number[];
  /** Range: subtype; multirange: its range type; else 0. */
  inner: number;
  /** For messages: schema-qualified name. */
  name: string;
}

/** How to walk one type's binary format to the OIDs it embeds; null: there is nothing to rewrite. */
export type OidPlan =
  | { readonly kind: 'array'; readonly elemOid: number; readonly elem: OidPlan | null }
  | { readonly kind: 'record'; readonly typeName: string; readonly fields: readonly { readonly oid: number; readonly plan: OidPlan | null }[] }
  | { readonly kind: 'range'; readonly bound: OidPlan }
  | { readonly kind: 'multirange'; readonly range: OidPlan };

/**
 * The OidPlan of target type `oid`: null when its binary format embeds no user-defined
 * type OID at any depth (every built-in type, enums, base types, and arrays/composites of
 * built-in types only). Unknown types (absent from `types`) have no plan.
 */
export function oidPlan(oid: number, types: ReadonlyMap<number, TargetTypeInfo>, visiting: Set<number> = new Set()): OidPlan | null {
  const t = types.get(oid);
  if (!t || visiting.has(oid)) return null;
  visiting.add(oid);
  try {
    if (t.typtype === 'd') return oidPlan(t.base, types, visiting);
    if (t.elem !== 0) {
      const elem = oidPlan(t.elem, types, visiting);
      return elem || t.elem >= FIRST_GENBKI_OID ? { kind: 'array', elemOid: t.elem, elem } : null;
    }
    if (t.typtype === 'c') {
      const fields = t.fields.map((f) => ({ oid: f, plan: oidPlan(f, types, visiting) }));
      // The field count is checked even when no OID needs rewriting: a user-defined composite
      // may differ between the clusters, and a count mismatch is worth naming the column for.
      return oid >= FIRST_GENBKI_OID || fields.some((f) => f.plan || f.oid >= FIRST_GENBKI_OID) ? { kind: 'record', typeName: t.name, fields } : null;
    }
    if (t.typtype === 'r') {
      const bound = oidPlan(t.inner, types, visiting);
      return bound ? { kind: 'range', bound } : null;
    }
    if (t.typtype === 'm') {
      const range = oidPlan(t.inner, types, visiting);
      return range ? { kind: 'multirange', range } : null;
    }
    return null;
  } finally {
    visiting.delete(oid);
  }
}

export const TSQUERY_OID = 3615;

/**
 * The text form of a binary value that its type's own receive function cannot read back,
 * or null. The empty tsquery: tsquerysend writes it as a zero item count and tsqueryrecv
 * rejects that with "malformed tsquery: operand not found" (PostgreSQL 10–18; native
 * binary replication and binary COPY fail on it). Only for a top-level value: inside an
 * array or composite it still fails.
 */
export function textForUnreceivable(typeOid: number, value: Buffer): string | null {
  if (typeOid === TSQUERY_OID && value.length === 4 && value.readUInt32BE(0) === 0) return '';
  return null;
}

/**
 * A binary value cannot be read as the target type (a composite's field count differs):
 * the type differs between publisher and target. params.ts adds table and column.
 */
export class BinaryLayoutError extends SchemaMismatchError {
  constructor(
    message: string,
    readonly typeName: string,
  ) {
    super(message, { type: typeName });
  }
}

/** The bytes do not parse as the planned layout: leave them to the server's receive function. */
class Unparseable {
  static readonly instance = new Unparseable();
}

/** Positions (byte offset → target OID) to patch. */
type Patches = [offset: number, oid: number][];

function i32(buf: Buffer, at: number, end: number): number {
  if (at + 4 > end) throw Unparseable.instance;
  return buf.readInt32BE(at);
}

function patchOid(buf: Buffer, at: number, end: number, expected: number, patches: Patches): void {
  if (at + 4 > end) throw Unparseable.instance;
  const sent = buf.readUInt32BE(at);
  if (sent !== expected && expected >= FIRST_GENBKI_OID && sent >= FIRST_GENBKI_OID) patches.push([at, expected]);
}

/** Walk the value in buf[start, end) by `plan`, collecting patches. */
function walk(buf: Buffer, start: number, end: number, plan: OidPlan, patches: Patches): void {
  switch (plan.kind) {
    case 'array': {
      const ndim = i32(buf, start, end);
      if (ndim < 0 || ndim > 6) throw Unparseable.instance; // MAXDIM
      patchOid(buf, start + 8, end, plan.elemOid, patches);
      let at = start + 12;
      let items = ndim === 0 ? 0 : 1;
      for (let d = 0; d < ndim; d++, at += 8) {
        const dim = i32(buf, at, end);
        if (dim < 0) throw Unparseable.instance;
        items *= dim;
      }
      for (let k = 0; k < items; k++) at = element(buf, at, end, plan.elem, patches);
      return;
    }
    case 'record': {
      const n = i32(buf, start, end);
      if (n !== plan.fields.length) {
        throw new BinaryLayoutError(`the composite value has ${n} field${n === 1 ? '' : 's'}, target type ${plan.typeName} has ${plan.fields.length}`, plan.typeName);
      }
      let at = start + 4;
      for (const field of plan.fields) {
        patchOid(buf, at, end, field.oid, patches);
        at = element(buf, at + 4, end, field.plan, patches);
      }
      return;
    }
    case 'range': {
      if (start + 1 > end) throw Unparseable.instance;
      const flags = buf[start]!;
      let at = start + 1;
      // RANGE_EMPTY 0x01, RANGE_LB_INF 0x08, RANGE_UB_INF 0x10, RANGE_LB_NULL 0x20, RANGE_UB_NULL 0x40
      if (!(flags & (0x01 | 0x20 | 0x08))) at = element(buf, at, end, plan.bound, patches);
      if (!(flags & (0x01 | 0x40 | 0x10))) element(buf, at, end, plan.bound, patches);
      return;
    }
    case 'multirange': {
      const n = i32(buf, start, end);
      if (n < 0) throw Unparseable.instance;
      let at = start + 4;
      for (let k = 0; k < n; k++) at = element(buf, at, end, plan.range, patches);
      return;
    }
  }
}

/** One length-prefixed item at `at` (-1 = NULL); returns the offset after it. */
function element(buf: Buffer, at: number, end: number, plan: OidPlan | null, patches: Patches): number {
  const len = i32(buf, at, end);
  if (len === -1) return at + 4;
  if (len < 0 || at + 4 + len > end) throw Unparseable.instance;
  if (plan) walk(buf, at + 4, at + 4 + len, plan, patches);
  return at + 4 + len;
}

/**
 * `value` (the publisher's send output) with the user-defined type OIDs it embeds replaced
 * by the target's, as `plan` lays them out. Returns `value` itself when nothing changes or
 * when the bytes do not match the plan's layout; a copy otherwise. Throws
 * BinaryLayoutError when a composite's field count differs from the target type's.
 */
export function rewriteOids(value: Buffer, plan: OidPlan): Buffer {
  const patches: Patches = [];
  try {
    walk(value, 0, value.length, plan, patches);
  } catch (err) {
    if (err instanceof Unparseable) return value;
    throw err;
  }
  if (patches.length === 0) return value;
  const out = Buffer.from(value);
  for (const [at, oid] of patches) out.writeUInt32BE(oid, at);
  return out;
}
