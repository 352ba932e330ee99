"""The lease plane's request rate while a stream that can never be dialled exists.

Real worker processes from the synthesized task definition (the tests' short timing: lease 2 s,
reconcile 0.5 s), dynalite and moto on loopback, the fake upstream. Three workers hold 20 calm
streams; every DynamoDB request the workers make is counted from their own logged counters in
two windows of the same length: the calm fleet alone, then the same fleet with one more stream
whose upstream answers every handshake with a cross-origin redirect (it fails at once on every
dial). Also counted: how often that stream was claimed and dialled in the second window.

Usage: ``python -m bench.hold_off_bench [--window 60] [--runs 3]``; writes the manual's page
``docs/benchmarks/hold-off.md``, with the machine, the date and the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streamfleet import model
from streamfleet_dev import pages
from streamfleet_dev.emulator.servers import fleet_servers
from streamfleet_dev.local.fleet import Fleet, WorkerProcess, eventually
from streamfleet_dev.upstream.fake import FakeUpstream

RESULTS = pages.PAGES / "hold-off.md"
OUTPUTS = (RESULTS,)
CALM = [f"calm{n:02d}" for n in range(20)]
BROKEN = "redirected"


def _requests_at(worker: WorkerProcess, ts: float) -> Counter[str]:
    """The worker's cumulative DynamoDB requests by operation, as last logged before ``ts``."""
    found: Counter[str] = Counter()
    for record in worker.events("worker_stats"):
        if record["ts"] <= ts:
            found = Counter(record.get("dynamodb_requests", {}))
    return found


def _window(fleet: Fleet, start: float, end: float) -> Counter[str]:
    total: Counter[str] = Counter()
    for worker in fleet.workers.values():
        total.update(_requests_at(worker, end) - _requests_at(worker, start))
    return total


async def one_run(endpoint: str, tmp: Path, window: float) -> dict[str, Any]:
    async with FakeUpstream(rate=5) as upstream:
        fleet = Fleet(
            endpoint=endpoint, upstream=upstream, tmp=tmp, hostile={BROKEN: frozenset({"redirect"})}
        )
        try:
            for _ in range(3):
                fleet.start_worker()
            await fleet.start_streams(*CALM)
            await eventually(lambda: fleet.all_live(CALM), timeout=60, what="all live")
            await asyncio.sleep(5)  # past the start burst: steady state
            calm_start = time.time()
            await asyncio.sleep(window + 1.5)  # the counters are logged every second
            calm = _window(fleet, calm_start, calm_start + window)

            await fleet.start_streams(BROKEN)
            broken_start = time.time()
            await asyncio.sleep(window + 1.5)
            broken = _window(fleet, broken_start, broken_start + window)
            row = fleet.rows()[BROKEN]
            return {
                "calm": dict(calm),
                "broken": dict(broken),
                "claims": int(row.get(model.LEASE_VERSION, 0)),
                "dials": upstream.stats()["redirected"].get(BROKEN, 0),
                "failures": int(row.get(model.DIAL_FAILURES, 0)),
            }
        finally:
            fleet.close()


async def run(window: float, runs: int) -> dict[str, Any]:
    conditions = {
        "date": pages.now(),
        "commit": pages.commit(),
        "machine": pages.machine(),
        "load_at_start": pages.load(),
    }
    results = []
    keep = os.environ.get("BENCH_LOGS")
    with contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with fleet_servers(root) as (dynamodb, _):
            for n in range(runs):
                directory = root / f"run{n}"
                directory.mkdir()
                results.append(await one_run(dynamodb.endpoint, directory, window))
                print(results[-1], flush=True)
    conditions["load_at_end"] = pages.load()
    return {"window": window, "conditions": conditions, "runs": results}


def report(figures: dict[str, Any]) -> str:
    window = figures["window"]

    def rate(run: dict[str, Any], which: str) -> float:
        return sum(run[which].values()) / window

    calm = [rate(r, "calm") for r in figures["runs"]]
    broken = [rate(r, "broken") for r in figures["runs"]]
    rows = "\n".join(
        f"| {i + 1} | {c:.1f} | {b:.1f} | {r['claims']} | {r['dials']} | {r['failures']} |"
        for i, (c, b, r) in enumerate(zip(calm, broken, figures["runs"], strict=True))
    )
    run = figures["conditions"]
    return f"""# Benchmark: the lease plane with a stream that can never be dialled

{pages.banner("hold_off_bench", "hold-off-of-a-stream-that-keeps-failing")}

`python -m bench.hold_off_bench --window {window:g} --runs {len(figures["runs"])}`, run of \
{run["date"]} at commit {run["commit"]}. Machine: {run["machine"]}; load average at the \
start {run["load_at_start"]}, at the end {run["load_at_end"]}.

3 real workers (lease 2 s, reconcile every 0.5 s) holding {len(CALM)} calm streams at 5 msg/s on
dynalite and moto. DynamoDB requests of all workers per second, from their own counters, over
{window:g} s without and then with one more stream whose upstream redirects every handshake to
another origin (each dial fails at once).

Median: **{statistics.median(calm):.1f}** requests/s calm, **{statistics.median(broken):.1f}** \
with the broken stream.

Each of its failures holds it off in its row for 0.5 to 1 times
1, 2, 4 ... s (capped at 300 s), for the whole fleet, so its claims grow with the logarithm of
the time it exists, not with it.

| Run | Calm (req/s) | With the broken stream (req/s) | Its claims | Its dials | Failures \
on its row |
|---|---|---|---|---|---|
{rows}

Requests by operation (last run): calm {figures["runs"][-1]["calm"]}; with the broken stream \
{figures["runs"][-1]["broken"]}.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    figures = asyncio.run(run(args.window, args.runs))
    text = report(figures)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
