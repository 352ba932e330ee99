"""One run of the canary: probe, apply the hysteresis, publish, and sweep the Region's
connections while it is unhealthy; a fault of the canary's own holds the last standing."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ... import model
from ...logs import log_event
from .. import jwt
from ..handshake import Endpoint
from .config import CanaryConfig
from .health import FailbackHysteresis, HealthState, HealthStateStore
from .metrics import AlarmState, MetricPublisher
from .probe import ProbeResult, probe
from .sweeper import Disconnector, SweepResult
from .tokens import TokenSource

# The package's logger: the canary's log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)

SAVE_ATTEMPTS = 3


class CanaryFault(RuntimeError):
    """The canary could not probe for a reason of its own (its key, its secret): the Lambda
    invocation fails (the function's Errors alarm pages) and the Region is judged as before."""


@dataclass(frozen=True)
class CanaryRun:
    """One run: the probe, the state after hysteresis, the published value, and the sweep of
    client connections (``None`` when the region is not unhealthy or sweeping is off)."""

    probe: ProbeResult
    state: HealthState
    value: int
    hysteresis_applied: bool
    sweep: SweepResult | None = None


class Canary:
    """Probe, apply hysteresis, publish. One :meth:`run_once` per schedule tick."""

    def __init__(
        self,
        config: CanaryConfig,
        *,
        tokens: TokenSource,
        store: HealthStateStore | None,
        publishers: Sequence[MetricPublisher],
        disconnector: Disconnector | None = None,
        alarm: AlarmState | None = None,
    ):
        self.config = config
        self.tokens = tokens
        self.store = store
        self.publishers = tuple(publishers)
        self.alarm = alarm
        self.disconnector = disconnector if config.disconnect_when_unhealthy else None
        self.hysteresis = FailbackHysteresis(
            config.healthy_runs_to_recover, config.failures_to_trip
        )
        self.retries_after_refusal = 0  # probes tried again with another key (tests, the drill)

    async def run_once(self, tick_ms: int | None = None) -> CanaryRun:
        """One probe and its metric, for schedule tick ``tick_ms`` (epoch ms; ``None``: now).
        Publishing failures are logged, not raised (the alarm treats the missing datapoint as
        breaching, which is the right outcome). A fault of the canary's own (no token, or a
        refusal of keys its authorizer does not accept) holds the last published value and
        raises :class:`CanaryFault`."""
        timeout = self.config.timeout_seconds
        try:
            # Each read of the secret is bounded by the token source itself, and a slow read
            # keeps the key held: the probe's own time is never spent here.
            token = await self.tokens.token()
        except Exception as exc:
            await self._hold(tick_ms)
            raise CanaryFault(f"token: {type(exc).__name__}: {exc}") from exc
        deadline = time.monotonic() + timeout
        result = await self._probe(token, timeout)
        # The Region refused the token: another key may be the one its authorizer accepts now
        # (a rotation; the Region decides, whatever JWT_CANARY_KEYS says), tried in the time the
        # probe has left.
        while result.credentials_refused and deadline > time.monotonic():
            try:
                token = await self.tokens.refused()
            except Exception as exc:  # the refusal stands
                self._warn("canary_key", exc)
                break
            if token is None or deadline <= time.monotonic():
                break
            self.retries_after_refusal += 1
            result = await self._probe(token, deadline - time.monotonic())
        if result.credentials_refused and not self._any_key_accepted():
            # Refused with keys its authorizer is known not to accept: the key is wrong (the
            # secret or canary_public_keys), not the Region. Page; judge nothing.
            await self._hold(tick_ms)
            raise CanaryFault(
                f"refused with HTTP {result.refused_status}, and none of its signing keys is one "
                f"of {model.ENV_JWT_CANARY_KEYS}, the keys its authorizer accepts"
            )
        state, applied = await self._apply_hysteresis(
            result.healthy, tick_ms, alarm_since_ms=await self._alarm_since_ms()
        )
        value = 1 if state.reported_healthy else 0
        await self._publish(value, result.healthy, tick_ms)
        # After publishing: by the time clients reconnect, the alarm has its datapoint.
        sweep = None
        if self.disconnector is not None and state.tripped:
            try:
                sweep = await self.disconnector.sweep()
            except Exception as exc:  # e.g. the table does not answer: the next run retries
                self._warn("canary_disconnect", exc)
                sweep = SweepResult(incomplete=True)
        log_event(
            logger,
            logging.INFO if result.healthy and value == 1 else logging.WARNING,
            "canary",
            apiId=self.config.api_id,
            probeHealthy=result.healthy,
            value=value,
            tripped=state.tripped,
            streak=state.healthy_streak,
            latencyMs=round(result.latency_seconds * 1000, 1),
            error=result.error,
            closed=None if sweep is None else sweep.closed,
            gone=None if sweep is None else sweep.gone,
            closeFailed=None if sweep is None else sweep.failed,
        )
        return CanaryRun(result, state, value, applied, sweep)

    async def _probe(self, token: str | None, timeout: float) -> ProbeResult:
        endpoint = Endpoint(self.config.endpoint_url, token, self.config.token_transport)
        return await probe(endpoint, timeout=timeout, connect_host=self.config.connect_host)

    def _any_key_accepted(self) -> bool:
        """Whether one of its keys is among those the Region's authorizer accepts (``True``
        when either side is unknown: the Region's answer then stands)."""
        accepted, keys = self.config.accepted_keys, self.tokens.keys
        if accepted is None or not keys:
            return True
        return any(jwt.same_key(key.public(), other) for key in keys for other in accepted)

    def _warn(self, event: str, exc: BaseException) -> None:
        """A step of the run failed for a reason it outlives (logged; the run goes on)."""
        log_event(
            logger,
            logging.WARNING,
            event,
            decision="error",
            apiId=self.config.api_id,
            detail=f"{type(exc).__name__}: {exc}",
        )

    async def _publish(self, value: int, probe_healthy: bool | None, tick_ms: int | None) -> None:
        for publisher in self.publishers:
            try:
                await publisher.publish(self.config.api_id, value, probe_healthy, tick_ms=tick_ms)
            except Exception as exc:
                self._warn("canary_publish", exc)

    async def _hold(self, tick_ms: int | None) -> None:
        """No probe could run for a reason of the canary's own: publish the Region's standing
        (unhealthy only while tripped: a single failure before does not make two breaching
        minutes with this one), so that neither the alarm nor the hysteresis takes the canary's
        fault for the Region's, and sweep nothing. With the history unreadable, publish nothing:
        a guess either way could move traffic."""
        previous = HealthState()  # a canary without a store: as a new one
        if self.store is not None:
            try:
                previous = await self.store.load()
            except Exception as exc:
                self._warn("canary_state", exc)
                return
        await self._publish(0 if previous.tripped else 1, None, tick_ms)

    async def _alarm_since_ms(self) -> int | None:
        """Since when the alarm is in ALARM, if it is (unreadable counts as not: the Region's
        fail-back then rests on the canary's own failures, as without the alarm)."""
        if self.alarm is None:
            return None
        try:
            return await self.alarm.alarm_since_ms()
        except Exception as exc:
            self._warn("canary_alarm", exc)
            return None

    async def _apply_hysteresis(
        self, probe_healthy: bool, tick_ms: int | None, *, alarm_since_ms: int | None = None
    ) -> tuple[HealthState, bool]:
        if self.store is None:
            state = self.hysteresis.next(
                HealthState(), probe_healthy, tick_ms, alarm_since_ms=alarm_since_ms
            )
            return state, False
        try:
            for _ in range(SAVE_ATTEMPTS):
                previous = await self.store.load()
                state = self.hysteresis.next(
                    previous, probe_healthy, tick_ms, alarm_since_ms=alarm_since_ms
                )
                if await self.store.save(state, previous):
                    return state, True
        except Exception as exc:
            self._warn("canary_state", exc)
        # Unknown history: report the probe itself rather than guess.
        return HealthState(reported_healthy=probe_healthy), False
