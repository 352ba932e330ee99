"""Real worker processes against moto's server and the fake upstream (tests, benchmarks).

Everything is real: the workers are ``python -m streamfleet.worker`` processes, signals are real
signals, DynamoDB and SQS are moto's server on loopback, the upstream is a WebSocket server.
Tests observe the system only from outside: the tables, the upstream's counters and the
workers' JSON logs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import boto3

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.control import ControlPlane
from streamfleet_dev import lifeline
from streamfleet_dev.assembly import (
    ContainerSpec,
    Stack,
    default_assembly,
    local_environment,
    reference_of,
)
from streamfleet_dev.checks import connection_rows, log_problems, stored_log
from streamfleet_dev.emulator.container import container_launch, image_python
from streamfleet_dev.tables import create_tables
from streamfleet_dev.upstream.fake import FakeUpstream, message_data, stores
from streamfleet_dev.upstream.process import UpstreamProcess

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")

# Short durations so failures and recoveries play out in seconds.
LEASE_SECONDS = 2.0
HEARTBEAT_SECONDS = 0.5
FAST_ENV = {
    "LEASE_SECONDS": str(LEASE_SECONDS),
    "HEARTBEAT_EVERY": str(HEARTBEAT_SECONDS),
    "MAX_CLOCK_SKEW_SECONDS": "0.2",
    "SAFETY_MARGIN_SECONDS": "0.2",
    "RECONCILE_EVERY": "0.5",
    "STOP_CHECK_EVERY": "0.5",
    "CHECKPOINT_EVERY": "0.2",
    "SQS_WAIT_SECONDS": "1",
    "METRICS_EVERY": "1",
    "RECONNECT_BASE_SECONDS": "0.05",
    "RECONNECT_CAP_SECONDS": "0.5",
}


async def eventually(
    check: Callable[[], Awaitable[T] | T], *, timeout: float, what: str, every: float = 0.1
) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(every)


@dataclass
class WorkerProcess:
    """One ``python -m streamfleet.worker`` process and its log."""

    worker_id: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if "event" in record and (name is None or record["event"] == name):
                    events.append(record)
        return events

    def metrics(self) -> list[dict[str, Any]]:
        """The Embedded Metric Format documents it printed."""
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith('{"_aws"')]

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait()


WORKER_STACK = "StreamFleet-Primary"  # the active Region's fleet: its task definition


@functools.cache
def worker_container() -> tuple[Stack, ContainerSpec, Path]:
    """The synthesized worker container (``WORKER_STACK``'s task definition), its stack and the
    image's interpreter (a cached virtualenv of the image's requirements): what every worker
    process started here runs. Synthesizes once per process unless ``STREAMFLEET_ASSEMBLY``
    names an assembly."""
    stack = default_assembly().stack(WORKER_STACK)
    container = stack.container()
    if container.image_dir is None:
        raise RuntimeError(f"{WORKER_STACK}: the worker image is not an asset of the assembly")
    return stack, container, image_python(container.image_dir)


def local_aws_environment(region: str) -> dict[str, str]:
    """What the task gets from Fargate and the local servers: its Region (this process's, else
    the stack's), credentials and every ``AWS_*`` variable of this process (the endpoints)."""
    found = {name: value for name, value in os.environ.items() if name.startswith("AWS_")}
    region = found.get("AWS_REGION") or found.get("AWS_DEFAULT_REGION") or region
    return {**found, "AWS_REGION": region, "AWS_DEFAULT_REGION": region}


@dataclass
class Fleet:
    """Tables, a queue, an upstream and worker processes for one test."""

    endpoint: str
    upstream: FakeUpstream | UpstreamProcess
    tmp: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    # ECS's STOPPED events: each worker gets a task ARN (task_env) and, when its process exits,
    # the synthesized task-events handler gets the event (streamfleet_dev.emulator.ecs).
    task_events: bool = False
    # Streams whose upstream is hostile, and how (fake.HOSTILE_MODES): their URL asks for it,
    # and their log is checked against what a correct worker stores of it.
    hostile: dict[str, frozenset[str]] = field(default_factory=dict)
    # Workers in sessions of their own, as in a task: no terminal's signal (a Ctrl-C, a closed
    # window's SIGHUP) reaches them, and the fleet's owner stops them in order. Only for an
    # owner that does (local mode). Either way a worker dies with its owner's process if that
    # is killed (the parent-death signal, lifeline.py; on Linux).
    own_sessions: bool = False

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.lease_table = f"leases-{suffix}"
        self.messages_table = f"messages-{suffix}"
        self.dynamodb = boto3.client("dynamodb")
        create_tables(
            self.dynamodb, lease_table=self.lease_table, messages_table=self.messages_table
        )
        self.sqs = boto3.client("sqs")
        self.queue_url = self.sqs.create_queue(QueueName=f"intake-{suffix}")["QueueUrl"]
        self.async_dynamodb = AsyncClient("dynamodb")
        self.async_sqs = AsyncClient("sqs")
        self.control = ControlPlane.create(
            dynamodb=self.async_dynamodb,
            sqs=self.async_sqs,
            table_name=self.lease_table,
            queue_url=self.queue_url,
        )
        self.writer = self.control.writer
        self.ecs = None
        if self.task_events:
            from streamfleet_dev.emulator.ecs import LocalEcs

            self.ecs = LocalEcs(
                workers=self.workers,
                table=self.lease_table,
                queue_url=self.queue_url,
                log_dir=self.tmp,
            )

    def task_env(self, worker_id: str) -> dict[str, str]:
        """The environment ECS gives the task of ``worker_id``'s next process (its metadata
        endpoint, so the worker records its task ARN); ``{}`` without ``task_events``."""
        return self.ecs.task_env(worker_id) if self.ecs is not None else {}

    # -- workers ------------------------------------------------------------------------------

    def start_worker(self, worker_id: str | None = None, **env: str) -> WorkerProcess:
        """Start one worker as ECS starts the synthesized task definition's container: its
        command in the image's code with the image's interpreter, the image's and the
        container's environment (references mapped to this fleet's tables and queue), and the
        local differences named: short timings, the local upstream on the allow-list, a
        capacity of 100, no health port (``HEALTH_PORT`` in ``env`` for one), the worker id,
        the endpoint variables and credentials of the local servers, then ``extra_env`` and
        ``env`` (which win)."""
        worker_id = worker_id or f"w{len(self.workers) + 1}"
        log_path = self.tmp / f"{worker_id}-{len(self.workers)}.log"
        stack, container, image_bin = worker_container()
        wanted = {
            **FAST_ENV,
            model.ENV_ALLOWED_UPSTREAMS: f"ws://127.0.0.1:{self.upstream.port}",
            "MAX_CONNECTIONS": "100",
            "HEALTH_PORT": "",  # none ("0": a free port, named in its health_listening log)
            "WORKER_ID": worker_id,
            **self.extra_env,
            **env,
        }
        # What the template sets is overridden by name (a typo fails); the rest are extras.
        declared = container.environment
        refs = {
            reference_of(declared[model.ENV_TABLE_NAME]): self.lease_table,
            reference_of(declared[model.ENV_MESSAGES_TABLE_NAME]): self.messages_table,
            reference_of(declared[model.ENV_QUEUE_URL]): self.queue_url,
        }
        environment = local_environment(
            declared,
            stack,
            refs=refs,
            overrides={k: v for k, v in wanted.items() if k in declared},
        )
        launch = container_launch(
            container,
            environment,
            image_bin=image_bin,
            overrides={
                **local_aws_environment(stack.region),
                **{k: v for k, v in wanted.items() if k not in declared},
            },
        )
        with open(log_path, "wb") as log:
            process = lifeline.popen(
                list(launch.argv),
                env=dict(launch.env),
                cwd=launch.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_sessions,
            )
        worker = WorkerProcess(worker_id, process, log_path)
        self.workers[worker_id] = worker
        return worker

    def close(self) -> None:
        if self.ecs is not None:
            self.ecs.close()  # first: the teardown's kills are not crashes to recover from
        for worker in self.workers.values():
            worker.stop()
        self.async_dynamodb.close()
        self.async_sqs.close()

    # -- the outside world ----------------------------------------------------------------------

    async def start_streams(self, *stream_ids: str, parallel: int = 8) -> list[str]:
        """START each stream as the event router does: the row, then the notification."""
        limit = asyncio.Semaphore(parallel)

        async def start(stream_id: str) -> None:
            async with limit:
                url = self.upstream.url_for(stream_id, self.hostile.get(stream_id, ()))
                await self.control.start(stream_id, url)

        await asyncio.gather(*(start(stream_id) for stream_id in stream_ids))
        return [model.connection_pk(stream_id) for stream_id in stream_ids]

    async def stop_stream(self, stream_id: str) -> None:
        await self.control.stop(stream_id)

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every connection row, by stream id."""
        return connection_rows(self.dynamodb, self.lease_table)

    def owners(self) -> dict[str, str | None]:
        return {sid: row.get(model.LEASE_OWNER) for sid, row in self.rows().items()}

    def stored_log(self, stream_id: str) -> dict[int, str]:
        """What is stored for a stream: seq -> data, read consistently."""
        return stored_log(self.dynamodb, self.messages_table, stream_id)

    def stored_seqs(self, stream_id: str) -> list[int]:
        return sorted(self.stored_log(stream_id))

    def stored_by(self, worker_id: str, received_after_ms: int = 0) -> int:
        """How many stored messages ``worker_id`` wrote (of those it received after the time)."""
        pages = self.dynamodb.get_paginator("scan").paginate(
            TableName=self.messages_table,
            FilterExpression="#w = :w AND #r > :after",
            ExpressionAttributeNames={
                "#w": model.MESSAGE_WORKER,
                "#r": model.MESSAGE_RECEIVED_AT_MS,
            },
            ExpressionAttributeValues={
                ":w": {"S": worker_id},
                ":after": {"N": str(received_after_ms)},
            },
        )
        return sum(page["Count"] for page in pages)

    def all_live(self, stream_ids: list[str], among: set[str] | None = None) -> bool:
        """Every stream owned (by one of ``among``, if given) and its upstream connected."""
        owners = self.owners()
        connected = self.upstream.stats()["connected"]
        return all(
            owners.get(sid) is not None
            and (among is None or owners[sid] in among)
            and connected.get(sid) == 1
            for sid in stream_ids
        )

    def assert_single_client_ever(self) -> None:
        stats = self.upstream.stats()
        assert stats["overlaps"] == {sid: 0 for sid in stats["overlaps"]}, stats["overlap_events"]
        assert set(stats["max_concurrent"].values()) <= {1}, stats["max_concurrent"]

    def log_problems(self, stream_ids: list[str], *, final: bool = False) -> list[str]:
        """Each stream's stored log against its origin and the upstream's content (see
        :mod:`streamfleet_dev.checks`); ``final``: the streams are stopped and released."""
        rows = self.rows()
        problems: list[str] = []
        for sid in stream_ids:
            modes = self.hostile.get(sid, frozenset())
            problems += log_problems(
                sid,
                rows.get(sid),
                self.stored_log(sid),
                message_data,
                final=final,
                stored_by_a_correct_worker=lambda seq, modes=modes: stores(modes, seq),
            )
        return problems

    def assert_log_exact(self, stream_ids: list[str], *, final: bool = False) -> dict[str, int]:
        """Exactly once from the origin, for every stream; returns how many stored per stream."""
        problems = self.log_problems(stream_ids, final=final)
        assert not problems, problems
        counts = {sid: len(self.stored_seqs(sid)) for sid in stream_ids}
        assert all(counts.values()), f"nothing stored for some stream: {counts}"
        return counts
