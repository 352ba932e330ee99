"""Bounded waits that never lose a cancellation (``streamfleet/waiting.py``)."""

from __future__ import annotations

import asyncio

import pytest

from streamfleet.waiting import wait_at_most


async def test_a_cancellation_that_races_the_completion_is_not_lost():
    """``asyncio.wait_for`` on Python 3.11 lost it: the caller ran on as if never cancelled (a
    connection told to end kept redialling until its next cancellation)."""
    done = asyncio.get_running_loop().create_future()
    went_on = asyncio.Event()

    async def caller() -> None:
        await wait_at_most(done, 10)
        went_on.set()

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # it is waiting
    done.set_result(None)
    task.cancel()  # in the same turn of the loop

    with pytest.raises(asyncio.CancelledError):
        await task
    assert not went_on.is_set()


async def test_it_says_whether_the_wait_finished_in_time():
    assert await wait_at_most(asyncio.sleep(0), 1) is True
    assert await wait_at_most(asyncio.Event().wait(), 0.01) is False
