"""The local event source mapping's batching window (``MaximumBatchingWindowInSeconds``).

Lambda gathers a shard's records until the batch is full or the window has passed, then
invokes once: fewer invocations (and, for the fan-out, fewer posts) for a bounded added latency.
Against a messages table's real change stream on moto's server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import boto3
import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.lease.dynamo import to_attr
from streamfleet_dev.emulator.event_source import (
    EventSourceSettings,
    OnFailureDestination,
    StreamEventSource,
)
from streamfleet_dev.tables import create_table

REGION = "us-east-1"


@pytest.fixture
def messages_stream(moto) -> Any:
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    name = f"batching-messages-{uuid.uuid4().hex[:10]}"
    create_table(dynamodb, model.MESSAGES_TABLE, name)
    arn = dynamodb.describe_table(TableName=name)["Table"]["LatestStreamArn"]
    yield dynamodb, name, arn, moto.endpoint
    dynamodb.delete_table(TableName=name)


def store(dynamodb: Any, table: str, seqs: range) -> None:
    for seq in seqs:
        dynamodb.put_item(
            TableName=table,
            Item={
                model.PK: to_attr(model.connection_pk("s1")),
                model.SEQ: to_attr(seq),
                model.MESSAGE_DATA: to_attr(f"s1:{seq}"),
            },
        )


class Recorder:
    """A function that records each invocation's seqs and when it came."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        seqs = [int(r["dynamodb"]["NewImage"][model.SEQ]["N"]) for r in event["Records"]]
        self.batches.append((time.monotonic(), seqs))
        return {"batchItemFailures": []}


async def run_source(
    arn: str,
    endpoint: str,
    settings: EventSourceSettings,
    body,
    function: Recorder | None = None,
    on_failure: OnFailureDestination | None = None,
) -> tuple[Recorder, StreamEventSource]:
    """The event source on ``arn`` invoking ``function`` (a new Recorder by default) while
    ``body(recorder, source)`` runs."""
    recorder = function or Recorder()
    streams = AsyncClient("dynamodbstreams", region_name=REGION, endpoint_url=endpoint)
    source = StreamEventSource(
        streams=streams,
        stream_arn=arn,
        function=recorder,
        region=REGION,
        settings=settings,
        on_failure=on_failure,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    try:
        await source.ready()
        await body(recorder, source)
    finally:
        stop.set()
        await task
        streams.close()
    return recorder, source


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_records_written_within_the_window_arrive_in_one_invocation(
    messages_stream,
) -> None:
    dynamodb, table, arn, endpoint = messages_stream
    # Three writes, 0.3 s apart: inside the window even where each write takes a second.
    settings = EventSourceSettings(poll_interval=0.05, max_batching_window=6.0, batch_size=100)

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        for group in range(3):
            await asyncio.to_thread(store, dynamodb, table, range(group * 5 + 1, group * 5 + 6))
            await asyncio.sleep(0.3)
        await until(lambda: sum(len(s) for _, s in recorder.batches) >= 15, 60, "15 records")

    recorder, _ = await run_source(arn, endpoint, settings, body)
    # Before the fix the source slept through the window and invoked with the first write's
    # records only: three invocations, each one window late.
    assert [seqs for _, seqs in recorder.batches] == [list(range(1, 16))]


async def test_a_full_batch_is_invoked_without_waiting_for_the_window(messages_stream) -> None:
    dynamodb, table, arn, endpoint = messages_stream
    # A source that waited for the window would invoke long after the poll below gave up.
    settings = EventSourceSettings(poll_interval=0.05, max_batching_window=300.0, batch_size=10)

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 11))
        await until(lambda: recorder.batches, 30, "the full batch, before the window")

    recorder, _ = await run_source(arn, endpoint, settings, body)
    ((_, seqs),) = recorder.batches
    assert seqs == list(range(1, 11))


class FailingOnce(Recorder):
    """Reports the record at ``position`` of its first batch failed (by its sequence number, or
    by ``identifier`` when given), then succeeds."""

    def __init__(self, position: int, identifier: str | None = None) -> None:
        super().__init__()
        self.position, self.identifier = position, identifier

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        super().__call__(event, context)
        if len(self.batches) > 1:
            return {"batchItemFailures": []}
        record = event["Records"][self.position]
        identifier = self.identifier or record["dynamodb"]["SequenceNumber"]
        return {"batchItemFailures": [{"itemIdentifier": identifier}]}


@pytest.mark.parametrize(
    ("identifier", "retried"),
    [(None, [3, 4, 5]), ("not-a-sequence-number", [1, 2, 3, 4, 5])],
    ids=["from-the-failed-item", "an-invalid-identifier-fails-the-batch"],
)
async def test_a_partial_batch_failure_is_retried_from_the_failed_item(
    messages_stream, identifier: str | None, retried: list[int]
) -> None:
    """Any answer was success: a batchItemFailures list was ignored, so a function that said
    "retry from here" lost what followed. As in Lambda with ReportBatchItemFailures, the batch
    is retried from its lowest failed item, and an identifier that names no record of the
    batch fails all of it."""
    dynamodb, table, arn, endpoint = messages_stream
    # A full batch of 5 is invoked at once, however slowly the puts land.
    settings = EventSourceSettings(
        poll_interval=0.05, max_batching_window=300.0, batch_size=5, report_batch_item_failures=True
    )
    function = FailingOnce(2, identifier)

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 6))
        await until(lambda: len(recorder.batches) >= 2, 60, "the batch and its retry")

    _, source = await run_source(arn, endpoint, settings, body, function)
    first, second = (seqs for _, seqs in function.batches[:2])
    assert first == [1, 2, 3, 4, 5] and second == retried
    assert source.stats.records == 5  # each record counted once, however it was retried


async def test_a_batch_that_keeps_failing_is_sent_to_the_on_failure_destination(
    messages_stream,
) -> None:
    """The queue is sent Lambda's invocation record: which shard and which sequence numbers were
    given up, so an operator can find them in the log; the batch is not retried again."""
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(
        poll_interval=0.05, max_batching_window=300.0, batch_size=5, max_retries=1
    )

    class Failing(Recorder):
        def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
            super().__call__(event, context)
            raise RuntimeError("the function failed")

    sqs = AsyncClient("sqs", region_name=REGION, endpoint_url=endpoint)
    queue = await sqs.call("create_queue", QueueName=f"failed-{uuid.uuid4().hex[:8]}")
    destination = OnFailureDestination(sqs, queue["QueueUrl"], "arn:aws:lambda:::function:f")

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 6))
        await until(lambda: source.stats.skipped_batches, 60, "the batch given up on")

    try:
        recorder, _ = await run_source(arn, endpoint, settings, body, Failing(), destination)
        received = await sqs.call(
            "receive_message", QueueUrl=queue["QueueUrl"], MaxNumberOfMessages=10
        )
    finally:
        sqs.close()
    (message,) = received["Messages"]
    sent = json.loads(message["Body"])
    assert sent["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert sent["requestContext"]["approximateInvokeCount"] == 2  # the try and its one retry
    assert sent["responseContext"]["functionError"] == "Unhandled"
    batch = sent["DDBStreamBatchInfo"]
    assert batch["batchSize"] == 5 and batch["shardId"] and batch["streamArn"] == arn
    first, last = int(batch["startSequenceNumber"]), int(batch["endSequenceNumber"])
    assert first < last
    assert [seqs for _, seqs in recorder.batches] == [[1, 2, 3, 4, 5]] * 2


async def test_expired_records_are_sent_to_the_destination_as_record_age_exceeded(
    messages_stream,
) -> None:
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(poll_interval=0.05, batch_size=10, max_record_age=0.0)
    sqs = AsyncClient("sqs", region_name=REGION, endpoint_url=endpoint)
    queue = await sqs.call("create_queue", QueueName=f"failed-{uuid.uuid4().hex[:8]}")
    destination = OnFailureDestination(sqs, queue["QueueUrl"], "arn:aws:lambda:::function:f")

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 4))
        await until(lambda: source.stats.expired_records >= 3, 60, "the records expired")

    try:
        recorder, _ = await run_source(arn, endpoint, settings, body, None, destination)
        received = await sqs.call(
            "receive_message", QueueUrl=queue["QueueUrl"], MaxNumberOfMessages=10
        )
    finally:
        sqs.close()
    sent = [json.loads(m["Body"]) for m in received["Messages"]]
    assert sum(s["DDBStreamBatchInfo"]["batchSize"] for s in sent) == 3
    assert {s["requestContext"]["condition"] for s in sent} == {"RecordAgeExceeded"}
    assert all("responseContext" not in s for s in sent)  # never invoked
    assert recorder.batches == []


async def test_a_failing_batch_is_bisected_until_the_bad_record_is_alone(messages_stream) -> None:
    """BisectBatchOnFunctionError: the batch is split in two before each retry, so the
    records around a poison one are processed and only it is given up."""
    dynamodb, table, arn, endpoint = messages_stream
    # One retry only: a split must not give up records that were never tried on their own.
    settings = EventSourceSettings(
        poll_interval=0.05, max_batching_window=300.0, batch_size=4, max_retries=1,
        bisect_on_error=True,
    )  # fmt: skip

    class PoisonedBy3(Recorder):
        def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
            super().__call__(event, context)
            if 3 in self.batches[-1][1]:
                raise RuntimeError("seq 3 is poison")
            return {"batchItemFailures": []}

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 5))
        await until(lambda: source.stats.skipped_batches, 60, "the poison given up on")

    function, source = await run_source(arn, endpoint, settings, body, PoisonedBy3())
    processed = sorted(seq for _, seqs in function.batches if 3 not in seqs for seq in seqs)
    assert processed == [1, 2, 4]
    (given_up,) = source.stats.on_failure
    assert given_up["DDBStreamBatchInfo"]["batchSize"] == 1
    # [1,2,3,4] failed and was split; [1,2] passed; [3,4] failed and was split; [3] failed
    # alone and was given up; [4] passed.
    assert source.stats.bisections == 2


async def test_records_older_than_the_maximum_age_are_skipped_without_an_invocation(
    messages_stream,
) -> None:
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(poll_interval=0.05, batch_size=10, max_record_age=0.0)

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 4))
        await until(lambda: source.stats.expired_records >= 3, 60, "the records expired")

    recorder, source = await run_source(arn, endpoint, settings, body)
    assert recorder.batches == [] and source.stats.invocations == 0
    assert sum(d["DDBStreamBatchInfo"]["batchSize"] for d in source.stats.on_failure) == 3


async def test_a_parallelization_factor_splits_a_batch_by_item_each_in_order(
    messages_stream,
) -> None:
    """ParallelizationFactor: concurrent batches per shard, order kept per item (partition and
    sort key), not per stream: the fan-out must not rely on one invocation per shard."""
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(
        poll_interval=0.05, max_batching_window=300.0, batch_size=8, parallelization_factor=2
    )

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 9))
        await until(lambda: sum(len(s) for _, s in recorder.batches) >= 8, 60, "8 records")

    recorder, _ = await run_source(arn, endpoint, settings, body)
    assert sorted(seq for _, seqs in recorder.batches for seq in seqs) == list(range(1, 9))
    assert len(recorder.batches) == 2  # one full batch, in two lanes
    assert all(seqs == sorted(seqs) for _, seqs in recorder.batches)


async def test_records_younger_than_the_maximum_age_are_invoked(messages_stream) -> None:
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(poll_interval=0.05, batch_size=10, max_record_age=3600.0)

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 4))
        await until(lambda: sum(len(s) for _, s in recorder.batches) >= 3, 60, "3 records")

    _, source = await run_source(arn, endpoint, settings, body)
    assert source.stats.expired_records == 0 and not source.stats.on_failure


async def test_a_batch_that_ages_out_while_retried_says_how_often_it_was_invoked(
    messages_stream,
) -> None:
    """With no retry limit (Lambda's default) a failing batch is given up only when its records
    pass the maximum age: its record then counts the invocations and names the failure."""
    dynamodb, table, arn, endpoint = messages_stream
    settings = EventSourceSettings(
        poll_interval=0.05, batch_size=10, max_retries=-1, max_record_age=1.0
    )

    class Failing(Recorder):
        def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
            super().__call__(event, context)
            time.sleep(0.05)
            raise RuntimeError("the function failed")

    async def body(recorder: Recorder, source: StreamEventSource) -> None:
        await asyncio.to_thread(store, dynamodb, table, range(1, 2))
        await until(lambda: source.stats.skipped_batches, 60, "the batch aged out")

    recorder, source = await run_source(arn, endpoint, settings, body, Failing())
    (given_up,) = source.stats.on_failure
    assert given_up["requestContext"]["condition"] == "RecordAgeExceeded"
    assert given_up["requestContext"]["approximateInvokeCount"] == len(recorder.batches) >= 1
    assert given_up["responseContext"]["functionError"] == "Unhandled"
