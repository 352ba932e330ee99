"""The web client's liveness in a real browser, with the network cut by the test.

Debian's Chromium, driven by ``clients/web/scripts/browser-liveness.mjs``, opens the built demo
page served by :class:`~streamfleet_dev.wsapi.regions.LocalRegions`; the page reaches the API
through the script's TCP proxy, which freezes (every byte silently dropped, the sockets left
open: a dead network or a frozen server) or refuses, and the browser context goes offline with
it. Checked: a dead connection is dropped within 30 s with the default settings and the page
reconnects when the network returns; back ``online`` while backing off, it reconnects at once;
the connection is rotated with no failed request and no status change.

Artifacts (screenshots, report, log) land in ``clients/web/test-artifacts/<test>/``.
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

SCRIPT = WEB / "scripts" / "browser-liveness.mjs"
# The dead-connection scenario waits up to 300 s for a 30 s bound; this only catches a hang.
SCRIPT_TIMEOUT_SECONDS = 600
# The client's own bound with the defaults: 20 s quiet, 10 s for the pong. The page's timers
# may fire a little late on a busy machine.
DETECTION_BOUND_MS = 30_000
TIMER_SLACK_MS = 1_000

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def web_build() -> Path:
    needed = {
        DIST / "index.html": "the built auction page",
        WEB / "node_modules" / "playwright-core" / "package.json": "clients/web's npm packages",
        CHROMIUM: "Debian's chromium",
    }
    missing = [f"{what} ({path})" for path, what in needed.items() if not path.exists()]
    if missing:
        pytest.fail("missing: " + "; ".join(missing) + ". Run `make web`.", pytrace=False)
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
def regions_settings(servers, monkeypatch: pytest.MonkeyPatch) -> RegionsSettings:
    monkeypatch.delenv("AWS_ENDPOINT_URL_CLOUDWATCH", raising=False)
    return RegionsSettings(
        dynamodb_endpoint=servers["dynalite"].endpoint,
        cloudwatch_endpoint=None,
        table_prefix="test-live",
    )


async def run_scenario(
    settings: RegionsSettings, web_build: Path, scenario: str, artifacts: Path
) -> dict[str, Any]:
    async with LocalRegions(settings=settings, static_dir=web_build) as regions:
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
        f"{scenario} failed: {report.get('error')}\n{steps}\nconsole: {report['console'][:10]}\n"
        f"observed: {json.dumps(report['observed'])[:2000]}\nartifacts: {artifacts}"
    )
    assert report["pageErrors"] == [], report["pageErrors"]
    _assert_screenshots(report["screenshots"])
    return report["observed"]


def _assert_screenshots(paths: list[str]) -> None:
    for shot in paths:
        data = Path(shot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, shot


async def test_a_dead_connection_is_noticed_within_30_s_and_the_page_reconnects(
    web_build: Path, regions_settings: RegionsSettings, artifacts: Path
) -> None:
    seen = await run_scenario(regions_settings, web_build, "dead-connection", artifacts)
    assert seen["disconnect"]["forced"] and seen["disconnect"]["opened"]
    assert seen["disconnect"]["reason"] == "heartbeats unanswered (1)"
    # Noticed by the page's own rule, within the bound from the last sign of life (before the
    # cut): the socket itself never closed.
    assert 0 < seen["detectedMs"] <= DETECTION_BOUND_MS + TIMER_SLACK_MS, seen
    assert seen["forcedReconnects"] == 1
    assert seen["connections"] == 2


async def test_back_online_while_backing_off_the_page_reconnects_at_once(
    web_build: Path, regions_settings: RegionsSettings, artifacts: Path
) -> None:
    seen = await run_scenario(regions_settings, web_build, "online-wakes", artifacts)
    # The next attempt was at least 10 s away; the online event did not wait for it.
    assert seen["scheduledInMs"] > 10_000
    assert seen["reconnectedBeforeDue"], seen
    assert seen["attemptsAfterOnline"] == 1


async def test_the_connection_is_rotated_without_a_gap_the_page_sees(
    web_build: Path, regions_settings: RegionsSettings, artifacts: Path
) -> None:
    seen = await run_scenario(regions_settings, web_build, "rotation", artifacts)
    assert seen["rotations"] >= 4
    assert seen["statuses"] == []  # never left "open"
    assert seen["readyChanges"] == []  # ready all along
    assert seen["disconnects"] == []
    assert seen["requestsFailed"] == [] and seen["requestsOk"] > 0
    assert seen["attempts"] == 1  # rotations are not reconnect attempts
    assert seen["openSockets"] <= 2  # the successor, and at most one old one still retiring
