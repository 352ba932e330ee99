"""The lease store under the faults real networks produce, each one scripted against a real
server (moto and dynalite) through the fault layer of the simulation suite.

One test per interleaving a hostile review found: each reproduces it exactly (a lost answer,
a late delivery, a START landing between two writes of one operation) and fails on code that
does not guard against it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.desired_state import DesiredStateWriter, Outcome
from streamfleet.lease import LeaseStore, LeaseTiming, orphans
from streamfleet_dev.sim.faults import Decision, Fault, FaultyClient, Network, Rule, Script, on
from tests.support import ShiftableClock

TIMING = LeaseTiming(
    lease_seconds=10.0, heartbeat_seconds=2.0, max_clock_skew_seconds=1.0, safety_margin_seconds=0.5
)
URL = "ws://127.0.0.1:9/stream"
PAST_EXPIRY = TIMING.lease_seconds + TIMING.max_clock_skew_seconds + 0.1


@pytest.fixture
def network():
    network = Network()
    yield network
    network.quiesce()


@pytest.fixture
async def plain(table_names):
    client = AsyncClient("dynamodb", settings=ClientSettings(threads=8))
    yield client
    client.close()


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
async def faulty(table_names, script, network):
    client = FaultyClient(
        AsyncClient("dynamodb", settings=ClientSettings(threads=8, read_timeout_seconds=2.0)),
        name="w1",
        plan=script,
        network=network,
    )
    yield client
    client.close()


def store_on(client, table: str, worker: str, clock=None) -> LeaseStore:
    return LeaseStore.create(
        table_name=table,
        worker_id=worker,
        timing=TIMING,
        dynamodb=client,
        clock=clock or ShiftableClock(),
    )


async def start(writer: DesiredStateWriter, connection_id: str) -> str:
    assert (await writer.start(connection_id, URL)).outcome is Outcome.CREATED
    return model.connection_pk(connection_id)


def renewal(params: dict) -> bool:
    return "#expires_at_ms = :expires" in params.get("UpdateExpression", "")


def claim(params: dict) -> bool:
    return "ADD #lease_version" in params.get("UpdateExpression", "")


def release(params: dict) -> bool:
    return params.get("UpdateExpression", "").startswith("REMOVE #lease_owner, #lease_session")


async def test_a_session_whose_first_put_lost_its_answer_trusts_itself_no_longer_than_the_table(
    table_names, faulty, script
):
    """The retry fails on the condition (the first put was applied), and the deadline
    used to count from that retry while the table held the first attempt's expiry."""
    script.add(Rule(on("put_item"), Decision(Fault.LOSE_ANSWER, 0.5)))
    store = store_on(faulty, table_names[0], "w1", clock=SimpleClock())
    before = time.monotonic()

    await store.session.open()

    # From the first send (a moment after `before`), not from the retry 0.5 s later.
    assert store.session.deadline <= before + TIMING.holder_window_seconds + 0.2
    assert faulty.requests["put_item"] == 2  # the lost answer, then the retry


async def test_a_renewal_delivered_late_never_lowers_the_expiry(
    table_names, faulty, script, network, plain
):
    """An attempt that timed out and is applied after the next renewal took
    ``expires_at`` back, so a taker could fence while the holder still trusted its window."""
    store = store_on(faulty, table_names[0], "w1", clock=SimpleClock())
    await store.session.open()
    script.add(Rule(on("update_item", where=renewal), Decision(Fault.LATE, 1.0)))
    await store.session.renew()  # its first attempt is held back; a retry is applied
    await asyncio.sleep(0.05)
    await store.session.renew()  # a later renewal: a later expiry
    renewed = await read_expiry(plain, table_names[0], store.session.pk)

    await asyncio.to_thread(network.quiesce)  # the held-back attempt arrives now

    assert network.delivered_late == 1
    assert await read_expiry(plain, table_names[0], store.session.pk) >= renewed


async def test_a_claim_whose_answer_was_lost_is_recognised_as_ours(
    table_names, faulty, script, plain
):
    """Only acquire() checked "ours already"; a claim of an orphan whose answer was
    lost left a row owned by this live session and run by nobody."""
    clock = SimpleClock()
    dead, finder = (
        store_on(plain, table_names[0], "dead", clock),
        store_on(faulty, table_names[0], "finder", clock),
    )
    writer = DesiredStateWriter(dynamodb=plain, table_name=table_names[0])
    pk = await start(writer, "c1")
    await dead.session.open()
    await dead.connections.acquire(pk)
    clock.advance(PAST_EXPIRY)
    await finder.session.open()
    [candidate] = await finder.orphans.find(10)
    assert candidate.owner == "dead"
    script.add(Rule(on("update_item", where=claim), Decision(Fault.LOSE_ANSWER, 0.05)))

    lease = await finder.connections.claim(candidate)

    assert lease is not None and lease.owner == "finder"
    assert lease.session_version == finder.session.version


async def test_a_start_between_the_two_writes_of_a_release_leaves_the_row_claimable(
    table_names, faulty, script, plain
):
    """The release found the row STOPPED, a START landed, and the second write
    (unconditioned on the desired state) left it STARTED, unowned and in no index."""
    writer = DesiredStateWriter(dynamodb=plain, table_name=table_names[0])
    pk = await start(writer, "c1")
    store = store_on(faulty, table_names[0], "w1")
    await store.session.open()
    lease = await store.connections.acquire(pk)
    await writer.stop("c1")

    async def start_again() -> None:
        assert (await writer.start("c1", URL)).outcome is Outcome.RESTARTED

    script.add(Rule(on("update_item", where=release), Decision(before=start_again), nth=2))

    offered = await store.connections.release(lease)

    row = await store.connections.read(pk)
    assert row[model.DESIRED_STATE] == "STARTED" and model.LEASE_OWNER not in row
    assert row.get(model.AWAITING_OWNER) == model.awaiting_owner_value(row[model.PK])
    assert offered is True
    assert [c.pk for c in await store.orphans.find(10)] == [pk]


async def test_a_start_that_revives_a_dead_owners_stopped_row_keeps_it_discoverable(
    table_names, faulty, script, plain
):
    """Reconcile read the row as STOPPED, a START revived it, the disown failed and
    was ignored, and the session was forgotten: STARTED and unreachable for ever."""
    clock = SimpleClock()
    writer = DesiredStateWriter(dynamodb=plain, table_name=table_names[0])
    pk = await start(writer, "c1")
    dead = store_on(plain, table_names[0], "dead", clock)
    finder = store_on(faulty, table_names[0], "finder", clock)
    await dead.session.open()
    await dead.connections.acquire(pk)
    await writer.stop("c1")  # flagged for "dead", which never closes it
    clock.advance(2 * PAST_EXPIRY + orphans.INDEX_LAG_ALLOWANCE_MS / 1000)  # long gone
    await finder.session.open()

    async def start_again() -> None:
        await writer.start("c1", URL)

    disown = on(
        "update_item", where=lambda p: ":stopped" in str(p.get("ExpressionAttributeValues"))
    )
    script.add(Rule(disown, Decision(before=start_again)))

    found = await finder.orphans.find(10) + await finder.orphans.find(10)

    assert pk in {c.pk for c in found}
    assert "dead" in {s.owner for s in await finder.directory.list()}  # never forgotten


async def test_an_index_answer_never_deletes_a_session_and_its_rows_stay_takeable_by_key(
    table_names, faulty, plain
):
    """ "The index shows nothing" is no proof: a session whose by-owner answer was empty is only
    marked cleared (and expires by TTL a day later), and a row it acquired behind that answer
    (the index had not caught up) is still taken by whoever asks for it by key."""
    writer = DesiredStateWriter(dynamodb=plain, table_name=table_names[0])
    pk = await start(writer, "c1")
    dead = store_on(plain, table_names[0], "dead", SimpleClock())
    # The finder's clocks run far ahead: it sees "dead" expired long enough to be cleared.
    finder = store_on(faulty, table_names[0], "finder", SimpleClock(offset=2 * PAST_EXPIRY + 61))
    await dead.session.open()
    await finder.session.open()
    await finder.orphans.find(10)  # "dead" is fenced, asked (nothing) and cleared
    await dead.connections.acquire(pk)  # its last acquisition, which the answer did not show

    [session] = [s for s in await finder.directory.list() if s.owner == "dead"]
    assert session.cleared and session.state is model.SessionState.ENDED
    lease = await finder.connections.acquire(pk)
    assert lease is not None and lease.owner == "finder"


async def read_expiry(client, table: str, pk: str) -> int:
    item = (
        await client.call("get_item", TableName=table, Key={"pk": {"S": pk}}, ConsistentRead=True)
    )["Item"]
    return int(item[model.EXPIRES_AT_MS]["N"])


class SimpleClock(ShiftableClock):
    """The shiftable clock of the conformance suite (a shared one makes a pause exact)."""
