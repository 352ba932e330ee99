"""Stored messages as the clients receive them: several seqs per frame, never over 32 KB.

Both the subscribe handler (a replay read from the messages table) and the fan-out function
(live records from the table's change stream) send a stream's messages with :func:`pack_frames`:

``{"type": "messages", "stream": "<id>", "source": "replay"|"live", "region": "<region>",
"messages": [{"seq": 41, "epoch": 0, "data": "...", "at": <received_at_ms>}, ...]}``

A seq counts within its ``epoch``: a stream's log is a run of epochs, each begun when the
upstream's numbering restarted, and ``(epoch, seq)`` orders the whole log.

``data`` is the string the upstream sent, or, with ``"format": "json"`` beside it, the exact
JSON text of the value it sent (an object, a number...), as the worker stored it.

as few frames as API Gateway's frame limit allows (32 KB each: a bigger frame closes the
client's socket with 1009, and the @connections API must split anything over 32 KB into frames
of at most that). Messages keep their seq order inside a frame and from frame to frame. A single
message too big for one frame is sent in parts: consecutive entries ``{"seq": n, "part": i,
"parts": k, "data": "<slice>"}`` (``at`` on every part), which the clients join before
delivering message ``n``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .. import model

SOURCE_REPLAY = "replay"
SOURCE_LIVE = "live"
FRAME_LIMIT = model.WS_MAX_FRAME_BYTES
# Room for a Region's name in the envelope a message's parts are cut for: longer than any AWS
# Region's, so that the cut is the same whichever Region and path (replay or live) sends it.
REGION_ROOM = 32


@dataclass(frozen=True, order=True)
class StoredMessage:
    """One message of a stream as the messages table holds it."""

    seq: int  # its log position (model.log_position): the wire splits it into epoch and seq
    data: str
    received_at_ms: int | None = None
    json: bool = False  # data is the JSON text of a value, not a string
    # What its writer received just before it: that seq, and when that message expires.
    prev_seq: int | None = None
    prev_expires_at: int | None = None

    @cached_property
    def data_bytes(self) -> int:
        return len(self.data.encode("utf-8"))

    def follows_unfillable_hole(self, after: int, now_ms: int) -> bool:
        """Whether the seqs between ``after`` and this message can never be stored: nothing
        was sent in between (a gap the upstream left, or frames refused), or what was sent
        has expired (the message just before this one did, and everything before it sooner).
        Without that knowledge (a message stored without it), never."""
        if self.prev_seq is not None and self.prev_seq <= after:
            return True
        return self.prev_expires_at is not None and self.prev_expires_at * 1000 <= now_ms


def hole_is_unfillable(after: int, replay: list[StoredMessage], now_ms: int) -> bool:
    """Whether the seqs between ``after`` and the first message of ``replay`` (ascending, all
    above ``after``) can never be stored: the first message says so itself, or a later one was
    received right after ``after`` (its writer's upstream went on past the hole, so what an
    earlier writer left stored before that is all the log will ever hold there)."""
    return bool(replay) and (
        replay[0].follows_unfillable_hole(after, now_ms)
        or any(m.prev_seq is not None and m.prev_seq <= after for m in replay[1:])
    )


def message_from_item(item: Mapping[str, Any]) -> StoredMessage:
    """A plain messages-table item (``from_item``) as a :class:`StoredMessage`."""
    data = item.get(model.MESSAGE_DATA)
    at = item.get(model.MESSAGE_RECEIVED_AT_MS)
    prev_seq = item.get(model.MESSAGE_PREV_SEQ)
    prev_expires_at = item.get(model.MESSAGE_PREV_EXPIRES_AT)
    return StoredMessage(
        seq=int(item[model.SEQ]),
        data=data if isinstance(data, str) else json.dumps(data, default=str),
        received_at_ms=int(at) if isinstance(at, (int, float)) else None,
        json=item.get(model.MESSAGE_FORMAT) == model.MESSAGE_FORMAT_JSON
        or not isinstance(data, str),
        prev_seq=int(prev_seq) if isinstance(prev_seq, (int, float)) else None,
        prev_expires_at=int(prev_expires_at) if isinstance(prev_expires_at, (int, float)) else None,
    )


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _entry(message: StoredMessage, data: str, part: tuple[int, int] | None = None) -> dict:
    entry: dict[str, Any] = {
        "seq": model.seq_of(message.seq),
        "epoch": model.epoch_of(message.seq),
    }
    if part is not None:
        entry["part"], entry["parts"] = part
    entry["data"] = data
    if message.json:
        entry["format"] = model.MESSAGE_FORMAT_JSON
    if message.received_at_ms is not None:
        entry["at"] = message.received_at_ms
    return entry


def _escaped(text: str) -> bytes:
    """``text`` as it stands inside a JSON string that :func:`_dumps` writes, without the quotes.
    JSON escapes each character on its own, so the escape of a concatenation is the
    concatenation of the escapes."""
    return json.dumps(text, ensure_ascii=False).encode("utf-8")[1:-1]


def _entry_with_escaped_data(message: StoredMessage, data: bytes, part: tuple[int, int]) -> bytes:
    """``_dumps(_entry(message, text, part))`` for the text whose escape is ``data``, without
    escaping the text again: the members before and after ``data`` are written apart and joined
    around it, in :func:`_entry`'s order."""
    members = list(_entry(message, "", part).items())
    split = [key for key, _ in members].index("data")
    head = _dumps(dict(members[:split]))[:-1] + b',"data":"' + data + b'"'
    after = dict(members[split + 1 :])
    return head + (b"," + _dumps(after)[1:] if after else b"}")


# The most bytes one character can take in :func:`_dumps`'s output (``\u001f``).
_WIDEST_CHARACTER = 6


def _slices(message: StoredMessage, room: int) -> list[bytes]:
    """``message.data`` cut into the fewest slices whose entries each fit in ``room`` bytes:
    each slice as long as fits; each slice escaped, as its entry holds it.

    The data's escapes vary, so a slice's size is measured, not computed from its length; the
    escapes are additive, so each slice grows by pieces that surely fit (a sixth of the room
    left, in characters) until not even one more character does: the data is escaped about
    once in all, and each piece's escape is kept for the slice's entry."""
    data = message.data
    budget = room - len(_dumps(_entry(message, "", (99999, 99999))))
    slices: list[bytes] = []
    start = 0
    while start < len(data):
        end, left = start, budget
        pieces: list[bytes] = []
        while end < len(data):
            step = max(1, left // _WIDEST_CHARACTER)
            piece = _escaped(data[end : end + step])
            if len(piece) > left:  # only when step is one character: the slice is full
                if end == start:  # a slice holds at least one character, whatever its size
                    pieces.append(piece)
                    end += 1
                break
            pieces.append(piece)
            end, left = min(end + step, len(data)), left - len(piece)
        slices.append(b"".join(pieces))
        start = end
    return slices


SOURCES = (SOURCE_REPLAY, SOURCE_LIVE)


def _envelope(stream: str, source: str, region: str) -> bytes:
    return _dumps(
        {
            "type": model.WS_REPLY_MESSAGES,
            "stream": stream,
            "source": source,
            "region": region,
            "messages": [],
        }
    )


def pack_frames(
    stream: str,
    messages: Iterable[StoredMessage],
    *,
    region: str,
    source: str,
    limit: int = FRAME_LIMIT,
) -> list[bytes]:
    """The frames that carry ``messages`` (sorted by seq, one entry per seq) to a client.

    A message too big for one frame is cut for the largest envelope any path could wrap it in,
    so the replay and the live path (and both Regions) cut it at the same points: a client may
    join parts that came by different paths and still deliver exactly the stored message.
    """
    empty = _envelope(stream, source, region)
    assert empty.endswith(b"[]}")  # "messages" is the last member
    prefix = empty[:-2]
    room = limit - len(empty)  # the overhead includes the empty list's brackets
    widest = max(
        (_envelope(stream, path, "r" * max(REGION_ROOM, len(region))) for path in SOURCES),
        key=len,
    )
    cut_room = limit - len(widest)
    if cut_room < 256:
        raise ValueError(f"limit: {limit} bytes leaves no room for a message")
    frames: list[bytes] = []
    entries: list[bytes] = []
    used = 0

    def flush() -> None:
        nonlocal entries, used
        if entries:
            frames.append(prefix + b",".join(entries) + b"]}")
        entries, used = [], 0

    for message in sorted({m.seq: m for m in messages}.values()):
        # Each character takes a byte at least: data longer than the room is cut without
        # being encoded whole first.
        encoded = None if len(message.data) > cut_room else _dumps(_entry(message, message.data))
        if encoded is None or len(encoded) > cut_room:
            pieces = _slices(message, cut_room)
            encoded_parts = [
                _entry_with_escaped_data(message, piece, (index, len(pieces)))
                for index, piece in enumerate(pieces)
            ]
        else:
            encoded_parts = [encoded]
        for part in encoded_parts:
            extra = len(part) + (1 if entries else 0)  # the comma between entries
            if used + extra > room:
                flush()
                extra = len(part)
            entries.append(part)
            used += extra
    flush()
    return frames
