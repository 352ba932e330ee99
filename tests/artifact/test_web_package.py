"""The web client as people install it: the tarball ``npm pack`` makes of ``clients/web``,
unpacked into a scratch application's ``node_modules``, then imported, required and type-checked
there as an ES module and as CommonJS; and the build's size budget."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.web_support import WEB

PACKAGE = "@streamfleet/web-client"
TSC = WEB / "node_modules" / ".bin" / "tsc"
# What the package holds beside the library's files.
PACKAGE_FILES = {"package.json", "README.md", "CHANGELOG.md"}


def _run(args: list[str], cwd: Path, timeout: float = 120) -> str:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The pack's file list, and a scratch application with the tarball installed."""
    if not (WEB / "dist" / "lib" / "streamfleet-client.js").exists():
        pytest.fail("clients/web/dist/lib missing: run `make web` (make test runs it first)")
    npm = shutil.which("npm")
    assert npm is not None, "npm not on PATH"
    work = tmp_path_factory.mktemp("web-package")
    listing = json.loads(_run([npm, "pack", "--json", "--pack-destination", str(work)], cwd=WEB))[0]
    app = work / "app"
    installed = app / "node_modules" / PACKAGE
    installed.mkdir(parents=True)
    with tarfile.open(work / listing["filename"]) as tarball:
        tarball.extractall(work / "unpacked", filter="data")
    shutil.copytree(work / "unpacked" / "package", installed, dirs_exist_ok=True)
    return sorted(f["path"] for f in listing["files"]), app


def test_the_pack_holds_the_builds_their_declarations_and_nothing_of_the_demo(
    packed: tuple[list[str], Path],
) -> None:
    files, _ = packed
    library = {f for f in files if f.startswith("dist/lib/")}
    assert set(files) == library | PACKAGE_FILES
    for built in ("streamfleet-client.js", "streamfleet-client.cjs"):
        assert f"dist/lib/{built}" in library
    assert "dist/lib/types/index.d.ts" in library
    assert "dist/lib/types-cjs/index.d.cts" in library
    # Every module's declarations in both forms.
    esm = {Path(f).name.removesuffix(".d.ts") for f in library if f.endswith(".d.ts")}
    cjs = {Path(f).name.removesuffix(".d.cts") for f in library if f.endswith(".d.cts")}
    assert esm == cjs and "client" in esm


def test_the_manifest_points_at_files_in_the_pack_and_promises_no_side_effects(
    packed: tuple[list[str], Path],
) -> None:
    files, app = packed
    manifest = json.loads((app / "node_modules" / PACKAGE / "package.json").read_text())
    assert "private" not in manifest and manifest["version"].startswith("0.")
    assert manifest["sideEffects"] is False
    assert not manifest.get("dependencies") and not manifest.get("peerDependencies")
    root = manifest["exports"]["."]
    targets = [
        root["import"]["types"],
        root["import"]["default"],
        root["require"]["types"],
        root["require"]["default"],
        manifest["main"],
        manifest["module"],
        manifest["types"],
    ]
    for target in targets:
        assert target.removeprefix("./") in files, target
    changelog = (app / "node_modules" / PACKAGE / "CHANGELOG.md").read_text()
    assert f"## {manifest['version']}" in changelog


def test_an_application_imports_and_requires_the_same_client(
    packed: tuple[list[str], Path],
) -> None:
    """Node resolves the package by its name, through the exports map, from both module
    systems; each form is a working client with the same exports."""
    _, app = packed
    probe = (
        "const c = new m.StreamFleetClient({url: 'ws://127.0.0.1:9/'});"
        "let refused = null;"
        "try { c.send({action: 'bid', pad: 'x'.repeat(40000)}); } catch (e) { refused = e.name; }"
        "c.close();"
        "console.log(JSON.stringify({exports: Object.keys(m).sort(), status: c.status, refused,"
        " delay: m.fullJitterBackoff(3, () => 1), limit: m.MAX_FRAME_BYTES}));"
    )
    (app / "esm.mjs").write_text(f"import * as m from '{PACKAGE}';\n{probe}\n")
    (app / "cjs.cjs").write_text(f"const m = require('{PACKAGE}');\n{probe}\n")
    esm = json.loads(_run(["node", "esm.mjs"], cwd=app))
    cjs = json.loads(_run(["node", "cjs.cjs"], cwd=app))
    assert esm == cjs
    assert {"StreamFleetClient", "StreamCursor", "ServerError", "handshake", "PONG_FRAME"} <= set(
        esm["exports"]
    )
    assert esm["status"] == "closed" and esm["refused"] == "FrameTooLargeError"
    assert esm["delay"] == 16000 and esm["limit"] == 32 * 1024
    # Nothing to install beside it: neither build imports or requires anything.
    for built in ("streamfleet-client.js", "streamfleet-client.cjs"):
        text = (app / "node_modules" / PACKAGE / "dist" / "lib" / built).read_text()
        imports = re.findall(r"^\s*import\b.*$|\brequire\(", text, re.MULTILINE)
        assert imports == [], (built, imports)


def test_an_application_type_checks_against_both_declarations(
    packed: tuple[list[str], Path],
) -> None:
    """TypeScript under Node's own resolution takes the ES module's declarations for an
    import and the CommonJS ones for a require (a require of declarations that only an ES module
    has is an error); a wrong option is an error."""
    _, app = packed
    use = (
        "const client = new StreamFleetClient({ url: 'wss://ws.example.com' });\n"
        "const status: string = client.status;\n"
        "export const delay: number = fullJitterBackoff(3, () => 1) + status.length;\n"
    )
    (app / "esm.mts").write_text(
        f"import {{ StreamFleetClient, fullJitterBackoff }} from '{PACKAGE}';\n{use}"
    )
    (app / "cjs.cts").write_text(
        f"import m = require('{PACKAGE}');\nconst {{ StreamFleetClient, fullJitterBackoff }} = m;\n"
        + use
    )
    config = {
        "compilerOptions": {
            # node16, not nodenext: TypeScript 5.8+ lets nodenext require() an ES module, so
            # only node16 tells CommonJS declarations from ES module ones.
            "module": "node16",
            "moduleResolution": "node16",
            "target": "es2022",
            "lib": ["es2022", "dom"],
            "strict": True,
            "noEmit": True,
            "types": [],
        },
        "files": ["esm.mts", "cjs.cts"],
    }
    (app / "tsconfig.json").write_text(json.dumps(config))
    _run([str(TSC), "-p", "tsconfig.json"], cwd=app)
    (app / "wrong.mts").write_text(
        f"import {{ StreamFleetClient }} from '{PACKAGE}';\n"
        "new StreamFleetClient({ url: 'wss://x', heartbeatIntervalMs: 'often' });\n"
    )
    config["files"] = ["wrong.mts"]
    (app / "tsconfig.json").write_text(json.dumps(config))
    result = subprocess.run(
        [str(TSC), "-p", "tsconfig.json"], cwd=app, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "wrong.mts" in result.stdout, result.stdout


def test_the_build_prints_the_core_size_and_holds_it_within_8_kib() -> None:
    out = _run(["node", "scripts/package-lib.mjs"], cwd=WEB)
    size, budget = (int(number) for number in re.findall(r"\d+", out))
    assert budget == 8 * 1024
    assert 0 < size <= budget, out
