/**
 * Structured JSON logs via pino. Fields, not prose: `{ lsn, xid, table }`. Passwords are
 * never logged: conninfo is only ever logged through redactConninfo, and the redact paths
 * below are a second line of defence for objects that carry one by accident.
 */
import pino, { type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string = process.env.PGSUB_LOG_LEVEL ?? 'info', destination?: pino.DestinationStream): Logger {
  return pino(
    {
      name: 'pgsub',
      level,
      base: { pid: process.pid },
      redact: { paths: ['password', '*.password', '*.*.password', 'conninfo', '*.conninfo'], censor: '****' },
      serializers: { err: pino.stdSerializers.err },
    },
    destination ?? pino.destination({ fd: 1, sync: true }),
  );
}
