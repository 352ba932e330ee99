"""The body of an API Gateway proxy event as text, for every edge that takes one.

The body comes from the caller: its size is bounded before any work that grows with it (the
base64 decoding), and again once decoded. Edges word a refusal for their own clients (a
WebSocket client sends frames, not HTTP bodies), so each refusal carries its reason as well as
a plain message.
"""

from __future__ import annotations

import base64
from enum import StrEnum


class Refusal(StrEnum):
    """Why a body is refused."""

    MISSING = "missing"
    EMPTY = "empty"
    NOT_TEXT = "not_text"
    TOO_LARGE = "too_large"
    NOT_BASE64 = "not_base64"
    NOT_UTF8_TEXT = "not_utf8_text"  # lone surrogates: the text has no UTF-8 form
    NOT_UTF8_BYTES = "not_utf8_bytes"  # decoded bytes that are not UTF-8 (binary data)


class BodyRefused(ValueError):
    """A body refused for ``reason``; ``field`` is always ``body``."""

    field = "body"

    def __init__(self, reason: Refusal, message: str):
        super().__init__(f"{self.field}: {message}")
        self.reason = reason
        self.message = message


def decode_body(body: object, is_base64: bool, max_bytes: int) -> str:
    """The body as text: present, decoded from base64 if ``is_base64``, within ``max_bytes``
    bytes (after decoding) and valid UTF-8. :class:`BodyRefused` otherwise."""
    if body is None:
        raise BodyRefused(Refusal.MISSING, "required")
    if not isinstance(body, str):
        raise BodyRefused(Refusal.NOT_TEXT, f"expected a string, got {type(body).__name__}")
    too_large = BodyRefused(Refusal.TOO_LARGE, f"larger than {max_bytes} bytes")
    if is_base64:
        # Bound the work before decoding: n bytes take 4 * ceil(n / 3) base64 characters.
        if len(body) > 4 * (max_bytes // 3 + 1):
            raise too_large
        try:
            raw = base64.b64decode(body, validate=True)
        except ValueError:  # binascii.Error, or a non-ASCII str
            raise BodyRefused(Refusal.NOT_BASE64, "not valid base64") from None
    else:
        if len(body) > max_bytes:  # each character is at least one byte
            raise too_large
        try:
            raw = body.encode("utf-8")
        except UnicodeEncodeError:
            raise BodyRefused(Refusal.NOT_UTF8_TEXT, "not valid UTF-8") from None
    if len(raw) > max_bytes:
        raise too_large
    if not raw:
        raise BodyRefused(Refusal.EMPTY, "required (empty)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyRefused(Refusal.NOT_UTF8_BYTES, "not valid UTF-8") from None
