"""Lambda's event source mapping for a DynamoDB stream, on loopback.

What runs in AWS: Lambda polls each shard of the table's stream (about four times a second when
it is idle, again at once when a poll returned records), and invokes the function with up to
``BatchSize`` records, one batch per shard at a time, so a shard's records are processed in
order; a batch whose invocation fails is retried (``MaximumRetryAttempts``; split in two first
with ``BisectBatchOnFunctionError``), then skipped to the on-failure destination, and records
older than ``MaximumRecordAgeInSeconds`` are skipped there without an invocation: the
destination (an SQS queue) is sent a JSON invocation record that names the shard and the
sequence numbers, never the records themselves. With
``ParallelizationFactor`` N a shard's batch is processed as up to N concurrent batches, each
item's records in order in one of them. ``IteratorAge`` is how old the last record of a batch
was when it was processed.

:class:`StreamEventSource` does that against a real change stream (moto's server implements
DynamoDB Streams: ``DescribeStream``, ``GetShardIterator``, ``GetRecords``; dynalite has none),
reached through the standard endpoint variables like everything else, and hands the function
records in the shape Lambda's event has (``eventName``, ``dynamodb.NewImage`` as DynamoDB JSON,
``ApproximateCreationDateTime`` in epoch seconds, ``eventSourceARN``). The function is any
``(event, context) -> result`` callable, in practice a
:class:`~streamfleet_dev.emulator.lambda_runner.LambdaProcess` running the synthesized asset.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import itertools
import json
import logging
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from streamfleet.aws import AsyncClient

logger = logging.getLogger(__name__)

LambdaFunction = Callable[[dict[str, Any], Any], Any]
SHARD_REFRESH_SECONDS = 5.0
# The most recent entries each of the stats' lists keeps: a mapping runs for hours in make local.
STATS_KEPT = 10_000


@dataclass(frozen=True)
class EventSourceSettings:
    """The mapping's settings, as the template's ``AWS::Lambda::EventSourceMapping`` has them."""

    batch_size: int = 100
    poll_interval: float = 0.25  # Lambda polls an idle shard about 4 times a second
    max_retries: int = 3  # MaximumRetryAttempts; negative (Lambda's default -1): no limit
    starting_position: str = "LATEST"  # or TRIM_HORIZON
    max_batching_window: float = 0.0
    # FunctionResponseTypes: ReportBatchItemFailures. The function's batchItemFailures then
    # say where to retry from; without it any answer is success, as in Lambda.
    report_batch_item_failures: bool = False
    bisect_on_error: bool = False  # BisectBatchOnFunctionError
    max_record_age: float | None = None  # MaximumRecordAgeInSeconds (None, -1: no limit)
    parallelization_factor: int = 1  # ParallelizationFactor: concurrent batches per shard
    on_failure_destination: bool = False  # DestinationConfig.OnFailure names a queue


@dataclass(frozen=True)
class OnFailureDestination:
    """``DestinationConfig.OnFailure``: the SQS queue told of every batch given up on."""

    sqs: AsyncClient
    queue_url: str
    function_arn: str


@dataclass
class EventSourceStats:
    """What the mapping did: a test's and a benchmark's evidence."""

    invocations: int = 0
    records: int = 0
    failed_invocations: int = 0
    skipped_batches: int = 0
    partial_failures: int = 0  # invocations that reported some items failed
    bisections: int = 0  # failed batches split in two (BisectBatchOnFunctionError)
    expired_records: int = 0  # skipped for MaximumRecordAgeInSeconds, never invoked
    # The invocation record of each batch given up on, as the on-failure destination is sent
    # it (whether or not there is one).
    on_failure: list[dict[str, Any]] = field(default_factory=list)
    destination_failures: int = 0  # records the destination could not be sent
    max_iterator_age_ms: float = 0.0
    iterator_ages_ms: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)


class StreamEventSource:
    """Reads every shard of ``stream_arn`` and invokes ``function`` with its records in order."""

    def __init__(
        self,
        *,
        streams: AsyncClient,
        stream_arn: str,
        function: LambdaFunction,
        region: str,
        settings: EventSourceSettings | None = None,
        name: str = "event-source",
        on_failure: OnFailureDestination | None = None,
    ):
        self.streams = streams
        self.stream_arn = stream_arn
        self.function = function
        self.region = region
        self.settings = settings or EventSourceSettings()
        self.name = name
        self.on_failure = on_failure
        self.stats = EventSourceStats()
        self.paused = False
        self._iterators: dict[str, str | None] = {}
        self._started = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and invoke until ``stop`` is set."""
        await self._refresh_shards(initial=True)
        refreshed = time.monotonic()
        while not stop.is_set():
            busy = False
            if not self.paused:
                for shard_id in list(self._iterators):
                    busy |= await self._poll(shard_id)
            if time.monotonic() - refreshed > SHARD_REFRESH_SECONDS:
                await self._refresh_shards()
                refreshed = time.monotonic()
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.poll_interval)

    async def ready(self) -> None:
        """Until the shards' iterators are open (records written after this are delivered)."""
        await self._started.wait()

    async def _refresh_shards(self, *, initial: bool = False) -> None:
        try:
            description = await self.streams.call("describe_stream", StreamArn=self.stream_arn)
        except Exception as exc:  # the next refresh tries again
            logger.warning("%s: describe_stream failed: %s", self.name, exc)
            return
        for shard in description["StreamDescription"].get("Shards", []):
            shard_id = shard["ShardId"]
            if shard_id in self._iterators:
                continue
            # A shard that appears later (a split) is read from its start, as Lambda does.
            position = self.settings.starting_position if initial else "TRIM_HORIZON"
            response = await self.streams.call(
                "get_shard_iterator",
                StreamArn=self.stream_arn,
                ShardId=shard_id,
                ShardIteratorType=position,
            )
            self._iterators[shard_id] = response["ShardIterator"]
        self._started.set()

    async def _poll(self, shard_id: str) -> bool:
        iterator = self._iterators.get(shard_id)
        if iterator is None:
            return False
        try:
            page = await self.streams.call(
                "get_records", ShardIterator=iterator, Limit=self.settings.batch_size
            )
        except Exception as exc:
            logger.warning("%s: get_records failed: %s", self.name, exc)
            return False
        self._iterators[shard_id] = page.get("NextShardIterator")
        records = page.get("Records") or []
        if not records:
            return False
        if self.settings.max_batching_window > 0 and len(records) < self.settings.batch_size:
            records += await self._fill_batch(shard_id, len(records))
        lanes: list[list[dict[str, Any]]] = [
            [] for _ in range(self.settings.parallelization_factor)
        ]
        for record in records:  # an item's records stay in order, in one lane
            keys = json.dumps((record.get("dynamodb") or {}).get("Keys"), sort_keys=True)
            lanes[zlib.crc32(keys.encode()) % len(lanes)].append(record)
        await asyncio.gather(
            *(
                self._invoke({"Records": [self._lambda_record(r) for r in lane]}, shard_id)
                for lane in lanes
                if lane
            )
        )
        return True

    async def _fill_batch(self, shard_id: str, have: int) -> list[dict[str, Any]]:
        """``MaximumBatchingWindowInSeconds``: keep reading the shard until the batch is full
        or the window (counted from the batch's first records) has passed, as Lambda gathers
        records before it invokes. Waiting without reading would only add latency."""
        window_ends = time.monotonic() + self.settings.max_batching_window
        more: list[dict[str, Any]] = []
        while have + len(more) < self.settings.batch_size:
            remaining = window_ends - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(self.settings.poll_interval, remaining))
            iterator = self._iterators.get(shard_id)
            if iterator is None:  # the shard is closed: nothing more will come
                break
            try:
                page = await self.streams.call(
                    "get_records",
                    ShardIterator=iterator,
                    Limit=self.settings.batch_size - have - len(more),
                )
            except Exception as exc:  # invoke with what was gathered; the next poll goes on
                logger.warning("%s: get_records failed: %s", self.name, exc)
                break
            self._iterators[shard_id] = page.get("NextShardIterator")
            more += page.get("Records") or []
        return more

    async def _invoke(
        self,
        event: dict[str, Any],
        shard_id: str = "",
        attempts: int | None = None,
        invoked: int = 0,
        error: str | None = None,
    ) -> None:
        """Invoke with ``event`` until it succeeds or its attempts (``None``: the mapping's) are
        spent, then give the rest up."""
        records = event["Records"]
        batch_size = len(records)
        done = 0  # records before the lowest failed item of a partial failure: processed
        if attempts is None:
            retries = self.settings.max_retries
            attempts = retries + 1 if retries >= 0 else None  # None: until the records expire
        # ``invoked``, ``error``: a bisected half counts the invocations of the batch it was
        # split from, and its last failure, as the record of a half given up reports them.
        for attempt in range(attempts) if attempts is not None else itertools.count():
            records = await self._drop_expired(records, shard_id, invoked, error)
            if not records:
                return
            event = {**event, "Records": records}
            self.stats.invocations += 1
            invoked += 1
            context = SimpleNamespace(aws_request_id=f"{self.name}-{self.stats.invocations}")
            try:
                result = await asyncio.to_thread(self.function, event, context)
                error = None
            except Exception as exc:
                error = "Unhandled"
                self.stats.failed_invocations += 1
                logger.warning(
                    "%s: invocation failed (attempt %d): %s", self.name, attempt + 1, exc
                )
                if self.settings.bisect_on_error and len(records) > 1:
                    # Each half is tried on its own (at least once: a split is not a retry that
                    # could give records up unseen), so one bad record ends up alone in its
                    # batch and alone skipped.
                    self.stats.bisections += 1
                    self.stats.records += done
                    left = None if attempts is None else max(1, attempts - 1 - attempt)
                    half = len(records) // 2
                    for part in (records[:half], records[half:]):
                        await self._invoke(
                            {**event, "Records": part}, shard_id, left, invoked, error
                        )
                    return
                continue
            retry_from = self._retry_from(result, records)
            if retry_from is not None:
                # Lambda retries the batch from the lowest failed item (what precedes it is
                # done); an identifier that names no record of the batch fails all of it.
                self.stats.partial_failures += 1
                done += retry_from
                records = records[retry_from:]
                event = {**event, "Records": records}
                continue
            newest = records[-1]["dynamodb"].get("ApproximateCreationDateTime")
            if isinstance(newest, (int, float)):
                age = max(0.0, time.time() * 1000 - newest * 1000)
                _keep(self.stats.iterator_ages_ms, age)
                self.stats.max_iterator_age_ms = max(self.stats.max_iterator_age_ms, age)
            self.stats.records += done + len(records)
            _keep(self.stats.batch_sizes, batch_size)
            return
        self.stats.records += done
        await self._skip(records, shard_id, "RetryAttemptsExhausted", invoked, error)

    async def _skip(
        self,
        records: list[dict[str, Any]],
        shard_id: str,
        condition: str,
        invoke_count: int,
        function_error: str | None = None,
    ) -> None:
        """Give ``records`` up: the on-failure destination is sent the invocation record Lambda
        sends (``requestContext``, ``responseContext``, ``DDBStreamBatchInfo``)."""
        if not records:
            return
        self.stats.skipped_batches += 1
        arrivals = [r["dynamodb"].get("ApproximateCreationDateTime") for r in records]
        document: dict[str, Any] = {
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "functionArn": self.on_failure.function_arn if self.on_failure else None,
                "condition": condition,
                "approximateInvokeCount": invoke_count,
            },
            "version": "1.0",
            "timestamp": _iso(time.time(), milliseconds=True),
            "DDBStreamBatchInfo": {
                "shardId": shard_id,
                "startSequenceNumber": records[0]["dynamodb"].get("SequenceNumber"),
                "endSequenceNumber": records[-1]["dynamodb"].get("SequenceNumber"),
                "approximateArrivalOfFirstRecord": _iso(arrivals[0]),
                "approximateArrivalOfLastRecord": _iso(arrivals[-1]),
                "batchSize": len(records),
                "streamArn": self.stream_arn,
            },
        }
        if invoke_count:  # a record that expired before any invocation has no response
            document["responseContext"] = {"statusCode": 200, "executedVersion": "$LATEST"}
            if function_error is not None:
                document["responseContext"]["functionError"] = function_error
        _keep(self.stats.on_failure, document)
        if self.on_failure is None:
            return
        try:
            await self.on_failure.sqs.call(
                "send_message",
                QueueUrl=self.on_failure.queue_url,
                MessageBody=json.dumps(document, separators=(",", ":")),
            )
        except Exception as exc:  # the records stay skipped; only their description is lost
            self.stats.destination_failures += 1
            logger.warning("%s: the on-failure destination failed: %s", self.name, exc)

    async def _drop_expired(
        self,
        records: list[dict[str, Any]],
        shard_id: str,
        invoked: int = 0,
        function_error: str | None = None,
    ) -> list[dict[str, Any]]:
        """The records still young enough for ``MaximumRecordAgeInSeconds``; the others are
        skipped to the on-failure destination without an invocation, as Lambda does."""
        limit = self.settings.max_record_age
        if limit is None or limit < 0:
            return records
        oldest_allowed = time.time() - limit
        expired = [
            r
            for r in records
            if isinstance(r["dynamodb"].get("ApproximateCreationDateTime"), (int, float))
            and r["dynamodb"]["ApproximateCreationDateTime"] < oldest_allowed
        ]
        if not expired:
            return records
        self.stats.expired_records += len(expired)
        # Expired between retries too (with no retry limit, the only way a batch is given up):
        # the record then says how often it was invoked and how the last invocation failed.
        await self._skip(expired, shard_id, "RecordAgeExceeded", invoked, function_error)
        return [r for r in records if r not in expired]

    def _retry_from(self, result: Any, records: list[dict[str, Any]]) -> int | None:
        """Where a batch must be retried from after the function answered ``result``: ``None``
        when it succeeded, 0 for all of it, else the index of its lowest failed record."""
        if not self.settings.report_batch_item_failures or not isinstance(result, dict):
            return None
        failures = result.get("batchItemFailures")
        if not failures:
            return None
        positions = {r["dynamodb"].get("SequenceNumber"): i for i, r in enumerate(records)}
        found = []
        for failure in failures:
            identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
            if not isinstance(identifier, str) or identifier not in positions:
                return 0  # an invalid identifier: the whole batch failed
            found.append(positions[identifier])
        return min(found)

    def _lambda_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """A ``GetRecords`` record as Lambda's event carries it (JSON only)."""
        payload = dict(record.get("dynamodb") or {})
        created = payload.get("ApproximateCreationDateTime")
        if isinstance(created, dt.datetime):
            payload["ApproximateCreationDateTime"] = created.timestamp()
        return {
            "eventID": record.get("eventID"),
            "eventName": record.get("eventName"),
            "eventVersion": "1.1",
            "eventSource": "aws:dynamodb",
            "awsRegion": self.region,
            "dynamodb": _jsonable(payload),
            "eventSourceARN": self.stream_arn,
        }


def _keep(items: list[Any], item: Any) -> None:
    """Append ``item``, keeping only the newest :data:`STATS_KEPT`."""
    items.append(item)
    del items[:-STATS_KEPT]


def _iso(seconds: Any, *, milliseconds: bool = False) -> str | None:
    """A time as the invocation record writes it (UTC, ``Z``)."""
    if isinstance(seconds, dt.datetime):
        seconds = seconds.timestamp()
    if not isinstance(seconds, (int, float)):
        return None
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    text = moment.isoformat(timespec="milliseconds" if milliseconds else "seconds")
    return text.replace("+00:00", "Z")


def _jsonable(value: Any) -> Any:
    """Binary attribute values as base64 text, as in Lambda's JSON event."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | set | tuple):
        return [_jsonable(item) for item in value]
    return value
