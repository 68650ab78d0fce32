/**
 * What went wrong while opening a connection, before any driver was involved, in the
 * classes connect-failure.ts turns into pgsub's errors: a TLS or certificate check
 * ('tls'), an authentication requirement ('auth'), a setting that cannot work ('config'),
 * or the network ('network', retried). A server's ErrorResponse is a ServerError carrying
 * its SQLSTATE, like the drivers' own errors. Messages never hold a password or key.
 */

export type FailureKind = 'tls' | 'auth' | 'config' | 'network';

export class HandshakeFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = 'HandshakeFailure';
  }
}

/** The server's ErrorResponse during startup (same shape as pg's DatabaseError: code, severity, detail). */
export class ServerError extends Error {
  readonly code: string;
  readonly severity: string;
  readonly detail: string | undefined;
  constructor(fields: Record<string, string>) {
    super(fields.M ?? 'error from the server');
    this.name = 'ServerError';
    this.code = fields.C ?? 'XX000';
    this.severity = fields.V ?? fields.S ?? 'FATAL';
    this.detail = fields.D;
  }
}
