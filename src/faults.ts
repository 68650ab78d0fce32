/**
 * Named crash and pause points for the fault tests: when PGSUB_FAULT names a point, the process
 * kills itself with SIGKILL there — the harshest crash, at the most delicate moment (e.g.
 * between COMMIT PREPARED on the target and the origin update that follows it). Unset in
 * production; reading one environment variable is all it costs.
 */
const armed = process.env.PGSUB_FAULT ?? '';

export function faultPoint(name: string): void {
  if (armed === name) process.kill(process.pid, 'SIGKILL');
}

/**
 * A named pause for the interruption tests: when PGSUB_FAULT is `pause:<name>`, the process
 * says so on stderr and waits there until `signal` aborts (a SIGTERM/SIGINT the test
 * sends) or a minute passes — a point the test can hit exactly, unlike a timer.
 */
export async function faultPause(name: string, signal?: AbortSignal): Promise<void> {
  if (armed !== `pause:${name}` || signal?.aborted) return;
  process.stderr.write(`pgsub: paused at ${name}\n`);
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, 60_000);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}
