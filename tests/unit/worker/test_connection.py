"""One connection's end-of-life rules, with stand-ins for the store and the sink (unit tests)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from streamfleet.lease import Lease, SessionLost
from streamfleet.worker.connection import Connection, ConnectionContext, EndReason
from streamfleet.worker.observability import Counters
from streamfleet.worker.protocol import JsonSeqProtocol
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

    async def checkpoint(self, lease, seq, *, origin=False) -> None:
        if self.checkpoint_error is not None:
            raise self.checkpoint_error

    async def release(self, lease, *, sealed=False) -> bool:
        self.released.append(sealed)
        return True


class Sink:
    def add(self, owner, message) -> None: ...

    async def flush(self) -> None: ...

    async def settle(self, owner) -> None: ...

    async def contiguous_end(self, pk, after) -> int:
        return after


class Notifier:
    def __init__(self) -> None:
        self.notified: list[str] = []

    async def notify(self, pk: str) -> None:
        self.notified.append(pk)


def context(leases: Leases, events: list) -> ConnectionContext:
    return ConnectionContext(
        leases=leases,  # type: ignore[arg-type]
        sink=Sink(),  # type: ignore[arg-type]
        notifier=Notifier(),  # type: ignore[arg-type]
        desired_state=None,  # type: ignore[arg-type]
        policy=UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://127.0.0.1"),
        protocol=JsonSeqProtocol(),
        log=lambda event, **fields: events.append((event, fields)),
        counters=Counters(),
        max_message_bytes=65536,
        max_buffered_messages=100,
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
    assert sum(1 for event, _ in events if event == "upstream_dropped") >= 2


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
