"""The event router Lambda: START or STOP a connection, or read its state.

API Gateway REST API, Lambda proxy integration (payload format 1.0):

* ``POST /events`` with ``{"event_type": "START", "connection_id": ..., "ws_url": ...}`` (and
  optionally ``"readers": ["user:<sub>", "<claim>:<value>", ...]``, who may subscribe to the
  stream through the WebSocket API: nobody unless named; a START that names them replaces
  them, one that does not leaves them as they are) or
  ``{"event_type": "STOP", "connection_id": ...}``;
* ``GET /connections/{connection_id}``.

Every request is validated completely (:func:`~streamfleet.request_body.decode_body`,
:func:`parse_event`, both pure) before any AWS call, so a bad request writes nothing. The writes
themselves are :class:`~streamfleet.desired_state.DesiredStateWriter`'s conditional updates,
which never disturb a running lease; a START that makes a connection claimable is followed by
one SQS notification.

Configuration comes from the environment (``TABLE_NAME``, ``QUEUE_URL``, ``ALLOWED_UPSTREAMS``,
optional ``MAX_BODY_BYTES``), validated on first use and cached; a bad value turns every request
into a 500 naming the variable.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from . import model, readers, strict_json
from .aws import AsyncClient, ClientSettings
from .control import ControlPlane
from .desired_state import Outcome
from .env import ConfigError, required
from .lease.dynamo import error_code
from .lease.errors import StoreUnavailable
from .logs import log_event
from .request_body import BodyRefused, decode_body
from .validation import check_id, check_ws_url
from .warm import WarmContainer
from .worker.upstream_policy import UpstreamPolicy

logger = logging.getLogger(__name__)

# Room for the largest START the request model admits: its fixed fields, and every reader
# entry at its longest with each character JSON-escaped as a surrogate pair (12 bytes). A
# smaller bound would refuse, after API Gateway accepted it, a START that is valid.
DEFAULT_MAX_BODY_BYTES = 4096 + model.MAX_READERS * (12 * model.MAX_READER_CHARS + 4)

START = "START"
STOP = "STOP"
EVENT_TYPE = "event_type"
CONNECTION_ID = "connection_id"
WS_URL = model.WS_URL
READERS = model.READERS
FIELDS = {START: (EVENT_TYPE, CONNECTION_ID, WS_URL, READERS), STOP: (EVENT_TYPE, CONNECTION_ID)}

EVENTS_RESOURCE = "/events"
CONNECTION_RESOURCE = "/connections/{connection_id}"
CONNECTIONS_PREFIX = "/connections/"

STATUS = {
    Outcome.CREATED: 201,
    Outcome.RESTARTED: 200,
    Outcome.UNCHANGED: 200,
    Outcome.STOPPED: 200,
    Outcome.NOT_FOUND: 404,
    Outcome.CONFLICT: 409,
}

# The notification only shortens the wait: an unowned STARTED row is also found by the workers'
# orphan scan, so a few quick tries are enough and a failure does not fail the request.
# Lambda runs one invocation at a time per container; two threads are plenty.
CLIENT_SETTINGS = ClientSettings(threads=2)
LOGGED_FIELD_CHARS = 64

# DynamoDB accepts a table name or (since 2024) a table ARN as TableName.
TABLE_NAME_PATTERN = re.compile(
    r"[A-Za-z0-9_.\-]{3,255}|arn:aws[a-z\-]*:dynamodb:[a-z0-9\-]+:\d{12}:table/[A-Za-z0-9_.\-]{3,255}"
)


# --- Request parsing (pure) -----------------------------------------------------------------


class BadRequest(ValueError):
    """A request the router refuses with a 400; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class StartEvent:
    """A validated START: the URL is well formed and allow-listed."""

    connection_id: str
    ws_url: str
    readers: tuple[str, ...] | None = None  # None: leave the stream's readers as they are


@dataclass(frozen=True)
class StopEvent:
    """A validated STOP."""

    connection_id: str


def _field_error(field: str, exc: ValueError) -> BadRequest:
    """Turn a ``ValueError("<field>: <message>")`` from the shared checks into a BadRequest."""
    prefix = f"{field}: "
    text = str(exc)
    return BadRequest(field, text[len(prefix) :] if text.startswith(prefix) else text)


def _string(payload: dict[str, Any], field: str) -> str:
    if field not in payload:
        raise BadRequest(field, "required")
    value = payload[field]
    if not isinstance(value, str):
        raise BadRequest(field, f"expected a string, got {strict_json.json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a JSON escape of a lone surrogate: not storable in DynamoDB
        raise BadRequest(field, "not valid Unicode") from None
    return value


def check_connection_id(value: object) -> str:
    """A connection id as the router accepts it (``validation.check_id``), else BadRequest."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(CONNECTION_ID, "not valid Unicode") from None
    try:
        return check_id(CONNECTION_ID, value)
    except ValueError as exc:
        raise _field_error(CONNECTION_ID, exc) from None


def check_allowed_url(value: str, policy: UpstreamPolicy) -> str:
    """A ``ws://``/``wss://`` URL (:func:`~streamfleet.validation.check_ws_url`), on the
    allow-list."""
    try:
        check_ws_url(WS_URL, value)
    except ValueError as exc:
        raise _field_error(WS_URL, exc) from None
    try:
        policy.check(value)
    except ValueError as exc:
        raise _field_error(WS_URL, exc) from None
    return value


def parse_event(body_text: str, policy: UpstreamPolicy) -> StartEvent | StopEvent:
    """Validate a ``POST /events`` body completely; :class:`BadRequest` names the first bad field.

    Strict on purpose: the event type is case-sensitive, unknown and duplicated fields are
    refused (a typo such as ``wsurl`` must not silently mean "no URL"), and the URL must be on
    the same allow-list the workers enforce, so a refused URL never becomes a STARTED row.
    """
    try:
        payload = strict_json.loads(body_text)
    except strict_json.DuplicateMember as dup:
        raise BadRequest(dup.member, "appears more than once") from None
    except (ValueError, RecursionError):
        raise BadRequest("body", "not valid JSON") from None
    if not isinstance(payload, dict):
        raise BadRequest("body", f"expected a JSON object, got {strict_json.json_type(payload)}")
    event_type = _string(payload, EVENT_TYPE)
    if event_type not in FIELDS:
        raise BadRequest(EVENT_TYPE, f"must be {START} or {STOP}")
    for key in payload:
        if key not in FIELDS[event_type]:
            raise BadRequest(key, f"unknown field for {event_type}")
    connection_id = check_connection_id(_string(payload, CONNECTION_ID))
    if event_type == STOP:
        return StopEvent(connection_id)
    ws_url = check_allowed_url(_string(payload, WS_URL), policy)
    names = None
    if READERS in payload:
        try:
            names = readers.check_readers(READERS, payload[READERS])
        except ValueError as exc:
            field, _, message = str(exc).partition(": ")
            raise BadRequest(field, message) from None
    return StartEvent(connection_id, ws_url, names)


# --- Configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterConfig:
    """The router's settings, immutable once read."""

    table_name: str
    queue_url: str
    upstreams: UpstreamPolicy
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RouterConfig:
        """Read and validate the environment; :class:`ConfigError` names the first bad one."""
        env = os.environ if env is None else env
        table_name = required(env, model.ENV_TABLE_NAME)
        if not TABLE_NAME_PATTERN.fullmatch(table_name):
            raise ConfigError(model.ENV_TABLE_NAME, "not a DynamoDB table name or table ARN")
        queue_url = required(env, model.ENV_QUEUE_URL)
        parts = urlsplit(queue_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(model.ENV_QUEUE_URL, "not an http(s) SQS queue URL")
        try:
            upstreams = UpstreamPolicy.parse(
                model.ENV_ALLOWED_UPSTREAMS, required(env, model.ENV_ALLOWED_UPSTREAMS)
            )
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(model.ENV_ALLOWED_UPSTREAMS, str(exc).partition(": ")[2]) from None
        raw_max = env.get("MAX_BODY_BYTES", "").strip()
        max_body_bytes = DEFAULT_MAX_BODY_BYTES
        if raw_max:
            if not raw_max.isdigit() or int(raw_max) <= 0:
                raise ConfigError("MAX_BODY_BYTES", f"{raw_max!r} is not a whole number above 0")
            max_body_bytes = int(raw_max)
        return cls(table_name, queue_url, upstreams, max_body_bytes)


# --- Responses ------------------------------------------------------------------------------


def response(status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict:
    """A proxy-integration response with a JSON body."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": "application/json", **(headers or {})},
        "body": json.dumps(payload, separators=(",", ":")),
        "isBase64Encoded": False,
    }


def error_response(status: int, message: str, **extra: Any) -> dict:
    """``{"error": message, ...}`` with ``status``."""
    return response(status, {"error": message, **extra})


def connection_state(item: dict[str, Any]) -> dict[str, Any]:
    """The public view of a connection row (no index bookkeeping attributes)."""
    state = {
        model.DESIRED_STATE: item.get(model.DESIRED_STATE),
        model.WS_URL: item.get(model.WS_URL),
        model.LEASE_OWNER: item.get(model.LEASE_OWNER),
        # null: never checkpointed; the checkpoint is a log position, shown as seq and epoch
        model.LAST_SEQ: model.split_position(item.get(model.LAST_SEQ))[1],
        model.API_EPOCH: model.split_position(item.get(model.LAST_SEQ))[0],
        model.LEASE_VERSION: item.get(model.LEASE_VERSION, 0),
        model.UPDATED_AT_MS: item.get(model.UPDATED_AT_MS),
    }
    if model.REFUSED_REASON in item:
        state[model.REFUSED_REASON] = item[model.REFUSED_REASON]
    # A stream its owner failed with: held off until then, and why (cleared by progress).
    for name in model.HOLD_OFF_ATTRIBUTES:
        if name in item:
            state[name] = item[name]
    if item.get(model.READERS):
        state[model.READERS] = sorted(item[model.READERS])
    return state


# --- Routing (pure) -------------------------------------------------------------------------


class NoRoute(Exception):
    """The request matched no route (404) or not with this method (405)."""

    def __init__(self, status: int, message: str, allow: str | None = None):
        super().__init__(message)
        self.status = status
        self.allow = allow


def route(event: Mapping[str, Any]) -> tuple[str, str | None]:
    """``("events", None)`` or ``("connection", raw_id)`` for an API Gateway proxy event.

    Uses the ``resource`` template when API Gateway supplies one and falls back on the path, so
    the same handler serves a greedy ``{proxy+}`` resource and the local HTTP adapter.
    """
    method = event.get("httpMethod")
    resource = event.get("resource") or ""
    path = (event.get("path") or "").rstrip("/") or "/"
    if resource == EVENTS_RESOURCE or path == EVENTS_RESOURCE:
        if method != "POST":
            raise NoRoute(405, f"method: {method} not allowed on {EVENTS_RESOURCE}", "POST")
        return "events", None
    raw_id = (event.get("pathParameters") or {}).get(CONNECTION_ID)
    if raw_id is None and path.startswith(CONNECTIONS_PREFIX):
        raw_id = path[len(CONNECTIONS_PREFIX) :]
        if "/" in raw_id:
            raise NoRoute(404, "path: not found")
    if resource == CONNECTION_RESOURCE or raw_id is not None:
        if method != "GET":
            raise NoRoute(405, f"method: {method} not allowed on {CONNECTION_RESOURCE}", "GET")
        # Clients may percent-encode ':' and the path fallback is never decoded; '%' is no id
        # character, so decoding once can only turn an invalid id into the one that was meant.
        return "connection", unquote(raw_id or "")
    raise NoRoute(404, "path: not found")


# --- AWS side -------------------------------------------------------------------------------


class EventRouter:
    """Applies validated events to the lease table and the queue."""

    def __init__(self, config: RouterConfig, *, dynamodb: AsyncClient, sqs: AsyncClient):
        self.config = config
        self.control = ControlPlane.create(
            dynamodb=dynamodb, sqs=sqs, table_name=config.table_name, queue_url=config.queue_url
        )

    async def apply(self, event: StartEvent | StopEvent) -> tuple[int, dict[str, Any], Outcome]:
        """Run a START or STOP; the status, the response payload and the outcome."""
        notified = None
        if isinstance(event, StartEvent):
            # The readers go in the START's own write: they apply to this START alone.
            result, notified = await self.control.start(
                event.connection_id, event.ws_url, event.readers
            )
        else:
            result = await self.control.stop(event.connection_id)
        payload: dict[str, Any] = {
            CONNECTION_ID: event.connection_id,
            "outcome": result.outcome.value,
            "state": connection_state(result.item) if result.item else None,
        }
        if notified is not None:
            payload["notified"] = notified
        if result.outcome is Outcome.CONFLICT:
            payload["error"] = f"{WS_URL}: {result.detail}"
            payload["field"] = WS_URL
        elif result.outcome is Outcome.NOT_FOUND:
            payload["error"] = f"{CONNECTION_ID}: no such connection"
            payload["field"] = CONNECTION_ID
        return STATUS[result.outcome], payload, result.outcome

    async def read(self, connection_id: str) -> dict[str, Any] | None:
        """The connection's public state, or ``None`` if it never existed."""
        item = await self.control.writer.read(model.connection_pk(connection_id))
        return connection_state(item) if item else None


# --- Per-container state --------------------------------------------------------------------


def _build_router(clients: Callable[[], tuple[AsyncClient, ...]]) -> EventRouter:
    config = RouterConfig.from_env()
    dynamodb, sqs = clients()
    return EventRouter(config, dynamodb=dynamodb, sqs=sqs)


_CONTAINER = WarmContainer(
    (model.ENV_TABLE_NAME, model.ENV_QUEUE_URL, model.ENV_ALLOWED_UPSTREAMS, "MAX_BODY_BYTES"),
    ("dynamodb", "sqs"),
    _build_router,
    CLIENT_SETTINGS,
)


def reset() -> None:
    """Forget the cached config, clients and event loop (tests; a new environment)."""
    with _CONTAINER.lock:
        _CONTAINER.reset()


# --- Entry point ----------------------------------------------------------------------------


def _dispatch(event: Mapping[str, Any], log: dict[str, Any]) -> dict[str, Any]:
    try:
        kind, raw_id = route(event)
    except NoRoute as missing:
        headers = {"Allow": missing.allow} if missing.allow else None
        field = str(missing).partition(":")[0]
        return response(missing.status, {"error": str(missing), "field": field}, headers)
    log["route"] = kind
    try:
        router = _CONTAINER.get()
        if kind == "connection":
            connection_id = check_connection_id(raw_id)
            log[CONNECTION_ID] = connection_id
            state = _CONTAINER.run(router.read(connection_id))
            if state is None:
                return error_response(
                    404, f"{CONNECTION_ID}: no such connection", field=CONNECTION_ID
                )
            return response(200, {CONNECTION_ID: connection_id, "state": state})
        text = decode_body(
            event.get("body"),
            event.get("isBase64Encoded") is True,  # API Gateway sends a JSON boolean
            router.config.max_body_bytes,
        )
        parsed = parse_event(text, router.config.upstreams)
        log[EVENT_TYPE] = START if isinstance(parsed, StartEvent) else STOP
        log[CONNECTION_ID] = parsed.connection_id
        status, payload, outcome = _CONTAINER.run(router.apply(parsed))
        log["outcome"] = outcome.value
        return response(status, payload)
    except (BadRequest, BodyRefused) as bad:
        # The field may be an attacker's key: bounded in the log, returned as sent to the caller.
        log["error_field"] = bad.field[:LOGGED_FIELD_CHARS]
        return error_response(400, str(bad), field=bad.field)
    except ConfigError as bad_config:
        log["error"] = "config"
        log["variable"] = bad_config.variable
        return error_response(500, f"configuration: {bad_config}", variable=bad_config.variable)
    except StoreUnavailable:
        log["error"] = "store_unavailable"
        return error_response(503, "the store is unavailable; retry later")


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (``streamfleet.event_router.handler``).

    Must not be called from inside a running event loop: it drives its own loop, reused across
    warm invocations so the clients' connection pools survive.
    """
    started = time.monotonic()
    log: dict[str, Any] = {
        "request_id": getattr(context, "aws_request_id", None),
        "method": event.get("httpMethod") if isinstance(event, dict) else None,
    }
    try:
        with _CONTAINER.lock:
            result = _dispatch(event, log)
    except Exception as exc:
        # No message, no traceback in the response: they could carry internals.
        log["error"] = type(exc).__name__
        log["error_code"] = error_code(exc)
        result = error_response(500, "internal error")
    log["status"] = result["statusCode"]
    log["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    # One record per request; a 5xx (the configuration, the store, a bug) at ERROR, so a
    # function logging at WARN still shows it.
    level = logging.ERROR if result["statusCode"] >= 500 else logging.INFO
    log_event(logger, level, "request", **log)
    return result
