/**
 * Row-level security on the target never costs a change (PostgreSQL 18 → 18, pgsub's target
 * role the README's, not a superuser, owning the table). A table whose policies apply to
 * that role (FORCE ROW LEVEL SECURITY; or, on a table it does not own, plain RLS without
 * BYPASSRLS) is a `pgsub preflight` blocker with the fix for each case, and makes `pgsub run`
 * exit 2 before copying anything, naming the table, the policy and the fix. Forced while pgsub
 * runs, an UPDATE of a row the policy hides stops the apply — first as the statement the
 * session's row_security = off makes fail, then as PGSUB_ROW_SECURITY at the Relation
 * message — retried, shown by `pgsub status`, never counted as update_missing nor skipped,
 * until NO FORCE ROW LEVEL SECURITY; then the row is right and the tables are equal.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { compareTables, spawnPgsub, startCluster, waitFor, waitForCatchUp, withTimeout, type Cluster, type PgsubProcess } from '../harness/index.js';

const TABLE = `CREATE TABLE public.acct (id int PRIMARY KEY, tenant text NOT NULL, balance int NOT NULL);
  CREATE TABLE public.shared (id int PRIMARY KEY);`;
let source: Cluster;
let target: Cluster;
let child: PgsubProcess | null = null;

before(async () => {
  [source, target] = await Promise.all([startCluster({ major: 18, name: 'rls-src' }), startCluster({ major: 18, name: 'rls-tgt' })]);
  await Promise.all([source.createDatabase('src'), target.createDatabase('dst')]);
  await source.query(
    `${TABLE} INSERT INTO public.acct VALUES (1, 'visible', 100), (2, 'hidden', 200);
     CREATE PUBLICATION pub FOR TABLE public.acct, public.shared;`,
    [],
    'src',
  );
  // The README's target role (PostgreSQL 15 or later), owner of the table as after `pgsub schema copy` (CREATE on its schema for defer_indexes).
  await target.query(
    `CREATE ROLE pgsub LOGIN;
     GRANT CREATE ON DATABASE dst TO pgsub;
     GRANT CREATE ON SCHEMA public TO pgsub;
     GRANT SET ON PARAMETER session_replication_role TO pgsub;
     GRANT EXECUTE ON FUNCTION pg_catalog.pg_replication_origin_create(text), pg_catalog.pg_replication_origin_oid(text),
       pg_catalog.pg_replication_origin_session_setup(text), pg_catalog.pg_replication_origin_session_reset(),
       pg_catalog.pg_replication_origin_xact_setup(pg_lsn, timestamptz), pg_catalog.pg_replication_origin_drop(text) TO pgsub;
     ${TABLE}
     ALTER TABLE public.acct OWNER TO pgsub;
     CREATE POLICY only_visible ON public.acct USING (tenant = 'visible');
     ALTER TABLE public.acct ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
     -- Not pgsub's: its policies apply to a role without BYPASSRLS even unforced.
     GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON public.shared TO pgsub;
     ALTER TABLE public.shared ENABLE ROW LEVEL SECURITY;`,
    [],
    'dst',
  );
});

after(async () => {
  child?.kill('SIGKILL');
  await child?.exited;
  await source?.stop();
  await target?.stop();
});

const env = () => ({
  PGSUB_SOURCE: source.url('src'),
  PGSUB_TARGET: `host=${target.host} port=${target.port} dbname=dst user=pgsub`,
  PGSUB_PUBLICATION: 'pub',
  PGSUB_SUBSCRIPTION: 'rls',
  // public.shared is not pgsub's: its indexes stay during the copy.
  PGSUB_DEFER_INDEXES: 'false',
  PGSUB_STATUS_INTERVAL: '1',
  PGSUB_RETRY_MIN_DELAY: '0.2',
  PGSUB_RETRY_MAX_DELAY: '0.5',
});

async function pgsub(args: string[]): Promise<{ code: number | string; output: string }> {
  const p = spawnPgsub(env(), args);
  const code = await withTimeout(p.exited, 60_000, `pgsub ${args.join(' ')}`);
  return { code, output: p.output() };
}

/** Rows as the superuser sees them: every one, whatever the policy. */
const rows = async () => (await target.query(`SELECT id, tenant, balance FROM public.acct ORDER BY id`, [], 'dst')).map((r) => `${r.id}:${r.tenant}:${r.balance}`);

/** The service's log, its JSON strings' quotes unescaped. */
const logged = () => child!.output().replaceAll('\\"', '"');

const REFUSAL =
  /user "pgsub" cannot replicate into relation with row-level security enabled: "public\.acct" \(policy only_visible; FORCE ROW LEVEL SECURITY applies them to its owner "pgsub"\)/;

test('a table whose row-level security applies to the applying role: a preflight blocker, and pgsub run exits 2 before copying it', async () => {
  const pre = await pgsub(['preflight', '--json']);
  assert.equal(pre.code, 1, pre.output.slice(-3000));
  const report = JSON.parse(pre.output.slice(pre.output.indexOf('{\n'))) as {
    findings: { severity: string; code: string; side: string; object: string; remediation: string | null }[];
  };
  const blocker = report.findings.find((f) => f.code === 'TARGET_ROW_SECURITY' && f.object === 'public.acct');
  assert.ok(blocker, pre.output.slice(-3000));
  assert.deepEqual([blocker.severity, blocker.side, blocker.object], ['blocker', 'target', 'public.acct']);
  assert.match(blocker.remediation ?? '', /ALTER TABLE "public"\."acct" NO FORCE ROW LEVEL SECURITY;/);
  const shared = report.findings.find((f) => f.code === 'TARGET_ROW_SECURITY' && f.object === 'public.shared');
  assert.ok(shared, pre.output.slice(-3000));
  assert.match(shared.remediation ?? '', /^ALTER ROLE "pgsub" BYPASSRLS;/);

  const run = await pgsub(['run']);
  assert.equal(run.code, 2, run.output.slice(-3000));
  const line = run.output.split('\n').find((l) => l.startsWith('pgsub: ')) ?? '';
  assert.match(line, /^pgsub: PGSUB_ROW_SECURITY: /, run.output.slice(-3000));
  assert.match(line, REFUSAL);
  assert.match(line, /On the target: ALTER TABLE "public"\."acct" NO FORCE ROW LEVEL SECURITY/);
  assert.deepEqual(await rows(), [], 'nothing copied into a table whose rows pgsub cannot all see');
});

test('forced while running, row-level security stops the apply of an UPDATE it would hide until the role sees every row; nothing is lost', async () => {
  await target.query(`ALTER TABLE public.acct NO FORCE ROW LEVEL SECURITY; ALTER TABLE public.shared DISABLE ROW LEVEL SECURITY`, [], 'dst');
  child = spawnPgsub(env());
  await child.waitForLog('streaming started');
  // A change after the copy: the session has the relation mapped when the policy is forced.
  await source.query(`UPDATE public.acct SET balance = balance + 1 WHERE id = 1`, [], 'src');
  await waitForCatchUp(source, 'src', 'rls', 60_000);
  assert.deepEqual(await rows(), ['1:visible:101', '2:hidden:200']);

  await target.query(`ALTER TABLE public.acct FORCE ROW LEVEL SECURITY`, [], 'dst');
  await source.query(`UPDATE public.acct SET balance = balance + 10 WHERE id = 2; DELETE FROM public.acct WHERE id = 2 AND false;`, [], 'src');
  await source.query(`BEGIN; UPDATE public.acct SET balance = balance + 1 WHERE id = 1; UPDATE public.acct SET tenant = 'hidden' WHERE id = 1; COMMIT;`, [], 'src');
  // The cached mapping's statement fails (row_security = off), and the next session refuses
  // the relation at its Relation message: retried, again and again, never applied past.
  await waitFor(() => /query would be affected by row-level security policy for table "acct"/.test(logged()), { timeoutMs: 30_000, what: 'the filtered UPDATE refused' });
  await waitFor(() => (child!.output().match(/PGSUB_ROW_SECURITY/g) ?? []).length >= 3, { timeoutMs: 30_000, what: 'the refusal, retried' });
  assert.match(logged(), REFUSAL);
  assert.deepEqual(await rows(), ['1:visible:101', '2:hidden:200'], 'nothing applied past the refused change');
  const status = await pgsub(['status', '--json']);
  const report = JSON.parse(status.output.slice(status.output.indexOf('{'))) as Record<string, unknown>;
  assert.equal(report.last_error_code, 'PGSUB_ROW_SECURITY', status.output);
  assert.equal(report.last_error_pending, true);
  assert.match(String(report.last_error_message), REFUSAL);

  // The fix on the target: the owner is no longer subject to its policies.
  await target.query(`ALTER TABLE public.acct NO FORCE ROW LEVEL SECURITY`, [], 'dst');
  await waitForCatchUp(source, 'src', 'rls', 60_000);
  assert.deepEqual(await rows(), ['1:hidden:102', '2:hidden:210']);
  const cmp = await compareTables(source, 'src', target, 'dst', ['public.acct']);
  assert.ok(cmp.equal, JSON.stringify(cmp));
  const [stats] = await target.query(`SELECT confl_update_missing::int AS um, confl_delete_missing::int AS dm FROM pgsub.subscription_stats WHERE subscription = 'rls'`, [], 'dst');
  assert.deepEqual([stats?.um ?? 0, stats?.dm ?? 0], [0, 0], 'no change counted as a missing row');
  child.kill('SIGTERM');
  assert.equal(await child.exited, 0, child.output().slice(-2000));
  child = null;
});
