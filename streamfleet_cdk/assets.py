"""Where the runtime's code is, and how it becomes a container image and a Lambda bundle.

The constructs deploy the code of the ``streamfleet`` package that is importable *now*. That
package lives in one of two places:

* **this repository**: ``runtime/streamfleet``, with the worker's build files next to it
  (``runtime/worker/Dockerfile``, ``runtime/requirements.txt``);
* **an installed wheel**: ``site-packages/streamfleet``, where the wheel carries the same build
  files as ``streamfleet/_image/Dockerfile`` and ``streamfleet/_image/requirements.txt``
  (see ``pyproject.toml``).

Neither synth path needs Docker: :func:`stage_worker_image_context` only assembles a build
context that ``ContainerImage.from_asset`` hashes (the image is built at deploy time), and
:func:`router_code` bundles the Lambda by copying the package (:class:`PackageCopy`), never in a
container.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import aws_cdk as cdk
import jsii
from aws_cdk import aws_lambda as lambda_

import streamfleet

PACKAGE_NAME = "streamfleet"
IMAGE_DIR_NAME = "_image"  # inside an installed package: the worker image's build files
DOCKERFILE = "Dockerfile"
REQUIREMENTS = "requirements.txt"

# Build and editor leftovers that must not change an asset's hash.
_SKIPPED_DIRS = frozenset({"__pycache__", IMAGE_DIR_NAME})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")

STAGING_DIR_NAME = "streamfleet-assets"


def runtime_package_dir() -> Path:
    """The directory of the importable ``streamfleet`` package (repository or site-packages)."""
    return Path(streamfleet.__file__).resolve().parent


def worker_image_files(package_dir: Path | None = None) -> tuple[Path, Path]:
    """The worker image's ``(Dockerfile, requirements.txt)``.

    From ``runtime/worker/Dockerfile`` and ``runtime/requirements.txt`` when the package is the
    repository's ``runtime/streamfleet``, else from the installed package's ``_image/``.
    """
    package_dir = package_dir or runtime_package_dir()
    runtime_dir = package_dir.parent
    candidates = (
        (runtime_dir / "worker" / DOCKERFILE, runtime_dir / REQUIREMENTS),  # repository
        (package_dir / IMAGE_DIR_NAME / DOCKERFILE, package_dir / IMAGE_DIR_NAME / REQUIREMENTS),
    )
    for dockerfile, requirements in candidates:
        if dockerfile.is_file() and requirements.is_file():
            return dockerfile, requirements
    searched = ", ".join(str(path) for pair in candidates for path in pair)
    raise FileNotFoundError(f"worker image files: none of {searched} exist")


def package_files(package_dir: Path | None = None) -> Iterator[tuple[str, Path]]:
    """``(relative POSIX path, file)`` of every file of the package, sorted, without caches."""
    package_dir = package_dir or runtime_package_dir()
    found: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in files:
            if name.endswith(_SKIPPED_SUFFIXES):
                continue
            path = Path(root) / name
            found.append((path.relative_to(package_dir).as_posix(), path))
    yield from sorted(found)


def worker_image_layout(package_dir: Path | None = None) -> dict[str, Path]:
    """The worker's build context: relative path in the context -> source file.

    The Dockerfile copies ``requirements.txt`` and ``streamfleet/`` relative to its context.
    """
    package_dir = package_dir or runtime_package_dir()
    dockerfile, requirements = worker_image_files(package_dir)
    layout = {DOCKERFILE: dockerfile, REQUIREMENTS: requirements}
    for relative, path in package_files(package_dir):
        layout[f"{PACKAGE_NAME}/{relative}"] = path
    return layout


def content_hash(layout: Mapping[str, Path]) -> str:
    """SHA-256 over every relative path and file content, in path order."""
    digest = hashlib.sha256()
    for relative in sorted(layout):
        data = layout[relative].read_bytes()
        digest.update(relative.encode())
        digest.update(b"\0")
        digest.update(str(len(data)).encode())
        digest.update(b"\0")
        digest.update(data)
    return digest.hexdigest()


def stage(layout: Mapping[str, Path], staging_root: Path | None = None) -> Path:
    """Copy ``layout`` into ``<staging_root>/<content hash>`` (once) and return that directory.

    The directory name is the content hash, so the same code always stages to the same place
    and an existing directory is complete by construction: it is assembled under a temporary
    name and renamed into place, so a concurrent synth never sees half of it.
    """
    root = staging_root or Path(tempfile.gettempdir()) / STAGING_DIR_NAME
    target = root / content_hash(layout)
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    try:
        for relative, source in layout.items():
            destination = partial / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
        os.rename(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not target.is_dir():  # not a lost race with another synth: a real failure
            raise
    return target


def stage_worker_image_context(
    staging_root: Path | None = None, package_dir: Path | None = None
) -> Path:
    """A directory holding exactly the worker image's build context (Dockerfile,
    requirements.txt, streamfleet/), for ``ecs.ContainerImage.from_asset``."""
    return stage(worker_image_layout(package_dir), staging_root)


@jsii.implements(cdk.ILocalBundling)
class PackageCopy:
    """Local bundling that copies the ``streamfleet`` package into the Lambda bundle.

    The event router needs only the package (pure Python) and boto3, which the Lambda Python
    runtime provides, so there is nothing to install and no reason to start a container.
    """

    def __init__(self, package_dir: Path | None = None) -> None:
        self._package_dir = package_dir or runtime_package_dir()

    def try_bundle(self, output_dir: str, *args: object, **kwargs: object) -> bool:
        destination = Path(output_dir) / PACKAGE_NAME
        for relative, source in package_files(self._package_dir):
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        return True


def router_code(runtime: lambda_.Runtime) -> lambda_.Code:
    """The event router's Lambda code: the ``streamfleet`` package at the bundle's root.

    The hash is the bundle's (``OUTPUT``), so it changes exactly when the copied code does. The
    bundling image is only a fallback CDK requires; :class:`PackageCopy` always succeeds first.
    """
    package_dir = runtime_package_dir()
    return lambda_.Code.from_asset(
        str(package_dir),
        asset_hash_type=cdk.AssetHashType.OUTPUT,
        bundling=cdk.BundlingOptions(image=runtime.bundling_image, local=PackageCopy(package_dir)),
    )
