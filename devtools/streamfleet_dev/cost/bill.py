"""The monthly bill of one workload on one deployment, line by line.

Every line is ``quantity x unit price`` and says where its quantity comes from:

* **measured**: a count taken from a benchmark page of this repository (``measured.json`` names
  the page and quotes the figure; a test checks the page still says it), or computed from the
  deployed code itself (a message's item, built by the worker's own sink);
* **template**: read from the synthesized assembly (task size and architecture, scaling target,
  function memory and architecture, NAT gateways, alarms, health checks, which tables replicate);
* **assumed**: a figure nothing here measures yet, named as such with its value.

Prices come from ``prices.json``, which names its price list and date.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfleet.worker.protocol import UpstreamMessage
from streamfleet.worker.sink import MessageSink, item_bytes
from streamfleet_client.reconnecting import ClientConfig

HERE = Path(__file__).resolve().parent
MONTH_SECONDS = 30 * 24 * 3600  # a 30-day month
MONTH_MINUTES = MONTH_SECONDS // 60
MONTH_HOURS = MONTH_SECONDS // 3600
GB = 1e9
KB = 1024
API_MESSAGE_UNIT_BYTES = 32 * 1024  # API Gateway meters WebSocket messages in 32 KB units

# Client behaviour, from the Python client's defaults (the browser client's are the same): a
# heartbeat only after this long without hearing from the server, answered by a pong.
HEARTBEAT_QUIET_SECONDS = ClientConfig().heartbeat_interval
# An idle connection's: one a quiet period (its pong starts the next one).
HEARTBEATS_PER_IDLE_CONNECTION_MINUTE = 60 / HEARTBEAT_QUIET_SECONDS
# Each client rotates its connection (a connect, its authorizer, a resubscribe per stream) at
# a random 90-100 % of max_connection_age, ahead of API Gateway's 2-hour limit.
_MAX_AGE = ClientConfig().max_connection_age or 2 * 3600
CONNECTS_PER_CONNECTION_HOUR = 3600 / (0.95 * _MAX_AGE)
# The worker's checkpoint of a stream that receives: at most one per CHECKPOINT_EVERY (300 s).
CHECKPOINTS_PER_STREAM_MINUTE = 60 / 300
# A wire entry's envelope around a message's data (seq, epoch, at, quotes, commas).
WIRE_ENTRY_OVERHEAD_BYTES = 60
# A subscription item as the fan-out reads it (connection id, user, tags, expiry).
SUBSCRIPTION_ITEM_BYTES = 200
# The connections per worker at which the fleet bench counted SQS requests per connection-minute
# (its long polls are per worker: the count per worker-minute is this times that figure).
FLEET_BENCH_CONNECTIONS_PER_WORKER = 500

ASSUMED = {
    "handler_ms": 10.0,  # a heartbeat or subscribe handled by the WebSocket handler
    "authorizer_ms": 50.0,  # a connect's token check (JWKS cached)
    "canary_ms": 2000.0,  # one canary run: connect, heartbeat, pong, disconnect
    "canary_runs_per_minute": 1.0,  # per Region
    "log_bytes_per_invocation": 500,  # Lambda's START/END/REPORT lines and one log line
    "fanout_log_bytes_per_invocation": 1500,  # the above and its EMF document
    "worker_log_bytes_per_minute": 2000,  # worker_stats and lease events
}


def heartbeats_per_connection_minute(posts_per_second: float) -> float:
    """The heartbeats of a connection that receives ``posts_per_second`` posts (any post is
    proof of life): with posts as a Poisson process of rate r and the quiet period Q, each gap
    longer than Q brings one heartbeat, whose pong restarts the clock: r / (e^(rQ) - 1) a
    second, 1 / Q when idle."""
    rate = posts_per_second * HEARTBEAT_QUIET_SECONDS
    if rate <= 0:
        return HEARTBEATS_PER_IDLE_CONNECTION_MINUTE
    return 60 * posts_per_second / math.expm1(rate) if rate < 700 else 0.0


@dataclass(frozen=True)
class Workload:
    streams: int
    msg_per_s: float
    message_bytes: int
    subscribers: int  # per stream, each on its own connection all month
    regions: int  # 1, or 2 (the secondary: replicas, its own API, standby fleet)
    batching_window: str = "none"  # the fan-out's, as measured: "none" or "0.5"

    def __post_init__(self) -> None:
        for name in ("streams", "message_bytes", "subscribers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: a whole number at least 0, got {value!r}")
        if not (isinstance(self.msg_per_s, (int, float)) and self.msg_per_s >= 0):
            raise ValueError(f"msg_per_s: a number at least 0, got {self.msg_per_s!r}")
        if self.regions not in (1, 2):
            raise ValueError(f"regions: 1 or 2, got {self.regions!r}")
        if self.message_bytes > 350 * 1024:
            raise ValueError(
                f"message_bytes: at most {350 * 1024} (one DynamoDB item of 400 KB with its "
                f"attributes), got {self.message_bytes}"
            )
        if self.batching_window not in ("none", "0.5"):
            raise ValueError(
                "batching_window: 'none' or '0.5' (the measured ones), got "
                f"{self.batching_window!r}"
            )


@dataclass(frozen=True)
class Deployment:
    """What the synthesized templates say, for the bill (see :mod:`.deployment`)."""

    task_vcpu: float
    task_gb: float
    task_architecture: str
    connections_per_task: int
    min_tasks: int
    nat_gateways_per_region: int
    dynamodb_endpoint: bool  # a gateway endpoint: the workers' DynamoDB traffic skips the NAT
    replicated_tables: frozenset[str]
    alarms: int  # all Regions together
    health_checks: int
    functions: dict[str, tuple[int, str]]  # role -> (memory MB, architecture)


@dataclass(frozen=True)
class Line:
    component: str
    item: str
    quantity: float
    unit: str
    unit_price: float
    source: str  # measured, template or assumed, with what

    @property
    def usd(self) -> float:
        return self.quantity * self.unit_price


def load_prices(path: Path = HERE / "prices.json") -> dict[str, Any]:
    return json.loads(path.read_text())


def load_measured(path: Path = HERE / "measured.json") -> dict[str, Any]:
    return json.loads(path.read_text())


def message_item_bytes(message_bytes: int, retention_seconds: int) -> int:
    """The size of the item the worker's own sink writes for a message of ``message_bytes``
    (an upper bound, as the sink counts it against DynamoDB's limit)."""
    sink = MessageSink(
        dynamodb=None,  # type: ignore[arg-type]  # only its item is built
        table_name="",
        worker_id="w-0123456789abcdef",
        session=None,  # type: ignore[arg-type]
        flush_every=1.0,
        retention_seconds=retention_seconds,
    )
    message = UpstreamMessage(seq=10**9, data="x" * message_bytes, json=False)
    item = sink.item("CONN#stream-0001", message, 1_800_000_000_000, prev_seq=10**9 - 1)
    return item_bytes(item)


def bill(
    workload: Workload,
    deployment: Deployment,
    prices: dict[str, Any],
    measured: dict[str, Any],
    *,
    retention_seconds: int,
) -> list[Line]:
    usd = prices["usd"]
    w, d = workload, deployment
    lines: list[Line] = []

    def add(component: str, item: str, quantity: float, unit: str, price: str, source: str):
        lines.append(Line(component, item, quantity, unit, usd[price], source))

    messages = w.streams * w.msg_per_s * MONTH_SECONDS
    delivered = messages * w.subscribers
    connections = w.streams * w.subscribers
    tasks = max(d.min_tasks, math.ceil(w.streams / d.connections_per_task)) if w.streams else 0
    item = message_item_bytes(w.message_bytes, retention_seconds)
    wru_per_message = math.ceil(item / KB)
    replicas = w.regions

    # DynamoDB ----------------------------------------------------------------------------
    add(
        "DynamoDB",
        "message writes",
        messages * wru_per_message,
        "WRU",
        "dynamodb_write_request_unit",
        f"measured: the sink's item for a {w.message_bytes} B message is {item} B, "
        f"{wru_per_message} WRU",
    )
    if replicas > 1 and "messages" in d.replicated_tables:
        add(
            "DynamoDB",
            "message replication",
            messages * wru_per_message,
            "rWRU",
            "dynamodb_replicated_write_request_unit",
            "template: the messages table is a global table; one replicated write per write",
        )
    lease = measured["lease_requests_per_connection_minute"]["value"]
    stream_minutes = w.streams * MONTH_MINUTES
    lease_writes = stream_minutes * (lease["update_item"] + CHECKPOINTS_PER_STREAM_MINUTE)
    add(
        "DynamoDB",
        "lease plane writes (renewals, checkpoints)",
        lease_writes,
        "WRU",
        "dynamodb_write_request_unit",
        "measured: docs/benchmarks/fleet.md renewals; checkpoints at most one per stream per 300 s",
    )
    if replicas > 1 and "connections" in d.replicated_tables:
        add(
            "DynamoDB",
            "lease plane replication",
            lease_writes,
            "rWRU",
            "dynamodb_replicated_write_request_unit",
            "template: the lease table is a global table",
        )
    add(
        "DynamoDB",
        "lease plane reads",
        stream_minutes * (lease["query"] * 0.5 + lease["batch_get_item"] * 2),
        "RRU",
        "dynamodb_read_request_unit",
        "measured: docs/benchmarks/fleet.md (a keys-only query 0.5 RRU, a consistent batch of "
        "~2 sessions 2 RRU)",
    )
    window = w.batching_window
    per_invocation = measured["fanout_records_per_invocation"]["value"][window]
    invocations = messages / per_invocation * replicas  # every Region fans out every write
    streams_per_batch = min(per_invocation, w.streams) if w.streams else 0
    subscriber_rru = math.ceil(w.subscribers * SUBSCRIPTION_ITEM_BYTES / (4 * KB)) or 1
    add(
        "DynamoDB",
        "fan-out reads (subscribers, readers)",
        invocations * streams_per_batch * (subscriber_rru + 1),
        "RRU",
        "dynamodb_read_request_unit",
        f"measured: {per_invocation:g} records per invocation (docs/benchmarks/fanout.md); "
        "one consistent subscribers query and one readers read per stream of a batch",
    )
    reconnects = connections * CONNECTS_PER_CONNECTION_HOUR * MONTH_HOURS
    add(
        "DynamoDB",
        "connects and resubscribes",
        reconnects * 4,
        "WRU",
        "dynamodb_write_request_unit",
        "assumed: 4 writes per connect (connection, subscription, user state, index)",
    )
    stored_gb = w.streams * w.msg_per_s * retention_seconds * item / GB
    add(
        "DynamoDB",
        "message storage",
        stored_gb * replicas,
        "GB-month",
        "dynamodb_storage_gb_month",
        f"measured item size x retention {retention_seconds // 86400} days, in every Region",
    )

    # API Gateway -------------------------------------------------------------------------
    posts = delivered * measured["posts_per_1000_delivered"]["value"][window] / 1000
    per_post = delivered / posts if posts else 0
    units_per_post = max(
        1,
        math.ceil(
            per_post * (w.message_bytes + WIRE_ENTRY_OVERHEAD_BYTES) / API_MESSAGE_UNIT_BYTES
        ),
    )
    add(
        "API Gateway",
        "messages posted to subscribers",
        posts * units_per_post,
        "messages (32 KB units)",
        "apigw_websocket_message",
        f"measured: {measured['posts_per_1000_delivered']['value'][window]:g} posts per 1,000 "
        f"delivered (docs/benchmarks/fanout.md), {units_per_post} unit(s) each",
    )
    per_connection_s = posts / connections / MONTH_SECONDS if connections else 0.0
    per_minute = heartbeats_per_connection_minute(per_connection_s)
    heartbeats = connections * per_minute * MONTH_MINUTES
    add(
        "API Gateway",
        "heartbeats and pongs",
        heartbeats * 2,
        "messages",
        "apigw_websocket_message",
        f"client default: a heartbeat after {HEARTBEAT_QUIET_SECONDS:g} s without a post or "
        f"reply ({HEARTBEATS_PER_IDLE_CONNECTION_MINUTE:g} a minute idle), each answered by a "
        f"pong; assumed: posts as a Poisson process ({per_connection_s:.3g} a second per "
        f"connection): {per_minute:.3g} heartbeats a connection-minute",
    )
    api_messages = sum(line.quantity for line in lines if line.unit.startswith("messages"))
    beyond = max(0.0, api_messages - usd["apigw_websocket_message_tier_1_messages"])
    if beyond:
        lines.append(
            Line(
                "API Gateway",
                "messages beyond the first billion (their lower price)",
                beyond,
                "messages",
                usd["apigw_websocket_message_beyond_tier_1"] - usd["apigw_websocket_message"],
                "price list: the second tier's price, less the first's already counted",
            )
        )
    add(
        "API Gateway",
        "connection minutes",
        connections * MONTH_MINUTES,
        "connection-minutes",
        "apigw_websocket_connection_minute",
        "every subscriber connected all month",
    )

    # Lambda ------------------------------------------------------------------------------
    def lambda_lines(role: str, count: float, ms: float, source: str) -> None:
        memory_mb, architecture = d.functions[role]
        add("Lambda", f"{role}: requests", count, "requests", "lambda_request", source)
        add(
            "Lambda",
            f"{role}: compute ({memory_mb} MB, {architecture})",
            count * ms / 1000 * memory_mb / 1024,
            "GB-s",
            f"lambda_gb_second_{architecture}",
            source,
        )

    lambda_lines(
        "fanout",
        invocations,
        measured["fanout_invocation_ms"]["value"],
        "measured: docs/benchmarks/fanout.md (duration: on the development machine)",
    )
    lambda_lines(
        "handler",
        heartbeats + reconnects,
        ASSUMED["handler_ms"],
        f"assumed: {ASSUMED['handler_ms']:g} ms per heartbeat or subscribe",
    )
    lambda_lines(
        "authorizer",
        reconnects,
        ASSUMED["authorizer_ms"],
        f"assumed: {ASSUMED['authorizer_ms']:g} ms per connect; client default: a rotation "
        f"every {0.95 * _MAX_AGE / 60:g} min on average",
    )
    canary_runs = ASSUMED["canary_runs_per_minute"] * MONTH_MINUTES * replicas
    lambda_lines(
        "canary", canary_runs, ASSUMED["canary_ms"], "template: every minute in each Region"
    )

    # Fargate -----------------------------------------------------------------------------
    arch = d.task_architecture
    add(
        "Fargate",
        f"worker tasks: vCPU ({tasks} x {d.task_vcpu:g} vCPU, {arch})",
        tasks * d.task_vcpu * MONTH_HOURS,
        "vCPU-hours",
        f"fargate_vcpu_hour_{arch}",
        f"template: {d.connections_per_task} streams per task (the scaling target), at least "
        f"{d.min_tasks}; the secondary's fleet is standby (0 tasks)",
    )
    add(
        "Fargate",
        f"worker tasks: memory ({tasks} x {d.task_gb:g} GB)",
        tasks * d.task_gb * MONTH_HOURS,
        "GB-hours",
        f"fargate_gb_hour_{arch}",
        "template",
    )

    # Network -----------------------------------------------------------------------------
    add(
        "NAT",
        "gateway hours",
        d.nat_gateways_per_region * replicas * MONTH_HOURS,
        "hours",
        "nat_gateway_hour",
        f"template: {d.nat_gateways_per_region} per Region",
    )
    upstream_gb = messages * (w.message_bytes + 20) / GB
    add(
        "NAT",
        "data processed (upstream frames in"
        + ("; DynamoDB through its gateway endpoint)" if d.dynamodb_endpoint else ", DynamoDB)"),
        upstream_gb * (1 if d.dynamodb_endpoint else 1 + replicas),
        "GB",
        "nat_gateway_gb",
        "messages x (size + 20 B of framing)",
    )
    add(
        "Data transfer",
        "out to subscribers",
        delivered * (w.message_bytes + WIRE_ENTRY_OVERHEAD_BYTES) / GB,
        "GB",
        "data_transfer_out_gb",
        "delivered messages with their wire entries",
    )

    # CloudWatch, SQS, Route 53 -------------------------------------------------------------
    add(
        "CloudWatch",
        "alarms",
        d.alarms,
        "alarm-months",
        "cloudwatch_alarm_month",
        "template: every alarm of every stack",
    )
    log_bytes = (
        invocations * ASSUMED["fanout_log_bytes_per_invocation"]
        + (heartbeats + 2 * reconnects + canary_runs) * ASSUMED["log_bytes_per_invocation"]
        + tasks * MONTH_MINUTES * ASSUMED["worker_log_bytes_per_minute"]
    )
    add(
        "CloudWatch",
        "logs ingested",
        log_bytes / GB,
        "GB",
        "cloudwatch_logs_ingested_gb",
        "assumed: bytes per invocation and per worker-minute (bill.ASSUMED)",
    )
    sqs_per_worker_minute = (
        measured["sqs_requests_per_connection_minute"]["value"] * FLEET_BENCH_CONNECTIONS_PER_WORKER
    )
    add(
        "SQS",
        "worker long polls",
        tasks * sqs_per_worker_minute * MONTH_MINUTES,
        "requests",
        "sqs_request",
        "measured: docs/benchmarks/fleet.md (6 per worker-minute)",
    )
    add(
        "Route 53",
        "health checks",
        d.health_checks,
        "health-check-months",
        "route53_health_check_month",
        "template",
    )
    return lines
