/**
 * Capture pgoutput fixtures from real PostgreSQL servers.
 *
 *   npx tsx scripts/capture-fixtures.ts            # writes test/fixtures/pgoutput/*.json
 *
 * Starts throw-away PostgreSQL 14 and 18 clusters from the npm binaries (node_modules/pg14,
 * node_modules/pg18), runs SQL scenarios, reads the raw pgoutput bytes through
 * pg_logical_slot_peek_binary_changes() and stores one JSON fixture per message:
 *
 *   { name, server, protoVersion, ctx, description, hex, expected }
 *
 * `expected` is what decode(hex, ctx) must return. It is NOT just the decoder's output echoed
 * back: every message is first matched against a pattern built from what the SQL did and from
 * independent server-side sources — xids from pg_current_xact_id()/xmin, relation and type oids
 * from the catalogs, column values from the inserted literals, binary values from the types'
 * send functions (int4send…), commit times from pg_xact_commit_timestamp() (track_commit_timestamp
 * is on), logical message LSNs from pg_logical_emit_message()'s result, end LSNs from the row
 * lsn of the SQL interface, other LSNs and times checked to lie between values read before and
 * after the statement, and cross-message equalities (Begin.final_lsn = Commit.commit_lsn,
 * Prepare fields = Begin Prepare fields, Rollback Prepared.prepare_end_lsn = Prepare.end_lsn…).
 * A mismatch aborts the script; only fully matched messages are written.
 *
 * Fixture encoding (see test/unit/decoder.test.ts for the reviver): LSN fields as "X/Y" text,
 * timestamps as decimal strings with an "n" suffix, Buffers as { "$hex": "…" }.
 *
 * Process notes: we run as root, initdb/postgres refuse root, so they run under
 * `runuser -u postgres --` with the data directory in a mkdtemp dir chowned to postgres;
 * the server listens on 127.0.0.1 at a free port < 32768 and is stopped and removed at the end.
 * Self-contained on purpose (does not use test/harness).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { decode } from '../src/protocol/decoder.js';
import { formatLsn, parseLsn, type Lsn } from '../src/protocol/lsn.js';
import type { DecodeContext, PgOutputMessage } from '../src/protocol/messages.js';
import { PG_EPOCH_MS } from '../src/protocol/messages.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const OUT_DIR = path.join(ROOT, 'test/fixtures/pgoutput');

// ---------------------------------------------------------------------------------------------
// Cluster lifecycle
// ---------------------------------------------------------------------------------------------

function hydrateSymlinks(pkgRoot: string): void {
  const list = JSON.parse(fs.readFileSync(path.join(pkgRoot, 'native/pg-symlinks.json'), 'utf8')) as {
    source: string;
    target: string;
  }[];
  for (const { source, target } of list) {
    const abs = path.join(pkgRoot, target);
    try {
      fs.lstatSync(abs);
      continue;
    } catch {
      /* missing: create */
    }
    fs.symlinkSync(path.relative(path.dirname(abs), path.join(pkgRoot, source)), abs);
  }
}

async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 20000 + Math.floor(Math.random() * 12000); // < 32768
    const ok = await new Promise<boolean>((resolve) => {
      const srv = net.createServer();
      srv.once('error', () => resolve(false));
      srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
    });
    if (ok) return port;
  }
  throw new Error('no free port found');
}

interface Cluster {
  major: number;
  port: number;
  dir: string;
  stop(): void;
}

function asPostgres(cmd: string, args: string[]): string {
  return execFileSync('runuser', ['-u', 'postgres', '--', cmd, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

async function startCluster(major: number): Promise<Cluster> {
  const pkgRoot = path.join(ROOT, 'node_modules', `pg${major}`);
  hydrateSymlinks(pkgRoot);
  const bin = path.join(pkgRoot, 'native/bin');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `pgsub-capture-pg${major}-`));
  const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
  const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
  fs.chownSync(dir, uid, gid);
  const data = path.join(dir, 'data');
  const port = await freePort();
  let started = false;
  const stop = () => {
    if (started) {
      try {
        asPostgres(path.join(bin, 'pg_ctl'), ['-D', data, '-m', 'fast', '-w', 'stop']);
      } catch (e) {
        console.error(`pg${major}: pg_ctl stop failed: ${(e as Error).message}`);
      }
      started = false;
    }
    fs.rmSync(dir, { recursive: true, force: true });
  };
  try {
    asPostgres(path.join(bin, 'initdb'), ['-D', data, '-U', 'postgres', '-A', 'trust', '-E', 'UTF8', '--no-locale', '-N']);
    fs.appendFileSync(
      path.join(data, 'postgresql.conf'),
      [
        '',
        "listen_addresses = '127.0.0.1'",
        `port = ${port}`,
        `unix_socket_directories = '${dir}'`,
        'wal_level = logical',
        'max_replication_slots = 20',
        'max_wal_senders = 10',
        'max_prepared_transactions = 10',
        "logical_decoding_work_mem = '64kB'",
        'track_commit_timestamp = on',
        'fsync = off',
        '',
      ].join('\n'),
    );
    asPostgres(path.join(bin, 'pg_ctl'), ['-D', data, '-l', path.join(dir, 'server.log'), '-w', '-t', '60', 'start']);
    started = true;
  } catch (e) {
    const log = path.join(dir, 'server.log');
    if (fs.existsSync(log)) console.error(fs.readFileSync(log, 'utf8'));
    stop();
    throw e;
  }
  return { major, port, dir, stop };
}

// ---------------------------------------------------------------------------------------------
// Patterns: expected values built from the SQL, with checks where the exact value is unknowable
// ---------------------------------------------------------------------------------------------

class Check {
  constructor(
    readonly desc: string,
    readonly ok: (v: unknown) => boolean,
  ) {}
}

type Pattern = unknown;

const lsnIn = (lo: Lsn, hi: Lsn) => new Check(`LSN in [${formatLsn(lo)}, ${formatLsn(hi)}]`, (v) => typeof v === 'bigint' && v >= lo && v <= hi && v > 0n);
const timeIn = (lo: bigint, hi: bigint) => new Check(`time in [${lo}, ${hi}]`, (v) => typeof v === 'bigint' && v >= lo && v <= hi);

function match(actual: unknown, pattern: Pattern, at: string, errors: string[]): void {
  if (pattern instanceof Check) {
    if (!pattern.ok(actual)) errors.push(`${at}: ${String(actual)} fails ${pattern.desc}`);
    return;
  }
  if (Buffer.isBuffer(pattern)) {
    if (!Buffer.isBuffer(actual) || !actual.equals(pattern))
      errors.push(`${at}: expected buffer ${pattern.toString('hex')}, got ${Buffer.isBuffer(actual) ? actual.toString('hex') : String(actual)}`);
    return;
  }
  if (Array.isArray(pattern)) {
    if (!Array.isArray(actual) || actual.length !== pattern.length) {
      errors.push(`${at}: expected array of ${pattern.length}, got ${JSON.stringify(toJson(actual))}`);
      return;
    }
    for (const [i, p] of pattern.entries()) match(actual[i], p, `${at}[${i}]`, errors);
    return;
  }
  if (pattern !== null && typeof pattern === 'object') {
    if (actual === null || typeof actual !== 'object') {
      errors.push(`${at}: expected object, got ${String(actual)}`);
      return;
    }
    const pk = Object.keys(pattern).sort();
    const ak = Object.keys(actual).sort();
    if (pk.join() !== ak.join()) errors.push(`${at}: keys ${ak.join()} != expected ${pk.join()}`);
    for (const k of pk) match((actual as Record<string, unknown>)[k], (pattern as Record<string, unknown>)[k], `${at}.${k}`, errors);
    return;
  }
  if (!Object.is(actual, pattern)) errors.push(`${at}: expected ${String(pattern)}, got ${String(actual)}`);
}

function expectMatch(actual: unknown, pattern: Pattern, what: string): void {
  const errors: string[] = [];
  match(actual, pattern, what, errors);
  if (errors.length > 0) throw new Error(`fixture check failed:\n  ${errors.join('\n  ')}\nactual: ${JSON.stringify(toJson(actual), null, 1)}`);
}

function expectEq(a: unknown, b: unknown, what: string): void {
  if (a !== b) throw new Error(`fixture check failed: ${what}: ${String(a)} !== ${String(b)}`);
}

const text = (value: string) => ({ kind: 'text', value });
const bin = (value: Buffer) => ({ kind: 'binary', value });
const NULL = { kind: 'null' };
const UNCHANGED = { kind: 'unchanged' };
const col = (name: string, typeOid: number, isKey = false, typeModifier = -1) => ({ isKey, name, typeOid, typeModifier });

// Builtin type oids (pg_type.dat) and typmods, known independently of the server.
const INT4 = 23;
const INT8 = 20;
const TEXT = 25;
const NUMERIC = 1700;
const TEXT_ARRAY = 1009;
const VARCHAR = 1043;
const numericTypmod = (p: number, s: number) => ((p << 16) | s) + 4;
const varcharTypmod = (n: number) => n + 4;

// ---------------------------------------------------------------------------------------------
// Fixture output
// ---------------------------------------------------------------------------------------------

const LSN_KEYS = new Set(['finalLsn', 'commitLsn', 'endLsn', 'originLsn', 'lsn', 'abortLsn', 'prepareLsn', 'prepareEndLsn', 'rollbackEndLsn']);

function toJson(v: unknown, key = ''): unknown {
  if (typeof v === 'bigint') return LSN_KEYS.has(key) ? formatLsn(v) : `${v}n`;
  if (Buffer.isBuffer(v)) return { $hex: v.toString('hex') };
  if (Array.isArray(v)) return v.map((x) => toJson(x));
  if (v !== null && typeof v === 'object') {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) o[k] = toJson(x, k);
    return o;
  }
  return v;
}

interface Fixture {
  name: string;
  server: string;
  protoVersion: number;
  ctx: DecodeContext;
  description: string;
  hex: string;
  expected: unknown;
}

const fixtures: Fixture[] = [];

// ---------------------------------------------------------------------------------------------
// SQL helpers
// ---------------------------------------------------------------------------------------------

type Client = pg.Client;

async function connect(port: number): Promise<Client> {
  const c = new pg.Client({ host: '127.0.0.1', port, user: 'postgres', database: 'postgres' });
  await c.connect();
  return c;
}

async function one(c: Client, sql: string, params: unknown[] = []): Promise<string> {
  const r = await c.query<{ v: string }>(sql, params);
  const v = r.rows[0]?.v;
  if (v === undefined || v === null) throw new Error(`no value from: ${sql}`);
  return String(v);
}

const xidNow = async (c: Client) => Number(await one(c, 'SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text AS v'));
const lsnNow = async (c: Client) => parseLsn(await one(c, 'SELECT pg_current_wal_insert_lsn()::text AS v'));
/** clock_timestamp() as PostgreSQL-epoch microseconds. */
const clockNow = async (c: Client) => BigInt(await one(c, `SELECT ((extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 946684800000000)::text AS v`));
const commitTs = async (c: Client, xid: number) =>
  BigInt(await one(c, `SELECT ((extract(epoch FROM pg_xact_commit_timestamp($1::text::xid)) * 1000000)::bigint - 946684800000000)::text AS v`, [String(xid)]));
const relid = async (c: Client, name: string) => Number(await one(c, 'SELECT $1::regclass::oid::int8::text AS v', [name]));
const bytesOf = async (c: Client, expr: string): Promise<Buffer> => {
  const r = await c.query<{ v: Buffer }>(`SELECT ${expr} AS v`);
  return r.rows[0]!.v;
};

interface Window {
  lsn0: Lsn;
  lsn1: Lsn;
  t0: bigint;
  t1: bigint;
}

/** Run `stmt` and record WAL insert position and clock before and after it. */
async function around(c: Client, stmt: string, params: unknown[] = []): Promise<Window> {
  const lsn0 = await lsnNow(c);
  const t0 = await clockNow(c);
  await c.query(stmt, params);
  const t1 = await clockNow(c);
  const lsn1 = await lsnNow(c);
  return { lsn0, lsn1, t0, t1 };
}

interface Tx {
  xid: number;
  commit: Window;
  commitTime: bigint;
}

/** BEGIN; (xid assigned); body; COMMIT — with the commit window and commit timestamp. */
async function tx(c: Client, body: () => Promise<void>): Promise<Tx> {
  await c.query('BEGIN');
  const xid = await xidNow(c);
  await body();
  const commit = await around(c, 'COMMIT');
  return { xid, commit, commitTime: await commitTs(c, xid) };
}

const beginP = (t: Tx, commitTime: bigint = t.commitTime) => ({
  tag: 'begin',
  finalLsn: lsnIn(t.commit.lsn0, t.commit.lsn1),
  commitTime,
  xid: t.xid,
});
const commitP = (t: Tx, commitTime: bigint = t.commitTime) => ({
  tag: 'commit',
  flags: 0,
  commitLsn: lsnIn(t.commit.lsn0, t.commit.lsn1),
  endLsn: lsnIn(t.commit.lsn0, t.commit.lsn1),
  commitTime,
});

// ---------------------------------------------------------------------------------------------
// Peeking and matching
// ---------------------------------------------------------------------------------------------

interface Row {
  lsn: Lsn;
  data: Buffer;
  ctx: DecodeContext;
  msg: PgOutputMessage;
}

interface Session {
  server: string;
  prefix: string; // pg14 / pg18
  major: number;
  port: number;
  admin: Client;
}

interface PeekOptions {
  proto: number;
  binary?: boolean;
  streaming?: 'on' | 'parallel';
  twoPhase?: boolean;
  messages?: boolean;
  origin?: 'any';
}

function optionArray(o: PeekOptions): string[] {
  const a = ['proto_version', String(o.proto), 'publication_names', 'pub'];
  if (o.binary) a.push('binary', 'true');
  if (o.streaming) a.push('streaming', o.streaming);
  if (o.twoPhase) a.push('two_phase', 'on');
  if (o.messages) a.push('messages', 'true');
  if (o.origin) a.push('origin', o.origin);
  return a;
}

async function peek(s: Session, slot: string, o: PeekOptions): Promise<Row[]> {
  const c = await connect(s.port); // fresh backend: fresh pgoutput relation cache
  try {
    const r = await c.query<{ lsn: string; data: Buffer }>('SELECT lsn::text AS lsn, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, VARIADIC $2::text[])', [
      slot,
      optionArray(o),
    ]);
    const rows: Row[] = [];
    let inStream = false;
    for (const { lsn, data } of r.rows) {
      const ctx: DecodeContext = o.streaming === 'parallel' && o.proto >= 4 ? { inStream, streamAbortInfo: true } : { inStream };
      const msg = decode(data, ctx);
      if (msg.tag === 'streamStart') inStream = true;
      if (msg.tag === 'streamStop') inStream = false;
      rows.push({ lsn: parseLsn(lsn), data, ctx, msg });
    }
    return rows;
  } finally {
    await c.end();
  }
}

async function withSlot(s: Session, slot: string, twoPhase: boolean, body: () => Promise<void>): Promise<void> {
  await s.admin.query(`SELECT pg_create_logical_replication_slot($1, 'pgoutput', false${twoPhase ? ', true' : ''})`, [slot]);
  try {
    await body();
  } finally {
    await s.admin.query('SELECT pg_drop_replication_slot($1)', [slot]);
  }
}

/** One expected message: pattern plus the fixture label (undefined = verify but do not save). */
interface Expect {
  label?: string;
  p: Pattern;
}

function save(s: Session, scenario: string, o: PeekOptions, row: Row, index: number, label: string, description: string): void {
  const name = `${s.prefix}-${scenario}-${String(index).padStart(4, '0')}-${label}`;
  fixtures.push({
    name,
    server: s.server,
    protoVersion: o.proto,
    ctx: row.ctx,
    description,
    hex: row.data.toString('hex'),
    expected: toJson(row.msg),
  });
}

function expectSequence(s: Session, scenario: string, o: PeekOptions, rows: Row[], want: Expect[], description: string, offset = 0): void {
  if (rows.length !== want.length) {
    throw new Error(`${s.prefix} ${scenario}: got ${rows.length} messages (${rows.map((r) => r.msg.tag).join(' ')}), expected ${want.length}`);
  }
  rows.forEach((row, i) => {
    const w = want[i]!;
    expectMatch(row.msg, w.p, `${s.prefix} ${scenario} #${i}`);
    // Row lsn for Commit / Prepare family is the end of the record: check it independently.
    const m = row.msg;
    if (m.tag === 'commit' || m.tag === 'streamCommit' || m.tag === 'commitPrepared' || m.tag === 'prepare' || m.tag === 'streamPrepare')
      expectEq(m.endLsn, row.lsn, `${scenario} #${i} ${m.tag}.endLsn = row lsn`);
    if (m.tag === 'rollbackPrepared') expectEq(m.rollbackEndLsn, row.lsn, `${scenario} #${i} rollbackEndLsn = row lsn`);
    if (w.label !== undefined) save(s, scenario, o, row, offset + i, w.label, description);
  });
  // Begin.final_lsn is the commit record's LSN.
  for (let i = 0; i < rows.length; i++) {
    const b = rows[i]!.msg;
    if (b.tag !== 'begin') continue;
    const c = rows.slice(i).find((r) => r.msg.tag === 'commit')?.msg;
    if (c?.tag !== 'commit') throw new Error(`${scenario}: begin without commit`);
    expectEq(b.finalLsn, c.commitLsn, `${scenario}: begin.finalLsn = commit.commitLsn`);
    expectEq(b.commitTime, c.commitTime, `${scenario}: begin.commitTime = commit.commitTime`);
    if (!(c.commitLsn < c.endLsn)) throw new Error(`${scenario}: commitLsn < endLsn`);
  }
}

// ---------------------------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------------------------

const Q_SCHEMA = 'Ünïcode "Schema"';
const Q_TABLE = 'Tàble "Q" 名';
const Q_TABLE_SQL = `"Ünïcode ""Schema"""."Tàble ""Q"" 名"`;

const SCHEMA_SQL = `
CREATE SCHEMA app;
CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE t_default (id int PRIMARY KEY, name text, score numeric(10,2), tags text[], mood app.mood);
CREATE SCHEMA "Ünïcode ""Schema""";
CREATE TABLE ${Q_TABLE_SQL} ("Ïd" bigint PRIMARY KEY, "col ""x""" varchar(20));
CREATE TABLE t_full (a int, b text);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_index (a int NOT NULL, b int NOT NULL, c text);
CREATE UNIQUE INDEX t_index_ab ON t_index (a, b);
ALTER TABLE t_index REPLICA IDENTITY USING INDEX t_index_ab;
CREATE TABLE t_nothing (a int, b text);
ALTER TABLE t_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE t_toast (id int PRIMARY KEY, big text, n int);
ALTER TABLE t_toast ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE tr_a (id serial PRIMARY KEY);
CREATE TABLE tr_b (id serial PRIMARY KEY, a_id int REFERENCES tr_a (id));
CREATE TABLE tr_c (id serial PRIMARY KEY);
CREATE TABLE t_stream (id int PRIMARY KEY, payload text);
CREATE TABLE t_sp (id int PRIMARY KEY, payload text);
CREATE PUBLICATION pub FOR ALL TABLES;
`;

interface Catalog {
  mood: number;
  rel: Record<string, number>;
}

async function catalog(c: Client): Promise<Catalog> {
  const mood = Number(await one(c, "SELECT 'app.mood'::regtype::oid::int8::text AS v"));
  const rel: Record<string, number> = {};
  for (const n of ['t_default', 't_full', 't_index', 't_nothing', 't_toast', 'tr_a', 'tr_b', 'tr_c', 't_stream', 't_sp']) rel[n] = await relid(c, n);
  rel.quoted = await relid(c, Q_TABLE_SQL);
  return { mood, rel };
}

function relations(cat: Catalog, xid?: number) {
  const r = (relationId: number, namespace: string, name: string, replicaIdentity: string, columns: unknown[]) =>
    xid === undefined
      ? { tag: 'relation', relationId, namespace, name, replicaIdentity, columns }
      : { tag: 'relation', xid, relationId, namespace, name, replicaIdentity, columns };
  return {
    t_default: r(cat.rel.t_default!, 'public', 't_default', 'default', [
      col('id', INT4, true),
      col('name', TEXT),
      col('score', NUMERIC, false, numericTypmod(10, 2)),
      col('tags', TEXT_ARRAY),
      col('mood', cat.mood),
    ]),
    quoted: r(cat.rel.quoted!, Q_SCHEMA, Q_TABLE, 'default', [col('Ïd', INT8, true), col('col "x"', VARCHAR, false, varcharTypmod(20))]),
    // REPLICA IDENTITY FULL flags every column as part of the key.
    t_full: r(cat.rel.t_full!, 'public', 't_full', 'full', [col('a', INT4, true), col('b', TEXT, true)]),
    t_index: r(cat.rel.t_index!, 'public', 't_index', 'index', [col('a', INT4, true), col('b', INT4, true), col('c', TEXT)]),
    t_nothing: r(cat.rel.t_nothing!, 'public', 't_nothing', 'nothing', [col('a', INT4), col('b', TEXT)]),
    t_toast: r(cat.rel.t_toast!, 'public', 't_toast', 'default', [col('id', INT4, true), col('big', TEXT), col('n', INT4)]),
    tr_a: r(cat.rel.tr_a!, 'public', 'tr_a', 'default', [col('id', INT4, true)]),
    tr_b: r(cat.rel.tr_b!, 'public', 'tr_b', 'default', [col('id', INT4, true), col('a_id', INT4)]),
    tr_c: r(cat.rel.tr_c!, 'public', 'tr_c', 'default', [col('id', INT4, true)]),
    t_stream: r(cat.rel.t_stream!, 'public', 't_stream', 'default', [col('id', INT4, true), col('payload', TEXT)]),
    t_sp: r(cat.rel.t_sp!, 'public', 't_sp', 'default', [col('id', INT4, true), col('payload', TEXT)]),
  };
}

const moodType = (cat: Catalog) => ({ tag: 'type', typeOid: cat.mood, namespace: 'app', name: 'mood' });

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

async function scenarioInsert(s: Session, w: Client, cat: Catalog, proto: number): Promise<void> {
  const o: PeekOptions = { proto };
  const rel = relations(cat);
  await withSlot(s, 'cap_insert', false, async () => {
    const t = await tx(w, async () => {
      await w.query(`INSERT INTO t_default VALUES (1, 'héllo wörld ✓', 12.5, '{a,"b c",NULL}', 'happy'), (2, NULL, NULL, NULL, NULL), (3, 'three', 0, '{}', 'sad')`);
      await w.query(`INSERT INTO ${Q_TABLE_SQL} VALUES (9007199254740993, 'x "quoted"')`);
      await w.query(`INSERT INTO t_full VALUES (1, 'one'), (2, 'two')`);
      await w.query(`INSERT INTO t_index VALUES (1, 1, 'c1'), (2, 2, 'c2')`);
      await w.query(`INSERT INTO t_nothing VALUES (1, 'nothing')`);
    });
    const ins = (relationId: number, newTuple: unknown[]) => ({ tag: 'insert', relationId, newTuple });
    const rows = await peek(s, 'cap_insert', o);
    expectSequence(
      s,
      'insert',
      o,
      rows,
      [
        { label: 'begin', p: beginP(t) },
        { label: 'type-enum', p: moodType(cat) },
        { label: 'relation-default', p: rel.t_default },
        { label: 'insert-text-unicode-array', p: ins(cat.rel.t_default!, [text('1'), text('héllo wörld ✓'), text('12.50'), text('{a,"b c",NULL}'), text('happy')]) },
        { label: 'insert-nulls', p: ins(cat.rel.t_default!, [text('2'), NULL, NULL, NULL, NULL]) },
        { label: 'insert-empty-array', p: ins(cat.rel.t_default!, [text('3'), text('three'), text('0.00'), text('{}'), text('sad')]) },
        { label: 'relation-quoted-unicode', p: rel.quoted },
        { label: 'insert-quoted', p: ins(cat.rel.quoted!, [text('9007199254740993'), text('x "quoted"')]) },
        { label: 'relation-full', p: rel.t_full },
        { p: ins(cat.rel.t_full!, [text('1'), text('one')]) },
        { p: ins(cat.rel.t_full!, [text('2'), text('two')]) },
        { label: 'relation-index', p: rel.t_index },
        { p: ins(cat.rel.t_index!, [text('1'), text('1'), text('c1')]) },
        { p: ins(cat.rel.t_index!, [text('2'), text('2'), text('c2')]) },
        { label: 'relation-nothing', p: rel.t_nothing },
        { p: ins(cat.rel.t_nothing!, [text('1'), text('nothing')]) },
        { label: 'commit', p: commitP(t) },
      ],
      'one transaction inserting into tables with replica identity default/full/index/nothing, an enum column, quoted unicode names',
    );
  });
}

async function scenarioDml(s: Session, w: Client, cat: Catalog, proto: number): Promise<void> {
  const o: PeekOptions = { proto };
  const rel = relations(cat);
  await withSlot(s, 'cap_dml', false, async () => {
    const t = await tx(w, async () => {
      await w.query('UPDATE t_default SET id = 101 WHERE id = 1');
      await w.query(`UPDATE t_default SET name = 'b2' WHERE id = 2`);
      await w.query('DELETE FROM t_default WHERE id = 3');
      await w.query(`UPDATE t_full SET b = 'ONE' WHERE a = 1`);
      await w.query('DELETE FROM t_full WHERE a = 2');
      await w.query('UPDATE t_index SET a = 5 WHERE a = 1');
      await w.query(`UPDATE t_index SET c = 'c2!' WHERE a = 2`);
      await w.query(`DELETE FROM ${Q_TABLE_SQL}`);
    });
    const D = cat.rel;
    const rows = await peek(s, 'cap_dml', o);
    expectSequence(
      s,
      'dml',
      o,
      rows,
      [
        { p: beginP(t) },
        { p: moodType(cat) },
        { p: rel.t_default },
        {
          label: 'update-key-change-K',
          p: {
            tag: 'update',
            relationId: D.t_default,
            oldKind: 'key',
            oldTuple: [text('1'), NULL, NULL, NULL, NULL],
            newTuple: [text('101'), text('héllo wörld ✓'), text('12.50'), text('{a,"b c",NULL}'), text('happy')],
          },
        },
        { label: 'update-no-old', p: { tag: 'update', relationId: D.t_default, newTuple: [text('2'), text('b2'), NULL, NULL, NULL] } },
        { label: 'delete-key-K', p: { tag: 'delete', relationId: D.t_default, oldKind: 'key', oldTuple: [text('3'), NULL, NULL, NULL, NULL] } },
        { p: rel.t_full },
        {
          label: 'update-full-O',
          p: { tag: 'update', relationId: D.t_full, oldKind: 'old', oldTuple: [text('1'), text('one')], newTuple: [text('1'), text('ONE')] },
        },
        { label: 'delete-full-O', p: { tag: 'delete', relationId: D.t_full, oldKind: 'old', oldTuple: [text('2'), text('two')] } },
        { p: rel.t_index },
        {
          label: 'update-index-key-K',
          p: { tag: 'update', relationId: D.t_index, oldKind: 'key', oldTuple: [text('1'), text('1'), NULL], newTuple: [text('5'), text('1'), text('c1')] },
        },
        { p: { tag: 'update', relationId: D.t_index, newTuple: [text('2'), text('2'), text('c2!')] } },
        { p: rel.quoted },
        { label: 'delete-quoted-K', p: { tag: 'delete', relationId: D.quoted, oldKind: 'key', oldTuple: [text('9007199254740993'), NULL] } },
        { p: commitP(t) },
      ],
      'UPDATE with key change (K), without old tuple, REPLICA IDENTITY FULL (O), USING INDEX; DELETE K/O',
    );
  });
}

async function scenarioToastAndBinary(s: Session, w: Client, cat: Catalog, proto: number): Promise<void> {
  const rel = relations(cat);
  // > 2 kB, stored out of line uncompressed (STORAGE EXTERNAL), written before the slot exists.
  await w.query(`INSERT INTO t_toast VALUES (1, (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 200) i), 0)`);
  const size = Number(await one(w, 'SELECT pg_column_size(big)::text AS v FROM t_toast WHERE id = 1'));
  if (size < 6000) throw new Error(`toast value unexpectedly small: ${size}`);

  let o: PeekOptions = { proto };
  await withSlot(s, 'cap_toast', false, async () => {
    const t = await tx(w, async () => {
      await w.query('UPDATE t_toast SET n = 7 WHERE id = 1');
    });
    const rows = await peek(s, 'cap_toast', o);
    expectSequence(
      s,
      'toast',
      o,
      rows,
      [
        { p: beginP(t) },
        { label: 'relation', p: rel.t_toast },
        { label: 'update-unchanged-toast-u', p: { tag: 'update', relationId: cat.rel.t_toast, newTuple: [text('1'), UNCHANGED, text('7')] } },
        { p: commitP(t) },
      ],
      'UPDATE leaving an out-of-line TOASTed text unchanged: column kind u',
    );
  });

  o = { proto, binary: true };
  // Binary forms from the types' own send functions, not from the decoder.
  const sends = {
    i10: await bytesOf(w, 'int4send(10)'),
    txt: await bytesOf(w, `textsend('bin ✓')`),
    num: await bytesOf(w, 'numeric_send(3.25::numeric(10,2))'),
    arr: await bytesOf(w, `array_send('{x,y}'::text[])`),
    enm: await bytesOf(w, `enum_send('ok'::app.mood)`),
    i11: await bytesOf(w, 'int4send(11)'),
    i1: await bytesOf(w, 'int4send(1)'),
    i42: await bytesOf(w, 'int4send(42)'),
  };
  await withSlot(s, 'cap_binary', false, async () => {
    const t = await tx(w, async () => {
      await w.query(`INSERT INTO t_default VALUES (10, 'bin ✓', 3.25, '{x,y}', 'ok'), (11, NULL, NULL, NULL, NULL)`);
      await w.query('UPDATE t_toast SET n = 42 WHERE id = 1');
    });
    const rows = await peek(s, 'cap_binary', o);
    expectSequence(
      s,
      'binary',
      o,
      rows,
      [
        { p: beginP(t) },
        { p: moodType(cat) },
        { p: rel.t_default },
        {
          label: 'insert-binary',
          p: { tag: 'insert', relationId: cat.rel.t_default, newTuple: [bin(sends.i10), bin(sends.txt), bin(sends.num), bin(sends.arr), bin(sends.enm)] },
        },
        { label: 'insert-binary-nulls', p: { tag: 'insert', relationId: cat.rel.t_default, newTuple: [bin(sends.i11), NULL, NULL, NULL, NULL] } },
        { p: rel.t_toast },
        { label: 'update-binary-unchanged-toast', p: { tag: 'update', relationId: cat.rel.t_toast, newTuple: [bin(sends.i1), UNCHANGED, bin(sends.i42)] } },
        { p: commitP(t) },
      ],
      'binary = true: column kind b (values checked against int4send/textsend/numeric_send/array_send/enum_send)',
    );
  });
}

async function scenarioTruncate(s: Session, w: Client, cat: Catalog, proto: number): Promise<void> {
  const o: PeekOptions = { proto };
  const rel = relations(cat);
  await w.query('INSERT INTO tr_a DEFAULT VALUES; INSERT INTO tr_b (a_id) SELECT id FROM tr_a; INSERT INTO tr_c DEFAULT VALUES');
  await withSlot(s, 'cap_truncate', false, async () => {
    const t1 = await tx(w, () => w.query('TRUNCATE tr_a, tr_c RESTART IDENTITY CASCADE').then(() => undefined));
    const t2 = await tx(w, () => w.query('TRUNCATE tr_c').then(() => undefined));
    const t3 = await tx(w, () => w.query('TRUNCATE ONLY tr_c RESTART IDENTITY').then(() => undefined));
    const rows = await peek(s, 'cap_truncate', o);
    // Relation messages for the three truncated relations precede the Truncate; cascade adds tr_b.
    const three = [cat.rel.tr_a!, cat.rel.tr_b!, cat.rel.tr_c!];
    const byId = new Map<number, unknown>([
      [cat.rel.tr_a!, rel.tr_a],
      [cat.rel.tr_b!, rel.tr_b],
      [cat.rel.tr_c!, rel.tr_c],
    ]);
    const firstT = rows.findIndex((r) => r.msg.tag === 'truncate');
    const tmsg = rows[firstT]?.msg;
    if (tmsg?.tag !== 'truncate') throw new Error('no truncate message');
    const order = tmsg.relationIds;
    if ([...order].sort().join() !== [...three].sort().join()) throw new Error(`truncate relids ${order.join()} != ${three.join()}`);
    expectSequence(
      s,
      'truncate',
      o,
      rows,
      [
        { p: beginP(t1) },
        ...order.map((id, i) => ({ label: i === 0 ? 'relation' : undefined, p: byId.get(id) })),
        { label: 'truncate-cascade-restart-3rels', p: { tag: 'truncate', cascade: true, restartIdentity: true, relationIds: order } },
        { p: commitP(t1) },
        { p: beginP(t2) },
        { p: rel.tr_c },
        { label: 'truncate-plain', p: { tag: 'truncate', cascade: false, restartIdentity: false, relationIds: [cat.rel.tr_c] } },
        { p: commitP(t2) },
        { p: beginP(t3) },
        { p: rel.tr_c },
        { label: 'truncate-restart-identity', p: { tag: 'truncate', cascade: false, restartIdentity: true, relationIds: [cat.rel.tr_c] } },
        { p: commitP(t3) },
      ],
      'TRUNCATE tr_a, tr_c RESTART IDENTITY CASCADE (cascades to tr_b); TRUNCATE tr_c; TRUNCATE ONLY tr_c RESTART IDENTITY',
    );
  });
}

async function scenarioMessages(s: Session, w: Client, proto: number): Promise<void> {
  const o: PeekOptions = { proto, messages: true };
  await withSlot(s, 'cap_msg', false, async () => {
    // Non-transactional first: the following COMMIT flushes its WAL so the SQL interface sees it.
    const ntLsn = parseLsn(await one(w, `SELECT pg_logical_emit_message(false, 'pgsub/non-tx', '\\x00ff10'::bytea)::text AS v`));
    let txLsn = 0n as Lsn;
    const t = await tx(w, async () => {
      txLsn = parseLsn(await one(w, `SELECT pg_logical_emit_message(true, 'pgsub/tx', 'hello ✓ message')::text AS v`));
    });
    const rows = await peek(s, 'cap_msg', o);
    expectSequence(
      s,
      'message',
      o,
      rows,
      [
        { label: 'non-transactional', p: { tag: 'message', transactional: false, lsn: ntLsn, prefix: 'pgsub/non-tx', content: Buffer.from([0x00, 0xff, 0x10]) } },
        { p: beginP(t) },
        { label: 'transactional', p: { tag: 'message', transactional: true, lsn: txLsn, prefix: 'pgsub/tx', content: Buffer.from('hello ✓ message', 'utf8') } },
        { p: commitP(t) },
      ],
      "pg_logical_emit_message(true, 'pgsub/tx', …) in a transaction and (false, 'pgsub/non-tx', '\\x00ff10') outside",
    );
  });
}

async function scenarioOrigin(s: Session, cat: Catalog, proto: number): Promise<void> {
  const o: PeekOptions = s.major >= 16 ? { proto, origin: 'any' } : { proto };
  const rel = relations(cat);
  const originName = 'upstream-ø';
  const originLsn = parseLsn('1/ABCDEF0');
  // 2024-02-29 12:34:56.789012 UTC in PostgreSQL-epoch microseconds, computed here.
  const originTs = BigInt(Date.UTC(2024, 1, 29, 12, 34, 56, 789) - PG_EPOCH_MS) * 1000n + 12n;
  const w = await connect(s.port);
  try {
    await w.query('SELECT pg_replication_origin_create($1)', [originName]);
    await w.query('SELECT pg_replication_origin_session_setup($1)', [originName]);
    await withSlot(s, 'cap_origin', false, async () => {
      const t = await tx(w, async () => {
        await w.query(`SELECT pg_replication_origin_xact_setup('1/ABCDEF0', '2024-02-29 12:34:56.789012+00')`);
        await w.query(`INSERT INTO t_nothing VALUES (2, 'from upstream')`);
      });
      const rows = await peek(s, 'cap_origin', o);
      expectSequence(
        s,
        'origin',
        o,
        rows,
        [
          { label: 'begin-origin-ts', p: beginP(t, originTs) },
          { label: 'origin', p: { tag: 'origin', originLsn, originName } },
          { p: rel.t_nothing },
          { p: { tag: 'insert', relationId: cat.rel.t_nothing, newTuple: [text('2'), text('from upstream')] } },
          { label: 'commit-origin-ts', p: commitP(t, originTs) },
        ],
        'transaction written in a session with pg_replication_origin_session_setup + xact_setup(1/ABCDEF0, 2024-02-29 12:34:56.789012+00)',
      );
    });
    await w.query('SELECT pg_replication_origin_session_reset()');
  } finally {
    await w.end();
  }
}

const payload = (i: number) => `row-${i}-${'x'.repeat(100)}`;

interface StreamRange {
  from: number;
  to: number;
  xid: number;
  committed: boolean;
}

/**
 * Validate a streamed transaction: S (R? I*) E blocks; every Insert's xid is the (sub)xact that
 * wrote that id; committed ids all present exactly once in order; `tail` patterns for what
 * follows the last Stream Stop (and Stream Abort of a subxact between blocks, if `subAbort`).
 */
function expectStream(
  s: Session,
  scenario: string,
  o: PeekOptions,
  rows: Row[],
  spec: { top: number; rel: (xid: number) => unknown; relationId: number; ranges: StreamRange[]; subAbort?: { after: number; p: Pattern }; tail: Expect[]; minBlocks?: number },
  description: string,
): void {
  const labels = new Map<number, string>();
  let inStream = false;
  let blocks = 0;
  let lastId = 0;
  const seen = new Set<number>();
  let abortAt = -1;
  let i = 0;
  const streamEnd = rows.length - spec.tail.length;
  const firstOf = new Set<number>();
  let pendingRelation: number | undefined;
  for (; i < streamEnd; i++) {
    const row = rows[i]!;
    const m = row.msg;
    expectEq(row.ctx.inStream, inStream, `${scenario} #${i} ctx.inStream`);
    switch (m.tag) {
      case 'streamStart':
        if (inStream) throw new Error(`${scenario} #${i}: nested stream start`);
        expectMatch(m, { tag: 'streamStart', xid: spec.top, firstSegment: blocks === 0 }, `${scenario} #${i}`);
        if (blocks === 0) labels.set(i, 'stream-start-first');
        if (blocks === 1) labels.set(i, 'stream-start-next');
        blocks++;
        inStream = true;
        break;
      case 'streamStop':
        if (!inStream) throw new Error(`${scenario} #${i}: stop outside stream`);
        if (blocks === 1) labels.set(i, 'stream-stop');
        inStream = false;
        break;
      case 'relation':
        // Sent (again) before the first change after a stream abort too; its xid is that of the
        // (sub)transaction whose change triggered it: checked against the next insert.
        if (!inStream) throw new Error(`${scenario} #${i}: relation outside stream`);
        if (m.xid === undefined) throw new Error(`${scenario} #${i}: relation without xid in stream`);
        expectMatch(m, spec.rel(m.xid), `${scenario} #${i}`);
        pendingRelation = m.xid;
        if (!labels.has(-1)) {
          labels.set(-1, 'seen');
          labels.set(i, 'stream-relation');
        } else labels.set(i, 'stream-relation-resent');
        break;
      case 'insert': {
        if (!inStream) throw new Error(`${scenario} #${i}: insert outside stream`);
        const id = Number(m.newTuple[0]?.kind === 'text' ? m.newTuple[0].value : NaN);
        const range = spec.ranges.find((r) => id >= r.from && id <= r.to);
        if (range === undefined) throw new Error(`${scenario} #${i}: unexpected id ${id}`);
        if (!(id > lastId)) throw new Error(`${scenario} #${i}: ids out of order ${lastId} → ${id}`);
        lastId = id;
        seen.add(id);
        if (spec.subAbort && abortAt >= 0 && range.xid === spec.ranges.find((r) => !r.committed)?.xid)
          throw new Error(`${scenario} #${i}: insert of aborted subxact after its Stream Abort`);
        if (pendingRelation !== undefined) expectEq(pendingRelation, range.xid, `${scenario} #${i} relation xid = insert xid`);
        pendingRelation = undefined;
        expectMatch(m, { tag: 'insert', xid: range.xid, relationId: spec.relationId, newTuple: [text(String(id)), text(payload(id))] }, `${scenario} #${i}`);
        if (!firstOf.has(range.from)) {
          firstOf.add(range.from);
          labels.set(i, `stream-insert-${range.xid === spec.top ? 'top' : range.committed ? 'subxact' : 'aborted-subxact'}`);
        }
        break;
      }
      case 'streamAbort':
        if (!spec.subAbort || inStream || abortAt >= 0) throw new Error(`${scenario} #${i}: unexpected stream abort`);
        expectMatch(m, spec.subAbort.p, `${scenario} #${i}`);
        abortAt = i;
        labels.set(i, 'stream-abort-subxact');
        break;
      default:
        throw new Error(`${scenario} #${i}: unexpected ${m.tag} in stream part`);
    }
  }
  if (inStream) throw new Error(`${scenario}: stream part ends inside a block`);
  if (blocks < (spec.minBlocks ?? 2)) throw new Error(`${scenario}: expected the transaction to be streamed in more blocks, got ${blocks}`);
  if (spec.subAbort && abortAt < 0) throw new Error(`${scenario}: no stream abort for the rolled back subtransaction`);
  for (const r of spec.ranges) {
    if (!r.committed) continue;
    for (let id = r.from; id <= r.to; id++) if (!seen.has(id)) throw new Error(`${scenario}: committed id ${id} missing`);
  }
  // Aborted subxact rows that were streamed precede the abort; later subxact rows follow it.
  if (spec.subAbort) {
    const after = rows.slice(abortAt).find((r) => r.msg.tag === 'insert');
    const id = after?.msg.tag === 'insert' && after.msg.newTuple[0]?.kind === 'text' ? Number(after.msg.newTuple[0].value) : -1;
    if (id < spec.subAbort.after) throw new Error(`${scenario}: first insert after stream abort is ${id}`);
  }
  rows.slice(0, streamEnd).forEach((row, k) => {
    const label = labels.get(k);
    if (label !== undefined) save(s, scenario, o, row, k, label, description);
  });
  expectSequence(s, scenario, o, rows.slice(streamEnd), spec.tail, description, streamEnd);
}

async function scenarioStream(s: Session, w: Client, cat: Catalog, o: PeekOptions): Promise<void> {
  const info = o.streaming === 'parallel' && o.proto >= 4;
  const ins = (from: number, to: number) => w.query(`INSERT INTO t_stream SELECT i, 'row-' || i || '-' || repeat('x', 100) FROM generate_series($1::int, $2::int) i`, [from, to]);
  const xminOf = async (id: number) => Number(await one(w, 'SELECT xmin::text AS v FROM t_stream WHERE id = $1', [id]));
  await withSlot(s, 'cap_stream', false, async () => {
    let sub1 = 0;
    let sub2 = 0;
    let abortW: Window | undefined;
    const t = await tx(w, async () => {
      await ins(1, 100);
      await w.query('SAVEPOINT s1');
      await ins(101, 1100);
      sub1 = await xminOf(101);
      abortW = await around(w, 'ROLLBACK TO SAVEPOINT s1');
      await w.query('SAVEPOINT s2');
      await ins(1101, 2100);
      sub2 = await xminOf(1101);
      await w.query('RELEASE SAVEPOINT s2');
    });
    if (sub1 === t.xid || sub2 === t.xid || sub1 === sub2) throw new Error('subtransaction xids not distinct');
    const rows = await peek(s, 'cap_stream', o);
    const a = abortW!;
    expectStream(
      s,
      'stream',
      o,
      rows,
      {
        top: t.xid,
        rel: (x) => relations(cat, x).t_stream,
        relationId: cat.rel.t_stream!,
        ranges: [
          { from: 1, to: 100, xid: t.xid, committed: true },
          { from: 101, to: 1100, xid: sub1, committed: false },
          { from: 1101, to: 2100, xid: sub2, committed: true },
        ],
        subAbort: {
          after: 1101,
          p: info
            ? { tag: 'streamAbort', xid: t.xid, subXid: sub1, abortLsn: lsnIn(a.lsn0, a.lsn1), abortTime: timeIn(a.t0, a.t1) }
            : { tag: 'streamAbort', xid: t.xid, subXid: sub1 },
        },
        tail: [
          {
            label: 'stream-commit',
            p: { tag: 'streamCommit', xid: t.xid, flags: 0, commitLsn: lsnIn(t.commit.lsn0, t.commit.lsn1), endLsn: lsnIn(t.commit.lsn0, t.commit.lsn1), commitTime: t.commitTime },
          },
        ],
      },
      `streamed transaction (logical_decoding_work_mem=64kB) with SAVEPOINT s1 rolled back (Stream Abort of subxact) and s2 released; streaming=${o.streaming}`,
    );
  });

  // A streamed top-level transaction that rolls back: Stream Abort with xid = subxid.
  // Not on PG18+: when decoding happens after the abort (as with the SQL interface), PG18's
  // ReorderBufferCheckAndTruncateAbortedTXN discards the already-aborted transaction instead of
  // streaming it, so nothing is sent. (Only a live walsender session would show it.)
  if (s.major >= 18) return;
  await withSlot(s, 'cap_stream_rb', false, async () => {
    await w.query('BEGIN');
    const xid = await xidNow(w);
    await ins(5001, 6000);
    const a = await around(w, 'ROLLBACK');
    // An abort record is not flushed by itself; the SQL interface only decodes flushed WAL.
    await w.query('SELECT pg_switch_wal()');
    const rows = await peek(s, 'cap_stream_rb', o);
    expectStream(
      s,
      'stream-rollback',
      o,
      rows,
      {
        top: xid,
        rel: (x) => relations(cat, x).t_stream,
        relationId: cat.rel.t_stream!,
        ranges: [{ from: 5001, to: 6000, xid, committed: false }],
        minBlocks: 1, // what is still in memory at ROLLBACK is discarded, not streamed
        tail: [
          {
            label: 'stream-abort-toplevel',
            p: info ? { tag: 'streamAbort', xid, subXid: xid, abortLsn: lsnIn(a.lsn0, a.lsn1), abortTime: timeIn(a.t0, a.t1) } : { tag: 'streamAbort', xid, subXid: xid },
          },
        ],
      },
      `streamed top-level transaction rolled back: Stream Abort with subxid = xid; streaming=${o.streaming}`,
    );
  });
}

async function scenarioTwoPhase(s: Session, w: Client, cat: Catalog, proto: number): Promise<void> {
  const o: PeekOptions = { proto, twoPhase: true };
  const rel = relations(cat);
  await withSlot(s, 'cap_2pc', true, async () => {
    const gid1 = 'pgsub-gid-ü 1';
    const gid2 = 'pgsub-gid-2';
    await w.query('BEGIN');
    const x1 = await xidNow(w);
    await w.query(`INSERT INTO t_default VALUES (20, '2pc', 1, '{}', 'ok')`);
    const p1 = await around(w, `PREPARE TRANSACTION '${gid1}'`);
    const c1 = await around(w, `COMMIT PREPARED '${gid1}'`);
    const ct1 = await commitTs(w, x1);

    await w.query('BEGIN');
    const x2 = await xidNow(w);
    await w.query(`INSERT INTO t_full VALUES (20, 'rollback-me')`);
    const p2 = await around(w, `PREPARE TRANSACTION '${gid2}'`);
    const r2 = await around(w, `ROLLBACK PREPARED '${gid2}'`);

    const rows = await peek(s, 'cap_2pc', o);
    const bp = (x: number, gid: string, p: Window) => ({
      tag: 'beginPrepare',
      prepareLsn: lsnIn(p.lsn0, p.lsn1),
      endLsn: lsnIn(p.lsn0, p.lsn1),
      prepareTime: timeIn(p.t0, p.t1),
      xid: x,
      gid,
    });
    const pr = (x: number, gid: string, p: Window) => ({
      tag: 'prepare',
      flags: 0,
      prepareLsn: lsnIn(p.lsn0, p.lsn1),
      endLsn: lsnIn(p.lsn0, p.lsn1),
      prepareTime: timeIn(p.t0, p.t1),
      xid: x,
      gid,
    });
    expectSequence(
      s,
      'twophase',
      o,
      rows,
      [
        { label: 'begin-prepare', p: bp(x1, gid1, p1) },
        { p: moodType(cat) },
        { p: rel.t_default },
        { p: { tag: 'insert', relationId: cat.rel.t_default, newTuple: [text('20'), text('2pc'), text('1.00'), text('{}'), text('ok')] } },
        { label: 'prepare', p: pr(x1, gid1, p1) },
        {
          label: 'commit-prepared',
          p: { tag: 'commitPrepared', flags: 0, commitLsn: lsnIn(c1.lsn0, c1.lsn1), endLsn: lsnIn(c1.lsn0, c1.lsn1), commitTime: ct1, xid: x1, gid: gid1 },
        },
        // The changes of a prepared transaction already rolled back when it is decoded are skipped
        // (PG18 checks the transaction's status first): only Begin Prepare / Prepare remain.
        { label: 'begin-prepare-2', p: bp(x2, gid2, p2) },
        { label: 'prepare-2', p: pr(x2, gid2, p2) },
        {
          label: 'rollback-prepared',
          p: {
            tag: 'rollbackPrepared',
            flags: 0,
            prepareEndLsn: lsnIn(p2.lsn0, p2.lsn1),
            rollbackEndLsn: lsnIn(r2.lsn0, r2.lsn1),
            prepareTime: timeIn(p2.t0, p2.t1),
            rollbackTime: timeIn(r2.t0, r2.t1),
            xid: x2,
            gid: gid2,
          },
        },
      ],
      'two_phase: PREPARE TRANSACTION + COMMIT PREPARED, then PREPARE TRANSACTION + ROLLBACK PREPARED',
    );
    // Cross-message equalities.
    const m = rows.map((r) => r.msg);
    const [b1, , , , P1, , b2, P2, R2] = m;
    if (b1?.tag !== 'beginPrepare' || P1?.tag !== 'prepare' || b2?.tag !== 'beginPrepare' || P2?.tag !== 'prepare' || R2?.tag !== 'rollbackPrepared')
      throw new Error('two-phase shape');
    expectEq(b1.prepareLsn, P1.prepareLsn, 'beginPrepare.prepareLsn = prepare.prepareLsn');
    expectEq(b1.endLsn, P1.endLsn, 'beginPrepare.endLsn = prepare.endLsn');
    expectEq(b1.prepareTime, P1.prepareTime, 'beginPrepare.prepareTime = prepare.prepareTime');
    expectEq(b2.endLsn, P2.endLsn, 'beginPrepare2.endLsn = prepare2.endLsn');
    expectEq(R2.prepareEndLsn, P2.endLsn, 'rollbackPrepared.prepareEndLsn = prepare.endLsn');
    expectEq(R2.prepareTime, P2.prepareTime, 'rollbackPrepared.prepareTime = prepare.prepareTime');
  });
}

async function scenarioStreamPrepare(s: Session, w: Client, cat: Catalog, o: PeekOptions): Promise<void> {
  await withSlot(s, 'cap_sp', true, async () => {
    const gid = 'pgsub-stream-prepare';
    await w.query('BEGIN');
    const xid = await xidNow(w);
    await w.query(`INSERT INTO t_sp SELECT i, 'row-' || i || '-' || repeat('x', 100) FROM generate_series(1, 1500) i`);
    const p = await around(w, `PREPARE TRANSACTION '${gid}'`);
    const c = await around(w, `COMMIT PREPARED '${gid}'`);
    const ct = await commitTs(w, xid);
    const rows = await peek(s, 'cap_sp', o);
    expectStream(
      s,
      'stream-prepare',
      o,
      rows,
      {
        top: xid,
        rel: (x) => relations(cat, x).t_sp,
        relationId: cat.rel.t_sp!,
        ranges: [{ from: 1, to: 1500, xid, committed: true }],
        tail: [
          {
            label: 'stream-prepare',
            p: { tag: 'streamPrepare', flags: 0, prepareLsn: lsnIn(p.lsn0, p.lsn1), endLsn: lsnIn(p.lsn0, p.lsn1), prepareTime: timeIn(p.t0, p.t1), xid, gid },
          },
          {
            label: 'commit-prepared-after-stream',
            p: { tag: 'commitPrepared', flags: 0, commitLsn: lsnIn(c.lsn0, c.lsn1), endLsn: lsnIn(c.lsn0, c.lsn1), commitTime: ct, xid, gid },
          },
        ],
      },
      `streamed two-phase transaction: Stream Prepare then Commit Prepared; streaming=${o.streaming}, two_phase`,
    );
  });
}

// ---------------------------------------------------------------------------------------------

async function capture(major: number): Promise<void> {
  const cluster = await startCluster(major);
  const admin = await connect(cluster.port).catch((e: unknown) => {
    cluster.stop();
    throw e;
  });
  let w: Client | undefined;
  try {
    const server = `PostgreSQL ${await one(admin, "SELECT current_setting('server_version') AS v")}`;
    console.log(`pg${major}: ${server} on 127.0.0.1:${cluster.port} (${cluster.dir})`);
    await admin.query(SCHEMA_SQL);
    const cat = await catalog(admin);
    w = await connect(cluster.port);
    const s: Session = { server, prefix: `pg${major}`, major, port: cluster.port, admin };
    const proto = major >= 16 ? 4 : major >= 15 ? 3 : 2;
    const base = major >= 16 ? 4 : 1;
    await scenarioInsert(s, w, cat, base);
    await scenarioDml(s, w, cat, base);
    await scenarioToastAndBinary(s, w, cat, base);
    await scenarioTruncate(s, w, cat, base);
    await scenarioMessages(s, w, base);
    await scenarioOrigin(s, cat, base);
    await w.query('TRUNCATE t_stream');
    await scenarioStream(s, w, cat, major >= 16 ? { proto, streaming: 'parallel' } : { proto: 2, streaming: 'on' });
    if (major >= 15) {
      await scenarioTwoPhase(s, w, cat, 3);
      await scenarioStreamPrepare(s, w, cat, { proto, streaming: major >= 16 ? 'parallel' : 'on', twoPhase: true });
    }
  } finally {
    await w?.end().catch(() => undefined);
    await admin.end().catch(() => undefined);
    cluster.stop();
  }
}

async function main(): Promise<void> {
  for (const major of [18, 14]) await capture(major);
  fs.mkdirSync(OUT_DIR, { recursive: true });
  for (const f of fs.readdirSync(OUT_DIR)) if (f.endsWith('.json')) fs.rmSync(path.join(OUT_DIR, f));
  const names = new Set<string>();
  for (const f of fixtures) {
    if (names.has(f.name)) throw new Error(`duplicate fixture name ${f.name}`);
    names.add(f.name);
    fs.writeFileSync(path.join(OUT_DIR, `${f.name}.json`), `${JSON.stringify(f, null, 2)}\n`);
  }
  console.log(`wrote ${fixtures.length} fixtures to ${path.relative(ROOT, OUT_DIR)}`);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exitCode = 1;
});
