"""The taker's claims whose answer never came: resolved at the next reconcile from one
consistent read, never run twice, never over what the worker gave back or shed, within its
capacity. Scripted stand-ins for the store (the lease simulation runs the real one:
``tests/integration/test_lease_core_simulation.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from streamfleet import model
from streamfleet.lease import Claimable, StoreUnavailable
from streamfleet.lease.connections import Lease
from streamfleet.lease.timing import LeaseTiming
from streamfleet.worker.holdings import Holdings
from streamfleet.worker.taker import LeaseTaker

PK = model.connection_pk("s0")
ME, SESSION = "w1", 7
TIMING = LeaseTiming()


def row(owner: str | None = ME, session: int = SESSION) -> dict[str, Any]:
    item = {model.PK: PK, model.LEASE_VERSION: 3, model.WS_URL: "wss://upstream.example.com"}
    if owner is not None:
        item |= {model.LEASE_OWNER: owner, model.LEASE_SESSION: session}
    return item


@dataclass
class Clock:
    now: float = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return int(self.now * 1000)


@dataclass
class Leases:
    """The connection leases as the taker calls them: each claim's outcome scripted."""

    row: dict[str, Any] | None = field(default_factory=row)
    claims: list[Any] = field(default_factory=list)  # outcomes in order: a Lease, None, or raise
    reads_fail: bool = False
    reads: int = 0
    released: list[str] = field(default_factory=list)

    async def acquire(self, pk: str, *, asked: bool = False) -> Lease | None:
        outcome = self.claims.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def read_many(self, pks: list[str]) -> dict[str, dict[str, Any]]:
        self.reads += 1
        if self.reads_fail:
            raise StoreUnavailable("read connections: DynamoDB unavailable until the deadline")
        return {PK: dict(self.row)} if self.row is not None and PK in pks else {}

    async def release(self, lease: Lease, failure: str | None = None) -> bool:
        self.released.append(lease.pk)
        return True


class Running:
    """Stands for the worker's Connection: counts what was started."""

    started: list[str] = []

    def __init__(self, lease: Lease, context: Any, *, acquired_at: float, on_finished: Any):
        self.lease, self.pk = lease, lease.pk
        Running.started.append(lease.pk)

    def end(self, reason: Any) -> None:
        pass


def make_taker(leases: Leases, max_connections: int = 10) -> tuple[LeaseTaker, Clock]:
    clock = Clock()
    session = SimpleNamespace(version=SESSION, deadline_passed=lambda: False, clock=clock)
    store = SimpleNamespace(session=session, connections=leases)
    notifier = SimpleNamespace(notify=lambda pk: asyncio.sleep(0))
    taker = LeaseTaker(
        SimpleNamespace(worker_id=ME, timing=TIMING, rebalance_hold_seconds=30.0),  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        SimpleNamespace(notifier=notifier),  # type: ignore[arg-type]
        Holdings(max_connections),
        lambda event, **fields: None,
        connection_factory=Running,  # type: ignore[arg-type]
    )
    Running.started = []
    return taker, clock


async def unanswered_claim(taker: LeaseTaker, leases: Leases) -> None:
    leases.claims.append(StoreUnavailable("acquire: DynamoDB unavailable until the deadline"))
    assert await taker.claim(Claimable(PK), "intake") is None


async def test_an_applied_claim_that_got_no_answer_runs_at_the_next_reconcile() -> None:
    leases = Leases()
    taker, _ = make_taker(leases)
    await unanswered_claim(taker, leases)
    await taker._resolve_unsure_claims()
    assert Running.started == [PK] and leases.released == []
    await taker._resolve_unsure_claims()  # resolved once: nothing read or run again
    assert Running.started == [PK] and leases.reads == 1


async def test_a_later_answered_claim_settles_it_so_a_row_given_back_is_not_run_again() -> None:
    """The claim's message came back and the next claim was answered: the row ran, its stream
    failed and its release went unanswered. The row is still this session's, but what decides
    it now is the release to retry (with its failure), not the first claim."""
    leases = Leases()
    taker, _ = make_taker(leases)
    await unanswered_claim(taker, leases)
    lease = Lease.from_item(row())
    leases.claims.append(lease)
    assert await taker.claim(Claimable(PK), "intake") is True
    connection = taker.holdings.connections.pop(PK)
    connection.abandoned, connection.failure = True, "dial failed: 502"
    taker._forget(connection)
    await taker._resolve_unsure_claims()
    assert Running.started == [PK] and leases.reads == 0


async def test_with_one_slot_free_the_row_is_run_not_given_back() -> None:
    leases = Leases()
    taker, _ = make_taker(leases, max_connections=1)
    await unanswered_claim(taker, leases)
    await taker._resolve_unsure_claims()
    assert Running.started == [PK] and leases.released == []


async def test_when_full_meanwhile_the_row_is_given_back() -> None:
    leases = Leases()
    taker, _ = make_taker(leases, max_connections=1)
    await unanswered_claim(taker, leases)
    taker.holdings.connections["CONN#other"] = object()  # type: ignore[assignment]
    await taker._resolve_unsure_claims()
    await taker._release_abandoned()
    assert Running.started == [] and leases.released == [PK]


@pytest.mark.parametrize("reads_fail", [False, True])
async def test_a_claim_not_found_applied_is_asked_again_while_it_may_still_land(
    reads_fail: bool,
) -> None:
    """Not applied yet (or the store still out): one of its requests may still be applied
    until a holder's window after it gave up, so the row is read again until then."""
    leases = Leases(row=row(owner=None), reads_fail=reads_fail)
    taker, _ = make_taker(leases)
    await unanswered_claim(taker, leases)
    await taker._resolve_unsure_claims()
    assert PK in taker._unsure and Running.started == []
    leases.reads_fail = False
    leases.row = row()  # the late request landed
    await taker._resolve_unsure_claims()
    assert Running.started == [PK]
    # Never applied: forgotten once no request of it can land any more.
    leases2 = Leases(row=row(owner=None))
    taker2, clock2 = make_taker(leases2)
    await unanswered_claim(taker2, leases2)
    clock2.now += TIMING.holder_window_seconds
    await taker2._resolve_unsure_claims()
    assert taker2._unsure == {} and Running.started == []


async def test_a_claim_of_a_session_that_ended_is_left_to_discovery() -> None:
    leases = Leases()
    taker, _ = make_taker(leases)
    await unanswered_claim(taker, leases)
    taker.store.session.version = SESSION + 1
    await taker._resolve_unsure_claims()
    assert leases.reads == 0 and Running.started == [] and taker._unsure == {}


async def test_a_row_shed_by_rebalancing_is_not_taken_back() -> None:
    leases = Leases()
    taker, clock = make_taker(leases)
    await unanswered_claim(taker, leases)
    taker.holdings.recently_shed[PK] = clock.now
    await taker._resolve_unsure_claims()
    assert leases.reads == 0 and Running.started == []
