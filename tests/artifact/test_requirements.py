"""The requirement sets: each fully pinned and closed, their union is requirements.txt, and
``make local`` installs the runtime, CDK and local sets but never the test tools."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
SETS = ("runtime", "cdk", "local", "dev")
TEST_TOOLS = ("pytest", "hypothesis", "syrupy", "cfn-lint", "checkov", "ruff", "matplotlib")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")


def pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file; every line must be an exact pin."""
    found = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}:{number}: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{path.name}:{number}: {name} pinned twice"
        found[name] = match.group(2)
    return found


def dependencies(name: str) -> set[str]:
    """What an installed distribution requires on this platform (no extras)."""
    found = set()
    for text in importlib.metadata.distribution(name).requires or ():
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.add(canonicalize_name(requirement.name))
    return found


def test_each_set_is_pinned_closed_and_agrees_with_the_others():
    union: dict[str, str] = {}
    for name in SETS:
        path = REPO / "requirements" / f"{name}.txt"
        listed = pins(path)
        for package, version in listed.items():
            assert union.setdefault(package, version) == version, (
                f"{path.name}: {package}=={version}, another set pins {union[package]}"
            )
            missing = dependencies(package) - set(listed)
            assert not missing, f"{path.name}: {package} needs {sorted(missing)}, not pinned here"
    assert union == pins(REPO / "requirements.txt"), "requirements.txt is not the union"
    for package, version in union.items():  # what make test installed is what the files say
        assert importlib.metadata.version(package) == version, package


def test_the_worker_image_set_is_part_of_the_runtime_set():
    image = pins(REPO / "runtime" / "requirements.txt")
    runtime = pins(REPO / "requirements" / "runtime.txt")
    assert {k: runtime.get(k) for k in image} == image


@pytest.mark.parametrize(
    ("target", "installed", "not_installed"),
    [
        ("local", ("runtime", "cdk", "local"), ("dev",)),
        ("cdk", ("runtime", "cdk"), ("local", "dev")),
        ("test", ("requirements.txt",), ()),
    ],
)
def test_what_each_target_installs(tmp_path, target, installed, not_installed):
    """A dry run of the target in a fresh clone's state (nothing installed yet)."""
    result = subprocess.run(
        ["make", "-n", "-B", "-f", str(REPO / "Makefile"), "-C", str(REPO), target],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    commands = result.stdout
    for name in installed:
        path = name if name.endswith(".txt") else f"requirements/{name}.txt"
        assert f"-r {path}" in commands, f"make {target} does not install {path}"
    for name in not_installed:
        assert f"-r requirements/{name}.txt" not in commands
        assert "-r requirements.txt" not in commands, f"make {target} installs everything"
    if target == "local":
        local = set().union(*(pins(REPO / "requirements" / f"{s}.txt") for s in installed))
        assert not local & set(TEST_TOOLS), "the local sets include test tools"
