// A client on a fake socket, connected, and the server's side of subscriptions: what the
// binding's tests (feeds.test.ts under Node, react.test.tsx in Chromium) share.
import { StreamFleetClient, memoryPositions, type PositionStore } from '../src/client/index.js';
import { type FakeSocket, socketFactory } from './fake-websocket.js';

export function makeClient(positions: PositionStore = memoryPositions()) {
  const factory = socketFactory();
  const client = new StreamFleetClient({
    url: 'ws://127.0.0.1:9/',
    webSocket: factory.create,
    random: () => 0,
    wakeSignals: null,
    followServerSubscriptions: false,
    positions,
  });
  return { client, factory };
}

/** A started client whose connection is open and its state restored. */
export async function connected(positions?: PositionStore) {
  const { client, factory } = makeClient(positions);
  client.start();
  await settle(); // the socket is wired to the client once its dial has returned
  const socket = factory.last();
  socket.open();
  socket.restoreState('us-east-1');
  return { client, socket, factory };
}

export function sent(socket: FakeSocket, action: string, stream: string): Record<string, unknown>[] {
  return socket.sentJson().filter((m) => m.action === action && m.stream === stream);
}

/** Answer the last subscribe of `stream`, then deliver `seqs` (the replay and live frames). */
export function serve(socket: FakeSocket, stream: string, after: number, seqs: number[]): void {
  const request = sent(socket, 'subscribe', stream).at(-1)!;
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
  deliver(socket, stream, seqs);
}

export function deliver(socket: FakeSocket, stream: string, seqs: number[]): void {
  socket.deliver({
    type: 'messages',
    stream,
    source: 'live',
    region: 'us-east-1',
    messages: seqs.map((seq) => ({ seq, data: `d${seq}`, at: seq })),
  });
}

/** Lets queued microtasks (a feed's notifications and let-go) run. */
export const settle = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));
