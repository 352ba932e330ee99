"""The Python cursor against the hostile frames both clients must read alike
(``tests/conformance/stream_entries.json``; the browser client runs the same cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamfleet_client import StreamCursor

CASES = json.loads((Path(__file__).parents[2] / "conformance" / "stream_entries.json").read_text())[
    "cases"
]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_a_hostile_frame_is_read_as_both_clients_read_it(case: dict) -> None:
    frame = json.loads(case["frame"])
    cursor = StreamCursor("s", position=0)
    cursor.acknowledged = True
    entries = frame.get("messages")
    delivered = cursor.on_entries(
        entries if isinstance(entries, list) else [], source="live", region=None, now=0
    )
    assert [[m.epoch, m.seq, m.data] for m in delivered] == case["delivered"]
