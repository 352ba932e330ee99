"""``python -m streamfleet_dev.sim``: run many seeded fault schedules against real servers.

Starts dynalite (DynamoDB) and moto's server (SQS) on loopback unless ``AWS_ENDPOINT_URL_*`` say
where they are, runs ``--schedules`` schedules ``--parallel`` at a time, prints how many
schedules, operations and injected faults of each kind ran, and every failing seed with what it
broke. ``SIM_SEED=<n>`` (or ``--seed``) replays exactly one schedule. Exit status 1 on a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from streamfleet_dev.emulator.servers import fleet_servers
from streamfleet_dev.sim.checker import LATE_FACTOR
from streamfleet_dev.sim.schedule import Outcome, run_seed
from streamfleet_dev.upstream.process import UpstreamProcess


async def run_many(seeds: list[int], parallel: int, on_done=None) -> list[Outcome]:
    """Run the schedules of ``seeds``, ``parallel`` at a time, on one shared upstream.

    Each runs in a process of a pool: the simulated workers of one schedule share an interpreter
    (they are threads), and two schedules in one process made it the bottleneck (measured: the
    process at 90 % of a core, the other core mostly idle, and renewals late past the holder's
    window, so sessions lapsed with no fault injected).
    """
    outcomes: list[Outcome] = []
    loop = asyncio.get_running_loop()
    with (
        UpstreamProcess(rate=20) as upstream,
        concurrent.futures.ProcessPoolExecutor(
            max_workers=parallel, mp_context=multiprocessing.get_context("spawn")
        ) as pool,
    ):

        async def one(seed: int) -> None:
            outcome = await loop.run_in_executor(pool, run_seed, seed, upstream.url)
            outcomes.append(outcome)
            if on_done is not None:
                on_done(outcome)

        await asyncio.gather(*(one(seed) for seed in seeds))
    return outcomes


def summary(outcomes: list[Outcome], seconds: float) -> dict:
    ops: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for outcome in outcomes:
        ops.update(outcome.ops)
        faults.update(outcome.faults)
    failed = [o for o in outcomes if not o.ok]
    phases: Counter[str] = Counter()
    for outcome in outcomes:
        phases.update(outcome.verdict.facts.get("phases", {}))
    recovered = sorted(
        o.verdict.facts["recovered_in"] for o in outcomes if "recovered_in" in o.verdict.facts
    )

    def at(fraction: float) -> float | None:
        return (
            recovered[min(len(recovered) - 1, int(fraction * len(recovered)))]
            if recovered
            else None
        )

    return {
        "recovered_after_last_fault_seconds": {
            "p50": at(0.5),
            "p99": at(0.99),
            "max": recovered[-1] if recovered else None,
        },
        "mean_phase_seconds": {k: round(v / len(outcomes), 2) for k, v in phases.items()}
        if outcomes
        else {},
        "schedules": len(outcomes),
        "failed": len(failed),
        "seconds": round(seconds, 1),
        "schedules_per_minute": round(len(outcomes) / seconds * 60, 1) if seconds else None,
        "operations": dict(sorted(ops.items())),
        "operations_total": sum(ops.values()),
        "faults_injected": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "late": [
            {"seed": o.schedule.seed, "detail": o.verdict.facts["late"]}
            for o in outcomes
            if "late" in o.verdict.facts
        ],
        "failures": [
            {
                "seed": o.schedule.seed,
                "schedule": o.schedule.describe(),
                "problems": o.verdict.problems,
            }
            for o in failed
        ],
    }


@contextlib.contextmanager
def local_servers():
    """dynalite and moto on loopback, unless the environment already points somewhere."""
    if os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") and os.environ.get("AWS_ENDPOINT_URL_SQS"):
        yield
        return
    with (
        tempfile.TemporaryDirectory(prefix="streamfleet-sim-") as tmp,
        fleet_servers(Path(tmp)),
    ):
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument(
        "--seed",
        type=int,
        default=int(os.environ.get("SIM_SEED", "0")) or None,
        help="replay one schedule (also SIM_SEED)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=None,
        help="seeds first-seed, first-seed+1, ... (default: random)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    if args.seed:
        seeds = [args.seed]
    else:
        first = args.first_seed if args.first_seed is not None else random.randrange(1, 10**6)
        seeds = list(range(first, first + args.schedules))

    def progress(outcome: Outcome) -> None:
        if not outcome.ok:
            print(
                f"FAILED {outcome.schedule.describe()} (replay: SIM_SEED={outcome.schedule.seed})",
                file=sys.stderr,
            )
            for problem in outcome.verdict.problems[:10]:
                print(f"  {problem}", file=sys.stderr)

    began = time.monotonic()
    with local_servers():
        outcomes = asyncio.run(run_many(seeds, args.parallel, progress))
    result = summary(outcomes, time.monotonic() - began)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['schedules']} schedules in {result['seconds']} s "
            f"({result['schedules_per_minute']} per minute), {result['failed']} failed"
        )
        print(f"operations ({result['operations_total']}): {result['operations']}")
        print(f"faults injected ({result['faults_total']}): {result['faults_injected']}")
        print(f"mean seconds per schedule phase: {result['mean_phase_seconds']}")
        print(
            "every stream back after the last fault, seconds: "
            f"{result['recovered_after_last_fault_seconds']}"
        )
        print(f"late (past the liveness bound, within {LATE_FACTOR} x): {len(result['late'])}")
        for late in result["late"]:
            print(f"  SIM_SEED={late['seed']} {late['detail']}")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
