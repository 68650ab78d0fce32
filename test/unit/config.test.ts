/**
 * loadConfig: a YAML or JSON file, then PGSUB_* variables, then overrides; one frozen
 * Config out. Unknown settings are errors naming the setting; CREATE SUBSCRIPTION options
 * whose value pgsub cannot honour yet are NotImplementedError naming the key. Every test
 * passes its own env, so the machine's environment never leaks in.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadConfig, resolveStateDir, CONFIG_KEYS, type LoadOptions } from '../../src/config/config.js';
import { editDistance, nearestName } from '../../src/config/issues.js';
import { ConfigError, NotImplementedError } from '../../src/errors.js';
import { ruleFor } from '../../src/mapping/rules.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pgsub-config-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

let fileCounter = 0;
function writeFile(ext: string, text: string): string {
  const file = path.join(dir, `config-${++fileCounter}${ext}`);
  fs.writeFileSync(file, text);
  return file;
}

/** A small config that loads (copy_data off keeps the examples about streaming alone). */
const MINIMAL_ENV: NodeJS.ProcessEnv = {
  PGSUB_SOURCE: 'postgresql://rep@pub.example.com:5433/shop',
  PGSUB_TARGET: 'host=tgt.example.com dbname=shop user=apply',
  PGSUB_PUBLICATION: 'shop_pub',
  PGSUB_COPY_DATA: 'false',
};

const load = (opts: LoadOptions) => loadConfig({ env: {}, ...opts });

function assertConfigError(fn: () => unknown, names: string | RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    assert.equal(err.code, 'PGSUB_CONFIG_INVALID');
    if (typeof names === 'string') assert.ok(err.message.includes(names), `message names ${names}: ${err.message}`);
    else assert.match(err.message, names);
    return true;
  });
}

function assertNotImplemented(fn: () => unknown, key: string): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof NotImplementedError, `expected NotImplementedError, got ${String(err)}`);
    assert.equal(err.code, 'PGSUB_NOT_IMPLEMENTED');
    assert.equal(err.context.key, key);
    assert.ok(err.message.startsWith(`${key} = `), `message names ${key}: ${err.message}`);
    return true;
  });
}

describe('config file', () => {
  test('YAML: every kind of value, publication as a list', () => {
    const file = writeFile(
      '.yaml',
      [
        'subscription: orders_sub',
        'source: "postgresql://rep:pw@pub:5433/shop?sslmode=require"',
        "target: host=tgt dbname=shop user=apply password='a b'",
        'publication: [pub_a, pub_b]',
        'copy_data: false',
        'create_slot: no',
        'streaming: off',
        'synchronous_commit: remote_apply',
        'status_interval: 2.5',
        'receive_timeout: 30',
        'max_in_flight: 50',
        'log_level: debug',
      ].join('\n'),
    );
    const c = load({ file });
    assert.equal(c.subscription, 'orders_sub');
    assert.equal(c.slotName, 'orders_sub');
    assert.deepEqual(c.publications, ['pub_a', 'pub_b']);
    const { host, port, user, password, database, sslmode } = c.source;
    assert.deepEqual({ host, port, user, password, database, sslmode }, { host: 'pub', port: 5433, user: 'rep', password: 'pw', database: 'shop', sslmode: 'require' });
    assert.deepEqual(c.source.hosts, [{ host: 'pub', port: 5433 }]);
    assert.equal(c.target.password, 'a b');
    assert.equal(c.target.database, 'shop');
    assert.equal(c.copyData, false);
    assert.equal(c.createSlot, false);
    assert.equal(c.streaming, 'off');
    assert.equal(c.synchronousCommit, 'remote_apply');
    assert.equal(c.statusIntervalMs, 2500);
    assert.equal(c.receiveTimeoutMs, 30_000);
    assert.equal(c.maxInFlight, 50);
    assert.equal(c.logLevel, 'debug');
  });

  test('JSON: booleans and publication as a comma-separated string', () => {
    const file = writeFile(
      '.json',
      JSON.stringify({ source: 'host=pub', target: 'host=tgt', publication: 'p1, p2 ,p3', copy_data: false, streaming: false, synchronous_commit: true, binary: false }),
    );
    const c = load({ file });
    assert.deepEqual(c.publications, ['p1', 'p2', 'p3']);
    assert.equal(c.subscription, 'pgsub');
    assert.equal(c.slotName, 'pgsub');
    assert.equal(c.streaming, 'off');
    assert.equal(c.synchronousCommit, 'on');
    assert.equal(c.binary, false);
  });

  test('defaults for everything not given', () => {
    const c = load({ env: MINIMAL_ENV });
    assert.equal(c.subscription, 'pgsub');
    assert.equal(c.createSlot, true);
    assert.equal(c.binary, false);
    assert.equal(c.streaming, 'off');
    assert.equal(c.synchronousCommit, 'on');
    assert.equal(c.twoPhase, false);
    assert.equal(c.disableOnError, false);
    assert.equal(c.origin, 'any');
    assert.equal(c.messages, false);
    assert.equal(c.statusIntervalMs, 10_000);
    assert.equal(c.receiveTimeoutMs, 60_000);
    assert.equal(c.targetTimeoutMs, 60_000);
    assert.equal(c.retryMinDelayMs, 1000);
    assert.equal(c.retryMaxDelayMs, 60_000);
    assert.equal(c.maxInFlight, 4000);
    assert.equal(c.copyInserts, true);
    assert.equal(c.queueSize, 2_000);
    assert.equal(c.logLevel, 'info');
  });

  test('target_timeout: seconds, positive', () => {
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_TARGET_TIMEOUT: '2.5' } }).targetTimeoutMs, 2500);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_TARGET_TIMEOUT: '0' } }), /target_timeout: /);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_TARGET_TIMEOUT: 'soon' } }), /target_timeout: /);
  });

  test('an unknown key in the file is a ConfigError naming it', () => {
    const file = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\ncopy_data: false\nslot: s1\n');
    assertConfigError(() => load({ file }), /unknown key slot \(from .*config-\d+\.yaml\)/);
  });

  test('an unknown key that is a near miss of a real one: did you mean …?', () => {
    const file = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\ncopydata: false\nStreaming: on\npublicaton_names: x\n');
    assertConfigError(() => load({ file }), /unknown key copydata \(from .*\.yaml\); did you mean copy_data\?/);
    assertConfigError(() => load({ file }), /unknown key Streaming \(from .*\.yaml\); did you mean streaming\?/);
    // Too far from every key for a guess: no suggestion.
    assertConfigError(() => load({ file }), /unknown key publicaton_names \(from/);
    assert.throws(
      () => load({ file }),
      (err: unknown) => err instanceof ConfigError && err.context.key === 'copydata' && !/publicaton_names; did you mean/.test(err.message),
    );
    // Nested mappings suggest their own keys.
    assertConfigError(
      () => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"defaults":{}}' } }),
      /unknown key defaults in conflicts \(from PGSUB_CONFLICTS\); did you mean default\?/,
    );
    assertConfigError(
      () => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"default":{"insert_exist":"skip"}}' } }),
      /unknown key insert_exist in conflicts\.default \(from PGSUB_CONFLICTS\); did you mean insert_exists\?/,
    );
  });

  test('an enum error lists the allowed values', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_STREAMING: 'maybe' } }), 'streaming: "maybe" is not one of off, on, parallel (from PGSUB_STREAMING)');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_ORIGIN: 'local' } }), 'origin: "local" is not one of any, none');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_LOG_LEVEL: 'loud' } }), 'log_level: "loud" is not one of fatal, error, warn, info, debug, trace, silent');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_COPY_DATA: 'maybe' } }), 'copy_data: "maybe" is not a boolean (true/false, on/off, yes/no, 1/0)');
    assertConfigError(
      () => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"default":{"insert_exists":"merge"}}' } }),
      'conflicts.default.insert_exists: "merge" is not one of error, skip, apply_remote, keep_local (from PGSUB_CONFLICTS)',
    );
    const file = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\nstreaming: 3\n');
    assertConfigError(() => load({ file }), new RegExp(`streaming: 3 is not one of off, on, parallel \\(from ${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}\\)`));
  });

  test('a number error names the key and the bad value', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_MAX_IN_FLIGHT: 'abc' } }), 'max_in_flight: "abc" is not a number (from PGSUB_MAX_IN_FLIGHT)');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_MAX_IN_FLIGHT: '0' } }), 'max_in_flight: must be at least 1, got 0');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_MAX_IN_FLIGHT: '2000000' } }), 'max_in_flight: must be at most 1000000, got 2000000');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_BATCH_ROWS: '1.5' } }), 'batch_rows: must be a whole number, got 1.5');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_STATUS_INTERVAL: '0' } }), 'status_interval: must be more than 0 (seconds), got 0');
    // An empty variable is not 0.
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_QUEUE_SIZE: '' } }), 'queue_size: "" is not a number');
    const file = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\nmax_in_flight: true\n');
    assertConfigError(() => load({ file }), 'max_in_flight: true is not a number');
    // Numbers still come as numbers or numeric strings.
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_MAX_IN_FLIGHT: ' 12 ', PGSUB_STATUS_INTERVAL: '.5' } }).maxInFlight, 12);
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_STATUS_INTERVAL: '.5' } }).statusIntervalMs, 500);
  });

  test('unreadable, malformed and non-mapping files', () => {
    assertConfigError(() => load({ file: path.join(dir, 'missing.yaml') }), /cannot read config file .*missing\.yaml/);
    assertConfigError(() => load({ file: writeFile('.json', '{"source": ') }), /is not valid JSON/);
    assertConfigError(() => load({ file: writeFile('.yaml', 'source: [unclosed\n') }), /is not valid YAML/);
    assertConfigError(() => load({ file: writeFile('.yaml', '- a\n- b\n') }), /must hold a mapping of settings/);
    assertConfigError(() => load({ file: writeFile('.yaml', '') }), /must hold a mapping of settings/);
  });

  test('wrongly typed values name the key', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_STATUS_INTERVAL: 'soon' } }), 'status_interval');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_MAX_IN_FLIGHT: '0' } }), 'max_in_flight');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_LOG_LEVEL: 'loud' } }), 'log_level');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_COPY_DATA: 'maybe' } }), 'copy_data');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_PUBLICATION: ' , ' } }), 'publication');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_SUBSCRIPTION: 'x'.repeat(64) } }), 'subscription');
  });

  test('missing required settings: "<key> is required"', () => {
    const { PGSUB_TARGET: _t, ...noTarget } = MINIMAL_ENV;
    assertConfigError(() => load({ env: noTarget }), /^invalid configuration: target is required \(in the config file, or as PGSUB_TARGET\)$/);
    const { PGSUB_SOURCE: _s, PGSUB_PUBLICATION: _p, ...neither } = MINIMAL_ENV;
    assertConfigError(() => load({ env: neither }), /source is required .*; publication is required/);
    assert.throws(
      () => load({ env: neither }),
      (err: unknown) => err instanceof ConfigError && err.context.key === 'source',
    );
  });
});

describe('environment', () => {
  const file = writeFile(
    '.yaml',
    'subscription: file_sub\nsource: host=file-src\ntarget: host=file-tgt\npublication: file_pub\nslot_name: file_slot\ncopy_data: true\nstreaming: parallel\nstatus_interval: 5\n',
  );

  test('PGSUB_* overrides the file, key by key', () => {
    const c = load({
      file,
      env: {
        PGSUB_SOURCE: 'postgresql://env-src/db',
        PGSUB_TARGET: 'host=env-tgt',
        PGSUB_PUBLICATION: 'a, b,c',
        PGSUB_SLOT: 'env_slot',
        PGSUB_SUBSCRIPTION: 'env_sub',
        PGSUB_COPY_DATA: 'false',
        PGSUB_STREAMING: 'off',
      },
    });
    assert.equal(c.source.host, 'env-src');
    assert.equal(c.target.host, 'env-tgt');
    assert.deepEqual(c.publications, ['a', 'b', 'c']);
    assert.equal(c.slotName, 'env_slot');
    assert.equal(c.subscription, 'env_sub');
    assert.equal(c.copyData, false);
    assert.equal(c.streaming, 'off');
    // Not overridden: still from the file.
    assert.equal(c.statusIntervalMs, 5000);
  });

  test('without the env overrides, the values of the file hold', () => {
    const c = load({ file });
    assert.equal(c.streaming, 'parallel');
    assert.equal(c.slotName, 'file_slot');
  });

  test('PGSUB_SLOT_NAME and the publication aliases', () => {
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_SLOT_NAME: 's2' } }).slotName, 's2');
    const { PGSUB_PUBLICATION: _p, ...rest } = MINIMAL_ENV;
    assert.deepEqual(load({ env: { ...rest, PGSUB_PUBLICATIONS: 'x,y' } }).publications, ['x', 'y']);
    assert.deepEqual(load({ env: { ...rest, PGSUB_PUBLICATION_NAMES: 'z' } }).publications, ['z']);
  });

  test('boolean spellings', () => {
    for (const v of ['false', 'off', '0', 'no']) assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_CREATE_SLOT: v } }).createSlot, false, v);
    for (const v of ['true', 'on', '1', 'yes']) assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_CREATE_SLOT: v } }).createSlot, true, v);
  });

  test('an unknown PGSUB_ variable is a ConfigError naming it, with a suggestion when it is a near miss', () => {
    assert.throws(
      () => load({ env: { ...MINIMAL_ENV, PGSUB_PUBLICATON: 'typo' } }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.context.key === 'PGSUB_PUBLICATON' &&
        /^environment variable PGSUB_PUBLICATON is not a pgsub setting; did you mean PGSUB_PUBLICATION\?$/.test(err.message),
    );
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_COPYDATA: 'false' } }), /PGSUB_COPYDATA is not a pgsub setting; did you mean PGSUB_COPY_DATA\?/);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_SLTO: 'x' } }), /did you mean PGSUB_SLOT\?/);
    // Nothing close: the known settings are listed instead.
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_WHATEVER_ELSE: '1' } }), /PGSUB_WHATEVER_ELSE is not a pgsub setting \(known: subscription, source, /);
    // Not settings, but pgsub's own: accepted.
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_PROGRESS_INTERVAL_MS: '100', PGSUB_FAULT: 'x' } }).subscription, 'pgsub');
  });

  test('non-PGSUB variables are ignored; libpq variables fill the conninfo', () => {
    const c = load({ env: { ...MINIMAL_ENV, PGSUB_TARGET: 'dbname=t', PGHOST: 'libpq-host', PGPASSWORD: 'pw', HOME: '/x', PGSUBX: '1' } });
    assert.equal(c.target.host, 'libpq-host');
    assert.equal(c.target.password, 'pw');
  });

  test('overrides beat the environment', () => {
    const c = load({ env: { ...MINIMAL_ENV, PGSUB_LOG_LEVEL: 'warn' }, overrides: { log_level: 'trace', subscription: 'ov' } });
    assert.equal(c.logLevel, 'trace');
    assert.equal(c.subscription, 'ov');
    // An undefined override (an absent CLI flag) leaves the lower layer alone.
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_LOG_LEVEL: 'warn' }, overrides: { log_level: undefined } }).logLevel, 'warn');
  });

  test('the process environment is not read when env is given', () => {
    process.env.PGSUB_BOGUS_FROM_PROCESS = '1';
    try {
      assert.equal(load({ env: MINIMAL_ENV }).subscription, 'pgsub');
    } finally {
      delete process.env.PGSUB_BOGUS_FROM_PROCESS;
    }
  });

  test('every key is settable as PGSUB_<KEY>', () => {
    // Not an exhaustive value check: the point is that no key is unknown to the env path.
    for (const key of CONFIG_KEYS) {
      const name = `PGSUB_${key.toUpperCase()}`;
      try {
        load({ env: { ...MINIMAL_ENV, [name]: 'x' } });
      } catch (err) {
        assert.ok(!(err as Error).message.includes(`${name} is not a pgsub setting`), name);
      }
    }
  });
});

describe('slot name', () => {
  test('defaults to the subscription name', () => {
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_SUBSCRIPTION: 'orders_2' } }).slotName, 'orders_2');
  });

  for (const bad of ['Orders', 'my-slot', 'slot name', 'été']) {
    test(`invalid slot name ${JSON.stringify(bad)} is a ConfigError`, () => {
      assert.throws(
        () => load({ env: { ...MINIMAL_ENV, PGSUB_SLOT: bad } }),
        (err: unknown) => err instanceof ConfigError && err.context.key === 'slot_name' && err.message.includes(JSON.stringify(bad)),
      );
    });
  }

  test('a subscription name that is not a valid slot name needs an explicit slot_name', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_SUBSCRIPTION: 'Orders-Sub' } }), /slot_name "Orders-Sub"/);
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_SUBSCRIPTION: 'Orders-Sub', PGSUB_SLOT: 'orders_sub' } }).subscription, 'Orders-Sub');
  });

  test('over 63 characters is refused', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_SLOT: 'a'.repeat(64) } }), 'slot_name');
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_SLOT: 'a'.repeat(63) } }).slotName.length, 63);
  });
});

describe('unimplemented CREATE SUBSCRIPTION options', () => {
  test('copy_data true is the default, with the table sync settings', () => {
    const { PGSUB_COPY_DATA: _c, ...env } = MINIMAL_ENV;
    const c = load({ env });
    assert.equal(c.copyData, true);
    assert.equal(c.truncateBeforeCopy, false);
    assert.equal(c.maxSyncWorkers, 4);
    assert.equal(load({ env: { ...env, PGSUB_MAX_SYNC_WORKERS: '8', PGSUB_TRUNCATE_BEFORE_COPY: 'on' } }).maxSyncWorkers, 8);
    assertConfigError(() => load({ env: { ...env, PGSUB_MAX_SYNC_WORKERS: '0' } }), 'max_sync_workers');
  });

  const refused: [string, string, string][] = [
    ['failover', 'PGSUB_FAILOVER', 'true'],
    ['enabled', 'PGSUB_ENABLED', 'false'],
    ['connect', 'PGSUB_CONNECT', 'false'],
    ['password_required', 'PGSUB_PASSWORD_REQUIRED', 'false'],
    ['run_as_owner', 'PGSUB_RUN_AS_OWNER', 'false'],
  ];
  for (const [key, name, value] of refused) {
    test(`${key} = ${value}`, () => assertNotImplemented(() => load({ env: { ...MINIMAL_ENV, [name]: value } }), key));
  }

  test('run_as_owner = true (what pgsub does: it applies as its own role) is the default and accepted', () => {
    load({ env: MINIMAL_ENV });
    load({ env: { ...MINIMAL_ENV, PGSUB_RUN_AS_OWNER: 'true' } });
    assert.throws(
      () => load({ env: { ...MINIMAL_ENV, PGSUB_RUN_AS_OWNER: 'false' } }),
      (err: Error & { code?: string }) => err.code === 'PGSUB_NOT_IMPLEMENTED' && /run_as_owner = false .*native's run_as_owner = true/.test(err.message),
    );
  });

  test('refresh_interval: 0 means refresh only by command; negative is refused', () => {
    assert.equal(load({ env: MINIMAL_ENV }).refreshIntervalMs, 60_000);
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_REFRESH_INTERVAL: '0' } }).refreshIntervalMs, 0);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_REFRESH_INTERVAL: '-1' } }), 'refresh_interval');
  });

  test('disable_on_error and conflict policies: native defaults, per-table overrides, validation', () => {
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_DISABLE_ON_ERROR: 'true' } }).disableOnError, true);
    const d = load({ env: MINIMAL_ENV }).conflicts;
    assert.equal(d.detect, true);
    assert.deepEqual(d.defaults, {
      insert_exists: 'error',
      update_origin_differs: 'apply_remote',
      update_exists: 'error',
      update_missing: 'skip',
      delete_origin_differs: 'apply_remote',
      delete_missing: 'skip',
      multiple_unique_conflicts: 'error',
    });
    const file = writeFile(
      '.yaml',
      [
        'source: host=a',
        'target: host=b',
        'publication: p',
        'conflicts:',
        '  default:',
        '    insert_exists: apply_remote',
        '  tables:',
        `    'public.Odd "name"':`,
        '      update_missing: apply_remote',
        '      insert_exists: keep_local',
        '',
      ].join('\n'),
    );
    const c = load({ file }).conflicts;
    assert.equal(c.defaults.insert_exists, 'apply_remote');
    assert.equal(c.defaults.update_exists, 'error');
    assert.deepEqual(c.tables['public.Odd "name"'], { update_missing: 'apply_remote', insert_exists: 'keep_local' });
    assert.equal(load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"detect":false}' } }).conflicts.detect, false);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"default":{"delete_missing":"apply_remote"}}' } }), 'delete_missing');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"default":{"insert_exists":"merge"}}' } }), 'insert_exists');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"default":{"row_exists":"skip"}}' } }), 'row_exists');
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_CONFLICTS: '{"tables":{"nodot":{"insert_exists":"skip"}}}' } }), 'schema.table');
  });

  test('the same values from a file and as JSON booleans', () => {
    const file = writeFile('.json', JSON.stringify({ source: 'host=a', target: 'host=b', publication: 'p', copy_data: false, streaming: 'parallel' }));
    assert.equal(load({ file }).streaming, 'parallel');
    const on = writeFile('.json', JSON.stringify({ source: 'host=a', target: 'host=b', publication: 'p', streaming: true, binary: true }));
    assert.equal(load({ file: on }).streaming, 'on');
    assert.equal(load({ file: on }).binary, true);
    const file2 = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\ncopy_data: false\nsynchronous_commit: false\n');
    assert.equal(load({ file: file2 }).synchronousCommit, 'off');
    const file3 = writeFile('.yaml', 'source: host=a\ntarget: host=b\npublication: p\ncopy_data: false\ntwo_phase: true\n');
    assert.equal(load({ file: file3 }).twoPhase, true);
  });

  test('implemented values of those options load', () => {
    const c = load({
      env: {
        ...MINIMAL_ENV,
        PGSUB_BINARY: 'false',
        PGSUB_STREAMING: 'false',
        PGSUB_TWO_PHASE: 'off',
        PGSUB_DISABLE_ON_ERROR: 'no',
        PGSUB_ORIGIN: 'none',
        PGSUB_MESSAGES: 'true',
        PGSUB_SYNCHRONOUS_COMMIT: 'local',
        PGSUB_FAILOVER: '0',
        PGSUB_ENABLED: 'true',
        PGSUB_CONNECT: 'true',
        PGSUB_PASSWORD_REQUIRED: 'true',
        PGSUB_RUN_AS_OWNER: 'true',
      },
    });
    assert.equal(c.streaming, 'off');
    assert.equal(c.synchronousCommit, 'local');
    assert.equal(c.origin, 'none');
    assert.equal(c.messages, true);
  });

  test('origin accepts only any and none', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_ORIGIN: 'local' } }), 'origin');
  });

  test('a config error is reported before an unimplemented option', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_STREAMING: 'on', PGSUB_SLOT: 'Bad-Slot' } }), 'slot_name');
  });
});

describe('conninfo errors through loadConfig', () => {
  test('a bad source port names source, a bad target sslmode names target', () => {
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_SOURCE: 'host=a port=x' } }), /^source: port "x"/);
    assertConfigError(() => load({ env: { ...MINIMAL_ENV, PGSUB_TARGET: 'postgresql://b/db?sslmode=bogus' } }), /^target: sslmode "bogus"/);
  });
});

describe('edit distance', () => {
  test('insertions, deletions, substitutions and swaps cost one each', () => {
    assert.equal(editDistance('copy_data', 'copy_data'), 0);
    assert.equal(editDistance('copydata', 'copy_data'), 1);
    assert.equal(editDistance('copy_dta', 'copy_data'), 1);
    assert.equal(editDistance('cpoy_data', 'copy_data'), 1);
    assert.equal(editDistance('copy_dbta', 'copy_data'), 1);
    assert.equal(editDistance('', 'abc'), 3);
    assert.equal(editDistance('kitten', 'sitting'), 3);
  });

  test('the nearest name within a distance that grows with the length, case ignored', () => {
    assert.equal(nearestName('COPY_DATA', CONFIG_KEYS), 'copy_data');
    assert.equal(nearestName('slto', ['slot', 'source']), 'slot');
    assert.equal(nearestName('sl', ['slot']), null);
    assert.equal(nearestName('max_inflight', CONFIG_KEYS), 'max_in_flight');
    assert.equal(nearestName('tables_to_copy', CONFIG_KEYS), null);
  });
});

describe('state directory', () => {
  test('state_dir wins, then $STATE_DIRECTORY (systemd), then XDG_STATE_HOME, then ~/.local/state', () => {
    const env = { STATE_DIRECTORY: '/var/lib/pgsub', XDG_STATE_HOME: '/home/op/.state', HOME: '/home/op' };
    assert.equal(resolveStateDir('orders', '/srv/pgsub', env), '/srv/pgsub');
    assert.equal(resolveStateDir('orders', 'rel/dir', env), path.resolve('rel/dir'));
    assert.equal(resolveStateDir('orders', undefined, env), '/var/lib/pgsub');
    // systemd lists several directories colon-separated when StateDirectory= names several.
    assert.equal(resolveStateDir('orders', undefined, { ...env, STATE_DIRECTORY: '/var/lib/pgsub:/var/lib/other' }), '/var/lib/pgsub');
    assert.equal(resolveStateDir('orders', undefined, { XDG_STATE_HOME: '/home/op/.state', HOME: '/home/op' }), '/home/op/.state/pgsub/orders');
    // A relative XDG_STATE_HOME is ignored, as the XDG spec says.
    assert.equal(resolveStateDir('orders', undefined, { XDG_STATE_HOME: 'state', HOME: '/home/op' }), '/home/op/.local/state/pgsub/orders');
    assert.equal(resolveStateDir('orders', undefined, { HOME: '/home/op' }), '/home/op/.local/state/pgsub/orders');
    assert.equal(resolveStateDir('orders', undefined, {}), path.join(os.homedir(), '.local', 'state', 'pgsub', 'orders'));
  });

  test('through loadConfig: per subscription, never the working directory; the spool below it', () => {
    const c = load({ env: { ...MINIMAL_ENV, PGSUB_SUBSCRIPTION: 'orders', HOME: '/home/op' } });
    assert.equal(c.stateDir, '/home/op/.local/state/pgsub/orders');
    assert.equal(c.spoolDir, '/home/op/.local/state/pgsub/orders/spool');
    assert.ok(!c.stateDir.startsWith(process.cwd()), c.stateDir);
    assert.equal(load({ env: { ...MINIMAL_ENV, STATE_DIRECTORY: '/var/lib/pgsub' } }).spoolDir, '/var/lib/pgsub/spool');
    assert.equal(load({ env: { ...MINIMAL_ENV, STATE_DIRECTORY: '/var/lib/pgsub', PGSUB_STATE_DIR: '/srv/x' } }).stateDir, '/srv/x');
  });
});

describe('the returned config is frozen', () => {
  test('top level and nested objects', () => {
    const c = load({ env: MINIMAL_ENV });
    assert.ok(Object.isFrozen(c));
    assert.ok(Object.isFrozen(c.source));
    assert.ok(Object.isFrozen(c.target));
    assert.ok(Object.isFrozen(c.publications));
    assert.throws(() => {
      (c as { slotName: string }).slotName = 'other';
    }, TypeError);
    assert.throws(() => {
      (c.target as { host: string }).host = 'elsewhere';
    }, TypeError);
    assert.throws(() => (c.publications as string[]).push('more'), TypeError);
    assert.equal(c.slotName, 'pgsub');
    assert.equal(c.target.host, 'tgt.example.com');
  });
});

describe('mapping', () => {
  const base = { env: MINIMAL_ENV };
  test('rules are validated and merged: schema target, table target, renames, excludes, computed', () => {
    const c = load({
      ...base,
      overrides: {
        mapping: {
          schemas: { shop: { target: 'sales' } },
          tables: { 'shop.customers': { target: 'clients', columns: { a: 'b', c: null }, exclude: ['d'], computed: { e: 'lower(a)' } } },
        },
      },
    });
    const rule = ruleFor(c.mapping, 'shop', 'customers')!;
    assert.deepEqual(
      [rule.targetSchema, rule.targetTable, [...rule.renames], [...rule.excluded].sort(), [...rule.computed]],
      ['sales', 'clients', [['a', 'b']], ['c', 'd'], [['e', 'lower(a)']]],
    );
    assert.deepEqual(ruleFor(c.mapping, 'shop', 'orders'), {
      source: 'shop.orders',
      targetSchema: 'sales',
      targetTable: 'orders',
      renames: new Map(),
      excluded: new Set(),
      computed: new Map(),
      rows: { truncate: 'truncate' },
      drift: 'stop',
    });
    assert.equal(ruleFor(c.mapping, 'other', 'orders'), null);
  });
  test('row semantics merge a table rule over its schema rule, with shorthands', () => {
    const c = load({
      ...base,
      overrides: {
        mapping: {
          schemas: { shop: { filter: `region = 'eu'`, soft_delete: 'deleted', discriminator: 'src' } },
          tables: { 'shop.a': { key: ['src', 'id'], truncate: 'ignore' }, 'shop.b': { soft_delete: { at: 'gone_at' }, discriminator: { column: 'src', value: 'b' } } },
        },
      },
    });
    assert.deepEqual(ruleFor(c.mapping, 'shop', 'a')!.rows, {
      truncate: 'ignore',
      key: ['src', 'id'],
      filter: `region = 'eu'`,
      softDelete: { flag: 'deleted' },
      discriminator: { column: 'src', value: 'shop.a' },
    });
    assert.deepEqual(ruleFor(c.mapping, 'shop', 'b')!.rows, {
      truncate: 'truncate',
      filter: `region = 'eu'`,
      softDelete: { at: 'gone_at' },
      discriminator: { column: 'src', value: 'b' },
    });
  });
  test('a bad rule names its key; a designed but unbuilt key is refused by name', () => {
    assertConfigError(() => load({ ...base, overrides: { mapping: { tables: { customers: {} } } } }), /mapping\.tables\.customers.*schema\.table/);
    assertConfigError(() => load({ ...base, overrides: { mapping: { tables: { 's.t': { colums: {} } } } } }), /unknown key colums.*columns/);
    // Every designed key is built: none is refused as not implemented.
    assert.equal(ruleFor(load({ ...base, overrides: { mapping: { tables: { 's.t': { drift: 'stop', filter: 'a > 1' } } } } }).mapping, 's', 't')?.rows.filter, 'a > 1');
  });
  test('drift: a table policy, else its schema, else stop; anything else is refused', () => {
    const c = load({ ...base, overrides: { mapping: { schemas: { s: { drift: 'ignore' } }, tables: { 's.t': { drift: 'add' } } } } });
    assert.equal(ruleFor(c.mapping, 's', 't')?.drift, 'add');
    assert.equal(ruleFor(c.mapping, 's', 'u')?.drift, 'ignore');
    assertConfigError(() => load({ ...base, overrides: { mapping: { tables: { 's.t': { drift: 'merge' } } } } }), /"merge" is not a drift policy/);
  });
  test('PGSUB_MAPPING takes JSON', () => {
    const c = load({ env: { ...MINIMAL_ENV, PGSUB_MAPPING: '{"tables": {"s.t": {"target": "u.v"}}}' } });
    assert.equal(ruleFor(c.mapping, 's', 't')?.targetSchema, 'u');
  });
});
