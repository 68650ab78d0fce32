/**
 * LSNs (WAL positions) as branded bigints, end to end. PostgreSQL prints them as two
 * 32-bit hex halves ("16/B374D848"); we parse and print that form at the edges only.
 */
export type Lsn = bigint & { readonly __lsn: true };

export const ZERO_LSN = 0n as Lsn;

export function asLsn(value: bigint): Lsn {
  if (value < 0n || value > 0xffff_ffff_ffff_ffffn) throw new RangeError(`LSN out of range: ${value}`);
  return value as Lsn;
}

export function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffff_ffffn).toString(16).toUpperCase()}`;
}

const LSN_TEXT = /^([0-9A-Fa-f]{1,8})\/([0-9A-Fa-f]{1,8})$/;

export function parseLsn(text: string): Lsn {
  const m = LSN_TEXT.exec(text.trim());
  if (!m) throw new RangeError(`not an LSN: ${JSON.stringify(text)}`);
  return ((BigInt(`0x${m[1]}`) << 32n) | BigInt(`0x${m[2]}`)) as Lsn;
}

export function maxLsn(a: Lsn, b: Lsn): Lsn {
  return a > b ? a : b;
}
