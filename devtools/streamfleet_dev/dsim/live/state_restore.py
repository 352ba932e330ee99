"""``getState`` after every (re)connect, as
:meth:`~streamfleet_client.reconnecting.ReconnectingClient._restore_state` sends it: again after
an error reply or none within the request timeout, with full-jitter backoff, and the connection
given up after ``STATE_ATTEMPTS`` unanswered ones (the next one may be served)."""

from __future__ import annotations

import random

from streamfleet.backoff import full_jitter
from streamfleet_client.reconnecting import STATE_ATTEMPTS, ClientConfig

_DEFAULTS = ClientConfig()


class StateRestore:
    """One connection's getState requests: :meth:`tick` says when to send one (its request id),
    :meth:`answered` and :meth:`failed` take the replies."""

    def __init__(self, opened_at: float, rng: random.Random):
        self._rng = rng  # a stream of its own: the client's other draws stay as they were
        self._attempt = 0
        self._send_at: float | None = opened_at  # the first right away
        self._sent_at: float | None = None
        self.request_id: str | None = None
        self.ready = False

    def tick(self, now: float, request_id: str) -> str | None:
        """``"send"`` (with ``request_id``, kept to match the reply), ``"give up"`` after
        ``STATE_ATTEMPTS`` unanswered ones, or ``None``."""
        if self.ready:
            return None
        if self._sent_at is not None and now - self._sent_at >= _DEFAULTS.request_timeout:
            self._retry_later(now)
        if self._send_at is None or now < self._send_at:
            return None
        if self._attempt >= STATE_ATTEMPTS:
            return "give up"
        self._send_at, self._sent_at, self.request_id = None, now, request_id
        return "send"

    def answered(self, request_id: str) -> bool:
        """A ``state`` reply: whether it answers this connection's request (then restored)."""
        if request_id != self.request_id or self.ready:
            return False
        self.ready = True
        return True

    def failed(self, request_id: str, now: float) -> None:
        """An error reply to the current request (``unavailable``, ``internal``): sent again."""
        if request_id == self.request_id and not self.ready and self._sent_at is not None:
            self._retry_later(now)

    def _retry_later(self, now: float) -> None:
        self._sent_at = None
        self._send_at = now + full_jitter(
            self._attempt, _DEFAULTS.backoff_base, _DEFAULTS.backoff_cap, self._rng
        )
        self._attempt += 1
