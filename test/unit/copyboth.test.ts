/**
 * The CopyBoth reader (protocol/copyboth.ts) on a fake pg connection: the walsender's byte
 * sequence after START_REPLICATION — CopyBothResponse, XLogData frames (one larger than
 * the others), a keepalive, a NoticeResponse, CopyDone, CommandComplete, ReadyForQuery —
 * split into chunks at every offset and every pair of offsets, must come out as exactly
 * the pgoutput messages and the keepalive, in order, with the walEnd of the last
 * XLogData; pg's own handler must get back everything after CopyDone. An ErrorResponse
 * goes back to pg the same way, after the messages before it. Status updates go out as
 * CopyData. The server's CopyDone is answered with a CopyDone; a CommandComplete without
 * CopyDone (a walsender stopping with its server) ends the stream and goes back to pg.
 */
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import { CopyBothReader, type ReceivedBatch } from '../../src/protocol/copyboth.js';

function message(code: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(code, 0, 'latin1');
  head.writeUInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

function xlogData(walEnd: bigint, payload: Buffer): Buffer {
  const head = Buffer.alloc(25);
  head.write('w', 0, 'latin1');
  head.writeBigUInt64BE(walEnd - 1n, 1);
  head.writeBigUInt64BE(walEnd, 9);
  head.writeBigInt64BE(123n, 17);
  return message('d', Buffer.concat([head, payload]));
}

function keepalive(walEnd: bigint, reply: boolean): Buffer {
  const body = Buffer.alloc(18);
  body.write('k', 0, 'latin1');
  body.writeBigUInt64BE(walEnd, 1);
  body.writeBigInt64BE(456n, 9);
  body[17] = reply ? 1 : 0;
  return message('d', body);
}

const payloads = [Buffer.from('Bbegin'), Buffer.from(`I${'x'.repeat(400)}`), Buffer.alloc(0), Buffer.from('Ccommit')];
const frames = payloads.map((p, i) => xlogData(BigInt(0x1000 + i), p));
const start = message('W', Buffer.from([0, 0, 0]));
const notice = message('N', Buffer.from('SNOTICE\0\0'));
const tail = Buffer.concat([message('C', Buffer.from('COPY 0\0')), message('Z', Buffer.from('I'))]);
const wire = Buffer.concat([start, frames[0]!, frames[1]!, keepalive(0x2000n, true), notice, frames[2]!, frames[3]!, message('c', Buffer.alloc(0)), tail]);

/** A socket as pg leaves it: one 'data' listener (pg's parser), here collecting bytes. */
function fakeConnection(chunks: Buffer[]) {
  const handedBack: Buffer[] = [];
  const written: Buffer[] = [];
  const stream = new Readable({ read() {} }) as Readable & { write(b: Buffer): boolean; writableEnded: boolean };
  stream.write = (b: Buffer) => {
    written.push(b);
    return true;
  };
  stream.writableEnded = false;
  stream.on('data', (b: Buffer) => handedBack.push(b));
  const connection = {
    stream,
    query: () => {
      for (const c of chunks) stream.push(c);
    },
  };
  return { connection, handedBack, written };
}

async function readAll(reader: CopyBothReader): Promise<{ items: ReceivedBatch['items']; walEnd: bigint | null; error: unknown }> {
  const items: ReceivedBatch['items'] = [];
  let walEnd: bigint | null = null;
  try {
    for (let batch = await reader.next(); batch !== null; batch = await reader.next()) {
      items.push(...batch.items);
      if (batch.walEnd !== null) walEnd = batch.walEnd;
    }
  } catch (error) {
    return { items, walEnd, error };
  }
  return { items, walEnd, error: null };
}

function splits(buf: Buffer, cuts: number[]): Buffer[] {
  const at = [0, ...cuts, buf.length];
  return at
    .slice(1)
    .map((end, i) => buf.subarray(at[i]!, end))
    .filter((b) => b.length > 0);
}

async function run(chunks: Buffer[]) {
  const { connection, handedBack, written } = fakeConnection(chunks);
  const reader = new CopyBothReader('START_REPLICATION …', 0);
  reader.submit(connection as never);
  // pg calls handleReadyForQuery after parsing what it was handed back; the fake does not parse.
  const result = await Promise.race([readAll(reader), new Promise<null>((r) => setTimeout(() => r(null), 20))]);
  if (result === null) reader.handleReadyForQuery();
  const final = result ?? (await readAll(reader));
  await new Promise((r) => setImmediate(r));
  return { ...final, handedBack: Buffer.concat(handedBack), written, serverEnd: reader.serverEnd };
}

function assertStream(items: ReceivedBatch['items'], label: string): void {
  assert.equal(items.length, 5, label);
  assert.deepEqual(items[0], payloads[0], label);
  assert.deepEqual(items[1], payloads[1], label);
  assert.deepEqual(items[2], { kind: 'keepalive', walEnd: 0x2000n, sendTime: 456n, replyRequested: true }, label);
  assert.deepEqual(items[3], payloads[2], label);
  assert.deepEqual(items[4], payloads[3], label);
}

test('pgoutput messages and keepalives come out in order, split anywhere', async () => {
  for (let i = 0; i <= wire.length; i++) {
    const { items, walEnd, handedBack, error } = await run(splits(wire, [i]));
    assert.equal(error, null);
    assertStream(items, `split at ${i}`);
    assert.equal(walEnd, 0x1003n);
    assert.deepEqual(handedBack, tail, `split at ${i}`);
  }
});

test("the server's CopyDone is answered with CopyDone", async () => {
  const { written, serverEnd } = await run([wire]);
  assert.deepEqual(written, [message('c', Buffer.alloc(0))]);
  assert.equal(serverEnd, 'copy-done');
});

test('CommandComplete without CopyDone (walsender stopping with its server) ends the stream, split anywhere', async () => {
  // walsender.c WalSndDone: "COPY 0" then exit, no CopyDone and no ReadyForQuery.
  const complete = message('C', Buffer.from('COPY 0\0'));
  const bytes = Buffer.concat([start, frames[0]!, frames[1]!, keepalive(0x2000n, true), notice, frames[2]!, frames[3]!, complete]);
  for (let i = 0; i <= bytes.length; i++) {
    const { items, handedBack, error, written, serverEnd } = await run(splits(bytes, [i]));
    assert.equal(error, null, `split at ${i}`);
    assertStream(items, `split at ${i}`);
    assert.deepEqual(handedBack, complete, `split at ${i}`);
    assert.equal(serverEnd, 'command-complete');
    assert.deepEqual(written, [], 'no CopyDone: the server did not send one');
  }
});

test('split at every pair of offsets', async () => {
  for (let i = 1; i < wire.length; i += 3) {
    for (let j = i + 1; j < wire.length; j += 5) {
      const { items, handedBack } = await run(splits(wire, [i, j]));
      assertStream(items, `split at ${i}, ${j}`);
      assert.deepEqual(handedBack, tail);
    }
  }
});

test('an ErrorResponse goes back to pg after the messages before it; pg reports it through handleError', async () => {
  const error = Buffer.concat([message('E', Buffer.from('SFATAL\0C57P01\0Mterminating connection\0\0')), message('Z', Buffer.from('I'))]);
  const bytes = Buffer.concat([start, frames[0]!, frames[1]!, error]);
  for (let i = 0; i <= bytes.length; i += 3) {
    const { connection, handedBack } = fakeConnection(splits(bytes, [i]));
    const reader = new CopyBothReader('START_REPLICATION …', 0);
    reader.submit(connection as never);
    const items: ReceivedBatch['items'] = [];
    const reading = (async () => {
      for (let batch = await reader.next(); batch !== null; batch = await reader.next()) items.push(...batch.items);
    })();
    await new Promise((r) => setTimeout(r, 1));
    assert.deepEqual(Buffer.concat(handedBack), error, `split at ${i}`);
    reader.handleError(new Error('terminating connection'));
    await assert.rejects(reading, /terminating connection/);
    assert.deepEqual(items, [payloads[0], payloads[1]], `split at ${i}`);
  }
});

test('an unknown frame tag is a ProtocolError naming it', async () => {
  const bad = message('d', Buffer.from('zjunk'));
  const { connection } = fakeConnection([Buffer.concat([start, frames[0]!, bad])]);
  const reader = new CopyBothReader('START_REPLICATION …', 0);
  reader.submit(connection as never);
  await assert.rejects(
    readAll(reader).then((r) => {
      if (r.error) throw r.error;
    }),
    (err: Error & { code?: string }) => err.code === 'PGSUB_PROTOCOL_UNKNOWN_MESSAGE' && /0x7a/.test(err.message),
  );
});

test('status updates go out as CopyData once CopyBoth has started, not before', async () => {
  const { connection, written } = fakeConnection([]);
  const reader = new CopyBothReader('START_REPLICATION …', 0);
  reader.submit(connection as never);
  reader.write(Buffer.from('r-early'));
  assert.equal(written.length, 0);
  connection.stream.push(start);
  const waiting = reader.next();
  connection.stream.push(frames[0]!);
  assert.deepEqual((await waiting)?.items, [payloads[0]]);
  reader.write(Buffer.from('r-status'));
  assert.deepEqual(written, [message('d', Buffer.from('r-status'))]);
  reader.destroy();
  assert.equal(await reader.next(), null);
});

test('after a small read the next one waits coalesceMs, gathering what arrives meanwhile; after a large read it does not wait', async () => {
  const { connection } = fakeConnection([start]);
  const reader = new CopyBothReader('START_REPLICATION …', 200);
  reader.submit(connection as never);
  connection.stream.push(frames[0]!);
  assert.deepEqual((await reader.next())?.items, [payloads[0]]);
  // That read was small: the next one waits, so frames sent 10 ms apart come together.
  const next = reader.next();
  connection.stream.push(frames[1]!);
  await new Promise((r) => setTimeout(r, 10));
  connection.stream.push(frames[3]!);
  assert.deepEqual((await next)?.items, [payloads[1], payloads[3]]);

  const large = Buffer.alloc(70 * 1024, 0x61);
  connection.stream.push(xlogData(0x3000n, large));
  const bigRead = await reader.next();
  assert.deepEqual(bigRead?.items, [large]);
  // A read of 64 kB or more means the subscriber is the slower side: no wait, one frame at a time.
  const afterLarge = reader.next();
  connection.stream.push(frames[0]!);
  await new Promise((r) => setTimeout(r, 10));
  connection.stream.push(frames[3]!);
  assert.deepEqual((await afterLarge)?.items, [payloads[0]]);
  reader.destroy();
});
