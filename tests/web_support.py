"""Where the web client's build, Chromium and the browser tests' screenshots are, how its
vitest suite is run, and how a browser script (clients/web/scripts/browser-*.mjs) is run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

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


async def run_browser_script(
    script: Path, *args: str, artifacts: Path, timeout: float, what: str
) -> tuple[dict[str, Any], int]:
    """Run a browser script with node; the JSON report it prints last (also kept in
    ``artifacts/report.json``, its output in ``artifacts/<script>.log``) and its exit status.
    Fails the test if it hangs past ``timeout`` or prints no report; ``what`` names it there."""
    process = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        "--artifacts",
        str(artifacts),
        cwd=WEB,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"{what}: the browser script hung for {timeout} s") from None
    (artifacts / f"{script.stem}.log").write_bytes(out + b"\n--- stderr ---\n" + err)
    lines = out.decode(errors="replace").strip().splitlines()
    assert lines and lines[-1].startswith("{"), (
        f"{what}: no report (exit {process.returncode})\n{out.decode()}\n{err.decode()}"
    )
    report = json.loads(lines[-1])
    (artifacts / "report.json").write_text(json.dumps(report, indent=2))
    return report, process.returncode
