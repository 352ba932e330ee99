"""Deployment settings, read once from CDK context and validated before any construct exists.

Every setting has a context key (``streamfleet:<field>``), set in ``cdk.json`` or on the command
line (``cdk synth -c streamfleet:secondary_region=eu-west-1``). A bad value fails synth with a
``ValueError`` whose message starts with that key, instead of surfacing later as a CloudFormation
error about a Region or a table that does not exist.

``streamfleet:account`` is normally left unset: the CLI then supplies ``CDK_DEFAULT_ACCOUNT``
from the ambient credentials, and without credentials a placeholder account is used so that
``cdk synth`` (and the tests) work anywhere. Nothing can be deployed to the placeholder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from aws_cdk import aws_logs as logs
from constructs import Node

from streamfleet import model
from streamfleet.lease.timing import LeaseTiming
from streamfleet.worker.fleet import SHUTDOWN_BUDGET_SECONDS
from streamfleet_cdk.upstreams import SEPARATOR, check_allowed_upstreams
from streamfleet_cdk.worker_fleet import FARGATE_MEMORY, MAX_STOP_TIMEOUT_SECONDS

CONTEXT_PREFIX = "streamfleet:"

PLACEHOLDER_ACCOUNT = "111111111111"
DEFAULT_PRIMARY_REGION = "us-east-1"
DEFAULT_SECONDARY_REGION = "us-west-2"

ACCOUNT_PATTERN = re.compile(r"\d{12}")
REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
# DynamoDB's own rule for table names.
TABLE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{3,255}")

# Synth works out of the box; a real deployment names its upstreams (cdk.json or -c).
DEFAULT_ALLOWED_UPSTREAMS = ("wss://*.example.com",)

# DynamoDB multi-Region strong consistency: all Regions (replicas and witness) in one set.
MRSC_REGION_SETS = (
    frozenset({"us-east-1", "us-east-2", "us-west-2"}),
    frozenset({"eu-west-1", "eu-west-2", "eu-west-3", "eu-central-1"}),
    frozenset({"ap-northeast-1", "ap-northeast-2", "ap-northeast-3"}),
)

# CloudWatch Logs' retention values, in days (CDK's enum has names, not numbers).
LOG_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS,
    2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}

_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})


def context_key(field_name: str) -> str:
    """The CDK context key of an :class:`AppConfig` field: ``streamfleet:<field>``."""
    return f"{CONTEXT_PREFIX}{field_name}"


def _default_account(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("CDK_DEFAULT_ACCOUNT") or PLACEHOLDER_ACCOUNT


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """Where and how the fleet is deployed.

    Attributes:
        account: the AWS account of both stacks (one account, two Regions).
        primary_region: Region whose stack declares the global tables.
        secondary_region: Region of the replica and of the standby stack.
        deletion_protection: DynamoDB deletion protection on both tables and every replica.
        lease_table_name: physical name of the lease table, shared by both Regions.
        messages_table_name: physical name of the messages table, shared by both Regions.
        allowed_upstreams: ``scheme://host[:port]`` entries the router accepts and the workers
            dial (``*.`` prefixes a domain wildcard); a JSON list, or a comma-separated string
            on the command line.
        worker_cpu: Fargate CPU units per worker task.
        worker_memory_mib: memory per worker task (a valid Fargate pairing with the CPU).
        min_tasks: fewest worker tasks in an active Region.
        max_tasks: most worker tasks in a Region.
        target_connections_per_task: average ``ActiveConnections`` per task auto scaling holds.
        scale_out_cooldown_seconds: wait after a scale-out before the next one.
        scale_in_cooldown_seconds: wait after a scale-in before the next one.
        max_connections: connections one worker holds at most (``MAX_CONNECTIONS``).
        lease_seconds: ``LEASE_SECONDS`` of the workers.
        heartbeat_seconds: ``HEARTBEAT_EVERY`` of the workers.
        reconcile_seconds: ``RECONCILE_EVERY`` of the workers.
        stop_timeout_seconds: SIGTERM to SIGKILL for a worker task (its handoff window).
        api_rate_limit: the events API's steady-state requests per second, per Region.
        api_burst_limit: the events API's burst, per Region.
        log_retention_days: retention of every log group (a CloudWatch Logs retention value).
        secondary_active: run workers in the secondary Region too. Off, the secondary fleet is
            a standby scaled to zero (min capacity 0): under eventually consistent tables only
            one Region may claim leases. Turn on for a failover, or with strong consistency.
        multi_region_strong_consistency: declare the lease table with DynamoDB multi-Region
            strong consistency, so both Regions' fleets may claim leases safely. Needs
            ``witness_region``, and all three Regions in one MRSC Region set.
        witness_region: the MRSC witness Region.
    """

    account: str = field(default_factory=_default_account)
    primary_region: str = DEFAULT_PRIMARY_REGION
    secondary_region: str = DEFAULT_SECONDARY_REGION
    deletion_protection: bool = True
    lease_table_name: str = model.DEFAULT_LEASE_TABLE_NAME
    messages_table_name: str = model.DEFAULT_MESSAGES_TABLE_NAME
    allowed_upstreams: tuple[str, ...] = DEFAULT_ALLOWED_UPSTREAMS
    worker_cpu: int = 512
    worker_memory_mib: int = 1024
    min_tasks: int = 1
    max_tasks: int = 10
    target_connections_per_task: int = 700
    scale_out_cooldown_seconds: int = 120
    scale_in_cooldown_seconds: int = 900
    max_connections: int = 1000
    lease_seconds: float = 20.0
    heartbeat_seconds: float = 5.0
    reconcile_seconds: float = 10.0
    stop_timeout_seconds: int = 30
    api_rate_limit: float = 50.0
    api_burst_limit: int = 100
    log_retention_days: int = 30
    secondary_active: bool = False
    multi_region_strong_consistency: bool = False
    witness_region: str | None = None

    def __post_init__(self) -> None:
        self._check_placement()
        self._check_fleet()
        self._check_timing()
        self._check_consistency()

    def _check_placement(self) -> None:
        _check_pattern("account", self.account, ACCOUNT_PATTERN, "12 digits")
        for name in ("primary_region", "secondary_region"):
            _check_pattern(name, getattr(self, name), REGION_PATTERN, "a Region like us-east-1")
        if self.primary_region == self.secondary_region:
            raise ValueError(
                f"{context_key('secondary_region')}: must differ from "
                f"{context_key('primary_region')} ({self.primary_region})"
            )
        if not isinstance(self.deletion_protection, bool):
            raise ValueError(f"{context_key('deletion_protection')}: expected true or false")
        for name in ("lease_table_name", "messages_table_name"):
            _check_pattern(
                name, getattr(self, name), TABLE_NAME_PATTERN, "3-255 of A-Z a-z 0-9 _ . -"
            )
        if self.lease_table_name == self.messages_table_name:
            raise ValueError(
                f"{context_key('messages_table_name')}: must differ from "
                f"{context_key('lease_table_name')} ({self.lease_table_name})"
            )
        for name in ("secondary_active", "multi_region_strong_consistency"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{context_key(name)}: expected true or false")

    def _check_fleet(self) -> None:
        with _naming_context_key("allowed_upstreams"):
            check_allowed_upstreams("allowed_upstreams", self.allowed_upstreams)
        _check_number("worker_cpu", self.worker_cpu, whole=True, minimum=1)
        if self.worker_cpu not in FARGATE_MEMORY:
            raise ValueError(
                f"{context_key('worker_cpu')}: expected one of {sorted(FARGATE_MEMORY)}, "
                f"got {self.worker_cpu}"
            )
        memory = FARGATE_MEMORY[self.worker_cpu]
        _check_number("worker_memory_mib", self.worker_memory_mib, whole=True, minimum=1)
        if self.worker_memory_mib not in memory:
            raise ValueError(
                f"{context_key('worker_memory_mib')}: {self.worker_memory_mib} is not valid with "
                f"{context_key('worker_cpu')} {self.worker_cpu} (Fargate allows "
                f"{memory.start}-{memory.stop - 1} in steps of {memory.step})"
            )
        _check_number("min_tasks", self.min_tasks, whole=True, minimum=1)
        _check_number("max_tasks", self.max_tasks, whole=True, minimum=self.min_tasks)
        _check_number("target_connections_per_task", self.target_connections_per_task, whole=True)
        _check_number(
            "max_connections",
            self.max_connections,
            whole=True,
            minimum=self.target_connections_per_task,
        )
        _check_number("scale_out_cooldown_seconds", self.scale_out_cooldown_seconds, whole=True)
        _check_number("scale_in_cooldown_seconds", self.scale_in_cooldown_seconds, whole=True)
        _check_number("api_rate_limit", self.api_rate_limit, minimum=1)
        _check_number("api_burst_limit", self.api_burst_limit, whole=True)
        _check_number("log_retention_days", self.log_retention_days, whole=True)
        if self.log_retention_days not in LOG_RETENTION:
            allowed = ", ".join(str(days) for days in LOG_RETENTION)
            raise ValueError(
                f"{context_key('log_retention_days')}: expected one of {allowed}, "
                f"got {self.log_retention_days}"
            )

    def _check_timing(self) -> None:
        for name in ("lease_seconds", "heartbeat_seconds", "reconcile_seconds"):
            _check_number(name, getattr(self, name), minimum=0.001)
        # The worker's own rule, with the skew and margin it derives from the lease by default.
        with _naming_context_key("lease_seconds"):
            LeaseTiming(
                lease_seconds=self.lease_seconds,
                heartbeat_seconds=self.heartbeat_seconds,
                max_clock_skew_seconds=min(1.0, self.lease_seconds / 8),
                safety_margin_seconds=min(0.5, self.lease_seconds / 8),
            )
        _check_number("stop_timeout_seconds", self.stop_timeout_seconds, whole=True)
        if not SHUTDOWN_BUDGET_SECONDS < self.stop_timeout_seconds <= MAX_STOP_TIMEOUT_SECONDS:
            raise ValueError(
                f"{context_key('stop_timeout_seconds')}: must exceed the worker's "
                f"{SHUTDOWN_BUDGET_SECONDS:g} s shutdown budget and be at most "
                f"{MAX_STOP_TIMEOUT_SECONDS}, got {self.stop_timeout_seconds}"
            )

    def _check_consistency(self) -> None:
        key = context_key("witness_region")
        if not self.multi_region_strong_consistency:
            if self.witness_region is not None:
                raise ValueError(
                    f"{key}: only used with {context_key('multi_region_strong_consistency')}"
                )
            return
        if self.witness_region is None:
            raise ValueError(
                f"{key}: required with {context_key('multi_region_strong_consistency')} "
                "(two replicas and a witness)"
            )
        _check_pattern("witness_region", self.witness_region, REGION_PATTERN, "a Region")
        regions = (self.primary_region, self.secondary_region, self.witness_region)
        if len(set(regions)) != len(regions):
            raise ValueError(f"{key}: must differ from the primary and the secondary Region")
        if not any(set(regions) <= region_set for region_set in MRSC_REGION_SETS):
            sets = "; ".join(", ".join(sorted(region_set)) for region_set in MRSC_REGION_SETS)
            raise ValueError(
                f"{context_key('multi_region_strong_consistency')}: the primary, secondary and "
                f"witness Regions {regions} must all be in one Region set ({sets})"
            )

    @property
    def log_retention(self) -> logs.RetentionDays:
        """:attr:`log_retention_days` as CDK's enum."""
        return LOG_RETENTION[self.log_retention_days]

    @property
    def replica_regions(self) -> tuple[str, ...]:
        """Regions that hold a replica of the tables declared in the primary Region."""
        return (self.secondary_region,)

    @classmethod
    def from_context(cls, app_node: Node, *, environ: Mapping[str, str] | None = None) -> AppConfig:
        """Read every ``streamfleet:<field>`` context key; unset (or null) keys keep defaults.

        ``environ`` (default :data:`os.environ`) supplies ``CDK_DEFAULT_ACCOUNT`` when
        ``streamfleet:account`` is unset. Values given with ``-c`` arrive as strings, values
        from ``cdk.json`` as JSON types; booleans accept both (``true``/``false``).
        """
        types = get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            raw = app_node.try_get_context(context_key(spec.name))
            if raw is None:
                continue
            parse = _PARSERS.get(types[spec.name], _require_str)
            values[spec.name] = parse(spec.name, raw)
        if "account" not in values:
            values["account"] = _default_account(os.environ if environ is None else environ)
        return cls(**values)


@contextmanager
def _naming_context_key(field_name: str) -> Iterator[None]:
    """Turn a construct-level ``ValueError("<field>: ...")`` into one naming the context key:
    ``<field>``'s if it is a setting, else ``field_name``'s."""
    try:
        yield
    except ValueError as exc:
        field, separator, message = str(exc).partition(": ")
        if separator and field in _FIELD_NAMES:
            raise ValueError(f"{context_key(field)}: {message}") from None
        raise ValueError(f"{context_key(field_name)}: {exc}") from None


def _check_number(name: str, value: object, *, whole: bool = False, minimum: float = 0) -> None:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "a whole number" if whole else "a number"
        raise ValueError(f"{context_key(name)}: expected {expected}, got {value!r}")
    if not value >= minimum:  # also refuses NaN
        raise ValueError(f"{context_key(name)}: expected at least {minimum:g}, got {value}")


def _parse_int(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{context_key(name)}: expected a whole number, got {value!r}")


def _parse_float(name: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"{context_key(name)}: expected a number, got {value!r}")


def _parse_str_tuple(name: str, value: object) -> tuple[str, ...]:
    """A JSON list of strings (cdk.json), or one comma-separated string (``-c``)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(SEPARATOR) if part.strip())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ValueError(f"{context_key(name)}: expected a list of strings, got {value!r}")


def _require_str(name: str, value: object) -> str:
    # A number in cdk.json would lose an account's leading zeros: insist on a string.
    if not isinstance(value, str):
        raise ValueError(f"{context_key(name)}: expected a string, got {type(value).__name__}")
    return value


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"{context_key(name)}: expected true or false, got {value!r}")


def _check_pattern(name: str, value: object, pattern: re.Pattern[str], expected: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{context_key(name)}: expected {expected}, got {value!r}")


_PARSERS: dict[Any, Any] = {
    bool: _parse_bool,
    int: _parse_int,
    float: _parse_float,
    tuple[str, ...]: _parse_str_tuple,
}
_FIELD_NAMES = frozenset(spec.name for spec in fields(AppConfig))
