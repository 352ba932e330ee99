"""Where the web client's build, Chromium and the browser tests' screenshots are, and how its
vitest suite is run."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from streamfleet_dev.emulator.servers import REPO_ROOT

WEB = REPO_ROOT / "clients" / "web"
DIST = WEB / "dist"
CHROMIUM = Path(os.environ.get("STREAMFLEET_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(os.environ.get("STREAMFLEET_TEST_ARTIFACTS", WEB / "test-artifacts"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VITEST = WEB / "node_modules" / ".bin" / "vitest"


def run_vitest(*args: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    """The web client's vitest suite (``args`` after ``vitest run``): its output without colour,
    and how many tests passed; fails the test if the run failed or passed none."""
    if not VITEST.exists():
        pytest.fail(f"{VITEST} missing: run `make web` (make test runs it first)", pytrace=False)
    result = subprocess.run(
        [str(VITEST), "run", "--reporter=verbose", *args],
        cwd=WEB,
        env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output
    passed = re.search(r"Tests\s+(\d+) passed", output)
    assert passed and int(passed.group(1)) > 0, output
    return output, int(passed.group(1))
