"""The application heartbeat of :class:`~streamfleet_client.reconnecting.ReconnectingClient`,
as a watch the simulated client ticks: a ``heartbeat`` after an interval without a sign of life
(the opening, a ``pong``), answered by any ``pong`` that arrives after it; too many unanswered
in a row (each sent when the previous timed out) end the connection, although its socket looks
open (a Region cut off, or one whose handlers answer nothing)."""

from __future__ import annotations

from streamfleet_client.reconnecting import ClientConfig

_DEFAULTS = ClientConfig()
# The real client's defaults, so the simulation checks the timings users run with.
HEARTBEAT_INTERVAL_S = _DEFAULTS.heartbeat_interval
HEARTBEAT_TIMEOUT_S = _DEFAULTS.heartbeat_timeout
MISSED_PONGS_BEFORE_RECONNECT = _DEFAULTS.missed_pongs_before_reconnect
# The longest a connection that answers nothing may be kept: the last sign of life just before,
# a heartbeat an interval later, each unanswered one given its timeout.
GIVE_UP_WITHIN_S = HEARTBEAT_INTERVAL_S + MISSED_PONGS_BEFORE_RECONNECT * HEARTBEAT_TIMEOUT_S


class HeartbeatWatch:
    """One connection's heartbeats, decided as ``ReconnectingClient._heartbeat`` decides them
    (no ids: a pong answers every heartbeat sent before it). The simulated client tells it of
    pongs only, so it heartbeats as the real client does on a connection with no other reply."""

    def __init__(self, opened_at: float):
        self._heard_at = opened_at
        self._ping_at: float | None = None  # when the unanswered heartbeat was sent
        self._missed = 0
        self.last_pong_at = float("-inf")

    def tick(self, now: float) -> str | None:
        """``"give up"`` after too many unanswered in a row, ``"send"`` when a heartbeat is
        due, else ``None``."""
        heard = max(self._heard_at, self.last_pong_at)
        if self._ping_at is not None and self.last_pong_at >= self._ping_at:
            self._ping_at, self._missed = None, 0
        if self._ping_at is not None and now >= self._ping_at + HEARTBEAT_TIMEOUT_S:
            self._ping_at = None
            self._missed += 1
            if self._missed >= MISSED_PONGS_BEFORE_RECONNECT:
                return "give up"
        if self._ping_at is None and (self._missed or now >= heard + HEARTBEAT_INTERVAL_S):
            self._ping_at = now
            return "send"
        return None
