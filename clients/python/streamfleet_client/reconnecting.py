"""A WebSocket client that keeps itself connected to the API, across region failovers.

What it does, and why:

* **Liveness.** Any reply of ours (the TEXT frame ``pong``, a state, a stream's frames) proves
  the connection alive; an error frame does not (a throttled region answers every message with
  an ``Internal server error`` frame), nor do protocol-level pings (API Gateway answers them
  itself even when the backend Lambda is throttled). After ``heartbeat_interval`` (20 s)
  without one it sends ``{"action": "heartbeat"}``; when no ``pong`` comes within
  ``heartbeat_timeout`` (10 s) it closes the connection and reconnects, even though the socket
  looks open (``missed_pongs_before_reconnect``, 1, heartbeats in a row, each sent when the
  previous timed out). A silently dead connection is so noticed within 20 + 10 = 30 s, at a
  cost of at most 3 heartbeats (6 API Gateway messages with their pongs) per idle
  connection-minute, and none on a connection that hears from the server at least every 20 s.
* **Rotation before API Gateway's 2-hour limit.** At a random age between 90 % and 100 % of
  ``max_connection_age`` (110 min; ``None``: never) a successor connection is opened (make
  before break); once it is open it takes over without the status leaving ``OPEN`` and without
  ``ready`` turning false, and the old one keeps receiving for ``request_timeout`` (the replies
  to requests sent on it, and live frames, which the cursors dedupe). Subscriptions resume
  from their positions. A successor that fails is tried again after ``backoff_cap``.
* **Sending while not ready** is refused (:class:`NotConnected`) by default; with
  ``send_queue_size`` above 0, :meth:`~ReconnectingClient.send` and
  :meth:`~ReconnectingClient.request` wait in a queue of that many, sent in order once the next
  connection's state is restored (:class:`SendQueueFull` when full; a queued request's timeout
  runs while it waits, and one that times out is never sent; ``close()`` drops the queue).
* **Replies correlated by ``requestId``**, never by order: each message is handled by its own
  Lambda invocation, so replies arrive in any order. :meth:`ReconnectingClient.request` adds a
  fresh ``requestId`` and waits for the reply that echoes it.
* **No frame over 32 KB**: API Gateway closes a socket that receives a bigger frame (1009) and
  every reply in flight is lost, so :meth:`~ReconnectingClient.send` and
  :meth:`~ReconnectingClient.request` raise :class:`FrameTooLarge` before sending one.
* **Exponential backoff with full jitter**: the n-th consecutive retry waits
  ``random(0, min(cap, base * 2**n))`` (base 2 s, cap 20 s), so the thousands of clients dropped
  by a failover do not all hit the surviving region in the same second.
* **An endpoint provider called before every attempt**: it returns the URL (the failover DNS
  name, re-resolved) and a fresh token, so an expired token or a moved region is picked up by
  the next attempt. A provider that accepts a ``force_refresh`` keyword gets ``True`` when the
  previous attempt failed before the socket opened (refused handshake, timeout, connection
  error): its cached token may be the reason, so it should fetch a new one.
* **State restore**: ``getState`` is sent after every (re)connect; the reply goes to
  ``on_state``. A connection counts as healthy (and resets the backoff) once that reply came
  and it then stayed open ``min_healthy_seconds``; ``last_close_code`` and
  ``last_close_reason`` say how the last one ended.
* **Callbacks** for state replies, region changes (every reply names its region), connection
  status changes, and every message.
* **A refused handshake is retried like any failure, and reported**: one refused with HTTP 401
  or 403, like one that failed for any other reason before the socket opened, is retried with
  the same backoff and a token fetched anew (``force_refresh``), and each is reported to
  ``on_handshake_failed`` (the HTTP status, ``None`` without one); ``auth_failures`` and
  ``consecutive_failures`` count them. The client never gives up on its own by default, as
  the browser client: a browser cannot tell a refusal from an outage (it hides the status),
  and clients that gave up during a failover would never come back. The application decides
  (sign the user in again, or ``close()``); ``max_auth_retries`` (default ``None``: no limit)
  stops the client with :class:`AuthorizationFailed` after that many refusals in a row.
* **Clean cancellation**: ``async with ReconnectingClient(...)`` or ``await client.close()``
  stops every task and fails pending requests with :class:`ClientClosed`.
* **Subscribed streams, exactly once**: :meth:`ReconnectingClient.subscribe` asks for an
  ingested stream (``after``: the last seq the application has, or ``None`` for the newest
  few); ``on_stream_message`` gets each message exactly once, in seq order, with no gap
  (:mod:`.streams`), whatever the wire does (replay and live frames interleaved, duplicates
  after a worker crash or a failover). Every (re)connect subscribes again from the last seq
  delivered (``positions``, a mapping the application may persist), and, with
  ``follow_server_subscriptions``, to every stream the server's state lists for the user
  (``getState``'s ``subscriptions``), so a restarted client picks up where it was.

Token transport: by default the token travels as the subprotocol ``bearer.<jwt>`` next to the
application protocol ``streamfleet.v1`` (kept out of URLs and therefore out of access logs);
:attr:`TokenTransport.QUERY` appends ``?token=<jwt>`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamfleet import model
from streamfleet.backoff import full_jitter
from streamfleet.wsapi.handshake import Endpoint

from .streams import DEFAULT_MAX_BUFFERED, StreamCursor, StreamMessage, StreamPosition

logger = logging.getLogger(__name__)

AUTH_FAILURE_STATUSES = (401, 403)


# --- Configuration ------------------------------------------------------------------------------


# ``provider(attempt)`` or ``provider(attempt, force_refresh=...)``: ``attempt`` counts the
# consecutive failures so far: 0 for the very first connection, 1 after a connection dropped,
# +1 for every failed attempt since; ``force_refresh`` is True when the previous attempt failed
# before the socket opened.
EndpointProvider = Callable[..., Endpoint | Awaitable[Endpoint]]


def _accepts_force_refresh(provider: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(provider).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "force_refresh" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in parameters
    )


@dataclass(frozen=True)
class ClientConfig:
    """Timings and limits. A dead connection is noticed within ``heartbeat_interval +
    missed_pongs_before_reconnect * heartbeat_timeout`` (30 s); 2 s backoff base, 20 s cap."""

    # A heartbeat after this long without a proof of life (a pong, a reply other than an error).
    heartbeat_interval: float = 20.0
    heartbeat_timeout: float = 10.0  # for its pong
    missed_pongs_before_reconnect: int = 1
    # Rotated (make before break) at a random 90-100 % of this age: API Gateway closes a
    # connection after 2 hours. None: never.
    max_connection_age: float | None = 6600.0
    # send()/request() while not ready: 0 refuses them (NotConnected); N queues up to N.
    send_queue_size: int = 0
    backoff_base: float = 2.0
    backoff_cap: float = 20.0
    max_auth_retries: int | None = None  # None: a refusal never stops the client on its own
    open_timeout: float = 10.0
    close_timeout: float = 2.0
    request_timeout: float = 10.0
    # websockets' protocol-level keepalive. Off by default: the application heartbeat is the
    # liveness check (API Gateway answers protocol pings even when the backend is broken).
    ping_interval: float | None = None
    max_message_bytes: int = model.WS_MAX_MESSAGE_BYTES
    # Extra fields of the getState request sent after every connect, e.g. (("auction", "a1"),).
    get_state_fields: tuple[tuple[str, str], ...] = ()
    # Subscribed streams: how long a gap may stay open before the client asks the stored log
    # to fill it, the bound of each stream's reorder buffer, and whether to subscribe to what
    # the server's state lists for the user (getState's "subscriptions").
    gap_timeout: float = 2.0
    # A subscribed stream heard nothing of for this long asks where its log ends (None: never):
    # the only way to learn of a lost last post, at one subscribe per quiet stream, backing off.
    quiet_timeout: float | None = 60.0
    max_buffered_per_stream: int = DEFAULT_MAX_BUFFERED
    follow_server_subscriptions: bool = True
    # A connection resets the backoff only once its state was restored and it stayed open this
    # long: a server that answers getState and then closes is backed off from, not hammered.
    min_healthy_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "heartbeat_interval",
            "heartbeat_timeout",
            "backoff_cap",
            "open_timeout",
            "close_timeout",
            "request_timeout",
            "gap_timeout",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: must be a finite number of seconds above zero")
        quiet = self.quiet_timeout
        if quiet is not None and not (isinstance(quiet, (int, float)) and math.isfinite(quiet)):
            raise ValueError("quiet_timeout: must be a finite number of seconds, or None")
        if quiet is not None and quiet < self.gap_timeout:
            raise ValueError("quiet_timeout: must be at least gap_timeout, or None")
        # Above zero: a refused handshake is retried for as long as the client runs, and with
        # no base every retry (and every token fetch it forces) would follow at once.
        if not (math.isfinite(self.backoff_base) and self.backoff_base > 0):
            raise ValueError("backoff_base: must be a finite number of seconds above zero")
        if self.missed_pongs_before_reconnect < 1:
            raise ValueError("missed_pongs_before_reconnect: must be at least 1")
        age = self.max_connection_age
        if age is not None and not (
            isinstance(age, (int, float)) and math.isfinite(age) and age > 0
        ):
            raise ValueError(
                "max_connection_age: must be a finite number of seconds above 0, or None"
            )
        if not isinstance(self.send_queue_size, int) or self.send_queue_size < 0:
            raise ValueError("send_queue_size: must be a whole number, 0 or more")
        if self.max_auth_retries is not None and self.max_auth_retries < 0:
            raise ValueError("max_auth_retries: must be zero or more, or None")
        if self.max_buffered_per_stream < 1:
            raise ValueError("max_buffered_per_stream: must be at least 1")
        if not (math.isfinite(self.min_healthy_seconds) and self.min_healthy_seconds >= 0):
            raise ValueError(
                "min_healthy_seconds: must be a finite number of seconds, zero or more"
            )


# The most one message may hold before the connection is closed (1009): bigger than any the
# server sends (max_message_bytes), so that a message over that is read and skipped.
MAX_READ_BYTES = 1024 * 1024


# --- Errors and status --------------------------------------------------------------------------


class ClientError(Exception):
    """Base class of the client's errors."""


class NotConnected(ClientError):
    """No open connection right now (the client is connecting or backing off)."""


class SendQueueFull(NotConnected):
    """Not ready, and ``send_queue_size`` messages already wait: this one was not queued."""

    def __init__(self, size: int):
        super().__init__(f"not connected, and the send queue is full ({size})")
        self.size = size


class FrameTooLarge(ClientError, ValueError):
    """A message whose frame would exceed API Gateway's 32 KB frame limit; nothing was sent."""

    def __init__(self, size: int, limit: int = model.WS_MAX_FRAME_BYTES):
        super().__init__(
            f"message: {size} bytes as a frame, over the {limit}-byte WebSocket frame limit "
            "(API Gateway would close the connection with 1009); nothing was sent"
        )
        self.size = size
        self.limit = limit


class ConnectionLost(ClientError):
    """The connection ended while a request waited for its reply (it may have been applied)."""


class ClientClosed(ClientError):
    """The client was closed."""


class AuthorizationFailed(ClientError):
    """The handshake was refused with 401/403 more often than ``max_auth_retries`` allows."""

    def __init__(self, status: int, attempts: int):
        super().__init__(f"handshake refused with HTTP {status} ({attempts} times in a row)")
        self.status = status
        self.attempts = attempts


class SubscriptionRefused(ClientError):
    """The server refused a subscribe (``error``: ``forbidden``, ``not_supported``,
    ``bad_request``); the stream is no longer subscribed."""

    def __init__(self, stream: str, reply: Mapping[str, Any]):
        super().__init__(f"subscribe {stream}: {reply.get('error')}: {reply.get('message')}")
        self.stream = stream
        self.reply = dict(reply)
        self.error = str(reply.get("error"))


# Errors after which subscribing again cannot help (the others are retried).
FINAL_SUBSCRIBE_ERRORS = frozenset({"forbidden", "not_supported", "bad_request"})
# The connection's token expired: the server answers every request so; the client reconnects.
TOKEN_EXPIRED = "token_expired"
# getState attempts on one connection before it is dropped for another.
STATE_ATTEMPTS = 5


class ClientStatus(StrEnum):
    """Where the connection loop is."""

    IDLE = "idle"
    CONNECTING = "connecting"
    OPEN = "open"
    BACKING_OFF = "backing_off"
    CLOSED = "closed"
    FAILED = "failed"  # gave up (authorization); see ReconnectingClient.error


Callback = Callable[..., Any]


# --- The client ---------------------------------------------------------------------------------


class ReconnectingClient:
    """Keeps one WebSocket connection to the API alive; see the module docstring."""

    def __init__(
        self,
        provider: EndpointProvider,
        config: ClientConfig | None = None,
        *,
        on_state: Callback | None = None,
        on_region: Callback | None = None,
        on_status: Callback | None = None,
        on_message: Callback | None = None,
        on_stream_message: Callback | None = None,
        on_subscription_error: Callback | None = None,
        on_stream_epoch: Callback | None = None,
        on_stream_skip: Callback | None = None,
        on_handshake_failed: Callback | None = None,
        positions: MutableMapping[str, StreamPosition] | None = None,
        rng: random.Random | None = None,
        name: str = "client",
    ):
        self.provider = provider
        self.config = config or ClientConfig()
        self.on_state = on_state  # (state_reply: dict)
        self.on_region = on_region  # (new_region: str, old_region: str | None)
        self.on_status = on_status  # (status: ClientStatus)
        self.on_message = on_message  # (message: dict), every JSON message
        self.on_stream_message = on_stream_message  # (message: StreamMessage), exactly once
        self.on_subscription_error = on_subscription_error  # (error: SubscriptionRefused)
        # (change: EpochChange), before the first message of the stream's newer epoch
        self.on_stream_epoch = on_stream_epoch
        # (skip: Skip), before what follows seqs the log will never hold (expired, never sent)
        self.on_stream_skip = on_stream_skip
        # (http_status: int | None), each attempt that failed before the socket opened
        self.on_handshake_failed = on_handshake_failed
        # The last position delivered per stream: what every (re)connect resumes from. Pass a
        # persistent mapping to resume across restarts (a plain seq counts as epoch 0's).
        self.positions: MutableMapping[str, StreamPosition] = {} if positions is None else positions
        self.subscriptions: dict[str, StreamCursor] = {}
        self.name = name
        self._force_refresh_keyword = _accepts_force_refresh(provider)
        self._rng = rng or random.Random()
        self.status = ClientStatus.IDLE
        self.region: str | None = None
        self.error: BaseException | None = None
        self.state: dict[str, Any] | None = None  # the last getState reply
        # Counters for tests, the drill and dashboards.
        self.attempts = 0
        self.connections = 0
        self.forced_reconnects = 0
        self.auth_failures = 0
        self.pongs = 0
        self.forced_refreshes = 0  # provider calls with force_refresh=True
        self.frames_skipped = 0  # binary, or text over max_message_bytes
        self._token_expired = False  # the server said so: the next attempt asks for a new one
        self._state_failed = asyncio.Event()  # the current getState was answered with an error
        # Streams the application unsubscribed from: never followed from getState again; and
        # those the server has not acknowledged yet (told again on every connection).
        self._unsubscribed: set[str] = set()
        self._pending_unsubscribes: set[str] = set()
        self.last_delay: float | None = None
        self.delays: list[float] = []
        # Attempts since the last connection that stayed healthy (the backoff's exponent + 1).
        self.consecutive_failures = 0
        # How the last connection ended: its close code and reason (None: no closing frame).
        self.last_close_code: int | None = None
        self.last_close_reason: str | None = None
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()
        self._reconnect_now = asyncio.Event()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._last_pong_at = -math.inf
        # The last proof of life on the current connection (a pong, a reply other than an error).
        self._heard_at = -math.inf
        self._restored = asyncio.Event()  # this connection's getState was answered
        self._successor: ClientConnection | None = None  # opened by a rotation, not yet serving
        self._retiring: set[asyncio.Task[None]] = set()  # old connections, still receiving
        # Stream frames are handled one at a time and each to its end (see _on_stream_frame).
        self._stream_frames = asyncio.Lock()
        self._frames: set[asyncio.Task[None]] = set()
        # What send()/request() gave while not ready (send_queue_size > 0): (text, request id).
        self._queue: deque[tuple[str, str | None]] = deque()
        self.rotations = 0
        self._session_healthy = False
        self._state_request_id: str | None = None
        self._session_tasks: set[asyncio.Task[Any]] = set()

    # Lifecycle -------------------------------------------------------------------------------

    async def start(self) -> ReconnectingClient:
        """Start the connection loop in the background (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"{self.name}-connection-loop"
            )
        return self

    async def close(self) -> None:
        """Stop reconnecting, close the connection, fail pending requests. Never raises."""
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for task in [*self._retiring, *self._frames]:
            task.cancel()
        await asyncio.gather(*self._retiring, *self._frames, return_exceptions=True)
        successor, self._successor = self._successor, None
        if successor is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.close_timeout):
                    await successor.close()
        self._queue.clear()  # queued requests fail below with the pending ones
        self._fail_pending(ClientClosed("client closed"))
        if self.status is not ClientStatus.FAILED:
            await self._set_status(ClientStatus.CLOSED)
        self._stopped.set()

    async def __aenter__(self) -> ReconnectingClient:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until a connection is open and its ``getState`` reply has arrived.

        Raises :class:`AuthorizationFailed` if the client gave up, :class:`ClientClosed` if it
        was closed, ``TimeoutError`` after ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while not self._ready.is_set():
                self._raise_if_stopped()
                ready = asyncio.ensure_future(self._ready.wait())
                stopped = asyncio.ensure_future(self._stopped.wait())
                try:
                    await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ready.cancel()
                    stopped.cancel()
            self._raise_if_stopped()

    async def wait_stopped(self) -> None:
        """Until the loop has ended; re-raises :class:`AuthorizationFailed` if that is why."""
        await self._stopped.wait()
        if self.error is not None:
            raise self.error

    def _raise_if_stopped(self) -> None:
        if self.error is not None:
            raise self.error
        if self._stopped.is_set() or self._closing:
            raise ClientClosed("client closed")

    @property
    def ready(self) -> bool:
        """Open, and the state of this connection has been restored."""
        return self._ready.is_set()

    def reconnect(self) -> None:
        """Drop the current connection and connect again (e.g. to follow a fail-back; the
        rotation ahead of API Gateway's 2-hour limit needs no call)."""
        self._reconnect_now.set()

    def abort_connection(self) -> bool:
        """Cut the socket without a closing handshake, as a lost network would (drills and
        tests); the client notices and reconnects by its own rules. ``False`` if not open."""
        ws = self._ws
        transport = getattr(ws, "transport", None)
        if transport is None:
            return False
        transport.abort()
        return True

    # Subscribed streams -----------------------------------------------------------------------

    async def subscribe(
        self, stream: str, *, after: StreamPosition | int | None = None
    ) -> dict[str, Any] | None:
        """Receive ``stream``: its stored messages after ``after`` (default: the position in
        ``positions``, else the newest few; a plain seq counts in epoch 0), then live ones,
        through ``on_stream_message``.

        Connected: returns the ``subscribed`` reply, or raises :class:`SubscriptionRefused`
        (the stream is then not subscribed). Not connected: returns ``None``; the subscribe is
        sent with the next connection, as after every reconnect.
        """
        self._unsubscribed.discard(stream)  # the application asks for it again
        self._pending_unsubscribes.discard(stream)
        cursor = self.subscriptions.get(stream)
        wanted = _position(after)
        if cursor is None:
            cursor = self._cursor(stream, wanted or self.stored_position(stream))
            self.subscriptions[stream] = cursor
        elif wanted is not None and (
            cursor.position is None or wanted > StreamPosition(cursor.epoch, cursor.position)
        ):
            cursor.move_to(wanted)
        if self._ws is None:
            return None
        return await self._send_subscribe(cursor, "request", raise_refusal=True)

    async def unsubscribe(self, stream: str) -> None:
        """Stop receiving ``stream``: here at once, and on the server as soon as it can be told.

        Remembered until the server acknowledges it (sent again on every connection until
        then), and a stream unsubscribed from is never followed from ``getState`` again."""
        self.subscriptions.pop(stream, None)
        self._unsubscribed.add(stream)
        self._pending_unsubscribes.add(stream)
        if self._ws is not None:
            await self._send_unsubscribe(stream)

    async def _send_unsubscribe(self, stream: str) -> None:
        with contextlib.suppress(NotConnected, ConnectionLost, TimeoutError):
            reply = await self._request(
                {"action": model.WS_ROUTE_UNSUBSCRIBE, "stream": stream}, queue=False
            )
            if reply.get("type") == model.WS_REPLY_UNSUBSCRIBED:
                self._pending_unsubscribes.discard(stream)

    def position(self, stream: str) -> StreamPosition | None:
        """The position of the last message of ``stream`` delivered to the application."""
        cursor = self.subscriptions.get(stream)
        if cursor is not None and cursor.position is not None:
            return StreamPosition(cursor.epoch, cursor.position)
        return self.stored_position(stream)

    def stored_position(self, stream: str) -> StreamPosition | None:
        """``positions[stream]``, a plain seq (as kept before epochs) read as epoch 0's."""
        return _position(self.positions.get(stream))

    def _cursor(self, stream: str, position: StreamPosition | None) -> StreamCursor:
        return StreamCursor(
            stream,
            None if position is None else position.seq,
            0 if position is None else position.epoch,
            max_buffered=self.config.max_buffered_per_stream,
        )

    async def _send_subscribe(
        self, cursor: StreamCursor, reason: str, *, raise_refusal: bool = False
    ) -> dict[str, Any] | None:
        cursor.in_flight = True
        cursor.request_id = self._next_request_id()
        try:
            reply = await self._request(
                {
                    "action": model.WS_ROUTE_SUBSCRIBE,
                    "stream": cursor.stream,
                    "after": cursor.position,
                    "afterEpoch": cursor.epoch,
                },
                request_id=cursor.request_id,
                queue=False,
            )
        except (NotConnected, ConnectionLost, TimeoutError) as exc:
            # The next connection subscribes again; on this one, retry after a gap timeout.
            logger.info("%s: subscribe %s (%s): %s", self.name, cursor.stream, reason, exc)
            cursor.acknowledged = True
            cursor.gap_since = asyncio.get_running_loop().time()
            return None
        finally:
            cursor.in_flight = False
        if reply.get("type") == model.WS_REPLY_ERROR:
            error = reply.get("error")
            if isinstance(error, str) and error in FINAL_SUBSCRIBE_ERRORS:
                if self.subscriptions.get(cursor.stream) is cursor:
                    del self.subscriptions[cursor.stream]
                refusal = SubscriptionRefused(cursor.stream, reply)
                await self._emit(self.on_subscription_error, refusal)
                if raise_refusal:
                    raise refusal
                return reply
            cursor.acknowledged = True  # unavailable: the gap clock retries it
            cursor.gap_since = asyncio.get_running_loop().time()
        return reply

    def _spawn(self, coroutine: Awaitable[Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"{self.name}-{name}")  # type: ignore[arg-type]
        self._session_tasks.add(task)
        task.add_done_callback(self._session_tasks.discard)

    async def _deliver(self, cursor: StreamCursor, messages: list[StreamMessage]) -> None:
        change, skip = cursor.take_epoch_change(), cursor.take_skip()
        if (change or skip) is not None and cursor.position is not None:
            # Kept at once: a later cursor (a resubscribe, a restart) must not be told again.
            self.positions[cursor.stream] = StreamPosition(cursor.epoch, cursor.position)
        if change is not None:
            await self._emit(self.on_stream_epoch, change)
        if skip is not None:
            await self._emit(self.on_stream_skip, skip)
        for message in messages:
            self.positions[message.stream] = message.position
            await self._emit(self.on_stream_message, message)

    async def _watch_gaps(self) -> None:
        """Ask the stored log for what a subscription misses (see :mod:`.streams`)."""
        loop = asyncio.get_running_loop()
        interval = min(self.config.gap_timeout / 4, 0.5)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for cursor in list(self.subscriptions.values()):
                reason = cursor.resubscribe_reason(
                    now, self.config.gap_timeout, self.config.quiet_timeout
                )
                if reason is not None:
                    cursor.count_resubscribe(reason, now)
                    cursor.in_flight = True  # before the task runs: one at a time
                    self._spawn(self._send_subscribe(cursor, reason), f"subscribe-{reason}")

    # Sending ---------------------------------------------------------------------------------

    async def send(self, message: Mapping[str, Any]) -> None:
        """Send one message; :class:`FrameTooLarge` (nothing sent) over 32 KB. While not ready:
        :class:`NotConnected`, or with ``send_queue_size`` queued (:class:`SendQueueFull` when
        full), sent in order once the next connection's state is restored."""
        text = _frame(dict(message))
        if self._queueing():
            self._enqueue(text, None)
            return
        ws = self._ws
        if ws is None:
            raise NotConnected("not connected")
        try:
            await ws.send(text)
        except ConnectionClosed:
            raise NotConnected("the connection just closed") from None

    async def request(
        self,
        message: Mapping[str, Any],
        *,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Send ``message`` with a fresh ``requestId`` and wait for the reply that echoes it.

        Replies are matched by ``requestId`` only, so concurrent requests may complete in any
        order. :class:`FrameTooLarge` (nothing sent) if the message is over 32 KB,
        :class:`NotConnected` if there is no connection (or, with ``send_queue_size``, queued
        as :meth:`send` does; the timeout runs while it waits, and a request that times out or
        is cancelled while queued is never sent), :class:`ConnectionLost` if it ends before the
        reply (the request may or may not have been applied), ``TimeoutError`` if no reply
        comes within ``timeout`` (default ``request_timeout``).
        """
        return await self._request(message, timeout=timeout, request_id=request_id, queue=True)

    async def _request(
        self,
        message: Mapping[str, Any],
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        queue: bool,
    ) -> dict[str, Any]:
        request_id = request_id or self._next_request_id()
        text = _frame({**message, "requestId": request_id})
        queued = queue and self._queueing()
        ws = self._ws
        if queued:
            self._enqueue(text, request_id)
        elif ws is None:
            raise NotConnected("not connected")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            if ws is not None and not queued:
                try:
                    await ws.send(text)
                except ConnectionClosed:
                    raise NotConnected("the connection just closed") from None
            async with asyncio.timeout(timeout or self.config.request_timeout):
                return await future
        finally:
            self._pending.pop(request_id, None)
            if queued:
                self._unqueue(request_id)

    def _queueing(self) -> bool:
        """Whether what the application sends now waits: a queue is configured, and this
        connection's state is not restored, or older messages still wait (order is kept)."""
        if self._closing:
            return False  # refused as without a queue: nothing would ever send it
        return self.config.send_queue_size > 0 and (not self._ready.is_set() or bool(self._queue))

    def _enqueue(self, text: str, request_id: str | None) -> None:
        if len(self._queue) >= self.config.send_queue_size:
            raise SendQueueFull(self.config.send_queue_size)
        self._queue.append((text, request_id))

    def _unqueue(self, request_id: str) -> None:
        for item in self._queue:
            if item[1] == request_id:
                self._queue.remove(item)
                return

    async def _flush(self, ws: ClientConnection) -> None:
        """The queue, in order, on a connection whose state was just restored."""
        while self._queue and self._ws is ws:
            await ws.send(self._queue[0][0])
            self._queue.popleft()

    def _next_request_id(self) -> str:
        return f"{self.name}-{next(self._ids)}"

    def _fail_pending(self, error: Exception) -> None:
        """Fails the requests sent; queued ones wait for the next connection."""
        queued = {request_id for _, request_id in self._queue}
        for request_id, future in list(self._pending.items()):
            if request_id not in queued:
                if not future.done():
                    future.set_exception(error)
                del self._pending[request_id]

    # Connection loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0  # consecutive attempts that did not give a healthy connection
        auth_refusals = 0
        first = True
        force_refresh = False  # the previous attempt failed before the socket opened
        try:
            while not self._closing:
                self.consecutive_failures = failures
                # A rotation's successor serves next, at once: no backoff, no status change.
                successor, self._successor = self._successor, None
                if successor is not None:
                    ws = successor
                elif not first:
                    delay = full_jitter(
                        max(failures - 1, 0),
                        self.config.backoff_base,
                        self.config.backoff_cap,
                        self._rng,
                    )
                    self.last_delay = delay
                    self.delays.append(delay)
                    await self._set_status(ClientStatus.BACKING_OFF)
                    await asyncio.sleep(delay)
                first = False
                if successor is None:
                    await self._set_status(ClientStatus.CONNECTING)
                    self.attempts += 1
                    try:
                        ws = await self._open(failures, force_refresh)
                    except InvalidStatus as exc:
                        force_refresh = True
                        status = exc.response.status_code
                        failures += 1
                        logger.info("%s: handshake refused with HTTP %s", self.name, status)
                        await self._emit(self.on_handshake_failed, status)
                        if status in AUTH_FAILURE_STATUSES:
                            self.auth_failures += 1
                            auth_refusals += 1
                            limit = self.config.max_auth_retries
                            if limit is not None and auth_refusals > limit:
                                self.error = AuthorizationFailed(status, auth_refusals)
                                logger.warning("%s: %s; giving up", self.name, self.error)
                                await self._set_status(ClientStatus.FAILED)
                                return
                        continue
                    except Exception as exc:  # refused, timed out, DNS, provider failure: retry
                        force_refresh = True
                        failures += 1
                        logger.info(
                            "%s: connect failed: %s: %s", self.name, type(exc).__name__, exc
                        )
                        await self._emit(self.on_handshake_failed, None)
                        continue
                auth_refusals = 0
                force_refresh = False
                # One more failure unless the session proves healthy (its getState answered)
                # and stays so for min_healthy_seconds, so a server that accepts and drops at
                # once, or answers and then drops, still backs off exponentially.
                opened_at = asyncio.get_running_loop().time()
                healthy = await self._session(ws, rotated=successor is not None)
                lasted = asyncio.get_running_loop().time() - opened_at
                if healthy and lasted >= self.config.min_healthy_seconds:
                    failures = 0
                else:
                    failures += 1
                # The first retry after a healthy connection waits random(0, base).
                failures = max(failures, 1)
                # A token the server said has expired is not offered again.
                force_refresh, self._token_expired = self._token_expired, False
        finally:
            self._stopped.set()

    async def _open(self, attempt: int, force_refresh: bool) -> ClientConnection:
        if force_refresh:
            self.forced_refreshes += 1
        if self._force_refresh_keyword:
            endpoint = self.provider(attempt, force_refresh=force_refresh)
        else:
            endpoint = self.provider(attempt)
        if inspect.isawaitable(endpoint):
            endpoint = await endpoint
        url, subprotocols = endpoint.handshake()
        return await connect(
            url,
            subprotocols=subprotocols,
            open_timeout=self.config.open_timeout,
            close_timeout=self.config.close_timeout,
            ping_interval=self.config.ping_interval,
            # Read up to MAX_READ_BYTES, so that a bigger message is skipped (below) rather
            # than the connection closed with 1009 and dialled again: the same in both clients.
            max_size=MAX_READ_BYTES,
            compression=None,
            proxy=None,
        )

    async def _session(self, ws: ClientConnection, *, rotated: bool = False) -> bool:
        """Serve one connection until it ends; whether it was healthy (state restored).

        ``rotated``: it took over from a connection that was ready, which stays so (the state
        it restored is the latest there is until this one's getState is answered)."""
        self._ws = ws
        self._session_healthy = False
        if not rotated:
            self._ready.clear()
        self._restored.clear()
        self._heard_at = asyncio.get_running_loop().time()
        self._reconnect_now.clear()
        self.connections += 1
        await self._set_status(ClientStatus.OPEN)
        tasks: list[asyncio.Task[Any]] = []
        try:
            loop = asyncio.get_running_loop()
            self._spawn(self._restore_state(ws), "restore-state")
            tasks = [
                loop.create_task(self._receive(ws), name=f"{self.name}-receive"),
                loop.create_task(self._heartbeat(ws), name=f"{self.name}-heartbeat"),
                loop.create_task(self._reconnect_now.wait(), name=f"{self.name}-reconnect"),
                loop.create_task(self._watch_gaps(), name=f"{self.name}-gaps"),
            ]
            if self.config.max_connection_age is not None:
                tasks.append(loop.create_task(self._rotate(), name=f"{self.name}-rotate"))
            # Resume every subscription from the last seq delivered, without waiting for the
            # state reply (which may add the ones this client does not know about yet).
            for cursor in self.subscriptions.values():
                cursor.acknowledged = False
                cursor.in_flight = True
                self._spawn(self._send_subscribe(cursor, "reconnect"), "subscribe-reconnect")
            for stream in list(self._pending_unsubscribes):
                self._spawn(self._send_unsubscribe(stream), "unsubscribe-pending")
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    logger.info("%s: connection ended: %s: %s", self.name, type(exc).__name__, exc)
        except ConnectionClosed:
            pass
        finally:
            # The first task to finish decides; the others must not outlive the connection.
            session_tasks = [*tasks, *self._session_tasks]
            for task in session_tasks:
                task.cancel()
            await asyncio.gather(*session_tasks, return_exceptions=True)
            for cursor in self.subscriptions.values():
                cursor.in_flight = False
            self._ws = None
            if self._successor is not None and not self._closing:
                self._retire(ws)  # rotated: the successor serves next, at once
            else:
                self._ready.clear()
                self._fail_pending(ConnectionLost("connection ended before the reply"))
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.config.close_timeout):
                        await ws.close()
                self.last_close_code, self.last_close_reason = ws.close_code, ws.close_reason
        return self._session_healthy

    async def _rotate(self) -> None:
        """Ahead of API Gateway's 2-hour limit: open a successor, then return, which ends this
        session; the connection loop serves the successor next.

        Make before break: breaking first would take the status through ``BACKING_OFF`` and
        ``CONNECTING``, refuse (or queue) the application's sends meanwhile, and lose the live
        frames of the gap until the resubscribes' replays brought them back."""
        age = self.config.max_connection_age
        assert age is not None
        # Jittered down to 90 %: clients that connected together (after a failover) spread out.
        await asyncio.sleep(age * (1 - self._rng.random() / 10))
        while True:
            try:
                self._successor = await self._open(0, False)
            except Exception as exc:  # refused, timed out: keep this one, try again later
                logger.info(
                    "%s: rotation: successor failed: %s: %s", self.name, type(exc).__name__, exc
                )
                await asyncio.sleep(self.config.backoff_cap)
                continue
            self.rotations += 1
            logger.info("%s: rotating to a new connection", self.name)
            return

    def _retire(self, ws: ClientConnection) -> None:
        """Keep receiving on a rotated-out connection for ``request_timeout`` (the replies to
        requests sent on it; its live frames, which the cursors dedupe), then close it."""

        async def retire() -> None:
            try:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.config.request_timeout):
                        await self._receive(ws)
            finally:  # close() cancels it: the socket is closed all the same
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.config.close_timeout):
                        await ws.close()

        task = asyncio.get_running_loop().create_task(retire(), name=f"{self.name}-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _restore_state(self, ws: ClientConnection) -> None:
        """``getState`` until it is answered: an error reply (``unavailable``, a reply too
        large) or none within the request timeout sends it again, with backoff; a connection
        that never answers it within ``STATE_ATTEMPTS`` is dropped (the next one may)."""
        for attempt in range(STATE_ATTEMPTS):
            self._state_request_id = f"{self.name}-state-{next(self._ids)}"
            self._state_failed.clear()
            await ws.send(
                json.dumps(
                    {
                        "action": model.WS_ROUTE_GET_STATE,
                        **dict(self.config.get_state_fields),
                        "requestId": self._state_request_id,
                    },
                    separators=(",", ":"),
                )
            )
            answered = asyncio.ensure_future(self._restored.wait())
            failed = asyncio.ensure_future(self._state_failed.wait())
            try:
                await asyncio.wait(
                    {answered, failed},
                    timeout=self.config.request_timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                answered.cancel()
                failed.cancel()
            if self._restored.is_set():
                return
            logger.info("%s: getState not answered (attempt %d)", self.name, attempt + 1)
            await asyncio.sleep(
                full_jitter(attempt, self.config.backoff_base, self.config.backoff_cap, self._rng)
            )
        logger.info("%s: getState never answered; reconnecting", self.name)
        await ws.close()

    async def _receive(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        async for raw in ws:
            current = ws is self._ws  # not a connection a rotation retired
            if raw == model.WS_PONG_FRAME:  # the heartbeat's reply, a bare text frame
                self.pongs += 1
                if current:
                    self._last_pong_at = self._heard_at = loop.time()
                continue
            if isinstance(raw, bytes) or _oversized(raw, self.config.max_message_bytes):
                # The server sends text of at most max_message_bytes: anything else is skipped
                # and counted, never a reason to reconnect (the browser client does the same).
                self.frames_skipped += 1
                continue
            try:
                message = json.loads(raw)
            except (ValueError, TypeError, RecursionError):
                logger.info("%s: ignoring a non-JSON message", self.name)
                continue
            if not isinstance(message, dict):
                continue
            kind = message.get("type")
            if current and isinstance(kind, str) and kind != model.WS_REPLY_ERROR:
                self._heard_at = loop.time()  # a reply of ours: proof of life
            region = message.get("region")
            # A retired connection still answers its requests, but it no longer says where the
            # client is nor what its state is.
            if current and isinstance(region, str) and region != self.region:
                old, self.region = self.region, region
                await self._emit(self.on_region, region, old)
            if kind in (model.WS_REPLY_MESSAGES, model.WS_REPLY_SUBSCRIBED):
                # Before the reply's future resolves: a caller awaiting subscribe() finds the
                # cursor already positioned.
                await self._on_stream_frame(kind, message, loop.time())
            request_id = message.get("requestId")
            future = self._pending.get(request_id) if isinstance(request_id, str) else None
            if future is not None and not future.done():
                future.set_result(message)
            if current and kind == model.WS_REPLY_STATE:
                self.state = message
                if request_id == self._state_request_id:
                    self._session_healthy = True
                    self._ready.set()
                    self._restored.set()
                    self._follow_server_subscriptions(message)
                    await self._flush(ws)
                await self._emit(self.on_state, message)
            await self._emit(self.on_message, message)
            if kind == model.WS_REPLY_ERROR and request_id == self._state_request_id:
                self._state_failed.set()  # sent again by _restore_state
            if current and kind == model.WS_REPLY_ERROR and message.get("error") == TOKEN_EXPIRED:
                # The server serves nothing more on this connection: a new one, with a token
                # asked for anew, resubscribes every stream from its position.
                logger.info("%s: the token expired; reconnecting", self.name)
                self._token_expired = True
                await ws.close()
                return

    async def _on_stream_frame(self, kind: str, message: dict[str, Any], now: float) -> None:
        """One frame at a time, and each to its end. Across a rotation two connections deliver
        for a while: without the lock the new one could emit seq 6 while the old one's callback
        still awaits seq 5; and a cursor counts a frame's messages as delivered before they are
        emitted, so a receive cancelled mid-frame (the old session's, when the rotation ends it)
        would lose the rest. The frame's task is shielded: cancelling the receive leaves it to
        finish, and the next frame waits for it."""
        frame = asyncio.ensure_future(self._stream_frame(kind, message, now))
        self._frames.add(frame)
        frame.add_done_callback(self._frames.discard)
        await asyncio.shield(frame)

    async def _stream_frame(self, kind: str, message: dict[str, Any], now: float) -> None:
        async with self._stream_frames:
            await self._handle_stream_frame(kind, message, now)

    async def _handle_stream_frame(self, kind: str, message: dict[str, Any], now: float) -> None:
        stream = message.get("stream")
        cursor = self.subscriptions.get(stream) if isinstance(stream, str) else None
        if cursor is None:
            return  # unsubscribed, never asked for, or no stream at all: ignored
        if kind == model.WS_REPLY_SUBSCRIBED:
            if message.get("requestId") != cursor.request_id:
                return  # not the answer to this cursor's own subscribe: it moves nothing
            ready = cursor.on_subscribed(message, now)
        else:
            entries = message.get("messages")
            ready = cursor.on_entries(
                entries if isinstance(entries, list) else [],
                source=str(message.get("source") or ""),
                region=message.get("region") if isinstance(message.get("region"), str) else None,
                now=now,
            )
        await self._deliver(cursor, ready)

    def _follow_server_subscriptions(self, state: dict[str, Any]) -> None:
        """Subscribe to the streams the server lists for the user and this client lacks."""
        listed = state.get("subscriptions")
        if not self.config.follow_server_subscriptions or not isinstance(listed, list):
            return
        for stream in listed:
            if (
                isinstance(stream, str)
                and stream not in self.subscriptions
                and stream not in self._unsubscribed
            ):
                cursor = self._cursor(stream, self.stored_position(stream))
                self.subscriptions[stream] = cursor
                cursor.in_flight = True
                self._spawn(self._send_subscribe(cursor, "server-state"), "subscribe-state")

    async def _heartbeat(self, ws: ClientConnection) -> None:
        """A heartbeat after ``heartbeat_interval`` without a proof of life, answered only by
        ``pong``; return (ending the session) when too many in a row go unanswered, each sent
        as soon as the previous timed out: within ``interval + missed * timeout`` of the last
        sign of life."""
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_interval
        timeout = self.config.heartbeat_timeout
        ping_at: float | None = None  # when the unanswered heartbeat was sent
        missed = 0
        heartbeat = json.dumps({"action": model.WS_ROUTE_HEARTBEAT}, separators=(",", ":"))
        while True:
            now = loop.time()
            if ping_at is not None and self._last_pong_at >= ping_at:
                ping_at, missed = None, 0
            if ping_at is not None and now >= ping_at + timeout:
                ping_at = None
                missed += 1
                if missed >= self.config.missed_pongs_before_reconnect:
                    self.forced_reconnects += 1
                    logger.info(
                        "%s: %d heartbeats unanswered; reconnecting although the socket is open",
                        self.name,
                        missed,
                    )
                    return
            if ping_at is None and (missed or now >= self._heard_at + interval):
                await ws.send(heartbeat)
                ping_at = now
            wake = self._heard_at + interval if ping_at is None else ping_at + timeout
            await asyncio.sleep(max(0.0, wake - loop.time()))

    # Callbacks -------------------------------------------------------------------------------

    async def _set_status(self, status: ClientStatus) -> None:
        if status is not self.status:
            self.status = status
            await self._emit(self.on_status, status)

    async def _emit(self, callback: Callback | None, *args: Any) -> None:
        # A failing callback is the application's bug; it must not take the connection down.
        if callback is None:
            return
        try:
            result = callback(*args)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("%s: callback %r failed", self.name, callback)


def _frame(message: dict[str, Any]) -> str:
    """The message as the text of one frame; :class:`FrameTooLarge` over API Gateway's limit."""
    text = json.dumps(message, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > model.WS_MAX_FRAME_BYTES:
        raise FrameTooLarge(size)
    return text


def _position(value: object) -> StreamPosition | None:
    """A position as given or kept: a StreamPosition (or an ``(epoch, seq)`` pair), or a plain
    seq of epoch 0; ``None`` for nothing, or for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return StreamPosition(0, value) if value >= 0 else None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        epoch, seq = value
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (epoch, seq)):
            return StreamPosition(epoch, seq)
    return None


def _oversized(text: str, limit: int) -> bool:
    """Whether ``text`` takes more than ``limit`` bytes in UTF-8 (encoded only when it may)."""
    # A code point takes at most 4 bytes: only text that may be too big is encoded.
    return len(text) * 4 > limit and len(text.encode("utf-8")) > limit
