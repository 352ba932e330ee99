"""A fake upstream: live sequenced WebSocket streams on loopback, for tests, benchmarks, local mode.

Each stream behaves like a real live source: its sequence advances at ``rate`` messages per second
from the moment the stream exists, whether or not anyone listens, and a client that reconnects
with ``?last_seq=<n>`` is replayed everything after ``n`` that is still retained. Nothing ticks
in the background: seq ``n`` of a stream is *defined* as produced at ``created_at + n / rate``, so
the head, the replay buffer and every frame's content are computed from the clock on demand and
thousands of idle streams cost a few objects each.

The server also records what tests need to check a client fleet from the outside: how many
clients each stream had at once (``max_concurrent``), every overlap (a second client while one is
connected), gaps (a resume older than the replay buffer) and drops. ``GET /stats`` serves the same
snapshot as JSON, so another process can read it.

Wire format: JSON text frames ``{"seq": <int>, "data": "<stream_id>:<seq>"}`` on
``ws://127.0.0.1:<port>/streams/<stream_id>[?last_seq=<n>][&epoch=<v>]``.

**Hostile modes** (``?hostile=<mode>[.<mode>...]`` on the stream URL, so every dial of every
owner sees the same): ``poison`` sends every 7th seq as a frame no JSON reader should survive
(deep nesting, ``NaN``, a lone surrogate, not JSON, a 5,000-digit seq), ``gap`` never sends seqs
ending in 3, ``oversize`` sends seq 50 of every hundred with 70,000 bytes of data (over a
worker's default limit: it can never get past it), ``pingflood`` floods pings and stops reading
(each ping queues a pong at the client), ``close`` accepts the handshake and closes at once, and
``redirect`` answers every handshake with a redirect to another origin (a worker that dials the
checked address cannot follow it: a URL that never works).
:func:`stores` says which seqs a correct worker stores.

**Epochs** (the worker sends its lease's fencing token as ``epoch``): a dial with an epoch higher
than any seen on the stream closes every client dialled with a lower one (close code 4409); a
dial with a lower epoch is refused (HTTP 409). So a worker frozen with its socket open stops
receiving the moment its successor dials, however long it stays frozen. ``overlaps`` counts the
violations that remain possible: a second client with the *current* epoch (or, without epochs,
any second client) while one is connected.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http
import json
import math
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, quote, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response
from websockets.protocol import State

from streamfleet.worker.protocol import (
    EPOCH_PARAMETER,
    STALE_EPOCH_STATUS,
    SUPERSEDED_CLOSE_CODE,
)

HOST = "127.0.0.1"
DEFAULT_RATE = 5.0
DEFAULT_REPLAY_CAPACITY = 100_000
MAX_INCOMING_BYTES = 4096
"""Clients have nothing to say to an upstream; anything bigger than this is a bug, not data."""
MAX_OVERLAP_EVENTS = 1000
"""Overlap events kept for inspection; the per-stream counters stay exact beyond this."""
SEND_BATCH = 1000
"""Frames sent between head re-reads, so a long replay notices when it falls out of the buffer."""
MIN_SLEEP_SECONDS = 0.001
MAX_SLEEP_SECONDS = 1.0
DROP_WAIT_SECONDS = 5.0

_STREAM_PATH = re.compile(r"/streams/(?P<stream_id>[^/]+)")
_HEAD_PATH = re.compile(r"/streams/(?P<stream_id>[^/]+)/head")
_LAST_SEQ = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also accepts "²"


HOSTILE_PARAMETER = "hostile"
HOSTILE_MODES = frozenset({"poison", "gap", "oversize", "pingflood", "close", "redirect"})
REDIRECT_TARGET = "ws://elsewhere.invalid/streams/"
OVERSIZE_BYTES = 70_000
_POISON = (
    '{"seq": %d, "data": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"seq": %d, "data": NaN}',
    '{"seq": %d, "data": "\\ud800"}',
    "seq %d is not JSON",
    '{"seq": ' + "9" * 5000 + ', "data": %d}',
)
_PING = b"\x89\x7d" + b"p" * 125  # an unmasked server ping with the largest payload


def stream_url(base: str, stream_id: str, hostile: Iterable[str] = ()) -> str:
    """The URL of a stream on the upstream at ``base``, in the hostile modes named."""
    url = f"{base}/streams/{quote(stream_id, safe='')}"
    modes = ".".join(sorted(hostile))
    return f"{url}?{HOSTILE_PARAMETER}={modes}" if modes else url


def hostile_modes(query: str) -> frozenset[str]:
    """The hostile modes a stream URL's query asks for; ``BadLastSeq`` for an unknown one."""
    values = parse_qs(query, keep_blank_values=True).get(HOSTILE_PARAMETER, [])
    modes = frozenset(mode for value in values for mode in value.split(".") if mode)
    if unknown := modes - HOSTILE_MODES:
        raise BadLastSeq(f"hostile: unknown modes {sorted(unknown)}")
    return modes


def stores(modes: Iterable[str], seq: int) -> bool:
    """Whether a correct worker stores ``seq`` of a stream in these modes: every frame it can
    read, none of the poison, nothing of what was never sent."""
    modes = frozenset(modes)
    return not ("poison" in modes and seq % 7 == 0) and not ("gap" in modes and seq % 10 == 3)


def frame_for(stream_id: str, seq: int, modes: frozenset[str], restarts: int = 0) -> str | None:
    """The frame that carries ``seq`` in these modes (``None``: not sent at all)."""
    if "gap" in modes and seq % 10 == 3:
        return None
    if "poison" in modes and seq % 7 == 0:
        return _POISON[(seq // 7) % len(_POISON)] % seq
    if "oversize" in modes and seq % 100 == 50:
        return json.dumps({"seq": seq, "data": "o" * OVERSIZE_BYTES})
    return encode_frame(stream_id, seq, restarts)


def message_data(stream_id: str, seq: int, restarts: int = 0) -> str:
    """The ``data`` of message ``seq`` on ``stream_id`` after it restarted ``restarts`` times:
    deterministic, so tests can check it."""
    return f"{stream_id}:{seq}" if not restarts else f"{stream_id}@{restarts}:{seq}"


def encode_frame(stream_id: str, seq: int, restarts: int = 0) -> str:
    """The JSON text frame carrying message ``seq`` of ``stream_id``."""
    return json.dumps(
        {"seq": seq, "data": message_data(stream_id, seq, restarts)}, separators=(",", ":")
    )


class BadLastSeq(ValueError):
    """A ``last_seq`` (or ``epoch``) query parameter that is not one non-negative integer."""


def _parse_number(query: str, name: str) -> int | None:
    values = parse_qs(query, keep_blank_values=True).get(name)
    if values is None:
        return None
    if len(values) != 1 or not _LAST_SEQ.fullmatch(values[0]):
        shown = ",".join(values)[:40]  # a close reason is at most 123 bytes
        raise BadLastSeq(f"{name} must be one non-negative integer, got {shown!r}")
    return int(values[0])


def parse_last_seq(query: str) -> int | None:
    """``last_seq`` from a URL query string; ``None`` when absent (the client starts live)."""
    return _parse_number(query, "last_seq")


def parse_epoch(query: str) -> int | None:
    """``epoch`` from a URL query string; ``None`` when absent (no fencing)."""
    return _parse_number(query, EPOCH_PARAMETER)


@dataclass(eq=False)
class _Client:
    """One accepted WebSocket connection on a stream, until its handler has finished."""

    connection: ServerConnection
    finished: asyncio.Future[None]
    epoch: int | None = None
    superseded: bool = False

    @property
    def open(self) -> bool:
        """Still a listener: not closing, not closed, not superseded. A client that sent its
        close frame or whose socket went away is gone even if its handler has not finished."""
        return self.connection.state is State.OPEN and not self.superseded


@dataclass(eq=False)
class _Stream:
    """One live source. Its messages are a function of the clock, so it stores no messages."""

    stream_id: str
    created_at: float
    rate: float
    replay_capacity: int
    clients: set[_Client] = field(default_factory=set)
    max_concurrent: int = 0
    connections: int = 0
    overlaps: int = 0
    gaps: int = 0
    drops: int = 0
    epoch: int | None = None  # the highest epoch dialled
    superseded: int = 0  # clients closed because a higher epoch dialled
    stale_refused: int = 0  # dials refused for a lower epoch
    redirected: int = 0  # handshakes answered with a redirect (hostile mode "redirect")
    restarts: int = 0  # times its numbering started again from 1 (restart())

    def head(self, now: float) -> int:
        """The last seq produced by ``now`` (0: none yet)."""
        return max(0, math.floor((now - self.created_at) * self.rate))

    def due(self, seq: int) -> float:
        """When ``seq`` is produced, on the stream's clock."""
        return self.created_at + seq / self.rate

    def oldest_retained(self, head: int) -> int:
        """The oldest seq still in the replay buffer when the head is ``head``."""
        return max(1, head - self.replay_capacity + 1)


class FakeUpstream:
    """A WebSocket server on 127.0.0.1 whose every ``/streams/<id>`` is a live sequenced source.

    Args:
        rate: messages per second produced on every stream.
        replay_capacity: how many of the latest seqs a stream keeps for ``last_seq`` resumes.
        port: TCP port; 0 picks a free one (read it from :attr:`port` once started).
        clock: monotonic seconds. Inject a shifted clock to age streams without sleeping; it
            should advance with real time, since senders sleep on the event loop's clock.
        keepalive_seconds: ping interval, pong timeout and close timeout for clients; a client
            that stops answering is dropped after about twice this (default 20 s).

    Use ``async with FakeUpstream(rate=50) as upstream:`` or :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        *,
        rate: float = DEFAULT_RATE,
        replay_capacity: int = DEFAULT_REPLAY_CAPACITY,
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        keepalive_seconds: float | None = None,
    ) -> None:
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if replay_capacity < 1:
            raise ValueError(f"replay_capacity must be >= 1, got {replay_capacity!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port!r}")
        self.rate = float(rate)
        self.replay_capacity = replay_capacity
        self._requested_port = port
        self._clock = clock
        self._keepalive = keepalive_seconds
        self._streams: dict[str, _Stream] = {}
        self._overlap_events: deque[dict[str, Any]] = deque(maxlen=MAX_OVERLAP_EVENTS)
        self._server: Server | None = None
        self._port: int | None = None
        self._closing: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> Self:
        """Listen on 127.0.0.1; returns once connections are accepted. Raises ``OSError``."""
        if self._server is not None:
            raise RuntimeError("FakeUpstream already started")
        self._server = await serve(
            self._handle,
            HOST,
            self._requested_port,
            process_request=self._process_request,
            max_size=MAX_INCOMING_BYTES,
            max_queue=4,
            # Thousands of connections in a benchmark: a zlib context each would cost far more
            # memory than the tiny frames could ever save.
            compression=None,
            # A frozen client (SIGSTOP, a paused VM) keeps its socket open; a real upstream drops
            # it when its keepalive fails. Tests make that shorter than the lease.
            ping_interval=self._keepalive or 20.0,
            ping_timeout=self._keepalive or 20.0,
            close_timeout=self._keepalive or 10.0,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close every connection (1001, going away) and stop listening. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- addresses ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port actually listened on."""
        if self._port is None:
            raise RuntimeError("FakeUpstream not started")
        return self._port

    @property
    def url(self) -> str:
        """``ws://127.0.0.1:<port>``."""
        return f"ws://{HOST}:{self.port}"

    @property
    def http_url(self) -> str:
        """``http://127.0.0.1:<port>``, for ``/stats`` and ``/streams/<id>/head``."""
        return f"http://{HOST}:{self.port}"

    def url_for(self, stream_id: str, hostile: Iterable[str] = ()) -> str:
        """The WebSocket URL of one stream (add ``?last_seq=<n>`` to resume), in the hostile
        modes named."""
        return stream_url(self.url, stream_id, hostile)

    # -- streams and observations ------------------------------------------------------------

    def ensure_stream(self, stream_id: str) -> int:
        """Create the stream if new (its clock starts now); returns its current head."""
        return self._stream(stream_id).head(self._clock())

    def head(self, stream_id: str) -> int:
        """The last seq produced on an existing stream (``KeyError`` if it was never created)."""
        return self._streams[stream_id].head(self._clock())

    def stats(self) -> dict[str, Any]:
        """A JSON-ready snapshot of what the upstream has seen, keyed by counter then stream.

        ``connected`` is how many clients are attached right now; ``max_concurrent`` the most
        ever attached at once (superseded ones not counted); ``connections`` the total accepted;
        ``overlaps`` how many connections arrived while another client with the same epoch (or
        without epochs) was attached; ``gaps`` how many resumes (or slow clients) skipped seqs
        that had left the replay buffer; ``drops`` connections cut by :meth:`drop_clients`;
        ``epoch`` the highest epoch dialled; ``superseded`` clients closed for a higher epoch;
        ``stale_refused`` dials refused for a lower one; ``redirected`` handshakes redirected.
        """
        now = self._clock()
        streams = self._streams.values()
        return {
            "rate": self.rate,
            "replay_capacity": self.replay_capacity,
            "streams": len(self._streams),
            "head": {s.stream_id: s.head(now) for s in streams},
            "connected": {s.stream_id: sum(c.open for c in s.clients) for s in streams},
            "max_concurrent": {s.stream_id: s.max_concurrent for s in streams},
            "connections": {s.stream_id: s.connections for s in streams},
            "overlaps": {s.stream_id: s.overlaps for s in streams},
            "gaps": {s.stream_id: s.gaps for s in streams},
            "drops": {s.stream_id: s.drops for s in streams},
            "epoch": {s.stream_id: s.epoch for s in streams},
            "superseded": {s.stream_id: s.superseded for s in streams},
            "stale_refused": {s.stream_id: s.stale_refused for s in streams},
            "redirected": {s.stream_id: s.redirected for s in streams},
            "overlap_events": list(self._overlap_events),
        }

    # -- trouble -----------------------------------------------------------------------------

    async def restart(self, stream_id: str, *, head: int = 0) -> None:
        """Restart a stream as a source that lost its state does: its numbering starts again,
        at ``head`` now (0: from 1), with other data, and its clients are cut. A resume from
        past its new head is answered from its start (it cannot know that seq)."""
        stream = self._stream(stream_id)
        stream.created_at = self._clock() - head / stream.rate
        stream.restarts += 1
        await self.drop_clients(stream_id)

    async def drop_clients(self, stream_id: str | None = None, *, epoch: int | None = None) -> int:
        """Cut connections without a closing handshake, like a network failure; returns how many.

        ``None`` drops every stream's clients; ``epoch`` only those dialled with that epoch (the
        sockets of one killed worker). Returns once their handlers have finished, so
        :meth:`stats` no longer counts them as connected.
        """
        if stream_id is None:
            streams: Iterable[_Stream] = list(self._streams.values())
        else:
            streams = [self._streams[stream_id]] if stream_id in self._streams else []
        dropped: list[_Client] = []
        for stream in streams:
            for client in list(stream.clients):
                if epoch is not None and client.epoch != epoch:
                    continue
                stream.drops += 1
                # abort(), not close(): the client must see an abnormal closure (1006) with no
                # close frame, which is what its reconnect logic exists for.
                client.connection.transport.abort()
                dropped.append(client)
        if dropped:
            await asyncio.wait([c.finished for c in dropped], timeout=DROP_WAIT_SECONDS)
        return len(dropped)

    # -- internals ---------------------------------------------------------------------------

    def _stream(self, stream_id: str) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = _Stream(stream_id, self._clock(), self.rate, self.replay_capacity)
            self._streams[stream_id] = stream
        return stream

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Plain HTTP routes, and 404 for anything that is not a stream. ``None`` upgrades."""
        path = urlsplit(request.path).path
        if path == "/stats":
            return _json_response(connection, http.HTTPStatus.OK, self.stats())
        if match := _HEAD_PATH.fullmatch(path):
            stream = self._streams.get(unquote(match["stream_id"]))
            if stream is None:  # a read must not start a stream's clock
                return _json_response(
                    connection, http.HTTPStatus.NOT_FOUND, {"error": "unknown stream"}
                )
            return _json_response(
                connection, http.HTTPStatus.OK, {"seq": stream.head(self._clock())}
            )
        if match := _STREAM_PATH.fullmatch(path):
            with contextlib.suppress(BadLastSeq):  # reported after the upgrade, as a close
                if "redirect" in hostile_modes(urlsplit(request.path).query):
                    self._stream(unquote(match["stream_id"])).redirected += 1
                    response = connection.respond(http.HTTPStatus.FOUND, "moved\n")
                    response.headers["Location"] = REDIRECT_TARGET + match["stream_id"]
                    return response
                epoch = parse_epoch(urlsplit(request.path).query)
                stream = self._streams.get(unquote(match["stream_id"]))
                if epoch is not None and stream is not None and (stream.epoch or 0) > epoch:
                    stream.stale_refused += 1
                    return connection.respond(
                        http.HTTPStatus(STALE_EPOCH_STATUS),
                        f"epoch {epoch} is older than {stream.epoch}: a newer owner dialled\n",
                    )
            return None
        return connection.respond(http.HTTPStatus.NOT_FOUND, "Not found: use /streams/<id>\n")

    async def _handle(self, connection: ServerConnection) -> None:
        """One client: validate the resume point, then send until either side goes away."""
        target = urlsplit(connection.request.path)
        match = _STREAM_PATH.fullmatch(target.path)
        if match is None:  # _process_request lets only stream paths upgrade
            await connection.close(CloseCode.POLICY_VIOLATION, "not a stream path")
            return
        try:
            last_seq = parse_last_seq(target.query)
            epoch = parse_epoch(target.query)
            modes = hostile_modes(target.query)
        except BadLastSeq as exc:
            await connection.close(CloseCode.POLICY_VIOLATION, str(exc))
            return

        stream = self._stream(unquote(match["stream_id"]))
        if epoch is not None and (stream.epoch or 0) > epoch:  # raced with a newer dial
            stream.stale_refused += 1
            await connection.close(SUPERSEDED_CLOSE_CODE, "a newer owner dialled")
            return
        client = _Client(connection, asyncio.get_running_loop().create_future(), epoch)
        self._attach(stream, client)
        # Without last_seq the client starts live: the first seq produced after it connected.
        head = stream.head(self._clock())
        first = head + 1 if last_seq is None else last_seq + 1
        if last_seq is not None and last_seq > head:
            first = stream.oldest_retained(head)  # a seq it never produced: from its start
        sender = asyncio.create_task(self._send(client, stream, first, modes))
        if "close" in modes:
            sender.cancel()
            drainer = asyncio.create_task(connection.close())
        elif "pingflood" in modes:
            drainer = asyncio.create_task(_flood_pings(connection))
        else:
            drainer = asyncio.create_task(_drain(connection))
        try:
            await asyncio.wait({sender, drainer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, drainer):
                task.cancel()
            results = await asyncio.gather(sender, drainer, return_exceptions=True)
            stream.clients.discard(client)
            client.finished.set_result(None)
        for result in results:
            # A bug in the sender should fail loudly (websockets logs it, closes with 1011).
            if isinstance(result, Exception):
                raise result

    def _attach(self, stream: _Stream, client: _Client) -> None:
        if client.epoch is not None and client.epoch > (stream.epoch or 0):
            stream.epoch = client.epoch
            for other in stream.clients:
                if other.open and (other.epoch is None or other.epoch < client.epoch):
                    other.superseded = True
                    stream.superseded += 1
                    closing = asyncio.create_task(
                        other.connection.close(SUPERSEDED_CLOSE_CODE, "a newer owner dialled")
                    )
                    self._closing.add(closing)
                    closing.add_done_callback(self._closing.discard)
        if any(other.open for other in stream.clients):
            stream.overlaps += 1
            self._overlap_events.append(
                {
                    "stream_id": stream.stream_id,
                    "concurrent": sum(other.open for other in stream.clients) + 1,
                    "head": stream.head(self._clock()),
                }
            )
        stream.clients.add(client)
        stream.connections += 1
        stream.max_concurrent = max(
            stream.max_concurrent, sum(other.open for other in stream.clients)
        )

    async def _send(
        self, client: _Client, stream: _Stream, next_seq: int, modes: frozenset[str] = frozenset()
    ) -> None:
        """Send every seq from ``next_seq`` on as it becomes due, catching up in batches."""
        try:
            while True:
                now = self._clock()
                head = stream.head(now)
                if head < next_seq:
                    # Sleep to the next due time, but at least a little: asyncio may wake a hair
                    # early, and float rounding can leave the head one short at the due instant.
                    # At most a second, so a jump of an injected clock is noticed promptly.
                    delay = stream.due(next_seq) - now
                    await asyncio.sleep(min(max(delay, MIN_SLEEP_SECONDS), MAX_SLEEP_SECONDS))
                    continue
                oldest = stream.oldest_retained(head)
                if next_seq < oldest:
                    stream.gaps += 1
                    next_seq = oldest
                last = min(head, next_seq + SEND_BATCH - 1)
                for seq in range(next_seq, last + 1):
                    if client.superseded:
                        return  # not one more frame to a former owner
                    # send() waits for the socket to drain, so a slow client holds its own
                    # sender back instead of growing a buffer here.
                    text = frame_for(stream.stream_id, seq, modes, stream.restarts)
                    if text is not None:
                        await client.connection.send(text)
                next_seq = last + 1
        except ConnectionClosed:
            return


async def _drain(connection: ServerConnection) -> None:
    """Read and discard whatever the client sends, so its close frame is processed promptly."""
    with contextlib.suppress(ConnectionClosed):
        async for _ in connection:
            pass


async def _flood_pings(connection: ServerConnection) -> None:
    """Stop reading, then flood the client with pings for as long as it stays connected."""
    transport = connection.transport
    transport.pause_reading()
    while not transport.is_closing():
        transport.write(_PING * 64)
        await asyncio.sleep(0.001)


def _json_response(connection: ServerConnection, status: http.HTTPStatus, body: Any) -> Response:
    response = connection.respond(status, json.dumps(body) + "\n")
    del response.headers["Content-Type"]  # Headers.__setitem__ appends rather than replaces
    response.headers["Content-Type"] = "application/json"
    return response


# -- command line ------------------------------------------------------------------------------


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535 (0: any free port), got {value}")
    return value


def _capacity(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m streamfleet_dev.upstream.fake`` command line."""
    parser = argparse.ArgumentParser(
        prog="python -m streamfleet_dev.upstream.fake",
        description="Serve live sequenced WebSocket streams on ws://127.0.0.1:<port>/streams/<id>.",
    )
    parser.add_argument(
        "--port", type=_port, default=0, help="TCP port on 127.0.0.1; 0 picks a free one"
    )
    parser.add_argument(
        "--rate", type=_rate, default=DEFAULT_RATE, help="messages per second on every stream"
    )
    parser.add_argument(
        "--replay-capacity",
        type=_capacity,
        default=DEFAULT_REPLAY_CAPACITY,
        help="latest seqs kept per stream for ?last_seq= resumes",
    )
    parser.add_argument(
        "--keepalive",
        type=_rate,
        default=None,
        help="seconds between pings, and to wait for a pong (drops frozen clients); default 20",
    )
    return parser


async def _serve(args: argparse.Namespace) -> int:
    upstream = FakeUpstream(
        rate=args.rate,
        replay_capacity=args.replay_capacity,
        port=args.port,
        keepalive_seconds=args.keepalive,
    )
    try:
        await upstream.start()
    except OSError as exc:
        print(f"fake upstream: cannot listen on {HOST}:{args.port}: {exc}", file=sys.stderr)
        return 1
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        print(json.dumps({"event": "listening", "url": upstream.url}), flush=True)
        await stopping.wait()
    finally:
        await upstream.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the fake upstream until SIGINT or SIGTERM; returns the exit status."""
    return asyncio.run(_serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
