"""``make cost``: the monthly bill of a workload by component, priced from a dated price list,
its quantities from measured counts and from the synthesized templates."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from streamfleet_dev import assembly
from streamfleet_dev.assembly import REPO_ROOT
from streamfleet_dev.cost.bill import HERE, Workload, bill, load_measured, load_prices
from streamfleet_dev.cost.deployment import read_deployment, retention_seconds

COMPONENTS = {
    "DynamoDB",
    "API Gateway",
    "Lambda",
    "Fargate",
    "NAT",
    "Data transfer",
    "CloudWatch",
    "SQS",
    "Route 53",
}


def _cost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamfleet_dev.cost", *args],
        cwd=REPO_ROOT,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def deployed() -> tuple[object, int]:
    cloud = assembly.default_assembly()
    return read_deployment(cloud), retention_seconds(cloud)


def _bill(
    deployed, *, streams: int, message_bytes: int = 200, subscribers: int = 10, regions: int = 2
):
    deployment, retention = deployed
    workload = Workload(
        streams=streams,
        msg_per_s=1,
        message_bytes=message_bytes,
        subscribers=subscribers,
        regions=regions,
    )
    return bill(workload, deployment, load_prices(), load_measured(), retention_seconds=retention)


def test_the_bill_prices_every_component_of_the_synthesized_deployment(deployed) -> None:
    deployment, _ = deployed
    lines = _bill(deployed, streams=10_000)
    assert {line.component for line in lines} == COMPONENTS
    assert all(line.source for line in lines)
    # Every line costs something, but the volume tier's: what its messages save.
    assert [line.item for line in lines if line.usd < 0] == [
        "messages beyond the first billion (their lower price)"
    ]
    # What the templates say, not the code's defaults: two Regions' NAT gateways and alarms,
    # the task size, the fleet sized by the scaling target.
    assert deployment.nat_gateways_per_region >= 1 and deployment.alarms > 0
    items = {line.item: line for line in lines}
    assert "message replication" in items
    tasks = -(-10_000 // deployment.connections_per_task)
    vcpu = next(line for line in lines if line.item.startswith("worker tasks: vCPU"))
    assert vcpu.quantity == pytest.approx(tasks * deployment.task_vcpu * 720)
    # One Region: no replicated write, one Region's storage and gateways.
    single = _bill(deployed, streams=10_000, regions=1)
    assert not any("replication" in line.item for line in single)
    by_item = {line.item: line.quantity for line in single}
    assert by_item["message storage"] == pytest.approx(items["message storage"].quantity / 2)
    # A message over one KB of item costs two write units: the item is the sink's own.
    large = _bill(deployed, streams=1, message_bytes=1500, subscribers=1, regions=1)
    writes = next(line for line in large if line.item == "message writes")
    assert writes.quantity == 2 * 30 * 24 * 3600


def test_make_cost_prints_the_bill_with_its_prices_source_and_date() -> None:
    done = _cost("--streams", "500", "--msg-per-s", "1", "--subscribers", "10")
    assert done.returncode == 0, done.stderr
    prices = load_prices()
    assert prices["as_of"] in done.stdout and prices["price_list"] in done.stdout
    summary = done.stdout.split("By component:")[1]
    assert {c for c in COMPONENTS if f"  {c} " in summary} == COMPONENTS
    assert "total" in summary


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--streams", "-1", "--msg-per-s", "1", "--subscribers", "1"], "streams"),
        (["--streams", "x", "--msg-per-s", "1", "--subscribers", "1"], "--streams"),
        (["--streams", "1", "--msg-per-s", "1", "--subscribers", "1", "--regions", "3"], "regions"),
        (
            [
                "--streams",
                "1",
                "--msg-per-s",
                "1",
                "--subscribers",
                "1",
                "--message-bytes",
                "999999",
            ],
            "message_bytes",
        ),
        (["--streams", "1", "--msg-per-s", "1"], "--subscribers"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(args: list[str], field: str) -> None:
    done = _cost(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and field in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_every_measured_count_is_quoted_from_its_benchmark_page() -> None:
    """A benchmark run that changes a figure changes its page: the count here must follow."""
    for name, count in load_measured().items():
        page = (REPO_ROOT / count["source"]).read_text()
        for quote in count["quote"]:
            assert quote in page, (name, quote)
        quoted = " ".join(count["quote"]).replace(",", "")
        values = count["value"].values() if isinstance(count["value"], dict) else [count["value"]]
        for value in values:
            assert re.search(rf"(?<![\d.]){re.escape(f'{value:g}')}(\.0)?(?![\d])", quoted), (
                name,
                value,
            )


def test_every_price_is_used_and_dated() -> None:
    prices = json.loads((HERE / "prices.json").read_text())
    assert prices["as_of"] and prices["price_list"] and prices["checked"]
    text = (HERE / "bill.py").read_text()
    unused = [
        name
        for name in prices["usd"]
        if f'"{name}"' not in text and re.sub(r"_(arm64|x86_64)$", "_{", name) not in text
    ]
    assert unused == []


def test_make_passes_the_workload_on() -> None:
    done = subprocess.run(
        ["make", "-n", "cost", "STREAMS=7", "MSG_PER_S=2.5", "SUBSCRIBERS=3", "REGIONS=1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The one line that runs it (make may add lines of its own, as CI's MAKEFLAGS do).
    (command,) = [line for line in done.stdout.splitlines() if "streamfleet_dev.cost" in line]
    for expected in ('--streams "7"', '--msg-per-s "2.5"', '--subscribers "3"', '--regions "1"'):
        assert expected in command, command
    assert Counter(command.split())["-m"] == 1


def test_the_manuals_three_sizes_are_what_make_cost_prints(deployed) -> None:
    """docs/cost.md quotes three bills: a change of price, count or template shows there."""
    page = (REPO_ROOT / "docs" / "cost.md").read_text()
    for streams in (500, 10_000, 100_000):
        lines = _bill(deployed, streams=streams)
        total = sum(line.usd for line in lines)
        assert f"**${total:,.0f}**" in page, (streams, total)
