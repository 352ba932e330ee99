"""The Python client against a scripted server that answers with errors, loses a reply, or lists
streams the application gave up: every request is asked again until answered, and an
unsubscribe sticks."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage

CONFIG = ClientConfig(
    heartbeat_interval=5,
    heartbeat_timeout=5,
    backoff_base=0.05,
    backoff_cap=0.2,
    request_timeout=1.0,
    gap_timeout=0.2,
)


@dataclass
class Script:
    """What the server does: how many getStates and subscribes to refuse first, and what it
    lists as the user's subscriptions."""

    refuse_state: int = 0
    refuse_subscribe: int = 0
    listed: list[str] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)
    connections: list[ServerConnection] = field(default_factory=list)
    down: bool = False  # refuse every handshake (HTTP 503), as a Region that is down
    close_after_state: bool = False  # answer getState, then close at once (code 4000)
    junk_first: bool = False  # a binary and a 200 KB message before anything else

    def refuse_while_down(self, connection: ServerConnection, request: Any) -> Any:
        return connection.respond(503, "down\n") if self.down else None

    async def serve(self, ws: ServerConnection) -> None:
        self.connections.append(ws)
        if self.junk_first:
            await ws.send(b'{"type":"state"}')
            await ws.send('"' + "x" * 200 * 1024 + '"')
        async for raw in ws:
            if raw == '{"action":"heartbeat"}':
                await ws.send("pong")
                continue
            request = json.loads(raw)
            self.seen.append(request)
            action, rid = request.get("action"), request.get("requestId")
            if action == "getState":
                if self.refuse_state > 0:
                    self.refuse_state -= 1
                    reply = {"type": "error", "error": "unavailable", "requestId": rid}
                else:
                    reply = {"type": "state", "subscriptions": self.listed, "requestId": rid}
            elif action == "subscribe":
                if self.refuse_subscribe > 0:
                    self.refuse_subscribe -= 1
                    reply = {"type": "error", "error": "unavailable", "requestId": rid}
                else:
                    stream = request["stream"]
                    await ws.send(
                        json.dumps(
                            {
                                "type": "subscribed",
                                "stream": stream,
                                "after": 0,
                                "upTo": 1,
                                "replayed": 1,
                                "more": False,
                                "requestId": rid,
                                "region": "r",
                            }
                        )
                    )
                    reply = {
                        "type": "messages",
                        "stream": stream,
                        "source": "replay",
                        "region": "r",
                        "messages": [{"seq": 1, "data": "one"}],
                    }
            elif action == "unsubscribe":
                reply = {"type": "unsubscribed", "stream": request["stream"], "requestId": rid}
            else:
                reply = {"type": "error", "error": "bad_request", "requestId": rid}
            await ws.send(json.dumps({**reply, "region": "r"}))
            if self.close_after_state and action == "getState":
                await ws.close(4000, "going away at once")

    def sent(self, action: str) -> list[dict[str, Any]]:
        return [r for r in self.seen if r.get("action") == action]


@contextlib.asynccontextmanager
async def client_of(
    script: Script, config: ClientConfig = CONFIG, **callbacks: Any
) -> AsyncIterator[ReconnectingClient]:
    async with serve(
        script.serve, "127.0.0.1", 0, process_request=script.refuse_while_down
    ) as server:
        url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
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
        await asyncio.sleep(0.02)


async def test_a_get_state_answered_with_an_error_is_asked_again_until_answered():
    """The client stayed open and never ready: it never followed the server's subscriptions."""
    script = Script(refuse_state=2)
    async with client_of(script) as client:
        await client.wait_ready(20)
        assert len(script.sent("getState")) == 3 and client.connections == 1


async def test_a_first_subscribe_answered_with_an_error_is_sent_again():
    """One subscribe was sent, answered unavailable, and nothing was ever delivered."""
    script = Script(refuse_subscribe=1)
    delivered: list[StreamMessage] = []
    async with client_of(script, on_stream_message=delivered.append) as client:
        await client.wait_ready(20)
        await client.subscribe("s")
        await until(lambda: [m.seq for m in delivered] == [1], "the stream delivered")
        assert len(script.sent("subscribe")) == 2


async def test_an_unsubscribe_made_while_disconnected_sticks():
    """The server was never told; its next getState listed the stream and the client
    subscribed to it again."""
    script = Script(listed=["s"])
    async with client_of(script) as client:
        await client.wait_ready(20)
        await until(lambda: "s" in client.subscriptions, "following the listed stream")
        script.down = True
        await script.connections[-1].close()
        await until(lambda: client.attempts >= 3, "failing to reconnect")
        await client.unsubscribe("s")  # while disconnected
        script.down = False
        await until(lambda: client.connections == 2 and client.ready, "reconnected")
        await until(lambda: script.sent("unsubscribe"), "the server told")

        assert "s" not in client.subscriptions
        assert [r["stream"] for r in script.sent("subscribe")] == ["s"]  # never again


async def test_a_connection_that_answers_and_then_closes_is_backed_off_from():
    """A server that answered getState and then closed reset the backoff each time: 22 to 30
    connections a client in 30 s, never reaching the cap. Health now also takes time, and the
    client says how the server closed."""
    script = Script(close_after_state=True)
    async with client_of(script) as client:
        await until(lambda: client.connections >= 5, "five connections")
        assert client.consecutive_failures >= 4
        assert (client.last_close_code, client.last_close_reason) == (4000, "going away at once")
    script = Script(close_after_state=True)
    async with client_of(script, dataclasses.replace(CONFIG, min_healthy_seconds=0)) as client:
        await until(lambda: client.connections >= 5, "five connections")
        assert client.consecutive_failures == 1  # healthy at once: the backoff starts over


async def test_a_binary_or_oversized_message_is_skipped_never_a_reason_to_reconnect():
    """A message over the limit closed the connection (1009) and the client dialled again for
    ever; a binary one was read as text. Both are now skipped and counted, as in the browser."""
    script = Script(junk_first=True)
    async with client_of(script) as client:
        await client.wait_ready(20)
        assert (client.frames_skipped, client.connections) == (2, 1)
