"""A two-region failover drill of the WebSocket API, on loopback, in seconds.

It runs on :class:`~.regions.LocalRegions`, everything the production design has, each piece
standing in for its AWS counterpart and running the real runtime code: two "regions" (a
:class:`~streamfleet_dev.emulator.websocket_gateway.LocalGateway` each, calling the real authorizer
and handlers, with their own tables), a
:class:`~streamfleet_dev.emulator.global_tables.StateReplication` between them (a global table:
asynchronous, the last writer by its own clock wins, deletes too), the real canary per region
(fail-back hysteresis in its connections table; closing every client connection of its region while
the region reports unhealthy), a :class:`~streamfleet_dev.emulator.failover.HealthAlarm` per region
and the :class:`~streamfleet_dev.emulator.failover.FailoverResolver` (Route 53 failover routing). On
top of that, N :class:`~streamfleet_client.ReconnectingClient` instances whose endpoint provider
asks the resolver for the "failover name" and mints a fresh token on every attempt.

The scenario: connect every client, bid, take the primary's canary's signing key away for a
few runs (a fault of the canary's own: it must page as such and move nobody), rotate the
canaries' key the two wrong ways round (the secret changed before the authorizers accept the
new key, then the old key dropped at once: nothing may move), make the primary
fail (by default the hardest way to
notice: the handler is throttled, sockets stay open, nothing answers; or the Region is down; or
only its state store is, so handshakes fail while the gateway runs), keep bidding, and measure
the time to detect (resolver switched), the time until every client is served by the secondary
again, and whether every acknowledged bid survived. With the primary's store down the auctions'
home cannot be reached, so the secondary must refuse bids as retryable, never accept one its
replica cannot judge. While the name answers with the secondary, the secondary's own canary is
made to trip (its handlers throttled, as by the arriving crowd): the name must stay, and that
canary must close no connection. Then recover the primary and check the slow fail-back
(``healthy_runs_to_recover`` good canary runs first) and that the clients, moved back, find
their state there too.

Timings are compressed (canary every 0.2 s, heartbeat 0.3 s / 0.4 s, backoff base 0.05 s), a
few hundred times faster than production (canary every minute, a heartbeat after 20 s without a
reply and 10 s for its ``pong``, backoff base 2 s). A client can leave the failed region two
ways, and the summary counts both: its own rule (a heartbeat without a ``pong``) or the canary
closing its connection (what moves third-party clients).

Run it: ``python -m streamfleet_dev.wsapi.drill [--clients 8] [--failures throttled,down,store]
[--backend dynalite|moto] [--markdown] [--only failover|live]``. After this failover drill it
runs the end-to-end drill of live delivery (:mod:`.live_drill`: the real fleet, both regions'
fan-out, Python clients and browser pages, a worker ``kill -9``, a network drop and a regional
failover, and the exactly-once check); ``--only`` runs one of the two.

Without ``AWS_ENDPOINT_URL_DYNAMODB`` the failover drill starts its own server: dynalite by
default, because moto's server does not serialise concurrent conditional writes on one item
(two racing first bids can both be accepted there), which is exactly the guarantee the auction
relies on. It refuses to run against anything but loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.lease.dynamo import from_item
from streamfleet.wsapi import jwt
from streamfleet.wsapi.canary.tokens import SecretToken
from streamfleet_auction import names as auction_names
from streamfleet_client import (
    ClientConfig,
    ConnectionLost,
    Endpoint,
    NotConnected,
    ReconnectingClient,
)
from streamfleet_dev import pages
from streamfleet_dev.emulator.failover import FailoverResolver, HealthAlarm
from streamfleet_dev.emulator.global_tables import (
    ChangeFeed,
    ReplicationStats,
    ScanFeed,
    StateReplication,
    StreamFeed,
)
from streamfleet_dev.emulator.websocket_gateway import FailureMode
from streamfleet_dev.wsapi.regions import LocalRegions, Region, RegionsError, RegionsSettings

# Re-exported: the drill's building blocks live in their own modules now.
__all__ = [
    "ChangeFeed",
    "DrillConfig",
    "FailoverResolver",
    "HealthAlarm",
    "ReplicationStats",
    "ScanFeed",
    "StateReplication",
    "StreamFeed",
    "markdown",
    "run_drill",
]

logger = logging.getLogger(__name__)


# --- Configuration ------------------------------------------------------------------------------


class DrillFailure(StrEnum):
    """How the primary fails."""

    THROTTLED = FailureMode.THROTTLED.value  # handlers do not run; sockets stay open
    DOWN = FailureMode.DOWN.value  # sockets dropped, handshakes refused
    STORE = "store"  # the handlers' DynamoDB stops answering; the gateway runs


@dataclass(frozen=True)
class DrillConfig:
    """The drill's scale and (compressed) timings."""

    clients: int = 8
    primary: str = "us-east-1"
    secondary: str = "us-west-2"
    failure: DrillFailure = DrillFailure.THROTTLED
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
    # The canary closes the clients' connections while the region is unhealthy (server-driven
    # failover); off, only the clients' own missed-pong rule moves them.
    disconnect_when_unhealthy: bool = True
    # While the name answers with the secondary, trip the secondary's canary too.
    trip_secondary: bool = True
    # Before the failure, the primary's canary cannot read its key for a few runs.
    break_canary_key: bool = True
    # Then the canaries' key is rotated the two wrong ways round (needs a Secrets Manager:
    # AWS_ENDPOINT_URL_SECRETS_MANAGER).
    rotate_canary_key: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "failure", DrillFailure(self.failure))


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
        regions: LocalRegions,
        config: DrillConfig,
        book: BidBook,
        clock: Callable[[], float],
        rng: random.Random,
    ):
        self.user = f"user-{index:03d}"
        self.regions = regions
        self.config = config
        self.book = book
        self.clock = clock
        self.rng = random.Random(rng.random())
        self.token_calls = 0
        self.ready_at: list[tuple[float, str]] = []  # (time, region) of every restored state
        self.bids: list[AckedBid] = []
        self.unacknowledged = 0
        # Bids that may have been applied although no answer said so (timed out, connection
        # lost, refused as retryable: the store or the auctions' home did not answer): a store
        # outage can apply one without its record.
        self.unanswered_amounts: set[int] = set()
        self.refusals: Counter[str] = Counter()  # error replies to bids, by error code
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

    def provider(self, attempt: int, *, force_refresh: bool = False) -> Endpoint:
        """Resolve the failover name and mint a fresh token: called on every attempt (a token
        is minted every time, so ``force_refresh`` changes nothing here)."""
        self.token_calls += 1
        token = self.regions.mint_token(self.user, expires_in=300)
        return Endpoint(self.regions.resolve()["url"], token)

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
                    {
                        "action": auction_names.WS_ROUTE_BID,
                        "auction": self.config.auction,
                        "amount": amount,
                    }
                )
            except NotConnected:  # never sent
                self.unacknowledged += 1
            except (ConnectionLost, TimeoutError):
                self.unacknowledged += 1
                self.unanswered_amounts.add(amount)
            else:
                if reply.get("type") == auction_names.WS_REPLY_BID:
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
                    self.refusals[str(reply.get("error"))] += 1
                    if reply.get("retryable"):  # the store (or the home) did not answer
                        self.unanswered_amounts.add(amount)
            await asyncio.sleep(self.config.bid_interval * (0.5 + self.rng.random()))


# --- The drill ----------------------------------------------------------------------------------


async def _wait_for(
    predicate: Callable[[], bool],
    deadline: float,
    what: str,
    detail: Callable[[], str] | None = None,
) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            more = f" ({detail()})" if detail is not None else ""
            raise TimeoutError(f"drill: {what} did not happen within {deadline:g} s{more}")
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


def _whereabouts(clients: list[DrillClient], resolver: FailoverResolver, since: float) -> str:
    """Where each client is and what the name resolved to since ``since``: for a failure."""
    names = [(round(t - since, 3), r) for t, r in resolver.history if t >= since - 5]
    where = {c.user: (c.client.region, c.client.status.value) for c in clients}
    return f"resolver since: {names}; clients: {where}"


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def regions_settings(config: DrillConfig) -> RegionsSettings:
    """The local regions the drill runs on, with its compressed timings."""
    return RegionsSettings(
        primary=config.primary,
        secondary=config.secondary,
        canary_period=config.canary_period,
        canary_timeout=config.canary_timeout,
        healthy_runs_to_recover=config.healthy_runs_to_recover,
        alarm_datapoints=config.alarm_datapoints,
        replication_interval=config.replication_interval,
        disconnect_when_unhealthy=config.disconnect_when_unhealthy,
        table_prefix="drill",
        fault_seed=config.seed,
        # Its clients bid, and it checks that every acknowledged bid survives: the demo auction.
        handler_entry=auction_names.HANDLER_ENTRY,
    )


async def run_drill(config: DrillConfig | None = None) -> dict[str, Any]:
    """Run the whole drill; the summary (``summary["passed"]`` says whether every check held)."""
    config = config or DrillConfig()
    rng = random.Random(config.seed)
    loop = asyncio.get_running_loop()
    clock = loop.time
    background: list[asyncio.Task[Any]] = []
    drill_clients: list[DrillClient] = []
    stop = asyncio.Event()
    async with LocalRegions(settings=regions_settings(config)) as regions:
        try:
            summary = await _phases(config, regions, rng, clock, stop, background, drill_clients)
        finally:
            stop.set()
            for client in drill_clients:
                await client.client.close()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    return summary


async def _phases(
    config: DrillConfig,
    regions: LocalRegions,
    rng: random.Random,
    clock: Callable[[], float],
    stop: asyncio.Event,
    background: list[asyncio.Task[Any]],
    drill_clients: list[DrillClient],
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    primary, secondary = regions.primary, regions.secondary
    resolver = regions.resolver
    assert resolver is not None
    # Phase 0 (LocalRegions did it): both regions report data; the name resolves to the primary.
    book = BidBook(rng)
    drill_clients += [
        DrillClient(i, regions=regions, config=config, book=book, clock=clock, rng=rng)
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

    # Phase 1b: the primary's canary cannot read its key: its own fault moves nothing.
    key_fault = await _break_canary_key(config, regions, clock) if config.break_canary_key else None
    _still_on_primary(config, key_fault, "the canary's key fault")
    # Phase 1c: the canaries' key is rotated: the Regions' health must not notice.
    rotation = (
        await _rotate_canary_key(config, regions, clock) if config.rotate_canary_key else None
    )
    _still_on_primary(config, rotation, "the canaries' key rotation")

    # Phase 2: the primary fails.
    failed_at = clock()
    if config.failure is DrillFailure.STORE:
        await regions.fail_primary_store()
    else:
        await regions.fail_primary(config.failure.value)
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
        lambda: _whereabouts(drill_clients, resolver, failed_at),
    )
    reconnect_times = [
        c.restored_in(config.secondary, failed_at) - failed_at for c in drill_clients
    ]
    await asyncio.sleep(config.bidding_seconds)  # bid on the secondary
    trip = (
        await _trip_secondary(config, regions, drill_clients, clock)
        if config.trip_secondary
        else None
    )
    bidding.clear()
    await asyncio.sleep(config.bid_timeout)  # let the last requests end

    # Phase 3: the primary recovers; the name comes back only after the hysteresis.
    recovered_at = clock()
    await regions.restore_primary()
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
        lambda: _whereabouts(drill_clients, resolver, moved_back_at),
    )

    # Phase 4: replication converges; check every acknowledged bid.
    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        a = await _scan(primary.state_client, primary.state_table)
        b = await _scan(secondary.state_client, secondary.state_table)
        return a, b

    end = time.monotonic() + config.deadline_seconds
    while True:
        a, b = await both()
        if a == b:
            break
        if time.monotonic() > end:
            differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise TimeoutError(
                f"drill: the two state tables did not converge; they differ on {differing[:5]}"
                + "".join(f"\n{k}: {a.get(k)} != {b.get(k)}" for k in differing[:3])
            )
        await asyncio.sleep(config.replication_interval)
    final = {primary.name: a, secondary.name: b}
    return _summarise(
        config,
        drill_clients=drill_clients,
        final=final,
        failed_at=failed_at,
        detected_at=detected_at,
        reconnect_times=reconnect_times,
        recovered_at=recovered_at,
        failback_at=failback_at,
        connected_to_primary=connected_to_primary,
        replicators=regions.replicators,
        regions=regions.regions,
        resolver_history=resolver.history,
        trip=trip,
        key_fault=key_fault,
        rotation=rotation,
    )


def _still_on_primary(config: DrillConfig, phase: dict[str, Any] | None, what: str) -> None:
    """The failure phase needs the name on the primary: a phase that moved it fails the drill
    here, named, rather than as a failover that never comes."""
    if phase is not None and not phase["name_stayed_on_primary"]:
        raise RuntimeError(f"drill: {what} moved the name to {config.secondary}: {phase}")


async def _break_canary_key(
    config: DrillConfig, regions: LocalRegions, clock: Callable[[], float]
) -> dict[str, Any]:
    """The primary's canary cannot read its signing key for longer than the alarm's missing-data
    rule needs to fire: a fault of the canary's own pages as such (its runs raise) and must move
    no traffic and sweep no client. Checked after a run with the key back, so that a move the
    last faulty run caused is seen before the failure phase could hide it."""
    primary, resolver = regions.primary, regions.resolver
    assert resolver is not None
    broken_at = clock()
    faults_before, closed_before = primary.canary_faults, primary.closed_by_canary
    # Missing data breaches after 1.5 periods per datapoint (HealthAlarm): one fault more.
    enough = math.ceil(1.5 * config.alarm_datapoints) + 1
    restore = regions.break_canary_key(config.primary)
    try:
        await _wait_for(
            lambda: primary.canary_faults - faults_before >= enough,
            config.deadline_seconds,
            "the primary's canary failing on its key",
        )
    finally:
        restore()
    runs_before = primary.completed_runs
    await _wait_for(
        lambda: primary.completed_runs > runs_before,
        config.deadline_seconds,
        "a canary run with the key back",
    )
    return {
        "canary_faults": primary.canary_faults - faults_before,
        "name_stayed_on_primary": regions.serving_region() == config.primary
        and resolver.switched_to(config.secondary, broken_at) is None,
        "closed_by_primary_canary": primary.closed_by_canary - closed_before,
    }


async def _rotate_canary_key(
    config: DrillConfig, regions: LocalRegions, clock: Callable[[], float]
) -> dict[str, Any]:
    """The canaries' key is rotated the hurried way, and nothing may move:

    1. the new key is put into every Region's secret before any authorizer accepts it (the
       runbook's first step skipped): each canary reads it at its next refresh, finds it is not
       one its authorizer accepts, and keeps signing with the key before it;
    2. every authorizer is deployed to accept only the new key (the old key dropped at once):
       each canary's token is refused, and it probes again with the new key in the same run;
    3. every canary is deployed with the new key as the accepted one (a new environment: its
       key read cold).

    A deploy updates the authorizer's and the canary's functions apart, hence steps 2 and 3.
    Judged per Region over more runs than the alarm's missing-data rule needs, after each step:
    the canary never tripped, paged no fault, closed no connection, and the name stayed; it was
    refused and recovered in step 2; at the end it signs with the new key."""
    resolver = regions.resolver
    assert resolver is not None
    rotated_at = clock()
    before = {
        name: (
            r.completed_runs,
            r.canary_faults,
            r.closed_by_canary,
            r.canary.retries_after_refusal,
        )
        for name, r in regions.regions.items()
    }
    enough = math.ceil(1.5 * config.alarm_datapoints) + 1

    def secret(region: Region) -> SecretToken:
        tokens = region.canary.tokens
        if not isinstance(tokens, SecretToken):
            raise RegionsError(
                "the key rotation needs the canaries to read a secret: set "
                "AWS_ENDPOINT_URL_SECRETS_MANAGER, or DrillConfig(rotate_canary_key=False)"
            )
        return tokens

    async def runs(what: str) -> None:
        counts = {name: r.completed_runs for name, r in regions.regions.items()}
        await _wait_for(
            lambda: all(
                r.completed_runs - counts[name] >= enough for name, r in regions.regions.items()
            ),
            config.deadline_seconds,
            what,
        )

    def signs_with(key: jwt.SigningKey) -> bool:
        return all(
            (signing := secret(r).signing_key) is not None
            and jwt.same_key(signing.public(), key.public())
            for r in regions.regions.values()
        )

    old = secret(regions.primary).signing_key
    assert old is not None
    new = await regions.put_canary_key()
    await _wait_for(
        lambda: all(
            (read := secret(r).secret_key) is not None and jwt.same_key(read.public(), new.public())
            for r in regions.regions.values()
        ),
        config.deadline_seconds,
        "every canary reading the new key from its secret",
    )
    await runs("canary runs with the new key in the secret only")
    kept_the_old_key = signs_with(old)
    regions.deploy_authorizers([new])
    await runs("canary runs with only the new key accepted by the authorizers")
    retried = {
        name: r.canary.retries_after_refusal - before[name][3]
        for name, r in regions.regions.items()
    }
    regions.deploy_canaries([new])
    await runs("canary runs after the canaries' own deploy")

    after = {name: r.completed_runs - before[name][0] for name, r in regions.regions.items()}
    since = {name: r.runs[-min(after[name], len(r.runs)) :] for name, r in regions.regions.items()}
    return {
        "runs": after,
        "failed_probes": {
            name: sum(not run.probe.healthy for run in runs) for name, runs in since.items()
        },
        "tripped": {name: any(run.state.tripped for run in runs) for name, runs in since.items()},
        "canary_faults": sum(r.canary_faults - before[n][1] for n, r in regions.regions.items()),
        "closed_by_canaries": sum(
            r.closed_by_canary - before[n][2] for n, r in regions.regions.items()
        ),
        "kept_the_old_key_until_it_was_accepted": kept_the_old_key,
        "retried_after_a_refusal": retried,
        "signs_with_the_new_key": signs_with(new),
        "name_stayed_on_primary": regions.serving_region() == config.primary
        and resolver.switched_to(config.secondary, rotated_at) is None,
    }


async def _trip_secondary(
    config: DrillConfig,
    regions: LocalRegions,
    drill_clients: list[DrillClient],
    clock: Callable[[], float],
) -> dict[str, Any]:
    """The secondary's canary trips while the name answers with it: the name must stay (its
    record has no health check) and that canary must close nobody (they would come straight
    back); the clients ride it out on their own rule and are served again once it recovers."""
    secondary, resolver = regions.secondary, regions.resolver
    assert resolver is not None
    tripped_at = clock()
    closed_before = secondary.closed_by_canary
    forced_before = sum(c.client.forced_reconnects for c in drill_clients)
    unhealthy_before = secondary.unhealthy_runs
    secondary.gateway.fail(FailureMode.THROTTLED)
    try:
        # Until the secondary's own alarm fires (its 2 of 2): the name's rule then has every
        # reason it could have to leave the secondary, and must not.
        await _wait_for(
            secondary.alarm.in_alarm,
            config.deadline_seconds,
            "the secondary's alarm in ALARM",
        )
        name_stayed = regions.serving_region() == config.secondary
    finally:
        secondary.gateway.recover()
    recovered_at = clock()
    # A client either kept its socket through the trip or gave it up on missed pongs and came
    # back through the name; either way it must end up served by the secondary.
    await _wait_for(
        lambda: all(c.client.ready and c.client.region == config.secondary for c in drill_clients),
        config.deadline_seconds,
        "every client served by the secondary again after its canary tripped",
        lambda: _whereabouts(drill_clients, resolver, recovered_at),
    )
    return {
        "unhealthy_runs": secondary.unhealthy_runs - unhealthy_before,
        "name_stayed_on_secondary": name_stayed
        and resolver.switched_to(config.primary, tripped_at) is None,
        "closed_by_secondary_canary": secondary.closed_by_canary - closed_before,
        # What the failover itself did to the clients, before the trip added its own.
        "forced_reconnects_before": forced_before,
    }


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
    replicators: list[StateReplication],
    regions: dict[str, Region],
    resolver_history: list[tuple[float, str]],
    trip: dict[str, Any] | None = None,
    key_fault: dict[str, Any] | None = None,
    rotation: dict[str, Any] | None = None,
) -> dict[str, Any]:
    acked = [bid for c in drill_clients for bid in c.bids]
    accepted = [bid for bid in acked if bid.accepted]
    refusals = sum((c.refusals for c in drill_clients), Counter())
    unanswered = {c.user: c.unanswered_amounts for c in drill_clients}
    highest_bidder = {
        name: str(
            (items.get(auction_names.auction_pk(config.auction)) or {}).get(
                auction_names.HIGHEST_BIDDER
            )
        )
        for name, items in final.items()
    }
    lost = {
        name: [
            bid.amount
            for bid in accepted
            if auction_names.bid_pk(config.auction, bid.amount) not in items
        ]
        for name, items in final.items()
    }
    highest = {
        name: int(
            (items.get(auction_names.auction_pk(config.auction)) or {}).get(
                auction_names.HIGHEST_AMOUNT, 0
            )
        )
        for name, items in final.items()
    }
    recorded_bids = {
        name: sorted(
            int(item[auction_names.BID_AMOUNT])
            for pk, item in items.items()
            if pk.startswith(
                auction_names.bid_pk(config.auction, 0)[: -auction_names.BID_AMOUNT_DIGITS]
            )
        )
        for name, items in final.items()
    }
    max_accepted = max((bid.amount for bid in accepted), default=0)
    users_restored = 0
    for client in drill_clients:
        mine = [bid.amount for bid in accepted if bid.user == client.user]
        state = (client.client.state or {}).get("state") or {}
        last = (state.get("lastBid") or {}).get("amount") or 0
        # A user's own item is a convenience written after the auction decided: a store that
        # fails in between leaves it behind the user's last accepted bid, as documented.
        current = last >= max(mine, default=0) or config.failure is DrillFailure.STORE
        if client.client.region == config.primary and current:
            users_restored += 1
    period = config.canary_period
    failback_seconds = None if failback_at is None else failback_at - recovered_at
    checks = {
        "all_clients_started_on_primary": connected_to_primary == config.clients,
        "detected": detected_at is not None,
        "all_clients_reconnected_to_secondary": len(reconnect_times) == config.clients,
        "no_acknowledged_bid_lost": all(not amounts for amounts in lost.values()),
        "highest_is_the_highest_recorded_bid": all(
            highest[name] >= (recorded_bids[name] or [0])[-1] >= max_accepted
            and (
                highest[name] == (recorded_bids[name] or [0])[-1]
                # Only with the store failing: a bid its bidder never heard back about, applied
                # before the outage cut off its record (a retry would have written it).
                or (
                    config.failure is DrillFailure.STORE
                    and highest[name] in unanswered.get(highest_bidder[name], ())
                )
            )
            for name in final
        ),
        **(
            {
                # The auctions' home (the primary) is unreachable: the secondary refuses every
                # bid as retryable rather than judge it against a replica that may be behind.
                "secondary_refused_bids_while_home_down": refusals.get("home_unavailable", 0) > 0
                and not any(bid.region == config.secondary for bid in accepted),
                "bids_accepted_before_the_outage": any(
                    bid.region == config.primary for bid in accepted
                ),
            }
            if config.failure is DrillFailure.STORE
            else {
                "bids_accepted_on_both_regions": bool(accepted)
                and {bid.region for bid in accepted} == {config.primary, config.secondary},
            }
        ),
        **(
            {
                "canary_key_fault_moved_nothing": key_fault["name_stayed_on_primary"]
                and key_fault["closed_by_primary_canary"] == 0,
            }
            if key_fault is not None
            else {}
        ),
        **(
            {
                "canary_key_rotation_moved_nothing": rotation["name_stayed_on_primary"]
                and rotation["canary_faults"] == 0
                and rotation["closed_by_canaries"] == 0
                and not any(rotation["tripped"].values()),
                "canary_key_rotation_ends_on_the_new_key": rotation[
                    "kept_the_old_key_until_it_was_accepted"
                ]
                and all(n >= 1 for n in rotation["retried_after_a_refusal"].values())
                and rotation["signs_with_the_new_key"],
            }
            if rotation is not None
            else {}
        ),
        **(
            {
                "secondary_trip_kept_the_name": trip["name_stayed_on_secondary"],
                "secondary_trip_closed_nobody": trip["closed_by_secondary_canary"] == 0,
            }
            if trip is not None
            else {}
        ),
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
            "refused_by_error": dict(refusals),
            "accepted_on": {name: sum(bid.region == name for bid in accepted) for name in final},
            "lost": {name: len(amounts) for name, amounts in lost.items()},
            "highest": highest,
            "max_acknowledged": max_accepted,
        },
        "clients_detail": {
            "restored_on_primary_after_failback": users_restored,
            # During the failover (the secondary's trip makes clients reconnect on their own).
            "forced_reconnects": trip["forced_reconnects_before"]
            if trip is not None
            else sum(c.client.forced_reconnects for c in drill_clients),
            "closed_by_canary": sum(region.closed_by_canary for region in regions.values()),
            "pongs": sum(c.client.pongs for c in drill_clients),
            "attempts": sum(c.client.attempts for c in drill_clients),
            "token_provider_calls": sum(c.token_calls for c in drill_clients),
            "auth_failures": sum(c.client.auth_failures for c in drill_clients),
        },
        "replication": {
            "feed": type(replicators[0].replicas[0].feed).__name__,
            **asdict(replicators[0].stats),
        },
        "gateways": {
            name: {
                "connects": region.gateway.stats.connects,
                "rejected": region.gateway.stats.rejected,
                "failed_messages": region.gateway.stats.failed_messages,
                "closed_by_canary": region.closed_by_canary,
            }
            for name, region in regions.items()
        },
        "secondary_trip": trip,
        "canary_key_fault": key_fault,
        "canary_key_rotation": rotation,
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
        (
            "Clients moved by the canary / by missed pongs",
            f"{summary['clients_detail']['closed_by_canary']} / "
            f"{summary['clients_detail']['forced_reconnects']}",
        ),
        (
            "Bids refused, by error",
            ", ".join(f"{k}: {v}" for k, v in sorted(bids["refused_by_error"].items())) or "-",
        ),
    ]
    key_fault = summary.get("canary_key_fault")
    if key_fault is not None:
        rows.append(
            (
                "Primary's canary without its key: faults paged / name stayed / connections it "
                "closed",
                f"{key_fault['canary_faults']} / {key_fault['name_stayed_on_primary']} / "
                f"{key_fault['closed_by_primary_canary']}",
            )
        )
    rotation = summary.get("canary_key_rotation")
    if rotation is not None:
        rows.append(
            (
                "Canaries' key rotated (secret first, authorizers, then canaries): failed "
                "probes / faults paged / name stayed / connections closed",
                f"{sum(rotation['failed_probes'].values())} of "
                f"{sum(rotation['runs'].values())} runs / {rotation['canary_faults']} / "
                f"{rotation['name_stayed_on_primary']} / {rotation['closed_by_canaries']}",
            )
        )
    trip = summary.get("secondary_trip")
    if trip is not None:
        rows.append(
            (
                "Secondary's canary tripped during the failover: unhealthy runs / name stayed / "
                "connections it closed",
                f"{trip['unhealthy_runs']} / {trip['name_stayed_on_secondary']} / "
                f"{trip['closed_by_secondary_canary']}",
            )
        )
    lines = ["| Measure | Value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines += ["| Check | Result |", "|---|---|"]
    lines += [f"| {k} | {'pass' if v else 'FAIL'} |" for k, v in summary["checks"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the drill, print the summary; exit 1 if a check failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=DrillConfig.clients)
    parser.add_argument(
        "--failures",
        type=_failures,
        default=tuple(DrillFailure),
        help="how the primary fails, one failover drill each: "
        + ",".join(DrillFailure)
        + " (all by default)",
    )
    parser.add_argument(
        "--backend",
        choices=["dynalite", "moto"],
        default="dynalite",
        help="local DynamoDB to start when AWS_ENDPOINT_URL_DYNAMODB is not set",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--markdown", action="store_true", help="print Markdown, not JSON")
    parser.add_argument(
        "--page",
        action="store_true",
        help=f"with --markdown: also write the report to {PAGE.relative_to(pages.REPO)}",
    )
    parser.add_argument(
        "--no-canary-disconnect",
        action="store_true",
        help="the canary does not close the failed region's connections (clients move alone)",
    )
    parser.add_argument("--verbose", action="store_true", help="log every canary run")
    parser.add_argument(
        "--only", choices=["failover", "live"], default=None, help="run one of the two drills"
    )
    parser.add_argument(
        "--short", action="store_true", help="the live drill's short version (as make test)"
    )
    args = parser.parse_args(argv)
    if args.page and not args.markdown:
        parser.error("--page: needs --markdown")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    report = _Report(args) if args.page else None
    # Failed probes and closed connections are what a drill is about: not warnings here.
    logging.getLogger("streamfleet.wsapi").setLevel(logging.INFO if args.verbose else logging.ERROR)
    if not args.verbose:  # a handler whose store is down fails on purpose, with a traceback
        logging.getLogger("streamfleet.wsapi.handlers").setLevel(logging.CRITICAL)
    passed = True
    if args.only != "live":
        configs = [
            DrillConfig(
                clients=args.clients,
                failure=failure,
                seed=args.seed,
                disconnect_when_unhealthy=not args.no_canary_disconnect,
            )
            for failure in args.failures
        ]
        passed = _failover_main(args, configs, report)
    if args.only != "failover":
        from streamfleet_dev.wsapi import live_drill

        live_config = (
            live_drill.LiveDrillConfig() if args.short else live_drill.LiveDrillConfig.full()
        )
        live = asyncio.run(live_drill.run_live_drill(live_config))
        if args.markdown:
            section = "\n## Live delivery, end to end\n\n" + live_drill.markdown(live)
            print(section)
            if report is not None:
                report.sections.append(section)
        else:
            print(json.dumps(live.summary(), indent=2))
        passed = passed and live.ok
    if report is not None:
        report.write()
    return 0 if passed else 1


# Where ``make drill`` writes its figures: a page of the manual, never edited by hand.
PAGE = pages.PAGES / "drill.md"
OUTPUTS = (PAGE,)


class _Report:
    """The page ``--page`` writes: the run's conditions, then each drill's Markdown report."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.sections: list[str] = []
        self.conditions = {
            "date": pages.now(),
            "commit": pages.commit(),
            "machine": pages.machine(),
            "load_at_start": pages.load(),
        }

    def write(self) -> None:
        run, args = self.conditions, self.args
        options = f"--clients {args.clients} --failures {','.join(args.failures)}" + (
            f" --seed {args.seed}" if args.seed is not None else ""
        )
        text = (
            "# Drill figures\n\n"
            + pages.banner("drill", "drills", target="drill", package="streamfleet_dev.wsapi")
            + f"\n\n`{options}`{' --short' if args.short else ''}, run of {run['date']} at "
            f"commit {run['commit']}. Machine: {run['machine']}; load average at the start "
            f"{run['load_at_start']}, at the end {pages.load()}. One run of each.\n"
            + "".join(self.sections)
        )
        PAGE.write_text(text)
        print(f"wrote {PAGE}")


FAILURE_TITLES = {
    DrillFailure.THROTTLED: "throttled (sockets open, nothing answers)",
    DrillFailure.DOWN: "down (sockets dropped, handshakes refused)",
    DrillFailure.STORE: "state store down (handshakes and writes fail)",
}


def _failures(text: str) -> tuple[DrillFailure, ...]:
    try:
        failures = tuple(DrillFailure(name.strip()) for name in text.split(",") if name.strip())
    except ValueError:
        failures = ()
    if not failures:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a comma-separated list of {', '.join(DrillFailure)}"
        )
    return failures


def _failover_main(
    args: argparse.Namespace, configs: list[DrillConfig], report: _Report | None = None
) -> bool:
    """One failover drill per config, on servers started once; whether all passed."""
    from streamfleet_dev.emulator.servers import dynalite_server, moto_server

    config = configs[0]
    passed = True
    started = []
    environment = dict(os.environ)  # given back afterwards: the servers set here are gone then
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
        # The canaries' key secrets, which the key rotation phase changes: on a moto started
        # here if there is one, else on one of their own.
        if not os.environ.get("AWS_ENDPOINT_URL_SECRETS_MANAGER"):
            motos = [server for server in started if server.kind == "moto"]
            if not motos:
                motos.append(moto_server().start())
                started.append(motos[0])
            os.environ["AWS_ENDPOINT_URL_SECRETS_MANAGER"] = motos[0].endpoint
        summaries = []
        for config in configs:
            summary = asyncio.run(run_drill(config))
            summaries.append(summary)
            if args.markdown:
                title = f"\n## Failover drill: the primary {FAILURE_TITLES[config.failure]}\n"
                print(title)
                print(markdown(summary))
                if report is not None:
                    report.sections.append(f"{title}\n{markdown(summary)}\n")
            passed = passed and bool(summary["passed"])
        if not args.markdown:
            print(json.dumps(summaries, indent=2))  # one document: a list, one per failure
    finally:
        for server in started:
            server.stop()
        os.environ.clear()
        os.environ.update(environment)
    return passed


if __name__ == "__main__":
    sys.exit(main())
