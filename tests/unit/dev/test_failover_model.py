"""The local Route 53 failover model: the alarm rule (N of N datapoints, missing data
breaching) and the failover records as deployed (a health check on the PRIMARY only)."""

from __future__ import annotations

import asyncio

from streamfleet_dev.emulator.failover import FailoverResolver, HealthAlarm


def test_the_resolver_follows_the_alarm_rule() -> None:
    now = [0.0]
    alarms = {
        region: HealthAlarm(datapoints=2, period=1.0, clock=lambda: now[0])
        for region in ("primary", "secondary")
    }
    resolver = FailoverResolver(
        "primary", "secondary", {"primary": "ws://p", "secondary": "ws://s"}, alarms, lambda: now[0]
    )

    def publish(region: str, value: int) -> None:
        asyncio.run(alarms[region].publish("api", value, bool(value)))

    publish("primary", 1)
    publish("secondary", 1)
    assert resolver.url() == "ws://p"
    publish("primary", 0)  # one breaching datapoint: not yet
    assert resolver.region() == "primary"
    publish("primary", 0)  # 2 of 2
    assert resolver.region() == "secondary"
    publish("secondary", 1)
    publish("primary", 1)  # back to OK
    assert resolver.region() == "primary"
    now[0] = 10.0  # no data for many periods: missing data is breaching
    publish("secondary", 1)
    assert resolver.region() == "secondary"
    assert [region for _, region in resolver.history] == [
        "primary", "secondary", "primary", "secondary"
    ]  # fmt: skip
    # Both unhealthy: the SECONDARY record has no health check, so the name stays there; with
    # one, Route 53 would answer with the primary.
    publish("secondary", 0)
    publish("secondary", 0)
    assert resolver.region() == "secondary"
    resolver.secondary_health_checked = True
    assert resolver.region() == "primary"
