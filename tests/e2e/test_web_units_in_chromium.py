"""The TypeScript client's unit tests in a real browser: the same vitest suite the gate runs
under Node (fake WebSocket and timers, the hostile-frame conformance file, the network-chaos
property), here in Debian's headless Chromium through Playwright, so the browser's own
``JSON``, ``TextEncoder``, timers and ``WebSocket`` typings are what the client meets."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.web_support import CHROMIUM, WEB

pytestmark = pytest.mark.slow

VITEST = WEB / "node_modules" / ".bin" / "vitest"


def test_the_web_client_unit_tests_pass_in_chromium() -> None:
    for needed, how in ((VITEST, "make web"), (CHROMIUM, "make web (installs Debian's Chromium)")):
        if not os.path.exists(needed):
            pytest.fail(f"{needed} missing: run `{how}`", pytrace=False)
    result = subprocess.run(
        [str(VITEST), "run", "--config", "vitest.browser.config.ts", "--reporter=verbose"],
        cwd=WEB,
        env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", "CHROMIUM_PATH": str(CHROMIUM)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output
    assert "chromium" in output, output  # the browser ran them, not Node
    passed = re.search(r"Tests\s+(\d+) passed", output)
    assert passed and int(passed.group(1)) >= 100, output
