"""The reconnecting client against the local API Gateway stand-in (real handlers on moto).

Timings are compressed (heartbeat 0.3 s / 0.4 s, backoff base 0.05 s) so each scenario takes
about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
import uuid
from typing import Any

import boto3
import pytest

from streamfleet import model
from streamfleet.wsapi import jwt
from streamfleet_client import (
    AuthorizationFailed,
    ClientClosed,
    ClientConfig,
    ClientStatus,
    ConnectionLost,
    Endpoint,
    FrameTooLarge,
    NotConnected,
    ReconnectingClient,
    TokenTransport,
    backoff_delay,
)
from streamfleet_dev.emulator.websocket_gateway import (
    FailureMode,
    LocalGateway,
)
from tests.wsapi_support import AUDIENCE, ISSUER, KEY, REGION

WRONG_KEY = jwt.generate_signing_key(jwt.HS256, kid="test")
FAST = ClientConfig(
    heartbeat_interval=0.3,
    heartbeat_timeout=0.4,
    backoff_base=0.05,
    backoff_cap=0.5,
    open_timeout=2.0,
    close_timeout=0.5,
    request_timeout=2.0,
)


class Tokens:
    """An endpoint provider that records every call and mints a distinct token each time."""

    def __init__(
        self,
        gateway: LocalGateway,
        sub: str = "alice",
        *,
        bad_for: int = 0,
        key: jwt.SigningKey = KEY,
        transport: TokenTransport = TokenTransport.SUBPROTOCOL,
        with_token: bool = True,
        lifetime: int = 300,
    ):
        self.gateway = gateway
        self.lifetime = lifetime
        self.sub = sub
        self.bad_for = bad_for  # the first N attempts get a token signed with the wrong key
        self.key = key
        self.transport = transport
        self.with_token = with_token
        self.calls: list[int] = []
        self.refreshes: list[bool] = []
        self.tokens: list[str | None] = []

    def __call__(self, attempt: int, *, force_refresh: bool = False) -> Endpoint:
        self.calls.append(attempt)
        self.refreshes.append(force_refresh)
        now = time.time()
        claims = {
            "sub": self.sub,
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + self.lifetime,
            "jti": uuid.uuid4().hex,
        }
        key = WRONG_KEY if len(self.calls) <= self.bad_for else self.key
        token = jwt.sign(claims, key) if self.with_token else None
        self.tokens.append(token)
        return Endpoint(self.gateway.url, token, self.transport)


async def eventually(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- Pure parts ---------------------------------------------------------------------------------


def test_backoff_is_full_jitter_capped() -> None:
    rng = random.Random(1)
    for attempt in range(8):
        ceiling = min(20.0, 2.0 * 2**attempt)
        samples = [backoff_delay(attempt, 2.0, 20.0, rng) for _ in range(2000)]
        assert all(0.0 <= s <= ceiling for s in samples)
        # Full jitter: spread over the whole window, not clustered near the ceiling.
        assert min(samples) < 0.05 * ceiling and max(samples) > 0.95 * ceiling
    assert backoff_delay(10_000, 2.0, 20.0, rng) <= 20.0  # no overflow for a huge attempt


def test_the_token_goes_in_a_subprotocol_or_the_query_string() -> None:
    url, protocols = Endpoint("wss://ws.example.com/prod", "abc.def.ghi").handshake()
    assert url == "wss://ws.example.com/prod"
    assert protocols == [model.WS_APP_SUBPROTOCOL, "bearer.abc.def.ghi"]
    url, protocols = Endpoint(
        "wss://ws.example.com/prod?lang=en&token=old", "abc.def.ghi", TokenTransport.QUERY
    ).handshake()
    assert url == "wss://ws.example.com/prod?lang=en&token=abc.def.ghi"
    assert protocols == [model.WS_APP_SUBPROTOCOL]


def test_configuration_is_validated() -> None:
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        ClientConfig(heartbeat_timeout=0)
    with pytest.raises(ValueError, match="missed_pongs_before_reconnect"):
        ClientConfig(missed_pongs_before_reconnect=0)


# --- Against the gateway ------------------------------------------------------------------------


async def test_reconnects_after_a_server_drop_and_restores_state(gateway: LocalGateway) -> None:
    tokens = Tokens(gateway)
    states: list[dict[str, Any]] = []
    regions: list[tuple[str, str | None]] = []
    async with ReconnectingClient(
        tokens, FAST, on_state=states.append, on_region=lambda new, old: regions.append((new, old))
    ) as client:
        await client.wait_ready(5)
        assert regions == [(REGION, None)]
        reply = await client.request({"action": "bid", "auction": "a1", "amount": 42})
        assert reply["accepted"] is True
        # The server drops the connection (Management API DeleteConnection, as boto3 calls it).
        management = boto3.client(
            "apigatewaymanagementapi", endpoint_url=gateway.management_endpoint, region_name=REGION
        )
        (connection_id,) = gateway.connection_ids
        await asyncio.to_thread(management.delete_connection, ConnectionId=connection_id)
        await eventually(lambda: client.connections == 2 and client.ready)
        # getState went out again after the reconnect, and the state came back by user (more
        # than once if a reply took longer than the request timeout: the client asks again).
        assert len(states) >= 2
        assert states[-1]["state"]["lastBid"]["amount"] == 42
        assert states[-1]["auction"]["highest"] == 42
        # One backoff after a healthy connection: random(0, base).
        assert len(client.delays) == 1 and 0.0 <= client.delays[0] <= FAST.backoff_base
        assert len(tokens.calls) == client.attempts == 2
        assert len(set(tokens.tokens)) == 2  # a fresh token for every attempt
        # The socket had opened: the drop is no reason to distrust the token.
        assert tokens.refreshes == [False, False]
        assert regions == [(REGION, None)]  # same region: no region change reported


async def test_backoff_grows_while_the_region_is_down(gateway: LocalGateway) -> None:
    tokens = Tokens(gateway)
    statuses: list[ClientStatus] = []
    async with ReconnectingClient(tokens, FAST, on_status=statuses.append) as client:
        await client.wait_ready(5)
        gateway.fail(FailureMode.DOWN)  # sockets dropped, handshakes refused with 503
        await eventually(lambda: client.attempts >= 5)
        gateway.recover()
        await eventually(lambda: client.ready and client.connections == 2)
    # The first retry after a healthy connection uses attempt 0; then every consecutive
    # failure doubles the window, up to the cap.
    for n, delay in enumerate(client.delays):
        assert 0.0 <= delay <= min(FAST.backoff_cap, FAST.backoff_base * 2**n)
    assert gateway.stats.rejected.get(503, 0) >= 3
    # The provider learns how many attempts in a row have failed (a drop counts as one).
    assert tokens.calls == list(range(len(tokens.calls)))
    assert len(tokens.calls) == client.attempts  # the provider is asked on every attempt
    # After every attempt that failed before the socket opened, a fresh token is asked for.
    assert tokens.refreshes[:2] == [False, False] and all(tokens.refreshes[2:])
    assert client.forced_refreshes == len(tokens.calls) - 2
    assert ClientStatus.BACKING_OFF in statuses and statuses[-1] is ClientStatus.CLOSED


async def test_an_unanswered_heartbeat_forces_a_reconnect_on_an_open_socket(
    gateway: LocalGateway,
) -> None:
    tokens = Tokens(gateway)
    others: list[dict[str, Any]] = []
    async with ReconnectingClient(tokens, FAST, on_message=others.append) as client:
        await client.wait_ready(5)
        await eventually(lambda: client.pongs >= 1)  # the text frame "pong" counts
        (connection_id,) = gateway.connection_ids
        # The failure hardest to notice: the handler is throttled. The socket stays open and
        # protocol pings would still be answered, but no pong comes back, only error frames.
        failed_at = time.monotonic()
        gateway.fail(FailureMode.THROTTLED)
        await eventually(lambda: client.forced_reconnects == 1, timeout=5)
        detected_after = time.monotonic() - failed_at
        # One heartbeat (the default) had to go unanswered: at least its timeout, at most the
        # quiet period plus the timeout (and scheduling slack).
        assert (
            FAST.heartbeat_timeout
            <= detected_after
            <= FAST.heartbeat_interval + FAST.heartbeat_timeout + 0.5
        )
        # Until the client gave up, the gateway still held the connection open; its error
        # frame was no sign of life.
        assert gateway.stats.failed_messages >= 1
        assert any(m.get("message") == "Internal server error" for m in others)
        # Reconnecting fails (HTTP 500) until the region recovers; then the state is back.
        await eventually(lambda: gateway.stats.rejected.get(500, 0) >= 1)
        gateway.recover()
        await eventually(lambda: client.ready and client.connections == 2)
        assert connection_id not in gateway.connection_ids
        assert client.auth_failures == 0


@pytest.mark.parametrize(
    ("status", "tokens_kwargs"),
    [(401, {"with_token": False}), (403, {"key": WRONG_KEY})],
    ids=["401-no-token", "403-bad-signature"],
)
async def test_authorization_failures_are_retried_a_bounded_number_of_times(
    gateway: LocalGateway, status: int, tokens_kwargs: dict[str, Any]
) -> None:
    tokens = Tokens(gateway, **tokens_kwargs)
    config = ClientConfig(**{**FAST.__dict__, "max_auth_retries": 2})
    client = ReconnectingClient(tokens, config)
    async with client:
        with pytest.raises(AuthorizationFailed) as failed:
            await client.wait_ready(10)
    assert failed.value.status == status
    assert client.status is ClientStatus.FAILED
    assert client.attempts == len(tokens.calls) == 3  # the first try and two retries
    assert gateway.stats.rejected == {status: 3}
    with pytest.raises(AuthorizationFailed):
        await client.wait_stopped()


async def test_a_refused_handshake_is_retried_with_a_fresh_token_and_reported(
    gateway: LocalGateway,
) -> None:
    """The browser client retried for ever while the Python client gave up after 3 refusals:
    the same refusal had two outcomes. Both now retry with backoff and a fresh token, report
    each refusal, and connect once a token is accepted again (a fixed authorizer, a user who
    signed in again)."""
    tokens = Tokens(gateway, bad_for=5)  # the first five attempts are refused
    refusals: list[int | None] = []
    client = ReconnectingClient(tokens, FAST, on_handshake_failed=refusals.append)
    async with client:
        await client.wait_ready(30)
    assert refusals == [403] * 5 and client.auth_failures == 5
    assert gateway.stats.rejected == {403: 5}
    assert tokens.refreshes == [False, True, True, True, True, True]  # a new token each time


async def test_an_expired_token_makes_the_client_reconnect_with_a_fresh_one(
    gateway: LocalGateway,
) -> None:
    """The server answers every request on a connection whose token expired with
    ``token_expired``: the client reconnects, asking its provider for a fresh token."""
    tokens = Tokens(gateway, lifetime=3)  # valid at the handshake, expired a few seconds on
    async with ReconnectingClient(tokens, FAST) as client:
        await client.wait_ready(5)
        deadline = time.monotonic() + 60
        while client.connections < 2:
            assert time.monotonic() < deadline, "never told the token expired"
            with contextlib.suppress(Exception):
                await client.request({"action": "getState"}, timeout=2)
            await asyncio.sleep(0.2)
        assert True in tokens.refreshes[1:]  # the expired token was not offered again


async def test_an_authorization_failure_within_the_bound_recovers(gateway: LocalGateway) -> None:
    tokens = Tokens(gateway, bad_for=1)  # a stale token first, then a good one
    async with ReconnectingClient(tokens, FAST) as client:
        await client.wait_ready(5)
        assert client.auth_failures == 1 and client.attempts == 2
        assert gateway.stats.rejected == {403: 1}
        assert tokens.refreshes == [False, True]  # the refused token is not offered again


async def test_query_string_tokens_work_too(gateway: LocalGateway) -> None:
    tokens = Tokens(gateway, transport=TokenTransport.QUERY)
    async with ReconnectingClient(tokens, FAST) as client:
        await client.wait_ready(5)
        assert (await client.request({"action": "getState"}))["type"] == "state"
        await eventually(lambda: client.pongs >= 1)


async def test_a_frame_over_32_kb_is_refused_before_sending(gateway: LocalGateway) -> None:
    async with ReconnectingClient(Tokens(gateway), FAST) as client:
        await client.wait_ready(5)
        before = gateway.stats.messages
        big = {"action": "bid", "auction": "a1", "amount": 1, "pad": "x" * 40_000}
        with pytest.raises(FrameTooLarge, match="32768-byte"):
            await client.request(big)
        with pytest.raises(FrameTooLarge):
            await client.send(big)
        # Nothing was sent and the connection is intact (a 40 KB frame would have closed it).
        assert gateway.stats.messages == before
        assert (await client.request({"action": "getState"}))["type"] == "state"
        assert client.connections == 1


async def test_replies_are_matched_by_request_id_in_any_order() -> None:
    """A server that answers a batch of requests in reverse order."""
    from websockets.asyncio.server import serve

    async def reverse(ws: Any) -> None:
        batch: list[dict[str, Any]] = []
        async for raw in ws:
            message = json.loads(raw)
            if message["action"] == "getState" and message.get("requestId", "").startswith(
                "client-state-"
            ):
                await ws.send(json.dumps({"type": "state", "region": "r", **message}))
                continue
            if message["action"] == "heartbeat":
                await ws.send("pong")
                continue
            batch.append(message)
            if len(batch) == 5:
                for request in reversed(batch):
                    reply = {"type": "echo", "region": "r", "n": request["n"]}
                    await ws.send(json.dumps({**reply, "requestId": request["requestId"]}))
                batch.clear()

    async with serve(reverse, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        provider = lambda attempt: Endpoint(f"ws://127.0.0.1:{port}")  # noqa: E731 (old style)
        async with ReconnectingClient(provider, FAST) as client:
            await client.wait_ready(5)
            replies = await asyncio.gather(
                *(client.request({"action": "echo", "n": n}) for n in range(5))
            )
    assert [reply["n"] for reply in replies] == list(range(5))


async def test_close_is_clean(gateway: LocalGateway) -> None:
    before = asyncio.all_tasks()
    client = await ReconnectingClient(Tokens(gateway), FAST).start()
    await client.wait_ready(5)
    gateway.fail(FailureMode.THROTTLED)  # nothing answers: the request stays pending
    pending = asyncio.create_task(client.request({"action": "getState"}, timeout=30))
    await asyncio.sleep(0.05)
    await client.close()
    with pytest.raises((ClientClosed, ConnectionLost)):
        await pending
    assert client.status is ClientStatus.CLOSED
    with pytest.raises(NotConnected):
        await client.send({"action": "heartbeat"})
    with pytest.raises(ClientClosed):
        await client.wait_ready(1)
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert [t for t in leftover if client.name in t.get_name()] == []
    gateway.recover()


async def test_closing_while_backing_off(gateway: LocalGateway) -> None:
    gateway.fail(FailureMode.DOWN)

    class Longest(random.Random):
        """Full jitter at its ceiling: every pause is the whole backoff."""

        def uniform(self, a: float, b: float) -> float:
            return b

    # A pause of 60 s, far longer than the close may take: a close that waited it out fails.
    patient = dataclasses.replace(FAST, backoff_base=60.0, backoff_cap=120.0)
    client = await ReconnectingClient(Tokens(gateway), patient, rng=Longest()).start()
    await eventually(lambda: client.status is ClientStatus.BACKING_OFF)
    started = time.monotonic()
    await client.close()
    assert time.monotonic() - started < 30
    assert client.status is ClientStatus.CLOSED
    gateway.recover()
