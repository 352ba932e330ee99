"""The lease core on a virtual clock (``streamfleet_dev.dsim``): the deployed lease code and the
worker's lease-plane loops (heartbeat, watchdog, taker) against an in-process DynamoDB through
the fault layer, holders crashed, paused and started by seeded schedules; one owner, fencing
and liveness checked; a seed replays byte for byte.

``make sim`` runs 10,000 fresh seeds; ``SIM_SEED=<n> SIM_SYSTEM=lease make sim`` prints one
trace."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from streamfleet import model
from streamfleet.lease import StoreUnavailable
from streamfleet.lease.connections import ConnectionLeases
from streamfleet.lease.timing import LeaseTiming
from streamfleet.worker.connection import Connection
from streamfleet.worker.taker import LeaseTaker
from streamfleet_dev.dsim.async_client import InProcessClient
from streamfleet_dev.dsim.lease_core import (
    TABLE,
    TIMING,
    FencingWitness,
    HeldConnection,
    Schedule,
    Window,
    one_owner_problems,
    run_schedule,
)
from streamfleet_dev.dsim.runner import run_many

# A fixed list, so the gate is the same on every run; make sim draws fresh ones.
SEEDS = range(1, 201)
# Seeds of that list that catch a taker claiming 3 s early (found by running the list with the
# defect in place; each catches it every time).
CATCHES_CLAIMING_EARLY = (14, 34, 56)


def test_every_fixed_schedule_keeps_one_owner_and_comes_back() -> None:
    outcomes = list(run_many("lease", SEEDS))
    failed = [f"SIM_SEED={o.schedule.seed}: {o.problems}" for o in outcomes if not o.ok]
    assert failed == []
    # The schedules did what they are for: faults injected, crashes and pauses played, rows
    # taken over, some from a holder that was paused at the time.
    assert sum(o.faults for o in outcomes) > 100
    kinds = {event.kind for o in outcomes for event in o.schedule.events}
    assert kinds == {"crash", "pause", "start"}
    assert sum(o.handovers for o in outcomes) > 10
    assert sum(o.from_paused for o in outcomes) > 0


def test_the_taker_runs_the_real_connection_unless_the_simulation_passes_its_stand_in() -> None:
    """The taker's seam: the worker never sets it, so what it claims runs the upstream
    ``Connection``; the simulation's holders pass :class:`HeldConnection`."""
    factory = {f.name: f.default for f in dataclasses.fields(LeaseTaker)}["connection_factory"]
    # Unset, the taker runs the module's Connection, looked up at each claim (the real-time
    # fault simulation puts its observed subclass there).
    assert factory is None
    assert HeldConnection is not Connection


def test_a_seed_replays_the_same_schedule_and_outcome_byte_for_byte() -> None:
    first, again = (run_schedule(Schedule.generate(7)) for _ in range(2))
    assert first.trace == again.trace and first.problems == again.problems
    assert " SENT " in first.trace and " holds " in first.trace
    assert run_schedule(Schedule.generate(8)).trace != first.trace

    def printed(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "SIM_SEED": "7"}
        done = subprocess.run(
            [sys.executable, "-m", "streamfleet_dev.dsim", "--system", "lease"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    # Another process, another string hashing: the same bytes.
    assert printed("1") == printed("2")
    assert first.trace in printed("3")


def test_a_taker_that_claims_3_s_before_a_session_expires_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail: a taker that treats a session as gone 3 s before it expires (the
    skew allowance and the holder's margin together are 1.5 s) takes a row whose paused
    holder may still act on it."""
    monkeypatch.setattr(
        LeaseTiming, "is_expired_for_taker", lambda self, expires, now: expires - 3000 < now
    )
    for seed in CATCHES_CLAIMING_EARLY:
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("could act until" in problem for problem in problems), (seed, problems)


def test_a_claim_answered_after_its_sessions_deadline_is_no_window_at_all() -> None:
    """A holder paused between sending a claim and hearing its answer learns it holds the row
    after its session's deadline: the lease code then sends nothing for it, so it overlaps
    nobody (found by make sim, SIM_SEED=951568231 SIM_SYSTEM=lease, where the newer lease
    was already held). Its window is flagged once it could still act."""
    newer = Window("h2", "CONN#s", lease_version=3, session_version=2, began=32.9)
    late = Window("h0", "CONN#s", lease_version=2, session_version=1, began=38.9, stopped=38.9)
    world = SimpleNamespace(windows=[newer, late], deadlines={("h0", 1): [29.0], ("h2", 2): [79.2]})
    assert one_owner_problems(world) == []  # type: ignore[arg-type]

    world.deadlines[("h0", 1)] = [40.0]  # its deadline not passed yet: it could act
    late.stopped = None
    assert [p.split(":")[0] for p in one_owner_problems(world)] == ["CONN#s"]  # type: ignore[arg-type]


def test_the_store_flags_a_write_applied_to_a_lease_its_sender_does_not_hold() -> None:
    """What the simulation's store checks on every fenced write it applies: the row was the
    lease the write names, and its checkpoint did not go back."""
    world = SimpleNamespace(fencing=[])
    store = FencingWitness(world)  # type: ignore[arg-type]
    try:
        store.create_table(model.LEASE_TABLE, TABLE)
        key = {model.PK: {"S": model.connection_pk("s0")}}
        held = {model.LEASE_OWNER: {"S": "h1"}, model.LEASE_VERSION: {"N": "2"}}
        store.call(
            "put_item", {"TableName": TABLE, "Item": {**key, **held, model.LAST_SEQ: {"N": "9"}}}
        )
        unfenced = {
            "TableName": TABLE,
            "Key": key,
            "UpdateExpression": "SET #seq = :seq",
            "ConditionExpression": ":me = :me AND :lease_version = :lease_version",
            "ExpressionAttributeNames": {"#seq": model.LAST_SEQ},
            "ExpressionAttributeValues": {
                ":seq": {"N": "3"},
                ":me": {"S": "h0"},
                ":lease_version": {"N": "1"},
            },
        }
        store.call("update_item", unfenced)
        assert world.fencing == [
            "CONN#s0: a write of h0 (lease 1) was applied to the row of h1 (lease 2)",
            "CONN#s0: the checkpoint went from 9 back to 3",
        ]
    finally:
        store.close()


def test_a_claim_applied_but_never_answered_is_run_at_the_next_reconcile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim whose every answer was lost until its deadline may have been applied: the row is
    then owned by a live session, so discovery never names it again. The holder reads it at its
    next reconcile and runs it, rather than leaving the stream down until its audit gives the
    row back a minute later."""
    original = ConnectionLeases._try_claim
    unanswered: list[str] = []

    async def applied_unanswered(self: ConnectionLeases, candidate):  # type: ignore[no-untyped-def]
        outcome = await original(self, candidate)
        if not unanswered:
            unanswered.append(candidate.pk)
            raise StoreUnavailable(f"acquire {candidate.pk}: no answer before the deadline")
        return outcome

    monkeypatch.setattr(ConnectionLeases, "_try_claim", applied_unanswered)
    schedule = Schedule(seed=1, holders=1, streams=1, fault_rate=0.0, events=(), quiet_seconds=30.0)
    outcome = run_schedule(schedule)
    assert outcome.problems == ()
    assert unanswered == [model.connection_pk("s0")]
    trace = outcome.trace
    assert "h0 claim_failed" in trace
    assert "via=unanswered_claim" in trace
    assert "reason=audit" not in trace  # the audit found nothing to give back


def test_a_store_slower_than_half_the_window_keeps_every_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every renewal answered 5 s after it was sent, with a holder's window of 8.5 s and a
    heartbeat of 2 s: a renewal that waited for the one before would be sent 5 s after it,
    and answered after the deadline that one set. Sent at the heartbeat's rate whether or not
    the one before answered, each answer comes a heartbeat after the one before, within the
    deadline: nobody's streams go down."""
    slow = 5.0
    assert 2 * slow > TIMING.holder_window_seconds > slow + TIMING.heartbeat_seconds
    original = InProcessClient.call

    async def slow_renewals(self: InProcessClient, operation: str, **params):  # type: ignore[no-untyped-def]
        key = params.get("Key", {}).get(model.PK, {}).get("S", "")
        if operation == "update_item" and key.startswith(model.SESSION_PREFIX):
            await asyncio.sleep(slow)
        return await original(self, operation, **params)

    monkeypatch.setattr(InProcessClient, "call", slow_renewals)
    schedule = Schedule(seed=1, holders=2, streams=4, fault_rate=0.0, events=(), quiet_seconds=60.0)
    outcome = run_schedule(schedule)
    assert outcome.problems == ()
    trace = outcome.trace
    for sign in ("deadline_passed", "session_reopened", "session_lost", "renewal_failed"):
        assert sign not in trace, sign
    # Each stream held once, from its first claim to the end.
    assert [trace.count(f" holds {model.connection_pk(f's{n}')} ") for n in range(4)] == [1] * 4
