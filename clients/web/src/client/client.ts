/**
 * A WebSocket client that keeps itself connected to the StreamFleet API across region
 * failovers: the browser counterpart of the Python `ReconnectingClient`
 * (runtime/streamfleet/client/reconnecting.py).
 *
 * - Liveness: any reply of ours (a `pong`, a state, a stream's frames; not an error frame,
 *   which a throttled region answers every message with) proves the connection alive. After
 *   `heartbeatIntervalMs` (20 s) without one it sends `{"action":"heartbeat"}`, and drops the
 *   connection when no `pong` came within `heartbeatTimeoutMs` (10 s), even though the socket
 *   looks open (`missedPongsBeforeReconnect`, 1, heartbeats in a row). A silently dead
 *   connection is so noticed within 20 + 10 = 30 s, at a cost of at most 3 heartbeats (6 API
 *   Gateway messages with their pongs) per idle connection-minute, and none on one that
 *   receives a reply or a stream message at least every 20 s.
 * - Rotation: at a random age between 90 % and 100 % of `maxConnectionAgeMs` (110 min), ahead of
 *   API Gateway's 2-hour limit, a successor connection is opened; it takes over once open (make
 *   before break: the status stays `open`), the old one serving the replies to what was sent on
 *   it for `requestTimeoutMs`. Subscriptions resume from their positions (the cursors drop
 *   what both connections deliver).
 * - While not ready, `send()` and `request()` are refused (`NotConnectedError`), or with
 *   `sendQueueSize` queued, up to that many, and sent in order once the state is restored.
 * - Full-jitter backoff: the n-th consecutive retry waits `random() * min(2000 * 2**n, 20000)` ms.
 * - Before every attempt it asks the URL provider (the failover name; locally `/resolve`) and
 *   the token provider; after an attempt that failed before the socket opened, the token
 *   provider gets `{forceRefresh: true}` (a browser cannot see why a handshake was refused:
 *   Chromium reports 1006 for a missing, expired or wrong token alike).
 * - After every (re)connect it sends `getState`; the reply restores the application state and
 *   marks the connection healthy (which resets the backoff).
 * - Replies arrive in any order: requests are correlated by `requestId`, each with a timeout.
 * - Frames over 32 KB are refused locally (API Gateway would close the socket with 1009).
 * - Subscribed streams, exactly once: `subscribe(stream, {after})` asks for an ingested stream
 *   (its stored messages after `after`, or the newest few, then live ones); the `streamMessage`
 *   event gets each message exactly once, in seq order, with no gap, whatever the wire does
 *   (see streams.ts). Every (re)connect subscribes again from the last seq delivered (kept in
 *   `positions`, which may be the page's localStorage), and, with `followServerSubscriptions`,
 *   to the streams the server's state lists for the user, so a reloaded page picks up where it
 *   was.
 */

import { DEFAULT_BACKOFF_BASE_MS, DEFAULT_BACKOFF_CAP_MS, fullJitterBackoff } from './backoff.js';
import {
  ClientClosedError,
  ConnectionLostError,
  FrameTooLargeError,
  NotConnectedError,
  RequestTimeoutError,
  SendQueueFullError,
  ServerError,
  StreamFleetError,
  SubscriptionRefusedError,
} from './errors.js';
import {
  APP_SUBPROTOCOL,
  BEARER_SUBPROTOCOL_PREFIX,
  type BidReply,
  type ClientMessage,
  comparePositions,
  type EpochChange,
  frameBytes,
  HEARTBEAT_FRAME,
  isErrorReply,
  MAX_BID_AMOUNT,
  MAX_FRAME_BYTES,
  MAX_MESSAGE_BYTES,
  MAX_REQUEST_ID_CHARS,
  type MessagesFrame,
  PONG_FRAME,
  type Reply,
  ROUTE_BID,
  ROUTE_GET_STATE,
  ROUTE_SUBSCRIBE,
  ROUTE_UNSUBSCRIBE,
  type StateReply,
  type StreamMessage,
  type Skip,
  type StreamPosition,
  type SubscribedReply,
  TOKEN_QUERY_PARAMETER,
} from './protocol.js';
import {
  DEFAULT_GAP_TIMEOUT_MS,
  DEFAULT_MAX_BUFFERED,
  DEFAULT_QUIET_TIMEOUT_MS,
  StreamCursor,
} from './streams.js';
import { globalTimers, type Timers } from './timers.js';

/** Where the position of the last message delivered per stream is kept (what every reconnect
 * resumes from). */
export interface PositionStore {
  get(stream: string): StreamPosition | null | undefined;
  set(stream: string, position: StreamPosition): void;
}

/** Positions in memory (the default): they survive reconnects, not a reload. */
export function memoryPositions(): PositionStore {
  const positions = new Map<string, StreamPosition>();
  return {
    get: (stream) => positions.get(stream),
    set: (stream, position) => void positions.set(stream, { ...position }),
  };
}

/** Positions in a `Storage` (the page's `localStorage`) as `<epoch>:<seq>`: they survive a
 * reload too. A plain `<seq>` (as kept before epochs) reads as epoch 0's. */
export function storagePositions(storage: Storage, prefix = 'streamfleet.position.'): PositionStore {
  return {
    get: (stream) => {
      const raw = storage.getItem(prefix + stream);
      const match = raw === null ? null : /^(?:([0-9]{1,16}):)?([0-9]{1,16})$/.exec(raw);
      if (match === null) return null;
      const position = { epoch: Number(match[1] ?? 0), seq: Number(match[2]) };
      return Number.isSafeInteger(position.epoch) && Number.isSafeInteger(position.seq) ? position : null;
    },
    set: (stream, position) => {
      try {
        storage.setItem(prefix + stream, `${position.epoch}:${position.seq}`);
      } catch {
        // Full or forbidden storage: the position lives on in the cursor for this page.
      }
    },
  };
}

/** Errors after which subscribing again cannot help (the others are retried). */
const FINAL_SUBSCRIBE_ERRORS = new Set(['forbidden', 'not_supported', 'bad_request']);
/** The connection's token expired: the server answers every request so; the client reconnects. */
const TOKEN_EXPIRED = 'token_expired';
/** getState attempts on one connection before it is dropped for another. */
const STATE_ATTEMPTS = 5;

/** Where the client is in its connection loop. */
export type ConnectionStatus = 'idle' | 'connecting' | 'open' | 'backing-off' | 'closed';

/** What a provider is told about the attempt it is asked for. */
export interface AttemptContext {
  /** Consecutive failed attempts so far (0 for the first connection). */
  readonly attempt: number;
  /** True when the previous attempt failed before its socket opened. */
  readonly forceRefresh: boolean;
}

/** The URL to dial for one attempt: a fixed string, or asked before every attempt. */
export type UrlProvider = string | ((context: AttemptContext) => string | Promise<string>);

/**
 * A token for one attempt (null: connect without one). Called before EVERY attempt; cache inside
 * if you like, but honour `forceRefresh`.
 */
export type TokenProvider = (
  context: AttemptContext,
) => string | null | undefined | Promise<string | null | undefined>;

/** Where the token goes in the handshake. */
export type TokenTransport = 'subprotocol' | 'query';

/** The part of the browser's WebSocket the client uses (tests pass a fake). */
export type WebSocketLike = Pick<
  WebSocket,
  'readyState' | 'send' | 'close' | 'onopen' | 'onmessage' | 'onclose' | 'onerror'
>;

export type WebSocketFactory = (url: string, protocols: string[]) => WebSocketLike;

export interface StreamFleetClientOptions {
  /** The failover name (or a function resolving it before every attempt). */
  url: UrlProvider;
  /** Called before every attempt; see {@link TokenProvider}. */
  token?: TokenProvider;
  /** `subprotocol` (default: `streamfleet.v1, bearer.<jwt>`, kept out of URLs and logs) or `query`. */
  tokenTransport?: TokenTransport;
  /** A heartbeat goes after this long without a proof of life (a `pong` or a reply other than
   * an error). Default 20 000 ms. */
  heartbeatIntervalMs?: number;
  /** How long a heartbeat waits for its `pong`. Default 10 000 ms. */
  heartbeatTimeoutMs?: number;
  /** Unanswered heartbeats (each sent when the previous times out) before the connection is
   * dropped. Default 1: a dead connection is noticed within 20 + 1 * 10 = 30 s. */
  missedPongsBeforeReconnect?: number;
  /**
   * The connection is replaced (make before break) at a random age between 90 % and 100 % of
   * this, ahead of API Gateway's 2-hour limit. Default 6 600 000 ms (110 min); `null`: never.
   */
  maxConnectionAgeMs?: number | null;
  /**
   * `send()` and `request()` while not ready: 0 (the default) refuses them with
   * {@link NotConnectedError}; above 0, up to this many wait and go in order once the next
   * connection's state is restored (more: {@link SendQueueFullError}).
   */
  sendQueueSize?: number;
  /** Default 2 000 ms. */
  backoffBaseMs?: number;
  /** Default 20 000 ms. */
  backoffCapMs?: number;
  /**
   * Replaces the backoff formula: the delay (ms) before retry number `attempt` (0-based).
   * Default: `random() * min(backoffBaseMs * 2**attempt, backoffCapMs)`.
   */
  reconnectInterval?: (attempt: number) => number;
  /** A socket that has not opened after this long counts as a failed attempt. Default 10 000 ms. */
  openTimeoutMs?: number;
  /**
   * A connection resets the backoff only once its state was restored and it stayed open this
   * long, so a server that answers and then closes is backed off from. Default 10 000 ms.
   */
  minHealthyMs?: number;
  /** Default per-request timeout. Default 10 000 ms. */
  requestTimeoutMs?: number;
  /** Extra fields of the `getState` sent after every connect, e.g. `{auction: 'a1'}`. */
  getStateFields?: Record<string, unknown> | (() => Record<string, unknown>);
  /** Frames above this many bytes are refused locally. At most (and default) 32 768. */
  maxFrameBytes?: number;
  /** Prefix of request ids (at most 40 characters). Default `web`. */
  name?: string;
  /** Default: `new WebSocket(url, protocols)`. */
  webSocket?: WebSocketFactory;
  /** Default `Math.random`. */
  random?: () => number;
  /** Default: the global timers and `Date.now`. */
  timers?: Timers;
  /** How long a gap in a subscribed stream may stay open before the stored log is asked. Default 2 000 ms. */
  gapTimeoutMs?: number;
  /**
   * How long a subscribed stream may stay quiet before it asks where its log ends (doubling, up
   * to 16 times, while nothing new comes): the only way to learn of a lost last post. Default
   * 60 000 ms; `null`: never.
   */
  quietTimeoutMs?: number | null;
  /** The bound of each subscribed stream's reorder buffer. Default 10 000 messages. */
  maxBufferedPerStream?: number;
  /** Subscribe to the streams the server's state lists for the user. Default true. */
  followServerSubscriptions?: boolean;
  /** Where positions are kept. Default: in memory ({@link storagePositions} keeps them across reloads). */
  positions?: PositionStore;
  /**
   * Where the browser says the network or the page is back: `online` on `window` and
   * `visibilitychange` on `document`. While backing off, either ends the wait and the client
   * connects at once. Default: the global `window` and `document` when there are any; `null`:
   * never.
   */
  wakeSignals?: WakeSignals | null;
}

/** The event targets {@link StreamFleetClientOptions.wakeSignals} listens on. */
export interface WakeSignals {
  window?: Pick<EventTarget, 'addEventListener' | 'removeEventListener'>;
  document?: Pick<EventTarget, 'addEventListener' | 'removeEventListener'> & {
    visibilityState?: string;
  };
}

export interface RequestOptions {
  timeoutMs?: number;
}

/** Why a connection ended. */
export interface DisconnectInfo {
  code: number | null;
  reason: string;
  /** The socket had opened. */
  opened: boolean;
  /** Its `getState` had been answered (the backoff restarts from zero). */
  healthy: boolean;
  /** The client dropped it (missed pongs, open timeout, `reconnect()`). */
  forced: boolean;
}

/** Everything an application shows about the connection, in one object. */
export interface ClientSnapshot {
  status: ConnectionStatus;
  /** Open, and this connection's `getState` reply has arrived. */
  ready: boolean;
  /** The region that served the last reply (`null` before the first). */
  region: string | null;
  /** The reconnect attempt in progress or scheduled; 0 while healthy. */
  reconnectAttempt: number;
  /** Connection attempts since start. */
  attempts: number;
  /** Connections that opened. */
  connections: number;
  /** Connections dropped because heartbeats went unanswered. */
  forcedReconnects: number;
  /** The last backoff delay, in ms. */
  lastDelayMs: number | null;
  /** When the scheduled attempt starts (`timers.now()` clock), while backing off. */
  nextAttemptAt: number | null;
  /** The last `getState` reply. */
  state: StateReply | null;
  /** Messages from the server skipped: binary, or over `MAX_MESSAGE_BYTES`. */
  framesSkipped: number;
}

export interface ClientEvents {
  status: (status: ConnectionStatus, previous: ConnectionStatus) => void;
  region: (region: string, previous: string | null) => void;
  /** Every `state` reply (the one after each connect included). */
  state: (reply: StateReply) => void;
  /** This connection's state is restored. */
  ready: (reply: StateReply) => void;
  /** Every JSON reply. */
  message: (reply: Reply) => void;
  pong: () => void;
  disconnect: (info: DisconnectInfo) => void;
  /** A retry was scheduled. */
  reconnecting: (info: { attempt: number; delayMs: number }) => void;
  /** An attempt failed before any socket existed (a provider threw, a bad URL). */
  error: (error: unknown) => void;
  /** Anything in the snapshot changed. */
  change: (snapshot: ClientSnapshot) => void;
  /** A subscribed stream's next message: exactly once, in seq order, no gap. */
  streamMessage: (message: StreamMessage) => void;
  /** A subscribed stream went on in a newer epoch (its upstream restarted its numbering): told
   * before the new epoch's first message. */
  streamEpoch: (change: EpochChange) => void;
  /** Seqs of a subscribed stream the log will never hold (expired, or never sent): told
   * before what follows them. */
  streamSkip: (skip: Skip) => void;
  /** A subscribe was answered (the replay of `reply.replayed` messages follows). */
  subscribed: (reply: SubscribedReply) => void;
  /** The server refused a subscribe; the stream is not subscribed any more. */
  subscriptionError: (error: SubscriptionRefusedError) => void;
}

type TimerName =
  'retryTimer' | 'openTimer' | 'heartbeatTimer' | 'gapTimer' | 'stateTimer' | 'rotateTimer' | 'retireTimer';

type Listeners = { [E in keyof ClientEvents]: Set<ClientEvents[E]> };

interface Pending {
  resolve: (reply: Reply) => void;
  reject: (error: Error) => void;
  timer: unknown;
}

const MAX_NAME_CHARS = 40;
const SOCKET_CLOSING = 2;
// 4000-4999 are for applications; the server never sees it on a dead connection anyway.
const CLOSE_FORCED = 4000;
const CLOSE_NORMAL = 1000;

function nonNegativeMs(name: string, value: number | undefined, fallback: number): number {
  const ms = value ?? fallback;
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
    throw new RangeError(
      `StreamFleetClient: ${name} must be a finite number of milliseconds, zero or more, got ${String(value)}`,
    );
  }
  return ms;
}

function whole(name: string, value: number, least: number): number {
  if (!Number.isInteger(value) || value < least) {
    throw new RangeError(
      `StreamFleetClient: ${name} must be a whole number >= ${least}, got ${String(value)}`,
    );
  }
  return value;
}

function positiveMs(name: string, value: number | undefined, fallback: number): number {
  const ms = value ?? fallback;
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms <= 0) {
    throw new RangeError(
      `StreamFleetClient: ${name} must be a finite number of milliseconds above zero, got ${String(value)}`,
    );
  }
  return ms;
}

/** The browser's `window` and `document`, where there are any (not in Node or a worker). */
function browserSignals(): WakeSignals | null {
  const scope = globalThis as { window?: WakeSignals['window']; document?: WakeSignals['document'] };
  return scope.window === undefined ? null : { window: scope.window, document: scope.document };
}

function defaultWebSocket(url: string, protocols: string[]): WebSocketLike {
  if (typeof globalThis.WebSocket !== 'function') {
    throw new StreamFleetError('no WebSocket implementation here: pass options.webSocket');
  }
  return new globalThis.WebSocket(url, protocols);
}

/** The URL and subprotocols of one handshake. */
export function handshake(
  url: string,
  token: string | null | undefined,
  transport: TokenTransport = 'subprotocol',
): { url: string; protocols: string[] } {
  const protocols = [APP_SUBPROTOCOL];
  if (token === null || token === undefined || token === '') {
    return { url, protocols };
  }
  if (transport === 'subprotocol') {
    return { url, protocols: [...protocols, BEARER_SUBPROTOCOL_PREFIX + token] };
  }
  const parsed = new URL(url);
  parsed.searchParams.set(TOKEN_QUERY_PARAMETER, token);
  return { url: parsed.toString(), protocols };
}

export class StreamFleetClient {
  readonly name: string;
  readonly #options: Required<
    Pick<
      StreamFleetClientOptions,
      | 'heartbeatIntervalMs'
      | 'heartbeatTimeoutMs'
      | 'missedPongsBeforeReconnect'
      | 'backoffBaseMs'
      | 'backoffCapMs'
      | 'openTimeoutMs'
      | 'minHealthyMs'
      | 'requestTimeoutMs'
      | 'sendQueueSize'
      | 'maxFrameBytes'
      | 'tokenTransport'
    >
  >;
  readonly #urlProvider: UrlProvider;
  readonly #tokenProvider: TokenProvider | undefined;
  readonly #getStateFields: StreamFleetClientOptions['getStateFields'];
  readonly #customInterval: ((attempt: number) => number) | undefined;
  readonly #createSocket: WebSocketFactory;
  readonly #random: () => number;
  readonly #timers: Timers;
  readonly #listeners: Listeners = {
    status: new Set(),
    region: new Set(),
    state: new Set(),
    ready: new Set(),
    message: new Set(),
    pong: new Set(),
    disconnect: new Set(),
    reconnecting: new Set(),
    error: new Set(),
    change: new Set(),
    streamMessage: new Set(),
    streamEpoch: new Set(),
    streamSkip: new Set(),
    subscribed: new Set(),
    subscriptionError: new Set(),
  };
  readonly #gapTimeoutMs: number;
  readonly #maxConnectionAgeMs: number | null;
  /** What `send()` and `request()` gave while not ready (`sendQueueSize` > 0), oldest first. */
  readonly #queue: { frame: string; id?: string }[] = [];
  readonly #quietTimeoutMs: number | null;
  readonly #maxBufferedPerStream: number;
  readonly #followServerSubscriptions: boolean;
  readonly #positions: PositionStore;
  readonly #cursors = new Map<string, StreamCursor>();
  private gapTimer: unknown = null;

  #_status: ConnectionStatus = 'idle';
  #_region: string | null = null;
  #_state: StateReply | null = null;
  #_ready = false;
  #attempts = 0;
  #connections = 0;
  #forcedReconnects = 0;
  #lastDelayMs: number | null = null;
  #nextAttemptAt: number | null = null;

  #started = false;
  readonly #wakeSignals: WakeSignals | null;
  readonly #onOnline = (): void => this.#wake();
  readonly #onVisibility = (): void => {
    if (this.#wakeSignals?.document?.visibilityState === 'visible') this.#wake();
  };
  #closing = false;
  /** Increases with every attempt (and on close): callbacks of older attempts are ignored. */
  #generation = 0;
  /** Consecutive attempts that did not give a healthy connection. */
  #failures = 0;
  #failedBeforeOpen = false;
  /** The server said the token expired: the next attempt asks the provider for a fresh one. */
  #tokenExpired = false;
  #ws: WebSocketLike | null = null;
  #opened = false;
  #framesSkipped = 0;
  /** When the current connection opened (the timers' clock). */
  #openedAt = 0;
  #healthy = false;
  #stateRequestId: string | null = null;
  /** getState attempts on this connection; its timer sends it again when unanswered. */
  #stateAttempts = 0;
  private stateTimer: unknown = null;
  /** Streams the application unsubscribed from (never followed from getState again), and
   * those the server has not acknowledged yet (told again on every connection). */
  readonly #unsubscribed = new Set<string>();
  readonly #pendingUnsubscribes = new Set<string>();
  #ids = 0;
  readonly #pending = new Map<string, Pending>();
  private retryTimer: unknown = null;
  private openTimer: unknown = null;
  private heartbeatTimer: unknown = null;
  private rotateTimer: unknown = null;
  private retireTimer: unknown = null;
  /** The connection that will take over from this one (rotation), until it does. */
  #successor: WebSocketLike | null = null;
  /** The connection a rotation replaced, kept open a little for its replies. */
  #retiring: WebSocketLike | null = null;
  /** The last proof of life on this connection: its opening, a `pong`, or a reply of ours. */
  #heardAt = 0;
  /** When the unanswered heartbeat was sent (null: none is). */
  #pingAt: number | null = null;
  #missed = 0;
  #lastPongAt = -Infinity;

  constructor(options: StreamFleetClientOptions) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('StreamFleetClient: options must be an object');
    }
    if (typeof options.url !== 'string' && typeof options.url !== 'function') {
      throw new TypeError('StreamFleetClient: url must be a string or a function');
    }
    if (options.token !== undefined && typeof options.token !== 'function') {
      throw new TypeError('StreamFleetClient: token must be a function (the token provider)');
    }
    const transport = options.tokenTransport ?? 'subprotocol';
    if (transport !== 'subprotocol' && transport !== 'query') {
      throw new RangeError(
        `StreamFleetClient: tokenTransport must be 'subprotocol' or 'query', got ${String(transport)}`,
      );
    }
    const missed = whole('missedPongsBeforeReconnect', options.missedPongsBeforeReconnect ?? 1, 1);
    const maxFrameBytes = options.maxFrameBytes ?? MAX_FRAME_BYTES;
    if (!Number.isInteger(maxFrameBytes) || maxFrameBytes < 1 || maxFrameBytes > MAX_FRAME_BYTES) {
      throw new RangeError(
        `StreamFleetClient: maxFrameBytes must be a whole number from 1 to ${MAX_FRAME_BYTES} (API Gateway's frame limit), got ${String(maxFrameBytes)}`,
      );
    }
    const name = options.name ?? 'web';
    if (typeof name !== 'string' || name.length === 0 || name.length > MAX_NAME_CHARS) {
      throw new RangeError(
        `StreamFleetClient: name must be 1 to ${MAX_NAME_CHARS} characters (it prefixes request ids of at most ${MAX_REQUEST_ID_CHARS})`,
      );
    }
    this.#options = {
      heartbeatIntervalMs: positiveMs('heartbeatIntervalMs', options.heartbeatIntervalMs, 20000),
      heartbeatTimeoutMs: positiveMs('heartbeatTimeoutMs', options.heartbeatTimeoutMs, 10000),
      missedPongsBeforeReconnect: missed,
      backoffBaseMs: positiveMs('backoffBaseMs', options.backoffBaseMs, DEFAULT_BACKOFF_BASE_MS),
      backoffCapMs: positiveMs('backoffCapMs', options.backoffCapMs, DEFAULT_BACKOFF_CAP_MS),
      openTimeoutMs: positiveMs('openTimeoutMs', options.openTimeoutMs, 10000),
      minHealthyMs: nonNegativeMs('minHealthyMs', options.minHealthyMs, 10000),
      requestTimeoutMs: positiveMs('requestTimeoutMs', options.requestTimeoutMs, 10000),
      sendQueueSize: whole('sendQueueSize', options.sendQueueSize ?? 0, 0),
      maxFrameBytes,
      tokenTransport: transport,
    };
    this.#maxConnectionAgeMs =
      options.maxConnectionAgeMs === null
        ? null
        : positiveMs('maxConnectionAgeMs', options.maxConnectionAgeMs, 6_600_000);
    this.name = name;
    this.#urlProvider = options.url;
    this.#tokenProvider = options.token;
    this.#getStateFields = options.getStateFields;
    this.#customInterval = options.reconnectInterval;
    this.#createSocket = options.webSocket ?? defaultWebSocket;
    this.#random = options.random ?? Math.random;
    this.#timers = options.timers ?? globalTimers;
    this.#wakeSignals = options.wakeSignals === undefined ? browserSignals() : options.wakeSignals;
    this.#gapTimeoutMs = positiveMs('gapTimeoutMs', options.gapTimeoutMs, DEFAULT_GAP_TIMEOUT_MS);
    this.#quietTimeoutMs =
      options.quietTimeoutMs === null
        ? null
        : positiveMs('quietTimeoutMs', options.quietTimeoutMs, DEFAULT_QUIET_TIMEOUT_MS);
    if (this.#quietTimeoutMs !== null && this.#quietTimeoutMs < this.#gapTimeoutMs) {
      throw new RangeError('StreamFleetClient: quietTimeoutMs must be at least gapTimeoutMs, or null');
    }
    this.#maxBufferedPerStream = whole(
      'maxBufferedPerStream',
      options.maxBufferedPerStream ?? DEFAULT_MAX_BUFFERED,
      1,
    );
    this.#followServerSubscriptions = options.followServerSubscriptions ?? true;
    this.#positions = options.positions ?? memoryPositions();
  }

  // --- What the application sees ----------------------------------------------------------

  get status(): ConnectionStatus {
    return this.#_status;
  }

  get region(): string | null {
    return this.#_region;
  }

  get state(): StateReply | null {
    return this.#_state;
  }

  get ready(): boolean {
    return this.#_ready;
  }

  snapshot(): ClientSnapshot {
    return {
      status: this.#_status,
      ready: this.#_ready,
      region: this.#_region,
      reconnectAttempt: this.#healthy ? 0 : this.#failures,
      attempts: this.#attempts,
      connections: this.#connections,
      forcedReconnects: this.#forcedReconnects,
      lastDelayMs: this.#lastDelayMs,
      nextAttemptAt: this.#nextAttemptAt,
      framesSkipped: this.#framesSkipped,
      state: this.#_state,
    };
  }

  /** Subscribe; returns the function that unsubscribes. */
  on<E extends keyof ClientEvents>(event: E, listener: ClientEvents[E]): () => void {
    const set = this.#listeners[event] as Set<ClientEvents[E]>;
    set.add(listener);
    return () => set.delete(listener);
  }

  // --- Lifecycle --------------------------------------------------------------------------

  /** Start connecting (idempotent). */
  start(): this {
    if (this.#closing) {
      throw new ClientClosedError('client closed: create a new one');
    }
    if (!this.#started) {
      this.#started = true;
      this.#wakeSignals?.window?.addEventListener('online', this.#onOnline);
      this.#wakeSignals?.document?.addEventListener('visibilitychange', this.#onVisibility);
      void this.#attempt();
    }
    return this;
  }

  /** The network or the page is back: a wait before the next attempt ends now. */
  #wake(): void {
    if (this.retryTimer === null || this.#closing) return;
    this.#clearTimer('retryTimer');
    void this.#attempt();
  }

  /**
   * Stop reconnecting, close the connection, fail pending requests with
   * {@link ClientClosedError}, and leave no timer behind. Idempotent.
   */
  close(): void {
    if (this.#closing) return;
    this.#closing = true;
    this.#generation += 1;
    this.#wakeSignals?.window?.removeEventListener('online', this.#onOnline);
    this.#wakeSignals?.document?.removeEventListener('visibilitychange', this.#onVisibility);
    this.#clearTimer('retryTimer');
    this.#nextAttemptAt = null;
    const ws = this.#ws;
    this.#teardownSocket();
    this.#dropRetiring();
    if (ws !== null) closeQuietly(ws, CLOSE_NORMAL, 'client closed');
    // Queued messages are dropped: queued requests reject with the pending ones.
    this.#queue.length = 0;
    this.#failPending(new ClientClosedError('client closed'));
    this.#setStatus('closed');
  }

  /**
   * Drop the current connection and connect again after a short jittered pause (e.g. to
   * follow a fail-back; rotation ahead of API Gateway's 2-hour limit needs no call).
   */
  reconnect(): void {
    if (this.#ws !== null) {
      this.#endConnection(this.#generation, { code: null, reason: 'reconnect requested', forced: true });
    }
  }

  // --- Subscribed streams -----------------------------------------------------------------

  /** The streams subscribed here, with their positions (the last message delivered). */
  get subscriptions(): { stream: string; position: StreamPosition | null; buffered: number }[] {
    return [...this.#cursors.values()].map((c) => ({
      stream: c.stream,
      position: c.at,
      buffered: c.buffered,
    }));
  }

  /** The cursor of `stream` (its counters), if subscribed. */
  cursor(stream: string): StreamCursor | undefined {
    return this.#cursors.get(stream);
  }

  /** The position of the last message of `stream` delivered to the application. */
  position(stream: string): StreamPosition | null {
    return this.#cursors.get(stream)?.at ?? this.#positions.get(stream) ?? null;
  }

  /**
   * Receive `stream`: its stored messages after `after` (default: the saved position, else the
   * newest few), then live ones, through the `streamMessage` event. Connected: resolves with
   * the `subscribed` reply, or rejects with {@link SubscriptionRefusedError} (the stream is then
   * not subscribed). Not connected: resolves with null; the subscribe goes with the next
   * connection, as after every reconnect.
   */
  async subscribe(
    stream: string,
    options: { after?: StreamPosition | number | null } = {},
  ): Promise<SubscribedReply | null> {
    if (typeof stream !== 'string' || stream.length === 0) {
      throw new RangeError('stream: expected a non-empty string');
    }
    const given = options.after ?? null;
    const after = typeof given === 'number' ? { epoch: 0, seq: given } : given;
    if (after !== null && !validPosition(after)) {
      throw new RangeError(
        `after: expected a seq, an {epoch, seq} (whole numbers >= 0) or null, got ${JSON.stringify(given)}`,
      );
    }
    this.#unsubscribed.delete(stream); // the application asks for it again
    this.#pendingUnsubscribes.delete(stream);
    let cursor = this.#cursors.get(stream);
    if (cursor === undefined) {
      cursor = new StreamCursor(
        stream,
        after ?? this.#positions.get(stream) ?? null,
        this.#maxBufferedPerStream,
      );
      this.#cursors.set(stream, cursor);
    } else if (after !== null && (cursor.at === null || comparePositions(after, cursor.at) > 0)) {
      cursor.moveTo(after);
    }
    if (this.#ws === null || !this.#opened) return null;
    this.#ensureGapCheck();
    return this.#sendSubscribe(cursor, true);
  }

  /** Stop receiving `stream`: here at once, and on the server as soon as it can be told
   * (remembered until it acknowledges; never followed from getState again). */
  async unsubscribe(stream: string): Promise<void> {
    this.#cursors.delete(stream);
    this.#unsubscribed.add(stream);
    this.#pendingUnsubscribes.add(stream);
    if (this.#ws === null || !this.#opened) return;
    await this.#sendUnsubscribe(stream);
  }

  async #sendUnsubscribe(stream: string): Promise<void> {
    try {
      const reply = await this.#exchange({ action: ROUTE_UNSUBSCRIBE, stream }, {}, false);
      if (reply.type === 'unsubscribed') this.#pendingUnsubscribes.delete(stream);
    } catch {
      // Not connected any more: told again with the next connection.
    }
  }

  async #sendSubscribe(cursor: StreamCursor, raiseRefusal = false): Promise<SubscribedReply | null> {
    cursor.inFlight = true;
    let reply: Reply;
    try {
      cursor.requestId = this.#peekNextId();
      reply = await this.#exchange(
        { action: ROUTE_SUBSCRIBE, stream: cursor.stream, after: cursor.position, afterEpoch: cursor.epoch },
        {},
        false,
      );
    } catch {
      cursor.inFlight = false;
      cursor.retryLater(this.#timers.now()); // or the next connection subscribes again
      return null;
    }
    cursor.inFlight = false;
    if (isErrorReply(reply)) {
      if (FINAL_SUBSCRIBE_ERRORS.has(reply.error)) {
        if (this.#cursors.get(cursor.stream) === cursor) this.#cursors.delete(cursor.stream);
        const refusal = new SubscriptionRefusedError(cursor.stream, reply);
        this.#emit('subscriptionError', refusal);
        if (raiseRefusal) throw refusal;
        return null;
      }
      cursor.retryLater(this.#timers.now());
      return null;
    }
    return reply as SubscribedReply;
  }

  #onStreamFrame(reply: Reply): void {
    const stream = typeof reply.stream === 'string' ? reply.stream : '';
    const cursor = this.#cursors.get(stream);
    if (cursor === undefined) return; // unsubscribed, or never asked for
    const now = this.#timers.now();
    // A `subscribed` that does not answer this cursor's own subscribe moves nothing.
    if (reply.type === 'subscribed' && reply.requestId !== cursor.requestId) return;
    const ready =
      reply.type === 'subscribed'
        ? cursor.onSubscribed(reply as SubscribedReply, now)
        : cursor.onFrame(reply as MessagesFrame, now);
    if (reply.type === 'subscribed') this.#emit('subscribed', reply as SubscribedReply);
    const change = cursor.takeEpochChange();
    const skip = cursor.takeSkip();
    const at = cursor.at;
    // Kept at once: a later cursor (a resubscribe, a reload) must not be told again.
    if ((change !== null || skip !== null) && at !== null) this.#positions.set(cursor.stream, at);
    if (change !== null) this.#emit('streamEpoch', change);
    if (skip !== null) this.#emit('streamSkip', skip);
    for (const message of ready) {
      this.#positions.set(message.stream, { epoch: message.epoch, seq: message.seq });
      this.#emit('streamMessage', message);
    }
  }

  #resubscribeAll(): void {
    for (const cursor of this.#cursors.values()) {
      cursor.acknowledged = false;
      void this.#sendSubscribe(cursor);
    }
  }

  #followSubscriptions(state: StateReply): void {
    if (!this.#followServerSubscriptions || !Array.isArray(state.subscriptions)) return;
    for (const stream of state.subscriptions) {
      if (typeof stream !== 'string' || this.#cursors.has(stream) || this.#unsubscribed.has(stream)) continue;
      const cursor = new StreamCursor(
        stream,
        this.#positions.get(stream) ?? null,
        this.#maxBufferedPerStream,
      );
      this.#cursors.set(stream, cursor);
      void this.#sendSubscribe(cursor);
    }
    this.#ensureGapCheck();
  }

  /** Watch the subscriptions' gaps while connected and subscribed (no timer otherwise). */
  #ensureGapCheck(): void {
    if (this.gapTimer === null && this.#cursors.size > 0 && this.#opened) {
      this.#scheduleGapCheck(this.#generation);
    }
  }

  #scheduleGapCheck(generation: number): void {
    const interval = Math.min(this.#gapTimeoutMs / 4, 500);
    this.gapTimer = this.#timers.setTimeout(() => {
      this.gapTimer = null;
      if (generation !== this.#generation || this.#cursors.size === 0) return;
      const now = this.#timers.now();
      for (const cursor of this.#cursors.values()) {
        const reason = cursor.resubscribeReason(now, this.#gapTimeoutMs, this.#quietTimeoutMs);
        if (reason !== null) {
          cursor.countResubscribe(reason, now);
          void this.#sendSubscribe(cursor);
        }
      }
      this.#scheduleGapCheck(generation);
    }, interval);
  }

  // --- Sending ----------------------------------------------------------------------------

  /**
   * Send one message without waiting for a reply. Throws {@link FrameTooLargeError} for a frame
   * over the limit; while not ready, {@link NotConnectedError} (or, with `sendQueueSize`, queues
   * it: {@link SendQueueFullError} when full).
   */
  send(message: ClientMessage): void {
    const frame = this.#encode(message);
    if (this.#queueing()) this.#enqueue(frame);
    else this.#openSocket().send(frame);
  }

  /**
   * Send `message` with a fresh `requestId` and resolve with the reply that echoes it (of any
   * type, errors included). Rejects with {@link NotConnectedError} (or queues it, see `send()`;
   * its timeout runs while it waits, and one that times out is never sent),
   * {@link FrameTooLargeError}, {@link RequestTimeoutError}, or {@link ConnectionLostError} if
   * the connection ends first (the request may or may not have been applied).
   */
  request(message: ClientMessage, options: RequestOptions = {}): Promise<Reply> {
    return this.#exchange(message, options, true);
  }

  #exchange(message: ClientMessage, options: RequestOptions, mayQueue: boolean): Promise<Reply> {
    try {
      const timeoutMs = positiveMs('timeoutMs', options.timeoutMs, this.#options.requestTimeoutMs);
      const requestId = this.#nextId();
      const frame = this.#encode({ ...message, requestId });
      const ws = mayQueue && this.#queueing() ? this.#enqueue(frame, requestId) : this.#openSocket();
      return new Promise<Reply>((resolve, reject) => {
        const timer = this.#timers.setTimeout(() => {
          if (this.#pending.delete(requestId)) {
            this.#unqueue(requestId);
            reject(new RequestTimeoutError(requestId, timeoutMs));
          }
        }, timeoutMs);
        this.#pending.set(requestId, { resolve, reject, timer });
        try {
          ws?.send(frame);
        } catch (error) {
          this.#settle(requestId)?.reject(new NotConnectedError(`send failed: ${String(error)}`));
        }
      });
    } catch (error) {
      return Promise.reject(error instanceof Error ? error : new Error(String(error)));
    }
  }

  /** Whether what the application sends now waits: a queue is configured, and the state of a
   * connection is not restored, or older messages still wait (order is kept). */
  #queueing(): boolean {
    return this.#options.sendQueueSize > 0 && (!this.#_ready || this.#queue.length > 0);
  }

  #enqueue(frame: string, id?: string): null {
    if (this.#queue.length >= this.#options.sendQueueSize)
      throw new SendQueueFullError(this.#options.sendQueueSize);
    this.#queue.push({ frame, id });
    return null;
  }

  #unqueue(id: string): void {
    const index = this.#queue.findIndex((queued) => queued.id === id);
    if (index >= 0) this.#queue.splice(index, 1);
  }

  /** The queue, in order, on a connection whose state was just restored. */
  #flush(): void {
    try {
      while (this.#_ready && this.#queue.length > 0) {
        this.#ws!.send(this.#queue[0]!.frame);
        this.#queue.shift();
      }
    } catch {
      // The socket is failing: what is left waits for the next connection.
    }
  }

  /** `getState`; rejects with {@link ServerError} on an error reply. */
  async getState(fields: Record<string, unknown> = {}, options?: RequestOptions): Promise<StateReply> {
    const reply = await this.request({ ...fields, action: ROUTE_GET_STATE }, options);
    if (isErrorReply(reply)) throw new ServerError(reply);
    if (reply.type !== 'state') throw new StreamFleetError(`expected a state reply, got ${reply.type}`);
    return reply as StateReply;
  }

  /**
   * Bid `amount` on `auction`. Resolves with the server's verdict (`accepted`, `highest`);
   * rejects with {@link ServerError} on an error reply, `RangeError` for a bad argument.
   */
  async bid(auction: string, amount: number, options?: RequestOptions): Promise<BidReply> {
    if (typeof auction !== 'string' || auction.length === 0) {
      throw new RangeError('auction: expected a non-empty string');
    }
    if (!Number.isSafeInteger(amount) || amount < 1 || amount > MAX_BID_AMOUNT) {
      throw new RangeError(
        `amount: expected a whole number from 1 to ${MAX_BID_AMOUNT}, got ${String(amount)}`,
      );
    }
    const reply = await this.request({ action: ROUTE_BID, auction, amount }, options);
    if (isErrorReply(reply)) throw new ServerError(reply);
    if (reply.type !== 'bid') throw new StreamFleetError(`expected a bid reply, got ${reply.type}`);
    return reply as BidReply;
  }

  #encode(message: ClientMessage): string {
    if (this.#closing) throw new ClientClosedError('client closed');
    if (
      message === null ||
      typeof message !== 'object' ||
      typeof message.action !== 'string' ||
      message.action === ''
    ) {
      throw new TypeError('action: every message needs a non-empty string "action" (the route)');
    }
    const frame = JSON.stringify(message);
    const bytes = frameBytes(frame);
    if (bytes > this.#options.maxFrameBytes) {
      throw new FrameTooLargeError(bytes, this.#options.maxFrameBytes);
    }
    return frame;
  }

  #openSocket(): WebSocketLike {
    if (this.#closing) throw new ClientClosedError('client closed');
    if (this.#ws === null || !this.#opened) throw new NotConnectedError(`not connected (${this.#_status})`);
    return this.#ws;
  }

  #nextId(): string {
    this.#ids += 1;
    return `${this.name}-${this.#ids}`;
  }

  /** The id the next request() will carry (taken with no await in between). */
  #peekNextId(): string {
    return `${this.name}-${this.#ids + 1}`;
  }

  // --- The connection loop ----------------------------------------------------------------

  async #attempt(): Promise<void> {
    this.#generation += 1;
    const generation = this.#generation;
    const context: AttemptContext = {
      attempt: this.#failures,
      forceRefresh: this.#failedBeforeOpen || this.#tokenExpired,
    };
    this.#tokenExpired = false;
    this.#attempts += 1;
    this.#nextAttemptAt = null;
    this.#setStatus('connecting');
    let socket: WebSocketLike;
    try {
      socket = await this.#dial(context, generation);
    } catch (error) {
      if (generation !== this.#generation) return;
      this.#emit('error', error);
      this.#opened = false;
      this.#healthy = false;
      this.#endConnection(generation, {
        code: null,
        reason: `attempt failed: ${String(error)}`,
        forced: false,
      });
      return;
    }
    // Closed (or superseded) while the dial returned: the socket is nobody's.
    if (generation !== this.#generation) return closeQuietly(socket, CLOSE_NORMAL, 'closed');
    this.#ws = socket;
    this.#opened = false;
    this.#healthy = false;
    this.#wire(socket, generation);
    this.openTimer = this.#timers.setTimeout(() => {
      this.openTimer = null;
      if (generation === this.#generation && !this.#opened) {
        this.#endConnection(generation, { code: null, reason: 'open timed out', forced: true });
      }
    }, this.#options.openTimeoutMs);
  }

  /** A socket for `context`, from the URL and token providers; throws if `generation` ended
   * meanwhile (closed) or a provider failed. */
  async #dial(context: AttemptContext, generation: number): Promise<WebSocketLike> {
    const url = typeof this.#urlProvider === 'string' ? this.#urlProvider : await this.#urlProvider(context);
    const token = this.#tokenProvider === undefined ? null : await this.#tokenProvider(context);
    if (generation !== this.#generation) throw new ClientClosedError('superseded');
    if (typeof url !== 'string' || url === '') {
      throw new StreamFleetError(`url provider returned ${String(url)}, not a URL`);
    }
    if (token !== null && token !== undefined && typeof token !== 'string') {
      throw new StreamFleetError('token provider returned something other than a string');
    }
    const shake = handshake(url, token, this.#options.tokenTransport);
    return this.#createSocket(shake.url, shake.protocols);
  }

  #wire(socket: WebSocketLike, generation: number): void {
    socket.onopen = () => {
      if (generation === this.#generation) this.#onOpen(generation);
    };
    socket.onmessage = (event: MessageEvent) => {
      if (generation === this.#generation) this.#onMessage(generation, event.data);
    };
    socket.onclose = (event: CloseEvent) => {
      if (generation === this.#generation) {
        this.#endConnection(generation, { code: event.code, reason: event.reason, forced: false });
      }
    };
    socket.onerror = () => {
      // A close event follows every error event; the close decides.
    };
  }

  // --- Rotation: make before break --------------------------------------------------------

  #scheduleRotation(generation: number): void {
    const age = this.#maxConnectionAgeMs;
    if (age === null) return;
    // Jittered down to 90 %, so that the clients of a fleet that connected together (after a
    // failover) do not all rotate together.
    this.#later(
      'rotateTimer',
      generation,
      () => void this.#rotate(generation),
      age * (1 - this.#random() / 10),
    );
  }

  /**
   * Ahead of API Gateway's 2-hour limit: a successor connection takes over as soon as it opens,
   * without the status leaving `open` or `ready` turning false (make before break: a break
   * would show the application a disconnected and a connecting state, refuse its sends, and
   * lose live frames until the resubscribes' replays brought them back). A successor that does
   * not open leaves this connection in place and is tried again after `backoffCapMs`; at worst
   * the limit closes it and the reconnect rules apply.
   */
  async #rotate(generation: number): Promise<void> {
    let next: WebSocketLike | null = null;
    let failed = false;
    const fail = (): void => {
      if (failed) return;
      failed = true;
      if (next !== null) {
        if (this.#successor === next) this.#successor = null;
        detach(next);
        closeQuietly(next, CLOSE_NORMAL, 'rotation failed');
      }
      // Only for this connection: a later one has its own rotation timer.
      if (generation === this.#generation) {
        this.#later(
          'rotateTimer',
          generation,
          () => void this.#rotate(generation),
          this.#options.backoffCapMs,
        );
      }
    };
    this.#later('rotateTimer', generation, fail, this.#options.openTimeoutMs);
    try {
      next = await this.#dial({ attempt: 0, forceRefresh: false }, generation);
    } catch {
      return fail();
    }
    if (failed || generation !== this.#generation) return closeQuietly(next, CLOSE_NORMAL, 'rotation failed');
    const socket = (this.#successor = next);
    socket.onopen = () => {
      if (generation === this.#generation) this.#promote(socket);
    };
    socket.onclose = fail;
  }

  /** The successor takes over, its getState sent as on any connection; the old one stays open
   * `requestTimeoutMs` for the replies to requests sent on it (and its live frames: the cursors
   * drop what both deliver). `ready` stays true: the state it restored is the latest there is
   * until the successor's getState answers. */
  #promote(next: WebSocketLike): void {
    const old = this.#ws!;
    const ready = this.#_ready;
    this.#successor = null;
    this.#teardownSocket();
    this.#generation += 1;
    this.#dropRetiring();
    this.#retiring = old;
    old.onmessage = (event: MessageEvent) => this.#onMessage(-1, event.data);
    this.retireTimer = this.#timers.setTimeout(() => this.#dropRetiring(), this.#options.requestTimeoutMs);
    this.#ws = next;
    this.#wire(next, this.#generation);
    this.#_ready = ready;
    this.#onOpen(this.#generation);
  }

  #dropRetiring(): void {
    this.#clearTimer('retireTimer');
    const old = this.#retiring;
    this.#retiring = null;
    if (old !== null) {
      detach(old);
      closeQuietly(old, CLOSE_NORMAL, 'rotated');
    }
  }

  /** A timer of connection `generation`: it does nothing once the connection is over. */
  #later(which: 'rotateTimer', generation: number, callback: () => void, ms: number): void {
    this.#clearTimer(which);
    this[which] = this.#timers.setTimeout(() => {
      this[which] = null;
      if (generation === this.#generation) callback();
    }, ms);
  }

  #onOpen(generation: number): void {
    this.#clearTimer('openTimer');
    this.#opened = true;
    this.#openedAt = this.#timers.now();
    this.#connections += 1;
    this.#setStatus('open');
    this.#heardAt = this.#openedAt;
    this.#pingAt = null;
    this.#missed = 0;
    this.#lastPongAt = -Infinity;
    this.#stateAttempts = 0;
    if (!this.#sendStateRequest(generation)) return;
    this.#scheduleHeartbeat(generation);
    this.#scheduleRotation(generation);
    // Resume every subscription from the last seq delivered, without waiting for the state.
    this.#resubscribeAll();
    for (const stream of this.#pendingUnsubscribes) void this.#sendUnsubscribe(stream);
    this.#ensureGapCheck();
  }

  /** getState, sent again (with backoff) until answered: an error reply or none within the
   * request timeout; a connection that never answers it within STATE_ATTEMPTS is dropped. */
  #sendStateRequest(generation: number): boolean {
    this.#clearTimer('stateTimer');
    if (this.#stateAttempts >= STATE_ATTEMPTS) {
      this.#endConnection(generation, { code: null, reason: 'getState never answered', forced: true });
      return false;
    }
    this.#stateAttempts += 1;
    this.#stateRequestId = `${this.name}-state-${++this.#ids}`;
    const fields = typeof this.#getStateFields === 'function' ? this.#getStateFields() : this.#getStateFields;
    try {
      this.#ws?.send(JSON.stringify({ ...fields, action: ROUTE_GET_STATE, requestId: this.#stateRequestId }));
    } catch (error) {
      this.#endConnection(generation, {
        code: null,
        reason: `getState failed: ${String(error)}`,
        forced: true,
      });
      return false;
    }
    this.stateTimer = this.#timers.setTimeout(() => {
      this.stateTimer = null;
      if (generation === this.#generation && !this.#_ready) this.#retryStateRequest(generation);
    }, this.#options.requestTimeoutMs);
    return true;
  }

  #retryStateRequest(generation: number): void {
    this.#clearTimer('stateTimer');
    const delay = fullJitterBackoff(
      this.#stateAttempts - 1,
      this.#random,
      this.#options.backoffBaseMs,
      this.#options.backoffCapMs,
    );
    this.stateTimer = this.#timers.setTimeout(() => {
      this.stateTimer = null;
      if (generation === this.#generation && !this.#_ready) this.#sendStateRequest(generation);
    }, delay);
  }

  #onMessage(generation: number, data: unknown): void {
    // The API sends text of at most MAX_MESSAGE_BYTES: anything else is skipped and counted.
    if (
      typeof data !== 'string' ||
      (data.length * 3 > MAX_MESSAGE_BYTES && frameBytes(data) > MAX_MESSAGE_BYTES)
    ) {
      this.#framesSkipped += 1;
      this.#emitChange();
      return;
    }
    const text = data;
    const current = generation === this.#generation;
    if (text === PONG_FRAME) {
      if (current) this.#lastPongAt = this.#heardAt = this.#timers.now();
      this.#emit('pong');
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      return; // not ours to interpret
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return;
    const reply = parsed as Reply;
    // A reply of ours proves the connection alive; API Gateway's error frames (no `type`: what a
    // throttled Region answers) and our error replies prove nothing.
    if (current && typeof reply.type === 'string' && !isErrorReply(reply)) this.#heardAt = this.#timers.now();
    let changed = false;
    // A connection a rotation retired still answers its requests, but it no longer says where
    // the client is nor what its state is.
    if (current && typeof reply.region === 'string' && reply.region !== this.#_region) {
      const previous = this.#_region;
      this.#_region = reply.region;
      this.#emit('region', reply.region, previous);
      changed = true;
    }
    // Before the reply's promise resolves: an awaiting subscribe() finds the cursor positioned.
    if (reply.type === 'messages' || reply.type === 'subscribed') this.#onStreamFrame(reply);
    const requestId = typeof reply.requestId === 'string' ? reply.requestId : null;
    if (requestId !== null) this.#settle(requestId)?.resolve(reply);
    if (current && reply.type === 'state') {
      const state = reply as StateReply;
      this.#_state = state;
      changed = true;
      if (requestId !== null && requestId === this.#stateRequestId) {
        this.#healthy = true;
        this.#_ready = true;
        this.#clearTimer('stateTimer');
        this.#failedBeforeOpen = false;
        this.#flush();
        this.#emit('ready', state);
        this.#followSubscriptions(state);
      }
      this.#emit('state', state);
    }
    this.#emit('message', reply);
    if (changed) this.#emitChange();
    if (isErrorReply(reply) && requestId !== null && requestId === this.#stateRequestId && !this.#_ready) {
      this.#retryStateRequest(generation); // unavailable, too large...: asked again
    }
    if (current && isErrorReply(reply) && reply.error === TOKEN_EXPIRED) {
      // The server serves nothing more on this connection: a new one, with a token asked for
      // anew, resubscribes every stream from its position.
      this.#tokenExpired = true;
      this.#endConnection(generation, { code: null, reason: 'the token expired', forced: true });
    }
  }

  #scheduleHeartbeat(generation: number): void {
    const { heartbeatIntervalMs, heartbeatTimeoutMs } = this.#options;
    const wake =
      this.#pingAt === null ? this.#heardAt + heartbeatIntervalMs : this.#pingAt + heartbeatTimeoutMs;
    this.heartbeatTimer = this.#timers.setTimeout(
      () => {
        this.heartbeatTimer = null;
        if (generation === this.#generation) this.#heartbeatTick(generation);
      },
      Math.max(0, wake - this.#timers.now()),
    );
  }

  /**
   * A heartbeat only after `heartbeatIntervalMs` without a proof of life (so a busy connection
   * sends none), answered only by `pong`. Unanswered within `heartbeatTimeoutMs`, another goes
   * at once; after `missedPongsBeforeReconnect` the connection is dropped: a silently dead
   * connection is noticed within interval + missed * timeout (30 s by default).
   */
  #heartbeatTick(generation: number): void {
    const now = this.#timers.now();
    if (this.#pingAt !== null && this.#lastPongAt >= this.#pingAt) {
      this.#pingAt = null;
      this.#missed = 0;
    }
    if (this.#pingAt !== null && now >= this.#pingAt + this.#options.heartbeatTimeoutMs) {
      this.#pingAt = null;
      if (++this.#missed >= this.#options.missedPongsBeforeReconnect) {
        this.#forcedReconnects += 1;
        this.#endConnection(generation, {
          code: null,
          reason: `heartbeats unanswered (${this.#missed})`,
          forced: true,
        });
        return;
      }
    }
    if (
      this.#pingAt === null &&
      (this.#missed > 0 || now >= this.#heardAt + this.#options.heartbeatIntervalMs)
    ) {
      try {
        this.#ws?.send(HEARTBEAT_FRAME);
      } catch (error) {
        this.#endConnection(generation, {
          code: null,
          reason: `heartbeat failed: ${String(error)}`,
          forced: true,
        });
        return;
      }
      this.#pingAt = now;
    }
    this.#scheduleHeartbeat(generation);
  }

  /** The connection (or attempt) `generation` is over: clean up, then back off and retry. */
  #endConnection(generation: number, info: { code: number | null; reason: string; forced: boolean }): void {
    if (generation !== this.#generation || this.#closing) return;
    const ws = this.#ws;
    const opened = this.#opened;
    const healthy = this.#healthy;
    const lasted = opened && this.#timers.now() - this.#openedAt >= this.#options.minHealthyMs;
    // Nothing of this connection may fire any more.
    this.#generation += 1;
    this.#teardownSocket();
    // Do not wait for a closing handshake a half-broken region may never finish.
    if (ws !== null) closeQuietly(ws, info.forced ? CLOSE_FORCED : CLOSE_NORMAL, info.reason);
    this.#failPending(new ConnectionLostError(`connection ended before the reply (${info.reason})`));
    this.#emit('disconnect', { ...info, opened, healthy });
    // One more failure unless the connection proved healthy and stayed so, so a server that
    // accepts and drops at once, or answers and then drops, still backs off exponentially; the
    // first retry after a healthy connection waits random() * base.
    this.#failures = Math.max(healthy && lasted ? 0 : this.#failures + 1, 1);
    this.#healthy = false;
    this.#failedBeforeOpen = !opened;
    this.#scheduleRetry();
  }

  #scheduleRetry(): void {
    const attempt = this.#failures - 1;
    let computed: unknown;
    try {
      computed = this.#customInterval
        ? this.#customInterval(attempt)
        : fullJitterBackoff(attempt, this.#random, this.#options.backoffBaseMs, this.#options.backoffCapMs);
    } catch (error) {
      computed = error;
    }
    let delay = this.#options.backoffCapMs;
    if (typeof computed === 'number' && Number.isFinite(computed) && computed >= 0) {
      delay = computed;
    } else {
      // A broken backoff function must not stop the reconnecting: wait the longest.
      console.warn(`StreamFleetClient: reconnectInterval gave ${String(computed)}; waiting backoffCapMs`);
    }
    this.#lastDelayMs = delay;
    this.#nextAttemptAt = this.#timers.now() + delay;
    this.#setStatus('backing-off');
    this.#emit('reconnecting', { attempt: this.#failures, delayMs: delay });
    this.retryTimer = this.#timers.setTimeout(() => {
      this.retryTimer = null;
      if (!this.#closing) void this.#attempt();
    }, delay);
  }

  #teardownSocket(): void {
    if (this.#ws !== null) detach(this.#ws);
    if (this.#successor !== null) {
      detach(this.#successor);
      closeQuietly(this.#successor, CLOSE_NORMAL, 'not needed');
      this.#successor = null;
    }
    this.#ws = null;
    this.#opened = false;
    this.#_ready = false;
    this.#stateRequestId = null;
    this.#clearTimer('openTimer');
    this.#clearTimer('heartbeatTimer');
    this.#clearTimer('gapTimer');
    this.#clearTimer('stateTimer');
    this.#clearTimer('rotateTimer');
    for (const cursor of this.#cursors.values()) cursor.inFlight = false;
  }

  #clearTimer(which: TimerName): void {
    if (this[which] !== null) {
      this.#timers.clearTimeout(this[which]);
      this[which] = null;
    }
  }

  #settle(requestId: string): Pending | undefined {
    const pending = this.#pending.get(requestId);
    if (pending === undefined) return undefined;
    this.#pending.delete(requestId);
    this.#timers.clearTimeout(pending.timer);
    return pending;
  }

  /** Rejects the requests sent (queued ones wait for the next connection). */
  #failPending(error: Error): void {
    for (const requestId of [...this.#pending.keys()]) {
      if (!this.#queue.some((queued) => queued.id === requestId)) this.#settle(requestId)?.reject(error);
    }
  }

  // --- Events -----------------------------------------------------------------------------

  #setStatus(status: ConnectionStatus): void {
    const previous = this.#_status;
    if (status === previous) return;
    this.#_status = status;
    this.#emit('status', status, previous);
    this.#emitChange();
  }

  #emitChange(): void {
    this.#emit('change', this.snapshot());
  }

  #emit<E extends keyof ClientEvents>(event: E, ...args: Parameters<ClientEvents[E]>): void {
    for (const listener of [...this.#listeners[event]]) {
      try {
        (listener as (...a: Parameters<ClientEvents[E]>) => void)(...args);
      } catch (error) {
        // A failing listener is the application's bug; it must not take the connection down.
        console.error(`StreamFleetClient: ${event} listener failed`, error);
      }
    }
  }
}

function detach(ws: WebSocketLike): void {
  ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
}

function closeQuietly(ws: WebSocketLike, code: number, reason: string): void {
  if (ws.readyState >= SOCKET_CLOSING) return;
  try {
    // The close reason is limited to 123 bytes.
    ws.close(code, reason.slice(0, 100));
  } catch {
    // Already closing, or a code the implementation refuses: the socket is abandoned anyway.
  }
}

function validPosition(position: StreamPosition): boolean {
  return (
    typeof position === 'object' &&
    Number.isSafeInteger(position.epoch) &&
    Number.isSafeInteger(position.seq) &&
    position.epoch >= 0 &&
    position.seq >= 0
  );
}
