"""LocalRegions: the two local regions behind one HTTP front, as the browser tests use them.

Everything runs for real on loopback: dynalite (the session's server), both regions' gateways
with the real authorizer and handlers, the canaries, replication and the failover resolver; the
tests talk to it only through its HTTP front and its WebSocket endpoints, as a browser would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from streamfleet import model
from streamfleet_auction import names as auction_names
from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV, REPO_ROOT
from streamfleet_dev.emulator.websocket_gateway import FailureMode
from streamfleet_dev.wsapi.regions import LocalRegions, RegionsError, RegionsSettings

PRIMARY, SECONDARY = "us-east-1", "us-west-2"
DEADLINE = 30.0


def settings(dynalite_endpoint: str, **overrides: Any) -> RegionsSettings:
    return RegionsSettings(
        dynamodb_endpoint=dynalite_endpoint,
        cloudwatch_endpoint=None,
        # Slow probes on a loaded machine must not fail the primary over by themselves.
        canary_period=1.0,
        canary_timeout=0.9,
        table_prefix="test-regions",
        **overrides,
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "index.html").write_text("<!doctype html><title>auction</title>")
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "app.js").write_text("export const answer = 42;\n")
    (tmp_path.parent / "secret.txt").write_text("not for you")
    return tmp_path


@pytest.fixture
async def regions(
    servers, site: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[LocalRegions]:
    monkeypatch.delenv("AWS_ENDPOINT_URL_CLOUDWATCH", raising=False)
    async with LocalRegions(
        settings=settings(servers["dynalite"].endpoint), static_dir=site
    ) as running:
        yield running


async def http(
    regions: LocalRegions, path: str, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    def call() -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(regions.http_url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    return await asyncio.to_thread(call)


async def get_json(regions: LocalRegions, path: str, method: str = "GET") -> Any:
    status, _, body = await http(regions, path, method)
    assert status == 200, (path, status, body)
    return json.loads(body)


async def token_for(regions: LocalRegions, user: str) -> str:
    return (await get_json(regions, f"/token?user={user}"))["token"]


async def open_ws(url: str, token: str) -> ClientConnection:
    protocols = [model.WS_APP_SUBPROTOCOL, f"{model.WS_BEARER_SUBPROTOCOL_PREFIX}{token}"]
    return await connect(url, subprotocols=protocols, open_timeout=5)


async def until(predicate, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)


# --- The HTTP front -----------------------------------------------------------------------------


async def test_a_token_from_the_front_is_accepted_by_both_regions(regions: LocalRegions) -> None:
    token = await token_for(regions, "alice")
    for region in (PRIMARY, SECONDARY):
        async with await open_ws(regions.region_url(region), token) as ws:
            assert ws.subprotocol == model.WS_APP_SUBPROTOCOL
            await ws.send(json.dumps({"action": "heartbeat", "requestId": "hb"}))
            assert await asyncio.wait_for(ws.recv(), 5) == "pong"  # a text frame, not JSON
            await ws.send(json.dumps({"action": "getState", "requestId": "s-1"}))
            state = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert state["type"] == "state" and state["user"] == "alice"
            assert state["region"] == region and state["requestId"] == "s-1"


async def test_resolve_and_health_follow_a_failed_and_restored_primary(
    regions: LocalRegions,
) -> None:
    assert await get_json(regions, "/resolve") == {
        "url": regions.region_url(PRIMARY),
        "region": PRIMARY,
    }
    health = await get_json(regions, "/health")
    assert (health["primary"], health["secondary"], health["serving"]) == (
        "healthy",
        "healthy",
        PRIMARY,
    )
    failed = await get_json(regions, "/fail?mode=throttled", method="POST")
    assert failed["primary"] == "throttled"

    async def serving(region: str) -> bool:
        return (await get_json(regions, "/resolve"))["region"] == region

    await until(lambda: serving(SECONDARY), "failover")
    assert (await get_json(regions, "/resolve"))["url"] == regions.region_url(SECONDARY)
    assert regions.serving_region() == SECONDARY
    assert (await get_json(regions, "/health"))["alarms"][PRIMARY] == "ALARM"
    restored = await get_json(regions, "/restore", method="POST")
    assert restored["primary"] == "healthy"
    await until(lambda: serving(PRIMARY), "fail-back")


async def test_bad_requests_name_what_is_wrong_and_change_nothing(regions: LocalRegions) -> None:
    status, _, body = await http(regions, "/token")
    assert status == 400 and "user" in json.loads(body)["error"]
    status, _, body = await http(regions, "/token?user=a%20b")
    assert status == 400 and "user" in json.loads(body)["error"]
    status, _, body = await http(regions, "/token?user=bob&expires_in=-5")
    assert status == 400 and "expires_in" in json.loads(body)["error"]
    status, _, body = await http(regions, "/fail?mode=sideways", method="POST")
    assert status == 400 and "mode" in json.loads(body)["error"]
    status, headers, _ = await http(regions, "/fail")
    assert status == 405 and headers["Allow"] == "POST"
    assert (await get_json(regions, "/health"))["primary"] == "healthy"


async def test_static_files_are_served_and_nothing_outside_them(regions: LocalRegions) -> None:
    status, headers, body = await http(regions, "/")
    assert status == 200 and b"<title>auction</title>" in body
    assert headers["Content-Type"].startswith("text/html")
    status, headers, body = await http(regions, "/assets/app.js")
    assert status == 200 and body == b"export const answer = 42;\n"
    assert headers["Content-Type"].startswith("text/javascript")
    for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/missing.html"):
        status, _, body = await http(regions, path)
        assert status == 404 and b"not for you" not in body, path


async def test_minted_tokens_are_checked_before_minting(regions: LocalRegions) -> None:
    with pytest.raises(RegionsError, match="user"):
        regions.mint_token("")
    with pytest.raises(RegionsError, match="expires_in"):
        regions.mint_token("carol", expires_in=float("inf"))
    with pytest.raises(RegionsError, match="reserved"):
        regions.mint_token("canary:mallory")


# --- Server-driven failover ---------------------------------------------------------------------


class ThirdPartyClient:
    """A client like react-use-websocket without returnMessage: any frame counts as "alive",
    so it never leaves a socket on its own; it reconnects through /resolve when one closes."""

    def __init__(self, regions: LocalRegions, token: str):
        self.regions = regions
        self.token = token
        self.frames: list[tuple[str, str]] = []  # (region, frame)
        self.connected_to: list[str] = []
        self.closes: list[int | None] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            where = await get_json(self.regions, "/resolve")
            try:
                ws = await open_ws(where["url"], self.token)
            except Exception:  # e.g. the throttled region refuses handshakes with 500
                await asyncio.sleep(0.1)
                continue
            self.connected_to.append(where["region"])
            try:
                async with ws:
                    while not stop.is_set():
                        await ws.send(json.dumps({"action": "heartbeat"}))
                        # Silence is fine too: this client never gives up a socket by itself.
                        with contextlib.suppress(TimeoutError):
                            frame = await asyncio.wait_for(ws.recv(), 0.3)
                            self.frames.append((where["region"], str(frame)))
                        await asyncio.sleep(0.1)
            except ConnectionClosed as closed:
                self.closes.append(closed.rcvd.code if closed.rcvd else None)


async def test_a_throttled_primary_closes_its_clients_and_they_land_on_the_secondary(
    regions: LocalRegions,
) -> None:
    client = ThirdPartyClient(regions, await token_for(regions, "dave"))
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(client.run(stop))
    try:

        async def pong_from(region: str) -> bool:
            return (region, "pong") in client.frames

        await until(lambda: pong_from(PRIMARY), "pong from the primary")
        await regions.fail_primary("throttled")

        async def on_secondary() -> bool:
            return client.connected_to[-1:] == [SECONDARY] and await pong_from(SECONDARY)

        await until(on_secondary, "the client reconnected to the secondary")
    finally:
        stop.set()
        await task
    # While throttled, the primary answered its heartbeats with API Gateway's error frame...
    errors = [json.loads(f) for r, f in client.frames if r == PRIMARY and f != "pong"]
    assert errors and all(e["message"] == "Internal server error" for e in errors)
    assert all({"connectionId", "requestId"} <= e.keys() for e in errors)
    # ...which this client counts as alive: only the canary's DeleteConnection moved it.
    assert client.closes and client.closes[0] == 1000
    assert regions.primary.closed_by_canary >= 1
    assert regions.secondary.closed_by_canary == 0


async def ask(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(message))
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def test_a_primary_state_store_outage_fails_over_and_loses_no_acknowledged_bid(
    regions: LocalRegions,
) -> None:
    """Users' handshakes fail when the primary's store does, so the canary moves the name; on
    the secondary, bids are refused as retryable while the auctions' home cannot be reached,
    never accepted against a replica that has not seen the primary's last bids."""
    async with await open_ws(regions.region_url(PRIMARY), await token_for(regions, "alice")) as ws:
        bid = await ask(ws, {"action": "bid", "auction": "dr", "amount": 100})
        assert bid["accepted"] and bid["region"] == PRIMARY
    await regions.fail_primary_store()

    async def serving_secondary() -> bool:
        return regions.serving_region() == SECONDARY

    await until(serving_secondary, "failover on a primary whose store is down")
    async with await open_ws(regions.region_url(SECONDARY), await token_for(regions, "bob")) as ws:
        for amount in (90, 101):
            refused = await ask(ws, {"action": "bid", "auction": "dr", "amount": amount})
            assert (refused["type"], refused["error"]) == ("error", "home_unavailable")
            assert refused["retryable"] is True and refused["region"] == SECONDARY
        await regions.restore_primary()
        lower = await ask(ws, {"action": "bid", "auction": "dr", "amount": 90})
        assert (lower["accepted"], lower["highest"]) == (False, 100)
        higher = await ask(ws, {"action": "bid", "auction": "dr", "amount": 101})
        assert higher["accepted"] and higher["region"] == SECONDARY

    async def converged() -> bool:
        views = []
        for region in (regions.primary, regions.secondary):
            item = await asyncio.to_thread(
                region.dynamodb.get_item,
                TableName=region.state_table,
                Key={model.PK: {"S": auction_names.auction_pk("dr")}},
                ConsistentRead=True,
            )
            views.append(item.get("Item", {}).get(auction_names.HIGHEST_BIDDER, {}).get("S"))
        return views == ["bob", "bob"]

    await until(converged, "both replicas hold Bob's 101")


async def test_a_secondary_that_trips_during_a_failover_keeps_its_clients(
    regions: LocalRegions,
) -> None:
    """The failover name answers with the secondary whatever its own canary says (its record
    has no health check), so a secondary canary that swept its clients would only send them
    straight back: it reports, and never sweeps."""
    await regions.fail_primary("throttled")

    async def serving_secondary() -> bool:
        return regions.serving_region() == SECONDARY

    await until(serving_secondary, "failover to the secondary")
    async with await open_ws(regions.region_url(SECONDARY), await token_for(regions, "erin")) as ws:
        await ws.send(json.dumps({"action": "heartbeat"}))
        assert await asyncio.wait_for(ws.recv(), 10) == "pong"
        regions.secondary.gateway.fail(FailureMode.THROTTLED)  # the arriving crowd, say
        tripped_runs = len(regions.secondary.runs)

        async def secondary_reports_unhealthy() -> bool:
            runs = regions.secondary.runs[tripped_runs:]
            return sum(run.value == 0 for run in runs) >= 3

        await until(secondary_reports_unhealthy, "the secondary's canary tripped")
        # The name stays (the old model answered with the primary here), and the secondary's
        # canary, which never sweeps (as deployed, checked in the infra tests), left the socket
        # open: a throttled API answers with its error frame.
        assert regions.serving_region() == SECONDARY
        await ws.send(json.dumps({"action": "heartbeat"}))
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["message"] == "Internal server error"
    regions.secondary.gateway.recover()


# --- The command line ---------------------------------------------------------------------------


def test_serve_prints_where_it_listens_and_stops_on_sigterm(servers, site: Path) -> None:
    env = {
        **os.environ,
        **LOCAL_AWS_ENV,
        "AWS_ENDPOINT_URL_DYNAMODB": servers["dynalite"].endpoint,
        "PYTHONPATH": os.pathsep.join(str(REPO_ROOT / p) for p in ("runtime", "devtools", ".")),
    }
    env.pop("AWS_ENDPOINT_URL_CLOUDWATCH", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "streamfleet_dev.wsapi.regions", "--serve", "--static-dir", site],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # blocks until ready (or the process dies)
        banner = json.loads(line)
        assert banner["event"] == "listening"
        assert set(banner["regions"]) == {PRIMARY, SECONDARY}
        with urllib.request.urlopen(banner["http_url"] + "/health", timeout=5) as response:
            assert json.loads(response.read())["serving"] == PRIMARY
        with urllib.request.urlopen(banner["http_url"] + "/", timeout=5) as response:
            assert b"auction" in response.read()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
