/**
 * Running under systemd (issue 17), against a real NOTIFY_SOCKET: a datagram socket bound
 * by a small Python receiver (Node has no AF_UNIX datagram sockets) that prints every
 * datagram pgsub's systemd-notify sends and closes the barrier descriptors it passes, as
 * systemd does. The datagrams come in order: STATUS and EXTEND_TIMEOUT_USEC while the
 * initial copy moves, READY=1 once streaming, then STATUS and WATCHDOG=1 at half of
 * WATCHDOG_USEC. With the target table locked by the test the apply stops moving and the
 * pings stop; they resume once the lock goes. SIGTERM sends STOPPING=1. The unit file
 * passes `systemd-analyze verify`, and a password named as a credential is read from
 * $CREDENTIALS_DIRECTORY.
 */
import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { compareTables, connect, spawnPgsub, startCluster, waitFor, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const REPO = path.resolve(import.meta.dirname, '..', '..');
const RECEIVER = `
import array, json, os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
os.chmod(path, 0o777)
print(json.dumps({"listening": path}), flush=True)
while True:
    data, anc, flags, addr = s.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i"); fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            for fd in fds: os.close(fd)
    print(json.dumps({"at": __import__("time").time(), "data": data.decode()}), flush=True)
`;

let publisher: Cluster;
let target: Cluster;
let work: string;
let receiver: ChildProcess;
const received: { at: number; data: string }[] = [];
const children: PgsubProcess[] = [];

before(async () => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-systemd-'));
  fs.chmodSync(work, 0o755);
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'sd-pub' }), startCluster({ major: 18, name: 'sd-tgt' })]);
  await publisher.createDatabase('src');
  await target.createDatabase('dst');
  const schema = `CREATE TABLE public.big (id int PRIMARY KEY, v text);`;
  await publisher.query(`${schema} INSERT INTO public.big SELECT g, repeat('x', 200) FROM generate_series(1, 400000) g; CREATE PUBLICATION pub FOR TABLE public.big;`, [], 'src');
  await target.query(schema, [], 'dst');
  const socketPath = path.join(work, 'notify.sock');
  receiver = spawn('python3', ['-c', RECEIVER, socketPath], { stdio: ['ignore', 'pipe', 'inherit'] });
  let buffer = '';
  const listening = new Promise<void>((resolve) => {
    receiver.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString();
      let nl: number;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = JSON.parse(buffer.slice(0, nl)) as { listening?: string; at?: number; data?: string };
        buffer = buffer.slice(nl + 1);
        if (line.listening) resolve();
        else received.push({ at: line.at! * 1000, data: line.data! });
      }
    });
  });
  await listening;
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  receiver?.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
  fs.rmSync(work, { recursive: true, force: true });
});

const keys = (d: string) => d.split('\n').map((l) => l.split('=')[0]);
const has = (key: string) => received.some((r) => keys(r.data).includes(key));

test('notify: STATUS and EXTEND_TIMEOUT_USEC during the copy, READY once streaming, watchdog pings only while the apply moves, STOPPING at SIGTERM', {
  timeout: 300_000,
}, async () => {
  const p = spawnPgsub({
    PGSUB_SOURCE: publisher.url('src'),
    PGSUB_TARGET: target.url('dst'),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: 'sd',
    PGSUB_STATE_DIR: path.join(work, 'state'),
    PGSUB_NOTIFY_INTERVAL_MS: '200',
    // One source transaction per target transaction: a locked row stops the apply at once.
    PGSUB_GROUP_TRANSACTIONS: '1',
    PGSUB_MAX_SYNC_WORKERS: '1',
    NOTIFY_SOCKET: path.join(work, 'notify.sock'),
    WATCHDOG_USEC: '2000000',
  });
  children.push(p);
  await p.waitForLog('streaming started', 120_000);
  await waitFor(() => has('READY'), { timeoutMs: 10_000, what: 'READY=1' });
  const readyAt = received.findIndex((r) => keys(r.data).includes('READY'));
  const beforeReady = received.slice(0, readyAt);
  assert.ok(
    beforeReady.some((r) => /^STATUS=initial copy: copying 1 table/m.test(r.data)),
    JSON.stringify(beforeReady.slice(0, 5)),
  );
  assert.ok(
    beforeReady.some((r) => keys(r.data).includes('EXTEND_TIMEOUT_USEC')),
    'no EXTEND_TIMEOUT_USEC during the copy',
  );
  assert.match(received[readyAt]!.data, /STATUS=streaming from [0-9A-F]+\/[0-9A-F]+/);
  await waitFor(() => received.some((r) => /^STATUS=streaming; applied [0-9A-F]+\/[0-9A-F]+; lag \d+ bytes/.test(r.data)), { timeoutMs: 10_000, what: 'STATUS while streaming' });
  // Pings at about every second (half of WATCHDOG_USEC) while it moves or idles.
  await waitFor(() => received.filter((r) => r.data === 'WATCHDOG=1').length >= 3, { timeoutMs: 15_000, what: 'watchdog pings' });

  // The apply stops moving: a row it must update is locked by the test.
  const holder = await connect(target, 'dst');
  try {
    await holder.query('BEGIN');
    await holder.query('SELECT * FROM public.big WHERE id = 1 FOR UPDATE');
    await publisher.query(`UPDATE public.big SET v = 'locked' WHERE id = 1`, [], 'src');
    for (let i = 2; i < 50; i++) await publisher.query(`UPDATE public.big SET v = 'after' WHERE id = ${i}`, [], 'src');
    await waitFor(() => /watchdog keep-alive withheld/.test(p.output()), { timeoutMs: 15_000, what: 'the pings withheld' });
    const stuckFrom = Date.now();
    await new Promise((r) => setTimeout(r, 3000));
    assert.deepEqual(
      received.filter((r) => r.data === 'WATCHDOG=1' && r.at > stuckFrom),
      [],
      'pinged while the apply was stuck',
    );
  } finally {
    await holder.query('ROLLBACK');
    await holder.end();
  }
  const freed = Date.now();
  await waitFor(() => received.some((r) => r.data === 'WATCHDOG=1' && r.at > freed), { timeoutMs: 10_000, what: 'pings again' });
  await waitForCatchUp(publisher, 'src', 'sd');
  const cmp = await compareTables(publisher, 'src', target, 'dst', ['public.big']);
  assert.ok(cmp.equal, JSON.stringify(cmp));

  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-2000));
  assert.ok(
    received.some((r) => keys(r.data).includes('STOPPING')),
    'no STOPPING=1',
  );
  const order = received.map((r) => keys(r.data)[0]);
  assert.ok(order.lastIndexOf('EXTEND_TIMEOUT_USEC') < order.indexOf('READY') && order.indexOf('READY') < order.lastIndexOf('STOPPING'), order.join(' '));
});

test('the unit file passes systemd-analyze verify', async () => {
  // An instance name for the template, beside a copy of it.
  const unit = path.join(work, 'pgsub@.service');
  fs.copyFileSync(path.join(REPO, 'packaging', 'systemd', 'pgsub@.service'), unit);
  fs.symlinkSync(unit, path.join(work, 'pgsub@orders.service'));
  const { stdout, stderr } = await promisify(execFile)('systemd-analyze', ['verify', path.join(work, 'pgsub@orders.service')]);
  assert.doesNotMatch(stdout + stderr, /pgsub@/, stdout + stderr);
});

test('a password named as a systemd credential is read from $CREDENTIALS_DIRECTORY', async () => {
  await target.query(`CREATE ROLE cred LOGIN PASSWORD 'from-credential' SUPERUSER`);
  const hba = path.join(target.dataDir, 'pg_hba.conf');
  // Password authentication for this role only, before the harness's trust lines.
  fs.writeFileSync(hba, `host all cred 127.0.0.1/32 scram-sha-256\n${fs.readFileSync(hba, 'utf8')}`);
  await target.query('SELECT pg_reload_conf()');
  const credentials = path.join(work, 'credentials');
  fs.mkdirSync(credentials);
  fs.writeFileSync(path.join(credentials, 'target'), 'from-credential\n', { mode: 0o600 });
  const p = spawnPgsub(
    {
      PGSUB_SOURCE: publisher.url('src'),
      PGSUB_TARGET: `host=127.0.0.1 port=${target.port} dbname=dst user=cred password=credential:target`,
      PGSUB_SUBSCRIPTION: 'sd',
      PGSUB_PUBLICATION: 'pub',
      CREDENTIALS_DIRECTORY: credentials,
    },
    ['status', '--json'],
  );
  children.push(p);
  assert.equal(await p.exited, 0, p.output());
  assert.match(p.output(), /"subscription": "sd"/);
});
