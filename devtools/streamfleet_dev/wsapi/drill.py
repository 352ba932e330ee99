"""A two-region failover drill of the WebSocket API, on loopback, in seconds.

Everything the production design has, each piece standing in for its AWS counterpart and running
the real runtime code:

* two "regions", each a :class:`~.local_gateway.LocalGateway` (API Gateway) calling the real
  :mod:`.authorizer` and :mod:`.handlers`, with its own state and connections tables on the local
  DynamoDB server (table names carry the region);
* a :class:`Replicator` per direction between the two state tables, behaving like a global table:
  asynchronous (polling every ``replication_interval``), last-writer-wins on
  ``(updated_at_ms, writer_region)``, fed by the table's DynamoDB stream where the backend has
  one (moto) and by a polling scan where it has not (dynalite);
* the real :class:`~.canary.Canary` probing each region every ``canary_period``, with its
  fail-back hysteresis kept in the region's connections table, publishing to a
  :class:`HealthAlarm` (and to CloudWatch when ``AWS_ENDPOINT_URL_CLOUDWATCH`` points at a local
  server);
* a :class:`FailoverResolver` standing in for Route 53 failover routing: the primary while its
  alarm is OK (the alarm fires on 2 of 2 breaching datapoints, missing data breaching), else the
  secondary;
* N :class:`~streamfleet.client.ReconnectingClient` instances whose endpoint provider asks the
  resolver for the "failover name" and mints a fresh token on every attempt.

The scenario: connect every client, bid, make the primary fail (by default the seed article's
way: the handler is throttled, sockets stay open, nothing answers), keep bidding, and measure the
time to detect (resolver switched), the time until every client is served by the secondary
again, and whether every acknowledged bid survived; then recover the primary and check the slow
fail-back (``healthy_runs_to_recover`` good canary runs first) and that the clients, moved back,
find their state there too.

Timings are compressed (canary every 0.2 s, heartbeat 0.3 s / 0.4 s, backoff base 0.05 s): the
same ratios as production (1 min, 30 s / 35 s, 2 s), a few hundred times faster.

Run it: ``python -m streamfleet_dev.wsapi.drill [--clients 8] [--failure throttled|down]
[--backend dynalite|moto] [--markdown]``. Without ``AWS_ENDPOINT_URL_DYNAMODB`` it starts its
own server: dynalite by default, because moto's server does not serialise concurrent
conditional writes on one item (two racing first bids can both be accepted there), which is
exactly the guarantee the auction relies on. It refuses to run against anything but loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from streamfleet import model
from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.client.reconnecting import (
    ClientConfig,
    ConnectionLost,
    Endpoint,
    NotConnected,
    ReconnectingClient,
)
from streamfleet.lease.dynamo import from_item, is_condition_failure, names, to_attr
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from streamfleet.wsapi.canary import (
    Canary,
    CanaryConfig,
    CloudWatchPublisher,
    DynamoHealthStateStore,
    MetricPublisher,
    MintedToken,
)
from streamfleet.wsapi.handlers import (
    HandlerConfig,
    ManagementApiReplier,
    WsApiHandlers,
    make_dynamodb_client,
)
from streamfleet_dev.wsapi.local_gateway import FailureMode, GatewaySettings, LocalGateway
from streamfleet_dev.wsapi.tables import create_wsapi_tables, delete_wsapi_tables

logger = logging.getLogger(__name__)

ISSUER = "https://issuer.drill.local"
AUDIENCE = "streamfleet-wsapi"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


# --- Configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrillConfig:
    """The drill's scale and (compressed) timings."""

    clients: int = 8
    primary: str = "us-east-1"
    secondary: str = "us-west-2"
    failure: FailureMode = FailureMode.THROTTLED
    canary_period: float = 0.2
    canary_timeout: float = 0.15
    healthy_runs_to_recover: int = 3
    alarm_datapoints: int = 2  # "2 of 2": what Route 53's alarm health checks support
    heartbeat_interval: float = 0.3
    heartbeat_timeout: float = 0.4
    backoff_base: float = 0.05
    backoff_cap: float = 0.5
    replication_interval: float = 0.05
    bid_interval: float = 0.15
    bid_timeout: float = 0.5
    bidding_seconds: float = 1.0  # before the failure, and again once everyone reconnected
    deadline_seconds: float = 20.0  # for each phase that waits on something
    auction: str = "a1"
    seed: int | None = None


# --- Replication (global table stand-in) --------------------------------------------------------


@dataclass
class ReplicationStats:
    shipped: int = 0
    # The destination already held a newer version (or this one): last-writer-wins kept it.
    conflicts: int = 0
    max_lag_ms: int = 0
    passes: int = 0


class ChangeFeed(Protocol):
    """Where a replicator learns what changed in its source table."""

    async def read(self) -> list[dict[str, Any]]:
        """Raw DynamoDB images of the items changed since the last read."""


class StreamFeed:
    """The table's DynamoDB stream (new images), read from the oldest record on: what global
    tables replicate from. Needs a backend with Streams (moto's server, AWS)."""

    def __init__(self, streams: AsyncClient, stream_arn: str):
        self.streams = streams
        self.stream_arn = stream_arn
        self._iterators: dict[str, str] = {}

    async def read(self) -> list[dict[str, Any]]:
        if not self._iterators:
            await self._open_shards()
        images: list[dict[str, Any]] = []
        for shard_id, iterator in list(self._iterators.items()):
            page = await self.streams.call("get_records", ShardIterator=iterator, Limit=1000)
            for record in page.get("Records", []):
                image = record.get("dynamodb", {}).get("NewImage")
                if record.get("eventName") != "REMOVE" and image:
                    images.append(image)
            if page.get("NextShardIterator"):
                self._iterators[shard_id] = page["NextShardIterator"]
            else:  # a closed shard: its children appear in the next describe
                del self._iterators[shard_id]
        return images

    async def _open_shards(self) -> None:
        description = await self.streams.call("describe_stream", StreamArn=self.stream_arn)
        for shard in description["StreamDescription"].get("Shards", []):
            response = await self.streams.call(
                "get_shard_iterator",
                StreamArn=self.stream_arn,
                ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON",
            )
            self._iterators[shard["ShardId"]] = response["ShardIterator"]


class ScanFeed:
    """A consistent scan per read, reporting the items whose version changed since the last one:
    for backends without Streams (dynalite). O(table) per read: fine for a drill."""

    def __init__(self, client: AsyncClient, table: str):
        self.client = client
        self.table = table
        self._seen: dict[str, tuple[int, str]] = {}

    async def read(self) -> list[dict[str, Any]]:
        images: list[dict[str, Any]] = []
        params: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        while True:
            page = await self.client.call("scan", **params)
            for raw in page.get("Items", []):
                version = _version_of(from_item(raw) or {})
                pk = raw[model.PK]["S"]
                if version is not None and self._seen.get(pk) != version:
                    self._seen[pk] = version
                    images.append(raw)
            if "LastEvaluatedKey" not in page:
                return images
            params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _version_of(item: dict[str, Any]) -> tuple[int, str] | None:
    """An item's last-writer-wins version; ``None`` for anything that is not a state version
    (moto, for one, streams a bare key before the full image of an upsert)."""
    if model.UPDATED_AT_MS not in item:
        return None
    return int(item[model.UPDATED_AT_MS]), str(item.get(model.WRITER_REGION, ""))


class Replicator:
    """Applies one region's state-table changes to another's, asynchronously, last-writer-wins.

    Like a global table: every ``interval`` it reads what changed in the source (a
    :class:`ChangeFeed`) and writes each new image into the destination with a conditional put
    that replaces only an older version, by ``(updated_at_ms, writer_region)``. Images written
    *in* the destination region are never shipped back to it (that is how a change stops
    bouncing). Deletes are not replicated: the handlers never delete state items.
    """

    def __init__(
        self,
        *,
        feed: ChangeFeed,
        destination: AsyncClient,
        destination_table: str,
        destination_region: str,
        interval: float,
    ):
        self.feed = feed
        self.destination = destination
        self.destination_table = destination_table
        self.destination_region = destination_region
        self.interval = interval
        self.stats = ReplicationStats()
        self.paused = False

    async def run(self, stop: asyncio.Event) -> None:
        """Replicate until ``stop`` is set."""
        while not stop.is_set():
            if not self.paused:
                try:
                    await self.poll_once()
                except Exception as exc:  # a failed poll is retried by the next one
                    logger.warning("replication poll failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    async def poll_once(self) -> int:
        """Read what changed and apply it; the number of items shipped."""
        self.stats.passes += 1
        latest: dict[str, tuple[tuple[int, str], dict[str, Any]]] = {}
        for image in await self.feed.read():
            item = from_item(image) or {}
            version = _version_of(item)
            if version is None or version[1] == self.destination_region:
                continue
            pk = str(item[model.PK])
            # Only the newest version of an item matters: the conditional put refuses older
            # ones anyway, so a burst of bids on one auction costs one write, not hundreds.
            if pk not in latest or latest[pk][0] < version:
                latest[pk] = (version, image)
        # Different items are independent, so they are shipped concurrently (the client's
        # executor bounds the parallelism).
        results = await asyncio.gather(
            *(self._ship(version, image) for version, image in latest.values())
        )
        return sum(results)

    async def _ship(self, version: tuple[int, str], image: dict[str, Any]) -> int:
        try:
            await self.destination.call(
                "put_item",
                TableName=self.destination_table,
                Item=image,
                ConditionExpression=(
                    "attribute_not_exists(#pk) OR #updated_at_ms < :ts OR "
                    "(#updated_at_ms = :ts AND #writer_region < :region)"
                ),
                ExpressionAttributeNames=names(model.PK, model.UPDATED_AT_MS, model.WRITER_REGION),
                ExpressionAttributeValues={
                    ":ts": to_attr(version[0]),
                    ":region": to_attr(version[1]),
                },
            )
        except Exception as exc:
            if not is_condition_failure(exc):
                raise
            self.stats.conflicts += 1
            return 0
        self.stats.shipped += 1
        self.stats.max_lag_ms = max(self.stats.max_lag_ms, time.time_ns() // 1_000_000 - version[0])
        return 1


# --- Alarm and DNS (CloudWatch + Route 53 stand-ins) --------------------------------------------


class HealthAlarm:
    """A CloudWatch alarm on ``WebSocketHealth < 1``: ALARM when the last ``datapoints`` values
    all breach, or when no datapoint arrived for ``datapoints`` periods (missing data breaching).
    Also a :class:`~.canary.MetricPublisher`, so the canary publishes straight into it."""

    def __init__(self, *, datapoints: int, period: float, clock: Callable[[], float]):
        self.datapoints = datapoints
        self.period = period
        self._clock = clock
        self._values: list[int] = []
        self._last_at: float | None = None

    async def publish(self, api_id: str, value: int, probe_healthy: bool) -> None:
        self._values = (
            [*self._values[-(self.datapoints - 1) :], value] if self.datapoints > 1 else [value]
        )
        self._last_at = self._clock()

    @property
    def has_data(self) -> bool:
        """Whether any datapoint arrived yet."""
        return self._last_at is not None

    def in_alarm(self) -> bool:
        """The alarm's state now."""
        if self._last_at is None:
            return False  # no data yet at all: INSUFFICIENT_DATA; the drill waits for data
        if self._clock() - self._last_at > self.datapoints * self.period * 1.5:
            return True
        return len(self._values) == self.datapoints and all(v < 1 for v in self._values)


@dataclass
class FailoverResolver:
    """Route 53 failover routing: the primary's URL while its alarm is OK, else the secondary's
    (if that one is healthy; with both unhealthy Route 53 answers with the primary)."""

    primary: str
    secondary: str
    urls: dict[str, str]
    alarms: dict[str, HealthAlarm]
    clock: Callable[[], float]
    history: list[tuple[float, str]] = field(default_factory=list)

    def region(self) -> str:
        """The region the failover name resolves to now; records every change."""
        if not self.alarms[self.primary].in_alarm():
            current = self.primary
        elif not self.alarms[self.secondary].in_alarm():
            current = self.secondary
        else:
            current = self.primary
        if not self.history or self.history[-1][1] != current:
            self.history.append((self.clock(), current))
        return current

    def url(self) -> str:
        return self.urls[self.region()]

    def switched_to(self, region: str, after: float) -> float | None:
        """When the name started resolving to ``region`` after time ``after``."""
        return next((t for t, r in self.history if r == region and t >= after), None)


# --- Clients ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AckedBid:
    user: str
    amount: int
    accepted: bool
    highest: int
    region: str
    at: float


class BidBook:
    """Amounts for the bidders: mostly just above the highest seen (accepted), sometimes at or
    below it (refused), so both paths of the conditional write are exercised."""

    def __init__(self, rng: random.Random):
        self._rng = rng
        self.issued = 0

    def next_amount(self) -> int:
        if self.issued and self._rng.random() < 0.2:
            return self._rng.randint(max(1, self.issued - 5), self.issued)
        self.issued += self._rng.randint(1, 3)
        return self.issued


class DrillClient:
    """One user: a reconnecting client plus a bidding loop and the records the drill checks."""

    def __init__(
        self,
        index: int,
        *,
        resolver: FailoverResolver,
        key: jwt.SigningKey,
        config: DrillConfig,
        book: BidBook,
        clock: Callable[[], float],
        rng: random.Random,
    ):
        self.user = f"user-{index:03d}"
        self.resolver = resolver
        self.key = key
        self.config = config
        self.book = book
        self.clock = clock
        self.rng = random.Random(rng.random())
        self.token_calls = 0
        self.ready_at: list[tuple[float, str]] = []  # (time, region) of every restored state
        self.bids: list[AckedBid] = []
        self.unacknowledged = 0
        self.client = ReconnectingClient(
            self.provider,
            ClientConfig(
                heartbeat_interval=config.heartbeat_interval,
                heartbeat_timeout=config.heartbeat_timeout,
                backoff_base=config.backoff_base,
                backoff_cap=config.backoff_cap,
                open_timeout=2.0,
                close_timeout=0.5,
                request_timeout=config.bid_timeout,
                get_state_fields=(("auction", config.auction),),
            ),
            on_state=self._on_state,
            rng=random.Random(rng.random()),
            name=self.user,
        )

    def provider(self, attempt: int) -> Endpoint:
        """Resolve the failover name and mint a fresh token: called on every attempt."""
        self.token_calls += 1
        now = int(time.time())
        token = jwt.sign(
            {"sub": self.user, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 300},
            self.key,
        )
        return Endpoint(self.resolver.url(), token)

    def _on_state(self, message: dict[str, Any]) -> None:
        if str(message.get("requestId") or "").startswith(f"{self.user}-state-"):
            self.ready_at.append((self.clock(), str(message.get("region"))))

    def restored_in(self, region: str, after: float) -> float | None:
        """When this client's state was first restored from ``region`` after ``after``."""
        return next((t for t, r in self.ready_at if r == region and t >= after), None)

    async def bid_loop(self, bidding: asyncio.Event, stop: asyncio.Event) -> None:
        """Bid every ``bid_interval`` while ``bidding`` is set, until ``stop``."""
        while not stop.is_set():
            if not bidding.is_set() or not self.client.ready:
                await asyncio.sleep(0.02)
                continue
            amount = self.book.next_amount()
            try:
                reply = await self.client.request(
                    {"action": model.WS_ROUTE_BID, "auction": self.config.auction, "amount": amount}
                )
            except (NotConnected, ConnectionLost, TimeoutError):
                self.unacknowledged += 1
            else:
                if reply.get("type") == model.WS_REPLY_BID:
                    self.bids.append(
                        AckedBid(
                            self.user,
                            amount,
                            bool(reply["accepted"]),
                            int(reply["highest"]),
                            str(reply["region"]),
                            self.clock(),
                        )
                    )
                else:
                    self.unacknowledged += 1
            await asyncio.sleep(self.config.bid_interval * (0.5 + self.rng.random()))


# --- The drill ----------------------------------------------------------------------------------


@dataclass
class Region:
    name: str
    gateway: LocalGateway
    canary: Canary
    alarm: HealthAlarm
    state_client: AsyncClient


def check_local_endpoint(variable: str) -> str:
    """The loopback URL in ``variable``; refuses anything else (a drill must never touch AWS)."""
    value = os.environ.get(variable) or os.environ.get("AWS_ENDPOINT_URL") or ""
    if urlsplit(value).hostname not in LOOPBACK_HOSTS:
        raise RuntimeError(f"{variable}: the drill runs only against a loopback endpoint")
    return value


async def _wait_for(predicate: Callable[[], bool], deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"drill: {what} did not happen within {deadline:g} s")
        await asyncio.sleep(0.01)


async def _scan(client: AsyncClient, table: str) -> dict[str, dict[str, Any]]:
    items: dict[str, dict[str, Any]] = {}
    params: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = await client.call("scan", **params)
        for raw in page.get("Items", []):
            item = from_item(raw) or {}
            items[item[model.PK]] = item
        if "LastEvaluatedKey" not in page:
            return items
        params["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def run_drill(config: DrillConfig | None = None) -> dict[str, Any]:
    """Run the whole drill; the summary (``summary["passed"]`` says whether every check held)."""
    config = config or DrillConfig()
    dynamodb_endpoint = check_local_endpoint("AWS_ENDPOINT_URL_DYNAMODB")
    # boto3 has no default link between the two: without this, the streams client would dial
    # the real streams.dynamodb.<region>.amazonaws.com.
    streams_endpoint = (
        check_local_endpoint("AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB_STREAMS")
        else dynamodb_endpoint
    )
    publish_to_cloudwatch = bool(
        os.environ.get("AWS_ENDPOINT_URL_CLOUDWATCH") or os.environ.get("AWS_ENDPOINT_URL")
    )
    if publish_to_cloudwatch:
        check_local_endpoint("AWS_ENDPOINT_URL_CLOUDWATCH")
    rng = random.Random(config.seed)
    loop = asyncio.get_running_loop()
    clock = loop.time
    suffix = uuid.uuid4().hex[:8]
    region_names = (config.primary, config.secondary)
    # Table names include the region: not every local backend keeps regions apart (dynalite
    # does not), and in AWS each region has its own replica anyway.
    state_tables = {name: f"drill-state-{name}-{suffix}" for name in region_names}
    connections_tables = {name: f"drill-connections-{name}-{suffix}" for name in region_names}
    sync_clients = {name: make_dynamodb_client(name) for name in region_names}
    stream_arns: dict[str, str | None] = {}
    for name in region_names:
        await asyncio.to_thread(
            create_wsapi_tables,
            sync_clients[name],
            state_table=state_tables[name],
            connections_table=connections_tables[name],
            stream=True,
        )
        description = await asyncio.to_thread(
            sync_clients[name].describe_table, TableName=state_tables[name]
        )
        stream_arns[name] = description["Table"].get("LatestStreamArn")

    key = await asyncio.to_thread(jwt.generate_signing_key, jwt.RS256, f"drill-{suffix}")
    authorizer = Authorizer(
        AuthorizerConfig(
            issuer=ISSUER, audience=AUDIENCE, keys=json.dumps(jwt.jwks_document([key]))
        )
    )
    settings = ClientSettings(threads=4)
    regions: dict[str, Region] = {}
    async_clients: list[AsyncClient] = []

    def async_client(service: str, region: str, **kwargs: Any) -> AsyncClient:
        client = AsyncClient(service, settings, region_name=region, **kwargs)
        async_clients.append(client)
        return client

    stop = asyncio.Event()
    background: list[asyncio.Task[Any]] = []
    drill_clients: list[DrillClient] = []
    try:
        for name in region_names:

            def factory(endpoint: str, name: str = name) -> WsApiHandlers:
                return WsApiHandlers(
                    HandlerConfig(state_tables[name], connections_tables[name], name, endpoint),
                    dynamodb=sync_clients[name],
                )

            gateway = await LocalGateway(
                GatewaySettings(region=name, api_id=f"api-{name}"),
                authorizer=authorizer,
                handler_factory=factory,
            ).start()
            # Creating a boto3 client holds the GIL for a long moment: do it now, not during
            # the first reply of the measured phases.
            handlers = gateway.handler
            assert isinstance(handlers, WsApiHandlers)
            if isinstance(handlers.replier, ManagementApiReplier):
                await asyncio.to_thread(handlers.replier.client_for, {})
            alarm = HealthAlarm(
                datapoints=config.alarm_datapoints, period=config.canary_period, clock=clock
            )
            publishers: list[MetricPublisher] = [alarm]
            if publish_to_cloudwatch:
                publishers.append(CloudWatchPublisher(async_client("cloudwatch", name)))
            canary = Canary(
                CanaryConfig(
                    endpoint_url=gateway.url,
                    api_id=f"api-{name}",
                    timeout_seconds=config.canary_timeout,
                    healthy_runs_to_recover=config.healthy_runs_to_recover,
                    failures_to_trip=config.alarm_datapoints,
                    state_table=connections_tables[name],
                ),
                tokens=MintedToken(key, ISSUER, AUDIENCE, subject=f"canary-{name}"),
                store=DynamoHealthStateStore(
                    async_client("dynamodb", name),
                    table_name=connections_tables[name],
                    api_id=f"api-{name}",
                ),
                publishers=publishers,
            )
            regions[name] = Region(name, gateway, canary, alarm, async_client("dynamodb", name))

        primary, secondary = regions[config.primary], regions[config.secondary]
        resolver = FailoverResolver(
            config.primary,
            config.secondary,
            {name: region.gateway.url for name, region in regions.items()},
            {name: region.alarm for name, region in regions.items()},
            clock,
        )

        def feed(region: Region) -> ChangeFeed:
            arn = stream_arns[region.name]
            if arn is None:  # no Streams on this backend (dynalite)
                return ScanFeed(region.state_client, state_tables[region.name])
            streams = async_client("dynamodbstreams", region.name, endpoint_url=streams_endpoint)
            return StreamFeed(streams, arn)

        replicators = [
            Replicator(
                feed=feed(a),
                destination=b.state_client,
                destination_table=state_tables[b.name],
                destination_region=b.name,
                interval=config.replication_interval,
            )
            for a, b in ((primary, secondary), (secondary, primary))
        ]

        async def canary_loop(region: Region) -> None:
            while not stop.is_set():
                started = clock()
                await region.canary.run_once()
                resolver.region()  # evaluate "DNS" as soon as a datapoint lands
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stop.wait(), max(0.0, started + config.canary_period - clock())
                    )

        async def watch_dns() -> None:
            while not stop.is_set():
                resolver.region()  # missing-data transitions happen between datapoints
                await asyncio.sleep(0.02)

        background += [loop.create_task(canary_loop(r)) for r in regions.values()]
        background += [loop.create_task(r.run(stop)) for r in replicators]
        background.append(loop.create_task(watch_dns()))

        # Phase 0: both regions report data; the name resolves to the primary.
        await _wait_for(
            lambda: all(r.alarm.has_data for r in regions.values()),
            config.deadline_seconds,
            "first canary datapoints",
        )
        book = BidBook(rng)
        drill_clients = [
            DrillClient(
                i, resolver=resolver, key=key, config=config, book=book, clock=clock, rng=rng
            )
            for i in range(config.clients)
        ]
        for client in drill_clients:
            await client.client.start()
        await asyncio.gather(*(c.client.wait_ready(config.deadline_seconds) for c in drill_clients))
        connected_to_primary = sum(c.client.region == config.primary for c in drill_clients)

        # Phase 1: bid on the primary.
        bidding = asyncio.Event()
        bidding.set()
        background += [loop.create_task(c.bid_loop(bidding, stop)) for c in drill_clients]
        await asyncio.sleep(config.bidding_seconds)

        # Phase 2: the primary fails.
        failed_at = clock()
        primary.gateway.fail(config.failure)
        await _wait_for(
            lambda: resolver.switched_to(config.secondary, failed_at) is not None,
            config.deadline_seconds,
            "failover to the secondary",
        )
        detected_at = resolver.switched_to(config.secondary, failed_at)
        await _wait_for(
            lambda: all(c.restored_in(config.secondary, failed_at) for c in drill_clients),
            config.deadline_seconds,
            "every client reconnected to the secondary",
        )
        reconnect_times = [
            c.restored_in(config.secondary, failed_at) - failed_at for c in drill_clients
        ]
        await asyncio.sleep(config.bidding_seconds)  # bid on the secondary
        bidding.clear()
        await asyncio.sleep(config.bid_timeout)  # let the last requests end

        # Phase 3: the primary recovers; the name comes back only after the hysteresis.
        recovered_at = clock()
        primary.gateway.recover()
        await _wait_for(
            lambda: resolver.switched_to(config.primary, recovered_at) is not None,
            config.deadline_seconds,
            "fail-back to the primary",
        )
        failback_at = resolver.switched_to(config.primary, recovered_at)
        # Connections live at most 2 hours in API Gateway; the clients reconnect at some point
        # and follow the name back. The drill makes that point "now".
        moved_back_at = clock()
        for client in drill_clients:
            client.client.reconnect()
        await _wait_for(
            lambda: all(c.restored_in(config.primary, moved_back_at) for c in drill_clients),
            config.deadline_seconds,
            "every client back on the primary",
        )

        # Phase 4: replication converges; check every acknowledged bid.
        async def tables_agree() -> bool:
            a = await _scan(primary.state_client, state_tables[primary.name])
            b = await _scan(secondary.state_client, state_tables[secondary.name])
            return a == b

        end = time.monotonic() + config.deadline_seconds
        while not await tables_agree():
            if time.monotonic() > end:
                a = await _scan(primary.state_client, state_tables[primary.name])
                b = await _scan(secondary.state_client, state_tables[secondary.name])
                differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                raise TimeoutError(
                    f"drill: the two state tables did not converge; they differ on {differing[:5]}"
                    + "".join(f"\n{k}: {a.get(k)} != {b.get(k)}" for k in differing[:3])
                )
            await asyncio.sleep(config.replication_interval)
        final = {
            name: await _scan(r.state_client, state_tables[name]) for name, r in regions.items()
        }
        summary = _summarise(
            config,
            drill_clients=drill_clients,
            final=final,
            failed_at=failed_at,
            detected_at=detected_at,
            reconnect_times=reconnect_times,
            recovered_at=recovered_at,
            failback_at=failback_at,
            connected_to_primary=connected_to_primary,
            replicators=replicators,
            regions=regions,
            resolver_history=resolver.history,
        )
    finally:
        stop.set()
        for client in drill_clients:
            await client.client.close()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for region in regions.values():
            await region.gateway.stop()
        for client in async_clients:
            client.close()
        for name in region_names:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    delete_wsapi_tables,
                    sync_clients[name],
                    state_table=state_tables[name],
                    connections_table=connections_tables[name],
                )
    return summary


def _summarise(
    config: DrillConfig,
    *,
    drill_clients: list[DrillClient],
    final: dict[str, dict[str, dict[str, Any]]],
    failed_at: float,
    detected_at: float | None,
    reconnect_times: list[float],
    recovered_at: float,
    failback_at: float | None,
    connected_to_primary: int,
    replicators: list[Replicator],
    regions: dict[str, Region],
    resolver_history: list[tuple[float, str]],
) -> dict[str, Any]:
    acked = [bid for c in drill_clients for bid in c.bids]
    accepted = [bid for bid in acked if bid.accepted]
    lost = {
        name: [
            bid.amount for bid in accepted if model.bid_pk(config.auction, bid.amount) not in items
        ]
        for name, items in final.items()
    }
    highest = {
        name: int((items.get(model.auction_pk(config.auction)) or {}).get(model.HIGHEST_AMOUNT, 0))
        for name, items in final.items()
    }
    recorded_bids = {
        name: sorted(
            int(item[model.BID_AMOUNT])
            for pk, item in items.items()
            if pk.startswith(model.bid_pk(config.auction, 0)[: -model.BID_AMOUNT_DIGITS])
        )
        for name, items in final.items()
    }
    max_accepted = max((bid.amount for bid in accepted), default=0)
    users_restored = 0
    for client in drill_clients:
        mine = [bid.amount for bid in accepted if bid.user == client.user]
        state = (client.client.state or {}).get("state") or {}
        last = (state.get("lastBid") or {}).get("amount") or 0
        if client.client.region == config.primary and last >= max(mine, default=0):
            users_restored += 1
    period = config.canary_period
    failback_seconds = None if failback_at is None else failback_at - recovered_at
    checks = {
        "all_clients_started_on_primary": connected_to_primary == config.clients,
        "detected": detected_at is not None,
        "all_clients_reconnected_to_secondary": len(reconnect_times) == config.clients,
        "no_acknowledged_bid_lost": all(not amounts for amounts in lost.values()),
        "highest_is_the_highest_recorded_bid": all(
            highest[name] == (recorded_bids[name] or [0])[-1] >= max_accepted for name in final
        ),
        "bids_accepted_on_both_regions": bool(accepted)
        and {bid.region for bid in accepted} == {config.primary, config.secondary},
        "no_failover_before_the_failure": all(
            region == config.primary for t, region in resolver_history if t < failed_at
        ),
        "failback_not_before_hysteresis": failback_seconds is not None
        and failback_seconds >= (config.healthy_runs_to_recover - 1) * period,
        "users_restored_on_primary_after_failback": users_restored == config.clients,
        "token_provider_called_per_attempt": all(
            c.token_calls == c.client.attempts for c in drill_clients
        ),
    }
    return {
        "clients": config.clients,
        "failure": config.failure.value,
        "regions": {"primary": config.primary, "secondary": config.secondary},
        "timings": {
            "canary_period_s": period,
            "alarm": f"{config.alarm_datapoints} of {config.alarm_datapoints} datapoints",
            "healthy_runs_to_recover": config.healthy_runs_to_recover,
            "heartbeat_interval_s": config.heartbeat_interval,
            "heartbeat_timeout_s": config.heartbeat_timeout,
            "backoff_base_s": config.backoff_base,
            "backoff_cap_s": config.backoff_cap,
            "replication_interval_s": config.replication_interval,
        },
        "time_to_detect_s": _seconds(None if detected_at is None else detected_at - failed_at),
        "time_to_reconnect_all_s": _seconds(max(reconnect_times, default=math.nan)),
        "median_reconnect_s": _seconds(statistics.median(reconnect_times)),
        "time_to_failback_s": _seconds(failback_seconds),
        "bids": {
            "acknowledged": len(acked),
            "accepted": len(accepted),
            "refused": len(acked) - len(accepted),
            "unacknowledged": sum(c.unacknowledged for c in drill_clients),
            "accepted_on": {name: sum(bid.region == name for bid in accepted) for name in final},
            "lost": {name: len(amounts) for name, amounts in lost.items()},
            "highest": highest,
            "max_acknowledged": max_accepted,
        },
        "clients_detail": {
            "restored_on_primary_after_failback": users_restored,
            "forced_reconnects": sum(c.client.forced_reconnects for c in drill_clients),
            "attempts": sum(c.client.attempts for c in drill_clients),
            "token_provider_calls": sum(c.token_calls for c in drill_clients),
            "auth_failures": sum(c.client.auth_failures for c in drill_clients),
        },
        "replication": {
            "feed": type(replicators[0].feed).__name__,
            **{f"into {r.destination_region}": asdict(r.stats) for r in replicators},
        },
        "gateways": {
            name: {
                "connects": region.gateway.stats.connects,
                "rejected": region.gateway.stats.rejected,
                "failed_messages": region.gateway.stats.failed_messages,
            }
            for name, region in regions.items()
        },
        "checks": checks,
        "passed": all(checks.values()),
    }


def markdown(summary: dict[str, Any]) -> str:
    """The summary as a short Markdown report."""
    bids = summary["bids"]
    rows = [
        ("Failure", summary["failure"]),
        ("Clients", summary["clients"]),
        ("Time to detect (s)", summary["time_to_detect_s"]),
        (
            "Time until every client was served by the secondary (s)",
            summary["time_to_reconnect_all_s"],
        ),
        ("Median client reconnect (s)", summary["median_reconnect_s"]),
        ("Time to fail back (s)", summary["time_to_failback_s"]),
        ("Bids acknowledged / accepted", f"{bids['acknowledged']} / {bids['accepted']}"),
        ("Accepted bids lost", ", ".join(f"{k}: {v}" for k, v in bids["lost"].items())),
        ("Unacknowledged bids (outage)", bids["unacknowledged"]),
    ]
    lines = ["| Measure | Value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines += ["| Check | Result |", "|---|---|"]
    lines += [f"| {k} | {'pass' if v else 'FAIL'} |" for k, v in summary["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the drill, print the summary; exit 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=DrillConfig.clients)
    parser.add_argument(
        "--failure",
        choices=[FailureMode.THROTTLED.value, FailureMode.DOWN.value],
        default=FailureMode.THROTTLED.value,
    )
    parser.add_argument(
        "--backend",
        choices=["dynalite", "moto"],
        default="dynalite",
        help="local DynamoDB to start when AWS_ENDPOINT_URL_DYNAMODB is not set",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--markdown", action="store_true", help="print Markdown, not JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = DrillConfig(clients=args.clients, failure=FailureMode(args.failure), seed=args.seed)
    from streamfleet_dev.local.servers import dynalite_server, moto_server

    started = []
    try:
        if not os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"):
            factory = dynalite_server if args.backend == "dynalite" else moto_server
            dynamodb = factory().start()
            started.append(dynamodb)
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb.endpoint
            for name, value in {
                "AWS_ACCESS_KEY_ID": "local",
                "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_DEFAULT_REGION": config.primary,
            }.items():
                os.environ.setdefault(name, value)
            # The canaries' PutMetricData goes to moto's CloudWatch, never to AWS.
            if not os.environ.get("AWS_ENDPOINT_URL_CLOUDWATCH"):
                cloudwatch = dynamodb if args.backend == "moto" else moto_server().start()
                if cloudwatch is not dynamodb:
                    started.append(cloudwatch)
                os.environ["AWS_ENDPOINT_URL_CLOUDWATCH"] = cloudwatch.endpoint
        summary = asyncio.run(run_drill(config))
    finally:
        for server in started:
            server.stop()
    print(markdown(summary) if args.markdown else json.dumps(summary, indent=2))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
