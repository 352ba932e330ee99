"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamfleet.aws import AsyncClient


@dataclass
class ShiftableClock:
    """The system clocks plus an offset a test can advance: a pause without sleeping.

    Advancing the clock shared by a holder and a taker is what a paused holder experiences (time
    went by, it did nothing); advancing only the taker's is a clock running ahead.
    """

    offset: float = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000 + round(self.offset * 1000)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class CountingClient(AsyncClient):
    """An :class:`AsyncClient` whose request counts a test can reset and read."""

    @property
    def calls(self) -> dict[str, int]:
        return dict(self.requests)

    def total(self) -> int:
        return sum(self.requests.values())

    def reset(self) -> None:
        self.requests.clear()
