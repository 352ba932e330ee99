"""The deterministic simulations' speed: schedules a second of each, and microseconds a request
of their in-process DynamoDB against moto's.

Schedules: the gate's fixed lists (seeds 1 to 200 of the lease core and of live delivery), on
one process and on one a core, as the gate and ``make sim`` run them; the wall time of each
list, ``--runs`` times, median and range.

Requests, shaped as the runtime sends them, on a table shaped as the lease table (string key, a
sparse index projecting a few attributes, a stream of both images) holding 2,000 items: a
consistent get, a put conditioned on the item's absence (then deleted again), a conditional
update of three attributes returning the new item (the lease's renewal and claim), and a query
of five items after a sequence number (the messages table's replay read); each repeated for
``--seconds``, the mean; the model (:class:`DynamoDBModel`) and moto's handlers called in
process (:class:`MotoDynamoDB`, what the simulations ran on before).

Usage: ``python -m bench.sim_bench [--runs 3] [--seconds 1]``; writes the manual's page
``docs/benchmarks/sim.md``, with the machine, the date and the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from streamfleet_dev import pages
from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel
from streamfleet_dev.dsim.moto_reference import MotoDynamoDB
from streamfleet_dev.dsim.runner import SYSTEMS, run_many

RESULTS = pages.PAGES / "sim.md"
OUTPUTS = (RESULTS,)
GATE_SEEDS = range(1, 201)  # the gate's fixed lists (tests/integration/test_*_simulation.py)

LEASES = "bench-leases"
MESSAGES = "bench-messages"
ITEMS = 2000


def _tables() -> list[dict[str, Any]]:
    leases = {
        "TableName": LEASES,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "lease_owner", "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "by-owner",
                "KeySchema": [
                    {"AttributeName": "lease_owner", "KeyType": "HASH"},
                    {"AttributeName": "pk", "KeyType": "RANGE"},
                ],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": ["lease_version", "desired_state"],
                },
            }
        ],
        "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    }
    messages = {
        "TableName": MESSAGES,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "seq", "AttributeType": "N"},
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "seq", "KeyType": "RANGE"},
        ],
    }
    return [leases, messages]


def _lease(number: int) -> dict[str, Any]:
    return {
        "pk": {"S": f"CONN#{number:05d}"},
        "lease_owner": {"S": f"worker-{number % 20}"},
        "lease_session": {"S": f"session-{number % 20}"},
        "lease_version": {"N": str(number)},
        "desired_state": {"S": "STARTED"},
        "ws_url": {"S": f"wss://upstream.example/{number}"},
        "last_seq": {"N": str(number * 10)},
        "updated_at_ms": {"N": "1700000000000"},
    }


def _requests() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    names = {"#pk": "pk", "#o": "lease_owner", "#v": "lease_version", "#u": "updated_at_ms"}
    return {
        "get": [
            ("get_item", {"TableName": LEASES, "Key": {"pk": {"S": "CONN#00007"}},
                          "ConsistentRead": True}),
        ],
        "conditional put": [
            ("put_item", {"TableName": LEASES, "Item": _lease(ITEMS + 1),
                          "ConditionExpression": "attribute_not_exists(#pk)",
                          "ExpressionAttributeNames": {"#pk": "pk"}}),
            ("delete_item", {"TableName": LEASES, "Key": {"pk": {"S": f"CONN#{ITEMS + 1:05d}"}}}),
        ],
        "conditional update": [
            ("update_item", {
                "TableName": LEASES, "Key": {"pk": {"S": "CONN#00007"}},
                "UpdateExpression": "SET #u = :now, #o = :me ADD #v :one",
                "ConditionExpression": "attribute_exists(#pk) AND #o = :me",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": {":now": {"N": "1700000000001"},
                                              ":me": {"S": "worker-7"}, ":one": {"N": "1"}},
                "ReturnValues": "ALL_NEW", "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }),
        ],
        "query": [
            ("query", {"TableName": MESSAGES,
                       "KeyConditionExpression": "#pk = :pk AND #seq > :after",
                       "ExpressionAttributeNames": {"#pk": "pk", "#seq": "seq"},
                       "ExpressionAttributeValues": {":pk": {"S": "CONN#00001"},
                                                     ":after": {"N": "100"}},
                       "Limit": 5, "ConsistentRead": True}),
        ],
    }  # fmt: skip


def _loaded(kind: Callable[[], Any]) -> Any:
    store = kind()
    for table in _tables():
        store.call("create_table", table)
    for number in range(ITEMS):
        store.call("put_item", {"TableName": LEASES, "Item": _lease(number)})
        message = {"pk": {"S": f"CONN#{number % 4:05d}"}, "seq": {"N": str(number)},
                   "data": {"S": "x" * 200}}  # fmt: skip
        store.call("put_item", {"TableName": MESSAGES, "Item": message})
    return store


def microseconds(store: Any, requests: list[tuple[str, dict[str, Any]]], seconds: float) -> float:
    """Mean microseconds per request over about ``seconds`` of repeating ``requests``."""
    for operation, params in requests:  # warm: parse caches, first-call costs
        store.call(operation, params)
    count, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for operation, params in requests:
            store.call(operation, params)
        count += len(requests)
    return (time.perf_counter() - began) / count * 1e6


def schedules_seconds(system: str, jobs: int) -> float:
    """Wall seconds for the gate's list of ``system`` on ``jobs`` processes (all passing)."""
    began = time.perf_counter()
    outcomes = list(run_many(system, GATE_SEEDS, jobs=jobs, traces=False))
    seconds = time.perf_counter() - began
    failed = [outcome.schedule.seed for outcome in outcomes if not outcome.ok]
    if failed:
        raise SystemExit(f"{system}: seeds {failed} failed; a bench times passing schedules")
    return seconds


def run(runs: int, seconds: float) -> dict[str, Any]:
    conditions = {
        "date": pages.now(),
        "commit": pages.commit(),
        "machine": pages.machine(),
        "load_at_start": pages.load(),
    }
    cores = os.cpu_count() or 1
    lists: dict[str, dict[int, list[float]]] = {}
    for system in sorted(SYSTEMS):
        lists[system] = {}
        for jobs in sorted({1, cores}):
            lists[system][jobs] = [schedules_seconds(system, jobs) for _ in range(runs)]
            print(system, jobs, lists[system][jobs], flush=True)
    model, moto = _loaded(DynamoDBModel), _loaded(MotoDynamoDB)
    requests = {
        name: (microseconds(model, shaped, seconds), microseconds(moto, shaped, seconds))
        for name, shaped in _requests().items()
    }
    conditions["load_at_end"] = pages.load()
    return {"conditions": conditions, "lists": lists, "requests": requests, "runs": runs}


def report(figures: dict[str, Any]) -> str:
    run_of = figures["conditions"]
    rows = []
    for system, by_jobs in figures["lists"].items():
        for jobs, times in by_jobs.items():
            median = statistics.median(times)
            rows.append(
                f"| {system} | {jobs} | **{median:.1f}** ({min(times):.1f} to {max(times):.1f}) "
                f"| {len(GATE_SEEDS) / median:.1f} |"
            )
    request_rows = [
        f"| {name} | **{ours:.1f}** | {theirs:.1f} | {theirs / ours:.0f}x |"
        for name, (ours, theirs) in figures["requests"].items()
    ]
    newline = "\n"
    return f"""# Benchmark: the deterministic simulations

{pages.banner("sim_bench", "the-deterministic-simulations")}

`python -m bench.sim_bench --runs {figures["runs"]}`, run of {run_of["date"]} at commit \
{run_of["commit"]}. Machine: {run_of["machine"]}; load average at the start \
{run_of["load_at_start"]}, at the end {run_of["load_at_end"]}.

## The gate's fixed lists

Seeds {GATE_SEEDS.start} to {GATE_SEEDS.stop - 1} of each simulation, wall seconds for the list:
median of {figures["runs"]} runs (minimum to maximum).

| Simulation | Processes | Seconds for the list | Schedules a second |
|---|---|---|---|
{newline.join(rows)}

## The in-process DynamoDB

Microseconds a request (mean), the model and moto's handlers called in process.

| Request | Model (µs) | moto (µs) | Ratio |
|---|---|---|---|
{newline.join(request_rows)}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    text = report(run(args.runs, args.seconds))
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
