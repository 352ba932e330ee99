"""The handlers' settings: what they read from the environment (:class:`HandlerConfig`, live
delivery's :class:`LiveTables`), the bounds a deployment may set, and their AWS clients."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

from ... import model
from ...env import ConfigError, required

DEFAULT_CONNECTION_TTL_SECONDS = model.WS_MAX_CONNECTION_SECONDS + 10 * 60
DEFAULT_SUBSCRIBE_NEWEST = 50
DEFAULT_REPLAY_MAX_MESSAGES = 2000
MAX_REPLAY_MESSAGES = 10_000
# The most a deployment may allow per stream and Region (one consistent query counts them).
MAX_SUBSCRIBERS_PER_STREAM = 10_000
MAX_USER_CONNECTIONS_PER_STREAM = 100


# Lambda runs one invocation at a time per container; a few connections are plenty. botocore
# retries throttling a little (standard mode); a reply that cannot be delivered fast is useless.
BOTO_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=3.0,
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=16,
)


@dataclass(frozen=True)
class HandlerConfig:
    """The handlers' settings, immutable once read."""

    state_table: str
    connections_table: str
    region: str
    management_endpoint: str | None = None
    connection_ttl_seconds: int = DEFAULT_CONNECTION_TTL_SECONDS
    max_message_bytes: int = model.WS_MAX_FRAME_BYTES
    live: LiveTables | None = None  # None: subscribe answers not_supported

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HandlerConfig:
        """Read and validate the environment (see :mod:`streamfleet.wsapi.handlers`)."""
        env = os.environ if env is None else env

        def whole(name: str, default: int, maximum: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            if not raw.isdigit() or not 0 < int(raw) <= maximum:
                raise ConfigError(name, f"{raw!r} is not a whole number 1 to {maximum}")
            return int(raw)

        ttl = whole(model.ENV_CONNECTION_TTL_SECONDS, DEFAULT_CONNECTION_TTL_SECONDS, 10**9)
        live_names = (
            model.ENV_STREAMS_TABLE_NAME,
            model.ENV_MESSAGES_TABLE_NAME,
            model.ENV_SUBSCRIPTIONS_TABLE_NAME,
        )
        given = [name for name in live_names if env.get(name, "").strip()]
        live = None
        if given:
            missing = [name for name in live_names if name not in given]
            if missing:
                raise ConfigError(
                    missing[0],
                    f"required with {given[0]} (live delivery needs all of "
                    f"{', '.join(live_names)})",
                )
            replay_max = whole(
                model.ENV_REPLAY_MAX_MESSAGES, DEFAULT_REPLAY_MAX_MESSAGES, MAX_REPLAY_MESSAGES
            )
            live = LiveTables(
                streams_table=required(env, model.ENV_STREAMS_TABLE_NAME),
                messages_table=required(env, model.ENV_MESSAGES_TABLE_NAME),
                subscriptions_table=required(env, model.ENV_SUBSCRIPTIONS_TABLE_NAME),
                newest=whole(
                    model.ENV_SUBSCRIBE_NEWEST_MESSAGES,
                    min(DEFAULT_SUBSCRIBE_NEWEST, replay_max),
                    1000,
                ),
                replay_max=replay_max,
                max_subscribers=whole(
                    model.ENV_MAX_SUBSCRIBERS_PER_STREAM,
                    model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM,
                    MAX_SUBSCRIBERS_PER_STREAM,
                ),
                max_user_connections=whole(
                    model.ENV_MAX_USER_CONNECTIONS_PER_STREAM,
                    model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM,
                    MAX_USER_CONNECTIONS_PER_STREAM,
                ),
            )
        return cls(
            state_table=required(env, model.ENV_STATE_TABLE_NAME),
            connections_table=required(env, model.ENV_CONNECTIONS_TABLE_NAME),
            region=required(env, "AWS_REGION"),
            management_endpoint=env.get(model.ENV_APIGW_MANAGEMENT_ENDPOINT, "").strip() or None,
            connection_ttl_seconds=ttl,
            live=live,
        )


@dataclass(frozen=True)
class LiveTables:
    """Where live delivery reads and writes: the fleet's lease table (a stream's readers and
    origin), its messages table (this Region's replica) and this Region's subscribers."""

    streams_table: str
    messages_table: str
    subscriptions_table: str
    newest: int = DEFAULT_SUBSCRIBE_NEWEST
    replay_max: int = DEFAULT_REPLAY_MAX_MESSAGES
    max_subscribers: int = model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM
    max_user_connections: int = model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM

    def __post_init__(self) -> None:
        if not 1 <= self.newest <= self.replay_max:
            raise ConfigError(
                model.ENV_SUBSCRIBE_NEWEST_MESSAGES,
                f"must be from 1 to {model.ENV_REPLAY_MAX_MESSAGES} ({self.replay_max})",
            )


def make_dynamodb_client(region: str | None = None, *, config: Config = BOTO_CONFIG) -> Any:
    """A boto3 DynamoDB client with short timeouts (endpoint from ``AWS_ENDPOINT_URL*``);
    ``config``: another budget (a client that calls across Regions has a shorter one)."""
    return boto3.session.Session().client("dynamodb", region_name=region, config=config)
