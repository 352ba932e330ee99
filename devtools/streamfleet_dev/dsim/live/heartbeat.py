"""The application heartbeat of :class:`~streamfleet_client.reconnecting.ReconnectingClient`,
as a watch the simulated client ticks: a ``heartbeat`` every interval, each answered by any
``pong`` that arrives after it; too many consecutive misses end the connection, although its
socket looks open (a Region cut off, or one whose handlers answer nothing)."""

from __future__ import annotations

from collections import deque

from streamfleet_client.reconnecting import ClientConfig

_DEFAULTS = ClientConfig()
# The real client's defaults, so the simulation checks the timings users run with.
HEARTBEAT_INTERVAL_S = _DEFAULTS.heartbeat_interval
HEARTBEAT_TIMEOUT_S = _DEFAULTS.heartbeat_timeout
MISSED_PONGS_BEFORE_RECONNECT = _DEFAULTS.missed_pongs_before_reconnect
# The longest a connection that answers nothing may be kept: the last heartbeat answered just
# before, the next ones sent an interval apart, the last of them given its timeout.
GIVE_UP_WITHIN_S = MISSED_PONGS_BEFORE_RECONNECT * HEARTBEAT_INTERVAL_S + HEARTBEAT_TIMEOUT_S


class HeartbeatWatch:
    """One connection's heartbeats, decided as ``ReconnectingClient._heartbeat`` decides them
    (no ids: a pong answers every heartbeat sent before it)."""

    def __init__(self, opened_at: float):
        self._outstanding: deque[float] = deque()  # send times of unanswered heartbeats
        self._missed = 0
        self._next_send = opened_at + HEARTBEAT_INTERVAL_S
        self.last_pong_at = float("-inf")

    def tick(self, now: float) -> str | None:
        """``"give up"`` after too many consecutive misses, ``"send"`` when a heartbeat is
        due, else ``None``."""
        if self._outstanding and self.last_pong_at >= self._outstanding[0]:
            self._outstanding.clear()
            self._missed = 0
        while self._outstanding and self._outstanding[0] + HEARTBEAT_TIMEOUT_S <= now:
            self._outstanding.popleft()
            self._missed += 1
            if self._missed >= MISSED_PONGS_BEFORE_RECONNECT:
                return "give up"
        if now >= self._next_send:
            self._outstanding.append(now)
            self._next_send = now + HEARTBEAT_INTERVAL_S
            return "send"
        return None
