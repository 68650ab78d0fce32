/**
 * `npm run fuzz`: seeded mutation fuzzing of the pgoutput decoder at scale — 10,000,000
 * mutated messages by default (the unit test runs 120,000 in `npm test`). Every outcome must
 * be a message or a typed ProtocolError; memory must stay bounded (the decoder never trusts
 * a length or count it reads, so no input can make it allocate what the input does not hold).
 * Prints the rate and RSS every million, the outcome counts at the end; exits 1 with a
 * replayable finding (seed, iteration, hex) or when peak RSS passes --max-rss-mb.
 *
 *   npm run fuzz                                  # 10,000,000 messages, the default seed
 *   npm run fuzz -- --messages 1000000 --seed 42  # another seed, fewer messages
 */
import { parseArgs } from 'node:util';
import { FuzzFinding, fuzzDecoder, summarise } from '../test/harness/fuzz.js';

const { values: opts } = parseArgs({
  options: {
    messages: { type: 'string', default: '10000000' },
    seed: { type: 'string', default: String(0x5eed_2024) },
    'max-rss-mb': { type: 'string', default: '256' },
  },
});
const messages = Number(opts.messages);
const seed = Number(opts.seed) >>> 0;
const maxRssMb = Number(opts['max-rss-mb']);
const mb = (n: number) => (n / 1048576).toFixed(0);

console.log(`decoder fuzz: ${messages.toLocaleString('en')} messages, seed ${seed}, RSS bound ${maxRssMb} MB`);
let peakRss = process.memoryUsage.rss();
try {
  const result = fuzzDecoder(seed, messages, (done, elapsedMs) => {
    const rss = process.memoryUsage.rss();
    peakRss = Math.max(peakRss, rss);
    const rate = done / (elapsedMs / 1000);
    console.log(
      `  ${done.toLocaleString('en').padStart(11)}  ${(elapsedMs / 1000).toFixed(1).padStart(6)} s  ${Math.round(rate).toLocaleString('en').padStart(9)} msg/s  RSS ${mb(rss)} MB`,
    );
  });
  peakRss = Math.max(peakRss, process.memoryUsage.rss());
  const rate = result.iterations / (result.elapsedMs / 1000);
  console.log(
    `done: ${result.iterations.toLocaleString('en')} messages in ${(result.elapsedMs / 1000).toFixed(1)} s (${Math.round(rate).toLocaleString('en')} msg/s), slowest call ${result.slowestMs.toFixed(2)} ms, peak RSS ${mb(peakRss)} MB`,
  );
  console.log(`outcomes: ${summarise(result.outcomes)}`);
  if (peakRss > maxRssMb * 1048576) {
    console.error(`peak RSS ${mb(peakRss)} MB is above the bound of ${maxRssMb} MB`);
    process.exit(1);
  }
} catch (e) {
  if (!(e instanceof FuzzFinding)) throw e;
  console.error(`finding: ${e.message}`);
  process.exit(1);
}
