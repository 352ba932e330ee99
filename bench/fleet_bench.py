"""Worker-fleet benchmark: real worker processes on moto's server and the fake upstream.

Prints a Markdown table of medians beside the targets of the worker-fleet issue, as ratios to the
lease where the target is one. Usage: ``make bench-fleet`` (or ``python -m bench.fleet_bench
--trials 5 --idle 2000``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from streamfleet.local.fleet import LEASE_SECONDS, Fleet, eventually
from streamfleet.local.servers import moto_server
from streamfleet.upstream.fake import FakeUpstream

LOCAL_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def live_fleet(fleet: Fleet, workers: int, streams: list[str]) -> None:
    for _ in range(workers):
        fleet.start_worker()
    await fleet.start_streams(*streams)
    await eventually(lambda: fleet.all_live(streams), timeout=60, what="all streams live")


def busiest(fleet: Fleet):
    owners = fleet.owners()
    workers = [w for w in fleet.workers.values() if w.alive()]
    victim = max(workers, key=lambda w: sum(o == w.worker_id for o in owners.values()))
    return victim, {w.worker_id for w in workers if w is not victim}


async def failover_trial(fleet: Fleet, streams: list[str], signum: int) -> float:
    victim, survivors = busiest(fleet)
    started = time.monotonic()
    victim.signal(signum)
    await eventually(
        lambda: fleet.all_live(streams, among=survivors),
        timeout=10 * LEASE_SECONDS,
        every=0.05,
        what="streams live elsewhere",
    )
    elapsed = time.monotonic() - started
    print(f"{signal.Signals(signum).name}: {elapsed:.2f} s", flush=True)
    victim.stop()
    fleet.start_worker(f"{victim.worker_id}-r{len(fleet.workers)}")
    return elapsed


async def stop_trial(fleet: Fleet, stream_id: str) -> float:
    started = time.monotonic()
    await fleet.stop_stream(stream_id)
    await eventually(
        lambda: fleet.upstream.stats()["connected"].get(stream_id) == 0,
        timeout=10,
        what="stream closed",
        every=0.02,
    )
    return time.monotonic() - started


async def upkeep_per_connection_minute(fleet: Fleet, connections: int, seconds: float) -> float:
    """Lease-upkeep requests (everything but message writes) per connection-minute, one worker."""
    worker = fleet.start_worker("upkeep", MAX_CONNECTIONS=str(connections), RECONCILE_EVERY="2")
    ids = [f"u{n:04d}" for n in range(connections)]
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=120, what="upkeep streams live")
    marker = len(worker.events("worker_stopped"))
    started = time.monotonic()
    await asyncio.sleep(seconds)  # the measurement window itself, not synchronisation
    worker.signal(signal.SIGTERM)
    worker.process.wait(30)
    minutes = (time.monotonic() - started) / 60
    counts = worker.events("worker_stopped")[marker]["dynamodb_requests"]
    upkeep = sum(n for op, n in counts.items() if op != "batch_write_item")
    return upkeep / (connections * minutes)


async def idle_memory(fleet: Fleet, connections: int) -> tuple[float, int]:
    worker = fleet.start_worker("idle", MAX_CONNECTIONS=str(connections))
    await eventually(lambda: worker.events("session_opened"), timeout=20, what="worker up")
    before = rss_kib(worker.process.pid)
    ids = [f"i{n:04d}" for n in range(connections)]
    await fleet.start_streams(*ids)
    await eventually(lambda: fleet.all_live(ids), timeout=300, what="idle streams live", every=1)
    after = rss_kib(worker.process.pid)
    return (after - before) / connections, after


async def main(trials: int, idle: int, upkeep_connections: int) -> None:
    os.environ.update(LOCAL_AWS_ENV)
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        server = moto_server().start()
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = os.environ["AWS_ENDPOINT_URL_SQS"] = (
            server.endpoint
        )
        try:
            async with FakeUpstream(rate=20, keepalive_seconds=0.3) as upstream:
                fleet = Fleet(endpoint=server.endpoint, upstream=upstream, tmp=Path(tmp))
                try:
                    streams = [f"s{n:03d}" for n in range(30)]
                    await live_fleet(fleet, 3, streams)
                    crash = [
                        await failover_trial(fleet, streams, signal.SIGKILL) for _ in range(trials)
                    ]
                    term = [
                        await failover_trial(fleet, streams, signal.SIGTERM) for _ in range(trials)
                    ]
                    stops = [await stop_trial(fleet, sid) for sid in streams[:trials]]
                    fleet.assert_single_client_ever()
                finally:
                    fleet.close()
            async with FakeUpstream(rate=0.001) as quiet:
                fleet = Fleet(endpoint=server.endpoint, upstream=quiet, tmp=Path(tmp))
                try:
                    upkeep = await upkeep_per_connection_minute(fleet, upkeep_connections, 60)
                    per_conn_kib, total_kib = await idle_memory(fleet, idle)
                finally:
                    fleet.close()
        finally:
            server.stop()
    median = statistics.median
    results = {
        "crash recovery (kill -9 → all its streams live elsewhere)": (
            f"{median(crash):.2f} s = {median(crash) / LEASE_SECONDS:.2f} x lease "
            f"(max {max(crash) / LEASE_SECONDS:.2f})",
            "≤ 1.2 x lease",
        ),
        "SIGTERM handoff (signal → all its streams live elsewhere)": (
            f"{median(term) * 1000:.0f} ms (max {max(term) * 1000:.0f} ms)",
            "≤ 1 s",
        ),
        "STOP → upstream closed": (
            f"{median(stops) * 1000:.0f} ms = {median(stops) / 0.5:.2f} x heartbeat",
            "≤ 1 heartbeat",
        ),
        f"lease-upkeep DynamoDB requests per connection-minute ({upkeep_connections} conns)": (
            f"{upkeep:.3f}",
            "≤ 0.1 at 500 per worker",
        ),
        f"memory per idle upstream connection ({idle} on one worker)": (
            f"{per_conn_kib:.1f} KiB (worker RSS {total_kib / 1024:.0f} MiB)",
            "< 50 KB",
        ),
    }
    print(f"\nLease {LEASE_SECONDS} s, heartbeat 0.5 s, reconcile 0.5 s; {trials} trials each.\n")
    print("| measure | median | target |\n|---|---|---|")
    for name, (value, target) in results.items():
        print(f"| {name} | {value} | {target} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--upkeep-connections", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.trials, args.idle, args.upkeep_connections))
