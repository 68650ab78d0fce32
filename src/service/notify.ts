/**
 * systemd's notify protocol (sd_notify(3)) for `Type=notify` units: READY=1, STATUS=,
 * EXTEND_TIMEOUT_USEC=, WATCHDOG=1, STOPPING=1, each a datagram to $NOTIFY_SOCKET.
 *
 * Node has no AF_UNIX datagram sockets, and a native addon needs a compiler at install
 * time, so each message is sent by systemd's own `systemd-notify` (no shell; needs
 * NotifyAccess=all in the unit). It runs without --no-block: it waits until systemd has
 * read the message (BARRIER=1), so the message is still attributed to this service's
 * cgroup when the short-lived sender is gone. Messages go out one at a time, in order;
 * STATUS lines that pile up while one is being sent are coalesced to the newest.
 * Without $NOTIFY_SOCKET (tests, a terminal) every call is a no-op.
 */
import { execFile } from 'node:child_process';
import type { Logger } from '../log.js';

export interface Notifier {
  /** systemd watches this process: the keep-alive interval (half of WATCHDOG_USEC), else null. */
  readonly watchdogIntervalMs: number | null;
  ready(status: string): void;
  status(status: string): void;
  /** Startup takes longer (a long initial copy): systemd waits this much more from now. */
  extendTimeout(ms: number): void;
  watchdog(): void;
  stopping(status: string): void;
  /** Resolves once everything queued has been handed to systemd. */
  flush(): Promise<void>;
}

export function createNotifier(log: Logger, env: NodeJS.ProcessEnv = process.env, command = 'systemd-notify'): Notifier {
  const socket = env.NOTIFY_SOCKET;
  const watchdogUsec = Number(env.WATCHDOG_USEC ?? 0);
  // WATCHDOG_PID, when set, names the process systemd watches: it may be a parent.
  const watched = watchdogUsec > 0 && (env.WATCHDOG_PID === undefined || Number(env.WATCHDOG_PID) === process.pid);
  const watchdogIntervalMs = socket && watched ? Math.max(1, Math.floor(watchdogUsec / 2000)) : null;
  if (!socket) {
    return { watchdogIntervalMs: null, ready() {}, status() {}, extendTimeout() {}, watchdog() {}, stopping() {}, flush: async () => {} };
  }

  const queue: string[][] = [];
  let sending: Promise<void> | null = null;
  let warned = false;
  const send = (assignments: string[]): Promise<void> =>
    new Promise((resolve) => {
      execFile(command, assignments, { env: { ...env, NOTIFY_SOCKET: socket }, timeout: 10_000 }, (err) => {
        if (err && !warned) {
          // Once: a unit without NotifyAccess=all, or no systemd-notify on PATH.
          warned = true;
          log.warn({ err, command }, 'cannot notify systemd (is NotifyAccess=all set and systemd-notify installed?)');
        }
        resolve();
      });
    });
  const pump = async () => {
    while (queue.length > 0) await send(queue.shift()!);
    sending = null;
  };
  const enqueue = (assignments: string[], coalesceStatus = false) => {
    const last = queue[queue.length - 1];
    if (coalesceStatus && last !== undefined && last.length === 1 && last[0]!.startsWith('STATUS=')) queue[queue.length - 1] = assignments;
    else queue.push(assignments);
    sending ??= pump();
  };
  // STATUS= takes one line: a newline would start another assignment.
  const line = (s: string) => `STATUS=${s.replace(/[\r\n]+/g, ' ')}`;
  return {
    watchdogIntervalMs,
    ready: (status) => enqueue(['READY=1', line(status)]),
    status: (status) => enqueue([line(status)], true),
    extendTimeout: (ms) => enqueue([`EXTEND_TIMEOUT_USEC=${Math.round(ms * 1000)}`]),
    watchdog: () => enqueue(['WATCHDOG=1']),
    stopping: (status) => enqueue(['STOPPING=1', line(status)]),
    flush: async () => {
      while (sending) await sending;
    },
  };
}
