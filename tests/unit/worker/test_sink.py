"""The message sink's promises, with a scripted DynamoDB stand-in (unit tests: the integration,
chaos and simulation suites run it against real servers)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from streamfleet import model
from streamfleet.clock import SYSTEM_CLOCK
from streamfleet.lease.errors import SessionLost
from streamfleet.worker.protocol import UpstreamMessage
from streamfleet.worker.sink import MAX_ITEMS_PER_FLUSH, MessageSink


@dataclass
class FakeSession:
    version: int = 1
    deadline: float = field(default_factory=lambda: time.monotonic() + 60)
    clock: Any = SYSTEM_CLOCK

    def require_live(self, version: int | None = None) -> int:
        if time.monotonic() >= self.deadline or version not in (None, self.version):
            raise SessionLost("deadline passed")
        return self.version

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


@dataclass
class Owner:
    pk: str
    session_version: int = 1
    stored_up_to: int = 0
    failures: list[Exception] = field(default_factory=list)

    def stored(self, count: int, up_to_seq: int, size: int = 0) -> None:
        self.stored_up_to = max(self.stored_up_to, up_to_seq)

    def storage_failed(self, error: Exception) -> None:
        self.failures.append(error)


class ScriptedDynamo:
    """Records every BatchWriteItem as it is *sent* and as it *lands*; ``slow``/``fail`` pick
    requests by a predicate on their seqs."""

    def __init__(self) -> None:
        self.landed: list[tuple[str, int]] = []
        self.sent_at: list[float] = []
        self.slow: dict[int, float] = {}  # seq -> seconds the request carrying it takes
        self.failing: set[int | tuple[str, int]] = set()  # seqs, or (pk, seq): refused
        self.requests: dict[str, int] = {}
        self.sending = asyncio.Event()  # set once a request is on its way

    async def call(self, operation: str, *, guard=None, **params: Any) -> dict[str, Any]:
        self.requests[operation] = self.requests.get(operation, 0) + 1
        if guard is not None:
            guard()
        assert operation == "batch_write_item"
        [(_table, requests)] = params["RequestItems"].items()
        items = [r["PutRequest"]["Item"] for r in requests]
        seqs = [int(item[model.SEQ]["N"]) for item in items]
        self.sent_at.append(time.monotonic())
        self.sending.set()
        await asyncio.sleep(max((self.slow.get(s, 0) for s in seqs), default=0))
        keys = {(item[model.PK]["S"], int(item[model.SEQ]["N"])) for item in items}
        if self.failing & (set(seqs) | keys):
            raise ClientError({"Error": {"Code": "ValidationException"}}, "BatchWriteItem")
        self.landed += [(item[model.PK]["S"], int(item[model.SEQ]["N"])) for item in items]
        self.items = items
        return {}


def make_sink(dynamo: ScriptedDynamo, session: FakeSession | None = None, **kwargs) -> MessageSink:
    return MessageSink(
        dynamodb=dynamo,  # type: ignore[arg-type]
        table_name="messages",
        worker_id="w1",
        session=session or FakeSession(),  # type: ignore[arg-type]
        flush_every=0.01,
        **kwargs,
    )


def add(sink: MessageSink, owner: Owner, *seqs: int) -> None:
    for seq in seqs:
        sink.add(owner, UpstreamMessage(seq, f"{owner.pk}:{seq}"))


async def test_flush_waits_for_a_flush_under_way_that_holds_its_messages():
    """Otherwise a stopping connection checkpoints and seals before its last message lands."""
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    dynamo.slow[2] = 0.3
    sink = make_sink(dynamo)
    add(sink, owner, 1, 2)
    under_way = asyncio.create_task(sink.flush())
    await dynamo.sending.wait()  # it has taken both messages and is writing them

    await sink.flush()

    assert ("CONN#a", 2) in dynamo.landed and owner.stored_up_to == 2
    await under_way


async def test_a_failed_write_stops_every_later_write_of_that_connection_only():
    dynamo = ScriptedDynamo()
    failing, healthy = Owner("CONN#f"), Owner("CONN#h")
    dynamo.failing = {("CONN#f", 3)}
    sink = make_sink(dynamo)
    add(sink, failing, *range(1, 26))  # one request of 25, refused
    add(sink, healthy, 1, 2, 3)  # the next request
    await sink.flush()
    add(sink, failing, 26, 27)  # received after the failure, before the connection ended
    add(sink, healthy, 4)
    await sink.flush()

    assert len(failing.failures) == 1
    assert not any(pk == "CONN#f" for pk, _ in dynamo.landed)
    assert healthy.stored_up_to == 4 and not healthy.failures


async def test_an_owner_hears_of_a_failure_only_once_no_sibling_write_is_left_in_flight():
    """A sibling chunk that keeps writing after its connection was released lands behind the
    back of the next owner."""
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    seqs = list(range(1, 61))  # three chunks of 25, 25, 10
    dynamo.failing = {1}
    dynamo.slow = {60: 0.3}  # the last chunk is slow
    sink = make_sink(dynamo)
    add(sink, owner, *seqs)
    told_at: list[float] = []
    owner.storage_failed = lambda error: told_at.append(time.monotonic())  # type: ignore[method-assign]

    await sink.flush()

    assert told_at and ("CONN#a", 60) in dynamo.landed
    landed_last = max(dynamo.sent_at) + 0.3
    assert told_at[0] >= landed_last - 0.05


async def test_settle_drops_what_is_queued_and_waits_for_writes_in_flight():
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    dynamo.slow[1] = 0.3
    sink = make_sink(dynamo)
    add(sink, owner, 1)
    writing = asyncio.create_task(sink.flush())
    await dynamo.sending.wait()
    add(sink, owner, 2)

    await sink.settle(owner)

    assert ("CONN#a", 1) in dynamo.landed  # it waited for the write in flight
    await sink.flush()
    await writing
    assert ("CONN#a", 2) not in dynamo.landed


async def test_messages_of_a_session_that_is_over_are_never_written():
    dynamo, session = ScriptedDynamo(), FakeSession()
    old = Owner("CONN#a", session_version=1)
    sink = make_sink(dynamo, session)
    add(sink, old, 1)
    session.version = 2  # the session was reopened: old leases are void

    await sink.flush()

    assert dynamo.landed == [] and isinstance(old.failures[0], SessionLost)


async def test_stored_messages_carry_the_retention_as_their_ttl():
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    sink = make_sink(dynamo, retention_seconds=7 * 86400)
    add(sink, owner, 1)
    await sink.flush()
    [item] = dynamo.items
    now = time.time()
    assert abs(int(item[model.MESSAGE_EXPIRES_AT]["N"]) - (now + 7 * 86400)) < 5


async def test_a_huge_backlog_is_serialised_a_little_at_a_time():
    """70,000 queued messages: between two turns of the event loop the sink serialises at most
    a few requests' worth (counted, not timed, so a busy machine cannot make it flaky)."""
    dynamo = ScriptedDynamo()
    owners = [Owner(f"CONN#{n}") for n in range(100)]
    sink = make_sink(dynamo)
    for seq in range(1, 701):
        for owner in owners:
            sink.add(owner, UpstreamMessage(seq, "x" * 40))
    serialised = 0
    item_of = sink._item

    def counting(pending):
        nonlocal serialised
        serialised += 1
        return item_of(pending)

    sink._item = counting  # type: ignore[method-assign]
    bursts: list[int] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        seen = 0
        while not stop.is_set():
            await asyncio.sleep(0)
            bursts.append(serialised - seen)
            seen = serialised

    ticking = asyncio.create_task(ticker())
    await sink.flush()
    stop.set()
    await ticking

    assert all(owner.stored_up_to == 700 for owner in owners)
    assert dynamo.requests["batch_write_item"] == 70_000 // 25
    # At most the parallel requests' worth per turn (8 x 25), never the backlog (or a flush).
    assert max(bursts) <= 8 * 25 < MAX_ITEMS_PER_FLUSH, max(bursts)


async def test_a_message_dynamodb_refuses_fails_only_its_own_stream():
    """One unstorable message failed its whole 25-item request, and every other stream with a
    message in it lost its connection, on every replay."""
    dynamo = ScriptedDynamo()
    poisoned = Owner("CONN#p")
    innocents = [Owner(f"CONN#i{n}") for n in range(5)]
    dynamo.failing = {("CONN#p", 2)}
    sink = make_sink(dynamo)
    for seq in range(1, 5):
        add(sink, poisoned, seq)
        for owner in innocents:
            add(sink, owner, seq)  # 25 messages of 6 streams: one request

    await sink.flush()

    assert len(poisoned.failures) == 1
    assert all(owner.stored_up_to == 4 and not owner.failures for owner in innocents)
    assert {pk for pk, _ in dynamo.landed} == {owner.pk for owner in innocents}


async def test_the_stored_item_keeps_the_data_and_says_when_it_is_json():
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    sink = make_sink(dynamo)
    sink.add(owner, UpstreamMessage(1, "[1, 2]"))
    sink.add(owner, UpstreamMessage(2, '{"n": 1e400}', json=True))
    await sink.flush()

    text, value = dynamo.items
    assert text[model.MESSAGE_DATA] == {"S": "[1, 2]"} and model.MESSAGE_FORMAT not in text
    assert value[model.MESSAGE_DATA] == {"S": '{"n": 1e400}'}
    assert value[model.MESSAGE_FORMAT] == {"S": model.MESSAGE_FORMAT_JSON}


def test_a_message_too_big_for_one_item_does_not_fit():
    sink = make_sink(ScriptedDynamo())
    assert sink.fits("CONN#a", UpstreamMessage(1, "x" * model.MAX_UPSTREAM_MESSAGE_BYTES))
    assert not sink.fits("CONN#a", UpstreamMessage(1, "x" * model.DYNAMODB_MAX_ITEM_BYTES))


async def test_the_worker_stops_reading_at_its_bound_in_bytes_until_a_write_finished():
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    sink = make_sink(dynamo, max_buffered_bytes=10_000)
    for seq in (1, 2):
        sink.add(owner, UpstreamMessage(seq, "z" * 4000))
    assert sink.room.is_set()
    sink.add(owner, UpstreamMessage(3, "z" * 4000))
    assert not sink.room.is_set() and sink.buffered_bytes == 12_000

    await sink.flush()

    assert sink.room.is_set() and sink.buffered_bytes == 0


async def test_what_settle_drops_no_longer_counts_against_the_bound():
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    sink = make_sink(dynamo, max_buffered_bytes=10_000)
    for seq in (1, 2, 3):
        sink.add(owner, UpstreamMessage(seq, "z" * 4000))

    await sink.settle(owner)

    assert sink.room.is_set() and sink.buffered_bytes == 0


async def test_each_item_names_the_message_before_it_and_when_that_one_expires():
    """How a reader proves that a hole can never be filled: the message before it
    was sent and has expired, or nothing was sent in between."""
    dynamo, owner = ScriptedDynamo(), Owner("CONN#a")
    sink = make_sink(dynamo, retention_seconds=86400)
    sink.add(owner, UpstreamMessage(5, "a"), 4)  # the first since a resume after 4
    sink.add(owner, UpstreamMessage(9, "b"), 5)  # 6..8 never sent
    await sink.flush()

    first, second = dynamo.items
    assert first[model.MESSAGE_PREV_SEQ] == {"N": "4"}
    assert model.MESSAGE_PREV_EXPIRES_AT not in first  # stored by someone else, if at all
    assert second[model.MESSAGE_PREV_SEQ] == {"N": "5"}
    assert second[model.MESSAGE_PREV_EXPIRES_AT] == first[model.MESSAGE_EXPIRES_AT]
