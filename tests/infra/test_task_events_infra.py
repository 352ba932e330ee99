"""Infrastructure of the STOPPED-task path: the rule, the handler, its role, its alarms, in both
Regions, and the switch that turns it off.

The handler's environment is fed to the handler's own configuration parser, the rule's pattern
is compared with what the handler accepts (:mod:`streamfleet.model`), and the role with exactly
the calls the handler makes (``TASK_EVENTS_ACTIONS``, which the IAM-against-behaviour test checks
against a recorded run).
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Template

from streamfleet import model
from streamfleet import task_events as runtime
from streamfleet_cdk import assets
from streamfleet_cdk.config import context_key
from streamfleet_cdk.task_events import (
    DEFAULT_RESERVED_CONCURRENCY,
    TASK_EVENTS_ACTIONS,
    TASK_EVENTS_HANDLER,
    TaskStoppedHandler,
    TaskStoppedHandlerProps,
)
from tests.app_support import (
    TEST_ACCOUNT,
    BuiltApp,
    arn_text,
    build_app,
    default_app,
    logical_id,
    role_grants,
    stacks_of,
)

DEPLOYED_QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/streamfleet-intake"


@pytest.fixture(scope="module")
def built() -> BuiltApp:
    return default_app()


def resource(template: Template, logical: str) -> dict[str, Any]:
    return template.to_json()["Resources"][logical]


def properties(template: Template, logical: str) -> dict[str, Any]:
    return resource(template, logical)["Properties"]


def functions_with_handler(template: Template, handler: str) -> dict[str, Any]:
    return {
        logical: res
        for logical, res in template.find_resources("AWS::Lambda::Function").items()
        if res["Properties"].get("Handler") == handler
    }


def test_both_regions_hold_one_rule_for_this_services_stopped_tasks(built):
    assert TASK_EVENTS_HANDLER == "streamfleet.task_events.handler"
    for stack, template in stacks_of(built):
        handler = stack.task_stopped
        assert handler is not None, stack.stack_name
        fleet = stack.fleet
        rule = properties(template, logical_id(stack, handler.rule))
        # Standby or not, the rule is on: a standby runs no task, so it never fires until the
        # fleet is promoted (which must not need a redeploy of this).
        assert rule["State"] == "ENABLED"
        assert rule["EventPattern"] == {
            "source": [model.ECS_EVENT_SOURCE],
            "detail-type": [model.ECS_TASK_STATE_CHANGE],
            "detail": {
                "lastStatus": [model.ECS_TASK_STOPPED],  # never DEACTIVATING or STOPPING
                "clusterArn": [stack.resolve(fleet.cluster.cluster_arn)],
                "group": [stack.resolve(model.ecs_service_group(fleet.service.service_name))],
            },
        }
        assert rule["EventPattern"]["detail"]["group"] == [
            {
                "Fn::Join": [
                    "",
                    ["service:", {"Fn::GetAtt": [logical_id(stack, fleet.service), "Name"]}],
                ]
            }
        ]
        (target,) = rule["Targets"]
        function_id = logical_id(stack, handler.function)
        assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
        assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 300, "MaximumRetryAttempts": 3}
        # Only this rule may invoke the handler.
        permissions = [
            p["Properties"]
            for p in template.find_resources("AWS::Lambda::Permission").values()
            if p["Properties"]["FunctionName"] == {"Fn::GetAtt": [function_id, "Arn"]}
        ]
        assert permissions == [
            {
                "Action": "lambda:InvokeFunction",
                "FunctionName": {"Fn::GetAtt": [function_id, "Arn"]},
                "Principal": "events.amazonaws.com",
                "SourceArn": {"Fn::GetAtt": [logical_id(stack, handler.rule), "Arn"]},
            }
        ]


def test_the_handler_runs_on_the_app_target_with_json_logs_and_reserved_concurrency(built):
    router = None
    for stack, template in stacks_of(built):
        handler = stack.task_stopped
        (function_id,) = functions_with_handler(template, TASK_EVENTS_HANDLER)
        assert function_id == logical_id(stack, handler.function)
        function = properties(template, function_id)
        router = properties(template, logical_id(stack, stack.ingestion.function))
        # One runtime and one architecture for every function of the app.
        assert function["Runtime"] == router["Runtime"] == assets.LAMBDA_TARGET.runtime.name
        assert function["Architectures"] == router["Architectures"] == ["arm64"]
        assert function["LoggingConfig"] == {
            "LogGroup": {"Ref": logical_id(stack, handler.log_group)},
            "LogFormat": "JSON",
            "ApplicationLogLevel": "INFO",
            "SystemLogLevel": "WARN",
        }
        assert function["ReservedConcurrentExecutions"] == DEFAULT_RESERVED_CONCURRENCY == 10
        assert function["Timeout"] == 30
        invoke = next(
            res["Properties"]
            for res in template.find_resources("AWS::Lambda::EventInvokeConfig").values()
            if res["Properties"]["FunctionName"] == {"Ref": function_id}
        )
        assert (invoke["MaximumRetryAttempts"], invoke["MaximumEventAgeInSeconds"]) == (2, 300)
        log_group = properties(template, logical_id(stack, handler.log_group))
        assert log_group["RetentionInDays"] == 30


def test_the_handler_environment_is_what_the_handler_accepts(built):
    for stack, template in stacks_of(built):
        function = properties(template, logical_id(stack, stack.task_stopped.function))
        variables = function["Environment"]["Variables"]
        assert set(variables) == {
            model.ENV_TABLE_NAME,
            model.ENV_QUEUE_URL,
            model.ENV_ECS_CLUSTER_ARN,
            model.ENV_ECS_SERVICE_NAME,
        }
        fleet = stack.fleet
        assert variables[model.ENV_TABLE_NAME] == stack.resolve(stack.lease_table.table_name)
        assert variables[model.ENV_QUEUE_URL] == stack.resolve(stack.ingestion.queue.queue_url)
        assert variables[model.ENV_ECS_CLUSTER_ARN] == stack.resolve(fleet.cluster.cluster_arn)
        assert variables[model.ENV_ECS_SERVICE_NAME] == stack.resolve(fleet.service.service_name)
        # What CloudFormation would put there, read by the handler's own parser (AWS_REGION is
        # set by Lambda itself).
        region = stack.region
        cluster = f"arn:aws:ecs:{region}:{TEST_ACCOUNT}:cluster/StreamFleet-Workers-Cluster"
        config = runtime.TaskEventsConfig.from_env(
            {
                model.ENV_TABLE_NAME: model.DEFAULT_LEASE_TABLE_NAME,
                model.ENV_QUEUE_URL: DEPLOYED_QUEUE_URL,
                model.ENV_ECS_CLUSTER_ARN: cluster,
                model.ENV_ECS_SERVICE_NAME: "StreamFleet-Primary-WorkersService06F7B0BF-abc",
                runtime.ENV_REGION: region,
            }
        )
        assert config.group == "service:StreamFleet-Primary-WorkersService06F7B0BF-abc"


def test_the_role_has_exactly_the_handlers_grants(built):
    for stack, template in stacks_of(built):
        handler = stack.task_stopped
        grants = role_grants(template, logical_id(stack, handler.role))
        table = arn_text(stack, stack.lease_table.table_arn)
        assert grants == {
            table: {"dynamodb:GetItem", "dynamodb:UpdateItem"},
            f"{table}/index/{model.TASK_INDEX.name}": {"dynamodb:Query"},
            f"{table}/index/{model.OWNER_INDEX.name}": {"dynamodb:Query"},
            arn_text(stack, stack.ingestion.queue.queue_arn): {"sqs:SendMessage"},
            arn_text(stack, handler.log_group.log_group_arn): {
                "logs:CreateLogStream",
                "logs:PutLogEvents",
            },
        }
        assert {a for actions in TASK_EVENTS_ACTIONS.values() for a in actions} == {
            action for actions in grants.values() for action in actions
        }
        role = properties(template, logical_id(stack, handler.role))
        assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
            "Service": "lambda.amazonaws.com"
        }


def test_its_alarms_notify_the_regions_alarm_topic(built):
    for stack, template in stacks_of(built):
        handler = stack.task_stopped
        topic = {"Ref": logical_id(stack, stack.alarm_topic)}
        function = {"Name": "FunctionName", "Value": {"Ref": logical_id(stack, handler.function)}}
        errors, throttles = (
            properties(template, logical_id(stack, alarm)) for alarm in handler.function_alarms
        )
        assert (errors["MetricName"], errors["Dimensions"]) == ("Errors", [function])
        assert (throttles["MetricName"], throttles["Dimensions"]) == ("Throttles", [function])
        failed = properties(template, logical_id(stack, handler.failed_invocations_alarm))
        assert (failed["Namespace"], failed["MetricName"]) == ("AWS/Events", "FailedInvocations")
        assert failed["Dimensions"] == [
            {"Name": "RuleName", "Value": {"Ref": logical_id(stack, handler.rule)}}
        ]
        for alarm in (errors, throttles, failed):
            assert alarm["AlarmActions"] == alarm["OKActions"] == [topic]
            assert (alarm["Threshold"], alarm["Period"], alarm["Statistic"]) == (1, 300, "Sum")
            assert alarm["TreatMissingData"] == "notBreaching"


def test_the_switch_turns_the_path_off_in_both_regions():
    built = build_app({context_key("task_stopped_handler"): "false"})
    for stack, template in stacks_of(built):
        assert stack.task_stopped is None
        assert functions_with_handler(template, TASK_EVENTS_HANDLER) == {}
        template.resource_count_is("AWS::Events::Rule", 0)
        # Nothing else changes: the fleet and its worker are the same.
        assert template.find_resources("AWS::ECS::Service")


def test_reserved_concurrency_and_log_level_follow_the_configuration():
    built = build_app(
        {
            context_key("task_stopped_reserved_concurrency"): "none",
            context_key("lambda_log_level"): "DEBUG",
        }
    )
    stack = built.secondary
    function = properties(built.template(stack), logical_id(stack, stack.task_stopped.function))
    assert "ReservedConcurrentExecutions" not in function
    assert function["LoggingConfig"]["ApplicationLogLevel"] == "DEBUG"
    built = build_app({context_key("task_stopped_reserved_concurrency"): 3})
    stack = built.primary
    function = properties(built.template(stack), logical_id(stack, stack.task_stopped.function))
    assert function["ReservedConcurrentExecutions"] == 3


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "task_stopped_handler",
            "maybe",
            "streamfleet:task_stopped_handler: expected true or false",
        ),
        (
            "task_stopped_reserved_concurrency",
            "0",
            "streamfleet:task_stopped_reserved_concurrency: expected at least 1",
        ),
        (
            "task_stopped_reserved_concurrency",
            "many",
            "streamfleet:task_stopped_reserved_concurrency: expected a whole number or 'none'",
        ),
    ],
)
def test_bad_settings_fail_synth_naming_the_context_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        build_app({context_key(key): value})


# --- The construct on its own ---


def bare_stack() -> cdk.Stack:
    return cdk.Stack(
        cdk.App(), "Bare", env=cdk.Environment(account=TEST_ACCOUNT, region="eu-west-1")
    )


def test_the_construct_composes_with_imported_resources():
    stack = bare_stack()
    cluster = ecs.Cluster.from_cluster_arn(
        stack, "Cluster", f"arn:aws:ecs:eu-west-1:{TEST_ACCOUNT}:cluster/fleet"
    )
    table = dynamodb.TableV2.from_table_name(stack, "Table", "leases")
    queue = sqs.Queue.from_queue_arn(stack, "Queue", f"arn:aws:sqs:eu-west-1:{TEST_ACCOUNT}:intake")
    handler = TaskStoppedHandler(
        stack,
        "TaskStopped",
        props=TaskStoppedHandlerProps(
            cluster=cluster,
            service_name="workers",
            lease_table=table,
            queue=queue,
            reserved_concurrency=None,
            retry_attempts=0,
        ),
    )
    template = Template.from_stack(stack)
    rule = properties(template, logical_id(stack, handler.rule))
    assert rule["EventPattern"]["detail"] == {
        "clusterArn": [f"arn:aws:ecs:eu-west-1:{TEST_ACCOUNT}:cluster/fleet"],
        "group": ["service:workers"],
        "lastStatus": ["STOPPED"],
    }
    assert rule["Targets"][0]["RetryPolicy"]["MaximumRetryAttempts"] == 0
    function = properties(template, logical_id(stack, handler.function))
    assert function["Environment"]["Variables"][model.ENV_ECS_SERVICE_NAME] == "workers"
    assert "ReservedConcurrentExecutions" not in function


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"reserved_concurrency": 0},
            "reserved_concurrency: expected a whole number of at least 1",
        ),
        ({"log_level": "LOUD"}, "log_level: expected one of"),
        ({"memory_mib": 64}, "memory_mib: expected 128-10240"),
        ({"retry_attempts": -1}, "retry_attempts: expected 0-185"),
        ({"timeout": cdk.Duration.seconds(1)}, "timeout: 1 s is outside 5-900 s"),
        (
            {"max_event_age": cdk.Duration.seconds(10)},
            "max_event_age: 10 s is outside 60 s to 24 h",
        ),
        ({"service_name": ""}, "service_name: required"),
    ],
)
def test_props_are_validated_naming_the_field(overrides, message):
    stack = bare_stack()
    base = {
        "cluster": ecs.Cluster.from_cluster_arn(
            stack, "Cluster", "arn:aws:ecs:eu-west-1:1:cluster/f"
        ),
        "service_name": "workers",
        "lease_table": dynamodb.TableV2.from_table_name(stack, "Table", "leases"),
        "queue": sqs.Queue.from_queue_arn(stack, "Queue", "arn:aws:sqs:eu-west-1:1:intake"),
    }
    with pytest.raises(ValueError, match=message):
        TaskStoppedHandlerProps(**{**base, **overrides})
