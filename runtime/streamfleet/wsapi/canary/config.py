"""The canary's settings, read from the environment (:class:`CanaryConfig`), and its defaults."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ... import model
from ...aws import ClientSettings
from ...env import ConfigError
from .. import jwt
from ..handshake import TokenTransport
from .sweeper import DEFAULT_DISCONNECT_BUDGET_SECONDS

DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_HEALTHY_RUNS_TO_RECOVER = 5
MINUTE_MS = 60_000  # the schedule's period and the alarm's
_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
DEFAULT_FAILURES_TO_TRIP = 2  # = the alarm's datapoints to alarm
CLIENT_SETTINGS = ClientSettings(threads=2)


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
            raise ConfigError(model.ENV_CANARY_ENDPOINT_URL, "must be a ws:// or wss:// URL")
        if self.management_endpoint is not None and not self.management_endpoint.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(model.ENV_CANARY_MANAGEMENT_ENDPOINT, "must be an http(s):// URL")
        if not self.api_id:
            raise ConfigError(model.ENV_CANARY_API_ID, "required")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise ConfigError(model.ENV_CANARY_TIMEOUT_SECONDS, "must be a number above zero")
        if self.healthy_runs_to_recover < 1:
            raise ConfigError(model.ENV_CANARY_HEALTHY_RUNS_TO_RECOVER, "must be at least 1")
        if self.failures_to_trip < 1:
            raise ConfigError(model.ENV_CANARY_FAILURES_TO_TRIP, "must be at least 1")
        if self.connect_host is not None and not _HOST_NAME.fullmatch(self.connect_host):
            raise ConfigError(model.ENV_CANARY_CONNECT_HOST, "not a host name")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CanaryConfig:
        """Read and validate the environment (see :mod:`streamfleet.wsapi.canary`)."""
        env = os.environ if env is None else env
        try:
            timeout = float(
                env.get(model.ENV_CANARY_TIMEOUT_SECONDS, "") or DEFAULT_TIMEOUT_SECONDS
            )
        except ValueError:
            raise ConfigError(model.ENV_CANARY_TIMEOUT_SECONDS, "not a number") from None

        def whole(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if raw and not raw.isdigit():
                raise ConfigError(name, "not a whole number")
            return int(raw) if raw else default

        transport = (
            env.get(model.ENV_CANARY_TOKEN_TRANSPORT, "").strip() or TokenTransport.SUBPROTOCOL
        )
        if transport not in tuple(TokenTransport):
            raise ConfigError(model.ENV_CANARY_TOKEN_TRANSPORT, "must be subprotocol or query")
        accepted_text = env.get(model.ENV_JWT_CANARY_KEYS, "").strip()
        try:
            accepted = jwt.parse_key_material(accepted_text) if accepted_text else None
        except jwt.KeyMaterialError as exc:
            raise ConfigError(model.ENV_JWT_CANARY_KEYS, str(exc)) from None
        raw_disconnect = env.get(model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY, "").strip().lower()
        if raw_disconnect not in ("", "true", "false"):
            raise ConfigError(model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY, "true or false")
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
