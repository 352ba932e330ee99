"""Upstream framing, resume and fencing rules, as a pluggable adapter.

The default protocol: JSON text frames ``{"seq": <int>, "data": ...}``; to resume, the worker
adds ``last_seq=<n>`` to the URL's query string and the upstream replays everything after ``n``;
to fence, it adds ``epoch=<lease_version>``. An upstream that honours the epoch (the fake one
does) closes every client dialled with a lower epoch when a higher one arrives (close code
4409) and refuses a dial with a lower epoch (HTTP 409), so a worker that was frozen with its
socket open cannot keep receiving once its successor has dialled. Another upstream plugs in its
own :class:`UpstreamProtocol`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus

RESUME_PARAMETER = "last_seq"
EPOCH_PARAMETER = "epoch"
SUPERSEDED_CLOSE_CODE = 4409  # "a newer owner of this stream has dialled"
STALE_EPOCH_STATUS = 409  # a dial with an epoch lower than the newest one seen


class ProtocolError(ValueError):
    """A frame the protocol cannot read."""


@dataclass(frozen=True)
class UpstreamMessage:
    """One message with its position in the stream."""

    seq: int
    data: Any


class UpstreamProtocol(Protocol):
    """What the worker needs to know about an upstream's wire format."""

    def dial_url(self, ws_url: str, *, resume_after: int | None, epoch: int) -> str:
        """The URL to dial to receive everything after ``resume_after`` (``None``: from now on),
        carrying the lease's fencing token ``epoch`` if the upstream can honour it."""

    def parse(self, frame: str | bytes) -> UpstreamMessage:
        """One frame as a message; :class:`ProtocolError` if malformed."""

    def superseded(self, error: Exception) -> bool:
        """Whether ``error`` (from dialling or receiving) says a newer owner has taken over."""


class JsonSeqProtocol:
    """``{"seq": n, "data": ...}`` frames; resume with ``?last_seq=n``, fence with ``?epoch=v``."""

    def dial_url(self, ws_url: str, *, resume_after: int | None, epoch: int) -> str:
        replaced = {RESUME_PARAMETER, EPOCH_PARAMETER}
        parts = urlsplit(ws_url)
        query = [
            (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in replaced
        ]
        if resume_after is not None:
            query.append((RESUME_PARAMETER, str(resume_after)))
        query.append((EPOCH_PARAMETER, str(epoch)))
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

    def superseded(self, error: Exception) -> bool:
        if isinstance(error, InvalidStatus):
            return error.response.status_code == STALE_EPOCH_STATUS
        if isinstance(error, ConnectionClosed):
            return error.rcvd is not None and error.rcvd.code == SUPERSEDED_CLOSE_CODE
        return False
