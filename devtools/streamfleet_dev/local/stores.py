"""The local AWS of ``make local``: one DynamoDB endpoint over two servers, and SQS.

* dynalite holds the lease table (its conditional writes must serialise: moto's server does
  not) and the WebSocket API's tables;
* moto's server holds the messages tables, because live delivery reads their change streams
  (moto's server implements DynamoDB Streams; dynalite does not), and SQS;
* a routing :class:`~streamfleet_dev.emulator.aws_proxy.AwsProxy` in front of both is the one
  DynamoDB endpoint the workers, the event router, the task-events handler, the regions and the
  live view reach, as they would reach DynamoDB: it sends each request to the server that holds
  its table.

The fleet names its own tables when it creates them (``messages-<suffix>``), so the messages
tables are routed by name pattern (:data:`MESSAGES_TABLES`), not by a list known in advance.
``--dynamodb moto`` puts every table on moto (no dynalite).
"""

from __future__ import annotations

import contextlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfleet_dev.emulator.aws_proxy import (
    DEFAULT_INDEX_LAG_SECONDS,
    DEFAULT_THROTTLE_RATE,
    AwsProxy,
    ParsedRequest,
)
from streamfleet_dev.emulator.servers import LocalServer, dynalite_server, moto_server

# What the fleet harness names its messages tables (``Fleet``: ``messages-<8 hex>``), and the
# secondary's replica named after it (``messages-<8 hex>-<region>``).
MESSAGES_TABLES = re.compile(r"^messages-[0-9a-f]{8}(-[a-z0-9-]+)?$")


class PatternRoutingProxy(AwsProxy):
    """An :class:`AwsProxy` that also sends every DynamoDB table whose name matches
    ``table_pattern`` to ``pattern_backend`` (tables named after the proxy started)."""

    def __init__(self, *, table_pattern: re.Pattern[str], pattern_backend: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.table_pattern = table_pattern
        self.pattern_backend = pattern_backend.rstrip("/")

    def backend_for(self, parsed: ParsedRequest) -> str:
        if parsed.service == "dynamodb":
            for table in parsed.tables:
                if table not in self.table_backends and self.table_pattern.match(table):
                    self.route_table(table, self.pattern_backend)
        return super().backend_for(parsed)


@dataclass
class LocalStores:
    """The running servers and the proxy (see the module docstring)."""

    moto: LocalServer
    dynalite: LocalServer | None
    proxy: AwsProxy

    @property
    def dynamodb_endpoint(self) -> str:
        """The one DynamoDB endpoint (the proxy)."""
        return self.proxy.endpoint

    @property
    def sqs_endpoint(self) -> str:
        return self.moto.endpoint

    @property
    def streams_endpoint(self) -> str:
        """DynamoDB Streams of the messages tables (moto's server)."""
        return self.moto.endpoint

    @property
    def leases_backend(self) -> str:
        return "dynalite" if self.dynalite is not None else "moto"

    def stop(self) -> None:
        try:
            self.proxy.stop()
        finally:
            try:
                if self.dynalite is not None:
                    self.dynalite.stop()
            finally:
                self.moto.stop()


def start_stores(
    workdir: Path,
    *,
    leases_on: str = "dynalite",
    index_lag_seconds: float = DEFAULT_INDEX_LAG_SECONDS,
    throttle_rate: float = DEFAULT_THROTTLE_RATE,
) -> LocalStores:
    """moto's server and (unless ``leases_on`` is ``moto``) dynalite, started side by side,
    and the routing proxy in front of them, whose index answers lag by ``index_lag_seconds``
    and which throttles ``throttle_rate`` of the item and query requests."""
    if leases_on not in ("dynalite", "moto"):
        raise ValueError(f"leases_on: dynalite or moto, not {leases_on!r}")
    with ThreadPoolExecutor(2) as pool:
        moto_started = pool.submit(moto_server(workdir / "moto.log").start)
        dynalite_started = (
            pool.submit(dynalite_server(workdir / "dynalite.log").start)
            if leases_on == "dynalite"
            else None
        )
        try:
            moto = moto_started.result()
        except BaseException:
            if dynalite_started is not None:  # started alongside: not to be left running
                with contextlib.suppress(Exception):
                    dynalite_started.result().stop()
            raise
        try:
            dynalite = dynalite_started.result() if dynalite_started is not None else None
        except BaseException:
            moto.stop()
            raise
    leases = dynalite.endpoint if dynalite is not None else moto.endpoint
    proxy = PatternRoutingProxy(
        table_pattern=MESSAGES_TABLES,
        pattern_backend=moto.endpoint,
        default_backend=moto.endpoint,
        service_backends={"dynamodb": leases},
        keep_records=False,
        index_lag_seconds=index_lag_seconds,
        throttle_rate=throttle_rate,
    ).start()
    return LocalStores(moto=moto, dynalite=dynalite, proxy=proxy)


def replica_name(messages_table: str, region: str) -> str:
    """The secondary region's messages replica, named after the primary's (and routed with
    it to moto)."""
    name = f"{messages_table}-{region}"
    if not MESSAGES_TABLES.match(name):
        raise ValueError(f"{messages_table}: not a messages table name the local proxy routes")
    return name
