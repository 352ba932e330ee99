"""A recording reverse proxy for the AWS protocols, in front of moto and dynalite.

Code under test reaches AWS only through the standard endpoint variables. Point
``AWS_ENDPOINT_URL`` at this proxy and it:

* **routes** DynamoDB requests by ``TableName`` (every table of a batch must live on the same
  server) to different backends, so leases can live on dynalite (which serialises conditional
  writes) and a table with a change stream on moto (which has streams), and forwards every other
  service to one backend (or a backend of its own: the WebSocket Management API to a local
  gateway, say);
* **records** every request as ``(access key id, service, operation, resources)`` plus the Region,
  the answer's status and the IAM condition values it can see (``cloudwatch:namespace``), in
  memory and, if asked, as JSON lines in a file. Give each component its own access key id and
  the record says who called what: the input of an IAM least-privilege check;
* **injects faults**: added latency per request (for all services or one), a "down" switch
  that drops requests without an answer, as an unreachable endpoint would, and throttling: a
  seeded fraction of DynamoDB's item and query requests answered
  ``ProvisionedThroughputExceededException`` and not applied, as a hot partition answers; a
  throttled ``BatchWriteItem`` or ``BatchGetItem`` of n items has a number of them processed
  drawn from 0 to n - 1, the rest returned as ``UnprocessedItems`` / ``UnprocessedKeys`` (the
  Management API's faults are the local gateway's own: ``management_fault_rates``);
* **lags secondary indexes**: DynamoDB's global secondary indexes are eventually consistent, and
  dynalite and moto update theirs synchronously. With ``index_lag_seconds`` a query or scan of
  an index may be answered with an earlier answer to the same request, the oldest that still
  reflects every write to its table older than the lag: so an index shows a write up to that
  long after it was applied (a row missing after it was written, or still there after it was
  removed), and never an answer the index did not really give. A request never asked before
  is answered as it is now (there is no earlier answer to give).

It understands the wire formats botocore speaks: the JSON protocol (``X-Amz-Target``:
DynamoDB, SQS, Secrets Manager), the query protocol (form ``Action=...``: CloudWatch with older
SDKs), Smithy RPC v2 CBOR (``/service/<name>/operation/<op>``: CloudWatch with newer ones) and
REST paths (the API Gateway Management API). Service, Region and caller come from the SigV4
``Authorization`` header's credential scope.

Python API::

    with AwsProxy(default_backend=moto.endpoint, table_backends={"leases": dynalite.endpoint},
                  record_path=Path("calls.jsonl")) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        proxy.set_latency(0.020, service="dynamodb")  # 20 ms on every DynamoDB request
        proxy.set_down(True)                          # every request dropped
        proxy.records()                               # RecordedRequest list

Command line (a running proxy is also steered over HTTP: ``POST /__proxy__/latency?seconds=0.02
[&service=dynamodb]``, ``POST /__proxy__/down?on=1``, ``GET /__proxy__/state``)::

    python -m streamfleet_dev.emulator.aws_proxy --backend http://127.0.0.1:5000 \\
        --table leases=http://127.0.0.1:8000 --record calls.jsonl --latency-ms 20 --port 4566
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import struct
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

CONTROL_PREFIX = "/__proxy__/"
INDEX_QUERIES_KEPT = 10_000  # distinct index requests remembered for lag, at most
INDEX_ANSWERS_KEPT = 20  # answers remembered per request: fewer only makes answers fresher
# How stale the local worlds' index answers are by default: DynamoDB propagates to a global
# secondary index "usually within a fraction of a second", so a second is on the strict side.
DEFAULT_INDEX_LAG_SECONDS = 1.0
# The fraction of requests the local worlds throttle by default: often enough that every run
# meets throttling on its busy paths, rarely enough that the SDKs' retries absorb it.
DEFAULT_THROTTLE_RATE = 0.01
BACKEND_TIMEOUT_SECONDS = 60.0
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}
)
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")
_CBOR_PATH = re.compile(r"/service/([^/]+)/operation/([^/?]+)")
_MANAGEMENT_PATH = re.compile(r"/(?P<stage>[^/]+)/@connections/(?P<id>[^/?]+)")
_MANAGEMENT_OPERATIONS = {"POST": "PostToConnection", "GET": "GetConnection"}
_MANAGEMENT_OPERATIONS["DELETE"] = "DeleteConnection"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the proxy saw it.

    Attributes:
        ts: when it arrived (epoch seconds).
        access_key_id: the caller's access key id (SigV4 credential scope).
        region: the Region it was signed for.
        service: the signing name (``dynamodb``, ``sqs``, ``monitoring``, ``execute-api``...).
        operation: the API operation (``UpdateItem``, ``SendMessage``, ``PostToConnection``...).
        resources: what it names: ``table/<name>``, ``table/<name>/index/<index>``,
            ``queue/<name>``, ``secret/<id>``, ``<stage>/<METHOD>/@connections/<id>``, or ``*``.
        status: the backend's HTTP status (0: dropped, never answered).
        conditions: IAM condition values visible in the request (``cloudwatch:namespace``).
    """

    ts: float
    access_key_id: str
    region: str
    service: str
    operation: str
    resources: tuple[str, ...]
    status: int
    conditions: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        data["resources"] = list(self.resources)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> RecordedRequest:
        data = json.loads(line)
        data["resources"] = tuple(data["resources"])
        return cls(**data)


def read_records(path: Path) -> list[RecordedRequest]:
    """The requests recorded in a JSON-lines file."""
    return [RecordedRequest.from_json(line) for line in path.read_text().splitlines() if line]


# --- Parsing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedRequest:
    access_key_id: str
    region: str
    service: str
    operation: str
    resources: tuple[str, ...]
    tables: tuple[str, ...]  # DynamoDB tables, for routing
    conditions: Mapping[str, str]


def _cbor_decode(data: bytes) -> Any:
    """Enough CBOR (RFC 8949) for a request body: maps, arrays, strings, numbers, booleans."""

    def item(offset: int) -> tuple[Any, int]:
        initial = data[offset]
        major, info = initial >> 5, initial & 0x1F
        offset += 1
        if major == 7:
            if info == 20:
                return False, offset
            if info == 21:
                return True, offset
            if info in (22, 23):
                return None, offset
            sizes = {25: (">e", 2), 26: (">f", 4), 27: (">d", 8)}
            fmt, size = sizes[info]
            return struct.unpack(fmt, data[offset : offset + size])[0], offset + size
        if info < 24:
            length = info
        elif info == 31:
            length = -1  # indefinite
        else:
            size = 1 << (info - 24)
            length = int.from_bytes(data[offset : offset + size], "big")
            offset += size
        if major == 0:
            return length, offset
        if major == 1:
            return -1 - length, offset
        if major in (2, 3):
            if length < 0:
                chunks = []
                while data[offset] != 0xFF:
                    chunk, offset = item(offset)
                    chunks.append(chunk)
                joined = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks)
                return (joined if major == 2 else joined.decode()), offset + 1
            raw = data[offset : offset + length]
            return (raw if major == 2 else raw.decode()), offset + length
        if major == 4:
            values = []
            while (length < 0 and data[offset] != 0xFF) or len(values) < max(length, 0):
                value, offset = item(offset)
                values.append(value)
            return values, offset + (1 if length < 0 else 0)
        if major == 5:
            mapping = {}
            while (length < 0 and data[offset] != 0xFF) or len(mapping) < max(length, 0):
                key, offset = item(offset)
                mapping[key], offset = item(offset)
            return mapping, offset + (1 if length < 0 else 0)
        if major == 6:  # a tag (timestamps): the tagged value
            return item(offset)
        raise ValueError(f"CBOR: major type {major}")

    return item(0)[0] if data else {}


def _queue_name(url: str) -> str:
    return urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]


def _dynamodb_tables(operation: str, params: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    if "TableName" in params:
        return [(str(params["TableName"]), params.get("IndexName"))]
    if "RequestItems" in params:  # BatchGetItem, BatchWriteItem
        return [(str(name), None) for name in params["RequestItems"]]
    if "TransactItems" in params:
        found = []
        for entry in params["TransactItems"]:
            for action in entry.values():
                if isinstance(action, Mapping) and "TableName" in action:
                    found.append((str(action["TableName"]), None))
        return found
    return []


def parse_request(method: str, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
    """Who calls which operation on what, from the raw HTTP request."""
    lower = {name.lower(): value for name, value in headers.items()}
    access_key, region, service = "", "", ""
    match = _CREDENTIAL.search(lower.get("authorization", ""))
    if match is None:  # presigned: the scope is in the query string
        query = parse_qs(urlsplit(path).query)
        scope = (query.get("X-Amz-Credential") or [""])[0].split("/")
        if len(scope) == 5:
            access_key, region, service = scope[0], scope[2], scope[3]
    else:
        access_key, region, service = match.groups()
    operation, params = "", {}
    target = lower.get("x-amz-target", "")
    content_type = lower.get("content-type", "")
    cbor = _CBOR_PATH.search(urlsplit(path).path)
    if target:
        operation = target.rsplit(".", 1)[-1]
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            params = {}
    elif cbor:
        operation = cbor.group(2)
        try:
            params = _cbor_decode(body)
        except (ValueError, KeyError, IndexError, struct.error):
            params = {}
    elif "x-www-form-urlencoded" in content_type:
        form = {k: v[-1] for k, v in parse_qs(body.decode(errors="replace")).items()}
        operation, params = form.pop("Action", ""), form
    if not isinstance(params, Mapping):
        params = {}
    resources: list[str] = []
    tables: list[str] = []
    conditions: dict[str, str] = {}
    if service == "dynamodb":
        for table, index in _dynamodb_tables(operation, params):
            tables.append(table)
            resources.append(f"table/{table}/index/{index}" if index else f"table/{table}")
        if "StreamArn" in params:
            resources.append(f"stream/{params['StreamArn']}")
    elif service == "sqs":
        if "QueueUrl" in params:
            resources.append(f"queue/{_queue_name(str(params['QueueUrl']))}")
        elif "QueueName" in params:
            resources.append(f"queue/{params['QueueName']}")
    elif service == "secretsmanager" and "SecretId" in params:
        resources.append(f"secret/{params['SecretId']}")
    elif service == "monitoring" and operation == "DescribeAlarms":
        names = params.get("AlarmNames")
        if not isinstance(names, list):  # the query protocol: AlarmNames.member.<n>
            names = [v for k, v in params.items() if str(k).startswith("AlarmNames.member.")]
        resources.extend(f"alarm:{name}" for name in names)
    elif service == "monitoring" and "Namespace" in params:
        conditions["cloudwatch:namespace"] = str(params["Namespace"])
    elif service == "execute-api":
        managed = _MANAGEMENT_PATH.search(urlsplit(path).path)
        if managed:
            operation = _MANAGEMENT_OPERATIONS.get(method, method)
            connection = unquote(managed.group("id"))
            resources.append(f"{managed.group('stage')}/{method}/@connections/{connection}")
    return ParsedRequest(
        access_key_id=access_key,
        region=region,
        service=service,
        operation=operation,
        resources=tuple(resources) or ("*",),
        tables=tuple(dict.fromkeys(tables)),
        conditions=conditions,
    )


# --- The proxy ----------------------------------------------------------------------------------


@dataclass
class _Faults:
    latency: dict[str | None, float] = field(default_factory=dict)  # service (None: all)
    down: set[str | None] = field(default_factory=set)
    # The first request for each item whose body contains this marker is applied and its answer
    # dropped (the caller sees the connection close); its retries are answered.
    lose_first_answer: bytes | None = None
    answered_once: set[str] = field(default_factory=set)
    answers_lost: int = 0
    index_lag: float = 0.0
    # (Region, backend, request body) -> [(when, (headers, body))]: each index request's answers
    index_answers: dict[
        tuple[str, ...], list[tuple[float, tuple[list[tuple[str, str]], bytes]]]
    ] = field(default_factory=dict)
    # "<Region>/<table>" -> when writes reached it (the newest older than the lag, and later)
    table_writes: dict[str, deque[float]] = field(default_factory=dict)
    stale_answers: int = 0  # answers that differed from the index's current one
    throttle_rate: float = 0.0
    throttle_random: random.Random = field(default_factory=random.Random)
    throttled: int = 0
    partly_throttled: int = 0  # of them, batches applied in part

    def throttles(self, parsed: ParsedRequest) -> bool:
        """Whether to answer ``parsed`` as throttled (decided once per request)."""
        if not self.throttle_rate or parsed.operation not in _THROTTLED_OPERATIONS:
            return False
        if self.throttle_random.random() >= self.throttle_rate:
            return False
        self.throttled += 1
        return True

    def split_batch(self, parsed: ParsedRequest, body: bytes) -> _BatchSplit | None:
        """For a throttled batch of several items: the part DynamoDB processes and the part it
        returns unprocessed, drawn from the seed; ``None``: refuse it whole (no item processed,
        which DynamoDB answers with the exception)."""
        if parsed.operation not in _BATCH_UNPROCESSED:
            return None
        try:
            request = json.loads(body)
            tables = request["RequestItems"]
            if parsed.operation == "BatchWriteItem":
                entries = [(t, i) for t, items in tables.items() for i in range(len(items))]
            else:
                entries = [(t, i) for t, spec in tables.items() for i in range(len(spec["Keys"]))]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not a request DynamoDB would accept: the backend says why
        # Split only what DynamoDB could have accepted whole, as far as the proxy can tell:
        # one table (the backend then judges the table and the processed items) and within
        # the batch limits. Items returned unprocessed are not judged with the others.
        limit = 25 if parsed.operation == "BatchWriteItem" else 100
        if len(tables) != 1 or not 2 <= len(entries) <= limit:
            return None
        processed = set(
            self.throttle_random.sample(entries, self.throttle_random.randrange(len(entries)))
        )
        if not processed:
            return None
        self.partly_throttled += 1
        return _BatchSplit.of(parsed.operation, request, processed)

    def answer_lost(self, body: bytes) -> bool:
        if self.lose_first_answer is None or self.lose_first_answer not in body:
            return False
        try:
            key = json.dumps(json.loads(body).get("Key"), sort_keys=True)
        except ValueError:
            return False
        if key in self.answered_once:
            return False
        self.answered_once.add(key)
        self.answers_lost += 1
        return True

    def wrote(self, table: str) -> None:
        """A write (applied or not) reached ``table`` now."""
        now = time.monotonic()
        self._writes_of(table, now).append(now)

    def _writes_of(self, table: str, now: float) -> deque[float]:
        """``table``'s write times within the lag, and the newest older one (all that matters):
        bounded by the write rate times the lag, on a table no index query ever reads too."""
        writes = self.table_writes.setdefault(table, deque())
        while len(writes) > 1 and writes[1] <= now - self.index_lag:
            writes.popleft()
        return writes

    def stale_answer(
        self, key: tuple[str, ...], table: str, answer: tuple[list[tuple[str, str]], bytes]
    ) -> tuple[list[tuple[str, str]], bytes]:
        """Remember ``answer`` (just given by the backend) to the index request ``key``, and
        give back the oldest remembered answer that reflects every write to ``table`` older
        than the lag: what a lagging index could answer now."""
        now = time.monotonic()
        cutoff = now - self.index_lag
        writes = self._writes_of(table, now)
        visible = writes[0] if writes and writes[0] <= cutoff else float("-inf")
        answers = [(at, given) for at, given in self.index_answers.get(key, []) if at > visible]
        answers.append((now, answer))
        self.index_answers[key] = answers[-INDEX_ANSWERS_KEPT:]
        if len(self.index_answers) > INDEX_QUERIES_KEPT:
            for old in list(self.index_answers)[: INDEX_QUERIES_KEPT // 2]:
                self.index_answers.pop(old, None)
        served = self.index_answers[key][0][1]
        self.stale_answers += served[1] != answer[1]
        return served

    def delay_for(self, service: str) -> float:
        return self.latency.get(service, self.latency.get(None, 0.0))

    def is_down(self, service: str) -> bool:
        return None in self.down or service in self.down


class AwsProxy:
    """The recording, routing, fault-injecting proxy (see the module docstring).

    Args:
        default_backend: where requests go that nothing else routes (``http://host:port``).
        table_backends: DynamoDB ``TableName`` -> backend.
        service_backends: signing name (``dynamodb``, ``sqs``, ``execute-api``...) -> backend;
            for DynamoDB, where tables not in ``table_backends`` go.
        index_lag_seconds: how stale an answer from a secondary index may be (0: never).
        throttle_rate, throttle_seed: the fraction of DynamoDB item and query requests
            answered as throttled, drawn from ``throttle_seed``.
        record_path: append every request as one JSON line to this file.
        keep_records: also keep them in memory for :meth:`records` (turn off for long runs;
            :meth:`counts` is always kept).
        host, port: where to listen (port 0: any free port, see :attr:`endpoint`).
    """

    def __init__(
        self,
        *,
        default_backend: str,
        table_backends: Mapping[str, str] | None = None,
        service_backends: Mapping[str, str] | None = None,
        index_lag_seconds: float = 0.0,
        throttle_rate: float = 0.0,
        throttle_seed: int | None = None,
        record_path: Path | None = None,
        keep_records: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.default_backend = default_backend.rstrip("/")
        self.table_backends = {k: v.rstrip("/") for k, v in (table_backends or {}).items()}
        self.service_backends = {k: v.rstrip("/") for k, v in (service_backends or {}).items()}
        self.record_path = record_path
        self.keep_records = keep_records
        self._faults = _Faults()
        self._records: list[RecordedRequest] = []
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()
        self.set_index_lag(index_lag_seconds)
        self.set_throttle(throttle_rate, seed=throttle_seed)
        self._server = _Server((host, port), _handler_class(self))
        self._thread: threading.Thread | None = None

    # Lifecycle -------------------------------------------------------------------------------

    def start(self) -> AwsProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="aws-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> AwsProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``: what ``AWS_ENDPOINT_URL`` should say."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # Routing ---------------------------------------------------------------------------------

    def route_table(self, table_name: str, backend: str) -> None:
        """Send DynamoDB requests for ``table_name`` to ``backend`` from now on."""
        with self._lock:
            self.table_backends[table_name] = backend.rstrip("/")

    def backend_for(self, parsed: ParsedRequest) -> str:
        """Where a request goes; ``ValueError`` if its tables live on different backends."""
        service_default = self.service_backends.get(parsed.service, self.default_backend)
        if parsed.service != "dynamodb" or not parsed.tables:
            return service_default
        backends = {self.table_backends.get(t, service_default) for t in parsed.tables}
        if len(backends) > 1:
            raise ValueError(f"tables {list(parsed.tables)} live on different backends")
        return backends.pop()

    # Faults ----------------------------------------------------------------------------------

    def set_latency(self, seconds: float, *, service: str | None = None) -> None:
        """Delay every request (of ``service``, or all) by ``seconds`` before forwarding it."""
        if not seconds >= 0:
            raise ValueError(f"seconds: {seconds!r} must be zero or more")
        with self._lock:
            if seconds:
                self._faults.latency[service] = float(seconds)
            else:
                self._faults.latency.pop(service, None)

    def lose_first_answers(self, marker: str | None) -> int:
        """From now on, the first request for each item whose body contains ``marker`` is
        applied and its answer dropped (``"ADD #lease_version"``: every claim's first attempt
        loses its answer); ``None`` stops it. Returns how many answers were lost so far."""
        with self._lock:
            self._faults.lose_first_answer = marker.encode() if marker else None
            self._faults.answered_once.clear()
            return self._faults.answers_lost

    def set_index_lag(self, seconds: float) -> None:
        """Answer index queries from views up to ``seconds`` old from now on (0: current)."""
        if not seconds >= 0:
            raise ValueError(f"seconds: {seconds!r} must be zero or more")
        with self._lock:
            self._faults.index_lag = float(seconds)
            self._faults.index_answers.clear()
            self._faults.table_writes.clear()

    def set_throttle(self, rate: float, *, seed: int | None = None) -> None:
        """Answer ``rate`` of the DynamoDB item and query requests as throttled from now on (0:
        none), drawn from ``seed``."""
        if not 0 <= rate <= 1:
            raise ValueError(f"rate: {rate!r} must be between 0 and 1")
        with self._lock:
            self._faults.throttle_rate = float(rate)
            self._faults.throttle_random = random.Random(seed)

    def set_down(self, down: bool, *, service: str | None = None) -> None:
        """Drop every request (of ``service``, or all) without an answer while ``down``."""
        with self._lock:
            if down:
                self._faults.down.add(service)
            else:
                self._faults.down.discard(service)

    def state(self) -> dict[str, Any]:
        """Current faults and request counts (what ``GET /__proxy__/state`` answers)."""
        with self._lock:
            return {
                "latency": {k or "*": v for k, v in self._faults.latency.items()},
                "down": sorted(k or "*" for k in self._faults.down),
                "index_lag": self._faults.index_lag,
                "stale_index_answers": self._faults.stale_answers,
                "throttle_rate": self._faults.throttle_rate,
                "throttled": self._faults.throttled,
                "partly_throttled": self._faults.partly_throttled,
                "requests": sum(self._counts.values()),
            }

    # Records ---------------------------------------------------------------------------------

    def records(self) -> list[RecordedRequest]:
        """Every request recorded so far (if ``keep_records``)."""
        with self._lock:
            return list(self._records)

    def counts(self) -> dict[tuple[str, str, str], int]:
        """``(access key id, service, operation) -> requests``."""
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        """Forget the records and counts (the file keeps what it has)."""
        with self._lock:
            self._records.clear()
            self._counts.clear()

    def _record(self, parsed: ParsedRequest, status: int) -> None:
        record = RecordedRequest(
            ts=time.time(),
            access_key_id=parsed.access_key_id,
            region=parsed.region,
            service=parsed.service,
            operation=parsed.operation,
            resources=parsed.resources,
            status=status,
            conditions=dict(parsed.conditions),
        )
        with self._lock:
            self._counts[(record.access_key_id, record.service, record.operation)] += 1
            if self.keep_records:
                self._records.append(record)
            if self.record_path is not None:
                with open(self.record_path, "a", encoding="utf-8") as handle:
                    handle.write(record.to_json() + "\n")

    # Control over HTTP -------------------------------------------------------------------------

    def control(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        command = parts.path.removeprefix(CONTROL_PREFIX)
        service = query.get("service") or None
        try:
            if command == "state" and method == "GET":
                return 200, self.state()
            if command == "latency" and method == "POST":
                self.set_latency(float(query.get("seconds", "0")), service=service)
                return 200, self.state()
            if command == "index-lag" and method == "POST":
                self.set_index_lag(float(query.get("seconds", "0")))
                return 200, self.state()
            if command == "throttle" and method == "POST":
                seed = query.get("seed")
                self.set_throttle(
                    float(query.get("rate", "0")), seed=None if seed is None else int(seed)
                )
                return 200, self.state()
            if command == "down" and method == "POST":
                self.set_down(query.get("on", "1") not in ("0", "false"), service=service)
                return 200, self.state()
            if command == "lose-first-answers" and method == "POST":
                lost = self.lose_first_answers(query.get("marker") or None)
                return 200, {**self.state(), "answers_lost": lost}
        except ValueError as exc:
            return 400, {"error": str(exc)}
        return 404, {"error": f"{method} {parts.path}: no such control"}


_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
_THROTTLED_OPERATIONS = _WRITES | {"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"}
# Where a throttled batch's items that were not processed are returned, by operation.
_BATCH_UNPROCESSED = {"BatchWriteItem": "UnprocessedItems", "BatchGetItem": "UnprocessedKeys"}


@dataclass(frozen=True)
class _BatchSplit:
    """A throttled batch applied in part: ``body`` is the request with the processed items only,
    ``unprocessed`` what the answer returns in ``UnprocessedItems`` / ``UnprocessedKeys``."""

    operation: str
    body: bytes
    unprocessed: dict[str, Any]

    @classmethod
    def of(
        cls, operation: str, request: dict[str, Any], processed: set[tuple[str, int]]
    ) -> _BatchSplit:
        kept: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for table, items in request["RequestItems"].items():
            if operation == "BatchWriteItem":
                chosen = [r for i, r in enumerate(items) if (table, i) in processed]
                left = [r for i, r in enumerate(items) if (table, i) not in processed]
                kept.update({table: chosen} if chosen else {})
                rest.update({table: left} if left else {})
            else:  # BatchGetItem: the keys split, the table's other parameters kept on both
                keys = items["Keys"]
                chosen = [k for i, k in enumerate(keys) if (table, i) in processed]
                left = [k for i, k in enumerate(keys) if (table, i) not in processed]
                kept.update({table: {**items, "Keys": chosen}} if chosen else {})
                rest.update({table: {**items, "Keys": left}} if left else {})
        body = json.dumps({**request, "RequestItems": kept}).encode()
        return cls(operation, body, rest)

    def answer(self, data: bytes) -> bytes:
        """The backend's answer to the processed part, with the rest added as unprocessed
        (an answer that is not JSON is passed on as it is)."""
        try:
            answer = json.loads(data)
        except ValueError:
            return data
        field_name = _BATCH_UNPROCESSED[self.operation]
        merged = dict(answer.get(field_name) or {})
        for table, left in self.unprocessed.items():
            if self.operation == "BatchWriteItem":
                merged[table] = [*merged.get(table, []), *left]
            else:
                earlier = merged.get(table, {}).get("Keys", [])
                merged[table] = {**left, "Keys": [*earlier, *left["Keys"]]}
        answer[field_name] = merged
        return json.dumps(answer).encode()


# What DynamoDB answers a throttled request on an on-demand table (a batch refused whole: no
# item of it could be processed).
_THROTTLED_ANSWER = json.dumps(
    {
        "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        "message": "Throughput exceeds the current capacity of your table or index. DynamoDB is "
        "automatically scaling your table or index so please try again shortly.",
    }
).encode()


def _reads_index(parsed: ParsedRequest) -> bool:
    return parsed.operation in ("Query", "Scan") and any(
        "/index/" in resource for resource in parsed.resources
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that gave up (its read timeout, a killed process) is the network's business:
        # not worth a traceback on stderr for every one.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _handler_class(proxy: AwsProxy) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    def connection_to(backend: str) -> http.client.HTTPConnection:
        pool = getattr(local, "pool", None)
        if pool is None:
            pool = local.pool = {}
        if backend not in pool:
            parts = urlsplit(backend)
            pool[backend] = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=BACKEND_TIMEOUT_SECONDS
            )
        return pool[backend]

    def drop_connection(backend: str) -> None:
        pool = getattr(local, "pool", {})
        connection = pool.pop(backend, None)
        if connection is not None:
            connection.close()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _serve(self) -> None:
            body = self._body()
            if self.path.startswith(CONTROL_PREFIX):
                status, payload = proxy.control(self.command, self.path)
                data = json.dumps(payload).encode()
                self._answer(status, [("Content-Type", "application/json")], data)
                return
            parsed = parse_request(self.command, self.path, dict(self.headers.items()), body)
            delay = proxy._faults.delay_for(parsed.service)
            if delay:
                time.sleep(delay)
            if proxy._faults.is_down(parsed.service):
                proxy._record(parsed, 0)
                self.close_connection = True
                return
            split = None
            with proxy._lock:
                throttled = parsed.service == "dynamodb" and proxy._faults.throttles(parsed)
                if throttled:
                    split = proxy._faults.split_batch(parsed, body)
            if split is not None:
                body = split.body
                throttled = False
            if throttled:
                proxy._record(parsed, 400)
                headers = [("Content-Type", "application/x-amz-json-1.0")]
                self._answer(400, headers, _THROTTLED_ANSWER)
                return
            try:
                backend = proxy.backend_for(parsed)
            except ValueError as exc:
                proxy._record(parsed, 400)
                error = {"__type": "ValidationException", "message": f"proxy: {exc}"}
                headers = [("Content-Type", "application/x-amz-json-1.0")]
                self._answer(400, headers, json.dumps(error).encode())
                return
            forwarded = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if split is not None:
                forwarded = {k: v for k, v in forwarded.items() if k.lower() != "content-length"}
                forwarded["Content-Length"] = str(len(body))
            for attempt in range(2):  # a pooled connection the backend closed: once more
                connection = connection_to(backend)
                try:
                    connection.request(self.command, self.path, body=body, headers=forwarded)
                    response = connection.getresponse()
                    data = response.read()
                    break
                except (OSError, http.client.HTTPException):
                    drop_connection(backend)
                    if attempt:
                        proxy._record(parsed, 0)
                        self.close_connection = True  # unreachable backend: no answer
                        return
            proxy._record(parsed, response.status)
            headers = response.getheaders()
            if split is not None and response.status == 200:
                data = split.answer(data)
                # botocore checks DynamoDB's answers against this checksum.
                headers = [(k, v) for k, v in headers if k.lower() != "x-amz-crc32"]
                headers.append(("x-amz-crc32", str(zlib.crc32(data) & 0xFFFFFFFF)))
            with proxy._lock:
                lost = proxy._faults.answer_lost(body)
                faults = proxy._faults
                if faults.index_lag and parsed.service == "dynamodb":
                    tables = [f"{parsed.region}/{table}" for table in parsed.tables]
                    if parsed.operation in _WRITES:
                        for table in tables:
                            faults.wrote(table)
                    elif response.status == 200 and len(tables) == 1 and _reads_index(parsed):
                        key = (parsed.region, backend, body.decode("utf-8", "replace"))
                        headers, data = faults.stale_answer(key, tables[0], (headers, data))
            if lost:  # applied by the backend; the caller never hears of it
                self.close_connection = True
                return
            self._answer(response.status, headers, data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve

    return Handler


# --- Command line -------------------------------------------------------------------------------


def _pairs(values: list[str], option: str) -> Iterator[tuple[str, str]]:
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise SystemExit(f"{option}: {value!r} is not NAME=http://host:port")
        yield name, url


class ProxyProcess:
    """The proxy in a process of its own (``python -m streamfleet_dev.emulator.aws_proxy``), steered
    over HTTP: a busy caller's process then never slows the proxy down (or the other way round).
    """

    def __init__(self, *, default_backend: str, table_backends: Mapping[str, str] | None = None):
        self._args = ["--backend", default_backend]
        for table, backend in (table_backends or {}).items():
            self._args += ["--table", f"{table}={backend}"]
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def __enter__(self) -> ProxyProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamfleet_dev.emulator.aws_proxy", *self._args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.process.stdout.readline()  # "aws proxy on http://127.0.0.1:<port>"
        if not line.startswith("aws proxy on "):
            raise RuntimeError(f"aws proxy did not start ({self.process.wait()})")
        self.endpoint = line.split()[-1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)

    def control(self, command: str, **query: object) -> dict[str, Any]:
        url = f"{self.endpoint}{CONTROL_PREFIX}{command}?" + urlencode(
            {k: v for k, v in query.items() if v is not None}
        )
        request = urllib.request.Request(url, method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def set_latency(self, seconds: float, *, service: str | None = None) -> None:
        self.control("latency", seconds=seconds, service=service)

    def set_throttle(self, rate: float, *, seed: int | None = None) -> None:
        self.control("throttle", rate=rate, seed=seed)

    def lose_first_answers(self, marker: str | None) -> int:
        return int(self.control("lose-first-answers", marker=marker or "")["answers_lost"])


def main(argv: list[str] | None = None) -> int:
    """Run the proxy until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True, help="default backend, http://host:port")
    parser.add_argument("--table", action="append", default=[], help="TABLE=backend (DynamoDB)")
    parser.add_argument("--service", action="append", default=[], help="SERVICE=backend")
    parser.add_argument("--record", type=Path, help="append requests as JSON lines here")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    proxy = AwsProxy(
        default_backend=args.backend,
        table_backends=dict(_pairs(args.table, "--table")),
        service_backends=dict(_pairs(args.service, "--service")),
        record_path=args.record,
        keep_records=False,
        host=args.host,
        port=args.port,
    )
    proxy.set_latency(args.latency_ms / 1000)
    print(f"aws proxy on {proxy.endpoint}", flush=True)
    try:
        proxy._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        proxy._server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
