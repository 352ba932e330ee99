"""The local API Gateway keeps API Gateway's limits on time, so code that would fail deployed
fails here: the maximum connection duration, the function's timeout (and a context that counts
down to it), the integration timeout, and the error frame a client gets when a route fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from streamfleet_auction.extension import auction_extension
from streamfleet_client import (
    ClientConfig,
    ConnectionLost,
    Endpoint,
    NotConnected,
    ReconnectingClient,
)
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, LocalGateway, wsapi_gateway
from tests.wsapi_support import REGION, authorizer, user_token

DEADLINE = 10.0


class Routes:
    """A route handler whose message behaviour the test picks: ``raise``, ``sleep:<s>``."""

    def __init__(self) -> None:
        self.remaining_ms: list[int] = []
        self.disconnects = 0

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        route = event["requestContext"]["routeKey"]
        if route == "$disconnect":
            self.disconnects += 1
        if route in ("$connect", "$disconnect"):
            return {"statusCode": 200}
        self.remaining_ms.append(context.get_remaining_time_in_millis())
        body = event["body"]
        if body == "raise":
            raise RuntimeError("the handler failed")
        if body == "raise-timeout":
            raise TimeoutError("the handler's own call timed out")
        if body.startswith("sleep:"):
            time.sleep(float(body.removeprefix("sleep:")))
        return {"statusCode": 200}


def gateway(routes: Routes, **limits: Any) -> LocalGateway:
    return LocalGateway(GatewaySettings(region=REGION, **limits), authorizer=None, handler=routes)


async def frame_after(url: str, message: str) -> dict[str, Any]:
    async with connect(url, open_timeout=5) as ws:
        await ws.send(message)
        return json.loads(await asyncio.wait_for(ws.recv(), DEADLINE))


async def test_a_route_that_raises_gets_api_gateways_error_frame() -> None:
    routes = Routes()
    async with gateway(routes) as running:
        frame = await frame_after(running.url, "raise")
    assert frame["message"] == "Internal server error"
    assert {"connectionId", "requestId"} <= frame.keys()
    assert running.stats.integration_errors == 1


async def test_a_route_that_raises_timeout_error_fails_at_once_not_at_its_timeout() -> None:
    """The handler's own TimeoutError (a socket's, say) is a failure now, not a wait for the
    function's timeout (here far longer than the test waits for the frame)."""
    routes = Routes()
    async with gateway(routes, handler_timeout_seconds=600) as running:
        frame = await frame_after(running.url, "raise-timeout")
    assert frame["message"] == "Internal server error"


async def test_a_route_that_outlives_its_timeout_failed_and_its_context_counted_down() -> None:
    routes = Routes()
    async with gateway(routes, handler_timeout_seconds=0.3) as running:
        frame = await frame_after(running.url, "sleep:1")
    assert frame["message"] == "Internal server error"
    assert 0 < routes.remaining_ms[0] <= 300


async def test_api_gateway_stops_waiting_after_the_integration_timeout() -> None:
    routes = Routes()
    async with gateway(
        routes, handler_timeout_seconds=5, integration_timeout_seconds=0.3
    ) as running:
        frame = await frame_after(running.url, "sleep:1")
    assert frame["message"] == "Endpoint request timed out"


async def test_a_connection_is_closed_at_its_maximum_duration_however_active() -> None:
    routes = Routes()
    async with gateway(routes, max_connection_seconds=0.5) as running:
        async with connect(running.url, open_timeout=5) as ws:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                while time.monotonic() - started < DEADLINE:
                    await ws.send("ok")  # active: the idle timeout never applies
                    await asyncio.sleep(0.05)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert running.stats.aged_out == 1

        async def disconnected() -> bool:
            return routes.disconnects == 1

        deadline = time.monotonic() + DEADLINE
        while not await disconnected():
            assert time.monotonic() < deadline, "$disconnect not invoked"
            await asyncio.sleep(0.05)


async def test_the_client_reconnects_across_the_maximum_duration_and_keeps_its_state(
    tables: tuple[str, str],
) -> None:
    state, connections = tables

    async def request(client: ReconnectingClient, message: dict[str, Any]) -> dict[str, Any]:
        # A request that straddles the cut is lost with its connection: asked again.
        for _ in range(3):
            with contextlib.suppress(ConnectionLost, NotConnected):
                await client.wait_ready(DEADLINE)
                return await client.request(message)
        raise AssertionError(f"{message} not answered in 3 connections")

    async with (
        wsapi_gateway(
            GatewaySettings(region=REGION, max_connection_seconds=3.0),
            authorizer=authorizer(),
            state_table=state,
            connections_table=connections,
            extensions=(auction_extension(),),  # its state is a bid's
        ) as running,
        ReconnectingClient(
            lambda attempt, force_refresh=False: Endpoint(running.url, user_token("erin")),
            ClientConfig(heartbeat_interval=0.2, heartbeat_timeout=1.0, backoff_base=0.05),
        ) as client,
    ):
        first = await request(client, {"action": "bid", "auction": "a1", "amount": 7})
        assert first["accepted"]
        deadline = time.monotonic() + DEADLINE
        while client.connections < 2 or not client.ready:
            assert time.monotonic() < deadline, "the client did not reconnect"
            await asyncio.sleep(0.05)
        state_reply = await request(client, {"action": "getState", "auction": "a1"})
    assert running.stats.aged_out >= 1
    assert state_reply["auction"]["highestIsYou"] is True


def _posts_refused(endpoint: str, connection_id: str, posts: int) -> list[str | None]:
    """Post ``posts`` frames, each tried once: the error code each one got (None: posted)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    management = boto3.client(
        "apigatewaymanagementapi",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(retries={"total_max_attempts": 1}),
    )
    codes: list[str | None] = []
    for index in range(posts):
        try:
            management.post_to_connection(ConnectionId=connection_id, Data=f"{index}".encode())
            codes.append(None)
        except ClientError as exc:
            codes.append(exc.response["Error"]["Code"])
    return codes


async def test_management_faults_on_by_rate_are_api_gateways_errors_and_replay_by_seed() -> None:
    """The fan-out and the repliers meet throttling and refusals in every run: a seeded fraction
    of the Management API's calls, with API Gateway's error codes, the same calls each time."""
    routes = Routes()
    outcomes = []
    for _ in range(2):
        settings = {"management_fault_rates": ((429, 0.2), (403, 0.05)), "fault_seed": 3}
        async with (
            gateway(routes, **settings) as running,
            connect(running.url, open_timeout=5),
        ):
            (connection_id,) = running.connection_ids
            outcomes.append(
                await asyncio.to_thread(
                    _posts_refused, running.management_endpoint, connection_id, 60
                )
            )
    assert outcomes[0] == outcomes[1]
    assert {"LimitExceededException", "ForbiddenException", None} == set(outcomes[0])
    with pytest.raises(ValueError, match="management_fault_rates"):
        GatewaySettings(region=REGION, management_fault_rates=((500, 0.1),))
