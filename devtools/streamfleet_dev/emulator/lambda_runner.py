"""Run a Lambda function from its synthesized asset directory, locally, as Lambda would.

One :class:`LambdaProcess` is one execution environment: a separate, clean interpreter
(``python -I -S``) whose ``sys.path`` holds only the asset directory and what the Lambda Python
runtime itself provides, boto3 and its dependencies, installed once into a cache directory at
:data:`LAMBDA_RUNTIME_BOTO3` (never the repository's ``runtime/``, never the virtualenv). It
imports the template's ``Handler`` at start (Lambda's init phase; an import error is a
:class:`LambdaInitError` carrying the traceback), then serves invocations one at a time, as one
execution environment does, with a Lambda-shaped ``context``. Its environment is what Lambda
sets (:func:`runtime_environment`) plus the template's ``Environment`` after the caller mapped
references to local resources, plus local overrides (endpoint variables) the caller names.

Every ``os.environ`` lookup inside the function is recorded with the file that made it
(:meth:`LambdaProcess.env_reads`), so a test can tell a variable the template sets but no code
reads from one the code reads but the template never sets.

The runner can only import native code built for this machine. :func:`native_mismatches` says
when an asset's compiled extensions target another CPU or Python (an arm64 or a Python 3.14
bundle on an x86_64 Python 3.11 host); :func:`host_twin` then builds a copy of the asset whose
compiled distributions are the same versions built for this host, everything else untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamfleet_dev import lifeline
from streamfleet_dev.cache import download_cache
from streamfleet_dev.emulator.servers import RUN_MARKS

if TYPE_CHECKING:
    from streamfleet_dev.assembly import FunctionSpec

BOOTSTRAP = Path(__file__).with_name("_lambda_bootstrap.py")
# The SDK the runner puts on the path, as the Lambda runtime does. AWS no longer publishes the
# version each runtime ships (it changes with runtime updates); this one is deliberately old: a
# lower bound of what any current Python runtime has, so code that needs a newer SDK fails here,
# as it could there. Override with STREAMFLEET_LAMBDA_BOTO3.
LAMBDA_RUNTIME_BOTO3 = "1.34.145"
SDK_VERSION_ENV = "STREAMFLEET_LAMBDA_BOTO3"
SDK_CACHE_DIR_NAME = "streamfleet-lambda-sdk"
INIT_TIMEOUT_SECONDS = 30.0  # Lambda's own is 10 s; a cold import here is slower on 2 cores
# A function still running this long after its timeout is killed (the environment, as in Lambda,
# is not reused); one that answers late within it is told so by its bootstrap.
INVOKE_SLACK_SECONDS = 2.0
STOP_TIMEOUT_SECONDS = 5.0
# How often the environment's memory is read while it works. The kernel's high-water mark is
# read, so a peak between two reads is seen too, one read late.
MEMORY_POLL_SECONDS = 0.05

# Variables the Lambda service sets in every execution environment (reserved: a template cannot
# set them). A function may read them although its template does not name them.
RUNTIME_VARIABLES = frozenset(
    {
        "_HANDLER",
        "_X_AMZN_TRACE_ID",
        "AWS_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_DEFAULT_REGION",
        "AWS_EXECUTION_ENV",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
        "AWS_LAMBDA_FUNCTION_NAME",
        "AWS_LAMBDA_FUNCTION_VERSION",
        "AWS_LAMBDA_INITIALIZATION_TYPE",
        "AWS_LAMBDA_LOG_FORMAT",
        "AWS_LAMBDA_LOG_GROUP_NAME",
        "AWS_LAMBDA_LOG_LEVEL",
        "AWS_LAMBDA_LOG_STREAM_NAME",
        "AWS_LAMBDA_RUNTIME_API",
        "AWS_REGION",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_XRAY_CONTEXT_MISSING",
        "AWS_XRAY_DAEMON_ADDRESS",
        "LAMBDA_RUNTIME_DIR",
        "LAMBDA_TASK_ROOT",
        "LANG",
        "LD_LIBRARY_PATH",
        "PATH",
        "PYTHONPATH",
        "TZ",
    }
)


# Lambda's payload limits: a synchronous invocation's request and response, and an asynchronous
# invocation's event (EventBridge targets, schedules).
SYNC_PAYLOAD_MAX_BYTES = 6 * 1024 * 1024
ASYNC_PAYLOAD_MAX_BYTES = 256 * 1024


class LambdaError(Exception):
    """A local Lambda function failed (base class)."""


class LambdaInitError(LambdaError):
    """The handler could not be imported: the asset is broken (``traceback`` says how)."""

    def __init__(self, name: str, error: Mapping[str, Any], log: str = ""):
        self.error_type = error.get("errorType", "")
        self.traceback = "".join(error.get("stackTrace", ()))
        super().__init__(
            f"{name}: init failed: {self.error_type}: {error.get('errorMessage', '')}\n"
            f"{self.traceback}{log}"
        )


class LambdaFunctionError(LambdaError):
    """The handler raised. ``str()`` is the error message, as API Gateway sees it (an
    authorizer's ``Unauthorized`` must read exactly that)."""

    def __init__(self, error: Mapping[str, Any]):
        self.error_type = error.get("errorType", "")
        self.error_message = error.get("errorMessage", "")
        self.traceback = "".join(error.get("stackTrace", ()))
        super().__init__(self.error_message)


class LambdaTimeout(LambdaError):
    """No answer within the function's timeout (plus slack): the environment was killed."""


class LambdaOutOfMemory(LambdaError):
    """The environment used more than the function's memory size: it was killed."""


@dataclass(frozen=True)
class LambdaSpec:
    """What one local function runs: code, handler, runtime and (already mapped) environment.

    Attributes:
        name: the function's name (its construct path, say).
        asset_dir: the directory whose contents Lambda would unpack into ``/var/task``.
        handler: ``module.function``.
        runtime: the Lambda runtime identifier (``python3.14``).
        architecture: ``x86_64`` or ``arm64``.
        environment: the template's ``Environment``, references mapped to local values.
        timeout_seconds: the function's timeout.
        memory_mb: the function's memory size.
        region: the Region the function runs in.
        credentials: ``(access key id, secret key)`` the role's session would give it; the
            access key id is how a recording proxy tells components apart.
        log_format: ``JSON`` or ``Text``, as its ``LoggingConfig`` says.
        log_level: its application log level (``None``: no filter).
    """

    name: str
    asset_dir: Path
    handler: str
    runtime: str = "python3.11"
    architecture: str = "x86_64"
    environment: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 3.0
    memory_mb: int = 128
    region: str = "us-east-1"
    credentials: tuple[str, str] = ("local", "local")
    log_format: str = "Text"
    log_level: str | None = None

    @property
    def function_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "-", self.name)[:64]

    @classmethod
    def for_function(
        cls,
        function: FunctionSpec,
        environment: Mapping[str, str],
        *,
        region: str,
        credentials: tuple[str, str] = ("local", "local"),
    ) -> LambdaSpec:
        """The spec of a synthesized function (asset, handler, runtime, timeout, memory) with
        its environment already made local."""
        if function.asset_dir is None:
            raise ValueError(f"{function.label}: its code is not an asset of the assembly")
        return cls(
            name=function.label,
            asset_dir=function.asset_dir,
            handler=function.handler,
            runtime=function.runtime,
            architecture=function.architecture,
            environment=dict(environment),
            timeout_seconds=function.timeout_seconds,
            memory_mb=function.memory_mb,
            region=region,
            credentials=credentials,
            log_format=function.log_format,
            log_level=function.log_level,
        )


@dataclass(frozen=True)
class EnvRead:
    """One variable the function looked up: whether it was set and which files asked."""

    name: str
    present: bool
    files: tuple[str, ...]


def runtime_environment(spec: LambdaSpec, sdk_dir: Path | None) -> dict[str, str]:
    """The variables the Lambda service sets for ``spec`` (documented reserved variables)."""
    name = spec.function_name
    access_key, secret_key = spec.credentials
    return {
        "_HANDLER": spec.handler,
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{spec.runtime}",
        "AWS_LAMBDA_FUNCTION_NAME": name,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{name}",
        "AWS_LAMBDA_LOG_STREAM_NAME": f"local/[$LATEST]{uuid.uuid4().hex}",
        "AWS_REGION": spec.region,
        "AWS_DEFAULT_REGION": spec.region,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_ACCESS_KEY": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_SESSION_TOKEN": f"local-session-{access_key}",
        "LAMBDA_TASK_ROOT": str(spec.asset_dir),
        "LAMBDA_RUNTIME_DIR": str(sdk_dir or ""),
        "LANG": "en_US.UTF-8",
        "TZ": ":UTC",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        # Not Lambda's: how long the bootstrap's context counts down from.
        "AWS_LAMBDA_FUNCTION_TIMEOUT": f"{spec.timeout_seconds:g}",
        # Lambda's own, when the function logs JSON at an application log level.
        **({"AWS_LAMBDA_LOG_FORMAT": "JSON"} if spec.log_format == "JSON" else {}),
        **({"AWS_LAMBDA_LOG_LEVEL": spec.log_level} if spec.log_level else {}),
        # Not Lambda's: the test suite's and local mode's marks on the processes they started.
        **{name: os.environ[name] for name in RUN_MARKS if name in os.environ},
    }


# Lambda's application log levels, least severe first.
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")


def kept_by_log_filter(line: str, log_level: str | None) -> bool:
    """Whether Lambda's log-level filter sends ``line`` of stdout to CloudWatch Logs: a JSON
    object is kept when its ``level`` is at least ``log_level``, and counts as INFO without a
    valid one. Other lines are kept: here they come from the bootstrap, which does not stand in
    for the runtime's own logging handler (that one filters by itself)."""
    if log_level is None or not line.startswith("{"):
        return True
    try:
        record = json.loads(line)
    except ValueError:
        return True
    level = str(record.get("level", "")).upper() if isinstance(record, dict) else ""
    rank = LOG_LEVELS.index(level) if level in LOG_LEVELS else LOG_LEVELS.index("INFO")
    return rank >= LOG_LEVELS.index(log_level.upper())


# --- The runtime's SDK --------------------------------------------------------------------------


def lambda_sdk_dir(version: str | None = None, cache_root: Path | None = None) -> Path:
    """A directory holding ``boto3==version`` and its dependencies for this interpreter,
    installed once (``pip install --target``; PyPI or pip's cache the first time)."""
    version = version or os.environ.get(SDK_VERSION_ENV) or LAMBDA_RUNTIME_BOTO3
    root = cache_root or download_cache() / SDK_CACHE_DIR_NAME
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    target = root / f"boto3-{version}-{python}"
    if (target / "boto3").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
        "--target",
        str(partial),
        f"boto3=={version}",
    ]
    result = lifeline.run(command, capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"boto3=={version}: pip install failed:\n{result.stderr[-2000:]}")
    shutil.rmtree(partial / "bin", ignore_errors=True)
    try:
        os.rename(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (target / "boto3").is_dir():
            raise
    return target


# --- Native code --------------------------------------------------------------------------------

_ELF_MACHINES = {62: "x86_64", 183: "arm64"}
_HOST_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class NativeFile:
    """A compiled extension in an asset: its CPU and the CPython it was built for."""

    path: Path
    machine: str  # x86_64, arm64, or "unknown"
    python: str | None  # "311" from cpython-311-..., None for abi3 or untagged


def native_files(asset_dir: Path) -> list[NativeFile]:
    """Every ELF shared object under ``asset_dir``."""
    found = []
    for path in sorted(asset_dir.rglob("*.so*")):
        if not path.is_file():
            continue
        with open(path, "rb") as handle:
            header = handle.read(20)
        if header[:4] != b"\x7fELF":
            continue
        machine = _ELF_MACHINES.get(int.from_bytes(header[18:20], "little"), "unknown")
        tag = re.search(r"\.cpython-(\d+)-", path.name)
        found.append(NativeFile(path, machine, tag.group(1) if tag else None))
    return found


def host_machine() -> str:
    return _HOST_MACHINES.get(os.uname().machine.lower(), os.uname().machine)


def native_mismatches(spec: LambdaSpec) -> list[str]:
    """Why this host cannot import the asset's compiled code as it is (``[]``: it can)."""
    host_python = f"{sys.version_info.major}{sys.version_info.minor}"
    problems = []
    for native in native_files(spec.asset_dir):
        relative = native.path.relative_to(spec.asset_dir)
        if native.machine != host_machine():
            problems.append(
                f"{relative}: built for {native.machine}, this host is {host_machine()}"
            )
        elif native.python is not None and native.python != host_python:
            problems.append(f"{relative}: built for CPython {native.python}, this is {host_python}")
    return problems


def wrong_target(spec: LambdaSpec) -> list[str]:
    """Compiled files that cannot run on the function's *own* runtime and architecture."""
    match = re.fullmatch(r"python(\d+)\.(\d+)", spec.runtime)
    runtime_python = f"{match.group(1)}{match.group(2)}" if match else None
    problems = []
    for native in native_files(spec.asset_dir):
        relative = native.path.relative_to(spec.asset_dir)
        if native.machine != spec.architecture:
            problems.append(f"{relative}: {native.machine} code in an {spec.architecture} function")
        if native.python is not None and runtime_python and native.python != runtime_python:
            problems.append(f"{relative}: CPython {native.python} code on {spec.runtime}")
    return problems


def _distributions_with_native_code(asset_dir: Path) -> list[tuple[str, str, list[str]]]:
    found = []
    for dist_info in sorted(asset_dir.glob("*.dist-info")):
        record = dist_info / "RECORD"
        if not record.is_file():
            continue
        files = [line.split(",", 1)[0] for line in record.read_text().splitlines() if line]
        if any(re.search(r"\.so(\.|$)", f) for f in files):
            name, version = dist_info.name.removesuffix(".dist-info").rsplit("-", 1)
            found.append((name, version, files))
    return found


def host_twin(asset_dir: Path, cache_root: Path | None = None) -> Path:
    """A copy of ``asset_dir`` whose compiled distributions are the same versions built for
    this interpreter and CPU (pure-Python files, the project's code included, untouched)."""
    # The asset directory's name is its content hash: the same code gets the same twin.
    digest = hashlib.sha256(asset_dir.name.encode())
    digest.update(sysconfig.get_platform().encode() + sys.version.encode())
    root = cache_root or Path(tempfile.gettempdir()) / SDK_CACHE_DIR_NAME / "twins"
    target = root / digest.hexdigest()
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    shutil.copytree(asset_dir, partial, dirs_exist_ok=True)
    native = _distributions_with_native_code(partial)
    for _, _, files in native:
        for relative in files:
            (partial / relative).unlink(missing_ok=True)
    for leftover in native_files(partial):  # extensions no RECORD claims (cffi's backend...)
        leftover.path.unlink()
    if native:
        # Into a directory of its own, then merged: pip --target skips packages whose directory
        # already exists (what removing the files left behind).
        fetched = Path(tempfile.mkdtemp(prefix=".fetched-", dir=root))
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
            "--target",
            str(fetched),
            *(f"{name}=={version}" for name, version, _ in native),
        ]
        result = lifeline.run(command, capture_output=True, text=True, check=False, timeout=600)
        if result.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(fetched, ignore_errors=True)
            raise RuntimeError(f"host twin of {asset_dir}: pip failed:\n{result.stderr[-2000:]}")
        shutil.rmtree(fetched / "bin", ignore_errors=True)
        shutil.copytree(fetched, partial, dirs_exist_ok=True)
        shutil.rmtree(fetched, ignore_errors=True)
    try:
        os.rename(partial, target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not target.is_dir():
            raise
    return target


# --- The execution environment ------------------------------------------------------------------


class LambdaProcess:
    """One local execution environment of one function; call it like the handler.

    ``start()`` imports the handler (init); ``invoke(event)`` (or calling the object) runs one
    invocation and returns its JSON result, raising :class:`LambdaFunctionError` when the
    handler raised; ``stop()`` ends the process. Invocations are serialised: one execution
    environment runs one at a time, whatever calls it concurrently.
    """

    def __init__(
        self,
        spec: LambdaSpec,
        *,
        sdk_dir: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        code_dir: Path | None = None,
    ):
        self.spec = spec
        self.sdk_dir = sdk_dir
        self.code_dir = code_dir or spec.asset_dir  # a host twin, when the asset cannot run here
        self.extra_env = dict(extra_env or {})
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="lambda-", suffix=".log")[1])
        self.environment: dict[str, str] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._requests: Any = None
        self._responses: Any = None
        self._lock = threading.Lock()
        self._ids = 0
        self.invocations = 0

    # Lifecycle -------------------------------------------------------------------------------

    def start(self) -> LambdaProcess:
        """Start the environment and import the handler; :class:`LambdaInitError` if that fails."""
        sdk = self.sdk_dir if self.sdk_dir is not None else lambda_sdk_dir()
        self.sdk_dir = sdk
        self.environment = {
            **runtime_environment(self.spec, sdk),
            **self.spec.environment,
            **self.extra_env,
        }
        self.environment["LAMBDA_TASK_ROOT"] = str(self.code_dir)
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        try:
            self._process = lifeline.popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    str(BOOTSTRAP),
                    str(self.code_dir),
                    str(sdk),
                    self.spec.handler,
                    str(request_read),
                    str(response_write),
                ],
                env=self.environment,
                cwd=self.code_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(request_read, response_write),
                start_new_session=True,
            )
        finally:
            log.close()
            os.close(request_read)
            os.close(response_write)
        self._requests = os.fdopen(request_write, "w", encoding="utf-8")
        self._responses = os.fdopen(response_read, "r", encoding="utf-8")
        try:
            answer = self._receive(INIT_TIMEOUT_SECONDS)
        except LambdaOutOfMemory as exc:  # over its memory size while importing: init failed
            raise LambdaInitError(
                self.spec.name, {"errorType": "Runtime.OutOfMemory", "errorMessage": str(exc)}
            ) from None
        if not answer.get("ok"):
            self.init_env_reads = _env_reads(answer.get("env_reads") or {})
            self.stop()
            raise LambdaInitError(self.spec.name, answer.get("error") or {}, self._log_tail())
        return self

    def stop(self) -> None:
        """End the environment (EOF on its requests, then SIGKILL if it lingers)."""
        if self._requests is not None:
            with contextlib.suppress(OSError):
                self._requests.close()
            self._requests = None
        if self._process is not None and self._process.poll() is None:
            try:
                self._process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._responses is not None:
            self._responses.close()
            self._responses = None

    def __enter__(self) -> LambdaProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # Invocations -----------------------------------------------------------------------------

    def invoke(self, event: Any, context: Any = None, *, asynchronous: bool = False) -> Any:
        """Run one invocation with ``event``; ``context`` (an object or a mapping) supplies the
        request id and names, like the Lambda service's. Lambda's payload limits hold: an event
        over 6 MB (256 KB ``asynchronous``) is refused before the function runs, a result over
        6 MB fails the invocation (``Function.ResponseSizeTooLarge``)."""
        limit = ASYNC_PAYLOAD_MAX_BYTES if asynchronous else SYNC_PAYLOAD_MAX_BYTES
        size = len(json.dumps(event, default=str).encode())
        if size > limit:
            raise LambdaFunctionError(
                {
                    "errorType": "RequestEntityTooLargeException",
                    "errorMessage": f"Request must be smaller than {limit} bytes, got {size}",
                }
            )
        with self._lock:
            if not self.running:
                self.start()  # a new environment after a crash or a timeout: a cold start
            self._ids += 1
            self.invocations += 1
            request_id = _attribute(context, "aws_request_id") or uuid.uuid4().hex
            fields = {
                "function_name": self.spec.function_name,
                "memory_limit_in_mb": str(self.spec.memory_mb),
                "invoked_function_arn": (
                    f"arn:aws:lambda:{self.spec.region}:000000000000:function:"
                    f"{self.spec.function_name}"
                ),
                "aws_request_id": request_id,
                "log_group_name": self.environment.get("AWS_LAMBDA_LOG_GROUP_NAME", ""),
                "log_stream_name": self.environment.get("AWS_LAMBDA_LOG_STREAM_NAME", ""),
            }
            try:
                answer = self._call(
                    {"op": "invoke", "id": self._ids, "event": event, "context": fields},
                    self.spec.timeout_seconds + INVOKE_SLACK_SECONDS,
                )
            except LambdaTimeout:
                # Killed: the next invocation starts a new environment, a cold start.
                raise LambdaFunctionError(
                    {
                        "errorType": "Sandbox.Timedout",
                        "errorMessage": f"Task timed out after {self.spec.timeout_seconds:.2f} s",
                    }
                ) from None
            except LambdaOutOfMemory as exc:
                raise LambdaFunctionError(
                    {
                        "errorType": "Runtime.OutOfMemory",
                        "errorMessage": f"Runtime exited with error: signal: killed ({exc})",
                    }
                ) from None
        if "error" in answer:
            raise LambdaFunctionError(answer["error"])
        result = answer.get("result")
        size = len(json.dumps(result, default=str).encode())
        if size > SYNC_PAYLOAD_MAX_BYTES:
            raise LambdaFunctionError(
                {
                    "errorType": "Function.ResponseSizeTooLarge",
                    "errorMessage": f"Response payload size ({size} bytes) exceeded maximum "
                    f"allowed payload size ({SYNC_PAYLOAD_MAX_BYTES} bytes).",
                }
            )
        return result

    __call__ = invoke

    def env_reads(self) -> list[EnvRead]:
        """Every variable the function's process looked up so far, sorted by name."""
        with self._lock:
            answer = self._call({"op": "env_reads"}, INIT_TIMEOUT_SECONDS)
        return _env_reads(answer.get("env_reads") or {})

    def modules(self) -> dict[str, str]:
        """``module name -> file`` of every module the function's process has imported."""
        with self._lock:
            answer = self._call({"op": "modules"}, INIT_TIMEOUT_SECONDS)
        return dict(answer.get("modules") or [])

    def log_text(self) -> str:
        """What the function printed."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def cloudwatch_text(self) -> str:
        """What of it would reach CloudWatch Logs, after Lambda's log-level filter."""
        level = self.spec.log_level if self.spec.log_format == "JSON" else None
        return "".join(
            line
            for line in self.log_text().splitlines(keepends=True)
            if kept_by_log_filter(line.rstrip("\n"), level)
        )

    def emf_documents(self) -> list[dict[str, Any]]:
        """Its metric documents (EMF lines) that would reach CloudWatch."""
        return [
            json.loads(line)
            for line in self.cloudwatch_text().splitlines()
            if line.startswith("{") and '"_aws"' in line
        ]

    # Plumbing --------------------------------------------------------------------------------

    def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self._requests is not None, "start() first"
        try:
            self._requests.write(json.dumps(request, default=str) + "\n")
            self._requests.flush()
        except (BrokenPipeError, ValueError):
            raise LambdaError(
                f"{self.spec.name}: the environment exited{self._log_tail()}"
            ) from None
        return self._receive(timeout)

    def _receive(self, timeout: float) -> dict[str, Any]:
        assert self._responses is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise LambdaTimeout(f"{self.spec.name}: no answer within {timeout:g} s")
            ready, _, _ = select.select(
                [self._responses], [], [], min(remaining, MEMORY_POLL_SECONDS)
            )
            used_mb = self.peak_memory_mb()
            if used_mb is not None and used_mb > self.spec.memory_mb:
                self._kill()
                raise LambdaOutOfMemory(
                    f"{self.spec.name}: {used_mb} MB used of its {self.spec.memory_mb} MB"
                )
            if ready:
                line = self._responses.readline()
                if not line:
                    self._kill()
                    raise LambdaError(f"{self.spec.name}: the environment exited{self._log_tail()}")
                return json.loads(line)
            if self._process is not None and self._process.poll() is not None:
                raise LambdaError(
                    f"{self.spec.name}: the environment exited with "
                    f"{self._process.returncode}{self._log_tail()}"
                )

    def peak_memory_mb(self) -> int | None:
        """The most the environment has held in memory (its resident set's high-water mark),
        in MB; ``None`` when it is not running or the kernel does not say."""
        if self._process is None or self._process.poll() is not None:
            return None
        try:
            status = Path(f"/proc/{self._process.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
        return None

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.stop()

    def _log_tail(self, chars: int = 3000) -> str:
        text = self.log_text()
        return f"\n--- its output ---\n{text[-chars:]}" if text.strip() else ""


def _attribute(context: Any, name: str) -> Any:
    if context is None:
        return None
    if isinstance(context, Mapping):
        return context.get(name)
    return getattr(context, name, None)


def _env_reads(raw: Mapping[str, Any]) -> list[EnvRead]:
    return [
        EnvRead(name, bool(entry.get("present")), tuple(entry.get("files", ())))
        for name, entry in sorted(raw.items())
    ]


def reads_by(reads: list[EnvRead], directory: Path) -> list[EnvRead]:
    """The reads made by code under ``directory`` (the function's own package, say)."""
    root = str(directory.resolve())
    return [r for r in reads if any(str(Path(f).resolve()).startswith(root) for f in r.files)]


# --- Event shapes -------------------------------------------------------------------------------


def rest_proxy_event(
    method: str,
    resource: str,
    *,
    path_parameters: Mapping[str, str] | None = None,
    body: str | None = None,
    stage: str = "local",
    caller: str = "AIDALOCALCALLER",
    account: str = "123456789012",
) -> dict[str, Any]:
    """An API Gateway REST proxy event (payload 1.0) for ``method`` on ``resource`` (a template
    path such as ``/connections/{connection_id}``), signed by an IAM caller as the API requires."""
    path = resource
    for name, value in (path_parameters or {}).items():
        path = path.replace("{" + name + "}", value)
    headers = {"Content-Type": "application/json", "Host": "local.execute-api"}
    request_id = str(uuid.uuid4())
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": dict(path_parameters) if path_parameters else None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method,
            "path": f"/{stage}{path}",
            "stage": stage,
            "requestId": request_id,
            "requestTimeEpoch": time.time_ns() // 1_000_000,
            "accountId": account,
            "identity": {
                "sourceIp": "127.0.0.1",
                "accountId": account,
                "caller": caller,
                "accessKey": "ASIALOCAL",
                "userArn": f"arn:aws:iam::{account}:user/local",
                "user": caller,
            },
        },
        "body": body,
        "isBase64Encoded": False,
    }


def scheduled_event(
    region: str, account: str, rule_arn: str, at: float | None = None
) -> dict[str, Any]:
    """An EventBridge "Scheduled Event", as a schedule rule delivers it to its target, for the
    tick at ``at`` (epoch seconds; default now)."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


# --- Command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Invoke one function of an assembly once with a JSON event; print the result."""
    from streamfleet_dev.assembly import Bindings, load, resolve_environment

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--assembly", required=True, help="a cloud assembly directory (cdk.out)")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--function", required=True, help="logical id (or its prefix)")
    parser.add_argument("--event", default="{}", help="the event as JSON, or @file.json")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE (a local value for a variable)"
    )
    args = parser.parse_args(argv)
    stack = load(args.assembly).stack(args.stack)
    function = stack.function(args.function)
    overrides = dict(item.split("=", 1) for item in args.env)
    raw = {name: value for name, value in function.environment.items() if name not in overrides}
    bindings = Bindings(pseudo=stack.pseudo_parameters())
    environment = {**resolve_environment(raw, bindings), **overrides}
    text = Path(args.event[1:]).read_text() if args.event.startswith("@") else args.event
    spec = LambdaSpec.for_function(
        function,
        environment,
        region=stack.region,
        credentials=(os.environ.get("AWS_ACCESS_KEY_ID", "local"), "local"),
    )
    passthrough = {k: v for k, v in os.environ.items() if k.startswith("AWS_ENDPOINT_URL")}
    code_dir = host_twin(spec.asset_dir) if native_mismatches(spec) else None
    with LambdaProcess(spec, extra_env=passthrough, code_dir=code_dir) as process:
        try:
            print(json.dumps(process.invoke(json.loads(text)), indent=2))
        except LambdaFunctionError as exc:
            print(f"{exc.error_type}: {exc}\n{exc.traceback}", file=sys.stderr)
            return 1
        finally:
            sys.stderr.write(process.log_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
