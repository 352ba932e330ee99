"""Two teams composing the library's constructs, as a platform team would: two complete sets
(the fleet's tables, START/STOP API, workers and their STOPPED-event handler; the WebSocket
API's tables, API and fan-out) in one stack, and two stacks in two Regions of one account.
Nothing they create may share a physical name, and no metric or alarm of one may count the
other's: a shared table name fails the second deploy, a shared dimension scales one fleet on the
other's tasks and alarms on the other's errors.

A queue a team brings, encrypted with its own KMS key, works: its senders and receivers are
granted what SQS needs of the key.

Names a template leaves to CloudFormation (no ``TableName``, no ``Name``) are unique by
construction; what is checked is every name and dimension the synthesized templates do fix.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from aws_cdk import App, Environment, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Template
from constructs import Construct

from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.live_delivery import MessagesStream, StreamFanout, StreamFanoutProps
from streamfleet_cdk.tables import FleetTables, FleetTablesProps
from streamfleet_cdk.websocket_api import (
    JwtSettings,
    WebSocketApi,
    WebSocketApiProps,
    WebSocketTables,
    WebSocketTablesProps,
)
from streamfleet_cdk.worker_fleet import WorkerFleet, WorkerFleetProps

ACCOUNT = "123456789012"
UPSTREAMS = ("wss://*.feeds.example.com",)

# Properties that carry a physical name, by resource type.
NAMED = {
    "AWS::DynamoDB::GlobalTable": "TableName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::ApiGateway::RestApi": "Name",
    "AWS::ApiGatewayV2::Api": "Name",
    "AWS::SQS::Queue": "QueueName",
    "AWS::ECS::Service": "ServiceName",
    "AWS::ECS::Cluster": "ClusterName",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::IAM::Role": "RoleName",
}


@dataclass(frozen=True)
class FleetSet:
    tables: FleetTables
    ingestion: EventIngestion
    fleet: WorkerFleet
    fanout: StreamFanout
    ws_tables: WebSocketTables
    websocket: WebSocketApi


def add_fleet_set(
    scope: Construct, construct_id: str, *, log_removal_policy: RemovalPolicy | None = None
) -> FleetSet:
    """One team's set, every construct with its defaults; ``log_removal_policy``, if given, is
    every construct's that owns a log group."""
    team = Construct(scope, construct_id)
    logs = {} if log_removal_policy is None else {"log_removal_policy": log_removal_policy}
    tables = FleetTables(team, "Tables", props=FleetTablesProps())
    ingestion = EventIngestion(
        team,
        "Ingestion",
        props=EventIngestionProps(
            lease_table=tables.lease_table, allowed_upstreams=UPSTREAMS, **logs
        ),
    )
    fleet = WorkerFleet(
        team,
        "Workers",
        props=WorkerFleetProps(
            lease_table=tables.lease_table,
            messages_table=tables.messages_table,
            queue=ingestion.queue,
            allowed_upstreams=UPSTREAMS,
            **logs,
        ),
    )
    fleet.add_task_stopped_handler(**logs)
    ws_tables = WebSocketTables(team, "WsTables", props=WebSocketTablesProps())
    websocket = WebSocketApi(
        team,
        "WebSocket",
        props=WebSocketApiProps(
            state_table=ws_tables.state_table,
            connections_table=ws_tables.connections_table,
            jwt=JwtSettings(
                issuer="https://login.example.org/",
                audience="clients",
                jwks_url="https://login.example.org/.well-known/jwks.json",
            ),
            **logs,
        ),
    )
    fanout = StreamFanout(
        team,
        "Fanout",
        props=StreamFanoutProps(
            stream_arn=MessagesStream(
                team, "Stream", table=tables.messages_table, **logs
            ).stream_arn,
            subscriptions_table=ws_tables.subscriptions_table,
            streams_table=tables.lease_table,
            api=websocket.api,
            stage=websocket.stage,
            **logs,
        ),
    )
    return FleetSet(tables, ingestion, fleet, fanout, ws_tables, websocket)


def one_stack() -> list[Stack]:
    app = App()
    stack = Stack(app, "Platform", env=Environment(account=ACCOUNT, region="eu-west-1"))
    add_fleet_set(stack, "TeamA")
    add_fleet_set(stack, "TeamB")
    return [stack]


def two_regions() -> list[Stack]:
    app = App()
    stacks = []
    for name, region in (("FeedsEu", "eu-west-1"), ("FeedsUs", "us-east-1")):
        stack = Stack(app, name, env=Environment(account=ACCOUNT, region=region))
        add_fleet_set(stack, "Team")
        stacks.append(stack)
    return stacks


def physical_names(template: dict[str, Any]) -> list[tuple[str, str]]:
    """``(type, name)`` of every name the template fixes, tokens resolved to their text."""
    found = []
    for resource in template["Resources"].values():
        key = NAMED.get(resource["Type"])
        value = (resource.get("Properties") or {}).get(key) if key else None
        if value is not None:
            found.append((resource["Type"], repr(value)))
    return found


def dimensions(template: dict[str, Any]) -> list[str]:
    """Every alarm's and scaling policy's metric, with its dimensions: what it counts."""
    found = []
    for resource in template["Resources"].values():
        properties = resource.get("Properties") or {}
        if resource["Type"] == "AWS::CloudWatch::Alarm" and "MetricName" in properties:
            found.append(
                repr(
                    (
                        properties.get("Namespace"),
                        properties["MetricName"],
                        sorted(
                            (d["Name"], repr(d["Value"])) for d in properties.get("Dimensions", [])
                        ),
                    )
                )
            )
        custom = (properties.get("TargetTrackingScalingPolicyConfiguration") or {}).get(
            "CustomizedMetricSpecification"
        )
        if custom:
            found.append(
                repr(
                    (
                        custom["Namespace"],
                        custom["MetricName"],
                        sorted((d["Name"], repr(d["Value"])) for d in custom.get("Dimensions", [])),
                    )
                )
            )
    return found


@pytest.mark.parametrize("build", [one_stack, two_regions], ids=["one-stack", "two-regions"])
def test_two_sets_share_no_physical_name_and_no_metric(build):
    stacks = build()
    names: Counter[tuple[str, str, str]] = Counter()
    counted: Counter[tuple[str, str]] = Counter()
    for stack in stacks:
        template = Template.from_stack(stack).to_json()
        # A name must be unique in its Region (and IAM names in the account); the two-Region
        # app's sets may reuse a Region-scoped name only because their Regions differ.
        for kind, name in physical_names(template):
            scope = "account" if kind == "AWS::IAM::Role" else stack.region
            names[(scope, kind, name)] += 1
        for metric in dimensions(template):
            counted[(stack.region, metric)] += 1
    shared = {name: n for name, n in names.items() if n > 1}
    assert not shared, f"physical names declared twice: {shared}"
    doubled = {metric: n for metric, n in counted.items() if n > 1}
    assert not doubled, f"metrics two alarms or scaling policies count alike: {doubled}"
    # Each set scales on its connections and alarms on lost leases, 5XX and failed posts.
    assert len(counted) >= 2 * 4, sorted(counted)


def test_a_queue_brought_with_its_own_kms_key_is_usable_by_every_sender_and_receiver():
    """SQS refuses SendMessage without kms:GenerateDataKey and ReceiveMessage without
    kms:Decrypt on a queue's customer managed key: the workers (both) and the STOPPED-event
    handler (send) get them, on that key only."""
    stack = Stack(App(), "Brought", env=Environment(account=ACCOUNT, region="eu-west-1"))
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    key = kms.Key(stack, "TeamKey")
    queue = sqs.Queue(
        stack, "TeamQueue", encryption=sqs.QueueEncryption.KMS, encryption_master_key=key
    )
    fleet = WorkerFleet(
        stack,
        "Workers",
        props=WorkerFleetProps(
            lease_table=tables.lease_table,
            messages_table=tables.messages_table,
            queue=queue,
            allowed_upstreams=UPSTREAMS,
        ),
    )
    handler = fleet.add_task_stopped_handler()
    resources = Template.from_stack(stack).to_json()["Resources"]
    key_id = stack.get_logical_id(key.node.default_child)
    for role in (fleet.task_role, handler.role):
        role_id = stack.get_logical_id(role.node.default_child)
        on_key = {
            action
            for resource in resources.values()
            if resource["Type"] == "AWS::IAM::Policy"
            and {"Ref": role_id} in resource["Properties"]["Roles"]
            for statement in resource["Properties"]["PolicyDocument"]["Statement"]
            if statement["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
            for action in (
                statement["Action"]
                if isinstance(statement["Action"], list)
                else [statement["Action"]]
            )
        }
        assert on_key == {"kms:Decrypt", "kms:GenerateDataKey"}, role.node.path


def test_a_producer_in_another_stack_is_granted_without_a_reference_cycle():
    """With named principals the resource policy names the grantee, and the grantee's policy
    names the API: across two stacks that was a DependencyCycle at synth. A role with a literal
    name is named by the ARN that name gives; one without is refused in one line."""
    app = App()
    env = Environment(account=ACCOUNT, region="eu-west-1")
    platform = Stack(app, "Platform", env=env)
    tables = FleetTables(platform, "Tables", props=FleetTablesProps())
    ingestion = EventIngestion(
        platform,
        "Ingestion",
        props=EventIngestionProps(
            lease_table=tables.lease_table,
            allowed_upstreams=UPSTREAMS,
            invoke_principals=(f"arn:aws:iam::{ACCOUNT}:role/scheduler",),
        ),
    )
    producers = Stack(app, "Producers", env=env)
    named = iam.Role(
        producers,
        "Named",
        role_name="feed-producer",
        path="/feeds/",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
    )
    ingestion.grant_invoke(named)
    unnamed = iam.Role(
        producers, "Unnamed", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com")
    )
    with pytest.raises(ValueError, match=r"^grantee: Producers/Unnamed is in another stack"):
        ingestion.grant_invoke(unnamed)
    assembly = app.synth()  # a cycle between the stacks fails here
    policy = next(
        resource["Properties"]["Policy"]
        for resource in assembly.get_stack_by_name("Platform").template["Resources"].values()
        if resource["Type"] == "AWS::ApiGateway::RestApi"
    )
    allowed = next(s for s in policy["Statement"] if s.get("Sid") == "InvokeByNamedPrincipals")
    assert f":iam::{ACCOUNT}:role/feeds/feed-producer" in json.dumps(allowed)
    assert "Producers" not in json.dumps(assembly.get_stack_by_name("Platform").template)
