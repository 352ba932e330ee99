"""One simulated world: real workers (in threads of this process), a real DynamoDB server
behind the fault layer, real SQS, the fake upstream, and a recorded history.

Each worker is the real :class:`~streamfleet.worker.fleet.Worker` on its own event loop in its
own thread, so it can be frozen like a SIGSTOPped process (its loop thread blocks; its sockets
stay open; its clocks keep running) and killed like a ``kill -9`` (frozen for good, nothing it
sends leaves the machine, its upstream sockets reset). Its wall clock runs ahead or behind by a
skew within ``MAX_CLOCK_SKEW_SECONDS``; its monotonic clock is the process's.

What the checkers need is recorded without touching the deployed code: each worker's holder
deadline (through an observing subclass of its session keeper), when each of its connections
began and stopped acting (an observing subclass of ``Connection``), every request it sent, and
its log events.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3

from streamfleet import model
from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.control import ControlPlane
from streamfleet.lease import LeaseTiming
from streamfleet.worker import connection as connection_module
from streamfleet.worker import taker as worker_taker
from streamfleet.worker.config import WorkerConfig
from streamfleet.worker.connection import Connection
from streamfleet.worker.fleet import Worker, WorkerClients
from streamfleet.worker.upstream_policy import UpstreamPolicy
from streamfleet_dev.checks import connection_rows, stored_log
from streamfleet_dev.sim.faults import PASS, FaultPlan, FaultyClient, Network, Sent
from streamfleet_dev.sim.observed import observe_session
from streamfleet_dev.tables import create_tables
from streamfleet_dev.upstream.process import UpstreamProcess


@dataclass(frozen=True)
class SimTiming:
    """Short timings, so that failures and recoveries play out in a second or two."""

    lease_seconds: float = 0.6
    heartbeat_seconds: float = 0.12
    max_clock_skew_seconds: float = 0.06
    safety_margin_seconds: float = 0.06
    reconcile_every: float = 0.3
    stop_check_every: float = 0.12
    checkpoint_every: float = 0.3
    flush_every: float = 0.02
    sqs_wait_seconds: int = 1
    rebalance_every: float = 1.2
    rebalance_hold_seconds: float = 1.2

    @property
    def lease(self) -> LeaseTiming:
        return LeaseTiming(
            lease_seconds=self.lease_seconds,
            heartbeat_seconds=self.heartbeat_seconds,
            max_clock_skew_seconds=self.max_clock_skew_seconds,
            safety_margin_seconds=self.safety_margin_seconds,
        )


SIM_TIMING = SimTiming()


@dataclass(frozen=True)
class SkewedClock:
    """This process's clocks, with the wall clock ``offset_ms`` ahead (or behind)."""

    offset_ms: int = 0

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


@dataclass
class Window:
    """When one worker acted as the owner of one stream under one lease."""

    worker: str
    pk: str
    lease_version: int
    session_version: int
    began: float
    stopped: float | None = None  # when it stopped receiving (None: never, killed)
    finished: float | None = None  # when it had released (or given up) the lease


@dataclass
class History:
    """Everything the checkers read; appended to from every worker's thread."""

    events: list[tuple[float, str, str, dict[str, Any]]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    deadlines: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def event(self, worker: str, name: str, fields: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((time.monotonic(), worker, name, fields))

    def record(self, sent: Sent) -> None:
        with self.lock:
            self.sent.append(sent)

    def deadline(self, worker: str, version: int | None, value: float) -> None:
        if version is None:
            return
        with self.lock:
            self.deadlines.setdefault((worker, version), []).append((time.monotonic(), value))

    def dump(self, problems: list[str]) -> str:
        """Everything recorded, in time order, as text (kept for a failing schedule)."""
        lines = [f"PROBLEM {problem}" for problem in problems]
        rows: list[tuple[float, str]] = []
        with self.lock:
            for at, worker, name, fields in self.events:
                shown = {k: v for k, v in fields.items() if not k.endswith("requests")}
                rows.append((at, f"EVENT {worker} {name} {shown}"))
            for sent in self.sent:
                text = f"SENT {sent.client} {sent.operation} {sent.fault} {str(sent.params)[:300]}"
                rows.append((sent.at, text))
            for window in self.windows:
                rows.append((window.began, f"WINDOW {window}"))
            for (worker, version), values in self.deadlines.items():
                for at, value in values:
                    rows.append((at, f"DEADLINE {worker} {version} -> {value:.3f}"))
        lines += [f"{at:.3f} {text}" for at, text in sorted(rows, key=lambda row: row[0])]
        return "\n".join(lines) + "\n"

    def deadline_at(self, worker: str, version: int, at: float) -> float:
        """The holder's deadline for that session as the worker believed it at ``at``."""
        values = [v for t, v in self.deadlines.get((worker, version), []) if t <= at]
        return values[-1] if values else float("-inf")


class _Log:
    """The worker's event log: into the history, not stdout."""

    def __init__(self, worker: str, history: History):
        self.worker = worker
        self.history = history

    def __call__(self, event: str, **fields: Any) -> None:
        self.history.event(self.worker, event, fields)


class ObservedConnection(Connection):
    """Records when it began acting and when it stopped (before its release is sent)."""

    def __init__(self, lease, context, **kwargs):
        log = context.log
        if isinstance(log, _Log):
            self._window: Window | None = Window(
                log.worker, lease.pk, lease.lease_version, lease.session_version, time.monotonic()
            )
            with log.history.lock:
                log.history.windows.append(self._window)
        else:
            self._window = None
        super().__init__(lease, context, **kwargs)

    async def _finish(self) -> None:
        if self._window is not None:
            self._window.stopped = time.monotonic()
        try:
            await super()._finish()
        finally:
            if self._window is not None:
                self._window.finished = time.monotonic()


# The worker's lease taker builds its connections through this module-level name; observing
# ones behave exactly like the real class (and record nothing) outside a simulated world.
worker_taker.Connection = ObservedConnection  # type: ignore[misc]

# Every upstream socket a simulated worker opens, by worker (its thread, not its name: two
# worlds may run at once, each with a worker of the same name), so that a kill can close them
# all, as the kernel closes a dead process's sockets.
_UPSTREAM_SOCKETS: dict[threading.Thread, list[Any]] = {}
_real_connect = connection_module.connect
KILL_FREEZE_SECONDS = 30.0


class _RecordingConnect:
    def __init__(self, *args: Any, **kwargs: Any):
        self._connect = _real_connect(*args, **kwargs)

    async def __aenter__(self) -> Any:
        upstream = await self._connect.__aenter__()
        _UPSTREAM_SOCKETS.setdefault(threading.current_thread(), []).append(upstream)
        return upstream

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._connect.__aexit__(*exc_info)


connection_module.connect = _RecordingConnect  # type: ignore[assignment]


def _reset(sock: Any, *, tcp_only: bool = False) -> None:
    """Shut a socket (an object with ``fileno()``, or a descriptor) down from outside its event
    loop, without closing the descriptor. ``tcp_only``: leave anything but a TCP socket alone
    (the loop's own self-pipe is a socket too)."""
    with contextlib.suppress(OSError, ValueError):
        raw = socket.socket(fileno=sock if isinstance(sock, int) else sock.fileno())
        try:
            if not tcp_only or (
                raw.family in (socket.AF_INET, socket.AF_INET6) and raw.type == socket.SOCK_STREAM
            ):
                raw.shutdown(socket.SHUT_RDWR)
        finally:
            raw.detach()


class SimWorker:
    """A real worker on its own loop and thread, which the schedule can freeze and kill."""

    def __init__(self, world: World, worker_id: str, *, skew_ms: int, plan: FaultPlan):
        self.world = world
        self.worker_id = worker_id
        self.skew_ms = skew_ms
        self.plan = plan
        self.loop = asyncio.new_event_loop()
        self.worker: Worker | None = None
        self.clients: list[FaultyClient] = []
        self.killed = False
        # When the kill had taken effect (monotonic): its loop frozen for good, its clients dead,
        # its upstream sockets reset. From then on it can neither send nor receive.
        self.killed_at: float | None = None
        self.stopping = False  # SIGTERM received: it hands over and exits
        self.started = threading.Event()
        self.finished = threading.Event()
        self._thaw = threading.Event()
        self._thaw.set()
        self._stopped_now = threading.Event()  # its loop thread has reached the freeze
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=worker_id, daemon=True)

    def start(self) -> SimWorker:
        """Start its thread; the worker comes up there (the caller's loop is not held)."""
        self.thread.start()
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._run())
        except BaseException as exc:  # reported by the checker, not lost in a thread
            self.error = exc
        finally:
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(self.loop)
                for task in pending:
                    task.cancel()
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            self.finished.set()

    async def _run(self) -> None:
        world = self.world
        config = world.worker_config(self.worker_id)
        with _SESSION_LOCK:  # one boto3 session, models loaded once, clients made one at a time
            real = WorkerClients.create(config, _shared_session())

        def faulty(inner: AsyncClient, kind: str, plan: FaultPlan) -> FaultyClient:
            client = FaultyClient(
                inner,
                name=f"{self.worker_id}/{kind}",
                plan=plan,
                network=world.network,
                record=world.history.record,
            )
            self.clients.append(client)
            return client

        clients = WorkerClients(
            dynamodb=faulty(real.dynamodb, "dynamodb", self.plan),
            renewals=faulty(real.renewals, "renewals", self.plan),
            sqs=faulty(real.sqs, "sqs", _NO_FAULTS),
        )
        self.worker = Worker(
            config,
            clock=SkewedClock(self.skew_ms),
            log=_Log(self.worker_id, world.history),
            clients=clients,  # type: ignore[arg-type]
        )
        observe_session(self.worker.store.session, world.history.deadline)
        self.started.set()
        if self.stopping:
            self.worker.request_shutdown()
        await self.worker.run(handle_signals=False)

    # -- what the schedule does to it ---------------------------------------------------------

    def alive(self) -> bool:
        return not self.killed and not self.finished.is_set()

    def serving(self) -> bool:
        """Up, with a session open (a new process takes a moment to get there)."""
        worker = self.worker
        return (
            self.alive()
            and not self.frozen()
            and worker is not None
            and worker.store.session.version is not None
        )

    def frozen(self) -> bool:
        return not self._thaw.is_set()

    def sigterm(self) -> None:
        if self.finished.is_set():
            return
        self.stopping = True
        self.loop.call_soon_threadsafe(self._request_shutdown)

    def _request_shutdown(self) -> None:
        if self.worker is not None:  # not yet built: _run sees `stopping` and asks it then
            self.worker.request_shutdown()

    def freeze(self) -> None:
        """SIGSTOP: the loop thread stops at its next step, sockets and clocks untouched."""
        if self.frozen() or self.finished.is_set():
            return
        self._thaw.clear()
        self._stopped_now.clear()
        self.loop.call_soon_threadsafe(self._stop_here)

    def _stop_here(self) -> None:
        self._stopped_now.set()
        self._thaw.wait()

    def thaw(self) -> None:
        if not self.killed:
            self._thaw.set()

    async def kill(self) -> None:
        """kill -9: frozen for good; nothing it sends leaves; its sockets close, as the kernel
        closes a dead process's (the upstream sees each one reset)."""
        self.freeze()
        self.killed = True
        for client in self.clients:
            client.dead = True
        # Nothing runs in it from here on; a loop that never reached the freeze would keep its
        # sockets, so that is an error of the harness, not a verdict on the worker.
        if not await asyncio.to_thread(self._stopped_now.wait, KILL_FREEZE_SECONDS):
            raise RuntimeError(f"{self.worker_id}: not frozen within {KILL_FREEZE_SECONDS} s")
        for upstream in _UPSTREAM_SOCKETS.pop(self.thread, []):
            sock = upstream.transport.get_extra_info("socket")
            if sock is not None:
                _reset(sock)
        # ...and one still in its handshake: the loop is blocked in a callback now, so its
        # registry of sockets holds still. Its transports register bare descriptors, not socket
        # objects: a dial caught between its TCP connect and the end of its WebSocket handshake
        # would otherwise stay open at the upstream, connected, for as long as the world lasts.
        for key in list(self.loop._selector.get_map().values()):  # type: ignore[attr-defined]
            _reset(key.fd, tcp_only=True)
        self.killed_at = time.monotonic()

    def dispose(self, timeout: float = 15.0) -> None:
        """End the thread. The world is over: its clean-up runs against dead clients and changes
        nothing anywhere."""
        for client in self.clients:
            client.dead = True
        self._thaw.set()
        self.sigterm()
        self.finished.wait(timeout)
        for client in self.clients:
            client.close()


_SESSIONS: list[boto3.session.Session] = []
_SESSION_LOCK = threading.Lock()


def _shared_session() -> boto3.session.Session:
    """Made on first use, so it reads the environment the local servers set up."""
    if not _SESSIONS:
        _SESSIONS.append(boto3.session.Session())
    return _SESSIONS[0]


class _NoFaults:
    def decide(self, client: str, operation: str, params: dict[str, Any]):
        return PASS


_NO_FAULTS = _NoFaults()


class World:
    """Tables, a queue, an upstream and workers for one schedule, on shared local servers.

    The upstream runs in a process of its own: in this process its loop would compete with the
    driver's and with every simulated worker for the interpreter, and a stalled upstream looks
    exactly like the network trouble the schedule is meant to control.
    """

    def __init__(
        self, *, upstream: UpstreamProcess, timing: SimTiming = SIM_TIMING, name: str = ""
    ) -> None:
        self.timing = timing
        self.upstream = upstream
        self.name = name or uuid.uuid4().hex[:8]
        self.lease_table = f"sim-leases-{self.name}"
        self.messages_table = f"sim-messages-{self.name}"
        self.network = Network()
        self.history = History()
        self.workers: dict[str, SimWorker] = {}
        self._dynamodb = boto3.client("dynamodb")
        create_tables(
            self._dynamodb, lease_table=self.lease_table, messages_table=self.messages_table
        )
        self._sqs = boto3.client("sqs")
        self.queue_url = self._sqs.create_queue(QueueName=f"sim-{self.name}")["QueueUrl"]
        self.control_client = AsyncClient("dynamodb", settings=ClientSettings(threads=4))
        self.sqs_client = AsyncClient("sqs", settings=ClientSettings(threads=2))
        self.control = ControlPlane.create(
            dynamodb=self.control_client,
            sqs=self.sqs_client,
            table_name=self.lease_table,
            queue_url=self.queue_url,
        )

    # -- names ----------------------------------------------------------------------------------

    def stream_id(self, pk: str) -> str:
        return model.connection_id_of(pk)

    def stream(self, number: int) -> str:
        return f"{self.name}-s{number}"

    # -- workers --------------------------------------------------------------------------------

    def worker_config(self, worker_id: str) -> WorkerConfig:
        timing = self.timing
        return WorkerConfig(
            table_name=self.lease_table,
            messages_table_name=self.messages_table,
            queue_url=self.queue_url,
            upstreams=UpstreamPolicy.parse(model.ENV_ALLOWED_UPSTREAMS, self.upstream.url),
            worker_id=worker_id,
            timing=timing.lease,
            reconcile_every=timing.reconcile_every,
            stop_check_every=timing.stop_check_every,
            checkpoint_every=timing.checkpoint_every,
            flush_every=timing.flush_every,
            sqs_wait_seconds=timing.sqs_wait_seconds,
            max_connections=100,
            metrics_every=3600,
            reconnect_base_seconds=0.02,
            reconnect_cap_seconds=0.2,
            rebalance_every=timing.rebalance_every,
            rebalance_hold_seconds=timing.rebalance_hold_seconds,
        )

    def start_worker(self, worker_id: str, *, skew_ms: int = 0, plan: FaultPlan | None = None):
        worker = SimWorker(self, worker_id, skew_ms=skew_ms, plan=plan or _NO_FAULTS).start()
        self.workers[worker_id] = worker
        return worker

    def live_workers(self) -> list[SimWorker]:
        return [w for w in self.workers.values() if w.serving()]

    # -- the outside world ----------------------------------------------------------------------

    async def start_stream(self, stream_id: str) -> None:
        await self.control.start(stream_id, self.upstream.url_for(stream_id))

    async def stop_stream(self, stream_id: str) -> None:
        await self.control.stop(stream_id)

    def rows(self) -> dict[str, dict[str, Any]]:
        return connection_rows(self._dynamodb, self.lease_table)

    def stored_log(self, stream_id: str) -> dict[int, str]:
        return stored_log(self._dynamodb, self.messages_table, stream_id)

    def dispose(self) -> None:
        disposing = [
            threading.Thread(target=worker.dispose, daemon=True) for worker in self.workers.values()
        ]
        for thread in disposing:
            thread.start()
        for thread in disposing:
            thread.join(20)
        self.network.quiesce()
        self.control_client.close()
        self.sqs_client.close()
        for table in (self.lease_table, self.messages_table):
            with contextlib.suppress(Exception):
                self._dynamodb.delete_table(TableName=table)
        with contextlib.suppress(Exception):
            self._sqs.delete_queue(QueueUrl=self.queue_url)


async def eventually(check: Callable[[], Any], *, timeout: float, every: float = 0.05) -> bool:
    """Poll ``check`` (sync, or async) until truthy or ``timeout``; ``True`` if it held."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every)
