"""Seeded schedules of operations and faults, and running one against a :class:`World`.

A schedule is a pure function of its seed: which workers start with which clock skew, which
streams are STARTed, and a timeline of operations — START, STOP, kill, SIGTERM-style shutdown,
pause and resume, network-fault windows and DynamoDB outages. ``SIM_SEED=<n>`` replays it.
(The operations and every random draw replay exactly; threads and the servers still decide
interleavings to within milliseconds, as in any real run.)

Running one: the timeline, then the heal (faults off, paused workers resumed, at least two
workers alive), then the checks of :mod:`streamfleet_dev.sim.checker`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from streamfleet_dev.sim.checker import Verdict, check_world
from streamfleet_dev.sim.faults import RandomFaults
from streamfleet_dev.sim.world import SIM_TIMING, SimTiming, World, eventually
from streamfleet_dev.upstream.process import UpstreamProcess

DUMP_ENV = "SIM_DUMP"  # a directory: the full history of every failing schedule is kept there
OPERATIONS = ("start", "stop", "kill", "sigterm", "pause", "faults", "outage")


@dataclass(frozen=True)
class Op:
    at: float  # seconds after the schedule began
    kind: str
    target: int = 0  # a worker or stream number
    seconds: float = 0.0  # how long a pause, a fault window or an outage lasts


@dataclass(frozen=True)
class Schedule:
    seed: int
    workers: int
    streams: int
    skews_ms: tuple[int, ...]
    fault_rate: float
    ops: tuple[Op, ...]
    timing: SimTiming = SIM_TIMING

    @classmethod
    def generate(cls, seed: int, timing: SimTiming = SIM_TIMING) -> Schedule:
        rng = random.Random(seed)
        lease = timing.lease_seconds
        # MAX_CLOCK_SKEW bounds how far two hosts' clocks may disagree: each within half of it.
        skew_ms = round(timing.max_clock_skew_seconds * 1000 / 2)
        workers = rng.randint(2, 4)
        streams = rng.randint(2, 6)
        length = rng.uniform(2.5, 5.0) * lease
        ops: list[Op] = []
        at = rng.uniform(0.1, 0.5) * lease
        while at < length:
            kind = rng.choices(OPERATIONS, weights=(2, 2, 1, 1, 1, 2, 1))[0]
            if kind in ("start", "stop"):
                ops.append(Op(at, kind, rng.randrange(streams)))
            elif kind in ("kill", "sigterm"):
                ops.append(Op(at, kind, rng.randrange(workers)))
            elif kind == "pause":
                ops.append(Op(at, kind, rng.randrange(workers), rng.uniform(0.3, 2.0) * lease))
            else:  # a window of random request faults, or every request failing
                ops.append(Op(at, kind, 0, rng.uniform(0.3, 1.5) * lease))
            at += rng.uniform(0.05, 0.6) * lease
        return cls(
            seed=seed,
            workers=workers,
            streams=streams,
            skews_ms=tuple(rng.randint(-skew_ms, skew_ms) for _ in range(workers + 8)),
            fault_rate=rng.uniform(0.05, 0.3),
            ops=tuple(ops),
            timing=timing,
        )

    def describe(self) -> str:
        kinds = Counter(op.kind for op in self.ops)
        return (
            f"seed {self.seed}: {self.workers} workers, {self.streams} streams, "
            f"fault rate {self.fault_rate:.2f}, ops {dict(kinds)}"
        )


@dataclass
class Outcome:
    """What one schedule did and found."""

    schedule: Schedule
    verdict: Verdict
    ops: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict.ok


class _Runner:
    def __init__(self, schedule: Schedule, upstream: UpstreamProcess, name: str | None = None):
        self.schedule = schedule
        self.rng = random.Random(schedule.seed ^ 0x5EED)
        self.faults = RandomFaults(rng=random.Random(schedule.seed), rate=schedule.fault_rate)
        self.faults.active = False
        self.upstream = upstream
        self.name = name or f"{schedule.seed}"
        self.slots: list[str] = []  # worker number -> current worker id in that slot
        self.started: set[int] = set()
        self.spawned = 0
        self.ops: Counter[str] = Counter()
        self.background: set[asyncio.Task[None]] = set()
        self.exit_seconds: list[float] = []  # SIGTERM -> the worker has exited

    def _new_worker(self, slot: int) -> None:
        self.spawned += 1
        worker_id = f"w{slot}-{self.spawned}"
        skew = self.schedule.skews_ms[self.spawned % len(self.schedule.skews_ms)]
        self.world.start_worker(worker_id, skew_ms=skew, plan=self.faults)
        if slot < len(self.slots):
            self.slots[slot] = worker_id
        else:
            self.slots.append(worker_id)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def run(self) -> Outcome:
        began = time.monotonic()
        schedule = self.schedule
        self.world = world = await asyncio.to_thread(
            World, upstream=self.upstream, timing=schedule.timing, name=self.name
        )
        try:
            for slot in range(schedule.workers):
                self._new_worker(slot)
            # The timeline starts once the fleet is up (its workers hold sessions).
            await eventually(
                lambda: len(world.live_workers()) == schedule.workers, timeout=20, every=0.02
            )
            first = list(range(schedule.streams))
            await asyncio.gather(*(world.start_stream(world.stream(n)) for n in first))
            self.started = set(first)
            t0 = time.monotonic()
            setup = t0 - began
            for op in schedule.ops:
                await asyncio.sleep(max(0.0, t0 + op.at - time.monotonic()))
                await self._apply(op)
            await asyncio.gather(*self.background, return_exceptions=True)
            phases = {"setup": setup, "faults": time.monotonic() - t0}
            mark = time.monotonic()
            await self._heal()
            phases["heal"] = time.monotonic() - mark
            mark = time.monotonic()
            verdict = await check_world(
                world,
                started={world.stream(n) for n in self.started},
                all_streams=[world.stream(n) for n in range(schedule.streams)],
            )
            phases["check"] = time.monotonic() - mark
        finally:
            mark = time.monotonic()
            await asyncio.to_thread(world.dispose)
        phases["dispose"] = time.monotonic() - mark
        verdict.facts["phases"] = {name: round(seconds, 2) for name, seconds in phases.items()}
        verdict.facts["exit_seconds"] = self.exit_seconds
        if not verdict.ok and os.environ.get(DUMP_ENV):
            path = Path(os.environ[DUMP_ENV]) / f"sim-{self.name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(world.history.dump(verdict.problems))
            verdict.facts["history"] = str(path)
        return Outcome(
            schedule, verdict, self.ops, Counter(self.faults.injected), time.monotonic() - began
        )

    async def _apply(self, op: Op) -> None:
        world = self.world
        self.ops[op.kind] += 1
        if op.kind == "start":
            self.started.add(op.target)
            self._spawn(self._quietly(world.start_stream(world.stream(op.target))))
        elif op.kind == "stop":
            self.started.discard(op.target)
            self._spawn(self._quietly(world.stop_stream(world.stream(op.target))))
        elif op.kind in ("kill", "sigterm", "pause"):
            worker = world.workers[self.slots[op.target]]
            if not worker.alive() or worker.frozen() or worker.stopping:
                self.ops[op.kind] -= 1  # nothing to do to it: not counted as injected
                return
            if op.kind == "kill":
                await worker.kill()
                self._new_worker(op.target)
            elif op.kind == "sigterm":
                worker.sigterm()
                self._spawn(self._replace_after_exit(op.target, worker))
            else:
                worker.freeze()
                self._spawn(self._thaw_after(worker, op.seconds))
        elif op.kind == "faults":
            self._spawn(self._window("active", op.seconds))
        elif op.kind == "outage":
            self._spawn(self._window("outage", op.seconds))

    async def _quietly(self, coroutine) -> None:
        # A START or STOP that fails (DynamoDB out) is what a client would see and retry; the
        # schedule's record of what it asked for stays as it is (the checker reads the rows).
        try:
            await coroutine
        except Exception:
            return

    async def _replace_after_exit(self, slot: int, worker) -> None:
        began = time.monotonic()
        await asyncio.to_thread(worker.finished.wait, 30)
        self.exit_seconds.append(round(time.monotonic() - began, 2))
        self._new_worker(slot)

    async def _thaw_after(self, worker, seconds: float) -> None:
        await asyncio.sleep(seconds)
        worker.thaw()

    async def _window(self, what: str, seconds: float) -> None:
        setattr(self.faults, what, True)
        await asyncio.sleep(seconds)
        setattr(self.faults, what, False)

    async def _heal(self) -> None:
        """Every fault over: the network delivers what it held, paused workers wake, and at
        least two workers answer."""
        self.faults.active = self.faults.outage = False
        await asyncio.to_thread(self.world.network.quiesce)
        for worker in self.world.workers.values():
            worker.thaw()
        for slot, worker_id in enumerate(self.slots):
            if not self.world.workers[worker_id].alive():
                self._new_worker(slot)
        await eventually(lambda: len(self.world.live_workers()) >= 2, timeout=20, every=0.02)


async def run_schedule(schedule: Schedule, upstream: UpstreamProcess) -> Outcome:
    """Run one schedule on the local servers the environment points at."""
    return await _Runner(schedule, upstream).run()


def run_seed(seed: int, upstream_url: str) -> Outcome:
    """Run the schedule of ``seed`` on its own event loop, against the upstream at
    ``upstream_url``: what a process of a pool runs (see ``run_many``)."""

    async def run() -> Outcome:
        # Blocking steps (table reads, waiting for late deliveries, disposing of worker
        # threads) run in threads; asyncio's default pool of cpu+4 would queue them.
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=16)
        )
        return await run_schedule(Schedule.generate(seed), UpstreamProcess.attached(upstream_url))

    return asyncio.run(run())
