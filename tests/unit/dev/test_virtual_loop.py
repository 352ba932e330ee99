"""The virtual-time event loop the deterministic simulation runs on."""

from __future__ import annotations

import asyncio
import time

import pytest

from streamfleet_dev.dsim.loop import Deadlock, run


def test_an_hour_of_sleeping_takes_no_time_and_timeouts_fire_on_the_virtual_clock() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        try:
            async with asyncio.timeout(10):
                await asyncio.sleep(20)
        except TimeoutError:
            return loop.time(), time.perf_counter()
        raise AssertionError("the timeout never fired")

    began = time.perf_counter()
    virtual, ended = run(main())
    assert virtual == 3610.0
    assert ended - began < 5  # real seconds: nothing waited


def test_timers_due_at_one_instant_run_in_the_order_they_were_set() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        order: list[int] = []
        for n in range(50):
            loop.call_later(1.0 if n % 2 else 2.0, order.append, n)
        await asyncio.sleep(3)
        return order

    odd, even = list(range(1, 50, 2)), list(range(0, 50, 2))
    assert run(main()) == odd + even


def test_a_loop_with_nothing_left_to_happen_says_so() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(Deadlock, match="nothing is ready"):
        run(main())
