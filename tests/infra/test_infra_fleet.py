"""Infrastructure tests: event ingestion and the worker fleet, resource by resource.

Expectations about names come from where the code reads them (:mod:`streamfleet.model`, the
event router, the constructs' action tables), and the environment the constructs give the worker
and the router is fed to their own configuration parsers: a template the runtime would refuse to
start with fails here, not in a deployment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsonschema
import pytest
from aws_cdk import Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Annotations, Match, Template

from stacks import FleetStack, add_fleet_stacks
from streamfleet import event_router, model, request_body
from streamfleet.worker.config import WorkerConfig
from streamfleet.worker.upstream_policy import UpstreamPolicy
from streamfleet_cdk import assets
from streamfleet_cdk.api_gateway_account import LOGGING_ACTIONS
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.event_ingestion import (
    ROUTER_ACTIONS,
    ROUTER_HANDLER,
    EventIngestion,
    EventIngestionProps,
)
from streamfleet_cdk.tables import FleetTables, FleetTablesProps
from streamfleet_cdk.worker_fleet import (
    HEALTH_PORT,
    TASK_ACTIONS,
    WorkerFleet,
    WorkerFleetProps,
)
from tests.app_support import (
    TEST_ACCOUNT,
    BuiltApp,
    arn_text,
    as_list,
    build_app,
    cdk_json_context,
    default_app,
    deployed,
    flatten,
    logical_id,
    only,
    role_grants,
    stacks_of,
)

ALLOWED = ("wss://*.example.com",)
# Values CloudFormation resolves at deploy time, as the runtime would see them.
DEPLOYED_QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/streamfleet-intake"


@pytest.fixture(scope="module")
def built() -> BuiltApp:
    return default_app()


@pytest.fixture(scope="module")
def primary(built: BuiltApp) -> Template:
    return built.template(built.primary)


@pytest.fixture(scope="module")
def secondary(built: BuiltApp) -> Template:
    return built.template(built.secondary)


@pytest.fixture(scope="module")
def active_active() -> BuiltApp:
    """Both Regions active on a strongly consistent lease table, with non-default scaling."""
    return build_app(
        {
            context_key("secondary_active"): True,
            context_key("multi_region_strong_consistency"): True,
            context_key("witness_region"): "us-east-2",
            context_key("min_tasks"): 2,
            context_key("max_tasks"): 40,
            context_key("target_connections_per_task"): 500,
            context_key("scale_out_cooldown_seconds"): 60,
            context_key("scale_in_cooldown_seconds"): 1200,
            context_key("stop_timeout_seconds"): 45,
        }
    )


# --- Template helpers ---


def environment_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["Name"]: item["Value"] for item in container["Environment"]}


# --- Queue ---


def test_both_queues_use_sqs_managed_encryption(built):
    for _, template in stacks_of(built):
        queues = template.find_resources("AWS::SQS::Queue")
        assert len(queues) == 2
        for queue in queues.values():
            assert queue["Properties"]["SqsManagedSseEnabled"] is True


def test_the_queue_redrives_to_the_dead_letter_queue(built):
    for stack, template in stacks_of(built):
        ingestion = stack.ingestion
        _, queue = only(template, "AWS::SQS::Queue", {"RedrivePolicy": Match.any_value()})
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": {
                "Fn::GetAtt": [logical_id(stack, ingestion.dead_letter_queue), "Arn"]
            },
            "maxReceiveCount": 5,
        }
        assert queue["VisibilityTimeout"] == 30
        dlq = template.to_json()["Resources"][logical_id(stack, ingestion.dead_letter_queue)]
        assert dlq["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_every_queue_refuses_requests_without_tls(built):
    for stack, template in stacks_of(built):
        policies = template.find_resources("AWS::SQS::QueuePolicy")
        queues = {
            logical_id(stack, q) for q in (stack.ingestion.queue, stack.ingestion.dead_letter_queue)
        }
        covered = set()
        for policy in policies.values():
            properties = policy["Properties"]
            covered.update(ref["Ref"] for ref in properties["Queues"])
            (statement,) = properties["PolicyDocument"]["Statement"]
            assert statement["Effect"] == "Deny"
            assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            assert statement["Principal"] == {"AWS": "*"}
            assert statement["Action"] == "sqs:*"
        assert covered == queues


def test_an_alarm_fires_on_the_first_dead_lettered_message(built):
    for stack, template in stacks_of(built):
        [alarm] = [
            resource["Properties"]
            for resource in template.find_resources("AWS::CloudWatch::Alarm").values()
            if resource["Properties"].get("Namespace") == "AWS/SQS"
        ]
        assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert alarm["Dimensions"] == [
            {
                "Name": "QueueName",
                "Value": {
                    "Fn::GetAtt": [
                        logical_id(stack, stack.ingestion.dead_letter_queue),
                        "QueueName",
                    ]
                },
            }
        ]
        assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
        assert alarm["Threshold"] == 0
        assert alarm["EvaluationPeriods"] == 1
        assert alarm["TreatMissingData"] == "notBreaching"
        assert stack.ingestion.dlq_alarm.alarm_arn  # exposed for alarm actions


# --- Event router ---


def test_router_runs_the_router_module_on_the_app_target_with_json_logs(built):
    assert ROUTER_HANDLER == "streamfleet.event_router.handler"
    for stack, template in stacks_of(built):
        function_id = logical_id(stack, stack.ingestion.function)
        function = template.to_json()["Resources"][function_id]["Properties"]
        assert function["Runtime"] == assets.LAMBDA_TARGET.runtime.name == "python3.14"
        assert function["Architectures"] == ["arm64"]
        assert function["Handler"] == ROUTER_HANDLER
        assert function["Timeout"] == 15
        assert function["LoggingConfig"] == {
            "LogGroup": {"Ref": logical_id(stack, stack.ingestion.function_log_group)},
            "LogFormat": "JSON",
            "ApplicationLogLevel": "INFO",
            "SystemLogLevel": "WARN",
        }
        assert function["ReservedConcurrentExecutions"] == 100
        assert "TracingConfig" not in function or function["TracingConfig"]["Mode"] == "PassThrough"


def test_router_concurrency_and_log_level_follow_the_configuration():
    built = build_app(
        {
            context_key("router_reserved_concurrency"): "none",
            context_key("lambda_log_level"): "DEBUG",
        }
    )
    stack = built.primary
    function = built.template(stack).to_json()["Resources"][
        logical_id(stack, stack.ingestion.function)
    ]["Properties"]
    assert "ReservedConcurrentExecutions" not in function
    assert function["LoggingConfig"]["ApplicationLogLevel"] == "DEBUG"


def test_router_environment_is_what_the_router_accepts(built):
    for stack, template in stacks_of(built):
        function_id = logical_id(stack, stack.ingestion.function)
        variables = template.to_json()["Resources"][function_id]["Properties"]["Environment"][
            "Variables"
        ]
        assert set(variables) == {"TABLE_NAME", "QUEUE_URL", "ALLOWED_UPSTREAMS"}
        assert variables["TABLE_NAME"] == stack.resolve(stack.lease_table.table_name)
        assert variables["QUEUE_URL"] == stack.resolve(stack.ingestion.queue.queue_url)
        config = event_router.RouterConfig.from_env(
            {
                "TABLE_NAME": deployed(variables["TABLE_NAME"], model.DEFAULT_LEASE_TABLE_NAME),
                "QUEUE_URL": deployed(variables["QUEUE_URL"], DEPLOYED_QUEUE_URL),
                "ALLOWED_UPSTREAMS": variables["ALLOWED_UPSTREAMS"],
            }
        )
        assert config.upstreams == UpstreamPolicy.parse("x", ",".join(ALLOWED))


def test_router_role_has_exactly_its_three_grants(built):
    for stack, template in stacks_of(built):
        ingestion = stack.ingestion
        grants = role_grants(template, logical_id(stack, ingestion.function_role))
        assert grants == {
            arn_text(stack, stack.lease_table.table_arn): set(ROUTER_ACTIONS["lease_table"]),
            arn_text(stack, ingestion.queue.queue_arn): set(ROUTER_ACTIONS["queue"]),
            arn_text(stack, ingestion.function_log_group.log_group_arn): set(
                ROUTER_ACTIONS["log_group"]
            ),
        }
    assert set(ROUTER_ACTIONS["lease_table"]) == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
    assert set(ROUTER_ACTIONS["queue"]) == {"sqs:SendMessage"}


def test_router_bundle_holds_only_the_package_and_imports_without_third_party_code(built):
    stack = built.primary
    function_id = logical_id(stack, stack.ingestion.function)
    code = built.template(stack).to_json()["Resources"][function_id]["Properties"]["Code"]
    root = Path(built.assembly.directory) / f"asset.{code['S3Key'].removesuffix('.zip')}"
    assert (root / "streamfleet" / "event_router.py").is_file()
    assert sorted(path.name for path in root.iterdir()) == ["streamfleet"]
    assert not list(root.rglob("__pycache__")) and not list(root.rglob("*.pyc"))
    assert not (root / "streamfleet" / assets.IMAGE_DIR_NAME).exists()
    # The Lambda runtime has boto3 but not websockets: importing the handler must not need it.
    check = (
        "import sys; sys.modules['websockets'] = None; "
        "import streamfleet.event_router as r; assert callable(r.handler)"
    )
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# --- API ---


def test_both_routes_require_iam_and_reach_the_router(built):
    for stack, template in stacks_of(built):
        methods = template.find_resources("AWS::ApiGateway::Method")
        routes = {m["Properties"]["HttpMethod"]: m["Properties"] for m in methods.values()}
        assert set(routes) == {"POST", "GET"}
        function_id = logical_id(stack, stack.ingestion.function)
        for properties in routes.values():
            assert properties["AuthorizationType"] == "AWS_IAM"
            assert properties["Integration"]["Type"] == "AWS_PROXY"
            assert function_id in json.dumps(properties["Integration"]["Uri"])
            assert "RequestValidatorId" in properties
        assert routes["POST"]["RequestModels"] == {
            "application/json": {"Ref": logical_id(stack, _model_of(stack))}
        }
        assert routes["GET"]["RequestParameters"] == {
            f"method.request.path.{event_router.CONNECTION_ID}": True
        }
        _, validator = only(template, "AWS::ApiGateway::RequestValidator")
        assert validator["ValidateRequestBody"] is True
        assert validator["ValidateRequestParameters"] is True


def _model_of(stack: FleetStack) -> Any:
    return stack.ingestion.api.node.find_child("EventModel")


def test_api_paths_are_the_routers(built):
    template = built.template(built.primary)
    paths = {
        r["Properties"]["PathPart"]
        for r in template.find_resources("AWS::ApiGateway::Resource").values()
    }
    expected = {
        part
        for resource in (event_router.EVENTS_RESOURCE, event_router.CONNECTION_RESOURCE)
        for part in resource.strip("/").split("/")
    }
    assert paths == expected


def test_lambda_may_be_invoked_only_by_the_deployed_stage_methods(built):
    for stack, template in stacks_of(built):
        permissions = [
            p["Properties"] for p in template.find_resources("AWS::Lambda::Permission").values()
        ]
        by_rule = [p for p in permissions if p["Principal"] == "events.amazonaws.com"]
        # The task-events function, by its own rule only (no other function may be invoked
        # by EventBridge).
        assert [flatten(p["SourceArn"]) for p in by_rule] == [
            f"<{logical_id(stack, stack.task_stopped.rule)}.Arn>"
        ]
        assert [p["FunctionName"] for p in by_rule] == [
            {"Fn::GetAtt": [logical_id(stack, stack.task_stopped.function), "Arn"]}
        ]
        by_api = [p for p in permissions if p not in by_rule]
        assert len(by_api) == 2  # no test-invoke permissions
        assert {p["Principal"] for p in by_api} == {"apigateway.amazonaws.com"}
        stage_id = logical_id(stack, stack.ingestion.api.deployment_stage)
        arns = sorted(flatten(p["SourceArn"]) for p in by_api)
        assert [arn.rsplit(f"<{stage_id}>", 1)[-1] for arn in arns] == [
            "/GET/connections/*",
            "/POST/events",
        ]


def test_stage_is_regional_throttled_and_access_logged(built):
    for stack, template in stacks_of(built):
        _, api = only(template, "AWS::ApiGateway::RestApi")
        assert api["EndpointConfiguration"] == {"Types": ["REGIONAL"]}
        _, stage = only(template, "AWS::ApiGateway::Stage")
        assert stage["StageName"] == "v1"
        assert stage["MethodSettings"] == [
            {
                "DataTraceEnabled": False,  # execution logs without request or response bodies
                "HttpMethod": "*",
                "LoggingLevel": "ERROR",
                "ResourcePath": "/*",
                "ThrottlingBurstLimit": 100,
                "ThrottlingRateLimit": 50,
            }
        ]
        log_group_id = logical_id(stack, stack.ingestion.access_log_group)
        assert log_group_id in json.dumps(stage["AccessLogSetting"]["DestinationArn"])
        assert json.loads(stage["AccessLogSetting"]["Format"])["status"] == "$context.status"
        # X-Ray on the stage whatever `tracing` says (that adds the router's active tracing).
        assert stage["TracingEnabled"] is True


# --- The Region's API Gateway CloudWatch role ---


def test_each_fleet_stack_sets_its_regions_api_gateway_cloudwatch_role(built):
    for stack, template in stacks_of(built):
        account_id, account = only(template, "AWS::ApiGateway::Account")
        role = stack.api_gateway_account.role
        assert account["CloudWatchRoleArn"] == {"Fn::GetAtt": [logical_id(stack, role), "Arn"]}
        properties = template.to_json()["Resources"][logical_id(stack, role)]
        assert properties["Properties"]["AssumeRolePolicyDocument"]["Statement"] == [
            {
                "Action": "sts:AssumeRole",
                "Effect": "Allow",
                "Principal": {"Service": "apigateway.amazonaws.com"},
            }
        ]
        assert properties["DeletionPolicy"] == "Retain"  # the account setting outlives us
        grants = role_grants(template, logical_id(stack, role))
        region_logs = f"arn:aws:logs:{stack.region}:{TEST_ACCOUNT}:log-group:*"
        assert grants == {region_logs: set(LOGGING_ACTIONS)}
        # The stage logs from its first deployment: it is created after the setting.
        stage_id, _ = only(template, "AWS::ApiGateway::Stage")
        assert account_id in template.to_json()["Resources"][stage_id]["DependsOn"]


def test_an_account_baseline_can_keep_the_api_gateway_role():
    built = build_app({context_key("api_gateway_cloudwatch_role"): False})
    for stack, template in stacks_of(built):
        assert stack.api_gateway_account is None
        template.resource_count_is("AWS::ApiGateway::Account", 0)
        stage_id, _ = only(template, "AWS::ApiGateway::Stage")
        assert "DependsOn" not in template.to_json()["Resources"][stage_id]


# --- Who may call the API ---


def resource_policy(template: Template) -> list[dict[str, Any]]:
    _, api = only(template, "AWS::ApiGateway::RestApi")
    return api["Policy"]["Statement"]


def test_by_default_the_api_is_open_to_this_accounts_principals_only(built):
    for stack, template in stacks_of(built):
        assert resource_policy(template) == [
            {
                "Sid": "InvokeFromThisAccount",
                "Action": "execute-api:Invoke",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{TEST_ACCOUNT}:root"},
                "Resource": "execute-api:/*",
            }
        ]
        Annotations.from_stack(stack).has_warning(
            "*", Match.string_like_regexp("streamfleet:invoke_principals is not set")
        )


def test_named_invoke_principals_are_allowed_and_everyone_else_denied():
    producer = "arn:aws:iam::123456789012:role/producer-*"
    built = build_app(
        {context_key("invoke_principals"): [producer, "arn:aws:iam::210987654321:root"]}
    )
    stack = built.primary
    statements = {s["Sid"]: s for s in resource_policy(built.template(stack))}
    assert set(statements) == {
        "InvokeByNamedPrincipals",
        "InvokeByNamedAccounts",
        "DenyEveryoneElse",
    }
    named = [f"arn:aws:iam::{TEST_ACCOUNT}:root", producer]
    assert statements["InvokeByNamedPrincipals"]["Condition"] == {
        "ArnLike": {"aws:PrincipalArn": named}
    }
    assert statements["InvokeByNamedAccounts"]["Principal"] == {
        "AWS": "arn:aws:iam::210987654321:root"
    }
    deny = statements["DenyEveryoneElse"]
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == (
        "Deny",
        {"AWS": "*"},
        "execute-api:Invoke",
    )
    assert deny["Condition"] == {
        "ArnNotLike": {"aws:PrincipalArn": named},
        "StringNotEquals": {"aws:PrincipalAccount": ["210987654321"]},
    }
    assert not Annotations.from_stack(stack).find_warning(
        "*", Match.string_like_regexp("invoke_principals")
    )


def test_grant_invoke_gives_the_grantee_the_action_and_names_it_in_the_policy():
    stack = construct_stack()
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    ingestion = EventIngestion(
        stack,
        "Ingestion",
        props=EventIngestionProps(
            lease_table=tables.lease_table,
            allowed_upstreams=ALLOWED,
            invoke_principals=("arn:aws:iam::123456789012:role/scheduler",),
        ),
    )
    producer = iam.Role(stack, "Producer", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    ingestion.grant_invoke(producer)
    template = Template.from_stack(stack)
    producer_id = logical_id(stack, producer)
    api_id = logical_id(stack, ingestion.api)
    grants = role_grants(template, producer_id)
    assert grants == {arn_text(stack, ingestion.api.arn_for_execute_api()): {"execute-api:Invoke"}}
    assert arn_text(stack, ingestion.api.arn_for_execute_api()).endswith(f":<{api_id}>/*/*/*")
    statements = {s["Sid"]: s for s in resource_policy(template)}
    named = statements["InvokeByNamedPrincipals"]["Condition"]["ArnLike"]["aws:PrincipalArn"]
    assert {"Fn::GetAtt": [producer_id, "Arn"]} in named
    assert named == statements["DenyEveryoneElse"]["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
    with pytest.raises(ValueError, match=r"^grantee: "):
        ingestion.grant_invoke(iam.ServicePrincipal("events.amazonaws.com"))


def event_schema(template: Template) -> dict[str, Any]:
    _, model_properties = only(template, "AWS::ApiGateway::Model")
    return model_properties["Schema"]


def test_request_schema_pins_connection_id_and_event_type(primary):
    schema = event_schema(primary)
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    properties = schema["properties"]
    assert properties[event_router.CONNECTION_ID]["pattern"] == r"^[A-Za-z0-9._:\-]{1,512}$"
    assert properties[event_router.EVENT_TYPE]["enum"] == [event_router.START, event_router.STOP]
    assert set(properties) == set(event_router.FIELDS[event_router.START])


def _bodies() -> list[dict[str, Any]]:
    url = "wss://feed.example.com/stream"
    start, stop = event_router.START, event_router.STOP
    return [
        {"event_type": start, "connection_id": "meeting-1", "ws_url": url},
        {"event_type": stop, "connection_id": "a.b_c:d-1"},
        {"event_type": stop, "connection_id": "x" * 512},
        {"event_type": stop, "connection_id": "x" * 513},
        {"event_type": start, "connection_id": "meeting-1"},
        {"event_type": stop, "connection_id": "meeting-1", "ws_url": url},
        {"event_type": "start", "connection_id": "meeting-1", "ws_url": url},
        {"event_type": stop, "connection_id": "has space"},
        {"event_type": stop, "connection_id": ""},
        {"event_type": stop, "connection_id": "ok", "extra": 1},
        {"event_type": stop},
        {"connection_id": "meeting-1"},
        {"event_type": stop, "connection_id": 7},
        {"event_type": start, "connection_id": "m", "ws_url": 5},
        # A START may name its readers (the router checks each entry's syntax).
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": ["user:alice"]},
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": []},
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": "user:alice"},
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": [7]},
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": ["x" * 301]},
        {"event_type": start, "connection_id": "m", "ws_url": url, "readers": ["u"] * 101},
        {"event_type": stop, "connection_id": "m", "readers": ["user:alice"]},
    ]


@pytest.mark.parametrize("body", _bodies(), ids=lambda body: json.dumps(body)[:60])
def test_request_schema_agrees_with_the_router(primary, body):
    """API Gateway may refuse a body early only where the router would refuse it too."""
    validator = jsonschema.Draft4Validator(event_schema(primary))
    schema_accepts = validator.is_valid(body)
    try:
        event_router.parse_event(json.dumps(body), UpstreamPolicy.parse("x", ",".join(ALLOWED)))
        router_accepts = True
    except event_router.BadRequest:
        router_accepts = False
    assert schema_accepts == router_accepts


def test_the_largest_start_the_model_admits_fits_the_routers_body_bound(primary):
    """The request model admits it, so the router must too: every reader at its longest, each
    character one JSON escapes as a surrogate pair (the router's bound is in bytes)."""
    reader = "user:" + "\U0001f600" * (model.MAX_READER_CHARS - len("user:"))
    body = {
        "event_type": event_router.START,
        "connection_id": "x" * 512,
        "ws_url": "wss://feed.example.com/" + "p" * 1800,
        "readers": [reader[:-1] + chr(0x1F600 + n) for n in range(model.MAX_READERS)],
    }
    assert jsonschema.Draft4Validator(event_schema(primary)).is_valid(body)
    text = json.dumps(body)  # ASCII-escaped: the longest spelling of these characters
    assert len(text.encode()) > 300_000
    decoded = request_body.decode_body(text, False, event_router.DEFAULT_MAX_BODY_BYTES)
    parsed = event_router.parse_event(decoded, UpstreamPolicy.parse("x", ",".join(ALLOWED)))
    assert len(parsed.readers) == model.MAX_READERS


# --- Worker fleet: task ---


def worker_task_memory(template: Template) -> int:
    _, task = only(template, "AWS::ECS::TaskDefinition")
    return int(task["Memory"])


def worker_container(template: Template) -> dict[str, Any]:
    _, task = only(template, "AWS::ECS::TaskDefinition")
    (container,) = task["ContainerDefinitions"]
    return container


def test_task_definition_is_fargate_arm64(built):
    for _, template in stacks_of(built):
        _, task = only(template, "AWS::ECS::TaskDefinition")
        assert task["RuntimePlatform"] == {
            "CpuArchitecture": "ARM64",
            "OperatingSystemFamily": "LINUX",
        }
        assert task["RequiresCompatibilities"] == ["FARGATE"]
        assert task["NetworkMode"] == "awsvpc"
        assert (task["Cpu"], task["Memory"]) == ("512", "1024")


def test_container_stops_gracefully_and_checks_its_health(built):
    for stack, template in stacks_of(built):
        container = worker_container(template)
        assert container["StopTimeout"] == 30
        assert container["Essential"] is True
        command = container["HealthCheck"]["Command"]
        assert command[0] == "CMD-SHELL"
        assert f"http://127.0.0.1:{HEALTH_PORT}/health" in command[1]
        assert command[1].startswith("python -c ") and command[1].endswith("|| exit 1")
        assert container["HealthCheck"]["StartPeriod"] == 30
        logging = container["LogConfiguration"]
        assert logging["LogDriver"] == "awslogs"
        assert logging["Options"]["awslogs-group"] == {
            "Ref": logical_id(stack, stack.fleet.log_group)
        }
        assert logging["Options"]["mode"] == "non-blocking"


def test_container_image_is_the_staged_runtime_for_arm64(built):
    manifest = json.loads(
        (Path(built.assembly.directory) / "StreamFleet-Primary.assets.json").read_text()
    )
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["platform"] == "linux/arm64"
    context = Path(built.assembly.directory) / image["source"]["directory"]
    assert sorted(path.name for path in context.iterdir()) == [
        "Dockerfile",
        "requirements.txt",
        "streamfleet",
    ]
    assert (context / "streamfleet" / "worker" / "__main__.py").is_file()


def test_worker_environment_is_what_the_worker_accepts(built):
    for stack, template in stacks_of(built):
        environment = environment_of(worker_container(template))
        assert set(environment) == {
            "TABLE_NAME",
            "MESSAGES_TABLE_NAME",
            "QUEUE_URL",
            "ALLOWED_UPSTREAMS",
            "SERVICE_NAME",
            "HEALTH_PORT",
            "LEASE_SECONDS",
            "HEARTBEAT_EVERY",
            "RECONCILE_EVERY",
            "MAX_CONNECTIONS",
            model.ENV_MEMORY_LIMIT_MIB,
            "METRICS_EVERY",
            model.ENV_MESSAGE_RETENTION_DAYS,
        }
        # The messages table's TTL only works if the workers write expires_at: they do, from
        # this retention (streamfleet:message_retention_days, 7 days by default).
        assert environment[model.ENV_MESSAGE_RETENTION_DAYS] == "7"
        assert environment["TABLE_NAME"] == stack.resolve(stack.lease_table.table_name)
        assert environment["MESSAGES_TABLE_NAME"] == stack.resolve(stack.messages_table.table_name)
        assert environment["QUEUE_URL"] == stack.resolve(stack.ingestion.queue.queue_url)
        config = WorkerConfig.from_env(
            {
                **environment,
                "TABLE_NAME": deployed(environment["TABLE_NAME"], model.DEFAULT_LEASE_TABLE_NAME),
                "MESSAGES_TABLE_NAME": deployed(
                    environment["MESSAGES_TABLE_NAME"], model.DEFAULT_MESSAGES_TABLE_NAME
                ),
                "QUEUE_URL": deployed(environment["QUEUE_URL"], DEPLOYED_QUEUE_URL),
            }
        )
        assert config.health_port == HEALTH_PORT
        # The worker checks its buffering against the task's memory, read from the template.
        assert config.memory_limit_mib == worker_task_memory(template)
        assert config.metrics_every == 60
        assert config.max_connections == 1000
        assert (config.timing.lease_seconds, config.timing.heartbeat_seconds) == (20, 5)
        assert config.reconcile_every == 10
        assert config.service_name == model.DEFAULT_WORKER_SERVICE_NAME
        assert config.message_retention_seconds == 7 * 24 * 3600


# --- Worker fleet: service and scaling ---


def test_service_deploys_without_losing_capacity_and_rolls_back_on_failure(built):
    for stack, template in stacks_of(built):
        _, service = only(template, "AWS::ECS::Service")
        deployment = service["DeploymentConfiguration"]
        assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
        assert deployment["MinimumHealthyPercent"] == 100
        assert deployment["MaximumPercent"] == 200
        assert service["LaunchType"] == "FARGATE"
        network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
        assert network["AssignPublicIp"] == "DISABLED"
        private = {
            stack.resolve(subnet.subnet_id)["Ref"] for subnet in stack.fleet.vpc.private_subnets
        }
        assert {subnet["Ref"] for subnet in network["Subnets"]} == private


def test_primary_leaves_the_task_count_to_auto_scaling(primary):
    _, service = only(primary, "AWS::ECS::Service")
    assert "DesiredCount" not in service  # a deployment never resets the scaled count
    _, target = only(primary, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 10)


def test_secondary_is_a_standby_scaled_to_zero(secondary):
    _, service = only(secondary, "AWS::ECS::Service")
    assert service["DesiredCount"] == 0
    _, target = only(secondary, "AWS::ApplicationAutoScaling::ScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (0, 10)


def test_scaling_tracks_average_active_connections_per_task_from_the_model(built):
    for stack, template in stacks_of(built):
        _, policy = only(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
        assert policy["PolicyType"] == "TargetTrackingScaling"
        tracking = policy["TargetTrackingScalingPolicyConfiguration"]
        metric = tracking["CustomizedMetricSpecification"]
        assert metric["Namespace"] == model.METRIC_NAMESPACE
        assert metric["MetricName"] == model.METRIC_ACTIVE_CONNECTIONS
        assert metric["Statistic"] == "Average"
        service_name = environment_of(worker_container(template))["SERVICE_NAME"]
        # The dimension is the value the workers put in their EMF documents.
        assert metric["Dimensions"] == [
            {"Name": model.METRIC_DIMENSION_SERVICE, "Value": service_name}
        ]
        assert tracking["TargetValue"] == 700
        assert tracking["ScaleOutCooldown"] == 120
        assert tracking["ScaleInCooldown"] == 900
        assert stack.fleet.active_connections.period.to_seconds() == 60


def test_scaling_follows_the_configuration(active_active):
    for _, template in stacks_of(active_active):
        _, target = only(template, "AWS::ApplicationAutoScaling::ScalableTarget")
        assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 40)
        _, policy = only(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
        tracking = policy["TargetTrackingScalingPolicyConfiguration"]
        assert (tracking["TargetValue"], tracking["ScaleOutCooldown"]) == (500, 60)
        assert tracking["ScaleInCooldown"] == 1200
        assert worker_container(template)["StopTimeout"] == 45
        _, service = only(template, "AWS::ECS::Service")
        assert "DesiredCount" not in service


def test_active_secondary_warns_unless_the_lease_table_is_strongly_consistent(active_active):
    Annotations.from_stack(active_active.secondary).has_no_warning(
        "*", Match.string_like_regexp("secondary_active")
    )
    built = build_app({context_key("secondary_active"): True})
    Annotations.from_stack(built.secondary).has_warning(
        "*", Match.string_like_regexp("secondary_active is on with eventually consistent")
    )
    _, service = only(built.template(built.secondary), "AWS::ECS::Service")
    assert "DesiredCount" not in service


def test_strong_consistency_applies_to_the_lease_table_only(active_active):
    template = active_active.template(active_active.primary)
    tables = template.find_resources("AWS::DynamoDB::GlobalTable")
    by_name = {t["Properties"]["TableName"]: t["Properties"] for t in tables.values()}
    lease = by_name[model.DEFAULT_LEASE_TABLE_NAME]
    assert lease["MultiRegionConsistency"] == "STRONG"
    assert lease["GlobalTableWitnesses"] == [{"Region": "us-east-2"}]
    messages = by_name[model.DEFAULT_MESSAGES_TABLE_NAME]
    assert "MultiRegionConsistency" not in messages


# --- Worker fleet: IAM ---


def test_task_role_has_exactly_the_workers_grants(built):
    for stack, template in stacks_of(built):
        grants = role_grants(template, logical_id(stack, stack.fleet.task_role))
        lease_arn = arn_text(stack, stack.lease_table.table_arn)
        lease_actions = set(TASK_ACTIONS["lease_table"])
        expected = {lease_arn: lease_actions}
        for index in model.WORKER_INDEXES:
            expected[f"{lease_arn}/index/{index.name}"] = lease_actions
        # The by-task index is the task-events handler's; no worker queries it.
        assert model.TASK_INDEX in model.LEASE_TABLE.indexes
        assert model.TASK_INDEX not in model.WORKER_INDEXES
        expected[arn_text(stack, stack.messages_table.table_arn)] = set(
            TASK_ACTIONS["messages_table"]
        )
        expected[arn_text(stack, stack.ingestion.queue.queue_arn)] = set(TASK_ACTIONS["queue"])
        assert grants == expected
    assert lease_actions == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
    }
    assert set(TASK_ACTIONS["messages_table"]) == {"dynamodb:BatchWriteItem", "dynamodb:Query"}
    assert set(TASK_ACTIONS["queue"]) == {
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
        "sqs:ChangeMessageVisibility",
    }


def test_no_policy_allows_wildcard_actions_scans_or_metric_writes(built):
    forbidden = {"dynamodb:Scan", "cloudwatch:PutMetricData"}
    for _, template in stacks_of(built):
        for logical, policy in template.find_resources("AWS::IAM::Policy").items():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                for action in as_list(statement["Action"]):
                    assert "*" not in action, (logical, action)
                    assert action not in forbidden, (logical, action)


def test_execution_role_pulls_only_the_image_and_writes_only_the_worker_logs(built):
    for stack, template in stacks_of(built):
        role = stack.fleet.task_definition.execution_role
        grants = role_grants(template, logical_id(stack, role))
        log_group = arn_text(stack, stack.fleet.log_group.log_group_arn)
        assert grants.pop(log_group) == {"logs:CreateLogStream", "logs:PutLogEvents"}
        assert grants.pop("*") == {"ecr:GetAuthorizationToken"}
        ((repository, actions),) = grants.items()
        assert ":repository/cdk-" in repository
        assert actions == {
            "ecr:BatchCheckLayerAvailability",
            "ecr:GetDownloadUrlForLayer",
            "ecr:BatchGetImage",
        }


# --- Worker fleet: network and cluster ---


def test_created_vpc_spans_two_azs_with_a_nat_each_flow_logs_and_a_dynamodb_endpoint(built):
    for stack, template in stacks_of(built):
        subnets = template.find_resources("AWS::EC2::Subnet")
        zones = {json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets.values()}
        assert zones == {
            json.dumps({"Fn::Select": [index, {"Fn::GetAZs": ""}]}) for index in (0, 1)
        }
        # One NAT gateway per AZ: losing an AZ leaves the other AZ's workers their egress.
        nats = template.find_resources("AWS::EC2::NatGateway")
        assert len(nats) == 2
        public = {
            stack.resolve(subnet.subnet_id)["Ref"] for subnet in stack.fleet.vpc.public_subnets
        }
        assert {nat["Properties"]["SubnetId"]["Ref"] for nat in nats.values()} == public
        _, flow_log = only(template, "AWS::EC2::FlowLog")
        assert (flow_log["LogDestinationType"], flow_log["TrafficType"]) == (
            "cloud-watch-logs",
            "ALL",
        )
        _, endpoint = only(template, "AWS::EC2::VPCEndpoint")
        assert endpoint["VpcEndpointType"] == "Gateway"
        assert "dynamodb" in json.dumps(endpoint["ServiceName"])


def test_the_nat_gateway_count_follows_the_configuration():
    built = build_app({context_key("nat_gateways"): 1})
    for _, template in stacks_of(built):
        template.resource_count_is("AWS::EC2::NatGateway", 1)


def test_worker_message_retention_follows_the_configuration():
    built = build_app({context_key("message_retention_days"): 30})
    for _, template in stacks_of(built):
        environment = environment_of(worker_container(template))
        assert environment[model.ENV_MESSAGE_RETENTION_DAYS] == "30"


def test_cluster_has_container_insights(built):
    for _, template in stacks_of(built):
        _, cluster = only(template, "AWS::ECS::Cluster")
        assert cluster["ClusterSettings"] == [{"Name": "containerInsights", "Value": "enabled"}]


def test_worker_security_group_accepts_no_inbound_traffic(built):
    for stack, template in stacks_of(built):
        (group,) = stack.fleet.service.connections.security_groups
        properties = template.to_json()["Resources"][logical_id(stack, group)]["Properties"]
        assert "SecurityGroupIngress" not in properties
        template.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


# --- Constructs on their own ---


def construct_stack() -> cdk.Stack:
    return cdk.Stack(cdk.App(), "T", env=cdk.Environment(account=TEST_ACCOUNT, region="eu-west-1"))


def test_worker_fleet_in_a_given_vpc_with_its_own_settings():
    stack = construct_stack()
    vpc = ec2.Vpc(stack, "Vpc", availability_zones=["eu-west-1a", "eu-west-1b"], nat_gateways=1)
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    queue = sqs.Queue(stack, "Queue", enforce_ssl=True)
    fleet = WorkerFleet(
        stack,
        "Fleet",
        props=WorkerFleetProps(
            lease_table=tables.lease_table,
            messages_table=tables.messages_table,
            queue=queue,
            allowed_upstreams=("ws://127.0.0.1:8765",),
            vpc=vpc,
            service_name="feeds-eu",
            cpu=1024,
            memory_limit_mib=2048,
            desired_count=3,
            min_capacity=2,
            max_capacity=6,
            stop_timeout=cdk.Duration.seconds(60),
        ),
    )
    template = Template.from_stack(stack)
    assert fleet.vpc is vpc
    template.resource_count_is("AWS::EC2::VPC", 1)
    template.resource_count_is("AWS::EC2::FlowLog", 0)
    container = worker_container(template)
    assert environment_of(container)["SERVICE_NAME"] == "feeds-eu"
    assert environment_of(container)["ALLOWED_UPSTREAMS"] == "ws://127.0.0.1:8765"
    assert container["StopTimeout"] == 60
    _, policy = only(template, "AWS::ApplicationAutoScaling::ScalingPolicy")
    dimensions = policy["TargetTrackingScalingPolicyConfiguration"]["CustomizedMetricSpecification"]
    assert dimensions["Dimensions"] == [
        {"Name": model.METRIC_DIMENSION_SERVICE, "Value": "feeds-eu"}
    ]
    _, service = only(template, "AWS::ECS::Service")
    assert service["DesiredCount"] == 3
    _, task = only(template, "AWS::ECS::TaskDefinition")
    assert (task["Cpu"], task["Memory"]) == ("1024", "2048")


def test_event_ingestion_options_change_auth_tracing_and_waf():
    stack = construct_stack()
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    ingestion = EventIngestion(
        stack,
        "Ingestion",
        props=EventIngestionProps(
            lease_table=tables.lease_table,
            allowed_upstreams=ALLOWED,
            iam_auth=False,
            tracing=True,
            web_acl_arn="arn:aws:wafv2:eu-west-1:123456789012:regional/webacl/fleet/abc",
            reserved_concurrency=20,
            stage_name="prod",
        ),
    )
    template = Template.from_stack(stack)
    for method in template.find_resources("AWS::ApiGateway::Method").values():
        assert method["Properties"]["AuthorizationType"] == "NONE"
    _, stage = only(template, "AWS::ApiGateway::Stage")
    assert stage["TracingEnabled"] is True and stage["StageName"] == "prod"
    _, function = only(template, "AWS::Lambda::Function")
    assert function["TracingConfig"] == {"Mode": "Active"}
    assert function["ReservedConcurrentExecutions"] == 20
    _, association = only(template, "AWS::WAFv2::WebACLAssociation")
    assert association["WebACLArn"].endswith("/webacl/fleet/abc")
    grants = role_grants(template, logical_id(stack, ingestion.function_role))
    assert grants["*"] == {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}


# --- Props validation ---


def fleet_props(**overrides: Any) -> WorkerFleetProps:
    stack = construct_stack()
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    values: dict[str, Any] = {
        "lease_table": tables.lease_table,
        "messages_table": tables.messages_table,
        "queue": sqs.Queue(stack, "Queue"),
        "allowed_upstreams": ALLOWED,
        **overrides,
    }
    return WorkerFleetProps(**values)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"allowed_upstreams": ()}, "^allowed_upstreams: at least one"),
        ({"allowed_upstreams": "wss://a.example.com"}, "^allowed_upstreams: expected a tuple"),
        ({"allowed_upstreams": ("https://a.example.com",)}, "^allowed_upstreams: "),
        ({"allowed_upstreams": ("wss://a,wss://b",)}, "^allowed_upstreams: "),
        # An empty-domain wildcard allowed every host written with a trailing dot.
        ({"allowed_upstreams": ("wss://*.",)}, "^allowed_upstreams: .*wildcard|valid host"),
        ({"allowed_upstreams": ("wss://user@*.example.com",)}, "^allowed_upstreams: "),
        ({"stop_timeout": cdk.Duration.seconds(10)}, "^stop_timeout: .*shutdown budget"),
        ({"stop_timeout": cdk.Duration.seconds(121)}, "^stop_timeout: .*at most 120"),
        ({"cpu": 300}, "^cpu: "),
        ({"memory_limit_mib": 512}, "^memory_limit_mib: .*cpu 512"),
        ({"min_capacity": -1}, "^min_capacity: "),
        ({"min_capacity": 5, "max_capacity": 4}, "^max_capacity: "),
        ({"desired_count": 11}, "^desired_count: .*max_capacity"),
        ({"desired_count": 0}, "^desired_count: "),
        ({"max_connections": 699}, "^max_connections: "),
        # Each connection may buffer a few frames: 5,000 of them cannot fit in 1 GiB.
        ({"max_connections": 5000}, "^max_connections, memory_limit_mib: buffering could reach"),
        ({"heartbeat_seconds": 10.0}, "^heartbeat_seconds: "),
        ({"lease_seconds": 0}, "^lease_seconds: "),
        ({"reconcile_seconds": 0}, "^reconcile_seconds: "),
        ({"availability_zones": ("eu-west-1a",)}, "^availability_zones: "),
        ({"service_name": "bad name"}, "^service_name: "),
        ({"nat_gateways": 0}, "^nat_gateways: "),
        ({"nat_gateways": 3}, "^nat_gateways: .*more than the VPC's 2 AZs"),
        ({"message_retention_days": 0}, "^message_retention_days: "),
    ],
)
def test_worker_fleet_props_are_validated_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        fleet_props(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"allowed_upstreams": ()}, "^allowed_upstreams: "),
        ({"router_timeout": cdk.Duration.seconds(30)}, "^router_timeout: "),
        ({"throttling_rate_limit": 0}, "^throttling_rate_limit: "),
        ({"throttling_burst_limit": 0}, "^throttling_burst_limit: "),
        ({"reserved_concurrency": 0}, "^reserved_concurrency: "),
        ({"queue_retention": cdk.Duration.seconds(30)}, "^queue_retention: "),
        ({"max_receive_count": 0}, "^max_receive_count: "),
        ({"stage_name": "v 1"}, "^stage_name: "),
        ({"invoke_principals": "arn:aws:iam::123456789012:root"}, "^invoke_principals: "),
        ({"invoke_principals": ("arn:aws:iam::123456789012:policy/x",)}, "^invoke_principals: "),
        ({"log_level": "LOUD"}, "^log_level: "),
    ],
)
def test_event_ingestion_props_are_validated_naming_the_field(overrides, message):
    stack = construct_stack()
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    values = {"lease_table": tables.lease_table, "allowed_upstreams": ALLOWED, **overrides}
    with pytest.raises(ValueError, match=message):
        EventIngestionProps(**values)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strong_consistency": True, "replica_regions": ("us-west-2",)}, "^witness_region: "),
        ({"witness_region": "us-east-2", "replica_regions": ("us-west-2",)}, "^witness_region: "),
        (
            {
                "strong_consistency": True,
                "witness_region": "us-east-2",
                "replica_regions": ("us-west-2", "us-east-1"),
            },
            "^replica_regions: .*exactly one",
        ),
        (
            {
                "strong_consistency": True,
                "witness_region": "us-west-2",
                "replica_regions": ("us-west-2",),
            },
            "^witness_region: must differ",
        ),
    ],
)
def test_strong_consistency_props_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FleetTablesProps(**kwargs)


# --- Assets: the runtime's code, from this repository or from an installed wheel ---


def installed_package(root: Path) -> Path:
    """A ``streamfleet`` package laid out as the wheel installs it (build files in ``_image``)."""
    package = root / "site-packages" / "streamfleet"
    for relative, text in {
        "__init__.py": "",
        "worker/__init__.py": "",
        "worker/__main__.py": "print('worker')\n",
        "_image/Dockerfile": "FROM python:3.11-slim\nCOPY streamfleet/ ./streamfleet/\n",
        "_image/requirements.txt": "boto3\n",
        "__pycache__/model.cpython-311.pyc": "",
        "worker/stale.pyc": "",
    }.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_repository_layout_takes_the_build_files_next_to_the_package():
    package = assets.runtime_package_dir()
    assert package == Path(__file__).resolve().parents[2] / "runtime" / "streamfleet"
    assert assets.worker_image_files() == (
        package.parent / "worker" / "Dockerfile",
        package.parent / "requirements.txt",
    )


def test_installed_layout_takes_the_build_files_from_the_package(tmp_path):
    package = installed_package(tmp_path)
    assert assets.worker_image_files(package) == (
        package / "_image" / "Dockerfile",
        package / "_image" / "requirements.txt",
    )
    context = assets.stage_worker_image_context(tmp_path / "staging", package)
    staged = sorted(p.relative_to(context).as_posix() for p in context.rglob("*") if p.is_file())
    assert staged == [
        "Dockerfile",
        "requirements.txt",
        "streamfleet/__init__.py",
        "streamfleet/worker/__init__.py",
        "streamfleet/worker/__main__.py",
    ]
    assert (context / "Dockerfile").read_text().startswith("FROM python:3.11-slim")


def test_missing_build_files_are_reported(tmp_path):
    package = tmp_path / "streamfleet"
    package.mkdir()
    with pytest.raises(FileNotFoundError, match="worker image files"):
        assets.worker_image_files(package)


def test_staging_is_content_addressed(tmp_path):
    package = installed_package(tmp_path)
    first = assets.stage_worker_image_context(tmp_path / "staging", package)
    assert assets.stage_worker_image_context(tmp_path / "staging", package) == first
    (package / "worker" / "__main__.py").write_text("print('changed')\n")
    second = assets.stage_worker_image_context(tmp_path / "staging", package)
    assert second != first
    assert (second / "streamfleet" / "worker" / "__main__.py").read_text() == "print('changed')\n"
    assert not list((tmp_path / "staging").glob(".partial-*"))


def test_the_dockerfile_copies_only_what_the_staged_context_holds():
    context = assets.stage_worker_image_context()
    sources = [
        line.split()[1]
        for line in (context / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
    ]
    assert sources == ["requirements.txt", "streamfleet/"]
    for source in sources:
        assert (context / source).exists(), source
    assert not list(context.rglob("__pycache__")) and not list(context.rglob("*.pyc"))


def test_local_bundling_copies_the_package_without_docker(tmp_path):
    package = installed_package(tmp_path)
    output = tmp_path / "bundle"
    output.mkdir()
    assert assets.PackageCopy(package).try_bundle(str(output), image=None) is True
    bundled = sorted(p.relative_to(output).as_posix() for p in output.rglob("*") if p.is_file())
    assert bundled == [
        "streamfleet/__init__.py",
        "streamfleet/worker/__init__.py",
        "streamfleet/worker/__main__.py",
    ]


def test_every_function_and_the_api_have_their_alarms(built):
    for stack, template in stacks_of(built):
        alarms = {
            logical_id(stack, alarm): alarm
            for alarm in (*stack.ingestion.function_alarms, stack.ingestion.server_error_alarm)
        }
        resources = template.to_json()["Resources"]
        errors, throttles = (
            resources[logical_id(stack, a)]["Properties"] for a in stack.ingestion.function_alarms
        )
        function = {
            "Name": "FunctionName",
            "Value": {"Ref": logical_id(stack, stack.ingestion.function)},
        }
        assert (errors["MetricName"], errors["Dimensions"]) == ("Errors", [function])
        assert (throttles["MetricName"], throttles["Dimensions"]) == ("Throttles", [function])
        server = resources[logical_id(stack, stack.ingestion.server_error_alarm)]["Properties"]
        assert (server["Namespace"], server["MetricName"]) == ("AWS/ApiGateway", "5XXError")
        for alarm_id in alarms:
            alarm = resources[alarm_id]["Properties"]
            assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"]) == ("Sum", 300, 1)
            assert alarm["TreatMissingData"] == "notBreaching"


def test_an_active_fleet_alarms_when_fewer_tasks_than_its_minimum_run(built):
    stack = built.primary
    alarm = built.template(stack).to_json()["Resources"][
        logical_id(stack, stack.fleet.running_tasks_alarm)
    ]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"]) == (
        "ECS/ContainerInsights",
        "RunningTaskCount",
    )
    assert {d["Name"] for d in alarm["Dimensions"]} == {"ClusterName", "ServiceName"}
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
    assert (alarm["EvaluationPeriods"], alarm["TreatMissingData"]) == (5, "breaching")
    # The standby Region runs nothing on purpose: no such alarm there.
    assert built.secondary.fleet.running_tasks_alarm is None


def test_the_leases_lost_alarm_watches_exactly_the_metric_the_workers_emit(primary: Template):
    primary.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "Namespace": model.METRIC_NAMESPACE,
            "MetricName": model.METRIC_LEASES_LOST,
            "Statistic": "Sum",
            "Threshold": 1,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "TreatMissingData": "notBreaching",
        },
    )


def test_what_operators_alarm_on_is_a_metric_method_that_the_alarms_use(built: BuiltApp):
    """Each number an alarm watches is offered as a ``metric_*()`` method, as CDK's own
    constructs do, so a team can build its own alarms and dashboards on exactly it."""
    stack = built.primary

    def same(a, b) -> bool:
        fields = ("namespace", "metric_name", "statistic")
        return all(getattr(a, f) == getattr(b, f) for f in fields) and (
            stack.resolve(a.dimensions) == stack.resolve(b.dimensions)
            and a.period.to_seconds() == b.period.to_seconds()
        )

    fleet = stack.fleet
    assert same(fleet.metric_leases_lost(), fleet.leases_lost_alarm.metric)
    assert same(fleet.metric_running_tasks(), fleet.running_tasks_alarm.metric)
    assert same(fleet.metric_active_connections(), fleet.active_connections)
    assert fleet.metric_leases_lost(period=Duration.hours(1)).period.to_seconds() == 3600


def test_the_fleet_is_connectable_as_cdk_constructs_are(built: BuiltApp):
    """A team opens its own resource to the workers the CDK way: ``allow_from(fleet, port)``."""
    fleet = built.primary.fleet
    assert [g.node.path for g in fleet.connections.security_groups] == [
        g.node.path for g in fleet.security_groups
    ]
    assert len(fleet.security_groups) == 1
    app = cdk.App(context={**cdk_json_context(), context_key("account"): TEST_ACCOUNT})
    primary, _ = add_fleet_stacks(app, AppConfig.from_context(app.node))
    database = ec2.SecurityGroup(primary, "TeamDatabase", vpc=primary.fleet.vpc)
    database.connections.allow_from(primary.fleet, ec2.Port.tcp(5432), "the workers")
    rules = Template.from_stack(primary).find_resources("AWS::EC2::SecurityGroupIngress")
    sources = [
        rule["Properties"]["SourceSecurityGroupId"]
        for rule in rules.values()
        if rule["Properties"].get("FromPort") == 5432
    ]
    assert sources == [
        {"Fn::GetAtt": [logical_id(primary, fleet_sg), "GroupId"]}
        for fleet_sg in primary.fleet.security_groups
    ]
