"""Where the benchmarks and the drill write their figures: pages of the manual, in
``docs/benchmarks/``.

``make bench`` and ``make drill`` write them and nobody edits them by hand: a new figure is a
new run. The manual's page on the benchmarks (``docs/benchmarks.md``) says what each one
measures, how, and what its figures mean, and links to these pages instead of restating them.
Each names what it writes in its module's ``OUTPUTS`` (``tests/unit/test_docs.py`` holds them
to this directory and to the built site).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "benchmarks"


def banner(module: str, section: str, *, target: str = "bench", package: str = "bench") -> str:
    """The line under a page's title: what writes it (``make <target>``, running
    ``<package>.<module>``), and where its method is described (``section``: the anchor of its
    section in ``docs/benchmarks.md``)."""
    return (
        f"*`make {target}` writes this page (`python -m {package}.{module}`): do not edit it by "
        f"hand, run it again. What it measures, how, and what the figures mean: "
        f"[Benchmarks](../benchmarks.md#{section}).*"
    )


def machine() -> str:
    """The machine as the pages name it: architecture, CPUs, memory, Python."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, {memory:.0f} GiB, "
        f"Python {platform.python_version()}"
    )


def commit() -> str:
    """The commit measured (``+changes`` when the checkout differs from it), or ``unknown``."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        changed = _git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks"
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+changes" if changed else head


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20, check=True
    ).stdout.strip()


def now() -> str:
    """The date and time a run started or a page was written, local time."""
    return time.strftime("%Y-%m-%d %H:%M")


def load() -> list[float]:
    """The load average (1, 5 and 15 minutes): other work shares the cores with the bench."""
    return [round(x, 2) for x in os.getloadavg()]
