"""Chaos against a real local fleet: kill -9, SIGTERM, SIGSTOP past the lease, restarts,
STOP/START churn and DynamoDB outages, then proof that nothing was lost or doubled.

``python -m streamfleet_dev.local.chaos --duration 180`` is the soak (``make chaos``); the test
suite runs a short one. It prints what it injected and what it checked, and exits non-zero if a
check failed. The seed (``--seed`` or ``CHAOS_SEED``) makes a run repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from streamfleet import model
from streamfleet_dev.emulator.servers import (
    LOCAL_AWS_ENV,
    LocalServer,
    dynalite_server,
    moto_server,
)
from streamfleet_dev.upstream.process import UpstreamProcess

from .fleet import LEASE_SECONDS, Fleet, WorkerProcess, eventually

FAULTS = ("kill9", "sigterm", "pause", "churn", "dynamodb_outage")
# Hostile modes that let a stream flow (oversize and close park it, which recovery would flag).
HOSTILE_CHAOS_MODES = frozenset({"poison", "gap"})


@dataclass(frozen=True)
class ChaosPlan:
    """How hard to shake the fleet."""

    workers: int = 4
    streams: int = 24
    duration_seconds: float = 20.0
    fault_every_seconds: tuple[float, float] = (0.8, 2.0)
    pause_seconds: float = LEASE_SECONDS * 1.5  # longer than the lease, as the issue asks
    # Outages from half a lease to one and a half: some end inside the holder's window, some
    # outlast it (every connection closes, sessions reopen once DynamoDB is back).
    outage_seconds: tuple[float, float] = (LEASE_SECONDS * 0.5, LEASE_SECONDS * 1.5)
    recovery_bound_seconds: float = LEASE_SECONDS * 4
    seed: int = 0
    # Streams whose upstream sends poison frames and leaves gaps (fake.HOSTILE_MODES): each is
    # checked against what a correct worker stores of it, and the others must not notice.
    hostile_streams: int = 0

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError("workers: at least 2, so someone is left to take over")
        if self.streams < 1 or self.duration_seconds <= 0:
            raise ValueError("streams and duration_seconds: must be positive")
        if not 0 <= self.hostile_streams <= self.streams:
            raise ValueError("hostile_streams: between 0 and streams")


@dataclass
class ChaosReport:
    """What was injected and what was checked."""

    seed: int
    injected: Counter[str] = field(default_factory=Counter)
    checks: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks[name] = ("ok: " if ok else "FAILED: ") + detail
        if not ok:
            self.failures.append(f"{name}: {detail}")

    def summary(self) -> str:
        lines = [f"chaos run, seed {self.seed}", "injected:"]
        lines += [f"  {fault:16} {self.injected[fault]}" for fault in (*FAULTS, "restart")]
        lines.append("checked:")
        lines += [f"  {name:28} {result}" for name, result in self.checks.items()]
        return "\n".join(lines)


class Chaos:
    """Drives faults into a :class:`Fleet` whose DynamoDB is ``dynamodb`` (restartable)."""

    def __init__(self, fleet: Fleet, dynamodb: LocalServer, plan: ChaosPlan):
        self.fleet = fleet
        self.dynamodb = dynamodb
        self.plan = plan
        self.random = random.Random(plan.seed)
        self.report = ChaosReport(seed=plan.seed)
        self.stream_ids = [f"c{n:03d}" for n in range(plan.streams)]
        fleet.hostile.update(
            {sid: HOSTILE_CHAOS_MODES for sid in self.stream_ids[: plan.hostile_streams]}
        )
        self.started: set[str] = set()
        self.paused: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()

    def alive(self) -> list[WorkerProcess]:
        return [
            w for w in self.fleet.workers.values() if w.alive() and w.worker_id not in self.paused
        ]

    async def run(self) -> ChaosReport:
        for _ in range(self.plan.workers):
            self.fleet.start_worker(self._new_id())
        await self.fleet.start_streams(*self.stream_ids)
        self.started = set(self.stream_ids)
        await eventually(
            lambda: self.fleet.all_live(self.stream_ids), timeout=30, what="all streams live"
        )
        deadline = time.monotonic() + self.plan.duration_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(self.random.uniform(*self.plan.fault_every_seconds))
            await self._inject(self.random.choice(FAULTS))
        await asyncio.gather(*self._background)  # pauses end, outages heal
        await self._verify()
        return self.report

    def _new_id(self) -> str:
        return f"cw{len(self.fleet.workers) + 1}"

    def _victim(self) -> WorkerProcess | None:
        # Keep two workers answering, so someone can always take over.
        candidates = self.alive()
        return self.random.choice(candidates) if len(candidates) > 2 else None

    async def _inject(self, fault: str) -> None:
        if fault == "churn":
            await self._churn()
        elif fault == "dynamodb_outage":
            if any(t for t in self._background if t.get_name() == "outage"):
                return  # one at a time: not injected, not counted
            self._spawn(self._outage(), "outage")
        else:
            victim = self._victim()
            if victim is None:
                return
            if fault == "pause":
                self._spawn(self._pause(victim), "pause")
            else:
                victim.signal(signal.SIGKILL if fault == "kill9" else signal.SIGTERM)
                self._spawn(self._restart_after_exit(victim), "restart")
        self.report.injected[fault] += 1

    def _spawn(self, coroutine, name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _pause(self, victim: WorkerProcess) -> None:
        self.paused.add(victim.worker_id)
        victim.signal(signal.SIGSTOP)
        await asyncio.sleep(self.plan.pause_seconds)  # the fault itself: a frozen process
        victim.signal(signal.SIGCONT)
        self.paused.discard(victim.worker_id)

    async def _restart_after_exit(self, victim: WorkerProcess) -> None:
        await asyncio.to_thread(victim.process.wait, 30)
        self.fleet.start_worker(self._new_id())
        self.report.injected["restart"] += 1

    async def _outage(self) -> None:
        await asyncio.to_thread(self.dynamodb.stop)
        await asyncio.sleep(self.random.uniform(*self.plan.outage_seconds))  # no DynamoDB
        await asyncio.to_thread(self.dynamodb.start)

    async def _churn(self) -> None:
        stream_id = self.random.choice(self.stream_ids)
        with contextlib.suppress(Exception):  # the DynamoDB server may be down right now
            if stream_id in self.started:
                await self.fleet.stop_stream(stream_id)
                self.started.discard(stream_id)
            else:
                await self.fleet.start_streams(stream_id)
                self.started.add(stream_id)

    async def _verify(self) -> None:
        fleet, report = self.fleet, self.report
        started, stopped = sorted(self.started), sorted(set(self.stream_ids) - self.started)
        began = time.monotonic()
        try:
            await eventually(
                lambda: (
                    fleet.all_live(started)
                    and all(fleet.owners().get(sid) is None for sid in stopped)
                    and all(fleet.upstream.stats()["connected"].get(sid, 0) == 0 for sid in stopped)
                ),
                timeout=self.plan.recovery_bound_seconds,
                what="every STARTED stream live and every STOPPED one closed",
            )
            report.check(
                "recovery",
                True,
                f"{len(started)} STARTED owned and connected, {len(stopped)} STOPPED closed, "
                f"{time.monotonic() - began:.1f} s after the last fault "
                f"(bound {self.plan.recovery_bound_seconds:.0f} s)",
            )
        except AssertionError as exc:
            owners, connected = fleet.owners(), fleet.upstream.stats()["connected"]
            stuck = {
                sid: (owners.get(sid), connected.get(sid, 0))
                for sid in self.stream_ids
                if (sid in self.started)
                != (owners.get(sid) is not None and connected.get(sid) == 1)
            }
            report.check("recovery", False, f"{exc}; (owner, clients) of the stuck: {stuck}")
        stats = fleet.upstream.stats()
        doubled = {sid: n for sid, n in stats["max_concurrent"].items() if n > 1}
        report.check(
            "one client per stream epoch",
            not doubled and not any(stats["overlaps"].values()),
            f"max concurrent clients per stream {max(stats['max_concurrent'].values())}"
            + (f", doubled: {doubled}" if doubled else ""),
        )
        # Exactly once from the origin, checked once every stream is stopped and sealed: a
        # live stream may still be replaying over a predecessor's unsealed tail.
        for sid in started:
            await fleet.stop_stream(sid)
        try:
            await eventually(
                lambda: all(
                    model.LEASE_OWNER not in row
                    and model.UNSEALED not in row
                    and model.AWAITING_OWNER not in row
                    for row in fleet.rows().values()
                ),
                timeout=self.plan.recovery_bound_seconds,
                what="every stream stopped, released and sealed",
            )
        except AssertionError as exc:
            report.check("stopped and sealed", False, str(exc))
        problems = fleet.log_problems(self.stream_ids, final=True)
        total = sum(len(fleet.stored_seqs(sid)) for sid in self.stream_ids)
        report.check(
            "exactly once from the origin",
            not problems,
            f"{total} messages over {len(self.stream_ids)} streams, each exactly origin+1..last "
            f"with the upstream's content ({self.plan.hostile_streams} hostile: less its poison "
            "and gaps)" + (f"; {problems[:6]}" if problems else ""),
        )
        upstream_gaps = {sid: n for sid, n in stats["gaps"].items() if n}
        report.check(
            "resumes within replay",
            not upstream_gaps,
            "every resume found its position in the upstream's replay buffer"
            if not upstream_gaps
            else f"resumes older than the buffer: {upstream_gaps}",
        )


async def run_chaos(plan: ChaosPlan, workdir: Path) -> ChaosReport:
    """Start the local servers and the upstream, run the plan, stop everything."""
    os.environ.update(LOCAL_AWS_ENV)
    sqs = moto_server(workdir / "moto.log").start()
    data = workdir / "dynalite-data"
    data.mkdir(exist_ok=True)
    dynamodb = dynalite_server(workdir / "dynalite.log", data_dir=data).start()
    os.environ["AWS_ENDPOINT_URL_SQS"] = sqs.endpoint
    os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb.endpoint
    try:
        # The upstream's own keepalive stays at its default (20 s): a paused worker is kept
        # from receiving by the epoch its successor dials with, not by a short keepalive.
        with UpstreamProcess(rate=10, log_path=workdir / "upstream.log") as upstream:
            fleet = Fleet(endpoint=dynamodb.endpoint, upstream=upstream, tmp=workdir)
            try:
                return await Chaos(fleet, dynamodb, plan).run()
            finally:
                for worker in fleet.workers.values():
                    with contextlib.suppress(ProcessLookupError):
                        worker.signal(signal.SIGCONT)
                fleet.close()
    finally:
        dynamodb.stop()
        sqs.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of faults")
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "0")) or None)
    parser.add_argument(
        "--hostile", type=int, default=0, help="streams whose upstream sends poison and gaps"
    )
    args = parser.parse_args(argv)
    seed = args.seed or random.randrange(1, 10**6)
    plan = ChaosPlan(
        workers=args.workers,
        streams=args.streams,
        duration_seconds=args.duration,
        seed=seed,
        hostile_streams=args.hostile,
    )
    keep = os.environ.get("CHAOS_LOGS")  # a directory to keep the workers' logs in
    with contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(run_chaos(plan, Path(tmp)))
    print(report.summary())
    print(json.dumps({"failures": report.failures}))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
