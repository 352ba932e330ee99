"""A newcomer's application, made as the manual says: the React example of ``docs/clients.md``
(taken from the page, so the two cannot drift) in a scratch folder with an ``index.html``, the
packed ``@streamfleet/web-client`` tarball installed there with react and react-dom, type-checked,
built with Vite, served by the local Regions in front of the real fleet (:class:`LiveWorld`), and
watched in Debian's Chromium (``clients/web/scripts/browser-newcomer.mjs``): it must stream, in
order and once, and go on after a reload from where it was.

npm installs offline: react, react-dom and their types are packed from ``clients/web``'s own
``node_modules`` (what ``make web`` installed from the lock file), as a registry would serve the
same versions. TypeScript and Vite are the newcomer's tools, run from there too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamfleet_dev.wsapi.e2e import LiveWorld, WorldSettings
from tests.web_support import ARTIFACTS, CHROMIUM, PNG_MAGIC, WEB, run_browser_script

pytestmark = pytest.mark.slow

MANUAL = WEB.parents[1] / "docs" / "clients.md"
SECTION = "### React: `useStream`"
SCRIPT = WEB / "scripts" / "browser-newcomer.mjs"
# The application's packages besides the tarball, at clients/web's pinned versions.
PEERS = ("react", "react-dom", "scheduler", "@types/react", "@types/react-dom", "csstype")
SCRIPT_TIMEOUT_SECONDS = 240
INDEX_HTML = (
    '<!doctype html>\n<html lang="en">\n'
    '<head><meta charset="utf-8" /><title>Ticker</title></head>\n'
    '<body><div id="root"></div><script type="module" src="./main.tsx"></script></body>\n</html>\n'
)
TSCONFIG = {
    "compilerOptions": {
        "target": "es2022",
        "module": "esnext",
        "moduleResolution": "bundler",
        "jsx": "react-jsx",
        "lib": ["es2022", "dom"],
        "strict": True,
        "noEmit": True,
    },
    "files": ["main.tsx"],
}


def _run(args: list[str], cwd: Path) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def the_manuals_example() -> str:
    """The first tsx block of the manual's React section."""
    text = MANUAL.read_text(encoding="utf-8")
    assert SECTION in text, f"{MANUAL}: no section {SECTION!r}"
    found = re.search(r"^```tsx\n(.*?)^```", text[text.index(SECTION) :], re.M | re.S)
    assert found, f"{MANUAL}: no tsx example under {SECTION!r}"
    return found.group(1)


@pytest.fixture
def artifacts(request: pytest.FixtureRequest) -> Path:
    directory = ARTIFACTS / request.node.name
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


@pytest.fixture
def newcomer_app(tmp_path: Path) -> Path:
    """The example built as an application: its ``dist/``."""
    needed = [
        WEB / "dist" / "lib" / "streamfleet-react.js",
        WEB / "node_modules" / "vite",
        CHROMIUM,
    ]
    missing = [str(path) for path in needed if not path.exists()]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run `make web`", pytrace=False)
    npm = shutil.which("npm")
    assert npm is not None, "npm not on PATH"
    packs = tmp_path / "packs"
    packs.mkdir()
    tarballs = [json.loads(_run([npm, "pack", "--json", "--pack-destination", str(packs)], WEB))]
    for name in PEERS:
        pack = [
            npm,
            "pack",
            "--json",
            "--pack-destination",
            str(packs),
            str(WEB / "node_modules" / name),
        ]
        tarballs.append(json.loads(_run(pack, WEB)))
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(
        json.dumps({"name": "ticker", "private": True, "type": "module"})
    )
    files = [str(packs / listing[0]["filename"]) for listing in tarballs]
    _run([npm, "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", *files], app)
    (app / "main.tsx").write_text(the_manuals_example())
    (app / "index.html").write_text(INDEX_HTML)
    (app / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    _run([str(WEB / "node_modules" / ".bin" / "tsc"), "-p", "tsconfig.json"], app)
    _run(
        ["node", str(WEB / "node_modules" / "vite" / "bin" / "vite.js"), "build", "--base", "./"],
        app,
    )
    # Built from the tarball the application installed, not from clients/web's sources.
    assert (app / "node_modules" / "@streamfleet" / "web-client" / "dist" / "lib").is_dir()
    assert not (app / "node_modules" / "@streamfleet" / "web-client").is_symlink()
    return app / "dist"


async def run_browser(base_url: str, artifacts: Path) -> dict[str, Any]:
    report, returncode = await run_browser_script(
        SCRIPT,
        "--base-url",
        base_url,
        artifacts=artifacts,
        timeout=SCRIPT_TIMEOUT_SECONDS,
        what="newcomer",
    )
    assert report["ok"] and returncode == 0, (
        f"{report.get('error')}\nsteps: {report['steps']}\nconsole: {report['console'][:10]}\n"
        f"artifacts: {artifacts}"
    )
    assert report["pageErrors"] == [], report["pageErrors"]
    return report


async def test_the_manuals_react_example_builds_from_the_tarball_and_streams(
    newcomer_app: Path, artifacts: Path
) -> None:
    settings = WorldSettings(
        streams=1, workers=1, static_dir=newcomer_app, log_dir=artifacts / "logs"
    )
    async with LiveWorld(settings) as world:
        assert world.stream_ids == ["live-001"]  # the stream the example watches
        await world.wait_live(60)
        assert world.regions is not None
        report = await run_browser(world.regions.http_url, artifacts)
    before, after = report["observed"]["before"], report["observed"]["after"]
    assert len(before) >= 5 and before == list(range(before[0], before[-1] + 1))
    assert after == list(range(after[0], after[-1] + 1))
    # The reloaded page went on right after the position stored when it went away
    # (localStorage, `<epoch>:<seq>`): no repeat, no gap.
    unloaded_at = int(report["observed"]["unloadedAt"].split(":")[-1])
    assert unloaded_at >= before[-1]
    assert report["observed"]["firstShown"] == unloaded_at + 1
    shot = (artifacts / "newcomer.png").read_bytes()
    assert shot.startswith(PNG_MAGIC) and len(shot) > 1_000
