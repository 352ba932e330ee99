"""Upstream framing, resume and fencing rules, as a pluggable adapter.

The default protocol: JSON text frames ``{"seq": <int>, "data": ...}``; to resume, the worker
adds ``last_seq=<n>`` to the URL's query string and the upstream replays everything after ``n``;
to fence, it adds ``epoch=<lease_version>``. An upstream that honours the epoch (the fake one
does) closes every client dialled with a lower epoch when a higher one arrives (close code
4409) and refuses a dial with a lower epoch (HTTP 409), so a worker that was frozen with its
socket open cannot keep receiving once its successor has dialled. Another upstream plugs in its
own :class:`UpstreamProtocol`.

Every frame is judged alone and strictly: it is one JSON object (text, or UTF-8 in a binary
frame) with one ``seq`` from 1 to 2**53 - 1 (what every client counts exactly: JavaScript's
safe integers; the API refuses a position past it) and at most one
``data``. The message keeps ``data`` exactly as sent: a JSON string as the string it encodes, any
other value as its own text, byte for byte (``1e400``, long decimals and repeated members are
stored as written, never rounded or re-serialised), marked as JSON so that the string
``"[1, 2]"`` and the array ``[1, 2]`` stay distinct. ``NaN`` and ``Infinity`` are not JSON and
refuse the frame, as does nesting too deep to parse, a string that is no Unicode text (a lone
surrogate) and anything else that cannot be read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from json.decoder import scanstring
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidStatus

from .. import model

RESUME_PARAMETER = "last_seq"
EPOCH_PARAMETER = "epoch"
SUPERSEDED_CLOSE_CODE = 4409  # "a newer owner of this stream has dialled"
STALE_EPOCH_STATUS = 409  # a dial with an epoch lower than the newest one seen


class ProtocolError(ValueError):
    """A frame the protocol cannot read; ``seq`` if it got as far as reading one."""

    def __init__(self, reason: str, *, seq: int | None = None):
        super().__init__(reason)
        self.seq = seq


@dataclass(frozen=True)
class UpstreamMessage:
    """One message with its position in the stream.

    ``data`` is what the upstream sent: the text of a string, or with ``json`` set, the exact
    JSON text of any other value.
    """

    seq: int
    data: str
    json: bool = False

    @cached_property
    def data_bytes(self) -> int:
        """The size of ``data`` in UTF-8: what it costs in memory and in the stored item."""
        return len(self.data.encode("utf-8"))


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
        if isinstance(frame, bytes):
            try:
                frame = frame.decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("frame is not UTF-8 text") from None
        members = _top_level_members(frame)
        raw_seq = members.get("seq")
        if raw_seq is None or not _SEQ.fullmatch(raw_seq[0]) or int(raw_seq[0]) > MAX_SEQ:
            raise ProtocolError(f"frame has no seq from 1 to {MAX_SEQ}")
        seq = int(raw_seq[0])
        if "data" not in members:
            return UpstreamMessage(seq=seq, data="null", json=True)
        text, value = members["data"]
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ProtocolError("data is not Unicode text", seq=seq) from None
            return UpstreamMessage(seq=seq, data=value)
        return UpstreamMessage(seq=seq, data=text, json=True)

    def superseded(self, error: Exception) -> bool:
        if isinstance(error, InvalidStatus):
            return error.response.status_code == STALE_EPOCH_STATUS
        if isinstance(error, ConnectionClosed):
            return error.rcvd is not None and error.rcvd.code == SUPERSEDED_CLOSE_CODE
        return False


# A seq is a positive integer every client counts exactly (model.MAX_SEQ).
MAX_SEQ = model.MAX_SEQ
_SEQ = re.compile(r"[1-9][0-9]{0,15}")
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _unread(_text: str) -> None:
    """Numbers are checked, never converted: their text is what is kept."""


# Validates a value without converting its numbers (no precision lost, no 4,300-digit limit).
_VALIDATOR = json.JSONDecoder(parse_constant=_not_json, parse_int=_unread, parse_float=_unread)


def _top_level_members(text: str) -> dict[str, tuple[str, object]]:
    """The members of the JSON object ``text``, each as (its exact text, its decoded value with
    numbers unread). ``ProtocolError`` for anything but one well-formed object with distinct
    member names."""
    try:
        index = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]
        if text[index : index + 1] != "{":
            raise ProtocolError("frame is not a JSON object")
        index = _WHITESPACE.match(text, index + 1).end()  # type: ignore[union-attr]
        members: dict[str, tuple[str, object]] = {}
        if text[index : index + 1] == "}":
            index += 1
        else:
            while True:
                if text[index : index + 1] != '"':
                    raise ProtocolError("frame is not a JSON object")
                name, index = scanstring(text, index + 1, True)
                index = _WHITESPACE.match(text, index).end()  # type: ignore[union-attr]
                if text[index : index + 1] != ":":
                    raise ProtocolError("frame is not a JSON object")
                index = _WHITESPACE.match(text, index + 1).end()  # type: ignore[union-attr]
                value, end = _VALIDATOR.raw_decode(text, index)
                if name in members:
                    raise ProtocolError(f"frame has two {name!r} members")
                members[name] = (text[index:end], value)
                index = _WHITESPACE.match(text, end).end()  # type: ignore[union-attr]
                separator = text[index : index + 1]
                index = _WHITESPACE.match(text, index + 1).end()  # type: ignore[union-attr]
                if separator == "}":
                    break
                if separator != ",":
                    raise ProtocolError("frame is not a JSON object")
        if _WHITESPACE.match(text, index).end() != len(text):  # type: ignore[union-attr]
            raise ProtocolError("frame has more after its JSON object")
        return members
    except RecursionError:
        raise ProtocolError("frame nests too deeply to read") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, a bad escape
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"frame is not JSON: {exc}") from None
