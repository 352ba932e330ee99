"""Lease durations and the holder's deadline, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import check_non_negative_seconds, check_positive_seconds

# A holder must get at least this many renewal attempts in before its deadline.
MIN_RENEWALS_PER_WINDOW = 3


@dataclass(frozen=True)
class LeaseTiming:
    """How long a session vouches for its connections, and the safety allowances around it.

    * ``lease_seconds``: what a renewal promises to the others (``expires_at_ms = now + lease``).
    * ``max_clock_skew_seconds``: the most two hosts' wall clocks may disagree. A taker waits this
      long past ``expires_at_ms``; the holder stops this long before it.
    * ``safety_margin_seconds``: extra room for the holder to close its connections.
    * ``heartbeat_seconds``: how often the holder renews.

    The holder's deadline is ``sent_at_of_last_successful_renew + lease - skew - margin`` on its
    monotonic clock; the heartbeat must leave at least three renewals inside that window.
    """

    lease_seconds: float = 20.0
    heartbeat_seconds: float = 5.0
    max_clock_skew_seconds: float = 1.0
    safety_margin_seconds: float = 0.5

    def __post_init__(self) -> None:
        check_positive_seconds("lease_seconds", self.lease_seconds)
        check_positive_seconds("heartbeat_seconds", self.heartbeat_seconds)
        check_non_negative_seconds("max_clock_skew_seconds", self.max_clock_skew_seconds)
        check_non_negative_seconds("safety_margin_seconds", self.safety_margin_seconds)
        if self.holder_window_seconds <= 0:
            raise ValueError(
                "lease_seconds: must exceed max_clock_skew_seconds + safety_margin_seconds "
                f"({self.max_clock_skew_seconds} + {self.safety_margin_seconds})"
            )
        if self.heartbeat_seconds * MIN_RENEWALS_PER_WINDOW > self.holder_window_seconds:
            raise ValueError(
                f"heartbeat_seconds: {self.heartbeat_seconds} is not well below the lease; at most "
                f"{self.holder_window_seconds / MIN_RENEWALS_PER_WINDOW:.3f} s leaves "
                f"{MIN_RENEWALS_PER_WINDOW} renewals before the holder's deadline"
            )

    @property
    def holder_window_seconds(self) -> float:
        """How long after sending a successful renewal the holder may still act on its leases."""
        return self.lease_seconds - self.max_clock_skew_seconds - self.safety_margin_seconds

    @property
    def lease_ms(self) -> int:
        return round(self.lease_seconds * 1000)

    @property
    def max_clock_skew_ms(self) -> int:
        return round(self.max_clock_skew_seconds * 1000)

    def holder_deadline(self, renew_sent_at_monotonic: float) -> float:
        """The monotonic instant by which the holder must have stopped every connection."""
        return renew_sent_at_monotonic + self.holder_window_seconds

    def is_expired_for_taker(self, expires_at_ms: int, now_wall_ms: int) -> bool:
        """Whether a taker may treat a session that expires at ``expires_at_ms`` as gone."""
        return expires_at_ms + self.max_clock_skew_ms < now_wall_ms
