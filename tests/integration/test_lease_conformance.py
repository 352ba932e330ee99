"""The lease store's contract, against moto's server, dynalite and (optionally) real DynamoDB.

Each test gets fresh tables on each backend. Time passes through :class:`StoppedClock`, which
moves only when a test advances it, so a "pause" or an "expiry" is exact, needs no sleeping, and
does not drift by however long a loaded machine takes over the requests (a margin of half a
second was eaten that way, behind the index-lagging proxy).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.desired_state import DesiredStateWriter, Outcome
from streamfleet.lease import (
    Lease,
    LeaseLost,
    LeaseStore,
    LeaseTiming,
    SessionLost,
    orphans,
)
from streamfleet.lease.connections import Claimable
from streamfleet_dev.emulator.aws_proxy import DEFAULT_INDEX_LAG_SECONDS
from tests.support import (
    LEASE_BACKENDS,
    CountingClient,
    ShiftableClock,
    StoppedClock,
    use_backend,
)

TIMING = LeaseTiming(
    lease_seconds=10.0, heartbeat_seconds=2.0, max_clock_skew_seconds=1.0, safety_margin_seconds=0.5
)
URL = "ws://127.0.0.1:9/stream"

StoreFactory = Callable[..., LeaseStore]


@pytest.fixture(params=LEASE_BACKENDS)
def backend(request: pytest.FixtureRequest, servers, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each DynamoDB implementation, and one whose index answers lag as DynamoDB's may."""
    return use_backend(request.param, servers, monkeypatch)


async def pks_of(found: Awaitable[list[Claimable]]) -> list[str]:
    return [candidate.pk for candidate in await found]


async def settled(read: Callable[[], Awaitable[object]], expected: object) -> None:
    """Until ``read()`` gives ``expected``: what an index shows after a write may lag by up to
    the proxy's lag (a query right after a write may see it or not, as on DynamoDB)."""
    deadline = time.monotonic() + 10 * DEFAULT_INDEX_LAG_SECONDS
    while (seen := await read()) != expected:
        assert time.monotonic() < deadline, f"still {seen!r}, expected {expected!r}"
        await asyncio.sleep(0.05)


@pytest.fixture
async def dynamodb(table_names) -> AsyncIterator[CountingClient]:
    client = CountingClient("dynamodb", settings=ClientSettings(threads=24))
    yield client
    client.close()


@pytest.fixture
def lease_table(table_names) -> str:
    return table_names[0]


@pytest.fixture
def make_store(dynamodb: AsyncClient, lease_table: str) -> StoreFactory:
    def make(worker_id: str, clock: ShiftableClock | None = None) -> LeaseStore:
        return LeaseStore.create(
            table_name=lease_table,
            worker_id=worker_id,
            timing=TIMING,
            dynamodb=dynamodb,
            clock=clock or StoppedClock(),
        )

    return make


@pytest.fixture
def writer(dynamodb: AsyncClient, lease_table: str) -> DesiredStateWriter:
    return DesiredStateWriter(dynamodb=dynamodb, table_name=lease_table)


@dataclasses.dataclass
class WallOf:
    """Another clock's wall time with this process's own monotonic time."""

    clock: ShiftableClock

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return self.clock.wall_ms()


def as_current(lease: Lease, store: LeaseStore) -> Lease:
    """The lease as if held under the store's current session: gets past the holder's own
    check, so only the fence in DynamoDB stands in the way."""
    return dataclasses.replace(lease, session_version=store.session.version)


async def started(writer: DesiredStateWriter, *ids: str) -> list[str]:
    for connection_id in ids:
        assert (await writer.start(connection_id, URL)).outcome is Outcome.CREATED
    return [model.connection_pk(connection_id) for connection_id in ids]


# moto's server evaluates a condition and writes without a lock (threaded server), so two
# concurrent conditional writes can both pass there: measured 1 double win in 15 rounds. The
# race is a property of the server, not of the lease store, so this test runs where conditional
# writes are atomic, as they are in DynamoDB.
@pytest.mark.parametrize("backend", [b for b in LEASE_BACKENDS if b != "moto"], indirect=True)
async def test_exactly_one_of_20_concurrent_acquirers_wins(make_store, writer):
    [pk] = await started(writer, "contested")
    stores = [make_store(f"worker-{n}") for n in range(20)]
    await asyncio.gather(*(store.session.open() for store in stores))

    results = await asyncio.gather(*(store.connections.acquire(pk) for store in stores))

    winners = [lease for lease in results if lease is not None]
    assert len(winners) == 1
    item = await stores[0].connections.read(pk)
    assert item[model.LEASE_OWNER] == winners[0].owner
    assert item[model.LEASE_VERSION] == winners[0].lease_version == 1
    assert model.AWAITING_OWNER not in item


async def test_acquire_fails_from_live_session_and_succeeds_from_expired_one(make_store, writer):
    [pk] = await started(writer, "c1")
    clock = StoppedClock()
    holder, taker = make_store("holder", clock), make_store("taker", clock)
    await holder.session.open()
    await taker.session.open()
    first = await holder.connections.acquire(pk)
    assert first is not None

    assert await taker.connections.acquire(pk) is None  # holder's session is live

    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    await taker.session.renew()  # the taker kept renewing through the holder's pause
    second = await taker.connections.acquire(pk)

    assert second is not None and second.owner == "taker"
    assert second.lease_version == first.lease_version + 1
    sessions = {s.owner: s for s in await taker.directory.list()}
    assert sessions["holder"].state is model.SessionState.ENDED  # fenced before the take


async def test_a_session_expired_by_less_than_the_skew_is_not_taken(make_store, writer):
    [pk] = await started(writer, "c1")
    clock = StoppedClock()
    holder, taker = make_store("holder", clock), make_store("taker", clock)
    await holder.session.open()
    assert await holder.connections.acquire(pk) is not None

    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds / 2)
    await taker.session.open()

    assert await taker.connections.acquire(pk) is None
    assert (await taker.connections.read(pk))[model.LEASE_OWNER] == "holder"


async def test_paused_holder_can_neither_renew_checkpoint_nor_release(make_store, writer):
    [pk] = await started(writer, "c1")
    clock = StoppedClock()
    holder, taker = make_store("holder", clock), make_store("taker", clock)
    await holder.session.open()
    lease = await holder.connections.acquire(pk)
    await holder.connections.checkpoint(lease, 5)
    old_version = holder.session.version

    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)  # the pause
    await taker.session.open()
    taken = await taker.connections.acquire(pk)
    assert taken is not None and taken.last_seq == 5

    # Waking up: its own deadline has passed, so it may not checkpoint...
    with pytest.raises(SessionLost):
        await holder.connections.checkpoint(lease, 6)
    # ...a renewal opens a new session instead of reviving the old one...
    assert await holder.session.renew() is False
    assert holder.session.version != old_version
    # ...the new session does not vouch for a lease of the old one...
    with pytest.raises(SessionLost):
        await holder.connections.checkpoint(lease, 6)
    # ...and even a write that claims the new session is stopped by the fence in DynamoDB.
    with pytest.raises(LeaseLost) as lost:
        await holder.connections.checkpoint(as_current(lease, holder), 6)
    assert lost.value.holder == "taker"
    with pytest.raises(LeaseLost):
        await holder.connections.release(lease)
    item = await taker.connections.read(pk)
    assert (item[model.LEASE_OWNER], item[model.LAST_SEQ]) == ("taker", 5)


async def test_fencing_holds_even_when_a_clock_runs_ahead_beyond_the_skew(make_store, writer):
    """The skew bound broken: the taker's clock is far ahead and it takes a live session.
    The holder's renewal then fails on the fence instead of silently succeeding."""
    [pk] = await started(writer, "c1")
    holder = make_store("holder", StoppedClock())
    taker = make_store("taker", StoppedClock(offset=TIMING.lease_seconds * 2))
    await holder.session.open()
    lease = await holder.connections.acquire(pk)
    await taker.session.open()

    assert await taker.connections.acquire(pk) is not None

    with pytest.raises(SessionLost):
        await holder.session.renew()
    await holder.session.open()
    with pytest.raises(LeaseLost):
        await holder.connections.checkpoint(as_current(lease, holder), 1)


async def test_release_makes_the_connection_claimable_at_once(make_store, writer):
    [pk] = await started(writer, "c1")
    first, second = make_store("first"), make_store("second")
    await first.session.open()
    await second.session.open()
    lease = await first.connections.acquire(pk)

    assert await first.connections.release(lease) is True
    assert [c.pk for c in await second.orphans.find(10)] == [pk]
    taken = await second.connections.acquire(pk)
    assert taken is not None and taken.lease_version == lease.lease_version + 1


async def test_a_stream_released_after_a_failure_is_held_off_for_the_whole_fleet(
    make_store, writer, dynamodb: CountingClient
):
    """A stream that fails at once (a URL no worker can dial) went round the fleet as fast as
    claims could be written. The hold-off is in the row: no worker claims it before it ends,
    a worker that found it held asks nothing more until then, and progress clears it."""
    clock = StoppedClock()
    [pk] = await started(writer, "broken")
    first, second = make_store("first", clock), make_store("second", clock)
    await first.session.open()
    await second.session.open()
    lease = await first.connections.acquire(pk)

    released_at = clock.wall_ms()
    assert await first.connections.release(lease, failure="ValueError: bad label") is True
    item = await first.connections.read(pk)
    assert (item[model.DIAL_FAILURES], item[model.LAST_FAILURE]) == (1, "ValueError: bad label")
    assert released_at + 500 <= item[model.HELD_UNTIL_MS] <= clock.wall_ms() + 1000

    [candidate] = await second.orphans.find(10)  # the index still names it
    assert await second.connections.claim(candidate) is None
    assert await first.connections.acquire(pk) is None
    dynamodb.reset()
    assert await second.connections.claim(candidate) is None
    assert dynamodb.total() == 0  # known held: not even a failed write until the hold ends

    clock.advance(model.HOLD_OFF_BASE_MS / 1000 + 0.1)
    again = await second.connections.claim(candidate)
    assert again is not None and again.dial_failures == 1
    released_at = clock.wall_ms()
    assert await second.connections.release(again, failure="ValueError: bad label") is True
    item = await second.connections.read(pk)
    assert item[model.DIAL_FAILURES] == 2  # consecutive failures: a longer hold
    assert item[model.HELD_UNTIL_MS] >= released_at + model.HOLD_OFF_BASE_MS

    clock.advance(2 * model.HOLD_OFF_BASE_MS / 1000 + 0.1)
    third = await first.connections.acquire(pk)
    assert third is not None
    await first.connections.checkpoint(third, 5)  # progress
    item = await first.connections.read(pk)
    assert not {model.DIAL_FAILURES, model.HELD_UNTIL_MS, model.LAST_FAILURE} & set(item)


async def test_discovery_reads_every_awaiting_owner_shard(
    make_store, writer, dynamodb, lease_table
):
    """Unowned rows are spread over the index's shards, and a finder asking for all of them
    gets every one, whichever shard it holds."""
    ids = [f"spread-{n}" for n in range(4 * model.AWAITING_OWNER_SHARDS)]
    pks = await started(writer, *ids)
    shards = set()
    for pk in pks:
        item = (await dynamodb.call("get_item", TableName=lease_table, Key={model.PK: {"S": pk}}))[
            "Item"
        ]
        shards.add(item[model.AWAITING_OWNER]["S"])
    assert shards == set(model.AWAITING_OWNER_VALUES)
    finder = make_store("finder")
    await finder.session.open()

    async def found() -> list[str]:
        return sorted(await pks_of(finder.orphans.find(len(pks))))

    await settled(found, sorted(pks))
    assert len(await finder.orphans.find(3)) == 3  # a finder asking for fewer gets that many


async def test_a_row_offered_under_the_unsharded_value_is_still_found(
    make_store, writer, dynamodb, lease_table
):
    """A table written before the index had shards holds `STARTED` itself as the key: those
    rows are still found and claimed."""
    [pk] = await started(writer, "unsharded")
    await dynamodb.call(
        "update_item",
        TableName=lease_table,
        Key={model.PK: {"S": pk}},
        UpdateExpression="SET #awaiting = :started",
        ExpressionAttributeNames={"#awaiting": model.AWAITING_OWNER},
        ExpressionAttributeValues={":started": {"S": model.DesiredState.STARTED.value}},
    )
    finder = make_store("finder")
    await finder.session.open()
    await settled(lambda: pks_of(finder.orphans.find(10)), [pk])
    [candidate] = await finder.orphans.find(10)
    assert await finder.connections.claim(candidate) is not None


async def test_held_rows_do_not_crowd_the_others_out_of_discovery(
    make_store, writer, dynamodb, lease_table
):
    """Held rows stay in the awaiting-owner index, first in key order: a worker asking for one
    candidate got the same held row on every reconcile and never found the stream behind it."""
    clock = StoppedClock()
    held_pks = await started(writer, *(f"a-held-{n}" for n in range(3)))
    [free] = await started(writer, "z-free")
    holder, finder = make_store("holder", clock), make_store("finder", clock)
    await holder.session.open()
    await finder.session.open()
    for pk in held_pks:
        lease = await holder.connections.acquire(pk)
        await holder.connections.release(lease, failure="ValueError: bad label")
        # Held for a minute, as after several failures: still held however long a lagging
        # index keeps offering it (a first failure's hold is a second or less).
        await dynamodb.call(
            "update_item",
            TableName=lease_table,
            Key={model.PK: {"S": pk}},
            UpdateExpression="SET #held = :later",
            ExpressionAttributeNames={"#held": model.HELD_UNTIL_MS},
            ExpressionAttributeValues={":later": {"N": str(clock.wall_ms() + 60_000)}},
        )

    # Each held row is met, refused, and passed over, until the free one is found (a lagging
    # index may offer a held row more than once; the claim refuses it every time).
    deadline = time.monotonic() + 10 * DEFAULT_INDEX_LAG_SECONDS
    while True:
        [candidate] = await finder.orphans.find(1)
        if candidate.pk == free:
            break
        assert candidate.pk in held_pks
        assert await finder.connections.claim(candidate) is None
        assert time.monotonic() < deadline, "the free stream was never offered"
    await settled(lambda: pks_of(finder.orphans.find(1)), [free])


async def test_a_hold_from_a_clock_far_ahead_holds_nothing(make_store, writer):
    """A releaser whose clock ran hours ahead would hold the stream for the whole fleet for
    hours: a hold that ends later than the longest hold plus the skew allowance is ignored."""
    [pk] = await started(writer, "broken")
    ahead = StoppedClock(offset=3600.0)
    releaser, taker = make_store("releaser", WallOf(ahead)), make_store("taker")
    await releaser.session.open()
    await taker.session.open()
    lease = await releaser.connections.acquire(pk)
    await releaser.connections.release(lease, failure="ValueError: bad label")

    assert await taker.connections.acquire(pk) is not None


async def test_a_restart_clears_a_hold_off(make_store, writer):
    """STOP then START is somebody deciding to try again (a fixed upstream): claimable at once."""
    [pk] = await started(writer, "broken")
    store = make_store("w1")
    await store.session.open()
    lease = await store.connections.acquire(pk)
    await store.connections.release(lease, failure="OSError: refused")
    await writer.stop("broken")
    assert (await writer.start("broken", URL)).outcome is Outcome.RESTARTED

    item = await store.connections.read(pk)
    assert not {model.DIAL_FAILURES, model.HELD_UNTIL_MS, model.LAST_FAILURE} & set(item)
    assert await store.connections.acquire(pk) is not None


async def test_a_sealed_release_of_a_stopped_connection_closes_it(make_store, writer):
    [pk] = await started(writer, "c1")
    store = make_store("w1")
    await store.session.open()
    lease = await store.connections.acquire(pk)
    await writer.stop("c1")

    assert await store.connections.release(lease, sealed=True) is False
    item = await store.connections.read(pk)
    assert model.LEASE_OWNER not in item and model.AWAITING_OWNER not in item
    assert model.UNSEALED not in item
    assert await store.orphans.find(10) == []


async def test_an_unsealed_release_of_a_stopped_connection_leaves_it_to_be_sealed(
    make_store, writer
):
    """Its holder could not seal the log (a final flush failed): another worker must."""
    [pk] = await started(writer, "c1")
    store, sealer = make_store("w1"), make_store("w2")
    await store.session.open()
    await sealer.session.open()
    lease = await store.connections.acquire(pk)
    await writer.stop("c1")

    assert await store.connections.release(lease) is True
    await settled(lambda: pks_of(sealer.orphans.find(10)), [pk])
    taken = await sealer.connections.acquire(pk)
    assert taken is not None and taken.desired_state == "STOPPED"
    assert await sealer.connections.release(taken, sealed=True) is False
    await settled(lambda: sealer.orphans.find(10), [])


async def test_orphan_discovery_finds_unowned_and_expired_and_nothing_else(
    make_store, writer, dynamodb: CountingClient
):
    clock = StoppedClock()
    never, live, dead, _stopped = await started(writer, "never", "live", "dead", "stopped")
    busy = await started(writer, *(f"busy-{n}" for n in range(30)))
    alive, doomed, finder = (make_store(name, clock) for name in ("alive", "doomed", "finder"))
    await doomed.session.open()
    assert await doomed.connections.acquire(dead) is not None
    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    await alive.session.open()
    await finder.session.open()
    for pk in (live, *busy):
        assert await alive.connections.acquire(pk) is not None
    await writer.stop("stopped")

    dynamodb.reset()
    found = await finder.orphans.find(limit=100)

    assert sorted(c.pk for c in found) == sorted([never, dead])
    [from_dead] = [c for c in found if c.pk == dead]
    assert (from_dead.owner, from_dead.session_version) == ("doomed", doomed.session.version)
    # O(workers + orphans): sessions query + batched read + fence + one owner query + one
    # query of each awaiting-owner value, whatever the 31 live connections.
    assert dynamodb.total() <= 5 + len(model.AWAITING_OWNER_READ_VALUES), dynamodb.calls
    assert dynamodb.calls.get("scan", 0) == 0
    assert await finder.connections.claim(from_dead) is not None


async def test_a_candidate_from_a_stale_index_is_judged_on_its_row(make_store, writer):
    """Discovery named the stream under an owner the row no longer has (an index behind the
    row, or one a store left out of step with it): the claim failed, and no later discovery
    found the stream under its real, dead owner. It is now judged on the row."""
    clock = StoppedClock()
    [pk] = await started(writer, "moved")
    first, second, finder = (make_store(name, clock) for name in ("first", "second", "finder"))
    await first.session.open()
    assert await first.connections.acquire(pk) is not None
    stale = Claimable(pk, "first", first.session.version)  # what the index still says
    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    await second.session.open()
    assert await second.connections.acquire(pk) is not None  # the row moved on
    await finder.session.open()

    assert await finder.connections.claim(stale) is None  # its real owner is alive

    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    later = make_store("later", clock)
    await later.session.open()
    lease = await later.connections.claim(stale)  # its real owner is gone now
    assert lease is not None and lease.owner == "later"


async def test_ended_sessions_without_connections_are_cleared_never_deleted(make_store, dynamodb):
    """An index query is no proof of absence: the session is only marked cleared (reconcile
    stops asking), and the table's TTL removes it a day later."""
    clock = StoppedClock()
    gone = make_store("gone", clock)
    # The finder's wall clock moves with the others, its monotonic one does not: its own
    # session stays live through the jumps, so the only ended session is "gone".
    finder = make_store("finder", WallOf(clock))
    await gone.session.open()
    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    await finder.session.open()

    assert await finder.orphans.find(10) == []  # fenced, asked, not cleared yet: too recent
    [still] = [s for s in await finder.directory.list() if s.owner == "gone"]
    assert still.state is model.SessionState.ENDED and not still.cleared

    clock.advance(orphans.INDEX_LAG_ALLOWANCE_MS / 1000 + TIMING.lease_seconds)
    await finder.session.renew()
    assert await finder.orphans.find(10) == []
    [cleared] = [s for s in await finder.directory.list() if s.owner == "gone"]
    assert cleared.cleared
    item = (
        await dynamodb.call(
            "get_item", TableName=finder.session._table, Key={"pk": {"S": cleared.pk}}
        )
    )["Item"]
    assert int(item[model.DELETE_AFTER]["N"]) > clock.wall_ms() // 1000 + 3600

    dynamodb.reset()
    await finder.orphans.find(10)
    # The sessions and each awaiting-owner shard: no by-owner query.
    assert dynamodb.calls.get("query", 0) == 1 + len(model.AWAITING_OWNER_READ_VALUES), (
        dynamodb.calls
    )


async def test_stopped_connections_are_one_query_per_worker(make_store, writer, dynamodb):
    pks = await started(writer, "a", "b", "c")
    store, other = make_store("w1"), make_store("w2")
    await store.session.open()
    await other.session.open()
    for pk in pks[:2]:
        await store.connections.acquire(pk)
    await other.connections.acquire(pks[2])

    await writer.stop("b")
    await writer.stop("c")
    dynamodb.reset()

    assert await store.connections.stop_requested() == [model.connection_pk("b")]
    assert dynamodb.calls == {"query": 1}
    assert await other.connections.stop_requested() == [model.connection_pk("c")]


async def test_a_new_start_cancels_a_pending_stop(make_store, writer):
    [pk] = await started(writer, "a")
    store = make_store("w1")
    await store.session.open()
    await store.connections.acquire(pk)
    await writer.stop("a")

    result = await writer.start("a", URL)

    assert result.outcome is Outcome.RESTARTED and not result.notify
    assert await store.connections.stop_requested() == []
    assert (await store.connections.read(pk))[model.LEASE_OWNER] == "w1"


async def test_start_is_idempotent_and_never_disturbs_a_running_lease(make_store, writer):
    [pk] = await started(writer, "a")
    store = make_store("w1")
    await store.session.open()
    lease = await store.connections.acquire(pk)
    await store.connections.checkpoint(lease, 42)

    again = await writer.start("a", URL)

    assert again.outcome is Outcome.UNCHANGED and not again.notify
    item = await store.connections.read(pk)
    assert (item[model.LEASE_OWNER], item[model.LEASE_VERSION], item[model.LAST_SEQ]) == (
        "w1",
        lease.lease_version,
        42,
    )
    assert (await writer.start("a", "ws://elsewhere/x")).outcome is Outcome.CONFLICT


async def test_stop_then_start_restarts_and_offers_the_connection(make_store, writer):
    await started(writer, "a")
    assert (await writer.stop("a")).outcome is Outcome.STOPPED
    assert (await writer.stop("a")).outcome is Outcome.UNCHANGED
    assert (await writer.stop("missing")).outcome is Outcome.NOT_FOUND
    store = make_store("w1")
    await store.session.open()
    await settled(lambda: store.orphans.find(10), [])

    restarted = await writer.start("a", URL)

    assert restarted.outcome is Outcome.RESTARTED and restarted.notify
    await settled(lambda: pks_of(store.orphans.find(10)), [model.connection_pk("a")])


async def test_batched_reads_cover_more_than_100_keys(make_store, writer):
    pks = await started(writer, *(f"bulk-{n:03d}" for n in range(130)))
    store = make_store("reader")
    await store.session.open()

    items = await store.connections.read_many([*pks, model.connection_pk("absent")])

    assert sorted(items) == sorted(pks)


async def test_no_index_key_is_ever_an_empty_string(make_store, writer, dynamodb, lease_table):
    pks = await started(writer, "a", "b")
    store = make_store("w1")
    await store.session.open()
    lease = await store.connections.acquire(pks[0])
    await store.connections.release(lease)
    await store.connections.acquire(pks[1])
    await writer.stop("b")
    await store.session.close()

    index_keys = {
        key for index in model.LEASE_TABLE.indexes for key in (index.partition_key, index.sort_key)
    }
    items = (await dynamodb.call("scan", TableName=lease_table))["Items"]
    for item in items:
        for key in index_keys & item.keys():
            assert item[key] != {"S": ""}, (key, item)


async def test_a_stopped_row_of_a_dead_owner_is_handed_over_to_be_sealed(make_store, writer):
    [pk] = await started(writer, "c1")
    clock = StoppedClock()
    dead, finder = make_store("dead", clock), make_store("finder", clock)
    await dead.session.open()
    await dead.connections.acquire(pk)
    await writer.stop("c1")  # flagged for "dead", which never gets to close it
    clock.advance(TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1)
    await finder.session.open()

    # STOPPED, but its owner died without sealing the log: offered, to be sealed and closed.
    [candidate] = await finder.orphans.find(10)
    assert candidate.pk == pk and candidate.owner is None
    item = await finder.connections.read(pk)
    assert item[model.DESIRED_STATE] == "STOPPED"
    assert model.LEASE_OWNER not in item and model.STOP_REQUESTED_FOR not in item
    sealing = await finder.connections.acquire(pk)
    assert sealing is not None and sealing.desired_state == "STOPPED"
    await finder.connections.release(sealing, sealed=True)
    await settled(lambda: finder.orphans.find(10), [])


async def test_a_worker_lists_exactly_the_rows_its_current_session_owns(make_store, writer):
    mine, theirs, other = await started(writer, "mine", "theirs", "other")
    clock = StoppedClock()
    store, peer = make_store("w1", clock), make_store("w2", clock)
    await store.session.open()
    await peer.session.open()
    lease = await store.connections.acquire(mine)
    await peer.connections.acquire(theirs)

    assert [(held.pk, held.lease_version) for held in await store.connections.mine()] == [
        (mine, lease.lease_version)
    ]
    # A row of this worker's previous session is not "mine" any more: it is an orphan.
    assert other not in {held.pk for held in await peer.connections.mine()}
    clock.advance(TIMING.lease_seconds)
    await store.session.renew()
    assert await store.connections.mine() == []
