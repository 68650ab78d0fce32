/**
 * The retry backoff with equal jitter (src/backoff.ts): every wait within [step / 2, step],
 * the step doubling from retry_min_delay to retry_max_delay and starting over after
 * progress, waits that differ between instances, and never 0 nor above the max.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Backoff, jitteredDelay } from '../../src/backoff.js';

test('a wait is between half the step and the step, and the draws are spread over it', () => {
  const draws = Array.from({ length: 2000 }, () => jitteredDelay(1000));
  assert.ok(
    draws.every((d) => d >= 500 && d <= 1000),
    `out of [500, 1000]: ${draws.filter((d) => d < 500 || d > 1000)}`,
  );
  // Not all equal: spread over the range (lockstep is what the jitter is for).
  assert.ok(new Set(draws).size > 100, `only ${new Set(draws).size} distinct waits`);
  assert.ok(Math.min(...draws) < 600 && Math.max(...draws) > 900, `min ${Math.min(...draws)}, max ${Math.max(...draws)}`);
  // The ends of the range, with the random source at its ends.
  assert.equal(
    jitteredDelay(1000, () => 0),
    500,
  );
  assert.equal(
    jitteredDelay(1000, () => 0.999999),
    1000,
  );
  // Never 0, also for a step of a millisecond or less.
  assert.equal(
    jitteredDelay(1, () => 0),
    1,
  );
  assert.equal(
    jitteredDelay(0.2, () => 0),
    1,
  );
});

test('the step doubles from the minimum to the maximum, which bounds every wait; reset starts over', () => {
  const steps: number[] = [];
  const b = new Backoff(1000, 60_000, () => 0.999999);
  for (let i = 0; i < 10; i++) steps.push(b.next());
  assert.deepEqual(steps, [1000, 2000, 4000, 8000, 16_000, 32_000, 60_000, 60_000, 60_000, 60_000]);
  b.reset();
  assert.equal(b.next(), 1000);
  const low = new Backoff(1000, 60_000, () => 0);
  assert.deepEqual([low.next(), low.next(), low.next()], [500, 1000, 2000]);
  // A minimum above the maximum: the maximum is the bound.
  const inverted = new Backoff(10_000, 3000, () => 0.999999);
  assert.deepEqual([inverted.next(), inverted.next()], [3000, 3000]);
});

test('two instances failing together draw different waits', () => {
  const a = new Backoff(1000, 60_000);
  const b = new Backoff(1000, 60_000);
  const waits = Array.from({ length: 8 }, () => [a.next(), b.next()]);
  assert.ok(
    waits.some(([x, y]) => x !== y),
    JSON.stringify(waits),
  );
  for (const [i, [x, y]] of waits.entries()) {
    const step = Math.min(1000 * 2 ** i, 60_000);
    for (const w of [x!, y!]) assert.ok(w >= step / 2 && w <= step, `wait ${w} outside [${step / 2}, ${step}] at attempt ${i + 1}`);
  }
});
