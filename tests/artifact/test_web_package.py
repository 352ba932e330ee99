"""The web client as people install it: the tarball ``npm pack`` makes of ``clients/web``,
unpacked into a scratch application's ``node_modules``, then imported, required and type-checked
there as an ES module and as CommonJS, the core and its React binding (``/react``, with react
copied from ``clients/web/node_modules`` as an application's own: no network); and the build's
size budgets."""

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
REACT = f"{PACKAGE}/react"


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
    # The application's React (the binding's peer; React 19 has no dependency of its own).
    shutil.copytree(WEB / "node_modules" / "react", app / "node_modules" / "react")
    return sorted(f["path"] for f in listing["files"]), app


def test_the_pack_holds_the_builds_their_declarations_and_nothing_of_the_demo(
    packed: tuple[list[str], Path],
) -> None:
    files, _ = packed
    library = {f for f in files if f.startswith("dist/lib/")}
    assert set(files) == library | PACKAGE_FILES
    for entry in ("streamfleet-client", "streamfleet-react"):
        assert {f"dist/lib/{entry}.js", f"dist/lib/{entry}.cjs"} <= library
    for declared in ("index", "react"):
        assert f"dist/lib/types/{declared}.d.ts" in library
        assert f"dist/lib/types-cjs/{declared}.d.cts" in library
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
    assert not manifest.get("dependencies")
    # React only for the /react entry: a peer (the application's own copy), optional so that an
    # application of the core alone is not given React by npm.
    assert manifest["peerDependencies"] == {"react": ">=18"}
    assert manifest["peerDependenciesMeta"] == {"react": {"optional": True}}
    assert set(manifest["exports"]) == {".", "./react", "./package.json"}
    targets = [manifest["main"], manifest["module"], manifest["types"]]
    for entry in (".", "./react"):
        conditions = manifest["exports"][entry]
        targets += [
            conditions[system][kind]
            for system in ("import", "require")
            for kind in ("types", "default")
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
        assert _imports(app, built) == [], built


def _imports(app: Path, built: str) -> list[str]:
    text = (app / "node_modules" / PACKAGE / "dist" / "lib" / built).read_text()
    return re.findall(r"^\s*import\b.*$|\brequire\(.*?\)", text, re.MULTILINE)


def test_an_application_imports_and_requires_the_react_binding(
    packed: tuple[list[str], Path],
) -> None:
    """``/react`` resolves through the exports map from both module systems to the same hooks,
    which import React (the application's) and nothing else: not even the core, whose types are
    all they take from it."""
    _, app = packed
    probe = (
        "let refused = null;"
        "try { m.useStream(null, 's'); } catch (e) { refused = e.message; }"
        "console.log(JSON.stringify({exports: Object.keys(m).sort(), keep: m.DEFAULT_KEEP,"
        " refused}));"
    )
    (app / "react.mjs").write_text(f"import * as m from '{REACT}';\n{probe}\n")
    (app / "react.cjs").write_text(f"const m = require('{REACT}');\n{probe}\n")
    esm = json.loads(_run(["node", "react.mjs"], cwd=app))
    cjs = json.loads(_run(["node", "react.cjs"], cwd=app))
    assert esm == cjs
    assert esm["exports"] == ["DEFAULT_KEEP", "useConnection", "useStream"]
    assert esm["keep"] == 100
    assert esm["refused"] == "useStream: client must be a StreamFleetClient, got null"
    assert _imports(app, "streamfleet-react.js") == [
        'import { useCallback, useMemo, useSyncExternalStore } from "react";'
    ]
    assert _imports(app, "streamfleet-react.cjs") == ['require("react")']


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
    # The hooks' declarations name the core's types: a client of the same package fits them.
    hooks = (
        "const shared = new StreamFleetClient({ url: 'wss://ws.example.com' });\n"
        "export function lastSeq(): number | undefined {\n"
        "  const { messages, status, error } = useStream(shared, 'prices', { keep: 20 });\n"
        "  const ready: boolean = useConnection(shared).ready;\n"
        "  const ok = ready && status === 'open' && error === null;\n"
        "  return ok ? messages.at(-1)?.seq : undefined;\n"
        "}\n"
    )
    (app / "esm-react.mts").write_text(
        f"import {{ StreamFleetClient }} from '{PACKAGE}';\n"
        f"import {{ useConnection, useStream }} from '{REACT}';\n{hooks}"
    )
    (app / "cjs-react.cts").write_text(
        f"import m = require('{PACKAGE}');\nimport r = require('{REACT}');\n"
        "const { StreamFleetClient } = m;\nconst { useConnection, useStream } = r;\n" + hooks
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
        "files": ["esm.mts", "cjs.cts", "esm-react.mts", "cjs-react.cts"],
    }
    (app / "tsconfig.json").write_text(json.dumps(config))
    _run([str(TSC), "-p", "tsconfig.json"], cwd=app)
    wrong = {
        "wrong.mts": (
            f"import {{ StreamFleetClient }} from '{PACKAGE}';\n"
            "new StreamFleetClient({ url: 'wss://x', heartbeatIntervalMs: 'often' });\n"
        ),
        "wrong-react.mts": (
            f"import {{ StreamFleetClient }} from '{PACKAGE}';\n"
            f"import {{ useStream }} from '{REACT}';\n"
            "useStream(new StreamFleetClient({ url: 'wss://x' }), 's', { keep: 'many' });\n"
        ),
    }
    for name, text in wrong.items():
        (app / name).write_text(text)
        config["files"] = [name]
        (app / "tsconfig.json").write_text(json.dumps(config))
        result = subprocess.run(
            [str(TSC), "-p", "tsconfig.json"], cwd=app, capture_output=True, text=True, timeout=120
        )
        assert result.returncode != 0 and name in result.stdout, result.stdout


def test_the_build_prints_each_entry_size_and_holds_them_within_their_budgets() -> None:
    out = _run(["node", "scripts/package-lib.mjs"], cwd=WEB)
    sizes = {
        name: (int(size), int(budget))
        for name, size, budget in re.findall(
            r"^(.+): (\d+) bytes min\+gzip \(budget (\d+)\)$", out, re.MULTILINE
        )
    }
    assert set(sizes) == {"core client", "react binding"}, out
    assert sizes["core client"][1] == 8 * 1024 and sizes["react binding"][1] == 2 * 1024
    for size, budget in sizes.values():
        assert 0 < size <= budget, out
