"""The worker process, put together: its clients, its session, the coordinator that runs its
loops, the health endpoint and its signals. What each loop does is in the coordinator's modules;
this one only decides what they share and what a process's start and end look like.

SIGTERM ends intake, ends every connection in parallel (flush, release, notify a peer), closes
the session, hands back whatever the last long poll still brings, and exits.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from ..backoff import full_jitter
from ..clock import SYSTEM_CLOCK, Clock
from ..desired_state import DesiredStateWriter
from ..lease import LeaseStore, StoreUnavailable
from ..waiting import wait_at_most
from .clients import WorkerClients
from .config import WorkerConfig
from .connection import Connection, ConnectionContext
from .coordinator import Coordinator
from .health import serve_health
from .notifier import Notifier
from .observability import Counters, EventLog
from .protocol import JsonSeqProtocol, UpstreamProtocol
from .sink import MessageSink

SHUTDOWN_BUDGET_SECONDS = 10.0


class Worker:
    """Owns connections through a session lease; its loops are the :class:`Coordinator`'s."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        protocol: UpstreamProtocol | None = None,
        clock: Clock = SYSTEM_CLOCK,
        log: Callable[..., None] | None = None,
        clients: WorkerClients | None = None,
    ):
        self.config = config
        self.log = log or EventLog(config.worker_id)
        self.clients = clients or WorkerClients.create(config)
        self.store = LeaseStore.create(
            table_name=config.table_name,
            worker_id=config.worker_id,
            timing=config.timing,
            dynamodb=self.clients.dynamodb,
            renewals=self.clients.renewals,
            clock=clock,
            group=config.session_group,
            region=config.region,
            capacity=config.max_connections,
            task_arn=config.task_arn,
        )
        self.sink = MessageSink(
            dynamodb=self.clients.dynamodb,
            table_name=config.messages_table_name,
            worker_id=config.worker_id,
            session=self.store.session,
            flush_every=config.flush_every,
            retention_seconds=config.message_retention_seconds,
            max_buffered_bytes=config.max_worker_buffered_bytes,
        )
        counters = Counters()
        context = ConnectionContext(
            leases=self.store.connections,
            sink=self.sink,
            notifier=Notifier(sqs=self.clients.sqs, queue_url=config.queue_url),
            desired_state=DesiredStateWriter(
                dynamodb=self.clients.dynamodb, table_name=config.table_name
            ),
            policy=config.upstreams,
            protocol=protocol or JsonSeqProtocol(),
            log=self.log,
            counters=counters,
            max_message_bytes=config.max_message_bytes,
            max_buffered_messages=config.max_buffered_messages,
            max_buffered_bytes=config.max_buffered_bytes,
            reconnect_base_seconds=config.reconnect_base_seconds,
            reconnect_cap_seconds=config.reconnect_cap_seconds,
        )
        self.coordinator = Coordinator(
            config,
            store=self.store,
            sink=self.sink,
            context=context,
            counters=counters,
            clients=self.clients,
            log=self.log,
        )

    @property
    def connections(self) -> dict[str, Connection]:
        """The connections this worker runs, by key."""
        return self.coordinator.holdings.connections

    def request_shutdown(self) -> None:
        """What SIGTERM and SIGINT do."""
        self.coordinator.holdings.stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Open the session, run the loops until asked to stop, then hand everything over."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.request_shutdown)
        if not await self._open_session():
            await self.shutdown()
            return
        self.log("session_opened", session_version=self.store.session.version)
        health_port = self.config.health_port
        if health_port is None:
            await self.coordinator.run()
        else:
            await self.coordinator.run(
                health=lambda: serve_health(
                    self.health_report,
                    health_port,
                    lambda port: self.log("health_listening", port=port),
                )
            )
        await self.shutdown()

    async def _open_session(self) -> bool:
        """Open the first session, waiting out a DynamoDB that does not answer yet (a worker
        that exits instead only crash-loops through the outage). ``False`` if asked to stop
        first."""
        stopping = self.coordinator.holdings.stopping
        heartbeat = self.config.timing.heartbeat_seconds
        attempt = 0
        while not stopping.is_set():
            try:
                await self.store.session.open()
                return True
            except StoreUnavailable as exc:
                self.log("session_open_failed", error=str(exc))
            await wait_at_most(stopping.wait(), full_jitter(attempt, heartbeat / 4, 2 * heartbeat))
            attempt += 1
        return False

    async def shutdown(self) -> None:
        """Hand every connection over (intake first, then every connection in parallel, within
        ``SHUTDOWN_BUDGET_SECONDS``), close the session and the clients."""
        clock = self.store.session.clock
        started = clock.monotonic()
        handed_over = await self.coordinator.hand_over(SHUTDOWN_BUDGET_SECONDS)
        await self.store.session.close()
        self.log(
            "worker_stopped",
            handed_over=handed_over,
            seconds=round(clock.monotonic() - started, 3),
            **self.clients.request_counts(),
        )
        self.clients.close()

    def dead_loops(self) -> list[str]:
        """Loops that ended although nothing asked them to (what the health check reports)."""
        return [name for name in self.coordinator.ended_loops() if name != "health"]

    def health_report(self) -> tuple[int, dict[str, Any]]:
        """What ``GET /health`` answers now: 503 once a loop has died, else 200; with what the
        worker holds."""
        dead = self.dead_loops()
        session = self.store.session
        body = {
            "worker": self.config.worker_id,
            "connections": len(self.connections),
            "session_live": not session.deadline_passed(),
            "session_version": session.version,
            "dead_loops": dead,
        }
        return (503 if dead else 200), body
