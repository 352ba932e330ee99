"""The demo page's live-stream panel in a real browser, fed by the real fleet.

Debian's Chromium (playwright-core, ``clients/web/scripts/browser-live.mjs``) opens the built
page served by the local regions; behind them the whole system runs on loopback
(:class:`~streamfleet_dev.wsapi.e2e.LiveWorld`): the fake upstream, real worker processes
storing into the messages table on moto's server, its real change stream, the fan-out from its
synthesized asset, the real handlers and authorizer.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from streamfleet_dev.wsapi.browser import BrowserPages, PageSpec, missing_prerequisites
from streamfleet_dev.wsapi.e2e import LiveWorld, WorldSettings
from tests.web_support import ARTIFACTS, DIST, PNG_MAGIC

pytestmark = pytest.mark.slow


@pytest.fixture
def artifacts(request: pytest.FixtureRequest):
    directory = ARTIFACTS / request.node.name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def until(read, predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        pages = await read()
        if predicate(pages):
            return pages
        assert time.monotonic() < deadline, (
            f"{what}: {[(p['stream'], len(p['seqs']), p['error']) for p in pages]}"
        )
        await asyncio.sleep(0.3)


async def test_the_page_shows_a_stream_live_resumes_after_a_reload_and_refuses_a_non_reader(
    artifacts,
) -> None:
    missing = missing_prerequisites()
    if missing:
        pytest.fail("; ".join(missing) + ". Run `make web` (make test runs it first).")
    settings = WorldSettings(streams=2, workers=2, static_dir=DIST, log_dir=artifacts / "logs")
    async with LiveWorld(settings) as world:
        await world.set_readers("live-002", ("user:bob",))  # not the group every user is in
        await world.wait_live(60)
        assert world.regions is not None
        pages = [PageSpec("alice", "live-001"), PageSpec("mallory", "live-002")]
        async with BrowserPages(world.regions.http_url, pages, artifacts) as browser:
            seen = await until(
                browser.read,
                lambda p: len(p[0]["seqs"]) >= 15 and p[1]["error"] != "",
                "alice's page to show 15 messages, mallory's its refusal",
            )
            await browser.screenshot(0, "live-stream")
            before = seen[0]["seqs"]
            assert before == list(range(before[0], before[-1] + 1))  # in order, no gap, once
            assert seen[0]["latenciesMs"], "no live message reached the page"
            assert seen[1]["seqs"] == [] and "not one of its readers" in seen[1]["error"]
            # A reload resumes after the last seq the page showed (its localStorage), and the
            # server's state re-subscribes it.
            await browser.reload(0)
            reloaded = (
                await until(browser.read, lambda p: len(p[0]["seqs"]) >= 5, "the reloaded page")
            )[0]
    # It started after the last seq it had delivered (at least the last we saw), no repeat.
    resumed_after, after = reloaded["startedAfter"], reloaded["seqs"]
    assert resumed_after is not None and resumed_after >= before[-1]
    assert after == list(range(resumed_after + 1, after[-1] + 1))
    shot = (artifacts / "live-stream.png").read_bytes()
    assert shot.startswith(PNG_MAGIC) and len(shot) > 5_000


async def test_the_page_rotates_its_connection_and_the_stream_goes_on_once_in_order(
    artifacts,
) -> None:
    """Rotation before API Gateway's 2-hour limit, every 3.6 to 4 s here: a successor takes over
    once open and resubscribes from the cursor; the stream goes on with no gap and no repeat,
    and no reconnect attempt is ever made (no connection broke)."""
    missing = missing_prerequisites()
    if missing:
        pytest.fail("; ".join(missing) + ". Run `make web` (make test runs it first).")
    settings = WorldSettings(streams=1, workers=1, static_dir=DIST, log_dir=artifacts / "logs")
    async with LiveWorld(settings) as world:
        await world.wait_live(60)
        assert world.regions is not None
        page = PageSpec("alice", "live-001", query=f"{PageSpec.query}&maxAge=4000")
        async with BrowserPages(world.regions.http_url, [page], artifacts) as browser:
            first = await until(browser.read, lambda p: len(p[0]["seqs"]) >= 3, "the stream")
            seen = (
                await until(
                    browser.read,
                    lambda p: p[0]["connections"] >= first[0]["connections"] + 3,
                    "three rotations",
                    timeout=120.0,
                )
            )[0]
    (artifacts / "rotation.json").write_text(json.dumps(seen, indent=2))
    seqs = seen["seqs"]
    assert seqs == list(range(seqs[0], seqs[-1] + 1)), seqs  # in order, no gap, once
    assert len(seqs) > len(first[0]["seqs"])  # and it went on across the rotations
    assert seen["attempts"] == 1 and seen["ready"]
