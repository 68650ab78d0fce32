/**
 * Connection strings: the two libpq forms (URI and key=value) normalised to one ConnInfo,
 * libpq environment fallbacks (always passed explicitly, never read from this process),
 * errors that name which side ('source' / 'target') is wrong, the redaction helpers that
 * stand between a password and a log line, and the TLS options chosen per sslmode.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { type ConnInfo, parseConninfo, redactConninfo, redactSecrets } from '../../src/config/conninfo.js';
import { ConfigError } from '../../src/errors.js';

/** The fields the old tests compared; hosts, settings and the rest are checked separately. */
function core(info: ConnInfo): Record<string, unknown> {
  const out: Record<string, unknown> = { host: info.host, port: info.port, user: info.user, database: info.database, sslmode: info.sslmode };
  if (info.password !== undefined) out.password = info.password;
  if (info.applicationName !== undefined) out.applicationName = info.applicationName;
  if (info.connectTimeoutSeconds !== undefined) out.connectTimeoutSeconds = info.connectTimeoutSeconds;
  return out;
}

/** No libpq variables and no USER: defaults must come from the code, not the test machine. */
const NO_ENV: NodeJS.ProcessEnv = {};

function assertConfigError(fn: () => unknown, side: 'source' | 'target', pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    assert.equal(err.code, 'PGSUB_CONFIG_INVALID');
    assert.ok(err.message.startsWith(`${side}: `), `message names ${side}: ${err.message}`);
    assert.equal(err.context.key, side);
    assert.match(err.message, pattern);
    return true;
  });
}

describe('parseConninfo: URI form', () => {
  test('all parts, with query parameters', () => {
    assert.deepEqual(core(parseConninfo('postgresql://alice:pw@db.example.com:6543/shop?sslmode=require&application_name=app1&connect_timeout=7', 'source', NO_ENV)), {
      host: 'db.example.com',
      port: 6543,
      user: 'alice',
      password: 'pw',
      database: 'shop',
      sslmode: 'require',
      applicationName: 'app1',
      connectTimeoutSeconds: 7,
    });
  });

  test('postgres:// and upper-case scheme are URIs too', () => {
    assert.equal(parseConninfo('postgres://bob@h/d', 'source', NO_ENV).user, 'bob');
    assert.equal(parseConninfo('  POSTGRESQL://bob@h/d  ', 'source', NO_ENV).database, 'd');
  });

  test('percent-encoding in user, password, database and query values', () => {
    const info = parseConninfo('postgresql://us%40er:p%40ss%3Aw%2Fd%20x@h/my%20db?application_name=a%26b%3Dc', 'source', NO_ENV);
    assert.equal(info.user, 'us@er');
    assert.equal(info.password, 'p@ss:w/d x');
    assert.equal(info.database, 'my db');
    assert.equal(info.applicationName, 'a&b=c');
  });

  test("'+' in a query value stays a plus (libpq percent-decodes only)", () => {
    assert.equal(parseConninfo('postgresql://h/db?application_name=a+b', 'source', NO_ENV).applicationName, 'a+b');
  });

  test('IPv6 host in brackets, with and without port', () => {
    const withPort = parseConninfo('postgresql://u@[::1]:5433/db', 'target', NO_ENV);
    assert.equal(withPort.host, '::1');
    assert.equal(withPort.port, 5433);
    const noPort = parseConninfo('postgresql://u@[2001:db8::7]/db', 'target', NO_ENV);
    assert.equal(noPort.host, '2001:db8::7');
    assert.equal(noPort.port, 5432);
  });

  test('unix-socket directory as a percent-encoded host or a host= parameter', () => {
    assert.equal(parseConninfo('postgresql://%2Fvar%2Frun%2Fpostgresql/db', 'source', NO_ENV).host, '/var/run/postgresql');
    const q = parseConninfo('postgresql:///db?host=/tmp/sock&port=7777', 'source', NO_ENV);
    assert.equal(q.host, '/tmp/sock');
    assert.equal(q.port, 7777);
    assert.equal(q.database, 'db');
  });

  test('the user info ends at the first @, as in libpq (a raw @ in a password must be %40)', () => {
    const info = parseConninfo('postgresql://u:p@ss@h/db', 'source', NO_ENV);
    assert.equal(info.password, 'p');
    assert.equal(info.host, 'ss@h');
    assert.equal(parseConninfo('postgresql://u:p%40ss@h/db', 'source', NO_ENV).password, 'p@ss');
  });

  test('an unparsable URI is a ConfigError naming the side', () => {
    assertConfigError(() => parseConninfo('postgresql://h:99999/db', 'target', NO_ENV), 'target', /port "99999" is not a TCP port/);
    assertConfigError(() => parseConninfo('postgresql://h/db?sslmode', 'source', NO_ENV), 'source', /sslmode/);
    assertConfigError(() => parseConninfo('postgresql://[::1/db', 'source', NO_ENV), 'source', /missing "]"/);
  });
});

describe('parseConninfo: key=value form', () => {
  test('plain values, spaces around =, any order', () => {
    assert.deepEqual(core(parseConninfo('dbname = shop  host=10.0.0.5 port= 6000 user=carol sslmode=disable', 'source', NO_ENV)), {
      host: '10.0.0.5',
      port: 6000,
      user: 'carol',
      database: 'shop',
      sslmode: 'disable',
    });
  });

  test('quoted values with spaces, escaped quotes and backslashes', () => {
    const info = parseConninfo(String.raw`host=h password='it\'s a \\secret' application_name='my app' dbname=''`, 'target', NO_ENV);
    assert.equal(info.password, String.raw`it's a \secret`);
    assert.equal(info.applicationName, 'my app');
    // An explicitly empty dbname is a value, not "unset".
    assert.equal(info.database, '');
  });

  test('backslash escapes in unquoted values', () => {
    assert.equal(parseConninfo(String.raw`password=a\ b\\c`, 'source', NO_ENV).password, String.raw`a b\c`);
  });

  test('malformed text is a ConfigError naming the side and where', () => {
    assertConfigError(() => parseConninfo('host=h junk', 'source', NO_ENV), 'source', /expected key=value at character 8/);
    assertConfigError(() => parseConninfo("password='open", 'target', NO_ENV), 'target', /unterminated quoted value for password/);
  });

  test('an unknown keyword is rejected like libpq does (a misspelt sslmode must not go unnoticed)', () => {
    assertConfigError(() => parseConninfo('host=h ssl_mode=verify-full', 'target', NO_ENV), 'target', /invalid connection option "ssl_mode"/);
    assertConfigError(() => parseConninfo('postgresql://h/db?sslmod=require', 'source', NO_ENV), 'source', /invalid connection option "sslmod"/);
    // libpq keywords pgsub does not use are accepted.
    assert.equal(parseConninfo('host=h keepalives=1 target_session_attrs=any', 'source', NO_ENV).host, 'h');
  });
});

describe('parseConninfo: defaults and libpq environment fallbacks', () => {
  const env = { PGHOST: 'envhost', PGPORT: '6001', PGUSER: 'envuser', PGDATABASE: 'envdb', PGPASSWORD: 'envpw', PGSSLMODE: 'require', PGAPPNAME: 'envapp', PGCONNECT_TIMEOUT: '3' };

  test('an empty conninfo takes everything from the env argument', () => {
    assert.deepEqual(core(parseConninfo('', 'source', env)), {
      host: 'envhost',
      port: 6001,
      user: 'envuser',
      database: 'envdb',
      password: 'envpw',
      sslmode: 'require',
      applicationName: 'envapp',
      connectTimeoutSeconds: 3,
    });
  });

  test('the conninfo wins over the environment, field by field', () => {
    const kv = parseConninfo('host=h user=u', 'source', env);
    assert.equal(kv.host, 'h');
    assert.equal(kv.user, 'u');
    assert.equal(kv.port, 6001);
    assert.equal(kv.database, 'envdb');
    assert.equal(kv.password, 'envpw');
    const uri = parseConninfo('postgresql://u2:pw2@h2:7000/d2?sslmode=disable', 'source', env);
    assert.deepEqual([uri.host, uri.port, uri.user, uri.password, uri.database, uri.sslmode], ['h2', 7000, 'u2', 'pw2', 'd2', 'disable']);
  });

  test('without environment: localhost:5432, USER or postgres, dbname = user, sslmode prefer, no password', () => {
    assert.deepEqual(core(parseConninfo('', 'source', NO_ENV)), { host: 'localhost', port: 5432, user: 'postgres', database: 'postgres', sslmode: 'prefer' });
    const info = parseConninfo('host=h', 'source', { USER: 'osuser' });
    assert.equal(info.user, 'osuser');
    assert.equal(info.database, 'osuser');
    assert.equal('password' in info, false);
  });

  test('the process environment is not consulted when an env argument is given', () => {
    const saved = process.env.PGHOST;
    process.env.PGHOST = 'from-process-env';
    try {
      assert.equal(parseConninfo('', 'source', NO_ENV).host, 'localhost');
    } finally {
      if (saved === undefined) delete process.env.PGHOST;
      else process.env.PGHOST = saved;
    }
  });
});

describe('parseConninfo: bad port, sslmode, connect_timeout', () => {
  for (const port of ['abc', '0', '65536', '-1', '54.5']) {
    test(`port ${JSON.stringify(port)}`, () => {
      assertConfigError(() => parseConninfo(`host=h port='${port}'`, 'source', NO_ENV), 'source', /is not a TCP port/);
    });
  }

  test('a bad PGPORT is reported too, naming the side it was used for', () => {
    assertConfigError(() => parseConninfo('host=h', 'target', { PGPORT: 'x' }), 'target', /port "x"/);
  });

  test("sslmode not one of libpq's six", () => {
    assertConfigError(
      () => parseConninfo('host=h sslmode=required', 'target', NO_ENV),
      'target',
      /sslmode "required" is not one of disable, allow, prefer, require, verify-ca, verify-full/,
    );
    assertConfigError(() => parseConninfo('postgresql://h/db?sslmode=on', 'source', NO_ENV), 'source', /sslmode "on"/);
    assertConfigError(() => parseConninfo('host=h', 'source', { PGSSLMODE: 'REQUIRE' }), 'source', /sslmode "REQUIRE"/);
  });

  test('connect_timeout must be a whole number of seconds', () => {
    assertConfigError(() => parseConninfo('host=h connect_timeout=soon', 'target', NO_ENV), 'target', /connect_timeout "soon"/);
    assertConfigError(() => parseConninfo('host=h connect_timeout=2.5', 'source', NO_ENV), 'source', /connect_timeout/);
    // libpq: zero or negative waits for ever.
    assert.equal(parseConninfo('host=h connect_timeout=-2', 'source', NO_ENV).connectTimeoutSeconds, 0);
    assert.equal(parseConninfo('host=h connect_timeout=0', 'source', NO_ENV).connectTimeoutSeconds, 0);
  });

  test('errors never echo the password', () => {
    for (const text of ['host=h password=hunter2 port=x', 'postgresql://u:hunter2@h/db?sslmode=bad', 'password=hunter2 oops']) {
      assert.throws(
        () => parseConninfo(text, 'source', NO_ENV),
        (err: Error) => !err.message.includes('hunter2'),
      );
    }
  });
});

describe('redactConninfo', () => {
  test('shows where it connects, never the password', () => {
    const info = parseConninfo("host=db port=6000 dbname=shop user=alice password='s3cr3t pw' sslmode=require", 'source', NO_ENV);
    const text = redactConninfo(info);
    assert.equal(text, 'host=db port=6000 dbname=shop user=alice sslmode=require');
    assert.ok(!text.includes('s3cr3t'));
    assert.ok(!/password/i.test(text));
  });

  test('a password from PGPASSWORD is not shown either', () => {
    const text = redactConninfo(parseConninfo('postgresql://u@h/db', 'target', { PGPASSWORD: 'envsecret' }));
    assert.ok(!text.includes('envsecret'), text);
  });
});

describe('redactSecrets', () => {
  const cases: [string, string, string][] = [
    ['URI', 'connect to postgresql://alice:hunter2@db:5432/shop failed', 'connect to postgresql://alice:****@db:5432/shop failed'],
    ['postgres:// URI without path', 'postgres://alice:hunter2@db', 'postgres://alice:****@db'],
    ['URI with a raw @ in the password', 'postgresql://u:p@hunter2@h/db', 'postgresql://u:****@h/db'],
    ['URI with an empty user', 'postgresql://:hunter2@h/db', 'postgresql://:****@h/db'],
    ['two URIs', 'postgresql://a:hunter2@h1/x -> postgresql://b:hunter2@h2/y', 'postgresql://a:****@h1/x -> postgresql://b:****@h2/y'],
    ['password in a URI query', 'postgresql://u@h/db?password=hunter2', 'postgresql://u@h/db?password=****'],
    ['key=value', 'host=h password=hunter2 user=u', 'host=h password=**** user=u'],
    ['key = value with spaces', 'host=h password = hunter2 user=u', 'host=h password = **** user=u'],
    ['quoted with spaces and escaped quotes', String.raw`host=h password='hun ter\'2' user=u`, 'host=h password=**** user=u'],
    ['upper-case key', 'PASSWORD=hunter2', 'PASSWORD=****'],
    ['sslpassword', 'host=h sslpassword=hunter2', 'host=h sslpassword=****'],
  ];
  for (const [name, input, want] of cases) {
    test(name, () => {
      const out = redactSecrets(input);
      assert.equal(out, want);
      assert.ok(!out.includes('hunter') && !out.includes('ter'), out);
    });
  }

  test('text without secrets is unchanged', () => {
    for (const text of ['password authentication failed for user "alice"', 'postgresql://alice@db/shop', 'host=h user=u']) {
      assert.equal(redactSecrets(text), text);
    }
  });
});

test('password=credential:NAME reads the systemd credential from $CREDENTIALS_DIRECTORY', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-cred-'));
  try {
    fs.writeFileSync(path.join(dir, 'source'), 's3cr3t\n', { mode: 0o600 });
    const env = { CREDENTIALS_DIRECTORY: dir };
    assert.equal(parseConninfo('host=db user=rep password=credential:source', 'source', env).password, 's3cr3t');
    assert.equal(parseConninfo('postgresql://rep:credential%3Asource@db/app', 'source', env).password, 's3cr3t');
    assert.throws(() => parseConninfo('host=db password=credential:target', 'target', env), /cannot read credential target/);
    assert.throws(() => parseConninfo('host=db password=credential:source', 'source', {}), /\$CREDENTIALS_DIRECTORY is not set/);
    assert.throws(() => parseConninfo('host=db password=credential:../etc/passwd', 'source', env), /is not a file name/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
