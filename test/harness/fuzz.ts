/**
 * Seeded mutation fuzzing of the pgoutput decoder, shared by the unit test (a short run in
 * `npm test`) and `npm run fuzz` (10,000,000 messages with rate and memory printed). The
 * corpus is the captured fixtures; every outcome must be a message or a ProtocolError, any
 * other exception is a finding, reported with seed, iteration, context and the input's hex
 * so it can be replayed.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ProtocolError } from '../../src/errors.js';
import { decode } from '../../src/protocol/decoder.js';
import type { DecodeContext } from '../../src/protocol/messages.js';

/** mulberry32: small, fast, good enough for fuzzing, fully determined by the seed. */
export function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n: number) => Math.floor(next() * n);
  return { next, int, pick: <T>(xs: readonly T[]): T => xs[int(xs.length)]! };
}

const FIXTURE_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../fixtures/pgoutput');
export const corpus: Buffer[] = fs
  .readdirSync(FIXTURE_DIR)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => Buffer.from((JSON.parse(fs.readFileSync(path.join(FIXTURE_DIR, f), 'utf8')) as { hex: string }).hex, 'hex'));

const TAGS = Buffer.from('BCORYIUDTMSEcAbPKrpwkXZ\0\xff', 'latin1');
const INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xff, 0x4e, 0x4b, 0x4f, 0x6e, 0x75, 0x74, 0x62, 0x64, 0x66, 0x69];
const INTERESTING_16 = [0x0000, 0x0001, 0x7fff, 0x8000, 0xffff, 0x0100, 0x00ff];
const INTERESTING_32 = [0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffffe, 0x00010000, 0x0000ffff, 1 << 30];

export type Rng = ReturnType<typeof prng>;

export function mutate(r: Rng, src: Buffer): Buffer {
  let b = Buffer.from(src);
  const rounds = 1 + r.int(3);
  for (let k = 0; k < rounds; k++) {
    const op = r.int(10);
    switch (op) {
      case 0: {
        // bit flips
        if (b.length === 0) break;
        for (let i = 1 + r.int(4); i > 0; i--) {
          const at = r.int(b.length);
          b[at]! ^= 1 << r.int(8);
        }
        break;
      }
      case 1: {
        // byte replacement, random or interesting
        if (b.length === 0) break;
        b[r.int(b.length)] = r.next() < 0.5 ? r.int(256) : r.pick(INTERESTING_BYTES);
        break;
      }
      case 2: {
        // insertion
        const at = r.int(b.length + 1);
        const ins = Buffer.alloc(1 + r.int(8));
        for (let i = 0; i < ins.length; i++) ins[i] = r.next() < 0.5 ? r.int(256) : r.pick(INTERESTING_BYTES);
        b = Buffer.concat([b.subarray(0, at), ins, b.subarray(at)]);
        break;
      }
      case 3: {
        // deletion
        if (b.length === 0) break;
        const at = r.int(b.length);
        const n = 1 + r.int(Math.min(8, b.length - at));
        b = Buffer.concat([b.subarray(0, at), b.subarray(at + n)]);
        break;
      }
      case 4: {
        // truncation
        b = b.subarray(0, r.int(b.length + 1));
        break;
      }
      case 5: {
        // 16-bit length/count corruption
        if (b.length < 2) break;
        b.writeUInt16BE(r.pick(INTERESTING_16), r.int(b.length - 1));
        break;
      }
      case 6: {
        // 32-bit length/count/id corruption
        if (b.length < 4) break;
        b.writeUInt32BE(r.pick(INTERESTING_32) >>> 0, r.int(b.length - 3));
        break;
      }
      case 7: {
        // random tag
        if (b.length === 0) break;
        b[0] = r.next() < 0.8 ? r.pick([...TAGS]) : r.int(256);
        break;
      }
      case 8: {
        // splice: head of this one, tail of another fixture
        const other = r.pick(corpus);
        b = Buffer.concat([b.subarray(0, r.int(b.length + 1)), other.subarray(r.int(other.length + 1))]);
        break;
      }
      default: {
        // duplicate a chunk
        if (b.length === 0) break;
        const at = r.int(b.length);
        const chunk = b.subarray(at, at + 1 + r.int(16));
        const to = r.int(b.length + 1);
        b = Buffer.concat([b.subarray(0, to), chunk, b.subarray(to)]);
      }
    }
  }
  return b;
}

const CONTEXTS: DecodeContext[] = [{ inStream: false }, { inStream: true }, { inStream: false, streamAbortInfo: true }, { inStream: true, streamAbortInfo: true }];

export class FuzzFinding extends Error {}

export interface FuzzResult {
  iterations: number;
  outcomes: Map<string, number>;
  elapsedMs: number;
  slowestMs: number;
}

/**
 * Decodes `iterations` mutated messages; throws FuzzFinding at the first exception that is
 * not a ProtocolError. `onProgress` is called every `every` iterations (for the script's
 * rate and memory lines).
 */
export function fuzzDecoder(seed: number, iterations: number, onProgress?: (done: number, elapsedMs: number) => void, every = 1_000_000): FuzzResult {
  const r = prng(seed);
  const outcomes = new Map<string, number>();
  const t0 = performance.now();
  let slowestMs = 0;
  for (let i = 0; i < iterations; i++) {
    const input = mutate(r, r.pick(corpus));
    const ctx = CONTEXTS[i & 3]!;
    const s = performance.now();
    let outcome: string;
    try {
      const m = decode(input, ctx);
      if (typeof m.tag !== 'string') throw new FuzzFinding(`decode returned a message without a tag at seed=${seed} iteration=${i}`);
      outcome = `ok:${m.tag}`;
    } catch (e) {
      if (e instanceof FuzzFinding) throw e;
      if (!(e instanceof ProtocolError)) {
        throw new FuzzFinding(
          `decode threw ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}\n` +
            `  seed=${seed} iteration=${i} ctx=${JSON.stringify(ctx)}\n  hex=${input.toString('hex')}`,
        );
      }
      outcome = e.code;
    }
    const dt = performance.now() - s;
    if (dt > slowestMs) slowestMs = dt;
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    if (onProgress && (i + 1) % every === 0) onProgress(i + 1, performance.now() - t0);
  }
  return { iterations, outcomes, elapsedMs: performance.now() - t0, slowestMs };
}

export function summarise(outcomes: Map<string, number>): string {
  return [...outcomes]
    .sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
}
