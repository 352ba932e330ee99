"""What clients send: every message parsed and checked completely (:func:`parse_message`), and
the refusals that answer a request with an error reply naming its cause."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import model, strict_json
from ...request_body import BodyRefused, Refusal, decode_body
from ...validation import ID_CHARSET_DOC, ID_PATTERN, MAX_ID_BYTES

MAX_REQUEST_ID_CHARS = model.MAX_WS_REQUEST_ID_CHARS
MAX_AUCTION_ID_CHARS = 128
MAX_BID_AMOUNT = 10**15  # below 2**53 (JavaScript clients) and BID_AMOUNT_DIGITS digits
MAX_STREAM_ID_BYTES = MAX_ID_BYTES  # a stream is a fleet connection id (validation.check_id)
MAX_SEQ = model.MAX_SEQ  # JavaScript clients count in doubles

FIELDS: dict[str, tuple[str, ...]] = {
    model.WS_ROUTE_HEARTBEAT: ("action", "requestId"),
    model.WS_ROUTE_GET_STATE: ("action", "requestId", "auction"),
    model.WS_ROUTE_BID: ("action", "requestId", "auction", "amount"),
    model.WS_ROUTE_SUBSCRIBE: ("action", "requestId", "stream", "after", "afterEpoch"),
    model.WS_ROUTE_UNSUBSCRIBE: ("action", "requestId", "stream"),
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
