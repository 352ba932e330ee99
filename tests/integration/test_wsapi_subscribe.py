"""Subscribe, replay, unsubscribe and getState's subscriptions, through real WebSockets.

The local API Gateway stand-in runs the real authorizer and handlers; the fleet's tables (the
lease table with a stream's readers and origin, the messages table) and the WebSocket API's
tables are on dynalite. Messages are stored here the way the workers' sink stores them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from streamfleet import model
from streamfleet.env import ConfigError
from streamfleet.lease.dynamo import from_item, to_attr
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer, AuthorizerConfig
from streamfleet.wsapi.handlers import WsApiHandlers
from streamfleet.wsapi.handlers.config import HandlerConfig
from streamfleet.wsapi.handlers.messages import (
    BadMessage,
    Subscribe,
    Unsubscribe,
    parse_message,
)
from tests import wsapi_live_support
from tests.wsapi_live_support import LiveTablesSet, live_gateway
from tests.wsapi_support import AUDIENCE, CANARY_KEY, ISSUER, KEY, REGION, user_token

REPLY_TIMEOUT = 5.0
live_tables = wsapi_live_support.live_tables  # the fixture


def alice_token() -> str:
    return user_token("alice")


async def open_ws(url: str, token: str) -> ClientConnection:
    protocols = [model.WS_APP_SUBPROTOCOL, f"{model.WS_BEARER_SUBPROTOCOL_PREFIX}{token}"]
    return await connect(url, subprotocols=protocols, open_timeout=5, max_size=2**20)


async def receive(ws: ClientConnection) -> dict[str, Any]:
    raw = await asyncio.wait_for(ws.recv(), REPLY_TIMEOUT)
    assert len(raw.encode() if isinstance(raw, str) else raw) <= model.WS_MAX_FRAME_BYTES
    return json.loads(raw)


async def subscribe(
    ws: ClientConnection,
    stream: str,
    after: int | None,
    request_id: str = "s1",
    after_epoch: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``subscribed`` reply and every replay entry that follows it (joined parts)."""
    request = {"action": "subscribe", "stream": stream, "after": after, "requestId": request_id}
    if after_epoch is not None:
        request["afterEpoch"] = after_epoch
    await ws.send(json.dumps(request))
    reply = await receive(ws)
    if reply["type"] != model.WS_REPLY_SUBSCRIBED:
        return reply, []
    entries: list[dict[str, Any]] = []
    seqs: set[tuple[int, int]] = set()
    while len(seqs) < reply["replayed"]:
        frame = await receive(ws)
        assert frame["type"] == model.WS_REPLY_MESSAGES and frame["stream"] == stream
        assert frame["source"] == "replay" and frame["region"] == "us-east-1"
        entries += frame["messages"]
        seqs = {
            (e["epoch"], e["seq"]) for e in entries if e.get("part", 0) + 1 == e.get("parts", 1)
        }
    return reply, entries


def joined(entries: list[dict[str, Any]]) -> dict[int, str]:
    messages: dict[int, str] = {}
    for entry in entries:
        messages[entry["seq"]] = messages.get(entry["seq"], "") + entry["data"]
    return messages


def reader_authorizer() -> Authorizer:
    """The test issuer's tokens, passing the ``groups`` claim on as reader tags."""
    return Authorizer(
        AuthorizerConfig(
            issuer=ISSUER,
            audience=AUDIENCE,
            keys=json.dumps(jwt.jwks_document([KEY])),
            canary_keys=json.dumps(jwt.jwks_document([CANARY_KEY])),
            reader_claims=("groups",),
        )
    )


# --- Parsing ------------------------------------------------------------------------------------


def test_subscribe_and_unsubscribe_messages_are_validated_field_by_field() -> None:
    old_client = {"knows_epochs": False}  # no afterEpoch
    assert parse_message('{"action":"subscribe","stream":"m-1","after":41}') == Subscribe(
        "m-1", 41, **old_client
    )
    assert parse_message('{"action":"subscribe","stream":"m-1","after":null}') == Subscribe(
        "m-1", **old_client
    )
    assert parse_message(
        '{"action":"subscribe","stream":"m-1","after":41,"afterEpoch":2}'
    ) == Subscribe("m-1", model.log_position(2, 41))
    assert parse_message('{"action":"subscribe","stream":"m-1"}') == Subscribe("m-1", **old_client)
    assert parse_message('{"action":"unsubscribe","stream":"m-1"}') == Unsubscribe("m-1")
    bad = {
        '{"action":"subscribe"}': "stream",
        '{"action":"subscribe","stream":""}': "stream",
        '{"action":"subscribe","stream":"a b"}': "stream",
        '{"action":"subscribe","stream":"m","after":-1}': "after",
        '{"action":"subscribe","stream":"m","after":1.5}': "after",
        '{"action":"subscribe","stream":"m","after":"3"}': "after",
        '{"action":"subscribe","stream":"m","after":true}': "after",
        '{"action":"subscribe","stream":"m","after":9007199254740992}': "after",
        '{"action":"subscribe","stream":"m","after":1,"afterEpoch":-1}': "afterEpoch",
        '{"action":"subscribe","stream":"m","after":1,"afterEpoch":0.5}': "afterEpoch",
        '{"action":"subscribe","stream":"m","after":1,"afterEpoch":"1"}': "afterEpoch",
        '{"action":"subscribe","stream":"m","after":1,"afterEpoch":9007199254740992}': "afterEpoch",
        '{"action":"subscribe","stream":"m","from":3}': "from",
        '{"action":"unsubscribe","stream":"m","after":3}': "after",
    }
    for text, field in bad.items():
        with pytest.raises(BadMessage) as raised:
            parse_message(text)
        assert raised.value.field == field, text


def test_live_delivery_configuration_names_the_missing_variable() -> None:
    env = {"STATE_TABLE_NAME": "s", "CONNECTIONS_TABLE_NAME": "c", "AWS_REGION": "us-east-1"}
    assert HandlerConfig.from_env(env).live is None
    with pytest.raises(ConfigError, match="MESSAGES_TABLE_NAME: required with"):
        HandlerConfig.from_env({**env, "STREAMS_TABLE_NAME": "l", "SUBSCRIPTIONS_TABLE_NAME": "x"})
    full = {
        **env,
        "STREAMS_TABLE_NAME": "l",
        "MESSAGES_TABLE_NAME": "m",
        "SUBSCRIPTIONS_TABLE_NAME": "x",
    }
    live = HandlerConfig.from_env(full).live
    assert live is not None and (live.newest, live.replay_max) == (50, 2000)
    assert HandlerConfig.from_env({**full, "REPLAY_MAX_MESSAGES": "20"}).live.newest == 20
    for name, value in (("REPLAY_MAX_MESSAGES", "0"), ("SUBSCRIBE_NEWEST_MESSAGES", "x")):
        with pytest.raises(ConfigError, match=name):
            HandlerConfig.from_env({**full, name: value})


# --- Replay -------------------------------------------------------------------------------------


async def test_replay_after_a_seq_then_the_reply_says_where_it_ended(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    big = "é" * 40_000  # one message larger than a frame: sent in parts
    tables.store("m1", range(1, 301), data=lambda seq: big if seq == 150 else f"m{seq}" * 30)
    async with live_gateway(tables) as gw, await open_ws(gw.url, alice_token()) as ws:
        reply, entries = await subscribe(ws, "m1", 100)
        assert tables.subscribers("m1") == gw.connection_ids  # this one, registered
    assert reply == {
        "type": "subscribed",
        "stream": "m1",
        "after": 100,
        "afterEpoch": 0,
        "replayed": 200,
        "upTo": 300,
        "upToEpoch": 0,
        "more": False,
        "requestId": "s1",
        "region": "us-east-1",
    }
    messages = joined(entries)
    assert sorted(messages) == list(range(101, 301))
    assert messages[150] == big and messages[151] == "m151" * 30
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)  # in seq order
    assert {e["parts"] for e in entries if "parts" in e} == {
        len([e for e in entries if e["seq"] == 150])
    }
    assert all(e["at"] == 1_700_000_000_000 + e["seq"] for e in entries)


async def test_after_null_starts_at_the_newest_and_an_empty_stream_at_its_origin(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",), origin=10)
    tables.store("m1", range(11, 41))
    tables.start_stream("empty", readers=("user:alice",), origin=7)
    tables.start_stream("unborn", readers=("user:alice",), origin=None)
    async with live_gateway(tables, newest=5) as gw, await open_ws(gw.url, alice_token()) as ws:
        reply, entries = await subscribe(ws, "m1", None)
        assert (reply["after"], reply["upTo"], reply["replayed"]) == (35, 40, 5)
        assert [e["seq"] for e in entries] == [36, 37, 38, 39, 40]
        reply, _ = await subscribe(ws, "empty", None)
        assert (reply["after"], reply["replayed"]) == (7, 0)
        # No origin yet: nobody knows where the log will start; the client learns it later.
        reply, _ = await subscribe(ws, "unborn", None)
        assert (reply["after"], reply["replayed"]) == (None, 0)
        # Below the origin nothing was ever stored: the reply moves the start up.
        reply, entries = await subscribe(ws, "m1", 3)
        assert reply["after"] == 10 and [e["seq"] for e in entries][:2] == [11, 12]


async def test_a_replay_stops_at_its_budget_and_the_next_subscribe_goes_on(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store("m1", range(1, 251))
    gateway = live_gateway(tables, replay_max=100)
    async with gateway as gw, await open_ws(gw.url, alice_token()) as ws:
        got: list[int] = []
        after: int | None = 0
        rounds = 0
        while True:
            reply, entries = await subscribe(ws, "m1", after, f"s{rounds}")
            rounds += 1
            got += [e["seq"] for e in entries]
            after = reply["upTo"]
            if not reply["more"]:
                break
        assert len(tables.subscribers("m1")) == 1  # one item, put again by each subscribe
    assert got == list(range(1, 251)) and rounds == 3


async def test_a_replay_of_big_messages_is_bounded_in_bytes_and_pages_on(
    live_tables: LiveTablesSet,
) -> None:
    """The budget counted messages only: far behind on a stream of 60 KB messages one subscribe
    built about 121 MB of frames and could not finish within the handler's limits."""
    tables = live_tables
    tables.start_stream("big", readers=("user:alice",))
    tables.store("big", range(1, 41), data=lambda seq: f"{seq:05d}" + "b" * 60_000)
    async with live_gateway(tables) as gw, await open_ws(gw.url, alice_token()) as ws:
        got: list[int] = []
        after, rounds = 0, 0
        while True:
            reply, entries = await subscribe(ws, "big", after, f"b{rounds}")
            rounds += 1
            replayed = sorted({e["seq"] for e in entries})
            assert len(replayed) <= 1024 * 1024 // 60_000 + 1, len(replayed)
            got += replayed
            after = reply["upTo"]
            if not reply["more"]:
                break
    assert got == list(range(1, 41)) and rounds >= 3


async def test_only_seqs_that_can_no_longer_be_stored_are_skipped(
    live_tables: LiveTablesSet,
) -> None:
    """A hole whose next message was older than 10 minutes was announced as expired, and the
    cursor dropped the message when it landed, though messages live 7 days: a batch still
    landing, a fleet scaled to zero or a Region behind leave such holes."""
    tables = live_tables
    now_s = int(time.time())
    three_days_ago_ms = (now_s - 3 * 24 * 3600) * 1000
    tables.start_stream("old", readers=("user:alice",))
    # Seq 499 expired an hour ago (and 1..498 before it).
    tables.store("old", range(500, 510), prev={500: (499, now_s - 3600)})
    tables.start_stream("hole", readers=("user:alice",))
    # Seq 19 was received and has four days to live: the hole may still be filled.
    tables.store(
        "hole", range(20, 30), received_at_ms=three_days_ago_ms, prev={20: (19, now_s + 4 * 86400)}
    )
    tables.start_stream("gap", readers=("user:alice",))
    # The upstream sent nothing between 5 and 20: a gap, never a hole.
    tables.store("gap", range(20, 30), prev={20: (5, None)})
    tables.start_stream("leftover", readers=("user:alice",))
    # 10 was stored before a hole at 9 (a batch that landed in part); its successor resumed
    # after 5 and its upstream went on at 15: 6..9 and 11..14 can never be stored.
    tables.store(
        "leftover",
        (10, *range(15, 20)),
        prev={10: (9, now_s + 4 * 86400), 15: (5, now_s + 4 * 86400)},
    )
    tables.start_stream("unknown", readers=("user:alice",))
    tables.store("unknown", range(20, 30), received_at_ms=three_days_ago_ms)  # no prev_seq
    async with live_gateway(tables) as gw, await open_ws(gw.url, alice_token()) as ws:
        reply, entries = await subscribe(ws, "old", 0)
        assert (reply["after"], reply["skipped"], reply["replayed"]) == (499, 499, 10)
        reply, entries = await subscribe(ws, "gap", 5)
        assert (reply["after"], reply["skipped"], reply["replayed"]) == (19, 14, 10)
        reply, entries = await subscribe(ws, "leftover", 5)
        assert (reply["after"], reply["skipped"], reply["replayed"]) == (9, 4, 6)
        assert [e["seq"] for e in entries] == [10, 15, 16, 17, 18, 19]
        for stream in ("hole", "unknown"):
            reply, entries = await subscribe(ws, stream, 0)
            assert reply["after"] == 0 and "skipped" not in reply, stream
            assert [e["seq"] for e in entries] == list(range(20, 30))


async def test_a_log_that_restarted_is_replayed_epoch_by_epoch_and_a_cursor_moves_on_to_the_new(
    live_tables: LiveTablesSet,
) -> None:
    """The upstream numbered from 1 again after seq 5: the new messages are epoch 1's. A reader
    at the end of epoch 0 is moved to epoch 1's origin (nothing can come in between), one further
    back gets the rest of epoch 0 and then epoch 1, and every entry names its epoch."""
    tables = live_tables
    tables.start_stream("re", readers=("user:alice",))
    tables.store_restarted(
        "re",
        old=5,
        new=3,
        data=lambda position: f"{model.epoch_of(position)}/{model.seq_of(position)}",
    )
    async with live_gateway(tables) as gw, await open_ws(gw.url, alice_token()) as ws:
        reply, entries = await subscribe(ws, "re", 3, after_epoch=0)
        assert (reply["after"], reply["afterEpoch"], reply["upTo"], reply["upToEpoch"]) == (
            3,
            0,
            3,
            1,
        )
        assert [(e["epoch"], e["seq"], e["data"]) for e in entries] == [
            (0, 4, "0/4"),
            (0, 5, "0/5"),
            (1, 1, "1/1"),
            (1, 2, "1/2"),
            (1, 3, "1/3"),
        ]
        reply, entries = await subscribe(ws, "re", 5, "s2", after_epoch=0)
        assert (reply["after"], reply["afterEpoch"], reply["replayed"]) == (0, 1, 3)
        assert "skipped" not in reply  # a new epoch, not a gap
        # A client that sends no afterEpoch would drop epoch 1's seqs as duplicates: refused.
        for after in (5, None):
            reply, _ = await subscribe(ws, "re", after, "old")
            assert (reply["error"], reply["field"]) == ("bad_request", "afterEpoch"), reply
        assert tables.subscribers("re") == []  # refused: nothing is delivered to it
        # ...on this connection only: the user's other clients still follow it from getState.
        listed = tables.dynamodb.get_item(
            TableName=tables.state,
            Key={model.PK: {"S": model.user_subscriptions_pk("alice")}},
            ConsistentRead=True,
        )["Item"][model.WS_STREAMS]["SS"]
        assert "re" in listed
        reply, entries = await subscribe(ws, "re", 2, "s3", after_epoch=1)
        assert [(e["epoch"], e["seq"]) for e in entries] == [(1, 3)]
        reply, entries = await subscribe(ws, "re", None, "s4", after_epoch=0)
        assert (reply["after"], reply["afterEpoch"]) == (0, 0)


# --- Who may read what --------------------------------------------------------------------------


async def test_only_readers_may_subscribe_and_everyone_else_gets_the_same_clear_refusal(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice", "groups:ops"))
    tables.start_stream("nobody")  # no readers at all: default deny
    tables.store("m1", range(1, 4))
    async with live_gateway(tables, auth=reader_authorizer()) as gateway:
        tokens = {
            "alice": user_token("alice"),
            "ops": user_token("carol", groups=["dev", "ops"]),
            "dev": user_token("dave", groups=["dev"]),
            "bob": user_token("bob"),
            "forged": user_token("mallory", **{"user:alice": "x"}),
        }
        answers: dict[str, dict[str, Any]] = {}
        registered: dict[str, list[str]] = {}
        for who, token in tokens.items():
            async with await open_ws(gateway.url, token) as ws:
                answers[who], _ = await subscribe(ws, "m1", 0)
                answers[f"{who}/nobody"], _ = await subscribe(ws, "nobody", 0)
                answers[f"{who}/missing"], _ = await subscribe(ws, "no-such-stream", 0)
                registered[who] = tables.subscribers("m1")
                assert tables.subscribers("nobody") == tables.subscribers("no-such-stream") == []
    assert answers["alice"]["type"] == answers["ops"]["type"] == "subscribed"
    assert len(registered["alice"]) == len(registered["ops"]) == 1
    for key in ("dev", "bob", "forged", "alice/nobody", "ops/missing", "bob/missing"):
        answer = answers[key]
        assert answer["type"] == "error" and answer["error"] == "forbidden", key
        assert answer["field"] == "stream" and answer["requestId"] == "s1"
        assert "not one of its readers" in answer["message"]
    # A refused subscribe registers nothing.
    assert registered["dev"] == registered["bob"] == registered["forged"] == []


class _ClockPastExpiryOnReplay:
    """A DynamoDB client whose clock passes ``expires_at`` when a replay is read: a subscribe
    accepted just before its token expired, whose replay read ends after it."""

    def __init__(self, client: Any, messages_table: str, expires_at: int) -> None:
        self._client = client
        self._messages = messages_table
        self._expires_at = expires_at
        self.ms = (expires_at - 1) * 1000

    def monotonic(self) -> float:
        return self.ms / 1000

    def wall_ms(self) -> int:
        return self.ms

    def query(self, **params: Any) -> Any:
        answer = self._client.query(**params)
        if params.get("TableName") == self._messages:
            self.ms = self._expires_at * 1000
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_token_that_expires_while_the_replay_is_read_is_served_none_of_it(
    live_tables: LiveTablesSet,
) -> None:
    """The replay may hold messages stored after the token expired: the subscribe is refused
    with token_expired (the client reconnects with a fresh token), nothing of the replay is
    posted, and the connection is not left registered for live delivery."""
    tables = live_tables
    tables.start_stream("m1", readers=("user:alice",))
    tables.store("m1", range(1, 4))
    expires_at = 1_800_000_000
    store = _ClockPastExpiryOnReplay(tables.dynamodb, tables.messages, expires_at)
    sent: list[dict[str, Any]] = []
    handlers = WsApiHandlers(
        HandlerConfig(tables.state, tables.connections, REGION, live=tables.live()),
        dynamodb=store,
        replier=_Recording(sent),
        clock=store,
    )
    context = {
        "routeKey": "$default",
        "connectionId": "c1",
        "authorizer": {"sub": "alice", model.WS_CONTEXT_TOKEN_EXPIRES_AT: expires_at},
    }
    body = {"action": "subscribe", "stream": "m1", "after": 0, "requestId": "s1"}
    handlers({"requestContext": context, "body": json.dumps(body)})

    assert [(m["type"], m.get("error"), m.get("field")) for m in sent] == [
        ("error", "token_expired", "token")
    ]
    assert tables.subscribers("m1") == []
    listed = tables.dynamodb.get_item(
        TableName=tables.subscriptions,
        Key={k: to_attr(v) for k, v in model.connection_streams_key("c1").items()},
        ConsistentRead=True,
    ).get("Item", {})
    assert "m1" not in from_item(listed).get(model.WS_STREAMS, set())


class _Recording:
    def __init__(self, sent: list[dict[str, Any]]) -> None:
        self._sent = sent

    def post(self, request_context: Any, connection_id: str, data: bytes) -> None:
        self._sent.append(json.loads(data))


async def test_the_canary_cannot_subscribe(live_tables: LiveTablesSet) -> None:
    tables = live_tables
    tables.start_stream("m1", readers=("user:canary:probe",))
    now = int(time.time())
    claims = {"sub": "probe", "iss": model.CANARY_TOKEN_ISSUER, "aud": AUDIENCE}
    token = jwt.sign({**claims, "iat": now, "exp": now + 60}, CANARY_KEY)
    async with live_gateway(tables) as gateway, await open_ws(gateway.url, token) as ws:
        answer, _ = await subscribe(ws, "m1", 0)
    assert answer["error"] == "forbidden" and tables.subscribers("m1") == []


async def test_without_live_tables_subscribe_is_not_supported(gateway) -> None:
    async with await open_ws(gateway.url, user_token("alice")) as ws:
        answer, _ = await subscribe(ws, "m1", 0)
    assert (answer["type"], answer["error"], answer["field"]) == (
        "error",
        "not_supported",
        "stream",
    )


# --- Subscriptions in the server's state --------------------------------------------------------


async def test_get_state_lists_the_users_subscriptions_across_connections(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    for stream in ("m1", "m2"):
        tables.start_stream(stream, readers=("user:alice",))
    async with live_gateway(tables) as gateway:
        async with await open_ws(gateway.url, alice_token()) as ws:
            await subscribe(ws, "m1", None, "a")
            await subscribe(ws, "m2", None, "b")
            first = ws.id
            (connection_id,) = tables.subscribers("m1")
            key = model.connection_streams_key(connection_id)
            record = from_item(
                tables.dynamodb.get_item(
                    TableName=tables.subscriptions,
                    Key={name: to_attr(value) for name, value in key.items()},
                    ConsistentRead=True,
                )["Item"]
            )
            assert record[model.WS_STREAMS] == {"m1", "m2"}
        # $disconnect removes this connection's subscribers (asynchronously, best effort)...
        deadline = time.monotonic() + 5
        while tables.subscribers("m1") or tables.subscribers("m2"):
            assert time.monotonic() < deadline, "subscriptions not removed at $disconnect"
            await asyncio.sleep(0.05)
        # ...but not the user's subscriptions: a new connection (a reload) is told about them.
        async with await open_ws(gateway.url, alice_token()) as ws:
            assert ws.id != first
            await ws.send(json.dumps({"action": "getState", "requestId": "g"}))
            state = await receive(ws)
            assert state["subscriptions"] == ["m1", "m2"]
            await ws.send(json.dumps({"action": "unsubscribe", "stream": "m1", "requestId": "u"}))
            assert await receive(ws) == {
                "type": "unsubscribed",
                "stream": "m1",
                "requestId": "u",
                "region": "us-east-1",
            }
            await ws.send(json.dumps({"action": "getState", "requestId": "g2"}))
            assert (await receive(ws))["subscriptions"] == ["m2"]
        async with await open_ws(gateway.url, user_token("bob")) as ws:
            await ws.send(json.dumps({"action": "getState", "requestId": "g"}))
            assert (await receive(ws))["subscriptions"] == []


async def test_a_connection_may_hold_a_bounded_number_of_subscriptions(
    live_tables: LiveTablesSet,
) -> None:
    tables = live_tables
    limit = model.MAX_SUBSCRIPTIONS_PER_CONNECTION
    for index in range(limit + 1):
        tables.start_stream(f"s{index}", readers=("user:alice",))
    async with live_gateway(tables) as gw, await open_ws(gw.url, alice_token()) as ws:
        for index in range(limit):
            reply, _ = await subscribe(ws, f"s{index}", None, f"r{index}")
            assert reply["type"] == "subscribed"
        again, _ = await subscribe(ws, "s0", None, "again")  # already held: fine
        assert again["type"] == "subscribed"
        over, _ = await subscribe(ws, f"s{limit}", None, "over")
    assert (over["error"], over["field"]) == ("bad_request", "stream")
    assert str(limit) in over["message"] and tables.subscribers(f"s{limit}") == []


async def test_subscribers_are_bounded_per_stream_and_per_user(live_tables: LiveTablesSet) -> None:
    """The only limit was 50 subscriptions per connection: one reader with 120 connections made
    every message of the stream cost 120 posts, and a few hundred subscribers held the shard."""
    tables = live_tables
    tables.start_stream("hot", readers=("user:alice", "user:bob", "user:carol"))
    gateway = live_gateway(tables, max_subscribers=3, max_user_connections=2)
    async with gateway as gw, contextlib.AsyncExitStack() as sockets:
        alice = [
            await sockets.enter_async_context(await open_ws(gw.url, alice_token()))
            for _ in range(3)
        ]
        replies = [(await subscribe(ws, "hot", 0, f"a{n}"))[0] for n, ws in enumerate(alice)]
        assert [r["type"] for r in replies] == ["subscribed", "subscribed", "error"]
        assert (replies[2]["error"], replies[2]["field"]) == ("too_many_connections", "stream")
        # A connection already subscribed subscribes again (a resume) within its bound.
        assert (await subscribe(alice[0], "hot", 0, "again"))[0]["type"] == "subscribed"
        bob = await sockets.enter_async_context(await open_ws(gw.url, user_token("bob")))
        assert (await subscribe(bob, "hot", 0, "b"))[0]["type"] == "subscribed"
        carol = await sockets.enter_async_context(await open_ws(gw.url, user_token("carol")))
        reply, _ = await subscribe(carol, "hot", 0, "c")
        assert (reply["type"], reply["error"]) == ("error", "too_many_subscribers")
        assert len(tables.subscribers("hot")) == 3  # nothing written for a refusal
