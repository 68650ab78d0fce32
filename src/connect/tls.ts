/**
 * TLS as libpq sets it up (fe-secure-openssl.c initialize_SSL), on Node's TLS: the root
 * certificate (sslrootcert, default ~/.postgresql/root.crt, or `system`) decides whether
 * the server's chain is verified — also with sslmode=require when the file exists, as in
 * libpq; verify-ca and verify-full need one. verify-full also checks the host name (SAN
 * or CN, IP addresses against IP SANs). CRLs (sslcrl, default ~/.postgresql/root.crl, and
 * sslcrldir) are checked for the whole chain. The client certificate (sslcert, default
 * ~/.postgresql/postgresql.crt) is sent only when its file exists; its key (sslkey)
 * must then exist and be private (libpq's rule: 0600 or less if owned by the user, 0640
 * if owned by root). SNI carries the host name unless it is an IP address (sslsni=0: never).
 * sslkeylogfile appends the session keys in NSS format (libpq 18), the file created 0600.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import type { ConnInfo, HostSpec } from '../config/conninfo.js';
import { HandshakeFailure } from './failure.js';

export interface TlsPlan {
  options: tls.ConnectionOptions;
  /** sslkeylogfile: where the TLS key material is appended (NSS key log format), for debugging with Wireshark. */
  keylogFile: string | null;
  /** The host name verify-full checks the certificate against, else null. */
  verifyHost: string | null;
}

const NO_ROOT_HINT = "Either provide the file, use the system's trusted roots with sslrootcert=system, or change sslmode to disable server certificate verification.";

/** The system's trusted roots for sslrootcert=system: OpenSSL's SSL_CERT_FILE, Debian's bundle, else Node's. */
function systemRoots(): (string | Buffer)[] {
  for (const file of [process.env.SSL_CERT_FILE, '/etc/ssl/certs/ca-certificates.crt', '/etc/pki/tls/certs/ca-bundle.crt']) {
    if (file && fs.existsSync(file)) return [fs.readFileSync(file)];
  }
  return [...tls.rootCertificates];
}

function statOrNull(file: string): fs.Stats | null {
  try {
    return fs.statSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw new HandshakeFailure('tls', `could not stat "${file}": ${(err as Error).message}`);
  }
}

function read(file: string, what: string): Buffer {
  try {
    return fs.readFileSync(file);
  } catch (err) {
    throw new HandshakeFailure('tls', `could not read ${what} "${file}": ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}

/** The CRLs libpq would load: sslcrl (default ~/.postgresql/root.crl when it exists) and every file of sslcrldir. */
function crls(info: ConnInfo): Buffer[] {
  const out: Buffer[] = [];
  const file = info.settings.sslcrl || path.join(info.home, '.postgresql', 'root.crl');
  if (statOrNull(file)) out.push(read(file, 'SSL certificate revocation list file'));
  const dir = info.settings.sslcrldir;
  if (dir) {
    let names: string[];
    try {
      names = fs.readdirSync(dir);
    } catch (err) {
      throw new HandshakeFailure('tls', `could not read SSL certificate revocation list directory "${dir}": ${(err as NodeJS.ErrnoException).code}`);
    }
    for (const name of names.sort()) if (/\.r\d+$/.test(name) || /\.(pem|crl)$/.test(name)) out.push(read(path.join(dir, name), 'SSL certificate revocation list file'));
  }
  return out;
}

/** libpq's permission rule for a private key file. */
export function keyPermissionProblem(file: string, st: fs.Stats): string | null {
  // libpq's rule as written: a root-owned key may be 0640 (group-readable), any other 0600.
  if ((st.mode & (st.uid === 0 ? 0o037 : 0o077)) !== 0) {
    return `private key file "${file}" has group or world access; file must have permissions u=rw (0600) or less if owned by the current user, or permissions u=rw,g=r (0640) or less if owned by root`;
  }
  return null;
}

function clientCertificate(info: ConnInfo, options: tls.ConnectionOptions): void {
  if (info.settings.sslcertmode === 'disable') return;
  const certFile = info.settings.sslcert || path.join(info.home, '.postgresql', 'postgresql.crt');
  // libpq: a certificate file that does not exist means no client certificate, named or not.
  if (!statOrNull(certFile)) return;
  const keyFile = info.settings.sslkey || path.join(info.home, '.postgresql', 'postgresql.key');
  const st = statOrNull(keyFile);
  if (!st) throw new HandshakeFailure('tls', `certificate present, but not private key file "${keyFile}"`);
  if (!st.isFile()) throw new HandshakeFailure('tls', `private key file "${keyFile}" is not a regular file`);
  const loose = keyPermissionProblem(keyFile, st);
  if (loose) throw new HandshakeFailure('tls', loose);
  options.cert = read(certFile, 'certificate file');
  options.key = read(keyFile, 'private key file');
  if (info.settings.sslpassword !== undefined) options.passphrase = info.settings.sslpassword;
}

export function tlsPlan(info: ConnInfo, spec: HostSpec): TlsPlan {
  const s = info.settings;
  const options: tls.ConnectionOptions = {
    ALPNProtocols: ['postgresql'],
    minVersion: (s.ssl_min_protocol_version || 'TLSv1.2') as tls.SecureVersion,
    rejectUnauthorized: false,
    // The host name is checked below for verify-full only (verify-ca must not check it).
    checkServerIdentity: () => undefined,
  };
  if (s.ssl_max_protocol_version) options.maxVersion = s.ssl_max_protocol_version as tls.SecureVersion;
  // No server name for an IP address: libpq sends none, and Node warns (DEP0123) if given one.
  if (s.sslsni !== '0' && net.isIP(spec.host) === 0) options.servername = spec.host;
  const rootFile = info.sslrootcert || path.join(info.home, '.postgresql', 'root.crt');
  let verifyChain = false;
  if (rootFile === 'system') {
    options.ca = systemRoots();
    verifyChain = true;
  } else if (statOrNull(rootFile)) {
    options.ca = read(rootFile, 'root certificate file');
    verifyChain = true;
  } else if (info.sslmode === 'verify-ca' || info.sslmode === 'verify-full') {
    throw new HandshakeFailure('tls', `root certificate file "${rootFile}" does not exist\n${NO_ROOT_HINT}`);
  }
  if (verifyChain) {
    options.rejectUnauthorized = true;
    const lists = crls(info);
    if (lists.length > 0) options.crl = lists;
  }
  clientCertificate(info, options);
  return { options, verifyHost: info.sslmode === 'verify-full' ? spec.host : null, keylogFile: s.sslkeylogfile || null };
}

/** Run the TLS handshake over `socket`; resolves with the TLS socket once its checks pass. */
export function startTls(socket: net.Socket, plan: TlsPlan): Promise<tls.TLSSocket> {
  return new Promise((resolve, reject) => {
    const secure = tls.connect({ ...plan.options, socket });
    const keylog = plan.keylogFile;
    if (keylog) secure.on('keylog', (line) => fs.appendFile(keylog, line, { mode: 0o600 }, () => {}));
    const fail = (err: Error) => {
      secure.destroy();
      reject(
        err instanceof HandshakeFailure
          ? err
          : new HandshakeFailure(/^(ECONNRESET|EPIPE|ETIMEDOUT)$/.test((err as NodeJS.ErrnoException).code ?? '') ? 'network' : 'tls', `SSL error: ${err.message}`, { cause: err }),
      );
    };
    secure.once('error', fail);
    secure.once('secureConnect', () => {
      secure.off('error', fail);
      if (plan.verifyHost !== null) {
        const cert = secure.getPeerCertificate();
        if (tls.checkServerIdentity(plan.verifyHost, cert) !== undefined) {
          const names = (cert.subjectaltname ?? '').replace(/(DNS|IP Address):/g, '') || (cert.subject?.CN ?? '');
          fail(new HandshakeFailure('tls', `server certificate for "${names}" does not match host name "${plan.verifyHost}"`));
          return;
        }
      }
      resolve(secure);
    });
  });
}
