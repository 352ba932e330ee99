"""Many seeded schedules of one simulation, on several processes: the gate's fixed lists and
``make sim``'s fresh seeds run the same way.

Each process runs whole schedules, so a schedule's outcome does not depend on how many ran
beside it: the outcomes come back in seed order, the same on any number of processes.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from types import ModuleType
from typing import Any

from streamfleet_dev.dsim import lease_core, live

SYSTEMS: dict[str, ModuleType] = {"lease": lease_core, "live": live}
# Seeds a process runs at a time: large enough that handing them out costs nothing next to
# running them (a schedule takes a few hundred ms), small enough that the processes finish
# together (the last chunk handed out runs alone).
CHUNK = 2


def run_seeds(system: str, seeds: Iterable[int], *, traces: bool = True) -> list[Any]:
    """The outcomes of ``system``'s schedules of ``seeds``, in this process; without their
    traces (often 100 KB each) unless ``traces``."""
    module = SYSTEMS[system]
    outcomes = []
    for seed in seeds:
        outcome = module.run_schedule(module.Schedule.generate(seed))
        outcomes.append(outcome if traces else dataclasses.replace(outcome, trace=""))
    return outcomes


def run_many(
    system: str, seeds: range, *, jobs: int | None = None, traces: bool = True
) -> Iterator[Any]:
    """The outcomes of ``system``'s schedules of ``seeds``, in seed order, on ``jobs``
    processes (one per core if not given)."""
    jobs = jobs or os.cpu_count() or 1
    chunks = [seeds[start : start + CHUNK] for start in range(0, len(seeds), CHUNK)]
    if jobs == 1 or len(chunks) == 1:
        for chunk in chunks:
            yield from run_seeds(system, chunk, traces=traces)
        return
    # A forked process inherits its parent's objects (a test run's: every template it
    # synthesized); frozen, the collector never walks them again in the child.
    with ProcessPoolExecutor(jobs, initializer=gc.freeze) as pool:
        for batch in pool.map(_run_chunk, [(system, chunk, traces) for chunk in chunks]):
            yield from batch


def _run_chunk(job: tuple[str, range, bool]) -> list[Any]:
    system, seeds, traces = job
    return run_seeds(system, seeds, traces=traces)
