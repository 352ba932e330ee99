"""The TypeScript client's unit tests in a real browser: the same vitest suite the gate runs
under Node (fake WebSocket and timers, the hostile-frame conformance file, the network-chaos
property), here in Debian's headless Chromium through Playwright, so the browser's own
``JSON``, ``TextEncoder`` and timers are what the client meets; and the React binding's
(``test/react.test.tsx``: react-dom and act, StrictMode, remounts, a reload), which need a
DOM and so run only here."""

from __future__ import annotations

import os

import pytest

from tests.web_support import CHROMIUM, run_vitest

pytestmark = pytest.mark.slow


def test_the_web_client_unit_tests_pass_in_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} missing: `make web` installs Debian's Chromium", pytrace=False)
    output, passed = run_vitest(
        "--config", "vitest.browser.config.ts", env={"CHROMIUM_PATH": str(CHROMIUM)}
    )
    assert "chromium" in output, output  # the browser ran them, not Node
    assert "react.test.tsx" in output, output  # the React binding's, which need a DOM
    assert passed >= 100, output
