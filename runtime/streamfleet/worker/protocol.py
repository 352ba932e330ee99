"""Upstream framing and resume rules, as a pluggable adapter.

The default protocol: JSON text frames ``{"seq": <int>, "data": ...}``; to resume, append
``last_seq=<n>`` to the URL's query string and the upstream replays everything after ``n``.
Another upstream plugs in its own :class:`UpstreamProtocol`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class ProtocolError(ValueError):
    """A frame the protocol cannot read."""


@dataclass(frozen=True)
class UpstreamMessage:
    """One message with its position in the stream."""

    seq: int
    data: Any


class UpstreamProtocol(Protocol):
    """What the worker needs to know about an upstream's wire format."""

    def resume_url(self, ws_url: str, last_seq: int | None) -> str:
        """The URL to dial to receive everything after ``last_seq``; ``None``: from now on."""

    def parse(self, frame: str | bytes) -> UpstreamMessage:
        """One frame as a message; :class:`ProtocolError` if malformed."""


class JsonSeqProtocol:
    """``{"seq": n, "data": ...}`` frames; resume with ``?last_seq=n``."""

    def resume_url(self, ws_url: str, last_seq: int | None) -> str:
        if last_seq is None:
            return ws_url
        parts = urlsplit(ws_url)
        query = [
            (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "last_seq"
        ]
        query.append(("last_seq", str(last_seq)))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def parse(self, frame: str | bytes) -> UpstreamMessage:
        try:
            payload = json.loads(frame)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"frame is not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise ProtocolError("frame is not a JSON object")
        seq = payload.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ProtocolError("frame has no positive integer seq")
        return UpstreamMessage(seq=seq, data=payload.get("data"))
