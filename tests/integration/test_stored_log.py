"""The stored log as the sink writes and reads it, on each DynamoDB backend: where a new owner
resumes and what the sealer of a stopped stream keeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.clock import SYSTEM_CLOCK
from streamfleet.lease import Lease
from streamfleet.lease.errors import SessionLost
from streamfleet.worker.connection import Connection, ConnectionContext, EndReason
from streamfleet.worker.observability import Counters
from streamfleet.worker.protocol import JsonSeqProtocol, UpstreamMessage
from streamfleet.worker.sink import MessageSink
from streamfleet.worker.upstream_policy import UpstreamPolicy
from streamfleet_dev.upstream.fake import FakeUpstream, message_data
from tests.support import ShiftableClock

PK = "CONN#s"


@dataclass
class Session:
    version: int = 1
    deadline: float = field(default_factory=lambda: time.monotonic() + 120)
    clock: Any = SYSTEM_CLOCK

    def require_live(self, version: int | None = None) -> int:
        if time.monotonic() >= self.deadline:
            raise SessionLost("deadline passed")
        return self.version

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()


@dataclass
class Owner:
    pk: str = PK
    session_version: int = 1
    failures: list[Exception] = field(default_factory=list)

    def stored(self, count: int, up_to_seq: int, size: int) -> None: ...

    def storage_failed(self, error: Exception) -> None:
        self.failures.append(error)


@pytest.fixture
async def sink(table_names) -> AsyncIterator[MessageSink]:
    client = AsyncClient("dynamodb")
    yield MessageSink(
        dynamodb=client,
        table_name=table_names[1],
        worker_id="w1",
        session=Session(),  # type: ignore[arg-type]
        flush_every=1.0,
        retention_seconds=7 * 24 * 3600,
    )
    client.close()


async def store(sink: MessageSink, owner: Owner, *received: tuple[int, int | None]) -> None:
    """Store messages as a connection does: each ``(seq, prev_seq)`` as it was received."""
    for seq, prev in received:
        sink.add(owner, UpstreamMessage(seq, f"m{seq}"), prev)
    await sink.flush()
    assert not owner.failures


def stored_items(table: str) -> list[dict[str, Any]]:
    pages = (
        boto3.client("dynamodb")
        .get_paginator("query")
        .paginate(
            TableName=table,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": model.PK},
            ExpressionAttributeValues={":pk": {"S": PK}},
            ConsistentRead=True,
        )
    )
    return [item for page in pages for item in page["Items"]]


def stored_seqs(table: str) -> list[int]:
    return [int(item[model.SEQ]["N"]) for item in stored_items(table)]


async def test_a_gap_the_upstream_left_is_part_of_the_log_and_sealing_keeps_what_follows(
    sink: MessageSink, table_names
):
    """The upstream skipped seq 4. The sealer of the stopped stream took the gap for a hole
    and deleted everything after it (54 of 59 messages in the reported run)."""
    owner = Owner()
    await store(
        sink,
        owner,
        (1, 0),
        (2, 1),
        (3, 2),
        *((seq, seq - 1 if seq > 5 else 3) for seq in range(5, 60)),
    )

    end = await sink.contiguous_end(PK, 0)
    closed = await sink.close_holes(PK, end)

    assert end == 59 and closed == (59, 0)
    assert stored_seqs(table_names[1]) == [1, 2, 3, *range(5, 60)]


async def test_a_refused_frame_leaves_a_gap_not_a_hole(sink: MessageSink):
    """Seq 3 was refused (unreadable): 4 was received right after 2."""
    await store(sink, Owner(), (1, 0), (2, 1), (4, 2), (5, 4))
    assert await sink.contiguous_end(PK, 0) == 5


async def test_a_hole_a_partly_landed_batch_left_still_ends_the_run(sink: MessageSink):
    """Seq 4 was received and never stored: a successor resumes after 3 and rewrites it."""
    await store(sink, Owner(), (1, 0), (2, 1), (3, 2), (5, 4), (6, 5))
    assert await sink.contiguous_end(PK, 0) == 3
    assert await sink.contiguous_end(PK, 4) == 6  # the checkpoint was past the hole already


async def test_what_a_writer_left_before_a_gap_its_successor_was_given_ends_no_run(
    sink: MessageSink,
):
    """10 landed without 9 (a batch that landed in part); the successor resumed after 5 and its
    upstream went on at 15. Nothing can fill 6..9 any more: the run went on to 16, where the
    successor's sealer and readers waited for 9 until it expired (up to the retention)."""
    await store(sink, Owner(), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4), (10, 9), (15, 5), (16, 15))
    assert await sink.contiguous_end(PK, 5) == 16
    assert await sink.contiguous_end(PK, 0) == 16


async def test_items_stored_without_prev_seq_are_contiguous_only_seq_by_seq(sink: MessageSink):
    await store(sink, Owner(), (1, None), (2, None), (4, None))
    assert await sink.contiguous_end(PK, 0) == 2


async def test_a_hole_nothing_can_fill_is_recorded_as_a_gap_and_what_follows_is_kept(
    sink: MessageSink, table_names
):
    """The sealer deleted everything past a hole the upstream could no longer replay, though
    subscribers may have received it; a message later written at one of those seqs was then
    dropped by every client as a duplicate it was not."""
    await store(sink, Owner(), (1, 0), (2, 1), (3, 2), (5, 4), (6, 5), (9, 8), (10, 9))

    assert await sink.close_holes(PK, 1) == (10, 2)

    assert stored_seqs(table_names[1]) == [1, 2, 3, 5, 6, 9, 10]
    assert prev_seqs(table_names[1]) == {5: 3, 9: 6}
    assert await sink.contiguous_end(PK, 0) == 10
    assert await sink.close_holes(PK, 0) == (10, 0)  # again: nothing more to record


def prev_seqs(table: str) -> dict[int, int]:
    """``prev_seq`` of the items whose predecessor is not the seq just before."""
    return {
        int(item[model.SEQ]["N"]): int(item[model.MESSAGE_PREV_SEQ]["N"])
        for item in stored_items(table)
        if model.MESSAGE_PREV_SEQ in item
        and int(item[model.MESSAGE_PREV_SEQ]["N"]) != int(item[model.SEQ]["N"]) - 1
    }


@dataclass
class Leases:
    """The lease store as a sealer needs it: a live session; checkpoints recorded."""

    session: Session
    checkpoints: list[int] = field(default_factory=list)
    released: list[bool] = field(default_factory=list)  # sealed or not, each time

    async def checkpoint(self, lease, seq, *, origin=False) -> None:
        self.checkpoints.append(seq)

    async def release(self, lease, *, sealed=False, failure=None) -> bool:
        self.released.append(sealed)
        return False


async def test_the_sealer_refills_a_hole_from_the_upstream_instead_of_deleting_what_follows(
    sink: MessageSink, table_names
):
    """A batch landed only in part before its owner died, then the stream was STOPPED: the
    sealer removed everything past the hole. It now has the upstream replay the hole, and the
    log keeps every message it had, exactly once."""
    async with FakeUpstream(rate=200) as upstream:
        upstream.ensure_stream("s")
        await store_with_a_hole(sink)
        sealer, events, leases = await run_sealer(sink, upstream.url_for("s"))

    assert sealer.end_reason is EndReason.SEALED
    assert stored_seqs(table_names[1]) == list(range(1, 9))
    assert ("log_sealed", {"pk": PK, "epoch": 0, "last_seq": 8, "gaps_recorded": 0}) in events
    assert leases.checkpoints[-1] == 8


async def test_a_sealer_that_cannot_reach_the_upstream_deletes_nothing_and_leaves_it_unsealed(
    sink: MessageSink, table_names
):
    """A refill that failed for a passing reason (DNS, a timeout, an upstream down) was
    followed by the removal of everything past the hole, already delivered to subscribers."""
    await store_with_a_hole(sink)
    sealer, events, leases = await run_sealer(sink, "ws://127.0.0.1:9/s")  # nothing listens

    assert sealer.end_reason is EndReason.FAILED and leases.released == [False]
    assert stored_seqs(table_names[1]) == [1, 2, 3, 5, 6, 7, 8]
    assert not [e for e, _ in events if e == "log_sealed"]


async def store_with_a_hole(sink: MessageSink) -> None:
    owner = Owner()
    for seq in (1, 2, 3, 5, 6, 7, 8):  # 4 was received and never stored
        sink.add(owner, UpstreamMessage(seq, message_data("s", seq)), seq - 1)
    await sink.flush()


def connection_context(sink: MessageSink, leases: Leases, events: list) -> ConnectionContext:
    return ConnectionContext(
        leases=leases,  # type: ignore[arg-type]
        sink=sink,
        notifier=None,  # type: ignore[arg-type]
        desired_state=None,  # type: ignore[arg-type]
        policy=UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "ws://127.0.0.1"),
        protocol=JsonSeqProtocol(),
        log=lambda event, **fields: events.append((event, fields)),
        counters=Counters(),
        max_message_bytes=65536,
        max_buffered_messages=100,
        max_buffered_bytes=1 << 20,
        reconnect_base_seconds=0.01,
        reconnect_cap_seconds=0.05,
    )


async def run_sealer(sink: MessageSink, url: str):
    """A worker that claimed the stopped stream to seal it, run to its end."""
    events: list = []
    leases = Leases(sink._session)  # type: ignore[arg-type]
    context = connection_context(sink, leases, events)
    lease = Lease(
        pk=PK,
        ws_url=url,
        last_seq=2,
        lease_version=2,
        owner="w2",
        session_version=1,
        desired_state="STOPPED",
    )
    sealer = Connection(lease, context, acquired_at=0, on_finished=lambda c: None)
    await asyncio.wait_for(sealer.task, 30)
    return sealer, events, leases


async def test_an_upstream_that_restarts_its_numbering_begins_a_new_epoch_of_the_log(
    sink: MessageSink, table_names
):
    """An upstream that lost its state numbers from 1 again. Its new messages were dropped as
    duplicates until their seqs passed the old ones (and every client dropped them again). They
    are now stored in the stream's next epoch, whose first message follows the old epoch's last:
    nothing is dropped, nothing is written over, and the log stays one run."""
    clock = ShiftableClock()
    async with FakeUpstream(rate=20, clock=clock.monotonic) as upstream:
        upstream.ensure_stream("s")
        clock.advance(10)  # 200 messages at once: the new numbering needs 10 s to catch up
        flusher = asyncio.create_task(sink.run())
        worker, events, leases = start_streaming(sink, upstream.url_for("s"))
        await wait_for_stored(table_names[1], 200)
        await upstream.restart("s")
        await wait_for_stored(table_names[1], model.log_position(1, 20))
        worker.end(EndReason.SHUTDOWN)
        await asyncio.wait_for(worker.task, 30)
        flusher.cancel()

    positions = stored_seqs(table_names[1])
    old = [p for p in positions if model.epoch_of(p) == 0]
    new = [model.seq_of(p) for p in positions if model.epoch_of(p) == 1]
    assert old == list(range(1, len(old) + 1)) and len(old) >= 200
    assert new == list(range(1, len(new) + 1)) and len(new) >= 20
    assert prev_seqs(table_names[1]) == {model.log_position(1, 1): old[-1]}
    assert model.log_position(1, 0) in leases.checkpoints  # the new epoch's origin, first
    assert await sink.contiguous_end(PK, 0) == positions[-1]
    [begun] = [fields for event, fields in events if event == "log_epoch_begun"]
    assert begun == {"pk": PK, "epoch": 1, "first": 1, "after": old[-1]}
    assert stored_data(table_names[1], model.log_position(1, 1)) == message_data("s", 1, 1)


async def test_a_restart_that_went_on_past_the_resume_point_is_caught_by_the_one_sent_again(
    sink: MessageSink, table_names
):
    """A restarted numbering already past the old log's end when the owner redials: resumed
    after the last seq stored, it sent the next seq of its new numbering, which passed for the
    old log going on. Dialled one seq back, its first message is compared with the stored one."""
    clock = ShiftableClock()
    async with FakeUpstream(rate=20, clock=clock.monotonic) as upstream:
        upstream.ensure_stream("s")
        clock.advance(10)  # 200 messages
        flusher = asyncio.create_task(sink.run())
        worker, events, _ = start_streaming(sink, upstream.url_for("s"))
        await wait_for_stored(table_names[1], 200)
        await upstream.restart("s", head=400)
        await wait_for_stored(table_names[1], model.log_position(1, 400))
        worker.end(EndReason.SHUTDOWN)
        await asyncio.wait_for(worker.task, 30)
        flusher.cancel()

    [begun] = [fields for event, fields in events if event == "log_epoch_begun"]
    old_end = begun["after"]
    assert begun["first"] == old_end  # the one sent again, with the new numbering's data
    assert stored_data(table_names[1], model.log_position(1, old_end)) == message_data(
        "s", old_end, 1
    )
    assert stored_data(table_names[1], old_end) == message_data("s", old_end)


async def test_a_successor_of_an_owner_that_began_an_epoch_chains_its_first_message_to_the_old(
    sink: MessageSink, table_names
):
    """An owner checkpointed a new epoch's origin and died before storing anything of it. Its
    successor's first message named that origin, which is no message, as its prev_seq: readers
    at the old epoch's end waited for ever for a hole before it."""
    await store(sink, Owner(), (1, 0), (2, 1), (3, 2))
    async with FakeUpstream(rate=200) as upstream:
        upstream.ensure_stream("s")
        flusher = asyncio.create_task(sink.run())
        worker, _, _ = start_streaming(sink, upstream.url_for("s"), model.log_position(1, 0))
        await wait_for_stored(table_names[1], model.log_position(1, 2))
        worker.end(EndReason.SHUTDOWN)
        await asyncio.wait_for(worker.task, 30)
        flusher.cancel()

    first = model.log_position(1, 1)
    assert prev_seqs(table_names[1]) == {first: 3}
    [item] = [i for i in stored_items(table_names[1]) if int(i[model.SEQ]["N"]) == first]
    assert model.MESSAGE_PREV_EXPIRES_AT in item  # when 3 expires: a reader can tell


async def test_an_owner_whose_upstream_went_past_a_hole_records_the_gap_before_what_was_left(
    sink: MessageSink, table_names
):
    """A predecessor left 4..5 unstored and 6..8 stored; the successor's upstream, asked for
    what follows 3, went on at 91. Only 91 said so, often beyond a reader's replay page: the
    reader waited for 4..5 until 3 expired. The message after the hole now says so itself."""
    await store(sink, Owner(), (1, 0), (2, 1), (3, 2), (6, 5), (7, 6), (8, 7))
    clock = ShiftableClock()
    # Slow enough that no later seq is due while the test runs: at 20 a second, a loaded
    # machine that kept the sender from the socket for half a second made a second, real hole.
    async with FakeUpstream(rate=0.1, replay_capacity=10, clock=clock.monotonic) as upstream:
        upstream.ensure_stream("s")
        clock.advance(1000)  # head 100: it keeps 91..100
        flusher = asyncio.create_task(sink.run())
        worker, _, _ = start_streaming(sink, upstream.url_for("s"), 3)
        await wait_for_stored(table_names[1], 95)
        worker.end(EndReason.SHUTDOWN)
        await asyncio.wait_for(worker.task, 30)
        flusher.cancel()

    first_past = min(seq for seq in stored_seqs(table_names[1]) if seq > 8)  # 91, or later
    assert prev_seqs(table_names[1]) == {6: 3, first_past: 3}
    assert await sink.contiguous_end(PK, 0) == stored_seqs(table_names[1])[-1]


def start_streaming(sink: MessageSink, url: str, last_seq: int = 0):
    """A worker that owns the stream, checkpointed at ``last_seq`` (0: it replays from seq 1)."""
    events: list = []
    leases = Leases(sink._session)  # type: ignore[arg-type]
    lease = Lease(
        pk=PK, ws_url=url, last_seq=last_seq, lease_version=1, owner="w1", session_version=1
    )
    worker = Connection(
        lease, connection_context(sink, leases, events), acquired_at=0, on_finished=lambda c: None
    )
    return worker, events, leases


async def wait_for_stored(table: str, position: int) -> None:
    deadline = time.monotonic() + 60
    while not stored_seqs(table) or stored_seqs(table)[-1] < position:
        assert time.monotonic() < deadline, f"{position} not stored within 60 s"
        await asyncio.sleep(0.05)


def stored_data(table: str, position: int) -> str:
    item = boto3.client("dynamodb").get_item(
        TableName=table, Key={model.PK: {"S": PK}, model.SEQ: {"N": str(position)}}
    )["Item"]
    return item[model.MESSAGE_DATA]["S"]
