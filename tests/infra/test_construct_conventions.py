"""The constructs follow CDK's own conventions where an operator or a platform team meets them:
each number an alarm watches is also a ``metric_*()`` method returning exactly that metric (so a
dashboard or a team's own alarm counts what the library's alarm counts), and each construct that
owns a resource others use offers ``grant_*(grantee) -> iam.Grant`` with exactly the actions its
name promises, on its own resources only.

Stateful resources take a ``RemovalPolicy`` (the tables' ``removal_policy``, every log group's
``log_removal_policy``), existing resources can be brought instead of built (a queue, the
tables), and every field of every props class is documented where ``help()`` shows it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from typing import Any

import pytest
from aws_cdk import App, Environment, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Template

import streamfleet_cdk
from stacks import add_websocket_stacks
from streamfleet import model
from streamfleet_cdk.canary import WebSocketCanary, WebSocketCanaryProps
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.live_delivery import MessagesStream, StreamFanout, StreamFanoutProps
from streamfleet_cdk.tables import TABLE_READ_ACTIONS, FleetTablesProps
from streamfleet_cdk.task_events import TaskStoppedHandlerProps
from streamfleet_cdk.websocket_api import (
    JwtSettings,
    WebSocketApi,
    WebSocketApiProps,
    WebSocketTables,
    WebSocketTablesProps,
)
from streamfleet_cdk.worker_fleet import WorkerFleet, WorkerFleetProps
from tests.app_support import cdk_json_context
from tests.infra.test_composition import ACCOUNT, UPSTREAMS, add_fleet_set

ENV = Environment(account=ACCOUNT, region="eu-west-1")


def watched(stack: Stack, resources: dict[str, Any], alarm: cloudwatch.Alarm) -> tuple:
    properties = resources[stack.get_logical_id(alarm.node.default_child)]["Properties"]
    return (
        properties["Namespace"],
        properties["MetricName"],
        properties["Statistic"],
        properties["Period"],
        sorted((d["Name"], repr(d["Value"])) for d in properties.get("Dimensions", [])),
    )


def described(stack: Stack, metric: cloudwatch.Metric) -> tuple:
    return (
        metric.namespace,
        metric.metric_name,
        metric.statistic,
        metric.period.to_seconds(),
        sorted((name, repr(stack.resolve(value))) for name, value in metric.dimensions.items()),
    )


def test_each_alarm_watches_exactly_what_its_metric_method_returns():
    stack = Stack(App(), "Metrics", env=ENV)
    team = add_fleet_set(stack, "Team")
    resources = Template.from_stack(stack).to_json()["Resources"]
    pairs = [
        (team.ingestion.server_error_alarm, team.ingestion.metric_server_errors()),
        (team.ingestion.dlq_alarm, team.ingestion.metric_dead_lettered()),
        (team.fleet.leases_lost_alarm, team.fleet.metric_leases_lost()),
        (team.fanout.iterator_age_alarm, team.fanout.metric_iterator_age()),
        (team.fanout.failed_posts_alarm, team.fanout.metric_failed_posts()),
        (team.fanout.failed_records_alarm, team.fanout.metric_failed_records()),
    ]
    for alarm, metric in pairs:
        assert watched(stack, resources, alarm) == described(stack, metric), alarm.node.path


def granted(stack: Stack, role: iam.Role) -> dict[str, set[str]]:
    """Resource (as text) -> actions, over every policy attached to ``role``."""
    role_id = stack.get_logical_id(role.node.default_child)
    found: dict[str, set[str]] = {}
    for resource in Template.from_stack(stack).to_json()["Resources"].values():
        if (
            resource["Type"] != "AWS::IAM::Policy"
            or {"Ref": role_id} not in resource["Properties"]["Roles"]
        ):
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"]
            targets = statement["Resource"]
            for target in targets if isinstance(targets, list) else [targets]:
                found.setdefault(repr(target), set()).update(
                    actions if isinstance(actions, list) else [actions]
                )
    return found


def new_role(stack: Stack, name: str) -> iam.Role:
    return iam.Role(stack, name, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))


def test_the_tables_grant_reading_and_nothing_else():
    stack = Stack(App(), "Grants", env=ENV)
    team = add_fleet_set(stack, "Team")
    ws_tables = WebSocketTables(
        stack,
        "WsTables",
        props=WebSocketTablesProps(
            state_table_name="ws-state",
            connections_table_name="ws-connections",
            subscriptions_table_name="ws-subscriptions",
        ),
    )
    fleet_reader, ws_reader = new_role(stack, "FleetReader"), new_role(stack, "WsReader")
    for grant in (team.tables.grant_read(fleet_reader), ws_tables.grant_read(ws_reader)):
        assert isinstance(grant, iam.Grant) and grant.success
    lease = stack.resolve(team.tables.lease_table.table_arn)
    fleet_grants = granted(stack, fleet_reader)
    assert set(fleet_grants) == {
        repr(lease),
        repr(stack.resolve(f"{team.tables.lease_table.table_arn}/index/*")),
        repr(stack.resolve(team.tables.messages_table.table_arn)),
    }
    ws_grants = granted(stack, ws_reader)
    assert set(ws_grants) == {
        repr(stack.resolve(table.table_arn))
        for table in (
            ws_tables.state_table,
            ws_tables.connections_table,
            ws_tables.subscriptions_table,
        )
    }
    for actions in (*fleet_grants.values(), *ws_grants.values()):
        assert actions == set(TABLE_READ_ACTIONS)


def test_the_websocket_api_grants_posting_to_its_own_stages_clients_only():
    app = App(context={**cdk_json_context(), context_key("account"): ACCOUNT})
    stack, _ = add_websocket_stacks(app, AppConfig.from_context(app.node))
    role = new_role(stack, "Backend")
    grant = stack.websocket.grant_post_to_connections(role)
    assert isinstance(grant, iam.Grant) and grant.success
    assert granted(stack, role) == {
        repr(stack.resolve(stack.websocket.management_connections_arn)): {
            "execute-api:ManageConnections"
        }
    }


# --- Removal policies ---

# Where each log group of a set belongs, and what it does with its stack by default: the
# defaults are what the constructs did before the prop existed, so no template moved.
LOG_GROUP_OWNERS = {
    "Team/Ingestion": RemovalPolicy.RETAIN,  # the router's logs and the access logs
    "Team/Workers": RemovalPolicy.RETAIN,  # the workers' logs and the VPC's flow logs
    "Team/Workers/TaskStopped": RemovalPolicy.RETAIN,
    "Team/WebSocket": RemovalPolicy.RETAIN,  # the handler's, the authorizer's, access logs
    "Team/Stream": RemovalPolicy.DESTROY,
    "Team/Fanout": RemovalPolicy.DESTROY,
    "Canary": RemovalPolicy.RETAIN,
}
CFN_POLICY = {RemovalPolicy.RETAIN: "Retain", RemovalPolicy.DESTROY: "Delete"}


@pytest.mark.parametrize(
    "policy",
    [None, RemovalPolicy.RETAIN, RemovalPolicy.DESTROY],
    ids=["default", "RETAIN", "DESTROY"],
)
def test_log_removal_policy_decides_every_log_group_of_its_construct(policy):
    stack = Stack(App(), "Logs", env=ENV)
    team = add_fleet_set(stack, "Team", log_removal_policy=policy)
    logs_option = {} if policy is None else {"log_removal_policy": policy}
    WebSocketCanary(
        stack,
        "Canary",
        props=WebSocketCanaryProps(
            api=team.websocket.api,
            stage=team.websocket.stage,
            state_table=team.ws_tables.connections_table,
            jwt_audience="clients",
            **logs_option,
        ),
    )
    resources = Template.from_stack(stack).to_json()["Resources"]
    groups = [node for node in stack.node.find_all() if isinstance(node, logs.LogGroup)]
    assert {group.node.scope.node.path.removeprefix("Logs/") for group in groups} == set(
        LOG_GROUP_OWNERS
    )
    for group in groups:
        owner = group.node.scope.node.path.removeprefix("Logs/")
        expected = CFN_POLICY[policy or LOG_GROUP_OWNERS[owner]]
        resource = resources[stack.get_logical_id(group.node.default_child)]
        assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == (
            expected,
            expected,
        ), group.node.path


def test_the_websocket_state_table_takes_a_removal_policy():
    stack = Stack(App(), "Tables", env=ENV)
    tables = WebSocketTables(
        stack,
        "WsTables",
        props=WebSocketTablesProps(removal_policy=RemovalPolicy.DESTROY, deletion_protection=False),
    )
    resources = Template.from_stack(stack).to_json()["Resources"]
    state = resources[stack.get_logical_id(tables.state_table.node.default_child)]
    assert (state["DeletionPolicy"], state["UpdateReplacePolicy"]) == ("Delete", "Delete")


# Stand-ins for the resources a props class only stores: its checks never look at them.
STORED = object()


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda bad: FleetTablesProps(removal_policy=bad), "removal_policy"),
        (lambda bad: WebSocketTablesProps(removal_policy=bad), "removal_policy"),
        (
            lambda bad: EventIngestionProps(
                lease_table=STORED, allowed_upstreams=UPSTREAMS, log_removal_policy=bad
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: WorkerFleetProps(
                lease_table=STORED,
                messages_table=STORED,
                queue=STORED,
                allowed_upstreams=UPSTREAMS,
                log_removal_policy=bad,
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: TaskStoppedHandlerProps(
                cluster=STORED,
                service_name="workers",
                lease_table=STORED,
                queue=STORED,
                log_removal_policy=bad,
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: WebSocketApiProps(
                state_table=STORED, connections_table=STORED, jwt=STORED, log_removal_policy=bad
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: WebSocketCanaryProps(
                api=STORED,
                stage=STORED,
                state_table=STORED,
                jwt_audience="a",
                log_removal_policy=bad,
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: StreamFanoutProps(
                stream_arn="arn",
                subscriptions_table=STORED,
                streams_table=STORED,
                api=STORED,
                stage=STORED,
                log_removal_policy=bad,
            ),
            "log_removal_policy",
        ),
        (
            lambda bad: MessagesStream(
                Stack(App(), "S", env=ENV),
                "Stream",
                table=STORED,
                log_removal_policy=bad,
            ),
            "log_removal_policy",
        ),
    ],
)
def test_a_removal_policy_of_another_type_is_refused_naming_the_field(build, field):
    # CloudFormation's spelling, and the boolean FleetTablesProps once took.
    for bad in ("Retain", True):
        with pytest.raises(ValueError, match=rf"^{field}: expected an aws_cdk.RemovalPolicy"):
            build(bad)
    with pytest.raises(ValueError, match=rf"^{field}: SNAPSHOT"):
        build(RemovalPolicy.SNAPSHOT)


# --- Brought resources ---


def test_event_ingestion_sends_to_a_brought_queue_and_builds_none():
    stack = Stack(App(), "Brought", env=ENV)
    key = kms.Key(stack, "TeamKey")
    queue = sqs.Queue(
        stack, "TeamQueue", encryption=sqs.QueueEncryption.KMS, encryption_master_key=key
    )
    ingestion = EventIngestion(
        stack,
        "Ingestion",
        props=EventIngestionProps(
            lease_table=dynamodb.TableV2.from_table_name(stack, "Leases", "team-leases"),
            allowed_upstreams=UPSTREAMS,
            queue=queue,
        ),
    )
    assert ingestion.queue is queue
    assert ingestion.dead_letter_queue is None and ingestion.dlq_alarm is None
    with pytest.raises(ValueError, match=r"^queue: brought"):
        ingestion.metric_dead_lettered()
    template = Template.from_stack(stack)
    queues = template.find_resources("AWS::SQS::Queue")
    assert list(queues) == [stack.get_logical_id(queue.node.default_child)]
    grants = granted(stack, ingestion.function_role)
    assert "sqs:SendMessage" in grants[repr(stack.resolve(queue.queue_arn))]
    assert grants[repr(stack.resolve(key.key_arn))] == {"kms:Decrypt", "kms:GenerateDataKey"}
    function = template.to_json()["Resources"][
        stack.get_logical_id(ingestion.function.node.default_child)
    ]
    variables = function["Properties"]["Environment"]["Variables"]
    assert variables[model.ENV_QUEUE_URL] == stack.resolve(queue.queue_url)


def test_a_fleet_composes_from_tables_the_team_brings():
    """Every construct that uses the tables takes ``ITableV2``: existing tables, referenced by
    name, stand in for FleetTables and WebSocketTables, and nothing declares a table."""
    stack = Stack(App(), "Brought", env=ENV)

    def brought(name: str) -> dynamodb.ITableV2:
        return dynamodb.TableV2.from_table_name(stack, name, f"team-{name.lower()}")

    leases, messages = brought("Leases"), brought("Messages")
    ingestion = EventIngestion(
        stack,
        "Ingestion",
        props=EventIngestionProps(lease_table=leases, allowed_upstreams=UPSTREAMS),
    )
    fleet = WorkerFleet(
        stack,
        "Workers",
        props=WorkerFleetProps(
            lease_table=leases,
            messages_table=messages,
            queue=ingestion.queue,
            allowed_upstreams=UPSTREAMS,
        ),
    )
    handler = fleet.add_task_stopped_handler()
    websocket = WebSocketApi(
        stack,
        "WebSocket",
        props=WebSocketApiProps(
            state_table=brought("State"),
            connections_table=brought("Connections"),
            jwt=JwtSettings(
                issuer="https://login.example.org/",
                audience="clients",
                jwks_url="https://login.example.org/.well-known/jwks.json",
            ),
        ),
    )
    StreamFanout(
        stack,
        "Fanout",
        props=StreamFanoutProps(
            stream_arn=MessagesStream(stack, "Stream", table=messages).stream_arn,
            subscriptions_table=brought("Subscriptions"),
            streams_table=leases,
            api=websocket.api,
            stage=websocket.stage,
        ),
    )
    template = Template.from_stack(stack)
    for kind in ("AWS::DynamoDB::GlobalTable", "AWS::DynamoDB::Table"):
        assert not template.find_resources(kind)
    lease_arn = repr(stack.resolve(leases.table_arn))
    assert lease_arn.count("team-leases") == 1
    for role in (ingestion.function_role, fleet.task_role, handler.role):
        assert lease_arn in granted(stack, role), role.node.path
    assert repr(stack.resolve(messages.table_arn)) in granted(stack, fleet.task_role)


# --- Documentation ---


def props_classes() -> list[type]:
    """Every dataclass of the library: the props, and the settings objects props take."""
    found = []
    for info in pkgutil.iter_modules(streamfleet_cdk.__path__):
        module = importlib.import_module(f"{streamfleet_cdk.__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls):
                found.append(cls)
    return found


def attribute_entries(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of ``cls``'s docstring: each entry's names (``a`` or
    ``a / b``) -> its text, continuation lines included."""
    _, _, section = (inspect.getdoc(cls) or "").partition("Attributes:")
    entries: dict[str, str] = {}
    names = None
    for line in section.splitlines():
        entry = re.match(r"    (\w[\w /]*?): (.*)", line)
        if entry:
            names = entry[1]
            entries[names] = entry[2]
        elif names is not None:
            entries[names] += " " + line.strip()
    return entries


def test_every_props_field_is_documented_with_its_default():
    """Every field is in its class's ``Attributes:`` (what ``help()`` shows a team); a field
    of a ``*Props`` class with a default says it (or, for ``None``, what ``None`` means)."""
    classes = props_classes()
    assert {"FleetTablesProps", "EventIngestionProps", "WebSocketCanaryProps"} <= {
        cls.__name__ for cls in classes
    }
    undocumented, no_default = [], []
    for cls in classes:
        entries = attribute_entries(cls)
        section = " ".join(f"{names}: {text}" for names, text in entries.items())
        for field in dataclasses.fields(cls):
            name = f"{cls.__module__}.{cls.__name__}.{field.name}"
            if not re.search(rf"\b{field.name}\b", section):
                undocumented.append(name)
                continue
            has_default = not (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            if not cls.__name__.endswith("Props") or not has_default:
                continue
            [text] = [t for n, t in entries.items() if re.search(rf"\b{field.name}\b", n)]
            said = "default" in text or (field.default is None and "``None``" in text)
            if not said:
                no_default.append(name)
    assert not undocumented, undocumented
    assert not no_default, no_default
