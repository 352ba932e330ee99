"""CloudWatch alarm and Route 53 failover routing stand-ins for the local regions and the drill.

:class:`HealthAlarm` applies the deployed alarm's rule to the canary's ``WebSocketHealth``
datapoints (ALARM on N of N breaching, missing data breaching); :class:`FailoverResolver` is the
failover record pair: the primary while its alarm is OK, else the secondary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class HealthAlarm:
    """A CloudWatch alarm on ``WebSocketHealth < 1``: ALARM when the last ``datapoints`` values
    all breach, or when no datapoint arrived for ``datapoints`` periods (missing data breaching).
    Also a :class:`~.canary.MetricPublisher`, so the canary publishes straight into it."""

    def __init__(self, *, datapoints: int, period: float, clock: Callable[[], float]):
        self.datapoints = datapoints
        self.period = period
        self._clock = clock
        self._values: list[int] = []
        self._last_at: float | None = None

    async def publish(
        self, api_id: str, value: int, probe_healthy: bool, *, tick_ms: int | None = None
    ) -> None:
        self._values = (
            [*self._values[-(self.datapoints - 1) :], value] if self.datapoints > 1 else [value]
        )
        self._last_at = self._clock()

    @property
    def has_data(self) -> bool:
        """Whether any datapoint arrived yet."""
        return self._last_at is not None

    def in_alarm(self) -> bool:
        """The alarm's state now."""
        if self._last_at is None:
            return False  # no data yet at all: INSUFFICIENT_DATA; the drill waits for data
        if self._clock() - self._last_at > self.datapoints * self.period * 1.5:
            return True
        return len(self._values) == self.datapoints and all(v < 1 for v in self._values)


@dataclass
class FailoverResolver:
    """Route 53 failover routing: the primary's URL while its alarm is OK, else the secondary's.

    As deployed, the SECONDARY record has no health check, so Route 53 answers with it whenever
    the primary is unhealthy, whatever the secondary's own alarm says. With
    ``secondary_health_checked`` it has one, and with both unhealthy Route 53 answers with the
    primary."""

    primary: str
    secondary: str
    urls: dict[str, str]
    alarms: dict[str, HealthAlarm]
    clock: Callable[[], float]
    history: list[tuple[float, str]] = field(default_factory=list)
    secondary_health_checked: bool = False

    def region(self) -> str:
        """The region the failover name resolves to now; records every change."""
        if not self.alarms[self.primary].in_alarm():
            current = self.primary
        elif not self.secondary_health_checked or not self.alarms[self.secondary].in_alarm():
            current = self.secondary
        else:
            current = self.primary
        if not self.history or self.history[-1][1] != current:
            self.history.append((self.clock(), current))
        return current

    def url(self) -> str:
        return self.urls[self.region()]

    def switched_to(self, region: str, after: float) -> float | None:
        """When the name started resolving to ``region`` after time ``after``."""
        return next((t for t, r in self.history if r == region and t >= after), None)
