"""The live simulation's regional failover: when the failover name moves, which schedules have
one, and the global tables' replication (out of order across items, last writer wins within
one, held while the primary is cut off)."""

from __future__ import annotations

import dataclasses

from streamfleet import model
from streamfleet.lease.dynamo import to_attr
from streamfleet_dev.dsim.live import Schedule, World
from streamfleet_dev.dsim.live.failover import Failover

FAILOVER = Failover(
    at=10.0,
    kind="region",
    detected_after=2.0,
    recovers_at=20.0,
    failback_after=3.0,
    lag_max=1.0,
)


def test_the_name_moves_when_the_failure_is_detected_and_back_after_the_healthy_runs() -> None:
    assert [FAILOVER.on_secondary(t) for t in (0.0, 11.9, 12.0, 22.9, 23.0, 500.0)] == [
        False, False, True, True, False, False
    ]  # fmt: skip
    for_good = dataclasses.replace(FAILOVER, recovers_at=None)
    assert for_good.on_secondary(12.0) and for_good.on_secondary(10_000.0)


def test_about_one_schedule_in_five_fails_over_and_the_others_draw_as_before() -> None:
    schedules = [Schedule.generate(seed) for seed in range(1, 501)]
    with_failover = [s for s in schedules if s.failover is not None]
    assert 70 <= len(with_failover) <= 130
    assert {s.failover.kind for s in with_failover} == {"api", "region"}  # type: ignore[union-attr]
    assert any(s.failover.recovers_at is None for s in with_failover)  # type: ignore[union-attr]
    # Drawn apart: a schedule is the same with its failover taken away.
    without = dataclasses.replace(with_failover[0], failover=None)
    assert dataclasses.replace(Schedule.generate(without.seed), failover=None) == without


class _Lags:
    """The replication's lags, in the order given."""

    def __init__(self, *lags: float):
        self._lags = list(lags)

    def uniform(self, _low: float, _high: float) -> float:
        return self._lags.pop(0)


def _world() -> World:
    seed = next(s for s in range(1, 200) if Schedule.generate(s).failover is not None)
    return World(dataclasses.replace(Schedule.generate(seed), failover=FAILOVER))


def _store(world: World, seq: int, data: str) -> None:
    params = {
        "TableName": world.names["messages"],
        "Item": {
            model.PK: to_attr(model.connection_pk("s0")),
            model.SEQ: to_attr(seq),
            model.MESSAGE_DATA: to_attr(data),
        },
    }
    world.primary.store.call("put_item", params)
    assert world.replication is not None
    world.replication.carry("put_item", params)


def _secondary_stream(world: World) -> list[tuple[str, int, str]]:
    assert world.secondary is not None
    records = world.secondary.store.stream_records(world.names["messages"])()
    return [
        (
            record["eventName"],
            int(record["dynamodb"]["Keys"][model.SEQ]["N"]),
            record["dynamodb"]["NewImage"][model.MESSAGE_DATA]["S"],
        )
        for record in records
    ]


def test_replicated_writes_apply_out_of_order_across_items_last_writer_wins_within_one() -> None:
    world = _world()
    assert world.replication is not None
    world.replication._rng = _Lags(0.5, 0.1, 0.9, 0.2)  # type: ignore[assignment]
    _store(world, 1, "one")
    _store(world, 2, "two")  # lands before 1
    _store(world, 3, "three, first")  # lands after its rewrite below: dropped
    _store(world, 3, "three, again")
    world.scheduler.run(2.0)
    assert _secondary_stream(world) == [
        ("INSERT", 2, "two"),
        ("INSERT", 3, "three, again"),
        ("INSERT", 1, "one"),
    ]


def test_what_a_cut_off_primary_had_not_replicated_arrives_once_it_recovers() -> None:
    world = _world()
    assert world.replication is not None and world.secondary is not None
    world.replication._rng = _Lags(0.1, 0.5, 0.3, 0.1)  # type: ignore[assignment]
    _store(world, 1, "one")
    _store(world, 2, "two")
    world.scheduler.run(0.2)
    world.primary.isolated = True
    world.scheduler.run(5.0)
    assert [seq for _, seq, _ in _secondary_stream(world)] == [1]
    assert not world.secondary.holds("s0", 2)
    world.primary.isolated = False
    world.replication.resume()
    world.scheduler.run(6.0)
    assert [seq for _, seq, _ in _secondary_stream(world)] == [1, 2]
