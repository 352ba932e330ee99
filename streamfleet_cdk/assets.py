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
:func:`lambda_code` bundles a Lambda by copying the package (:class:`PackageCopy`), never in a
container, plus the third-party distributions it names (the WebSocket authorizer's and canary's
``cryptography``, ``PyJWT`` and ``websockets``), each checked against the Lambda runtime it will
run on (:class:`LambdaPythonTarget`) and fetched for it where the installed wheel does not fit.

A function may also carry modules of another top-level package beside ``streamfleet`` (an
application's own routes, such as the demo auction's ``streamfleet_auction``): its entry module
is then that package's, and ``packages`` names where each such package's directory is. The same
import closure decides what of each package it carries.

Every function of the app runs on one runtime and one architecture, :data:`LAMBDA_TARGET`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
WORKER_ENTRY = f"{PACKAGE_NAME}.worker.__main__"  # the image's `python -m streamfleet.worker`


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


def package_files(
    package_dir: Path | None = None,
    entries: tuple[str, ...] | None = None,
    packages: Mapping[str, Path] | None = None,
) -> Iterator[tuple[str, Path]]:
    """``(relative POSIX path, file)`` of every file of the package, sorted, without caches;
    with ``entries`` (module names), only the modules they import (:func:`module_closure`;
    ``packages``: the other top-level packages those may be in)."""
    roots = _roots(package_dir, packages)
    yield from _package_files(roots[PACKAGE_NAME], PACKAGE_NAME, entries, roots)


def bundle_files(
    entries: tuple[str, ...] | None = None,
    packages: Mapping[str, Path] | None = None,
    package_dir: Path | None = None,
) -> list[tuple[str, Path]]:
    """``(path in the bundle, file)``, sorted: ``streamfleet/<relative>`` for the runtime
    package's files and ``<name>/<relative>`` for each of ``packages`` (top-level package name
    -> its directory); with ``entries``, only what they import, whichever package it is in."""
    roots = _roots(package_dir, packages)
    found = [
        (f"{name}/{relative}", path)
        for name, root in roots.items()
        for relative, path in _package_files(root, name, entries, roots)
    ]
    return sorted(found)


def _roots(package_dir: Path | None, packages: Mapping[str, Path] | None) -> dict[str, Path]:
    roots = {PACKAGE_NAME: package_dir or runtime_package_dir()}
    for name, root in (packages or {}).items():
        if name in roots or not name.isidentifier():
            raise ValueError(f"packages: {name!r} is not another top-level package name")
        roots[name] = Path(root)
    return roots


def _package_files(
    root: Path, name: str, entries: tuple[str, ...] | None, roots: Mapping[str, Path]
) -> list[tuple[str, Path]]:
    """:func:`package_files` of any of ``roots``: the one called ``name``, in ``root``."""
    wanted = None if entries is None else {r for n, r in _closure(entries, roots) if n == name}
    found: list[tuple[str, Path]] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for file_name in files:
            if file_name.endswith(_SKIPPED_SUFFIXES):
                continue
            path = Path(directory) / file_name
            relative = path.relative_to(root).as_posix()
            if wanted is not None and not file_name.endswith(".py"):
                # Imports cannot say who reads a data file: ship none rather than guess.
                raise ValueError(
                    f"{name}/{relative}: a data file in the package; no artifact knows it"
                )
            if wanted is None or relative in wanted:
                found.append((relative, path))
    return sorted(found)


def module_closure(
    entries: tuple[str, ...],
    package_dir: Path | None = None,
    packages: Mapping[str, Path] | None = None,
) -> frozenset[str]:
    """The package's files (relative POSIX paths) that ``entries`` import, transitively: each
    module's own file and every package ``__init__.py`` on the way. ``packages``: other
    top-level packages (name -> directory) an entry, or what it imports, may be in; their own
    files are :func:`bundle_files`'.

    Why: an artifact that carries only what it runs changes only when that changes; with the
    whole package in every asset, a comment in the canary rolled the whole fleet. Imports are
    read from each module's syntax tree, anywhere in it (a function's lazy import too); the
    runtime imports nothing by computed name (the artifact tests, which import every handler
    in a clean interpreter from its asset and run the worker from its build context, would
    fail if it did), and holds no data files (:func:`package_files` refuses one).
    """
    roots = _roots(package_dir, packages)
    return frozenset(
        relative for name, relative in _closure(entries, roots) if name == PACKAGE_NAME
    )


def _closure(entries: tuple[str, ...], roots: Mapping[str, Path]) -> frozenset[tuple[str, str]]:
    """``(top-level package, relative path)`` of every file ``entries`` import, transitively."""
    found: set[tuple[str, str]] = set()
    queue = list(entries)
    while queue:
        module = queue.pop()
        path = _module_file(module, roots)
        if path is None:
            known = ", ".join(f"{name} in {root}" for name, root in roots.items())
            raise ValueError(f"{module}: not a module of {known}")
        top = module.split(".")[0]
        key = (top, path.relative_to(roots[top]).as_posix())
        if key in found:
            continue
        found.add(key)
        parts = module.split(".")
        queue += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages on the way
        queue += _imports_of(module, path, roots)
    return frozenset(found)


def module_imports(module: str, package_dir: Path | None = None) -> frozenset[str]:
    """The package's modules that ``module`` imports directly (packages on the way excluded)."""
    roots = _roots(package_dir, None)
    path = _module_file(module, roots)
    if path is None:
        raise ValueError(f"{module}: not a module of {PACKAGE_NAME} in {roots[PACKAGE_NAME]}")
    return frozenset(name for name in _imports_of(module, path, roots) if name != module)


def _module_file(module: str, roots: Mapping[str, Path]) -> Path | None:
    parts = module.split(".")
    root = roots.get(parts[0])
    if root is None:
        return None
    base = root.joinpath(*parts[1:])
    candidates = [base / "__init__.py", *([base.with_suffix(".py")] if len(parts) > 1 else [])]
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def _imports_of(module: str, path: Path, roots: Mapping[str, Path]) -> list[str]:
    """The modules of ``roots``' packages that ``module`` (in ``path``) names in an import."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from package import name` names a submodule, or something of the package itself.
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            names += submodules
            if any(_module_file(name, roots) is None for name in submodules):
                names.append(base)
    return [name for name in names if _module_file(name, roots) is not None]


def worker_image_layout(package_dir: Path | None = None) -> dict[str, Path]:
    """The worker's build context: relative path in the context -> source file.

    The Dockerfile copies ``requirements.txt`` and ``streamfleet/`` relative to its context:
    of the package, only what the worker's entry point imports.
    """
    package_dir = package_dir or runtime_package_dir()
    dockerfile, requirements = worker_image_files(package_dir)
    layout = {DOCKERFILE: dockerfile, REQUIREMENTS: requirements}
    for relative, path in package_files(package_dir, (WORKER_ENTRY,)):
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
    """Local bundling that copies the ``streamfleet`` package (and ``packages``, other top-level
    packages by name and directory) into the Lambda bundle: with ``entries``, only the modules
    they import (:func:`bundle_files`).

    The event router needs only the package (pure Python) and boto3, which the Lambda Python
    runtime provides, so there is nothing to install and no reason to start a container.
    """

    def __init__(
        self,
        package_dir: Path | None = None,
        entries: tuple[str, ...] | None = None,
        packages: Mapping[str, Path] | None = None,
    ) -> None:
        self._package_dir = package_dir or runtime_package_dir()
        self._entries = entries
        self._packages = dict(packages or {})

    def try_bundle(self, output_dir: str, *args: object, **kwargs: object) -> bool:
        files = bundle_files(self._entries, self._packages, self._package_dir)
        for relative, source in files:
            target = Path(output_dir) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        return True


# --- Lambda bundles with third-party distributions ---------------------------------------------
#
# The WebSocket API's authorizer needs ``PyJWT`` and ``cryptography`` (compiled), the canary
# ``websockets`` too. They are bundled without Docker, from the distributions installed in the
# interpreter that runs the synth, after checking each one's wheel tags against the Lambda
# runtime it will run on. The synth interpreter is rarely that runtime: this venv's cryptography
# wheel is ``cp311-abi3-manylinux_2_34_x86_64`` and loads cffi's ``_cffi_backend``, a
# ``cp311-cp311`` x86_64 extension, while every function runs CPython 3.14 on arm64. A
# distribution whose installed wheel does not fit is therefore fetched once, as the same version
# built for the target (``pip install --platform ... --only-binary=:all:``, from PyPI or pip's
# cache), and kept in a staging cache; the others (pure Python) are copied as installed.

RUNTIME_PROVIDED_DISTRIBUTIONS = frozenset(
    # What every Lambda Python runtime ships: never bundled, so the runtime's copy is used.
    {"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"}
)
FETCHED_DIR_NAME = "fetched-wheels"
_OLDEST_MANYLINUX_GLIBC_MINOR = 5
# PEP 600 names of the older manylinux tags, by the glibc minor they stand for.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass(frozen=True)
class LambdaPythonTarget:
    """The interpreter a Lambda bundle runs on: CPython version, CPU and glibc of the runtime.

    Attributes:
        runtime: the Lambda runtime.
        architecture: the Lambda architecture.
        python: ``(major, minor)`` of the runtime's CPython.
        machine: the wheel-tag spelling of the CPU (``x86_64``, ``aarch64``).
        glibc: ``(major, minor)`` of the runtime's C library (Amazon Linux 2: 2.26; 2023: 2.34).
    """

    runtime: lambda_.Runtime
    architecture: lambda_.Architecture
    python: tuple[int, int]
    machine: str
    glibc: tuple[int, int]

    @property
    def python_tag(self) -> str:
        return f"cp{self.python[0]}{self.python[1]}"

    @property
    def platforms(self) -> tuple[str, ...]:
        """Every platform tag a wheel may carry to run here, newest first."""
        major, newest = self.glibc
        names: list[str] = []
        for minor in range(newest, _OLDEST_MANYLINUX_GLIBC_MINOR - 1, -1):
            names.append(f"manylinux_{major}_{minor}_{self.machine}")
            if minor in _LEGACY_MANYLINUX:
                names.append(f"{_LEGACY_MANYLINUX[minor]}_{self.machine}")
        return tuple(names)

    def supported_tags(self) -> frozenset[str]:
        """Every ``python-abi-platform`` wheel tag this target can import."""
        from packaging import tags

        platforms = [*self.platforms, "any"]
        cpython = tags.cpython_tags(self.python, abis=[self.python_tag], platforms=platforms)
        generic = tags.compatible_tags(self.python, self.python_tag, platforms)
        return frozenset(str(tag) for tag in (*cpython, *generic))

    def accepts(self, wheel_tags: tuple[str, ...]) -> bool:
        """Whether a wheel with these tags (``WHEEL``'s ``Tag:`` lines) runs here."""
        from packaging.tags import parse_tag

        supported = self.supported_tags()
        return any(str(tag) in supported for text in wheel_tags for tag in parse_tag(text))

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values of this target (which dependencies a distribution needs)."""
        version = f"{self.python[0]}.{self.python[1]}"
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{version}.0",
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_system": "Linux",
            "python_full_version": f"{version}.0",
            "python_version": version,
            "sys_platform": "linux",
            "extra": "",
        }

    @property
    def description(self) -> str:
        """``python3.14/arm64/glibc2.34``: what a bundle for this target is built for."""
        return f"{self.runtime.name}/{self.architecture.name}/glibc{self.glibc[0]}.{self.glibc[1]}"


PYTHON_3_14_ARM64 = LambdaPythonTarget(
    runtime=lambda_.Runtime.PYTHON_3_14,
    architecture=lambda_.Architecture.ARM_64,
    python=(3, 14),
    machine="aarch64",
    glibc=(2, 34),  # the Python 3.12+ runtimes run on Amazon Linux 2023
)

# The one runtime and architecture of every function: the newest Python CDK knows (cdk-nag's
# AwsSolutions-L1 asks for it) on Graviton (cheaper per GB-second than x86_64). Compiled
# dependencies are fetched for it (cp314, manylinux aarch64) whatever the synth machine runs.
LAMBDA_TARGET = PYTHON_3_14_ARM64


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def distribution_closure(
    names: tuple[str, ...],
    target: LambdaPythonTarget,
    *,
    skip: frozenset[str] = RUNTIME_PROVIDED_DISTRIBUTIONS,
) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` and everything they require on ``target``
    (markers evaluated for the target, extras not followed), minus ``skip``, sorted by name."""
    from packaging.requirements import Requirement

    environment = target.marker_environment()
    skipped = {_canonical(name) for name in skip}
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = [_canonical(name) for name in names]
    while pending:
        name = pending.pop()
        if name in found or name in skipped:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ModuleNotFoundError(
                f"{name}: not installed in this interpreter ({sys.executable}); the Lambda "
                "bundle is assembled from the synth environment's packages"
            ) from None
        found[name] = distribution
        for text in distribution.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                pending.append(_canonical(requirement.name))
    return [found[name] for name in sorted(found)]


def wheel_tags(distribution: importlib.metadata.Distribution) -> tuple[str, ...]:
    """The ``Tag:`` lines of an installed distribution's ``WHEEL`` file (none: unknown)."""
    text = distribution.read_text("WHEEL") or ""
    return tuple(
        line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("Tag:")
    )


def installed_files(distribution: importlib.metadata.Distribution) -> list[tuple[str, Path]]:
    """``(path relative to site-packages, file)`` of an installed distribution, from its
    ``RECORD``: without caches and without files installed outside site-packages (scripts)."""
    found: list[tuple[str, Path]] = []
    for record in distribution.files or ():
        relative = record.as_posix()
        parts = relative.split("/")
        if ".." in parts or any(part in _SKIPPED_DIRS for part in parts):
            continue
        if relative.endswith(_SKIPPED_SUFFIXES):
            continue
        found.append((relative, Path(str(distribution.locate_file(record)))))
    return sorted(found)


def download_cache() -> Path:
    """Where what was fetched from PyPI is kept across synths and test runs, each entry keyed by
    what it holds: ``$XDG_CACHE_HOME/streamfleet``, by default ``~/.cache/streamfleet``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamfleet"


def fetch_distribution(
    name: str, version: str, target: LambdaPythonTarget, staging_root: Path | None = None
) -> Path:
    """``name==version`` built for ``target``, installed (once) into a staging directory.

    ``pip install --target --platform ... --only-binary=:all:`` needs neither Docker nor a
    compiler: it only unpacks the published wheel for the target's platform. The directory's
    name is a hash of what it holds, so later synths reuse it without the network.
    """
    root = (
        (staging_root / FETCHED_DIR_NAME) if staging_root else download_cache() / FETCHED_DIR_NAME
    )
    key = f"{_canonical(name)}=={version}|{target.python_tag}|{','.join(target.platforms)}"
    destination = root / hashlib.sha256(key.encode()).hexdigest()
    if destination.is_dir():
        return destination
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-compile",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        f"{target.python[0]}.{target.python[1]}",
        *(item for abi in (target.python_tag, "abi3", "none") for item in ("--abi", abi)),
        *(item for platform in target.platforms for item in ("--platform", platform)),
        "--target",
        str(partial),
        f"{name}=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(
            f"{name}: the installed wheel does not run on {target.runtime.name} "
            f"({target.machine}, glibc {target.glibc[0]}.{target.glibc[1]}) and fetching "
            f"{name}=={version} for it failed (pip needs PyPI once, or a wheel in "
            f"PIP_FIND_LINKS):\n{result.stderr[-2000:]}"
        )
    shutil.rmtree(partial / "bin", ignore_errors=True)
    try:
        os.rename(partial, destination)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not destination.is_dir():
            raise
    return destination


def _copy_tree(source: Path, destination: Path) -> None:
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in sorted(files):
            if name.endswith(_SKIPPED_SUFFIXES):
                continue
            path = Path(root) / name
            target = destination / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def bundle_distributions(
    names: tuple[str, ...],
    target: LambdaPythonTarget,
    output_dir: Path,
    *,
    skip: frozenset[str] = RUNTIME_PROVIDED_DISTRIBUTIONS,
    staging_root: Path | None = None,
) -> list[str]:
    """Put ``names`` and their dependencies, as ``target`` can import them, into
    ``output_dir``; returns ``name==version`` of each, and how it got there."""
    bundled: list[str] = []
    for distribution in distribution_closure(names, target, skip=skip):
        name, version = distribution.metadata["Name"], distribution.version
        if target.accepts(wheel_tags(distribution)):
            for relative, source in installed_files(distribution):
                destination = output_dir / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)
            bundled.append(f"{name}=={version} (copied)")
        else:
            _copy_tree(fetch_distribution(name, version, target, staging_root), output_dir)
            bundled.append(f"{name}=={version} (fetched for {target.runtime.name})")
    return bundled


@jsii.implements(cdk.ILocalBundling)
class SitePackagesBundling:
    """Local bundling of the ``streamfleet`` package plus third-party distributions.

    The distributions come from the synth interpreter's site-packages when their wheel tags fit
    ``target`` (see :func:`bundle_distributions`), else from :func:`fetch_distribution`. The
    Lambda runtime's own packages (boto3 and its dependencies) are left out.
    """

    def __init__(
        self,
        distributions: tuple[str, ...],
        target: LambdaPythonTarget,
        *,
        package_dir: Path | None = None,
        staging_root: Path | None = None,
        entries: tuple[str, ...] | None = None,
        packages: Mapping[str, Path] | None = None,
    ) -> None:
        self.distributions = distributions
        self.target = target
        self._package = PackageCopy(package_dir, entries, packages)
        self._staging_root = staging_root

    def try_bundle(self, output_dir: str, *args: object, **kwargs: object) -> bool:
        self._package.try_bundle(output_dir)
        bundle_distributions(
            self.distributions, self.target, Path(output_dir), staging_root=self._staging_root
        )
        return True


def bundle_declaration(
    distributions: tuple[str, ...],
    target: LambdaPythonTarget,
    packages: tuple[str, ...] = (),
) -> str:
    """What a bundle holds, in words: the package (and ``packages``, the other top-level
    packages it carries), each distribution ``name==version`` of the closure, and the target,
    e.g. ``streamfleet + cryptography==50.0.2 + ... for python3.14/arm64/glibc2.34``. Two
    bundles with different contents never have the same declaration."""
    closure = distribution_closure(distributions, target) if distributions else []
    parts = [
        PACKAGE_NAME,
        *packages,
        *(f"{_canonical(d.metadata['Name'])}=={d.version}" for d in closure),
    ]
    return f"{' + '.join(parts)} for {target.description}"


def bundle_fingerprint(
    distributions: tuple[str, ...],
    target: LambdaPythonTarget,
    package_dir: Path | None = None,
    entries: tuple[str, ...] | None = None,
    packages: Mapping[str, Path] | None = None,
) -> str:
    """SHA-256 of what a bundle declares: every file of the packages it carries (path and
    content) and :func:`bundle_declaration` (each distribution's version, the target). The
    third-party files follow from those: the same version for the same target is the same
    wheel."""
    package_dir = package_dir or runtime_package_dir()
    layout = dict(bundle_files(entries, packages, package_dir))
    declared = bundle_declaration(distributions, target, tuple(sorted(packages or {})))
    digest = hashlib.sha256(declared.encode())
    digest.update(b"\0")
    digest.update(content_hash(layout).encode())
    return digest.hexdigest()


def lambda_code(
    distributions: tuple[str, ...] = (),
    target: LambdaPythonTarget = LAMBDA_TARGET,
    *,
    entries: tuple[str, ...] | None = None,
    packages: Mapping[str, Path] | None = None,
) -> lambda_.Code:
    """Lambda code: the ``streamfleet`` package (with ``entries``, only the modules they import:
    a function's handler module) and ``distributions`` (with their dependencies) built for
    ``target``; with no distributions, the package alone (boto3 comes from the Lambda
    runtime). ``packages``: other top-level packages (name -> directory) the entry may be in
    or import, carried the same way.

    The asset hash is :func:`bundle_fingerprint`, the bundle's declared contents. CDK caches
    staged assets by source path, bundling options and asset hash, and a local bundler is not
    part of that key: with a hash of the bundle's *output* (computed after the cache lookup),
    every bundle of this source directory with the same bundling image got the first one's
    contents (the canary once shipped with the authorizer's bundle, without ``websockets``).
    The bundling image is only a fallback CDK requires; the local bundler always succeeds first.
    """
    package_dir = runtime_package_dir()
    local: PackageCopy | SitePackagesBundling = (
        SitePackagesBundling(
            distributions, target, package_dir=package_dir, entries=entries, packages=packages
        )
        if distributions
        else PackageCopy(package_dir, entries, packages)
    )
    return lambda_.Code.from_asset(
        str(package_dir),
        asset_hash_type=cdk.AssetHashType.CUSTOM,
        asset_hash=bundle_fingerprint(distributions, target, package_dir, entries, packages),
        bundling=cdk.BundlingOptions(image=target.runtime.bundling_image, local=local),
    )
