/**
 * The authentication exchange, as libpq's fe-auth.c answers it: cleartext and MD5
 * passwords, SCRAM-SHA-256 and, over TLS, SCRAM-SHA-256-PLUS with tls-server-end-point
 * channel binding (node-postgres's SCRAM code). Before answering a request it applies
 * require_auth (PostgreSQL 16: the methods the server may ask for, or with `!` those it
 * may not; `none` is a server that asks for nothing) and channel_binding (require: only
 * SASL is answered, and the server must have proven the channel). The password comes
 * from the conninfo, else the password file, and is read only when the server asks.
 */
import crypto from 'node:crypto';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { continueSession, finalizeSession, startSession } from 'pg/lib/crypto/sasl.js';
import type { ConnInfo, HostSpec } from '../config/conninfo.js';
import { HandshakeFailure, ServerError } from './failure.js';
import { type BackendMessage, cstr, errorFields, frontend, type MessageReader } from './messages.js';
import { passfilePassword } from './passfile.js';

const REQUEST_NAMES: Record<number, [method: string, reason: string]> = {
  3: ['password', 'server requested a cleartext password'],
  5: ['md5', 'server requested a hashed password'],
  2: ['gss', 'server requested GSSAPI authentication'],
  7: ['gss', 'server requested GSSAPI authentication'],
  9: ['sspi', 'server requested SSPI authentication'],
  10: ['scram-sha-256', 'server requested SASL authentication'],
};

/** Whether require_auth lets the server use `method` ('none': no authentication at all). */
export function authAllowed(requireAuth: string | undefined, method: string): boolean {
  if (!requireAuth) return true;
  const items = requireAuth.split(',').map((s) => s.trim());
  return items[0]!.startsWith('!') ? !items.includes(`!${method}`) : items.includes(method);
}

export interface AuthContext {
  info: ConnInfo;
  spec: HostSpec;
  socket: Socket;
  /** The TLS socket when TLS is in use (channel binding binds to its certificate). */
  tls: TLSSocket | null;
  reader: MessageReader;
  /** libpq's warning about an ignored password file, kept for the error message. */
  warnings: string[];
}

/** What the exchange has established so far; require_auth and channel_binding are checked against it. */
interface Exchange {
  requireAuth: string | undefined;
  binding: string;
  sasl: ReturnType<typeof startSession> | null;
  /** The server proved the channel (SCRAM-SHA-256-PLUS verified). */
  bound: boolean;
  /** A password was sent or a SCRAM exchange verified: the server did ask for something. */
  authenticated: boolean;
}

function fail(message: string): HandshakeFailure {
  return new HandshakeFailure('auth', message);
}

/** Answers authentication requests until AuthenticationOk; returns that message. */
export async function authenticate(ctx: AuthContext): Promise<BackendMessage> {
  const ex: Exchange = {
    requireAuth: ctx.info.settings.require_auth,
    binding: ctx.info.settings.channel_binding ?? 'prefer',
    sasl: null,
    bound: false,
    authenticated: false,
  };
  while (true) {
    const m = await ctx.reader.message();
    if (m.type === 'E') throw new ServerError(errorFields(m.body));
    if (m.type === 'N') continue;
    if (m.type !== 'R') throw new HandshakeFailure('network', `expected an authentication request from the server, received message type "${m.type}"`);
    const code = m.body.readInt32BE(0);
    if (code === 0) {
      checkCompleted(ex);
      return m;
    }
    if (code === 11 || code === 12) await saslStep(ctx, ex, code, m.body);
    else await answerRequest(ctx, ex, code, m.body);
  }
}

/** AuthenticationOk: refuse it if require_auth or channel_binding wanted more than happened. */
function checkCompleted(ex: Exchange): void {
  if (!ex.authenticated && !authAllowed(ex.requireAuth, 'none')) throw fail(`authentication method requirement "${ex.requireAuth}" failed: server did not complete authentication`);
  if (ex.binding === 'require' && !ex.bound) throw fail('channel binding required, but server authenticated client without channel binding');
}

/** A request that starts an exchange (code 3, 5, 10, or one pgsub cannot answer). */
async function answerRequest(ctx: AuthContext, ex: Exchange, code: number, body: Buffer): Promise<void> {
  const [method, reason] = REQUEST_NAMES[code] ?? ['unknown', `server requested authentication method ${code}`];
  if (!authAllowed(ex.requireAuth, method)) throw fail(`authentication method requirement "${ex.requireAuth}" failed: ${reason}`);
  if (ex.binding === 'require' && code !== 10) throw fail("channel binding required but not supported by server's authentication request");
  switch (code) {
    case 3:
      ctx.socket.write(frontend('p', cstr(await password(ctx))));
      ex.authenticated = true;
      break;
    case 5: {
      const inner = crypto
        .createHash('md5')
        .update((await password(ctx)) + ctx.info.user)
        .digest('hex');
      const outer = crypto.createHash('md5').update(inner).update(body.subarray(4, 8)).digest('hex');
      ctx.socket.write(frontend('p', cstr(`md5${outer}`)));
      ex.authenticated = true;
      break;
    }
    case 10:
      ex.sasl = await startSasl(ctx, ex.binding, body);
      break;
    default:
      throw fail(`${reason}, which pgsub does not support (it has no GSSAPI, SSPI or Kerberos)`);
  }
}

/** AuthenticationSASL: pick the mechanism and send SASLInitialResponse. */
async function startSasl(ctx: AuthContext, binding: string, body: Buffer): Promise<ReturnType<typeof startSession>> {
  const mechanisms = body
    .toString('utf8', 4)
    .split('\0')
    .filter((s) => s !== '');
  if (binding === 'require') {
    if (!ctx.tls) throw fail('channel binding required, but SSL not in use');
    if (!mechanisms.includes('SCRAM-SHA-256-PLUS')) throw fail('channel binding is required, but server did not offer an authentication method that supports channel binding');
  }
  let sasl: ReturnType<typeof startSession>;
  try {
    sasl = startSession(mechanisms, binding === 'disable' ? null : ctx.tls);
  } catch (err) {
    throw fail(`none of the server's SASL authentication mechanisms are supported (${mechanisms.join(', ')}): ${(err as Error).message}`);
  }
  // The initial response needs the password only later (continueSession); ask for it now, like libpq.
  await password(ctx);
  const data = Buffer.from(sasl.response, 'utf8');
  const len = Buffer.alloc(4);
  len.writeInt32BE(data.length, 0);
  ctx.socket.write(frontend('p', Buffer.concat([cstr(sasl.mechanism), len, data])));
  return sasl;
}

/** AuthenticationSASLContinue (11): send the client proof; AuthenticationSASLFinal (12): verify the server's. */
async function saslStep(ctx: AuthContext, ex: Exchange, code: 11 | 12, body: Buffer): Promise<void> {
  const sasl = ex.sasl;
  if (!sasl) throw new HandshakeFailure('network', 'SASL message from the server outside a SASL exchange');
  const data = body.toString('utf8', 4);
  if (code === 11) {
    const pw = await password(ctx);
    await (scram(() => continueSession(sasl, pw, data, ex.binding === 'disable' ? null : ctx.tls)) as Promise<void>).catch((err: Error) => {
      throw err instanceof HandshakeFailure ? err : fail(`SCRAM authentication failed: ${err.message}`);
    });
    ctx.socket.write(frontend('p', Buffer.from(sasl.response, 'utf8')));
  } else {
    scram(() => finalizeSession(sasl, data));
    ex.bound = sasl.mechanism === 'SCRAM-SHA-256-PLUS';
    ex.authenticated = true;
  }
}

// A SCRAM message that does not verify (a server that cannot prove it knows the password) is permanent, not a lost connection.
function scram(step: () => unknown): unknown {
  try {
    return step();
  } catch (err) {
    throw fail(`SCRAM authentication failed: ${(err as Error).message}`);
  }
}

async function password(ctx: AuthContext): Promise<string> {
  if (ctx.info.password !== undefined && ctx.info.password !== '') return ctx.info.password;
  const answer = passfilePassword(ctx.info, ctx.spec);
  if (answer.warning && !ctx.warnings.includes(answer.warning)) ctx.warnings.push(answer.warning);
  if (answer.password !== undefined && answer.password !== '') return answer.password;
  throw new HandshakeFailure('auth', `fe_sendauth: no password supplied${ctx.warnings.length > 0 ? ` (${ctx.warnings.join('; ')})` : ''}`);
}
