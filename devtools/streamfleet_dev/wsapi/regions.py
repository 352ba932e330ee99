"""Two local regions of the client-facing WebSocket API, with failover, behind one HTTP port.

What :class:`LocalRegions` runs, each piece standing in for its AWS counterpart and running the
real runtime code (the contract with the browser client: docs/protocol.md):

* * a primary (``us-east-1``) and a secondary (``us-west-2``) region, each a
  :class:`~streamfleet_dev.emulator.websocket_gateway.LocalGateway` (API Gateway's WebSocket routing
  and Management API) calling the real :mod:`~streamfleet.wsapi.authorizer` and
  :mod:`~streamfleet.wsapi.handlers`, with its own state and connections tables on a local DynamoDB
  (dynalite unless given one);
* * a :class:`~streamfleet_dev.emulator.global_tables.StateReplication` between the two state tables
  (a global table: asynchronous, the last writer by the replicator's own clock wins, deletes
  replicated);
* * the real :class:`~streamfleet.wsapi.canary.run.Canary` per region, with its own identity (a key
  the user tokens never use), its fail-back hysteresis in the connections table, publishing to a
  :class:`~streamfleet_dev.emulator.failover.HealthAlarm` (and to CloudWatch when an endpoint is
  given), and closing every client connection of its region while the region reports unhealthy;
* a :class:`~streamfleet_dev.emulator.failover.FailoverResolver`: the failover name's answer;
* * with :class:`LiveSettings`, live delivery of the fleet's streams in both regions: a
  subscriptions table per region, the handlers' ``subscribe`` over the fleet's lease and messages
  tables, the messages table's global-table replication to the secondary
  (:class:`~streamfleet_dev.emulator.global_tables.MessageReplicator`, from the primary's real
  DynamoDB stream), and per region the fan-out function (from its synthesized asset by default)
  behind the event source mapping stand-in
  (:class:`~streamfleet_dev.emulator.event_source.StreamEventSource`) on that region's stream.

And an HTTP server on ``http_url`` (127.0.0.1, a free port unless configured):

* ``GET /resolve`` -> ``{"url": "ws://127.0.0.1:<port>", "region": "us-east-1"}`` (the DNS
  stand-in: where the failover name points now);
* ``GET /token?user=<id>[&expires_in=<s>]`` -> ``{"token": ...}``: a development token
  accepted by both regions (LOCAL ONLY: anyone who can reach the port gets one);
* ``GET /health`` -> ``{"primary": "healthy", "secondary": "healthy", "serving": "us-east-1",
  ...}`` (each region's failure mode, plus alarms and URLs);
* ``POST /fail?mode=throttled|down`` and ``POST /restore``: :meth:`LocalRegions.fail_primary`
  and :meth:`LocalRegions.restore_primary` from another process;
* ``GET /streams`` -> ``{"streams": [...]}``: the streams :attr:`LocalRegions.streams` names
  (what the demo page offers to watch; empty unless the caller set it);
* ``GET /<path>``: files from ``static_dir`` (the built demo page), ``/`` is ``index.html``.

Run it on its own: ``python -m streamfleet_dev.wsapi.regions --serve [--static-dir DIR]``
prints one JSON line ``{"event": "listening", "http_url": ..., "regions": {...}}`` when ready
and runs until SIGINT/SIGTERM. It refuses any DynamoDB or CloudWatch endpoint but loopback.

Timings are compressed by default (canary every 0.5 s, 2 of 2 datapoints to fail over, 3
healthy runs to fail back): a failover takes about a second instead of about two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import mimetypes
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import boto3
from botocore.config import Config

from streamfleet import model
from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.validation import ID_CHARSET_DOC, ID_PATTERN
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from streamfleet.wsapi.canary.config import MINUTE_MS, CanaryConfig
from streamfleet.wsapi.canary.health import DynamoHealthStateStore
from streamfleet.wsapi.canary.metrics import CloudWatchPublisher, MetricPublisher
from streamfleet.wsapi.canary.run import Canary, CanaryFault, CanaryRun
from streamfleet.wsapi.canary.sweeper import ConnectionSweeper
from streamfleet.wsapi.canary.tokens import (
    KEY_REFRESH_SECONDS,
    KEY_RELOAD_MIN_SECONDS,
    MintedToken,
    SecretToken,
    TokenSource,
)
from streamfleet.wsapi.fanout import Fanout, FanoutConfig
from streamfleet.wsapi.handlers import WsApiHandlers
from streamfleet.wsapi.handlers import handler as core_handler
from streamfleet.wsapi.handlers.config import HandlerConfig, LiveTables
from streamfleet.wsapi.handlers.extensions import RouteExtension
from streamfleet.wsapi.handlers.replier import ManagementApiReplier
from streamfleet.wsapi.handlers.state_store import StateReplica
from streamfleet_auction import names as auction_names
from streamfleet_auction.config import AuctionConfig
from streamfleet_auction.extension import auction_extension
from streamfleet_dev.emulator.event_source import (
    EventSourceSettings,
    OnFailureDestination,
    StreamEventSource,
)
from streamfleet_dev.emulator.failover import FailoverResolver, HealthAlarm
from streamfleet_dev.emulator.global_tables import (
    ChangeFeed,
    MessageReplicator,
    ReplicaTable,
    ScanFeed,
    StateReplication,
    StreamFeed,
)
from streamfleet_dev.emulator.store_outage import StoreSwitch
from streamfleet_dev.emulator.websocket_gateway import (
    DEFAULT_MANAGEMENT_FAULT_RATES,
    FailureMode,
    GatewaySettings,
    LocalGateway,
)
from streamfleet_dev.wsapi.live import event_source_settings, fanout_process
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOCAL_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
BACKENDS = ("dynalite", "moto")
MAX_HTTP_HEAD_BYTES = 16 * 1024
MAX_HTTP_BODY_BYTES = 64 * 1024
HTTP_READ_TIMEOUT_SECONDS = 10.0
MAX_TOKEN_SECONDS = 24 * 60 * 60
MAX_USER_CHARS = 128
READY_TIMEOUT_SECONDS = 30.0
_BOTO_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=3.0,
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=16,
)


class RegionsError(RuntimeError):
    """The local regions could not start (a bad setting, a non-loopback endpoint...)."""


# --- Configuration ------------------------------------------------------------------------------

# The WebSocket handler's entry points a template may name, and whether each installs the demo
# auction: a fixed table, as each entry module names its own extensions (nothing is imported by
# computed name).
CORE_HANDLER_ENTRY = f"{core_handler.__module__}.{core_handler.__name__}"
HANDLER_ENTRIES = {CORE_HANDLER_ENTRY: False, auction_names.HANDLER_ENTRY: True}


@dataclass(frozen=True)
class LiveSettings:
    """Live delivery in both local regions.

    The fleet's tables are the caller's (the fleet writes the primary's messages table): one
    lease table stands for the global table in both regions; ``messages_tables`` are the
    primary's and the secondary's replicas (the secondary's is created here from the template
    when ``create_replica``). ``dynamodb_endpoint`` of the regions must reach the messages
    tables on a server with DynamoDB Streams (moto; the recording proxy routes them there), and
    ``streams_endpoint`` is that server, for the event sources and the replicator.
    """

    lease_table: str
    messages_tables: tuple[str, str]
    streams_endpoint: str
    create_replica: bool = True
    fanout_from_assembly: bool = True  # the synthesized asset; False: in-process (faster)
    reader_claims: tuple[str, ...] = ()
    poll_interval: float = 0.25  # the event source's idle poll (Lambda: about 4 a second)
    replication_interval: float = 0.05
    # Claims every development token carries (say, a group every local user is in, which the
    # streams' readers name): ((claim, (values...)), ...).
    token_claims: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class RegionsSettings:
    """Names, timings and endpoints of the two local regions."""

    primary: str = "us-east-1"
    secondary: str = "us-west-2"
    canary_period: float = 0.5
    canary_timeout: float = 0.4
    healthy_runs_to_recover: int = 3
    alarm_datapoints: int = 2  # "2 of 2": what Route 53's alarm health checks support
    replication_interval: float = 0.1
    disconnect_when_unhealthy: bool = True
    # Which DynamoDB: this endpoint, else AWS_ENDPOINT_URL_DYNAMODB, else a server of `backend`
    # started (and stopped) by LocalRegions itself.
    dynamodb_endpoint: str | None = None
    backend: str = "dynalite"
    # CloudWatch for the canaries' PutMetricData: this, else AWS_ENDPOINT_URL_CLOUDWATCH, else
    # none (the local alarm gets the datapoints either way).
    cloudwatch_endpoint: str | None = None
    # Secrets Manager for the canaries' signing key, a secret per Region read as deployed
    # (SecretToken, its refresh compressed with the canary's period): this, else
    # AWS_ENDPOINT_URL_SECRETS_MANAGER, else none (the canaries hold their key; no rotation).
    secrets_endpoint: str | None = None
    host: str = "127.0.0.1"
    http_port: int = 0
    gateway_ports: tuple[int, int] = (0, 0)  # primary, secondary; 0: any free port
    issuer: str = "https://issuer.local.streamfleet"
    audience: str = "streamfleet-wsapi"
    lambda_concurrency: int = 16
    table_prefix: str = "local"
    live: LiveSettings | None = None
    # Management API calls answered with an error, by status and rate (see GatewaySettings):
    # on by default, as strict as AWS can be.
    management_fault_rates: tuple[tuple[int, float], ...] = DEFAULT_MANAGEMENT_FAULT_RATES
    fault_seed: int | None = None  # the primary's gateway draws from it, the secondary's from +1
    # The handler's entry point (one of HANDLER_ENTRIES), as the template names it: the app's
    # default adds the demo auction. With live delivery from the assembly, the template's own.
    handler_entry: str = auction_names.HANDLER_ENTRY

    def __post_init__(self) -> None:
        if self.handler_entry not in HANDLER_ENTRIES:
            raise RegionsError(f"handler_entry: one of {', '.join(HANDLER_ENTRIES)}")
        if not self.primary or not self.secondary or self.primary == self.secondary:
            raise RegionsError("primary, secondary: two different region names are required")
        for name in ("canary_period", "canary_timeout", "replication_interval"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise RegionsError(f"{name}: must be a number of seconds above zero")
        if self.canary_timeout >= self.canary_period:
            raise RegionsError("canary_timeout: must be shorter than canary_period")
        if self.healthy_runs_to_recover < 1 or self.alarm_datapoints < 1:
            raise RegionsError("healthy_runs_to_recover, alarm_datapoints: at least 1")
        if self.backend not in BACKENDS:
            raise RegionsError(f"backend: one of {', '.join(BACKENDS)}")
        if self.host not in LOOPBACK_HOSTS:
            raise RegionsError("host: the local regions listen on loopback only")
        try:
            GatewaySettings(region=self.primary, management_fault_rates=self.management_fault_rates)
        except ValueError as exc:
            raise RegionsError(str(exc)) from None


def _private_pem(key: jwt.SigningKey) -> str:
    """The private key as a secret holds it (PKCS #8 PEM)."""
    from cryptography.hazmat.primitives import serialization

    return key.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def check_local_endpoint(value: str, what: str) -> str:
    """``value`` if it is a loopback URL; :class:`RegionsError` naming ``what`` otherwise (the
    local regions and the drill must never touch AWS)."""
    if urlsplit(value).hostname not in LOOPBACK_HOSTS:
        raise RegionsError(f"{what}: the local regions run only against a loopback endpoint")
    return value


# --- One region ---------------------------------------------------------------------------------


@dataclass
class Region:
    """One running region and what tests and the drill read from it."""

    name: str
    api_id: str
    gateway: LocalGateway
    canary: Canary
    alarm: HealthAlarm
    state_client: AsyncClient
    dynamodb: Any  # synchronous boto3 client (handlers, table set-up)
    store: StoreSwitch  # the handlers' view of this Region's DynamoDB (an outage on demand)
    state_table: str
    connections_table: str
    stream_arn: str | None
    runs: list[CanaryRun] = field(default_factory=list)
    closed_by_canary: int = 0
    canary_faults: int = 0  # runs that raised CanaryFault: the canary's own fault, paged as such
    completed_runs: int = 0  # every run that returned (``runs`` keeps only the last 100)
    unhealthy_runs: int = 0  # of them, those that published 0
    subscriptions_table: str | None = None
    messages_table: str | None = None
    fanout: Any = None  # a LambdaProcess (the asset) or an in-process Fanout
    event_source: StreamEventSource | None = None
    failed_records_queue: str | None = None  # the on-failure destination's URL, when it has one
    fanout_metrics: list[dict[str, Any]] = field(default_factory=list)  # in-process only

    @property
    def mode(self) -> FailureMode:
        return self.gateway.mode


# --- The two regions ----------------------------------------------------------------------------


class LocalRegions:
    """Both regions, replication, canaries, the failover resolver and the HTTP front.

    ``async with LocalRegions() as regions:`` starts everything (and waits until both canaries
    reported once, so :meth:`serving_region` means something) and stops it all on exit,
    deleting the tables it created.
    """

    def __init__(self, *, settings: RegionsSettings | None = None, static_dir: Path | None = None):
        self.settings = settings or RegionsSettings()
        self.static_dir = static_dir.resolve() if static_dir is not None else None
        if self.static_dir is not None and not self.static_dir.is_dir():
            raise RegionsError(f"static_dir: {static_dir} is not a directory")
        self.regions: dict[str, Region] = {}
        self.resolver: FailoverResolver | None = None
        self.replicators: list[StateReplication] = []
        self.user_key: jwt.SigningKey | None = None
        self._canary_key: jwt.SigningKey | None = None
        self._suffix = uuid.uuid4().hex[:8]
        self._server_process: Any = None  # a LocalServer we started
        self._dynamodb_endpoint: str | None = None
        self._cloudwatch_endpoint: str | None = None
        self._secrets_endpoint: str | None = None
        # Each Region's canary key secret: (synchronous client, ARN).
        self._canary_secrets: dict[str, tuple[Any, str]] = {}
        self._canary_secret_clients: dict[str, AsyncClient] = {}
        self._async_clients: list[AsyncClient] = []
        # (client, state, connections, subscriptions or None)
        self._created_tables: list[tuple[Any, str, str, str | None]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._http: asyncio.Server | None = None
        self._http_tasks: set[asyncio.Task[Any]] = set()
        self._clock: Callable[[], float] = time.monotonic
        self.streams: list[str] = []  # what GET /streams offers (the demo page's choices)
        self.message_replicator: MessageReplicator | None = None
        self._log_dir: Path | None = None

    # Lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> LocalRegions:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self) -> LocalRegions:
        """Start everything; returns once both canaries have published a first datapoint."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def _start(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._resolve_endpoints()
        if self._dynamodb_endpoint is None:
            await self._start_own_dynamodb()
        # Key generation is CPU work: off the event loop.
        self.user_key = await asyncio.to_thread(
            jwt.generate_signing_key, jwt.RS256, f"local-user-{self._suffix}"
        )
        self._canary_key = await asyncio.to_thread(
            jwt.generate_signing_key, jwt.ES256, f"local-canary-{self._suffix}"
        )
        for name, port in zip((s.primary, s.secondary), s.gateway_ports, strict=True):
            self.regions[name] = await self._start_region(name, port)
        primary, secondary = self.regions[s.primary], self.regions[s.secondary]
        self.resolver = FailoverResolver(
            s.primary,
            s.secondary,
            {name: region.gateway.url for name, region in self.regions.items()},
            {name: region.alarm for name, region in self.regions.items()},
            self._clock,
        )
        self.replicators = [
            StateReplication(
                [
                    ReplicaTable(r.name, r.state_client, r.state_table, self._feed(r))
                    for r in (primary, secondary)
                ],
                interval=s.replication_interval,
            )
        ]
        self._tasks += [loop.create_task(self._canary_loop(r)) for r in self.regions.values()]
        self._tasks += [loop.create_task(r.run(self._stop)) for r in self.replicators]
        if s.live is not None:
            await self._start_live(s.live)
        self._tasks.append(loop.create_task(self._watch_dns()))
        self._http = await asyncio.start_server(self._serve_http, s.host, s.http_port)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not all(region.alarm.has_data for region in self.regions.values()):
            if time.monotonic() > deadline:
                raise RegionsError("the canaries published no datapoint in time")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """Stop everything (idempotent); delete the tables; stop a server started here."""
        self._stop.set()
        if self._http is not None:
            self._http.close()
            for task in list(self._http_tasks):
                task.cancel()
            await asyncio.gather(*self._http_tasks, return_exceptions=True)
            self._http = None
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for region in self.regions.values():
            if region.fanout is not None and hasattr(region.fanout, "stop"):
                await asyncio.to_thread(region.fanout.stop)
            await region.gateway.stop()
        for client in self._async_clients:
            client.close()
        self._async_clients.clear()
        for dynamodb, state_table, connections_table, subscriptions in self._created_tables:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    delete_wsapi_tables,
                    dynamodb,
                    state_table=state_table,
                    connections_table=connections_table,
                    subscriptions_table=subscriptions,
                )
        self._created_tables.clear()
        for secrets, arn in self._canary_secrets.values():
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    secrets.delete_secret, SecretId=arn, ForceDeleteWithoutRecovery=True
                )
            secrets.close()
        self._canary_secrets.clear()
        if self._server_process is not None:
            await asyncio.to_thread(self._server_process.stop)
            self._server_process = None

    def _resolve_endpoints(self) -> None:
        s = self.settings
        dynamodb = s.dynamodb_endpoint or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
        if dynamodb:
            self._dynamodb_endpoint = check_local_endpoint(dynamodb, "AWS_ENDPOINT_URL_DYNAMODB")
        cloudwatch = s.cloudwatch_endpoint or os.environ.get("AWS_ENDPOINT_URL_CLOUDWATCH")
        if cloudwatch:
            self._cloudwatch_endpoint = check_local_endpoint(
                cloudwatch, "AWS_ENDPOINT_URL_CLOUDWATCH"
            )
        secrets = s.secrets_endpoint or os.environ.get("AWS_ENDPOINT_URL_SECRETS_MANAGER")
        if secrets:
            self._secrets_endpoint = check_local_endpoint(
                secrets, "AWS_ENDPOINT_URL_SECRETS_MANAGER"
            )

    async def _start_own_dynamodb(self) -> None:
        from streamfleet_dev.emulator.servers import dynalite_server, moto_server

        factory = dynalite_server if self.settings.backend == "dynalite" else moto_server
        self._server_process = await asyncio.to_thread(lambda: factory().start())
        self._dynamodb_endpoint = self._server_process.endpoint

    def _boto(self, service: str, region: str, endpoint: str | None = None) -> Any:
        return boto3.session.Session().client(
            service,
            region_name=region,
            endpoint_url=endpoint or self._dynamodb_endpoint,
            config=_BOTO_CONFIG,
            **LOCAL_CREDENTIALS,
        )

    def _async(
        self, service: str, region: str, endpoint: str | None, threads: int = 4
    ) -> AsyncClient:
        client = AsyncClient(
            service,
            ClientSettings(threads=threads),
            region_name=region,
            endpoint_url=endpoint,
            **LOCAL_CREDENTIALS,
        )
        self._async_clients.append(client)
        return client

    async def _start_region(self, name: str, port: int) -> Region:
        s = self.settings
        api_id = f"api-{name}"
        # Table names include the region: not every local backend keeps regions apart (dynalite
        # does not), and in AWS each region has its own replica anyway.
        state_table = f"{s.table_prefix}-wsstate-{name}-{self._suffix}"
        connections_table = f"{s.table_prefix}-wsconn-{name}-{self._suffix}"
        subscriptions_table = (
            f"{s.table_prefix}-wssubs-{name}-{self._suffix}" if s.live is not None else None
        )
        dynamodb = await asyncio.to_thread(self._boto, "dynamodb", name)
        await asyncio.to_thread(
            create_wsapi_tables,
            dynamodb,
            state_table=state_table,
            connections_table=connections_table,
            stream=True,
            subscriptions_table=subscriptions_table,
        )
        self._created_tables.append((dynamodb, state_table, connections_table, subscriptions_table))
        live_tables = None
        messages_table = None
        if s.live is not None:
            assert subscriptions_table is not None
            messages_table = s.live.messages_tables[0 if name == s.primary else 1]
            live_tables = LiveTables(s.live.lease_table, messages_table, subscriptions_table)
        description = await asyncio.to_thread(dynamodb.describe_table, TableName=state_table)
        assert self.user_key is not None and self._canary_key is not None
        canary_keys = json.dumps(jwt.jwks_document([self._canary_key]))
        authorizer = Authorizer(
            AuthorizerConfig(
                issuer=s.issuer,
                audience=s.audience,
                keys=json.dumps(jwt.jwks_document([self.user_key])),
                canary_keys=canary_keys,
                reader_claims=s.live.reader_claims if s.live is not None else (),
            )
        )

        def management_client(endpoint: str) -> Any:
            return self._boto("apigatewaymanagementapi", name, endpoint)

        store = StoreSwitch(dynamodb, name)

        extensions: tuple[RouteExtension, ...] = ()
        if HANDLER_ENTRIES[self._handler_entry(name)]:
            # As deployed, every Region decides bids in the primary's replica; locally each
            # Region's table has a name of its own, so the home is handed over, not derived.
            home = None
            if name != s.primary:
                primary = self.regions[s.primary]  # started first
                home = StateReplica(primary.name, primary.state_table, primary.store)
            extensions = (auction_extension(AuctionConfig(home_region=s.primary), home=home),)

        def handlers(endpoint: str) -> WsApiHandlers:
            return WsApiHandlers(
                HandlerConfig(state_table, connections_table, name, endpoint, live=live_tables),
                dynamodb=store,
                replier=ManagementApiReplier(
                    region=name, endpoint=endpoint, client_factory=management_client
                ),
                extensions=extensions,
            )

        gateway = await LocalGateway(
            GatewaySettings(
                region=name,
                api_id=api_id,
                host=s.host,
                port=port,
                lambda_concurrency=s.lambda_concurrency,
                management_fault_rates=s.management_fault_rates,
                fault_seed=None if s.fault_seed is None else s.fault_seed + (name != s.primary),
            ),
            authorizer=authorizer,
            handler_factory=handlers,
        ).start()
        # Creating a boto3 client holds the GIL for a long moment: now, not in the first reply.
        replier = gateway.handler.replier  # type: ignore[union-attr]
        await asyncio.to_thread(replier.client_for, {})
        alarm = HealthAlarm(
            datapoints=s.alarm_datapoints, period=s.canary_period, clock=self._clock
        )
        publishers: list[MetricPublisher] = [alarm]
        if self._cloudwatch_endpoint:
            publishers.append(
                CloudWatchPublisher(self._async("cloudwatch", name, self._cloudwatch_endpoint))
            )
        canary_dynamodb = self._async("dynamodb", name, self._dynamodb_endpoint)
        tokens = await self._canary_tokens(name)
        canary = Canary(
            CanaryConfig(
                endpoint_url=gateway.url,
                api_id=api_id,
                timeout_seconds=s.canary_timeout,
                healthy_runs_to_recover=s.healthy_runs_to_recover,
                failures_to_trip=s.alarm_datapoints,
                state_table=connections_table,
                # As deployed: only the primary's canary sweeps (the SECONDARY record has no
                # health check, so the name answers with it whatever its canary says).
                disconnect_when_unhealthy=s.disconnect_when_unhealthy and name == s.primary,
                management_endpoint=gateway.management_endpoint,
                disconnect_budget_seconds=s.canary_period,
                # As deployed: the canary knows the keys its authorizer accepts.
                accepted_keys=jwt.parse_key_material(canary_keys),
            ),
            tokens=tokens,
            store=DynamoHealthStateStore(
                canary_dynamodb, table_name=connections_table, api_id=api_id
            ),
            publishers=publishers,
            # No alarm to read: the local alarm's missing-data rule, at these compressed
            # timings, would take a one-second stall of a loaded machine for two silent minutes
            # and trip a healthy Region (tests/integration/test_wsapi_canary.py reads a real
            # alarm in moto).
            disconnector=ConnectionSweeper(
                dynamodb=canary_dynamodb,
                management=self._async(
                    "apigatewaymanagementapi", name, gateway.management_endpoint, threads=8
                ),
                table_name=connections_table,
                budget_seconds=s.canary_period,
            ),
        )
        return Region(
            name=name,
            api_id=api_id,
            gateway=gateway,
            canary=canary,
            alarm=alarm,
            state_client=self._async("dynamodb", name, self._dynamodb_endpoint),
            dynamodb=dynamodb,
            store=store,
            state_table=state_table,
            connections_table=connections_table,
            stream_arn=description["Table"].get("LatestStreamArn"),
            subscriptions_table=subscriptions_table,
            messages_table=messages_table,
        )

    async def _canary_tokens(self, name: str) -> TokenSource:
        """The canary's token source: its key read from a secret in its Region, as deployed,
        when there is a Secrets Manager to hold it; the key itself otherwise."""
        s = self.settings
        assert self._canary_key is not None
        subject = f"canary-{name}"
        if self._secrets_endpoint is None:
            return MintedToken(self._canary_key, s.audience, subject=subject)
        # Made now, not during a rotation: creating a boto3 client holds the GIL long enough
        # to stall the canaries past the alarm's missing-data rule at the local timings.
        secrets = await asyncio.to_thread(
            self._boto, "secretsmanager", name, self._secrets_endpoint
        )
        created = await asyncio.to_thread(
            secrets.create_secret,
            Name=f"{s.table_prefix}-canary-key-{self._suffix}",
            SecretString=_private_pem(self._canary_key),
        )
        self._canary_secrets[name] = (secrets, created["ARN"])
        self._canary_secret_clients[name] = self._async(
            "secretsmanager", name, self._secrets_endpoint
        )
        return self._secret_token(name)

    def _secret_token(self, name: str) -> SecretToken:
        """A cold token source for the canary of ``name`` (a new Lambda environment's), with
        the deployed refresh and reload intervals in canary periods (one a minute there)."""
        s = self.settings
        runs = s.canary_period / (MINUTE_MS / 1000)
        return SecretToken(
            self._canary_secret_clients[name],
            self._canary_secrets[name][1],
            audience=s.audience,
            subject=f"canary-{name}",
            refresh_seconds=KEY_REFRESH_SECONDS * runs,
            reload_min_seconds=KEY_RELOAD_MIN_SECONDS * runs,
            # Not scaled: moto answers in milliseconds, not in a 300th of 2 s.
            read_timeout_seconds=s.canary_timeout,
        )

    # Live delivery ---------------------------------------------------------------------------

    async def _start_live(self, live: LiveSettings) -> None:
        """The messages table's replica and replication, and each region's fan-out."""
        loop = asyncio.get_running_loop()
        streams_endpoint = check_local_endpoint(live.streams_endpoint, "streams_endpoint")
        primary, secondary = self.primary, self.secondary
        if live.create_replica:
            await asyncio.to_thread(self._create_messages_replica, secondary)
        self._log_dir = Path(tempfile.mkdtemp(prefix="streamfleet-live-"))
        for region in self.regions.values():
            assert region.messages_table is not None and region.subscriptions_table is not None
            described = await asyncio.to_thread(
                region.dynamodb.describe_table, TableName=region.messages_table
            )
            stream_arn = described["Table"].get("LatestStreamArn")
            if not stream_arn:
                raise RegionsError(
                    f"{region.messages_table}: no DynamoDB stream (is it on moto's server?)"
                )
            region.fanout = await asyncio.to_thread(self._fanout_for, region, live)
            function = region.fanout.invoke if live.fanout_from_assembly else region.fanout
            settings = self._event_source_settings(region, live)
            region.event_source = StreamEventSource(
                streams=self._async("dynamodbstreams", region.name, streams_endpoint),
                stream_arn=stream_arn,
                function=function,
                region=region.name,
                settings=settings,
                name=f"fanout-{region.name}",
                on_failure=(
                    await self._failed_records_queue(region, streams_endpoint)
                    if settings.on_failure_destination
                    else None
                ),
            )
            self._tasks.append(loop.create_task(region.event_source.run(self._stop)))
            await region.event_source.ready()
            if region is primary:
                self.message_replicator = MessageReplicator(
                    streams=self._async("dynamodbstreams", region.name, streams_endpoint),
                    stream_arn=stream_arn,
                    destination=self._async("dynamodb", secondary.name, self._dynamodb_endpoint),
                    destination_table=str(secondary.messages_table),
                    interval=live.replication_interval,
                )
                self._tasks.append(loop.create_task(self.message_replicator.run(self._stop)))

    async def _failed_records_queue(self, region: Region, endpoint: str) -> OnFailureDestination:
        """The mapping's on-failure destination: a queue on the server that has SQS (moto)."""
        sqs = self._async("sqs", region.name, endpoint)
        created = await sqs.call("create_queue", QueueName=f"fanout-failed-records-{region.name}")
        url = region.failed_records_queue = created["QueueUrl"]
        account = url.rstrip("/").split("/")[-2]  # the server's account, as in the queue's URL
        return OnFailureDestination(
            sqs=sqs,
            queue_url=url,
            function_arn=f"arn:aws:lambda:{region.name}:{account}:function:fanout",
        )

    def _create_messages_replica(self, region: Region) -> None:
        from streamfleet_dev.tables import create_table

        existing = region.dynamodb.list_tables().get("TableNames", [])
        if region.messages_table not in existing:
            create_table(region.dynamodb, model.MESSAGES_TABLE, str(region.messages_table))

    def _event_source_settings(self, region: Region, live: LiveSettings) -> EventSourceSettings:
        if live.fanout_from_assembly:
            base = event_source_settings(self._websocket_stack(region))
        else:
            base = EventSourceSettings()
        return replace(base, poll_interval=live.poll_interval)

    def _websocket_stack(self, region: Region | str) -> Any:
        from streamfleet_dev.assembly import default_assembly

        name = region if isinstance(region, str) else region.name
        stacks = [
            stack
            for stack in default_assembly().stacks
            if stack.region == name and stack.of_type("AWS::Lambda::EventSourceMapping")
        ]
        if len(stacks) != 1:
            raise RegionsError(f"{name}: no single WebSocket stack in the assembly")
        return stacks[0]

    def _handler_entry(self, region: str) -> str:
        """The WebSocket handler's entry point in ``region``: the template's, when live delivery
        runs from the assembly (so the local API serves the routes the deployment would), else
        :attr:`RegionsSettings.handler_entry`."""
        live = self.settings.live
        if live is None or not live.fanout_from_assembly:
            return self.settings.handler_entry
        found = {f.handler for f in self._websocket_stack(region).functions()} & set(
            HANDLER_ENTRIES
        )
        if len(found) != 1:
            raise RegionsError(f"{region}: no single WebSocket handler in the assembly")
        return found.pop()

    def _fanout_for(self, region: Region, live: LiveSettings) -> Any:
        assert region.subscriptions_table is not None and self._log_dir is not None
        management = region.gateway.management_endpoint
        if live.fanout_from_assembly:
            return fanout_process(
                self._websocket_stack(region),
                subscriptions_table=region.subscriptions_table,
                streams_table=live.lease_table,
                management_endpoint=management,
                endpoint_url=str(self._dynamodb_endpoint),
                log_path=self._log_dir / f"fanout-{region.name}.log",
                credentials=(f"fanout-{region.name}", "local"),
            )

        def collect(line: str) -> None:
            region.fanout_metrics.append(json.loads(line))
            del region.fanout_metrics[:-10_000]

        return Fanout(
            FanoutConfig(region.subscriptions_table, management, region.name, live.lease_table),
            dynamodb=self._boto("dynamodb", region.name),
            management=self._boto("apigatewaymanagementapi", region.name, management),
            metrics_out=collect,
        )

    def fanout_metrics(self, region: str) -> list[dict[str, Any]]:
        """The fan-out's metric documents (EMF) so far, as CloudWatch would read them."""
        target = self.regions[region]
        if target.fanout is None:
            return []
        if isinstance(target.fanout, Fanout):
            return list(target.fanout_metrics)
        return target.fanout.emf_documents()

    def _feed(self, region: Region) -> ChangeFeed:
        if region.stream_arn is None:  # no Streams on this backend (dynalite)
            return ScanFeed(region.state_client, region.state_table)
        streams_endpoint = os.environ.get("AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        if streams_endpoint:
            check_local_endpoint(streams_endpoint, "AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        streams = self._async(
            "dynamodbstreams", region.name, streams_endpoint or self._dynamodb_endpoint
        )
        return StreamFeed(streams, region.stream_arn)

    async def _canary_loop(self, region: Region) -> None:
        period = self.settings.canary_period
        while not self._stop.is_set():
            started = self._clock()
            try:
                # Each run's tick, as EventBridge names it (wall-clock ms): what stamps its
                # datapoint and ties an ALARM to the runs before it (see FailbackHysteresis).
                run = await region.canary.run_once(time.time_ns() // 1_000_000)
            except CanaryFault as exc:  # its Errors alarm would page; the Region is not judged
                region.canary_faults += 1
                logger.warning("canary fault in %s: %s", region.name, exc)
            except Exception:  # a bug, not an outage: log it and keep the schedule
                logger.exception("canary run failed in %s", region.name)
            else:
                region.runs = [*region.runs[-99:], run]
                region.completed_runs += 1
                region.unhealthy_runs += run.value == 0
                if run.sweep is not None:
                    region.closed_by_canary += run.sweep.closed
            self._require_resolver().region()  # evaluate "DNS" as soon as a datapoint lands
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._stop.wait(), max(0.0, started + period - self._clock())
                )

    async def _watch_dns(self) -> None:
        while not self._stop.is_set():
            self._require_resolver().region()  # missing-data transitions happen between runs
            await asyncio.sleep(0.02)

    def _require_resolver(self) -> FailoverResolver:
        if self.resolver is None:
            raise RegionsError("start() first")
        return self.resolver

    # The contract's interface ----------------------------------------------------------------

    @property
    def primary(self) -> Region:
        return self.regions[self.settings.primary]

    @property
    def secondary(self) -> Region:
        return self.regions[self.settings.secondary]

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:<port>``: /resolve, /token, /health, /fail, /restore, files."""
        if self._http is None:
            raise RegionsError("start() first")
        port = self._http.sockets[0].getsockname()[1]
        return f"http://{self.settings.host}:{port}"

    def region_url(self, region: str) -> str:
        """The regional WebSocket endpoint of ``region`` (what the canary dials)."""
        if region not in self.regions:
            raise RegionsError(f"region: {region!r} is not one of {', '.join(self.regions)}")
        return self.regions[region].gateway.url

    def serving_region(self) -> str:
        """The region the failover name resolves to now."""
        return self._require_resolver().region()

    def resolve(self) -> dict[str, str]:
        """What ``GET /resolve`` answers."""
        region = self.serving_region()
        return {"url": self.region_url(region), "region": region}

    async def fail_primary(self, mode: str = "throttled") -> None:
        """Make the primary fail: ``throttled`` (handlers do not run, sockets stay open, every
        message gets API Gateway's error frame) or ``down`` (sockets dropped, handshakes 503)."""
        try:
            failure = FailureMode(mode)
        except ValueError:
            failure = None
        if failure not in (FailureMode.THROTTLED, FailureMode.DOWN):
            raise RegionsError("mode: must be throttled or down")
        self.primary.gateway.fail(failure)

    async def restore_primary(self) -> None:
        """The primary works again; the name comes back after the canary's hysteresis."""
        self.primary.gateway.recover()
        self.primary.store.down = False

    def break_canary_key(self, region_name: str) -> Callable[[], None]:
        """The canary of ``region_name`` cannot read its signing key (a deleted secret, a
        denied kms:Decrypt): a fault of its own. Returns what restores it."""
        canary = self.regions[region_name].canary
        working = canary.tokens

        class UnreadableKey:
            async def token(self) -> str | None:
                raise RuntimeError("the canary's signing key cannot be read (drill)")

            async def refused(self) -> str | None:
                return None

            @property
            def keys(self) -> tuple[jwt.SigningKey, ...]:
                return ()

        canary.tokens = UnreadableKey()

        def restore() -> None:
            canary.tokens = working

        return restore

    async def put_canary_key(self) -> jwt.SigningKey:
        """A new signing key for the canaries, put into every Region's secret at once; the
        authorizers and canaries still accept the keys they were deployed with."""
        if set(self._canary_secrets) != set(self.regions):
            raise RegionsError(
                "put_canary_key: the canaries read no secret (set "
                "AWS_ENDPOINT_URL_SECRETS_MANAGER or secrets_endpoint)"
            )
        key = await asyncio.to_thread(
            jwt.generate_signing_key, jwt.ES256, f"local-canary-{uuid.uuid4().hex[:8]}"
        )
        pem = _private_pem(key)
        await asyncio.gather(
            *(
                asyncio.to_thread(secrets.put_secret_value, SecretId=arn, SecretString=pem)
                for secrets, arn in self._canary_secrets.values()
            )
        )
        return key

    def deploy_authorizers(self, keys: Sequence[jwt.SigningKey]) -> None:
        """Every Region's authorizer deployed with exactly ``keys`` as the canary's public keys
        (``canary_public_keys``). A deploy updates the canary's function apart, later or
        sooner: :meth:`deploy_canaries`."""
        text = json.dumps(jwt.jwks_document(keys))
        for region in self.regions.values():
            deployed = region.gateway.authorizer
            assert isinstance(deployed, Authorizer)
            region.gateway.authorizer = Authorizer(replace(deployed.config, canary_keys=text))

    def deploy_canaries(self, keys: Sequence[jwt.SigningKey]) -> None:
        """Every Region's canary deployed with ``keys`` as the keys its authorizer accepts
        (``JWT_CANARY_KEYS``): a new environment, so its key is read cold."""
        accepted = jwt.parse_key_material(json.dumps(jwt.jwks_document(keys)))
        for name, region in self.regions.items():
            region.canary.config = replace(region.canary.config, accepted_keys=accepted)
            if name in self._canary_secrets:
                region.canary.tokens = self._secret_token(name)

    async def fail_primary_store(self) -> None:
        """The primary's DynamoDB stops answering its handlers and the secondary's writes to
        it (the auctions' home); the gateway keeps running. Replication and the canaries' own
        streak stores still reach it: the outage is of the handlers' path to the store."""
        self.primary.store.down = True

    def mint_token(self, user_id: str, *, expires_in: float = 3600) -> str:
        """A development token for ``user_id``, accepted by both regions (LOCAL ONLY)."""
        if self.user_key is None:
            raise RegionsError("start() first")
        if not (isinstance(user_id, str) and 0 < len(user_id) <= MAX_USER_CHARS):
            raise RegionsError(f"user: 1 to {MAX_USER_CHARS} characters")
        if not ID_PATTERN.fullmatch(user_id):
            raise RegionsError(f"user: only {ID_CHARSET_DOC} are allowed")
        if user_id.startswith(model.CANARY_PRINCIPAL_PREFIX):
            raise RegionsError(f"user: the prefix {model.CANARY_PRINCIPAL_PREFIX!r} is reserved")
        if not (math.isfinite(expires_in) and 0 < expires_in <= MAX_TOKEN_SECONDS):
            raise RegionsError(f"expires_in: between 0 and {MAX_TOKEN_SECONDS} seconds")
        now = int(time.time())
        live = self.settings.live
        claims: dict[str, Any] = {
            **{claim: list(values) for claim, values in (live.token_claims if live else ())},
            "sub": user_id,
            "iss": self.settings.issuer,
            "aud": self.settings.audience,
            "iat": now,
            "exp": now + max(1, int(expires_in)),
        }
        return jwt.sign(claims, self.user_key)

    def health(self) -> dict[str, Any]:
        """What ``GET /health`` answers."""
        serving = self.serving_region()

        def alarm(region: Region) -> str:
            if not region.alarm.has_data:
                return "INSUFFICIENT_DATA"
            return "ALARM" if region.alarm.in_alarm() else "OK"

        return {
            "primary": self.primary.mode.value,
            "secondary": self.secondary.mode.value,
            "serving": serving,
            "alarms": {name: alarm(region) for name, region in self.regions.items()},
            "regions": {name: region.gateway.url for name, region in self.regions.items()},
            "closedByCanary": {
                name: region.closed_by_canary for name, region in self.regions.items()
            },
        }

    def describe(self) -> dict[str, Any]:
        """The ``--serve`` banner: every URL a person or a test needs."""
        return {
            "event": "listening",
            "http_url": self.http_url,
            "regions": {name: region.gateway.url for name, region in self.regions.items()},
            "primary": self.settings.primary,
            "secondary": self.settings.secondary,
            "serving": self.serving_region(),
            "static_dir": str(self.static_dir) if self.static_dir else None,
        }

    # HTTP ------------------------------------------------------------------------------------

    async def _serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._http_tasks.add(task)
        try:
            request = await asyncio.wait_for(_read_request(reader), HTTP_READ_TIMEOUT_SECONDS)
            if request is None:
                return
            method, target = request
            status, headers, body = await self._route(method, target)
            await _respond(writer, status, headers, body, head_only=method == "HEAD")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            if task is not None:
                self._http_tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(self, method: str, target: str) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(target)
        path = unquote(parts.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        if method == "OPTIONS":
            return 204, {"Allow": "GET, HEAD, POST, OPTIONS"}, b""
        api = {
            "/resolve": ("GET", lambda: self.resolve()),
            "/token": ("GET", lambda: self._token_endpoint(query)),
            "/health": ("GET", lambda: self.health()),
            "/streams": ("GET", lambda: {"streams": list(self.streams)}),
            "/fail": ("POST", None),
            "/restore": ("POST", None),
        }
        if path in api:
            allowed, handler = api[path]
            if method != allowed and not (allowed == "GET" and method == "HEAD"):
                return _json(405, {"error": f"{path}: use {allowed}"}, {"Allow": allowed})
            try:
                if path == "/fail":
                    await self.fail_primary(query.get("mode") or FailureMode.THROTTLED.value)
                    return _json(200, self.health())
                if path == "/restore":
                    await self.restore_primary()
                    return _json(200, self.health())
                assert handler is not None
                return _json(200, handler())
            except RegionsError as exc:
                return _json(400, {"error": str(exc)})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{method} {path}: not allowed"}, {"Allow": "GET"})
        return await self._static(path)

    def _token_endpoint(self, query: dict[str, str]) -> dict[str, Any]:
        user = query.get("user", "")
        raw = query.get("expires_in", "")
        try:
            expires_in = float(raw) if raw else 3600.0
        except ValueError:
            raise RegionsError("expires_in: not a number") from None
        return {"token": self.mint_token(user, expires_in=expires_in), "user": user}

    async def _static(self, path: str) -> tuple[int, dict[str, str], bytes]:
        if self.static_dir is None:
            return _json(404, {"error": f"{path}: not found (no static directory)"})
        relative = path.lstrip("/") or "index.html"
        candidate = (self.static_dir / relative).resolve()
        if candidate != self.static_dir and self.static_dir not in candidate.parents:
            return _json(404, {"error": f"{path}: not found"})
        if candidate.is_dir():
            candidate = candidate / "index.html"
        if not candidate.is_file():
            return _json(404, {"error": f"{path}: not found"})
        body = await asyncio.to_thread(candidate.read_bytes)
        kind = _content_type(candidate)
        return 200, {"Content-Type": kind, "Cache-Control": "no-cache"}, body


# --- A minimal HTTP/1.1 server ------------------------------------------------------------------


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """The request's method and target; the headers are read and the body skipped."""
    line = await reader.readline()
    if not line:
        return None
    method, _, rest = line.decode("latin-1").strip().partition(" ")
    target = rest.rpartition(" ")[0] or rest
    length, size = 0, len(line)
    while True:
        header = await reader.readline()
        size += len(header)
        if size > MAX_HTTP_HEAD_BYTES:
            raise ValueError("request head too large")
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip() or 0)
    if length > MAX_HTTP_BODY_BYTES:
        raise ValueError("request body too large")
    if length:
        await reader.readexactly(length)
    return method.upper(), target or "/"


def _json(
    status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    return (
        status,
        {"Content-Type": "application/json", "Cache-Control": "no-store", **(headers or {})},
        json.dumps(payload).encode(),
    )


def _content_type(path: Path) -> str:
    if path.suffix in (".js", ".mjs"):
        return "text/javascript; charset=utf-8"
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"{kind}; charset=utf-8" if kind.startswith("text/") or kind.endswith("json") else kind


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    headers: dict[str, str],
    body: bytes,
    *,
    head_only: bool = False,
) -> None:
    from http import HTTPStatus

    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        # A dev server for pages and tests on other local ports (a vite dev server, a test
        # page): any origin may read it. Nothing here is a secret worth an origin check.
        "Access-Control-Allow-Origin: *",
        "Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS",
        "Access-Control-Allow-Headers: Content-Type",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body))
    await writer.drain()


# --- Command line -------------------------------------------------------------------------------


async def serve(
    settings: RegionsSettings, static_dir: Path | None, streams: tuple[str, ...] = ()
) -> None:
    """Run until SIGINT/SIGTERM, after printing the ``listening`` line; ``streams``: what
    ``GET /streams`` offers."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with LocalRegions(settings=settings, static_dir=static_dir) as regions:
        regions.streams = list(streams)
        print(json.dumps(regions.describe()), flush=True)
        await stop.wait()


LIVE_REQUIRED = ("lease_table", "messages_tables", "streams_endpoint")


def _live_settings(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> LiveSettings | None:
    """``LiveSettings`` from the live-delivery options, or None when none of them is given."""
    given = [name for name in LIVE_REQUIRED if getattr(args, name)]
    if not given:
        if args.reader_claim or args.token_claim or args.stream:
            parser.error("--reader-claim, --token-claim, --stream: need --lease-table too")
        return None
    missing = [f"--{name.replace('_', '-')}" for name in LIVE_REQUIRED if name not in given]
    if missing:
        parser.error(f"live delivery needs {', '.join(missing)} as well")
    tables = tuple(args.messages_tables.split(","))
    if len(tables) != 2 or not all(tables):
        parser.error("--messages-tables: PRIMARY,SECONDARY (two table names)")
    token_claims = []
    for entry in args.token_claim:
        claim, _, values = entry.partition("=")
        if not claim or not values:
            parser.error(f"--token-claim: {entry!r} is not CLAIM=VALUE[,VALUE...]")
        token_claims.append((claim, tuple(v for v in values.split(",") if v)))
    if args.event_source_poll <= 0:
        parser.error("--event-source-poll: seconds above zero")
    return LiveSettings(
        lease_table=args.lease_table,
        messages_tables=(tables[0], tables[1]),
        streams_endpoint=args.streams_endpoint,
        fanout_from_assembly=not args.in_process_fanout,
        reader_claims=tuple(args.reader_claim),
        poll_interval=args.event_source_poll,
        token_claims=tuple(token_claims),
    )


def _fault_rates(text: str) -> tuple[tuple[int, float], ...]:
    """``429=0.01,403=0.001`` (or ``none``) as GatewaySettings' ``management_fault_rates``."""
    if text.strip() == "none":
        return ()
    try:
        pairs = [item.split("=") for item in text.split(",")]
        return tuple((int(status), float(rate)) for status, rate in pairs)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not STATUS=RATE,... or none") from None


def format_fault_rates(rates: tuple[tuple[int, float], ...]) -> str:
    """The ``--management-faults`` argument for ``rates``."""
    return ",".join(f"{status}={rate}" for status, rate in rates) or "none"


def main(argv: list[str] | None = None) -> int:
    """``python -m streamfleet_dev.wsapi.regions --serve``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", required=True, help="run until stopped")
    parser.add_argument("--static-dir", type=Path, default=None, help="files to serve on /")
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--primary-port", type=int, default=0)
    parser.add_argument("--secondary-port", type=int, default=0)
    parser.add_argument("--backend", choices=BACKENDS, default="dynalite")
    parser.add_argument(
        "--management-faults",
        type=_fault_rates,
        default=RegionsSettings.management_fault_rates,
        help="Management API calls answered with an error: STATUS=RATE,... (429=0.01,403=0.001)"
        " or none",
    )
    parser.add_argument("--canary-period", type=float, default=RegionsSettings.canary_period)
    parser.add_argument("--canary-timeout", type=float, default=RegionsSettings.canary_timeout)
    parser.add_argument(
        "--healthy-runs-to-recover", type=int, default=RegionsSettings.healthy_runs_to_recover
    )
    parser.add_argument(
        "--verbose", action="store_true", help="log every decision of the Lambdas (INFO)"
    )
    parser.add_argument(
        "--dynamodb-endpoint",
        default=None,
        help="DynamoDB for every table (default: AWS_ENDPOINT_URL_DYNAMODB, else a server of "
        "--backend); with live delivery it must reach the messages tables on moto",
    )
    live = parser.add_argument_group(
        "live delivery (LiveSettings: --lease-table, --messages-tables and --streams-endpoint)"
    )
    live.add_argument("--lease-table", default=None, help="the fleet's lease table")
    live.add_argument(
        "--messages-tables",
        default=None,
        metavar="PRIMARY,SECONDARY",
        help="the primary's messages table (the fleet's) and the secondary's replica",
    )
    live.add_argument(
        "--streams-endpoint", default=None, help="the server with DynamoDB Streams (moto)"
    )
    live.add_argument(
        "--reader-claim",
        action="append",
        default=[],
        metavar="CLAIM",
        help="a claim the authorizer passes on as reader tags (repeatable)",
    )
    live.add_argument(
        "--token-claim",
        action="append",
        default=[],
        metavar="CLAIM=VALUE[,VALUE]",
        help="a claim every development token carries (repeatable)",
    )
    live.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="ID",
        help="a stream GET /streams offers the demo page (repeatable)",
    )
    live.add_argument(
        "--in-process-fanout",
        action="store_true",
        help="the fan-out in this process instead of from its synthesized asset",
    )
    live.add_argument(
        "--event-source-poll",
        type=float,
        default=LiveSettings.poll_interval,
        help="seconds between the event source's polls of an idle stream",
    )
    args = parser.parse_args(argv)
    live_settings = _live_settings(args, parser)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # A failover drill makes the canaries and the authorizer warn on every run: by default only
    # errors reach the terminal.
    logging.getLogger("streamfleet.wsapi").setLevel(logging.INFO if args.verbose else logging.ERROR)
    try:
        settings = RegionsSettings(
            backend=args.backend,
            http_port=args.http_port,
            gateway_ports=(args.primary_port, args.secondary_port),
            canary_period=args.canary_period,
            canary_timeout=args.canary_timeout,
            healthy_runs_to_recover=args.healthy_runs_to_recover,
            dynamodb_endpoint=args.dynamodb_endpoint,
            live=live_settings,
            management_fault_rates=args.management_faults,
        )
        asyncio.run(serve(settings, args.static_dir, tuple(args.stream)))
    except RegionsError as exc:
        print(f"regions: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
