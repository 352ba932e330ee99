"""Demo pages in Debian's Chromium, steered from Python: ``clients/web/scripts/browser-live.mjs``.

:class:`BrowserPages` starts the script (playwright-core drives ``/usr/bin/chromium``), one
page per :class:`PageSpec`, each on its live-stream panel, and sends it one JSON command per
line: read what every page delivered, cut one page's network for a while, reload a page, take
a screenshot. The pages are the built demo (``clients/web/dist``, ``make web``) served by
:class:`~.regions.LocalRegions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
WEB = REPO / "clients" / "web"
SCRIPT = WEB / "scripts" / "browser-live.mjs"
CHROMIUM = Path(os.environ.get("STREAMFLEET_CHROMIUM", "/usr/bin/chromium"))
ANSWER_TIMEOUT_SECONDS = 60.0


class BrowserError(RuntimeError):
    """The browser script failed, or a page command did."""


@dataclass(frozen=True)
class PageSpec:
    """One page: who, which stream, and the page's query string (timings)."""

    user: str
    stream: str
    query: str = "hb=400&hbTimeout=600&backoffBase=100&backoffCap=1000&gap=500&poll=60000"


def missing_prerequisites() -> list[str]:
    """What ``make web`` provides and this needs, if absent."""
    needed = {
        WEB / "dist" / "index.html": "the built demo page (make web)",
        WEB / "node_modules" / "playwright-core" / "package.json": "clients/web's npm packages",
        CHROMIUM: "Debian's chromium (make web installs it)",
    }
    return [f"{what}: {path}" for path, what in needed.items() if not path.exists()]


class BrowserPages:
    """``async with BrowserPages(base_url, pages, artifacts) as browser``."""

    def __init__(self, base_url: str, pages: list[PageSpec], artifacts: Path):
        self.base_url = base_url
        self.pages = pages
        self.artifacts = artifacts
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: list[str] = []
        self.browser_version = ""

    async def __aenter__(self) -> BrowserPages:
        missing = missing_prerequisites()
        if missing:
            raise BrowserError("missing: " + "; ".join(missing))
        self.artifacts.mkdir(parents=True, exist_ok=True)
        specs = [{"user": p.user, "stream": p.stream, "query": p.query} for p in self.pages]
        self._process = await asyncio.create_subprocess_exec(
            "node",
            str(SCRIPT),
            "--base-url",
            self.base_url,
            "--artifacts",
            str(self.artifacts),
            "--pages",
            json.dumps(specs),
            cwd=WEB,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,  # a read of long runs is one big line
        )
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        ready = await self._answer()
        if ready.get("event") != "ready":
            raise BrowserError(f"browser did not start: {ready}")
        self.browser_version = str(ready.get("browser", ""))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        process = self._process
        if process is None:
            return
        self._process = None
        with contextlib.suppress(Exception):
            assert process.stdin is not None
            process.stdin.write(b'{"cmd":"quit"}\n')
            await process.stdin.drain()
        try:
            await asyncio.wait_for(process.wait(), 20)
        except TimeoutError:
            process.kill()
            await process.wait()
        self._stderr_task.cancel()

    async def command(self, **command: Any) -> dict[str, Any]:
        """Send one command; its answer (:class:`BrowserError` for an ``error`` answer)."""
        process = self._process
        if process is None or process.stdin is None:
            raise BrowserError("the browser is not running")
        process.stdin.write((json.dumps(command) + "\n").encode())
        await process.stdin.drain()
        answer = await self._answer()
        if answer.get("event") in ("error", "failed"):
            raise BrowserError(f"{command}: {answer.get('error')}")
        return answer

    async def read(self) -> list[dict[str, Any]]:
        """What every page shows and delivered (``seqs``: the watched stream's, in order)."""
        return (await self.command(cmd="read"))["pages"]

    async def offline(self, page: int, seconds: float) -> None:
        await self.command(cmd="offline", page=page, ms=int(seconds * 1000))

    async def reload(self, page: int) -> None:
        await self.command(cmd="reload", page=page)

    async def screenshot(self, page: int, name: str) -> Path:
        return Path((await self.command(cmd="screenshot", page=page, name=name))["path"])

    async def _answer(self) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        while True:
            line = await asyncio.wait_for(self._process.stdout.readline(), ANSWER_TIMEOUT_SECONDS)
            if not line:
                raise BrowserError(
                    f"the browser script exited ({self._process.returncode}): "
                    + "".join(self._stderr[-20:])
                )
            text = line.decode(errors="replace").strip()
            if text.startswith("{"):
                return json.loads(text)

    async def _drain_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        async for line in self._process.stderr:
            self._stderr.append(line.decode(errors="replace"))
            del self._stderr[:-200]
