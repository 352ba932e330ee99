import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import {
  MAX_PART_CHARS,
  StreamCursor,
  StreamFleetClient,
  SubscriptionRefusedError,
  storagePositions,
  type MessagesFrame,
  type StreamFleetClientOptions,
  type StreamMessage,
} from '../src/client/index.js';
import { type FakeSocket, socketFactory } from './fake-websocket.js';

function frame(stream: string, seqs: number[], source = 'live'): MessagesFrame {
  return {
    type: 'messages',
    stream,
    source,
    region: 'us-east-1',
    messages: seqs.map((seq) => ({ seq, data: `d${seq}`, at: seq })),
  };
}

describe('StreamCursor', () => {
  it('asks where a quiet stream ends, ever more patiently, and from scratch after a delivery', () => {
    // A live post lost with its connection open was found only by a later message: after a
    // stream's last one, never.
    const quiet = 60_000;
    const cursor = new StreamCursor('s', 0);
    cursor.onSubscribed({ type: 'subscribed', stream: 's', after: 0, replayed: 0, upTo: 0, more: false }, 0);
    cursor.onFrame(frame('s', [1]), 1);
    expect(cursor.resubscribeReason(quiet, 2000, quiet)).toBeNull();
    expect(cursor.resubscribeReason(1 + quiet, 2000, quiet)).toBe('quiet');
    expect(cursor.resubscribeReason(1 + quiet, 2000)).toBeNull(); // off without a timeout
    cursor.countResubscribe('quiet', 1 + quiet);
    cursor.onSubscribed(
      { type: 'subscribed', stream: 's', after: 1, replayed: 0, upTo: 1, more: false },
      1 + quiet,
    );
    expect(cursor.resubscribeReason(3 * quiet, 2000, quiet)).toBeNull();
    expect(cursor.resubscribeReason(1 + 3 * quiet, 2000, quiet)).toBe('quiet');
    expect(cursor.stats.quietResubscribes).toBe(1);
    cursor.onFrame(frame('s', [2]), 500_000);
    // A delivery does not make it eager again (a slow stream would pay a subscribe a message)...
    expect(cursor.resubscribeReason(500_000 + quiet, 2000, quiet)).toBeNull();
    expect(cursor.resubscribeReason(500_000 + 2 * quiet, 2000, quiet)).toBe('quiet');
    cursor.countResubscribe('quiet', 500_000 + 2 * quiet);
    // ...finding a lost tail does, and the tail is then awaited as a gap.
    cursor.onSubscribed(
      { type: 'subscribed', stream: 's', after: 2, replayed: 0, upTo: 3, more: false },
      500_000 + 2 * quiet,
    );
    expect(cursor.resubscribeReason(500_000 + 3 * quiet, 2000, quiet)).toBe('gap');
  });

  it('tells a forward jump once, and none for a first subscribe from the newest', () => {
    const cursor = new StreamCursor('s', 5);
    cursor.onSubscribed({ type: 'subscribed', stream: 's', after: 9, replayed: 0, upTo: 9, more: false }, 0);
    expect(cursor.takeSkip()).toEqual({ stream: 's', epoch: 0, after: 5, to: 9 });
    expect(cursor.takeSkip()).toBeNull();
    const first = new StreamCursor('t');
    first.onSubscribed({ type: 'subscribed', stream: 't', after: 40, replayed: 0, upTo: 40, more: false }, 0);
    expect(first.takeSkip()).toBeNull();
  });

  it("tells the new epoch's seqs the log no longer holds after the epoch change", () => {
    // A reply into a newer epoch past its first seqs (TTL deleted them) told the change only.
    const cursor = new StreamCursor('s', 5);
    cursor.onSubscribed(
      {
        type: 'subscribed',
        stream: 's',
        after: 9,
        afterEpoch: 1,
        replayed: 0,
        upTo: 9,
        upToEpoch: 1,
        more: false,
      },
      0,
    );
    expect(cursor.takeEpochChange()).toEqual({ stream: 's', epoch: 1, previous: 0 });
    expect(cursor.takeSkip()).toEqual({ stream: 's', epoch: 1, after: 0, to: 9 });
    const entered = new StreamCursor('t', 5);
    entered.onSubscribed(
      {
        type: 'subscribed',
        stream: 't',
        after: 0,
        afterEpoch: 1,
        replayed: 0,
        upTo: 0,
        upToEpoch: 1,
        more: false,
      },
      0,
    );
    expect(entered.takeEpochChange()).not.toBeNull();
    expect(entered.takeSkip()).toBeNull();
  });

  it('drops what it held of the old epoch when moved to a newer one', () => {
    // The application's own position in a newer epoch kept the old buffer: its next seq was
    // delivered as the new epoch's.
    const cursor = new StreamCursor('s', 5);
    cursor.onFrame(
      { type: 'messages', stream: 's', source: 'live', messages: [{ seq: 7, data: 'old 7' }] },
      0,
    );
    cursor.moveTo({ epoch: 1, seq: 6 });
    const ready = cursor.onFrame(
      { type: 'messages', stream: 's', source: 'live', messages: [{ seq: 7, epoch: 1, data: 'new 7' }] },
      0,
    );
    expect(ready.map((m) => [m.epoch, m.seq, m.data])).toEqual([[1, 7, 'new 7']]);
  });

  it('awaits a newer epoch like a gap, enters it once with an event, and drops older epochs', () => {
    // A stream whose upstream numbered from 1 again: its new seqs were dropped as duplicates.
    const cursor = new StreamCursor('s', 5);
    cursor.acknowledged = true;
    const newer: MessagesFrame = {
      type: 'messages',
      stream: 's',
      source: 'live',
      messages: [
        { seq: 1, epoch: 1, data: 'n1' },
        { seq: 2, epoch: 1, data: 'n2' },
      ],
    };
    expect(cursor.onFrame(newer, 0)).toEqual([]);
    expect(cursor.resubscribeReason(2000, 2000)).toBe('gap');
    cursor.countResubscribe('gap', 2000);
    const reply = {
      type: 'subscribed',
      stream: 's',
      after: 0,
      afterEpoch: 1,
      replayed: 2,
      upTo: 2,
      upToEpoch: 1,
      more: false,
    } as const;
    expect(cursor.onSubscribed(reply, 2000)).toEqual([]);
    expect(cursor.takeEpochChange()).toEqual({ stream: 's', epoch: 1, previous: 0 });
    expect(cursor.takeEpochChange()).toBeNull();
    expect(cursor.onFrame({ ...newer, source: 'replay' }, 2000).map((m) => [m.epoch, m.seq, m.data])).toEqual(
      [
        [1, 1, 'n1'],
        [1, 2, 'n2'],
      ],
    );
    const older: MessagesFrame = {
      type: 'messages',
      stream: 's',
      source: 'live',
      messages: [{ seq: 6, data: 'late' }],
    };
    expect(cursor.onFrame(older, 2000)).toEqual([]);
    expect(cursor.stats.duplicates).toBe(1);
    expect(cursor.at).toEqual({ epoch: 1, seq: 2 });
    expect(cursor.resubscribeReason(100_000, 2000)).toBeNull();
  });

  it('delivers in order, once, whatever order and repeats arrive', () => {
    const cursor = new StreamCursor('s', 10);
    const got: number[] = [];
    for (const batch of [[13, 12], [11], [12, 14, 9, 10], [16], [15, 16]]) {
      got.push(...cursor.onFrame(frame('s', batch), 0).map((m) => m.seq));
    }
    expect(got).toEqual([11, 12, 13, 14, 15, 16]);
    expect(cursor.position).toBe(16);
    expect(cursor.stats.duplicates).toBe(4);
  });

  it('joins a message sent in parts before delivering it', () => {
    const cursor = new StreamCursor('s', 0);
    const parts: MessagesFrame = {
      type: 'messages',
      stream: 's',
      source: 'replay',
      messages: [
        { seq: 1, part: 1, parts: 2, data: 'world' },
        { seq: 1, part: 0, parts: 2, data: 'hello ' },
      ],
    };
    expect(cursor.onFrame(parts, 0).map((m) => m.data)).toEqual(['hello world']);
  });

  it('drops an incomplete part set when a subscribe is answered (the replay brings it whole)', () => {
    const cursor = new StreamCursor('s', 0);
    const first: MessagesFrame = {
      type: 'messages',
      stream: 's',
      source: 'live',
      messages: [{ seq: 1, part: 0, parts: 2, data: 'hello ' }],
    };
    expect(cursor.onFrame(first, 0)).toEqual([]);
    cursor.onSubscribed({ type: 'subscribed', stream: 's', after: 0, replayed: 0, upTo: 1, more: false }, 1);
    const second: MessagesFrame = { ...first, messages: [{ seq: 1, part: 1, parts: 2, data: 'world' }] };
    expect(cursor.onFrame(second, 2)).toEqual([]); // part 0 from before is gone
  });

  it('keeps the parts of a live message past the replay a subscribe answer promises', () => {
    const cursor = new StreamCursor('s', 0);
    const part = (index: number, data: string): MessagesFrame => ({
      type: 'messages',
      stream: 's',
      source: 'live',
      messages: [{ seq: 2, part: index, parts: 2, data }],
    });
    cursor.onFrame(part(0, 'hello '), 0);
    cursor.onSubscribed({ type: 'subscribed', stream: 's', after: 0, replayed: 1, upTo: 1, more: false }, 1);
    cursor.onFrame(
      { type: 'messages', stream: 's', source: 'replay', messages: [{ seq: 1, data: 'one' }] },
      2,
    );
    expect(cursor.onFrame(part(1, 'world'), 3).map((m) => m.data)).toEqual(['hello world']);
  });

  it('never joins parts of different cuts, and bounds incomplete parts', () => {
    const cursor = new StreamCursor('s', 4);
    const parts = (entries: [number, number, string][]): MessagesFrame => ({
      type: 'messages',
      stream: 's',
      source: 'live',
      messages: entries.map(([total, part, data]) => ({ seq: 5, part, parts: total, data })),
    });
    expect(
      cursor.onFrame(
        parts([
          [2, 0, 'he'],
          [3, 1, 'XX'],
          [2, 1, 'llo'],
        ]),
        0,
      ),
    ).toEqual([]);
    expect(cursor.onFrame(parts([[2, 0, 'he']]), 1).map((m) => m.data)).toEqual(['hello']);
    const big = 'p'.repeat(65536);
    for (let seq = 7; seq < 200; seq += 1) {
      cursor.onFrame(
        { type: 'messages', stream: 's', source: 'live', messages: [{ seq, part: 0, parts: 2, data: big }] },
        2,
      );
    }
    expect(cursor.partChars).toBeLessThanOrEqual(MAX_PART_CHARS);
    cursor.onFrame(
      {
        type: 'messages',
        stream: 's',
        source: 'live',
        messages: [{ seq: 6, part: 0, parts: 1e9, data: 'x' }],
      },
      3,
    );
    expect(cursor.partChars).toBeLessThanOrEqual(MAX_PART_CHARS);
  });

  it('asks again for a promised replay that never arrives, on a quiet stream too', () => {
    const cursor = new StreamCursor('s', 0);
    cursor.onSubscribed({ type: 'subscribed', stream: 's', after: 0, replayed: 10, upTo: 10, more: true }, 0);
    expect(cursor.resubscribeReason(1999, 2000)).toBeNull();
    expect(cursor.resubscribeReason(2000, 2000)).toBe('gap');
  });

  it('says which messages carry the JSON text of a value rather than a string', () => {
    const cursor = new StreamCursor('s', 0);
    const got = cursor.onFrame(
      {
        type: 'messages',
        stream: 's',
        source: 'live',
        messages: [
          { seq: 1, data: '[1, 2]' },
          { seq: 2, data: '[1, 2]', format: 'json' },
        ],
      },
      0,
    );
    expect(got.map((m) => [m.data, m.json])).toEqual([
      ['[1, 2]', false],
      ['[1, 2]', true],
    ]);
  });

  it('asks the log to fill a gap after the timeout, then ever more patiently', () => {
    const cursor = new StreamCursor('s', 5);
    cursor.acknowledged = true;
    cursor.onFrame(frame('s', [8]), 100);
    expect(cursor.resubscribeReason(1999 + 100, 2000)).toBeNull();
    expect(cursor.resubscribeReason(2100, 2000)).toBe('gap');
    cursor.countResubscribe('gap', 2100);
    expect(cursor.resubscribeReason(2100 + 3999, 2000)).toBeNull();
    expect(cursor.resubscribeReason(2100 + 4000, 2000)).toBe('gap');
    expect(cursor.onFrame(frame('s', [6, 7], 'replay'), 7000).map((m) => m.seq)).toEqual([6, 7, 8]);
    expect(cursor.resubscribeReason(99_999, 2000)).toBeNull();
  });

  it('learns an unknown start from the reply, and bounds its buffer', () => {
    const cursor = new StreamCursor('s', null, 3);
    expect(cursor.onFrame(frame('s', [41, 42, 43, 44]), 0)).toEqual([]);
    expect(cursor.stats.droppedForSpace).toBe(1);
    const ready = cursor.onSubscribed(
      { type: 'subscribed', stream: 's', after: 40, replayed: 0, upTo: 40, more: false },
      0,
    );
    expect(ready.map((m) => m.seq)).toEqual([41, 42, 43]);
  });
});

// --- The client -------------------------------------------------------------------------------

function setup(overrides: Partial<StreamFleetClientOptions> = {}) {
  const factory = socketFactory();
  const client = new StreamFleetClient({
    url: 'ws://127.0.0.1:9/primary',
    token: () => 'token',
    webSocket: factory.create,
    random: () => 0,
    name: 'alice',
    gapTimeoutMs: 1000,
    ...overrides,
  });
  const delivered: StreamMessage[] = [];
  client.on('streamMessage', (message) => delivered.push(message));
  return { client, factory, delivered };
}

async function settle(): Promise<void> {
  await vi.advanceTimersByTimeAsync(0);
}

function subscribes(socket: FakeSocket): Record<string, unknown>[] {
  return socket.sentJson().filter((m) => m.action === 'subscribe');
}

/** Answer the last subscribe of `stream` on `socket`. */
function acknowledge(socket: FakeSocket, stream: string, after: number | null, more = false): void {
  const request = subscribes(socket)
    .filter((m) => m.stream === stream)
    .at(-1)!;
  socket.deliver({
    type: 'subscribed',
    stream,
    after,
    replayed: 0,
    upTo: after,
    more,
    requestId: request.requestId,
    region: 'us-east-1',
  });
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('StreamFleetClient subscriptions', () => {
  it('subscribes, delivers exactly once in order, and resumes from its position after a drop', async () => {
    const { client, factory, delivered } = setup();
    client.start();
    await settle();
    const first = factory.last();
    first.open();
    first.restoreState('us-east-1');
    const subscribed = client.subscribe('m1', { after: 0 });
    expect(subscribes(first)).toMatchObject([{ stream: 'm1', after: 0 }]);
    acknowledge(first, 'm1', 0);
    await expect(subscribed).resolves.toMatchObject({ type: 'subscribed', after: 0 });
    first.deliver(frame('m1', [3, 1], 'replay'));
    first.deliver(frame('m1', [2, 3, 4]));
    expect(delivered.map((m) => m.seq)).toEqual([1, 2, 3, 4]);
    expect(delivered[0]).toMatchObject({ stream: 'm1', data: 'd1', source: 'replay', region: 'us-east-1' });
    // The connection drops; the next one subscribes again from seq 4, unasked.
    first.drop();
    await vi.advanceTimersByTimeAsync(10);
    const second = factory.last();
    expect(second).not.toBe(first);
    second.open();
    expect(subscribes(second)).toMatchObject([{ stream: 'm1', after: 4 }]);
    acknowledge(second, 'm1', 4);
    second.deliver(frame('m1', [4, 5, 6], 'replay'));
    expect(delivered.map((m) => m.seq)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(client.position('m1')).toEqual({ epoch: 0, seq: 6 });
    client.close();
  });

  it('sends a first subscribe again when it was answered with an error', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    void client.subscribe('m1');
    const first = subscribes(socket)[0]!;
    socket.deliver({ type: 'error', error: 'unavailable', requestId: first.requestId, region: 'us-east-1' });
    await vi.advanceTimersByTimeAsync(1500); // past the gap timeout
    expect(subscribes(socket).length).toBe(2);
    client.close();
  });

  it('asks getState again until it is answered', async () => {
    const { client, factory } = setup({ requestTimeoutMs: 1000 });
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    const first = socket.getStateRequest();
    socket.deliver({ type: 'error', error: 'unavailable', requestId: first.requestId, region: 'us-east-1' });
    await vi.advanceTimersByTimeAsync(100);
    const states = () => socket.sentJson().filter((m) => m.action === 'getState');
    expect(states().length).toBe(2);
    await vi.advanceTimersByTimeAsync(1100); // the second is lost: no answer within the timeout
    expect(states().length).toBe(3);
    socket.deliver({ type: 'state', region: 'us-east-1', requestId: states()[2]!.requestId, state: {} });
    expect(client.ready).toBe(true);
    client.close();
  });

  it('remembers an unsubscribe made while disconnected and never follows the stream again', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    const first = factory.last();
    first.open();
    first.restoreState('us-east-1');
    void client.subscribe('m1', { after: 0 });
    acknowledge(first, 'm1', 0);
    first.drop();
    await client.unsubscribe('m1'); // while disconnected
    await vi.advanceTimersByTimeAsync(10);
    const second = factory.last();
    second.open();
    const request = second.getStateRequest();
    second.deliver({
      type: 'state',
      region: 'us-east-1',
      requestId: request.requestId,
      subscriptions: ['m1'],
      state: {},
    });
    await settle();
    expect(subscribes(second)).toEqual([]);
    expect(second.sentJson().filter((m) => m.action === 'unsubscribe')).toMatchObject([{ stream: 'm1' }]);
    client.close();
  });

  it('moves nothing on a subscribed reply it did not ask for', async () => {
    const { client, factory, delivered } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    void client.subscribe('m1', { after: 3 });
    acknowledge(socket, 'm1', 3);
    // An unsolicited reply would have skipped seqs 4 to 1000.
    socket.deliver({
      type: 'subscribed',
      stream: 'm1',
      after: 1000,
      replayed: 0,
      upTo: 1000,
      more: false,
      requestId: 'x',
    });
    socket.deliver(frame('m1', [4]));
    expect(delivered.map((m) => m.seq)).toEqual([4]);
    client.close();
  });

  it('fills a gap from the stored log after the gap timeout', async () => {
    const { client, factory, delivered } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    void client.subscribe('m1', { after: 10 });
    acknowledge(socket, 'm1', 10);
    socket.deliver(frame('m1', [11, 14]));
    expect(delivered.map((m) => m.seq)).toEqual([11]);
    await vi.advanceTimersByTimeAsync(900);
    expect(subscribes(socket)).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(400);
    expect(subscribes(socket).at(-1)).toMatchObject({ stream: 'm1', after: 11 });
    acknowledge(socket, 'm1', 11);
    socket.deliver(frame('m1', [12, 13, 14], 'replay'));
    expect(delivered.map((m) => m.seq)).toEqual([11, 12, 13, 14]);
    expect(client.cursor('m1')?.stats.gapResubscribes).toBe(1);
    client.close();
  });

  it('a reloaded page follows the server state from its saved position', async () => {
    const storage = new Map<string, string>();
    const fakeStorage = {
      getItem: (key: string) => storage.get(key) ?? null,
      setItem: (key: string, value: string) => void storage.set(key, value),
    } as unknown as Storage;
    const positions = storagePositions(fakeStorage);
    positions.set('m2', { epoch: 0, seq: 41 });
    const { client, factory } = setup({ positions });
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    const request = socket.getStateRequest();
    socket.deliver({
      type: 'state',
      region: 'us-west-2',
      requestId: request.requestId,
      user: 'alice',
      state: { lastBid: null, bidsAccepted: 0, bidsRefused: 0, updatedAtMs: null },
      subscriptions: ['m2', 'm3'],
    });
    expect(subscribes(socket)).toMatchObject([
      { stream: 'm2', after: 41 },
      { stream: 'm3', after: null },
    ]);
    acknowledge(socket, 'm2', 41);
    socket.deliver(frame('m2', [42]));
    expect(storage.get('streamfleet.position.m2')).toBe('0:42');
    client.close();
  });

  it('a refused subscribe rejects, is reported, and leaves nothing subscribed', async () => {
    const { client, factory } = setup();
    const refusals: SubscriptionRefusedError[] = [];
    client.on('subscriptionError', (error) => refusals.push(error));
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    const subscribed = client.subscribe('secret');
    const request = subscribes(socket)[0]!;
    socket.deliver({
      type: 'error',
      error: 'forbidden',
      field: 'stream',
      message: "stream: 'secret' does not exist or you are not one of its readers",
      requestId: request.requestId,
    });
    await expect(subscribed).rejects.toBeInstanceOf(SubscriptionRefusedError);
    expect(refusals.map((r) => r.error)).toEqual(['forbidden']);
    expect(client.subscriptions).toEqual([]);
    client.close();
  });

  it('a cut replay is continued once caught up', async () => {
    const { client, factory, delivered } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    void client.subscribe('m1', { after: 0 });
    const request = subscribes(socket)[0]!;
    socket.deliver({
      type: 'subscribed',
      stream: 'm1',
      after: 0,
      replayed: 2,
      upTo: 2,
      more: true,
      requestId: request.requestId,
    });
    socket.deliver(frame('m1', [1, 2], 'replay'));
    await vi.advanceTimersByTimeAsync(300);
    expect(subscribes(socket).at(-1)).toMatchObject({ stream: 'm1', after: 2 });
    expect(delivered.map((m) => m.seq)).toEqual([1, 2]);
    client.close();
  });
});
