"""The two-region failover drill, end to end, plus the replicator it relies on.

The drill's DynamoDB is dynalite (it applies the writes of one item one at a time, as DynamoDB
does; moto's threaded server does not, see test_wsapi_handlers.atomic_tables) and its
CloudWatch is moto. The replicator's stream path is tested on moto, which has Streams.
"""

from __future__ import annotations

import asyncio

import boto3
import pytest

from streamfleet import model
from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV
from streamfleet_dev.wsapi.drill import (
    DrillConfig,
    DrillFailure,
    markdown,
    run_drill,
)


@pytest.fixture
def drill_env(servers, monkeypatch: pytest.MonkeyPatch) -> str:
    """DynamoDB on dynalite, CloudWatch and Secrets Manager on moto; the moto endpoint is
    returned."""
    for name, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", servers["moto"].endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", servers["moto"].endpoint)
    return servers["moto"].endpoint


@pytest.mark.parametrize(
    ("failure", "clients", "canary_disconnects"),
    [
        (DrillFailure.THROTTLED, 8, True),
        (DrillFailure.DOWN, 4, True),
        (DrillFailure.THROTTLED, 4, False),
        (DrillFailure.STORE, 4, True),
    ],
    ids=["throttled-handler", "region-down", "throttled-clients-on-their-own", "state-store-down"],
)
async def test_failover_drill(
    drill_env: str, failure: DrillFailure, clients: int, canary_disconnects: bool
) -> None:
    # Timings a loaded machine keeps: at the drill's own 0.2 s canary period (0.15 s timeout) two
    # slow probes alone fail the primary over before the failure.
    config = DrillConfig(
        clients=clients,
        failure=failure,
        seed=11,
        disconnect_when_unhealthy=canary_disconnects,
        canary_period=1.0,
        canary_timeout=0.9,
        heartbeat_interval=1.0,
        heartbeat_timeout=2.0,
        bid_timeout=2.0,
        bidding_seconds=3.0,
    )
    summary = await run_drill(config)
    assert summary["checks"] == {name: True for name in summary["checks"]}, summary
    assert summary["passed"]
    # Detection follows the alarm rule: 2 of 2 failed datapoints (a probe already in flight
    # when the region fails can be the first), so about two canary periods; 10 is the bound.
    assert 0 < summary["time_to_detect_s"] <= 10 * config.canary_period
    # Every client reconnected (a check above); how fast is a figure of make drill's report.
    bids = summary["bids"]
    assert bids["lost"] == {config.primary: 0, config.secondary: 0}
    assert bids["accepted"] > 0 and bids["highest"][config.primary] >= bids["max_acknowledged"]
    if failure is DrillFailure.STORE:
        # The auctions' home was unreachable: the secondary refused bids as retryable, and
        # accepted none it could not judge.
        assert bids["accepted_on"][config.secondary] == 0
        assert bids["refused_by_error"]["home_unavailable"] > 0
    else:
        assert all(count > 0 for count in bids["accepted_on"].values())
    # The secondary's canary tripped (its alarm fired: missing data counts too) while the name
    # answered with it: the name stayed, and it closed nobody (the checks above).
    assert summary["secondary_trip"]["unhealthy_runs"] >= 1
    # Before the failure, the primary's canary lost its key for longer than the alarm needs:
    # every run paged as the canary's own fault, and nothing moved (a check above).
    assert summary["canary_key_fault"]["canary_faults"] > 1.5 * config.alarm_datapoints
    # Then the canaries' key was rotated the hurried way (secret first, the old key dropped at
    # once), and nothing moved (the checks above). How many probes failed meanwhile is a figure:
    # one in flight when an authorizer changes may run out of time on a loaded machine.
    assert summary["canary_key_rotation"]["canary_faults"] == 0
    # Fail-back waits for the healthy streak: fast to fail, slow to forgive.
    assert summary["time_to_failback_s"] >= (config.healthy_runs_to_recover - 1) * (
        config.canary_period
    )
    assert summary["replication"]["feed"] == "ScanFeed"  # dynalite has no Streams
    details = summary["clients_detail"]
    assert details["auth_failures"] == 0
    assert details["token_provider_calls"] == details["attempts"]
    assert details["pongs"] > 0  # heartbeats were answered with the text frame pong
    if failure is DrillFailure.THROTTLED and canary_disconnects:
        # The canary closed the open sockets of the throttled region once it tripped (the
        # alarm's 2 of 2), before their heartbeats went unanswered.
        assert details["closed_by_canary"] >= 1
        assert details["closed_by_canary"] + details["forced_reconnects"] >= clients
        assert summary["gateways"][config.secondary]["closed_by_canary"] == 0
    if failure is DrillFailure.THROTTLED and not canary_disconnects:
        # Without the canary's help, open sockets that stopped answering were abandoned by the
        # clients themselves (a heartbeat without a pong).
        assert details["closed_by_canary"] == 0
        assert details["forced_reconnects"] >= clients
    assert "| Time to detect (s) |" in markdown(summary)
    # The canaries' PutMetricData reached (moto's) CloudWatch, by ApiId.
    for region in (config.primary, config.secondary):
        metrics = boto3.client("cloudwatch", region_name=region).list_metrics(
            Namespace=model.HEALTH_METRIC_NAMESPACE, MetricName=model.HEALTH_METRIC_NAME
        )["Metrics"]
        dimensions = [d for m in metrics for d in m["Dimensions"]]
        assert {"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": f"api-{region}"} in (
            dimensions
        )


def test_the_drill_refuses_to_run_against_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", "https://dynamodb.us-east-1.amazonaws.com")
    with pytest.raises(RuntimeError, match="loopback"):
        asyncio.run(run_drill(DrillConfig(clients=1)))
