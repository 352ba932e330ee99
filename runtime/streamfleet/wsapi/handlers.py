"""Lambda handlers of the client-facing WebSocket API (API Gateway WebSocket, Lambda proxy).

One function serves every route; the event names the route in ``requestContext.routeKey``:

* ``$connect`` (after the authorizer): stores ``WSCONN#<connection id>`` -> verified user id in
  the *regional* connections table, with a TTL (API Gateway's 2-hour connection limit plus a
  margin: ``$disconnect`` is best effort, the TTL cleans up what it misses); selects the
  ``streamfleet.v1`` subprotocol when the client offered it (never the ``bearer.`` entry);
* ``$disconnect``: deletes the connection record;
* ``heartbeat``: replies with the TEXT frame ``pong`` (those 4 bytes, not JSON, whatever else the
  request carried) without touching DynamoDB: it is sent every 30 s by every client, what it
  must prove is that API Gateway and Lambda answer, and a literal ``pong`` is what third-party
  heartbeat options match (react-use-websocket's ``returnMessage: 'pong'``);
* ``getState``: the user's state from the (global) state table, plus one auction's;
* ``bid``: ``{"action": "bid", "auction": "a1", "amount": 123}`` on a live auction counter. The
  bid is accepted only by a conditional write (``highest < amount``), so of two racing bids the
  lower one is refused, never silently overwritten; each accepted bid also leaves an immutable
  ``BID#<auction>#<amount>`` record;
* ``subscribe``: ``{"action": "subscribe", "stream": "<id>", "after": <seq or null>,
  "afterEpoch": <epoch, default 0>}``: live
  delivery of an ingested stream (the fleet's connection ``<id>``), allowed only to its readers
  (the START named them; :mod:`streamfleet.readers`; nobody by default). The connection is
  registered as a subscriber *first* (the Region's subscriptions table, read by the fan-out
  function), then the stored messages after ``after`` are replayed (``after`` null: the newest
  ``SUBSCRIBE_NEWEST_MESSAGES``), at most ``REPLAY_MAX_MESSAGES`` per subscribe (``more`` in the
  reply says the client should subscribe again from where it got to). Because the registration
  comes first, every message is in the replay or reaches the fan-out after it can see this
  subscriber: none falls between the two. The reply ``subscribed`` comes before the replay's
  ``messages`` frames; its ``after``/``afterEpoch`` say where the replay starts (past a gap,
  or at a newer epoch's origin, when nothing can be stored in between) and ``upTo``/
  ``upToEpoch`` where it ends;
* ``unsubscribe``: the opposite; the user's subscriptions (``SUBS#<sub>``, global) are what
  ``getState`` reports, so a client that reconnects or reloads is re-subscribed from the server's
  state, in either Region;
* ``$default``: anything else. Unknown actions and malformed messages get an error reply that
  names the offending field; no message can crash the handler.

State is keyed by the verified ``sub`` (``USER#<sub>``), never by connection id, so a client
that reconnects, to this region or to the other one after a failover, finds its state again.

**The canary is confined**: a connection whose authorizer context says ``principalKind`` is
``canary`` (a token signed by the canary's own key, see :mod:`.authorizer`) may send
``heartbeat`` only; any other message gets an error reply and nothing is read or written, and
its ``$connect`` writes no connection record.

Every JSON reply is one object with ``type``, the ``region`` that served it and the request's
``requestId`` echoed (when it had a valid one). No reply frame is larger than API Gateway's
32 KB frame limit: a reply that would be is replaced by an error reply (``reply_too_large``).
Replies go through the API Gateway Management API (``post_to_connection``) at the *regional*
endpoint of this API (a custom domain name would follow the failover DNS and might reach the
other region), or at ``APIGW_MANAGEMENT_ENDPOINT`` when set (the local stand-in sets it). A
``GoneException`` means the client left: its connection record is deleted.

**One writer per auction**: every bid is decided by a conditional write in the auction's home
Region's replica (``STATE_HOME_REGION``), whichever Region serves the bidder; the other Region
writes it across Regions, and refuses the bid as retryable (``home_unavailable``) when the home
does not answer. A state read is served from the local replica and says whether it may lag the
home (``stale``). The user's own items (last bid, counters, subscriptions) are written in the
Region that serves the user.

Environment: ``STATE_TABLE_NAME``, ``CONNECTIONS_TABLE_NAME``, ``AWS_REGION`` (set by Lambda),
optional ``STATE_HOME_REGION``, ``APIGW_MANAGEMENT_ENDPOINT`` and ``CONNECTION_TTL_SECONDS``;
for live delivery all of ``STREAMS_TABLE_NAME`` (the fleet's lease table),
``MESSAGES_TABLE_NAME`` and ``SUBSCRIPTIONS_TABLE_NAME``, optionally
``SUBSCRIBE_NEWEST_MESSAGES`` (default 50) and ``REPLAY_MAX_MESSAGES`` (default 2,000) (names in
:data:`streamfleet.model.HANDLERS_ENV`).
Decisions and errors are logged as structured records (:mod:`.logs`) at INFO/WARNING.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import model, readers, strict_json
from ..clock import SYSTEM_CLOCK, Clock
from ..lease.dynamo import error_code, from_item, is_condition_failure, names, to_attr
from ..request_body import BodyRefused, Refusal, decode_body
from ..validation import ID_CHARSET_DOC, ID_PATTERN, MAX_ID_BYTES, REGION_PATTERN
from .delivery import (
    SOURCE_REPLAY,
    StoredMessage,
    hole_is_unfillable,
    message_from_item,
    pack_frames,
)
from .logs import log_event

logger = logging.getLogger(__name__)

CONNECT = "$connect"
DISCONNECT = "$disconnect"
DEFAULT = "$default"

DEFAULT_CONNECTION_TTL_SECONDS = model.WS_MAX_CONNECTION_SECONDS + 10 * 60
MAX_REQUEST_ID_CHARS = model.MAX_WS_REQUEST_ID_CHARS
MAX_AUCTION_ID_CHARS = 128
MAX_BID_AMOUNT = 10**15  # below 2**53 (JavaScript clients) and BID_AMOUNT_DIGITS digits
# Retries of a state write whose only failed condition was "newer than the stored version".
MAX_VERSION_RETRIES = 8
MAX_STREAM_ID_BYTES = MAX_ID_BYTES  # a stream is a fleet connection id (validation.check_id)
MAX_SEQ = model.MAX_SEQ  # JavaScript clients count in doubles
DEFAULT_SUBSCRIBE_NEWEST = 50
DEFAULT_REPLAY_MAX_MESSAGES = 2000
MAX_REPLAY_MESSAGES = 10_000
# The data one subscribe reads and posts at most, whatever the messages' sizes (at least one
# message): about 35 frames of 32 KB, well within the handler's memory and time; the reply's
# `more` sends the client back for the rest.
REPLAY_MAX_BYTES = 1024 * 1024
# The most a deployment may allow per stream and Region (one consistent query counts them).
MAX_SUBSCRIBERS_PER_STREAM = 10_000
MAX_USER_CONNECTIONS_PER_STREAM = 100
QUERY_PAGE_ITEMS = 1000

FIELDS: dict[str, tuple[str, ...]] = {
    model.WS_ROUTE_HEARTBEAT: ("action", "requestId"),
    model.WS_ROUTE_GET_STATE: ("action", "requestId", "auction"),
    model.WS_ROUTE_BID: ("action", "requestId", "auction", "amount"),
    model.WS_ROUTE_SUBSCRIBE: ("action", "requestId", "stream", "after", "afterEpoch"),
    model.WS_ROUTE_UNSUBSCRIBE: ("action", "requestId", "stream"),
}

# Lambda runs one invocation at a time per container; a few connections are plenty. botocore
# retries throttling a little (standard mode); a reply that cannot be delivered fast is useless.
_BOTO_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=3.0,
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=16,
)
# Writes to the auction's home Region cross Regions from the other one: two short attempts, so a
# home that cannot be reached is told within about 6 s (HOME_CALL_MAX_MS), and a home call is
# started only with that much of the invocation left.
HOME_CALL_MAX_MS = 6_500
_HOME_BOTO_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=2.0,
    retries={"max_attempts": 2, "mode": "standard"},
    max_pool_connections=16,
)


# --- Configuration ------------------------------------------------------------------------------


class HandlerConfigError(ValueError):
    """A missing or invalid environment variable; names the variable."""


@dataclass(frozen=True)
class HandlerConfig:
    """The handlers' settings, immutable once read."""

    state_table: str
    connections_table: str
    region: str
    management_endpoint: str | None = None
    connection_ttl_seconds: int = DEFAULT_CONNECTION_TTL_SECONDS
    max_message_bytes: int = model.WS_MAX_FRAME_BYTES
    live: LiveTables | None = None  # None: subscribe answers not_supported
    # Where auctions are written (None: this Region). Global tables resolve concurrent writes
    # to one item last-writer-wins, so a conditional write in each Region could accept two
    # bids that each replace the other; one home Region evaluates every bid's condition.
    home_region: str | None = None

    def __post_init__(self) -> None:
        if self.home_region is not None and not REGION_PATTERN.fullmatch(self.home_region):
            raise HandlerConfigError(
                f"{model.ENV_STATE_HOME_REGION}: {self.home_region!r} is not a Region name"
            )

    @property
    def auction_home(self) -> str:
        """The Region whose replica of the state table decides every bid."""
        return self.home_region or self.region

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HandlerConfig:
        """Read and validate the environment (see the module docstring)."""
        env = os.environ if env is None else env

        def required(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise HandlerConfigError(f"{name}: required but not set")
            return value

        def whole(name: str, default: int, maximum: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            if not raw.isdigit() or not 0 < int(raw) <= maximum:
                raise HandlerConfigError(f"{name}: {raw!r} is not a whole number 1 to {maximum}")
            return int(raw)

        ttl = whole(model.ENV_CONNECTION_TTL_SECONDS, DEFAULT_CONNECTION_TTL_SECONDS, 10**9)
        live_names = (
            model.ENV_STREAMS_TABLE_NAME,
            model.ENV_MESSAGES_TABLE_NAME,
            model.ENV_SUBSCRIPTIONS_TABLE_NAME,
        )
        given = [name for name in live_names if env.get(name, "").strip()]
        live = None
        if given:
            missing = [name for name in live_names if name not in given]
            if missing:
                raise HandlerConfigError(
                    f"{missing[0]}: required with {given[0]} (live delivery needs all of "
                    f"{', '.join(live_names)})"
                )
            replay_max = whole(
                model.ENV_REPLAY_MAX_MESSAGES, DEFAULT_REPLAY_MAX_MESSAGES, MAX_REPLAY_MESSAGES
            )
            live = LiveTables(
                streams_table=required(model.ENV_STREAMS_TABLE_NAME),
                messages_table=required(model.ENV_MESSAGES_TABLE_NAME),
                subscriptions_table=required(model.ENV_SUBSCRIPTIONS_TABLE_NAME),
                newest=whole(
                    model.ENV_SUBSCRIBE_NEWEST_MESSAGES,
                    min(DEFAULT_SUBSCRIBE_NEWEST, replay_max),
                    1000,
                ),
                replay_max=replay_max,
                max_subscribers=whole(
                    model.ENV_MAX_SUBSCRIBERS_PER_STREAM,
                    model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM,
                    MAX_SUBSCRIBERS_PER_STREAM,
                ),
                max_user_connections=whole(
                    model.ENV_MAX_USER_CONNECTIONS_PER_STREAM,
                    model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM,
                    MAX_USER_CONNECTIONS_PER_STREAM,
                ),
            )
        return cls(
            state_table=required(model.ENV_STATE_TABLE_NAME),
            connections_table=required(model.ENV_CONNECTIONS_TABLE_NAME),
            region=required("AWS_REGION"),
            management_endpoint=env.get(model.ENV_APIGW_MANAGEMENT_ENDPOINT, "").strip() or None,
            connection_ttl_seconds=ttl,
            live=live,
            home_region=env.get(model.ENV_STATE_HOME_REGION, "").strip() or None,
        )


@dataclass(frozen=True)
class LiveTables:
    """Where live delivery reads and writes: the fleet's lease table (a stream's readers and
    origin), its messages table (this Region's replica) and this Region's subscribers."""

    streams_table: str
    messages_table: str
    subscriptions_table: str
    newest: int = DEFAULT_SUBSCRIBE_NEWEST
    replay_max: int = DEFAULT_REPLAY_MAX_MESSAGES
    max_subscribers: int = model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM
    max_user_connections: int = model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM

    def __post_init__(self) -> None:
        if not 1 <= self.newest <= self.replay_max:
            raise HandlerConfigError(
                f"{model.ENV_SUBSCRIBE_NEWEST_MESSAGES}: must be from 1 to "
                f"{model.ENV_REPLAY_MAX_MESSAGES} ({self.replay_max})"
            )


# --- Messages (pure) ----------------------------------------------------------------------------


class BadMessage(ValueError):
    """A message refused with an error reply; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str, request_id: str | None = None):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Heartbeat:
    request_id: str | None = None


@dataclass(frozen=True)
class GetState:
    request_id: str | None = None
    auction: str | None = None


@dataclass(frozen=True)
class PlaceBid:
    auction: str
    amount: int
    request_id: str | None = None


@dataclass(frozen=True)
class Subscribe:
    stream: str
    after: int | None = None  # a log position (epoch and seq); None: from the newest few
    request_id: str | None = None
    # Sent afterEpoch: a client that follows a stream from one epoch into the next. One that
    # does not would take the next epoch's seqs for duplicates of the old ones.
    knows_epochs: bool = True


@dataclass(frozen=True)
class Unsubscribe:
    stream: str
    request_id: str | None = None


Message = Heartbeat | GetState | PlaceBid | Subscribe | Unsubscribe


def _message_text(event: Mapping[str, Any], max_bytes: int) -> str:
    """The message as text (:func:`~streamfleet.request_body.decode_body`); :class:`BadMessage`
    otherwise, worded for a client that sends frames, not HTTP bodies."""
    body = event.get("body")
    try:
        return decode_body(body, bool(event.get("isBase64Encoded")), max_bytes)
    except BodyRefused as refused:
        message = {
            Refusal.MISSING: "required (empty message)",
            Refusal.EMPTY: "required (empty message)",
            Refusal.NOT_TEXT: f"expected text, got {type(body).__name__}",
            Refusal.TOO_LARGE: f"{refused.message} (API Gateway's frame limit)",
            Refusal.NOT_UTF8_BYTES: f"{refused.message} (binary frames are not accepted)",
        }.get(refused.reason, refused.message)
        raise BadMessage(refused.field, message) from None


def _identifier(payload: Mapping[str, Any], field: str, max_chars: int) -> str:
    value = payload[field]
    if not isinstance(value, str):
        raise BadMessage(field, f"expected a string, got {strict_json.json_type(value)}")
    if not value:
        raise BadMessage(field, "must not be empty")
    if len(value) > max_chars:
        raise BadMessage(field, f"longer than {max_chars} characters")
    if not ID_PATTERN.fullmatch(value):
        raise BadMessage(field, f"only {ID_CHARSET_DOC} are allowed")
    return value


def _stream(payload: Mapping[str, Any]) -> str:
    if "stream" not in payload:
        raise BadMessage("stream", "required")
    return _identifier(payload, "stream", MAX_STREAM_ID_BYTES)  # ASCII: characters are bytes


def _whole_number(payload: Mapping[str, Any], field: str, what: str) -> int:
    value = payload[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadMessage(field, f"expected {what}, got {strict_json.json_type(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadMessage(field, "expected a whole number, got a fraction")
        value = int(value)
    if not 0 <= value <= MAX_SEQ:
        raise BadMessage(field, f"must be between 0 and {MAX_SEQ}")
    return value


def _after(payload: Mapping[str, Any]) -> int | None:
    """The log position after which to replay: ``after`` (a seq, or null for the newest few)
    in epoch ``afterEpoch`` (0 when absent)."""
    epoch = 0
    if payload.get("afterEpoch") is not None:
        epoch = _whole_number(payload, "afterEpoch", "an epoch")
    if payload.get("after") is None:
        return None
    return model.log_position(epoch, _whole_number(payload, "after", "a seq or null"))


def _wire_position(name: str, position: int | None) -> dict[str, int | None]:
    """A log position as the wire carries it: ``{name: seq, name + "Epoch": epoch}``."""
    if position is None:
        return {name: None, f"{name}Epoch": None}
    return {name: model.seq_of(position), f"{name}Epoch": model.epoch_of(position)}


def _amount(payload: Mapping[str, Any]) -> int:
    value = payload["amount"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadMessage("amount", f"expected a whole number, got {strict_json.json_type(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadMessage("amount", "expected a whole number, got a fraction")
        value = int(value)
    if not 1 <= value <= MAX_BID_AMOUNT:
        raise BadMessage("amount", f"must be between 1 and {MAX_BID_AMOUNT}")
    return value


def parse_message(text: str) -> Message:
    """Validate one client message completely; :class:`BadMessage` names the first bad field.

    Strict: unknown and duplicated fields are refused, so a typo (``ammount``) is an error
    instead of a silently missing value.
    """
    try:
        payload = strict_json.loads(text)
    except strict_json.DuplicateMember as dup:
        raise BadMessage(dup.member, "appears more than once") from None
    except (ValueError, RecursionError):
        raise BadMessage("body", "not valid JSON") from None
    if not isinstance(payload, dict):
        raise BadMessage("body", f"expected a JSON object, got {strict_json.json_type(payload)}")
    if payload.get(model.WS_ROUTE_SELECTION_FIELD) == model.WS_ROUTE_HEARTBEAT:
        # Always a pong, whatever else came with it: a heartbeat only asks "are you there?".
        try:
            request_id = _identifier(payload, "requestId", MAX_REQUEST_ID_CHARS)
        except (KeyError, BadMessage):
            request_id = None
        return Heartbeat(request_id)
    request_id = None
    if "requestId" in payload:
        request_id = _identifier(payload, "requestId", MAX_REQUEST_ID_CHARS)
    try:
        if model.WS_ROUTE_SELECTION_FIELD not in payload:
            raise BadMessage("action", "required")
        action = payload["action"]
        if not isinstance(action, str):
            raise BadMessage("action", f"expected a string, got {strict_json.json_type(action)}")
        if action not in FIELDS:
            shown = action[:40]
            raise BadMessage("action", f"unknown action {shown!r} (expected {', '.join(FIELDS)})")
        for key in payload:
            if key not in FIELDS[action]:
                raise BadMessage(key, f"unknown field for {action}")
        if action == model.WS_ROUTE_GET_STATE:
            auction = None
            if "auction" in payload:
                auction = _identifier(payload, "auction", MAX_AUCTION_ID_CHARS)
            return GetState(request_id, auction)
        if action == model.WS_ROUTE_SUBSCRIBE:
            return Subscribe(_stream(payload), _after(payload), request_id, "afterEpoch" in payload)
        if action == model.WS_ROUTE_UNSUBSCRIBE:
            return Unsubscribe(_stream(payload), request_id)
        for field in ("auction", "amount"):
            if field not in payload:
                raise BadMessage(field, "required")
        return PlaceBid(
            _identifier(payload, "auction", MAX_AUCTION_ID_CHARS), _amount(payload), request_id
        )
    except BadMessage as bad:
        bad.request_id = request_id
        raise


# --- Replies through the Management API ---------------------------------------------------------


class ConnectionGone(Exception):
    """The connection no longer exists (HTTP 410 from the Management API)."""


class Replier(Protocol):
    """Delivers one message to one connection."""

    def post(self, request_context: Mapping[str, Any], connection_id: str, data: bytes) -> None:
        """Send ``data``; :class:`ConnectionGone` when the client has left."""


def management_endpoint(request_context: Mapping[str, Any], region: str) -> str:
    """The Management API endpoint for a request: the API's own regional endpoint.

    A request that arrived through a custom domain name (the failover name) must not be answered
    through it: the name follows the failover DNS and may resolve to the *other* region, whose
    API Gateway does not know this connection.
    """
    domain = str(request_context.get("domainName") or "")
    stage = str(request_context.get("stage") or "")
    api_id = str(request_context.get("apiId") or "")
    if domain.endswith(".amazonaws.com") or not api_id:
        return f"https://{domain}/{stage}"
    return f"https://{api_id}.execute-api.{region}.amazonaws.com/{stage}"


class ManagementApiReplier:
    """``apigatewaymanagementapi.post_to_connection`` with boto3, one client per endpoint."""

    def __init__(
        self,
        *,
        region: str,
        endpoint: str | None = None,
        client_factory: Callable[[str], Any] | None = None,
    ):
        self.region = region
        self.endpoint = endpoint
        self._factory = client_factory or self._new_client
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _new_client(self, endpoint: str) -> Any:
        return boto3.session.Session().client(
            "apigatewaymanagementapi",
            endpoint_url=endpoint,
            region_name=self.region,
            config=_BOTO_CONFIG,
        )

    def client_for(self, request_context: Mapping[str, Any]) -> Any:
        """The boto3 client for this request's endpoint (created once, then reused)."""
        endpoint = self.endpoint or management_endpoint(request_context, self.region)
        with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                client = self._clients[endpoint] = self._factory(endpoint)
            return client

    def post(self, request_context: Mapping[str, Any], connection_id: str, data: bytes) -> None:
        try:
            self.client_for(request_context).post_to_connection(
                ConnectionId=connection_id, Data=data
            )
        except ClientError as exc:
            if error_code(exc) == "GoneException":
                raise ConnectionGone(connection_id) from None
            raise


# --- The handlers -------------------------------------------------------------------------------


def make_dynamodb_client(region: str | None = None, *, home: bool = False) -> Any:
    """A boto3 DynamoDB client with short timeouts (endpoint from ``AWS_ENDPOINT_URL*``);
    ``home``: the shorter budget of a client that writes across Regions."""
    config = _HOME_BOTO_CONFIG if home else _BOTO_CONFIG
    return boto3.session.Session().client("dynamodb", region_name=region, config=config)


@dataclass(frozen=True)
class StateReplica:
    """One Region's replica of the state table: where a write goes and who it says wrote it."""

    region: str
    table: str
    client: Any


class StateWriteConflict(RuntimeError):
    """A state item kept changing under a write for ``MAX_VERSION_RETRIES`` attempts."""


class WsApiHandlers:
    """Every route of the WebSocket API. Thread-safe: the local gateway calls it concurrently."""

    def __init__(
        self,
        config: HandlerConfig,
        *,
        dynamodb: Any | None = None,
        replier: Replier | None = None,
        clock: Clock = SYSTEM_CLOCK,
        home: StateReplica | None = None,
    ):
        """``home``: the auctions' home replica, when it is not this Region's (default: the
        table of the same name in ``config.home_region``)."""
        self.config = config
        self.dynamodb = dynamodb or make_dynamodb_client(config.region)
        self.local = StateReplica(config.region, config.state_table, self.dynamodb)
        if config.auction_home == config.region:
            self.home = self.local
        else:
            self.home = home or StateReplica(
                config.auction_home,
                config.state_table,
                make_dynamodb_client(config.auction_home, home=True),
            )
        self.replier = replier or ManagementApiReplier(
            region=config.region, endpoint=config.management_endpoint
        )
        self.clock = clock

    # Entry point -----------------------------------------------------------------------------

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        """Handle one API Gateway WebSocket event; never raises."""
        request_context = event.get("requestContext") or {}
        route = request_context.get("routeKey")
        try:
            if route == CONNECT:
                return self.on_connect(event)
            if route == DISCONNECT:
                return self.on_disconnect(event)
            return self.on_message(event, _time_left(context))
        except Exception:
            logger.exception("wsapi %s failed (connection %s)", route, _connection_id(event))
            return {"statusCode": 500}

    # $connect / $disconnect ------------------------------------------------------------------

    def on_connect(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Record the connection under its verified user; select the application subprotocol."""
        request_context = event.get("requestContext") or {}
        user_id = _authorized_sub(request_context)
        connection_id = _connection_id(event)
        if user_id is None:
            # No authorizer in front of $connect: a deployment error, never let it through.
            log_event(
                logger,
                logging.ERROR,
                "wsapi_connect",
                decision="refuse",
                reason="no_authorizer_context",
                connectionId=connection_id,
            )
            return {"statusCode": 401}
        response: dict[str, Any] = {"statusCode": 200}
        if model.WS_APP_SUBPROTOCOL in _offered_subprotocols(event):
            response["headers"] = {"Sec-WebSocket-Protocol": model.WS_APP_SUBPROTOCOL}
        kind = _principal_kind(request_context)
        log_event(
            logger,
            logging.INFO,
            "wsapi_connect",
            decision="accept",
            principalKind=kind,
            sub=user_id,
            connectionId=connection_id,
        )
        # The canary's connection is recorded as every user's: a Region whose state store cannot
        # be written refuses the canary's handshake as it refuses its users'.
        now_ms = self.clock.wall_ms()
        self.dynamodb.put_item(
            TableName=self.config.connections_table,
            Item={
                model.PK: to_attr(model.ws_connection_pk(connection_id)),
                model.WS_USER_ID: to_attr(user_id),
                model.WS_CONNECTED_AT_MS: to_attr(now_ms),
                model.WS_REGION: to_attr(self.config.region),
                model.WS_EXPIRES_AT: to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
            },
        )
        return response

    def on_disconnect(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Delete the connection record and its subscriptions (best effort, like
        ``$disconnect`` itself; the subscriptions' TTL removes what a lost one leaves)."""
        self._forget_connection(_connection_id(event))
        return {"statusCode": 200}

    def _forget_connection(self, connection_id: str) -> None:
        self.dynamodb.delete_item(
            TableName=self.config.connections_table,
            Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
        )
        live = self.config.live
        if live is None:
            return
        old = self.dynamodb.delete_item(
            TableName=live.subscriptions_table,
            Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
            ReturnValues="ALL_OLD",
        ).get("Attributes")
        streams = sorted((from_item(old) or {}).get(model.WS_STREAMS) or ())
        requests = [
            {
                "DeleteRequest": {
                    "Key": {
                        model.PK: to_attr(model.stream_subscribers_pk(stream)),
                        model.SUB_CONNECTION: to_attr(connection_id),
                    }
                }
            }
            for stream in streams
        ]
        for start in range(0, len(requests), 25):
            pending = requests[start : start + 25]
            for _ in range(3):  # unprocessed items: retried twice, then left to the TTL
                response = self.dynamodb.batch_write_item(
                    RequestItems={live.subscriptions_table: pending}
                )
                pending = response.get("UnprocessedItems", {}).get(live.subscriptions_table)
                if not pending:
                    break

    # Messages --------------------------------------------------------------------------------

    def on_message(
        self, event: Mapping[str, Any], time_left_ms: Callable[[], int] | None = None
    ) -> dict[str, Any]:
        """Parse, act, reply. Every failure becomes an error reply naming its cause.
        ``time_left_ms``: the invocation's remaining time (Lambda's context), if known."""
        request_context = event.get("requestContext") or {}
        connection_id = _connection_id(event)
        request_id = None
        try:
            text = _message_text(event, self.config.max_message_bytes)
            message = parse_message(text)
            request_id = message.request_id
            if isinstance(message, Heartbeat):
                if _principal_kind(request_context) == model.WS_PRINCIPAL_CANARY:
                    # The canary's heartbeat reads its connection record first: a Region whose
                    # state store cannot be read answers it with an error, not with a pong.
                    self._read_connection(connection_id)
                self.send_pong(request_context, connection_id)
                return {"statusCode": 200}
            if _principal_kind(request_context) == model.WS_PRINCIPAL_CANARY:
                # Checked before anything is read: the canary's identity owns no state.
                raise _NotAuthorized("the canary identity may send heartbeat only")
            user_id = self._user_of(request_context, connection_id)
            token_expires_at = _token_expires_at(request_context)
            if token_expires_at is not None and token_expires_at <= self.clock.wall_ms() // 1000:
                # Its authorization ended with its token: nothing more is served on it, and the
                # fan-out closes it at its next delivery. The client reconnects with a new token.
                raise _Refused(
                    "token_expired",
                    "token",
                    "token: expired; reconnect with a fresh one",
                )
            if isinstance(message, Subscribe):
                tags = _reader_tags(request_context, user_id)
                reply, frames = self.subscribe(
                    user_id, tags, connection_id, message, token_expires_at=token_expires_at
                )
                if self.reply(request_context, connection_id, reply, request_id):
                    for frame in frames:
                        if not self._post(connection_id, request_context, frame):
                            break
                return {"statusCode": 200}
            if isinstance(message, Unsubscribe):
                reply = self.unsubscribe(user_id, connection_id, message.stream)
            elif isinstance(message, GetState):
                reply = self.get_state(user_id, message.auction)
            else:
                reply = self.place_bid(
                    user_id, message.auction, message.amount, time_left_ms=time_left_ms
                )
        except BadMessage as bad:
            request_id = bad.request_id
            reply = _error(bad.message, bad.field, full=str(bad), code="bad_request")
        except _NotAuthorized as exc:
            log_event(
                logger,
                logging.WARNING,
                "wsapi_message",
                decision="refuse",
                reason="not_authorized",
                route=request_context.get("routeKey"),
                principalKind=_principal_kind(request_context),
                connectionId=connection_id,
                detail=str(exc),
            )
            reply = _error(str(exc), "authorization", code="forbidden")
        except _Refused as refused:
            log_event(
                logger,
                logging.WARNING,
                "wsapi_message",
                decision="refuse",
                reason=refused.code,
                route=request_context.get("routeKey"),
                connectionId=connection_id,
                detail=str(refused),
            )
            reply = _error(
                str(refused), refused.field, code=refused.code, retryable=refused.retryable
            )
        except (BotoCoreError, ClientError, StateWriteConflict) as exc:
            log_event(
                logger,
                logging.WARNING,
                "wsapi_message",
                decision="error",
                reason="state_store",
                route=request_context.get("routeKey"),
                connectionId=connection_id,
                detail=f"{type(exc).__name__}: {exc}",
            )
            reply = _error(
                "the state store did not answer; retry", None, retryable=True, code="unavailable"
            )
        except Exception:
            logger.exception("wsapi message failed (connection %s)", connection_id)
            reply = _error("internal error", None, retryable=True, code="internal")
        self.reply(request_context, connection_id, reply, request_id)
        return {"statusCode": 200}

    def send_pong(self, request_context: Mapping[str, Any], connection_id: str) -> bool:
        """The heartbeat's reply: the TEXT frame ``pong``; ``False`` if the client is gone."""
        return self._post(connection_id, request_context, model.WS_PONG_FRAME.encode())

    def reply(
        self,
        request_context: Mapping[str, Any],
        connection_id: str,
        payload: dict[str, Any],
        request_id: str | None = None,
    ) -> bool:
        """Post ``payload`` (plus the serving region and ``requestId``); ``False`` if the client
        is gone, in which case its stale connection record is deleted."""
        body = {**payload, "region": self.config.region}
        if request_id is not None:
            body["requestId"] = request_id
        data = json.dumps(body, separators=(",", ":")).encode()
        if len(data) > model.WS_MAX_FRAME_BYTES:
            # API Gateway would close the client's socket (1009) and lose every reply in flight.
            log_event(
                logger,
                logging.WARNING,
                "wsapi_reply",
                decision="replaced",
                reason="reply_too_large",
                bytes=len(data),
                replyType=payload.get("type"),
                connectionId=connection_id,
            )
            body = {
                **_error(
                    f"the reply ({len(data)} bytes) exceeds the {model.WS_MAX_FRAME_BYTES}-byte "
                    "frame limit",
                    None,
                    code="reply_too_large",
                ),
                "region": self.config.region,
            }
            if request_id is not None:
                body["requestId"] = request_id
            data = json.dumps(body, separators=(",", ":")).encode()
        return self._post(connection_id, request_context, data)

    def _post(self, connection_id: str, request_context: Mapping[str, Any], data: bytes) -> bool:
        try:
            self.replier.post(request_context, connection_id, data)
            return True
        except ConnectionGone:
            try:
                self._forget_connection(connection_id)
            except (BotoCoreError, ClientError) as exc:
                log_event(
                    logger,
                    logging.WARNING,
                    "wsapi_reply",
                    decision="error",
                    reason="forget_gone_connection",
                    connectionId=connection_id,
                    detail=str(exc),
                )
            return False
        except Exception as exc:  # the reply is lost; the client's request times out
            log_event(
                logger,
                logging.WARNING,
                "wsapi_reply",
                decision="error",
                reason="post_failed",
                connectionId=connection_id,
                detail=f"{type(exc).__name__}: {exc}",
            )
            return False

    def _read_connection(self, connection_id: str) -> dict[str, Any]:
        """The connection's record as ``$connect`` wrote it (consistent; ``{}``: none)."""
        return (
            from_item(
                self.dynamodb.get_item(
                    TableName=self.config.connections_table,
                    Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
                    ConsistentRead=True,
                ).get("Item")
            )
            or {}
        )

    def _user_of(self, request_context: Mapping[str, Any], connection_id: str) -> str:
        """The verified user of a connection: from the authorizer context API Gateway passes
        with every message, else from the connection record written at ``$connect``."""
        user_id = _authorized_sub(request_context)
        if user_id is not None:
            return user_id
        item = self._read_connection(connection_id)
        if not isinstance(item.get(model.WS_USER_ID), str):
            raise _NotAuthorized("no verified user for this connection; reconnect")
        return item[model.WS_USER_ID]

    # Application -----------------------------------------------------------------------------

    def get_state(self, user_id: str, auction: str | None) -> dict[str, Any]:
        """The user's state and one auction's (the requested one, else the user's last)."""
        user = self._get_state_item(model.user_pk(user_id))
        state: dict[str, Any] = {
            "lastBid": None,
            "bidsAccepted": 0,
            "bidsRefused": 0,
            "updatedAtMs": None,
        }
        if user:
            if model.LAST_BID_AUCTION in user:
                state["lastBid"] = {
                    "auction": user[model.LAST_BID_AUCTION],
                    "amount": user.get(model.LAST_BID_AMOUNT),
                    "atMs": user.get(model.LAST_BID_AT_MS),
                }
            state["bidsAccepted"] = user.get(model.BIDS_ACCEPTED, 0)
            state["bidsRefused"] = user.get(model.BIDS_REFUSED, 0)
            state["updatedAtMs"] = user.get(model.UPDATED_AT_MS)
        reply: dict[str, Any] = {"type": model.WS_REPLY_STATE, "user": user_id, "state": state}
        if self.config.live is not None:
            subscriptions = self._get_state_item(model.user_subscriptions_pk(user_id)) or {}
            reply["subscriptions"] = sorted(subscriptions.get(model.WS_STREAMS) or ())
        auction = auction or (state["lastBid"] or {}).get("auction")
        if auction:
            reply["auction"] = self._auction_view(auction, user_id)
        return reply

    def _auction_view(self, auction: str, user_id: str) -> dict[str, Any]:
        """The auction as this Region's replica holds it. Read here, not in the home Region, so
        a state read never waits on another Region; ``stale`` tells the client that this
        replica may lag the home by the replication lag (a bid's own reply never does)."""
        item = self._get_state_item(model.auction_pk(auction)) or {}
        return {
            "auction": auction,
            "highest": item.get(model.HIGHEST_AMOUNT, 0),
            "highestIsYou": item.get(model.HIGHEST_BIDDER) == user_id,
            "bids": item.get(model.BID_COUNT, 0),
            "homeRegion": self.home.region,
            "stale": self.home is not self.local,
        }

    # Live delivery --------------------------------------------------------------------------

    def _live(self) -> LiveTables:
        if self.config.live is None:
            raise _Refused(
                "not_supported",
                "stream",
                "live delivery is not configured on this API (STREAMS_TABLE_NAME, "
                "MESSAGES_TABLE_NAME, SUBSCRIPTIONS_TABLE_NAME)",
            )
        return self.config.live

    def subscribe(
        self,
        user_id: str,
        tags: list[str],
        connection_id: str,
        message: Subscribe,
        *,
        token_expires_at: int | None = None,
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Check the reader, register the subscriber, read the replay: the ``subscribed``
        reply and the ``messages`` frames to post after it, in this order."""
        live = self._live()
        stream = message.stream
        try:
            row = self._readable_row(live, stream, tags)
        except _Refused:
            # A stream the user may no longer read leaves their subscriptions too: a reconnect
            # (which resubscribes what getState lists) must not ask for it again and again.
            with contextlib.suppress(BotoCoreError, ClientError, StateWriteConflict):
                pk = model.user_subscriptions_pk(user_id)
                listed = (self._get_state_item(pk) or {}).get(model.WS_STREAMS) or ()
                if stream in listed:
                    self.write_state(pk, sets={}, deletes={model.WS_STREAMS: {stream}})
            raise
        now_ms = self.clock.wall_ms()
        self._check_audience(live, stream, user_id, connection_id)
        self._add_connection_stream(live, connection_id, stream, now_ms)
        # Registered BEFORE the replay is read: a message stored after the read below reaches
        # the fan-out, whose (consistent) query of this table then sees this subscriber.
        subscription = {
            model.PK: to_attr(model.stream_subscribers_pk(stream)),
            model.SUB_CONNECTION: to_attr(connection_id),
            model.SUB_USER_ID: to_attr(user_id),
            model.SUB_SUBSCRIBED_AT_MS: to_attr(now_ms),
            model.SUB_EXPIRES_AT: to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
            # What the fan-out checks at every delivery against the stream's readers then (with
            # the user tag, which it takes from the user id, never from a list).
            model.SUB_READER_TAGS: to_attr(readers.encode_tags(readers.claim_tags_only(tags))),
        }
        if token_expires_at is not None:
            subscription[model.SUB_TOKEN_EXPIRES_AT] = to_attr(token_expires_at)
        self.dynamodb.put_item(TableName=live.subscriptions_table, Item=subscription)
        try:
            self.write_state(
                model.user_subscriptions_pk(user_id), sets={}, adds={model.WS_STREAMS: {stream}}
            )
        except (BotoCoreError, ClientError, StateWriteConflict) as exc:
            # This connection is subscribed; only a later reload would not be told about it.
            logger.warning("wsapi user subscriptions update failed: %s", exc)
        origin = row.get(model.ORIGIN_SEQ)
        after = message.after
        skipped = 0
        more = False
        if after is None:
            messages = self._newest(live, stream)
            after = messages[0].seq - 1 if messages else origin
        else:
            if origin is not None and after < origin:
                after = int(origin)  # nothing at or below the origin was ever stored
            messages, more = self._replay(live, stream, after)
            first = messages[0] if messages else None
            # A hole right after `after` is skipped only once nothing can fill it any more;
            # one that may still be filled (a batch still landing, a fleet scaled to zero, a
            # Region behind) is waited for, however old its neighbours.
            if (
                first is not None
                and first.seq > after + 1
                and hole_is_unfillable(after, messages, now_ms)
            ):
                if model.epoch_of(first.seq) == model.epoch_of(after):
                    skipped = first.seq - 1 - after
                # else the log went on in a newer epoch: the reply's afterEpoch says so
                after = first.seq - 1
        if not message.knows_epochs:
            newest = self._newest_position(live, stream)
            if newest is not None and model.epoch_of(newest) > 0:
                # This connection only: the user's other clients may follow the stream.
                self._stop_delivery(connection_id, stream)
                raise BadMessage(
                    "afterEpoch",
                    f"required: the stream went on in epoch {model.epoch_of(newest)} (its"
                    " upstream restarted its numbering), which a client that sends no"
                    " afterEpoch cannot follow",
                    message.request_id,
                )
        # The replay may hold messages stored after a START that changed the readers in the
        # meantime: read them again, so nothing stored after that START was answered is served.
        try:
            self._readable_row(live, stream, tags)
        except _Refused:
            self.unsubscribe(user_id, connection_id, stream)
            raise
        if token_expires_at is not None and token_expires_at <= self.clock.wall_ms() // 1000:
            # The token ended while the replay was read, which may hold messages stored after
            # it: none is served on this connection (the fan-out stops its live delivery the
            # same way). The client reconnects with a fresh token and subscribes again.
            self._stop_delivery(connection_id, stream)
            raise _Refused("token_expired", "token", "token: expired; reconnect with a fresh one")
        up_to = messages[-1].seq if messages else after
        reply: dict[str, Any] = {
            "type": model.WS_REPLY_SUBSCRIBED,
            "stream": stream,
            **_wire_position("after", after),
            "replayed": len(messages),
            **_wire_position("upTo", up_to),
            "more": more,
        }
        if skipped:
            reply["skipped"] = skipped
        frames = pack_frames(stream, messages, region=self.config.region, source=SOURCE_REPLAY)
        log_event(
            logger,
            logging.INFO,
            "wsapi_subscribe",
            decision="accept",
            sub=user_id,
            stream=stream,
            connectionId=connection_id,
            after=after,
            replayed=len(messages),
            frames=len(frames),
            more=more,
        )
        return reply, frames

    def _check_audience(
        self, live: LiveTables, stream: str, user_id: str, connection_id: str
    ) -> None:
        """Refuse a new subscriber past the stream's bounds (every message costs the fan-out a
        post per subscriber, and its batch waits for all of them). A connection already
        subscribed counts once. Checked here, so concurrent subscribes may pass it by their
        number."""
        params: dict[str, Any] = {
            "TableName": live.subscriptions_table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {
                "#pk": model.PK,
                "#c": model.SUB_CONNECTION,
                "#u": model.SUB_USER_ID,
            },
            "ExpressionAttributeValues": {":pk": to_attr(model.stream_subscribers_pk(stream))},
            "ProjectionExpression": "#c, #u",
            "ConsistentRead": True,
        }
        total = mine = 0
        while True:
            response = self.dynamodb.query(**params)
            for item in response.get("Items", []):
                if item[model.SUB_CONNECTION]["S"] == connection_id:
                    return
                total += 1
                mine += item.get(model.SUB_USER_ID, {}).get("S") == user_id
            if "LastEvaluatedKey" not in response:
                break
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        if total >= live.max_subscribers:
            raise _Refused(
                "too_many_subscribers",
                "stream",
                f"stream: {stream!r} has {total} subscribers here, its most; try later",
            )
        if mine >= live.max_user_connections:
            raise _Refused(
                "too_many_connections",
                "stream",
                f"stream: you read {stream!r} on {mine} connections, the most for one user",
            )

    def _readable_row(self, live: LiveTables, stream: str, tags: list[str]) -> dict[str, Any]:
        """The stream's row (readers, origin), read consistently; ``forbidden`` unless ``tags``
        may read it."""
        row = from_item(
            self.dynamodb.get_item(
                TableName=live.streams_table,
                Key={model.PK: to_attr(model.connection_pk(stream))},
                ProjectionExpression="#readers, #origin",
                ExpressionAttributeNames={"#readers": model.READERS, "#origin": model.ORIGIN_SEQ},
                ConsistentRead=True,
            ).get("Item")
        )
        if row is None or not readers.may_read(row.get(model.READERS), tags):
            # The same answer whether the stream exists or not: no probing for stream ids.
            raise _Refused(
                "forbidden",
                "stream",
                f"stream: {stream!r} does not exist or you are not one of its readers",
            )
        return row

    def _add_connection_stream(
        self, live: LiveTables, connection_id: str, stream: str, now_ms: int
    ) -> None:
        """List ``stream`` among the connection's (``$disconnect`` removes its subscriptions
        from there), within :data:`~streamfleet.model.MAX_SUBSCRIPTIONS_PER_CONNECTION`."""
        try:
            self.dynamodb.update_item(
                TableName=live.subscriptions_table,
                Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
                UpdateExpression="ADD #streams :stream SET #expires_at = :expires",
                ConditionExpression="attribute_not_exists(#streams) OR size(#streams) < :max "
                "OR contains(#streams, :one)",
                ExpressionAttributeNames=names(model.WS_STREAMS, model.SUB_EXPIRES_AT),
                ExpressionAttributeValues={
                    ":stream": to_attr({stream}),
                    ":one": to_attr(stream),
                    ":max": to_attr(model.MAX_SUBSCRIPTIONS_PER_CONNECTION),
                    ":expires": to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
                },
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise
            raise BadMessage(
                "stream",
                f"at most {model.MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions per connection",
            ) from None

    def _query(self, table: str, stream: str, **params: Any):
        """Pages of a stream's stored messages (consistent reads)."""
        condition = params["KeyConditionExpression"]
        request: dict[str, Any] = {
            "TableName": table,
            "ExpressionAttributeNames": {
                key: name
                for key, name in (("#pk", model.PK), ("#seq", model.SEQ))
                if key in condition
            },
            "ConsistentRead": True,
            **params,
        }
        request["ExpressionAttributeValues"] = {
            ":pk": to_attr(model.connection_pk(stream)),
            **params.get("ExpressionAttributeValues", {}),
        }
        while True:
            response = self.dynamodb.query(**request)
            yield [message_from_item(from_item(raw) or {}) for raw in response.get("Items", [])]
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            request["ExclusiveStartKey"] = last

    def _newest_position(self, live: LiveTables, stream: str) -> int | None:
        """The position of the newest message stored for ``stream`` (``None``: none)."""
        newest = next(
            self._query(
                live.messages_table,
                stream,
                KeyConditionExpression="#pk = :pk",
                ScanIndexForward=False,
                Limit=1,
            )
        )
        return newest[0].seq if newest else None

    def _newest(self, live: LiveTables, stream: str) -> list[StoredMessage]:
        """The newest messages: up to ``newest`` of them and ``REPLAY_MAX_BYTES`` of data."""
        pages = self._query(
            live.messages_table,
            stream,
            KeyConditionExpression="#pk = :pk",
            ScanIndexForward=False,
            Limit=live.newest,
        )
        newest_first, _ = _within_budget(next(pages), REPLAY_MAX_BYTES)
        return sorted(newest_first)

    def _replay(
        self, live: LiveTables, stream: str, after: int
    ) -> tuple[list[StoredMessage], bool]:
        """Messages after ``after``, ascending, up to ``replay_max`` of them and
        ``REPLAY_MAX_BYTES`` of data (at least one); whether more may follow."""
        messages: list[StoredMessage] = []
        pages = self._query(
            live.messages_table,
            stream,
            KeyConditionExpression="#pk = :pk AND #seq > :after",
            ExpressionAttributeValues={":after": to_attr(after)},
            Limit=min(QUERY_PAGE_ITEMS, live.replay_max),
        )
        budget = REPLAY_MAX_BYTES
        for page in pages:
            kept, cut = _within_budget(
                page[: live.replay_max - len(messages)], budget, at_least_one=not messages
            )
            messages += kept
            budget -= sum(message.data_bytes for message in kept)
            if cut or len(messages) >= live.replay_max or budget <= 0:
                return messages, True
        return messages, False

    def unsubscribe(self, user_id: str, connection_id: str, stream: str) -> dict[str, Any]:
        """Stop this connection's delivery of ``stream`` and forget the user's subscription."""
        self._stop_delivery(connection_id, stream)
        self.write_state(
            model.user_subscriptions_pk(user_id), sets={}, deletes={model.WS_STREAMS: {stream}}
        )
        return {"type": model.WS_REPLY_UNSUBSCRIBED, "stream": stream}

    def _stop_delivery(self, connection_id: str, stream: str) -> None:
        """Stop this connection's delivery of ``stream`` (the user's subscriptions stay)."""
        live = self._live()
        self.dynamodb.delete_item(
            TableName=live.subscriptions_table,
            Key={
                model.PK: to_attr(model.stream_subscribers_pk(stream)),
                model.SUB_CONNECTION: to_attr(connection_id),
            },
        )
        try:
            self.dynamodb.update_item(
                TableName=live.subscriptions_table,
                Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
                UpdateExpression="DELETE #streams :stream",
                ConditionExpression="attribute_exists(#pk)",  # never create an empty item
                ExpressionAttributeNames=names(model.PK, model.WS_STREAMS),
                ExpressionAttributeValues={":stream": to_attr({stream})},
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise

    def place_bid(
        self,
        user_id: str,
        auction: str,
        amount: int,
        *,
        time_left_ms: Callable[[], int] | None = None,
    ) -> dict[str, Any]:
        """Accept ``amount`` only if strictly above the auction's highest, atomically, in the
        auction's home Region (:attr:`HandlerConfig.auction_home`) whichever Region serves the
        bidder: an acknowledged bid is then never replaced by a lower one from another Region.

        When the home cannot be reached (or there is not time left to reach it) the bid is
        refused as retryable. A retry of a bid whose answer was lost (botocore's own retry, or
        the client's) is recognised while the bid is still the highest: it is acknowledged, its
        record written if it was not, and the user's counters moved once."""
        try:
            self._home_call_fits(time_left_ms)
            outcome = self.write_state(
                model.auction_pk(auction),
                sets={
                    model.AUCTION_ID: auction,
                    model.HIGHEST_AMOUNT: amount,
                    model.HIGHEST_BIDDER: user_id,
                },
                adds={model.BID_COUNT: 1},
                condition=f"attribute_not_exists(#{model.HIGHEST_AMOUNT}) OR "
                f"#{model.HIGHEST_AMOUNT} < :amount",
                condition_names=(model.HIGHEST_AMOUNT,),
                condition_values={":amount": amount},
                still_applies=lambda old: old.get(model.HIGHEST_AMOUNT, 0) < amount,
                replica=self.home,
            )
            old = outcome.current or {}
            # This bidder's own bid already decided: acknowledge it again rather than refuse it.
            ours_already = not outcome.written and (
                old.get(model.HIGHEST_AMOUNT) == amount and old.get(model.HIGHEST_BIDDER) == user_id
            )
            accepted = outcome.written or ours_already
            if accepted:
                self._home_call_fits(time_left_ms)
                self._record_bid(auction, amount, user_id, outcome.timestamp_ms)
        except (BotoCoreError, ClientError, StateWriteConflict, _HomeOutOfTime) as exc:
            if self.home is self.local or not _home_unreachable(exc):
                raise
            raise _Refused(
                "home_unavailable",
                "auction",
                f"the auction's home Region {self.home.region} did not answer "
                f"({_describe(exc)}); the bid may not have been accepted: retry it "
                "(a retried bid that is still the highest is acknowledged)",
                retryable=True,
            ) from exc
        if accepted:
            highest, is_you = amount, True
        else:
            highest = old.get(model.HIGHEST_AMOUNT, 0)
            is_you = old.get(model.HIGHEST_BIDDER) == user_id
        try:
            if accepted:
                # Once per accepted bid, however often it is acknowledged.
                self.write_state(
                    model.user_pk(user_id),
                    sets={
                        model.LAST_BID_AUCTION: auction,
                        model.LAST_BID_AMOUNT: amount,
                        model.LAST_BID_AT_MS: outcome.timestamp_ms,
                    },
                    adds={model.BIDS_ACCEPTED: 1},
                    condition=f"NOT (#{model.LAST_BID_AUCTION} = :auction AND "
                    f"#{model.LAST_BID_AMOUNT} = :amount)",
                    condition_names=(model.LAST_BID_AUCTION, model.LAST_BID_AMOUNT),
                    condition_values={":auction": auction, ":amount": amount},
                    still_applies=lambda old: (
                        old.get(model.LAST_BID_AUCTION) != auction
                        or old.get(model.LAST_BID_AMOUNT) != amount
                    ),
                )
            else:
                self.write_state(model.user_pk(user_id), sets={}, adds={model.BIDS_REFUSED: 1})
        except (BotoCoreError, ClientError, StateWriteConflict) as exc:
            # The auction item decided the bid; the user's counters are a convenience.
            logger.warning("wsapi user state update failed after a bid: %s", exc)
        return {
            "type": model.WS_REPLY_BID,
            "auction": auction,
            "amount": amount,
            "accepted": accepted,
            "highest": highest,
            "highestIsYou": is_you,
            **({} if accepted else {"reason": "not higher than the current highest bid"}),
        }

    def _home_call_fits(self, time_left_ms: Callable[[], int] | None) -> None:
        """Raise :class:`_HomeOutOfTime` rather than start a cross-Region call that Lambda's
        timeout could cut short (the client would hear nothing at all)."""
        remote = self.home is not self.local
        if remote and time_left_ms is not None and time_left_ms() < HOME_CALL_MAX_MS:
            raise _HomeOutOfTime(f"less than {HOME_CALL_MAX_MS} ms left in the invocation")

    def _record_bid(self, auction: str, amount: int, user_id: str, at_ms: int) -> None:
        # Immutable and keyed by amount (accepted amounts strictly increase): a retried put is a
        # no-op, and an acknowledged bid can be looked up after a failover. Written in the home
        # Region, beside the auction item that accepted it.
        try:
            self.home.client.put_item(
                TableName=self.home.table,
                Item={
                    model.PK: to_attr(model.bid_pk(auction, amount)),
                    model.AUCTION_ID: to_attr(auction),
                    model.BID_AMOUNT: to_attr(amount),
                    model.BID_BIDDER: to_attr(user_id),
                    model.BID_AT_MS: to_attr(at_ms),
                    model.UPDATED_AT_MS: to_attr(at_ms),
                    model.WRITER_REGION: to_attr(self.home.region),
                },
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames=names(model.PK),
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise

    def write_state(
        self,
        pk: str,
        *,
        sets: Mapping[str, Any],
        adds: Mapping[str, Any] | None = None,
        deletes: Mapping[str, set[str]] | None = None,
        condition: str | None = None,
        condition_names: tuple[str, ...] = (),
        condition_values: Mapping[str, Any] | None = None,
        still_applies: Callable[[dict[str, Any]], bool] | None = None,
        replica: StateReplica | None = None,
    ) -> WriteOutcome:
        """Update a state item, stamping ``updated_at_ms`` strictly above its previous value.

        Why: the timestamp is the item's version as clients see it (``updatedAtMs``), so it must
        grow in the order DynamoDB applies the writes to one replica, whatever the clocks of the
        Lambdas say. (Global tables settle concurrent writes from two Regions on their own write
        time, not on it: that is why each auction has one writing Region.)
        The write is conditioned on ``updated_at_ms < :ts``; when only that part fails (the
        caller's ``condition`` still applies to the item read back), it is retried just above
        the stored value. When the caller's condition fails, nothing is written and the current
        item is returned. ``replica``: where to write (default: this Region's).
        """
        replica = replica or self.local
        timestamp = self.clock.wall_ms()
        version_names = (model.UPDATED_AT_MS, model.WRITER_REGION)
        all_names = names(*version_names, *sets, *(adds or {}), *(deletes or {}), *condition_names)
        version_condition = (
            f"(attribute_not_exists(#{model.UPDATED_AT_MS}) OR #{model.UPDATED_AT_MS} < :ts)"
        )
        # DynamoDB rejects redundant parentheses, so add them only where OR needs them.
        full_condition = (
            f"({condition}) AND {version_condition}"
            if condition
            else version_condition.removeprefix("(").removesuffix(")")
        )
        set_parts = [f"#{name} = :s_{index}" for index, name in enumerate(sets)]
        set_parts += [f"#{model.UPDATED_AT_MS} = :ts", f"#{model.WRITER_REGION} = :region"]
        expression = "SET " + ", ".join(set_parts)
        if adds:
            expression += " ADD " + ", ".join(
                f"#{name} :a_{index}" for index, name in enumerate(adds)
            )
        if deletes:
            expression += " DELETE " + ", ".join(
                f"#{name} :d_{index}" for index, name in enumerate(deletes)
            )
        for _ in range(MAX_VERSION_RETRIES):
            values = {
                **{f":s_{index}": to_attr(value) for index, value in enumerate(sets.values())},
                **{
                    f":a_{index}": to_attr(value)
                    for index, value in enumerate((adds or {}).values())
                },
                **{
                    f":d_{index}": to_attr(value)
                    for index, value in enumerate((deletes or {}).values())
                },
                **{key: to_attr(value) for key, value in (condition_values or {}).items()},
                ":ts": to_attr(timestamp),
                ":region": to_attr(replica.region),
            }
            try:
                replica.client.update_item(
                    TableName=replica.table,
                    Key={model.PK: to_attr(pk)},
                    UpdateExpression=expression,
                    ConditionExpression=full_condition,
                    ExpressionAttributeNames=all_names,
                    ExpressionAttributeValues=values,
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return WriteOutcome(True, timestamp, None)
            except ClientError as exc:
                if not is_condition_failure(exc):
                    raise
                current = from_item(exc.response.get("Item")) or self._get_state_item(pk, replica)
            if current is None:
                continue  # deleted between the write and the read: try again
            if still_applies is not None and not still_applies(current):
                return WriteOutcome(False, timestamp, current)
            timestamp = max(self.clock.wall_ms(), int(current.get(model.UPDATED_AT_MS, 0)) + 1)
        raise StateWriteConflict(f"{pk}: still changing after {MAX_VERSION_RETRIES} attempts")

    def _get_state_item(
        self, pk: str, replica: StateReplica | None = None
    ) -> dict[str, Any] | None:
        replica = replica or self.local
        return from_item(
            replica.client.get_item(
                TableName=replica.table,
                Key={model.PK: to_attr(pk)},
                ConsistentRead=True,
            ).get("Item")
        )


@dataclass(frozen=True)
class WriteOutcome:
    """What :meth:`WsApiHandlers.write_state` did: written (at ``timestamp_ms``) or refused by
    the caller's condition (``current`` is the item that refused it)."""

    written: bool
    timestamp_ms: int
    current: dict[str, Any] | None


class _NotAuthorized(Exception):
    pass


class _HomeOutOfTime(Exception):
    """Not enough of the invocation left for a call to the auctions' home Region."""


# Answers that say the home's store is out of reach or overloaded, not that the request is wrong.
_TRANSIENT_CODES = frozenset(
    {
        "ThrottlingException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)


def _home_unreachable(exc: BaseException) -> bool:
    """Whether a failed call to the home Region is an outage (retry later) rather than a
    fault of this deployment (access denied, no such table), which must not pass for one."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return error_code(exc) in _TRANSIENT_CODES or status >= 500
    return isinstance(exc, (BotoCoreError, StateWriteConflict, _HomeOutOfTime))


def _describe(exc: BaseException) -> str:
    return (error_code(exc) or "error") if isinstance(exc, ClientError) else type(exc).__name__


def _time_left(context: Any) -> Callable[[], int] | None:
    """The invocation's remaining milliseconds, when Lambda's context says."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining if callable(remaining) else None


def _within_budget(
    messages: list[StoredMessage], budget: int, *, at_least_one: bool = True
) -> tuple[list[StoredMessage], bool]:
    """The leading ``messages`` whose data fits in ``budget`` bytes (with ``at_least_one``, the
    first one whatever its size, so that every subscribe makes progress), and whether any was
    left out."""
    kept: list[StoredMessage] = []
    for message in messages:
        if (kept or not at_least_one) and message.data_bytes > budget:
            return kept, True
        kept.append(message)
        budget -= message.data_bytes
    return kept, False


class _Refused(Exception):
    """A request refused with a stable error ``code`` naming ``field`` (not the client's
    syntax: who it is, or what this API offers)."""

    def __init__(self, code: str, field: str, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.field = field
        self.retryable = retryable


def _error(
    message: str,
    field: str | None,
    *,
    code: str,
    full: str | None = None,
    retryable: bool = False,
) -> dict[str, Any]:
    """An error reply: ``error`` is a stable code, ``message`` the human text naming the field."""
    reply: dict[str, Any] = {
        "type": model.WS_REPLY_ERROR,
        "error": code,
        "message": full or message,
    }
    if field is not None:
        reply["field"] = field
    if retryable:
        reply["retryable"] = True
    return reply


def _connection_id(event: Mapping[str, Any]) -> str:
    return str((event.get("requestContext") or {}).get("connectionId") or "")


def _authorized_sub(request_context: Mapping[str, Any]) -> str | None:
    authorizer = request_context.get("authorizer") or {}
    sub = authorizer.get(model.WS_CONTEXT_SUB) or authorizer.get("principalId")
    return sub if isinstance(sub, str) and sub else None


def _token_expires_at(request_context: Mapping[str, Any]) -> int | None:
    """When the connection's token expires (epoch seconds), as the authorizer passed it on;
    ``None`` for a connection authorized before it did."""
    value = (request_context.get("authorizer") or {}).get(model.WS_CONTEXT_TOKEN_EXPIRES_AT)
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _reader_tags(request_context: Mapping[str, Any], user_id: str) -> list[str]:
    """The connection's reader tags: its verified ``sub`` and the claim tags the authorizer
    passed on (:mod:`streamfleet.readers`)."""
    authorizer = request_context.get("authorizer") or {}
    return [
        readers.user_tag(user_id),
        *readers.decode_tags(authorizer.get(model.WS_CONTEXT_READER_TAGS)),
    ]


def _principal_kind(request_context: Mapping[str, Any]) -> str:
    """``canary`` for the canary's identity, else ``user``. A principal whose id carries the
    canary prefix counts as the canary even if the kind is missing (fail closed)."""
    authorizer = request_context.get("authorizer") or {}
    kind = authorizer.get(model.WS_CONTEXT_PRINCIPAL_KIND)
    sub = _authorized_sub(request_context) or ""
    if kind == model.WS_PRINCIPAL_CANARY or sub.startswith(model.CANARY_PRINCIPAL_PREFIX):
        return model.WS_PRINCIPAL_CANARY
    return model.WS_PRINCIPAL_USER


def _offered_subprotocols(event: Mapping[str, Any]) -> list[str]:
    headers = event.get("headers") or {}
    values = [v for k, v in headers.items() if k.lower() == "sec-websocket-protocol" and v]
    return [entry.strip() for value in values for entry in str(value).split(",")]


# --- Lambda entry point -------------------------------------------------------------------------

_ENV_NAMES = (*model.HANDLERS_ENV, "AWS_REGION")
_cached: tuple[tuple[str, ...], WsApiHandlers] | None = None
_cached_lock = threading.Lock()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point for every route (``streamfleet.wsapi.handlers.handler``).

    The clients live as long as the container; a configuration error fails every invocation
    with a log line naming the variable.
    """
    global _cached
    key = tuple(os.environ.get(name, "") for name in _ENV_NAMES)
    with _cached_lock:
        if _cached is None or _cached[0] != key:
            _cached = (key, WsApiHandlers(HandlerConfig.from_env()))
        handlers = _cached[1]
    started = time.monotonic()
    result = handlers(event, context)
    request_context = event.get("requestContext") or {}
    # DEBUG: one line per heartbeat of every client would dominate the log bill at INFO; the
    # decisions (connect, refusals, errors) are logged where they are made.
    log_event(
        logger,
        logging.DEBUG,
        "wsapi_invocation",
        route=request_context.get("routeKey"),
        status=result.get("statusCode"),
        connectionId=request_context.get("connectionId"),
        durationMs=round((time.monotonic() - started) * 1000, 1),
    )
    return result
