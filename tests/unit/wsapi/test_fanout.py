"""The fan-out reads the subscribers of a batch's streams concurrently.

One consistent query per stream, one after another, bounds a shard's fan-out to about
1 / (query latency) streams per second: with a hundred streams at 5 msg/s each, a batch of 100
records spans about a hundred streams, and a few milliseconds per query put the fan-out behind
the table for good (its iterator age grows without bound). Read on the posting threads, a batch
costs about one query's latency, whatever the number of streams.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from streamfleet import model
from streamfleet.lease.dynamo import to_item
from streamfleet.wsapi.fanout import DEFAULT_POST_THREADS, Fanout, FanoutConfig

REGION = "us-east-1"
CONFIG = FanoutConfig(
    "subs", "https://api.execute-api.us-east-1.amazonaws.com/v1", REGION, "leases"
)
STREAMS = 20
# Every posting thread reading at once (the default pool is 16 threads).
AT_ONCE = DEFAULT_POST_THREADS
HOLD_SECONDS = 2.0


def record(stream: str, seq: int) -> dict[str, Any]:
    image = to_item(
        {model.PK: model.connection_pk(stream), model.SEQ: seq, model.MESSAGE_DATA: "x"}
    )
    return {"eventName": "INSERT", "dynamodb": {"NewImage": image, "Keys": image}}


class SlowDynamo:
    """Every query holds its thread until :data:`AT_ONCE` queries have run together (or
    :data:`HOLD_SECONDS` passed, which only reads one after another ever wait out); records how
    many ran at once."""

    def __init__(self, fail_stream: str | None = None) -> None:
        self.changed = threading.Condition()
        self.running = 0
        self.most = 0
        self.fail_stream = fail_stream

    def query(self, **params: Any) -> dict[str, Any]:
        stream = params["ExpressionAttributeValues"][":pk"]["S"].removeprefix("STREAM#")
        with self.changed:
            self.running += 1
            self.most = max(self.most, self.running)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.most >= AT_ONCE, timeout=HOLD_SECONDS)
        try:
            if stream == self.fail_stream:
                raise ClientError({"Error": {"Code": "InternalServerError"}}, "Query")
            return {
                "Items": [
                    {
                        model.SUB_CONNECTION: {"S": f"{stream}-c{i}"},
                        model.SUB_USER_ID: {"S": "alice"},
                    }
                    for i in range(3)
                ]
            }
        finally:
            with self.changed:
                self.running -= 1

    def get_item(self, **params: Any) -> dict[str, Any]:
        return {"Item": {model.READERS: {"SS": ["user:alice"]}}}


class Management:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts: dict[str, list[int]] = {}

    def post_to_connection(self, *, ConnectionId: str, Data: bytes) -> None:
        seqs = [m["seq"] for m in json.loads(Data)["messages"]]
        with self.lock:
            self.posts.setdefault(ConnectionId, []).extend(seqs)


def test_the_subscribers_of_a_batchs_streams_are_read_at_once() -> None:
    dynamo, management = SlowDynamo(), Management()
    fanout = Fanout(CONFIG, dynamodb=dynamo, management=management, metrics_out=lambda _: None)
    records = [record(f"s{n:02d}", seq) for seq in (1, 2) for n in range(STREAMS)]
    fanout({"Records": records})
    # One after another, one query would run at a time (and each would wait out its hold).
    assert dynamo.most == AT_ONCE
    # Nothing else changed: every subscriber of every stream got its stream's seqs, in order.
    assert len(management.posts) == STREAMS * 3
    assert all(seqs == [1, 2] for seqs in management.posts.values())


def test_one_failed_read_still_fails_the_batch_and_posts_nothing() -> None:
    dynamo, management = SlowDynamo(fail_stream="s07"), Management()
    fanout = Fanout(CONFIG, dynamodb=dynamo, management=management, metrics_out=lambda _: None)
    with pytest.raises(ClientError):
        fanout({"Records": [record(f"s{n:02d}", 1) for n in range(STREAMS)]})
    assert management.posts == {}  # Lambda retries the whole batch
