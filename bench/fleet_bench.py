"""Worker-fleet benchmark: real worker processes, local DynamoDB and SQS, the fake upstream.

Prints a Markdown table of medians beside the targets of the worker-fleet issue (as ratios to
the lease where the target is one) and writes it, with the machine, the date and the load, to
the manual's page ``docs/benchmarks/fleet.md``, with three plots beside it (``failover.png``,
``burst.png``, ``requests.png``).

* failover (lease 2 s, heartbeat 0.5 s): kill -9 and SIGTERM of the busiest of 3 workers holding
  30 live streams, repeated; STOP to closed;
* upkeep (production timing: lease 20 s, heartbeat 5 s, reconcile 10 s): DynamoDB requests
  other than message writes, per connection-minute, over a steady-state minute at 500 idle
  connections on one worker;
* memory: resident memory added per idle upstream connection at 2,000 on one worker, and how
  late its renewals ran.

DynamoDB is dynalite (``BENCH_DYNAMODB=moto`` for moto), SQS is moto's server.
Usage: ``make bench`` or ``python -m bench.fleet_bench [--trials 7] [--idle 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfleet_dev import pages
from streamfleet_dev.emulator.servers import (
    LOCAL_AWS_ENV,
    LocalServer,
    dynalite_server,
    moto_server,
)
from streamfleet_dev.local.fleet import HEARTBEAT_SECONDS, LEASE_SECONDS, Fleet, eventually
from streamfleet_dev.upstream.fake import FakeUpstream

PRODUCTION_TIMING = {
    "LEASE_SECONDS": "20",
    "HEARTBEAT_EVERY": "5",
    "RECONCILE_EVERY": "10",
    "STOP_CHECK_EVERY": "5",
    "MAX_CLOCK_SKEW_SECONDS": "1",
    "SAFETY_MARGIN_SECONDS": "0.5",
    "SQS_WAIT_SECONDS": "10",
    "METRICS_EVERY": "5",
    # The worker's default: without it the harness's fast 0.2 s would checkpoint every message
    # of an active stream (the lease bench's upkeep of active streams measures exactly this).
    "CHECKPOINT_EVERY": "300",
}
RESULTS = pages.PAGES / "fleet.md"
PLOTS = {name: pages.PAGES / f"{name}.png" for name in ("failover", "burst", "requests")}
OUTPUTS = (RESULTS, *PLOTS.values())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def busiest(fleet: Fleet):
    owners = fleet.owners()
    workers = [w for w in fleet.workers.values() if w.alive()]
    victim = max(workers, key=lambda w: sum(o == w.worker_id for o in owners.values()))
    return victim, {w.worker_id for w in workers if w is not victim}


async def failover_trial(fleet: Fleet, streams: list[str], signum: int) -> float:
    """Signal the busiest worker; seconds until all its streams are live on the others."""
    victim, survivors = busiest(fleet)
    started = time.monotonic()
    victim.signal(signum)
    await eventually(
        lambda: fleet.all_live(streams, among=survivors),
        timeout=10 * LEASE_SECONDS,
        what="streams live elsewhere",
        every=0.02,
    )
    elapsed = time.monotonic() - started
    victim.stop()
    fleet.start_worker(f"{victim.worker_id}-r{len(fleet.workers)}")
    await asyncio.sleep(3 * HEARTBEAT_SECONDS)  # let the new worker join before the next trial
    return elapsed


async def stop_trial(fleet: Fleet, stream_id: str) -> float:
    started = time.monotonic()
    await fleet.stop_stream(stream_id)
    await eventually(
        lambda: fleet.upstream.stats()["connected"].get(stream_id) == 0,
        timeout=10,
        what="stream closed",
        every=0.01,
    )
    return time.monotonic() - started


async def failover(fleet: Fleet, trials: int) -> dict[str, list[float]]:
    streams = [f"s{n:03d}" for n in range(30)]
    for _ in range(3):
        fleet.start_worker()
    await fleet.start_streams(*streams)
    await eventually(lambda: fleet.all_live(streams), timeout=60, what="all streams live")
    crash = [await failover_trial(fleet, streams, signal.SIGKILL) for _ in range(trials)]
    term = [await failover_trial(fleet, streams, signal.SIGTERM) for _ in range(trials)]
    stops = [await stop_trial(fleet, sid) for sid in streams[:trials]]
    fleet.assert_single_client_ever()
    return {"crash": crash, "term": term, "stop": stops}


async def steady_state(fleet: Fleet, name: str, connections: int, window: float) -> dict:
    """One worker with ``connections`` idle streams; its request deltas over ``window`` s."""
    # Headroom as in production (target 700, max 1000): a full worker would not poll SQS.
    headroom = str(connections * 2)
    worker = fleet.start_worker(name, MAX_CONNECTIONS=headroom, **PRODUCTION_TIMING)
    await eventually(lambda: worker.events("session_opened"), timeout=30, what="worker up")
    rss_before = rss_kib(worker.process.pid)
    ids = [f"{name}{n:04d}" for n in range(connections)]
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=300, what=f"{name} live", every=1)
    await asyncio.sleep(float(PRODUCTION_TIMING["METRICS_EVERY"]) + 1)  # past the claim burst
    first = worker.events("worker_stats")[-1]
    await asyncio.sleep(window)  # the measurement window itself, not synchronisation
    last = worker.events("worker_stats")[-1]
    minutes = (last["ts"] - first["ts"]) / 60
    upkeep = sum(
        n - first["dynamodb_requests"].get(op, 0)
        for op, n in last["dynamodb_requests"].items()
        if op != "batch_write_item"
    )
    sqs = sum(n - first["sqs_requests"].get(op, 0) for op, n in last["sqs_requests"].items())
    per_op = {
        op: round((n - first["dynamodb_requests"].get(op, 0)) / (connections * minutes), 4)
        for op, n in last["dynamodb_requests"].items()
        if op != "batch_write_item"
    }
    result = {
        "per_operation": per_op,
        "upkeep_per_connection_minute": upkeep / (connections * minutes),
        "sqs_per_connection_minute": sqs / (connections * minutes),
        "kib_per_connection": (rss_kib(worker.process.pid) - rss_before) / connections,
        "rss_mib": rss_kib(worker.process.pid) / 1024,
        "lateness_ms": last["renewal_lateness_max_ms"],
    }
    for stream_id in ids:  # leave nothing running for the next scenario
        await fleet.stop_stream(stream_id)
    worker.signal(signal.SIGTERM)
    worker.process.wait(60)
    return result


async def burst(fleet: Fleet, streams: int) -> list[float]:
    """START ``streams`` at once on 3 workers; seconds from each START to its upstream client."""
    workers = [fleet.start_worker(MAX_CONNECTIONS=str(streams)) for _ in range(3)]
    for worker in workers:
        await eventually(lambda w=worker: w.events("session_opened"), timeout=30, what="up")
    ids = [f"b{streams}-{n:04d}" for n in range(streams)]
    started: dict[str, float] = {}
    connected: dict[str, float] = {}
    limit = asyncio.Semaphore(16)

    async def start(stream_id: str) -> None:
        async with limit:
            started[stream_id] = time.monotonic()
            await fleet.control.start(stream_id, fleet.upstream.url_for(stream_id))

    starting = asyncio.gather(*(start(sid) for sid in ids))

    def all_connected() -> bool:
        now, counts = time.monotonic(), fleet.upstream.stats()["connections"]
        for sid in ids:
            if sid not in connected and counts.get(sid, 0) > 0:
                connected[sid] = now
        return len(connected) == len(ids)

    await eventually(all_connected, timeout=120, what=f"{streams} connected", every=0.02)
    await starting
    for sid in ids:
        await fleet.stop_stream(sid)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        worker.process.wait(60)
    return [connected[sid] - started[sid] for sid in ids]


async def throughput(fleet: Fleet, streams: int, seconds: float) -> float:
    """Messages persisted per second by one worker holding ``streams`` busy streams."""
    worker = fleet.start_worker("busy", MAX_CONNECTIONS=str(streams), METRICS_EVERY="1")
    ids = [f"t{n:03d}" for n in range(streams)]
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=60, what="busy streams live")
    await asyncio.sleep(2)  # past the start, into the steady state
    first = worker.events("worker_stats")[-1]
    await asyncio.sleep(seconds)  # the measurement window itself
    last = worker.events("worker_stats")[-1]
    for sid in ids:
        await fleet.stop_stream(sid)
    worker.signal(signal.SIGTERM)
    worker.process.wait(60)
    return (last["messages_stored"] - first["messages_stored"]) / (last["ts"] - first["ts"])


async def run(trials: int, idle: int, upkeep_connections: int, window: float) -> str:
    os.environ.update(LOCAL_AWS_ENV)
    conditions = {
        "date": pages.now(),
        "commit": pages.commit(),
        "machine": pages.machine(),
        "load_at_start": pages.load(),
    }
    servers: list[LocalServer] = []
    kind = os.environ.get("BENCH_DYNAMODB", "dynalite")
    # BENCH_LOGS=<dir> keeps the workers' logs for a look afterwards.
    keep = os.environ.get("BENCH_LOGS")
    with contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory() as tmp:
        try:
            sqs = moto_server(Path(tmp) / "moto.log").start()
            servers.append(sqs)
            dynamo = sqs
            if kind == "dynalite":
                dynamo = dynalite_server(Path(tmp) / "dynalite.log").start()
                servers.append(dynamo)
            os.environ["AWS_ENDPOINT_URL_SQS"] = sqs.endpoint
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = dynamo.endpoint
            async with FakeUpstream(rate=20) as upstream:
                fleet = Fleet(endpoint=dynamo.endpoint, upstream=upstream, tmp=Path(tmp))
                try:
                    times = await failover(fleet, trials)
                finally:
                    fleet.close()
            async with FakeUpstream(rate=0.001) as quiet:
                fleet = Fleet(endpoint=dynamo.endpoint, upstream=quiet, tmp=Path(tmp))
                try:
                    bursts = {n: await burst(fleet, n) for n in (100, 1000)}
                    upkeep = await steady_state(fleet, "upkeep", upkeep_connections, window)
                    memory = await steady_state(fleet, "idle", idle, 15)
                finally:
                    fleet.close()
            async with FakeUpstream(rate=50) as busy:
                fleet = Fleet(endpoint=dynamo.endpoint, upstream=busy, tmp=Path(tmp))
                try:
                    persisted = await throughput(fleet, 100, 10)
                finally:
                    fleet.close()
        finally:
            for server in servers:
                server.stop()
    conditions["load_at_end"] = pages.load()
    figures = Figures(trials, kind, times, bursts, upkeep, memory, persisted, conditions)
    plot(figures)
    return report(figures, upkeep_connections, idle)


@dataclass(frozen=True)
class Figures:
    """Everything one run measured."""

    trials: int
    dynamodb: str
    times: dict[str, list[float]]
    bursts: dict[int, list[float]]
    upkeep: dict[str, Any]
    memory: dict[str, float]
    persisted_per_second: float
    conditions: dict[str, Any]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def plot(figures: Figures) -> None:
    """PNG plots beside the results: failover distributions, burst latency, request costs."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    times = figures.times
    fig, axes = pyplot.subplots(1, 3, figsize=(12, 4))
    axes[0].boxplot([[t / LEASE_SECONDS for t in times["crash"]]], tick_labels=["kill -9"])
    axes[0].axhline(1.2, color="red", linestyle="--", label="target 1.2 x lease")
    axes[0].set_ylabel("recovery / lease")
    axes[0].legend()
    axes[1].boxplot([times["term"]], tick_labels=["SIGTERM"])
    axes[1].axhline(1.0, color="red", linestyle="--", label="target 1 s")
    axes[1].set_ylabel("handoff, s")
    axes[1].legend()
    axes[2].boxplot([[t / HEARTBEAT_SECONDS for t in times["stop"]]], tick_labels=["STOP"])
    axes[2].axhline(1.0, color="red", linestyle="--", label="target 1 heartbeat")
    axes[2].set_ylabel("STOP to closed / heartbeat")
    axes[2].legend()
    for axis in axes:
        axis.set_ylim(bottom=0)
    fig.suptitle(f"failover over {figures.trials} trials (lease {LEASE_SECONDS} s)")
    fig.tight_layout()
    fig.savefig(PLOTS["failover"], dpi=90)
    pyplot.close(fig)

    fig, axis = pyplot.subplots(figsize=(6, 4))
    for streams, latencies in figures.bursts.items():
        ordered = sorted(latencies)
        axis.plot(ordered, [(n + 1) / len(ordered) for n in range(len(ordered))], label=streams)
    axis.set_xlabel("START to connected, s")
    axis.set_ylabel("fraction of streams")
    axis.set_title("START burst on 3 workers")
    axis.legend(title="streams")
    fig.tight_layout()
    fig.savefig(PLOTS["burst"], dpi=90)
    pyplot.close(fig)

    fig, axis = pyplot.subplots(figsize=(6, 4))
    labels = ["DynamoDB (lease upkeep)", "SQS"]
    values = [
        figures.upkeep["upkeep_per_connection_minute"],
        figures.upkeep["sqs_per_connection_minute"],
    ]
    axis.bar(labels, values)
    axis.axhline(0.1, color="red", linestyle="--", label="DynamoDB target 0.1")
    axis.set_ylabel("requests per connection-minute")
    axis.set_title("steady state, 500 idle connections, heartbeat 5 s")
    axis.legend()
    fig.tight_layout()
    fig.savefig(PLOTS["requests"], dpi=90)
    pyplot.close(fig)


def report(figures: Figures, upkeep_connections: int, idle: int) -> str:
    median = statistics.median
    crash, term, stop = (figures.times[k] for k in ("crash", "term", "stop"))
    upkeep, memory = figures.upkeep, figures.memory
    rows = [
        *(
            (
                f"START burst of {streams} on 3 workers: START → connected",
                f"p50 {percentile(lat, 0.5) * 1000:.0f} ms, "
                f"p99 {percentile(lat, 0.99) * 1000:.0f} ms",
                "(no target; a burst is served in parallel, not one message at a time)",
            )
            for streams, lat in figures.bursts.items()
        ),
        (
            "crash recovery: kill -9 → all its streams live elsewhere",
            f"{median(crash) / LEASE_SECONDS:.2f} x lease ({median(crash):.2f} s; "
            f"max {max(crash) / LEASE_SECONDS:.2f} x)",
            "≤ 1.2 x lease",
        ),
        (
            "SIGTERM handoff: signal → all its streams live elsewhere",
            f"{median(term) * 1000:.0f} ms (max {max(term) * 1000:.0f} ms)",
            "≤ 1 s",
        ),
        (
            "STOP → upstream closed",
            f"{median(stop) / HEARTBEAT_SECONDS:.2f} x heartbeat ({median(stop) * 1000:.0f} ms)",
            "≤ 1 heartbeat",
        ),
        (
            f"lease-upkeep DynamoDB requests per connection-minute, {upkeep_connections} "
            "connections on one worker, heartbeat 5 s",
            f"{upkeep['upkeep_per_connection_minute']:.3f}",
            "≤ 0.1",
        ),
        (
            "SQS requests per connection-minute, same worker",
            f"{upkeep['sqs_per_connection_minute']:.3f}",
            "(long polls; no target)",
        ),
        (
            "messages persisted per second, one worker, 100 streams at 50 msg/s",
            f"{figures.persisted_per_second:.0f}",
            "(5,000 offered: the figure is the saturation point here)",
        ),
        (
            f"memory per idle upstream connection, {idle} on one worker",
            f"{memory['kib_per_connection']:.1f} KiB (worker RSS {memory['rss_mib']:.0f} MiB)",
            "< 50 KB",
        ),
        (
            f"renewal lateness (max), {idle} connections",
            f"{memory['lateness_ms']:.0f} ms",
            "never late (≪ lease)",
        ),
    ]
    conditions = figures.conditions
    lines = [
        "# Benchmark: the fleet",
        "",
        pages.banner("fleet_bench", "the-fleet"),
        "",
        f"Run of {conditions['date']} at commit {conditions['commit']}. Machine: "
        f"{conditions['machine']}; load average at the "
        f"start {conditions['load_at_start']}, at the end {conditions['load_at_end']}. "
        f"DynamoDB: {figures.dynamodb}, SQS: moto server; {figures.trials} failover trials.",
        "",
        "| measure | median / figure | target |",
        "|---|---|---|",
        *(f"| {name} | {value} | {target} |" for name, value, target in rows),
        "",
        "Lease-upkeep requests per connection-minute by operation: "
        + ", ".join(f"{op} {n}" for op, n in sorted(upkeep["per_operation"].items())),
        "",
        " ".join(f"![{name}]({path.name})" for name, path in PLOTS.items()),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="worker-fleet benchmark")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--upkeep-connections", type=int, default=500)
    parser.add_argument("--window", type=float, default=60.0, help="upkeep window, seconds")
    args = parser.parse_args()
    table = asyncio.run(run(args.trials, args.idle, args.upkeep_connections, args.window))
    RESULTS.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
