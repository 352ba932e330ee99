"""How long one subscriber can hold its shard: the fan-out's batch duration with one bad reader.

The fan-out (the deployed handler's class, with the real SDK client) posts one batch to a
Management API on loopback. Stream ``quiet`` has healthy subscribers only; stream ``loud`` has
healthy ones and, depending on the case, one that:

* ``none``: is healthy too (the baseline);
* ``slow``: answers every post, each after 400 ms (a connection that drains slowly);
* ``throttled``: is refused with 429 on every post;
* ``hung``: never answers (the SDK's read timeout ends each attempt).

A shard's next batch starts only when this one has returned, so the batch's duration is how long
the other streams of the shard wait. The stated bound on one subscriber's share is its budget
(``FANOUT_SUBSCRIBER_BUDGET_MS`` + ``FRAME_ALLOWANCE_MS`` per frame) plus two post timeouts
(the post in flight when the budget ends, and the close after it).

Usage: ``python -m bench.fanout_stall_bench [--runs 5]``; writes the manual's page
``docs/benchmarks/fanout-stall.md``, with the machine, the date and the load. Loopback answers in
about a millisecond; API Gateway's Management API in tens, so the healthy posts here are faster
than in AWS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from streamfleet import model
from streamfleet.lease.dynamo import to_item
from streamfleet.wsapi import fanout as fanout_runtime
from streamfleet.wsapi.fanout import Fanout, FanoutConfig
from streamfleet_dev import pages
from streamfleet_dev.emulator.scripted_management import ScriptedManagementApi

RESULTS = pages.PAGES / "fanout-stall.md"
OUTPUTS = (RESULTS,)
REGION = "us-east-1"
HEALTHY_PER_STREAM = 20
MESSAGES_PER_STREAM = 50
MESSAGE_BYTES = 2_000
SLOW_POST_SECONDS = 0.4
HUNG_SECONDS = 60.0
CASES = ("none", "slow", "throttled", "hung")


def _answer_for(case: str):
    """The Management API's answer to each request: the connection ``bad`` as the case says."""

    def answer(method: str, connection_id: str) -> tuple[int, float]:
        if method == "DELETE":
            return 204, 0.0
        if connection_id != "bad":
            return 200, 0.0
        return {
            "slow": (200, SLOW_POST_SECONDS),
            "hung": (200, HUNG_SECONDS),
            "throttled": (429, 0.0),
        }.get(case, (200, 0.0))

    return answer


class _Subscriptions:
    """The subscriptions and streams tables, in memory: their reads are not what is measured."""

    def __init__(self, by_stream: dict[str, list[str]]):
        self.by_stream = by_stream

    def query(self, **params: Any) -> dict[str, Any]:
        stream = params["ExpressionAttributeValues"][":pk"]["S"].removeprefix("STREAM#")
        return {
            "Items": [
                {model.SUB_CONNECTION: {"S": c}, model.SUB_USER_ID: {"S": "alice"}}
                for c in self.by_stream.get(stream, [])
            ]
        }

    def get_item(self, **params: Any) -> dict[str, Any]:
        return {"Item": {model.READERS: {"SS": ["user:alice"]}}}

    def delete_item(self, **params: Any) -> None:
        pass


def _batch() -> dict[str, Any]:
    records = []
    for stream in ("quiet", "loud"):
        for seq in range(1, MESSAGES_PER_STREAM + 1):
            image = to_item(
                {
                    model.PK: model.connection_pk(stream),
                    model.SEQ: seq,
                    model.MESSAGE_DATA: "x" * MESSAGE_BYTES,
                }
            )
            records.append({"eventName": "INSERT", "dynamodb": {"NewImage": image}})
    return {"Records": records}


def measure(case: str, runs: int) -> dict[str, Any]:
    subscribers = {
        "quiet": [f"q{i}" for i in range(HEALTHY_PER_STREAM)],
        "loud": [f"l{i}" for i in range(HEALTHY_PER_STREAM)] + (["bad"] if case != "none" else []),
    }
    durations: list[float] = []
    metrics: list[dict[str, Any]] = []
    with ScriptedManagementApi(_answer_for(case)) as api:
        endpoint = api.url
        for _ in range(runs):
            lines: list[str] = []
            fanout = Fanout(
                FanoutConfig("subs", endpoint, REGION, "leases"),
                dynamodb=_Subscriptions(subscribers),
                metrics_out=lines.append,
            )
            started = time.monotonic()
            fanout(_batch())
            durations.append(time.monotonic() - started)
            metrics.append(json.loads(lines[-1]))
    last = metrics[-1]
    return {
        "case": case,
        "runs": [round(d, 3) for d in durations],
        "median_s": round(statistics.median(durations), 3),
        "min_s": round(min(durations), 3),
        "max_s": round(max(durations), 3),
        "posts": last[model.METRIC_FANOUT_POSTS],
        "over_budget": last[model.METRIC_FANOUT_OVER_BUDGET],
        "failed_posts": last[model.METRIC_FANOUT_FAILED_POSTS],
        "disconnected": last[model.METRIC_FANOUT_DISCONNECTED],
        "delivered": last[model.METRIC_FANOUT_DELIVERED],
    }


def frames_per_subscriber() -> int:
    from streamfleet.wsapi.delivery import pack_frames
    from streamfleet.wsapi.fanout import messages_by_stream

    (messages,) = [m for s, m in messages_by_stream(_batch()["Records"]).items() if s == "loud"]
    return len(pack_frames("loud", messages, region=REGION, source="live"))


def markdown(figures: dict[str, Any]) -> str:
    config = FanoutConfig("subs", "http://x", REGION, "leases")
    frames = figures["frames"]
    bound = config.budget_s(frames) + 2 * fanout_runtime.POST_TIMEOUT_S
    rows = "\n".join(
        f"| {c['case']} | {c['median_s']} s | {c['min_s']} / {c['max_s']} s | {c['posts']} | "
        f"{c['over_budget']} | {c['failed_posts']} | {c['disconnected']} | {c['delivered']} |"
        for c in figures["cases"]
    )
    return f"""# Benchmark: how long one subscriber can hold its shard

{pages.banner("fanout_stall_bench", "a-slow-subscribers-cost-to-its-shard")}

`python -m bench.fanout_stall_bench --runs {figures["runs"]}`, run of {figures["date"]} at \
commit {figures["commit"]}. Machine: {figures["machine"]}; load average at the start \
{figures["load"]}, at the end {figures["load_at_end"]}.

One batch of {2 * MESSAGES_PER_STREAM} records ({MESSAGES_PER_STREAM} of {MESSAGE_BYTES:,} \
bytes on each of two streams, {frames} frames per subscriber) posted by the fan-out (the \
deployed class, the real SDK, {config.post_threads} posting threads) to a Management API on \
loopback: {HEALTHY_PER_STREAM} healthy subscribers per stream, and on one stream one more that \
is healthy (*none*), answers each post after {SLOW_POST_SECONDS * 1000:.0f} ms (*slow*), is \
refused with 429 (*throttled*), or never answers (*hung*). The shard's next batch waits for \
this one, so the batch's duration is what the other streams of the shard wait.

Stated bound for one subscriber: budget {config.subscriber_budget_ms} ms + \
{config.frame_allowance_ms} ms x {frames} frames + 2 x {fanout_runtime.POST_TIMEOUT_S:g} s \
(the post in flight, the close after it; each call's timeouts are botocore's, per socket \
operation) = **{bound:.2f} s**. Whatever the subscribers, the batch stops posting \
{fanout_runtime.INVOCATION_MARGIN_MS / 1000:g} s before the function's timeout (60 s in the \
template), and closes whom it did not serve for {fanout_runtime.POST_TIMEOUT_S:g} s more.

| Bad subscriber | Batch median | min / max | Posts | Over budget | Failed posts | Closed | \
Delivered |
|---|---|---|---|---|---|---|---|
{rows}

Runs: {json.dumps({c["case"]: c["runs"] for c in figures["cases"]})}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(name, value)
    figures = {
        "runs": args.runs,
        "date": pages.now(),
        "commit": pages.commit(),
        "machine": pages.machine(),
        "load": pages.load(),
        "frames": frames_per_subscriber(),
        "cases": [],
    }
    for case in CASES:
        figures["cases"].append(measure(case, args.runs))
        print(json.dumps(figures["cases"][-1]), flush=True)
    figures["load_at_end"] = pages.load()
    RESULTS.write_text(markdown(figures))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
