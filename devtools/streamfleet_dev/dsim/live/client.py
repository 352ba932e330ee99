"""Each user's client: the reconnecting client's handling of stream cursors, without
sockets."""

from __future__ import annotations

import itertools
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamfleet import model
from streamfleet.backoff import full_jitter
from streamfleet_client.reconnecting import FINAL_SUBSCRIBE_ERRORS, TOKEN_EXPIRED
from streamfleet_client.streams import StreamCursor, StreamMessage, StreamPosition
from streamfleet_dev.dsim.live.heartbeat import MISSED_PONGS_BEFORE_RECONNECT, HeartbeatWatch
from streamfleet_dev.dsim.live.schedule import ClientPlan
from streamfleet_dev.dsim.live.state_restore import StateRestore
from streamfleet_dev.dsim.live.world import SETTLE_S, World

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.aws import Connection

GAP_TIMEOUT_S = 2.0
QUIET_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0
WATCH_TICK_S = 0.5  # how often the client looks at its watches (the real one: min(gap/4, 0.5))

# --- Clients --------------------------------------------------------------------------------------


@dataclass
class AppLog:
    """What one client's application received of one stream: ``("start", epoch, seq)`` where
    a subscription without a position began (the server's choice: the newest few, or the
    origin), then messages, epoch changes and skips as the client told them."""

    events: list[tuple[Any, ...]] = field(default_factory=list)


class Client:
    """One user's client: :class:`ReconnectingClient`'s handling of cursors, without sockets."""

    def __init__(self, world: World, plan: ClientPlan):
        self.world = world
        self.plan = plan
        self.rng = random.Random(f"client-{world.schedule.seed}-{plan.user}")
        # getState's backoff draws from a stream of its own: the client's other draws (its
        # reconnect backoff) stay as they were before it sent getState.
        self.state_rng = random.Random(f"client-state-{world.schedule.seed}-{plan.user}")
        self.subscriptions: dict[str, StreamCursor] = {}
        self.positions: dict[str, StreamPosition] = {}
        self.pending_unsubscribes: set[str] = set()
        # Streams the application unsubscribed from: never followed from getState again.
        self.unsubscribed: set[str] = set()
        # Every getState reply this client took: (when, the connection's Region, its list).
        self.state_replies: list[tuple[float, str, tuple[str, ...]]] = []
        self.heartbeat: HeartbeatWatch | None = None
        self.restore: StateRestore | None = None
        self.apps: dict[str, AppLog] = defaultdict(AppLog)
        self.connection: Connection | None = None
        self.pending: dict[str, tuple[StreamCursor, float]] = {}  # subscribe request ids
        self.refused: dict[str, str] = {}  # stream -> the final error that ended it
        self._ids = itertools.count(1)
        self._closed = False
        # For the checker, not the client: the streams its application wants (subscribed and
        # not unsubscribed since), those the server acknowledged before a restart, and when.
        self.app_wants: set[str] = set()
        self.acknowledged: set[str] = set()
        self.known_before_restart: set[str] = set()
        self.restarted_at: float | None = None

    # Application's actions -------------------------------------------------------------------

    def subscribe(self, stream: str, *, after: StreamPosition | None = None) -> None:
        """As ``ReconnectingClient.subscribe``: from ``after`` if given (and ahead of what
        was delivered), else from the position delivered, else from the newest few."""
        self.pending_unsubscribes.discard(stream)
        self.unsubscribed.discard(stream)
        self.app_wants.add(stream)
        self.refused.pop(stream, None)
        if stream not in self.subscriptions:
            position = self.positions.get(stream)
            if after is not None and (position is None or after > position):
                position = after
                self.apps[stream].events.append(("start", after.epoch, after.seq))
            self.subscriptions[stream] = StreamCursor(
                stream,
                None if position is None else position.seq,
                0 if position is None else position.epoch,
            )
        if self.connection is not None:
            self._send_subscribe(self.subscriptions[stream], "request")

    def unsubscribe(self, stream: str) -> None:
        self.subscriptions.pop(stream, None)
        self.unsubscribed.add(stream)
        self.app_wants.discard(stream)
        self.pending_unsubscribes.add(stream)
        if self.connection is not None:
            self._send_unsubscribe(stream)

    # The connection's life -------------------------------------------------------------------

    def run(self) -> None:
        world = self.world
        attempt = 0
        while world.scheduler.now < world.schedule.duration + SETTLE_S:
            expires = world.now_ms // 1000 + int(self.plan.token_seconds)
            connection = world.region_for(self.plan.user).gateway.connect(self, expires)
            if connection is None:
                world.scheduler.sleep(full_jitter(attempt, 0.5, 10.0, self.rng))
                attempt += 1
                continue
            attempt = 0
            self.connection = connection
            now = world.scheduler.now
            self.heartbeat = HeartbeatWatch(now)
            # As the real client: getState first, then every subscription from its position
            # without waiting for the state (which may add streams this client lacks).
            self.restore = StateRestore(now, self.state_rng)
            self._tick_state(connection, now)
            for cursor in self.subscriptions.values():
                cursor.acknowledged = False
                self._send_subscribe(cursor, "reconnect")
            for stream in list(self.pending_unsubscribes):
                self._send_unsubscribe(stream)
            self._watch(connection)
            connection.client_left_at = world.scheduler.now
            self.connection = None
            for cursor in self.subscriptions.values():
                cursor.in_flight = False
            self.pending.clear()
            world.scheduler.sleep(full_jitter(0, 0.5, 10.0, self.rng))

    def _watch(self, connection: Connection) -> None:
        """The gap and quiet watch and the request timeouts, while the connection is open."""
        world = self.world
        # Until the client learns the connection ended (a close reaching it, or its own
        # decision), not when API Gateway sees it closed: a cut-off Region's close never comes.
        while not self._closed:
            world.scheduler.sleep(WATCH_TICK_S)
            if self._closed:
                break  # closed while it slept: nothing more is sent on it
            now = world.scheduler.now
            if self._tick_heartbeat(connection, now) or self._tick_state(connection, now):
                break
            for request_id, (cursor, sent) in list(self.pending.items()):
                if now - sent >= REQUEST_TIMEOUT_S:
                    del self.pending[request_id]
                    cursor.in_flight = False
                    cursor.acknowledged = True
                    cursor.gap_since = now
            for cursor in list(self.subscriptions.values()):
                reason = cursor.resubscribe_reason(now, GAP_TIMEOUT_S, QUIET_TIMEOUT_S)
                if reason is not None:
                    cursor.count_resubscribe(reason, now)
                    self._send_subscribe(cursor, reason)
        self._closed = False

    def _tick_heartbeat(self, connection: Connection, now: float) -> bool:
        """Send a heartbeat when one is due; whether the connection is given up (too many
        consecutive pongs missed: the socket looks open, nothing answers)."""
        assert self.heartbeat is not None
        action = self.heartbeat.tick(now)
        if action == "send":
            connection.gateway.send(
                connection, json.dumps({"action": model.WS_ROUTE_HEARTBEAT}, separators=(",", ":"))
            )
        elif action == "give up":
            self._leave(
                connection,
                f"closed by {self.plan.user}: {MISSED_PONGS_BEFORE_RECONNECT} heartbeats "
                "unanswered",
            )
            return True
        return False

    def _tick_state(self, connection: Connection, now: float) -> bool:
        """Send getState when it is due; whether the connection is given up (never answered)."""
        assert self.restore is not None
        action = self.restore.tick(now, f"{self.plan.user}-state-{next(self._ids)}")
        if action == "send":
            connection.gateway.send(
                connection,
                json.dumps(
                    {"action": model.WS_ROUTE_GET_STATE, "requestId": self.restore.request_id},
                    separators=(",", ":"),
                ),
            )
        elif action == "give up":
            self._leave(connection, f"closed by {self.plan.user}: getState never answered")
            return True
        return False

    def _leave(self, connection: Connection, why: str) -> None:
        """The client closes ``connection`` itself: it stops serving it at once, whatever the
        gateway makes of it (a cut-off Region's never hears of it)."""
        if connection.open and not connection.dropped:
            connection.gateway.drop(connection, why)
        else:
            self.world.note(f"{connection.id} {why}")
        if connection is self.connection:
            self._closed = True

    def restart(self) -> None:
        """The client's process restarts: its connection and everything it held in memory are
        gone; its application kept the positions delivered (a persisted mapping, as
        ``ReconnectingClient`` allows) and what it was told (refusals), so the new client's
        subscriptions come from the server's state (getState) alone."""
        if self.connection is not None:
            self._leave(self.connection, f"closed by {self.plan.user}: restarting")
        # Frames still arriving for the old connection reach nobody: the old process is gone.
        self.connection = None
        self.known_before_restart = self.acknowledged & self.app_wants
        self.restarted_at = self.world.scheduler.now
        self.subscriptions.clear()
        self.pending.clear()
        self.pending_unsubscribes.clear()
        self.unsubscribed.clear()

    def drop(self) -> None:
        """The client closes its connection (a network change, a page reload)."""
        if self.connection is not None:
            self._leave(self.connection, f"dropped by {self.plan.user}")

    def on_closed(self, connection: Connection) -> None:
        if connection is self.connection:
            self._closed = True

    def _send_subscribe(self, cursor: StreamCursor, reason: str) -> None:
        assert self.connection is not None
        cursor.in_flight = True
        cursor.request_id = f"{self.plan.user}-{next(self._ids)}"
        self.pending[cursor.request_id] = (cursor, self.world.scheduler.now)
        self.world.subscribing(cursor.stream, self.plan.group)
        self.world.note(
            f"{self.plan.user} subscribe {cursor.stream} after {cursor.epoch}/{cursor.position}"
            f" ({reason}) on {self.connection.id}"
        )
        self.connection.gateway.send(
            self.connection,
            json.dumps(
                {
                    "action": model.WS_ROUTE_SUBSCRIBE,
                    "stream": cursor.stream,
                    "after": cursor.position,
                    "afterEpoch": cursor.epoch,
                    "requestId": cursor.request_id,
                }
            ),
        )

    def _send_unsubscribe(self, stream: str) -> None:
        assert self.connection is not None
        request_id = f"{self.plan.user}-u{next(self._ids)}"
        self.connection.gateway.send(
            self.connection,
            json.dumps(
                {"action": model.WS_ROUTE_UNSUBSCRIBE, "stream": stream, "requestId": request_id}
            ),
        )

    # What arrives ----------------------------------------------------------------------------

    def on_frame(self, connection: Connection, data: bytes) -> None:
        if connection is not self.connection:
            return
        text = data.decode()
        now = self.world.scheduler.now
        if text == model.WS_PONG_FRAME:
            if self.heartbeat is not None:
                self.heartbeat.last_pong_at = now
            return
        message = json.loads(text)
        kind = message.get("type")
        request_id = message.get("requestId")
        if self.restore is not None and isinstance(request_id, str):
            if kind == model.WS_REPLY_STATE and self.restore.answered(request_id):
                self._on_state(connection, message)
            elif kind == model.WS_REPLY_ERROR:
                self.restore.failed(request_id, now)
        if kind in (model.WS_REPLY_MESSAGES, model.WS_REPLY_SUBSCRIBED):
            self._on_stream_frame(kind, message, now)
        if kind == model.WS_REPLY_UNSUBSCRIBED:
            self.pending_unsubscribes.discard(message.get("stream"))
        pending = self.pending.pop(request_id, None) if isinstance(request_id, str) else None
        if pending is not None:
            cursor, _ = pending
            cursor.in_flight = False
            if kind == model.WS_REPLY_ERROR:
                error = message.get("error")
                if error in FINAL_SUBSCRIBE_ERRORS:
                    if self.subscriptions.get(cursor.stream) is cursor:
                        del self.subscriptions[cursor.stream]
                    self.refused[cursor.stream] = str(error)
                    self.world.note(f"{self.plan.user} refused {cursor.stream}: {error}")
                else:
                    cursor.acknowledged = True
                    cursor.gap_since = now
        if kind == model.WS_REPLY_ERROR and message.get("error") == TOKEN_EXPIRED:
            self._leave(connection, f"closed by {self.plan.user}: token expired")

    def _on_state(self, connection: Connection, state: dict[str, Any]) -> None:
        """As ``ReconnectingClient`` with ``follow_server_subscriptions`` (its default): every
        stream the server lists for the user that this client lacks is subscribed, from the
        position delivered (kept across a restart, as an application persists it)."""
        listed = state.get("subscriptions")
        listed = [s for s in listed if isinstance(s, str)] if isinstance(listed, list) else []
        region = connection.gateway.region.name
        self.state_replies.append((self.world.scheduler.now, region, tuple(listed)))
        self.world.note(f"{self.plan.user} state on {connection.id}: {','.join(listed) or '-'}")
        for stream in listed:
            if stream in self.subscriptions or stream in self.unsubscribed:
                continue
            self.refused.pop(stream, None)
            position = self.positions.get(stream)
            cursor = StreamCursor(
                stream,
                None if position is None else position.seq,
                0 if position is None else position.epoch,
            )
            self.subscriptions[stream] = cursor
            self._send_subscribe(cursor, "server-state")

    def _on_stream_frame(self, kind: str, message: dict[str, Any], now: float) -> None:
        stream = message.get("stream")
        cursor = self.subscriptions.get(stream) if isinstance(stream, str) else None
        if cursor is None:
            return
        if kind == model.WS_REPLY_SUBSCRIBED:
            if message.get("requestId") != cursor.request_id:
                return
            first = cursor.position is None
            ready = cursor.on_subscribed(message, now)
            self.acknowledged.add(cursor.stream)
            if first and cursor.position is not None:
                epoch, after = int(message.get("afterEpoch") or 0), int(message["after"])
                self.apps[cursor.stream].events.append(("start", epoch, after))
        else:
            ready = cursor.on_entries(
                message.get("messages") or [],
                source=str(message.get("source") or ""),
                region=message.get("region"),
                now=now,
            )
        self._deliver(cursor, ready)

    def _deliver(self, cursor: StreamCursor, messages: list[StreamMessage]) -> None:
        app = self.apps[cursor.stream]
        change, skip = cursor.take_epoch_change(), cursor.take_skip()
        if (change or skip) is not None and cursor.position is not None:
            self.positions[cursor.stream] = StreamPosition(cursor.epoch, cursor.position)
        if change is not None:
            app.events.append(("epoch", change.epoch))
        if skip is not None:
            app.events.append(("skip", skip.epoch, skip.after, skip.to))
            self.world.note(
                f"{self.plan.user} told {cursor.stream} {skip.epoch}/{skip.after + 1}.."
                f"{skip.to} skipped"
            )
        for message in messages:
            self.positions[message.stream] = message.position
            app.events.append(("message", message.epoch, message.seq, message.data, message.json))


def run_client(world: World, client: Client) -> None:
    plan = client.plan
    scheduler = world.scheduler
    scheduler.spawn(client.run, name=f"client-{plan.user}")
    actions: list[tuple[float, str, str | None]] = [
        (at, "subscribe-whole" if whole else "subscribe", s) for s, at, whole in plan.streams
    ]
    actions += [(at, "drop", None) for at in plan.drops]
    actions += [
        (at, "restart", None) for user, at in world.schedule.client_restarts if user == plan.user
    ]
    if plan.unsubscribe is not None:
        stream, off, on = plan.unsubscribe
        actions += [(off, "unsubscribe", stream), (on, "subscribe", stream)]
    for at, action, stream in sorted(actions, key=lambda a: (a[0], a[1], a[2] or "")):
        scheduler.sleep(max(0.0, at - scheduler.now))
        world.note(f"{plan.user} {action} {stream or ''}")
        if action == "subscribe":
            assert stream is not None
            client.subscribe(stream)
        elif action == "subscribe-whole":
            assert stream is not None
            client.subscribe(stream, after=StreamPosition(0, 0))
        elif action == "unsubscribe":
            assert stream is not None
            client.unsubscribe(stream)
        elif action == "restart":
            client.restart()
        else:
            client.drop()
    # The application asks again for what was refused: a reader excluded for a while reads
    # again from where it stopped (one excluded for good is refused again).
    scheduler.sleep(max(0.0, world.schedule.duration + 1.0 - scheduler.now))
    for stream in sorted(client.refused):
        world.note(f"{plan.user} subscribe {stream} again")
        client.subscribe(stream)
