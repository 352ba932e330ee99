"""The fake upstream, end to end: a real server on loopback and real WebSocket clients.

What the rest of the suite relies on: live frames in order, ``last_seq`` resumes with no gap and
no duplicate, a sequence that keeps moving while nobody listens, and counters that reveal two
clients on one stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from streamfleet_dev.upstream.fake import FakeUpstream, message_data
from tests.support import ShiftableClock

RATE = 100.0  # messages per second: fast enough to keep the file quick, slow enough to be live
TIMEOUT = 5.0
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream(rate=RATE) as server:
        yield server


async def recv_seqs(ws: ClientConnection, count: int, stream_id: str) -> list[int]:
    """The seqs of the next ``count`` frames, checking each frame's data on the way."""
    seqs = []
    async with asyncio.timeout(TIMEOUT):
        for _ in range(count):
            frame = json.loads(await ws.recv())
            assert frame["data"] == message_data(stream_id, frame["seq"])
            seqs.append(frame["seq"])
    return seqs


async def recv_through(ws: ClientConnection, last: int, stream_id: str) -> list[int]:
    """Seqs of frames received until one with seq >= ``last``."""
    seqs: list[int] = []
    async with asyncio.timeout(TIMEOUT):
        while not seqs or seqs[-1] < last:
            seqs.extend(await recv_seqs(ws, 1, stream_id))
    return seqs


async def http_get(url: str) -> tuple[int, str, Any]:
    """Status, content type and JSON body of a GET, in a thread: the server runs on our loop."""

    def fetch() -> tuple[int, str, Any]:
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                return response.status, response.headers["Content-Type"], json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, error.headers["Content-Type"], error.read().decode()

    return await asyncio.to_thread(fetch)


async def wait_until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``condition`` until true, failing after ``TIMEOUT`` seconds."""
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.01)


def consecutive(seqs: list[int]) -> bool:
    return seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_live_frames_arrive_in_order_with_consecutive_seqs(upstream: FakeUpstream) -> None:
    async with connect(upstream.url_for("live")) as ws:
        seqs = await recv_seqs(ws, 20, "live")
    assert seqs[0] >= 1
    assert consecutive(seqs)


async def test_resume_with_last_seq_has_no_gap_and_no_duplicate(upstream: FakeUpstream) -> None:
    async with connect(upstream.url_for("resume")) as ws:
        before = await recv_seqs(ws, 5, "resume")
    async with connect(f"{upstream.url_for('resume')}?last_seq={before[-1]}") as ws:
        after = await recv_seqs(ws, 5, "resume")
    assert after[0] == before[-1] + 1
    assert consecutive(before + after)
    assert upstream.stats()["gaps"]["resume"] == 0


async def test_sequence_advances_while_nobody_listens(upstream: FakeUpstream) -> None:
    head_url = f"{upstream.http_url}/streams/idle/head"
    async with connect(upstream.url_for("idle")) as ws:
        [last_seen] = await recv_seqs(ws, 1, "idle")

    async def moved_on() -> bool:
        _, _, body = await http_get(head_url)
        return body["seq"] >= last_seen + 10

    await wait_until(moved_on, "the head moves on with no client")
    _, _, body = await http_get(head_url)
    async with connect(f"{upstream.url_for('idle')}?last_seq={last_seen}") as ws:
        missed = await recv_through(ws, body["seq"], "idle")
    assert missed[0] == last_seen + 1
    assert consecutive(missed)


async def test_head_keeps_time_for_idle_streams_without_background_tasks() -> None:
    clock = ShiftableClock()
    async with FakeUpstream(rate=RATE, clock=clock.monotonic) as upstream:
        tasks_before = len(asyncio.all_tasks())
        for n in range(2000):
            upstream.ensure_stream(f"idle-{n}")
        assert len(asyncio.all_tasks()) == tasks_before
        clock.advance(10.0)
        # 10 s at RATE msg/s, less one for float rounding at the boundary
        assert upstream.head("idle-0") >= RATE * 10 - 1
        assert upstream.head("idle-1999") >= RATE * 10 - 1


async def test_resume_older_than_the_replay_buffer_starts_at_the_oldest_and_counts_a_gap() -> None:
    clock = ShiftableClock()
    # One seq a second: a second gap would need the sender kept from its socket for 10 s.
    async with FakeUpstream(rate=1.0, replay_capacity=10, clock=clock.monotonic) as upstream:
        upstream.ensure_stream("old")
        clock.advance(500.0)  # 500 seqs produced, only the last 10 retained
        head = upstream.head("old")
        async with connect(f"{upstream.url_for('old')}?last_seq=1") as ws:
            seqs = await recv_seqs(ws, 10, "old")
        assert seqs[0] >= head - 9
        assert consecutive(seqs)
        assert upstream.stats()["gaps"]["old"] == 1


async def test_two_clients_on_one_stream_are_recorded_as_an_overlap(
    upstream: FakeUpstream,
) -> None:
    async with connect(upstream.url_for("shared")) as first:
        await recv_seqs(first, 1, "shared")
        async with connect(upstream.url_for("shared")) as second:
            await recv_seqs(second, 1, "shared")
            stats = upstream.stats()
            assert stats["connected"]["shared"] == 2
    assert stats["max_concurrent"]["shared"] == 2
    assert stats["overlaps"]["shared"] == 1
    assert [e["stream_id"] for e in stats["overlap_events"]] == ["shared"]


async def test_sequential_clients_never_overlap(upstream: FakeUpstream) -> None:
    for _ in range(3):
        async with connect(upstream.url_for("handover")) as ws:
            await recv_seqs(ws, 1, "handover")

    async def all_gone() -> bool:
        return upstream.stats()["connected"]["handover"] == 0

    await wait_until(all_gone, "the last client is gone")
    stats = upstream.stats()
    assert stats["max_concurrent"]["handover"] == 1
    assert stats["overlaps"]["handover"] == 0
    assert stats["connections"]["handover"] == 3


async def test_dropped_client_sees_an_abnormal_close_and_resumes(upstream: FakeUpstream) -> None:
    async with connect(upstream.url_for("flaky")) as ws:
        [last_seen] = await recv_seqs(ws, 1, "flaky")
        assert await upstream.drop_clients("flaky") == 1
        with pytest.raises(ConnectionClosedError) as closed:
            async with asyncio.timeout(TIMEOUT):
                while True:
                    last_seen = json.loads(await ws.recv())["seq"]
        assert closed.value.rcvd is None  # no close frame: the connection just died
    assert upstream.stats()["connected"]["flaky"] == 0
    async with connect(f"{upstream.url_for('flaky')}?last_seq={last_seen}") as ws:
        assert await recv_seqs(ws, 1, "flaky") == [last_seen + 1]
    assert upstream.stats()["drops"]["flaky"] == 1


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "", "1&last_seq=2"])
async def test_bad_last_seq_is_closed_with_policy_violation(
    upstream: FakeUpstream, bad: str
) -> None:
    async with connect(f"{upstream.url_for('strict')}?last_seq={bad}") as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            async with asyncio.timeout(TIMEOUT):
                await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert "last_seq" in closed.value.rcvd.reason
    assert upstream.stats()["streams"] == 0  # a rejected client starts no stream


@pytest.mark.parametrize("path", ["/", "/nope", "/streams", "/streams/", "/streams/a/b"])
async def test_unknown_path_is_rejected_with_404(upstream: FakeUpstream, path: str) -> None:
    with pytest.raises(InvalidStatus) as rejected:
        async with asyncio.timeout(TIMEOUT):
            await connect(f"{upstream.url}{path}")
    assert rejected.value.response.status_code == 404


async def test_stats_over_http_match_the_counters(upstream: FakeUpstream) -> None:
    async with connect(upstream.url_for("watched")) as ws:
        await recv_seqs(ws, 1, "watched")
        status, content_type, body = await http_get(f"{upstream.http_url}/stats")
    assert status == 200
    assert content_type == "application/json"
    assert body["rate"] == RATE
    assert body["connected"]["watched"] == 1
    assert body["max_concurrent"]["watched"] == 1
    assert body["connections"]["watched"] == 1
    assert body["overlaps"]["watched"] == 0
    assert body["head"]["watched"] >= 1


async def test_stop_closes_connected_clients_with_going_away() -> None:
    upstream = await FakeUpstream(rate=RATE).start()
    try:
        async with connect(upstream.url_for("bye")) as ws:
            await recv_seqs(ws, 1, "bye")
            await upstream.stop()
            await asyncio.wait_for(ws.wait_closed(), TIMEOUT)
            assert ws.close_code == 1001
    finally:
        await upstream.stop()


async def test_head_of_an_unknown_stream_is_404_and_does_not_create_it(
    upstream: FakeUpstream,
) -> None:
    status, _, _ = await http_get(f"{upstream.http_url}/streams/ghost/head")
    assert status == 404
    assert "ghost" not in upstream.stats()["head"]


def cli_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO_ROOT / d) for d in ("runtime", "devtools", ".")),
    }


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
async def test_cli_prints_the_listening_url_and_serves_until_signalled(stop_signal: int) -> None:
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "streamfleet_dev.upstream.fake", "--port", "0", "--rate", "200"],
        stdout=asyncio.subprocess.PIPE,
        env=cli_env(),
    )
    try:
        async with asyncio.timeout(TIMEOUT):
            line = json.loads(await process.stdout.readline())
        assert line["event"] == "listening"
        assert line["url"].startswith("ws://127.0.0.1:")
        async with connect(f"{line['url']}/streams/cli") as ws:
            assert consecutive(await recv_seqs(ws, 3, "cli"))
        process.send_signal(stop_signal)
        async with asyncio.timeout(TIMEOUT):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "--rate: must be a finite number > 0"),
        (["--rate", "fast"], "--rate: not a number"),
        (["--port", "70000"], "--port: must be in 0..65535"),
    ],
)
async def test_cli_rejects_bad_arguments_with_a_clear_error(args: list[str], message: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "streamfleet_dev.upstream.fake", *args],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(),
    )
    async with asyncio.timeout(TIMEOUT):
        _, stderr = await process.communicate()
    assert process.returncode == 2
    assert message in stderr.decode()


async def test_hostile_modes_send_what_they_say_and_stores_says_what_a_worker_keeps(
    upstream: FakeUpstream,
) -> None:
    from streamfleet.worker.protocol import JsonSeqProtocol, ProtocolError
    from streamfleet_dev.upstream.fake import stores

    modes = {"poison", "gap"}
    url = upstream.url_for("h1", modes) + "&last_seq=0"
    readable, refused = [], []
    async with connect(url, max_size=None) as ws:
        while len(readable) + len(refused) < 30:
            frame = await asyncio.wait_for(ws.recv(), TIMEOUT)
            try:
                readable.append(JsonSeqProtocol().parse(frame).seq)
            except ProtocolError:
                refused.append(frame)

    assert readable == [seq for seq in range(1, 35) if stores(modes, seq)][: len(readable)]
    assert 3 not in readable and 13 not in readable and 7 not in readable  # gaps and poison
    assert len(refused) >= 3


async def test_a_closing_upstream_closes_at_once_and_an_unknown_mode_is_refused(
    upstream: FakeUpstream,
) -> None:
    async with connect(upstream.url_for("h2", {"close"})) as ws:
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), TIMEOUT)
    async with connect(upstream.url_for("h3") + "?hostile=sulk") as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            await asyncio.wait_for(ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
