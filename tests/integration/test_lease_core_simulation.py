"""The lease core on a virtual clock (``streamfleet_dev.dsim``): the deployed lease code against
an in-process DynamoDB through the fault layer, holders crashed, paused and started by seeded
schedules; one owner and liveness checked; a seed replays byte for byte.

``make lease-sim`` runs 200 fresh seeds; ``SIM_SEED=<n> make lease-sim`` prints one trace."""

from __future__ import annotations

import pytest

from streamfleet.lease.timing import LeaseTiming
from streamfleet_dev.dsim.lease_core import Schedule, run_schedule

# A fixed list, so the gate is the same on every run; make lease-sim draws fresh ones.
SEEDS = range(1, 26)


def test_every_fixed_schedule_keeps_one_owner_and_comes_back() -> None:
    outcomes = [run_schedule(Schedule.generate(seed)) for seed in SEEDS]
    failed = [f"SIM_SEED={o.schedule.seed}: {o.problems}" for o in outcomes if not o.ok]
    assert failed == []
    # The schedules did what they are for: faults injected, crashes and pauses played.
    assert sum(o.faults for o in outcomes) > 100
    kinds = {event.kind for o in outcomes for event in o.schedule.events}
    assert kinds == {"crash", "pause", "start"}


def test_a_seed_replays_the_same_schedule_and_outcome_byte_for_byte() -> None:
    first, again = (run_schedule(Schedule.generate(7)) for _ in range(2))
    assert first.trace == again.trace and first.problems == again.problems
    assert " SENT " in first.trace and " holds " in first.trace
    assert run_schedule(Schedule.generate(8)).trace != first.trace


def test_a_taker_that_ignores_the_clock_skew_allowance_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker can fail: a taker that treats a session as gone 3 s before it expires
    (the allowance is 1 s) takes a paused holder's row while the holder may still act."""
    monkeypatch.setattr(
        LeaseTiming, "is_expired_for_taker", lambda self, expires, now: expires - 3000 < now
    )
    # The seeds of the fixed list whose pauses outlast a lease while a row is held: each
    # catches it, every time (found by running the list with the defect in place).
    for seed in (2, 10, 19):
        problems = run_schedule(Schedule.generate(seed)).problems
        assert any("could act until" in problem for problem in problems), (seed, problems)
