"""The lease core on a virtual clock: the real lease code and the worker's lease-plane loops,
seeded faults, one owner checked.

Each schedule runs holders that use the deployed lease code (``LeaseStore``: the session
keeper's renewals, the orphan finder with its fencing of dead sessions, ``claim``, fenced
``checkpoint``) against :class:`~.dynamodb_model.DynamoDBModel` through the fault layer of
:mod:`streamfleet_dev.sim.faults` (delays, lost answers, late and duplicated deliveries,
throttling, server errors, timeouts, stale index views), with each holder's wall clock skewed
within the allowance. The schedule crashes holders (their tasks end at once; what they sent is
still delivered), pauses them (nothing they send or hear passes; time goes on) and starts new
ones.

A holder is the lease plane of a worker, run by the worker's own code: its session (opened
as ``Worker.run`` opens it, waiting out a store that does not answer), and the loops the
coordinator runs for it, wired as the coordinator wires them: the heartbeat (fixed-rate
renewals, a new session when the old one lapsed) and its watchdog (nothing held past the
holder's deadline) from :mod:`streamfleet.worker.heartbeat`, and the
:class:`~streamfleet.worker.taker.LeaseTaker` from :mod:`streamfleet.worker.taker` (reconcile
at its jittered cadence and early wake-ups, fair share of a dead peer's rows and its grace,
claims given back when their session ended first, release retries, the audit of its own rows),
with ``WorkerConfig`` set to the simulation's timing (:data:`TIMING`, a reconcile every
:data:`RECONCILE_SECONDS`). What stays simulated is the connection the taker starts for each
lease it claims (its ``connection_factory``): a :class:`HeldConnection` dials no upstream and
stores no message; it checkpoints a rising seq every :data:`CHECKPOINT_SECONDS` through the real
fenced ``checkpoint`` until the lease or its session is lost or it is told to end, then gives
the row back as the worker's connection does. The worker's other loops (intake and its
notifications, the stop check, the checkpointer, rebalancing, metrics, shutdown) and its sink
are not in this simulation: a notification is only traced. A paused holder's loops still wake
on their timers, but nothing they send or hear passes until it resumes, and its connections
checkpoint nothing meanwhile.

The checker asks what the lease model promises whatever the faults:

* **one owner**: a new holder's window on a row begins only after the previous holder's has
  ended: at its stop, or at the last holder's deadline its session ever had, whichever came
  first;
* **liveness**: once the network has healed and every pause has ended, every row is held again
  within the quiet period (three leases);
* **no loop ends**: a worker loop that ends on its own ends the worker.

(The store also checks every fenced write it applies: :class:`FencingWitness`.)

Everything is on one virtual clock and every random draw comes from the seed (the runtime's
own, the taker's jitter among them: see :func:`_seeded`), so a schedule replays exactly: the
same seed gives the same trace (:attr:`Outcome.trace`, every request with its fault included)
on any machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from streamfleet import model
from streamfleet.aws import ClientSettings
from streamfleet.backoff import full_jitter
from streamfleet.desired_state import DesiredStateWriter
from streamfleet.lease import LeaseLost, LeaseStore, LeaseTiming, SessionLost, StoreUnavailable
from streamfleet.lease import sessions as sessions_module
from streamfleet.lease.connections import Lease
from streamfleet.worker.config import WorkerConfig
from streamfleet.worker.connection import EndReason
from streamfleet.worker.heartbeat import Heartbeat
from streamfleet.worker.holdings import Holdings
from streamfleet.worker.taker import LeaseTaker
from streamfleet.worker.upstream_policy import UpstreamPolicy
from streamfleet_dev.dsim import loop as virtual
from streamfleet_dev.dsim.async_client import InProcessClient
from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel
from streamfleet_dev.dsim.network import VirtualNetwork
from streamfleet_dev.sim.faults import FaultyClient, RandomFaults, Sent
from streamfleet_dev.sim.observed import observe_session

TIMING = LeaseTiming(
    lease_seconds=10.0, heartbeat_seconds=2.0, max_clock_skew_seconds=1.0, safety_margin_seconds=0.5
)
RECONCILE_SECONDS = 3.0
CHECKPOINT_SECONDS = 2.0
WALL_BASE_MS = 1_800_000_000_000  # the virtual clock's 0, on the wall
TABLE = "dsim-leases"
URL = "wss://upstream.example.com/stream"
UPSTREAMS = UpstreamPolicy.parse("ALLOWED_UPSTREAMS", "wss://upstream.example.com")


# --- the schedule -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    at: float
    kind: str  # crash, pause, start
    holder: int
    seconds: float = 0.0  # how long a pause lasts


@dataclass(frozen=True)
class Schedule:
    seed: int
    holders: int
    streams: int
    fault_rate: float
    events: tuple[Event, ...]
    quiet_seconds: float  # after the last event, before the end

    @classmethod
    def generate(cls, seed: int) -> Schedule:
        rng = random.Random(f"{seed}/schedule")
        holders = rng.randint(2, 4)
        streams = rng.randint(1, 6)
        events: list[Event] = []
        at = 0.0
        next_holder = holders
        alive = set(range(holders))
        for _ in range(rng.randint(1, 6)):
            at += rng.uniform(0.5, 2 * TIMING.lease_seconds)
            kind = rng.choice(("crash", "pause", "pause", "start"))
            seconds = rng.choice((0.5, TIMING.heartbeat_seconds * 2, TIMING.lease_seconds * 2))
            holder = rng.randrange(next_holder)
            if kind == "crash" and alive <= {holder}:
                kind = "start"  # the last one alive is never crashed: nobody could come back
            if kind == "start":
                events.append(Event(at, kind, next_holder))
                alive.add(next_holder)
                next_holder += 1
            else:
                events.append(Event(at, kind, holder, seconds if kind == "pause" else 0.0))
                if kind == "crash":
                    alive.discard(holder)
        return cls(
            seed=seed,
            holders=holders,
            streams=streams,
            fault_rate=rng.choice((0.0, 0.05, 0.2)),
            events=tuple(events),
            quiet_seconds=3 * (TIMING.lease_seconds + TIMING.max_clock_skew_seconds),
        )

    def describe(self) -> str:
        events = ", ".join(
            f"{e.kind} h{e.holder}@{e.at:.1f}" + (f"+{e.seconds:g}" if e.seconds else "")
            for e in self.events
        )
        return (
            f"seed {self.seed}: {self.holders} holders, {self.streams} streams, "
            f"faults {self.fault_rate:g}: {events}"
        )


# --- one world --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkewedVirtualClock:
    """The loop's time as the monotonic clock; the wall clock ``skew_ms`` off."""

    loop: asyncio.AbstractEventLoop
    skew_ms: int = 0

    def monotonic(self) -> float:
        return self.loop.time()

    def wall_ms(self) -> int:
        return WALL_BASE_MS + round(self.loop.time() * 1000) + self.skew_ms


@dataclass
class Window:
    """One holder acting as the owner of one row under one lease."""

    holder: str
    pk: str
    lease_version: int
    session_version: int
    began: float
    stopped: float | None = None


class _Paused:
    """A holder's client that sends nothing and hears nothing while the holder is paused, as a
    SIGSTOPped process: a request waits to be sent, an answer waits to be read."""

    def __init__(self, inner: FaultyClient, awake: asyncio.Event):
        self.inner = inner
        self.awake = awake

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        await self.awake.wait()
        try:
            return await self.inner.call(operation, **params)
        finally:
            await self.awake.wait()


@dataclass(frozen=True)
class _Notices:
    """Where the holder's notifications go (to a queue its peers' intake reads, in the worker):
    into the trace. Intake is not simulated; peers find the row by reconcile."""

    holder: Holder

    async def notify(self, pk: str) -> None:
        self.holder.world.trace(f"{self.holder.name} notifies {pk}")


@dataclass(frozen=True)
class _Context:
    """What the taker reads of the worker's :class:`ConnectionContext`: its notifier. The rest
    (sink, protocol, upstream policy) serves the upstream connection, which is simulated."""

    notifier: _Notices


class HeldConnection:
    """The simulation's stand-in for the worker's ``Connection``, made by the taker (its
    ``connection_factory``) for each lease it claims: it dials nothing, and checkpoints a rising
    seq every ``CHECKPOINT_SECONDS`` through the real fenced ``checkpoint`` until the lease or
    its session is lost or it is told to end (the watchdog, a new session). Then, as the
    worker's connection does, it gives the row back (fenced) unless the lease was lost, and is
    marked abandoned if the store did not answer, for the taker to retry. Its window on the row
    runs from the claim to the moment it stops checkpointing."""

    def __init__(
        self,
        holder: Holder,
        lease: Lease,
        context: Any,
        *,
        acquired_at: float,
        on_finished: Callable[[HeldConnection], None],
    ):
        self.holder = holder
        self.lease = lease
        self.pk = lease.pk
        self.acquired_at = acquired_at
        self.end_reason: EndReason | None = None
        self.abandoned = False
        self.failure: str | None = None
        self._on_finished = on_finished
        self._started = False
        self.window = Window(
            holder.name, lease.pk, lease.lease_version, lease.session_version, holder.now()
        )
        holder.world.windows.append(self.window)
        holder.world.trace(f"{holder.name} holds {lease.pk} v{lease.lease_version}")
        self.task = holder.spawn(self._run())
        # Cancelled before its first step (its holder crashed at once): its window ends too.
        self.task.add_done_callback(lambda _: self._stop())

    @property
    def session_version(self) -> int:
        return self.lease.session_version

    def end(self, reason: EndReason) -> None:
        """As ``Connection.end``: the first reason wins."""
        if self.end_reason is None and not self.task.done():
            self.end_reason = reason
            if self._started:
                self.task.cancel()

    def _stop(self) -> None:
        if self.window.stopped is None:
            self.window.stopped = self.holder.now()

    async def _run(self) -> None:
        self._started = True
        holder = self.holder
        try:
            if self.end_reason is None:
                await self._checkpoint_until_lost()
        except asyncio.CancelledError:
            if holder.crashed:
                raise  # kill -9: nothing more of it runs
            if self.end_reason is None:
                self.end_reason = EndReason.SHUTDOWN
        except LeaseLost:
            self.end_reason = EndReason.LOST
        except SessionLost:
            self.end_reason = EndReason.DEADLINE
        except Exception as exc:  # as the worker's: never leave a lease owned by a task gone
            holder.world.trace(f"{holder.name} connection_failed pk={self.pk} error={exc!r}")
            if self.end_reason is None:
                self.end_reason = EndReason.FAILED
        finally:
            self._stop()
        holder.world.trace(
            f"{holder.name} ends {self.pk} v{self.lease.lease_version}: {self.end_reason}"
        )
        try:
            await self._finish()
        finally:
            self._on_finished(self)

    async def _checkpoint_until_lost(self) -> None:
        holder = self.holder
        store = holder.store
        seq = self.lease.last_seq or 0
        while True:
            await holder.awake.wait()
            store.session.require_live(self.lease.session_version)
            seq += 1
            try:
                await store.connections.checkpoint(self.lease, seq)
            except StoreUnavailable as exc:  # not answered in time: again next time
                holder.world.trace(f"{holder.name} checkpoint failed: {type(exc).__name__}")
            await asyncio.sleep(CHECKPOINT_SECONDS)

    async def _finish(self) -> None:
        """What ``Connection._finish`` does with the lease (there is nothing to flush)."""
        holder = self.holder
        if self.end_reason is EndReason.LOST:
            return
        try:
            offered = await holder.store.connections.release(self.lease)
        except LeaseLost:
            holder.world.trace(f"{holder.name} release of {self.pk} found it lost")
            return
        except (SessionLost, StoreUnavailable) as exc:
            self.abandoned = isinstance(exc, StoreUnavailable)
            holder.world.trace(f"{holder.name} abandons {self.pk}: {type(exc).__name__}")
            return
        holder.world.trace(f"{holder.name} released {self.pk} v{self.lease.lease_version}")
        if offered:
            await holder.notices.notify(self.pk)


class Holder:
    """The lease plane of one worker (see the module docstring): its session, the worker's
    heartbeat, watchdog and taker as the coordinator wires them, and a :class:`HeldConnection`
    for each lease the taker claims."""

    def __init__(self, world: World, name: str, skew_ms: int):
        self.world = world
        self.name = name
        loop = asyncio.get_running_loop()
        self._loop = loop
        latency = random.Random(f"{world.schedule.seed}/latency/{name}")
        self.awake = asyncio.Event()
        self.awake.set()
        self.paused_until = float("-inf")
        self.client = FaultyClient(
            InProcessClient(  # type: ignore[arg-type]
                world.db,
                settings=ClientSettings(read_timeout_seconds=2.0),
                latency=lambda: latency.uniform(0.001, 0.05),
            ),
            name=name,
            plan=world.faults,
            network=world.network,
            record=world.sent.append,
            clock=loop.time,
        )
        self.store = LeaseStore.create(
            table_name=TABLE,
            worker_id=name,
            timing=TIMING,
            dynamodb=_Paused(self.client, self.awake),  # type: ignore[arg-type]
            clock=SkewedVirtualClock(loop, skew_ms),
        )
        observe_session(self.store.session, world.record_deadline)
        self.config = WorkerConfig(
            table_name=TABLE,
            messages_table_name=TABLE,
            queue_url="",
            upstreams=UPSTREAMS,
            worker_id=name,
            timing=TIMING,
            reconcile_every=RECONCILE_SECONDS,
        )
        self.notices = _Notices(self)
        self.holdings = Holdings(self.config.max_connections)
        self.taker = LeaseTaker(
            self.config,
            self.store,
            _Context(self.notices),  # type: ignore[arg-type]
            self.holdings,
            self._log,
            connection_factory=functools.partial(HeldConnection, self),
        )
        self.heartbeat = Heartbeat(
            self.store.session, TIMING, self.holdings, self._log, self.taker.reconcile_soon
        )
        self.tasks: dict[asyncio.Task[Any], None] = {}  # in the order they were started
        self.crashed = False

    def now(self) -> float:
        return self._loop.time()

    def _log(self, event: str, **fields: Any) -> None:
        details = "".join(f" {name}={value}" for name, value in fields.items())
        self.world.trace(f"{self.name} {event}{details}")

    def start(self) -> None:
        self.spawn(self._run())

    def spawn(self, coroutine: Any, loop_name: str | None = None) -> asyncio.Task[Any]:
        task = self._loop.create_task(coroutine)
        self.tasks[task] = None
        task.add_done_callback(lambda done: self.tasks.pop(done, None))
        if loop_name is not None:
            task.add_done_callback(lambda done: self._ended(loop_name, done))
        return task

    def _ended(self, loop_name: str, task: asyncio.Task[Any]) -> None:
        """A worker loop that ends on its own ends the worker (the coordinator stops it, the
        health check fails): a problem, whatever the lease rows say."""
        if not task.cancelled():
            error = task.exception()
            self.world.loop_failures.append(f"{self.name}: its {loop_name} loop ended: {error!r}")
            self.world.trace(f"{self.name} {loop_name} loop ended: {error!r}")

    def crash(self) -> None:
        """kill -9: nothing of it runs again; what it sent is still on its way."""
        self.crashed = True
        self.client.dead = True
        for task in list(self.tasks):
            task.cancel()
        self.world.trace(f"{self.name} crashed")

    async def pause(self, seconds: float) -> None:
        """SIGSTOP for ``seconds`` (or until an overlapping pause ends): it sends and reads
        nothing; its clocks go on."""
        loop = asyncio.get_running_loop()
        self.paused_until = max(self.paused_until, loop.time() + seconds)
        self.awake.clear()
        self.world.trace(f"{self.name} paused for {seconds:g} s")
        await asyncio.sleep(seconds)
        # An overlapping pause that ends later resumes it, not this one.
        if loop.time() >= self.paused_until and not self.awake.is_set():
            self.world.trace(f"{self.name} resumed")
            self.awake.set()

    async def _run(self) -> None:
        """What ``Worker.run`` does before its loops: open the session, waiting out a store
        that does not answer; then the coordinator's lease-plane loops."""
        heartbeat = TIMING.heartbeat_seconds
        attempt = 0
        while True:
            try:
                await self.store.session.open()
                break
            except StoreUnavailable as exc:
                self.world.trace(f"{self.name} open failed: {type(exc).__name__}")
            await asyncio.sleep(full_jitter(attempt, heartbeat / 4, 2 * heartbeat))
            attempt += 1
        self.world.trace(f"{self.name} opened session {self.store.session.version}")
        self.spawn(self.heartbeat.run(), "heartbeat")
        self.spawn(self.heartbeat.watchdog(), "watchdog")
        self.spawn(self.taker.run(), "reconcile")


class World:
    """One schedule's table, network, holders and records."""

    def __init__(self, schedule: Schedule):
        loop = asyncio.get_running_loop()
        self.schedule = schedule
        self.rng = random.Random(f"{schedule.seed}/holders")
        self.db = FencingWitness(self)
        self.db.create_table(model.LEASE_TABLE, TABLE)
        self.network = VirtualNetwork(loop)
        # Delays, lost-answer waits and late deliveries up to 4 s: past the clients' 2 s read
        # timeout and the renewals' hedge, into the slack between a holder's deadline and the
        # earliest takeover.
        self.faults = RandomFaults(
            random.Random(f"{schedule.seed}/faults"), rate=schedule.fault_rate, max_seconds=4.0
        )
        self.fencing: list[str] = []  # writes applied to a row their sender did not hold
        self.loop_failures: list[str] = []  # worker loops that ended on their own
        self.sent: list[Sent] = []
        self.windows: list[Window] = []
        self.deadlines: dict[tuple[str, int], list[float]] = {}
        self.holders: dict[int, Holder] = {}
        self.holders_by_name: dict[str, Holder] = {}
        self.lines: list[str] = []
        self._loop = loop

    def record_deadline(self, worker: str, version: int | None, value: float) -> None:
        if version is not None and value != float("-inf"):
            self.deadlines.setdefault((worker, version), []).append(value)

    def trace(self, text: str) -> None:
        self.lines.append(f"{self._loop.time():10.3f} {text}")

    def add_holder(self, number: int) -> Holder:
        skew = TIMING.max_clock_skew_ms // 2
        holder = Holder(self, f"h{number}", self.rng.randint(-skew, skew))
        self.holders[number] = holder
        self.holders_by_name[holder.name] = holder
        holder.start()
        return holder

    def close(self) -> None:
        self.db.close()


# --- running and judging ----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    schedule: Schedule
    problems: tuple[str, ...]
    trace: str
    requests: int
    faults: int
    handovers: int  # rows that passed from one holder to another
    from_paused: int  # of them, from a holder that was paused at the time

    @property
    def ok(self) -> bool:
        return not self.problems


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The runtime's own draws (backoff jitter, the finder's shuffle, the taker's reconcile
    jitter and first delay: all from the ``random`` module) and the session version (the wall
    clock in microseconds) from the seed and the virtual clock, for this run only. The worker's
    loops read time only through the store's clock, which is the virtual one."""
    state = random.getstate()
    random.seed(f"{seed}/runtime")
    real_time = sessions_module.time

    class _VirtualTime:
        @staticmethod
        def time_ns() -> int:
            loop = asyncio.get_running_loop()
            return (WALL_BASE_MS + round(loop.time() * 1000)) * 1_000_000

    sessions_module.time = _VirtualTime  # type: ignore[assignment]
    real_uuid4 = uuid.uuid4
    draws = random.Random(f"{seed}/uuid")
    uuid.uuid4 = lambda: uuid.UUID(int=draws.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        uuid.uuid4 = real_uuid4  # type: ignore[assignment]
        sessions_module.time = real_time  # type: ignore[assignment]
        random.setstate(state)


def run_schedule(schedule: Schedule) -> Outcome:
    """Run one schedule to its end on a fresh virtual loop; its outcome and trace."""
    with _seeded(schedule.seed):
        return virtual.run(_run(schedule))


async def _run(schedule: Schedule) -> Outcome:
    world = World(schedule)
    try:
        writer = DesiredStateWriter(
            dynamodb=InProcessClient(world.db),  # type: ignore[arg-type]
            table_name=TABLE,
            clock=SkewedVirtualClock(asyncio.get_running_loop()),
        )
        for number in range(schedule.streams):
            await writer.start(f"s{number}", URL)
        for number in range(schedule.holders):
            world.add_holder(number)
        pauses: list[asyncio.Task[None]] = []
        started = asyncio.get_running_loop().time()
        for event in schedule.events:
            await asyncio.sleep(max(0.0, started + event.at - asyncio.get_running_loop().time()))
            holder = world.holders.get(event.holder)
            if event.kind == "start" and holder is None:
                world.add_holder(event.holder)
            elif holder is not None and not holder.crashed:
                if event.kind == "crash":
                    holder.crash()
                elif event.kind == "pause":
                    pauses.append(asyncio.create_task(holder.pause(event.seconds)))
        world.faults.active = False  # the quiet end: the network heals
        await asyncio.gather(*pauses, return_exceptions=True)
        await asyncio.sleep(schedule.quiet_seconds)
        unheld = [
            f"s{number}"
            for number in range(schedule.streams)
            if not any(
                w.pk == model.connection_pk(f"s{number}")
                and w.stopped is None
                and not world.holders_by_name[w.holder].crashed
                for w in world.windows
            )
        ]
        for holder in world.holders.values():
            if not holder.crashed:
                holder.crash()  # the end of the world, judged as it stands
        problems = (
            tuple(one_owner_problems(world))
            + tuple(world.fencing)
            + tuple(world.loop_failures)
            + tuple(
                f"{stream}: held by no live holder {schedule.quiet_seconds:g} s after the last "
                "fault"
                for stream in unheld
            )
        )
        world.lines += [f"{s.at:10.3f} SENT {s.client} {s.operation} {s.fault}" for s in world.sent]
        world.lines.sort(key=lambda line: float(line.split(maxsplit=1)[0]))
        handovers, from_paused = _handovers(world)
        return Outcome(
            schedule=schedule,
            problems=problems,
            trace="\n".join(world.lines) + "\n",
            requests=len(world.sent),
            faults=sum(world.faults.injected.values()),
            handovers=handovers,
            from_paused=from_paused,
        )
    finally:
        world.close()


class FencingWitness(DynamoDBModel):
    """The store, watching every fenced write it applies to a connection row (one that names
    its sender and lease version): it must land only on that lease, and never move the
    checkpoint back."""

    def __init__(self, world: World):
        super().__init__()
        self._world = world

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        values = params.get("ExpressionAttributeValues", {})
        pk = params.get("Key", {}).get(model.PK, {}).get("S", "")
        fenced = (
            operation == "update_item"
            and ":me" in values
            and pk.startswith(model.connection_pk(""))
            and "ADD #lease_version" not in params.get("UpdateExpression", "")
        )
        if not fenced:
            return super().call(operation, params)
        key = {"TableName": TABLE, "Key": params["Key"]}
        before = super().call("get_item", key).get("Item", {})
        answer = super().call(operation, params)  # raises if its condition failed
        owner = before.get(model.LEASE_OWNER, {}).get("S")
        version = before.get(model.LEASE_VERSION, {}).get("N")
        me, expected = values[":me"].get("S"), values.get(":lease_version", {}).get("N")
        if (owner, version) != (me, expected):
            self._world.fencing.append(
                f"{pk}: a write of {me} (lease {expected}) was applied to the row of {owner} "
                f"(lease {version})"
            )
        after = super().call("get_item", key).get("Item", {})
        old, new = (item.get(model.LAST_SEQ, {}).get("N") for item in (before, after))
        if old is not None and (new is None or int(new) < int(old)):
            self._world.fencing.append(f"{pk}: the checkpoint went from {old} back to {new}")
        return answer


def _handovers(world: World) -> tuple[int, int]:
    """How many times a row passed from one holder to another, and how many of those from a
    holder paused when the next one took it."""
    pauses: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for event in world.schedule.events:
        if event.kind == "pause":
            pauses[f"h{event.holder}"].append((event.at, event.at + event.seconds))
    handovers = from_paused = 0
    by_pk: dict[str, list[Window]] = defaultdict(list)
    for window in world.windows:
        by_pk[window.pk].append(window)
    for windows in by_pk.values():
        windows.sort(key=lambda w: (w.began, w.lease_version))
        for before, after in itertools.pairwise(windows):
            if before.holder != after.holder:
                handovers += 1
                if any(a <= after.began <= b for a, b in pauses[before.holder]):
                    from_paused += 1
    return handovers, from_paused


def _deadline_end(world: World, window: Window) -> float:
    """The last holder's deadline that window's session ever had (see
    :func:`streamfleet_dev.sim.checker._deadline_end` for why the last, not the first)."""
    values = world.deadlines.get((window.holder, window.session_version), [])
    return max(values, default=window.began)


def one_owner_problems(world: World) -> list[str]:
    """A holder whose window on a row began while another holder's could still act on it.

    A window can act until the holder stopped it or until the last holder's deadline of its
    session, whichever came first: the lease code promises to send nothing for a row past that
    deadline (every write is bounded by it), and a taker may claim only a session that expired
    by more than the clock-skew allowance, which the holder's deadline precedes."""
    problems: list[str] = []
    by_pk: dict[str, list[Window]] = defaultdict(list)
    for window in world.windows:
        by_pk[window.pk].append(window)
    for pk, windows in sorted(by_pk.items()):
        windows.sort(key=lambda w: (w.began, w.lease_version))
        previous_end, previous = float("-inf"), None
        for window in windows:
            end = min(
                window.stopped if window.stopped is not None else float("inf"),
                _deadline_end(world, window),
            )
            if end <= window.began:
                # Its deadline had passed when it learnt it held the row (a claim answered
                # after a pause longer than the lease): it could never act on it.
                continue
            if (
                previous is not None
                and previous.holder != window.holder
                and window.began < previous_end
            ):
                problems.append(
                    f"{pk}: {window.holder} (lease {window.lease_version}) held it from "
                    f"{window.began:.3f} while {previous.holder} (lease "
                    f"{previous.lease_version}) could act until {previous_end:.3f}"
                )
            if end > previous_end:
                previous_end, previous = end, window
    return problems
