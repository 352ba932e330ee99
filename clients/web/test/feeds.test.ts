// The React binding's store without React (src/client/feeds.ts), under Node in the gate: one
// subscription on the wire however many components show a stream, kept through StrictMode's
// unmount and mount, ended by the last one, resumed without a duplicate. test/react.test.tsx
// drives the same through React in Chromium.
import { describe, expect, it } from 'vitest';

import { connectionOf, feedOf } from '../src/client/feeds.js';
import type { StreamFleetClient } from '../src/client/index.js';
import { useConnection, useStream } from '../src/client/react.js';
import { connected, deliver, makeClient, sent, serve, settle } from './connected-client.js';

const seqs = (feed: ReturnType<typeof feedOf>, keep: number) => feed.view(keep).messages.map((m) => m.seq);

describe('StreamFeed', () => {
  it('subscribes once for every component, and unsubscribes after the last lets go', async () => {
    const { client, socket } = await connected();
    const feed = feedOf(client, 's');
    expect(feedOf(client, 's')).toBe(feed);
    const first = feed.attach(10, () => undefined);
    const second = feed.attach(10, () => undefined);
    expect(sent(socket, 'subscribe', 's')).toHaveLength(1);
    first();
    first(); // letting go twice counts once
    await settle();
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(0);
    second();
    await settle();
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(1);
    expect(client.status).toBe('open'); // the client is the application's: never closed here
    client.close();
  });

  it("keeps the subscription through StrictMode's unmount and mount in one commit", async () => {
    const { client, socket } = await connected();
    const feed = feedOf(client, 's');
    feed.attach(10, () => undefined)();
    const again = feed.attach(10, () => undefined);
    await settle();
    expect(sent(socket, 'subscribe', 's')).toHaveLength(1);
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(0);
    again();
    client.close();
  });

  it('keeps the last messages, tells its listeners once per frame, and gives a stable view', async () => {
    const { client, socket } = await connected();
    const feed = feedOf(client, 's');
    let told = 0;
    const detach = feed.attach(3, () => (told += 1));
    const empty = feed.view(3);
    expect(feed.view(3)).toBe(empty);
    serve(socket, 's', 0, [1, 2, 3, 4, 5]);
    await settle();
    expect(told).toBe(1);
    expect(seqs(feed, 3)).toEqual([3, 4, 5]);
    expect(seqs(feed, 2)).toEqual([4, 5]);
    expect(feed.view(3)).toBe(feed.view(3));
    expect(feed.view(3)).not.toBe(empty);
    deliver(
      socket,
      's',
      Array.from({ length: 20 }, (_, i) => 6 + i),
    );
    expect(seqs(feed, 3)).toEqual([23, 24, 25]);
    detach();
    client.close();
  });

  it('resumes after a remount from where the client was, with no duplicate', async () => {
    const { client, socket } = await connected();
    const feed = feedOf(client, 's');
    const detach = feed.attach(10, () => undefined);
    serve(socket, 's', 0, [1, 2, 3]);
    detach();
    await settle();
    expect(sent(socket, 'unsubscribe', 's')).toHaveLength(1);
    feed.attach(10, () => undefined);
    // The client subscribes from its position; the server's replay repeats 3 (at least once).
    expect(sent(socket, 'subscribe', 's').at(-1)).toMatchObject({ after: 3 });
    serve(socket, 's', 3, [3, 4, 5]);
    expect(seqs(feed, 10)).toEqual([1, 2, 3, 4, 5]);
    client.close();
  });

  it('starts an idle client, and shows a refusal until a remount asks again', async () => {
    const { client, factory } = makeClient();
    const feed = feedOf(client, 'secret');
    const detach = feed.attach(10, () => undefined);
    expect(client.status).toBe('connecting');
    await settle();
    const socket = factory.last();
    socket.open();
    socket.restoreState('us-east-1');
    const request = sent(socket, 'subscribe', 'secret').at(-1)!;
    socket.deliver({ type: 'error', error: 'forbidden', requestId: request.requestId, message: 'no' });
    await settle();
    expect(feed.view(10).error?.error).toBe('forbidden');
    detach();
    await settle();
    expect(sent(socket, 'unsubscribe', 'secret')).toHaveLength(0); // the client already dropped it
    feed.attach(10, () => undefined);
    expect(feed.view(10).error).toBeNull();
    expect(sent(socket, 'subscribe', 'secret')).toHaveLength(2);
    client.close();
  });

  it("gives the connection's status, readiness and region, a new object only when they change", async () => {
    const { client, factory } = makeClient();
    const idle = connectionOf(client);
    expect(idle).toEqual({ status: 'idle', ready: false, region: null });
    expect(connectionOf(client)).toBe(idle);
    client.start();
    await settle();
    factory.last().open();
    factory.last().restoreState('us-east-1');
    expect(connectionOf(client)).toEqual({ status: 'open', ready: true, region: 'us-east-1' });
    client.close();
  });
});

describe('useStream and useConnection', () => {
  it('refuse a bad option or client in one line, before any hook runs', () => {
    const { client } = makeClient();
    expect(() => useStream(client, 's', { keep: 0 })).toThrow(
      'useStream: keep must be a whole number >= 1, got 0',
    );
    expect(() => useStream(client, '', {})).toThrow('useStream: stream must be a non-empty string or null');
    expect(() => useConnection(null as unknown as StreamFleetClient)).toThrow(
      'useConnection: client must be a StreamFleetClient, got null',
    );
  });
});
