"""Small helpers shared by the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

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
    """An :class:`AsyncClient` that counts the requests it sends, by operation."""

    def __init__(self, service: str, **kwargs: Any):
        super().__init__(service, **kwargs)
        self.calls: dict[str, int] = {}

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        return await super().call(operation, **params)

    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()
