"""What ECS and EventBridge do for the fleet, locally: task ARNs, and STOPPED events on exit.

In ECS every worker process runs in a task: the task metadata endpoint tells it its task ARN
(``ECS_CONTAINER_METADATA_URI_V4``), and when the process exits (kill -9, OOM, crash, or a
SIGTERM handoff that finished) ECS emits an ``ECS Task State Change`` event with ``lastStatus:
STOPPED``, which the fleet's EventBridge rule delivers to the task-events Lambda. Locally:

* :class:`TaskMetadataEndpoint` serves ``GET /v4/<container>/task`` for every worker process
  with a synthetic task ARN of its own (:meth:`LocalEcs.task_env` is the variable to give it);
* :class:`LocalEcs` watches the fleet's worker processes and, when one exits, builds the event
  ECS would send (:func:`task_state_change_event`), checks it against the *synthesized rule's*
  event pattern (:func:`matches`) and delivers it to the *synthesized handler* from its asset
  directory (:class:`~streamfleet_dev.emulator.lambda_runner.LambdaProcess`), its template
  environment mapped to the fleet's table and queue and to the local cluster and service.

A frozen process (SIGSTOP) has not exited: no event, exactly as in ECS (the lease handles it).
:meth:`LocalEcs.emit` sends any event by hand: a forged STOPPED event for a task that is still
running is how the tests show a wrong event costs availability, never double ownership.

Delivery is immediate (ECS takes a few seconds, most of the figure in AWS); a failed invocation
is retried twice, like Lambda's asynchronous retries (which wait a minute and two there).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from streamfleet import model
from streamfleet import task_events as handler_module
from streamfleet_dev.assembly import (
    LOCAL_ACCOUNT,
    Bindings,
    FunctionSpec,
    Stack,
    default_assembly,
    reference_of,
    resolve,
    resolve_environment,
)
from streamfleet_dev.emulator.lambda_runner import (
    LambdaError,
    LambdaProcess,
    LambdaSpec,
    host_twin,
    lambda_sdk_dir,
    native_mismatches,
)

HANDLER = f"{handler_module.handler.__module__}.{handler_module.handler.__name__}"
FLEET_STACK = "StreamFleet-Primary"
LOCAL_CLUSTER_NAME = "streamfleet-local"
LOCAL_SERVICE_NAME = "streamfleet-local-workers"
WATCH_EVERY_SECONDS = 0.01
RETRY_DELAYS_SECONDS = (0.2, 1.0)  # Lambda retries a failed asynchronous invocation twice
EXIT_STOP_CODE = "EssentialContainerExited"
EXIT_REASON = "Essential container in task exited"


# --- Event shapes -------------------------------------------------------------------------------


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def task_state_change_event(
    *,
    task_arn: str,
    cluster_arn: str,
    service_name: str,
    region: str,
    account: str = LOCAL_ACCOUNT,
    last_status: str = model.ECS_TASK_STOPPED,
    exit_code: int | None = None,
    stopped_reason: str = EXIT_REASON,
    stop_code: str = EXIT_STOP_CODE,
    container_name: str = "Worker",
) -> dict[str, Any]:
    """An ``ECS Task State Change`` event as EventBridge delivers it to a rule's target."""
    stopped = last_status == model.ECS_TASK_STOPPED
    detail: dict[str, Any] = {
        "clusterArn": cluster_arn,
        "taskArn": task_arn,
        "group": model.ecs_service_group(service_name),
        "lastStatus": last_status,
        "desiredStatus": model.ECS_TASK_STOPPED,
        "launchType": "FARGATE",
        "platformFamily": "Linux",
        "startedBy": "ecs-svc/0000000000000000000",
        "version": 5 if stopped else 3,
        "containers": [
            {
                "name": container_name,
                "taskArn": task_arn,
                "lastStatus": last_status if stopped else "RUNNING",
                **({"exitCode": exit_code} if stopped and exit_code is not None else {}),
            }
        ],
        "updatedAt": _now_iso(),
    }
    if stopped:
        detail.update(stoppedReason=stopped_reason, stopCode=stop_code, stoppedAt=_now_iso())
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": model.ECS_TASK_STATE_CHANGE,
        "source": model.ECS_EVENT_SOURCE,
        "account": account,
        "time": _now_iso(),
        "region": region,
        "resources": [task_arn],
        "detail": detail,
    }


def matches(pattern: Mapping[str, Any], event: Mapping[str, Any]) -> bool:
    """Whether ``event`` matches an EventBridge event pattern made of exact values (lists of
    allowed values, nested objects): the subset the fleet's rule uses. Anything else (prefix,
    anything-but, numeric...) raises, rather than being matched wrongly."""
    for key, wanted in pattern.items():
        if key not in event:
            return False
        value = event[key]
        if isinstance(wanted, Mapping):
            if not isinstance(value, Mapping) or not matches(wanted, value):
                return False
            continue
        if not isinstance(wanted, list) or any(isinstance(w, (Mapping, list)) for w in wanted):
            raise ValueError(f"pattern: {key}: only lists of exact values are supported")
        values = value if isinstance(value, list) else [value]
        if not any(v in wanted for v in values):
            return False
    return True


# --- The task metadata endpoint -----------------------------------------------------------------


@dataclass(frozen=True)
class LocalTask:
    """One worker process's task: its ARN and the metadata path that serves it."""

    arn: str
    container: str  # the path segment of ECS_CONTAINER_METADATA_URI_V4

    @property
    def task_id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]


class TaskMetadataEndpoint:
    """``GET /v4/<container>/task`` -> the task's metadata (``TaskARN``, ``Cluster``...), as the
    ECS agent serves it to the containers of a task; any other path is a 404."""

    def __init__(self, cluster_arn: str) -> None:
        self.cluster_arn = cluster_arn
        self._tasks: dict[str, LocalTask] = {}
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = endpoint._answer(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                data = json.dumps(body or {"error": "no such task"}).encode()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="task-metadata"
        )
        self._thread.start()

    def uri(self, task: LocalTask) -> str:
        """The task's ``ECS_CONTAINER_METADATA_URI_V4``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v4/{task.container}"

    def add(self, task: LocalTask) -> None:
        with self._lock:
            self._tasks[task.container] = task

    def _answer(self, path: str) -> dict[str, Any] | None:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "v4" or parts[2] != "task":
            return None
        with self._lock:
            task = self._tasks.get(parts[1])
        if task is None:
            return None
        return {
            "Cluster": self.cluster_arn,
            "TaskARN": task.arn,
            "Family": "StreamFleetWorkers",
            "Revision": "1",
            "DesiredStatus": "RUNNING",
            "KnownStatus": "RUNNING",
            "LaunchType": "FARGATE",
            "Containers": [{"Name": "Worker", "KnownStatus": "RUNNING"}],
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- The rule and its target, from the assembly -------------------------------------------------


class _Process(Protocol):
    """What :class:`LocalEcs` watches: a worker process (``WorkerProcess`` of the harness)."""

    worker_id: str
    process: Any


@dataclass
class Delivery:
    """One event delivered (or not) to the handler, with when it happened (monotonic)."""

    event: dict[str, Any]
    reason: str  # "exited" (a process ended) or "emitted" (sent by hand)
    worker_id: str | None
    matched: bool
    exited_at: float
    wall: float = 0.0  # epoch seconds of the exit (or the emission)
    answered_at: float = 0.0
    result: Any = None
    error: str | None = None
    attempts: int = 0


@dataclass
class RuleTarget:
    """The synthesized rule's pattern and its target function, made local."""

    pattern: dict[str, Any]
    function: FunctionSpec
    environment: dict[str, str]


def handler_bindings(stack: Stack, *, table: str, queue_url: str) -> Bindings:
    """The template's bindings with the handler's table and queue references made local."""
    declared = stack.function_with_handler(HANDLER).environment
    template = stack.template_bindings()
    refs = dict(template.refs)
    for variable, value in (
        (model.ENV_TABLE_NAME, table),
        (model.ENV_QUEUE_URL, queue_url),
    ):
        logical_id = reference_of(declared[variable])
        if logical_id is None:
            raise RuntimeError(f"{stack.name}: {variable} refers to no resource of the stack")
        refs[logical_id] = value
    return Bindings(refs=refs, attributes=template.attributes, pseudo=template.pseudo)


def rule_target(
    stack: Stack, *, bindings: Bindings, cluster_arn: str, service_name: str
) -> RuleTarget:
    """The rule whose target is the task-events handler, its pattern resolved for the local
    cluster and service, and the handler's template environment resolved with ``bindings``
    (the stack's resources made local) plus that cluster and service, by the references the
    template makes: a variable wired to another resource would not resolve to them."""
    function = stack.function_with_handler(HANDLER)
    declared = function.environment
    cluster_id = reference_of(declared[model.ENV_ECS_CLUSTER_ARN])
    service_id = reference_of(declared[model.ENV_ECS_SERVICE_NAME])
    bindings = Bindings(
        refs=bindings.refs,
        attributes={
            **bindings.attributes,
            (cluster_id, "Arn"): cluster_arn,
            (service_id, "Name"): service_name,
        },
        pseudo=bindings.pseudo,
        values=bindings.values,
    )
    rules = [
        resource["Properties"]
        for resource in stack.of_type("AWS::Events::Rule").values()
        if any(
            reference_of(target.get("Arn")) == function.logical_id
            for target in resource["Properties"].get("Targets", [])
        )
    ]
    if len(rules) != 1:
        raise RuntimeError(f"{stack.name}: {len(rules)} rules target {function.label}")
    return RuleTarget(
        pattern=resolve(rules[0]["EventPattern"], bindings),
        function=function,
        environment=resolve_environment(declared, bindings),
    )


def local_cluster_arn(region: str, account: str = LOCAL_ACCOUNT) -> str:
    """A cluster ARN of its own for one local fleet."""
    return f"arn:aws:ecs:{region}:{account}:cluster/{LOCAL_CLUSTER_NAME}-{uuid.uuid4().hex[:8]}"


def local_task_arn(cluster_arn: str) -> str:
    """A fresh task ARN in ``cluster_arn`` (long format, as Fargate's)."""
    prefix, cluster_name = cluster_arn.split(":cluster/", 1)
    return f"{prefix}:task/{cluster_name}/{uuid.uuid4().hex}"


def start_handler(
    target: RuleTarget,
    *,
    region: str,
    log_path: Path,
    credentials: tuple[str, str] = ("local", "local"),
    extra_env: Mapping[str, str] | None = None,
    sdk_dir: Path | None = None,
) -> LambdaProcess:
    """The handler from its asset directory, started (warm: one execution environment)."""
    spec = LambdaSpec.for_function(
        target.function, target.environment, region=region, credentials=credentials
    )
    process = LambdaProcess(
        spec,
        sdk_dir=sdk_dir or lambda_sdk_dir(),
        extra_env=dict(extra_env or {}),
        log_path=log_path,
        code_dir=host_twin(spec.asset_dir) if native_mismatches(spec) else None,
    )
    return process.start()


# --- ECS for the local fleet --------------------------------------------------------------------


class LocalEcs:
    """Task ARNs and STOPPED events for the worker processes of a local fleet.

    ``workers``: the fleet's ``{worker id: process}`` mapping (read, never changed). Give each
    worker process :meth:`task_env` when starting it; when it exits, the handler from the
    assembly gets the STOPPED event. :attr:`deliveries` records each one.
    """

    def __init__(
        self,
        *,
        workers: Mapping[str, _Process],
        table: str,
        queue_url: str,
        log_dir: Path,
        stack: Stack | None = None,
        region: str | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
    ) -> None:
        self.stack = stack or default_assembly().stack(FLEET_STACK)
        # The workers' Region (what their sessions record): this process's, as theirs.
        self.region = (
            region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        ) or self.stack.region
        self.account = self.stack.account
        self.cluster_arn = local_cluster_arn(self.region, self.account)
        self.service_name = LOCAL_SERVICE_NAME
        self.target = rule_target(
            self.stack,
            bindings=handler_bindings(self.stack, table=table, queue_url=queue_url),
            cluster_arn=self.cluster_arn,
            service_name=self.service_name,
        )
        self.metadata = TaskMetadataEndpoint(self.cluster_arn)
        self._workers = workers
        self._log_path = log_dir / "task-events.jsonl"
        self._on_delivery = on_delivery
        self._lock = threading.Lock()
        self._pending: dict[str, LocalTask] = {}  # allocated, not yet seen running
        self._watched: dict[int, tuple[_Process, LocalTask]] = {}  # id(process) -> its task
        self.deliveries: list[Delivery] = []
        self.handler = self._start_handler(log_dir)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="local-ecs")
        self._watcher.start()

    def _start_handler(self, log_dir: Path) -> LambdaProcess:
        return start_handler(
            self.target,
            region=self.region,
            log_path=log_dir / "task-events-handler.log",
            credentials=(os.environ.get("AWS_ACCESS_KEY_ID", "local"), "local"),
            extra_env={k: v for k, v in os.environ.items() if k.startswith("AWS_ENDPOINT_URL")},
        )

    # -- tasks ----------------------------------------------------------------------------------

    def task_env(self, worker_id: str) -> dict[str, str]:
        """``ECS_CONTAINER_METADATA_URI_V4`` for the next process of ``worker_id``: a task of
        its own (the same one until that process has been seen running)."""
        with self._lock:
            task = self._pending.get(worker_id)
            if task is None:
                arn = local_task_arn(self.cluster_arn)
                task = LocalTask(arn=arn, container=f"{arn.rsplit('/', 1)[-1]}-worker")
                self._pending[worker_id] = task
                self.metadata.add(task)
        return {model.ENV_ECS_METADATA_URI: self.metadata.uri(task)}

    def task_of(self, worker: _Process) -> LocalTask | None:
        """The task of a worker process (once it has been seen running)."""
        self._adopt()
        with self._lock:
            entry = self._watched.get(id(worker))
        return entry[1] if entry else None

    def _adopt(self) -> None:
        with self._lock:
            for worker in list(self._workers.values()):
                if id(worker) not in self._watched and worker.worker_id in self._pending:
                    self._watched[id(worker)] = (worker, self._pending.pop(worker.worker_id))

    # -- events ---------------------------------------------------------------------------------

    def stopped_event(self, task: LocalTask, *, exit_code: int | None = None) -> dict[str, Any]:
        return task_state_change_event(
            task_arn=task.arn,
            cluster_arn=self.cluster_arn,
            service_name=self.service_name,
            region=self.region,
            account=self.account,
            exit_code=exit_code,
        )

    def emit(self, event: dict[str, Any], *, worker_id: str | None = None) -> Delivery:
        """Deliver ``event`` now, as EventBridge would: to the handler only if it matches the
        synthesized rule's pattern."""
        return self._deliver(event, "emitted", worker_id, time.monotonic())

    def _deliver(
        self, event: dict[str, Any], reason: str, worker_id: str | None, exited_at: float
    ) -> Delivery:
        delivery = Delivery(
            event=event,
            reason=reason,
            worker_id=worker_id,
            matched=matches(self.target.pattern, event),
            exited_at=exited_at,
            wall=time.time() - (time.monotonic() - exited_at),
        )
        if delivery.matched:
            for delay in (0.0, *RETRY_DELAYS_SECONDS):
                time.sleep(delay)
                delivery.attempts += 1
                try:
                    delivery.result = self.handler.invoke(event, asynchronous=True)
                    delivery.error = None
                    break
                except LambdaError as exc:
                    delivery.error = f"{type(exc).__name__}: {str(exc)[:500]}"
        delivery.answered_at = time.monotonic()
        with self._lock:
            self.deliveries.append(delivery)
        self._record(delivery)
        if self._on_delivery is not None:
            self._on_delivery(delivery)
        return delivery

    def _record(self, delivery: Delivery) -> None:
        line = {
            "ts": time.time(),
            "event": "task_state_change",
            "reason": delivery.reason,
            "worker": delivery.worker_id,
            "task": delivery.event.get("detail", {}).get("taskArn"),
            "last_status": delivery.event.get("detail", {}).get("lastStatus"),
            "matched": delivery.matched,
            "attempts": delivery.attempts,
            "ms": round((delivery.answered_at - delivery.exited_at) * 1000, 1),
            "result": delivery.result,
            "error": delivery.error,
        }
        with open(self._log_path, "a") as log:
            log.write(json.dumps(line, default=str) + "\n")

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_EVERY_SECONDS):
            self._adopt()
            with self._lock:
                exited = [
                    (key, worker, task)
                    for key, (worker, task) in self._watched.items()
                    if worker.process.poll() is not None
                ]
                for key, _, _ in exited:
                    del self._watched[key]
            for _, worker, task in exited:
                if self._stopping.is_set():
                    return
                seen = time.monotonic()
                code = worker.process.returncode
                # A container killed by signal N exits with 128 + N in ECS's terms (137: kill -9).
                event = self.stopped_event(task, exit_code=128 - code if code < 0 else code)
                with contextlib.suppress(Exception):  # one bad delivery must not stop the watch
                    self._deliver(event, "exited", worker.worker_id, seen)

    def wait_for_delivery(self, worker_id: str, *, timeout: float, after: int = 0) -> Delivery:
        """The first delivery (beyond the first ``after``) for ``worker_id``'s task."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = [d for d in self.deliveries[after:] if d.worker_id == worker_id]
            if found:
                return found[0]
            time.sleep(WATCH_EVERY_SECONDS)
        raise TimeoutError(f"no task event delivered for {worker_id} within {timeout} s")

    def recent(self, count: int = 5) -> list[str]:
        """The last deliveries, one line each (for a live view)."""
        with self._lock:
            chosen = self.deliveries[-count:]
        lines = []
        for d in chosen:
            result = d.result if isinstance(d.result, dict) else {}
            lines.append(
                f"{time.strftime('%H:%M:%S', time.localtime(d.wall))} {d.worker_id or '-':>4} "
                f"ECS {d.event.get('detail', {}).get('lastStatus')} -> "
                f"{result.get('decision', d.error or 'not matched')}, "
                f"notified {result.get('notified', 0)} "
                f"({(d.answered_at - d.exited_at) * 1000:.0f} ms)"
            )
        return lines

    def close(self) -> None:
        """Stop watching (processes that exit from now on get no event), then stop the handler
        and the metadata endpoint."""
        self._stopping.set()
        self._watcher.join(timeout=10)
        self.handler.stop()
        self.metadata.close()
