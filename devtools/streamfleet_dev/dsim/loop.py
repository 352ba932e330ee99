"""An asyncio event loop on a virtual clock: time moves only when every task waits.

The loop's ``time()`` is a number the loop itself advances. When no callback is ready, it jumps
straight to the earliest timer instead of waiting for it, so an hour of ``asyncio.sleep``,
``asyncio.timeout`` and ``call_later`` takes as long as the code between them. Nothing may do
real I/O on it (a socket would never be polled): every peer is in process, answered by
callbacks. A loop with nothing ready and no timer is stuck for good, which is a bug of the
simulation: it raises :class:`Deadlock` rather than hang.

Given the same code and the same seeded inputs, the order of callbacks is the same on every run
and every machine: ready callbacks run first in first out, and timers due at the same instant
run in the order they were scheduled (the loop breaks ties by a sequence number, not by the
heap's comparison of handles).
"""

from __future__ import annotations

import asyncio
import itertools
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Nothing is ready and nothing is scheduled: no task can ever run again."""


class _NoIoSelector(selectors.BaseSelector):
    """A selector that never reports I/O; ``select(timeout)`` moves the virtual clock instead of
    waiting. The loop's own wake-up pipe is registered here and never polled: on a virtual loop
    every callback comes from the loop's own thread."""

    def __init__(self, loop: VirtualTimeLoop):
        self._loop = loop
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, _fd(fileobj), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock(
                f"at t={self._loop.time():.6f}: nothing is ready and no timer is set "
                "(a task awaits something only real I/O or another thread could deliver)"
            )
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Any:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


def _fd(fileobj: Any) -> int:
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """See the module docstring. ``start``: the virtual time the loop begins at (seconds)."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)
        self._sequence = itertools.count()
        super().__init__(_NoIoSelector(self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on (never back)."""
        if seconds > 0:
            self._now += seconds

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
        # The timer's time carries a sequence number: heapq compares timers by time only, and
        # equal times would then run in the heap's order.
        return super().call_at(_Tied(when, next(self._sequence)), callback, *args, context=context)

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:
        # Work on another thread takes real time the virtual clock would jump over.
        raise RuntimeError("a virtual-time loop runs nothing on other threads")

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> Any:
        raise RuntimeError("a virtual-time loop takes no callbacks from other threads")


class _Tied(float):
    """A timer's time that also carries its scheduling order, for the heap's comparisons."""

    def __new__(cls, when: float, sequence: int) -> _Tied:
        value = super().__new__(cls, when)
        value.sequence = sequence  # type: ignore[attr-defined]
        return value

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _Tied) and float(self) == float(other):
            return self.sequence < other.sequence  # type: ignore[attr-defined]
        return float(self) < float(other)  # type: ignore[arg-type]


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`; close it afterwards,
    cancelling whatever ``main`` left running."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
