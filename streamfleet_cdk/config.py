"""Deployment settings, read once from CDK context and validated before any construct exists.

Every setting has a context key (``streamfleet:<field>``), set in ``cdk.json`` or on the command
line (``cdk synth -c streamfleet:secondary_region=eu-west-1``). A bad value fails synth with a
:class:`ContextError` whose message starts with that key (``app.py`` prints it as one line and
exits 1), instead of surfacing later as a CloudFormation
error about a Region or a table that does not exist.

``streamfleet:account`` is normally left unset: the stacks are then *account-agnostic* (their
Region is fixed, their account is ``AWS::AccountId``), so ``cdk synth`` needs no credentials and
writes the same templates on every machine, and ``cdk deploy`` deploys them into the account of
the credentials it runs with. Nothing is ever synthesized for a made-up account, so a
synth-once-deploy-later pipeline cannot deploy one. Set it to pin both stacks to one account:
the CDK CLI then refuses to deploy them with another account's credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from aws_cdk import aws_logs as logs
from constructs import Node

from streamfleet import model
from streamfleet.lease.timing import LeaseTiming
from streamfleet.readers import check_claim_name
from streamfleet.validation import REGION_PATTERN
from streamfleet.worker.fleet import SHUTDOWN_BUDGET_SECONDS
from streamfleet_cdk.alarms import EMAIL_PATTERN
from streamfleet_cdk.event_ingestion import check_invoke_principals
from streamfleet_cdk.functions import DEFAULT_LOG_LEVEL, check_log_level
from streamfleet_cdk.task_events import (
    DEFAULT_RESERVED_CONCURRENCY as TASK_STOPPED_RESERVED_CONCURRENCY,
)
from streamfleet_cdk.upstreams import SEPARATOR, check_allowed_upstreams
from streamfleet_cdk.websocket_api import check_public_keys
from streamfleet_cdk.worker_fleet import FARGATE_MEMORY, MAX_STOP_TIMEOUT_SECONDS, VPC_AZS

CONTEXT_PREFIX = "streamfleet:"


class ContextError(ValueError):
    """A context setting is missing or wrong; the message starts with its key."""


DEFAULT_PRIMARY_REGION = "us-east-1"
DEFAULT_SECONDARY_REGION = "us-west-2"

ACCOUNT_PATTERN = re.compile(r"\d{12}")
# DynamoDB's own rule for table names.
TABLE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{3,255}")

# Synth works out of the box; a real deployment names its upstreams (cdk.json or -c).
DEFAULT_ALLOWED_UPSTREAMS = ("wss://*.example.com",)

# The WebSocket API's token settings: placeholders, so that synth works out of the box; a real
# deployment names its identity provider (cdk.json or -c), and the stacks warn until it does.
DEFAULT_JWT_ISSUER = "https://issuer.example.com/"
DEFAULT_JWT_AUDIENCE = "streamfleet"
DEFAULT_JWT_JWKS_URL = "https://issuer.example.com/.well-known/jwks.json"
CANARY_TOKEN_TRANSPORTS = ("subprotocol", "query")  # streamfleet.wsapi.handshake.TokenTransport

# The custom domain and its failover DNS: all of these, or none.
WS_DOMAIN_SETTINGS = (
    "ws_domain_name",
    "hosted_zone_id",
    "hosted_zone_name",
    "ws_certificate_arn_primary",
    "ws_certificate_arn_secondary",
)
DOMAIN_NAME_PATTERN = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
HOSTED_ZONE_ID_PATTERN = re.compile(r"Z[A-Z0-9]{1,31}")
CERTIFICATE_ARN_PATTERN = re.compile(
    r"arn:aws[a-z-]*:acm:(?P<region>[a-z0-9-]+):\d{12}:certificate/[A-Za-z0-9-]+"
)
SECRET_NAME_PATTERN = re.compile(r"[A-Za-z0-9/_+=.@-]{1,512}")

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
# A reserved-concurrency key set to this leaves the function in the account's unreserved pool.
UNRESERVED = "none"
RESERVED_CONCURRENCY_SETTINGS = (
    "router_reserved_concurrency",
    "ws_handler_reserved_concurrency",
    "authorizer_reserved_concurrency",
    "canary_reserved_concurrency",
    "task_stopped_reserved_concurrency",
    "fanout_reserved_concurrency",
)


def context_key(field_name: str) -> str:
    """The CDK context key of an :class:`AppConfig` field: ``streamfleet:<field>``."""
    return f"{CONTEXT_PREFIX}{field_name}"


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """Where and how the fleet is deployed.

    Attributes:
        account: the AWS account of every stack (one account, two Regions); ``None`` (the
            default): account-agnostic stacks, deployed into the deploying credentials' account.
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
        ws_domain_name: the WebSocket API's client-facing name, served by the primary Region
            while its canary is healthy, by the secondary otherwise (Route 53 failover records).
            Needs every setting of :data:`WS_DOMAIN_SETTINGS`; without any of them the APIs
            have only their regional URLs, and no failover.
        hosted_zone_id: the public hosted zone that holds ``ws_domain_name``.
        hosted_zone_name: that zone's name (``ws_domain_name`` ends with it).
        ws_certificate_arn_primary: ACM certificate for ``ws_domain_name`` in the primary Region.
        ws_certificate_arn_secondary: the same, in the secondary Region.
        jwt_issuer: ``iss`` the WebSocket authorizer accepts.
        jwt_audience: ``aud`` the WebSocket authorizer accepts.
        jwt_jwks_url: the issuer's JWKS (https), where the authorizer finds its keys.
        canary_signing_key_secret_name: Secrets Manager secret (a name, replicated to both
            Regions) with the private key the canaries mint their tokens with; required with a
            custom domain (a canary without a token always reports unhealthy).
        canary_public_keys: the public key(s) matching the canary's signing key (a JWKS
            document, a JWK or a PEM public key), given to the authorizer (``JWT_CANARY_KEYS``):
            the only keys that verify a canary token, which is allowed on ``heartbeat`` only.
            Required with ``canary_signing_key_secret_name``; never a shared secret.
        canary_token_transport: ``subprotocol`` or ``query``: how the canary sends its token.
        canary_healthy_runs_to_recover: consecutive healthy probes before a failed Region
            reports healthy again (fail-back is slower than failover).
        ws_api_rate_limit: the WebSocket stage's steady-state messages per second, per Region.
        ws_api_burst_limit: the WebSocket stage's burst, per Region.
        ws_state_table_name: physical name of the WebSocket API's state table (global).
        demo_auction: add the demo auction (examples/auction: the ``bid`` route, its part of
            ``getState``, ``STATE_HOME_REGION`` and its permissions) to both Regions' WebSocket
            handlers. Off: the core routes only.
        ws_state_home_region: the Region whose replica of the state table decides every bid
            of the demo auction (``STATE_HOME_REGION`` of both Regions' handlers): the primary
            (``None``) or the secondary. Moving it is a disaster-recovery step
            (docs/disaster-recovery.md). Only with ``demo_auction``.
        ws_connections_table_name: physical name of each Region's connections table.
        ws_subscriptions_table_name: physical name of each Region's subscriptions table (which
            client connection receives which ingested stream live).
        jwt_reader_claims: token claims the authorizer passes on as reader tags
            (``<claim>:<value>``), which a START's ``readers`` may name besides ``user:<sub>``.
        fanout_reserved_concurrency: reserved concurrency of each Region's stream fan-out.
        fanout_batching_window_seconds: how long the fan-out's event source may wait to fill
            a batch (0 to 300; Lambda takes whole seconds): fewer posts per delivered message
            on slow streams, each message later by up to that long. 0: every poll.
        max_subscribers_per_stream: subscribers of one stream per Region at most (1 to
            10,000): each costs the fan-out a post per message, and its batch waits for all.
        max_user_connections_per_stream: connections of one user subscribed to one stream at
            most (1 to 100).
        api_gateway_cloudwatch_role: create each Region's API Gateway CloudWatch role (the
            account setting every stage's logs go through) in that Region's fleet stack. Turn
            off where the account baseline sets it.
        invoke_principals: IAM role/user ARNs (``*`` allowed in the name), account root ARNs or
            account ids that may call the events API; empty: this account's principals, as
            their IAM policies allow.
        router_reserved_concurrency: reserved concurrency of the event router (``none``:
            unreserved).
        ws_handler_reserved_concurrency: reserved concurrency of the WebSocket handler.
        authorizer_reserved_concurrency: reserved concurrency of the WebSocket authorizer (a
            ``$connect`` flood is refused at this cap).
        canary_reserved_concurrency: reserved concurrency of the canary.
        task_stopped_handler: end a worker task's sessions as soon as ECS reports the task
            STOPPED (an EventBridge rule and a Lambda per Region), so its streams move in about
            a second instead of a lease. Off: crashes recover through the lease alone.
        task_stopped_reserved_concurrency: reserved concurrency of that Lambda.
        lambda_log_level: application log level of every function (JSON logs).
        alarm_email: an e-mail address subscribed to each Region's alarm topic (``None``: no
            subscription; subscribe anything else to the ``StreamFleet-Alarms`` topic).
        nat_gateways: NAT gateways of each Region's VPC, 1 to its AZ count (default: one per
            AZ, so one AZ's failure leaves the other's workers their outbound connections).
        message_retention_days: how long stored messages are kept (the workers'
            ``MESSAGE_RETENTION_DAYS``; the messages table's TTL deletes them after that).
    """

    account: str | None = None
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
    ws_domain_name: str | None = None
    hosted_zone_id: str | None = None
    hosted_zone_name: str | None = None
    ws_certificate_arn_primary: str | None = None
    ws_certificate_arn_secondary: str | None = None
    jwt_issuer: str = DEFAULT_JWT_ISSUER
    jwt_audience: str = DEFAULT_JWT_AUDIENCE
    jwt_jwks_url: str = DEFAULT_JWT_JWKS_URL
    canary_signing_key_secret_name: str | None = None
    canary_public_keys: str | None = None
    canary_token_transport: str = CANARY_TOKEN_TRANSPORTS[0]
    canary_healthy_runs_to_recover: int = 5
    ws_api_rate_limit: float = 500.0
    ws_api_burst_limit: int = 1000
    ws_state_table_name: str = model.DEFAULT_WSAPI_STATE_TABLE_NAME
    demo_auction: bool = True
    ws_state_home_region: str | None = None
    ws_connections_table_name: str = model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME
    ws_subscriptions_table_name: str = model.DEFAULT_WSAPI_SUBSCRIPTIONS_TABLE_NAME
    jwt_reader_claims: tuple[str, ...] = ()
    fanout_reserved_concurrency: int | None = 10
    fanout_batching_window_seconds: int = 0
    max_subscribers_per_stream: int = model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM
    max_user_connections_per_stream: int = model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM
    api_gateway_cloudwatch_role: bool = True
    invoke_principals: tuple[str, ...] = ()
    router_reserved_concurrency: int | None = 100
    ws_handler_reserved_concurrency: int | None = 200
    authorizer_reserved_concurrency: int | None = 100
    canary_reserved_concurrency: int | None = 2
    task_stopped_handler: bool = True
    task_stopped_reserved_concurrency: int | None = TASK_STOPPED_RESERVED_CONCURRENCY
    lambda_log_level: str = DEFAULT_LOG_LEVEL
    alarm_email: str | None = None
    nat_gateways: int = VPC_AZS
    message_retention_days: int = model.DEFAULT_MESSAGE_RETENTION_DAYS

    def __post_init__(self) -> None:
        self._check_placement()
        self._check_fleet()
        self._check_timing()
        self._check_consistency()
        self._check_websocket_api()
        self._check_websocket_domain()
        self._check_operations()

    def _check_placement(self) -> None:
        if self.account is not None:
            _check_pattern("account", self.account, ACCOUNT_PATTERN, "12 digits")
        for name in ("primary_region", "secondary_region"):
            _check_pattern(name, getattr(self, name), REGION_PATTERN, "a Region like us-east-1")
        if self.primary_region == self.secondary_region:
            raise ContextError(
                f"{context_key('secondary_region')}: must differ from "
                f"{context_key('primary_region')} ({self.primary_region})"
            )
        if not isinstance(self.deletion_protection, bool):
            raise ContextError(f"{context_key('deletion_protection')}: expected true or false")
        for name in ("lease_table_name", "messages_table_name"):
            _check_pattern(
                name, getattr(self, name), TABLE_NAME_PATTERN, "3-255 of A-Z a-z 0-9 _ . -"
            )
        if self.lease_table_name == self.messages_table_name:
            raise ContextError(
                f"{context_key('messages_table_name')}: must differ from "
                f"{context_key('lease_table_name')} ({self.lease_table_name})"
            )
        for name in (
            "secondary_active",
            "multi_region_strong_consistency",
            "api_gateway_cloudwatch_role",
            "task_stopped_handler",
            "demo_auction",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ContextError(f"{context_key(name)}: expected true or false")

    def _check_fleet(self) -> None:
        with _naming_context_key("allowed_upstreams"):
            check_allowed_upstreams("allowed_upstreams", self.allowed_upstreams)
        _check_number("worker_cpu", self.worker_cpu, whole=True, minimum=1)
        if self.worker_cpu not in FARGATE_MEMORY:
            raise ContextError(
                f"{context_key('worker_cpu')}: expected one of {sorted(FARGATE_MEMORY)}, "
                f"got {self.worker_cpu}"
            )
        memory = FARGATE_MEMORY[self.worker_cpu]
        _check_number("worker_memory_mib", self.worker_memory_mib, whole=True, minimum=1)
        if self.worker_memory_mib not in memory:
            raise ContextError(
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
            raise ContextError(
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
            raise ContextError(
                f"{context_key('stop_timeout_seconds')}: must exceed the worker's "
                f"{SHUTDOWN_BUDGET_SECONDS:g} s shutdown budget and be at most "
                f"{MAX_STOP_TIMEOUT_SECONDS}, got {self.stop_timeout_seconds}"
            )

    def _check_consistency(self) -> None:
        key = context_key("witness_region")
        if not self.multi_region_strong_consistency:
            if self.witness_region is not None:
                raise ContextError(
                    f"{key}: only used with {context_key('multi_region_strong_consistency')}"
                )
            return
        if self.witness_region is None:
            raise ContextError(
                f"{key}: required with {context_key('multi_region_strong_consistency')} "
                "(two replicas and a witness)"
            )
        _check_pattern("witness_region", self.witness_region, REGION_PATTERN, "a Region")
        regions = (self.primary_region, self.secondary_region, self.witness_region)
        if len(set(regions)) != len(regions):
            raise ContextError(f"{key}: must differ from the primary and the secondary Region")
        if not any(set(regions) <= region_set for region_set in MRSC_REGION_SETS):
            sets = "; ".join(", ".join(sorted(region_set)) for region_set in MRSC_REGION_SETS)
            raise ContextError(
                f"{context_key('multi_region_strong_consistency')}: the primary, secondary and "
                f"witness Regions {regions} must all be in one Region set ({sets})"
            )

    def _check_websocket_api(self) -> None:
        for name in ("jwt_issuer", "jwt_audience"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ContextError(f"{context_key(name)}: required, a non-empty string")
        parts = urlsplit(self.jwt_jwks_url) if isinstance(self.jwt_jwks_url, str) else None
        if parts is None or parts.scheme != "https" or not parts.hostname:
            raise ContextError(f"{context_key('jwt_jwks_url')}: expected an https URL")
        if self.canary_token_transport not in CANARY_TOKEN_TRANSPORTS:
            raise ContextError(
                f"{context_key('canary_token_transport')}: expected one of "
                f"{', '.join(CANARY_TOKEN_TRANSPORTS)}, got {self.canary_token_transport!r}"
            )
        _check_number(
            "canary_healthy_runs_to_recover",
            self.canary_healthy_runs_to_recover,
            whole=True,
            minimum=1,
        )
        _check_number("ws_api_rate_limit", self.ws_api_rate_limit, minimum=1)
        _check_number("ws_api_burst_limit", self.ws_api_burst_limit, whole=True, minimum=1)
        secret = self.canary_signing_key_secret_name
        if secret is not None:
            _check_pattern(
                "canary_signing_key_secret_name",
                secret,
                SECRET_NAME_PATTERN,
                "a Secrets Manager secret name (not an ARN: each Region reads its own replica)",
            )
            if secret.startswith("arn:"):
                raise ContextError(
                    f"{context_key('canary_signing_key_secret_name')}: expected the secret's "
                    "name, not an ARN: each Region's canary reads its own replica"
                )
            if self.canary_public_keys is None:
                raise ContextError(
                    f"{context_key('canary_public_keys')}: required with "
                    f"{context_key('canary_signing_key_secret_name')}: without the canary's "
                    "public key the authorizer refuses its tokens, and the Region never reports "
                    "healthy"
                )
        if self.canary_public_keys is not None:
            if secret is None:
                raise ContextError(
                    f"{context_key('canary_public_keys')}: only used with "
                    f"{context_key('canary_signing_key_secret_name')}"
                )
            check_public_keys(context_key("canary_public_keys"), self.canary_public_keys)
        for name in (
            "ws_state_table_name",
            "ws_connections_table_name",
            "ws_subscriptions_table_name",
        ):
            _check_pattern(
                name, getattr(self, name), TABLE_NAME_PATTERN, "3-255 of A-Z a-z 0-9 _ . -"
            )
        home = self.ws_state_home_region
        if home is not None and not self.demo_auction:
            raise ContextError(
                f"{context_key('ws_state_home_region')}: only used with "
                f"{context_key('demo_auction')} (the auction's bids are what it decides)"
            )
        if home is not None and home not in (self.primary_region, self.secondary_region):
            raise ContextError(
                f"{context_key('ws_state_home_region')}: must be the primary "
                f"({self.primary_region}) or the secondary ({self.secondary_region}), got {home!r}"
            )
        for claim in self.jwt_reader_claims:
            with _naming_context_key("jwt_reader_claims"):
                check_claim_name("jwt_reader_claims", claim)
        # Every table of both halves has its own name (the fleet's pair is checked above).
        seen: dict[str, str] = {}
        for name in (
            "lease_table_name",
            "messages_table_name",
            "ws_state_table_name",
            "ws_connections_table_name",
            "ws_subscriptions_table_name",
        ):
            other = seen.setdefault(getattr(self, name), name)
            if other != name:
                raise ContextError(
                    f"{context_key(name)}: must differ from {context_key(other)} "
                    f"({getattr(self, name)})"
                )

    def _check_websocket_domain(self) -> None:
        given = [name for name in WS_DOMAIN_SETTINGS if getattr(self, name) is not None]
        if not given:
            return
        missing = [name for name in WS_DOMAIN_SETTINGS if name not in given]
        if missing:
            raise ContextError(
                f"{context_key(missing[0])}: required with {context_key(given[0])} (a custom "
                f"domain with failover DNS needs all of {', '.join(WS_DOMAIN_SETTINGS)})"
            )
        zone = str(self.hosted_zone_name).removesuffix(".")
        for name, value in (("ws_domain_name", self.ws_domain_name), ("hosted_zone_name", zone)):
            _check_pattern(name, value, DOMAIN_NAME_PATTERN, "a lower-case DNS name")
        domain = str(self.ws_domain_name)
        if domain != zone and not domain.endswith(f".{zone}"):
            raise ContextError(
                f"{context_key('ws_domain_name')}: {domain} is not in the hosted zone "
                f"{context_key('hosted_zone_name')} ({zone})"
            )
        _check_pattern("hosted_zone_id", self.hosted_zone_id, HOSTED_ZONE_ID_PATTERN, "Z...")
        for name, region in (
            ("ws_certificate_arn_primary", self.primary_region),
            ("ws_certificate_arn_secondary", self.secondary_region),
        ):
            value = getattr(self, name)
            _check_pattern(name, value, CERTIFICATE_ARN_PATTERN, "an ACM certificate ARN")
            match = CERTIFICATE_ARN_PATTERN.fullmatch(value)
            if match is not None and match["region"] != region:
                raise ContextError(
                    f"{context_key(name)}: the certificate is in {match['region']}, the API in "
                    f"{region} (a regional custom domain needs a certificate in its own Region)"
                )
        if self.canary_signing_key_secret_name is None:
            raise ContextError(
                f"{context_key('canary_signing_key_secret_name')}: required with "
                f"{context_key('ws_domain_name')}: without a token the canary's probes are "
                "refused, so the primary Region would never be healthy"
            )

    def _check_operations(self) -> None:
        with _naming_context_key("invoke_principals"):
            check_invoke_principals("invoke_principals", self.invoke_principals)
        for name in RESERVED_CONCURRENCY_SETTINGS:
            value = getattr(self, name)
            if value is not None:
                _check_number(name, value, whole=True, minimum=1)
        with _naming_context_key("lambda_log_level"):
            check_log_level("lambda_log_level", self.lambda_log_level)
        if self.alarm_email is not None:
            _check_pattern("alarm_email", self.alarm_email, EMAIL_PATTERN, "an e-mail address")
        _check_number("nat_gateways", self.nat_gateways, whole=True, minimum=1)
        if self.nat_gateways > VPC_AZS:
            raise ContextError(
                f"{context_key('nat_gateways')}: at most {VPC_AZS} (one per AZ of the VPC), "
                f"got {self.nat_gateways}"
            )
        _check_number("message_retention_days", self.message_retention_days, whole=True, minimum=1)
        _check_number(
            "fanout_batching_window_seconds", self.fanout_batching_window_seconds, whole=True
        )
        _check_number(
            "max_subscribers_per_stream", self.max_subscribers_per_stream, whole=True, minimum=1
        )
        if self.max_subscribers_per_stream > 10_000:
            raise ContextError(
                f"{context_key('max_subscribers_per_stream')}: at most 10000, "
                f"got {self.max_subscribers_per_stream}"
            )
        _check_number(
            "max_user_connections_per_stream",
            self.max_user_connections_per_stream,
            whole=True,
            minimum=1,
        )
        if self.max_user_connections_per_stream > 100:
            raise ContextError(
                f"{context_key('max_user_connections_per_stream')}: at most 100, "
                f"got {self.max_user_connections_per_stream}"
            )
        if self.fanout_batching_window_seconds > 300:
            raise ContextError(
                f"{context_key('fanout_batching_window_seconds')}: at most 300 (Lambda's "
                f"limit), got {self.fanout_batching_window_seconds}"
            )

    @property
    def ws_custom_domain(self) -> bool:
        """Whether the WebSocket API has a custom domain and failover records."""
        return self.ws_domain_name is not None

    @property
    def jwt_placeholders(self) -> tuple[str, ...]:
        """The JWT settings still at their placeholder (``example.com``) defaults."""
        defaults = {"jwt_issuer": DEFAULT_JWT_ISSUER, "jwt_jwks_url": DEFAULT_JWT_JWKS_URL}
        return tuple(name for name, value in defaults.items() if getattr(self, name) == value)

    @property
    def log_retention(self) -> logs.RetentionDays:
        """:attr:`log_retention_days` as CDK's enum."""
        return LOG_RETENTION[self.log_retention_days]

    @property
    def replica_regions(self) -> tuple[str, ...]:
        """Regions that hold a replica of the tables declared in the primary Region."""
        return (self.secondary_region,)

    @classmethod
    def from_context(cls, app_node: Node) -> AppConfig:
        """Read every ``streamfleet:<field>`` context key; unset (or null) keys keep defaults.

        Values given with ``-c`` arrive as strings, values from ``cdk.json`` as JSON types;
        booleans accept both (``true``/``false``). The account is never taken from the
        environment (``CDK_DEFAULT_ACCOUNT``): unset, the stacks are account-agnostic, and the
        same synth gives the same templates with or without credentials.
        """
        types = get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            raw = app_node.try_get_context(context_key(spec.name))
            if raw is None:
                continue
            parse = _PARSERS.get(types[spec.name], _require_str)
            values[spec.name] = parse(spec.name, raw)
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
            raise ContextError(f"{context_key(field)}: {message}") from None
        raise ContextError(f"{context_key(field_name)}: {exc}") from None


def _check_number(name: str, value: object, *, whole: bool = False, minimum: float = 0) -> None:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        expected = "a whole number" if whole else "a number"
        raise ContextError(f"{context_key(name)}: expected {expected}, got {value!r}")
    if not value >= minimum:  # also refuses NaN
        raise ContextError(f"{context_key(name)}: expected at least {minimum:g}, got {value}")


def _parse_int(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ContextError(f"{context_key(name)}: expected a whole number, got {value!r}")


def _parse_float(name: str, value: object) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ContextError(f"{context_key(name)}: expected a number, got {value!r}")


def _parse_optional_int(name: str, value: object) -> int | None:
    """A whole number, or :data:`UNRESERVED` for none."""
    if isinstance(value, str) and value.strip().lower() == UNRESERVED:
        return None
    try:
        return _parse_int(name, value)
    except ValueError:
        raise ContextError(
            f"{context_key(name)}: expected a whole number or {UNRESERVED!r}, got {value!r}"
        ) from None


def _parse_str_tuple(name: str, value: object) -> tuple[str, ...]:
    """A JSON list of strings (cdk.json), or one comma-separated string (``-c``)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(SEPARATOR) if part.strip())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise ContextError(f"{context_key(name)}: expected a list of strings, got {value!r}")


def _require_str(name: str, value: object) -> str:
    # A number in cdk.json would lose an account's leading zeros: insist on a string.
    if not isinstance(value, str):
        raise ContextError(f"{context_key(name)}: expected a string, got {type(value).__name__}")
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
    raise ContextError(f"{context_key(name)}: expected true or false, got {value!r}")


def _check_pattern(name: str, value: object, pattern: re.Pattern[str], expected: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ContextError(f"{context_key(name)}: expected {expected}, got {value!r}")


_PARSERS: dict[Any, Any] = {
    bool: _parse_bool,
    int: _parse_int,
    int | None: _parse_optional_int,
    float: _parse_float,
    tuple[str, ...]: _parse_str_tuple,
}
_FIELD_NAMES = frozenset(spec.name for spec in fields(AppConfig))
