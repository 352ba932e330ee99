"""The worker image's Dockerfile, as the deploy machine would build it (no Docker engine here).

The task runs on ARM64 and the image is usually built on an x86_64 machine without QEMU, so no
instruction may run on the target platform: only a stage pinned to ``$BUILDPLATFORM`` may have a
``RUN``, and it fetches wheels built for the target instead of building them. The base image is
pinned to a patch version. The build stage's ``pip install`` is also run here, for real (from
wheels fetched once into ``~/.cache/streamfleet``), to show that it needs no emulation and
yields target wheels only.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from streamfleet_cdk import assets
from tests.app_support import default_app

DOCKERFILE, REQUIREMENTS = assets.worker_image_files()
MACHINES = {"linux/arm64": "aarch64", "linux/amd64": "x86_64"}
ELF_MACHINES = {"aarch64": 183, "x86_64": 62}
PATCH_TAG = re.compile(r"^(?P<name>[\w./-]+):(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)\b")


@dataclass
class Stage:
    flags: list[str]
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def of(self, keyword: str) -> list[str]:
        return [arguments for instruction, arguments in self.instructions if instruction == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ``ARG`` defaults and the stages of a Dockerfile (continuations joined)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        lines.append(pending.strip())
        pending = ""
    arguments: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            flags = [w for w in words if w.startswith("--")]
            plain = [w for w in words if not w.startswith("--")]
            name = plain[2] if len(plain) == 3 and plain[1].upper() == "AS" else None
            stages.append(Stage(flags, plain[0], name))
        elif instruction == "ARG" and not stages:
            key, _, default = rest.partition("=")
            arguments[key.strip()] = default.strip()
        elif stages:
            stages[-1].instructions.append((instruction, rest.strip()))
    return arguments, stages


def expand(value: str, arguments: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: arguments[m[1] or m[2]], value)


ARGUMENTS, STAGES = parse(DOCKERFILE.read_text())
TARGET_STAGE = STAGES[-1]


def pip_install(stage: Stage) -> list[str]:
    [command] = [run for run in stage.of("RUN") if "pip install" in run]
    words = shlex.split(command.split("&&")[0])
    return words[words.index("pip") :]


def option_values(words: list[str], option: str) -> list[str]:
    values = []
    for index, word in enumerate(words):
        if word == option:
            values.append(words[index + 1])
        elif word.startswith(f"{option}="):
            values.append(word.split("=", 1)[1])
    return values


def image_platform() -> str:
    """The platform the worker image asset is built for (the task's CPU architecture)."""
    built = default_app()
    manifest = json.loads(
        (Path(built.assembly.directory) / f"{built.primary.stack_name}.assets.json").read_text()
    )
    (image,) = manifest["dockerImages"].values()
    return image["source"]["platform"]


def test_the_target_stage_runs_nothing():
    # No RUN: nothing executes on linux/arm64 while building, so no QEMU/binfmt is needed.
    assert TARGET_STAGE.of("RUN") == []
    assert TARGET_STAGE.flags == []  # built for the platform the CDK asset asks for
    assert TARGET_STAGE.of("ENTRYPOINT") == ['["python", "-m", "streamfleet.worker"]']


def test_the_worker_runs_as_a_fixed_unprivileged_user():
    (user,) = TARGET_STAGE.of("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) >= 1000 and int(gid) >= 1000, user


def test_every_stage_that_runs_commands_runs_on_the_build_platform():
    for stage in STAGES[:-1]:
        if stage.of("RUN"):
            assert "--platform=$BUILDPLATFORM" in stage.flags, stage.name


def test_every_base_image_is_pinned_to_a_patch_version_and_is_the_tested_python():
    for stage in STAGES:
        image = expand(stage.image, ARGUMENTS)
        if image in {s.name for s in STAGES}:
            continue
        match = PATCH_TAG.match(image)
        assert match, f"{image}: not pinned to a patch version"
        assert match["name"] == "python"
        # The image runs the CPython minor version the tests run the worker on.
        assert (int(match["major"]), int(match["minor"])) == sys.version_info[:2], image


def test_the_build_stage_fetches_wheels_for_the_task_platform():
    machine = MACHINES[image_platform()]
    assert machine == "aarch64"
    words = pip_install(STAGES[0])
    assert "--only-binary=:all:" in words  # never a source build (no compiler, no emulation)
    assert "--no-deps" in words  # exactly the pinned set
    platforms = option_values(words, "--platform")
    assert platforms and all(
        p.startswith("manylinux") and p.endswith(f"_{machine}") for p in platforms
    )
    assert option_values(words, "--implementation") == ["cp"]
    image = PATCH_TAG.match(expand(STAGES[0].image, ARGUMENTS))
    assert option_values(words, "--python-version") == [f"{image['major']}.{image['minor']}"]
    assert option_values(words, "--target") and option_values(words, "-r") == ["requirements.txt"]


def pinned_requirements() -> dict[str, str]:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        [specifier] = requirement.specifier
        assert specifier.operator == "==", line
        pins[str(canonicalize_name(requirement.name))] = specifier.version
    return pins


def test_the_requirements_pin_every_distribution_the_image_needs():
    # --no-deps installs exactly this list: it must hold every dependency of every entry, at
    # the versions this venv (where the tests run the worker) has.
    pins = pinned_requirements()
    environment = {"platform_machine": "aarch64", "sys_platform": "linux", "extra": ""}
    for name, version in pins.items():
        distribution = importlib.metadata.distribution(name)
        assert distribution.version == version, (name, distribution.version, version)
        for text in distribution.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                assert str(canonicalize_name(requirement.name)) in pins, (name, text)


def wheels_for(command: list[str]) -> str:
    """The wheels ``pip install <command>`` takes, downloaded once into the download cache, keyed
    by what selects them (the platform options and the requirements' content): a second run on
    the same machine fetches nothing."""
    download, words = [], iter(command)  # what pip download takes: all but where to install
    for word in words:
        if word == "--target":
            next(words)
        elif word != "--no-compile" and not word.startswith("--target="):
            download.append(word)
    key = "\0".join(REQUIREMENTS.read_text() if w == str(REQUIREMENTS) else w for w in download)
    wheels = assets.download_cache() / "worker-image-wheels"
    wheels /= hashlib.sha256(key.encode()).hexdigest()[:24]
    if not (wheels / ".complete").exists():
        wheels.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=wheels.parent))
        try:
            pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(partial)]
            result = subprocess.run(
                [*pip, *download],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert result.returncode == 0, result.stderr[-3000:]
            (partial / ".complete").touch()
            partial.rename(wheels)  # fails if another run completed it meanwhile: keep that one
        except OSError:
            if not (wheels / ".complete").exists():
                raise
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return str(wheels)


@pytest.mark.slow
def test_the_build_stage_pip_install_yields_target_wheels_without_emulation(tmp_path):
    machine = MACHINES[image_platform()]
    words = pip_install(STAGES[0])
    target = option_values(words, "--target")[0]
    command = [
        word if word != target else str(tmp_path / "deps")
        for word in words[2:]  # after "pip install"
    ]
    command = [str(REQUIREMENTS) if word == "requirements.txt" else word for word in command]
    wheels = wheels_for(command)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            wheels,
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    deps = tmp_path / "deps"
    installed = {
        str(
            canonicalize_name(importlib.metadata.PathDistribution(info).metadata["Name"])
        ): importlib.metadata.PathDistribution(info).version
        for info in deps.glob("*.dist-info")
    }
    assert installed == pinned_requirements()
    for library in deps.rglob("*.so"):
        header = library.read_bytes()[:20]
        assert int.from_bytes(header[18:20], "little") == ELF_MACHINES[machine], library
