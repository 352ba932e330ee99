/**
 * `@streamfleet/web-client/react`: a stream's messages and the connection's state in a
 * component, from a client the application creates once and shares.
 *
 * ```tsx
 * const client = new StreamFleetClient({ url, token, positions: storagePositions(localStorage) });
 * function Ticker() {
 *   const { messages, status } = useStream(client, 'prices', { keep: 20 });
 *   return <ul data-status={status}>{messages.map((m) => <li key={`${m.epoch}:${m.seq}`}>{m.data}</li>)}</ul>;
 * }
 * ```
 *
 * React 18 or later is a peer dependency of this entry only: the core entry never imports it.
 * Both hooks read through `useSyncExternalStore`, so concurrent rendering never shows two
 * components different messages of one stream; see feeds.ts for what is shared and when the
 * subscription ends.
 */
import { useCallback, useMemo, useSyncExternalStore } from 'react';

import type { StreamFleetClient } from './client.js';
import {
  type ConnectionView,
  connectionOf,
  DEFAULT_KEEP,
  EMPTY_VIEW,
  feedOf,
  type StreamView,
} from './feeds.js';

export { type ConnectionView, DEFAULT_KEEP, type StreamView } from './feeds.js';

export interface UseStreamOptions {
  /** How many of the stream's last messages the component gets. Default 100. */
  keep?: number;
}

/** What {@link useStream} gives a component. */
export interface StreamState extends StreamView, ConnectionView {}

const noop = (): void => undefined;
const IDLE_CONNECTION: ConnectionView = Object.freeze({ status: 'idle', ready: false, region: null });

function checkClient(client: StreamFleetClient, hook: string): void {
  if (client === null || typeof client !== 'object' || typeof client.subscribe !== 'function') {
    throw new TypeError(`${hook}: client must be a StreamFleetClient, got ${String(client)}`);
  }
}

/**
 * The messages of `stream` (the last `keep`, oldest first, each once and in order) and the
 * connection's state. Subscribes when the first component showing the stream mounts, and
 * unsubscribes when the last one unmounts; never closes the client, and starts it when it is
 * idle. A component that mounts again gets the messages kept so far, then the ones it missed
 * (the client resumes from its positions: with `storagePositions(localStorage)`, across
 * reloads too). `stream` null: no subscription, no messages.
 */
export function useStream(
  client: StreamFleetClient,
  stream: string | null,
  options: UseStreamOptions = {},
): StreamState {
  checkClient(client, 'useStream');
  const keep = options.keep ?? DEFAULT_KEEP;
  if (!Number.isSafeInteger(keep) || keep < 1) {
    throw new RangeError(`useStream: keep must be a whole number >= 1, got ${String(options.keep)}`);
  }
  if (stream !== null && (typeof stream !== 'string' || stream === '')) {
    throw new RangeError(
      `useStream: stream must be a non-empty string or null, got ${JSON.stringify(stream)}`,
    );
  }
  const feed = stream === null ? null : feedOf(client, stream);
  const subscribe = useCallback(
    (onChange: () => void) => (feed === null ? noop : feed.attach(keep, onChange)),
    [feed, keep],
  );
  const read = (): StreamView => (feed === null ? EMPTY_VIEW : feed.view(keep));
  // The server renders no messages: they arrive once the page's client is connected.
  const view = useSyncExternalStore(subscribe, read, () => EMPTY_VIEW);
  const connection = useConnection(client);
  return useMemo(() => ({ ...view, ...connection }), [view, connection]);
}

/** The client's status, readiness and region; renders again only when one of them changes.
 * Does not start the client. */
export function useConnection(client: StreamFleetClient): ConnectionView {
  checkClient(client, 'useConnection');
  const subscribe = useCallback(
    (onChange: () => void) => {
      const off = client.on('change', onChange);
      return () => void off();
    },
    [client],
  );
  const read = (): ConnectionView => connectionOf(client);
  // The server renders an idle client, whatever this client is doing by hydration time.
  return useSyncExternalStore(subscribe, read, () => IDLE_CONNECTION);
}
