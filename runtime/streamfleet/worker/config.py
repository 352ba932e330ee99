"""Worker configuration from environment variables, validated once at start.

The variables: ``TABLE_NAME``, ``MESSAGES_TABLE_NAME``, ``QUEUE_URL``, ``WORKER_ID``,
``LEASE_SECONDS``, ``HEARTBEAT_EVERY``, ``RECONCILE_EVERY``, ``MAX_CONNECTIONS``; seconds may be
fractional. A bad value stops the worker before it touches anything, with the variable's name.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import buffering, model
from ..lease import LeaseTiming
from ..validation import (
    check_id,
    check_positive_int,
    check_positive_seconds,
    check_service_name,
)
from .upstream_policy import UpstreamPolicy


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a number") from None
    return check_positive_seconds(name, value)


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a whole number") from None
    return check_positive_int(name, value)


def _message_bytes(env: Mapping[str, str]) -> int:
    value = _whole(env, "MAX_MESSAGE_BYTES", buffering.DEFAULT_MAX_MESSAGE_BYTES)
    if value > model.MAX_UPSTREAM_MESSAGE_BYTES:
        raise ValueError(
            f"MAX_MESSAGE_BYTES: at most {model.MAX_UPSTREAM_MESSAGE_BYTES} (a stored message is "
            "one DynamoDB item of at most 400 KB)"
        )
    return value


def _port(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or not 0 <= int(raw) <= 65535:
        raise ValueError(f"{name}: {raw!r} is not a TCP port (0..65535, 0: any free one)")
    return int(raw)


# LeaseTiming names its fields; the operator set environment variables.
_TIMING_VARIABLES = {
    "lease_seconds": "LEASE_SECONDS",
    "heartbeat_seconds": "HEARTBEAT_EVERY",
    "max_clock_skew_seconds": "MAX_CLOCK_SKEW_SECONDS",
    "safety_margin_seconds": "SAFETY_MARGIN_SECONDS",
}


def _timing(env: Mapping[str, str]) -> LeaseTiming:
    lease = _number(env, "LEASE_SECONDS", 20.0)
    heartbeat = _number(env, "HEARTBEAT_EVERY", 5.0)
    try:
        return LeaseTiming(
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            max_clock_skew_seconds=_number(env, "MAX_CLOCK_SKEW_SECONDS", min(1.0, lease / 8)),
            safety_margin_seconds=_number(env, "SAFETY_MARGIN_SECONDS", min(0.5, lease / 8)),
        )
    except ValueError as exc:
        message = str(exc)
        for field_name, variable in _TIMING_VARIABLES.items():
            message = message.replace(field_name, variable)
        raise ValueError(message) from None


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ValueError(f"{name}: required but not set")
    return value


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs to know, immutable once read."""

    table_name: str
    messages_table_name: str
    queue_url: str
    upstreams: UpstreamPolicy
    worker_id: str = field(default_factory=lambda: f"worker-{uuid.uuid4().hex[:12]}")
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    reconcile_every: float = 10.0
    stop_check_every: float = 5.0
    max_connections: int = 700
    service_name: str = model.DEFAULT_WORKER_SERVICE_NAME
    session_group: str = model.DEFAULT_SESSION_GROUP
    region: str = ""
    # None: no health endpoint; 0: a port the system picks, reported in the health_listening log
    health_port: int | None = None
    metrics_every: float = 60.0
    sqs_wait_seconds: int = 10
    # Rare on purpose: a new owner resumes from what is stored past the checkpoint (one query),
    # so a checkpoint only bounds that query; it costs one write per connection each time.
    checkpoint_every: float = 300.0
    message_retention_seconds: int = model.DEFAULT_MESSAGE_RETENTION_DAYS * 86400
    flush_every: float = 0.05
    max_message_bytes: int = buffering.DEFAULT_MAX_MESSAGE_BYTES
    max_buffered_messages: int = 1000
    max_buffered_bytes: int = buffering.DEFAULT_MAX_BUFFERED_BYTES  # per connection, unstored
    max_worker_buffered_bytes: int = buffering.DEFAULT_MAX_WORKER_BUFFERED_BYTES
    memory_limit_mib: int = 0  # the task's memory (0: unknown, not checked)
    reconnect_base_seconds: float = 0.2
    reconnect_cap_seconds: float = 10.0
    rebalance_every: float = 30.0
    rebalance_hold_seconds: float = 60.0
    rebalance_max_per_interval: int = 50
    rebalance_tolerance: float = 0.2
    task_arn: str = ""  # the ECS task running this worker (ecs_metadata.py), "" outside ECS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        """Read and validate the environment. ``ValueError`` names the first bad variable."""
        env = os.environ if env is None else env
        timing = _timing(env)
        worker_id = env.get("WORKER_ID") or f"worker-{uuid.uuid4().hex[:12]}"
        health_port = _port(env, "HEALTH_PORT")
        sqs_wait = _whole(env, "SQS_WAIT_SECONDS", 10)
        if sqs_wait > 20:
            raise ValueError("SQS_WAIT_SECONDS: SQS allows at most 20")
        tolerance = _number(env, "REBALANCE_TOLERANCE", 0.2)
        max_connections = _whole(env, "MAX_CONNECTIONS", 700)
        max_message_bytes = _message_bytes(env)
        max_worker_buffered_bytes = _whole(
            env, "MAX_WORKER_BUFFERED_BYTES", buffering.DEFAULT_MAX_WORKER_BUFFERED_BYTES
        )
        memory_limit_mib = _whole(env, model.ENV_MEMORY_LIMIT_MIB, 0)  # unset: not checked
        if memory_limit_mib:
            buffering.check_fits_memory(
                memory_limit_mib=memory_limit_mib,
                max_connections=max_connections,
                max_message_bytes=max_message_bytes,
                max_worker_buffered_bytes=max_worker_buffered_bytes,
                fields="MAX_CONNECTIONS, MAX_MESSAGE_BYTES, MAX_WORKER_BUFFERED_BYTES",
            )
        return cls(
            table_name=_required(env, model.ENV_TABLE_NAME),
            messages_table_name=_required(env, model.ENV_MESSAGES_TABLE_NAME),
            queue_url=_required(env, model.ENV_QUEUE_URL),
            upstreams=UpstreamPolicy.parse(
                model.ENV_ALLOWED_UPSTREAMS, _required(env, model.ENV_ALLOWED_UPSTREAMS)
            ),
            worker_id=check_id("WORKER_ID", worker_id),
            timing=timing,
            reconcile_every=_number(env, "RECONCILE_EVERY", 10.0),
            stop_check_every=_number(env, "STOP_CHECK_EVERY", timing.heartbeat_seconds),
            max_connections=max_connections,
            service_name=check_service_name(
                model.ENV_SERVICE_NAME,
                env.get(model.ENV_SERVICE_NAME) or model.DEFAULT_WORKER_SERVICE_NAME,
            ),
            session_group=check_id(
                "SESSION_GROUP", env.get("SESSION_GROUP") or model.DEFAULT_SESSION_GROUP
            ),
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "",
            health_port=health_port,
            metrics_every=_number(env, "METRICS_EVERY", 60.0),
            sqs_wait_seconds=sqs_wait,
            checkpoint_every=_number(env, "CHECKPOINT_EVERY", 300.0),
            message_retention_seconds=round(
                _number(env, model.ENV_MESSAGE_RETENTION_DAYS, model.DEFAULT_MESSAGE_RETENTION_DAYS)
                * 86400
            ),
            flush_every=_number(env, "FLUSH_EVERY", 0.05),
            max_message_bytes=max_message_bytes,
            max_buffered_messages=_whole(env, "MAX_BUFFERED_MESSAGES", 1000),
            max_buffered_bytes=_whole(
                env, "MAX_BUFFERED_BYTES", buffering.DEFAULT_MAX_BUFFERED_BYTES
            ),
            max_worker_buffered_bytes=max_worker_buffered_bytes,
            memory_limit_mib=memory_limit_mib,
            reconnect_base_seconds=_number(env, "RECONNECT_BASE_SECONDS", 0.2),
            reconnect_cap_seconds=_number(env, "RECONNECT_CAP_SECONDS", 10.0),
            rebalance_every=_number(env, "REBALANCE_EVERY", 30.0),
            rebalance_hold_seconds=_number(env, "REBALANCE_HOLD_SECONDS", 60.0),
            rebalance_max_per_interval=_whole(env, "REBALANCE_MAX_PER_INTERVAL", 50),
            rebalance_tolerance=tolerance,
        )
