/**
 * The wire protocol of the StreamFleet client-facing WebSocket API (API Gateway WebSocket API,
 * route selection on `$request.body.action`). The contract lives in the repository's
 * docs/protocol.md.
 */

/** The application subprotocol the server selects (never the token entry). */
export const APP_SUBPROTOCOL = 'streamfleet.v1';
/** Prefix of the subprotocol entry that carries the JWT: `bearer.<jwt>`. */
export const BEARER_SUBPROTOCOL_PREFIX = 'bearer.';
/** Query parameter that carries the JWT when the subprotocol transport is not used. */
export const TOKEN_QUERY_PARAMETER = 'token';

export const ROUTE_HEARTBEAT = 'heartbeat';
export const ROUTE_GET_STATE = 'getState';
export const ROUTE_BID = 'bid';
/** Live delivery of an ingested stream:
 * `{"action":"subscribe","stream":"<id>","after":<seq|null>,"afterEpoch":<epoch>}`. */
export const ROUTE_SUBSCRIBE = 'subscribe';
export const ROUTE_UNSUBSCRIBE = 'unsubscribe';

/** The heartbeat frame: exactly what a typical react-use-websocket configuration sends. */
export const HEARTBEAT_FRAME = JSON.stringify({ action: ROUTE_HEARTBEAT });
/** The server answers a heartbeat with this TEXT frame (four bytes, not JSON). */
export const PONG_FRAME = 'pong';

/**
 * API Gateway's limit per frame. A bigger frame makes API Gateway close the socket (1009) and
 * lose every reply in flight, so the client refuses to send one.
 */
export const MAX_FRAME_BYTES = 32 * 1024;
/** The most one message from the server holds (API Gateway's limit): a bigger one, or a binary
 * one, is skipped and counted, never a reason to reconnect (the Python client does the same). */
export const MAX_MESSAGE_BYTES = 128 * 1024;
/** The server refuses longer request ids. */
export const MAX_REQUEST_ID_CHARS = 64;
/** The server refuses bids outside 1..MAX_BID_AMOUNT (kept below 2**53 for JavaScript). */
export const MAX_BID_AMOUNT = 10 ** 15;

/** A message to the server: `action` selects the route. */
export interface ClientMessage {
  action: string;
  [field: string]: unknown;
}

/** Every reply other than `pong` is one JSON object naming its type and the serving region. */
export interface Reply {
  type: string;
  region?: string;
  requestId?: string;
  [field: string]: unknown;
}

export interface AuctionView {
  auction: string;
  highest: number;
  highestIsYou: boolean;
  bids: number;
  /** The Region whose replica decides every bid of this auction. */
  homeRegion?: string;
  /** Read from a replica other than the home's: it may lag by the replication lag. */
  stale?: boolean;
}

export interface UserState {
  lastBid: { auction: string; amount: number; atMs: number | null } | null;
  bidsAccepted: number;
  bidsRefused: number;
  updatedAtMs: number | null;
}

export interface StateReply extends Reply {
  type: 'state';
  user: string;
  state: UserState;
  auction?: AuctionView;
  /** The streams the user is subscribed to (server-side state, kept across reconnects). */
  subscriptions?: string[];
}

/** A place in a stream's log: `seq` counted in `epoch`; ordered epoch first. */
export interface StreamPosition {
  epoch: number;
  seq: number;
}

/** Compares two positions: negative, zero or positive as `a` comes before, at or after `b`. */
export function comparePositions(a: StreamPosition, b: StreamPosition): number {
  return a.epoch !== b.epoch ? a.epoch - b.epoch : a.seq - b.seq;
}

/** Seqs `after + 1 .. to` of `epoch` will never be delivered: the log cannot hold them (expired,
 * or never sent). Told to the application (the `streamSkip` event) before what follows them. */
export interface Skip {
  stream: string;
  epoch: number;
  after: number;
  to: number;
}

/** The stream went on in a newer epoch: its seqs count from the upstream's again. Told to the
 * application (the `streamEpoch` event) before the new epoch's first message. */
export interface EpochChange {
  stream: string;
  epoch: number;
  previous: number;
}

/** The answer to `subscribe`; the replay's `messages` frames follow it. */
export interface SubscribedReply extends Reply {
  type: 'subscribed';
  stream: string;
  /** Where the replay starts (seqs above it follow); null: the stream has stored nothing yet. */
  after: number | null;
  /** The epoch `after` counts in (absent from servers before epochs: 0). */
  afterEpoch?: number | null;
  /** How many messages the replay frames carry. */
  replayed: number;
  /** The last replayed seq (`after` when nothing was replayed). */
  upTo: number | null;
  /** The epoch `upTo` counts in. */
  upToEpoch?: number | null;
  /** The replay was cut at its budget: subscribe again from where you got to. */
  more: boolean;
  /** Seqs below the oldest kept message that expired with the table's TTL. */
  skipped?: number;
}

/** One entry of a `messages` frame; a message over one frame comes in `parts`. */
export interface StreamEntry {
  seq: number;
  /** The epoch `seq` counts in: a new one each time the upstream restarted its numbering. */
  epoch?: number;
  data: string;
  /** `json`: `data` is the exact JSON text of a value the upstream sent, not a string. */
  format?: string;
  /** When the fleet's worker received it from the upstream (epoch ms). */
  at?: number;
  part?: number;
  parts?: number;
}

/** Several messages of one stream, in seq order, within one frame. */
export interface MessagesFrame extends Reply {
  type: 'messages';
  stream: string;
  /** `replay` (the stored log, after a subscribe) or `live` (the fan-out). */
  source: string;
  messages: StreamEntry[];
}

/** A stream message as delivered to the application: exactly once, in seq order. */
export interface StreamMessage {
  stream: string;
  seq: number;
  /** The epoch `seq` counts in (0 until the upstream first restarted its numbering). */
  epoch: number;
  data: string;
  receivedAtMs: number | null;
  source: string;
  region: string | null;
  /** `data` is the exact JSON text of a value the upstream sent (parse it), not a string. */
  json: boolean;
}

export interface BidReply extends Reply {
  type: 'bid';
  auction: string;
  amount: number;
  accepted: boolean;
  highest: number;
  highestIsYou: boolean;
  reason?: string;
}

export interface ErrorReply extends Reply {
  type: 'error';
  /** A code or a description of what was wrong. */
  error: string;
  /** Human text naming the field, when the server gives one. */
  message?: string;
  /** The field at fault, when the server names one. */
  field?: string;
  /** True when the same request may succeed later (e.g. the state store did not answer). */
  retryable?: boolean;
}

export function isStateReply(reply: Reply): reply is StateReply {
  return reply.type === 'state';
}

export function isBidReply(reply: Reply): reply is BidReply {
  return reply.type === 'bid';
}

export function isErrorReply(reply: Reply): reply is ErrorReply {
  return reply.type === 'error';
}

const encoder = new TextEncoder();

/** Size of a text frame on the wire (UTF-8 bytes, which is what API Gateway counts). */
export function frameBytes(frame: string): number {
  return encoder.encode(frame).byteLength;
}
