"""The whole system on loopback, from upstream to subscribed clients in two regions.

:class:`LiveWorld` starts, and stops again:

* moto's server (SQS, and the messages tables with their DynamoDB Streams) and dynalite (the
  lease table, which must serialise conditional writes, and the WebSocket API's tables), behind
  the recording proxy (:class:`~streamfleet_dev.emulator.aws_proxy.AwsProxy`), which routes each
  DynamoDB request by table, so the workers reach both through one endpoint, as they would
  reach DynamoDB;
* the fake upstream (its own process) and real worker processes (``python -m
  streamfleet.worker``) with compressed lease timings;
* the lease and messages tables and the intake queue, created from the synthesized templates;
* :class:`~.regions.LocalRegions` with live delivery: both regions' gateways, handlers,
  authorizers, canaries and failover resolver, each region's fan-out (from its synthesized
  asset) on its messages table's stream, and the messages replication to the secondary;
* the STARTs of the streams (with their readers), through the same control plane the event
  router uses.

The drill (:mod:`.drill`), the benchmark (``bench/fanout_bench.py``), the end-to-end test and
the local mode's live view all run on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.control import ControlPlane
from streamfleet.lease.dynamo import from_item, to_attr
from streamfleet_dev.emulator.aws_proxy import (
    DEFAULT_INDEX_LAG_SECONDS,
    DEFAULT_THROTTLE_RATE,
    AwsProxy,
)
from streamfleet_dev.emulator.servers import (
    LOCAL_AWS_ENV,
    LocalServer,
    dynalite_server,
    moto_server,
)
from streamfleet_dev.local.fleet import FAST_ENV
from streamfleet_dev.tables import create_table
from streamfleet_dev.upstream.process import UpstreamProcess
from streamfleet_dev.wsapi.regions import LiveSettings, LocalRegions, RegionsSettings

REPO = Path(__file__).resolve().parents[3]
READER_GROUP = "viewers"
READER_CLAIM = "groups"
_BOTO = Config(connect_timeout=2.0, read_timeout=10.0, retries={"max_attempts": 5})


@dataclass(frozen=True)
class WorldSettings:
    """Scale and timings of one :class:`LiveWorld`."""

    streams: int = 4
    rate: float = 5.0  # messages per second per stream (the fake upstream's)
    workers: int = 3
    fanout_from_assembly: bool = True
    static_dir: Path | None = None  # the built demo page
    stream_prefix: str = "live"
    # Every stream's readers: the group every development token carries, so any local user may
    # watch (a reader list naming users works the same way, see the tests).
    readers: tuple[str, ...] = (f"{READER_CLAIM}:{READER_GROUP}",)
    # Compressed, but with room: 2 cores also run the fleet, both servers and the browser,
    # and a canary probe that misses its timeout twice fails the primary over.
    canary_period: float = 1.0
    canary_timeout: float = 0.9
    healthy_runs_to_recover: int = 2
    event_source_poll: float = 0.1
    worker_env: tuple[tuple[str, str], ...] = ()
    log_dir: Path | None = None
    http_port: int = 0


@dataclass
class Worker:
    """One worker process."""

    worker_id: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class LiveWorld:
    """Everything, running (see the module docstring). ``async with LiveWorld(...) as world``."""

    settings: WorldSettings = field(default_factory=WorldSettings)
    regions: LocalRegions | None = None
    proxy: AwsProxy | None = None
    upstream: UpstreamProcess | None = None
    workers: dict[str, Worker] = field(default_factory=dict)
    stream_ids: list[str] = field(default_factory=list)
    lease_table: str = ""
    messages_tables: tuple[str, str] = ("", "")
    queue_url: str = ""
    log_dir: Path = Path()
    _servers: list[LocalServer] = field(default_factory=list)
    _clients: list[AsyncClient] = field(default_factory=list)
    _control: ControlPlane | None = None
    _worker_count: int = 0
    moto: str = ""
    dynalite: str = ""

    async def __aenter__(self) -> LiveWorld:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # Start and stop --------------------------------------------------------------------------

    async def _start(self) -> None:
        s = self.settings
        self.log_dir = s.log_dir or Path(tempfile.mkdtemp(prefix="streamfleet-world-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        moto, dynalite = await asyncio.gather(
            asyncio.to_thread(lambda: moto_server(self.log_dir / "moto.log").start()),
            asyncio.to_thread(lambda: dynalite_server(self.log_dir / "dynalite.log").start()),
        )
        self._servers = [moto, dynalite]
        self.moto, self.dynalite = moto.endpoint, dynalite.endpoint
        suffix = uuid.uuid4().hex[:8]
        self.lease_table = f"live-leases-{suffix}"
        primary, secondary = RegionsSettings().primary, RegionsSettings().secondary
        self.messages_tables = (
            f"live-messages-{primary}-{suffix}",
            f"live-messages-{secondary}-{suffix}",
        )
        # DynamoDB by table: the messages tables (they need a stream) on moto, everything else
        # (leases: conditional writes must serialise) on dynalite; SQS on moto.
        self.proxy = AwsProxy(
            default_backend=self.moto,
            service_backends={"dynamodb": self.dynalite},
            table_backends={name: self.moto for name in self.messages_tables},
            keep_records=False,
            index_lag_seconds=DEFAULT_INDEX_LAG_SECONDS,
            throttle_rate=DEFAULT_THROTTLE_RATE,
        ).start()
        await asyncio.to_thread(self._create_fleet_resources)
        self.upstream = await asyncio.to_thread(
            lambda: UpstreamProcess(
                rate=s.rate, keepalive_seconds=1.0, log_path=self.log_dir / "upstream.log"
            ).start()
        )
        dynamodb = self._async("dynamodb", self.proxy.endpoint)
        sqs = self._async("sqs", self.moto)
        self._control = ControlPlane.create(
            dynamodb=dynamodb, sqs=sqs, table_name=self.lease_table, queue_url=self.queue_url
        )
        for _ in range(s.workers):
            self.start_worker()
        self.regions = await LocalRegions(
            settings=RegionsSettings(
                dynamodb_endpoint=self.proxy.endpoint,
                cloudwatch_endpoint=None,
                canary_period=s.canary_period,
                canary_timeout=s.canary_timeout,
                healthy_runs_to_recover=s.healthy_runs_to_recover,
                http_port=s.http_port,
                table_prefix=f"live{suffix}",
                live=LiveSettings(
                    lease_table=self.lease_table,
                    messages_tables=self.messages_tables,
                    streams_endpoint=self.moto,
                    fanout_from_assembly=s.fanout_from_assembly,
                    reader_claims=(READER_CLAIM,),
                    poll_interval=s.event_source_poll,
                    token_claims=((READER_CLAIM, (READER_GROUP,)),),
                ),
            ),
            static_dir=s.static_dir,
        ).start()
        self.stream_ids = [f"{s.stream_prefix}-{index + 1:03d}" for index in range(s.streams)]
        await self.start_streams(self.stream_ids)
        self.regions.streams = list(self.stream_ids)

    def _create_fleet_resources(self) -> None:
        assert self.proxy is not None
        dynamodb = self._boto("dynamodb", self.proxy.endpoint)
        create_table(dynamodb, model.LEASE_TABLE, self.lease_table)
        create_table(dynamodb, model.MESSAGES_TABLE, self.messages_tables[0])
        sqs = self._boto("sqs", self.moto)
        self.queue_url = sqs.create_queue(QueueName=f"live-intake-{uuid.uuid4().hex[:8]}")[
            "QueueUrl"
        ]

    async def stop(self) -> None:
        """Stop everything that was started (idempotent)."""
        if self.regions is not None:
            await self.regions.stop()
            self.regions = None
        for worker in self.workers.values():
            if worker.alive():
                worker.process.kill()
            with contextlib.suppress(Exception):
                worker.process.wait(5)
        if self.upstream is not None:
            await asyncio.to_thread(self.upstream.stop)
            self.upstream = None
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        for server in self._servers:
            await asyncio.to_thread(server.stop)
        self._servers.clear()

    # The fleet ------------------------------------------------------------------------------

    def start_worker(self) -> Worker:
        """One more worker process (the task definition's command: ``python -m
        streamfleet.worker``) with the compressed timings of the fleet tests."""
        assert self.proxy is not None and self.upstream is not None
        self._worker_count += 1
        worker_id = f"w{self._worker_count}"
        log_path = self.log_dir / f"worker-{worker_id}.log"
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            **LOCAL_AWS_ENV,
            **FAST_ENV,
            "PYTHONPATH": str(REPO / "runtime"),
            model.ENV_TABLE_NAME: self.lease_table,
            model.ENV_MESSAGES_TABLE_NAME: self.messages_tables[0],
            model.ENV_QUEUE_URL: self.queue_url,
            "WORKER_ID": worker_id,
            model.ENV_ALLOWED_UPSTREAMS: f"ws://127.0.0.1:{self.upstream.port}",
            "AWS_ENDPOINT_URL_DYNAMODB": self.proxy.endpoint,
            "AWS_ENDPOINT_URL_SQS": self.moto,
            "MAX_CONNECTIONS": "1000",
            **dict(self.settings.worker_env),
        }
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "streamfleet.worker"],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(worker_id, process, log_path)
        self.workers[worker_id] = worker
        return worker

    def kill_worker(self, worker_id: str) -> None:
        """``kill -9``: no handoff, no release; its sessions expire."""
        self.workers[worker_id].process.send_signal(signal.SIGKILL)
        self.workers[worker_id].process.wait(5)

    async def start_streams(self, stream_ids: list[str]) -> None:
        """START each stream with its readers (the row and the notification, as the event
        router does)."""
        assert self._control is not None and self.upstream is not None
        for stream in stream_ids:
            await self._control.start(stream, self.upstream.url_for(stream), self.settings.readers)

    async def set_readers(self, stream: str, readers: tuple[str, ...]) -> None:
        """Replace a stream's readers: a START naming them, with its own URL."""
        assert self._control is not None and self.upstream is not None
        await self._control.start(stream, self.upstream.url_for(stream), readers)

    async def stop_streams(self, stream_ids: list[str]) -> None:
        assert self._control is not None
        for stream in stream_ids:
            await self._control.stop(stream)

    def owners(self) -> dict[str, str | None]:
        """Each stream's current owner (a consistent read of its row)."""
        assert self.proxy is not None
        dynamodb = self._boto("dynamodb", self.proxy.endpoint)
        owners = {}
        for stream in self.stream_ids:
            item = from_item(
                dynamodb.get_item(
                    TableName=self.lease_table,
                    Key={model.PK: to_attr(model.connection_pk(stream))},
                    ConsistentRead=True,
                ).get("Item")
            )
            owners[stream] = (item or {}).get(model.LEASE_OWNER)
        return owners

    def row(self, stream: str) -> dict[str, Any]:
        assert self.proxy is not None
        dynamodb = self._boto("dynamodb", self.proxy.endpoint)
        return (
            from_item(
                dynamodb.get_item(
                    TableName=self.lease_table,
                    Key={model.PK: to_attr(model.connection_pk(stream))},
                    ConsistentRead=True,
                ).get("Item")
            )
            or {}
        )

    def stored_seqs(self, stream: str, region: int = 0) -> list[int]:
        """The seqs stored for ``stream`` in a region's messages table, ascending."""
        client = self._boto("dynamodb", self.moto)
        pages = client.get_paginator("query").paginate(
            TableName=self.messages_tables[region],
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": model.PK},
            ExpressionAttributeValues={":pk": to_attr(model.connection_pk(stream))},
            ProjectionExpression="#pk, seq",
            ConsistentRead=True,
            # the messages tables live on moto: read them there, not through the proxy's records
        )
        return sorted(int(item[model.SEQ]["N"]) for page in pages for item in page["Items"])

    async def wait_sealed(self, timeout: float) -> dict[str, int]:
        """After a STOP: until every stream is released and sealed; each one's last stored seq
        (its stored log is then exactly origin + 1 .. that)."""
        deadline = time.monotonic() + timeout
        while True:
            rows = {stream: self.row(stream) for stream in self.stream_ids}
            done = all(
                row.get(model.DESIRED_STATE) == "STOPPED"
                and model.LEASE_OWNER not in row
                and model.UNSEALED not in row
                for row in rows.values()
            )
            if done:
                return {stream: max(self.stored_seqs(stream), default=0) for stream in rows}
            if time.monotonic() > deadline:
                raise TimeoutError(f"streams not sealed within {timeout:g} s: {rows}")
            await asyncio.sleep(0.2)

    async def wait_live(self, timeout: float) -> None:
        """Until every stream has an owner and stored messages."""
        deadline = time.monotonic() + timeout
        while True:
            owners = await asyncio.to_thread(self.owners)
            if all(owners.values()) and all(
                await asyncio.gather(
                    *(asyncio.to_thread(self.stored_seqs, s) for s in self.stream_ids)
                )
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"streams not live within {timeout:g} s: {owners}")
            await asyncio.sleep(0.2)

    # Plumbing --------------------------------------------------------------------------------

    def _boto(self, service: str, endpoint: str, region: str = "us-east-1") -> Any:
        return boto3.session.Session().client(
            service,
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id="world",
            aws_secret_access_key="local",
            config=_BOTO,
        )

    def _async(self, service: str, endpoint: str) -> AsyncClient:
        client = AsyncClient(
            service,
            region_name="us-east-1",
            endpoint_url=endpoint,
            aws_access_key_id="world",
            aws_secret_access_key="local",
        )
        self._clients.append(client)
        return client


def owner_of_most(owners: dict[str, str | None], among: Callable[[str], bool] = bool) -> str:
    """The worker that owns the most streams (ties: the lowest id)."""
    counts: dict[str, int] = {}
    for owner in owners.values():
        if owner and among(owner):
            counts[owner] = counts.get(owner, 0) + 1
    if not counts:
        raise RuntimeError("no stream has an owner")
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[0][0]
