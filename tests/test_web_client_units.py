"""The TypeScript client's unit tests (vitest, fake WebSocket and fake timers), run from pytest
so that ``make test`` and CI run them: backoff formula and bounds, two missed pongs force a
reconnect, the token provider per attempt with ``forceRefresh``, ``getState`` after every
reconnect, out-of-order correlation, the 32 KB refusal and ``close()`` leaving no timer.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from streamfleet_dev.local.servers import REPO_ROOT

WEB = REPO_ROOT / "clients" / "web"
VITEST = WEB / "node_modules" / ".bin" / "vitest"


def test_vitest_suite_of_the_web_client_passes() -> None:
    if not VITEST.exists():
        pytest.fail(f"{VITEST} missing: run `make web` (make test runs it first)", pytrace=False)
    result = subprocess.run(
        [str(VITEST), "run", "--reporter=verbose"],
        cwd=WEB,
        env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output
    passed = re.search(r"Tests\s+(\d+) passed", output)
    assert passed and int(passed.group(1)) > 0, output
