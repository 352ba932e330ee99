"""One place that schedules the worker's loops, as KCL's ``DynamoDBLeaseCoordinator`` schedules
its taker and renewer: each loop does one job, and the order in which they start and stop is
decided here, because the handoff on SIGTERM depends on it.

Loops (each a task):

* heartbeat and watchdog (:mod:`.heartbeat`): keep the session, end everything at its deadline;
* intake (:mod:`.intake`) and reconcile (:mod:`.taker`): claim connections;
* stop check (:mod:`.stop_check`) and checkpointer (:mod:`.checkpointer`): look after those held;
* sink: writes what they receive;
* rebalance (:mod:`.rebalance`): sheds surplus to the fleet;
* metrics (:mod:`.metrics`): reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..lease import LeaseStore
from .checkpointer import Checkpointer
from .clients import WorkerClients
from .config import WorkerConfig
from .connection import ConnectionContext, EndReason
from .heartbeat import Heartbeat
from .holdings import Holdings
from .intake import Intake
from .metrics import MetricsReporter
from .observability import Counters
from .rebalance import Rebalancer
from .sink import MessageSink
from .stop_check import StopCheck
from .taker import LeaseTaker

Loop = Callable[[], Awaitable[None]]


class Coordinator:
    """Owns what this worker holds and the loops that change it."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        store: LeaseStore,
        sink: MessageSink,
        context: ConnectionContext,
        counters: Counters,
        clients: WorkerClients,
        log: Callable[..., None],
    ):
        self.config = config
        self.sink = sink
        self.log = log
        self.holdings = Holdings(config.max_connections)
        self.taker = LeaseTaker(config, store, context, self.holdings, log)
        self.heartbeat = Heartbeat(
            store.session, config.timing, self.holdings, log, self.taker.reconcile_soon
        )
        self.intake = Intake(config, clients.sqs, store.session, self.taker, self.holdings, log)
        self.stop_check = StopCheck(config, store, self.holdings, log)
        self.checkpointer = Checkpointer(config, self.holdings)
        self.rebalancer = Rebalancer(config, store, self.holdings, log)
        self.metrics = MetricsReporter(
            config, self.holdings, counters, sink, self.heartbeat, clients, log
        )
        self._loops: dict[str, asyncio.Task[None]] = {}

    async def run(self, **more: Loop) -> None:
        """Run every loop, and ``more`` after them, until the worker is asked to stop or one of
        them ends."""
        loops: dict[str, Loop] = {
            "heartbeat": self.heartbeat.run,
            "watchdog": self.heartbeat.watchdog,
            "intake": self.intake.run,
            "reconcile": self.taker.run,
            "stop_check": self.stop_check.run,
            "checkpointer": self.checkpointer.run,
            "sink": self.sink.run,
            "rebalance": self.rebalancer.run,
            "metrics": self.metrics.run,
            **more,
        }
        self._loops = {name: asyncio.create_task(run(), name=name) for name, run in loops.items()}
        stopping = asyncio.create_task(self.holdings.stopping.wait())
        await asyncio.wait([stopping, *self._loops.values()], return_when=asyncio.FIRST_COMPLETED)
        for name, task in self._loops.items():
            if task.done() and not task.cancelled() and task.exception():
                self.log("loop_failed", loop=name, error=repr(task.exception()))
        stopping.cancel()

    def ended_loops(self) -> list[str]:
        """The loops that have ended (none should while the worker runs)."""
        return [name for name, task in self._loops.items() if task.done()]

    async def hand_over(self, budget_seconds: float) -> int:
        """Stop intake, end every connection in parallel (each flushes, releases and notifies a
        peer) within ``budget_seconds``, then every loop. Returns how many connections ended."""
        self.holdings.stopping.set()
        # Intake is not cancelled: its long poll may be in flight and may receive the very
        # notifications this worker is about to publish. It hands back whatever it gets from
        # now on (visibility 0) and ends after that poll.
        for name in ("reconcile", "rebalance", "stop_check"):
            if name in self._loops:
                self._loops[name].cancel()
        ending = list(self.holdings.connections.values())
        for connection in ending:
            connection.end(EndReason.SHUTDOWN)
        if ending:
            await asyncio.wait([c.task for c in ending], timeout=budget_seconds)
        intake = self._loops.get("intake")
        if intake is not None:
            await asyncio.wait([intake], timeout=self.config.sqs_wait_seconds + 1)
        for task in self._loops.values():
            task.cancel()
        await asyncio.gather(*self._loops.values(), return_exceptions=True)
        return len(ending)
