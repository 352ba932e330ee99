"""Structured JSON logs and CloudWatch Embedded Metric Format (EMF) on stdout.

One log line per lease event (gained, lost, released, handed over), never one per message: what
an upstream can repeat at its own rate (a refused frame, a gap) goes through a
:class:`RateLimitedLog` and is counted in full in the metrics. The
metrics are EMF documents that CloudWatch Logs turns into metrics, so the worker makes no
PutMetricData call; the scaling policy tracks exactly ``model.METRIC_ACTIVE_CONNECTIONS``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from .. import emf, model


@dataclass
class EventLog:
    """Writes one JSON object per line; each carries the worker id."""

    worker_id: str
    stream: TextIO = field(default_factory=lambda: sys.stdout)

    def __call__(self, event: str, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, "worker": self.worker_id, **fields}
        self.stream.write(json.dumps(record, default=str, separators=(",", ":")) + "\n")
        self.stream.flush()


class RateLimitedLog:
    """At most one line per ``event`` every ``interval`` seconds (per instance: one per stream).

    The first occurrence is logged at once; the ones within the next ``interval`` are counted
    and reported as ``suppressed`` on the next line that is written.
    """

    def __init__(
        self,
        log: Callable[..., None],
        *,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._log = log
        self._interval = interval
        self._clock = clock
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, event: str, **fields: Any) -> None:
        now = self._clock()
        if now < self._next.get(event, float("-inf")):
            self._suppressed[event] = self._suppressed.get(event, 0) + 1
            return
        self._next[event] = now + self._interval
        suppressed = self._suppressed.pop(event, 0)
        if suppressed:
            fields["suppressed"] = suppressed
        self._log(event, **fields)


@dataclass
class Counters:
    """Counts that go out with the next metrics document."""

    leases_lost: int = 0
    handoffs: int = 0
    frames_refused: int = 0
    upstream_gaps: int = 0
    upstream_seq_backwards: int = 0
    log_epochs: int = 0
    upstream_drops: int = 0
    streams_held_off: int = 0

    def reset(self) -> None:
        """Zero every count once a document has carried it (the connections share this one)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, 0)


def emf_document(service_name: str, active: int, counters: Counters) -> dict[str, Any]:
    """An EMF document with ActiveConnections and the worker's counts for one service."""
    return emf.document(
        model.METRIC_NAMESPACE,
        {model.METRIC_DIMENSION_SERVICE: service_name},
        {
            model.METRIC_ACTIVE_CONNECTIONS: (active, emf.COUNT),
            model.METRIC_LEASES_LOST: (counters.leases_lost, emf.COUNT),
            model.METRIC_HANDOFFS: (counters.handoffs, emf.COUNT),
            model.METRIC_FRAMES_REFUSED: (counters.frames_refused, emf.COUNT),
            model.METRIC_UPSTREAM_GAPS: (counters.upstream_gaps, emf.COUNT),
            model.METRIC_UPSTREAM_SEQ_BACKWARDS: (counters.upstream_seq_backwards, emf.COUNT),
            model.METRIC_LOG_EPOCHS: (counters.log_epochs, emf.COUNT),
            model.METRIC_UPSTREAM_DROPS: (counters.upstream_drops, emf.COUNT),
            model.METRIC_STREAMS_HELD_OFF: (counters.streams_held_off, emf.COUNT),
        },
    )
