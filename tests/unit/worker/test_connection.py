"""One connection's end-of-life rules, with stand-ins for the store and the sink (unit tests)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field

from websockets.asyncio.server import serve

from streamfleet.lease import Lease, SessionLost
from streamfleet.model import log_position
from streamfleet.worker import connection as connection_module
from streamfleet.worker.connection import Connection, ConnectionContext, EndReason
from streamfleet.worker.observability import Counters
from streamfleet.worker.protocol import JsonSeqProtocol, UpstreamMessage
from streamfleet.worker.upstream_policy import UpstreamPolicy

CLOSED_PORT_URL = "ws://127.0.0.1:9/streams/a"  # nothing listens on the discard port


@dataclass
class Session:
    deadline: float

    def require_live(self, version: int | None = None) -> int:
        if time.monotonic() >= self.deadline:
            raise SessionLost("deadline passed")
        return 1


@dataclass
class Leases:
    session: Session
    checkpoint_error: Exception | None = None
    released: list[bool] = field(default_factory=list)
    failures: list[str | None] = field(default_factory=list)

    async def checkpoint(self, lease, seq, *, origin=False) -> None:
        if self.checkpoint_error is not None:
            raise self.checkpoint_error

    async def release(self, lease, *, sealed=False, failure=None) -> bool:
        self.released.append(sealed)
        self.failures.append(failure)
        return True


class Sink:
    """Records what it is given; a message over ``max_item_bytes`` does not fit an item."""

    def __init__(self) -> None:
        self.added: list = []
        self.prev_seqs: list = []
        self.max_item_bytes = 400 * 1024
        self.got: asyncio.Event = asyncio.Event()
        self.waiting_for: int | None = None

    def add(self, owner, message, prev_seq=None) -> None:
        self.added.append(message)
        self.prev_seqs.append(prev_seq)
        if message.seq == self.waiting_for:
            self.got.set()

    def fits(self, pk, message) -> bool:
        return message.data_bytes <= self.max_item_bytes

    @property
    def room(self) -> asyncio.Event:
        room = asyncio.Event()
        room.set()
        return room

    async def flush(self) -> None: ...

    async def settle(self, owner) -> None: ...

    async def contiguous_end(self, pk, after) -> int:
        return after

    # What was added counts as stored (flush does nothing).
    async def newest_stored(self, pk) -> int | None:
        return max((m.seq for m in self.added), default=None)

    async def stored_message(self, pk, position) -> tuple[str, bool] | None:
        found = [(m.data, m.json) for m in self.added if m.seq == position]
        return found[-1] if found else None

    async def close_holes(self, pk, after, below=None) -> tuple[int, int]:
        return max([after, *(m.seq for m in self.added)]), 0

    async def last_stored(self, pk, at_most) -> tuple[int, int | None] | None:
        found = [m.seq for m in self.added if m.seq <= at_most]
        return (max(found), None) if found else None

    def follows(self, owner, expires_at) -> None: ...


class Notifier:
    def __init__(self) -> None:
        self.notified: list[str] = []

    async def notify(self, pk: str) -> None:
        self.notified.append(pk)


def context(
    leases: Leases, events: list, sink: Sink | None = None, max_buffered_bytes: int = 1 << 20
) -> ConnectionContext:
    return ConnectionContext(
        leases=leases,  # type: ignore[arg-type]
        sink=sink or Sink(),  # type: ignore[arg-type]
        notifier=Notifier(),  # type: ignore[arg-type]
        desired_state=None,  # type: ignore[arg-type]
        policy=UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://127.0.0.1"),
        protocol=JsonSeqProtocol(),
        log=lambda event, **fields: events.append((event, fields)),
        counters=Counters(),
        max_message_bytes=65536,
        max_buffered_messages=100,
        max_buffered_bytes=max_buffered_bytes,
        reconnect_base_seconds=0.01,
        reconnect_cap_seconds=0.05,
    )


LEASE = Lease(
    pk="CONN#a", ws_url=CLOSED_PORT_URL, last_seq=3, lease_version=1, owner="w1", session_version=1
)


async def test_redialling_stops_at_the_holders_deadline():
    """An upstream that keeps refusing: the redial loop itself must notice the deadline (the
    old one redialled for ever, relying on somebody else to end it)."""
    leases, events = Leases(Session(deadline=time.monotonic() + 1.0)), []
    finished = asyncio.Event()
    connection = Connection(
        LEASE, context(leases, events), acquired_at=0, on_finished=lambda c: finished.set()
    )

    await asyncio.wait_for(finished.wait(), timeout=10)

    assert connection.end_reason is EndReason.DEADLINE
    assert connection._context.counters.upstream_drops >= 2


async def test_a_final_checkpoint_that_finds_the_session_over_still_releases():
    """SIGTERM: the last checkpoint raised SessionLost and the release used to be skipped, so
    peers waited a whole lease instead of taking the stream at once."""
    leases, events = Leases(Session(deadline=time.monotonic() + 60)), []
    leases.checkpoint_error = SessionLost("deadline passed")
    finished = asyncio.Event()
    connection = Connection(
        LEASE, context(leases, events), acquired_at=0, on_finished=lambda c: finished.set()
    )
    deadline = time.monotonic() + 10
    while not any(event == "upstream_dropped" for event, _ in events):  # it has taken up the stream
        assert time.monotonic() < deadline, events
        await asyncio.sleep(0.01)
    connection.stored_seq = 10  # something to checkpoint
    connection.end(EndReason.SHUTDOWN)

    await asyncio.wait_for(finished.wait(), timeout=3)

    assert leases.released == [False]  # released, not sealed (nothing confirmed past 3)
    assert ("final_flush_failed", {"pk": "CONN#a", "error": "deadline passed"}) in events


class UndialableProtocol(JsonSeqProtocol):
    """A protocol that cannot make a URL of this lease's: an error the redial loop does not
    retry (an IDNA failure, a pluggable protocol's bug)."""

    def dial_url(self, ws_url, *, resume_after, epoch) -> str:
        raise ValueError("label empty or too long")


async def test_a_stream_that_fails_is_held_off_in_its_row_not_offered_at_once():
    """It was released and offered to the fleet at once, claimed again at once, and failed
    again within milliseconds: a hot loop through the fleet. Now the release carries the
    failure (the row holds the stream off, for everyone) and nobody is told to claim it."""
    leases, events = Leases(Session(deadline=time.monotonic() + 60)), []
    shared = dataclasses.replace(context(leases, events), protocol=UndialableProtocol())
    finished = asyncio.Event()
    connection = Connection(LEASE, shared, acquired_at=0, on_finished=lambda c: finished.set())

    await asyncio.wait_for(finished.wait(), timeout=10)

    assert connection.end_reason is EndReason.FAILED
    assert leases.failures == ["ValueError: label empty or too long"]
    assert shared.notifier.notified == []  # type: ignore[attr-defined]
    assert shared.counters.streams_held_off == 1
    assert [f for e, f in events if e == "stream_held_off"] == [
        {"pk": "CONN#a", "failures": 1, "error": "ValueError: label empty or too long"}
    ]


async def test_progress_clears_the_failures_this_lease_began_with():
    """A checkpoint clears the failures in the row; the lease kept the count it was claimed
    with, so a stream that failed nine times, then ran for a day, was held for minutes on its
    next failure instead of a second."""
    leases, events = Leases(Session(deadline=time.monotonic() + 60)), []
    lease = dataclasses.replace(LEASE, dial_failures=9)
    connection = Connection(
        lease, context(leases, events), acquired_at=0, on_finished=lambda c: None
    )
    connection.stored_seq = 10  # something stored since the claim

    await connection.checkpoint()

    assert connection.lease.dial_failures == 0
    await shut_down(connection)


async def test_a_stream_that_fails_for_the_store_is_offered_at_once_not_held_off():
    """Only the stream's own failure (making its URL, dialling it) is held off: one the store
    caused says nothing about the stream, and a peer should take it up at once."""

    class FailingSink(Sink):
        async def contiguous_end(self, pk, after) -> int:
            raise RuntimeError("the store answered nonsense")

    leases, events = Leases(Session(deadline=time.monotonic() + 60)), []
    shared = context(leases, events, sink=FailingSink())
    finished = asyncio.Event()
    connection = Connection(LEASE, shared, acquired_at=0, on_finished=lambda c: finished.set())

    await asyncio.wait_for(finished.wait(), timeout=10)

    assert connection.end_reason is EndReason.FAILED
    assert leases.failures == [None]
    assert shared.notifier.notified == ["CONN#a"]  # type: ignore[attr-defined]


def frame(seq: int, data: object = "d") -> str:
    return json.dumps({"seq": seq, "data": data})


POISON = [
    '{"seq": 5, "data": ' + "[" * 5000 + "]" * 5000 + "}",  # RecursionError in json.loads
    '{"seq": ' + "9" * 5000 + "}",  # ValueError: past Python's int-from-text limit
    '{"seq": 5, "data": NaN}',
    '{"seq": 5, "data": "\\ud800"}',
    '{"seq": 100000000000000000000000000000000000000, "data": 1}',
    "not json at all",
]


async def test_a_seq_that_jumps_or_goes_back_is_counted_and_logged_never_dropped_silently():
    """A bogus seq of 10**15 was stored and checkpointed, and the genuine messages after it were
    dropped without a word. The jump and every seq that goes back are counted and logged, and
    the message after the gap names its predecessor, so the log records the gap. (Seqs the log
    does not hold prove no restart: nothing to compare them with.)"""
    script = [frame(4), frame(5), frame(10**15), frame(6), frame(7), frame(10**15 + 1)]
    async with scripted_upstream(script) as url:
        sink = Sink()
        sink.waiting_for = 10**15 + 1
        connection, ctx, events, _ = start_connection(url, sink)
        await asyncio.wait_for(sink.got.wait(), timeout=30)

        assert [m.seq for m in sink.added] == [4, 5, 10**15, 10**15 + 1]
        assert sink.prev_seqs == [3, 4, 5, 10**15]
        counters = ctx.counters
        assert (counters.upstream_gaps, counters.upstream_seq_backwards) == (1, 2)
        assert counters.log_epochs == 0
        logged = [event for event, _ in events if event.startswith("upstream_")]
        assert logged == ["upstream_gap", "upstream_seq_repeated"], logged
        await shut_down(connection)


async def test_a_seq_sent_again_is_a_duplicate_only_if_it_is_the_same_message():
    """An upstream whose numbering restarts (after 6 it sends 4, 5, ... again) had every new
    message dropped as a duplicate until its seqs passed 6, and every client dropped them too.
    The same message again is still a duplicate; another one at a seq the log holds begins the
    stream's next epoch, whose first message follows the last of the one before."""
    script = [frame(4, "a"), frame(5, "b"), frame(6, "c"), frame(5, "b"), frame(6, "c")]
    script += [frame(4, "new"), frame(5, "newer"), frame(5, "newer"), frame(7, "z")]
    async with scripted_upstream(script) as url:
        sink = Sink()
        sink.waiting_for = log_position(1, 7)
        connection, ctx, events, _ = start_connection(url, sink)
        await asyncio.wait_for(sink.got.wait(), timeout=30)

        assert [(m.seq, m.data) for m in sink.added] == [
            (4, "a"),
            (5, "b"),
            (6, "c"),
            (log_position(1, 4), "new"),
            (log_position(1, 5), "newer"),
            (log_position(1, 7), "z"),
        ]
        assert sink.prev_seqs[3:] == [6, log_position(1, 4), log_position(1, 5)]
        assert (ctx.counters.upstream_seq_backwards, ctx.counters.log_epochs) == (3, 1)
        begun = [fields for event, fields in events if event == "log_epoch_begun"]
        assert begun == [{"pk": "CONN#a", "epoch": 1, "first": 4, "after": 6}]
        assert connection.log_epoch == 1
        await shut_down(connection)


async def test_poison_frames_are_refused_one_by_one_and_the_stream_keeps_its_lease():
    """A small poison frame (deep nesting, a huge integer) ended the connection; the lease was
    released and re-claimed about 13 times a second, the stream stuck for ever. Each bad frame
    is now refused alone, counted, and logged at most once per interval."""
    script = [frame(4)] + POISON * 40 + [frame(5), frame(6, "x" * 2000), frame(7, {"n": 1e3})]
    async with scripted_upstream(script) as url:
        sink = Sink()
        sink.max_item_bytes = 1000  # seq 6 cannot be stored
        sink.waiting_for = 7
        connection, ctx, events, leases = start_connection(url, sink)

        await asyncio.wait_for(sink.got.wait(), timeout=30)

        assert connection.end_reason is None and connection.connected
        assert [(m.seq, m.data, m.json) for m in sink.added] == [
            (4, "d", False),
            (5, "d", False),
            (7, '{"n": 1000.0}', True),
        ]
        assert ctx.counters.frames_refused == len(POISON) * 40 + 1
        refusals = [fields for event, fields in events if event == "upstream_frame_refused"]
        assert len(refusals) == 1, refusals  # the rest within the interval are only counted
        assert refusals[0]["pk"] == "CONN#a" and refusals[0]["reason"]
        assert not any(event == "upstream_dropped" for event, _ in events)
        await shut_down(connection)
        assert leases.released == [False]


@contextlib.asynccontextmanager
async def scripted_upstream(script: list[str]):
    """A loopback upstream that sends ``script`` to whoever dials it; yields its URL."""

    async def upstream(websocket) -> None:
        for text in script:
            await websocket.send(text)
        await websocket.wait_closed()

    async with serve(upstream, "127.0.0.1", 0) as server:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/s"


def start_connection(url: str, sink: Sink, last_seq: int = 3, **kwargs):
    leases, events = Leases(Session(deadline=time.monotonic() + 60)), []
    lease = Lease(
        pk="CONN#a", ws_url=url, last_seq=last_seq, lease_version=1, owner="w1", session_version=1
    )
    ctx = context(leases, events, sink, **kwargs)
    connection = Connection(lease, ctx, acquired_at=0, on_finished=lambda c: None)
    return connection, ctx, events, leases


async def shut_down(connection: Connection) -> None:
    connection.end(EndReason.SHUTDOWN)
    await asyncio.wait_for(connection.task, timeout=10)


@contextlib.asynccontextmanager
async def ping_flood_upstream():
    """An upstream that completes the handshake, then floods pings and never reads again (each
    ping makes the client queue a pong). Hand-written, since a WebSocket library always reads."""
    floods: list[asyncio.Task] = []

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        key = next(
            line.split(b":", 1)[1].strip()
            for line in request.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(
            hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()
        )
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        writer.transport.pause_reading()  # never reads again
        ping = b"\x89\x7d" + b"p" * 125  # the largest ping: its pong is as large
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(ping * 64)
                await writer.drain()

    def handle(reader, writer):
        floods.append(asyncio.create_task(flood(reader, writer)))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/s"
    finally:
        for task in floods:
            task.cancel()
        server.close()


async def test_an_upstream_that_floods_pings_and_never_reads_is_cut_off_not_buffered():
    """The queued pongs reached 702 MiB in 45 s and still grew; the worker's own keepalive
    never fired. Unsent bytes are capped per connection: past the cap the socket is aborted,
    and the stream is redialled with backoff, keeping its lease."""
    async with ping_flood_upstream() as url:
        connection, _, events, _ = start_connection(url, Sink())
        deadline = time.monotonic() + 60
        while not any(
            f.get("error") == "not reading" for e, f in events if e == "upstream_dropped"
        ):
            assert time.monotonic() < deadline, events
            await asyncio.sleep(0.05)

        assert connection.end_reason is None
        await shut_down(connection)


async def test_a_stream_ends_promptly_when_its_upstream_does_not_read():
    """After about 30 MB of unread pongs a STOP was never carried out, and SIGTERM used its
    full 10 s handing nothing over. Closing aborts a socket that cannot drain."""
    async with ping_flood_upstream() as url:
        connection, _, _, leases = start_connection(url, Sink())
        deadline = time.monotonic() + 30
        while not connection.connected:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

        await shut_down(connection)  # within 10 s: the close is bounded at 0.4 s

        assert leases.released == [False]


async def test_a_handshake_alone_does_not_reset_the_backoff(monkeypatch):
    """An upstream that accepts and closes at once, or replays a message over the limit, was
    redialled about 10 times a second for ever: each handshake reset the backoff. It resets
    only after a message was received."""
    attempts = record_backoff(monkeypatch)
    script = [frame(4, "x" * 70_000)]  # over the 65,536 bytes the context allows
    async with scripted_upstream(script) as url:
        connection, ctx, events, _ = start_connection(url, Sink())
        await redials(attempts, 5)
        await shut_down(connection)

    assert attempts[:5] == [0, 1, 2, 3, 4]
    assert ctx.counters.frames_refused >= 5  # each replay of the message is reported...
    refused = [f for e, f in events if e == "upstream_frame_refused"]
    assert len(refused) == 1 and refused[0]["seq"] == 4  # ...and logged once per interval
    assert "MAX_MESSAGE_BYTES" in refused[0]["reason"]


async def test_progress_resets_the_backoff(monkeypatch):
    attempts = record_backoff(monkeypatch)
    seqs = iter(range(4, 1000))

    async def one_message_then_close(websocket) -> None:
        await websocket.send(frame(next(seqs)))
        await websocket.close()

    async with serve(one_message_then_close, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/s"
        connection, _, _, _ = start_connection(url, Sink())
        await redials(attempts, 5)
        await shut_down(connection)

    assert attempts[:5] == [0, 0, 0, 0, 0]


async def test_reading_pauses_at_the_connections_bound_in_bytes():
    """Frames of 64 KiB that expand when parsed held 1.5 GiB for one connection: the bound was
    1,000 messages, whatever their size. Unstored bytes are bounded per connection."""
    script = [frame(seq, "y" * 4000) for seq in range(4, 104)]
    async with scripted_upstream(script) as url:
        sink = Sink()  # never reports anything stored
        connection, _, _, _ = start_connection(url, sink, max_buffered_bytes=10_000)
        deadline = time.monotonic() + 30
        while connection._drained.is_set() or not sink.added:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

        assert len(sink.added) == 3  # 12,000 bytes unstored: it stopped reading there
        await shut_down(connection)


def record_backoff(monkeypatch) -> list[int]:
    """The attempt number of every backoff the connection waits (each wait made 1 ms)."""
    attempts: list[int] = []

    def recording(attempt: int, base: float, cap: float) -> float:
        attempts.append(attempt)
        return 0.001

    monkeypatch.setattr(connection_module, "full_jitter", recording)
    return attempts


async def redials(attempts: list[int], count: int) -> None:
    deadline = time.monotonic() + 30
    while len(attempts) < count:
        assert time.monotonic() < deadline, attempts
        await asyncio.sleep(0.01)


async def test_a_replay_written_anew_is_the_same_json_value_not_a_restart():
    """The same JSON value spaced or ordered differently is the same message: not an epoch."""
    script = [frame(4, {"a": 1, "b": [2]}), '{"seq": 4, "data": {"b": [2],  "a": 1}}', frame(5)]
    async with scripted_upstream(script) as url:
        sink = Sink()
        sink.waiting_for = 5
        connection, ctx, _, _ = start_connection(url, sink)
        await asyncio.wait_for(sink.got.wait(), timeout=30)

        assert [m.seq for m in sink.added] == [4, 5]
        assert (ctx.counters.upstream_seq_backwards, ctx.counters.log_epochs) == (1, 0)
        await shut_down(connection)


async def test_a_successor_at_an_epochs_origin_stores_nothing_below_it():
    """Resumed at epoch 1's origin (seq 9), the first message followed the old epoch's last
    stored one for the duplicate check too: seqs 1..8 sent again were stored below the origin."""
    script = [frame(5, "old"), frame(10, "new")]
    async with scripted_upstream(script) as url:
        sink = Sink()
        sink.added.append(UpstreamMessage(3, "epoch 0's last"))
        sink.waiting_for = log_position(1, 10)
        connection, ctx, _, _ = start_connection(url, sink, last_seq=log_position(1, 9))
        await asyncio.wait_for(sink.got.wait(), timeout=30)

        assert [m.seq for m in sink.added] == [3, log_position(1, 10)]
        assert sink.prev_seqs == [3]  # it follows epoch 0's last message
        assert ctx.counters.upstream_seq_backwards == 1
        await shut_down(connection)
