/** node-postgres's SCRAM-SHA-256(-PLUS) client (pg/lib/crypto/sasl.js), which src/connect/auth.ts drives. */
declare module 'pg/lib/crypto/sasl.js' {
  import type { Socket } from 'node:net';
  interface Session {
    mechanism: string;
    response: string;
  }
  export function startSession(mechanisms: string[], stream?: Socket | null): Session;
  export function continueSession(session: Session, password: string, serverData: string, stream?: Socket | null): Promise<void>;
  export function finalizeSession(session: Session, serverData: string): void;
}
