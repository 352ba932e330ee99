"""Each artifact carries only what it runs: a change to one module changes the assets of
exactly the artifacts that import it.

Every Lambda asset and the worker image once carried the whole ``streamfleet`` package, so a
comment in the canary changed the worker image's hash (every worker handed off every stream
at the next deploy) and redeployed every function. Checked here as ``cdk synth`` builds it: a
copy of the checkout synthesized (``python app.py``) before and after a comment is added to
the canary's module, and the two assemblies' asset references compared.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamfleet_auction_cdk import PACKAGE_DIR, PACKAGE_NAME
from streamfleet_cdk import assets

REPO = Path(__file__).resolve().parents[2]
CANARY = "streamfleet.wsapi.canary.handler"
ROUTER = "streamfleet.event_router.handler"


def synthesize(checkout: Path, outdir: Path) -> dict[str, Any]:
    """``python app.py`` in ``checkout``, with cdk.json's context, as the CDK CLI runs it."""
    context = json.loads((checkout / "cdk.json").read_text())["context"]
    env = {
        **os.environ,
        "CDK_OUTDIR": str(outdir),
        "CDK_CONTEXT_JSON": json.dumps(context),
        "PYTHONPATH": os.pathsep.join([str(checkout / "runtime"), str(checkout)]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=checkout, env=env, capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return {path.name: json.loads(path.read_text()) for path in outdir.glob("*.template.json")}


def asset_references(templates: dict[str, Any]) -> dict[tuple[str, str, str], str]:
    """``(template, logical ID, handler)`` -> its code's S3 key; ``(template, logical ID,
    "worker")`` -> the task definition's image."""
    found: dict[tuple[str, str, str], str] = {}
    for name, template in templates.items():
        for logical_id, resource in template.get("Resources", {}).items():
            props = resource.get("Properties", {})
            if resource["Type"] == "AWS::Lambda::Function" and "S3Key" in props.get("Code", {}):
                found[(name, logical_id, props["Handler"])] = props["Code"]["S3Key"]
            if resource["Type"] == "AWS::ECS::TaskDefinition":
                for container in props.get("ContainerDefinitions", []):
                    image = json.dumps(container["Image"], sort_keys=True)
                    found[(name, logical_id, "worker")] = image
    return found


# Entry modules of another top-level package (the demo auction's handler), by package name.
OTHER_PACKAGES = {PACKAGE_NAME: PACKAGE_DIR}


def importers_of(relative: str, references: dict[tuple[str, str, str], str]) -> set:
    """The artifacts whose entry point imports the package's file ``relative``."""
    entries = {
        key: assets.WORKER_ENTRY if key[2] == "worker" else key[2].rpartition(".")[0]
        for key in references
        if key[2] == "worker"
        or key[2].startswith((f"{assets.PACKAGE_NAME}.", *(f"{n}." for n in OTHER_PACKAGES)))
    }
    return {
        key
        for key, entry in entries.items()
        if relative in assets.module_closure((entry,), packages=OTHER_PACKAGES)
    }


@pytest.mark.slow
def test_a_change_to_a_module_changes_exactly_the_assets_that_import_it(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    for part in ("app.py", "cdk.json", "stacks", "streamfleet_cdk", "runtime", "examples"):
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            checkout.mkdir(exist_ok=True)
            shutil.copyfile(source, checkout / part)
    package = checkout / "runtime" / "streamfleet"
    before = asset_references(synthesize(checkout, tmp_path / "before"))
    # A leaf (the canary's handler module), and a module two artifacts share.
    for relative in ("wsapi/canary/__init__.py", "worker/ecs_metadata.py"):
        module = package / relative
        module.write_text(module.read_text() + "\n# A comment: nothing else changes.\n")
    after = asset_references(synthesize(checkout, tmp_path / "after"))
    assert before.keys() == after.keys()
    changed = {key for key in before if before[key] != after[key]}
    canary = {key for key in before if key[2] == CANARY}
    shared = importers_of("worker/ecs_metadata.py", before)
    assert canary and len({key[2] for key in shared}) >= 2  # the worker and another
    assert changed == canary | shared
    untouched = {key[2] for key in before} - {key[2] for key in changed}
    assert ROUTER in untouched


def test_each_artifact_carries_the_modules_it_imports_and_no_other() -> None:
    worker = assets.module_closure((assets.WORKER_ENTRY,))
    router = assets.module_closure((ROUTER.rpartition(".")[0],))
    canary = assets.module_closure((CANARY.rpartition(".")[0],))
    entry = "wsapi/canary/__init__.py"  # the canary's entry module
    assert entry in canary and entry not in worker | router
    # Operator tools and the client ship with no deployed artifact that does not use them.
    for tool in ("cli.py", "preflight.py", "client/reconnecting.py"):
        assert tool not in worker | router, tool
    assert {"__init__.py", "worker/__init__.py", "worker/__main__.py"} <= worker
    with pytest.raises(ValueError, match="not a module"):
        assets.module_closure(("streamfleet.no_such_module",))


def test_the_demo_auction_ships_only_with_the_handler_that_installs_it() -> None:
    """The core handler never imports the demo: its bundle carries none of it, even when the
    demo's package is offered; the demo's entry carries the core modules it runs and its own."""
    core = dict(assets.bundle_files(("streamfleet.wsapi.handlers",), OTHER_PACKAGES))
    assert not [path for path in core if path.startswith(f"{PACKAGE_NAME}/")]
    demo = dict(assets.bundle_files(("streamfleet_auction.handler",), OTHER_PACKAGES))
    ours = {path for path in demo if path.startswith(f"{PACKAGE_NAME}/")}
    assert {f"{PACKAGE_NAME}/handler.py", f"{PACKAGE_NAME}/auctions.py"} <= ours
    assert set(core) <= set(demo)  # the core's routes, as the core handler runs them
    # Its names (what its CDK spec imports) need nothing of the runtime.
    names = ("streamfleet_auction.names",)
    assert assets.module_closure(names, packages=OTHER_PACKAGES) == frozenset()


def test_the_runtime_has_no_import_cycle() -> None:
    """Modules of one concept import downwards: a cycle (the worker's fleet and its health
    endpoint imported each other) makes neither usable, nor testable, alone."""
    package = assets.runtime_package_dir()
    modules = {
        ".".join(
            (assets.PACKAGE_NAME, *path.relative_to(package).with_suffix("").parts)
        ).removesuffix(".__init__")
        for path in package.rglob("*.py")
        if "__pycache__" not in path.parts and "_image" not in path.parts
    }
    graph = {module: assets.module_imports(module) & modules for module in modules}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in visiting, " -> ".join([*visiting, module])
        visiting.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        visiting.pop()
        done.add(module)

    assert "streamfleet.worker.sink" in graph["streamfleet.worker.fleet"]  # the graph is read
    for module in sorted(graph):
        visit(module)
