"""The TypeScript client's unit tests (vitest, fake WebSocket and fake timers), run from pytest
so that ``make test`` and CI run them: backoff formula and bounds, an unanswered heartbeat forces
a reconnect, rotation and the send queue, the token provider per attempt with ``forceRefresh``,
``getState`` after every reconnect, out-of-order correlation, the 32 KB refusal and ``close()``
leaving no timer. Also the type check and formatting (the built package as a consumer installs
it: ``test_web_package.py``)."""

from __future__ import annotations

import shutil
import subprocess

from tests.web_support import WEB, run_vitest


def test_vitest_suite_of_the_web_client_passes() -> None:
    run_vitest()


def test_the_web_client_typechecks_and_is_formatted() -> None:
    npm = shutil.which("npm")
    assert npm is not None, "npm not on PATH"
    result = subprocess.run(
        [npm, "run", "--silent", "lint"],
        cwd=WEB,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, (
        f"{result.stdout}{result.stderr}\n(cd clients/web && npm run format) fixes the formatting"
    )
