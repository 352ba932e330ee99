"""Checks applied at the edges, before anything is written.

Every failure is a ``ValueError`` whose message starts with the name of the offending field, so
an HTTP handler can turn it into a 400 and a worker can refuse to start with a clear message.
"""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit

MAX_ID_BYTES = 512
# Letters, digits and . _ : - : safe in keys, URLs, log lines and shell commands alike.
ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]+")
ID_CHARSET_DOC = "letters, digits and . _ : -"

MAX_URL_BYTES = 2048
WEBSOCKET_SCHEMES = ("ws", "wss")


def check_id(field: str, value: object) -> str:
    """An identifier (connection id, worker id): 1 to 512 bytes of ``ID_CHARSET_DOC``."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if len(value.encode()) > MAX_ID_BYTES:
        raise ValueError(f"{field}: longer than {MAX_ID_BYTES} bytes")
    if not ID_PATTERN.fullmatch(value):
        raise ValueError(f"{field}: only {ID_CHARSET_DOC} are allowed")
    return value


def check_ws_url(field: str, value: object) -> str:
    """A ``ws://`` or ``wss://`` URL with a host, at most ``MAX_URL_BYTES`` long."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {type(value).__name__}")
    if len(value.encode()) > MAX_URL_BYTES:
        raise ValueError(f"{field}: longer than {MAX_URL_BYTES} bytes")
    try:
        parts = urlsplit(value)
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ValueError(f"{field}: not a valid URL") from None
    if parts.scheme not in WEBSOCKET_SCHEMES:
        raise ValueError(f"{field}: scheme must be ws:// or wss://")
    if not hostname:
        raise ValueError(f"{field}: has no host")
    if any(ch.isspace() for ch in value):
        raise ValueError(f"{field}: must not contain whitespace")
    return value


def check_positive_seconds(field: str, value: object) -> float:
    """A finite duration in seconds, greater than zero (fractions allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: expected a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field}: must be a finite number of seconds greater than zero")
    return float(value)


def check_non_negative_seconds(field: str, value: object) -> float:
    """A finite duration in seconds, zero or more."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: expected a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{field}: must be a finite number of seconds, zero or more")
    return float(value)


def check_positive_int(field: str, value: object) -> int:
    """A whole number greater than zero."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}: expected a whole number, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{field}: must be greater than zero")
    return value
