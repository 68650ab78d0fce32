/**
 * The few protocol messages a connection exchanges before a driver takes it over:
 * SSLRequest, the startup packet, authentication responses, one simple query for
 * target_session_attrs, and a reader of backend messages that keeps every byte it was
 * given (the driver is handed AuthenticationOk … ReadyForQuery exactly as they came).
 */
import type { Socket } from 'node:net';

export interface BackendMessage {
  type: string;
  body: Buffer;
  /** The whole message as sent: type byte, length and body. */
  raw: Buffer;
}

export const SSL_REQUEST = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);

export function startupPacket(params: Record<string, string>): Buffer {
  const parts: Buffer[] = [Buffer.alloc(8)];
  for (const [k, v] of Object.entries(params)) parts.push(Buffer.from(`${k}\0${v}\0`, 'utf8'));
  parts.push(Buffer.from([0]));
  const buf = Buffer.concat(parts);
  buf.writeInt32BE(buf.length, 0);
  buf.writeInt32BE(196608, 4);
  return buf;
}

/** A frontend message: type byte, length, body. */
export function frontend(type: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(type, 0, 'latin1');
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

export const cstr = (s: string): Buffer => Buffer.from(`${s}\0`, 'utf8');

/** Whether `buf` starts with a protocol-3.0 startup packet (what a driver writes first). */
export function startupLength(buf: Buffer): number {
  return buf.length >= 8 && buf.readInt32BE(4) === 196608 ? buf.readInt32BE(0) : 0;
}

/** ErrorResponse / NoticeResponse fields by their one-letter codes. */
export function errorFields(body: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < body.length && body[i] !== 0) {
    const code = String.fromCharCode(body[i]!);
    const end = body.indexOf(0, i + 1);
    out[code] = body.toString('utf8', i + 1, end < 0 ? body.length : end);
    i = end < 0 ? body.length : end + 1;
  }
  return out;
}

/** Reads backend messages from a socket until detached; errors and close reject the waiting read. */
export class MessageReader {
  #buf: Buffer = Buffer.alloc(0);
  #waiting: { resolve: (m: BackendMessage | Buffer) => void; reject: (e: Error) => void; bytes?: number } | null = null;
  #failed: Error | null = null;
  readonly #socket: Socket;
  readonly #onData = (chunk: Buffer) => {
    this.#buf = this.#buf.length === 0 ? chunk : Buffer.concat([this.#buf, chunk]);
    this.#deliver();
  };
  readonly #onError = (err: Error) => this.#fail(err);
  readonly #onClose = () => this.#fail(Object.assign(new Error('server closed the connection unexpectedly'), { code: 'ECONNRESET' }));

  constructor(socket: Socket) {
    this.#socket = socket;
    socket.on('data', this.#onData);
    socket.on('error', this.#onError);
    socket.on('close', this.#onClose);
  }

  /** Bytes received and not yet read. */
  get pending(): number {
    return this.#buf.length;
  }

  /** Stop listening; returns what was received and not read. The socket is left paused. */
  detach(): Buffer {
    this.#socket.pause();
    this.#socket.off('data', this.#onData);
    this.#socket.off('error', this.#onError);
    this.#socket.off('close', this.#onClose);
    const rest = this.#buf;
    this.#buf = Buffer.alloc(0);
    return rest;
  }

  /** One raw byte (the answer to SSLRequest). */
  byte(): Promise<Buffer> {
    return this.#wait(1) as Promise<Buffer>;
  }

  message(): Promise<BackendMessage> {
    return this.#wait(undefined) as Promise<BackendMessage>;
  }

  #wait(bytes: number | undefined): Promise<BackendMessage | Buffer> {
    if (this.#failed) return Promise.reject(this.#failed);
    return new Promise((resolve, reject) => {
      this.#waiting = bytes === undefined ? { resolve, reject } : { resolve, reject, bytes };
      this.#deliver();
    });
  }

  #deliver(): void {
    const w = this.#waiting;
    if (!w) return;
    if (w.bytes !== undefined) {
      if (this.#buf.length < w.bytes) return;
      const out = this.#buf.subarray(0, w.bytes);
      this.#buf = this.#buf.subarray(w.bytes);
      this.#waiting = null;
      w.resolve(out);
      return;
    }
    if (this.#buf.length < 5) return;
    const len = this.#buf.readInt32BE(1);
    if (len < 4 || len > 1 << 24) {
      this.#waiting = null;
      w.reject(new Error(`invalid message length ${len} from the server (is it a PostgreSQL server?)`));
      return;
    }
    if (this.#buf.length < len + 1) return;
    const raw = this.#buf.subarray(0, len + 1);
    this.#buf = this.#buf.subarray(len + 1);
    this.#waiting = null;
    w.resolve({ type: String.fromCharCode(raw[0]!), body: raw.subarray(5), raw });
  }

  #fail(err: Error): void {
    this.#failed ??= err;
    const w = this.#waiting;
    this.#waiting = null;
    w?.reject(this.#failed);
  }
}
