/**
 * Structured logs via pino. Fields, not prose: `{ lsn, xid, table }`. Passwords are
 * never logged: conninfo is only ever logged through redactConninfo, and the redact paths
 * below are a second line of defence for objects that carry one by accident.
 */
import pino, { type Logger } from 'pino';
import pretty from 'pino-pretty';

export type { Logger };

/**
 * JSON lines on stdout for journald and log shippers; on a terminal, pino-pretty's
 * human-readable lines (synchronous, in-process: no transport worker thread).
 */
function defaultDestination(): pino.DestinationStream {
  if (process.stdout.isTTY && process.env.PGSUB_LOG_FORMAT !== 'json') return pretty({ sync: true, colorize: true, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,name' });
  return pino.destination({ fd: 1, sync: true });
}

export function createLogger(level: string = process.env.PGSUB_LOG_LEVEL ?? 'info', destination?: pino.DestinationStream): Logger {
  return pino(
    {
      name: 'pgsub',
      level,
      base: { pid: process.pid },
      redact: { paths: ['password', '*.password', '*.*.password', 'conninfo', '*.conninfo'], censor: '****' },
      serializers: { err: pino.stdSerializers.err },
    },
    destination ?? defaultDestination(),
  );
}
