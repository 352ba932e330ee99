import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

import {
  ClientClosedError,
  ConnectionLostError,
  FrameTooLargeError,
  fullJitterBackoff,
  MAX_FRAME_BYTES,
  NotConnectedError,
  RequestTimeoutError,
  ServerError,
  StreamFleetClient,
  type AttemptContext,
  type StreamFleetClientOptions,
} from '../src/client/index.js';
import { socketFactory } from './fake-websocket.js';

// The throttled-region frame API Gateway sends for every message when the handler cannot run.
const THROTTLED = { message: 'Internal server error', connectionId: 'c1', requestId: 'r1' };

function setup(overrides: Partial<StreamFleetClientOptions> = {}) {
  const factory = socketFactory();
  const tokenCalls: AttemptContext[] = [];
  const urlCalls: AttemptContext[] = [];
  const client = new StreamFleetClient({
    url: (context) => {
      urlCalls.push(context);
      return Promise.resolve('ws://127.0.0.1:9/primary');
    },
    token: (context) => {
      tokenCalls.push(context);
      return Promise.resolve(`token-${tokenCalls.length}`);
    },
    webSocket: factory.create,
    random: () => 1,
    name: 'alice',
    minHealthyMs: 0, // healthy as soon as the state is restored, unless a test says otherwise
    ...overrides,
  });
  return { client, factory, tokenCalls, urlCalls };
}

/** Let the providers' promises settle (no time passes). */
async function settle(): Promise<void> {
  await vi.advanceTimersByTimeAsync(0);
}

beforeEach(() => {
  vi.useFakeTimers();
});

afterEach(() => {
  vi.useRealTimers();
});

describe('fullJitterBackoff', () => {
  it('is random() * min(2000 * 2**attempt, 20000) by default', () => {
    expect([0, 1, 2, 3, 4, 5, 10].map((attempt) => fullJitterBackoff(attempt, () => 1))).toEqual([
      2000, 4000, 8000, 16000, 20000, 20000, 20000,
    ]);
    expect(fullJitterBackoff(2, () => 0.25)).toBe(2000);
    expect(fullJitterBackoff(3, () => 0)).toBe(0);
  });

  it('stays within [0, min(base * 2**attempt, cap)) for any random value and huge attempts', () => {
    let seed = 7;
    const random = () => {
      seed = (seed * 16807) % 2147483647;
      return (seed - 1) / 2147483646;
    };
    for (let attempt = 0; attempt < 2000; attempt += 1) {
      const delay = fullJitterBackoff(attempt, random);
      expect(delay).toBeGreaterThanOrEqual(0);
      expect(delay).toBeLessThan(Math.min(2000 * 2 ** attempt, 20000));
    }
    expect(fullJitterBackoff(1, () => 1, 50, 300)).toBe(100);
    expect(fullJitterBackoff(9, () => 1, 50, 300)).toBe(300);
  });

  it('refuses a negative or fractional attempt, naming it', () => {
    expect(() => fullJitterBackoff(-1)).toThrow(/attempt/);
    expect(() => fullJitterBackoff(1.5)).toThrow(/attempt/);
  });
});

describe('StreamFleetClient reconnecting', () => {
  it('backs off with the default full-jitter formula between failed attempts, and not sooner', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    const delays: number[] = [];
    client.on('reconnecting', ({ delayMs }) => delays.push(delayMs));
    for (const expected of [2000, 4000, 8000, 16000, 20000, 20000]) {
      const before = factory.sockets.length;
      factory.last().drop(); // refused handshake: never opened
      expect(client.status).toBe('backing-off');
      await vi.advanceTimersByTimeAsync(expected - 1);
      expect(factory.sockets.length).toBe(before);
      await vi.advanceTimersByTimeAsync(1);
      expect(factory.sockets.length).toBe(before + 1);
    }
    expect(delays).toEqual([2000, 4000, 8000, 16000, 20000, 20000]);
    expect(client.snapshot().reconnectAttempt).toBe(6);
    client.close();
  });

  it('starts the backoff again from random() * 2000 after a healthy connection', async () => {
    const { client, factory } = setup({ random: () => 0.5 });
    client.start();
    await settle();
    factory.last().drop();
    await vi.advanceTimersByTimeAsync(1000);
    factory.last().drop();
    expect(client.snapshot().lastDelayMs).toBe(2000); // 0.5 * 4000
    await vi.advanceTimersByTimeAsync(2000);
    factory.last().open();
    factory.last().restoreState('us-east-1');
    expect(client.snapshot().reconnectAttempt).toBe(0);
    factory.last().drop(1001);
    expect(client.snapshot().lastDelayMs).toBe(1000); // 0.5 * 2000
    expect(client.snapshot().reconnectAttempt).toBe(1);
    client.close();
  });

  it('keeps backing off from a server that answers and then closes at once', async () => {
    // Each answered getState reset the backoff: 22 to 30 connections a client in 30 s.
    const { client, factory } = setup({ random: () => 0.5, minHealthyMs: 10000 });
    client.start();
    await settle();
    for (let round = 0; round < 4; round += 1) {
      factory.last().open();
      factory.last().restoreState('us-east-1');
      factory.last().drop(4000);
      await vi.advanceTimersByTimeAsync(client.snapshot().lastDelayMs ?? 0);
    }
    expect(client.snapshot().reconnectAttempt).toBe(4);
    expect(client.snapshot().lastDelayMs).toBe(8000); // 0.5 * 2000 * 2**3
    // One that stays up as long counts as healthy: the backoff starts over.
    factory.last().open();
    factory.last().restoreState('us-east-1');
    await vi.advanceTimersByTimeAsync(10000);
    factory.last().drop(1001);
    expect(client.snapshot().lastDelayMs).toBe(1000);
    client.close();
  });

  it('skips a binary or oversized message and counts it, never reconnecting for it', async () => {
    // Binary messages were decoded as text, and a 10 MB one was taken whole.
    const { client, factory } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    socket.deliverRaw(new TextEncoder().encode('{"type":"state"}').buffer);
    socket.deliverRaw('"' + 'x'.repeat(200 * 1024) + '"');
    socket.restoreState('us-east-1');
    expect(client.snapshot().framesSkipped).toBe(2);
    expect(client.snapshot().ready).toBe(true);
    expect(client.snapshot().connections).toBe(1);
    client.close();
  });

  it('uses the reconnectInterval option instead of the formula when given', async () => {
    const seen: number[] = [];
    const { client, factory } = setup({
      reconnectInterval: (attempt) => {
        seen.push(attempt);
        return 10 * (attempt + 1);
      },
    });
    client.start();
    await settle();
    factory.last().drop();
    await vi.advanceTimersByTimeAsync(10);
    factory.last().drop();
    await vi.advanceTimersByTimeAsync(20);
    expect(seen).toEqual([0, 1]);
    expect(factory.sockets.length).toBe(3);
    client.close();
  });

  it('waits backoffCapMs when a custom reconnectInterval throws or returns nonsense', async () => {
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    const answers: (() => number)[] = [
      () => Number.NaN,
      () => {
        throw new Error('bug');
      },
    ];
    const { client, factory } = setup({
      backoffCapMs: 5000,
      reconnectInterval: (attempt) => answers[attempt]!(),
    });
    client.start();
    await settle();
    for (const expected of [2, 3]) {
      factory.last().drop();
      expect(client.snapshot().lastDelayMs).toBe(5000);
      await vi.advanceTimersByTimeAsync(5000);
      expect(factory.sockets.length).toBe(expected);
    }
    expect(warn).toHaveBeenCalledTimes(2);
    client.close();
  });

  it('counts a socket that never opens within openTimeoutMs as a failed attempt', async () => {
    const { client, factory, tokenCalls } = setup({ openTimeoutMs: 5000 });
    client.start();
    await settle();
    await vi.advanceTimersByTimeAsync(4999);
    expect(client.status).toBe('connecting');
    await vi.advanceTimersByTimeAsync(1);
    expect(client.status).toBe('backing-off');
    expect(factory.sockets[0]!.closeCalls.length).toBe(1);
    await vi.advanceTimersByTimeAsync(2000);
    expect(tokenCalls.map((c) => c.forceRefresh)).toEqual([false, true]);
    client.close();
  });
});

describe('StreamFleetClient heartbeat', () => {
  async function open(overrides: Partial<StreamFleetClientOptions> = {}) {
    const { client, factory } = setup(overrides);
    const disconnects: { forced: boolean; reason: string }[] = [];
    client.on('disconnect', (info) => disconnects.push(info));
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    return { client, factory, socket, disconnects };
  }

  it('notices a silently dead connection within 30 s by default: 20 s quiet, 10 s for the pong', async () => {
    const { client, factory, socket, disconnects } = await open();
    // The state reply at t=0 was the last sign of life: the network dies now, silently.
    await vi.advanceTimersByTimeAsync(19_999);
    expect(socket.heartbeats()).toBe(0);
    await vi.advanceTimersByTimeAsync(1); // 20 s quiet: a heartbeat
    expect(socket.heartbeats()).toBe(1);
    await vi.advanceTimersByTimeAsync(9_999);
    expect(client.status).toBe('open');
    expect(socket.readyState).toBe(1); // the socket looks fine all along
    await vi.advanceTimersByTimeAsync(1); // 30 s: dropped
    expect(socket.closeCalls).toEqual([{ code: 4000, reason: 'heartbeats unanswered (1)' }]);
    expect(client.status).toBe('backing-off');
    expect(client.ready).toBe(false);
    expect(client.snapshot().forcedReconnects).toBe(1);
    expect(disconnects).toEqual([expect.objectContaining({ forced: true, opened: true, healthy: true })]);
    await vi.advanceTimersByTimeAsync(2000);
    expect(factory.sockets.length).toBe(2);
    client.close();
  });

  it('sends no heartbeat while replies keep coming, and counts from the last one', async () => {
    const { client, socket } = await open();
    for (let i = 0; i < 10; i += 1) {
      await vi.advanceTimersByTimeAsync(15_000);
      socket.deliver({ type: 'messages', stream: 's', source: 'live', messages: [], region: 'us-east-1' });
    }
    expect(socket.heartbeats()).toBe(0); // 150 s of traffic, no heartbeat
    await vi.advanceTimersByTimeAsync(20_000);
    expect(socket.heartbeats()).toBe(1);
    socket.deliver('pong');
    await vi.advanceTimersByTimeAsync(19_999);
    expect(socket.heartbeats()).toBe(1); // the pong restarted the quiet period
    await vi.advanceTimersByTimeAsync(1);
    expect(socket.heartbeats()).toBe(2);
    expect(client.status).toBe('open');
    expect(client.snapshot().forcedReconnects).toBe(0);
    client.close();
  });

  it('takes no error frame for a sign of life, nor any frame for the pong', async () => {
    // A throttled Region answers every message with an error frame: it must be left.
    const { client, socket } = await open({ heartbeatIntervalMs: 1000, heartbeatTimeoutMs: 1500 });
    await vi.advanceTimersByTimeAsync(1000);
    expect(socket.heartbeats()).toBe(1);
    socket.deliver(THROTTLED);
    socket.deliver({ type: 'error', error: 'unavailable', region: 'us-east-1' });
    socket.deliver({ type: 'pong', region: 'us-east-1' });
    socket.deliver('PONG');
    await vi.advanceTimersByTimeAsync(1499);
    expect(client.snapshot().forcedReconnects).toBe(0);
    await vi.advanceTimersByTimeAsync(1); // 2.5 s: interval + timeout
    expect(client.snapshot().forcedReconnects).toBe(1);
    client.close();
  });

  it('with missedPongsBeforeReconnect 2, sends another heartbeat when one times out, and forgives one miss', async () => {
    const { client, socket } = await open({ missedPongsBeforeReconnect: 2 });
    await vi.advanceTimersByTimeAsync(30_000); // heartbeat at 20 s, unanswered at 30 s
    expect(socket.heartbeats()).toBe(2); // the second goes at once
    expect(client.status).toBe('open');
    socket.deliver('pong'); // answered: the miss is forgiven
    await vi.advanceTimersByTimeAsync(20_000 + 10_000 + 9_999);
    expect(socket.heartbeats()).toBe(4);
    expect(client.status).toBe('open');
    await vi.advanceTimersByTimeAsync(1); // two in a row unanswered: 20 + 2 * 10 s after the pong
    expect(client.snapshot().forcedReconnects).toBe(1);
    client.close();
  });
});

describe('StreamFleetClient providers and state', () => {
  it('reconnects with a fresh token when the server says the token expired', async () => {
    const { client, factory, tokenCalls } = setup();
    client.start();
    await settle();
    const first = factory.last();
    first.open();
    first.restoreState('us-east-1');
    first.deliver(JSON.stringify({ type: 'error', error: 'token_expired', field: 'token', message: 'x' }));
    await vi.advanceTimersByTimeAsync(2000);
    expect(factory.sockets.length).toBe(2);
    expect(tokenCalls.map((c) => c.forceRefresh)).toEqual([false, true]);
    client.close();
  });

  it('asks for a URL and a token on every attempt, with forceRefresh after a pre-open failure', async () => {
    const urls = ['ws://127.0.0.1:9/east', 'ws://127.0.0.1:9/east', 'ws://127.0.0.1:9/west'];
    const { client, factory, tokenCalls, urlCalls } = setup({
      url: (context) => {
        urlCalls.push(context);
        return Promise.resolve(urls[urlCalls.length - 1]!);
      },
    });
    client.start();
    await settle();
    expect(factory.last().protocols).toEqual(['streamfleet.v1', 'bearer.token-1']);
    factory.last().drop(); // refused (expired token?): the browser cannot tell why
    await vi.advanceTimersByTimeAsync(2000);
    const second = factory.last();
    expect(second.protocols).toEqual(['streamfleet.v1', 'bearer.token-2']);
    second.open();
    second.restoreState('us-east-1');
    second.drop(1001); // a drop after a healthy connection: no reason to distrust the token
    await vi.advanceTimersByTimeAsync(2000);
    expect(factory.last().url).toBe('ws://127.0.0.1:9/west');
    expect(tokenCalls).toEqual([
      { attempt: 0, forceRefresh: false },
      { attempt: 1, forceRefresh: true },
      { attempt: 1, forceRefresh: false },
    ]);
    expect(urlCalls).toEqual(tokenCalls);
    expect(factory.sockets.map((s) => s.url)).toEqual(urls);
    client.close();
  });

  it('can send the token in the query string instead', async () => {
    const { client, factory } = setup({ tokenTransport: 'query', url: 'ws://127.0.0.1:9/x?a=1' });
    client.start();
    await settle();
    expect(factory.last().url).toBe('ws://127.0.0.1:9/x?a=1&token=token-1');
    expect(factory.last().protocols).toEqual(['streamfleet.v1']);
    client.close();
  });

  it('retries with backoff when a provider fails, and asks again with forceRefresh', async () => {
    let calls = 0;
    const errors: unknown[] = [];
    const { client, factory } = setup({
      token: (context) => {
        calls += 1;
        if (calls === 1) return Promise.reject(new Error('identity provider down'));
        return Promise.resolve(context.forceRefresh ? 'fresh' : 'cached');
      },
    });
    client.on('error', (error) => errors.push(error));
    client.start();
    await settle();
    expect(factory.sockets.length).toBe(0);
    expect(client.status).toBe('backing-off');
    expect(String(errors[0])).toContain('identity provider down');
    await vi.advanceTimersByTimeAsync(2000);
    expect(factory.last().protocols).toEqual(['streamfleet.v1', 'bearer.fresh']);
    client.close();
  });

  it('sends getState first on every (re)connect and is ready only when its reply comes', async () => {
    const regions: [string, string | null][] = [];
    const { client, factory } = setup({ getStateFields: { auction: 'a1' } });
    client.on('region', (region, previous) => regions.push([region, previous]));
    client.start();
    await settle();
    for (const region of ['us-east-1', 'us-west-2']) {
      const socket = factory.last();
      socket.open();
      const request = socket.sentJson()[0]!;
      expect(request).toEqual({ auction: 'a1', action: 'getState', requestId: expect.any(String) });
      // A state reply to someone else's request does not restore this connection.
      socket.deliver({ type: 'state', region, requestId: 'other', user: 'alice', state: {} });
      expect(client.ready).toBe(false);
      socket.restoreState(region, 42);
      expect(client.ready).toBe(true);
      expect(client.region).toBe(region);
      expect(client.state?.auction?.highest).toBe(42);
      socket.drop();
      await vi.advanceTimersByTimeAsync(2000);
    }
    expect(regions).toEqual([
      ['us-east-1', null],
      ['us-west-2', 'us-east-1'],
    ]);
    const ids = factory.sockets.slice(0, 2).map((s) => s.getStateRequest().requestId);
    expect(new Set(ids).size).toBe(2);
    client.close();
  });

  it('tells the application its status, region and reconnect attempts through change events', async () => {
    const { client, factory } = setup();
    const seen: string[] = [];
    client.on('change', (s) => seen.push(`${s.status}/${s.region ?? '-'}/${s.reconnectAttempt}`));
    client.start();
    await settle();
    factory.last().open();
    factory.last().restoreState('us-east-1');
    factory.last().drop();
    await vi.advanceTimersByTimeAsync(2000);
    factory.last().drop();
    client.close();
    expect(seen).toEqual([
      'connecting/-/0',
      'open/-/0',
      'open/us-east-1/0',
      'backing-off/us-east-1/1',
      'connecting/us-east-1/1',
      'backing-off/us-east-1/2',
      'closed/us-east-1/2',
    ]);
  });

  it('keeps working when a listener throws', async () => {
    const { client, factory } = setup();
    const spy = vi.spyOn(console, 'error').mockImplementation(() => undefined);
    client.on('region', () => {
      throw new Error('application bug');
    });
    client.start();
    await settle();
    factory.last().open();
    factory.last().restoreState('us-east-1');
    expect(client.ready).toBe(true);
    expect(spy).toHaveBeenCalled();
    client.close();
  });
});

describe('StreamFleetClient requests', () => {
  async function connected(overrides: Partial<StreamFleetClientOptions> = {}) {
    const context = setup(overrides);
    context.client.start();
    await settle();
    context.factory.last().open();
    context.factory.last().restoreState('us-east-1');
    return { ...context, socket: context.factory.last() };
  }

  it('correlates replies that arrive out of order by requestId', async () => {
    const { client, socket } = await connected();
    const first = client.bid('a1', 10);
    const second = client.bid('a1', 20);
    const state = client.getState({ auction: 'a1' });
    const [, r1, r2, r3] = socket.sentJson();
    expect(new Set([r1!.requestId, r2!.requestId, r3!.requestId]).size).toBe(3);
    socket.deliver({
      type: 'state',
      region: 'us-east-1',
      requestId: r3!.requestId,
      user: 'alice',
      state: {},
    });
    socket.deliver({ type: 'bid', region: 'us-east-1', requestId: 'nobody', amount: 99 });
    socket.deliver({
      type: 'bid',
      region: 'us-east-1',
      requestId: r2!.requestId,
      auction: 'a1',
      amount: 20,
      accepted: true,
      highest: 20,
      highestIsYou: true,
    });
    socket.deliver({
      type: 'bid',
      region: 'us-east-1',
      requestId: r1!.requestId,
      auction: 'a1',
      amount: 10,
      accepted: false,
      highest: 20,
      highestIsYou: false,
      reason: 'not higher',
    });
    await expect(first).resolves.toMatchObject({ amount: 10, accepted: false, highest: 20 });
    await expect(second).resolves.toMatchObject({ amount: 20, accepted: true });
    await expect(state).resolves.toMatchObject({ type: 'state' });
    client.close();
  });

  it('times out each request on its own, and ignores a reply that comes too late', async () => {
    const { client, socket } = await connected({ requestTimeoutMs: 1000 });
    const slow = client.request({ action: 'getState' }, { timeoutMs: 500 });
    const normal = client.request({ action: 'getState' });
    const slowId = socket.sentJson()[1]!.requestId as string;
    const outcome = slow.catch((error: unknown) => error);
    await vi.advanceTimersByTimeAsync(499);
    socket.deliver({ type: 'state', region: 'us-east-1', requestId: socket.sentJson()[2]!.requestId });
    await expect(normal).resolves.toMatchObject({ type: 'state' });
    await vi.advanceTimersByTimeAsync(1);
    const error = await outcome;
    expect(error).toBeInstanceOf(RequestTimeoutError);
    expect((error as RequestTimeoutError).requestId).toBe(slowId);
    socket.deliver({ type: 'state', region: 'us-east-1', requestId: slowId }); // late: ignored
    expect(vi.getTimerCount()).toBe(2); // only the heartbeat and the rotation
    client.close();
  });

  it('fails requests in flight with ConnectionLostError when the connection ends', async () => {
    const { client, socket } = await connected();
    const pending = client.bid('a1', 5);
    socket.drop();
    await expect(pending).rejects.toBeInstanceOf(ConnectionLostError);
    await expect(client.bid('a1', 6)).rejects.toBeInstanceOf(NotConnectedError);
    client.close();
  });

  it('rejects an error reply as ServerError naming the field', async () => {
    const { client, socket } = await connected();
    const pending = client.bid('a1', 5);
    socket.deliver({
      type: 'error',
      region: 'us-east-1',
      requestId: socket.sentJson()[1]!.requestId,
      error: 'bad_request',
      message: 'amount: must be between 1 and 10**15',
      field: 'amount',
    });
    const error = await pending.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ServerError);
    expect((error as ServerError).field).toBe('amount');
    expect((error as ServerError).message).toContain('amount');
    client.close();
  });

  it('refuses frames over 32 KB locally, before sending anything', async () => {
    const { client, socket } = await connected();
    const sentBefore = socket.sent.length;
    const envelope = JSON.stringify({ action: 'bid', pad: '' }).length;
    const exact = { action: 'bid', pad: 'x'.repeat(MAX_FRAME_BYTES - envelope) };
    expect(() => client.send(exact)).not.toThrow();
    const over = { action: 'bid', pad: 'x'.repeat(MAX_FRAME_BYTES - envelope + 1) };
    expect(() => client.send(over)).toThrow(FrameTooLargeError);
    expect(() => client.send(over)).toThrow(/32769 bytes refused: the API allows at most 32768/);
    // Bytes, not characters: 'é' is two bytes in UTF-8.
    const accented = { action: 'bid', pad: 'é'.repeat(20000) };
    expect(() => client.send(accented)).toThrow(FrameTooLargeError);
    await expect(client.request({ action: 'bid', pad: 'x'.repeat(40 * 1024) })).rejects.toBeInstanceOf(
      FrameTooLargeError,
    );
    expect(socket.sent.length).toBe(sentBefore + 1);
    expect(client.status).toBe('open');
    client.close();
  });

  it('names the field of a bad argument and sends nothing', async () => {
    const { client, socket } = await connected();
    const before = socket.sent.length;
    await expect(client.bid('a1', 1.5)).rejects.toThrow(/amount/);
    await expect(client.bid('', 5)).rejects.toThrow(/auction/);
    expect(() => client.send({ nope: 1 } as never)).toThrow(/action/);
    expect(socket.sent.length).toBe(before);
    client.close();
  });
});

describe('StreamFleetClient lifecycle', () => {
  it('close() while open: closes the socket, fails pending requests, leaves no timer', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    const pending = client.bid('a1', 3);
    expect(vi.getTimerCount()).toBe(3); // heartbeat, rotation and the request's timeout
    client.close();
    await expect(pending).rejects.toBeInstanceOf(ClientClosedError);
    expect(socket.closeCalls).toEqual([{ code: 1000, reason: 'client closed' }]);
    expect(client.status).toBe('closed');
    expect(vi.getTimerCount()).toBe(0);
    await vi.advanceTimersByTimeAsync(120000);
    expect(factory.sockets.length).toBe(1);
    expect(() => client.send({ action: 'heartbeat' })).toThrow(ClientClosedError);
  });

  it('close() right after start(), before the dial has returned: its socket is closed, no timer left', async () => {
    // A fixed URL and no token provider: the socket is made at once, and wired a microtask later.
    const { client, factory } = setup({ url: 'ws://127.0.0.1:9/primary', token: undefined });
    client.start();
    client.close();
    await settle();
    expect(factory.sockets.length).toBe(1);
    expect(factory.last().closeCalls).toEqual([{ code: 1000, reason: 'closed' }]);
    expect(vi.getTimerCount()).toBe(0);
    expect(client.status).toBe('closed');
  });

  it('close() while backing off cancels the retry', async () => {
    const { client, factory } = setup();
    client.start();
    await settle();
    factory.last().drop();
    expect(vi.getTimerCount()).toBe(1);
    client.close();
    expect(vi.getTimerCount()).toBe(0);
    await vi.advanceTimersByTimeAsync(60000);
    expect(factory.sockets.length).toBe(1);
  });

  it('close() while a provider is still answering creates no socket', async () => {
    let release: (url: string) => void = () => undefined;
    const { client, factory } = setup({
      url: () =>
        new Promise<string>((resolve) => {
          release = resolve;
        }),
    });
    client.start();
    await settle();
    client.close();
    release('ws://127.0.0.1:9/late');
    await settle();
    expect(factory.sockets.length).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
    expect(client.status).toBe('closed');
  });

  it('close() is idempotent and a closed client cannot be restarted', async () => {
    const { client } = setup();
    client.start();
    await settle();
    client.close();
    client.close();
    expect(() => client.start()).toThrow(ClientClosedError);
  });

  it('reconnect() drops the connection and connects again after a short pause', async () => {
    const { client, factory } = setup({ random: () => 0.5 });
    client.start();
    await settle();
    factory.last().open();
    factory.last().restoreState('us-east-1');
    client.reconnect();
    expect(client.status).toBe('backing-off');
    await vi.advanceTimersByTimeAsync(1000);
    expect(factory.sockets.length).toBe(2);
    client.close();
  });

  it('refuses bad options, naming the option', () => {
    const base = { url: 'ws://127.0.0.1:9/' };
    expect(() => new StreamFleetClient({ ...base, heartbeatIntervalMs: 0 })).toThrow(/heartbeatIntervalMs/);
    expect(() => new StreamFleetClient({ ...base, heartbeatTimeoutMs: Number.NaN })).toThrow(
      /heartbeatTimeoutMs/,
    );
    expect(() => new StreamFleetClient({ ...base, missedPongsBeforeReconnect: 0 })).toThrow(
      /missedPongsBeforeReconnect/,
    );
    expect(() => new StreamFleetClient({ ...base, maxFrameBytes: 40000 })).toThrow(/maxFrameBytes/);
    expect(() => new StreamFleetClient({ ...base, backoffCapMs: -1 })).toThrow(/backoffCapMs/);
    expect(() => new StreamFleetClient({ ...base, name: 'x'.repeat(41) })).toThrow(/name/);
    expect(() => new StreamFleetClient({ ...base, tokenTransport: 'cookie' as never })).toThrow(
      /tokenTransport/,
    );
    expect(() => new StreamFleetClient({ url: 42 as never })).toThrow(/url/);
  });
});

describe('wake signals', () => {
  function signals(visibility = 'hidden') {
    const window = new EventTarget();
    const document = Object.assign(new EventTarget(), { visibilityState: visibility });
    return { window, document };
  }

  async function backingOff(wakeSignals: ReturnType<typeof signals> | null) {
    const { client, factory } = setup({ wakeSignals, backoffBaseMs: 20_000 });
    client.start();
    await settle();
    factory.last().drop(); // the network is gone: backing off up to 20 s
    expect(client.status).toBe('backing-off');
    return { client, factory };
  }

  it('connects at once when the browser is back online, not after the backoff', async () => {
    const wake = signals();
    const { client, factory } = await backingOff(wake);
    wake.window.dispatchEvent(new Event('online'));
    await settle();
    expect(factory.sockets.length).toBe(2);
    expect(client.status).toBe('connecting');
    await vi.advanceTimersByTimeAsync(20_000); // the backoff's timer is gone: no third attempt
    expect(factory.sockets.length).toBe(2);
    client.close();
  });

  it('connects at once when the page becomes visible, not when it is hidden', async () => {
    const wake = signals('hidden');
    const { client, factory } = await backingOff(wake);
    wake.document.dispatchEvent(new Event('visibilitychange'));
    await settle();
    expect(factory.sockets.length).toBe(1);
    wake.document.visibilityState = 'visible';
    wake.document.dispatchEvent(new Event('visibilitychange'));
    await settle();
    expect(factory.sockets.length).toBe(2);
    client.close();
  });

  it('leaves a connecting or open client alone, and listens no more once closed', async () => {
    const wake = signals('visible');
    const { client, factory } = setup({ wakeSignals: wake });
    client.start();
    await settle();
    factory.last().open();
    wake.window.dispatchEvent(new Event('online'));
    await settle();
    expect(factory.sockets.length).toBe(1);
    factory.last().drop();
    client.close();
    wake.window.dispatchEvent(new Event('online'));
    wake.document.dispatchEvent(new Event('visibilitychange'));
    await settle();
    expect(factory.sockets.length).toBe(1);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('waits its backoff where nothing signals (wakeSignals null)', async () => {
    const { client, factory } = await backingOff(null);
    await vi.advanceTimersByTimeAsync(19_999);
    expect(factory.sockets.length).toBe(1);
    await vi.advanceTimersByTimeAsync(1);
    await settle();
    expect(factory.sockets.length).toBe(2);
    client.close();
  });
});
