"""What a stored message becomes at the application: the worker's item, packed as the replay and
the fan-out pack it, read by the Python client's cursor."""

from __future__ import annotations

import json
import random

import pytest

from streamfleet import model
from streamfleet.worker.protocol import JsonSeqProtocol
from streamfleet.worker.sink import MessageSink
from streamfleet.wsapi.delivery import (
    SOURCE_LIVE,
    SOURCE_REPLAY,
    StoredMessage,
    message_from_item,
    pack_frames,
)
from streamfleet_client import StreamCursor


def stored_item(frame: str) -> dict:
    """The messages-table item a worker stores for ``frame`` (plain values)."""
    message = JsonSeqProtocol().parse(frame)
    sink = MessageSink(
        dynamodb=None,  # type: ignore[arg-type]
        table_name="messages",
        worker_id="w1",
        session=None,  # type: ignore[arg-type]
        flush_every=1.0,
    )
    return sink.item("CONN#s", message, 1_700_000_000_000)


@pytest.mark.parametrize("source", [SOURCE_LIVE, SOURCE_REPLAY])
def test_the_application_gets_the_string_or_the_exact_json_text_and_knows_which(source):
    frames = [
        '{"seq": 1, "data": "[1, 2]"}',
        '{"seq": 2, "data": [1, 2]}',
        '{"seq": 3, "data": {"price": 1e400, "id": 12345678901234567890123}}',
    ]
    stored = [message_from_item(stored_item(frame)) for frame in frames]
    cursor = StreamCursor("s", position=0)
    cursor.acknowledged = True

    delivered = []
    for packed in pack_frames("s", stored, region="r", source=source):
        delivered += cursor.on_entries(
            json.loads(packed)["messages"], source=source, region="r", now=0
        )

    assert [(m.seq, m.data, m.json) for m in delivered] == [
        (1, "[1, 2]", False),
        (2, "[1, 2]", True),
        (3, '{"price": 1e400, "id": 12345678901234567890123}', True),
    ]


def test_a_message_in_parts_is_cut_the_same_by_every_path_and_region():
    """The room for data depended on the envelope ("replay" is 2 bytes longer than "live", and
    Regions' names differ), so the paths cut one message at different points; a client that
    joined live part 0 with replay part 1 delivered it 2 characters short."""
    data = "".join(chr(0x41 + n % 26) for n in range(60_000))
    message = StoredMessage(seq=7, data=data, received_at_ms=1)

    def parts(source: str, region: str) -> list[dict]:
        frames = pack_frames("s", [message], region=region, source=source)
        return [entry for frame in frames for entry in json.loads(frame)["messages"]]

    live = parts(SOURCE_LIVE, "us-east-1")
    replay = parts(SOURCE_REPLAY, "ap-southeast-2")
    assert len(live) > 1 and [p["data"] for p in live] == [p["data"] for p in replay]

    cursor = StreamCursor("s", position=6)
    cursor.acknowledged = True
    mixed = [live[0], *replay[1:]]
    delivered = cursor.on_entries(mixed, source=SOURCE_LIVE, region="r", now=0)
    assert [(m.seq, m.data) for m in delivered] == [(7, data)]


def test_an_incomplete_part_set_is_dropped_when_the_subscribe_is_answered():
    data = "x" * 60_000
    message = StoredMessage(seq=7, data=data)
    [first, *_] = [
        entry
        for frame in pack_frames("s", [message], region="r", source=SOURCE_LIVE)
        for entry in json.loads(frame)["messages"]
    ]
    cursor = StreamCursor("s", position=6)
    cursor.on_entries([first], source=SOURCE_LIVE, region="r", now=0)
    assert cursor.parts

    cursor.on_subscribed({"after": 6}, now=1)  # after a reconnect: the replay brings it whole

    assert not cursor.parts


@pytest.mark.parametrize("seed", range(6))
def test_a_message_in_parts_fills_each_frame_and_none_exceeds_the_limit(seed):
    """Escapes and multi-byte characters make a part's size differ from its length: every
    frame stays within the limit, the parts join to the message, and every frame but the last
    is full (short of the limit by no more than the widest envelope's extra room, the part
    numbers' digits and one character that did not fit: under 64 bytes)."""
    rng = random.Random(seed)
    alphabet = 'ab"\\\u00e9\u20ac\U0001f600 \n\x01'[: rng.randint(1, 10)]
    data = "".join(rng.choices(alphabet, k=rng.randint(20_000, 90_000)))
    message = StoredMessage(seq=3, data=data, received_at_ms=1, json=seed % 2 == 0)
    limit = rng.choice([4_096, 32_768])

    frames = pack_frames("s", [message], region="r", source=SOURCE_REPLAY, limit=limit)

    assert all(len(frame) <= limit for frame in frames)
    assert all(len(frame) > limit - 64 for frame in frames[:-1])
    parts = [json.loads(frame)["messages"][0] for frame in frames]
    assert "".join(part["data"] for part in parts) == data


@pytest.mark.parametrize("seed", range(4))
def test_every_frame_is_the_compact_json_of_what_it_carries(seed):
    """A part's entry is written around data escaped once, not by dumping the entry: it must
    still be, byte for byte, what ``json.dumps`` writes for it (members in order, ``format`` and
    ``at`` after ``data`` when the message has them), so that every path sends the same bytes."""
    rng = random.Random(seed)

    def text(size: int) -> str:
        return "".join(rng.choices('ab"\\\u00e9\U0001f600\n\x1f', k=size))

    messages = [
        StoredMessage(seq=1, data=text(9), received_at_ms=1_700_000_000_000),
        StoredMessage(seq=2, data=text(40_000), received_at_ms=1_700_000_000_001, json=True),
        StoredMessage(seq=model.log_position(1, 1), data=text(40_000)),
    ]

    frames = pack_frames("s", messages, region="eu-west-1", source=SOURCE_LIVE)

    for frame in frames:
        assert frame == json.dumps(
            json.loads(frame), separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
    entries = [entry for frame in frames for entry in json.loads(frame)["messages"]]
    assert {(entry["seq"], entry["epoch"], "part" in entry) for entry in entries} == {
        (1, 0, False),
        (2, 0, True),
        (1, 1, True),
    }
    for entry in entries:
        message = messages[
            [1, 2, model.EPOCH_STRIDE + 1].index(model.log_position(entry["epoch"], entry["seq"]))
        ]
        assert entry.get("format") == ("json" if message.json else None)
        assert entry.get("at") == message.received_at_ms
        order = ("seq", "epoch", "part", "parts", "data", "format", "at")
        assert list(entry) == [key for key in order if key in entry]
