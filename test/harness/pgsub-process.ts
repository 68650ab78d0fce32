/**
 * pgsub as a child process (`node bin/pgsub.js run`), for tests that kill, signal and
 * restart it as an operator or a crash would. Configured through PGSUB_* environment
 * variables only (the systemd EnvironmentFile path). Captures stdout/stderr (JSON logs).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
/**
 * What the tests run: scripts/run-tests.mjs bundles the sources once (PGSUB_TEST_BIN), so a
 * spawn costs ~0.3 s instead of tsx compiling ~150 files each time (~2 s); without it, the
 * sources through bin/pgsub.js.
 */
export const PGSUB_BIN = process.env.PGSUB_TEST_BIN ?? path.join(REPO_ROOT, 'bin', 'pgsub.js');

export interface PgsubProcess {
  child: ChildProcess;
  /** Everything written so far to stdout and stderr. */
  output(): string;
  /** Resolves with the exit code (or the signal name). */
  exited: Promise<number | string>;
  /** Resolves when a log line with this msg has been printed. */
  waitForLog(msg: string, timeoutMs?: number): Promise<Record<string, unknown>>;
  kill(signal?: NodeJS.Signals): void;
}

export function spawnPgsub(env: Record<string, string>, args: string[] = ['run']): PgsubProcess {
  const child = spawn(process.execPath, [PGSUB_BIN, ...args], {
    cwd: REPO_ROOT,
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  const listeners = new Set<() => void>();
  const onData = (chunk: Buffer) => {
    out += chunk.toString('utf8');
    for (const l of listeners) l();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<number | string>((resolve) => child.on('exit', (code, signal) => resolve(code ?? signal ?? -1)));
  const findLog = (msg: string): Record<string, unknown> | undefined => {
    for (const line of out.split('\n')) {
      if (!line.startsWith('{')) continue;
      try {
        const rec = JSON.parse(line) as Record<string, unknown>;
        if (rec.msg === msg) return rec;
      } catch {
        // a partial line; the next chunk completes it
      }
    }
    return undefined;
  };
  return {
    child,
    output: () => out,
    exited,
    kill: (signal = 'SIGTERM') => void child.kill(signal),
    waitForLog(msg, timeoutMs = 60_000) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const rec = findLog(msg);
          if (rec) {
            cleanup();
            resolve(rec);
          }
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`pgsub did not log "${msg}" within ${timeoutMs} ms; output:\n${out.slice(-4000)}`));
        }, timeoutMs);
        const onExit = () => {
          cleanup();
          reject(new Error(`pgsub exited before logging "${msg}"; output:\n${out.slice(-4000)}`));
        };
        const cleanup = () => {
          clearTimeout(timer);
          listeners.delete(check);
          child.off('exit', onExit);
        };
        listeners.add(check);
        child.once('exit', onExit);
        check();
      });
    },
  };
}
