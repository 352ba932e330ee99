"""What clients send: every message parsed and checked completely (:func:`parse_message`), and
the refusals that answer a request with an error reply naming its cause. The checks of a field
(:func:`identifier`, :func:`whole_number`) are shared with the routes an extension adds
(:mod:`.extensions`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ... import model, strict_json
from ...request_body import BodyRefused, Refusal, decode_body
from ...validation import ID_CHARSET_DOC, ID_PATTERN, MAX_ID_BYTES
from .extensions import COMMON_FIELDS, RouteExtension

MAX_REQUEST_ID_CHARS = model.MAX_WS_REQUEST_ID_CHARS
MAX_STREAM_ID_BYTES = MAX_ID_BYTES  # a stream is a fleet connection id (validation.check_id)
MAX_SEQ = model.MAX_SEQ  # JavaScript clients count in doubles

# The core routes' fields; an extension's routes, and its getState fields, come on top.
FIELDS: dict[str, tuple[str, ...]] = {
    model.WS_ROUTE_HEARTBEAT: COMMON_FIELDS,
    model.WS_ROUTE_GET_STATE: COMMON_FIELDS,
    model.WS_ROUTE_SUBSCRIBE: (*COMMON_FIELDS, "stream", "after", "afterEpoch"),
    model.WS_ROUTE_UNSUBSCRIBE: (*COMMON_FIELDS, "stream"),
}


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
    # What each installed extension's StateRequest parsed (None for one without), in order.
    extensions: tuple[Any, ...] = ()


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


@dataclass(frozen=True)
class ExtensionMessage:
    """A message of a route an extension added: ``message`` is what its parser returned."""

    route: str
    message: Any
    request_id: str | None = None


Message = Heartbeat | GetState | Subscribe | Unsubscribe | ExtensionMessage


def message_text(event: Mapping[str, Any], max_bytes: int) -> str:
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


def identifier(payload: Mapping[str, Any], field: str, max_chars: int) -> str:
    """``payload[field]``: an identifier of at most ``max_chars`` characters of
    :data:`~streamfleet.validation.ID_PATTERN`; :class:`BadMessage` naming ``field``."""
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
    return identifier(payload, "stream", MAX_STREAM_ID_BYTES)  # ASCII: characters are bytes


def whole_number(
    payload: Mapping[str, Any],
    field: str,
    what: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_SEQ,
) -> int:
    """``payload[field]``: a whole number (a JSON number without a fraction) from ``minimum``
    to ``maximum``; :class:`BadMessage` naming ``field``, ``what`` saying what was expected."""
    value = payload[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadMessage(field, f"expected {what}, got {strict_json.json_type(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadMessage(field, "expected a whole number, got a fraction")
        value = int(value)
    if not minimum <= value <= maximum:
        raise BadMessage(field, f"must be between {minimum} and {maximum}")
    return value


def _after(payload: Mapping[str, Any]) -> int | None:
    """The log position after which to replay: ``after`` (a seq, or null for the newest few)
    in epoch ``afterEpoch`` (0 when absent)."""
    epoch = 0
    if payload.get("afterEpoch") is not None:
        epoch = whole_number(payload, "afterEpoch", "an epoch")
    if payload.get("after") is None:
        return None
    return model.log_position(epoch, whole_number(payload, "after", "a seq or null"))


def route_fields(extensions: Sequence[RouteExtension] = ()) -> dict[str, tuple[str, ...]]:
    """Every route's allowed fields: the core's, then each extension's routes, with each
    extension's ``getState`` fields added to the core's. ``ValueError`` if two claim one route
    or one ``getState`` field."""
    fields = dict(FIELDS)
    for extension in extensions:
        for route, spec in extension.routes.items():
            if route in fields or route.startswith("$"):
                raise ValueError(f"{extension.name}: route {route!r} is taken")
            fields[route] = (*COMMON_FIELDS, *spec.fields)
        if extension.state_request is not None:
            state = fields[model.WS_ROUTE_GET_STATE]
            taken = set(state) & set(extension.state_request.fields)
            if taken:
                raise ValueError(f"{extension.name}: getState field {sorted(taken)[0]!r} is taken")
            fields[model.WS_ROUTE_GET_STATE] = (*state, *extension.state_request.fields)
    return fields


def parse_message(text: str, extensions: Sequence[RouteExtension] = ()) -> Message:
    """Validate one client message completely; :class:`BadMessage` names the first bad field.

    Strict: unknown and duplicated fields are refused, so a typo (``ammount``) is an error
    instead of a silently missing value. ``extensions``: the routes and ``getState`` fields
    they add (:mod:`.extensions`); any other action is unknown.
    """
    return parse_routed(text, extensions, route_fields(extensions))


def parse_routed(
    text: str, extensions: Sequence[RouteExtension], fields: Mapping[str, tuple[str, ...]]
) -> Message:
    """:func:`parse_message` with ``fields`` already computed by :func:`route_fields`."""
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
            request_id = identifier(payload, "requestId", MAX_REQUEST_ID_CHARS)
        except (KeyError, BadMessage):
            request_id = None
        return Heartbeat(request_id)
    request_id = None
    if "requestId" in payload:
        request_id = identifier(payload, "requestId", MAX_REQUEST_ID_CHARS)
    try:
        if model.WS_ROUTE_SELECTION_FIELD not in payload:
            raise BadMessage("action", "required")
        action = payload["action"]
        if not isinstance(action, str):
            raise BadMessage("action", f"expected a string, got {strict_json.json_type(action)}")
        if action not in fields:
            shown = action[:40]
            raise BadMessage("action", f"unknown action {shown!r} (expected {', '.join(fields)})")
        for key in payload:
            if key not in fields[action]:
                raise BadMessage(key, f"unknown field for {action}")
        if action == model.WS_ROUTE_GET_STATE:
            return GetState(
                request_id,
                tuple(
                    None if e.state_request is None else e.state_request.parse(payload)
                    for e in extensions
                ),
            )
        if action == model.WS_ROUTE_SUBSCRIBE:
            return Subscribe(_stream(payload), _after(payload), request_id, "afterEpoch" in payload)
        if action == model.WS_ROUTE_UNSUBSCRIBE:
            return Unsubscribe(_stream(payload), request_id)
        (route,) = [e.routes[action] for e in extensions if action in e.routes]
        return ExtensionMessage(action, route.parse(payload), request_id)
    except BadMessage as bad:
        bad.request_id = request_id
        raise


class NotAuthorized(Exception):
    """The connection's principal may not do this (the canary's identity, a connection without
    a verified user)."""


class Refused(Exception):
    """A request refused with a stable error ``code`` naming ``field`` (not the client's
    syntax: who it is, or what this API offers)."""

    def __init__(self, code: str, field: str, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.field = field
        self.retryable = retryable
