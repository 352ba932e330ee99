"""The TypeScript client's unit tests (vitest, fake WebSocket and fake timers), run from pytest
so that ``make test`` and CI run them: backoff formula and bounds, two missed pongs force a
reconnect, the token provider per attempt with ``forceRefresh``, ``getState`` after every
reconnect, out-of-order correlation, the 32 KB refusal and ``close()`` leaving no timer. Also the
type check and formatting, and the built library as a consumer imports it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

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


def test_the_built_library_is_an_es_module_with_types_where_package_json_says() -> None:
    """What a consumer gets: package.json's exports point at one dependency-free ES module and
    its declarations, and the module works (imported in plain Node, not through vitest)."""
    exports = json.loads((WEB / "package.json").read_text())["exports"]["."]
    module, types = WEB / exports["import"], WEB / exports["types"]
    if not module.exists():
        pytest.fail(f"{module} missing: run `make web` (make test runs it first)", pytrace=False)
    assert types.is_file(), types
    declarations = types.read_text()
    for name in ("StreamFleetClient", "FrameTooLargeError", "fullJitterBackoff", "ClientSnapshot"):
        assert name in declarations, name
    probe = (
        "const m = await import(process.argv[1]);"
        "const c = new m.StreamFleetClient({url: 'ws://127.0.0.1:9/'});"
        "let refused = null;"
        "try { c.send({action: 'bid', pad: 'x'.repeat(40000)}); } catch (e) { refused = e.name; }"
        "c.close();"
        "console.log(JSON.stringify({exports: Object.keys(m), status: c.status, refused,"
        " delay: m.fullJitterBackoff(3, () => 1), limit: m.MAX_FRAME_BYTES}));"
    )
    result = subprocess.run(
        ["node", "--input-type=module", "-e", probe, module.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert {"StreamFleetClient", "ServerError", "handshake", "PONG_FRAME"} <= set(seen["exports"])
    assert seen["status"] == "closed"
    assert seen["refused"] == "FrameTooLargeError"
    assert seen["delay"] == 16000
    assert seen["limit"] == 32 * 1024
    imports = re.findall(r"^\s*import\b.*$|\brequire\(", module.read_text(), re.MULTILINE)
    assert imports == [], f"the library must not depend on anything: {imports}"
