"""Checks applied at the edges, before anything is written.

Every failure is a ``ValueError`` whose message starts with the name of the offending field, so
an HTTP handler can turn it into a 400 and a worker can refuse to start with a clear message.
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from urllib.parse import urlsplit

MAX_ID_BYTES = 512
# Letters, digits and . _ : - : safe in keys, URLs, log lines and shell commands alike.
ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]+")
ID_CHARSET_DOC = "letters, digits and . _ : -"
REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")  # us-east-1, ap-southeast-2

# A metric's service dimension (SERVICE_NAME), which the constructs may derive from a path.
MAX_SERVICE_NAME_CHARS = 64
SERVICE_NAME_PATTERN = re.compile(r"[A-Za-z0-9-]+")

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


def check_service_name(field: str, value: object) -> str:
    """A metrics service dimension: 1 to ``MAX_SERVICE_NAME_CHARS`` letters, digits and -."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_SERVICE_NAME_CHARS
        or not SERVICE_NAME_PATTERN.fullmatch(value)
    ):
        raise ValueError(
            f"{field}: 1 to {MAX_SERVICE_NAME_CHARS} letters, digits and -, got {value!r}"
        )
    return value


_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def check_ws_url(field: str, value: object) -> str:
    """A ``ws://`` or ``wss://`` URL with a valid host (:func:`canonical_host`), at most
    ``MAX_URL_BYTES`` long, without whitespace or control characters."""
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
    # A NUL or another control character is no whitespace: no worker could dial it, and it
    # would reach logs and dashboards verbatim.
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValueError(f"{field}: must not contain control characters")
    canonical_host(field, hostname)
    return value


def canonical_host(field: str, host: str) -> str:
    """``host`` as the one ASCII string that is matched, resolved and dialled: an IP literal in
    its compressed form, or a DNS name IDNA-encoded, lower-case, without a trailing dot, of
    labels of letters, digits and inner hyphens (1 to 63 each, 253 in all; the last not all
    digits). Anything else (a
    NUL or another control character, an empty label, ``_``, a second trailing dot) is refused:
    the C resolver would stop at a NUL and resolve what precedes it."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    try:
        ascii_name = name.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"{field}: host {host!r} is not a valid DNS name") from None
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{field}: host {host!r} is not a valid DNS name")
    if labels[-1].isdigit():
        # No top-level domain is numeric: the resolver would read it as an IPv4 address in
        # another spelling (127.000.0.1, 2130706433, 0x7f.1).
        raise ValueError(f"{field}: host {host!r} is neither an IP address nor a DNS name")
    return ascii_name


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
