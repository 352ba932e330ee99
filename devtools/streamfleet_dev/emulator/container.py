"""Run a task definition's container locally: the image's command, code and environment.

No Docker here, so the image is reproduced from its build context (the asset directory the
assembly holds): the process is the container's command (``EntryPoint``/``Command`` or the
image's ``ENTRYPOINT``/``CMD``, :meth:`~streamfleet_dev.assembly.ContainerSpec.argv`), run in the
build context where the image has its ``WORKDIR`` (the image copies the context's code there),
with the image's ``ENV`` and then the container's ``Environment``, and ``python`` on ``PATH``
being an interpreter with exactly the image's ``requirements.txt`` installed (a cached
virtualenv, :func:`image_python`), not the project's virtualenv.

What cannot be the same locally is said by name: paths inside the image map to the build
context (:func:`container_launch`), and ``overrides`` (a free health port per process, the
endpoint variables of local servers, a worker id) are the caller's, listed in one place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamfleet_dev import lifeline
from streamfleet_dev.assembly import ContainerSpec
from streamfleet_dev.cache import download_cache
from streamfleet_dev.emulator.servers import RUN_MARKS

IMAGE_ENV_DIR_NAME = "streamfleet-image-python"


@dataclass(frozen=True)
class ContainerLaunch:
    """How to start the container's process here: ``subprocess.Popen(argv, env=env, cwd=cwd)``."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


def image_python(image_dir: Path, cache_root: Path | None = None) -> Path:
    """The ``bin`` directory of a virtualenv holding the image's ``requirements.txt`` (pip
    install, as the image's build stage does; cached by the requirements' content)."""
    requirements = image_dir / "requirements.txt"
    text = requirements.read_text() if requirements.is_file() else ""
    dockerfile = image_dir / "Dockerfile"
    # An image that installs with --no-deps has only what the file lists: so must this.
    no_deps = dockerfile.is_file() and "--no-deps" in dockerfile.read_text()
    digest = hashlib.sha256(f"{text}{sys.version}{no_deps}".encode()).hexdigest()[:24]
    root = cache_root or download_cache() / IMAGE_ENV_DIR_NAME
    target = root / digest
    if (target / "bin" / "python").exists() and (target / ".complete").exists():
        return target / "bin"
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    try:
        lifeline.run(
            [sys.executable, "-m", "venv", "--without-pip", str(partial)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        site = Path(
            sysconfig.get_path("purelib", vars={"base": str(partial), "platbase": str(partial)})
        )
        if text.strip():
            result = lifeline.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-compile",
                    *(["--no-deps"] if no_deps else []),
                    "--target",
                    str(site),
                    "-r",
                    str(requirements),
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
            if result.returncode != 0:
                raise RuntimeError(f"{requirements}: pip install failed:\n{result.stderr[-2000:]}")
        (partial / ".complete").touch()
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / ".complete").exists():
            raise
    return target / "bin"


def _map_paths(value: str, workdir: str, image_dir: Path) -> str:
    """``/app`` (and ``/app/x``, and entries of a ``:``-separated list) -> the build context."""
    if workdir in ("", "/"):
        return value
    parts = []
    for part in value.split(os.pathsep):
        if part == workdir or part.startswith(workdir.rstrip("/") + "/"):
            part = str(image_dir) + part[len(workdir.rstrip("/")) :]
        parts.append(part)
    return os.pathsep.join(parts)


def container_launch(
    container: ContainerSpec,
    environment: Mapping[str, str],
    *,
    image_bin: Path,
    overrides: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> ContainerLaunch:
    """The container's process as a local launch.

    Args:
        container: the task definition's container (its image must be an asset).
        environment: its ``Environment`` with references resolved to local values.
        image_bin: :func:`image_python`'s directory (``python`` there).
        overrides: variables that must differ locally (each one a decision of the caller).
        base_env: a minimal host environment to start from (default: only ``HOME``, ``LANG``).
    """
    if container.image_dir is None:
        raise ValueError(f"{container.name}: its image is not an asset of the assembly")
    image = container.image
    env = dict(base_env if base_env is not None else _minimal_host_env())
    env["PATH"] = f"{image_bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    for name, value in image.env.items():
        env[name] = _map_paths(value, image.workdir, container.image_dir)
    env.update(environment)
    env.update(overrides or {})
    argv = tuple(_map_paths(a, image.workdir, container.image_dir) for a in container.argv())
    if not argv:
        raise ValueError(f"{container.name}: neither the container nor the image has a command")
    return ContainerLaunch(argv=argv, env=env, cwd=container.image_dir)


def _minimal_host_env() -> dict[str, str]:
    passed = ("HOME", "LANG", "TMPDIR", *RUN_MARKS)
    return {name: os.environ[name] for name in passed if name in os.environ}
