"""What the canary tells CloudWatch (``PutMetricData``: the health after hysteresis and the
raw probe) and what its alarm's state tells the canary back (``DescribeAlarms``)."""

from __future__ import annotations

import datetime
import logging
from typing import Protocol

from ... import model
from ...aws import AsyncClient
from ...logs import log_event

# The package's logger: the canary's log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)


class AlarmState(Protocol):
    """The alarm the canary's metric feeds."""

    async def alarm_since_ms(self) -> int | None:
        """When it entered the ALARM it is in (epoch ms); ``None`` if it is not in ALARM."""


class CloudWatchAlarmState:
    """The alarm's state from ``DescribeAlarms`` (one call per run)."""

    def __init__(self, cloudwatch: AsyncClient, alarm_name: str):
        self._cloudwatch = cloudwatch
        self._alarm_name = alarm_name

    async def alarm_since_ms(self) -> int | None:
        response = await self._cloudwatch.call(
            "describe_alarms", AlarmNames=[self._alarm_name], AlarmTypes=["MetricAlarm"]
        )
        alarms = response.get("MetricAlarms") or []
        if not alarms:
            log_event(
                logger,
                logging.WARNING,
                "canary_alarm",
                decision="not_found",
                detail=f"no metric alarm named {self._alarm_name}: fail-back rests on the "
                "canary's own failures",
            )
            return None
        if alarms[0].get("StateValue") != "ALARM":
            return None
        # When it entered ALARM: StateUpdatedTimestamp also moves while it stays there (its
        # evaluation state or reason changing), which would pass for a new ALARM.
        since = alarms[0].get("StateTransitionedTimestamp") or alarms[0].get(
            "StateUpdatedTimestamp"
        )
        return int(since.timestamp() * 1000) if isinstance(since, datetime.datetime) else None


class MetricPublisher(Protocol):
    """Where a run's result goes."""

    async def publish(
        self, api_id: str, value: int, probe_healthy: bool | None, *, tick_ms: int | None = None
    ) -> None:
        """Publish ``value`` (1/0 after hysteresis) and the raw probe result (``None``: no
        probe ran), in the minute of schedule tick ``tick_ms`` (``None``: now)."""


class CloudWatchPublisher:
    """``PutMetricData``: ``App/WebSocketHealth`` and ``App/WebSocketProbeSuccess`` by ``ApiId``."""

    def __init__(self, cloudwatch: AsyncClient):
        self._cloudwatch = cloudwatch

    async def publish(
        self, api_id: str, value: int, probe_healthy: bool | None, *, tick_ms: int | None = None
    ) -> None:
        dimensions = [{"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": api_id}]
        # Stamped with the tick, not the arrival: a probe that ran past the minute (up to its
        # timeout) must not leave its own minute empty and fill the next one, which the alarm
        # would count as two breaching minutes.
        stamp = (
            {}
            if tick_ms is None
            else {"Timestamp": datetime.datetime.fromtimestamp(tick_ms / 1000, datetime.UTC)}
        )
        await self._cloudwatch.call(
            "put_metric_data",
            Namespace=model.HEALTH_METRIC_NAMESPACE,
            MetricData=[
                {
                    "MetricName": model.HEALTH_METRIC_NAME,
                    "Dimensions": dimensions,
                    "Value": float(value),
                    "Unit": "None",
                    **stamp,
                },
                *(
                    []
                    if probe_healthy is None
                    else [
                        {
                            "MetricName": model.PROBE_METRIC_NAME,
                            "Dimensions": dimensions,
                            "Value": 1.0 if probe_healthy else 0.0,
                            "Unit": "None",
                            **stamp,
                        }
                    ]
                ),
            ],
        )
