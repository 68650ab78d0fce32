/**
 * Mutation fuzzing of the pgoutput decoder, seeded from the captured fixtures (the mutator and
 * runner are test/harness/fuzz.ts; `npm run fuzz` runs 10,000,000 of them).
 *
 * Every call must either return a message or throw a ProtocolError; any other exception
 * (RangeError from Buffer, TypeError…) is a failure, reported with the seed, the iteration and
 * the input hex so it can be replayed.
 *
 *   PGSUB_FUZZ_SEED=1234 PGSUB_FUZZ_ITERATIONS=1000000 node --import tsx --test test/unit/decoder-fuzz.test.ts
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ProtocolError } from '../../src/errors.js';
import { decode } from '../../src/protocol/decoder.js';
import { corpus, fuzzDecoder, summarise } from '../harness/fuzz.js';

const SEED = Number(process.env.PGSUB_FUZZ_SEED ?? 0x5eed_2024) >>> 0;
const ITERATIONS = Number(process.env.PGSUB_FUZZ_ITERATIONS ?? 120_000);

test(`decoder fuzz: ${ITERATIONS} mutated messages, seed ${SEED}`, () => {
  console.log(`# decoder fuzz seed=${SEED} iterations=${ITERATIONS} (set PGSUB_FUZZ_SEED / PGSUB_FUZZ_ITERATIONS to replay or extend)`);
  assert.ok(corpus.length > 0, 'no fixtures');
  const { outcomes, elapsedMs, slowestMs } = fuzzDecoder(SEED, ITERATIONS);
  console.log(`# ${ITERATIONS} calls in ${elapsedMs.toFixed(0)} ms (slowest ${slowestMs.toFixed(2)} ms): ${summarise(outcomes)}`);
  // Every error class and plenty of successes must have been exercised.
  for (const code of ['PGSUB_PROTOCOL_TRUNCATED', 'PGSUB_PROTOCOL_TRAILING_BYTES', 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE', 'PGSUB_PROTOCOL_BAD_FIELD'])
    assert.ok((outcomes.get(code) ?? 0) > 0, `no ${code} outcome`);
  assert.ok([...outcomes.keys()].filter((k) => k.startsWith('ok:')).length >= 10, 'too few successful decodes');
});

test('decoder fuzz: every byte value as tag, with and without a body, both stream states', () => {
  for (let tag = 0; tag < 256; tag++) {
    for (const body of [Buffer.alloc(0), Buffer.alloc(64, 0xff), Buffer.alloc(64, 0)]) {
      for (const inStream of [false, true]) {
        const input = Buffer.concat([Buffer.from([tag]), body]);
        try {
          decode(input, { inStream, streamAbortInfo: inStream });
        } catch (e) {
          assert.ok(e instanceof ProtocolError, `tag 0x${tag.toString(16)}: ${String(e)}`);
        }
      }
    }
  }
});
