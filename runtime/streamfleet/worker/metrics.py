"""The worker's periodic report: an EMF document for the fleet's scaling and alarms, and a log
line for whoever reads one task's logs. Counted as things happen, emitted on one clock, so that
emitting costs the same however busy the worker is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .. import emf
from .clients import WorkerClients
from .config import WorkerConfig
from .heartbeat import Heartbeat
from .holdings import Holdings
from .observability import Counters, emf_document
from .sink import MessageSink


@dataclass(eq=False)
class MetricsReporter:
    """Every ``metrics_every``, writes the EMF document and the ``worker_stats`` event."""

    config: WorkerConfig
    holdings: Holdings
    counters: Counters
    sink: MessageSink
    heartbeat: Heartbeat
    clients: WorkerClients
    log: Callable[..., None]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.metrics_every)
            self.emit()

    def emit(self) -> None:
        connections = len(self.holdings.connections)
        document = emf_document(self.config.service_name, connections, self.counters)
        emf.write(emf.line(document))
        self.counters.reset()
        self.log(
            "worker_stats",
            connections=connections,
            messages_stored=self.sink.stored_total,
            renewal_lateness_max_ms=round(self.heartbeat.renewal_lateness_max * 1000, 1),
            **self.clients.request_counts(),
        )
