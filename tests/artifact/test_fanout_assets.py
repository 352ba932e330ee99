"""Live delivery's functions run from their synthesized asset directories (what ``cdk deploy``
ships): the fan-out behind the event source mapping stand-in, reading a real change stream
(moto's server), posting through the local gateway to a subscribed Python client; and the
stream lookup answering a CloudFormation custom-resource request.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import boto3
import pytest

from streamfleet.aws import AsyncClient
from streamfleet_client import ClientConfig, Endpoint, ReconnectingClient, StreamMessage
from streamfleet_dev.assembly import default_assembly
from streamfleet_dev.emulator.event_source import StreamEventSource
from streamfleet_dev.emulator.lambda_runner import LambdaProcess, LambdaSpec, reads_by
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, wsapi_gateway
from streamfleet_dev.tables import create_table_request
from streamfleet_dev.wsapi.live import FanoutArtifact, event_source_settings, fanout_process
from tests.assembly_support import CloudFormationResponses
from tests.wsapi_support import REGION, authorizer, user_token

pytestmark = pytest.mark.slow
WS_PRIMARY = "StreamFleet-WebSocket-Primary"


async def test_the_fanout_from_its_asset_delivers_the_stream_live(moto_tables, tmp_path) -> None:
    tables, endpoint = moto_tables
    tables.start_stream("m1", readers=("user:alice",))
    stack = default_assembly().stack(WS_PRIMARY)
    artifact = FanoutArtifact.of(stack)
    stream_arn = tables.dynamodb.describe_table(TableName=tables.messages)["Table"][
        "LatestStreamArn"
    ]
    received: list[StreamMessage] = []
    stop = asyncio.Event()
    streams = AsyncClient("dynamodbstreams", region_name=REGION, endpoint_url=endpoint)
    gateway = wsapi_gateway(
        GatewaySettings(region=REGION),
        authorizer=authorizer(),
        state_table=tables.state,
        connections_table=tables.connections,
        live=tables.live(),
    )
    async with gateway:
        process = await asyncio.to_thread(
            fanout_process,
            stack,
            subscriptions_table=tables.subscriptions,
            streams_table=tables.leases,
            management_endpoint=gateway.management_endpoint,
            endpoint_url=endpoint,
            log_path=tmp_path / "fanout.log",
        )
        source = StreamEventSource(
            streams=streams,
            stream_arn=stream_arn,
            function=process.invoke,
            region=REGION,
            settings=artifact.settings,
        )
        task = asyncio.create_task(source.run(stop))
        client = ReconnectingClient(
            lambda attempt: Endpoint(gateway.url, user_token("alice")),
            ClientConfig(heartbeat_interval=5, heartbeat_timeout=5),
            on_stream_message=received.append,
        )
        try:
            await source.ready()
            async with client:
                await client.wait_ready(5)
                await client.subscribe("m1", after=0)
                tables.store("m1", range(1, 201))
                deadline = time.monotonic() + 30
                while len(received) < 200:
                    assert time.monotonic() < deadline, (len(received), process.log_text()[-2000:])
                    await asyncio.sleep(0.05)
            reads = process.env_reads()
        finally:
            stop.set()
            await task
            streams.close()
            process.stop()
    assert [m.seq for m in received] == list(range(1, 201))
    assert {m.source for m in received} == {"live"}
    # Its metrics, as CloudWatch would read them from the function's stdout.
    documents = process.emf_documents()
    assert sum(d["FanoutDelivered"] for d in documents) == 200
    assert 0 < sum(d["FanoutPosts"] for d in documents) < 200 / 10
    # It read only variables its template sets.
    unset = [r.name for r in reads_by(reads, process.code_dir / "streamfleet") if not r.present]
    assert unset == []


def test_the_stream_lookup_from_its_asset_answers_cloudformation(moto, tmp_path) -> None:
    stack = default_assembly().stack(WS_PRIMARY)
    function = stack.function_with_handler("streamfleet.wsapi.stream_lookup.handler")
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    with_stream, without = f"lk-messages-{uuid.uuid4().hex[:8]}", f"lk-plain-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        **create_table_request(default_assembly().table("streamfleet-messages"), with_stream)
    )
    plain = create_table_request(default_assembly().table("streamfleet-messages"), without)
    plain.pop("StreamSpecification", None)
    dynamodb.create_table(**plain)
    responses = CloudFormationResponses()
    spec = LambdaSpec.for_function(function, {}, region=REGION)
    process = LambdaProcess(
        spec, extra_env={"AWS_ENDPOINT_URL": moto.endpoint}, log_path=tmp_path / "lookup.log"
    ).start()
    try:
        for request_type, table in (
            ("Create", with_stream),
            ("Update", without),
            ("Delete", without),
        ):
            process.invoke(
                {
                    "RequestType": request_type,
                    "ResponseURL": responses.url,
                    "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/s/1",
                    "RequestId": f"r-{request_type}",
                    "LogicalResourceId": "MessagesStream",
                    "ResourceType": "Custom::StreamFleetTableStream",
                    "ResourceProperties": {"TableName": table},
                }
            )
    finally:
        process.stop()
        responses.close()
        for name in (with_stream, without):
            dynamodb.delete_table(TableName=name)
    created, updated, deleted = responses.bodies
    arn = created["Data"]["StreamArn"]
    assert created["Status"] == "SUCCESS" and arn.startswith("arn:aws:dynamodb:us-east-1:")
    assert f"table/{with_stream}/stream/" in arn
    assert updated["Status"] == "FAILED" and "has no stream" in updated["Reason"]
    assert deleted["Status"] == "SUCCESS" and deleted["RequestId"] == "r-Delete"


def test_the_local_mapping_takes_every_setting_the_template_gives() -> None:
    """The local event source read only the batch size, retries, starting position and window:
    a bisect, a record age or a parallelization the template sets must reach it too."""
    settings = event_source_settings(default_assembly().stack(WS_PRIMARY))
    assert settings.report_batch_item_failures is True
    assert (settings.max_retries, settings.max_record_age) == (10, 3600.0)
    assert (settings.parallelization_factor, settings.bisect_on_error) == (1, False)
    assert settings.on_failure_destination is True  # the FailedRecords queue


def test_the_local_mapping_parses_each_setting_and_lambdas_defaults() -> None:
    class Template:
        name = "T"

        def __init__(self, properties: dict) -> None:
            self.properties = properties

        def of_type(self, kind: str) -> dict:
            return {"Mapping": {"Properties": self.properties}}

    given = event_source_settings(
        Template(
            {
                "BisectBatchOnFunctionError": True,
                "MaximumRecordAgeInSeconds": 120,
                "ParallelizationFactor": 4,
                "MaximumRetryAttempts": 2,
                "DestinationConfig": {"OnFailure": {"Destination": "arn:aws:sqs:::q"}},
            }
        )
    )
    assert (given.bisect_on_error, given.max_record_age) == (True, 120.0)
    assert (given.parallelization_factor, given.max_retries) == (4, 2)
    assert given.on_failure_destination is True
    absent = event_source_settings(Template({}))
    # Lambda's defaults: no retry limit, no age limit, one batch per shard, no bisect.
    assert (absent.max_retries, absent.max_record_age) == (-1, None)
    assert (absent.parallelization_factor, absent.bisect_on_error) == (1, False)
    assert absent.on_failure_destination is False  # records given up are only bypassed
