"""One subscribed stream on the client side: exactly once, in seq order, no gap.

The wire gives *at least once, in any order*: the subscribe handler's replay and the fan-out's
live frames are separate posts that may interleave; a worker crash or a regional failover makes
the fleet rewrite seqs it had stored; after a reconnect the replay repeats what arrived live
before. A :class:`StreamCursor` turns that into what the application sees:

* ``position`` is the last seq delivered to the application, counted in ``epoch``; anything at
  or below it, or of an older epoch, is a duplicate and dropped;
* a stream whose upstream restarted its numbering goes on in a newer *epoch* (its seqs count
  from the upstream's again): the subscribe reply moves the cursor there once nothing more
  can come in the old one, and the application hears of it (:meth:`StreamCursor.take_epoch_change`)
  before the new epoch's first message. An entry of a newer epoch that arrives before that
  counts as a gap: the log fills in the rest of the old epoch first;
* anything above ``position + 1`` waits in a bounded buffer until the seqs before it arrive
  (a message too big for one frame arrives in parts and is joined first);
* a gap that stays open longer than ``gap_timeout`` (a lost post, a dropped frame, a fan-out
  batch that failed) asks for a fresh subscribe from ``position``: the stored log fills it. So
  does a replay that was cut at its budget (``more``), once the client has caught up with it;
* when the buffer is full the highest seqs are dropped: they are in the table and come back
  with the next replay, so the client's memory is bounded whatever the backlog.

Pure state, no I/O: the reconnecting client drives it (and the tests drive it directly).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

DEFAULT_MAX_BUFFERED = 10_000
# A message's parts: at most this many per message (a 384 KiB message takes about 13 frames of
# 32 KB), and at most this many bytes of incomplete parts per stream, the highest seqs evicted
# first (the next replay brings them back).
MAX_PARTS = 64
MAX_PART_BYTES = 4 * 1024 * 1024


class StreamPosition(NamedTuple):
    """A place in a stream's log: ``seq`` counted in ``epoch``; ordered epoch first."""

    epoch: int
    seq: int


@dataclass(frozen=True)
class StreamMessage:
    """One message as delivered to the application."""

    stream: str
    seq: int
    data: str
    received_at_ms: int | None  # when the fleet's worker received it from the upstream
    source: str  # "replay" (from the stored log) or "live" (from the fan-out)
    region: str | None  # the Region that delivered it
    json: bool = False  # data is the exact JSON text of a value the upstream sent, not a string
    epoch: int = 0  # the epoch its seq counts in (a new one each time the upstream restarted)

    @property
    def position(self) -> StreamPosition:
        return StreamPosition(self.epoch, self.seq)


@dataclass(frozen=True)
class Skip:
    """Seqs ``after + 1 .. to`` of ``epoch`` will never be delivered: the log cannot hold them
    (expired, or never sent). Told to the application before what follows them."""

    stream: str
    epoch: int
    after: int
    to: int


@dataclass(frozen=True)
class EpochChange:
    """The stream went on in a newer epoch: its seqs count from the upstream's again."""

    stream: str
    epoch: int
    previous: int


@dataclass
class CursorStats:
    """What a cursor did, for tests, the drill and dashboards."""

    delivered: int = 0
    duplicates: int = 0
    buffered_max: int = 0
    dropped_for_space: int = 0
    gap_resubscribes: int = 0
    more_resubscribes: int = 0
    quiet_resubscribes: int = 0  # a quiet stream asked where its log ends (a lost last post)


@dataclass
class StreamCursor:
    """The client-side state of one subscription (see the module docstring)."""

    stream: str
    position: int | None = None
    epoch: int = 0  # the epoch ``position`` counts in
    max_buffered: int = DEFAULT_MAX_BUFFERED
    stats: CursorStats = field(default_factory=CursorStats)
    buffer: dict[int, StreamMessage] = field(default_factory=dict)
    # seq -> (how many parts its cut has, the parts received so far by index)
    parts: dict[int, tuple[int, dict[int, str]]] = field(default_factory=dict)
    part_bytes: int = 0  # held in incomplete parts
    gap_since: float | None = None
    more_up_to: StreamPosition | None = None  # a replay was cut: subscribe again past this
    # The last position a subscribe reply promised: its replay frames are awaited like a gap, so
    # a replay whose frames were lost is asked for again even on a quiet or stopped stream.
    promised_up_to: StreamPosition | None = None
    in_flight: bool = False  # a subscribe request is on its way (one at a time)
    request_id: str | None = None  # that request's id: only its reply moves the cursor
    gap_attempts: int = 0  # resubscribes since the last delivery: each waits twice as long
    acknowledged: bool = False  # a subscribe of the current connection was answered
    ahead: bool = False  # an entry of a newer epoch arrived: waited for like a gap
    heard_at: float | None = None  # the last frame or reply of this stream
    # Quiet resubscribes that found nothing since the last that found a lost tail: each waits
    # twice as long (a delivery does not reset it: a slow stream would pay a subscribe a gap).
    quiet_attempts: int = 0
    quiet_asked: bool = False  # the subscribe in flight is a quiet one
    _epoch_change: EpochChange | None = None
    _skip: Skip | None = None

    # Server replies --------------------------------------------------------------------------

    def on_subscribed(self, reply: dict[str, Any], now: float) -> list[StreamMessage]:
        """A ``subscribed`` reply: where the log starts for us, and whether the replay was cut.

        Returns what became deliverable (messages buffered before the start was known).
        """
        self.acknowledged = True
        self.heard_at = now
        if self.quiet_asked:
            self.quiet_asked = False
            found = _reply_position(reply, "upTo")
            at = None if self.position is None else StreamPosition(self.epoch, self.position)
            if found is not None and at is not None and found > at:
                self.quiet_attempts = 0  # it found a lost tail: ask as soon again
        # Parts of a message the replay that follows brings whole are dropped: no part from
        # before a reconnect joins one from after it. Parts past the replay are kept: a live
        # message stored after the replay's read may have posted its first parts already.
        up_to = _reply_position(reply, "upTo")
        for seq in list(self.parts):
            if up_to is None or (self.epoch, seq) <= up_to:
                self._drop_parts(seq)
        after = _reply_position(reply, "after")
        if after is not None and (
            self.position is None or after > StreamPosition(self.epoch, self.position)
        ):
            # None: we had no position (a first subscribe from the newest). Above ours: the log
            # has nothing in between (before its origin, expired, or the rest of an epoch that
            # ended): nothing to wait for.
            if after.epoch != self.epoch and self.position is not None:
                self._epoch_change = EpochChange(self.stream, after.epoch, self.epoch)
                if after.seq > 0:
                    # The new epoch's first seqs are not in the log either (expired, or before
                    # the stream's origin): told as a jump within it.
                    self._skip = Skip(self.stream, after.epoch, 0, after.seq)
            elif self.position is not None:
                self._skip = Skip(self.stream, self.epoch, self.position, after.seq)
            self.move_to(after)
        self.more_up_to = up_to if reply.get("more") and up_to is not None else None
        self.promised_up_to = up_to
        return self._drain(now)

    def move_to(self, position: StreamPosition) -> None:
        """Go on from ``position`` (the application's own, ahead of the cursor's): what the
        cursor held of another epoch is dropped with it."""
        if position.epoch != self.epoch:
            self.buffer.clear()
            for seq in list(self.parts):
                self._drop_parts(seq)
            self.epoch, self.ahead = position.epoch, False
        self.position = position.seq

    def take_skip(self) -> Skip | None:
        """The forward jump the last reply made within an epoch (the new one's, after an epoch
        change: told after it), once (``None``: none)."""
        skip, self._skip = self._skip, None
        return skip

    def take_epoch_change(self) -> EpochChange | None:
        """The epoch change the last reply made, once (``None``: none): tell the application
        before delivering what follows it."""
        change, self._epoch_change = self._epoch_change, None
        return change

    def on_entries(
        self, entries: list[Any], *, source: str, region: str | None, now: float
    ) -> list[StreamMessage]:
        """The entries of a ``messages`` frame; returns the messages now deliverable, in order."""
        self.heard_at = now
        for entry in entries:
            message = self._message(entry, source, region)
            if message is None:
                continue
            if message.epoch != self.epoch:
                if message.epoch > self.epoch:
                    self.ahead = True  # the log holds what comes before it: asked for anew
                else:
                    self.stats.duplicates += 1
                continue
            if self.position is not None and message.seq <= self.position:
                self.stats.duplicates += 1
                continue
            if message.seq in self.buffer:
                self.stats.duplicates += 1
                continue
            self.buffer[message.seq] = message
            if len(self.buffer) > self.max_buffered:
                # The highest seqs are the cheapest to lose: the next replay brings them back.
                highest = max(self.buffer)
                del self.buffer[highest]
                self.stats.dropped_for_space += 1
        self.stats.buffered_max = max(self.stats.buffered_max, len(self.buffer))
        return self._drain(now)

    def _message(self, entry: Any, source: str, region: str | None) -> StreamMessage | None:
        if not isinstance(entry, dict):
            return None
        seq = wire_whole(entry.get("seq"))
        data = entry.get("data")
        raw_epoch = entry.get("epoch")
        epoch = 0 if raw_epoch is None else wire_whole(raw_epoch)
        if seq is None or epoch is None or not isinstance(data, str):
            return None
        received = wire_whole(entry.get("at"))
        is_json = entry.get("format") == "json"
        if "parts" in entry:
            part, parts = wire_whole(entry.get("part")), wire_whole(entry.get("parts"))
            if part is None or parts is None or not part < parts <= MAX_PARTS:
                return None
            if epoch != self.epoch or (self.position is not None and seq <= self.position):
                return StreamMessage(self.stream, seq, "", received, source, region, epoch=epoch)
            total, pieces = self.parts.get(seq, (parts, {}))
            if total != parts:
                # Another cut of the same message: its parts never join this one's.
                self._drop_parts(seq)
                total, pieces = parts, {}
            self.part_bytes += len(data) - len(pieces.get(part, ""))
            pieces[part] = data
            self.parts[seq] = (total, pieces)
            if len(pieces) < total:
                self._bound_parts()
                return None
            data = "".join(pieces[index] for index in range(total))
            self._drop_parts(seq)
        return StreamMessage(self.stream, seq, data, received, source, region, is_json, epoch)

    def _drop_parts(self, seq: int) -> None:
        held = self.parts.pop(seq, None)
        if held is not None:
            self.part_bytes -= sum(len(piece) for piece in held[1].values())

    def _bound_parts(self) -> None:
        while self.part_bytes > MAX_PART_BYTES and self.parts:
            self._drop_parts(max(self.parts))
            self.stats.dropped_for_space += 1

    def _drain(self, now: float) -> list[StreamMessage]:
        ready: list[StreamMessage] = []
        if self.position is not None:
            while self.position + 1 in self.buffer:
                message = self.buffer.pop(self.position + 1)
                self.position = message.seq
                ready.append(message)
            for seq in [s for s in self.buffer if s <= self.position]:
                del self.buffer[seq]
                self.stats.duplicates += 1
            for seq in [s for s in self.parts if s <= self.position]:
                self._drop_parts(seq)
        self.stats.delivered += len(ready)
        if ready:
            self.gap_attempts = 0
        if self.promised_up_to is not None and (
            self.position is not None
            and StreamPosition(self.epoch, self.position) >= self.promised_up_to
        ):
            self.promised_up_to = None
        waiting = (
            bool(self.buffer) or bool(self.parts) or self.promised_up_to is not None or self.ahead
        )
        if not waiting:
            self.gap_since = None
        elif self.gap_since is None or ready:
            self.gap_since = now  # the wait for the next missing seq starts now
        return ready

    # When to ask again ----------------------------------------------------------------------

    def resubscribe_reason(
        self, now: float, gap_timeout: float, quiet_timeout: float | None = None
    ) -> str | None:
        """``"gap"``, ``"more"``, ``"start"`` or ``"quiet"`` when a subscribe from ``position``
        should be sent now; ``None`` otherwise (or while one is in flight).

        ``"quiet"``: nothing of the stream was heard for ``quiet_timeout`` (doubling, up to 16
        times, while each finds nothing new). A live post can be lost with its connection still
        open (a fan-out out of time, a batch given up): a later message shows the gap, but after
        a stream's last message nothing would, so a quiet stream asks where its log ends."""
        if self.in_flight or not self.acknowledged:
            return None
        if self.position is None:
            # Subscribed before the stream had stored anything: the first message tells us the
            # log exists now, and a subscribe from the newest tells us where it starts. A first
            # subscribe that failed (no answer, or an error) is sent again after the timeout.
            if self.buffer or self.parts:
                return "start"
            wait = gap_timeout * 2 ** min(self.gap_attempts, 6)  # refused again: more patient
            failed = self.gap_since is not None and now - self.gap_since >= wait
            return "start" if failed else None
        if (
            self.more_up_to is not None
            and StreamPosition(self.epoch, self.position) >= self.more_up_to
        ):
            return "more"
        # A gap the log cannot fill (the unsealed tail of a stopped stream) must not cost a
        # subscribe every gap_timeout for ever: each unproductive retry waits twice as long.
        wait = gap_timeout * 2 ** min(self.gap_attempts, 6)
        if self.gap_since is not None and now - self.gap_since >= wait:
            return "gap"
        if quiet_timeout is not None and self.heard_at is not None and self.gap_since is None:
            quiet = quiet_timeout * 2 ** min(self.quiet_attempts, QUIET_BACKOFF_STEPS)
            if now - self.heard_at >= quiet:
                return "quiet"
        return None

    def count_resubscribe(self, reason: str, now: float) -> None:
        """A subscribe is being sent for ``reason``: restart the gap's clock."""
        if reason == "gap":
            self.stats.gap_resubscribes += 1
            self.gap_attempts += 1
        elif reason == "start":
            self.gap_attempts += 1  # until something is delivered
        elif reason == "more":
            self.stats.more_resubscribes += 1
        elif reason == "quiet":
            self.stats.quiet_resubscribes += 1
            self.quiet_attempts += 1
            self.quiet_asked = True
            self.heard_at = now
        self.more_up_to = None
        self.promised_up_to = None  # the next reply promises anew
        self.gap_since = now if (self.buffer or self.parts or self.ahead) else None


# A quiet stream asks where its log ends after quiet_timeout, then after twice as long, up to
# 2**4 times as long (16 minutes at the clients' default 60 s) while nothing new comes.
QUIET_BACKOFF_STEPS = 4

# The wire's whole numbers, as both clients read them: 0 to 2**53 - 1 (what JavaScript counts
# exactly), written with or without a fraction of zero (``1.0`` is 1, as JSON.parse has it).
MAX_WIRE_WHOLE = 2**53 - 1


def wire_whole(value: object) -> int | None:
    """``value`` as a wire whole number; ``None`` for anything else (the field is then
    unreadable and its entry skipped, in both clients alike)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_WIRE_WHOLE:
        return value
    return None


def _reply_position(reply: dict[str, Any], name: str) -> StreamPosition | None:
    """``reply[name]`` in epoch ``reply[name + "Epoch"]`` (0 when absent); ``None`` if no seq."""
    raw_epoch = reply.get(f"{name}Epoch")
    seq, epoch = wire_whole(reply.get(name)), 0 if raw_epoch is None else wire_whole(raw_epoch)
    if seq is None or epoch is None:
        return None
    return StreamPosition(epoch, seq)
