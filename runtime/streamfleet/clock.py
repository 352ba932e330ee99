"""Two clocks, kept apart on purpose.

Wall time (epoch milliseconds) is what other hosts can read in DynamoDB, so it is only ever
compared with a clock-skew allowance. The monotonic clock is what a holder measures its own
deadline on: it never jumps when NTP steps the wall clock, and it keeps running while the process
is stopped (SIGSTOP, a frozen VM), which is exactly when a holder must not trust its lease.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    """What the lease code needs to know about time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch, as other hosts see them (give or take their skew)."""


@dataclass(frozen=True)
class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK = SystemClock()
