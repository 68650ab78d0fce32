/**
 * The bind parameters of a statement: each value of a change as the target reads it
 * (NULL, a string in text format, a Buffer in binary format with its embedded OIDs
 * rewritten) and, where a binary value needs one, its Parse type. Every statement builder
 * fills one Params in the order its text numbers the parameters.
 *
 * Binary mode: a tuple may mix binary values (the publisher's typsend output) and text
 * ones (types without a send function); each is bound as it came — a Buffer in binary
 * format, a string in text format — so the target reads it with the type's receive or
 * input function, as native's slot_store_data does per column. The cast stays in the
 * text; what a binary value is read as is its Parse type (mapped-relation.ts BinaryColumns): by
 * default inferred from the cast, the REMOTE type where that differs, so a remote int4
 * read in binary and cast to a target int8 column works (native requires identical types
 * in binary mode). Text values always leave the type to the cast. The Parse types only
 * depend on which columns came in binary, and the wire keys its prepared statements by
 * text and Parse types, so the SQL texts cached per shape (statement-text.ts) are shared
 * by text and binary rows. User-defined type OIDs embedded in arrays and composites are
 * rewritten to the target's (binary.ts) before binding.
 */
import { ApplyError, SchemaMismatchError } from '../../errors.js';
import type { Tuple, TupleValue } from '../../protocol/messages.js';
import { BinaryLayoutError, rewriteOids, textForUnreceivable } from './binary.js';
import type { MappedRelation } from './mapped-relation.js';
import type { WireValue } from '../../pgwire/wire.js';
import type { Statement } from '../../pgwire/statement.js';

/**
 * A binary value as the target's receive function must see it (embedded OIDs rewritten),
 * or its text form where the receive function cannot read it (binary.ts).
 */
export function binaryValue(rel: MappedRelation, value: Buffer, index: number): Buffer | string {
  const text = textForUnreceivable(rel.remote.columns[index]?.typeOid ?? 0, value);
  if (text !== null) return text;
  const plan = rel.binary?.plans?.[index];
  if (!plan) return value;
  try {
    return rewriteOids(value, plan);
  } catch (err) {
    if (!(err instanceof BinaryLayoutError)) throw err;
    const column = rel.remote.columns[index]?.name;
    throw new SchemaMismatchError(
      `binary value of column "${column}" of "${rel.displayName}" does not fit the target's type: ${err.message}`,
      { relation: rel.displayName, column, type: err.typeName },
      { cause: err },
    );
  }
}

/** Bind parameters in order, with their Parse types when a binary value needs one. */
export class Params {
  readonly values: WireValue[] = [];
  #types: number[] | undefined;

  constructor(private readonly rel: MappedRelation) {}

  add(tuple: Tuple, index: number): void {
    const value = valueOf(this.rel, tuple[index], index);
    this.values.push(value);
    const parseType = Buffer.isBuffer(value) ? (this.rel.binary?.parseTypes?.[index] ?? 0) : 0;
    if (parseType !== 0) (this.#types ??= new Array<number>(this.values.length - 1).fill(0)).push(parseType);
    else this.#types?.push(0);
  }

  /** A value pgsub supplies itself (a ctid, an OID), in text format. */
  addText(value: string): void {
    this.values.push(value);
    this.#types?.push(0);
  }

  statement(text: string): Statement {
    return this.#types ? { text, params: this.values, paramTypes: this.#types } : { text, params: this.values };
  }
}

function valueOf(rel: MappedRelation, value: TupleValue | undefined, index: number): WireValue {
  if (value === undefined) {
    throw new ApplyError(`tuple for "${rel.displayName}" has fewer columns than its Relation message`, { relation: rel.displayName });
  }
  switch (value.kind) {
    case 'null':
      return null;
    case 'text':
      return value.value;
    case 'unchanged':
      throw new ApplyError(`unchanged TOAST value where a full value is required, column "${rel.remote.columns[index]?.name}" of "${rel.displayName}"`, {
        relation: rel.displayName,
        column: rel.remote.columns[index]?.name,
      });
    case 'binary':
      return binaryValue(rel, value.value, index);
  }
}
