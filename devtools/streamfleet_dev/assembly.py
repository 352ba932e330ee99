"""The synthesized cloud assembly: what ``cdk deploy`` would ship, read back as plain data.

Tests and local mode run *these* artifacts instead of whatever the repository happens to
import: each Lambda function's asset directory with the template's handler, runtime and
environment; each table's key schema, indexes, TTL and stream from its template; the worker
task definition's command (the image's ``ENTRYPOINT``/``CMD`` unless the container overrides
them) and environment (the image's ``ENV`` plus the container's); the policies of each role.

:func:`synthesize` runs the real app (``cdk synth``, the CLI that ``make synth`` runs) into a
cache directory named by a hash of everything the synth reads, so a test session or a local run
pays for one synth only when an input changed. :func:`load` reads any assembly directory
(``cdk.out`` included). Values in a template are often CloudFormation intrinsics (``Ref``,
``Fn::GetAtt``, ``Fn::Join``, ``Fn::Sub``...): :func:`resolve` evaluates them against
:class:`Bindings`, which say what each logical id stands for *here* (a local table's name, a
local queue's URL) or in the template's own terms (:meth:`Stack.template_bindings`).

Nothing here imports ``aws_cdk``: the assembly is JSON, and reading it must not depend on the
code that wrote it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfleet_dev import lifeline

REPO_ROOT = Path(__file__).resolve().parents[2]
ASSEMBLY_ENV = "STREAMFLEET_ASSEMBLY"  # use this assembly directory instead of synthesizing
CACHE_ENV = "STREAMFLEET_ASSEMBLY_CACHE"  # where synthesized assemblies are kept
CACHE_DIR_NAME = "streamfleet-assembly"
# The account every local synth is pinned to: moto's default account, so that ARNs built by
# the templates and ARNs of local resources name the same account.
LOCAL_ACCOUNT = "123456789012"
CONTEXT_PREFIX = "streamfleet:"
SYNTH_TIMEOUT_SECONDS = 600
KEEP_ASSEMBLIES = 10  # cached assemblies kept (each holds all its assets)

# What `cdk synth` reads: the app, its context, the constructs and stacks, and the runtime code
# that becomes the assets (the demo auction's too). Caches and editor leftovers are not inputs.
_INPUT_PATHS = (
    "app.py",
    "cdk.json",
    "cdk.context.json",
    "pyproject.toml",
    "requirements.txt",
    "package-lock.json",
    "stacks",
    "streamfleet_cdk",
    "runtime",
    "examples",
)
_SKIPPED_PARTS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


class AssemblyError(RuntimeError):
    """The assembly cannot be synthesized or does not hold what was asked for."""


class UnresolvedReference(AssemblyError):
    """An intrinsic names a logical id, attribute or pseudo parameter the bindings lack."""


# --- Synthesis ----------------------------------------------------------------------------------


def context_key(name: str) -> str:
    """``streamfleet:<name>``: the CDK context key of an app setting."""
    return name if ":" in name else f"{CONTEXT_PREFIX}{name}"


def _input_files(repo_root: Path) -> Iterator[tuple[str, Path]]:
    for entry in _INPUT_PATHS:
        path = repo_root / entry
        if path.is_file():
            yield entry, path
        elif path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_PARTS)
                for name in sorted(files):
                    if not name.endswith(_SKIPPED_SUFFIXES):
                        file = Path(root) / name
                        yield file.relative_to(repo_root).as_posix(), file


def _installed_distributions() -> list[str]:
    # Bundling copies (or fetches) the synth interpreter's packages: their versions are inputs.
    import importlib.metadata

    found = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()}
    return sorted(found)


def inputs_hash(context: Mapping[str, Any], repo_root: Path = REPO_ROOT) -> str:
    """SHA-256 over every synth input: files, context, interpreter and installed packages."""
    digest = hashlib.sha256()
    for relative, path in _input_files(repo_root):
        data = path.read_bytes()
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
    digest.update(json.dumps(dict(context), sort_keys=True, default=str).encode())
    digest.update(sys.version.encode())
    digest.update("\n".join(_installed_distributions()).encode())
    return digest.hexdigest()


def cache_root() -> Path:
    """``$STREAMFLEET_ASSEMBLY_CACHE``, else ``<tmp>/streamfleet-assembly``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / CACHE_DIR_NAME


def _cdk_command(repo_root: Path) -> list[str]:
    cli = repo_root / "node_modules" / ".bin" / "cdk"
    if not cli.exists():
        raise AssemblyError(
            f"{cli}: the CDK CLI is not installed (run `make setup`, or set {ASSEMBLY_ENV} to "
            "an existing cdk.out)"
        )
    return [str(cli)]


def _context_text(value: Any) -> str:
    # `-c key=value` hands the app a string; AppConfig parses lists as comma-separated text.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def synthesize(
    context: Mapping[str, Any] | None = None,
    *,
    root: Path | None = None,
    repo_root: Path = REPO_ROOT,
) -> Path:
    """Synthesize the real app with ``context`` added to ``cdk.json``'s; return the directory.

    Keys without a ``:`` get the ``streamfleet:`` prefix; ``account`` defaults to
    :data:`LOCAL_ACCOUNT` so the result does not depend on ambient credentials. The assembly
    lands in ``<root>/<inputs hash>``, assembled under a temporary name and renamed into place,
    so concurrent runs never see half of one and an existing one is reused as is.
    """
    merged = {context_key("account"): LOCAL_ACCOUNT}
    merged.update({context_key(k): v for k, v in (context or {}).items()})
    root = root or cache_root()
    target = root / inputs_hash(merged, repo_root)
    if (target / "manifest.json").is_file():
        os.utime(target)  # recently used: kept by the pruning
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    command = [*_cdk_command(repo_root), "synth", "--quiet", "--no-notices", "-o", str(partial)]
    for key, value in merged.items():
        command += ["-c", f"{key}={_context_text(value)}"]
    env = {
        **os.environ,
        # cdk.json runs `python3 app.py`: make that this interpreter, with the repo's paths.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(
            str(repo_root / part) for part in ("runtime", "devtools", "examples/auction", ".")
        ),
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for name in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION"):
        env.pop(name, None)  # the account is pinned in context; regions come from context
    result = lifeline.run(
        command,
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=SYNTH_TIMEOUT_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise AssemblyError(
            f"cdk synth failed ({result.returncode}):\n{(result.stderr or result.stdout)[-4000:]}"
        )
    try:
        os.rename(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / "manifest.json").is_file():
            raise
    _prune(root, keep=target)
    return target


def _prune(root: Path, *, keep: Path) -> None:
    """Drop cached assemblies beyond the newest :data:`KEEP_ASSEMBLIES` that are also older than
    an hour (another run may still read a recent one); each one holds every asset."""

    def modified(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:  # another run pruned it just now
            return 0.0

    cached = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and p != keep),
        key=modified,
        reverse=True,
    )
    cutoff = time.time() - 3600
    for stale in cached[KEEP_ASSEMBLIES - 1 :]:
        if modified(stale) < cutoff:
            shutil.rmtree(stale, ignore_errors=True)


_DEFAULT_LOCK = threading.Lock()


def default_assembly() -> CloudAssembly:
    """The assembly of the app as ``cdk.json`` configures it: ``$STREAMFLEET_ASSEMBLY`` if set
    (an existing ``cdk.out``), else one cached :func:`synthesize` (once per process, whichever
    thread asks first; the others wait for it)."""
    with _DEFAULT_LOCK:
        return _default_assembly()


@functools.cache
def _default_assembly() -> CloudAssembly:
    configured = os.environ.get(ASSEMBLY_ENV)
    return load(Path(configured) if configured else synthesize())


# --- Reading ------------------------------------------------------------------------------------


def load(directory: Path | str) -> CloudAssembly:
    """Read the stacks of the assembly in ``directory`` (its ``manifest.json``)."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise AssemblyError(f"{manifest_path}: not a cloud assembly (no manifest.json)")
    manifest = json.loads(manifest_path.read_text())
    stacks = []
    for name, artifact in sorted(manifest.get("artifacts", {}).items()):
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        account, region = _environment(artifact.get("environment", ""))
        assets_path = directory / f"{name}.assets.json"
        stacks.append(
            Stack(
                name=name,
                account=account,
                region=region,
                template=json.loads((directory / properties["templateFile"]).read_text()),
                directory=directory,
                assets=json.loads(assets_path.read_text()) if assets_path.is_file() else {},
                bootstrap_version=int(properties.get("requiresBootstrapStackVersion", 0) or 0),
                bootstrap_parameter=properties.get("bootstrapStackVersionSsmParameter"),
            )
        )
    return CloudAssembly(directory=directory, stacks=tuple(stacks))


def _environment(text: str) -> tuple[str, str]:
    match = re.fullmatch(r"aws://([^/]+)/([^/]+)", text)
    if not match:
        raise AssemblyError(f"environment: {text!r} is not aws://<account>/<region>")
    return match.group(1), match.group(2)


@dataclass(frozen=True)
class CloudAssembly:
    """The stacks of one synthesized assembly."""

    directory: Path
    stacks: tuple[Stack, ...]

    def stack(self, name: str) -> Stack:
        for stack in self.stacks:
            if stack.name == name:
                return stack
        names = ", ".join(s.name for s in self.stacks)
        raise AssemblyError(f"stack: no {name!r} in the assembly (it has {names})")

    def functions(self) -> list[FunctionSpec]:
        """Every Lambda function of every stack."""
        return [function for stack in self.stacks for function in stack.functions()]

    def table(self, table_name: str) -> TableDefinition:
        """The table declared with this physical name (``TableName``) in any stack."""
        found = [t for s in self.stacks for t in s.tables() if t.table_name == table_name]
        if not found:
            declared = sorted(
                {t.table_name or t.logical_id for s in self.stacks for t in s.tables()}
            )
            raise AssemblyError(
                f"table_name: no table {table_name!r} in the assembly (declared: {declared})"
            )
        return found[0]


@dataclass(frozen=True)
class FunctionSpec:
    """One Lambda function as the template declares it.

    Attributes:
        stack: the stack's name.
        logical_id: its logical id in the template.
        path: its construct path (``aws:cdk:path``), the name people recognise.
        handler: the ``Handler`` string (``module.function``).
        runtime: the ``Runtime`` (``python3.14``...).
        architectures: ``Architectures`` (default ``x86_64``).
        environment: ``Environment.Variables``, unresolved (may hold intrinsics).
        role: the logical id of its execution role (``None``: an imported role).
        asset_dir: the asset directory its code comes from (``None``: inline or external code).
        timeout_seconds: ``Timeout`` (Lambda's default 3 s when absent).
        memory_mb: ``MemorySize`` (default 128).
        log_format: ``LoggingConfig.LogFormat`` (``Text`` when absent).
        log_level: ``LoggingConfig.ApplicationLogLevel`` (``None``: no filter).
    """

    stack: str
    logical_id: str
    path: str
    handler: str
    runtime: str
    architectures: tuple[str, ...]
    environment: Mapping[str, Any]
    role: str | None
    asset_dir: Path | None
    timeout_seconds: int
    memory_mb: int
    log_format: str = "Text"
    log_level: str | None = None

    @property
    def label(self) -> str:
        """``<construct path>`` without the ``/Resource`` suffix: what a failure names."""
        return self.path.removesuffix("/Resource")

    @property
    def is_python(self) -> bool:
        return self.runtime.startswith("python")

    @property
    def architecture(self) -> str:
        return self.architectures[0] if self.architectures else "x86_64"


@dataclass(frozen=True)
class IndexDefinition:
    """A global secondary index: name, key schema and projection, as in ``CreateTable``."""

    name: str
    key_schema: tuple[Mapping[str, str], ...]
    projection: Mapping[str, Any]

    def request(self) -> dict[str, Any]:
        return {
            "IndexName": self.name,
            "KeySchema": [dict(k) for k in self.key_schema],
            "Projection": json.loads(json.dumps(self.projection)),
        }


@dataclass(frozen=True)
class TableDefinition:
    """A DynamoDB table (``AWS::DynamoDB::Table`` or ``GlobalTable``) as the template declares it.

    Attributes:
        logical_id: its logical id.
        table_name: ``TableName`` (``None``: CloudFormation would generate one).
        key_schema: ``KeySchema``.
        attribute_definitions: ``AttributeDefinitions`` (every key attribute and its type).
        indexes: the global secondary indexes.
        ttl_attribute: the TTL attribute when TTL is enabled.
        stream_view_type: the stream's view type when the table has a stream.
        replica_regions: the Regions of a global table's replicas (``()`` for a plain table).
    """

    logical_id: str
    table_name: str | None
    key_schema: tuple[Mapping[str, str], ...]
    attribute_definitions: tuple[Mapping[str, str], ...]
    indexes: tuple[IndexDefinition, ...]
    ttl_attribute: str | None
    stream_view_type: str | None
    replica_regions: tuple[str, ...]

    def create_table_request(self, table_name: str) -> dict[str, Any]:
        """``CreateTable`` parameters for a table of this definition named ``table_name``
        (on-demand, like every table of the app; TTL needs its own ``UpdateTimeToLive``)."""
        request: dict[str, Any] = {
            "TableName": table_name,
            "AttributeDefinitions": [dict(a) for a in self.attribute_definitions],
            "KeySchema": [dict(k) for k in self.key_schema],
            "BillingMode": "PAY_PER_REQUEST",
        }
        if self.indexes:
            request["GlobalSecondaryIndexes"] = [index.request() for index in self.indexes]
        if self.stream_view_type:
            request["StreamSpecification"] = {
                "StreamEnabled": True,
                "StreamViewType": self.stream_view_type,
            }
        return request

    def index(self, name: str) -> IndexDefinition:
        for index in self.indexes:
            if index.name == name:
                return index
        raise AssemblyError(f"index: {self.table_name} has no index {name!r}")


@dataclass(frozen=True)
class QueueDefinition:
    """An SQS queue: its properties as declared (may hold intrinsics)."""

    logical_id: str
    properties: Mapping[str, Any]

    @property
    def dead_letter_queue(self) -> str | None:
        """The logical id of its dead-letter queue, if its redrive policy names one."""
        target = (self.properties.get("RedrivePolicy") or {}).get("deadLetterTargetArn")
        if isinstance(target, Mapping) and "Fn::GetAtt" in target:
            return target["Fn::GetAtt"][0]
        return None


@dataclass(frozen=True)
class ImageFacts:
    """What a container image's Dockerfile says about how it runs (its final stage)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str | None = None


@dataclass(frozen=True)
class ContainerSpec:
    """One container of an ECS task definition, with the image it runs.

    Attributes:
        stack: the stack's name.
        task_logical_id: the task definition's logical id.
        name: the container's name.
        environment: the container's ``Environment``, unresolved (may hold intrinsics).
        command: the container's ``Command`` (``()``: the image's ``CMD``).
        entry_point: the container's ``EntryPoint`` (``()``: the image's ``ENTRYPOINT``).
        image_dir: the image asset's build context (``None``: an image from a registry).
        platform: the image asset's platform (``linux/arm64``...).
        task_role: the logical id of the task role.
        cpu_architecture: the task's ``RuntimePlatform.CpuArchitecture``.
        stop_timeout: the container's ``StopTimeout`` (seconds; ECS's default 30).
    """

    stack: str
    task_logical_id: str
    name: str
    environment: Mapping[str, Any]
    command: tuple[str, ...]
    entry_point: tuple[str, ...]
    image_dir: Path | None
    platform: str | None
    task_role: str | None
    cpu_architecture: str | None
    stop_timeout: int

    @functools.cached_property
    def image(self) -> ImageFacts:
        """The image's ``ENTRYPOINT``, ``CMD``, ``ENV``, ``WORKDIR`` (from its Dockerfile)."""
        if self.image_dir is None:
            return ImageFacts()
        return parse_dockerfile((self.image_dir / "Dockerfile").read_text())

    def argv(self) -> list[str]:
        """The process ECS starts: ``EntryPoint`` or the image's ``ENTRYPOINT``, then
        ``Command`` or (unless the entry point was overridden) the image's ``CMD``."""
        entry = list(self.entry_point or self.image.entrypoint)
        if self.command:
            return entry + list(self.command)
        return entry + ([] if self.entry_point else list(self.image.cmd))


@dataclass(frozen=True)
class Statement:
    """One IAM policy statement, unresolved (``Resource`` may hold intrinsics)."""

    effect: str
    actions: tuple[str, ...]
    resources: tuple[Any, ...]
    conditions: Mapping[str, Mapping[str, Any]]
    source: str  # the policy's logical id

    @classmethod
    def parse(cls, raw: Mapping[str, Any], source: str) -> Statement:
        if "NotAction" in raw or "NotResource" in raw:
            raise AssemblyError(f"{source}: NotAction/NotResource statements are not supported")
        actions = raw.get("Action", [])
        resources = raw.get("Resource", [])
        return cls(
            effect=raw.get("Effect", "Allow"),
            actions=tuple([actions] if isinstance(actions, str) else actions),
            resources=tuple(resources if isinstance(resources, list) else [resources]),
            conditions=raw.get("Condition", {}),
            source=source,
        )


@dataclass(frozen=True)
class WebSocketApiSpec:
    """A WebSocket API: its route keys and stages."""

    logical_id: str
    route_selection_expression: str
    route_keys: tuple[str, ...]
    stages: tuple[str, ...]


@dataclass(frozen=True)
class RestMethod:
    """One REST API method with a Lambda proxy integration."""

    http_method: str
    resource_path: str  # /events, /connections/{connection_id}
    function: str | None  # logical id of the integrated function
    authorization_type: str


@dataclass(frozen=True)
class Stack:
    """One stack of the assembly: its template and where its assets are."""

    name: str
    account: str
    region: str
    template: Mapping[str, Any]
    directory: Path
    assets: Mapping[str, Any]
    bootstrap_version: int = 0
    bootstrap_parameter: str | None = None

    @property
    def resources(self) -> Mapping[str, Mapping[str, Any]]:
        return self.template.get("Resources", {})

    def of_type(self, *types: str) -> dict[str, Mapping[str, Any]]:
        """``logical id -> resource`` of the given types."""
        return {lid: r for lid, r in self.resources.items() if r.get("Type") in types}

    def functions(self) -> list[FunctionSpec]:
        """Every ``AWS::Lambda::Function`` of the template."""
        found = []
        for logical_id, resource in self.of_type("AWS::Lambda::Function").items():
            props = resource.get("Properties", {})
            metadata = resource.get("Metadata", {})
            asset = metadata.get("aws:asset:path")
            role = props.get("Role")
            found.append(
                FunctionSpec(
                    stack=self.name,
                    logical_id=logical_id,
                    path=metadata.get("aws:cdk:path", f"{self.name}/{logical_id}"),
                    handler=props.get("Handler", ""),
                    runtime=props.get("Runtime", ""),
                    architectures=tuple(props.get("Architectures", ())),
                    environment=(props.get("Environment") or {}).get("Variables", {}),
                    role=_logical_id_of(role),
                    asset_dir=(self.directory / asset) if asset else None,
                    timeout_seconds=int(props.get("Timeout", 3)),
                    memory_mb=int(props.get("MemorySize", 128)),
                    log_format=str((props.get("LoggingConfig") or {}).get("LogFormat", "Text")),
                    log_level=(props.get("LoggingConfig") or {}).get("ApplicationLogLevel"),
                )
            )
        return found

    def function(self, logical_id_prefix: str) -> FunctionSpec:
        """The one function whose logical id starts with ``logical_id_prefix``."""
        found = [f for f in self.functions() if f.logical_id.startswith(logical_id_prefix)]
        if len(found) != 1:
            ids = [f.logical_id for f in self.functions()]
            raise AssemblyError(
                f"function: {len(found)} functions of {self.name} match {logical_id_prefix!r} "
                f"(it has {ids})"
            )
        return found[0]

    def function_with_handler(self, handler: str) -> FunctionSpec:
        """The one function whose ``Handler`` is ``handler`` (``module.function``)."""
        found = [f for f in self.functions() if f.handler == handler]
        if len(found) != 1:
            raise AssemblyError(
                f"handler: {len(found)} functions of {self.name} have {handler!r}, expected 1"
            )
        return found[0]

    def container(self, name: str | None = None) -> ContainerSpec:
        """The container called ``name`` (or the only one) of the stack's task definitions."""
        found = [c for c in self.containers() if name is None or c.name == name]
        if len(found) != 1:
            raise AssemblyError(
                f"container: {len(found)} containers of {self.name} match {name or 'any'}"
            )
        return found[0]

    def tables(self) -> list[TableDefinition]:
        """Every DynamoDB table of the template (global tables included)."""
        found = []
        types = ("AWS::DynamoDB::Table", "AWS::DynamoDB::GlobalTable")
        for logical_id, resource in self.of_type(*types).items():
            props = resource.get("Properties", {})
            ttl = props.get("TimeToLiveSpecification") or {}
            stream = props.get("StreamSpecification") or {}
            found.append(
                TableDefinition(
                    logical_id=logical_id,
                    table_name=props.get("TableName"),
                    key_schema=tuple(props.get("KeySchema", ())),
                    attribute_definitions=tuple(props.get("AttributeDefinitions", ())),
                    indexes=tuple(
                        IndexDefinition(
                            name=index["IndexName"],
                            key_schema=tuple(index["KeySchema"]),
                            projection=index.get("Projection", {"ProjectionType": "ALL"}),
                        )
                        for index in props.get("GlobalSecondaryIndexes", ())
                    ),
                    ttl_attribute=ttl.get("AttributeName") if ttl.get("Enabled") else None,
                    stream_view_type=stream.get("StreamViewType")
                    if stream.get("StreamEnabled", True)
                    else None,
                    replica_regions=tuple(r["Region"] for r in props.get("Replicas", ())),
                )
            )
        return found

    def queues(self) -> list[QueueDefinition]:
        """Every SQS queue, dead-letter queues first (a queue's redrive policy needs its DLQ)."""
        found = [
            QueueDefinition(logical_id, resource.get("Properties", {}))
            for logical_id, resource in self.of_type("AWS::SQS::Queue").items()
        ]
        return sorted(found, key=lambda q: q.dead_letter_queue is not None)

    def containers(self) -> list[ContainerSpec]:
        """Every container of every ECS task definition."""
        found = []
        images = self.assets.get("dockerImages", {})
        for logical_id, resource in self.of_type("AWS::ECS::TaskDefinition").items():
            props = resource.get("Properties", {})
            platform = props.get("RuntimePlatform") or {}
            for container in props.get("ContainerDefinitions", ()):
                image_dir, image_platform = None, None
                image_text = json.dumps(container.get("Image"))
                for image_hash, image in images.items():
                    if image_hash in image_text:
                        image_dir = self.directory / image["source"]["directory"]
                        image_platform = image["source"].get("platform")
                env = {e["Name"]: e["Value"] for e in container.get("Environment", ())}
                found.append(
                    ContainerSpec(
                        stack=self.name,
                        task_logical_id=logical_id,
                        name=container.get("Name", ""),
                        environment=env,
                        command=tuple(container.get("Command", ())),
                        entry_point=tuple(container.get("EntryPoint", ())),
                        image_dir=image_dir,
                        platform=image_platform,
                        task_role=_logical_id_of(props.get("TaskRoleArn")),
                        cpu_architecture=platform.get("CpuArchitecture"),
                        stop_timeout=int(container.get("StopTimeout", 30)),
                    )
                )
        return found

    def _role(self, role_logical_id: str) -> Mapping[str, Any]:
        role = self.resources.get(role_logical_id)
        if role is None or role.get("Type") != "AWS::IAM::Role":
            raise AssemblyError(f"role: {role_logical_id} is not a role of {self.name}")
        return role.get("Properties", {})

    def managed_policies(self, role_logical_id: str) -> list[Any]:
        """The role's ``ManagedPolicyArns`` (their statements are not in the template)."""
        return list(self._role(role_logical_id).get("ManagedPolicyArns", ()))

    def statements(self, role_logical_id: str) -> list[Statement]:
        """Every policy statement attached to the role: its inline policies and every
        ``AWS::IAM::Policy`` naming it (managed policies: :meth:`managed_policies`)."""
        props = self._role(role_logical_id)
        found = []
        for policy in props.get("Policies", ()):
            for raw in policy["PolicyDocument"].get("Statement", ()):
                found.append(Statement.parse(raw, f"{role_logical_id}/{policy['PolicyName']}"))
        for logical_id, policy in self.of_type("AWS::IAM::Policy").items():
            policy_props = policy.get("Properties", {})
            if {"Ref": role_logical_id} not in policy_props.get("Roles", ()):
                continue
            for raw in policy_props["PolicyDocument"].get("Statement", ()):
                found.append(Statement.parse(raw, logical_id))
        return found

    def websocket_apis(self) -> list[WebSocketApiSpec]:
        """Every WebSocket API with the route keys and stage names the template gives it."""
        apis = {
            lid: r
            for lid, r in self.of_type("AWS::ApiGatewayV2::Api").items()
            if r.get("Properties", {}).get("ProtocolType") == "WEBSOCKET"
        }
        found = []
        for logical_id, api in apis.items():
            ref = {"Ref": logical_id}
            routes = [
                r["Properties"]["RouteKey"]
                for r in self.of_type("AWS::ApiGatewayV2::Route").values()
                if r["Properties"].get("ApiId") == ref
            ]
            stages = [
                s["Properties"]["StageName"]
                for s in self.of_type("AWS::ApiGatewayV2::Stage").values()
                if s["Properties"].get("ApiId") == ref
            ]
            found.append(
                WebSocketApiSpec(
                    logical_id=logical_id,
                    route_selection_expression=api["Properties"].get(
                        "RouteSelectionExpression", ""
                    ),
                    route_keys=tuple(sorted(routes)),
                    stages=tuple(sorted(stages)),
                )
            )
        return found

    def rest_methods(self) -> list[RestMethod]:
        """Every REST API method, with its full resource path and integrated function."""
        resources = self.of_type("AWS::ApiGateway::Resource")

        def path_of(reference: Any) -> str:
            logical_id = _logical_id_of(reference)
            if logical_id not in resources:  # the API's root resource
                return ""
            props = resources[logical_id]["Properties"]
            return f"{path_of(props['ParentId'])}/{props['PathPart']}"

        found = []
        for method in self.of_type("AWS::ApiGateway::Method").values():
            props = method["Properties"]
            if props.get("HttpMethod") == "OPTIONS":
                continue
            uri = json.dumps((props.get("Integration") or {}).get("Uri"))
            function = next(
                (f.logical_id for f in self.functions() if f'"{f.logical_id}"' in uri), None
            )
            found.append(
                RestMethod(
                    http_method=props["HttpMethod"],
                    resource_path=path_of(props.get("ResourceId")) or "/",
                    function=function,
                    authorization_type=props.get("AuthorizationType", "NONE"),
                )
            )
        return sorted(found, key=lambda m: (m.resource_path, m.http_method))

    def has_resource_type(self, resource_type: str) -> bool:
        return bool(self.of_type(resource_type))

    def template_bindings(self, url_suffix: str = "amazonaws.com") -> Bindings:
        """What each logical id stands for in the template's own terms: a table's
        ``TableName`` and ARN, a queue's logical id as its name (CloudFormation would generate
        one), any other resource's logical id. For comparing ARNs, not for calling AWS."""
        refs: dict[str, Any] = {}
        attributes: dict[tuple[str, str], Any] = {}
        arn = f"arn:aws:{{service}}:{self.region}:{self.account}:{{rest}}"
        for logical_id, resource in self.resources.items():
            props = resource.get("Properties", {})
            kind = resource.get("Type")
            if kind in ("AWS::DynamoDB::Table", "AWS::DynamoDB::GlobalTable"):
                name = props.get("TableName", logical_id)
                refs[logical_id] = name
                attributes[(logical_id, "Arn")] = arn.format(
                    service="dynamodb", rest=f"table/{name}"
                )
            elif kind == "AWS::SQS::Queue":
                refs[logical_id] = (
                    f"https://sqs.{self.region}.{url_suffix}/{self.account}/{logical_id}"
                )
                attributes[(logical_id, "Arn")] = arn.format(service="sqs", rest=logical_id)
                attributes[(logical_id, "QueueName")] = logical_id
            elif kind == "AWS::Logs::LogGroup":
                name = props.get("LogGroupName", logical_id)
                refs[logical_id] = name
                attributes[(logical_id, "Arn")] = arn.format(
                    service="logs", rest=f"log-group:{name}:*"
                )
            elif kind == "AWS::ApiGatewayV2::DomainName":
                name = props.get("DomainName", logical_id)
                refs[logical_id] = name
                # API Gateway names it d-<id>; the logical id stands in for the id.
                attributes[(logical_id, "RegionalDomainName")] = (
                    f"d-{logical_id.lower()}.execute-api.{self.region}.{url_suffix}"
                )
            elif kind == "AWS::CloudWatch::Alarm":
                name = props.get("AlarmName", logical_id)
                refs[logical_id] = name
                attributes[(logical_id, "Arn")] = arn.format(
                    service="cloudwatch", rest=f"alarm:{name}"
                )
            else:
                refs[logical_id] = logical_id
        return Bindings(refs=refs, attributes=attributes, pseudo=self.pseudo_parameters(url_suffix))

    def pseudo_parameters(self, url_suffix: str = "amazonaws.com") -> dict[str, str]:
        return {
            "AWS::Region": self.region,
            "AWS::AccountId": self.account,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": url_suffix,
            "AWS::StackName": self.name,
            "AWS::NoValue": "",
        }


def local_environment(
    variables: Mapping[str, Any],
    stack: Stack,
    *,
    refs: Mapping[str, Any] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A function's or container's ``Environment`` for a local run: references to the
    resources in ``refs`` (logical id -> local name or URL) resolved to them, everything else
    as the template says, then ``overrides`` (each one a local decision: an allow-list naming
    the local upstream, say), which may only replace variables the template sets."""
    unknown = sorted(set(overrides or {}) - set(variables))
    if unknown:
        raise AssemblyError(
            f"overrides: {unknown} are not in the template's environment (pass them to the "
            "process as local extras instead)"
        )
    template = stack.template_bindings()
    bindings = Bindings(
        refs={**template.refs, **(refs or {})},
        attributes=template.attributes,
        pseudo=template.pseudo,
    )
    return {**resolve_environment(variables, bindings), **(overrides or {})}


def reference_of(value: Any) -> str | None:
    """The logical id a ``Ref``/``Fn::GetAtt`` value points at (``None`` for a literal)."""
    return _logical_id_of(value)


def _logical_id_of(reference: Any) -> str | None:
    if isinstance(reference, Mapping):
        if "Ref" in reference:
            return reference["Ref"]
        if "Fn::GetAtt" in reference:
            return reference["Fn::GetAtt"][0]
    return None


# --- Dockerfile ---------------------------------------------------------------------------------


def _dockerfile_instructions(text: str) -> Iterator[tuple[str, str]]:
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
        logical = ""


def _exec_form(text: str) -> tuple[str, ...]:
    if text.startswith("["):
        return tuple(json.loads(text))
    return ("/bin/sh", "-c", text)


def parse_dockerfile(text: str) -> ImageFacts:
    """``ENTRYPOINT``, ``CMD``, ``ENV``, ``WORKDIR`` and ``USER`` of the final stage."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    workdir, user = "/", None
    for keyword, rest in _dockerfile_instructions(text):
        if keyword == "FROM":  # a new stage: only the last one is the image
            entrypoint, cmd, env, workdir, user = (), (), {}, "/", None
        elif keyword == "ENTRYPOINT":
            entrypoint, cmd = _exec_form(rest), ()  # a new ENTRYPOINT resets an inherited CMD
        elif keyword == "CMD":
            cmd = _exec_form(rest)
        elif keyword == "ENV":
            words = shlex.split(rest)
            if words and "=" not in words[0]:  # legacy form: ENV NAME value with spaces
                env[words[0]] = rest.partition(" ")[2].strip()
            else:
                env.update(word.split("=", 1) for word in words)  # type: ignore[arg-type]
        elif keyword == "WORKDIR":
            workdir = rest if rest.startswith("/") else f"{workdir.rstrip('/')}/{rest}"
        elif keyword == "USER":
            user = rest
    return ImageFacts(entrypoint=entrypoint, cmd=cmd, env=env, workdir=workdir, user=user)


# --- Intrinsics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bindings:
    """What a template's references mean in one setting.

    Attributes:
        refs: ``logical id -> value`` of ``Ref``.
        attributes: ``(logical id, attribute) -> value`` of ``Fn::GetAtt``.
        pseudo: pseudo parameters (``AWS::Region``...).
        values: whole resolved strings to replace (a template literal that names a resource of
            another stack, say a replica table, or an AWS URL with a local stand-in).
    """

    refs: Mapping[str, Any] = field(default_factory=dict)
    attributes: Mapping[tuple[str, str], Any] = field(default_factory=dict)
    pseudo: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, str] = field(default_factory=dict)

    def with_values(self, values: Mapping[str, str]) -> Bindings:
        return Bindings(self.refs, self.attributes, self.pseudo, {**self.values, **values})


def resolve(value: Any, bindings: Bindings) -> Any:
    """Evaluate the intrinsics in ``value`` (``Ref``, ``Fn::GetAtt``, ``Fn::Join``,
    ``Fn::Sub``, ``Fn::Select``, ``Fn::Split``); then apply ``bindings.values`` to strings."""
    resolved = _resolve(value, bindings)
    if isinstance(resolved, str):
        return bindings.values.get(resolved, resolved)
    return resolved


def resolve_environment(variables: Mapping[str, Any], bindings: Bindings) -> dict[str, str]:
    """An ``Environment`` (function or container) as strings, every intrinsic evaluated."""
    return {name: str(resolve(value, bindings)) for name, value in variables.items()}


def _ref(name: str, bindings: Bindings) -> Any:
    if name in bindings.pseudo:
        return bindings.pseudo[name]
    if name in bindings.refs:
        return bindings.refs[name]
    raise UnresolvedReference(f"Ref: {name} has no binding")


def _getatt(logical_id: str, attribute: str, bindings: Bindings) -> Any:
    try:
        return bindings.attributes[(logical_id, attribute)]
    except KeyError:
        raise UnresolvedReference(f"Fn::GetAtt: {logical_id}.{attribute} has no binding") from None


def _resolve(value: Any, bindings: Bindings) -> Any:
    if isinstance(value, list):
        return [_resolve(item, bindings) for item in value]
    if not isinstance(value, Mapping):
        return value
    if len(value) != 1:
        return {key: _resolve(item, bindings) for key, item in value.items()}
    ((key, argument),) = value.items()
    if key == "Ref":
        return _ref(argument, bindings)
    if key == "Fn::GetAtt":
        logical_id, attribute = argument.split(".", 1) if isinstance(argument, str) else argument
        return _getatt(logical_id, attribute, bindings)
    if key == "Fn::Join":
        separator, items = argument
        return separator.join(str(_resolve(item, bindings)) for item in _resolve(items, bindings))
    if key == "Fn::Select":
        index, items = argument
        return _resolve(items, bindings)[int(_resolve(index, bindings))]
    if key == "Fn::Split":
        separator, text = argument
        return str(_resolve(text, bindings)).split(separator)
    if key == "Fn::Sub":
        template, variables = (argument, {}) if isinstance(argument, str) else argument
        local = {name: _resolve(item, bindings) for name, item in variables.items()}

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in local:
                return str(local[name])
            if "." in name and name.split(".", 1)[0] not in bindings.pseudo:
                logical_id, attribute = name.split(".", 1)
                return str(_getatt(logical_id, attribute, bindings))
            return str(_ref(name, bindings))

        return re.sub(r"\$\{([^}]+)\}", substitute, template)
    if key.startswith("Fn::") or key == "Condition":
        raise UnresolvedReference(f"{key}: not supported here")
    return {key: _resolve(argument, bindings)}
