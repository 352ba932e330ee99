"""The fan-out: the messages table's change stream to every subscriber, live.

Units first (grouping records, what happens to a gone or failing subscriber, a failed read of
the subscribers); then the whole path on loopback: a messages table with a real change stream
(moto's server), the event source mapping stand-in reading it, the fan-out posting through the
local gateway's Management API, and the Python client subscribed through the real handlers.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.env import ConfigError
from streamfleet.lease.dynamo import to_item
from streamfleet.wsapi.fanout import (
    INVOCATION_MARGIN_MS,
    POST_TIMEOUT_S,
    Fanout,
    FanoutConfig,
    messages_by_stream,
)
from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage
from streamfleet_dev.emulator.event_source import EventSourceSettings, StreamEventSource
from streamfleet_dev.emulator.scripted_management import ScriptedManagementApi
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, LocalGateway, wsapi_gateway
from tests.wsapi_support import REGION, authorizer, user_token

CONFIG = FanoutConfig(
    "subs", "https://api.execute-api.us-east-1.amazonaws.com/v1", REGION, "leases"
)


class VirtualClock:
    """Time that passes only when a test says so: the fan-out's budgets judged exactly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000 + round(self.now * 1000)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def record(name: str, stream: str, seq: int, data: str = "x") -> dict[str, Any]:
    image = to_item(
        {model.PK: model.connection_pk(stream), model.SEQ: seq, model.MESSAGE_DATA: data}
    )
    return {"eventName": name, "dynamodb": {"NewImage": image, "Keys": image}}


# --- Units --------------------------------------------------------------------------------------


def test_a_batch_is_grouped_by_stream_sorted_and_the_last_image_of_a_seq_wins() -> None:
    records = [
        record("INSERT", "a", 3),
        record("INSERT", "b", 1),
        record("INSERT", "a", 1, "first"),
        record("MODIFY", "a", 1, "rewritten"),  # a successor's rewrite of the same seq
        {"eventName": "REMOVE", "dynamodb": {"Keys": record("INSERT", "a", 2)["dynamodb"]["Keys"]}},
        {"eventName": "INSERT", "dynamodb": {"NewImage": to_item({"pk": "OTHER#x", "seq": 1})}},
    ]
    grouped = messages_by_stream(records)
    assert {s: [(m.seq, m.data) for m in ms] for s, ms in grouped.items()} == {
        "a": [(1, "rewritten"), (3, "x")],
        "b": [(1, "x")],
    }


def test_the_configuration_names_what_is_missing() -> None:
    env = {
        "SUBSCRIPTIONS_TABLE_NAME": "subs",
        "STREAMS_TABLE_NAME": "leases",
        "APIGW_MANAGEMENT_ENDPOINT": "https://a.execute-api.us-east-1.amazonaws.com/v1",
        "AWS_REGION": REGION,
    }
    assert FanoutConfig.from_env(env).post_threads == 16
    assert FanoutConfig.from_env(env).service_name == model.FANOUT_SERVICE_NAME
    assert FanoutConfig.from_env({**env, "SERVICE_NAME": "feeds-eu"}).service_name == "feeds-eu"
    for name, value in (
        ("SERVICE_NAME", "feeds eu"),
        ("SERVICE_NAME", "x" * 65),
        ("SUBSCRIPTIONS_TABLE_NAME", ""),
        ("STREAMS_TABLE_NAME", ""),
        ("APIGW_MANAGEMENT_ENDPOINT", "wss://x"),
        ("FANOUT_POST_THREADS", "0"),
        ("FANOUT_SUBSCRIBER_BUDGET_MS", "0"),
        ("FANOUT_SUBSCRIBER_BUDGET_MS", "1.5"),
    ):
        with pytest.raises(ConfigError, match=name):
            FanoutConfig.from_env({**env, name: value})


class FakeDynamo:
    """Subscribers by stream, each user ``alice`` (or the one in ``users``) with the claim tags
    in ``tags`` and the token expiry in ``expires``; every stream readable by ``user:alice`` (or
    by ``readers``)."""

    def __init__(
        self,
        subscribers: dict[str, list[str]],
        fail: bool = False,
        *,
        users: dict[str, str | None] | None = None,
        tags: dict[str, list[str]] | None = None,
        expires: dict[str, int] | None = None,
        readers: dict[str, list[str]] | None = None,
    ):
        self.subscribers = subscribers
        self.fail = fail
        self.users = users or {}
        self.tags = tags or {}
        self.expires = expires or {}
        self.readers = readers or {}
        self.deleted: list[str] = []

    def query(self, **params: Any) -> dict[str, Any]:
        if self.fail:
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException"}}, "Query"
            )
        stream = params["ExpressionAttributeValues"][":pk"]["S"].removeprefix("STREAM#")
        items = []
        for i in self.subscribers.get(stream, []):
            item = {
                model.SUB_CONNECTION: {"S": i},
                model.SUB_READER_TAGS: {"S": json.dumps(self.tags.get(i, []))},
            }
            user = self.users.get(i, "alice")
            if user is not None:
                item[model.SUB_USER_ID] = {"S": user}
            if i in self.expires:
                item[model.SUB_TOKEN_EXPIRES_AT] = {"N": str(self.expires[i])}
            items.append(item)
        return {"Items": items}

    def get_item(self, **params: Any) -> dict[str, Any]:
        stream = params["Key"][model.PK]["S"].removeprefix(model.CONNECTION_PREFIX)
        return {"Item": {model.READERS: {"SS": self.readers.get(stream, ["user:alice"])}}}

    def delete_item(self, **params: Any) -> None:
        self.deleted.append(params["Key"][model.SUB_CONNECTION]["S"])


class FakeManagement:
    """A Management API: ``gone``, ``failing`` and ``forbidden`` connections refuse every post,
    ``throttled`` ones the number of posts given; a post to one of ``slow`` advances ``clock``
    by its value (a connection that drains slowly)."""

    def __init__(
        self,
        gone: set[str] = frozenset(),
        failing: set[str] = frozenset(),
        *,
        slow: dict[str, float] | None = None,
        clock: VirtualClock | None = None,
        throttled: dict[str, int] | None = None,
        forbidden: set[str] = frozenset(),
    ):
        self.gone, self.failing = gone, failing
        self.slow, self.clock = slow or {}, clock
        self.throttled, self.forbidden = dict(throttled or {}), forbidden
        self.attempts: dict[str, int] = {}
        self.posts: dict[str, list[bytes]] = {}
        self.closed: list[str] = []

    def post_to_connection(self, *, ConnectionId: str, Data: bytes) -> None:
        self.attempts[ConnectionId] = self.attempts.get(ConnectionId, 0) + 1
        if ConnectionId in self.slow:
            self.clock.advance(self.slow[ConnectionId])
        if self.throttled.get(ConnectionId, 0) > 0:
            self.throttled[ConnectionId] -= 1
            raise ClientError({"Error": {"Code": "LimitExceededException"}}, "PostToConnection")
        if ConnectionId in self.forbidden:
            raise ClientError({"Error": {"Code": "ForbiddenException"}}, "PostToConnection")
        if ConnectionId in self.gone:
            raise ClientError({"Error": {"Code": "GoneException"}}, "PostToConnection")
        if ConnectionId in self.failing:
            raise ClientError({"Error": {"Code": "LimitExceededException"}}, "PostToConnection")
        self.posts.setdefault(ConnectionId, []).append(Data)

    def delete_connection(self, *, ConnectionId: str) -> None:
        self.closed.append(ConnectionId)


def test_only_subscribers_that_may_read_now_get_anything_the_others_are_closed() -> None:
    """Readers were checked only at subscribe: a START that removed a reader, or a token that
    expired, left existing subscriptions delivering for the connection's whole life (2 h)."""
    dynamo = FakeDynamo(
        {"a": ["reader", "group", "removed", "expired", "unknown"]},
        users={"reader": "bob", "group": "dave", "expired": "carol", "unknown": None},
        tags={"group": ["team:red"], "unknown": ["user:bob"]},  # never a user tag from a list
        readers={"a": ["user:bob", "user:carol", "team:red"]},  # a START made these readers
        expires={"reader": int(time.time()) + 3600, "expired": int(time.time()) - 1},
    )
    management = FakeManagement()
    lines: list[str] = []
    fanout = Fanout(CONFIG, dynamodb=dynamo, management=management, metrics_out=lines.append)

    fanout({"Records": [record("INSERT", "a", 1)]})

    assert set(management.posts) == {"reader", "group"}
    assert sorted(management.closed) == ["expired", "removed", "unknown"]
    assert sorted(dynamo.deleted) == ["expired", "removed", "unknown"]
    assert json.loads(lines[-1])[model.METRIC_FANOUT_REVOKED] == 3


def test_gone_subscribers_are_removed_and_failing_ones_closed_to_resume_from_the_log() -> None:
    dynamo = FakeDynamo({"a": ["ok", "gone", "slow"], "b": ["ok"]})
    management = FakeManagement(gone={"gone"}, failing={"slow"})
    lines: list[str] = []
    fanout = Fanout(CONFIG, dynamodb=dynamo, management=management, metrics_out=lines.append)
    records = [record("INSERT", "a", seq, "d" * 300) for seq in range(1, 201)]
    fanout({"Records": [*records, record("INSERT", "b", 7)]})
    frames = [json.loads(f) for f in management.posts["ok"]]
    assert [m["seq"] for f in frames if f["stream"] == "a" for m in f["messages"]] == list(
        range(1, 201)
    )
    assert all(len(f) <= model.WS_MAX_FRAME_BYTES for f in management.posts["ok"])
    assert {f["source"] for f in frames} == {"live"} and {f["region"] for f in frames} == {REGION}
    assert dynamo.deleted == ["gone"] and management.closed == ["slow"]
    (metrics,) = [json.loads(line) for line in lines]
    a_frames = len([f for f in frames if f["stream"] == "a"])
    assert metrics["FanoutPosts"] == a_frames + 1  # posts count frames, not messages
    assert metrics["FanoutDelivered"] == 201  # "ok" got 200 + 1; the others got none
    assert (metrics["FanoutGone"], metrics["FanoutFailedPosts"], metrics["FanoutDisconnected"]) == (
        1,
        1,
        1,
    )
    assert metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == model.METRIC_NAMESPACE
    assert metrics["ServiceName"] == model.FANOUT_SERVICE_NAME


def test_a_slow_subscriber_is_closed_at_its_budget_and_holds_nobody_else() -> None:
    """A reader whose connection drains slowly made the shard wait for all its posts, every
    batch: now no post starts past its budget, and it resumes from the log instead."""
    clock = VirtualClock()
    config = replace(CONFIG, post_threads=1, subscriber_budget_ms=1000, frame_allowance_ms=0)
    dynamo = FakeDynamo({"a": ["slow", "ok"], "b": ["ok"]})
    management = FakeManagement(slow={"slow": 0.4}, clock=clock)
    lines: list[str] = []
    fanout = Fanout(
        config, dynamodb=dynamo, management=management, clock=clock, metrics_out=lines.append
    )
    records = [record("INSERT", "a", seq, "d" * 20_000) for seq in range(1, 11)]

    assert fanout({"Records": [*records, record("INSERT", "b", 1)]}) == {"batchItemFailures": []}

    seqs = {
        connection: [m["seq"] for f in frames for m in json.loads(f)["messages"]]
        for connection, frames in management.posts.items()
    }
    assert seqs["ok"] == [*range(1, 11), 1]  # every frame of both streams
    assert len(management.posts["slow"]) == 3  # at 0.4, 0.8, 1.2 s: the fourth would start late
    assert management.closed == ["slow"]
    (metrics,) = [json.loads(line) for line in lines]
    assert metrics[model.METRIC_FANOUT_OVER_BUDGET] == 1
    assert metrics[model.METRIC_FANOUT_DISCONNECTED] == 1
    assert metrics[model.METRIC_FANOUT_FAILED_POSTS] == 0
    assert metrics[model.METRIC_FANOUT_DELIVERED] == 11 + len(seqs["slow"])


def test_a_batch_stops_posting_before_the_functions_timeout_and_closes_whom_it_did_not_serve():
    """Past Lambda's timeout the whole batch is retried, holding every stream of the shard: the
    batch ends in time instead, and the subscribers it could not serve resume from the log."""
    clock = VirtualClock()
    config = replace(CONFIG, post_threads=1)
    management = FakeManagement(slow={"first": 0.6}, clock=clock)
    lines: list[str] = []
    fanout = Fanout(
        config,
        dynamodb=FakeDynamo({"a": ["first", "second"]}),
        management=management,
        clock=clock,
        metrics_out=lines.append,
    )

    class LambdaContext:  # the attribute of Lambda's context object the fan-out reads
        @staticmethod
        def get_remaining_time_in_millis() -> int:
            return INVOCATION_MARGIN_MS + 500

    result = fanout({"Records": [record("INSERT", "a", 1)]}, LambdaContext())

    assert result == {"batchItemFailures": []}
    assert list(management.posts) == ["first"] and management.closed == ["second"]
    assert json.loads(lines[-1])[model.METRIC_FANOUT_OVER_BUDGET] == 1


def test_a_throttled_post_is_retried_within_the_budget_and_a_refused_one_is_not() -> None:
    """Throttling is the Management API's, not the subscriber's: closing on the first 429 made
    a brownout close every subscriber at once. A refusal is final: no retry."""
    management = FakeManagement(throttled={"busy": 2}, forbidden={"refused"})
    fanout = Fanout(
        CONFIG,
        dynamodb=FakeDynamo({"a": ["busy", "refused"]}),
        management=management,
        metrics_out=lambda line: None,
    )

    fanout({"Records": [record("INSERT", "a", 1)]})

    assert list(management.posts) == ["busy"] and management.attempts["busy"] == 3
    assert management.attempts["refused"] == 1 and management.closed == ["refused"]


def test_past_the_functions_time_nothing_more_is_started_not_even_a_close() -> None:
    """Closing the subscribers a batch did not serve took one call each, on the posting threads:
    many of them, on a slow API, ran past the function's timeout anyway."""
    clock = VirtualClock()
    management = FakeManagement()
    lines: list[str] = []
    fanout = Fanout(
        replace(CONFIG, post_threads=2),
        dynamodb=FakeDynamo({"a": [f"c{n}" for n in range(10)]}),
        management=management,
        clock=clock,
        metrics_out=lines.append,
    )

    class LateContext:  # posting should have stopped, and closing too, a second ago
        @staticmethod
        def get_remaining_time_in_millis() -> int:
            return INVOCATION_MARGIN_MS - round((POST_TIMEOUT_S + 1) * 1000)

    assert fanout({"Records": [record("INSERT", "a", 1)]}, LateContext()) == {
        "batchItemFailures": []
    }
    assert management.posts == {} and management.closed == []
    assert json.loads(lines[-1])[model.METRIC_FANOUT_OVER_BUDGET] == 10


def test_a_failed_read_of_the_subscribers_fails_the_batch_so_lambda_retries_it() -> None:
    fanout = Fanout(CONFIG, dynamodb=FakeDynamo({}, fail=True), management=FakeManagement())
    with pytest.raises(ClientError):
        fanout({"Records": [record("INSERT", "a", 1)]})


# --- The whole path on loopback -----------------------------------------------------------------


def test_a_subscriber_throttled_for_its_whole_budget_is_closed(monkeypatch) -> None:
    """Through the real SDK client: retried with backoff within its budget, then
    DeleteConnection. Retries past the budget would hold the shard's next batch, for every
    stream of the shard."""
    for name, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(name, value)

    def throttled(method: str, connection_id: str) -> tuple[int, float]:
        return (204, 0.0) if method == "DELETE" else (429, 0.0)

    with ScriptedManagementApi(throttled) as api:
        fanout = Fanout(
            FanoutConfig("subs", api.url, REGION, "leases"),
            dynamodb=FakeDynamo({"a": ["slow"]}),
            metrics_out=lambda line: None,
        )
        fanout({"Records": [record("INSERT", "a", 1)]})
    seen = api.seen
    *posts, close = seen
    assert 2 <= len(posts) <= 4 and set(posts) == {("POST", "/v1/@connections/slow")}
    assert close == ("DELETE", "/v1/@connections/slow")


async def test_the_management_apis_throttling_and_refusals_reach_the_fan_out(
    gateway: LocalGateway, monkeypatch
) -> None:
    """The gateway stand-in never answered 429 or 403, so the fan-out's handling of them ran
    only against a scripted server. Throttled twice, a post is retried within the subscriber's
    budget and arrives; refused (403), the subscriber is closed to resume from the log."""
    for name, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(name, value)
    protocols = [
        model.WS_APP_SUBPROTOCOL,
        f"{model.WS_BEARER_SUBPROTOCOL_PREFIX}{user_token('alice')}",
    ]
    async with connect(gateway.url, subprotocols=protocols, open_timeout=5) as ws:
        (connection_id,) = gateway.connection_ids
        lines: list[str] = []
        fanout = Fanout(
            FanoutConfig("subs", gateway.management_endpoint, REGION, "leases"),
            dynamodb=FakeDynamo({"a": [connection_id]}),
            metrics_out=lines.append,
        )
        gateway.fail_management(429, times=2, connection_id=connection_id)
        await asyncio.to_thread(fanout, {"Records": [record("INSERT", "a", 1)]})
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert [m["seq"] for m in frame["messages"]] == [1]
        assert json.loads(lines[-1])[model.METRIC_FANOUT_FAILED_POSTS] == 0

        gateway.fail_management(403, connection_id=connection_id)
        await asyncio.to_thread(fanout, {"Records": [record("INSERT", "a", 2)]})
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        metrics = json.loads(lines[-1])
        assert (metrics[model.METRIC_FANOUT_FAILED_POSTS], metrics["FanoutDisconnected"]) == (1, 1)
    assert gateway.stats.management_faults == 3


async def test_stored_messages_reach_every_subscriber_live_in_batches(moto_tables) -> None:
    tables, endpoint = moto_tables
    tables.start_stream("m1", readers=("user:alice", "user:bob"))
    tables.start_stream("m2", readers=("user:alice",))
    stream_arn = tables.dynamodb.describe_table(TableName=tables.messages)["Table"][
        "LatestStreamArn"
    ]
    received: dict[str, list[StreamMessage]] = {"alice": [], "bob": []}
    stop = asyncio.Event()
    streams = AsyncClient("dynamodbstreams", region_name=REGION, endpoint_url=endpoint)
    gateway = wsapi_gateway(
        GatewaySettings(region=REGION),
        authorizer=authorizer(),
        state_table=tables.state,
        connections_table=tables.connections,
        live=tables.live(),
    )
    async with gateway:
        fanout = Fanout(
            FanoutConfig(tables.subscriptions, gateway.management_endpoint, REGION, tables.leases),
            metrics_out=lambda line: None,
        )
        source = StreamEventSource(
            streams=streams,
            stream_arn=stream_arn,
            function=fanout,
            region=REGION,
            settings=EventSourceSettings(poll_interval=0.05),
        )
        task = asyncio.create_task(source.run(stop))
        await source.ready()
        bob_errors: list = []
        clients = {
            user: ReconnectingClient(
                lambda attempt, user=user: Endpoint(gateway.url, user_token(user)),
                ClientConfig(heartbeat_interval=5, heartbeat_timeout=5),
                on_stream_message=received[user].append,
                on_subscription_error=bob_errors.append if user == "bob" else None,
                name=user,
            )
            for user in received
        }
        try:
            for client in clients.values():
                await client.start()
                await client.wait_ready(5)
                assert (await client.subscribe("m1", after=0))["type"] == "subscribed"
            await clients["alice"].subscribe("m2", after=0)
            sent = time.time()
            tables.store("m1", range(1, 301))
            tables.store("m2", range(1, 51))
            deadline = time.monotonic() + 20
            while len(received["alice"]) < 350 or len(received["bob"]) < 300:
                assert time.monotonic() < deadline, {u: len(m) for u, m in received.items()}
                await asyncio.sleep(0.05)
            # A START removes bob from m1's readers: nothing stored after it reaches him, his
            # connection is closed, and his client's subscribe again is refused.
            tables.start_stream("m1", readers=("user:alice",))
            tables.store("m1", range(301, 321))
            while len(received["alice"]) < 370 or "m1" in clients["bob"].subscriptions:
                assert time.monotonic() < deadline + 20, (len(received["alice"]), bob_errors)
                await asyncio.sleep(0.05)
            assert [e.reply.get("error") for e in bob_errors] == ["forbidden"]
        finally:
            for client in clients.values():
                await client.close()
            stop.set()
            await task
            streams.close()
    alice = [(m.stream, m.seq) for m in received["alice"]]
    assert [s for st, s in alice if st == "m1"] == list(range(1, 321))
    assert [s for st, s in alice if st == "m2"] == list(range(1, 51))
    assert [m.seq for m in received["bob"]] == list(range(1, 301))  # none after the START
    assert {m.source for m in received["bob"]} == {"live"}
    assert all(m.received_at_ms is not None for m in received["bob"])
    # Batching: far fewer invocations than records, far fewer posts than deliveries.
    assert source.stats.records == 370 and source.stats.invocations < 370 / 10
    assert gateway.stats.posts < (350 + 300) / 10
    assert time.time() - sent < 20
