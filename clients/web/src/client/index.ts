/** @streamfleet/web-client: the browser client of the StreamFleet WebSocket API. */
export {
  StreamFleetClient,
  handshake,
  memoryPositions,
  storagePositions,
  type PositionStore,
  type AttemptContext,
  type ClientEvents,
  type ClientSnapshot,
  type ConnectionStatus,
  type DisconnectInfo,
  type RequestOptions,
  type StreamFleetClientOptions,
  type TokenProvider,
  type TokenTransport,
  type UrlProvider,
  type WakeSignals,
  type WebSocketFactory,
  type WebSocketLike,
} from './client.js';
export { DEFAULT_BACKOFF_BASE_MS, DEFAULT_BACKOFF_CAP_MS, fullJitterBackoff } from './backoff.js';
export {
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
export {
  DEFAULT_GAP_TIMEOUT_MS,
  DEFAULT_QUIET_TIMEOUT_MS,
  DEFAULT_MAX_BUFFERED,
  MAX_PART_CHARS,
  MAX_PARTS,
  StreamCursor,
  type CursorStats,
  type ResubscribeReason,
} from './streams.js';
export * from './protocol.js';
export { globalTimers, type Timers } from './timers.js';
