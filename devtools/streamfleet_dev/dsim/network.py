"""The fault layer's network on a virtual clock: late and duplicated requests are delivered by
the loop's own timers, and index answers are remembered by virtual time, so the faults of
:mod:`streamfleet_dev.sim.faults` replay exactly."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from streamfleet_dev.sim.faults import Network


class VirtualNetwork(Network):
    """:class:`~streamfleet_dev.sim.faults.Network` without threads: ``deliver_later`` is a timer
    of ``loop``, and "now" is the loop's time."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._loop = loop
        self._pending: set[asyncio.TimerHandle] = set()

    def deliver_later(self, client: Any, operation: str, params: dict[str, Any], delay: float):
        def deliver() -> None:
            self._pending.discard(timer)
            # The sender gave up on it long ago: nobody hears the answer.
            with contextlib.suppress(Exception):
                getattr(client, operation)(**params)
            self.delivered_late += 1

        timer = self._loop.call_later(delay, deliver)
        self._pending.add(timer)

    def remember(self, key: str, answer: dict[str, Any]) -> None:
        answers = self._answers.setdefault(key, [])
        answers.append((self._loop.time(), answer))
        del answers[:-50]

    def earlier_answer(self, key: str, within: float) -> dict[str, Any] | None:
        cutoff = self._loop.time() - within
        for at, answer in self._answers.get(key, []):
            if at >= cutoff:
                return answer
        return None

    @property
    def in_flight(self) -> int:
        """Requests still on their way."""
        return len(self._pending)

    def quiesce(self, timeout: float = 10.0) -> None:
        """Nothing to wait for outside the loop: run it until every delivery is made."""
