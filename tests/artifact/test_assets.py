"""The Lambda assets as ``cdk deploy`` would upload them: read from the synthesized assembly.

Every function of every template is followed from its ``Code.S3Key`` through the stack's asset
manifest to its directory in the cloud assembly, and that directory is what is checked: that each
function has its own bundle holding what it declares, that the handler imports from it in a clean
interpreter (``python -I -S``: no site-packages, no ``PYTHONPATH``; only the asset and the boto3
every Lambda Python runtime provides), and that its compiled code is built for the one runtime
and architecture every function runs on (``assets.LAMBDA_TARGET``, CPython 3.14 on arm64).

This machine is not that target (CPython 3.11 on x86_64), so compiled extensions the host would
try to load and cannot (``cryptography``'s ``_rust.abi3.so``) are replaced, for the import only,
by the same version built for the host, together with the compiled distributions they load
(``cffi``). The version must be the asset's; everything else, ``streamfleet``, ``PyJWT`` and
``websockets`` included, is imported from the asset itself.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from streamfleet_auction import names as auction_names
from streamfleet_cdk import assets
from streamfleet_cdk.canary import CANARY_DISTRIBUTIONS
from streamfleet_cdk.functions import INVOKED_SYNCHRONOUSLY, python_function
from streamfleet_cdk.websocket_api import AUTHORIZER_DISTRIBUTIONS
from tests.app_support import synthesize

TARGET = assets.LAMBDA_TARGET
# What each handler's bundle declares beyond the streamfleet package.
DECLARED = {
    "streamfleet.event_router.handler": (),
    auction_names.HANDLER_ENTRY: (),  # the WebSocket handler with the demo auction (default)
    "streamfleet.wsapi.authorizer.handler": AUTHORIZER_DISTRIBUTIONS,
    "streamfleet.wsapi.canary.handler": CANARY_DISTRIBUTIONS,
    "streamfleet.task_events.handler": (),
    "streamfleet.wsapi.fanout.handler": (),
    "streamfleet.wsapi.stream_lookup.handler": (),
}
# Top-level packages a handler's bundle carries besides streamfleet (its entry module's).
OTHER_PACKAGES = {auction_names.HANDLER_ENTRY: {"streamfleet_auction"}}
# Modules each handler must import from its own asset (the canary dials with websockets).
IMPORTED_FROM_ASSET = {
    "streamfleet.wsapi.canary.handler": ("websockets", "websockets.asyncio.client", "jwt"),
    "streamfleet.wsapi.authorizer.handler": ("jwt",),
}
# Modules a handler must not load on a cold start: the authorizer answers every $connect, and
# the AWS SDK would add its import time to each cold one (it needs none: PyJWT and urllib).
NOT_IMPORTED = {
    "streamfleet.wsapi.authorizer.handler": ("boto3", "botocore"),
}
# The one function CDK itself adds (the VPC's restrict-default-security-group custom resource):
# Node.js code of CDK's, not this project's; every other function must be the project's.
CDK_PROVIDER_HANDLER = "__entrypoint__.handler"
ELF_MACHINES = {"aarch64": 183, "x86_64": 62}


@dataclass(frozen=True)
class DeployedFunction:
    """One ``AWS::Lambda::Function`` of a synthesized template, with its asset directory."""

    stack: str
    logical_id: str
    properties: dict[str, Any]
    asset: Path | None

    @property
    def handler(self) -> str:
        return self.properties["Handler"]

    @property
    def name(self) -> str:
        return f"{self.stack}/{self.logical_id}"


def deployed_functions(assembly: Path) -> list[DeployedFunction]:
    """Every Lambda function of every stack in the assembly, with the directory its
    ``Code.S3Key`` names in that stack's asset manifest (``None`` for inline code)."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    found: list[DeployedFunction] = []
    for stack, artifact in manifest["artifacts"].items():
        if artifact["type"] != "aws:cloudformation:stack":
            continue
        template = json.loads((assembly / artifact["properties"]["templateFile"]).read_text())
        files = json.loads((assembly / f"{stack}.assets.json").read_text())["files"]
        by_key = {
            destination["objectKey"]: entry["source"]["path"]
            for entry in files.values()
            for destination in entry["destinations"].values()
        }
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::Lambda::Function":
                continue
            key = resource["Properties"]["Code"].get("S3Key")
            asset = assembly / by_key[key] if key is not None else None
            found.append(DeployedFunction(stack, logical_id, resource["Properties"], asset))
    return found


@pytest.fixture(scope="module")
def functions(tmp_path_factory) -> list[DeployedFunction]:
    found = deployed_functions(synthesize(tmp_path_factory.mktemp("assembly") / "cdk.out"))
    assert {f.handler for f in found} == {*DECLARED, CDK_PROVIDER_HANDLER}
    return [f for f in found if f.handler != CDK_PROVIDER_HANDLER]


# --- What each asset holds ---


def installed_distributions(directory: Path) -> dict[str, str]:
    """``{canonical name: version}`` of the ``*.dist-info`` directories in a bundle."""
    found = {}
    for info in directory.glob("*.dist-info"):
        metadata = importlib.metadata.PathDistribution(info).metadata
        found[str(canonicalize_name(metadata["Name"]))] = metadata["Version"]
    return found


def declared_closure(names: tuple[str, ...]) -> dict[str, str]:
    """What the bundler puts in for ``names`` on the target: the closure, with versions."""
    if not names:
        return {}
    return {
        str(canonicalize_name(d.metadata["Name"])): d.version
        for d in assets.distribution_closure(names, TARGET)
    }


def test_every_function_has_its_own_asset_holding_exactly_what_it_declares(functions):
    for function in functions:
        assert function.asset is not None and function.asset.is_dir(), function.name
        expected = declared_closure(DECLARED[function.handler])
        assert installed_distributions(function.asset) == expected, function.name
        top_level = {p.name for p in function.asset.iterdir() if not p.name.endswith(".dist-info")}
        assert "streamfleet" in top_level, function.name
        if not expected:
            packages = {"streamfleet", *OTHER_PACKAGES.get(function.handler, ())}
            assert top_level == packages, function.name
    # Bundles with different contents never share an asset; equal contents may.
    by_asset: dict[Path, set[tuple[str, ...]]] = {}
    for function in functions:
        by_asset.setdefault(function.asset, set()).add(DECLARED[function.handler])
    assert all(len(declared) == 1 for declared in by_asset.values()), by_asset


def test_the_canary_ships_websockets_and_the_authorizer_does_not(functions):
    # The regression: both once shared the authorizer's bundle (no websockets at all).
    for function in functions:
        if function.handler in ("streamfleet.wsapi.canary.handler",):
            assert (function.asset / "websockets" / "asyncio" / "client.py").is_file()
        if function.handler == "streamfleet.wsapi.authorizer.handler":
            assert not (function.asset / "websockets").exists()


def test_two_bundles_of_one_source_in_one_stack_stay_distinct(tmp_path):
    # CDK's asset cache keys on source path and bundling options; the bundle's declared
    # contents must reach that key, or the second function silently gets the first's bundle.
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Bundles", env=cdk.Environment(region="eu-west-1"))
    for construct_id, distributions in (("Plain", ()), ("WithWebsockets", ("websockets",))):
        python_function(
            stack,
            construct_id,
            description=construct_id,
            handler="streamfleet.model.__name__",
            distributions=distributions,
            role=iam.Role(stack, f"{construct_id}Role", assumed_by=iam.AnyPrincipal()),
            log_group=logs.LogGroup(stack, f"{construct_id}Logs"),
            environment={},
            timeout=cdk.Duration.seconds(3),
            no_dead_letter_queue=INVOKED_SYNCHRONOUSLY,
        )
    app.synth()
    by_id = {f.logical_id[: -len("XXXXXXXX")]: f for f in deployed_functions(tmp_path)}
    plain, with_websockets = by_id["Plain"], by_id["WithWebsockets"]
    assert plain.asset != with_websockets.asset
    assert installed_distributions(plain.asset) == {}
    assert "websockets" in installed_distributions(with_websockets.asset)


# --- One runtime, one architecture, compiled for it ---


def test_every_function_runs_one_current_python_on_arm64(functions):
    newest = max(
        (r for r in lambda_.Runtime.ALL if r.name.startswith("python3.")),
        key=lambda r: int(r.name.removeprefix("python3.")),
    )
    assert TARGET.runtime.name == newest.name == "python3.14"
    assert TARGET.architecture.name == "arm64"
    for function in functions:
        assert function.properties["Runtime"] == TARGET.runtime.name, function.name
        assert function.properties["Architectures"] == [TARGET.architecture.name], function.name


def elf_machine(path: Path) -> int:
    header = path.read_bytes()[:20]
    assert header[:4] == b"\x7fELF", path
    assert header[4] == 2, f"{path}: not a 64-bit ELF"
    return int.from_bytes(header[18:20], "little")


def test_compiled_code_in_every_asset_is_built_for_the_target(functions):
    suffixes = (f".cpython-{TARGET.python[0]}{TARGET.python[1]}-{TARGET.machine}-linux-gnu.so",)
    seen = 0
    for asset in {f.asset for f in functions}:
        for library in asset.rglob("*.so"):
            seen += 1
            assert library.name.endswith((*suffixes, ".abi3.so")), library
            assert elf_machine(library) == ELF_MACHINES[TARGET.machine], library
        for wheel in asset.glob("*.dist-info/WHEEL"):
            assert TARGET.accepts(
                assets.wheel_tags(importlib.metadata.PathDistribution(wheel.parent))
            ), wheel.parent.name
    assert seen >= 3  # cryptography's _rust, cffi's _cffi_backend, websockets' speedups


# --- Each handler imports from its asset, in a clean interpreter ---


def host_loadable(relative: str) -> bool:
    """Whether this interpreter would try to load an extension module file of that name."""
    name = relative.rsplit("/", 1)[-1]
    stem = name.split(".", 1)[0]
    return any(name == f"{stem}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def host_overlay(asset: Path, destination: Path) -> set[str]:
    """Copy, from this interpreter, the compiled distributions of ``asset`` that the host would
    try (and fail) to load, and the compiled distributions they require; returns their names.
    Each must be installed here at the asset's version."""
    in_asset = installed_distributions(asset)
    compiled: dict[str, list[str]] = {}
    for info in asset.glob("*.dist-info"):
        distribution = importlib.metadata.PathDistribution(info)
        files = [str(f) for f in distribution.files or ()]
        if any(f.endswith(".so") for f in files):
            compiled[str(canonicalize_name(distribution.metadata["Name"]))] = files
    chosen = {name for name, files in compiled.items() if any(map(host_loadable, files))}
    pending = list(chosen)
    while pending:  # what chosen compiled code loads in turn
        for text in importlib.metadata.distribution(pending.pop()).requires or ():
            requirement = Requirement(text)
            name = str(canonicalize_name(requirement.name))
            if (
                name in compiled
                and name not in chosen
                and (requirement.marker is None or requirement.marker.evaluate({"extra": ""}))
            ):
                chosen.add(name)
                pending.append(name)
    for name in chosen:
        host = importlib.metadata.distribution(name)
        assert host.version == in_asset[name], (
            f"{name}: host {host.version}, asset {in_asset[name]}"
        )
        for relative, source in assets.installed_files(host):
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return chosen


@pytest.fixture(scope="module")
def runtime_provided(tmp_path_factory) -> Path:
    """What every Lambda Python runtime provides on its own: boto3 and its dependencies."""
    directory = tmp_path_factory.mktemp("lambda-runtime")
    for distribution in assets.distribution_closure(("boto3",), TARGET, skip=frozenset()):
        for relative, source in assets.installed_files(distribution):
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    return directory


IMPORT_CHECK = """
import importlib, json, sys, sysconfig
paths, handler, from_asset = json.loads(sys.argv[1])
sys.path[:0] = paths
module_name, _, attribute = handler.rpartition(".")
module = importlib.import_module(module_name)
assert callable(getattr(module, attribute)), handler
for name in from_asset:
    importlib.import_module(name)
stdlib = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]]
files = {
    name: module.__file__
    for name, module in list(sys.modules.items())
    if getattr(module, "__file__", None)
}
print(json.dumps({"files": files, "stdlib": stdlib, "path": sys.path}))
"""


def test_every_handler_imports_from_its_own_asset_in_a_clean_interpreter(
    functions, runtime_provided, tmp_path
):
    for function in functions:
        overlay = tmp_path / function.stack / function.logical_id / "host-builds"
        overlay.mkdir(parents=True)
        replaced = host_overlay(function.asset, overlay)
        assert replaced <= {"cryptography", "cffi"}, (function.name, replaced)
        from_asset = IMPORTED_FROM_ASSET.get(function.handler, ())
        paths = [str(overlay), str(function.asset), str(runtime_provided)]
        result = subprocess.run(
            [
                sys.executable,
                "-I",  # no PYTHONPATH, no user site, no script directory
                "-S",  # no site-packages at all
                "-c",
                IMPORT_CHECK,
                json.dumps([paths, function.handler, from_asset]),
            ],
            cwd=tmp_path,
            env={"PATH": os.environ.get("PATH", ""), "AWS_DEFAULT_REGION": "us-east-1"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{function.name}:\n{result.stderr[-3000:]}"
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert not any("site-packages" in entry for entry in report["path"]), report["path"]
        files = report["files"]
        module = function.handler.rpartition(".")[0]
        assert Path(files[module]).is_relative_to(function.asset), (function.name, files[module])
        for name in from_asset:
            assert Path(files[name]).is_relative_to(function.asset), (function.name, name)
        for name in NOT_IMPORTED.get(function.handler, ()):
            assert name not in files, (function.name, name)
        allowed = (function.asset, overlay, runtime_provided, *map(Path, report["stdlib"]))
        outside = {
            name: file
            for name, file in files.items()
            if not any(Path(file).is_relative_to(root) for root in allowed)
        }
        assert outside == {}, function.name
        # Only the replaced compiled distributions came from the host builds.
        from_host = {n.split(".")[0] for n, f in files.items() if Path(f).is_relative_to(overlay)}
        top_levels = {
            line.split("/", 1)[0].split(".", 1)[0]
            for name in replaced
            for line in map(str, importlib.metadata.distribution(name).files or ())
            if not line.split("/", 1)[0].endswith(".dist-info")
        }
        assert from_host <= top_levels, (function.name, from_host, replaced)


def test_the_import_check_fails_for_a_bundle_without_its_dependencies(tmp_path, runtime_provided):
    # Not vacuous: the canary's handler, from a bundle without websockets, does not import.
    bundle = tmp_path / "bundle"
    assert assets.PackageCopy().try_bundle(str(bundle)) is True
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            IMPORT_CHECK,
            json.dumps(
                [[str(bundle), str(runtime_provided)], "streamfleet.wsapi.canary.handler", []]
            ),
        ],
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "No module named 'websockets'" in result.stderr or "No module named 'jwt'" in (
        result.stderr
    ), textwrap.shorten(result.stderr, 500)
