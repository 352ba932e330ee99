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
* ``getState``: the user (``user``) and, with live delivery, their subscriptions, from the
  (global) state table; each installed extension adds its own keys;
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

A deployment adds routes of its own through :mod:`.extensions`: its entry module builds the
Lambda entry point with :func:`make_handler` and its extensions (the demo auction's ``bid``,
``examples/auction``, is one). Nothing is imported by computed name, so each entry's asset
carries exactly what it imports.

State is keyed by the verified ``sub`` (``SUBS#<sub>``, and an extension's own keys), never by
connection id, so a client that reconnects, to this region or to the other one after a
failover, finds its state again.

**The canary is confined**: a connection whose authorizer context says ``principalKind`` is
``canary`` (a token signed by the canary's own key, see :mod:`streamfleet.wsapi.authorizer`)
may send ``heartbeat`` only; any other message gets an error reply and nothing is read or
written. Its ``$connect`` writes a connection record as every user's does, and its heartbeat
reads it, so a Region whose state store fails answers the canary as it answers its users.

Every JSON reply is one object with ``type``, the ``region`` that served it and the request's
``requestId`` echoed (when it had a valid one). No reply frame is larger than API Gateway's
32 KB frame limit: a reply that would be is replaced by an error reply (``reply_too_large``).
Replies go through the API Gateway Management API (``post_to_connection``) at the *regional*
endpoint of this API (a custom domain name would follow the failover DNS and might reach the
other region), or at ``APIGW_MANAGEMENT_ENDPOINT`` when set (the local stand-in sets it). A
``GoneException`` means the client left: its connection record is deleted.

The user's own items (subscriptions) are written in the Region that serves the user.

Environment: ``STATE_TABLE_NAME``, ``CONNECTIONS_TABLE_NAME``, ``AWS_REGION`` (set by Lambda),
optional ``APIGW_MANAGEMENT_ENDPOINT`` and ``CONNECTION_TTL_SECONDS``;
for live delivery all of ``STREAMS_TABLE_NAME`` (the fleet's lease table),
``MESSAGES_TABLE_NAME`` and ``SUBSCRIPTIONS_TABLE_NAME``, optionally
``SUBSCRIBE_NEWEST_MESSAGES`` (default 50) and ``REPLAY_MAX_MESSAGES`` (default 2,000) (names in
:data:`streamfleet.model.HANDLERS_ENV`).
Decisions and errors are logged as structured records (:mod:`streamfleet.logs`) at
INFO/WARNING.

The package, one concern a module: :mod:`.config` (the environment), :mod:`.messages` (what
clients send, and the refusals), :mod:`.replier` (the Management API), :mod:`.state_store`
(versioned writes of the state table), :mod:`.connections` (``$connect``/``$disconnect``),
:mod:`.subscribe` (``subscribe``, ``unsubscribe``), :mod:`.extensions` (the routes a deployment
adds); here, the dispatch of every event to them, ``getState``, the replies, and the Lambda
entry point (:func:`make_handler`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ... import model
from ...clock import SYSTEM_CLOCK, Clock
from ...env import EnvironmentCache
from ...logs import configured, log_event
from .config import HandlerConfig, make_dynamodb_client
from .connections import (
    Connections,
    connection_id_of,
    principal_kind_of,
    reader_tags_of,
    token_expires_at_of,
)
from .extensions import BoundExtension, ExtensionContext, RouteExtension
from .messages import (
    BadMessage,
    ExtensionMessage,
    GetState,
    Heartbeat,
    NotAuthorized,
    Refused,
    Subscribe,
    Unsubscribe,
    message_text,
    parse_routed,
    route_fields,
)
from .replier import ConnectionGone, ManagementApiReplier, Replier
from .state_store import StateReplica, StateStore, StateWriteConflict
from .subscribe import Subscriptions

logger = logging.getLogger(__name__)

CONNECT = "$connect"
DISCONNECT = "$disconnect"
DEFAULT = "$default"


class WsApiHandlers:
    """Every route of the WebSocket API. Thread-safe: the local gateway calls it concurrently."""

    def __init__(
        self,
        config: HandlerConfig,
        *,
        dynamodb: Any | None = None,
        replier: Replier | None = None,
        clock: Clock = SYSTEM_CLOCK,
        extensions: tuple[RouteExtension, ...] = (),
        environment: Mapping[str, str] | None = None,
    ):
        """``extensions``: the routes a deployment adds (:mod:`.extensions`), each bound here
        to these handlers' state table, client and clock; ``environment``: what they read
        their own settings from (default: the process's)."""
        self.config = config
        self.dynamodb = dynamodb or make_dynamodb_client(config.region)
        local = StateReplica(config.region, config.state_table, self.dynamodb)
        self.replier = replier or ManagementApiReplier(
            region=config.region, endpoint=config.management_endpoint
        )
        self.clock = clock
        self.state = StateStore(local, clock)
        self.connections = Connections(config, self.dynamodb, clock)
        self.subscriptions = Subscriptions(config, self.dynamodb, self.state, clock)
        self.extensions = tuple(extensions)
        self._fields = route_fields(self.extensions)  # refuses two claims on one route
        context = ExtensionContext(
            config=config,
            state=self.state,
            dynamodb=self.dynamodb,
            clock=clock,
            environment=os.environ if environment is None else environment,
        )
        self.bound: tuple[BoundExtension, ...] = tuple(e.bind(context) for e in self.extensions)
        self._serving = {
            route: bound
            for extension, bound in zip(self.extensions, self.bound, strict=True)
            for route in extension.routes
        }

    def extension(self, name: str) -> BoundExtension:
        """The installed extension called ``name``, as bound to these handlers."""
        for extension, bound in zip(self.extensions, self.bound, strict=True):
            if extension.name == name:
                return bound
        raise KeyError(name)

    @property
    def routes(self) -> tuple[str, ...]:
        """Every message route these handlers serve: the core's, then the extensions'."""
        return tuple(self._fields)

    # Entry point -----------------------------------------------------------------------------

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        """Handle one API Gateway WebSocket event; never raises."""
        request_context = event.get("requestContext") or {}
        route = request_context.get("routeKey")
        try:
            if route == CONNECT:
                return self.connections.on_connect(event)
            if route == DISCONNECT:
                return self.connections.on_disconnect(event)
            return self.on_message(event, _time_left(context))
        except Exception:
            logger.exception("wsapi %s failed (connection %s)", route, connection_id_of(event))
            return {"statusCode": 500}

    # Messages --------------------------------------------------------------------------------

    def on_message(
        self, event: Mapping[str, Any], time_left_ms: Callable[[], int] | None = None
    ) -> dict[str, Any]:
        """Parse, act, reply. Every failure becomes an error reply naming its cause.
        ``time_left_ms``: the invocation's remaining time (Lambda's context), if known."""
        request_context = event.get("requestContext") or {}
        connection_id = connection_id_of(event)
        request_id = None
        try:
            text = message_text(event, self.config.max_message_bytes)
            message = parse_routed(text, self.extensions, self._fields)
            request_id = message.request_id
            if isinstance(message, Heartbeat):
                if principal_kind_of(request_context) == model.WS_PRINCIPAL_CANARY:
                    # The canary's heartbeat reads its connection record first: a Region whose
                    # state store cannot be read answers it with an error, not with a pong.
                    self.connections.read(connection_id)
                self.send_pong(request_context, connection_id)
                return {"statusCode": 200}
            if principal_kind_of(request_context) == model.WS_PRINCIPAL_CANARY:
                # Checked before anything is read: the canary's identity owns no state.
                raise NotAuthorized("the canary identity may send heartbeat only")
            user_id = self.connections.user_of(request_context, connection_id)
            token_expires_at = token_expires_at_of(request_context)
            if token_expires_at is not None and token_expires_at <= self.clock.wall_ms() // 1000:
                # Its authorization ended with its token: nothing more is served on it, and the
                # fan-out closes it at its next delivery. The client reconnects with a new token.
                raise Refused(
                    "token_expired",
                    "token",
                    "token: expired; reconnect with a fresh one",
                )
            if isinstance(message, Subscribe):
                tags = reader_tags_of(request_context, user_id)
                reply, frames = self.subscriptions.subscribe(
                    user_id, tags, connection_id, message, token_expires_at=token_expires_at
                )
                if self.reply(request_context, connection_id, reply, request_id):
                    for frame in frames:
                        if not self._post(connection_id, request_context, frame):
                            break
                return {"statusCode": 200}
            if isinstance(message, Unsubscribe):
                reply = self.subscriptions.unsubscribe(user_id, connection_id, message.stream)
            elif isinstance(message, GetState):
                reply = self.get_state(user_id, message)
            elif isinstance(message, ExtensionMessage):
                reply = self._serving[message.route].handle(user_id, message.message, time_left_ms)
            else:  # every parsed message is one of the above
                raise TypeError(f"no route serves {type(message).__name__}")
        except BadMessage as bad:
            request_id = bad.request_id
            reply = _error(bad.message, bad.field, full=str(bad), code="bad_request")
        except NotAuthorized as exc:
            log_event(
                logger,
                logging.WARNING,
                "wsapi_message",
                decision="refuse",
                reason="not_authorized",
                route=request_context.get("routeKey"),
                principalKind=principal_kind_of(request_context),
                connectionId=connection_id,
                detail=str(exc),
            )
            reply = _error(str(exc), "authorization", code="forbidden")
        except Refused as refused:
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

    def get_state(self, user_id: str, message: GetState) -> dict[str, Any]:
        """The ``getState`` reply: the user and, with live delivery, the streams they are
        subscribed to (so a client that reconnects, in either Region, subscribes again from
        the server's state); each extension then adds its own keys."""
        reply: dict[str, Any] = {"type": model.WS_REPLY_STATE, "user": user_id}
        if self.config.live is not None:
            subscriptions = self.state.read(model.user_subscriptions_pk(user_id)) or {}
            reply["subscriptions"] = sorted(subscriptions.get(model.WS_STREAMS) or ())
        for bound, request in zip(self.bound, message.extensions, strict=True):
            reply = bound.add_state(user_id, request, reply)
        return reply

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
                self.connections.forget(connection_id)
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


def _time_left(context: Any) -> Callable[[], int] | None:
    """The invocation's remaining milliseconds, when Lambda's context says."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return remaining if callable(remaining) else None


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


# --- Lambda entry point -------------------------------------------------------------------------


def make_handler(
    extensions: tuple[RouteExtension, ...] = (),
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """A Lambda entry point serving the core routes and ``extensions``' (the entry module of
    an application that adds routes calls this with its own, by name: nothing is imported by
    computed name).

    The handlers live as long as the container, in a cache of their own rebuilt only when a
    variable they read changes; a configuration error fails every invocation with a log line
    naming the variable.
    """
    names = (
        *model.HANDLERS_ENV,
        "AWS_REGION",
        *(name for extension in extensions for name in extension.environment),
    )
    cache = EnvironmentCache(
        names, lambda: WsApiHandlers(HandlerConfig.from_env(), extensions=extensions)
    )

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        handlers = configured(cache, logger, context)
        started = time.monotonic()
        result = handlers(event, context)
        request_context = event.get("requestContext") or {}
        # DEBUG: one line per heartbeat of every client would dominate the log bill at INFO;
        # the decisions (connect, refusals, errors) are logged where they are made.
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

    return handler


# The core's entry point (``streamfleet.wsapi.handlers.handler``): the core routes only.
handler = make_handler()
