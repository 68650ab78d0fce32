/**
 * A throw-away certificate authority for TLS tests, made with openssl (Debian's, which
 * .ci/run installs): a CA, a server certificate for `localhost` (DNS name only, so a
 * connection to 127.0.0.1 fails verify-full as it should), a second server certificate
 * for `localhost` that the CRL revokes, a client certificate for role `cert_user`, and
 * the CRL. Files are PEM, keys unencrypted except `clientEncryptedKey` (passphrase
 * `keypass`). Everything lives in one temporary directory, removed by `remove()`.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export interface TestCa {
  dir: string;
  caCert: string;
  serverCert: string;
  serverKey: string;
  revokedCert: string;
  revokedKey: string;
  clientCert: string;
  clientKey: string;
  /** The client key encrypted with passphrase CLIENT_KEY_PASSPHRASE. */
  clientEncryptedKey: string;
  crl: string;
  remove(): void;
}

export const CLIENT_KEY_PASSPHRASE = 'keypass';

function openssl(dir: string, args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

const CA_CONFIG = `[ca]
default_ca = test
[test]
dir = .
database = index.txt
crlnumber = crlnumber
default_md = sha256
default_crl_days = 30
policy = anything
[anything]
commonName = supplied
[v3_ca]
basicConstraints = critical,CA:true
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:false
subjectAltName = DNS:localhost
extendedKeyUsage = serverAuth
[client]
basicConstraints = CA:false
extendedKeyUsage = clientAuth
`;

export function createTestCa(): TestCa {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-ca-'));
  const f = (name: string) => path.join(dir, name);
  fs.writeFileSync(f('ca.cnf'), CA_CONFIG);
  fs.writeFileSync(f('index.txt'), '');
  fs.writeFileSync(f('crlnumber'), '01\n');
  openssl(dir, [
    'req',
    '-x509',
    '-new',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.crt',
    '-days',
    '30',
    '-subj',
    '/CN=pgsub test CA',
    '-config',
    'ca.cnf',
    '-extensions',
    'v3_ca',
  ]);
  const issue = (name: string, cn: string, ext: string, serial: string) => {
    openssl(dir, ['req', '-new', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`]);
    openssl(dir, [
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.crt',
      '-CAkey',
      'ca.key',
      '-set_serial',
      serial,
      '-out',
      `${name}.crt`,
      '-days',
      '30',
      '-sha256',
      '-extfile',
      'ca.cnf',
      '-extensions',
      ext,
    ]);
    fs.chmodSync(f(`${name}.key`), 0o600);
  };
  issue('server', 'localhost', 'server', '1001');
  issue('revoked', 'localhost', 'server', '1002');
  issue('client', 'cert_user', 'client', '1003');
  openssl(dir, ['rsa', '-in', 'client.key', '-aes256', '-passout', `pass:${CLIENT_KEY_PASSPHRASE}`, '-out', 'client-enc.key']);
  fs.chmodSync(f('client-enc.key'), 0o600);
  openssl(dir, ['ca', '-config', 'ca.cnf', '-keyfile', 'ca.key', '-cert', 'ca.crt', '-revoke', 'revoked.crt']);
  openssl(dir, ['ca', '-config', 'ca.cnf', '-keyfile', 'ca.key', '-cert', 'ca.crt', '-gencrl', '-out', 'crl.pem']);
  return {
    dir,
    caCert: f('ca.crt'),
    serverCert: f('server.crt'),
    serverKey: f('server.key'),
    revokedCert: f('revoked.crt'),
    revokedKey: f('revoked.key'),
    clientCert: f('client.crt'),
    clientKey: f('client.key'),
    clientEncryptedKey: f('client-enc.key'),
    crl: f('crl.pem'),
    remove: () => fs.rmSync(dir, { recursive: true, force: true }),
  };
}
