/**
 * libpq's conninfo semantics beyond the two text forms: several hosts and ports, hostaddr,
 * the service file (PGSERVICEFILE, PGSYSCONFDIR), PG* variables of every keyword, each
 * keyword pgsub cannot honour refused by name, require_auth's grammar and meaning, the
 * password file's matching and permission rule, and the TLS plan (root certificate
 * defaults, verify-ca vs verify-full, no SNI for IP addresses, the private key rule).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { conninfoKeywords, parseConninfo } from '../../src/config/conninfo.js';
import { KEYWORDS } from '../../src/config/conninfo/keywords.js';
import { authAllowed } from '../../src/connect/auth.js';
import { HandshakeFailure } from '../../src/connect/failure.js';
import { passfilePassword } from '../../src/connect/passfile.js';
import { tlsPlan } from '../../src/connect/tls.js';
import { ConfigError } from '../../src/errors.js';

function tmp(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-libpq-'));
}

describe('hosts', () => {
  test('URI with several hosts and ports', () => {
    const info = parseConninfo('postgresql://u@h1:5433,[::1]:5434,h3/db?target_session_attrs=read-write', 'target', {});
    assert.deepEqual(info.hosts, [
      { host: 'h1', port: 5433 },
      { host: '::1', port: 5434 },
      { host: 'h3', port: 5432 },
    ]);
    assert.equal(info.settings.target_session_attrs, 'read-write');
  });

  test('key=value lists: one port for all, hostaddr per host', () => {
    const info = parseConninfo('host=a,b port=6000 hostaddr=10.0.0.1,10.0.0.2', 'source', {});
    assert.deepEqual(info.hosts, [
      { host: 'a', hostaddr: '10.0.0.1', port: 6000 },
      { host: 'b', hostaddr: '10.0.0.2', port: 6000 },
    ]);
  });

  test('mismatched lists are refused as libpq refuses them', () => {
    assert.throws(() => parseConninfo('host=a,b port=1,2,3', 'source', {}), /could not match 3 port numbers to 2 hosts/);
    assert.throws(() => parseConninfo('host=a,b hostaddr=10.0.0.1', 'source', {}), /could not match 2 host names to 1 hostaddr values/);
    assert.throws(() => parseConninfo('hostaddr=db.example.com', 'source', {}), /not a numeric IP address/);
  });

  test('ssl=true in a URI is sslmode=require', () => {
    assert.equal(parseConninfo('postgresql://h/db?ssl=true', 'source', {}).sslmode, 'require');
  });
});

describe('service file', () => {
  test('PGSERVICEFILE first, then PGSYSCONFDIR/pg_service.conf; the conninfo wins, the environment loses', () => {
    const dir = tmp();
    try {
      fs.writeFileSync(path.join(dir, 'user.conf'), '# mine\n[other]\nhost=nope\n[shop]\nhost=db1\nport = 6000\nsslmode=require\n');
      fs.mkdirSync(path.join(dir, 'etc'));
      fs.writeFileSync(path.join(dir, 'etc', 'pg_service.conf'), '[sys]\nhost=sysdb\ndbname=sysdb\n');
      const env = { PGSERVICEFILE: path.join(dir, 'user.conf'), PGSYSCONFDIR: path.join(dir, 'etc'), PGPORT: '7000', PGUSER: 'envuser' };
      const a = parseConninfo('service=shop port=6500', 'source', env);
      assert.deepEqual([a.host, a.port, a.sslmode, a.user], ['db1', 6500, 'require', 'envuser']);
      const b = parseConninfo('dbname=x', 'source', { ...env, PGSERVICE: 'sys' });
      assert.deepEqual([b.host, b.database, b.port], ['sysdb', 'x', 7000]);
      assert.throws(
        () => parseConninfo('service=missing', 'target', env),
        (e: Error) => e instanceof ConfigError && /definition of service "missing" not found/.test(e.message),
      );
      fs.writeFileSync(path.join(dir, 'user.conf'), '[loop]\nservice=other\n');
      assert.throws(() => parseConninfo('service=loop', 'source', env), /nested "service" specifications not supported/);
      fs.writeFileSync(path.join(dir, 'user.conf'), '[bad]\nsslmod=require\n');
      assert.throws(() => parseConninfo('service=bad', 'source', env), /invalid keyword of service "bad" "sslmod"/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('keywords', () => {
  test('every keyword of libpq 18 is known, each PG* variable fills its keyword', () => {
    assert.equal(Object.keys(KEYWORDS).length, 50);
    const info = parseConninfo('host=h', 'source', {
      PGREQUIREAUTH: 'scram-sha-256',
      PGCHANNELBINDING: 'require',
      PGSSLMODE: 'verify-full',
      PGSSLCRL: '/x.crl',
      PGOPTIONS: '-c work_mem=64MB',
    });
    assert.equal(info.settings.require_auth, 'scram-sha-256');
    assert.equal(info.settings.channel_binding, 'require');
    assert.equal(info.settings.sslcrl, '/x.crl');
    assert.equal(info.settings.options, '-c work_mem=64MB');
  });

  const refusals: [string, RegExp][] = [
    ['requirepeer=postgres', /requirepeer "postgres" is refused: Node.js cannot read the peer credentials/],
    ['krbsrvname=postgres', /krbsrvname "postgres" is refused/],
    ['gsslib=gssapi', /gsslib "gssapi" is refused/],
    ['gssencmode=require', /gssencmode "require" is refused: pgsub has no GSSAPI/],
    ['gssdelegation=1', /gssdelegation "1" is refused/],
    ['keepalives_interval=5', /keepalives_interval "5" is refused: Node.js cannot set TCP_KEEPINTVL/],
    ['keepalives_count=3', /keepalives_count "3" is refused: Node.js cannot set TCP_KEEPCNT/],
    ['tcp_user_timeout=1000', /tcp_user_timeout "1000" is refused: Node.js cannot set TCP_USER_TIMEOUT/],
    ['replication=database', /replication "database" is refused/],
    ['sslcertmode=require', /sslcertmode "require" is refused/],
    ['sslcompression=1', /sslcompression "1" is refused/],
    ['client_encoding=LATIN1', /client_encoding "LATIN1" is refused/],
    ['max_protocol_version=3.2', /max_protocol_version "3.2" is refused/],
    ['min_protocol_version=latest', /min_protocol_version "latest" is refused/],
    ['oauth_issuer=https://x', /oauth_issuer "https:\/\/x" is refused/],
    ['scram_client_key=abc', /scram_client_key is refused/],
    ['sslkey=pkcs11:foo', /sslkey "pkcs11:foo" is refused: OpenSSL engine keys/],
    ['require_auth=md5,!password', /negative require_auth method cannot be mixed/],
    ['require_auth=kerberos', /invalid method "kerberos"/],
    ['channel_binding=maybe', /channel_binding "maybe" is not one of disable, prefer, require/],
    ['sslrootcert=system sslmode=verify-ca', /weak sslmode "verify-ca" may not be used with sslrootcert=system/],
    ['sslnegotiation=direct sslmode=prefer', /weak sslmode "prefer" may not be used with sslnegotiation=direct/],
    ['ssl_min_protocol_version=TLSv1.3 ssl_max_protocol_version=TLSv1.2', /invalid SSL protocol version range/],
    ['channel_binding=require sslmode=disable', /channel_binding=require needs TLS/],
  ];
  for (const [text, message] of refusals) {
    test(`refused: ${text}`, () => {
      assert.throws(
        () => parseConninfo(`host=h ${text}`, 'source', {}),
        (e: Error) => e instanceof ConfigError && e.exitCode === 2 && e.message.startsWith('source: ') && message.test(e.message),
      );
    });
  }

  test('a read-only target_session_attrs is refused for the target only', () => {
    assert.throws(() => parseConninfo('host=a,b target_session_attrs=standby', 'target', {}), /is refused for the target: pgsub writes into it/);
    assert.equal(parseConninfo('host=a,b target_session_attrs=prefer-standby', 'source', {}).settings.target_session_attrs, 'prefer-standby');
  });

  test('the values libpq takes as defaults are accepted', () => {
    const info = parseConninfo(
      'host=h keepalives_interval=0 gssencmode=prefer gssdelegation=0 max_protocol_version=3.0 sslcertmode=disable sslcompression=0 client_encoding=UTF8',
      'source',
      {},
    );
    assert.equal(info.settings.gssencmode, 'prefer');
  });

  test('sslrootcert=system makes verify-full the default sslmode (PostgreSQL 16)', () => {
    assert.equal(parseConninfo('host=h sslrootcert=system', 'source', {}).sslmode, 'verify-full');
  });

  test('an error about a secret keyword does not echo its value', () => {
    assert.throws(
      () => parseConninfo('host=h oauth_client_secret=hunter2', 'source', {}),
      (e: Error) => !e.message.includes('hunter2'),
    );
  });

  test("pg_dump's keywords: every setting but the passwords", () => {
    const info = parseConninfo('host=a,b port=1,2 user=u dbname=d password=pw sslpassword=kp require_auth=scram-sha-256 sslmode=verify-full', 'source', {});
    const kw = conninfoKeywords(info);
    assert.deepEqual(kw, { host: 'a,b', port: '1,2', dbname: 'd', user: 'u', sslmode: 'verify-full', require_auth: 'scram-sha-256' });
  });
});

describe('require_auth', () => {
  test('a list allows only its methods; negations forbid theirs', () => {
    assert.equal(authAllowed(undefined, 'password'), true);
    assert.equal(authAllowed('scram-sha-256', 'scram-sha-256'), true);
    assert.equal(authAllowed('scram-sha-256', 'password'), false);
    assert.equal(authAllowed('scram-sha-256', 'none'), false);
    assert.equal(authAllowed('md5,none', 'none'), true);
    assert.equal(authAllowed('!password', 'password'), false);
    assert.equal(authAllowed('!password', 'none'), true);
    assert.equal(authAllowed('!password,!none', 'none'), false);
  });
});

describe('password file', () => {
  test('first matching line, * and escapes; loose permissions ignore the file with a warning', () => {
    const dir = tmp();
    try {
      const file = path.join(dir, 'pgpass');
      fs.writeFileSync(file, '# comment\nother:*:*:*:no\nlocalhost:5432:shop:alice:a\\:b\\\\c\n*:*:*:alice:fallback\n', { mode: 0o600 });
      const info = parseConninfo(`host=localhost dbname=shop user=alice passfile=${file}`, 'source', {});
      assert.deepEqual(passfilePassword(info, info.hosts[0]!), { password: 'a:b\\c' });
      const sock = parseConninfo(`host=/tmp dbname=shop user=alice passfile=${file}`, 'source', {});
      assert.deepEqual(passfilePassword(sock, sock.hosts[0]!), { password: 'a:b\\c' }, 'a socket directory matches localhost');
      const other = parseConninfo(`host=db dbname=x user=alice passfile=${file}`, 'source', {});
      assert.deepEqual(passfilePassword(other, other.hosts[0]!), { password: 'fallback' });
      fs.chmodSync(file, 0o640);
      const loose = passfilePassword(info, info.hosts[0]!);
      assert.equal(loose.password, undefined);
      assert.match(loose.warning ?? '', /has group or world access; permissions should be u=rw \(0600\) or less/);
      const home = parseConninfo('host=localhost dbname=shop user=alice', 'source', { HOME: dir });
      assert.deepEqual(passfilePassword(home, home.hosts[0]!), {}, 'no ~/.pgpass');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('TLS plan', () => {
  test('verify-full and verify-ca need a root certificate; require uses ~/.postgresql/root.crt when it exists', () => {
    const home = tmp();
    try {
      const full = parseConninfo('host=db.example.com sslmode=verify-full', 'source', { HOME: home });
      assert.throws(
        () => tlsPlan(full, full.hosts[0]!),
        (e: Error) => e instanceof HandshakeFailure && e.kind === 'tls' && /root certificate file ".*\/\.postgresql\/root\.crt" does not exist/.test(e.message),
      );
      const require = parseConninfo('host=db.example.com sslmode=require', 'source', { HOME: home });
      assert.equal(tlsPlan(require, require.hosts[0]!).options.rejectUnauthorized, false);
      fs.mkdirSync(path.join(home, '.postgresql'));
      fs.writeFileSync(path.join(home, '.postgresql', 'root.crt'), 'PEM');
      const plan = tlsPlan(require, require.hosts[0]!);
      assert.equal(plan.options.rejectUnauthorized, true, 'libpq verifies the chain when root.crt exists');
      assert.equal(plan.verifyHost, null);
      assert.equal(tlsPlan(full, full.hosts[0]!).verifyHost, 'db.example.com');
      const ca = parseConninfo('host=db.example.com sslmode=verify-ca', 'source', { HOME: home });
      assert.equal(tlsPlan(ca, ca.hosts[0]!).verifyHost, null, 'verify-ca checks no host name');
    } finally {
      fs.rmSync(home, { recursive: true, force: true });
    }
  });

  test('SNI carries a host name, never an IP address, and not with sslsni=0', () => {
    const home = tmp();
    try {
      const name = parseConninfo('host=db.example.com sslmode=require', 'source', { HOME: home });
      assert.equal(tlsPlan(name, name.hosts[0]!).options.servername, 'db.example.com');
      const ip = parseConninfo('host=127.0.0.1 sslmode=require', 'source', { HOME: home });
      assert.equal(tlsPlan(ip, ip.hosts[0]!).options.servername, undefined);
      const off = parseConninfo('host=db.example.com sslmode=require sslsni=0', 'source', { HOME: home });
      assert.equal(tlsPlan(off, off.hosts[0]!).options.servername, undefined);
    } finally {
      fs.rmSync(home, { recursive: true, force: true });
    }
  });

  test('client certificate: none without the file; its key must exist and be private', () => {
    const dir = tmp();
    try {
      const cert = path.join(dir, 'c.crt');
      const key = path.join(dir, 'c.key');
      const missing = parseConninfo(`host=h sslmode=require sslcert=${cert} sslkey=${key}`, 'source', { HOME: dir });
      assert.equal(tlsPlan(missing, missing.hosts[0]!).options.cert, undefined, 'a missing certificate file means none, as in libpq');
      fs.writeFileSync(cert, 'CERT');
      assert.throws(() => tlsPlan(missing, missing.hosts[0]!), /certificate present, but not private key file/);
      fs.writeFileSync(key, 'KEY', { mode: 0o644 });
      fs.chmodSync(key, 0o644);
      assert.throws(() => tlsPlan(missing, missing.hosts[0]!), /has group or world access; file must have permissions u=rw \(0600\)/);
      fs.chmodSync(key, 0o600);
      const withPass = parseConninfo(`host=h sslmode=require sslcert=${cert} sslkey=${key} sslpassword=kp`, 'source', { HOME: dir });
      const plan = tlsPlan(withPass, withPass.hosts[0]!);
      assert.equal(String(plan.options.cert), 'CERT');
      assert.equal(plan.options.passphrase, 'kp');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
