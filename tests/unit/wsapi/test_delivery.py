"""What a stored message becomes at the application: the worker's item, packed as the replay and
the fan-out pack it, read by the Python client's cursor."""

from __future__ import annotations

import json

import pytest

from streamfleet.client import StreamCursor
from streamfleet.worker.protocol import JsonSeqProtocol
from streamfleet.worker.sink import MessageSink
from streamfleet.wsapi.delivery import SOURCE_LIVE, SOURCE_REPLAY, message_from_item, pack_frames


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
