/** A scriptable stand-in for the browser's WebSocket: the test plays the server. */
import type { WebSocketLike } from '../src/client/index.js';

const CONNECTING = 0;
const OPEN = 1;
const CLOSING = 2;
const CLOSED = 3;

export class FakeSocket implements WebSocketLike {
  readyState: number = CONNECTING;
  readonly sent: string[] = [];
  readonly closeCalls: { code: number | undefined; reason: string | undefined }[] = [];
  onopen: WebSocket['onopen'] = null;
  onmessage: WebSocket['onmessage'] = null;
  onclose: WebSocket['onclose'] = null;
  onerror: WebSocket['onerror'] = null;

  constructor(
    readonly url: string,
    readonly protocols: string[],
  ) {}

  send(data: string | ArrayBufferLike | Blob | ArrayBufferView): void {
    if (this.readyState !== OPEN) {
      throw new Error(`send in readyState ${this.readyState}`);
    }
    this.sent.push(String(data));
  }

  close(code?: number, reason?: string): void {
    this.closeCalls.push({ code, reason });
    if (this.readyState < CLOSING) this.readyState = CLOSING;
  }

  // --- The server's side ---

  open(): void {
    this.readyState = OPEN;
    this.onopen?.call(this as unknown as WebSocket, new Event('open'));
  }

  /** A message as the socket received it: text, or binary data. */
  deliverRaw(data: unknown): void {
    this.onmessage?.call(this as unknown as WebSocket, { data } as MessageEvent);
  }

  /** A text frame from the server (an object is sent as JSON). */
  deliver(frame: string | object): void {
    const data = typeof frame === 'string' ? frame : JSON.stringify(frame);
    this.onmessage?.call(this as unknown as WebSocket, { data } as MessageEvent);
  }

  /** The connection ends (1006: what a browser reports for a refused handshake or a drop). */
  drop(code = 1006, reason = ''): void {
    this.readyState = CLOSED;
    this.onerror?.call(this as unknown as WebSocket, new Event('error'));
    this.onclose?.call(this as unknown as WebSocket, { code, reason, wasClean: false } as CloseEvent);
  }

  /** Every JSON frame the client sent, parsed. */
  sentJson(): Record<string, unknown>[] {
    return this.sent.map((frame) => JSON.parse(frame) as Record<string, unknown>);
  }

  heartbeats(): number {
    return this.sent.filter((frame) => frame === '{"action":"heartbeat"}').length;
  }

  /** The client's getState request on this connection. */
  getStateRequest(): Record<string, unknown> {
    const request = this.sentJson().find((message) => message.action === 'getState');
    if (request === undefined) throw new Error('no getState sent');
    return request;
  }

  /** Answer this connection's getState, which marks it healthy. */
  restoreState(region: string, highest = 0): void {
    const request = this.getStateRequest();
    this.deliver({
      type: 'state',
      region,
      requestId: request.requestId,
      user: 'alice',
      state: { lastBid: null, bidsAccepted: 0, bidsRefused: 0, updatedAtMs: null },
      auction: { auction: 'a1', highest, highestIsYou: false, bids: 0 },
    });
  }
}

/** A factory that records every socket the client creates. */
export function socketFactory(): {
  sockets: FakeSocket[];
  create: (url: string, protocols: string[]) => FakeSocket;
  last: () => FakeSocket;
} {
  const sockets: FakeSocket[] = [];
  return {
    sockets,
    create: (url, protocols) => {
      const socket = new FakeSocket(url, protocols);
      sockets.push(socket);
      return socket;
    },
    last: () => {
      const socket = sockets.at(-1);
      if (socket === undefined) throw new Error('no socket created yet');
      return socket;
    },
  };
}
