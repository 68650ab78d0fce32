/**
 * Company on the target (issue 30): local transactions on the target update, delete and
 * lock the very rows the apply is changing, at a high rate, while a source writer updates
 * them — the case where PostgreSQL's own apply worker can miss a row a local transaction
 * is updating (commitfest entry 5151: a false update_missing/delete_missing and a lost
 * update). PostgreSQL 18 → 18, the target with track_commit_timestamp = on so that
 * *_origin_differs is detected; grouping on (group_transactions' default), one conflict
 * policy set per test. At the end every row is what the policy says, checked row by row
 * against a model:
 *  - the source writer only increments `src` (and inserts one event row per transaction,
 *    an append-only log whose copy on the target must equal the source's: nothing lost,
 *    nothing applied twice); it deletes a known subset of ids (SD);
 *  - local updaters set `loc` from a target sequence (evaluated once the row is locked, so
 *    the highest value is the last local write of a row) and remember each row they wrote;
 *    a local deleter deletes another known subset (LD); lockers hold single rows FOR UPDATE;
 *  - once the local writers stop and the apply caught up, a row is the source's, or (where
 *    the policy keeps local changes, or no source change came after it) its last local
 *    write; then the source updates every row once more, and under apply_remote every row
 *    equals the source's exactly;
 *  - no update_missing or delete_missing is ever logged for an id outside LD (any other is
 *    false), no apply error, and pgsub's stream never restarts: a conflict inside a group is
 *    resolved inside it (apply/run/conflict-replay.ts) — no GroupRetryError, no careful
 *    re-stream, one 'streaming started' per process.
 * Prints the apply rate of a backlog of single-row transactions with and without the local
 * writers. npm run test:faults (PGSUB_FAULTS=full) runs longer, adds the skip policy, kills
 * pgsub with SIGKILL in the middle of the local writers, and makes one target COMMIT fail
 * (a deferred trigger, once) while conflicts are being resolved inside groups: that one
 * failure, and only it, restarts the stream, and the model still holds. It also runs the
 * same workload against PostgreSQL's own subscriber (CREATE SUBSCRIPTION in the target,
 * whose defaults are the `defaults` scenario's policies) and prints what it did: false
 * *_missing read from the target's server log and rows that differ from the model — the
 * CF 5151 behaviour, if it shows; only what native must do (catch up, every event row
 * exactly once) is asserted there.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, test } from 'node:test';
import type pg from 'pg';
import { connect, prng, spawnPgsub, startCluster, waitForCatchUp, type Cluster, type PgsubProcess } from '../harness/index.js';

const FULL = process.env.PGSUB_FAULTS === 'full';
const ROWS = FULL ? 3000 : 1000;
/** Single-row source transactions of each measured backlog. */
const BACKLOG = FULL ? 1500 : 300;
/** How long the local writers run with the source writer live, after the backlog. */
const LOCAL_MS = FULL ? 40_000 : 3_000;
/** Source transactions per second while live (bounded, so the careful path keeps up). */
const SOURCE_RATE = FULL ? 300 : 150;
/** Pause of each local updater between its updates (two of them). */
const LOCAL_PAUSE_MS = FULL ? 2 : 5;
const SEED = Number(process.env.PGSUB_WRITERS_SEED ?? Date.now() % 100_000);

/** Deleted by the source while the local writers run. */
const isSD = (id: number) => id % 25 === 7;
/** Deleted on the target by the local deleter; the only ids a *_missing may name. */
const isLD = (id: number) => id % 25 === 3;

const SCHEMA = `CREATE TABLE public.t (id int PRIMARY KEY, src bigint NOT NULL, loc bigint NOT NULL, note text NOT NULL);
  CREATE TABLE public.ev (id bigserial PRIMARY KEY, k int NOT NULL);`;
// No autovacuum on the target's t: a frozen xmin has no commit origin, and the model assumes every row's last writer is known.
const TARGET_EXTRA = `ALTER TABLE public.t SET (autovacuum_enabled = false); CREATE SEQUENCE public.tok;`;
/** Fails one COMMIT of pgsub's (replica mode) once armed: a deferred trigger, once by a sequence (non-transactional). */
const FAULT = `
  CREATE TABLE public.fault (armed boolean NOT NULL); INSERT INTO public.fault VALUES (false);
  CREATE SEQUENCE public.fault_seq;
  CREATE FUNCTION public.fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF pg_catalog.current_setting('session_replication_role') = 'replica' THEN
      IF (SELECT armed FROM public.fault) THEN
        IF pg_catalog.nextval('public.fault_seq') = 1 THEN RAISE EXCEPTION 'injected commit failure'; END IF;
      END IF;
    END IF;
    RETURN NULL;
  END $$;
  CREATE CONSTRAINT TRIGGER t_fail_once AFTER UPDATE ON public.t DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.fail_once();
  ALTER TABLE public.t ENABLE ALWAYS TRIGGER t_fail_once;`;

interface Scenario {
  name: string;
  conflicts: Record<string, string> | null;
  /** *_origin_differs applies the remote change (else the local row stays). */
  remoteWins: boolean;
  /** update_missing inserts the remote row (else skipped). */
  missingInserts: boolean;
}

const SCENARIOS: Scenario[] = [
  { name: 'defaults', conflicts: null, remoteWins: true, missingInserts: false },
  { name: 'keep_local', conflicts: { update_origin_differs: 'keep_local', delete_origin_differs: 'keep_local' }, remoteWins: false, missingInserts: false },
  {
    name: 'apply_remote',
    conflicts: { update_origin_differs: 'apply_remote', delete_origin_differs: 'apply_remote', update_missing: 'apply_remote', delete_missing: 'skip' },
    remoteWins: true,
    missingInserts: true,
  },
  ...(FULL
    ? [
        {
          name: 'skip',
          conflicts: { update_origin_differs: 'skip', delete_origin_differs: 'skip', update_missing: 'skip', delete_missing: 'skip' },
          remoteWins: false,
          missingInserts: false,
        },
      ]
    : []),
];

let pub: Cluster;
let tgt: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [pub, tgt] = await Promise.all([startCluster({ major: 18, name: 'lw-pub' }), startCluster({ major: 18, name: 'lw-tgt', settings: { track_commit_timestamp: 'on' } })]);
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await Promise.all(children.map((c) => c.exited));
  await pub?.stop();
  await tgt?.stop();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** PGSUB_WRITERS_DEBUG=1: each phase's end, as it happens. */
const phase = (what: string) => {
  if (process.env.PGSUB_WRITERS_DEBUG) process.stdout.write(`# ${new Date().toISOString()} ${what}\n`);
};

function start(sc: Scenario): PgsubProcess {
  const child = spawnPgsub({
    PGSUB_SOURCE: pub.url(sc.name),
    PGSUB_TARGET: tgt.url(sc.name),
    PGSUB_PUBLICATION: 'pub',
    PGSUB_SUBSCRIPTION: `lw_${sc.name}`,
    PGSUB_COPY_DATA: 'false',
    PGSUB_STATUS_INTERVAL: '1',
    PGSUB_RETRY_MIN_DELAY: '0.2',
    PGSUB_RETRY_MAX_DELAY: '0.5',
    ...(process.env.PGSUB_WRITERS_DEBUG ? { PGSUB_LOG_LEVEL: 'debug' } : {}),
    ...(sc.conflicts ? { PGSUB_CONFLICTS: JSON.stringify({ default: sc.conflicts }) } : {}),
  });
  children.push(child);
  return child;
}

function records(p: PgsubProcess): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of p.output().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // a partial line
    }
  }
  return out;
}

/** Stream restarts in one process's log: sessions after the first, and why. */
function restarts(p: PgsubProcess): { sessions: number; retries: Record<string, unknown>[] } {
  const rs = records(p);
  const sessions = rs.filter((r) => r.msg === 'streaming started').length;
  const retries = rs.filter(
    (r) =>
      r.msg === 'a grouped transaction failed; re-applying one transaction at a time' ||
      r.msg === 're-streaming a conflicting transaction to apply it carefully' ||
      r.msg === 'apply failed; retrying',
  );
  return { sessions, retries };
}

async function stopChild(p: PgsubProcess): Promise<void> {
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0, p.output().slice(-3000));
}

/** BEGIN; one source change + its event row; COMMIT — `n` times, in one simple query. */
async function sourceBacklog(db: string, rnd: () => number, n: number): Promise<void> {
  const parts: string[] = [];
  for (let i = 0; i < n; i++) {
    const id = 1 + Math.floor(rnd() * ROWS);
    parts.push(`BEGIN; WITH u AS (UPDATE public.t SET src = src + 1, note = 'b${i}' WHERE id = ${id} RETURNING id) INSERT INTO public.ev (k) SELECT id FROM u; COMMIT;`);
  }
  for (let i = 0; i < parts.length; i += 500) await pub.query(parts.slice(i, i + 500).join('\n'), [], db);
}

type Row = { id: number; src: string; loc: string; note: string };
const rowText = (r: Row | undefined) => (r ? `${r.id}|${r.src}|${r.loc}|${r.note}` : 'absent');

/** The local side: updaters, a deleter of LD, lockers; each loop until stopped. */
class LocalWriters {
  /** Last local write of each row (highest loc). */
  readonly last = new Map<number, Row>();
  readonly deleted = new Set<number>();
  updates = 0;
  locks = 0;
  #stop = false;
  #loops: Promise<void>[] = [];
  #clients: pg.Client[] = [];
  #error: unknown = null;

  #run(loop: Promise<void>): void {
    this.#loops.push(
      loop.catch((err: unknown) => {
        this.#error ??= err;
        this.#stop = true;
      }),
    );
  }

  async start(db: string, seed: number, deleteWithinMs: number): Promise<void> {
    const rnd = prng(seed);
    const open = async () => {
      const c = await connect(tgt, db);
      this.#clients.push(c);
      return c;
    };
    for (let k = 0; k < 2; k++) {
      const c = await open();
      this.#run(this.#updater(c, prng(seed + 1 + k)));
    }
    for (let k = 0; k < 2; k++) {
      const c = await open();
      this.#run(this.#locker(c, prng(seed + 11 + k)));
    }
    const ld = Array.from({ length: ROWS }, (_, i) => i + 1).filter(isLD);
    for (let i = ld.length - 1; i > 0; i--) {
      const j = Math.floor(rnd() * (i + 1));
      [ld[i], ld[j]] = [ld[j]!, ld[i]!];
    }
    this.#run(this.#deleter(await open(), ld, deleteWithinMs));
  }

  async #updater(c: pg.Client, rnd: () => number): Promise<void> {
    while (!this.#stop) {
      const id = 1 + Math.floor(rnd() * ROWS);
      const r = await c.query<Row>(`UPDATE public.t SET loc = nextval('public.tok'), note = 'local' WHERE id = $1 RETURNING id, src::text AS src, loc::text AS loc, note`, [id]);
      const row = r.rows[0];
      if (row) {
        this.updates++;
        const seen = this.last.get(id);
        if (!seen || BigInt(row.loc) > BigInt(seen.loc)) this.last.set(id, row);
      }
      await sleep(LOCAL_PAUSE_MS);
    }
  }

  async #locker(c: pg.Client, rnd: () => number): Promise<void> {
    while (!this.#stop) {
      // One row per transaction: a locker never waits while holding a lock (no deadlock with the apply).
      await c.query('BEGIN');
      await c.query('SELECT 1 FROM public.t WHERE id = $1 FOR UPDATE', [1 + Math.floor(rnd() * ROWS)]);
      await c.query('SELECT pg_sleep(0.01)');
      await c.query('COMMIT');
      this.locks++;
      await sleep(3);
    }
  }

  async #deleter(c: pg.Client, ids: number[], withinMs: number): Promise<void> {
    const gap = withinMs / ids.length;
    for (const id of ids) {
      if (this.#stop) break;
      const r = await c.query('DELETE FROM public.t WHERE id = $1 RETURNING id', [id]);
      if (r.rowCount) this.deleted.add(id);
      await sleep(gap);
    }
  }

  async stop(): Promise<void> {
    this.#stop = true;
    await Promise.all(this.#loops);
    await Promise.all(this.#clients.map((c) => c.end()));
    if (this.#error !== null) throw this.#error;
  }
}

/** The live source writer: SOURCE_RATE single-row transactions per second, SD ids deleted along the way. */
class SourceWriter {
  transactions = 0;
  #stop = false;
  #loop: Promise<void> | null = null;
  #client: pg.Client | null = null;

  async start(db: string, rnd: () => number, deleteWithinMs: number): Promise<void> {
    this.#client = await connect(pub, db);
    const sd = Array.from({ length: ROWS }, (_, i) => i + 1).filter(isSD);
    // Observed at once (an unhandled rejection would end the test runner), thrown by stop().
    this.#loop = this.#run(this.#client, rnd, sd, deleteWithinMs);
    this.#loop.catch(() => {});
  }

  async #run(c: pg.Client, rnd: () => number, sd: number[], withinMs: number): Promise<void> {
    const began = Date.now();
    let deletes = 0;
    while (!this.#stop) {
      const due = Math.floor(((Date.now() - began) / withinMs) * sd.length);
      if (deletes < sd.length && deletes < due) {
        await c.query(`WITH d AS (DELETE FROM public.t WHERE id = $1 RETURNING id) INSERT INTO public.ev (k) SELECT -id FROM d`, [sd[deletes++]]);
      } else {
        const id = 1 + Math.floor(rnd() * ROWS);
        await c.query(`WITH u AS (UPDATE public.t SET src = src + 1, note = 'live' WHERE id = $1 RETURNING id) INSERT INTO public.ev (k) SELECT id FROM u`, [id]);
      }
      this.transactions++;
      const ahead = (this.transactions * 1000) / SOURCE_RATE - (Date.now() - began);
      if (ahead > 0) await sleep(ahead);
    }
    while (deletes < sd.length) await c.query(`WITH d AS (DELETE FROM public.t WHERE id = $1 RETURNING id) INSERT INTO public.ev (k) SELECT -id FROM d`, [sd[deletes++]]);
  }

  async stop(): Promise<void> {
    this.#stop = true;
    await this.#loop;
    await this.#client?.end();
  }
}

async function tableRows(c: Cluster, db: string): Promise<Map<number, Row>> {
  const rows = await c.query<Row>('SELECT id, src::text AS src, loc::text AS loc, note FROM public.t ORDER BY id', [], db);
  return new Map(rows.map((r) => [Number(r.id), { ...r, id: Number(r.id) }]));
}

/**
 * Every row against the model. `quiesced`: after the local writers stopped, before the
 * final source update (a local write that no source change followed stays under any policy).
 */
async function checkModel(sc: Scenario, local: LocalWriters, quiesced: boolean, db = sc.name): Promise<string[]> {
  const source = await tableRows(pub, db);
  const target = await tableRows(tgt, db);
  const bad: string[] = [];
  for (let id = 1; id <= ROWS; id++) {
    const S = source.get(id);
    const T = target.get(id);
    const L = local.last.get(id);
    const same = (a: Row | undefined, b: Row | undefined) => rowText(a) === rowText(b);
    // A local write that no source change followed: the row may stay as written.
    const localStands = L !== undefined && same(T, L) && S !== undefined && L.src === S.src && quiesced;
    let ok: boolean;
    if (isSD(id)) {
      // Deleted by the source: gone, unless the policy keeps a row written locally before the delete arrived.
      ok = sc.remoteWins ? T === undefined : L === undefined ? T === undefined : same(T, L);
    } else if (isLD(id)) {
      assert.ok(local.deleted.has(id), `LD id ${id} was not deleted locally`);
      // Deleted locally: gone (update_missing skipped) or inserted again from the source (apply_remote).
      ok = sc.missingInserts ? (quiesced ? T === undefined || same(T, S) || localStands : same(T, S)) : T === undefined;
    } else if (sc.remoteWins) {
      ok = same(T, S) || localStands;
    } else {
      // The local write, once made, stays (keep_local / skip); a row never written locally follows the source.
      ok = L === undefined ? same(T, S) : same(T, L);
    }
    if (!ok) bad.push(`id ${id}: target ${rowText(T)}, source ${rowText(S)}, last local ${rowText(L)}`);
  }
  for (const id of target.keys()) if (id < 1 || id > ROWS) bad.push(`unexpected id ${id}`);
  return bad;
}

async function checkEvents(db: string): Promise<void> {
  const q = 'SELECT count(*)::int AS n, coalesce(sum(id), 0)::text AS s, coalesce(sum(k::bigint * id), 0)::text AS w FROM public.ev';
  const [a] = await pub.query(q, [], db);
  const [b] = await tgt.query(q, [], db);
  assert.deepEqual(b, a, 'the event log: every source transaction applied exactly once');
}

/** The slot caught up with the publisher; a pgsub that exits first fails the test at once, with its log. */
async function untilCaughtUp(child: PgsubProcess, db: string, timeoutMs: number): Promise<void> {
  const exited = child.exited.then((code) => {
    assert.fail(`pgsub exited (${code}) before the slot caught up:\n${child.output().slice(-6000)}`);
  });
  exited.catch(() => {}); // an exit after the catch-up (the test's own SIGTERM) is no failure
  await Promise.race([waitForCatchUp(pub, db, `lw_${db}`, timeoutMs), exited]).catch((err) => assert.fail(`${err}\n${child.output().slice(-4000)}`));
}

/** Start pgsub on a backlog (with local writers already running, or not); source transactions per second from its stream's start to the catch-up. */
async function catchUpRate(sc: Scenario): Promise<{ child: PgsubProcess; rate: number }> {
  const child = start(sc);
  await child.waitForLog('streaming started', 60_000);
  const t0 = performance.now();
  await untilCaughtUp(child, sc.name, FULL ? 600_000 : 90_000);
  return { child, rate: BACKLOG / ((performance.now() - t0) / 1000) };
}

/** The *_missing conflicts native's apply worker logged (PostgreSQL 18: a LOG line "conflict detected … conflict=update_missing", then its DETAIL line "… replica identity (id)=(N)"). */
async function nativeMissing(sinceOffset: number): Promise<{ type: string; id: number }[]> {
  const lines = (await readFile(path.join(tgt.dataDir, 'server.log'), 'utf8')).slice(sinceOffset).split('\n');
  const found: { type: string; id: number }[] = [];
  for (let i = 0; i < lines.length; i++) {
    const conflict = /conflict=(update_missing|delete_missing)$/.exec(lines[i]!);
    if (!conflict) continue;
    // The DETAIL that follows (its second line starts with a tab), before the next entry's LOG.
    const detail = lines.slice(i + 1, i + 4).join('\n');
    const key = /replica identity \(id\)=\((\d+)\)/.exec(detail);
    assert.ok(key, `a ${conflict[1]} without its key in the server log: ${lines.slice(i, i + 4).join(' | ')}`);
    found.push({ type: conflict[1]!, id: Number(key[1]) });
  }
  return found;
}

/** A backlog of BACKLOG source transactions while native's subscription is disabled; source transactions per second from ENABLE to the catch-up. */
async function nativeCatchUpRate(db: string, rnd: () => number, beforeEnable: () => Promise<void> = async () => {}): Promise<number> {
  await tgt.query('ALTER SUBSCRIPTION lw_native DISABLE', [], db);
  await waitForIdleSlot(db);
  await sourceBacklog(db, rnd, BACKLOG);
  await beforeEnable();
  await tgt.query('ALTER SUBSCRIPTION lw_native ENABLE', [], db);
  // Timed from the walsender's start, as pgsub's from 'streaming started': not the launcher's delay in starting the worker.
  while (!(await pub.query<{ active: boolean }>("SELECT active FROM pg_replication_slots WHERE slot_name = 'lw_native'", [], db))[0]?.active) await sleep(5);
  const t0 = performance.now();
  await waitForCatchUp(pub, db, 'lw_native', 600_000);
  return BACKLOG / ((performance.now() - t0) / 1000);
}

async function waitForIdleSlot(db: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    const [r] = await pub.query<{ active: boolean }>("SELECT active FROM pg_replication_slots WHERE slot_name = 'lw_native'", [], db);
    if (r && !r.active) return;
    await sleep(100);
  }
  assert.fail('native walsender still active 30 s after DISABLE');
}

if (FULL) {
  test(`the same local writers against PostgreSQL's own subscriber: what it does (CF 5151), catch-up and events asserted (seed ${SEED})`, { timeout: 900_000 }, async () => {
    const db = 'native';
    const sc = SCENARIOS[0]!; // native's policies are the defaults': remote wins, a missing row is skipped
    const rnd = prng(SEED + db.length);
    await pub.createDatabase(db);
    await tgt.createDatabase(db);
    await pub.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.t, public.ev;`, [], db);
    await tgt.query(SCHEMA + TARGET_EXTRA, [], db);
    const logStart = (await readFile(path.join(tgt.dataDir, 'server.log'), 'utf8')).length;
    await tgt.query(`CREATE SUBSCRIPTION lw_native CONNECTION '${pub.url(db)}' PUBLICATION pub WITH (copy_data = false)`, [], db);
    await pub.query(`INSERT INTO public.t SELECT g, 0, 0, 'init' FROM generate_series(1, ${ROWS}) g`, [], db);
    await waitForCatchUp(pub, db, 'lw_native', 120_000);

    const quiet = await nativeCatchUpRate(db, rnd);
    phase(`native: quiet backlog applied (${Math.round(quiet)}/s)`);
    const local = new LocalWriters();
    const busy = await nativeCatchUpRate(db, rnd, () => local.start(db, SEED + 7 * db.length, LOCAL_MS * 0.8));
    phase(`native: busy backlog applied (${Math.round(busy)}/s)`);
    const source = new SourceWriter();
    await source.start(db, rnd, LOCAL_MS * 0.8);
    await sleep(LOCAL_MS);
    await local.stop();
    await source.stop();
    await waitForCatchUp(pub, db, 'lw_native', 300_000);
    const quiesced = await checkModel(sc, local, true, db);
    for (let a = 1; a <= ROWS; a += 100) {
      await pub.query(
        `WITH u AS (UPDATE public.t SET src = src + 1, note = 'final' WHERE id BETWEEN $1 AND $2 RETURNING id) INSERT INTO public.ev (k) SELECT id FROM u`,
        [a, a + 99],
        db,
      );
    }
    await waitForCatchUp(pub, db, 'lw_native', 300_000);
    const final = await checkModel(sc, local, false, db);
    await checkEvents(db);
    const missing = await nativeMissing(logStart);
    const falseMissing = missing.filter((m) => !isLD(m.id));
    const [stats] = await tgt.query(
      'SELECT confl_update_origin_differs::int AS uod, confl_update_missing::int AS um, confl_delete_missing::int AS dm, apply_error_count::int AS errors FROM pg_stat_subscription_stats',
      [],
      db,
    );
    // Every *_missing native counted is one read from its log (the count the comparison rests on).
    assert.equal(missing.length, stats.um + stats.dm, 'the *_missing in the server log against pg_stat_subscription_stats');
    await tgt.query('DROP SUBSCRIPTION lw_native', [], db);
    process.stdout.write(
      `# native subscriber under local writers: apply rate ${Math.round(quiet)} source transactions/s without local writers, ${Math.round(busy)} with them; ` +
        `${local.updates} local updates, ${local.deleted.size} local deletes, ${local.locks} row locks, ${source.transactions} live source transactions; ` +
        `pg_stat_subscription_stats ${JSON.stringify(stats)}; *_missing logged ${missing.length}, false (id never deleted on the target) ${falseMissing.length}` +
        `${falseMissing.length ? ` e.g. ${JSON.stringify(falseMissing.slice(0, 5))}` : ''}; rows differing from the model ${quiesced.length} after the writers stopped, ${final.length} after the final update` +
        `${final.length ? ` e.g. ${final.slice(0, 3).join('; ')}` : ''}\n`,
    );
  });
}

for (const sc of SCENARIOS) {
  test(`local writers on the target, policies ${sc.name}: every row as the policy says, no false *_missing, no stream restart (seed ${SEED})`, {
    timeout: FULL ? 900_000 : 300_000,
  }, async () => {
    const db = sc.name;
    const slot = `lw_${db}`;
    const rnd = prng(SEED + db.length);
    await pub.createDatabase(db);
    await tgt.createDatabase(db);
    await pub.query(`${SCHEMA} CREATE PUBLICATION pub FOR TABLE public.t, public.ev;`, [], db);
    await tgt.query(SCHEMA + TARGET_EXTRA + (FULL ? FAULT : ''), [], db);
    let child = start(sc);
    await child.waitForLog('streaming started');
    // Inserted through the stream: every row's last writer on the target is pgsub's origin.
    await pub.query(`INSERT INTO public.t SELECT g, 0, 0, 'init' FROM generate_series(1, ${ROWS}) g`, [], db);
    await waitForCatchUp(pub, db, slot);
    await stopChild(child);
    const processes: PgsubProcess[] = [];

    // Without local writers: a backlog's apply rate.
    await sourceBacklog(db, rnd, BACKLOG);
    const quiet = await catchUpRate(sc);
    phase(`quiet backlog applied (${Math.round(quiet.rate)}/s)`);
    // Nobody else writes yet: not one conflict is seen (a detecting statement's result is no conflict).
    assert.deepEqual(
      records(quiet.child).filter((r) => r.msg === 'conflict detected'),
      [],
    );
    processes.push(quiet.child);
    await stopChild(quiet.child);

    // With local writers: they start, then pgsub on the same backlog; then the source writes live.
    await sourceBacklog(db, rnd, BACKLOG);
    const local = new LocalWriters();
    await local.start(db, SEED + 7 * db.length, LOCAL_MS * 0.8);
    const busy = await catchUpRate(sc);
    phase(`busy backlog applied (${Math.round(busy.rate)}/s)`);
    child = busy.child;
    const source = new SourceWriter();
    await source.start(db, rnd, LOCAL_MS * 0.8);
    let killed: PgsubProcess | null = null;
    if (FULL) {
      // One target COMMIT fails (once) while conflicts are resolved inside groups; then a SIGKILL in the middle.
      await sleep(LOCAL_MS / 4);
      await tgt.query('UPDATE public.fault SET armed = true', [], db);
      phase('fault armed');
      await sleep(LOCAL_MS / 4);
      child.kill('SIGKILL');
      assert.equal(await child.exited, 'SIGKILL');
      killed = child;
      phase('pgsub killed');
      child = start(sc);
      await child.waitForLog('streaming started', 60_000);
      await sleep(LOCAL_MS / 2);
    } else await sleep(LOCAL_MS);
    await local.stop();
    await source.stop();
    phase(`writers stopped (${source.transactions} live source transactions)`);
    await untilCaughtUp(child, db, 300_000);
    phase('caught up');
    const quiesced = await checkModel(sc, local, true);
    assert.deepEqual(quiesced.slice(0, 20), [], `${quiesced.length} rows differ from the model after the local writers stopped`);

    // The source updates every row once more (chunks of 100 rows a transaction).
    for (let a = 1; a <= ROWS; a += 100) {
      await pub.query(
        `WITH u AS (UPDATE public.t SET src = src + 1, note = 'final' WHERE id BETWEEN $1 AND $2 RETURNING id) INSERT INTO public.ev (k) SELECT id FROM u`,
        [a, a + 99],
        db,
      );
    }
    await untilCaughtUp(child, db, 300_000);
    phase('final update applied');
    const final = await checkModel(sc, local, false);
    assert.deepEqual(final.slice(0, 20), [], `${final.length} rows differ from the model after the final source update`);
    if (sc.remoteWins && sc.missingInserts) assert.deepEqual([...(await tableRows(tgt, db)).values()].map(rowText), [...(await tableRows(pub, db)).values()].map(rowText));
    await checkEvents(db);
    await stopChild(child);
    processes.push(child);

    // No false *_missing: only ids the local deleter removed.
    const log = await tgt.query<{ conflict_type: string; id: string; policy: string }>(
      `SELECT conflict_type, key->>'id' AS id, policy FROM pgsub.conflict_log WHERE subscription = $1 ORDER BY id`,
      [slot],
      db,
    );
    const falseMissing = log.filter((l) => /_missing$/.test(l.conflict_type) && !isLD(Number(l.id)));
    assert.deepEqual(falseMissing, [], 'a *_missing for an id never deleted on the target');
    const byType: Record<string, number> = {};
    for (const l of log) byType[l.conflict_type] = (byType[l.conflict_type] ?? 0) + 1;
    assert.ok((byType.update_origin_differs ?? 0) > 0, `conflicts met: ${JSON.stringify(byType)}`);
    const [stats] = await tgt.query('SELECT apply_error_count::int AS errors FROM pgsub.subscription_stats WHERE subscription = $1', [slot], db);
    // The injected COMMIT failure is the one apply error the full run may count.
    assert.ok((stats?.errors ?? 0) <= (FULL ? 1 : 0), `apply errors: ${stats?.errors}`);

    // No stream restart: one session per process; in the full run the injected failure's retry alone.
    const retries: Record<string, unknown>[] = [];
    for (const p of processes) {
      const r = restarts(p);
      retries.push(...r.retries);
      const injected = r.retries.filter((x) => JSON.stringify(x).includes('injected commit failure')).length;
      assert.equal(r.sessions, 1 + injected, `sessions of one process: ${JSON.stringify(r.retries)}`);
    }
    if (killed) {
      const r = restarts(killed);
      retries.push(...r.retries);
      assert.equal(r.sessions, 1 + r.retries.length);
    }
    const notInjected = retries.filter((x) => !JSON.stringify(x).includes('injected commit failure'));
    assert.deepEqual(notInjected, [], 'stream restarts that were not the injected failure');
    if (FULL) {
      // The trigger failed one COMMIT, and that failure alone restarted the stream, once.
      assert.equal((await tgt.query(`SELECT is_called FROM public.fault_seq`, [], db))[0].is_called, true);
      assert.equal(retries.length, 1, JSON.stringify(retries));
    }
    const careful = records(child).filter((r) => r.msg === 'conflict detected').length;
    for (const p of processes) {
      const unnamed = records(p).filter((r) => r.msg === 'conflict detected' && !(typeof r.conflict === 'string' && r.conflict in byType));
      assert.deepEqual(unnamed.slice(0, 3), [], 'every conflict logged names a type the conflict log has');
    }
    if (process.env.PGSUB_WRITERS_DEBUG) process.stdout.write(`# ${JSON.stringify(records(busy.child).find((r) => r.msg === 'apply loop stopped'))}\n`);
    process.stdout.write(
      `# local writers (${sc.name}): apply rate ${Math.round(quiet.rate)} source transactions/s without local writers, ${Math.round(busy.rate)} with them; ` +
        `${local.updates} local updates, ${local.deleted.size} local deletes, ${local.locks} row locks, ${source.transactions} live source transactions; ` +
        `conflicts ${JSON.stringify(byType)}; stream restarts ${retries.length}${FULL ? ' (the injected failure)' : ''}; conflicts logged by the last process ${careful}\n`,
    );
  });
}
