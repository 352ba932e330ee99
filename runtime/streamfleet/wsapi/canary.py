"""The canary: probes one region's WebSocket API and publishes ``App/WebSocketHealth``.

Every run (EventBridge, once a minute) it opens a WebSocket to the *regional* endpoint (not the
failover name: it must judge this region, whatever DNS says), authenticates like a client, sends
``{"action": "heartbeat"}`` and expects ``{"type": "pong"}`` within ``CANARY_TIMEOUT_SECONDS``.
Anything else (refused handshake, HTTP 500 because the handler is throttled, API Gateway's
``Internal server error`` frame, silence) is a failed probe.

**Fail-back hysteresis.** Route 53 only understands the alarm's plain "2 of 2 datapoints"
(no M-of-N, no metric math), so the asymmetry the seed recommends (fail over after 2 bad
minutes, fail back only after more than 5 good ones) lives here. Once ``CANARY_FAILURES_TO_TRIP``
(default 2: the alarm's datapoints) consecutive probes failed, i.e. once the alarm fires, the
canary is *tripped* and keeps reporting 0 until ``CANARY_HEALTHY_RUNS_TO_RECOVER`` (default 5)
*consecutive* probes succeeded. A region that flaps while recovering therefore does not pull
traffic back and forth. A single failed probe does not trip it: it reports one 0, which the
2-of-2 alarm ignores, exactly as without hysteresis (tripping on one blip would turn every blip
into a failover). The small state is kept in a DynamoDB item
(``CANARY#<api id>`` in ``CANARY_STATE_TABLE_NAME``, the regional connections table) written with
an optimistic version check; without a table every run starts from "healthy" (no hysteresis).
If the item cannot be read or written, the raw probe result is reported: a broken state store
alone must not take the region out of service.

**Metric.** ``PutMetricData`` (one call per run: cheap at one run a minute, and visible to the
alarm at once, unlike EMF's log-ingestion delay): namespace ``App``, dimension ``ApiId``,
``WebSocketHealth`` (after hysteresis; the alarm's metric) and ``WebSocketProbeSuccess`` (the
raw probe, for dashboards). The alarm must treat missing data as breaching, so a canary that
stops running also fails the region over.

**Token.** The canary authenticates like any client. Configure one of ``CANARY_TOKEN`` (a
static token: local use), ``CANARY_SIGNING_KEY`` (a PEM private key or an ``oct`` JWK; a token is
minted per run for ``CANARY_SUBJECT``, default ``canary``, with ``JWT_ISSUER``/``JWT_AUDIENCE``) or
``CANARY_SIGNING_KEY_SECRET_ARN`` (the same, read once from Secrets Manager). The authorizer must
trust the matching public key. ``CANARY_TOKEN_TRANSPORT`` is ``subprotocol`` (default) or
``query``.

Other environment: ``CANARY_ENDPOINT_URL`` (``wss://<api id>.execute-api.<region>.amazonaws.com/
<stage>``), ``CANARY_API_ID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .. import model
from ..aws import AsyncClient, ClientSettings
from ..client.reconnecting import Endpoint, TokenTransport
from ..lease.dynamo import from_item, is_condition_failure, names, to_attr
from . import jwt

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_HEALTHY_RUNS_TO_RECOVER = 5
DEFAULT_FAILURES_TO_TRIP = 2  # = the alarm's datapoints to alarm
DEFAULT_TOKEN_LIFETIME_SECONDS = 300
DEFAULT_SUBJECT = "canary"
SAVE_ATTEMPTS = 3
CLIENT_SETTINGS = ClientSettings(threads=2)


class CanaryConfigError(ValueError):
    """A missing or invalid environment variable; names the variable."""


# --- Configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryConfig:
    """One canary: which endpoint it judges, how patiently, and how slowly it forgives."""

    endpoint_url: str
    api_id: str
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    healthy_runs_to_recover: int = DEFAULT_HEALTHY_RUNS_TO_RECOVER
    failures_to_trip: int = DEFAULT_FAILURES_TO_TRIP
    state_table: str | None = None
    token_transport: TokenTransport = TokenTransport.SUBPROTOCOL

    def __post_init__(self) -> None:
        if not self.endpoint_url.startswith(("ws://", "wss://")):
            raise CanaryConfigError("CANARY_ENDPOINT_URL: must be a ws:// or wss:// URL")
        if not self.api_id:
            raise CanaryConfigError("CANARY_API_ID: required")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise CanaryConfigError("CANARY_TIMEOUT_SECONDS: must be a number above zero")
        if self.healthy_runs_to_recover < 1:
            raise CanaryConfigError("CANARY_HEALTHY_RUNS_TO_RECOVER: must be at least 1")
        if self.failures_to_trip < 1:
            raise CanaryConfigError("CANARY_FAILURES_TO_TRIP: must be at least 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CanaryConfig:
        """Read and validate the environment (see the module docstring)."""
        env = os.environ if env is None else env
        try:
            timeout = float(env.get("CANARY_TIMEOUT_SECONDS", "") or DEFAULT_TIMEOUT_SECONDS)
        except ValueError:
            raise CanaryConfigError("CANARY_TIMEOUT_SECONDS: not a number") from None

        def whole(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if raw and not raw.isdigit():
                raise CanaryConfigError(f"{name}: not a whole number")
            return int(raw) if raw else default

        transport = env.get("CANARY_TOKEN_TRANSPORT", "").strip() or TokenTransport.SUBPROTOCOL
        if transport not in tuple(TokenTransport):
            raise CanaryConfigError("CANARY_TOKEN_TRANSPORT: must be subprotocol or query")
        return cls(
            endpoint_url=env.get("CANARY_ENDPOINT_URL", "").strip(),
            api_id=env.get("CANARY_API_ID", "").strip(),
            timeout_seconds=timeout,
            healthy_runs_to_recover=whole(
                "CANARY_HEALTHY_RUNS_TO_RECOVER", DEFAULT_HEALTHY_RUNS_TO_RECOVER
            ),
            failures_to_trip=whole("CANARY_FAILURES_TO_TRIP", DEFAULT_FAILURES_TO_TRIP),
            state_table=env.get("CANARY_STATE_TABLE_NAME", "").strip() or None,
            token_transport=TokenTransport(transport),
        )


# --- Probe --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """One probe: healthy iff a pong came back in time."""

    healthy: bool
    latency_seconds: float
    region: str | None = None
    error: str | None = None


async def probe(endpoint: Endpoint, *, timeout: float) -> ProbeResult:
    """Connect, send a heartbeat, wait for the pong; all within ``timeout`` seconds.

    Closing the connection afterwards is not part of the verdict: a pong that arrived in time
    is a healthy probe even if the close handshake is slow.
    """
    started = time.monotonic()

    def result(healthy: bool, region: str | None = None, error: str | None = None) -> ProbeResult:
        return ProbeResult(healthy, time.monotonic() - started, region, error)

    url, subprotocols = endpoint.handshake()
    ws = None
    try:
        async with asyncio.timeout(timeout):
            ws = await connect(
                url,
                subprotocols=subprotocols,
                open_timeout=None,  # the overall timeout bounds it
                ping_interval=None,
                close_timeout=max(0.05, timeout / 4),
                compression=None,
                proxy=None,
            )
            await ws.send(json.dumps({"action": model.WS_ROUTE_HEARTBEAT}))
            async for raw in ws:
                try:
                    message = json.loads(raw)
                except (ValueError, TypeError):
                    continue
                if isinstance(message, dict) and message.get("type") == model.WS_REPLY_PONG:
                    region = message.get("region")
                    return result(True, region if isinstance(region, str) else None)
            return result(False, error="connection closed before the pong")
    except TimeoutError:
        return result(False, error=f"no pong within {timeout:g} s")
    except InvalidStatus as exc:
        return result(False, error=f"handshake refused with HTTP {exc.response.status_code}")
    except ConnectionClosed as exc:
        return result(False, error=f"connection closed: {exc}")
    except Exception as exc:  # refused, DNS, TLS...
        return result(False, error=f"{type(exc).__name__}: {exc}")
    finally:
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()


# --- Tokens -------------------------------------------------------------------------------------


class TokenSource(Protocol):
    """Where the canary's token comes from."""

    async def token(self) -> str | None:
        """A token valid now (``None``: connect without one)."""


@dataclass(frozen=True)
class StaticToken:
    """A fixed token (or none)."""

    value: str | None

    async def token(self) -> str | None:
        return self.value


@dataclass(frozen=True)
class MintedToken:
    """A short-lived token minted for every run with the canary's own signing key."""

    key: jwt.SigningKey
    issuer: str
    audience: str
    subject: str = DEFAULT_SUBJECT
    lifetime_seconds: int = DEFAULT_TOKEN_LIFETIME_SECONDS

    async def token(self) -> str | None:
        now = int(time.time())
        claims = {
            "sub": self.subject,
            "iss": self.issuer,
            "aud": self.audience,
            "iat": now,
            "exp": now + self.lifetime_seconds,
        }
        return jwt.sign(claims, self.key)


class SecretToken:
    """:class:`MintedToken` whose key is read once from Secrets Manager."""

    def __init__(self, secrets: AsyncClient, secret_arn: str, *, issuer: str, audience: str):
        self._secrets = secrets
        self._arn = secret_arn
        self._issuer = issuer
        self._audience = audience
        self._minted: MintedToken | None = None

    async def token(self) -> str | None:
        if self._minted is None:
            secret = await self._secrets.call("get_secret_value", SecretId=self._arn)
            key = jwt.signing_key_from_text(secret["SecretString"])
            self._minted = MintedToken(key, self._issuer, self._audience)
        return await self._minted.token()


def token_source_from_env(
    env: Mapping[str, str], secrets: AsyncClient | None = None
) -> TokenSource:
    """The token source the environment configures (see the module docstring)."""
    static = env.get("CANARY_TOKEN", "").strip()
    key_text = env.get("CANARY_SIGNING_KEY", "").strip()
    secret_arn = env.get("CANARY_SIGNING_KEY_SECRET_ARN", "").strip()
    if sum(bool(v) for v in (static, key_text, secret_arn)) > 1:
        raise CanaryConfigError(
            "CANARY_TOKEN, CANARY_SIGNING_KEY, CANARY_SIGNING_KEY_SECRET_ARN: set at most one"
        )
    if static:
        return StaticToken(static)
    if not key_text and not secret_arn:
        return StaticToken(None)
    issuer, audience = env.get("JWT_ISSUER", "").strip(), env.get("JWT_AUDIENCE", "").strip()
    if not issuer or not audience:
        raise CanaryConfigError("JWT_ISSUER, JWT_AUDIENCE: required to mint the canary's token")
    if key_text:
        try:
            key = jwt.signing_key_from_text(key_text)
        except jwt.KeyMaterialError as exc:
            raise CanaryConfigError(f"CANARY_SIGNING_KEY: {exc}") from None
        subject = env.get("CANARY_SUBJECT", "").strip() or DEFAULT_SUBJECT
        return MintedToken(key, issuer, audience, subject)
    return SecretToken(
        secrets or AsyncClient("secretsmanager", CLIENT_SETTINGS),
        secret_arn,
        issuer=issuer,
        audience=audience,
    )


# --- Hysteresis ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthState:
    """The canary's memory between runs."""

    reported_healthy: bool = True  # what the last run published (a new canary saw no failure)
    tripped: bool = False  # failed long enough to fail over; fail-back needs a healthy streak
    failure_streak: int = 0
    healthy_streak: int = 0
    version: int = 0


@dataclass(frozen=True)
class FailbackHysteresis:
    """Fast to fail, slow to forgive.

    A failed probe always reports unhealthy. ``failures_to_trip`` consecutive failures (the
    alarm's datapoints: the point where traffic fails over) trip the canary; once tripped it
    reports unhealthy until ``healthy_runs_to_recover`` consecutive probes succeeded. Failures
    that do not trip it (a blip the alarm ignores) change nothing for the next healthy probe.
    """

    healthy_runs_to_recover: int = DEFAULT_HEALTHY_RUNS_TO_RECOVER
    failures_to_trip: int = DEFAULT_FAILURES_TO_TRIP

    def next(self, state: HealthState, probe_healthy: bool) -> HealthState:
        """The state after one more probe; ``reported_healthy`` is what to publish."""
        version = state.version + 1
        if not probe_healthy:
            failures = min(state.failure_streak + 1, self.failures_to_trip)
            tripped = state.tripped or failures >= self.failures_to_trip
            return HealthState(False, tripped, failures, 0, version)
        streak = min(state.healthy_streak + 1, self.healthy_runs_to_recover)
        tripped = state.tripped and streak < self.healthy_runs_to_recover
        return HealthState(not tripped, tripped, 0, streak, version)


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
        )

    async def save(self, state: HealthState, previous: HealthState) -> bool:
        condition = "attribute_not_exists(#pk) OR #state_version = :previous"
        try:
            await self._dynamodb.call(
                "put_item",
                TableName=self._table,
                Item={
                    model.PK: to_attr(self._pk),
                    model.CANARY_REPORTED_HEALTHY: to_attr(state.reported_healthy),
                    model.CANARY_TRIPPED: to_attr(state.tripped),
                    model.CANARY_FAILURE_STREAK: to_attr(state.failure_streak),
                    model.CANARY_HEALTHY_STREAK: to_attr(state.healthy_streak),
                    model.CANARY_STATE_VERSION: to_attr(state.version),
                    model.UPDATED_AT_MS: to_attr(time.time_ns() // 1_000_000),
                },
                ConditionExpression=condition,
                ExpressionAttributeNames=names(model.PK, model.CANARY_STATE_VERSION),
                ExpressionAttributeValues={":previous": to_attr(previous.version)},
            )
        except Exception as exc:
            if is_condition_failure(exc):
                return False
            raise
        return True


# --- Publishing ---------------------------------------------------------------------------------


class MetricPublisher(Protocol):
    """Where a run's result goes."""

    async def publish(self, api_id: str, value: int, probe_healthy: bool) -> None:
        """Publish ``value`` (1/0 after hysteresis) and the raw probe result."""


class CloudWatchPublisher:
    """``PutMetricData``: ``App/WebSocketHealth`` and ``App/WebSocketProbeSuccess`` by ``ApiId``."""

    def __init__(self, cloudwatch: AsyncClient):
        self._cloudwatch = cloudwatch

    async def publish(self, api_id: str, value: int, probe_healthy: bool) -> None:
        dimensions = [{"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": api_id}]
        await self._cloudwatch.call(
            "put_metric_data",
            Namespace=model.HEALTH_METRIC_NAMESPACE,
            MetricData=[
                {
                    "MetricName": model.HEALTH_METRIC_NAME,
                    "Dimensions": dimensions,
                    "Value": float(value),
                    "Unit": "None",
                },
                {
                    "MetricName": model.PROBE_METRIC_NAME,
                    "Dimensions": dimensions,
                    "Value": 1.0 if probe_healthy else 0.0,
                    "Unit": "None",
                },
            ],
        )


# --- The canary ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryRun:
    """One run: the probe, the state after hysteresis, and the published value."""

    probe: ProbeResult
    state: HealthState
    value: int
    hysteresis_applied: bool


class Canary:
    """Probe, apply hysteresis, publish. One :meth:`run_once` per schedule tick."""

    def __init__(
        self,
        config: CanaryConfig,
        *,
        tokens: TokenSource,
        store: HealthStateStore | None,
        publishers: Sequence[MetricPublisher],
    ):
        self.config = config
        self.tokens = tokens
        self.store = store
        self.publishers = tuple(publishers)
        self.hysteresis = FailbackHysteresis(
            config.healthy_runs_to_recover, config.failures_to_trip
        )

    async def run_once(self) -> CanaryRun:
        """One probe and its metric. Publishing failures are logged, not raised (the alarm
        treats the missing datapoint as breaching, which is the right outcome)."""
        try:
            token = await self.tokens.token()
        except Exception as exc:
            logger.warning("canary could not get a token: %s", exc)
            result = ProbeResult(False, 0.0, None, f"token: {type(exc).__name__}: {exc}")
        else:
            endpoint = Endpoint(self.config.endpoint_url, token, self.config.token_transport)
            result = await probe(endpoint, timeout=self.config.timeout_seconds)
        state, applied = await self._apply_hysteresis(result.healthy)
        value = 1 if state.reported_healthy else 0
        for publisher in self.publishers:
            try:
                await publisher.publish(self.config.api_id, value, result.healthy)
            except Exception as exc:
                logger.warning("canary could not publish: %s: %s", type(exc).__name__, exc)
        logger.info(
            json.dumps(
                {
                    "event": "canary",
                    "apiId": self.config.api_id,
                    "probeHealthy": result.healthy,
                    "value": value,
                    "streak": state.healthy_streak,
                    "latencyMs": round(result.latency_seconds * 1000, 1),
                    "region": result.region,
                    "error": result.error,
                },
                separators=(",", ":"),
            )
        )
        return CanaryRun(result, state, value, applied)

    async def _apply_hysteresis(self, probe_healthy: bool) -> tuple[HealthState, bool]:
        if self.store is None:
            return self.hysteresis.next(HealthState(), probe_healthy), False
        try:
            for _ in range(SAVE_ATTEMPTS):
                previous = await self.store.load()
                state = self.hysteresis.next(previous, probe_healthy)
                if await self.store.save(state, previous):
                    return state, True
        except Exception as exc:
            logger.warning("canary state store failed: %s: %s", type(exc).__name__, exc)
        # Unknown history: report the probe itself rather than guess.
        return HealthState(reported_healthy=probe_healthy), False


# --- Lambda entry point -------------------------------------------------------------------------

_cached: tuple[tuple[str, ...], Canary] | None = None
_cached_lock = threading.Lock()
_ENV_NAMES = (
    "CANARY_ENDPOINT_URL",
    "CANARY_API_ID",
    "CANARY_TIMEOUT_SECONDS",
    "CANARY_HEALTHY_RUNS_TO_RECOVER",
    "CANARY_FAILURES_TO_TRIP",
    "CANARY_STATE_TABLE_NAME",
    "CANARY_TOKEN_TRANSPORT",
    "CANARY_TOKEN",
    "CANARY_SIGNING_KEY",
    "CANARY_SIGNING_KEY_SECRET_ARN",
    "CANARY_SUBJECT",
    "JWT_ISSUER",
    "JWT_AUDIENCE",
)


def canary_from_env(env: Mapping[str, str] | None = None) -> Canary:
    """A canary wired to DynamoDB (if a state table is set) and CloudWatch."""
    env = os.environ if env is None else env
    config = CanaryConfig.from_env(env)
    store = None
    if config.state_table:
        store = DynamoHealthStateStore(
            AsyncClient("dynamodb", CLIENT_SETTINGS),
            table_name=config.state_table,
            api_id=config.api_id,
        )
    return Canary(
        config,
        tokens=token_source_from_env(env),
        store=store,
        publishers=[CloudWatchPublisher(AsyncClient("cloudwatch", CLIENT_SETTINGS))],
    )


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (``streamfleet.wsapi.canary.handler``), one probe per invocation."""
    global _cached
    key = tuple(os.environ.get(name, "") for name in _ENV_NAMES)
    with _cached_lock:
        if _cached is None or _cached[0] != key:
            _cached = (key, canary_from_env())
        canary = _cached[1]
    run = asyncio.run(canary.run_once())
    return {
        "healthy": run.probe.healthy,
        "value": run.value,
        "healthyStreak": run.state.healthy_streak,
        "tripped": run.state.tripped,
        "latencyMs": round(run.probe.latency_seconds * 1000, 1),
        "region": run.probe.region,
        "error": run.probe.error,
    }
