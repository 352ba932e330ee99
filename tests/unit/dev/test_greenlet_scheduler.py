"""The greenlet scheduler of the live-delivery simulation: blocking code interleaved in virtual
time, in a replayable order, and killed tasks that unwind without another request."""

from __future__ import annotations

import pytest

from streamfleet_dev.dsim.greenlets import Killed, Scheduler, TaskPool


def test_tasks_run_in_virtual_time_order_ties_in_the_order_they_were_scheduled() -> None:
    scheduler = Scheduler()
    seen: list[tuple[float, str]] = []

    def actor(name: str, pauses: list[float]) -> None:
        for pause in pauses:
            scheduler.sleep(pause)
            seen.append((scheduler.now, name))

    scheduler.spawn(actor, "a", [1.0, 1.0], name="a")
    scheduler.spawn(actor, "b", [2.0, 0.5], name="b")
    scheduler.spawn(actor, "c", [1.0], name="c")
    scheduler.run(until=10.0)

    # At 2.0 b goes first: its wake was scheduled at 0, a's at 1.0.
    assert seen == [(1.0, "a"), (1.0, "c"), (2.0, "b"), (2.0, "a"), (2.5, "b")]
    assert scheduler.now == 10.0 and scheduler.failures == []


def test_the_clock_reads_virtual_time_on_the_wall_and_monotonic() -> None:
    scheduler = Scheduler(wall_base_ms=1_000_000)
    scheduler.spawn(scheduler.sleep, 2.5, name="sleeper")
    scheduler.run(until=2.5)
    assert (scheduler.clock.monotonic(), scheduler.clock.wall_ms()) == (2.5, 1_002_500)


def test_a_killed_task_unwinds_at_its_wait_and_every_later_wait() -> None:
    scheduler = Scheduler()
    steps: list[str] = []

    def victim() -> None:
        try:
            scheduler.sleep(10.0)
            steps.append("woke")
        except Exception:  # the code under test cannot swallow a kill
            steps.append("swallowed")
        finally:
            try:
                scheduler.sleep(1.0)  # a request in a finally block is not made either
            except Killed:
                steps.append("no request after the kill")
                raise

    task = scheduler.spawn(victim, name="victim", detached=False)
    scheduler.spawn(scheduler.kill, task, name="killer", delay=1.0)
    scheduler.run(until=100.0)

    assert steps == ["no request after the kill"]
    assert task.done and isinstance(task.error, Killed)
    assert scheduler.failures == []  # a kill is not a failure of the run


def test_a_task_killed_before_its_first_turn_never_starts() -> None:
    scheduler = Scheduler()
    ran: list[str] = []
    task = scheduler.spawn(ran.append, "ran", name="late", delay=5.0, detached=False)
    scheduler.spawn(scheduler.kill, task, name="killer", delay=1.0)
    scheduler.run(until=10.0)
    assert ran == [] and isinstance(task.error, Killed)


def test_a_root_task_outlives_the_task_that_started_it() -> None:
    scheduler = Scheduler()
    ran: list[str] = []

    def delivery() -> None:
        scheduler.sleep(5.0)
        ran.append("delivered")

    def invocation() -> None:
        scheduler.spawn(delivery, name="delivery", root=True)
        scheduler.sleep(10.0)

    task = scheduler.spawn(invocation, name="invocation", detached=False)
    scheduler.spawn(scheduler.kill, task, name="killer", delay=1.0)
    scheduler.run(until=10.0)
    assert ran == ["delivered"]


def test_killing_a_task_kills_what_it_started() -> None:
    scheduler = Scheduler()
    ran: list[str] = []

    def child() -> None:
        scheduler.sleep(5.0)
        ran.append("child")

    def parent() -> None:
        scheduler.spawn(child, name="child")
        scheduler.sleep(5.0)
        ran.append("parent")

    task = scheduler.spawn(parent, name="parent", detached=False)
    scheduler.spawn(scheduler.kill, task, name="killer", delay=1.0)
    scheduler.run(until=10.0)
    assert ran == []


def test_an_exception_of_a_task_nobody_joins_is_a_failure_of_the_run() -> None:
    scheduler = Scheduler()

    def broken() -> None:
        scheduler.sleep(1.0)
        raise ValueError("boom")

    scheduler.spawn(broken, name="broken")
    scheduler.run(until=5.0)
    assert [(name, str(error)) for name, error in scheduler.failures] == [("broken", "boom")]


def test_a_pool_runs_its_items_concurrently_and_answers_in_order() -> None:
    scheduler = Scheduler()
    pool = TaskPool(scheduler, "pool", workers=2)
    answers: list[object] = []

    def work(pause: float) -> float:
        scheduler.sleep(pause)
        return pause

    def caller() -> None:
        answers.extend(pool.map(work, [3.0, 1.0, 2.0]))
        answers.append(scheduler.now)

    scheduler.spawn(caller, name="caller")
    scheduler.run(until=60.0)
    # Two at a time, each worker taking the next item when it is free: the third starts at
    # 1 s, when the second ends, and ends at 3 s with the first.
    assert answers == [3.0, 1.0, 2.0, 3.0]


def test_a_pool_raises_the_first_failing_item_to_its_caller() -> None:
    scheduler = Scheduler()
    pool = TaskPool(scheduler, "pool", workers=4)
    caught: list[str] = []

    def work(item: int) -> int:
        if item == 1:
            raise KeyError("one")
        return item

    def caller() -> None:
        with pytest.raises(KeyError) as raised:
            list(pool.map(work, [0, 1, 2]))
        caught.append(str(raised.value))

    scheduler.spawn(caller, name="caller")
    scheduler.run(until=1.0)
    assert caught == ["'one'"] and scheduler.failures == []
