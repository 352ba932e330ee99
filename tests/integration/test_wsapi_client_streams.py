"""The Python client's subscriptions: exactly once, in seq order, no gap, across reconnects.

The cursor (pure) first; then the reconnecting client against the real handlers behind the
local gateway, with messages stored in the messages table as the workers store them, and frames
posted through the gateway's Management API as the fan-out posts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import boto3
import pytest

from streamfleet.wsapi.delivery import StoredMessage, pack_frames
from streamfleet_client import (
    ClientConfig,
    Endpoint,
    EpochChange,
    ReconnectingClient,
    StreamCursor,
    StreamMessage,
    SubscriptionRefused,
)
from tests import wsapi_live_support
from tests.wsapi_live_support import LiveTablesSet, live_gateway
from tests.wsapi_support import REGION, user_token

live_tables = wsapi_live_support.live_tables  # the fixture


def entries(*seqs: int, data: str = "d") -> list[dict]:
    return [{"seq": seq, "data": f"{data}{seq}", "at": seq} for seq in seqs]


# --- The cursor ---------------------------------------------------------------------------------


def test_the_cursor_delivers_in_order_once_whatever_order_and_repeats_arrive() -> None:
    cursor = StreamCursor("s", position=10)
    got: list[int] = []
    for batch in ([13, 12], [11], [12, 14, 9, 10], [16], [15, 16]):
        got += [m.seq for m in cursor.on_entries(entries(*batch), source="live", region="r", now=0)]
    assert got == [11, 12, 13, 14, 15, 16]
    assert cursor.position == 16 and cursor.stats.duplicates == 4 and not cursor.buffer


def test_a_message_in_parts_is_joined_before_it_is_delivered() -> None:
    big = "é" * 50_000
    frames = pack_frames(
        "s",
        [StoredMessage(1, "a"), StoredMessage(2, big), StoredMessage(3, "c")],
        region="r",
        source="replay",
    )
    assert len(frames) > 1
    cursor = StreamCursor("s", position=0)
    got: list[StreamMessage] = []
    for frame in reversed(frames):  # even out of order
        got += cursor.on_entries(json.loads(frame)["messages"], source="replay", region="r", now=0)
    assert [(m.seq, m.data) for m in got] == [(1, "a"), (2, big), (3, "c")]


def test_a_gap_asks_for_the_log_after_the_timeout_then_ever_more_patiently() -> None:
    cursor = StreamCursor("s", position=5, acknowledged=True)
    cursor.on_entries(entries(8), source="live", region="r", now=100.0)
    assert cursor.resubscribe_reason(101.9, gap_timeout=2.0) is None
    assert cursor.resubscribe_reason(102.0, gap_timeout=2.0) == "gap"
    cursor.count_resubscribe("gap", 102.0)
    assert cursor.resubscribe_reason(105.9, gap_timeout=2.0) is None  # waits 4 s now
    assert cursor.resubscribe_reason(106.0, gap_timeout=2.0) == "gap"
    cursor.in_flight = True
    assert cursor.resubscribe_reason(200.0, gap_timeout=2.0) is None  # one at a time
    cursor.in_flight = False
    assert [
        m.seq for m in cursor.on_entries(entries(6, 7), source="replay", region="r", now=107)
    ] == [
        6,
        7,
        8,
    ]
    assert cursor.resubscribe_reason(500.0, gap_timeout=2.0) is None and cursor.gap_attempts == 0


def test_a_cut_replay_asks_for_more_once_caught_up() -> None:
    cursor = StreamCursor("s", position=None)
    cursor.on_subscribed({"after": 0, "upTo": 3, "more": True}, now=0)
    assert cursor.resubscribe_reason(0, gap_timeout=2.0) is None
    cursor.on_entries(entries(1, 2, 3), source="replay", region="r", now=0)
    assert cursor.resubscribe_reason(0, gap_timeout=2.0) == "more"


def test_an_unknown_start_is_learned_from_the_reply_or_asked_for() -> None:
    cursor = StreamCursor("s", position=None)
    assert cursor.on_entries(entries(41, 42), source="live", region="r", now=0) == []
    cursor.on_subscribed({"after": None, "upTo": None, "more": False}, now=0)
    assert cursor.resubscribe_reason(0, gap_timeout=2.0) == "start"
    ready = cursor.on_subscribed({"after": 40, "upTo": 40, "more": False}, now=0)
    assert [m.seq for m in ready] == [41, 42]


def test_the_buffer_is_bounded_and_drops_the_highest_seqs() -> None:
    cursor = StreamCursor("s", position=0, max_buffered=3)
    cursor.on_entries(entries(5, 4, 3, 2), source="live", region="r", now=0)
    assert sorted(cursor.buffer) == [2, 3, 4] and cursor.stats.dropped_for_space == 1


# --- The client against the real handlers ------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.messages: list[StreamMessage] = []
        self.arrived = asyncio.Event()

    def __call__(self, message: StreamMessage) -> None:
        self.messages.append(message)
        self.arrived.set()

    def seqs(self, stream: str = "m1") -> list[int]:
        return [m.seq for m in self.messages if m.stream == stream]

    async def until(self, count: int, stream: str = "m1", timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seqs(stream)) < count:
            assert time.monotonic() < deadline, f"{len(self.seqs(stream))} of {count} arrived"
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 0.2)


def make_client(
    url: str, user: str, recorder: Recorder, positions=None, on_epoch=None, **config
) -> ReconnectingClient:
    settings = {"heartbeat_interval": 5.0, "heartbeat_timeout": 5.0, "backoff_base": 0.05}
    return ReconnectingClient(
        lambda attempt: Endpoint(url, user_token(user)),
        ClientConfig(**{**settings, **config}),
        on_stream_message=recorder,
        on_stream_epoch=on_epoch,
        positions=positions,
        name=user,
    )


async def test_the_client_resumes_after_a_reconnect_and_after_a_restart_without_a_duplicate(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store("m1", range(1, 101))
    recorder = Recorder()
    positions: dict[str, Any] = {}
    async with live_gateway(tables) as gateway:
        async with make_client(gateway.url, "alice", recorder, positions) as client:
            await client.wait_ready(5)
            reply = await client.subscribe("m1", after=0)
            assert reply is not None and reply["type"] == "subscribed"
            await recorder.until(100)
            # The connection drops; meanwhile the stream goes on.
            tables.store("m1", range(101, 151))
            connections = client.connections
            client.reconnect()
            await recorder.until(150)
            assert client.connections == connections + 1
        assert positions == {"m1": (0, 150)}
        # A restart: a new client that knows only the saved position (and asks for nothing)
        # is subscribed again from the server's state, from where it was.
        tables.store("m1", range(151, 171))
        async with make_client(gateway.url, "alice", recorder, positions) as client:
            await recorder.until(170)
            assert set(client.subscriptions) == {"m1"}
    assert recorder.seqs() == list(range(1, 171))
    assert {m.source for m in recorder.messages} == {"replay"}
    assert recorder.messages[0].data == "message 1" and recorder.messages[0].region == REGION


async def test_a_gap_left_by_a_lost_frame_is_filled_from_the_stored_log(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store("m1", range(1, 11))
    recorder = Recorder()
    async with live_gateway(tables) as gateway:
        management = boto3.client(
            "apigatewaymanagementapi", endpoint_url=gateway.management_endpoint, region_name=REGION
        )
        async with make_client(gateway.url, "alice", recorder, gap_timeout=0.3) as client:
            await client.wait_ready(5)
            await client.subscribe("m1", after=None)  # the newest 10 here
            await recorder.until(10)
            # Seqs 11-15 are stored, but only 16 reaches the client live (the others' post lost).
            tables.store("m1", range(11, 17))
            (frame,) = pack_frames(
                "m1", [StoredMessage(16, "message 16")], region=REGION, source="live"
            )
            (connection_id,) = gateway.connection_ids
            await asyncio.to_thread(
                management.post_to_connection, ConnectionId=connection_id, Data=frame
            )
            await recorder.until(16)
            assert client.subscriptions["m1"].stats.gap_resubscribes == 1
    assert recorder.seqs() == list(range(1, 17))
    assert [m.source for m in recorder.messages][-1] == "live"  # 16, held until 11-15 came


async def test_a_long_backlog_arrives_in_budgeted_replays(live_tables: LiveTablesSet) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store("m1", range(1, 501))
    recorder = Recorder()
    gateway = live_gateway(tables, replay_max=120)
    async with gateway, make_client(gateway.url, "alice", recorder) as client:
        await client.wait_ready(5)
        await client.subscribe("m1", after=0)
        await recorder.until(500)
        assert client.subscriptions["m1"].stats.more_resubscribes == 4
    assert recorder.seqs() == list(range(1, 501))


async def test_a_refused_subscribe_raises_and_leaves_nothing_subscribed(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("secret", readers=("user:bob",))
    recorder = Recorder()
    refusals: list[SubscriptionRefused] = []
    async with live_gateway(tables) as gateway:
        client = make_client(gateway.url, "alice", recorder)
        client.on_subscription_error = refusals.append
        async with client:
            await client.wait_ready(5)
            with pytest.raises(SubscriptionRefused) as raised:
                await client.subscribe("secret")
    assert raised.value.error == "forbidden" and "secret" in str(raised.value)
    assert client.subscriptions == {} and len(refusals) == 1


async def test_the_application_hears_of_a_new_epoch_before_its_first_message(
    live_tables: LiveTablesSet,
) -> None:
    """The upstream numbered from 1 again after seq 5. Both clients dropped seqs 1..5 of the new
    numbering as duplicates of the old, without a word: they now come, after an event."""
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store_restarted("m1", old=5, new=3)
    recorder, heard = Recorder(), []

    def on_epoch(change: EpochChange) -> None:
        heard.append((change, len(recorder.messages)))

    positions: dict[str, Any] = {}
    async with (
        live_gateway(tables) as gateway,
        make_client(gateway.url, "alice", recorder, positions, on_epoch, gap_timeout=0.2) as client,
    ):
        await client.wait_ready(5)
        await client.subscribe("m1", after=0)
        await recorder.until(8)
        assert client.position("m1") == (1, 3)
    assert [(m.epoch, m.seq) for m in recorder.messages] == [
        *((0, seq) for seq in range(1, 6)),
        *((1, seq) for seq in range(1, 4)),
    ]
    assert heard == [(EpochChange("m1", 1, 0), 5)]
    assert positions == {"m1": (1, 3)}
