/**
 * Named crash points for the fault tests: when PGSUB_FAULT names a point, the process
 * kills itself with SIGKILL there — the harshest crash, at the most delicate moment (e.g.
 * between COMMIT PREPARED on the target and the origin update that follows it). Unset in
 * production; reading one environment variable is all it costs.
 */
const armed = process.env.PGSUB_FAULT ?? '';

export function faultPoint(name: string): void {
  if (armed === name) process.kill(process.pid, 'SIGKILL');
}
