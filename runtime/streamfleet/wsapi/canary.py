"""The canary: probes one region's WebSocket API and publishes ``App/WebSocketHealth``.

Every run (EventBridge, once a minute) it opens a WebSocket to the *regional* endpoint (not the
failover name: it must judge this region, whatever DNS says): with a custom domain, the
domain's URL connected to this Region's regional domain name (``CANARY_CONNECT_HOST``), so the
domain's certificate and mapping are probed too, as users meet them. It authenticates with its own
identity, sends ``{"action": "heartbeat"}`` and expects the TEXT frame ``pong`` within
``CANARY_TIMEOUT_SECONDS``. Anything else (refused handshake, HTTP 500 because the handler is
throttled, API Gateway's ``Internal server error`` frame, silence) is a failed probe.

**Fail-back hysteresis.** Route 53 only understands the alarm's plain "2 of 2 datapoints"
(no M-of-N, no metric math), so the asymmetry that stops flapping (fail over after 2 bad
minutes, fail back only after more than 5 good ones) lives here. Once ``CANARY_FAILURES_TO_TRIP``
(default 2: the alarm's datapoints) consecutive probes failed, i.e. once the alarm fires, the
canary is *tripped* and keeps reporting 0 until ``CANARY_HEALTHY_RUNS_TO_RECOVER`` (default 5)
*consecutive* probes succeeded. A region that flaps while recovering therefore does not pull
traffic back and forth. A single failed probe does not trip it: it reports one 0, which the
2-of-2 alarm ignores, exactly as without hysteresis (tripping on one blip would turn every blip
into a failover). The canary also reads its alarm's state each run (``CANARY_ALARM_NAME``,
``DescribeAlarms``): an ALARM it did not cause (missing data: the canary did not run, or could
not publish, for two minutes) trips it too, so fail-back waits for the same healthy streak after
any ALARM. Only an ALARM that began after the canary's previous run counts: the one its own
reports keep up, and the minute CloudWatch takes to end it once the canary recovered, must not
trip it again. An alarm it cannot read changes nothing. The small state is kept in a DynamoDB item
(``CANARY#<api id>`` in ``CANARY_STATE_TABLE_NAME``, the regional connections table) written with
an optimistic version check; without a table every run starts from "healthy" (no hysteresis).
If the item cannot be read or written, the raw probe result is reported: a broken state store
alone must not take the region out of service.

**Metric.** ``PutMetricData`` (one call per run: cheap at one run a minute, and visible to the
alarm at once, unlike EMF's log-ingestion delay): namespace ``App``, dimension ``ApiId``,
``WebSocketHealth`` (after hysteresis; the alarm's metric) and ``WebSocketProbeSuccess`` (the
raw probe, for dashboards). The alarm must treat missing data as breaching, so a canary that
stops running also fails the region over.

**Server-driven failover.** A third-party client that counts any frame as "alive" stays on a
throttled region for ever: API Gateway answers each of its heartbeats with an ``Internal server
error`` frame. So while the region reports unhealthy (from the run that trips the hysteresis,
i.e. when the alarm fires and the failover name moves, until fail-back), every run closes every
client connection of this region through the Management API (``DeleteConnection`` on the ids in
the connections table; ``GoneException`` means already gone) and deletes their records (the
``$disconnect`` handler may be throttled too). Clients reconnect through the failover name and
land in the other region; one that lands here again (DNS caches) is closed again next run.
``CANARY_DISCONNECT_WHEN_UNHEALTHY=false`` turns it off. The Management API endpoint is the
https form of ``CANARY_ENDPOINT_URL`` unless ``CANARY_MANAGEMENT_ENDPOINT`` says otherwise.

**Token: the canary's own identity.** The canary's token is signed with its own key and carries
``iss`` = :data:`~streamfleet.model.CANARY_TOKEN_ISSUER`, ``aud`` = ``JWT_AUDIENCE``; the
authorizer verifies it only with ``JWT_CANARY_KEYS`` (the canary's public key, which is *not*
in the identity provider's JWKS) and the handlers let it send ``heartbeat`` only: its key cannot
mint a token for any user. Configure one of ``CANARY_TOKEN`` (a static token: local use),
``CANARY_SIGNING_KEY`` (a PEM private key or an ``oct`` JWK; a 5-minute token is minted per run
for ``CANARY_SUBJECT``, default ``canary``) or ``CANARY_SIGNING_KEY_SECRET_ARN`` (the same, read
from Secrets Manager: again every 5 minutes, and at once when a token is refused, which also
tries the key before it, so a rotation done in either order moves nothing).
``JWT_CANARY_KEYS`` (the keys the authorizer accepts for the canary, optional): a refusal of
keys all outside them is the canary's own fault, not a failed probe. ``CANARY_TOKEN_TRANSPORT`` is
``subprotocol`` (default) or ``query``.

Other environment: ``CANARY_ENDPOINT_URL`` (``wss://<api id>.execute-api.<region>.amazonaws.com/
<stage>``), ``CANARY_API_ID``; every name is in :data:`streamfleet.model.CANARY_ENV`. Runs are
logged as structured records (:mod:`.logs`): INFO for a healthy run, WARNING otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .. import model
from ..aws import AsyncClient, ClientSettings
from ..client.reconnecting import Endpoint, TokenTransport
from ..lease.dynamo import error_code, from_item, is_condition_failure, names, to_attr
from . import jwt
from .logs import log_event

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_HEALTHY_RUNS_TO_RECOVER = 5
MINUTE_MS = 60_000  # the schedule's period and the alarm's
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
DEFAULT_FAILURES_TO_TRIP = 2  # = the alarm's datapoints to alarm
DEFAULT_TOKEN_LIFETIME_SECONDS = 300
DEFAULT_SUBJECT = "canary"
SAVE_ATTEMPTS = 3
CLIENT_SETTINGS = ClientSettings(threads=2)
# DeleteConnection calls in flight at once, and the time a run may spend on them (what is left
# is closed by the next run, a minute later).
DISCONNECT_CONCURRENCY = 8
DEFAULT_DISCONNECT_BUDGET_SECONDS = 20.0
MANAGEMENT_CLIENT_SETTINGS = ClientSettings(threads=DISCONNECT_CONCURRENCY)


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
    disconnect_when_unhealthy: bool = True
    management_endpoint: str | None = None  # None: derived from endpoint_url
    disconnect_budget_seconds: float = DEFAULT_DISCONNECT_BUDGET_SECONDS
    alarm_name: str | None = None  # the alarm its metric feeds (read each run), if any
    connect_host: str | None = None  # the regional domain name behind a custom domain URL
    # The keys the Region's authorizer accepts for the canary (JWT_CANARY_KEYS, the same text),
    # if known: a refusal of keys all outside them is a fault of the canary's own, not the
    # Region's.
    accepted_keys: tuple[jwt.VerificationKey, ...] | None = None

    def __post_init__(self) -> None:
        if not self.endpoint_url.startswith(("ws://", "wss://")):
            raise CanaryConfigError(
                f"{model.ENV_CANARY_ENDPOINT_URL}: must be a ws:// or wss:// URL"
            )
        if self.management_endpoint is not None and not self.management_endpoint.startswith(
            ("http://", "https://")
        ):
            raise CanaryConfigError(
                f"{model.ENV_CANARY_MANAGEMENT_ENDPOINT}: must be an http(s):// URL"
            )
        if not self.api_id:
            raise CanaryConfigError(f"{model.ENV_CANARY_API_ID}: required")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise CanaryConfigError(
                f"{model.ENV_CANARY_TIMEOUT_SECONDS}: must be a number above zero"
            )
        if self.healthy_runs_to_recover < 1:
            raise CanaryConfigError(
                f"{model.ENV_CANARY_HEALTHY_RUNS_TO_RECOVER}: must be at least 1"
            )
        if self.failures_to_trip < 1:
            raise CanaryConfigError(f"{model.ENV_CANARY_FAILURES_TO_TRIP}: must be at least 1")
        if self.connect_host is not None and not _HOST_NAME.fullmatch(self.connect_host):
            raise CanaryConfigError(f"{model.ENV_CANARY_CONNECT_HOST}: not a host name")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CanaryConfig:
        """Read and validate the environment (see the module docstring)."""
        env = os.environ if env is None else env
        try:
            timeout = float(
                env.get(model.ENV_CANARY_TIMEOUT_SECONDS, "") or DEFAULT_TIMEOUT_SECONDS
            )
        except ValueError:
            raise CanaryConfigError(f"{model.ENV_CANARY_TIMEOUT_SECONDS}: not a number") from None

        def whole(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if raw and not raw.isdigit():
                raise CanaryConfigError(f"{name}: not a whole number")
            return int(raw) if raw else default

        transport = (
            env.get(model.ENV_CANARY_TOKEN_TRANSPORT, "").strip() or TokenTransport.SUBPROTOCOL
        )
        if transport not in tuple(TokenTransport):
            raise CanaryConfigError(
                f"{model.ENV_CANARY_TOKEN_TRANSPORT}: must be subprotocol or query"
            )
        accepted_text = env.get(model.ENV_JWT_CANARY_KEYS, "").strip()
        try:
            accepted = jwt.parse_key_material(accepted_text) if accepted_text else None
        except jwt.KeyMaterialError as exc:
            raise CanaryConfigError(f"{model.ENV_JWT_CANARY_KEYS}: {exc}") from None
        raw_disconnect = env.get(model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY, "").strip().lower()
        if raw_disconnect not in ("", "true", "false"):
            raise CanaryConfigError(f"{model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY}: true or false")
        return cls(
            endpoint_url=env.get(model.ENV_CANARY_ENDPOINT_URL, "").strip(),
            api_id=env.get(model.ENV_CANARY_API_ID, "").strip(),
            timeout_seconds=timeout,
            healthy_runs_to_recover=whole(
                model.ENV_CANARY_HEALTHY_RUNS_TO_RECOVER, DEFAULT_HEALTHY_RUNS_TO_RECOVER
            ),
            failures_to_trip=whole(model.ENV_CANARY_FAILURES_TO_TRIP, DEFAULT_FAILURES_TO_TRIP),
            state_table=env.get(model.ENV_CANARY_STATE_TABLE_NAME, "").strip() or None,
            token_transport=TokenTransport(transport),
            disconnect_when_unhealthy=raw_disconnect != "false",
            management_endpoint=env.get(model.ENV_CANARY_MANAGEMENT_ENDPOINT, "").strip() or None,
            alarm_name=env.get(model.ENV_CANARY_ALARM_NAME, "").strip() or None,
            connect_host=env.get(model.ENV_CANARY_CONNECT_HOST, "").strip() or None,
            accepted_keys=accepted,
        )

    def management_url(self) -> str:
        """Where ``DeleteConnection`` goes: the regional API's own https endpoint."""
        if self.management_endpoint is not None:
            return self.management_endpoint
        parts = urlsplit(self.endpoint_url)
        scheme = "https" if parts.scheme == "wss" else "http"
        return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


# --- Probe --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """One probe: healthy iff a pong came back in time."""

    healthy: bool
    latency_seconds: float
    error: str | None = None
    refused_status: int | None = None  # the HTTP status of a handshake the Region refused

    @property
    def credentials_refused(self) -> bool:
        """The handshake was refused as unauthenticated (401) or denied (403): what the
        authorizer answers to a token signed with a key it no longer accepts."""
        return self.refused_status in (401, 403)


async def probe(
    endpoint: Endpoint, *, timeout: float, connect_host: str | None = None
) -> ProbeResult:
    """Connect, send a heartbeat, wait for the pong; all within ``timeout`` seconds.

    ``connect_host``: open the connection to this host instead of the URL's, which still names
    the TLS server (SNI, certificate) and the HTTP ``Host``: a custom domain probed in one
    Region, whatever its name resolves to.

    Closing the connection afterwards is not part of the verdict: a pong that arrived in time
    is a healthy probe even if the close handshake is slow.
    """
    started = time.monotonic()

    def result(
        healthy: bool, error: str | None = None, refused_status: int | None = None
    ) -> ProbeResult:
        return ProbeResult(healthy, time.monotonic() - started, error, refused_status)

    url, subprotocols = endpoint.handshake()
    ws = None
    try:
        async with asyncio.timeout(timeout):
            ws = await connect(
                url,
                **({"host": connect_host} if connect_host else {}),
                subprotocols=subprotocols,
                open_timeout=None,  # the overall timeout bounds it
                ping_interval=None,
                close_timeout=max(0.05, timeout / 4),
                compression=None,
                proxy=None,
            )
            await ws.send(json.dumps({"action": model.WS_ROUTE_HEARTBEAT}))
            async for raw in ws:
                # Exactly the text frame "pong"; API Gateway's error frame does not count.
                if raw == model.WS_PONG_FRAME:
                    return result(True)
            return result(False, error="connection closed before the pong")
    except TimeoutError:
        return result(False, error=f"no pong within {timeout:g} s")
    except InvalidStatus as exc:
        status = exc.response.status_code
        return result(False, error=f"handshake refused with HTTP {status}", refused_status=status)
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
        """A token valid now (``None``: connect without one). Each run starts here."""

    async def refused(self) -> str | None:
        """The Region refused the last token: a token signed with another key not yet refused
        in this run (``None``: there is none)."""

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        """Every key it may sign with (none known: a static token)."""


# How long a warm canary signs with the key it read before reading the secret again.
KEY_REFRESH_SECONDS = 300.0
# A refused token reads the secret again at once, but not within this long of any read: a
# Region that refuses every handshake (a deleted API mapping answers 403 too) costs one read per
# run at most.
KEY_RELOAD_MIN_SECONDS = 30.0
# One read of the secret, at most: a slow Secrets Manager keeps the key held rather than delay
# the probe that judges the Region.
KEY_READ_TIMEOUT_SECONDS = 2.0


class CanaryFault(RuntimeError):
    """The canary could not probe for a reason of its own (its key, its secret): the Lambda
    invocation fails (the function's Errors alarm pages) and the Region is judged as before."""


@dataclass(frozen=True)
class StaticToken:
    """A fixed token (or none)."""

    value: str | None

    async def token(self) -> str | None:
        return self.value

    async def refused(self) -> str | None:
        return None

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return ()


@dataclass(frozen=True)
class MintedToken:
    """A short-lived token minted for every run with the canary's own signing key."""

    key: jwt.SigningKey
    audience: str
    subject: str = DEFAULT_SUBJECT
    lifetime_seconds: int = DEFAULT_TOKEN_LIFETIME_SECONDS
    issuer: str = model.CANARY_TOKEN_ISSUER

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

    async def refused(self) -> str | None:
        return None

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return (self.key,)


class SecretToken:
    """:class:`MintedToken` whose key is read from Secrets Manager, again once it is
    ``refresh_seconds`` old, and at once (at most every ``reload_min_seconds`` after any read)
    when a token is refused. Each read is bounded by ``read_timeout_seconds``; a read that
    fails or times out keeps the key held. It also keeps the key that signed before the secret
    changed: a token refused with one is tried with the other, and the accepted key signs until
    the secret changes again.

    So a rotation done in either order moves nothing: the authorizer enforcing the new key
    before a warm canary read it (the refusal reads the secret again), or the secret changed
    before the authorizer accepts the new key (the key before it still signs)."""

    def __init__(
        self,
        secrets: AsyncClient,
        secret_arn: str,
        *,
        audience: str,
        subject: str = DEFAULT_SUBJECT,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = KEY_REFRESH_SECONDS,
        reload_min_seconds: float = KEY_RELOAD_MIN_SECONDS,
        read_timeout_seconds: float = KEY_READ_TIMEOUT_SECONDS,
    ):
        self._secrets = secrets
        self._arn = secret_arn
        self._audience = audience
        self._subject = subject
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self._reload_min_seconds = reload_min_seconds
        self._read_timeout_seconds = read_timeout_seconds
        self._keys: list[MintedToken] = []  # the secret's key, then the one that signed before
        self._signing: MintedToken | None = None
        self._run_began_with: MintedToken | None = None
        self._refused: list[MintedToken] = []  # refused in this run
        self._secret_text: str | None = None
        self._refreshed_at = -math.inf  # the last scheduled read, done or failed
        self._read_at = -math.inf  # the last read of any kind, done or failed
        self.reads_on_refusal = 0  # reads a refused token asked for (tests and the drill)

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return tuple(minted.key for minted in self._keys)

    @property
    def signing_key(self) -> jwt.SigningKey | None:
        """The key the next token is signed with (``None``: none read yet)."""
        return None if self._signing is None else self._signing.key

    @property
    def secret_key(self) -> jwt.SigningKey | None:
        """The key the secret held when it was last read (``None``: never read)."""
        return self._keys[0].key if self._keys else None

    async def token(self) -> str | None:
        self._refused = []
        if self._signing is None or self._clock() - self._refreshed_at >= self._refresh_seconds:
            self._refreshed_at = self._clock()
            try:
                await self._read()
            except Exception as exc:  # TimeoutError included
                if self._signing is None:
                    raise
                self._warn(exc)  # the key read before still signs
        assert self._signing is not None
        self._run_began_with = self._signing
        return await self._signing.token()

    async def refused(self) -> str | None:
        if self._signing is None:
            return None
        self._refused.append(self._signing)
        if self._clock() - self._read_at >= self._reload_min_seconds:
            self.reads_on_refusal += 1
            try:
                await self._read()
            except Exception as exc:
                self._warn(exc)
        for key in self._keys:
            if all(key is not done for done in self._refused):
                self._signing = key
                return await key.token()
        # Nothing else to try: the next run starts from the key this one began with.
        self._signing = self._run_began_with
        return None

    async def _read(self) -> None:
        """Read the secret; a new key goes first and signs, the key that signed is kept."""
        self._read_at = self._clock()
        async with asyncio.timeout(self._read_timeout_seconds):
            secret = await self._secrets.call("get_secret_value", SecretId=self._arn)
        text = secret["SecretString"]
        if text == self._secret_text:
            return
        key = jwt.signing_key_from_text(text)
        self._secret_text = text
        current = self._keys[0] if self._keys else None
        if current is not None and jwt.same_key(key.public(), current.key.public()):
            return  # the same key written again (another encoding): nothing changes
        minted = MintedToken(key, self._audience, self._subject)
        before = self._signing if self._signing is not None else current
        self._keys = [minted, *([before] if before is not None else [])]
        self._signing = minted

    def _warn(self, exc: BaseException) -> None:
        log_event(
            logger,
            logging.WARNING,
            "canary_key",
            decision="error",
            detail="reading the secret failed, signing with the key read before: "
            f"{type(exc).__name__}: {exc}",
        )


def token_source_from_env(
    env: Mapping[str, str], secrets: AsyncClient | None = None
) -> TokenSource:
    """The token source the environment configures (see the module docstring)."""
    static = env.get(model.ENV_CANARY_TOKEN, "").strip()
    key_text = env.get(model.ENV_CANARY_SIGNING_KEY, "").strip()
    secret_arn = env.get(model.ENV_CANARY_SIGNING_KEY_SECRET_ARN, "").strip()
    if sum(bool(v) for v in (static, key_text, secret_arn)) > 1:
        raise CanaryConfigError(
            f"{model.ENV_CANARY_TOKEN}, {model.ENV_CANARY_SIGNING_KEY}, "
            f"{model.ENV_CANARY_SIGNING_KEY_SECRET_ARN}: set at most one"
        )
    if static:
        return StaticToken(static)
    if not key_text and not secret_arn:
        return StaticToken(None)
    audience = env.get(model.ENV_JWT_AUDIENCE, "").strip()
    if not audience:
        raise CanaryConfigError(f"{model.ENV_JWT_AUDIENCE}: required to mint the canary's token")
    subject = env.get(model.ENV_CANARY_SUBJECT, "").strip() or DEFAULT_SUBJECT
    if key_text:
        try:
            key = jwt.signing_key_from_text(key_text)
        except jwt.KeyMaterialError as exc:
            raise CanaryConfigError(f"CANARY_SIGNING_KEY: {exc}") from None
        return MintedToken(key, audience, subject)
    return SecretToken(
        secrets or AsyncClient("secretsmanager", CLIENT_SETTINGS),
        secret_arn,
        audience=audience,
        subject=subject,
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


# --- Publishing ---------------------------------------------------------------------------------


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


# --- Server-driven failover ---------------------------------------------------------------------


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: connections closed, already gone, failed; whether it ran out of time."""

    closed: int = 0
    gone: int = 0
    failed: int = 0
    incomplete: bool = False


class Disconnector(Protocol):
    """Closes every client connection of the region."""

    async def sweep(self) -> SweepResult:
        """Close what is open now."""


class ConnectionSweeper:
    """``DeleteConnection`` for every ``WSCONN#<id>`` record of the regional connections table.

    The connection ids come from the table the ``$connect`` handler writes (API Gateway has no
    "list connections" call). Each closed or already-gone connection's record is deleted, since
    the ``$disconnect`` handler may be throttled as well. At most ``concurrency`` calls are in
    flight; after ``budget_seconds`` no new one starts (the next run goes on).
    """

    def __init__(
        self,
        *,
        dynamodb: AsyncClient,
        management: AsyncClient,
        table_name: str,
        concurrency: int = DISCONNECT_CONCURRENCY,
        budget_seconds: float = DEFAULT_DISCONNECT_BUDGET_SECONDS,
    ):
        self._dynamodb = dynamodb
        self._management = management
        self._table = table_name
        self._concurrency = concurrency
        self._budget = budget_seconds

    async def connection_ids(self) -> list[str]:
        """Every client connection recorded now (a canary's own probes close themselves)."""
        ids: list[str] = []
        params: dict[str, Any] = {
            "TableName": self._table,
            "FilterExpression": (
                "begins_with(#pk, :prefix) AND NOT begins_with(#user_id, :canary)"
            ),
            "ProjectionExpression": "#pk",
            "ExpressionAttributeNames": names(model.PK, model.WS_USER_ID),
            "ExpressionAttributeValues": {
                ":prefix": to_attr(model.WS_CONNECTION_PREFIX),
                ":canary": to_attr(model.CANARY_PRINCIPAL_PREFIX),
            },
        }
        while True:
            page = await self._dynamodb.call("scan", **params)
            for item in page.get("Items", []):
                pk = item[model.PK]["S"]
                ids.append(pk[len(model.WS_CONNECTION_PREFIX) :])
            if "LastEvaluatedKey" not in page:
                return ids
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    async def sweep(self) -> SweepResult:
        deadline = time.monotonic() + self._budget
        ids = await self.connection_ids()
        counts = {"closed": 0, "gone": 0, "failed": 0}
        incomplete = False
        semaphore = asyncio.Semaphore(self._concurrency)

        async def close(connection_id: str) -> None:
            async with semaphore:
                if time.monotonic() > deadline:
                    nonlocal incomplete
                    incomplete = True
                    return
                try:
                    await self._management.call("delete_connection", ConnectionId=connection_id)
                    outcome = "closed"
                except Exception as exc:
                    if error_code(exc) != "GoneException":
                        counts["failed"] += 1
                        log_event(
                            logger,
                            logging.WARNING,
                            "canary_disconnect",
                            decision="error",
                            connectionId=connection_id,
                            detail=f"{type(exc).__name__}: {exc}",
                        )
                        return
                    outcome = "gone"
                counts[outcome] += 1
                try:
                    await self._dynamodb.call(
                        "delete_item",
                        TableName=self._table,
                        Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
                    )
                except Exception as exc:  # the next sweep finds it gone and tries again
                    log_event(
                        logger,
                        logging.WARNING,
                        "canary_disconnect",
                        decision="error",
                        reason="delete_record",
                        connectionId=connection_id,
                        detail=f"{type(exc).__name__}: {exc}",
                    )

        await asyncio.gather(*(close(connection_id) for connection_id in ids))
        return SweepResult(counts["closed"], counts["gone"], counts["failed"], incomplete)


# --- The canary ---------------------------------------------------------------------------------


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


# --- Lambda entry point -------------------------------------------------------------------------

_cached: tuple[tuple[str, ...], Canary] | None = None
_cached_lock = threading.Lock()
_ENV_NAMES = model.CANARY_ENV


def canary_from_env(env: Mapping[str, str] | None = None) -> Canary:
    """A canary wired to DynamoDB (if a state table is set) and CloudWatch."""
    env = os.environ if env is None else env
    config = CanaryConfig.from_env(env)
    store = None
    disconnector = None
    if config.state_table:
        dynamodb = AsyncClient("dynamodb", CLIENT_SETTINGS)
        store = DynamoHealthStateStore(
            dynamodb, table_name=config.state_table, api_id=config.api_id
        )
        if config.disconnect_when_unhealthy:
            disconnector = ConnectionSweeper(
                dynamodb=dynamodb,
                management=AsyncClient(
                    "apigatewaymanagementapi",
                    MANAGEMENT_CLIENT_SETTINGS,
                    endpoint_url=config.management_url(),
                ),
                table_name=config.state_table,
                budget_seconds=config.disconnect_budget_seconds,
            )
    cloudwatch = AsyncClient("cloudwatch", CLIENT_SETTINGS)
    return Canary(
        config,
        tokens=token_source_from_env(env),
        store=store,
        publishers=[CloudWatchPublisher(cloudwatch)],
        disconnector=disconnector,
        alarm=None
        if config.alarm_name is None
        else CloudWatchAlarmState(cloudwatch, config.alarm_name),
    )


def schedule_tick_ms(event: Mapping[str, Any]) -> int | None:
    """The schedule tick an EventBridge event names (``time``, ISO 8601 UTC), in epoch ms;
    ``None`` for an event without one (a manual invocation)."""
    raw = event.get("time") if isinstance(event, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        tick = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if tick.tzinfo is None:
        return None
    return int(tick.timestamp() * 1000)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (``streamfleet.wsapi.canary.handler``), one probe per invocation."""
    global _cached
    key = tuple(os.environ.get(name, "") for name in _ENV_NAMES)
    with _cached_lock:
        if _cached is None or _cached[0] != key:
            _cached = (key, canary_from_env())
        canary = _cached[1]
    run = asyncio.run(canary.run_once(schedule_tick_ms(event)))
    return {
        "healthy": run.probe.healthy,
        "value": run.value,
        "healthyStreak": run.state.healthy_streak,
        "tripped": run.state.tripped,
        "latencyMs": round(run.probe.latency_seconds * 1000, 1),
        "error": run.probe.error,
        "closedConnections": None if run.sweep is None else run.sweep.closed,
    }
