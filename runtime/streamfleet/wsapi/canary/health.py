"""The Region's standing between runs: fail-back hysteresis (fast to fail, slow to forgive)
and the stores that keep its state (in memory, or one DynamoDB item)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Protocol

from ... import model
from ...aws import AsyncClient
from ...lease.dynamo import from_item, is_condition_failure, names, to_attr
from .config import DEFAULT_FAILURES_TO_TRIP, DEFAULT_HEALTHY_RUNS_TO_RECOVER, MINUTE_MS


@dataclass(frozen=True)
class HealthState:
    """The canary's memory between runs."""

    reported_healthy: bool = True  # what the last run published (a new canary saw no failure)
    tripped: bool = False  # failed long enough to fail over; fail-back needs a healthy streak
    failure_streak: int = 0
    healthy_streak: int = 0
    version: int = 0
    last_tick_ms: int | None = None  # the schedule tick of the run that wrote it


@dataclass(frozen=True)
class FailbackHysteresis:
    """Fast to fail, slow to forgive.

    A failed probe always reports unhealthy. ``failures_to_trip`` consecutive failures (the
    alarm's datapoints: the point where traffic fails over) trip the canary; once tripped it
    reports unhealthy until ``healthy_runs_to_recover`` consecutive probes succeeded. Failures
    that do not trip it (a blip the alarm ignores) change nothing for the next healthy probe.

    A run for a tick already counted (EventBridge and Lambda deliver at least once, and a late
    run may save after the next one) counts nothing: one bad minute never counts twice.
    """

    healthy_runs_to_recover: int = DEFAULT_HEALTHY_RUNS_TO_RECOVER
    failures_to_trip: int = DEFAULT_FAILURES_TO_TRIP

    def next(
        self,
        state: HealthState,
        probe_healthy: bool,
        tick_ms: int | None = None,
        *,
        alarm_since_ms: int | None = None,
    ) -> HealthState:
        """The state after one more probe at schedule tick ``tick_ms`` (epoch ms; ``None``:
        unknown), with the alarm in ALARM since ``alarm_since_ms`` (``None``: not in ALARM);
        ``reported_healthy`` is what to publish. An ALARM that began after the previous run
        trips the canary whatever caused it (missing data too), and the healthy streak that
        fail-back needs counts from there. An older one changes nothing: it is the ALARM the
        canary's own reports keep up, or one CloudWatch has not ended yet after a recovery
        (re-tripping on it would never let the Region back)."""
        version = state.version + 1
        if tick_ms is not None and state.last_tick_ms is not None and tick_ms <= state.last_tick_ms:
            return dataclasses.replace(state, version=version)  # counted already
        last_tick = state.last_tick_ms if tick_ms is None else tick_ms
        if (
            alarm_since_ms is not None
            and state.last_tick_ms is not None
            and alarm_since_ms > state.last_tick_ms
            and not state.tripped
        ):
            state = dataclasses.replace(state, tripped=True, healthy_streak=0)
        elif (
            state.tripped
            and tick_ms is not None
            and state.last_tick_ms is not None
            and tick_ms - state.last_tick_ms > MINUTE_MS * (self.failures_to_trip + 1)
        ):
            # Tripped, and silent since long enough for the alarm to have breached again:
            # the healthy streak fail-back needs counts consecutive minutes, not runs.
            state = dataclasses.replace(state, healthy_streak=0)
        if not probe_healthy:
            failures = min(state.failure_streak + 1, self.failures_to_trip)
            tripped = state.tripped or failures >= self.failures_to_trip
            return HealthState(False, tripped, failures, 0, version, last_tick)
        streak = min(state.healthy_streak + 1, self.healthy_runs_to_recover)
        tripped = state.tripped and streak < self.healthy_runs_to_recover
        return HealthState(not tripped, tripped, 0, streak, version, last_tick)


class HealthStateStore(Protocol):
    """Keeps :class:`HealthState` between runs."""

    async def load(self) -> HealthState:
        """The stored state (the default one if there is none)."""

    async def save(self, state: HealthState, previous: HealthState) -> bool:
        """Store ``state`` if the stored one is still ``previous``; ``False`` otherwise."""


class MemoryHealthStateStore:
    """In-process state: one long-running canary (the local drill)."""

    def __init__(self, initial: HealthState | None = None):
        self.state = initial or HealthState()

    async def load(self) -> HealthState:
        return self.state

    async def save(self, state: HealthState, previous: HealthState) -> bool:
        if self.state != previous:
            return False
        self.state = state
        return True


class DynamoHealthStateStore:
    """The state as one item, ``CANARY#<api id>``, written with an optimistic version check
    (a retried or overlapping invocation cannot count one probe twice)."""

    def __init__(self, dynamodb: AsyncClient, *, table_name: str, api_id: str):
        self._dynamodb = dynamodb
        self._table = table_name
        self._pk = model.canary_pk(api_id)

    async def load(self) -> HealthState:
        response = await self._dynamodb.call(
            "get_item",
            TableName=self._table,
            Key={model.PK: to_attr(self._pk)},
            ConsistentRead=True,
        )
        item = from_item(response.get("Item"))
        if not item:
            return HealthState()
        return HealthState(
            reported_healthy=bool(item.get(model.CANARY_REPORTED_HEALTHY, True)),
            tripped=bool(item.get(model.CANARY_TRIPPED, False)),
            failure_streak=int(item.get(model.CANARY_FAILURE_STREAK, 0)),
            healthy_streak=int(item.get(model.CANARY_HEALTHY_STREAK, 0)),
            version=int(item.get(model.CANARY_STATE_VERSION, 0)),
            last_tick_ms=(
                int(item[model.CANARY_LAST_TICK_MS]) if model.CANARY_LAST_TICK_MS in item else None
            ),
        )

    async def save(self, state: HealthState, previous: HealthState) -> bool:
        condition = "attribute_not_exists(#pk) OR #state_version = :previous"
        item = {
            model.PK: to_attr(self._pk),
            model.CANARY_REPORTED_HEALTHY: to_attr(state.reported_healthy),
            model.CANARY_TRIPPED: to_attr(state.tripped),
            model.CANARY_FAILURE_STREAK: to_attr(state.failure_streak),
            model.CANARY_HEALTHY_STREAK: to_attr(state.healthy_streak),
            model.CANARY_STATE_VERSION: to_attr(state.version),
            model.UPDATED_AT_MS: to_attr(time.time_ns() // 1_000_000),
        }
        if state.last_tick_ms is not None:
            item[model.CANARY_LAST_TICK_MS] = to_attr(state.last_tick_ms)
        try:
            await self._dynamodb.call(
                "put_item",
                TableName=self._table,
                Item=item,
                ConditionExpression=condition,
                ExpressionAttributeNames=names(model.PK, model.CANARY_STATE_VERSION),
                ExpressionAttributeValues={":previous": to_attr(previous.version)},
            )
        except Exception as exc:
            if is_condition_failure(exc):
                return False
            raise
        return True
