/**
 * What the React binding (react.ts) shares per client and stream, with no React in it: a feed
 * keeps a stream's last messages, counts the components that show it, and holds the client's
 * subscription while any does. It is the external store `useSyncExternalStore` reads.
 *
 * - The subscription is the client's own: one per stream whatever the number of components,
 *   resumed by the client from its PositionStore (a remount, or a reload with
 *   `storagePositions(localStorage)`), each message once.
 * - Letting go is deferred to a microtask: StrictMode's mount, unmount, mount (and a component
 *   moving in the tree) would otherwise cost an unsubscribe and a subscribe on the wire.
 * - The last messages outlive the components (bounded), so a remounted one shows what it
 *   showed, then what it missed (the client's replay from its position), with no duplicate.
 * - The client is never closed here: it may serve other components and other code. An idle
 *   client is started, so a component is all an application needs.
 */
import type { ConnectionStatus, StreamFleetClient } from './client.js';
import type { SubscriptionRefusedError } from './errors.js';
import type { StreamMessage } from './protocol.js';

/** Messages a feed keeps unless told otherwise. */
export const DEFAULT_KEEP = 100;

/** What a component shows of one stream. */
export interface StreamView {
  /** The last `keep` messages delivered, oldest first: each once, in the order the client
   * delivered them (seq order within an epoch; a new epoch's come after the old one's). */
  readonly messages: readonly StreamMessage[];
  /** The server refused the subscribe (`forbidden`, ...): nothing more comes until a remount. */
  readonly error: SubscriptionRefusedError | null;
}

/** What a component shows of the connection (a new object only when one of these changes). */
export interface ConnectionView {
  readonly status: ConnectionStatus;
  /** Open, and the connection's state restored. */
  readonly ready: boolean;
  /** The region that served the last reply. */
  readonly region: string | null;
}

export const EMPTY_VIEW: StreamView = Object.freeze({ messages: Object.freeze([]), error: null });

export class StreamFeed {
  private messages: StreamMessage[] = [];
  private capacity = 0;
  private version = 0;
  private readonly views = new Map<number, { version: number; view: StreamView }>();
  private error: SubscriptionRefusedError | null = null;
  private readonly listeners = new Set<() => void>();
  private holders = 0;
  private subscribed = false;
  // Whether the subscription is this feed's to end: the application's own subscribe, or one the
  // client follows from the server's state, outlives the components that showed the stream
  // (the client keeps one cursor per stream, with no count of who asked for it).
  private ownsSubscription = false;
  private notifying = false;

  constructor(
    private readonly client: StreamFleetClient,
    readonly stream: string,
  ) {}

  /** A component shows the stream: subscribe (once for all of them); the returned function
   * lets go. `onChange` hears of new messages, batched per microtask. */
  attach(keep: number, onChange: () => void): () => void {
    this.capacity = Math.max(this.capacity, keep);
    this.listeners.add(onChange);
    this.holders += 1;
    if (!this.subscribed) {
      this.subscribed = true;
      if (this.error !== null) {
        this.error = null;
        this.changed();
      }
      if (this.client.status === 'idle') this.client.start();
      this.ownsSubscription = this.client.cursor(this.stream) === undefined;
      // A refusal arrives as the client's subscriptionError event too (see received()).
      this.client.subscribe(this.stream).catch(() => undefined);
    }
    let attached = true;
    return () => {
      if (!attached) return;
      attached = false;
      this.listeners.delete(onChange);
      this.holders -= 1;
      if (this.holders === 0) queueMicrotask(() => this.letGo());
    };
  }

  /** The last `keep` messages: the same object until something changes (what
   * useSyncExternalStore requires of a snapshot). */
  view(keep: number): StreamView {
    const cached = this.views.get(keep);
    if (cached !== undefined && cached.version === this.version) return cached.view;
    const view: StreamView = {
      messages: this.messages.length <= keep ? this.messages.slice() : this.messages.slice(-keep),
      error: this.error,
    };
    this.views.set(keep, { version: this.version, view });
    return view;
  }

  /** The client delivered a message of this stream. */
  received(message: StreamMessage): void {
    this.messages.push(message);
    // Trimmed in halves, not per message: a copy per message would cost keep each time. A feed
    // no component has attached to yet keeps one.
    const keep = Math.max(this.capacity, 1);
    if (this.messages.length > 2 * keep) this.messages = this.messages.slice(-keep);
    this.changed();
  }

  refused(error: SubscriptionRefusedError): void {
    if (!this.subscribed) return;
    this.subscribed = false; // the client dropped the stream; a remount asks again
    this.error = error;
    this.changed();
  }

  private letGo(): void {
    if (this.holders > 0 || !this.subscribed) return; // attached again meanwhile
    this.subscribed = false;
    if (this.ownsSubscription) this.client.unsubscribe(this.stream).catch(() => undefined);
  }

  private changed(): void {
    this.version += 1;
    if (this.notifying) return;
    this.notifying = true;
    // One render for a frame's worth of messages (the client delivers them one by one).
    queueMicrotask(() => {
      this.notifying = false;
      for (const listener of [...this.listeners]) listener();
    });
  }
}

/** Per client: its feeds, and the connection view last shown. */
interface Registry {
  feeds: Map<string, StreamFeed>;
  connection: ConnectionView;
}

const registries = new WeakMap<StreamFleetClient, Registry>();

function registry(client: StreamFleetClient): Registry {
  let found = registries.get(client);
  if (found === undefined) {
    const feeds = new Map<string, StreamFeed>();
    found = { feeds, connection: { status: client.status, ready: client.ready, region: client.region } };
    registries.set(client, found);
    // For the client's lifetime: a feed keeps its messages between components.
    client.on('streamMessage', (message) => feeds.get(message.stream)?.received(message));
    client.on('subscriptionError', (error) => feeds.get(error.stream)?.refused(error));
  }
  return found;
}

/** The feed of `stream` on `client` (made on first use, kept while the client lives). */
export function feedOf(client: StreamFleetClient, stream: string): StreamFeed {
  const { feeds } = registry(client);
  let feed = feeds.get(stream);
  if (feed === undefined) {
    feed = new StreamFeed(client, stream);
    feeds.set(stream, feed);
  }
  return feed;
}

/** The client's status, readiness and region: the same object while none of them changes. */
export function connectionOf(client: StreamFleetClient): ConnectionView {
  const found = registry(client);
  const last = found.connection;
  if (last.status !== client.status || last.ready !== client.ready || last.region !== client.region) {
    found.connection = { status: client.status, ready: client.ready, region: client.region };
  }
  return found.connection;
}
