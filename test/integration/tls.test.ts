/**
 * Connections as libpq makes them, checked against libpq itself: a CA, a server
 * certificate for `localhost`, a revoked one, a client certificate (test/harness/certs.ts),
 * two PostgreSQL 18 servers with ssl = on, hostssl rules, scram-sha-256, md5, password,
 * clientcert=verify-full and a CRL (the second one serves the revoked certificate and is
 * read-only). Every case of the table is run through psql linked against PostgreSQL 18's
 * libpq (the one the npm server package ships, by LD_LIBRARY_PATH; the test logs which
 * libpq.so answered) and through pgsub — `pgsub run` until it streams, with the case as the
 * source (into a plain server) and then as the target (from another plain server), then
 * `pgsub status` with the case on those sides — and pgsub's verdict
 * (connects, or refused for TLS, authentication or configuration) must equal psql's.
 * Keywords pgsub refuses by name are the exception the table states: psql connects,
 * pgsub exits 2 naming the keyword (one side suffices: the refusal is the parser's). The
 * cases on the revoked, read-only server are the source's. No password, sslpassword or key content may appear
 * in anything pgsub prints.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CLIENT_KEY_PASSPHRASE, createTestCa, type TestCa } from '../harness/certs.js';
import { type Cluster, pgBinDir, pickPort, spawnPgsub, startCluster, stopAllClusters } from '../harness/index.js';

type Verdict = 'ok' | 'tls' | 'auth' | 'config';

const PW = { scram: 'scram-Secret-71', cert: 'cert-Secret-72', md5: 'md5-Secret-73', cleartext: 'clear-Secret-74' };
const SECRETS = [...Object.values(PW), CLIENT_KEY_PASSPHRASE];

interface Env {
  a: number;
  b: number;
  down: number;
  ca: TestCa;
}

interface Case {
  name: string;
  /** The conninfo for database `db`; `home` is this case's $HOME. */
  conn: (e: Env, db: string, home: string) => string;
  want: Verdict;
  /** psql's verdict when it differs by design (a keyword pgsub refuses). */
  psql?: Verdict;
  /** Files in $HOME (relative path → source file or text, and mode). */
  home?: (e: Env) => [string, string | { text: string }, number][];
  env?: (e: Env, home: string) => Record<string, string>;
  /** Which sides to run: some cases (a read-only first host) are the source's only. */
  sides?: ('source' | 'target')[];
  /** A word pgsub's refusal must name. */
  names?: string;
}

const scram = (e: Env, db: string, extra: string) => `host=localhost port=${e.a} dbname=${db} user=scram_user password=${PW.scram} ${extra}`;
const certUser = (e: Env, db: string, extra: string) =>
  `host=localhost port=${e.a} dbname=${db} user=cert_user password=${PW.cert} sslmode=verify-full sslrootcert=${e.ca.caCert} ${extra}`;
const pgpassLine = (port: number) => `localhost:${port}:*:scram_user:${PW.scram}\n`;

const CASES: Case[] = [
  { name: 'verify-full, right host name', conn: (e, db) => scram(e, db, `sslmode=verify-full sslrootcert=${e.ca.caCert}`), want: 'ok' },
  {
    name: 'verify-full, wrong host name (127.0.0.1)',
    conn: (e, db) => scram(e, db, `sslmode=verify-full sslrootcert=${e.ca.caCert}`).replace('host=localhost', 'host=127.0.0.1'),
    want: 'tls',
  },
  {
    name: 'verify-ca with a root certificate, IP address',
    conn: (e, db) => scram(e, db, `sslmode=verify-ca sslrootcert=${e.ca.caCert}`).replace('host=localhost', 'host=127.0.0.1'),
    want: 'ok',
  },
  { name: 'verify-ca without a root certificate', conn: (e, db) => scram(e, db, 'sslmode=verify-ca'), want: 'tls' },
  { name: 'verify-ca with ~/.postgresql/root.crt', conn: (e, db) => scram(e, db, 'sslmode=verify-ca'), home: (e) => [['.postgresql/root.crt', e.ca.caCert, 0o644]], want: 'ok' },
  {
    name: 'revoked server certificate (sslcrl)',
    conn: (e, db) => scram(e, db, `sslmode=verify-full sslrootcert=${e.ca.caCert} sslcrl=${e.ca.crl}`).replace(`port=${e.a}`, `port=${e.b}`),
    want: 'tls',
    sides: ['source'],
  },
  {
    name: 'revoked server certificate (~/.postgresql/root.crl)',
    conn: (e, db) => scram(e, db, 'sslmode=verify-ca').replace(`port=${e.a}`, `port=${e.b}`),
    home: (e) => [
      ['.postgresql/root.crt', e.ca.caCert, 0o644],
      ['.postgresql/root.crl', e.ca.crl, 0o644],
    ],
    want: 'tls',
    sides: ['source'],
  },
  { name: 'client certificate required and given', conn: (e, db) => certUser(e, db, `sslcert=${e.ca.clientCert} sslkey=${e.ca.clientKey}`), want: 'ok' },
  { name: 'client certificate required and missing', conn: (e, db) => certUser(e, db, ''), want: 'tls' },
  {
    name: 'client key with loose permissions',
    conn: (e, db, home) => certUser(e, db, `sslcert=${e.ca.clientCert} sslkey=${home}/loose.key`),
    home: (e) => [['loose.key', e.ca.clientKey, 0o644]],
    want: 'tls',
  },
  {
    name: 'client certificate from ~/.postgresql/postgresql.crt and .key',
    conn: (e, db) => certUser(e, db, ''),
    home: (e) => [
      ['.postgresql/postgresql.crt', e.ca.clientCert, 0o644],
      ['.postgresql/postgresql.key', e.ca.clientKey, 0o600],
    ],
    want: 'ok',
  },
  {
    name: 'encrypted client key with sslpassword',
    conn: (e, db) => certUser(e, db, `sslcert=${e.ca.clientCert} sslkey=${e.ca.clientEncryptedKey} sslpassword=${CLIENT_KEY_PASSPHRASE}`),
    want: 'ok',
  },
  {
    name: 'channel_binding=require against md5',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=md5_user password=${PW.md5} sslmode=require channel_binding=require`,
    want: 'auth',
  },
  { name: 'channel_binding=require against scram over TLS', conn: (e, db) => scram(e, db, 'sslmode=require channel_binding=require'), want: 'ok' },
  {
    name: 'require_auth=scram-sha-256 against a cleartext-password server',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=pw_user password=${PW.cleartext} sslmode=require require_auth=scram-sha-256`,
    want: 'auth',
  },
  {
    name: 'require_auth=!password against a cleartext-password server',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=pw_user password=${PW.cleartext} sslmode=require require_auth=!password`,
    want: 'auth',
  },
  {
    name: 'require_auth=password against a cleartext-password server',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=pw_user password=${PW.cleartext} sslmode=require require_auth=password`,
    want: 'ok',
  },
  { name: 'require_auth=!md5,!password against scram', conn: (e, db) => scram(e, db, 'sslmode=require require_auth=!md5,!password'), want: 'ok' },
  { name: 'a wrong password', conn: (e, db) => scram(e, db, 'sslmode=require').replace(PW.scram, 'wrong-one'), want: 'auth' },
  {
    name: 'passfile with 0600',
    conn: (e, db, home) => `host=localhost port=${e.a} dbname=${db} user=scram_user sslmode=require passfile=${home}/pw`,
    home: (e) => [['pw', { text: pgpassLine(e.a) }, 0o600]],
    want: 'ok',
  },
  {
    name: 'passfile readable by others',
    conn: (e, db, home) => `host=localhost port=${e.a} dbname=${db} user=scram_user sslmode=require passfile=${home}/pw`,
    home: (e) => [['pw', { text: pgpassLine(e.a) }, 0o644]],
    want: 'auth',
  },
  {
    name: '~/.pgpass with 0600',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=scram_user sslmode=require`,
    home: (e) => [['.pgpass', { text: pgpassLine(e.a) }, 0o600]],
    want: 'ok',
  },
  {
    name: '~/.pgpass readable by the group',
    conn: (e, db) => `host=localhost port=${e.a} dbname=${db} user=scram_user sslmode=require`,
    home: (e) => [['.pgpass', { text: pgpassLine(e.a) }, 0o640]],
    want: 'auth',
  },
  {
    name: 'a service file entry (PGSERVICEFILE)',
    conn: (_e, db) => `service=tls_case dbname=${db}`,
    home: (e) => [
      ['services.conf', { text: `[tls_case]\nhost=localhost\nport=${e.a}\nuser=scram_user\npassword=${PW.scram}\nsslmode=verify-full\nsslrootcert=${e.ca.caCert}\n` }, 0o600],
    ],
    env: (_e, home) => ({ PGSERVICEFILE: path.join(home, 'services.conf') }),
    want: 'ok',
  },
  {
    name: 'two hosts, the first down',
    conn: (e, db) => scram(e, db, 'sslmode=require').replace(`host=localhost port=${e.a}`, `host=localhost,localhost port=${e.down},${e.a}`),
    want: 'ok',
  },
  {
    name: 'two hosts, the first read-only, target_session_attrs=read-write',
    conn: (e, db) => scram(e, db, 'sslmode=require target_session_attrs=read-write').replace(`host=localhost port=${e.a}`, `host=localhost,localhost port=${e.b},${e.a}`),
    want: 'ok',
    sides: ['source'],
  },
  { name: 'unsupported: requirepeer', conn: (e, db) => scram(e, db, 'sslmode=require requirepeer=postgres'), want: 'config', psql: 'ok', names: 'requirepeer', sides: ['source'] },
  {
    name: 'unsupported: keepalives_count',
    conn: (e, db) => scram(e, db, 'sslmode=require keepalives_count=3'),
    want: 'config',
    psql: 'ok',
    names: 'keepalives_count',
    sides: ['target'],
  },
  { name: 'a misspelt keyword', conn: (e, db) => scram(e, db, 'sslmod=require'), want: 'config', names: 'sslmod', sides: ['source'] },
];

const HBA = `local all all trust
host all postgres 127.0.0.1/32 trust
hostssl all scram_user 127.0.0.1/32 scram-sha-256
hostssl all cert_user 127.0.0.1/32 scram-sha-256 clientcert=verify-full
host all md5_user 127.0.0.1/32 md5
host all pw_user 127.0.0.1/32 password
`;

let env: Env;
let a: Cluster;
let b: Cluster;
/** Plain servers for the other side of a run: the target of source-side runs, the source of target-side runs (no run waits on another's transactions). */
let plainTarget: Cluster;
let plainSource: Cluster;
let psql: string;
let libDir: string;
const homes: string[] = [];

/** Every run leaves a slot on its source and an origin on its target (≈ 60 in all; PostgreSQL 18 counts origins apart). */
const MANY_SLOTS = { max_replication_slots: '120', max_active_replication_origins: '120', max_wal_senders: '60' };

function tlsSettings(cert: string, key: string): Record<string, string> {
  return { ssl: 'on', ssl_cert_file: cert, ssl_key_file: key, ssl_ca_file: 'ca.crt', ssl_crl_file: 'crl.pem', password_encryption: 'scram-sha-256', ...MANY_SLOTS };
}

async function prepare(c: Cluster): Promise<void> {
  await c.query(`
    CREATE ROLE scram_user LOGIN SUPERUSER REPLICATION PASSWORD '${PW.scram}';
    CREATE ROLE cert_user LOGIN SUPERUSER REPLICATION PASSWORD '${PW.cert}';
    CREATE ROLE pw_user LOGIN SUPERUSER REPLICATION PASSWORD '${PW.cleartext}';
    SET password_encryption = 'md5';
    CREATE ROLE md5_user LOGIN SUPERUSER REPLICATION PASSWORD '${PW.md5}';`);
  await c.createDatabase('pub');
  await c.createDatabase('tgt');
  await c.query('CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION p FOR TABLE t; INSERT INTO t VALUES (1, $$a$$)', [], 'pub');
  await c.query('CREATE TABLE t (id int PRIMARY KEY, v text)', [], 'tgt');
}

function findPsql(): string {
  const dirs = fs.existsSync('/usr/lib/postgresql') ? fs.readdirSync('/usr/lib/postgresql').sort((x, y) => Number(y) - Number(x)) : [];
  for (const d of dirs) {
    const p = `/usr/lib/postgresql/${d}/bin/psql`;
    if (fs.existsSync(p)) return p;
  }
  return 'psql';
}

before(async () => {
  const ca = createTestCa();
  const files = (cert: string, key: string) => ({
    'server.crt': fs.readFileSync(cert),
    'server.key': fs.readFileSync(key),
    'ca.crt': fs.readFileSync(ca.caCert),
    'crl.pem': fs.readFileSync(ca.crl),
  });
  [a, b] = await Promise.all([
    startCluster({ major: 18, name: 'tls-a', hba: HBA, files: files(ca.serverCert, ca.serverKey), settings: tlsSettings('server.crt', 'server.key') }),
    startCluster({ major: 18, name: 'tls-b', hba: HBA, files: files(ca.revokedCert, ca.revokedKey), settings: tlsSettings('server.crt', 'server.key') }),
  ]);
  [plainTarget, plainSource] = await Promise.all([
    startCluster({ major: 18, name: 'tls-tgt', settings: MANY_SLOTS }),
    startCluster({ major: 18, name: 'tls-src', settings: MANY_SLOTS }),
  ]);
  await Promise.all([prepare(a), prepare(b), prepare(plainTarget), prepare(plainSource)]);
  await b.query('ALTER SYSTEM SET default_transaction_read_only = on');
  await b.query('SELECT pg_catalog.pg_reload_conf()');
  env = { a: a.port, b: b.port, down: await pickPort(), ca };
  psql = findPsql();
  libDir = path.join(await pgBinDir(18), '..', 'lib');
  if (!fs.existsSync(path.join(libDir, 'libpq.so.5'))) libDir = path.resolve('node_modules/pg18/native/lib');
  const linked = execFileSync('ldd', [psql], { env: { ...process.env, LD_LIBRARY_PATH: libDir }, encoding: 'utf8' })
    .split('\n')
    .find((l) => l.includes('libpq.so'));
  const version = fs.readdirSync(libDir).find((f) => /^libpq\.so\.5\.\d+$/.test(f));
  console.log(`psql ${psql} answers through ${linked?.trim()} (${version}; PostgreSQL 18's libpq)`);
  assert.match(String(linked), new RegExp(libDir.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')));
});

after(async () => {
  await stopAllClusters();
  env?.ca.remove();
  for (const h of homes) fs.rmSync(h, { recursive: true, force: true });
});

function makeHome(c: Case): string {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-tls-home-'));
  homes.push(home);
  for (const [rel, from, mode] of c.home?.(env) ?? []) {
    const file = path.join(home, rel);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, typeof from === 'string' ? fs.readFileSync(from) : from.text);
    fs.chmodSync(file, mode);
  }
  return home;
}

function psqlVerdict(text: string, code: number): Verdict | string {
  if (code === 0) return 'ok';
  if (/invalid connection option|invalid \w+ value|not compiled in|weak sslmode/i.test(text)) return 'config';
  if (/certificate|private key|SSL error|does not match host name|SSL SYSCALL/i.test(text)) return 'tls';
  if (/authentication|password|channel binding|pg_hba\.conf/i.test(text)) return 'auth';
  return `unclassified: ${text}`;
}

function pgsubVerdict(output: string): Verdict | string {
  const code = /pgsub: (PGSUB_[A-Z_]+):/.exec(output)?.[1] ?? /"code":"(PGSUB_[A-Z_]+)"/.exec(output)?.[1];
  if (code === 'PGSUB_TLS_FAILED') return 'tls';
  if (code === 'PGSUB_AUTH_FAILED') return 'auth';
  if (code === 'PGSUB_CONFIG_INVALID') return 'config';
  return `unclassified (${code ?? 'no code'}): ${output.slice(-600)}`;
}

function runPsql(conn: string, home: string, extra: Record<string, string>): Promise<{ code: number; text: string }> {
  return new Promise((resolve) => {
    execFile(
      psql,
      ['-X', '-w', '-A', '-t', '-c', 'SELECT 1', conn],
      { env: { PATH: process.env.PATH ?? '', HOME: home, LD_LIBRARY_PATH: libDir, PGCONNECT_TIMEOUT: '10', ...extra }, timeout: 30_000 },
      (err, stdout, stderr) => resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, text: `${stdout}${stderr}` }),
    );
  });
}

let serial = 0;

function settingsFor(c: Case, sides: readonly ('source' | 'target')[], home: string, extra: Record<string, string>): Record<string, string> {
  const sub = `tls_${sides.map((x) => x[0]).join('')}_${++serial}`;
  const trusted = (cluster: Cluster, db: string) => `host=127.0.0.1 port=${cluster.port} dbname=${db} user=postgres sslmode=disable`;
  return {
    PGSUB_SOURCE: sides.includes('source') ? c.conn(env, 'pub', home) : trusted(plainSource, 'pub'),
    PGSUB_TARGET: sides.includes('target') ? c.conn(env, 'tgt', home) : trusted(plainTarget, 'tgt'),
    PGSUB_PUBLICATION: 'p',
    PGSUB_SUBSCRIPTION: sub,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATE_DIR: path.join(home, `state-${sub}`),
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '1',
    HOME: home,
    ...extra,
  };
}

/** `pgsub run` until it streams (→ ok, then stopped) or exits (→ its refusal). */
async function pgsubRun(c: Case, settings: Record<string, string>): Promise<{ verdict: string; output: string }> {
  const t0 = Date.now();
  const p = spawnPgsub(settings);
  const streaming = p.waitForLog('streaming started', 60_000).then(
    () => 'ok',
    () => null,
  );
  const exited = p.exited.then(() => 'exited');
  const verdict = await Promise.race([streaming, exited]);
  let run: string;
  if (verdict === 'ok' || verdict === null) {
    // Streaming, or neither streaming nor refused after 60 s (retrying): stop it either way.
    p.kill('SIGTERM');
    const stopped = await Promise.race([exited, new Promise((r) => setTimeout(r, 20_000, 'running'))]);
    if (stopped === 'running') p.kill('SIGKILL');
    run = verdict === 'ok' ? 'ok' : `neither streaming nor refused after 60 s: ${p.output().slice(-800)}`;
  } else {
    const code = await p.exited;
    run = code === 2 ? pgsubVerdict(p.output()) : `exit ${code}: ${p.output().slice(-600)}`;
  }
  if (process.env.PGSUB_TLS_TIMING) console.log(`${c.name}: run ${Date.now() - t0} ms`);
  return { verdict: run, output: p.output() };
}

/** `pgsub status` with the case's settings: 0 → ok, 2 → its refusal. */
async function pgsubStatus(settings: Record<string, string>): Promise<{ verdict: string; output: string }> {
  const s = spawnPgsub(settings, ['status']);
  const timer = setTimeout(() => s.kill('SIGKILL'), 60_000);
  const code = await s.exited;
  clearTimeout(timer);
  return { verdict: code === 0 ? 'ok' : code === 2 ? pgsubVerdict(s.output()) : `exit ${code}: ${s.output().slice(-600)}`, output: s.output() };
}

describe('conninfo cases: psql (libpq 18) and pgsub agree', { concurrency: 4 }, () => {
  for (const c of CASES) {
    test(c.name, async () => {
      const home = makeHome(c);
      const extra = c.env?.(env, home) ?? {};
      const viaPsql = await runPsql(c.conn(env, 'pub', home), home, extra);
      assert.equal(psqlVerdict(viaPsql.text, viaPsql.code), c.psql ?? c.want, `psql: ${viaPsql.text}`);
      const keyText = fs.readFileSync(env.ca.clientKey, 'utf8').split('\n')[5]!;
      const sides = c.sides ?? (['source', 'target'] as const);
      const checks: [string, { verdict: string; output: string }][] = [];
      let lastSubscription = '';
      for (const side of sides) {
        const settings = settingsFor(c, [side], home, extra);
        lastSubscription = settings.PGSUB_SUBSCRIPTION!;
        checks.push([`pgsub run, ${side} side`, await pgsubRun(c, settings)]);
      }
      // Status with the case on every side run, for the subscription the last run created (or was refused).
      const statusSettings = { ...settingsFor(c, sides, home, extra), PGSUB_SUBSCRIPTION: lastSubscription };
      checks.push([`pgsub status, ${sides.join(' and ')}`, await pgsubStatus(statusSettings)]);
      for (const [what, r] of checks) {
        assert.equal(r.verdict, c.want, what);
        if (c.names) assert.match(r.output, new RegExp(`\\b${c.names}\\b`), `${what}: the refusal names ${c.names}`);
        for (const secret of [...SECRETS, keyText]) assert.ok(!r.output.includes(secret), `${what}: the output holds a secret: ${r.output.slice(0, 2000)}`);
        assert.ok(!/DEP0123/.test(r.output), `${what}: no DEP0123 warning`);
      }
    });
  }
});

/** The pub database's own settings (the cutover's fence is one): none may appear. */
async function fenceSettings(c: Cluster): Promise<number> {
  const rows = await c.query<{ n: string }>(
    `SELECT count(*)::text AS n FROM pg_catalog.pg_db_role_setting s JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase WHERE d.datname = 'pub'`,
  );
  return Number(rows[0]?.n);
}

test('verify and cutover refuse a TLS, authentication or configuration failure as run does: exit 2 with its code, before anything changed', async () => {
  const picked = ['verify-full, wrong host name (127.0.0.1)', 'a wrong password', 'a misspelt keyword'].map((n) => CASES.find((c) => c.name === n)!);
  // A subscription that exists and streamed, so that nothing but the connection can refuse.
  const home = makeHome(picked[0]!);
  const trusted = settingsFor(picked[0]!, [], home, {});
  const first = await pgsubRun(picked[0]!, trusted);
  assert.equal(first.verdict, 'ok', first.output.slice(-800));
  for (const c of picked) {
    const keyText = fs.readFileSync(env.ca.clientKey, 'utf8').split('\n')[5]!;
    for (const side of c.sides ?? (['source', 'target'] as const)) {
      const settings = { ...settingsFor(c, [side], home, {}), PGSUB_SUBSCRIPTION: trusted.PGSUB_SUBSCRIPTION! };
      for (const args of [['verify'], ['cutover', '--fence-timeout', '2', '--timeout', '5']]) {
        const p = spawnPgsub(settings, args);
        const timer = setTimeout(() => p.kill('SIGKILL'), 60_000);
        const code = await p.exited;
        clearTimeout(timer);
        const what = `pgsub ${args[0]}, ${side} side, ${c.name}`;
        assert.equal(code, 2, `${what}: ${p.output().slice(-800)}`);
        assert.equal(pgsubVerdict(p.output()), c.want, what);
        if (c.names) assert.match(p.output(), new RegExp(`\\b${c.names}\\b`), `${what}: the refusal names ${c.names}`);
        for (const secret of [...SECRETS, keyText]) assert.ok(!p.output().includes(secret), `${what}: the output holds a secret`);
        assert.ok(!/DEP0123/.test(p.output()), `${what}: no DEP0123 warning`);
      }
    }
  }
  // Nothing was fenced: neither the trusted source nor the case's server has a setting on pub.
  assert.equal(await fenceSettings(plainSource), 0);
  assert.equal(await fenceSettings(a), 0);
});
