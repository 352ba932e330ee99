"""Structured JSON logs and CloudWatch Embedded Metric Format (EMF) on stdout.

One log line per lease event (gained, lost, released, handed over), never one per message. The
metrics are EMF documents that CloudWatch Logs turns into metrics, so the worker makes no
PutMetricData call; the scaling policy tracks exactly ``model.METRIC_ACTIVE_CONNECTIONS``.
"""

from __future__ import annotations

import json
import sys
import time
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


@dataclass
class Counters:
    """Counts that go out with the next metrics document."""

    leases_lost: int = 0
    handoffs: int = 0


def emf_document(service_name: str, active: int, counters: Counters) -> dict[str, Any]:
    """An EMF document with ActiveConnections, LeasesLost and Handoffs for one service."""
    return emf.document(
        model.METRIC_NAMESPACE,
        {model.METRIC_DIMENSION_SERVICE: service_name},
        {
            model.METRIC_ACTIVE_CONNECTIONS: (active, emf.COUNT),
            model.METRIC_LEASES_LOST: (counters.leases_lost, emf.COUNT),
            model.METRIC_HANDOFFS: (counters.handoffs, emf.COUNT),
        },
    )
