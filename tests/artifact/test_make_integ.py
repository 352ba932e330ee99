"""``make integ``: the runner of integ/, from integ/, with the virtualenv's python3 first on PATH.

A dry run (``make -n``) shows the one command the target runs; what that command does without
credentials, and with a stand-in CDK CLI, is tested in ``tests/infra/test_integ_synth.py`` and
``tests/unit/test_integ_run.py``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INHERITED = ("ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def dry_run(*args: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in INHERITED}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(REPO), "integ", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_make_integ_runs_the_runner_from_integ_with_the_virtualenv_first():
    *_, last = dry_run()
    assert last.rstrip() == (
        f"cd integ && PATH={REPO}/.venv/bin:$PATH {REPO}/.venv/bin/python -m streamfleet_integ.run"
    )


def test_args_reach_the_runner():
    *_, last = dry_run("ARGS=--no-clean")
    assert last.endswith("-m streamfleet_integ.run --no-clean")
