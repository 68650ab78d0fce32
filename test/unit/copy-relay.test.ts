/**
 * The COPY relay (tablesync/relay.ts) on a fake pg connection: the backend's COPY OUT
 * byte sequence — CopyOutResponse, CopyData rows with a NoticeResponse among them,
 * CopyDone, CommandComplete, ReadyForQuery — split into chunks at every offset (and at
 * every pair of offsets), must come out as exactly the CopyData messages, in order, each
 * chunk ending at a message boundary, each row once (also when a NoticeResponse is cut
 * after complete rows); pg's own handler must get back everything from CopyDone on. An ErrorResponse mid-copy goes to pg's handler the same way.
 */
import assert from 'node:assert/strict';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { test } from 'node:test';
import { CopyOutRelay } from '../../src/tablesync/relay.js';

function message(code: string, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.write(code, 0, 'latin1');
  head.writeUInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

const rows = [Buffer.from('1\tone\n'), Buffer.from(`2\t${'x'.repeat(300)}\n`), Buffer.alloc(0), Buffer.from('3\tthree\n')];
const data = rows.map((r) => message('d', r));
const copyOut = message('H', Buffer.from([0, 0, 1, 0, 0]));
const notice = message('N', Buffer.from('SNOTICE\0\0'));
const tail = Buffer.concat([message('c', Buffer.alloc(0)), message('C', Buffer.from('COPY 4\0')), message('Z', Buffer.from('I'))]);
const wire = Buffer.concat([copyOut, data[0]!, data[1]!, notice, data[2]!, data[3]!, tail]);
const wantOut = Buffer.concat(data);

/** A socket as pg leaves it: one 'data' listener (pg's parser), here collecting bytes. */
function fakeConnection(chunks: Buffer[]) {
  const handedBack: Buffer[] = [];
  let allPushed!: () => void;
  const pushed = new Promise<void>((resolve) => (allPushed = resolve));
  const stream = new Readable({ read() {} });
  stream.on('data', (b: Buffer) => handedBack.push(b));
  // One chunk per socket read: read() would return every chunk pushed so far as one.
  const connection = {
    stream,
    query: () => {
      const next = (i: number) => {
        if (i >= chunks.length) return allPushed();
        stream.push(chunks[i]);
        setImmediate(() => next(i + 1));
      };
      next(0);
    },
  };
  return { connection, handedBack, pushed };
}

async function relay(chunks: Buffer[]): Promise<{ out: Buffer[]; handedBack: Buffer; messages: number }> {
  const { connection, handedBack, pushed } = fakeConnection(chunks);
  const reader = new CopyOutRelay('COPY t TO STDOUT');
  reader.submit(connection as never);
  const out: Buffer[] = [];
  await pipeline(
    reader,
    new Writable({
      write(chunk: Buffer, _enc, done) {
        out.push(chunk);
        done();
      },
    }),
  );
  await pushed;
  await new Promise((r) => setImmediate(r));
  return { out, handedBack: Buffer.concat(handedBack), messages: reader.messages };
}

function splits(buf: Buffer, cuts: number[]): Buffer[] {
  const at = [0, ...cuts, buf.length];
  return at
    .slice(1)
    .map((end, i) => buf.subarray(at[i]!, end))
    .filter((b) => b.length > 0);
}

/** Every output chunk is a run of whole CopyData messages. */
function assertFramed(chunks: Buffer[]): void {
  for (const c of chunks) {
    let pos = 0;
    while (pos < c.length) {
      assert.equal(c[pos], 0x64);
      pos += 1 + c.readUInt32BE(pos + 1);
    }
    assert.equal(pos, c.length);
  }
}

test('CopyData messages pass as they are, split anywhere', async () => {
  for (let i = 0; i <= wire.length; i++) {
    const { out, handedBack, messages } = await relay(splits(wire, [i]));
    assert.deepEqual(Buffer.concat(out), wantOut, `split at ${i}`);
    assertFramed(out);
    assert.deepEqual(handedBack, tail, `split at ${i}`);
    assert.equal(messages, rows.length);
  }
});

test('split at every pair of offsets', async () => {
  for (let i = 1; i < wire.length; i += 3) {
    for (let j = i + 1; j < wire.length; j += 7) {
      const { out, handedBack } = await relay(splits(wire, [i, j]));
      assert.deepEqual(Buffer.concat(out), wantOut, `split at ${i}, ${j}`);
      assertFramed(out);
      assert.deepEqual(handedBack, tail);
    }
  }
});

test('an ErrorResponse mid-copy goes back to pg', async () => {
  const error = Buffer.concat([message('E', Buffer.from('SERROR\0C57014\0Mcanceled\0\0')), message('Z', Buffer.from('I'))]);
  const bytes = Buffer.concat([copyOut, data[0]!, data[1]!, error]);
  for (let i = 0; i <= bytes.length; i += 5) {
    const { connection, handedBack } = fakeConnection(splits(bytes, [i]));
    const reader = new CopyOutRelay('COPY t TO STDOUT');
    const out: Buffer[] = [];
    reader.on('data', (b: Buffer) => out.push(b));
    reader.submit(connection as never);
    // pg would now call handleError; here: the relay stops and hands the rest back.
    await new Promise((r) => setTimeout(r, 1));
    assert.deepEqual(Buffer.concat(handedBack), error, `split at ${i}`);
    assert.deepEqual(Buffer.concat(out), Buffer.concat([data[0]!, data[1]!]));
  }
});

test("pg's error ends the pipeline with it; after an abort it is not thrown", async () => {
  const { connection } = fakeConnection([Buffer.concat([copyOut, data[0]!])]);
  const reader = new CopyOutRelay('COPY t TO STDOUT');
  reader.submit(connection as never);
  const sink = new Writable({ write: (_c, _e, done) => done() });
  const piped = pipeline(reader, sink);
  await new Promise((r) => setTimeout(r, 1));
  reader.handleError(new Error('canceling statement due to user request'));
  await assert.rejects(piped, /canceling statement/);
  // Already destroyed: a second error (the connection lost while draining) is swallowed.
  reader.handleError(new Error('Connection terminated'));
});
