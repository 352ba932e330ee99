"""``python -m streamfleet_dev.dsim``: the deterministic simulations, on a virtual clock.

``--system lease`` runs the lease core (:mod:`.lease_core`), ``--system live`` live delivery
(:mod:`.live`), ``--system all`` (the default) both, each with the same seeds.
``--schedules N [--first S] [--jobs J]`` runs N seeded schedules of each system (from seed S,
random if not given) on J processes, prints each failing seed with its problems and the command
that replays it, then a summary a system; exit 1 if any failed.
``--seed S`` (or ``SIM_SEED=S``) runs one schedule of each system and prints its description,
its whole trace and its verdict: the same bytes on any machine, every time.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from streamfleet_dev.dsim.runner import SYSTEMS, run_many


def run_fresh(system: str, first: int, count: int, jobs: int) -> bool:
    """``count`` schedules of ``system`` from seed ``first``: each failure (in seed order) with
    the command that replays it, then a summary; whether every one passed."""
    began = time.monotonic()
    failed = requests = faults = 0
    seeds = range(first, first + count)
    for outcome in run_many(system, seeds, jobs=jobs, traces=False):
        requests += outcome.requests
        faults += outcome.faults
        if not outcome.ok:
            failed += 1
            seed = outcome.schedule.seed
            print(f"SIM_SEED={seed} SIM_SYSTEM={system} make sim   # {outcome.schedule.describe()}")
            for problem in outcome.problems:
                print(f"  {problem}", flush=True)
    print(
        f"{system}: {count} schedules (seeds {first}..{first + count - 1}), {failed} failed, "
        f"{requests} requests, {faults} injected faults, {time.monotonic() - began:.1f} s "
        f"on {jobs} process{'es' if jobs > 1 else ''}",
        flush=True,
    )
    return failed == 0


def replay(system: str, seed: int) -> bool:
    """One schedule's description, trace and verdict, printed."""
    module = SYSTEMS[system]
    outcome = module.run_schedule(module.Schedule.generate(seed))
    sys.stdout.write(outcome.schedule.describe() + "\n" + outcome.trace)
    for problem in outcome.problems:
        print(f"PROBLEM {problem}")
    print("ok" if outcome.ok else "FAILED", flush=True)
    return outcome.ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--first", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--system", choices=[*sorted(SYSTEMS), "all"], default="all")
    args = parser.parse_args(argv)
    systems = sorted(SYSTEMS) if args.system == "all" else [args.system]
    seed = args.seed if args.seed is not None else _env_int("SIM_SEED")
    if seed is not None:
        results = []
        for system in systems:
            if len(systems) > 1:
                print(f"== {system} SIM_SEED={seed}")
            results.append(replay(system, seed))
        return 0 if all(results) else 1
    if args.schedules < 1:
        parser.error("--schedules: at least 1")
    if args.jobs < 1:
        parser.error("--jobs: at least 1")
    first = args.first if args.first is not None else random.randrange(1, 10**9)
    passed = [run_fresh(system, first, args.schedules, args.jobs) for system in systems]
    return 0 if all(passed) else 1


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise SystemExit(f"{name}: expected a whole number, got {raw!r}")
    return int(raw)


if __name__ == "__main__":
    sys.exit(main())
