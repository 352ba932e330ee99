"""Worker-fleet benchmark: real worker processes, local DynamoDB and SQS, the fake upstream.

Prints a Markdown table of medians beside the targets of the worker-fleet issue (as ratios to
the lease where the target is one) and writes it to ``bench/fleet_results.md``.

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
import platform
import signal
import statistics
import tempfile
import time
from pathlib import Path

from streamfleet.local.fleet import HEARTBEAT_SECONDS, LEASE_SECONDS, Fleet, eventually
from streamfleet.local.servers import LocalServer, dynalite_server, moto_server
from streamfleet.upstream.fake import FakeUpstream

LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
PRODUCTION_TIMING = {
    "LEASE_SECONDS": "20",
    "HEARTBEAT_EVERY": "5",
    "RECONCILE_EVERY": "10",
    "STOP_CHECK_EVERY": "5",
    "MAX_CLOCK_SKEW_SECONDS": "1",
    "SAFETY_MARGIN_SECONDS": "0.5",
    "CHECKPOINT_EVERY": "1",
    "SQS_WAIT_SECONDS": "10",
    "METRICS_EVERY": "5",
}
RESULTS = Path(__file__).with_name("fleet_results.md")


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
    worker = fleet.start_worker(name, MAX_CONNECTIONS=str(connections), **PRODUCTION_TIMING)
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
    result = {
        "upkeep_per_connection_minute": upkeep / (connections * minutes),
        "kib_per_connection": (rss_kib(worker.process.pid) - rss_before) / connections,
        "rss_mib": rss_kib(worker.process.pid) / 1024,
        "lateness_ms": last["renewal_lateness_max_ms"],
    }
    for stream_id in ids:  # leave nothing running for the next scenario
        await fleet.stop_stream(stream_id)
    worker.signal(signal.SIGTERM)
    worker.process.wait(60)
    return result


async def run(trials: int, idle: int, upkeep_connections: int, window: float) -> str:
    os.environ.update(LOCAL_AWS_ENV)
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
            async with FakeUpstream(rate=20, keepalive_seconds=0.3) as upstream:
                fleet = Fleet(endpoint=dynamo.endpoint, upstream=upstream, tmp=Path(tmp))
                try:
                    times = await failover(fleet, trials)
                finally:
                    fleet.close()
            async with FakeUpstream(rate=0.001) as quiet:
                fleet = Fleet(endpoint=dynamo.endpoint, upstream=quiet, tmp=Path(tmp))
                try:
                    upkeep = await steady_state(fleet, "upkeep", upkeep_connections, window)
                    memory = await steady_state(fleet, "idle", idle, 15)
                finally:
                    fleet.close()
        finally:
            for server in servers:
                server.stop()
    return report(trials, kind, times, upkeep, memory, upkeep_connections, idle)


def report(trials, kind, times, upkeep, memory, upkeep_connections, idle) -> str:
    median = statistics.median
    crash, term, stop = times["crash"], times["term"], times["stop"]
    rows = [
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
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; DynamoDB: {kind}, SQS: moto server; {trials} trials.",
        "",
        "| measure | median | target |",
        "|---|---|---|",
        *(f"| {name} | {value} | {target} |" for name, value, target in rows),
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
