"""One owned upstream connection: dial, receive, persist, and end on the first reason to.

A connection is a single task. Whatever ends it first (STOP, lease lost, deadline, shutdown,
handoff) cancels that task and records the reason; :meth:`Connection._finish` then does what the
reason calls for. Nothing waits for "all of" anything: a ``gather`` that waits for all of them
lets one stuck step hold the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.frames import CloseCode

from .. import buffering, model
from ..backoff import full_jitter
from ..desired_state import DesiredStateWriter
from ..lease import ConnectionLeases, Lease, LeaseLost, SessionLost, StoreUnavailable
from ..waiting import wait_at_most
from .notifier import Notifier
from .observability import Counters, EventLog, RateLimitedLog
from .protocol import ProtocolError, UpstreamMessage, UpstreamProtocol
from .sink import MessageSink
from .upstream_policy import UpstreamPolicy, UpstreamRefused

CLOSE_TIMEOUT_SECONDS = 0.2
OPEN_TIMEOUT_SECONDS = 5.0
PING_INTERVAL_SECONDS = 20.0
# How long the sealer of a stopped stream may spend having a hole replayed by the upstream.
REFILL_SECONDS = 10.0


class BoundedConnection(ClientConnection):
    """A client connection whose unsent bytes are capped: an upstream that stops reading while
    it keeps sending (a ping flood: each ping queues a pong) is cut off at
    ``buffering.MAX_OUTGOING_BYTES`` instead of growing the worker's memory without bound."""

    cut_off = False

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        transport = self.transport
        if transport.get_write_buffer_size() > buffering.MAX_OUTGOING_BYTES:
            self.cut_off = True
            transport.abort()


async def close_within(upstream: ClientConnection, seconds: float) -> None:
    """Close ``upstream`` in bounded time: politely if it drains, else abort the transport, so a
    STOP or a handoff never waits on a peer that does not read."""
    transport = upstream.transport
    if transport.get_write_buffer_size() == 0:
        with contextlib.suppress(Exception):
            await wait_at_most(upstream.close(), 2 * seconds)
    if not transport.is_closing() or transport.get_write_buffer_size():
        transport.abort()


def _close_code(error: BaseException) -> int | None:
    if isinstance(error, ConnectionClosed):
        for frame in (error.sent, error.rcvd):
            if frame is not None:
                return frame.code
    return None


class EndReason(StrEnum):
    """Why a connection ended; decides whether to flush, release and notify."""

    STOPPED = "stopped"  # STOP requested: flush, seal the log, release, do not offer
    SEALED = "sealed"  # claimed only to seal a stopped stream's log: done, release
    SHUTDOWN = "shutdown"  # SIGTERM: flush, release, offer to a peer at once
    HANDOFF = "handoff"  # rebalancing: same as shutdown
    DEADLINE = "deadline"  # holder's deadline passed: close now, write no message
    LOST = "lease_lost"  # someone else owns it: close now, write nothing
    REFUSED = "refused"  # URL not allowed: mark the row, release
    STORAGE_FAILED = "storage_failed"  # messages could not be stored: release for a retry
    FAILED = "failed"  # anything unexpected: release so that a peer (or this worker) retries


_FLUSHES = {EndReason.STOPPED, EndReason.SHUTDOWN, EndReason.HANDOFF}
_OFFERS = {
    EndReason.SHUTDOWN,
    EndReason.HANDOFF,
    EndReason.DEADLINE,
    EndReason.STORAGE_FAILED,
    EndReason.FAILED,
}


@dataclass(frozen=True)
class ConnectionContext:
    """What every connection of a worker shares."""

    leases: ConnectionLeases
    sink: MessageSink
    notifier: Notifier
    desired_state: DesiredStateWriter
    policy: UpstreamPolicy
    protocol: UpstreamProtocol
    log: EventLog
    counters: Counters
    max_message_bytes: int
    max_buffered_messages: int
    max_buffered_bytes: int
    reconnect_base_seconds: float
    reconnect_cap_seconds: float


class Connection:
    """A lease and the task that streams it."""

    def __init__(
        self,
        lease: Lease,
        context: ConnectionContext,
        *,
        acquired_at: float,
        on_finished: Callable[[Connection], None],
    ):
        self.lease = lease
        self.pk = lease.pk
        self.acquired_at = acquired_at
        # Log positions (model.log_position) in the stream: received from the upstream, stored,
        # checkpointed. Until the resume point is known (_stream) they are the checkpoint, 0 for
        # a stream never checkpointed (nothing of it is stored).
        start = lease.last_seq or 0
        self.last_received_seq = start
        self.stored_seq = start
        self.checkpointed_seq = start
        # The epoch the upstream's seqs are numbered in now: the checkpoint's, since a new epoch
        # is checkpointed at its origin before anything of it is stored.
        self.log_epoch = model.epoch_of(start)
        self.end_reason: EndReason | None = None
        self.connected = False
        self.abandoned = False  # its release failed while its session may still be live
        self._context = context
        self._on_finished = on_finished
        self._unstored = 0
        self._unstored_bytes = 0
        self._stored_high = 0  # the newest position stored when this lease began (or refilled)
        self._last_message: int | None = None  # the newest message received or found stored
        self._follows: int | None = None  # what the next message follows, when not the last
        self._repeat_expected: int | None = None  # dialled one back: this one comes again
        self._started = False
        self._storage_failed = False
        self._refusal = ""
        self._failure = ""  # what went wrong with the stream itself (EndReason.FAILED)
        self._dialling = False  # making the URL, or dialling it, up to its handshake
        self._drained = asyncio.Event()
        self._drained.set()
        # What the upstream can repeat at its own rate is logged at most once per interval.
        self._upstream_log = RateLimitedLog(context.log)
        self.task: asyncio.Task[None] = asyncio.create_task(self._run(), name=self.pk)

    # -- control ------------------------------------------------------------------------------

    @property
    def failure(self) -> str | None:
        """What went wrong with the stream itself, if that is why it ended: its release holds it
        off (see :meth:`ConnectionLeases.release`)."""
        return self._failure if self.end_reason is EndReason.FAILED and self._failure else None

    @property
    def session_version(self) -> int:
        """The session this connection's lease belongs to."""
        return self.lease.session_version

    def end(self, reason: EndReason) -> None:
        """End the connection for ``reason``; the first reason wins, later ones are ignored."""
        if self.end_reason is None and not self.task.done():
            self.end_reason = reason
            # A task cancelled before its first step would never run its cleanup: until it
            # has started, the reason alone is enough (it checks it first thing).
            if self._started:
                self.task.cancel()

    # -- sink callbacks -----------------------------------------------------------------------

    def stored(self, count: int, up_to_seq: int, size: int) -> None:
        self._unstored -= count
        self._unstored_bytes -= size
        self.stored_seq = max(self.stored_seq, up_to_seq)
        if (
            self._unstored < self._context.max_buffered_messages
            and self._unstored_bytes < self._context.max_buffered_bytes
        ):
            self._drained.set()

    def storage_failed(self, error: Exception) -> None:
        # Whatever ends the connection, no checkpoint may pass these lost messages now.
        self._storage_failed = True
        reason = EndReason.DEADLINE if isinstance(error, SessionLost) else EndReason.STORAGE_FAILED
        self.end(reason)

    # -- the task -----------------------------------------------------------------------------

    async def _run(self) -> None:
        self._started = True
        try:
            if self.end_reason is None:
                if self.lease.desired_state == model.DesiredState.STOPPED.value:
                    # Not sealed (the upstream could not be reached to refill a hole): released
                    # unsealed, for a later attempt.
                    sealed = await self._seal_log()
                    self.end_reason = EndReason.SEALED if sealed else EndReason.FAILED
                    self._failure = "" if sealed else "its log could not be sealed"
                else:
                    await self._stream()
        except asyncio.CancelledError:
            if self.end_reason is None:
                self.end_reason = EndReason.SHUTDOWN
        except UpstreamRefused as refused:
            self.end_reason = EndReason.REFUSED
            self._refusal = str(refused)
        except LeaseLost:
            self.end_reason = EndReason.LOST
        except SessionLost:
            self.end_reason = EndReason.DEADLINE
        except Exception as exc:  # never leave a lease owned by a task that is gone
            self._context.log("connection_failed", pk=self.pk, error=repr(exc))
            if self.end_reason is None:
                self.end_reason = EndReason.FAILED
                if self._dialling:  # the stream's own failure, not the store's: hold it off
                    self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            self.connected = False
        try:
            await self._finish()
        finally:
            self._on_finished(self)

    async def _stream(self) -> None:
        """Dial, receive and queue messages; redial with backoff while the lease is held."""
        context = self._context
        session = context.leases.session
        # Where to resume: the end of the run stored without a hole after the checkpoint (the
        # checkpoint is written rarely; what is stored says where the predecessor got to). A
        # stream never checkpointed has nothing stored: join it live (None).
        resume_from: int | None = None
        if self.lease.last_seq is not None:
            resume_from = await self._resume_at(
                await context.sink.contiguous_end(self.pk, self.lease.last_seq)
            )
        attempt = 0
        while self.end_reason is None:  # told to end: its cancellation ends it, this is a net
            session.require_live()  # never (re)dial past the holder's deadline
            if resume_from is not None:
                # A redial in this lease, perhaps in a newer epoch than the one it resumed in.
                resume_from = max(resume_from, self.last_received_seq, self.stored_seq)
            self._dialling = True
            url = context.protocol.dial_url(
                self.lease.ws_url,
                resume_after=self._dial_after(resume_from),
                epoch=self.lease.lease_version,
            )
            received_before = self.last_received_seq
            dialled: BoundedConnection | None = None
            try:
                async with await self._dial(url) as upstream:
                    dialled = upstream
                    self._dialling = False
                    try:
                        self.connected = True
                        async for frame in upstream:
                            message = self._judge(frame)
                            if message is None:
                                continue
                            if resume_from is None:
                                resume_from = await self._record_origin(message.seq)
                            await self._receive(message)
                            await self._backpressure()
                    finally:
                        await close_within(upstream, CLOSE_TIMEOUT_SECONDS)
                    self._dropped(upstream.close_code, "closed")
            except (OSError, TimeoutError, WebSocketException) as exc:
                if context.protocol.superseded(exc):
                    raise LeaseLost(self.pk, None, " (the upstream has a newer epoch)") from None
                cut_off = dialled is not None and dialled.cut_off
                self._dropped(_close_code(exc), "not reading" if cut_off else type(exc).__name__)
            self.connected = False
            self._dialling = False
            # A failure the stream repeats backs off further each time: a handshake alone is
            # no progress (an upstream that accepts and closes at once, or replays a message
            # over the limit, would otherwise be redialled several times a second for ever).
            if self.last_received_seq > received_before:
                attempt = 0
            await asyncio.sleep(
                full_jitter(attempt, context.reconnect_base_seconds, context.reconnect_cap_seconds)
            )
            attempt += 1

    async def _resume_at(self, end: int) -> int:
        """Take the stream up after ``end`` (the end of the run stored without a hole): the first
        message received follows the newest message stored at or below it (an epoch's origin
        is no message: that is the previous epoch's last), with its expiry, so readers can
        tell when a hole before it can no longer be filled. Past a hole an earlier owner may
        have stored more: what the upstream sends again up to there is compared with it."""
        sink = self._context.sink
        self.stored_seq = self.last_received_seq = end
        last = await sink.last_stored(self.pk, end)
        self._follows = last[0] if last is not None and last[0] < end else None
        self._last_message = None if last is None else last[0]
        sink.follows(self, None if last is None else last[1])
        self._stored_high = await sink.newest_stored(self.pk) or 0
        return end

    def _dial_after(self, resume_from: int | None) -> int | None:
        """The seq to resume the upstream after: one before the last message of this epoch the
        log holds, so that the first message it sends is compared with the stored one (a
        restarted numbering that went on past that seq would otherwise pass for the old log
        going on), or the resume point itself when there is no such message."""
        if resume_from is None:
            return None
        last = self._last_message
        if last == resume_from and model.epoch_of(last) == self.log_epoch:
            self._repeat_expected = last
            return model.seq_of(last) - 1
        return model.seq_of(resume_from)

    async def _dial(self, url: str) -> Any:
        """The upstream connection to open for ``url`` (``async with`` it): the checked address
        of the lease's URL, its frames, queue and unsent bytes bounded."""
        context = self._context
        host, port = await context.policy.resolve(self.lease.ws_url)
        return connect(
            url,
            host=host,
            port=port,
            open_timeout=OPEN_TIMEOUT_SECONDS,
            close_timeout=CLOSE_TIMEOUT_SECONDS,
            ping_interval=PING_INTERVAL_SECONDS,
            max_size=context.max_message_bytes,
            max_queue=buffering.MAX_QUEUED_FRAMES,
            write_limit=buffering.MAX_OUTGOING_BYTES,
            create_connection=BoundedConnection,
            proxy=None,  # dial exactly the checked address, never via an ambient proxy
        )

    async def _checkpoint(self, position: int, *, origin: bool = False) -> None:
        """Checkpoint ``position``; progress clears the stream's failures in the row (see
        :meth:`ConnectionLeases.checkpoint`), so this lease counts from none again."""
        await self._context.leases.checkpoint(self.lease, position, origin=origin)
        if self.lease.dial_failures:
            self.lease = dataclasses.replace(self.lease, dial_failures=0)

    async def _backpressure(self) -> None:
        """Stop reading while too much of this connection, or of the whole worker, is unstored:
        the upstream's TCP window holds the rest."""
        context = self._context
        if (
            self._unstored >= context.max_buffered_messages
            or self._unstored_bytes >= context.max_buffered_bytes
        ):
            self._drained.clear()
            await self._drained.wait()
        if not context.sink.room.is_set():
            await context.sink.room.wait()

    def _dropped(self, code: int | None, error: str) -> None:
        self._context.counters.upstream_drops += 1
        if code == CloseCode.MESSAGE_TOO_BIG:
            # It replays that message on every redial: reported, and redialled with backoff.
            self._context.counters.frames_refused += 1
            self._upstream_log(
                "upstream_frame_refused",
                pk=self.pk,
                seq=self.last_received_seq + 1,
                reason=f"over MAX_MESSAGE_BYTES ({self._context.max_message_bytes})",
            )
        self._upstream_log("upstream_dropped", pk=self.pk, error=error, code=code)

    async def _record_origin(self, first: int) -> int:
        """A stream taken up live starts at its first message: record the seq before it as the
        stream's origin, before anything is stored, so every later owner knows where the log
        begins (and that it has to replay from there)."""
        origin = model.log_position(self.log_epoch, first - 1)
        await self._checkpoint(origin, origin=True)
        self.checkpointed_seq = self.stored_seq = self.last_received_seq = origin
        return origin

    def _judge(self, frame: str | bytes) -> UpstreamMessage | None:
        """The frame's message, or ``None`` once the frame is refused: one that cannot be read
        or stored is judged alone, and never ends this stream's connection, nor another's."""
        try:
            message = self._context.protocol.parse(frame)
        except Exception as exc:  # a pluggable protocol may raise anything: refuse the frame
            reason = str(exc) if isinstance(exc, ProtocolError) else repr(exc)
            self._refuse(frame, reason, getattr(exc, "seq", None))
            return None
        stored = dataclasses.replace(message, seq=model.log_position(self.log_epoch, message.seq))
        if not self._context.sink.fits(self.pk, stored):
            self._refuse(frame, "too big for one stored item", message.seq)
            return None
        return message

    def _refuse(self, frame: str | bytes, reason: str, seq: int | None) -> None:
        self._context.counters.frames_refused += 1
        size = len(frame.encode("utf-8")) if isinstance(frame, str) else len(frame)
        self._upstream_log(
            "upstream_frame_refused", pk=self.pk, seq=seq, bytes=size, reason=reason[:200]
        )

    async def _receive(self, message: UpstreamMessage) -> None:
        """Queue ``message`` at its log position. A seq the log already holds is compared with
        what is stored there: only another message at a stored position proves that the
        upstream's numbering restarted, and begins a new epoch, so the new message is neither
        dropped nor written over the old one. The same message again is a duplicate (dropped,
        or past what this lease received rewritten unchanged); so is one the log no longer holds
        (expired, or never sent): nothing to compare it with."""
        previous = self.last_received_seq
        position = model.log_position(self.log_epoch, message.seq)
        expected, self._repeat_expected = self._repeat_expected, None
        if position <= max(previous, self._stored_high):
            if position > self.stored_seq:
                await self._context.sink.flush()  # compare with the log, not with a queue
                if self._storage_failed:
                    return  # the connection is ending: nothing more of it is stored
            stored = await self._context.sink.stored_message(self.pk, position)
            if stored is not None and not _same(stored, message):
                begun = await self._begin_epoch(message.seq)
                if begun is None:
                    return
                position, previous = begun, self.last_received_seq
            elif position <= previous:
                if position != expected:  # the one it was dialled to send again is no news
                    self._context.counters.upstream_seq_backwards += 1
                    self._upstream_log("upstream_seq_repeated", pk=self.pk, seq=message.seq)
                return
            # Otherwise past what this lease received: an earlier owner's message again, or its
            # hole filled now.
        elif position != previous + 1 and model.epoch_of(previous) == self.log_epoch:
            # Stored with prev_seq: the log records the gap, so resuming and sealing keep what
            # lies past it.
            self._context.counters.upstream_gaps += 1
            self._upstream_log(
                "upstream_gap", pk=self.pk, after=model.seq_of(previous), next=message.seq
            )
        if position > previous + 1 and previous < self._stored_high:
            # The upstream went past what an earlier owner left stored after a hole: that hole
            # can never be filled now. Recorded where readers find it, the message after it.
            await self._context.sink.close_holes(self.pk, previous, below=position)
        if self._follows is not None:  # the first after a resume at an epoch's origin
            previous, self._follows = self._follows, None
        self.last_received_seq = self._last_message = position
        self._unstored += 1
        self._unstored_bytes += message.data_bytes
        self._context.sink.add(self, dataclasses.replace(message, seq=position), previous)

    async def _begin_epoch(self, first: int) -> int | None:
        """The upstream numbers anew from ``first``: end the current epoch (everything received
        in it stored, its holes recorded as gaps), checkpoint the next one at its origin before
        anything of it is stored, and return ``first``'s position in it (``None``: storage
        failed, the connection is ending). Its first message follows the old epoch's last, so
        readers and successors go on from one to the other."""
        context = self._context
        await context.sink.flush()
        if self._storage_failed:
            return None
        end, _ = await context.sink.close_holes(self.pk, self.stored_seq)
        epoch = self.log_epoch + 1
        origin = model.log_position(epoch, first - 1)
        await self._checkpoint(origin)
        self.log_epoch = epoch
        self.checkpointed_seq = self.stored_seq = self._stored_high = origin
        self.last_received_seq, self._follows = end, None
        context.counters.log_epochs += 1
        context.log(
            "log_epoch_begun", pk=self.pk, epoch=epoch, first=first, after=model.seq_of(end)
        )
        return model.log_position(epoch, first)

    async def checkpoint(self) -> None:
        """Record the stored position, if it moved. Ends the connection if the lease is lost."""
        seq = self.stored_seq
        if seq <= self.checkpointed_seq or self.end_reason is not None or self._storage_failed:
            return
        try:
            await self._checkpoint(seq)
        except LeaseLost:
            self.end(EndReason.LOST)
            return
        self.checkpointed_seq = max(self.checkpointed_seq, seq)

    async def _seal_log(self) -> bool:
        """Leave the stored log without a hole, then checkpoint its end; ``False`` if it could
        not be sealed now. A hole (a message received and never stored: a batch that landed
        only in part before its owner failed) is refilled from the upstream, which replays from
        the end of the run stored before it. What the upstream, once reached, can no longer
        replay is recorded as a gap (nothing stored past it is removed: readers may have had
        it); while it cannot be reached nothing changes, and the stream stays unsealed for a
        later attempt. Only an owner does this, so nobody writes the stream meanwhile."""
        if self.lease.last_seq is None and not self.stored_seq:
            return True  # never checkpointed: nothing of it is stored
        sink = self._context.sink
        end = await sink.contiguous_end(self.pk, self.stored_seq)
        newest = await sink.newest_stored(self.pk)
        gaps = 0
        if newest is not None and newest > end:
            end, replayed = await self._refill(end, newest)
            if newest > end:
                if not replayed:
                    return False
                end, gaps = await sink.close_holes(self.pk, end)
        if end > self.checkpointed_seq:
            await self._checkpoint(end)
        self.checkpointed_seq = self.stored_seq = end
        self._context.log(
            "log_sealed",
            pk=self.pk,
            epoch=model.epoch_of(end),
            last_seq=model.seq_of(end),
            gaps_recorded=gaps,
        )
        return True

    async def _refill(self, end: int, newest: int) -> tuple[int, bool]:
        """Receive ``end + 1 .. newest`` from the upstream again and store it, within
        ``REFILL_SECONDS``; returns the end of the run stored without a hole now, and whether
        the upstream was reached and replayed what it still has."""
        context = self._context
        context.leases.session.require_live()
        await self._resume_at(end)
        self._stored_high = newest
        replayed = True
        try:
            async with asyncio.timeout(REFILL_SECONDS):
                url = context.protocol.dial_url(
                    self.lease.ws_url,
                    resume_after=self._dial_after(end),
                    epoch=self.lease.lease_version,
                )
                async with await self._dial(url) as upstream:
                    try:
                        async for frame in upstream:
                            message = self._judge(frame)
                            if message is not None:
                                await self._receive(message)
                                await self._backpressure()
                            if self.last_received_seq >= newest:
                                break
                    finally:
                        await close_within(upstream, CLOSE_TIMEOUT_SECONDS)
        except UpstreamRefused as exc:
            # Its URL is no longer allowed: it can never be replayed, now or later.
            context.log("log_refill_failed", pk=self.pk, after=end, error=str(exc))
        except (OSError, TimeoutError, WebSocketException) as exc:
            context.log("log_refill_failed", pk=self.pk, after=end, error=type(exc).__name__)
            replayed = False
        await context.sink.flush()
        if self._storage_failed:
            return end, False
        return await context.sink.contiguous_end(self.pk, end), replayed

    async def _finish(self) -> None:
        reason = self.end_reason
        context = self._context
        sealed = reason in (EndReason.SEALED, EndReason.REFUSED)
        try:
            if reason in _FLUSHES:
                try:
                    await context.sink.flush()
                    if not self._storage_failed:
                        stored = self.stored_seq
                        if stored > self.checkpointed_seq:
                            await self._checkpoint(stored)
                            self.checkpointed_seq = stored
                        if reason is EndReason.STOPPED:
                            sealed = await self._seal_log()
                except (SessionLost, StoreUnavailable) as exc:
                    # Not stored or not checkpointed: still released (fenced, safe late), so a
                    # peer resumes at once from what is stored instead of after a whole lease.
                    context.log("final_flush_failed", pk=self.pk, error=str(exc))
            # Nothing of this connection may be written after it is given up.
            await context.sink.settle(self)
            if reason is EndReason.REFUSED:
                await context.desired_state.refuse(self.lease, self._refusal)
            if reason is EndReason.LOST:
                context.counters.leases_lost += 1
                context.log("lease_lost", pk=self.pk, lease_version=self.lease.lease_version)
                return
            failure = self.failure
            offered = await context.leases.release(self.lease, sealed=sealed, failure=failure)
            if failure is not None:
                # Held off in the row: the fleet claims it when the hold ends, nobody sooner.
                context.counters.streams_held_off += 1
                context.log(
                    "stream_held_off",
                    pk=self.pk,
                    failures=self.lease.dial_failures + 1,
                    error=failure[: model.MAX_FAILURE_CHARS],
                )
                return
        except LeaseLost:
            context.counters.leases_lost += 1
            context.log("lease_lost", pk=self.pk, lease_version=self.lease.lease_version)
            return
        except (SessionLost, StoreUnavailable) as exc:
            # Nothing could be written: the worker retries the release while its session lives,
            # and otherwise the lease ends with the session.
            self.abandoned = isinstance(exc, StoreUnavailable)
            context.log("lease_abandoned", pk=self.pk, reason=str(reason), error=str(exc))
            return
        if offered:
            # Also after a STOP that a new START overtook: nobody else announces it.
            with contextlib.suppress(Exception):
                await context.notifier.notify(self.pk)
        if offered and reason in _OFFERS:
            context.counters.handoffs += 1
            context.log("lease_handed_over", pk=self.pk, reason=str(reason))
        else:
            context.log(
                "lease_released", pk=self.pk, reason=str(reason), last_seq=self.checkpointed_seq
            )


def _same(stored: tuple[str, bool], message: UpstreamMessage) -> bool:
    """Whether ``message`` is the one stored: the same string, or the same JSON value however
    its text is spaced or its members ordered (an upstream may write a replay anew)."""
    data, is_json = stored
    if is_json != message.json:
        return False
    if data == message.data or not is_json:
        return data == message.data
    try:
        return _canonical(data) == _canonical(message.data)
    except (ValueError, RecursionError):
        return False


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
