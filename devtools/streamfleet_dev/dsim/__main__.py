"""``python -m streamfleet_dev.dsim``: the deterministic simulations, on a virtual clock.

``--system lease`` (the default) runs the lease core (:mod:`.lease_core`), ``--system live``
live delivery (:mod:`.live`).
``--schedules N [--first S]`` runs N seeded schedules (from seed S, random if not given) and
prints each failing seed with its problems, then a summary; exit 1 if any failed.
``--seed S`` (or ``SIM_SEED=S``) runs one schedule and prints its description, its whole trace
and its verdict: the same bytes on any machine.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from streamfleet_dev.dsim import lease_core, live

SYSTEMS = {"lease": lease_core, "live": live}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--first", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", choices=sorted(SYSTEMS), default="lease")
    args = parser.parse_args(argv)
    system = SYSTEMS[args.system]
    seed = args.seed if args.seed is not None else _env_seed()
    if seed is not None:
        outcome = system.run_schedule(system.Schedule.generate(seed))
        sys.stdout.write(outcome.schedule.describe() + "\n" + outcome.trace)
        for problem in outcome.problems:
            print(f"PROBLEM {problem}")
        print("ok" if outcome.ok else "FAILED")
        return 0 if outcome.ok else 1
    if args.schedules < 1:
        parser.error("--schedules: at least 1")
    first = args.first if args.first is not None else random.randrange(1, 10**6)
    began = time.monotonic()
    failed = requests = faults = 0
    for number in range(first, first + args.schedules):
        outcome = system.run_schedule(system.Schedule.generate(number))
        requests += outcome.requests
        faults += outcome.faults
        if not outcome.ok:
            failed += 1
            print(f"SIM_SEED={number} {outcome.schedule.describe()}")
            for problem in outcome.problems:
                print(f"  {problem}")
    print(
        f"{args.schedules} schedules (seeds {first}..{first + args.schedules - 1}), "
        f"{failed} failed, {requests} requests, {faults} injected faults, "
        f"{time.monotonic() - began:.1f} s"
    )
    return 1 if failed else 0


def _env_seed() -> int | None:
    raw = os.environ.get("SIM_SEED", "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise SystemExit(f"SIM_SEED: expected a whole number, got {raw!r}")
    return int(raw)


if __name__ == "__main__":
    sys.exit(main())
