/**
 * A target database whose encoding is not UTF8 (issue 16.3): pgsub's own schema installs
 * (its migrations are ASCII), values are converted by the server as native's are — the
 * initial copy and the stream both carry LATIN1-representable text — and a value the
 * target encoding cannot represent is an apply error naming the table and the column, the
 * change and the remote transaction; skipped, the rest applies.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { spawnPgsub, startCluster, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const SUB = 'enc';
let publisher: Cluster;
let target: Cluster;
const children: PgsubProcess[] = [];

before(async () => {
  [publisher, target] = await Promise.all([startCluster({ major: 18, name: 'enc-pub' }), startCluster({ major: 18, name: 'enc-tgt' })]);
  await publisher.createDatabase('src');
  await target.query(`CREATE DATABASE dst ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`);
  const schema = `CREATE TABLE public.t (id int PRIMARY KEY, name text, note text);`;
  await publisher.query(`${schema} INSERT INTO public.t VALUES (1, 'café', 'crème brûlée'), (2, 'Ærø', 'smørrebrød'); CREATE PUBLICATION pub FOR TABLE public.t;`, [], 'src');
  await target.query(schema, [], 'dst');
});

after(async () => {
  for (const c of children) c.kill('SIGKILL');
  await publisher?.stop();
  await target?.stop();
});

function run(args = ['run'], extra: Record<string, string> = {}): PgsubProcess {
  const child = spawnPgsub(
    {
      PGSUB_SOURCE: publisher.url('src'),
      PGSUB_TARGET: target.url('dst'),
      PGSUB_PUBLICATION: 'pub',
      PGSUB_SUBSCRIPTION: SUB,
      PGSUB_RETRY_MIN_DELAY: '0.2',
      PGSUB_RETRY_MAX_DELAY: '0.5',
      PGSUB_STATUS_INTERVAL: '1',
      ...extra,
    },
    args,
  );
  children.push(child);
  return child;
}

const rows = async (c: Cluster, db: string) => (await c.query<{ r: string }>(`SELECT id || '|' || name || '|' || note AS r FROM public.t ORDER BY id`, [], db)).map((x) => x.r);

test("pgsub's migrations are ASCII: they install into any server encoding", () => {
  const dir = path.join(import.meta.dirname, '..', '..', 'migrations');
  for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.sql'))) {
    const text = fs.readFileSync(path.join(dir, f), 'utf8');
    assert.ok(/^[\x00-\x7f]*$/.test(text), `${f} has non-ASCII characters`);
  }
});

test('a LATIN1 target: copied and streamed text converted; an unrepresentable value names table and column; skipped, the rest applies', async () => {
  const p = run();
  await p.waitForLog('streaming started');
  await publisher.query(`INSERT INTO public.t VALUES (3, 'naïve', 'façade')`, [], 'src');
  await waitForCatchUp(publisher, 'src', SUB);
  assert.deepEqual(await rows(target, 'dst'), await rows(publisher, 'src'));
  // The euro sign is not in LATIN1.
  await publisher.query(`INSERT INTO public.t VALUES (4, 'ok', 'price 5 €')`, [], 'src');
  await waitFor(async () => /apply failed; retrying/.test(p.output()), { timeoutMs: 30_000, what: 'the conversion error' });
  const failure = p
    .output()
    .split('\n')
    .find((l) => l.includes('apply failed; retrying'))!;
  process.stdout.write(`# ${failure}\n`);
  const rec = JSON.parse(failure) as { err: { type: string; message: string; relation?: string; column?: string; command?: string; stack?: string }; finishLsn?: string };
  assert.match(rec.err.message, /has no equivalent in encoding "LATIN1"/);
  assert.equal(rec.err.relation, 'public.t');
  assert.equal(rec.err.column, 'note');
  assert.equal(rec.err.command, 'INSERT');
  assert.ok(rec.finishLsn);
  const skip = run(['skip', '--lsn', rec.finishLsn!]);
  assert.equal(await withTimeout(skip.exited, 30_000, 'skip'), 0, skip.output());
  await publisher.query(`INSERT INTO public.t VALUES (5, 'après', 'fin')`, [], 'src');
  await waitForCatchUp(publisher, 'src', SUB);
  assert.deepEqual(
    await rows(target, 'dst'),
    (await rows(publisher, 'src')).filter((r) => !r.startsWith('4|')),
  );
  p.kill('SIGTERM');
  assert.equal(await p.exited, 0);
});
