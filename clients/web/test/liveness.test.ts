/**
 * Rotation ahead of API Gateway's 2-hour limit (make before break) and the send queue, against
 * a fake WebSocket and fake timers: outcomes only, no real time.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import {
  type AttemptContext,
  ClientClosedError,
  ConnectionLostError,
  NotConnectedError,
  RequestTimeoutError,
  SendQueueFullError,
  StreamFleetClient,
  type ConnectionStatus,
  type MessagesFrame,
  type StreamFleetClientOptions,
  type StreamMessage,
} from '../src/client/index.js';
import { type FakeSocket, socketFactory } from './fake-websocket.js';

const HOUR = 3_600_000;

function setup(overrides: Partial<StreamFleetClientOptions> = {}) {
  const factory = socketFactory();
  const tokenCalls: AttemptContext[] = [];
  const client = new StreamFleetClient({
    url: 'ws://127.0.0.1:9/primary',
    token: (context) => {
      tokenCalls.push(context);
      return `token-${tokenCalls.length}`;
    },
    webSocket: factory.create,
    random: () => 1, // rotation at 90 % of maxConnectionAgeMs
    name: 'alice',
    wakeSignals: null,
    heartbeatIntervalMs: 10 * HOUR, // the fake server answers no heartbeat: none is sent
    ...overrides,
  });
  const delivered: StreamMessage[] = [];
  const statuses: ConnectionStatus[] = [];
  const readiness: boolean[] = [];
  client.on('streamMessage', (message) => delivered.push(message));
  client.on('status', (status) => statuses.push(status));
  client.on('change', (snapshot) => {
    if (readiness.at(-1) !== snapshot.ready) readiness.push(snapshot.ready);
  });
  return { client, factory, delivered, statuses, readiness, tokenCalls };
}

async function settle(): Promise<void> {
  await vi.advanceTimersByTimeAsync(0);
}

async function connected(overrides: Partial<StreamFleetClientOptions> = {}) {
  const context = setup(overrides);
  context.client.start();
  await settle();
  context.factory.last().open();
  context.factory.last().restoreState('us-east-1');
  return { ...context, socket: context.factory.last() };
}

function frame(stream: string, seqs: number[], source = 'live'): MessagesFrame {
  return {
    type: 'messages',
    stream,
    source,
    region: 'us-east-1',
    messages: seqs.map((seq) => ({ seq, data: `d${seq}` })),
  };
}

function sentOf(socket: FakeSocket, action: string): Record<string, unknown>[] {
  return socket.sentJson().filter((m) => m.action === action);
}

function acknowledge(socket: FakeSocket, stream: string, after: number): void {
  const request = sentOf(socket, 'subscribe').at(-1)!;
  socket.deliver({
    type: 'subscribed',
    stream,
    after,
    replayed: 0,
    upTo: after,
    more: false,
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

describe('rotation before API Gateway’s 2-hour limit', () => {
  it('replaces the connection at 90 to 100 % of maxConnectionAgeMs, 110 min by default', async () => {
    const early = await connected({ random: () => 1 });
    const late = await connected({ random: () => 0 });
    await vi.advanceTimersByTimeAsync(0.9 * 110 * 60_000 - 1);
    expect([early.factory.sockets.length, late.factory.sockets.length]).toEqual([1, 1]);
    await vi.advanceTimersByTimeAsync(1);
    expect(early.factory.sockets.length).toBe(2);
    await vi.advanceTimersByTimeAsync(0.1 * 110 * 60_000);
    expect(late.factory.sockets.length).toBe(2);
    expect(0.9 * 110).toBeLessThan(120); // both well before the limit
    early.client.close();
    late.client.close();
  });

  it('makes before it breaks: status and ready never change, streams go on exactly once, in order', async () => {
    const {
      client,
      factory,
      socket: old,
      delivered,
      statuses,
      readiness,
      tokenCalls,
    } = await connected({
      // A minute, not hours: advancing 54 fake minutes took 16 s in Chromium, past the timeout.
      maxConnectionAgeMs: 60_000,
      requestTimeoutMs: 5000,
    });
    void client.subscribe('m1', { after: 0 });
    acknowledge(old, 'm1', 0);
    old.deliver(frame('m1', [1, 2]));
    statuses.length = 0;
    readiness.length = 0;

    await vi.advanceTimersByTimeAsync(0.9 * 60_000);
    expect(factory.sockets.length).toBe(2);
    const bidBefore = client.bid('a1', 5); // sent on the old connection
    const next = factory.last();
    expect(tokenCalls.at(-1)).toEqual({ attempt: 0, forceRefresh: false }); // asked as usual
    old.deliver(frame('m1', [3])); // the old one still serves until the new one opens
    next.open();
    // The new connection restores the state and resubscribes from the position, at once.
    expect(sentOf(next, 'getState').length).toBe(1);
    expect(sentOf(next, 'subscribe')).toMatchObject([{ stream: 'm1', after: 3 }]);
    // Both deliver for a while: live frames of the old one, the replay and live ones of the new.
    old.deliver(frame('m1', [4, 5]));
    acknowledge(next, 'm1', 3);
    next.deliver(frame('m1', [4, 5, 6], 'replay'));
    old.deliver(frame('m1', [6, 7]));
    next.deliver(frame('m1', [7, 8]));
    const bid = sentOf(old, 'bid')[0]!;
    old.deliver({ type: 'bid', requestId: bid.requestId, accepted: true, amount: 5, highest: 5 });
    await expect(bidBefore).resolves.toMatchObject({ accepted: true });
    next.restoreState('us-east-1');
    expect(delivered.map((m) => m.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(statuses).toEqual([]); // 'open' all along
    expect(readiness).toEqual([true]); // every change event said ready
    expect(client.snapshot()).toMatchObject({ connections: 2, attempts: 1, reconnectAttempt: 0 });
    // The retired connection still answers, but no longer says where the client is.
    old.deliver({ type: 'bid', requestId: 'unknown', region: 'us-west-2' });
    expect(client.region).toBe('us-east-1');
    // New requests go on the new connection.
    void client.bid('a1', 6).catch(() => undefined);
    expect(sentOf(next, 'bid').length).toBe(1);
    expect(sentOf(old, 'bid').length).toBe(1);
    // The old one is closed once its requests had their time.
    expect(old.closeCalls).toEqual([]);
    await vi.advanceTimersByTimeAsync(5000);
    expect(old.closeCalls).toEqual([{ code: 1000, reason: 'rotated' }]);
    old.deliver(frame('m1', [9])); // nothing more from it counts
    expect(delivered.length).toBe(8);
    client.close();
  });

  it('keeps the connection when the successor fails, and tries again after backoffCapMs', async () => {
    const {
      client,
      factory,
      socket: old,
      statuses,
    } = await connected({
      maxConnectionAgeMs: HOUR,
      backoffCapMs: 20_000,
      openTimeoutMs: 10_000,
    });
    statuses.length = 0;
    await vi.advanceTimersByTimeAsync(0.9 * HOUR);
    factory.last().drop(); // refused
    await vi.advanceTimersByTimeAsync(19_999);
    expect(factory.sockets.length).toBe(2);
    await vi.advanceTimersByTimeAsync(1);
    expect(factory.sockets.length).toBe(3);
    await vi.advanceTimersByTimeAsync(10_000); // never opens
    expect(factory.last().closeCalls).toEqual([{ code: 1000, reason: 'rotation failed' }]);
    await vi.advanceTimersByTimeAsync(20_000);
    expect(factory.sockets.length).toBe(4);
    factory.last().open();
    expect(old.closeCalls).toEqual([]); // kept until its successor opened
    expect(statuses).toEqual([]);
    expect(client.snapshot().connections).toBe(2);
    client.close();
  });

  it('drops a successor when the connection ends meanwhile, and close() leaves nothing behind', async () => {
    const { client, factory, socket: old } = await connected({ maxConnectionAgeMs: HOUR });
    await vi.advanceTimersByTimeAsync(0.9 * HOUR);
    const successor = factory.last();
    old.drop(1006);
    expect(successor.closeCalls).toEqual([{ code: 1000, reason: 'not needed' }]);
    expect(client.status).toBe('backing-off');
    await vi.advanceTimersByTimeAsync(2000);
    const third = factory.last();
    third.open();
    third.restoreState('us-east-1');
    await vi.advanceTimersByTimeAsync(0.9 * HOUR);
    factory.last().open(); // rotated: the third one retires
    client.close();
    expect(third.closeCalls).toEqual([{ code: 1000, reason: 'rotated' }]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('never rotates with maxConnectionAgeMs null, and refuses a bad one', async () => {
    const { client, factory } = await connected({ maxConnectionAgeMs: null });
    await vi.advanceTimersByTimeAsync(3 * HOUR);
    expect(factory.sockets.length).toBe(1);
    client.close();
    expect(() => new StreamFleetClient({ url: 'ws://x/', maxConnectionAgeMs: 0 })).toThrow(
      /maxConnectionAgeMs/,
    );
  });
});

describe('sending while not connected', () => {
  it('refuses by default: NotConnectedError, nothing kept', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    expect(() => client.send({ action: 'note' })).toThrow(NotConnectedError);
    await expect(client.bid('a1', 5)).rejects.toBeInstanceOf(NotConnectedError);
    factory.last().open();
    factory.last().restoreState('us-east-1');
    expect(
      factory
        .last()
        .sentJson()
        .map((m) => m.action),
    ).toEqual(['getState']);
    client.close();
  });

  it('with sendQueueSize, keeps up to that many and sends them in order once the state is restored', async () => {
    const { client, factory } = setup({ sendQueueSize: 3 });
    client.start();
    await settle();
    client.send({ action: 'note', n: 1 });
    const bid = client.bid('a1', 5);
    const socket = factory.last();
    socket.open();
    client.send({ action: 'note', n: 2 }); // open, not ready yet: queued behind the others
    expect(() => client.send({ action: 'note', n: 3 })).toThrow(SendQueueFullError);
    expect(() => client.send({ action: 'note', n: 3 })).toThrow(NotConnectedError); // a kind of it
    await expect(client.bid('a1', 6)).rejects.toThrow(/send queue is full \(3\)/);
    expect(socket.sentJson().map((m) => m.action)).toEqual(['getState']);
    socket.restoreState('us-east-1');
    expect(
      socket
        .sentJson()
        .slice(1)
        .map((m) => m.n ?? m.action),
    ).toEqual([1, 'bid', 2]);
    const sentBid = sentOf(socket, 'bid')[0]!;
    socket.deliver({ type: 'bid', requestId: sentBid.requestId, accepted: true, amount: 5, highest: 5 });
    await expect(bid).resolves.toMatchObject({ accepted: true });
    client.send({ action: 'note', n: 5 }); // ready and nothing waits: sent at once
    expect(socket.sentJson().at(-1)).toMatchObject({ n: 5 });
    client.close();
  });

  it('keeps queued requests across a failed connection, and never sends one that timed out', async () => {
    const { client, factory } = setup({ sendQueueSize: 5, requestTimeoutMs: 10_000 });
    client.start();
    await settle();
    const early = client.request({ action: 'echo' }, { timeoutMs: 1000 }).catch((error: unknown) => error);
    const patient = client.request({ action: 'echo' }, { timeoutMs: 60_000 });
    factory.last().drop(); // the first attempt fails: queued requests are not lost with it
    await vi.advanceTimersByTimeAsync(1000);
    expect(await early).toBeInstanceOf(RequestTimeoutError);
    await vi.advanceTimersByTimeAsync(2000);
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    const echoes = sentOf(socket, 'echo');
    expect(echoes.length).toBe(1);
    socket.deliver({ type: 'echo', requestId: echoes[0]!.requestId });
    await expect(patient).resolves.toMatchObject({ type: 'echo' });
    // Sent, then the connection ends: lost like any request in flight.
    const inFlight = client.request({ action: 'echo' });
    socket.drop();
    await expect(inFlight).rejects.toBeInstanceOf(ConnectionLostError);
    client.close();
  });

  it('close() drops the queue: queued requests reject with ClientClosedError, nothing is sent', async () => {
    const { client, factory } = setup({ sendQueueSize: 2 });
    client.start();
    await settle();
    client.send({ action: 'note' });
    const queued = client.request({ action: 'echo' });
    client.close();
    await expect(queued).rejects.toBeInstanceOf(ClientClosedError);
    expect(factory.last().sent).toEqual([]);
    expect(vi.getTimerCount()).toBe(0);
    expect(() => client.send({ action: 'note' })).toThrow(ClientClosedError);
  });

  it('refuses a bad sendQueueSize, naming it', () => {
    expect(() => new StreamFleetClient({ url: 'ws://x/', sendQueueSize: -1 })).toThrow(/sendQueueSize/);
    expect(() => new StreamFleetClient({ url: 'ws://x/', sendQueueSize: 1.5 })).toThrow(/sendQueueSize/);
  });
});
