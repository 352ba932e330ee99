"""The constructs follow CDK's own conventions where an operator or a platform team meets them:
each number an alarm watches is also a ``metric_*()`` method returning exactly that metric (so a
dashboard or a team's own alarm counts what the library's alarm counts), and each construct that
owns a resource others use offers ``grant_*(grantee) -> iam.Grant`` with exactly the actions its
name promises, on its own resources only."""

from __future__ import annotations

from typing import Any

from aws_cdk import App, Environment, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from stacks import add_websocket_stacks
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.tables import TABLE_READ_ACTIONS
from streamfleet_cdk.websocket_api import WebSocketTables, WebSocketTablesProps
from tests.app_support import cdk_json_context
from tests.infra.test_composition import ACCOUNT, add_fleet_set

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
