"""The Python client's liveness against a scripted server on loopback: a connection that goes
silent is dropped after one unanswered heartbeat, replies of ours spare the heartbeats and error
frames do not, the connection is rotated (make before break) with subscriptions going on
exactly once, and sending while not ready is refused or queued. Timings are compressed; every
wait is on an outcome, with a generous deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from streamfleet_client import (
    ClientClosed,
    ClientConfig,
    ClientStatus,
    Endpoint,
    NotConnected,
    ReconnectingClient,
    SendQueueFull,
    StreamMessage,
)

HEARTBEAT = '{"action":"heartbeat"}'
FAST = ClientConfig(
    heartbeat_interval=0.3,
    heartbeat_timeout=0.3,
    backoff_base=0.05,
    backoff_cap=0.2,
    request_timeout=2.0,
    gap_timeout=0.2,
    max_connection_age=None,
)


@dataclass
class Server:
    """Answers heartbeats, getState and subscribes (stream ``s``: replays what it has after the
    cursor's position), until told to go silent or to answer with error frames only."""

    connections: list[ServerConnection] = field(default_factory=list)
    heartbeats: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    silent: bool = False  # read nothing more, answer nothing: a dead network, socket open
    throttled: bool = False  # every message answered by API Gateway's error frame
    down: bool = False  # refuse handshakes (HTTP 503)
    log: list[int] = field(default_factory=list)  # stream s's seqs
    hold: set[str] = field(default_factory=set)  # actions whose reply waits for release
    held: list[tuple[ServerConnection, dict[str, Any]]] = field(default_factory=list)
    requests: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (connection, it)

    def seen_on(self, connection: int, action: str) -> list[dict[str, Any]]:
        return [r for i, r in self.requests if i == connection and r["action"] == action]

    # While set and not yet released, handshakes after the first wait (a successor held).
    handshake_gate: asyncio.Event | None = None
    waiting_handshakes: int = 0

    async def refuse_while_down(self, connection: ServerConnection, request: Any) -> Any:
        if self.handshake_gate is not None and self.connections:
            self.waiting_handshakes += 1
            await self.handshake_gate.wait()
        return connection.respond(503, "down\n") if self.down else None

    async def serve(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        async for raw in ws:
            if self.silent:
                await ws.wait_closed()  # never answers again; the socket stays open
            if self.throttled:
                await ws.send(json.dumps({"message": "Internal server error"}))
                continue
            if raw == HEARTBEAT:
                self.heartbeats += 1
                await ws.send("pong")
                continue
            request = json.loads(raw)
            self.seen.append(request)
            self.requests.append((self.connections.index(ws), request))
            if request["action"] in self.hold:
                self.held.append((ws, request))
            else:
                await self.answer(ws, request)

    async def answer(self, ws: ServerConnection, request: dict[str, Any]) -> None:
        action, rid = request["action"], request.get("requestId")
        if action == "getState":
            await ws.send(json.dumps({"type": "state", "requestId": rid, "subscriptions": []}))
        elif action == "subscribe":
            after = request["after"] or 0
            replay = [seq for seq in self.log if seq > after]
            upto = replay[-1] if replay else after
            reply = {"type": "subscribed", "stream": "s", "after": after, "upTo": upto}
            await ws.send(
                json.dumps({**reply, "replayed": len(replay), "more": False, "requestId": rid})
            )
            if replay:
                await ws.send(json.dumps(frame(replay, "replay")))
        else:
            await ws.send(json.dumps({"type": action, "requestId": rid}))

    async def publish(self, seq: int, *connections: ServerConnection) -> None:
        """Stores ``seq`` and posts it live to ``connections`` (default: every open one)."""
        self.log.append(seq)
        for ws in connections or self.connections:
            with contextlib.suppress(Exception):
                await ws.send(json.dumps(frame([seq], "live")))


def frame(seqs: list[int], source: str) -> dict[str, Any]:
    return {
        "type": "messages",
        "stream": "s",
        "source": source,
        "messages": [{"seq": seq, "data": f"d{seq}"} for seq in seqs],
    }


@contextlib.asynccontextmanager
async def client_of(
    server: Server, config: ClientConfig = FAST, **callbacks: Any
) -> AsyncIterator[ReconnectingClient]:
    async with serve(
        server.serve, "127.0.0.1", 0, process_request=server.refuse_while_down
    ) as listening:
        url = f"ws://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
        client = ReconnectingClient(lambda attempt: Endpoint(url, None), config, **callbacks)
        await client.start()
        try:
            yield client
        finally:
            await client.close()


async def until(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def test_the_defaults_notice_a_dead_connection_within_30_s_at_3_heartbeats_an_idle_minute():
    config = ClientConfig()
    bound = (
        config.heartbeat_interval + config.missed_pongs_before_reconnect * config.heartbeat_timeout
    )
    assert bound <= 30
    assert 60 / config.heartbeat_interval <= 3
    assert config.max_connection_age is not None and config.max_connection_age < 2 * 3600 * 0.95
    assert config.send_queue_size == 0  # refuse, as before
    with pytest.raises(ValueError, match="max_connection_age"):
        ClientConfig(max_connection_age=0)
    with pytest.raises(ValueError, match="send_queue_size"):
        ClientConfig(send_queue_size=-1)


async def test_a_silent_connection_is_dropped_after_one_unanswered_heartbeat():
    server = Server()
    async with client_of(server) as client:
        await client.wait_ready(10)
        await until(lambda: server.heartbeats >= 2, "heartbeats answered on a quiet connection")
        assert client.forced_reconnects == 0
        server.silent = True
        await until(lambda: client.forced_reconnects == 1, "the silent connection dropped")
        server.silent = False
        await until(lambda: client.ready and client.connections == 2, "connected again")


async def test_replies_of_ours_spare_heartbeats_and_error_frames_do_not():
    server = Server()
    config = ClientConfig(**{**FAST.__dict__, "heartbeat_interval": 1.0})
    async with client_of(server, config) as client:
        await client.wait_ready(10)
        await client.subscribe("s")
        # Live frames every 50 ms, a twentieth of the quiet period: no heartbeat is needed.
        for seq in range(1, 61):
            await server.publish(seq)
            await asyncio.sleep(0.05)
        assert server.heartbeats == 0
        # Throttled: every message answered by an error frame, which proves nothing.
        server.throttled = True
        await until(lambda: client.forced_reconnects == 1, "the throttled connection dropped")


async def test_the_connection_is_rotated_before_it_breaks_and_the_stream_goes_on_once_in_order():
    server = Server(hold={"bid"})
    statuses: list[ClientStatus] = []
    delivered: list[int] = []

    def on_stream_message(message: StreamMessage) -> None:
        delivered.append(message.seq)

    config = ClientConfig(**{**FAST.__dict__, "max_connection_age": 1.0})
    async with client_of(
        server, config, on_status=statuses.append, on_stream_message=on_stream_message
    ) as client:
        await client.wait_ready(10)
        await client.subscribe("s", after=0)
        for seq in (1, 2, 3):
            await server.publish(seq)
        await until(lambda: delivered == [1, 2, 3], "the first messages")
        bid = asyncio.ensure_future(client.request({"action": "bid"}))  # held by the server
        await until(lambda: len(server.held) == 1, "the bid on the first connection")
        old = server.connections[0]
        await until(lambda: len(server.connections) == 2, "a successor connection", timeout=30)
        # Published while both are open: live on the old one only (the new one is not
        # subscribed yet); its replay brings them again, which the cursor drops.
        for seq in (4, 5):
            await server.publish(seq, old)
        await until(lambda: client.rotations == 1 and client.connections == 2, "rotated")
        assert client.ready and client.status is ClientStatus.OPEN
        await until(lambda: len(server.seen_on(1, "subscribe")) >= 1, "resubscribed")
        for seq in (6, 7):
            await server.publish(seq)
        # The reply to the bid sent on the old connection still arrives there.
        held_ws, held = server.held.pop()
        assert held_ws is old
        await server.answer(old, held)
        assert (await asyncio.wait_for(bid, 5))["type"] == "bid"
        await until(
            lambda: delivered == [1, 2, 3, 4, 5, 6, 7], f"exactly once, in order: {delivered}"
        )
        assert (
            ClientStatus.BACKING_OFF not in statuses and ClientStatus.CONNECTING not in statuses[1:]
        )
        assert statuses.count(ClientStatus.OPEN) == 1  # never left it
        await until(lambda: old.close_code is not None, "the old connection closed")


async def test_a_rotation_never_ends_a_frame_midway_nor_interleaves_two_connections():
    """The old connection's frame of seqs 4 and 5 is being delivered (the application's
    coroutine awaits something at seq 4) when the successor opens and the rotation ends the old
    connection's session: 5 is still delivered, after 4, and once."""
    server = Server(handshake_gate=asyncio.Event())
    delivered: list[int] = []
    at_4, go_on = asyncio.Event(), asyncio.Event()

    async def on_stream_message(message: StreamMessage) -> None:
        if message.seq == 4:
            at_4.set()
            await go_on.wait()  # the application's own await (a database, a render)
        delivered.append(message.seq)

    config = ClientConfig(**{**FAST.__dict__, "max_connection_age": 1.0})
    async with client_of(server, config, on_stream_message=on_stream_message) as client:
        await client.wait_ready(10)
        await client.subscribe("s", after=0)
        for seq in (1, 2, 3):
            await server.publish(seq)
        await until(lambda: delivered == [1, 2, 3], "the first messages")
        await until(lambda: server.waiting_handshakes == 1, "a successor dialling", timeout=30)
        old = server.connections[0]
        server.log += [4, 5]
        await old.send(json.dumps(frame([4, 5], "live")))
        await asyncio.wait_for(at_4.wait(), 10)
        server.handshake_gate.set()  # the successor opens; the rotation ends the old session
        await until(lambda: client.rotations == 1 and client.connections == 2, "rotated")
        await until(lambda: len(server.seen_on(1, "subscribe")) >= 1, "resubscribed")
        go_on.set()
        await server.publish(6)
        await until(lambda: delivered == [1, 2, 3, 4, 5, 6], f"once, in order: {delivered}")


async def test_sending_while_not_ready_is_refused_by_default():
    server = Server(down=True)
    async with client_of(server) as client:
        with pytest.raises(NotConnected):
            await client.send({"action": "note"})
        with pytest.raises(NotConnected):
            await client.request({"action": "echo"})
        server.down = False
        await client.wait_ready(10)
        assert [m["action"] for m in server.seen] == ["getState"]


async def test_a_send_queue_keeps_messages_in_order_until_the_state_is_restored():
    server = Server(down=True)
    config = ClientConfig(**{**FAST.__dict__, "send_queue_size": 3})
    async with client_of(server, config) as client:
        await client.send({"action": "note", "n": 1})
        echo = asyncio.ensure_future(client.request({"action": "echo"}, timeout=30))
        expired = asyncio.ensure_future(client.request({"action": "echo", "n": 0}, timeout=0.05))
        with pytest.raises(TimeoutError):
            await expired  # its timeout ran while it waited: never sent
        await client.send({"action": "note", "n": 2})
        with pytest.raises(SendQueueFull, match=r"send queue is full \(3\)"):
            await client.send({"action": "note", "n": 3})
        server.down = False
        assert (await asyncio.wait_for(echo, 10))["type"] == "echo"
        await until(lambda: len(server.seen) == 4, "the queue flushed")
        assert [(m["action"], m.get("n")) for m in server.seen] == [
            ("getState", None),
            ("note", 1),
            ("echo", None),
            ("note", 2),
        ]


async def test_close_drops_the_queue_and_fails_queued_requests():
    server = Server(down=True)
    config = ClientConfig(**{**FAST.__dict__, "send_queue_size": 2})
    async with client_of(server, config) as client:
        queued = asyncio.ensure_future(client.request({"action": "echo"}))
        await client.send({"action": "note"})
        await asyncio.sleep(0)
        await client.close()
        with pytest.raises(ClientClosed):
            await queued
        assert server.seen == []
        with pytest.raises(NotConnected):  # closed: refused, not queued for ever
            await client.send({"action": "note"})
