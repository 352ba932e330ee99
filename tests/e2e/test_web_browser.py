"""The web client's demo pages in a real browser, against the local two-region WebSocket API.

Debian's Chromium (``/usr/bin/chromium``; ``make web`` installs it with apt when it is missing)
is driven by playwright-core from ``clients/web/scripts/browser-test.mjs``; this module starts
:class:`~streamfleet_dev.wsapi.regions.LocalRegions` serving the built pages
(``clients/web/dist``, built by ``make web``), runs the script, and asserts on the JSON report it
prints. Nothing is mocked: the pages fetch ``/resolve`` and ``/token`` from LocalRegions, and
talk to the real handlers and authorizer behind the local API Gateway stand-ins; the primary
is failed with ``POST /fail?mode=throttled`` (the failure hardest to notice: the handlers stop
answering, sockets stay open) and restored with ``POST /restore``.

Screenshots and the reports land in ``clients/web/test-artifacts/<test>/`` (git-ignored; set
``STREAMFLEET_TEST_ARTIFACTS`` to put them elsewhere); each test prints its directory.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from streamfleet_dev.wsapi.regions import LocalRegions, RegionsSettings
from tests.web_support import ARTIFACTS, CHROMIUM, DIST, PNG_MAGIC, WEB, run_browser_script

SCRIPT = WEB / "scripts" / "browser-test.mjs"
PRIMARY, SECONDARY = "us-east-1", "us-west-2"
# The script's own waits give up after 45 s each; this only catches a hung browser.
SCRIPT_TIMEOUT_SECONDS = 240

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def web_build() -> Path:
    """The built pages, playwright-core and Chromium: ``make web`` provides all three."""
    needed = {
        DIST / "index.html": "the built auction page",
        DIST / "react-use-websocket.html": "the built react-use-websocket page",
        WEB / "node_modules" / "playwright-core" / "package.json": "clients/web's npm packages",
        CHROMIUM: "Debian's chromium",
    }
    missing = [f"{what} ({path})" for path, what in needed.items() if not path.exists()]
    if missing:
        pytest.fail(
            "missing: " + "; ".join(missing) + ". Run `make web` (make test runs it first).",
            pytrace=False,
        )
    return DIST


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Path:
    directory = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    with capsys.disabled():
        print(f"\n  browser test artifacts (screenshots, report): {directory}")
    return directory


@pytest.fixture
def dynalite_endpoint(servers, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("AWS_ENDPOINT_URL_CLOUDWATCH", raising=False)
    return servers["dynalite"].endpoint


async def run_browser(regions: LocalRegions, scenario: str, artifacts: Path) -> dict[str, Any]:
    """Run one scenario of the browser script; its report, after checking it passed."""
    report, returncode = await run_browser_script(
        SCRIPT,
        scenario,
        "--base-url",
        regions.http_url,
        artifacts=artifacts,
        timeout=SCRIPT_TIMEOUT_SECONDS,
        what=scenario,
    )
    steps = "\n".join(f"  {s['atMs'] / 1000:6.2f} s  {s['step']}" for s in report["steps"])
    assert report["ok"] and returncode == 0, (
        f"{scenario} failed: {report.get('error')}\n{steps}\n"
        f"console: {report['console'][:10]}\nlogs: {json.dumps(report['observed'])[:2000]}\n"
        f"artifacts: {artifacts}"
    )
    assert report["pageErrors"] == [], report["pageErrors"]
    return report


def assert_screenshots(artifacts: Path, *names: str) -> None:
    for name in names:
        path = artifacts / f"{name}.png"
        assert path.is_file(), f"no screenshot {path}"
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, f"{path}: not a real screenshot"


@pytest.mark.parametrize(
    "sweep",
    [True, False],
    ids=["canary-closes-the-connections", "client-notices-two-missed-pongs"],
)
async def test_auction_page_fails_over_with_its_state_and_comes_back(
    web_build: Path, dynalite_endpoint: str, artifacts: Path, sweep: bool
) -> None:
    """Two bidders see each other's bids; the primary is throttled; both pages reconnect to
    the secondary with the highest bid intact, bid there, and return after the restore.

    With the canary's sweep (production: it closes its region's connections while unhealthy)
    the pages see their sockets closed; without it, the sockets stay open and only the page's
    own rule (two consecutive heartbeats without ``pong``) gets them off the broken region.
    """
    settings = RegionsSettings(
        dynamodb_endpoint=dynalite_endpoint,
        cloudwatch_endpoint=None,
        table_prefix="test-web",
        disconnect_when_unhealthy=sweep,
    )
    async with LocalRegions(settings=settings, static_dir=web_build) as regions:
        report = await run_browser(regions, "failover", artifacts)
    seen = report["observed"]
    first, second, third = seen["bids"]
    assert second > first
    # Before: both on the primary, each saw the other's bid.
    assert seen["before"] == {"region": PRIMARY, "highest": second}
    # After the failover: the secondary, the state restored from its replica.
    assert seen["afterFailover"]["region"] == SECONDARY
    assert seen["afterFailover"]["highest"] == second
    assert seen["afterFailover"]["attempts"] == 0  # healthy again: the counter is back to 0
    assert seen["afterFailover"]["connections"] >= 2
    assert seen["bobAfterFailover"] == {"region": SECONDARY, "highest": second}
    bid_on_secondary = next(
        s for s in report["steps"] if s["step"] == f"alice bid {third}: accepted"
    )
    assert bid_on_secondary["region"] == SECONDARY
    # After the restore and a reconnect: the primary, with the bid placed on the secondary.
    assert seen["afterRestore"] == {"region": PRIMARY, "highest": third, "bobHighest": third}
    log = "\n".join(seen["aliceLog"])
    assert f"region changed: {PRIMARY} → {SECONDARY}" in log
    assert "reconnect attempt 1 in" in log  # what the page showed while reconnecting
    if sweep:
        assert "connection lost: closed" in log
    else:
        assert seen["afterFailover"]["forced"] >= 1
        assert "heartbeats unanswered" in log
    assert_screenshots(artifacts, "auction-before-failover", "auction-after-failover")


async def test_react_use_websocket_with_the_reference_configuration(
    web_build: Path, dynalite_endpoint: str, artifacts: Path
) -> None:
    """react-use-websocket 4.13.0 itself, configured as a typical app does: healthy, the
    text ``pong`` is filtered out of ``lastMessage`` and keeps the connection open; degraded
    (the primary throttled: its frames say "Internal server error", which the hook counts as
    alive), the canary closes the connection and the hook reconnects through the failover name
    to the secondary."""
    settings = RegionsSettings(
        dynamodb_endpoint=dynalite_endpoint, cloudwatch_endpoint=None, table_prefix="test-web"
    )
    async with LocalRegions(settings=settings, static_dir=web_build) as regions:
        report = await run_browser(regions, "react-use-websocket", artifacts)
    healthy = report["observed"]["healthy"]
    # Healthy for 4 heartbeat timeouts: heartbeats answered, never shown, never closed.
    assert healthy["readyState"] == 1
    assert (healthy["opens"], healthy["closes"]) == (1, 0)
    assert healthy["rawPongs"] >= 3
    assert healthy["pongsInLastMessage"] == 0
    assert healthy["lastMessages"] >= 1  # the getState reply did reach lastMessage
    assert '"type":"state"' in healthy["lastMessageShown"]
    degraded = report["observed"]["degraded"]
    assert degraded["closes"] >= 1
    assert degraded["readyState"] == 1
    assert degraded["region"] == SECONDARY
    assert degraded["regions"] == [PRIMARY, SECONDARY]
    assert degraded["pongsInLastMessage"] == 0
    assert_screenshots(
        artifacts, "react-use-websocket-healthy", "react-use-websocket-after-failover"
    )
