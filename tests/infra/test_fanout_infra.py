"""Infrastructure tests of live delivery: the subscriptions table, the stream lookup, the fan-out
with its event source mapping, least-privilege IAM, alarms, cdk-nag, configuration.

The WebSocket stacks are built as ``app.py`` builds them (tests/wsapi_app_support.py);
names come from where the runtime reads them.
"""

from __future__ import annotations

import pytest
from aws_cdk import App, Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from streamfleet import model
from streamfleet.wsapi import authorizer as authorizer_runtime
from streamfleet.wsapi import fanout as fanout_runtime
from streamfleet.wsapi.handlers import config as handlers_config
from streamfleet_cdk import live_delivery
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.live_delivery import (
    HANDLER_LIVE_ACTIONS,
    LOOKUP_RESOURCE_TYPE,
    LiveDeliveryTables,
    StreamFanoutProps,
)
from streamfleet_cdk.nag import AWS_SOLUTIONS
from tests.app_support import TEST_ACCOUNT, arn_text, logical_id, role_grants
from tests.wsapi_app_support import (
    BuiltWebSocketApp,
    build_websocket_app,
    default_websocket_app,
    function_of,
    resources,
    stacks_of,
    variables_of,
)


@pytest.fixture(scope="module")
def built() -> BuiltWebSocketApp:
    return default_websocket_app()


def table_arn(region: str, name: str) -> str:
    return f"arn:aws:dynamodb:{region}:{TEST_ACCOUNT}:table/{name}"


def test_each_region_has_its_own_subscriptions_table_from_the_model(built):
    for stack, template in stacks_of(built):
        tables = template.to_json()["Resources"]
        props = tables[logical_id(stack, stack.subscriptions_table)]["Properties"]
        spec = model.WSAPI_SUBSCRIPTIONS_TABLE
        assert props["TableName"] == spec.default_name
        assert props["KeySchema"] == [
            {"AttributeName": spec.partition_key, "KeyType": "HASH"},
            {"AttributeName": spec.sort_key, "KeyType": "RANGE"},
        ]
        assert props["TimeToLiveSpecification"] == {
            "AttributeName": spec.ttl_attribute,
            "Enabled": True,
        }
        assert [r["Region"] for r in props["Replicas"]] == [stack.region]  # never replicated
        assert not props.get("GlobalSecondaryIndexes")  # the fan-out's read is consistent


def test_the_handler_serves_subscribe_with_exactly_the_live_grants(built):
    for stack, template in stacks_of(built):
        handler = function_of(template, stack, stack.websocket.handler)
        variables = variables_of(handler)
        assert variables[model.ENV_STREAMS_TABLE_NAME] == model.DEFAULT_LEASE_TABLE_NAME
        assert variables[model.ENV_MESSAGES_TABLE_NAME] == model.DEFAULT_MESSAGES_TABLE_NAME
        config = handlers_config.HandlerConfig.from_env(
            {
                **{k: str(v) for k, v in variables.items() if isinstance(v, str)},
                # References to tables declared in this stack, as CloudFormation resolves them.
                model.ENV_STATE_TABLE_NAME: model.DEFAULT_WSAPI_STATE_TABLE_NAME,
                model.ENV_CONNECTIONS_TABLE_NAME: model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME,
                model.ENV_SUBSCRIPTIONS_TABLE_NAME: model.DEFAULT_WSAPI_SUBSCRIPTIONS_TABLE_NAME,
                "AWS_REGION": stack.region,
            }
        )
        assert config.live is not None and config.live.replay_max == 2000
        grants = role_grants(template, logical_id(stack, stack.websocket.handler_role))
        region = stack.region
        assert grants[table_arn(region, model.DEFAULT_LEASE_TABLE_NAME)] == set(
            HANDLER_LIVE_ACTIONS["streams_table"]
        )
        assert grants[table_arn(region, model.DEFAULT_MESSAGES_TABLE_NAME)] == set(
            HANDLER_LIVE_ACTIONS["messages_table"]
        )
        assert grants[arn_text(stack, stack.subscriptions_table.table_arn)] == set(
            HANDLER_LIVE_ACTIONS["subscriptions_table"]
        )
    assert set(HANDLER_LIVE_ACTIONS["streams_table"]) == {"dynamodb:GetItem"}
    assert set(HANDLER_LIVE_ACTIONS["messages_table"]) == {"dynamodb:Query"}


def test_the_stream_lookup_reads_only_this_regions_replica(built):
    """The custom resource names this Region's replica and is served by the lookup. Its role
    (DescribeTable on that table, nothing else) and the fan-out's are checked against the calls
    each makes from its asset (and, for the fan-out, what Lambda's event source mapping does
    with its role): tests/artifact/test_iam_against_code.py."""
    for stack, template in stacks_of(built):
        (custom,) = resources(template, LOOKUP_RESOURCE_TYPE).values()
        assert custom["TableName"] == model.DEFAULT_MESSAGES_TABLE_NAME
        lookup = stack.messages_stream
        function = function_of(template, stack, lookup.function)
        assert function["Handler"] == "streamfleet.wsapi.stream_lookup.handler"
        assert custom["ServiceToken"] == {"Fn::GetAtt": [logical_id(stack, lookup.function), "Arn"]}


def test_the_fanout_reads_the_regions_stream_in_order_and_records_what_it_gives_up(built):
    for stack, template in stacks_of(built):
        fanout = stack.fanout
        (mapping,) = resources(template, "AWS::Lambda::EventSourceMapping").values()
        assert mapping["EventSourceArn"] == {
            "Fn::GetAtt": [logical_id(stack, stack.messages_stream.resource), "StreamArn"]
        }
        assert mapping["FunctionName"] == {"Ref": logical_id(stack, fanout.function)}
        assert mapping["StartingPosition"] == "LATEST"
        assert (mapping["BatchSize"], mapping["ParallelizationFactor"]) == (100, 1)
        assert mapping["MaximumRetryAttempts"] == 10
        assert mapping["MaximumRecordAgeInSeconds"] == 3600
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["DestinationConfig"]["OnFailure"]["Destination"] == {
            "Fn::GetAtt": [logical_id(stack, fanout.failed_records), "Arn"]
        }
        assert "MaximumBatchingWindowInSeconds" not in mapping or (
            mapping["MaximumBatchingWindowInSeconds"] == 0
        )
        function = function_of(template, stack, fanout.function)
        assert function["Handler"] == "streamfleet.wsapi.fanout.handler"
        assert (function["Runtime"], function["Architectures"]) == ("python3.14", ["arm64"])
        assert function["ReservedConcurrentExecutions"] == 10
        variables = variables_of(function)
        assert set(variables) == set(model.FANOUT_ENV)
        endpoint = stack.resolve(fanout.management_endpoint)
        assert variables[model.ENV_APIGW_MANAGEMENT_ENDPOINT] == endpoint
        flat = str(endpoint)
        assert "execute-api" in flat and stack.region in flat  # the regional endpoint
        config = fanout_runtime.FanoutConfig.from_env(
            {
                model.ENV_SUBSCRIPTIONS_TABLE_NAME: "t",
                model.ENV_STREAMS_TABLE_NAME: variables[model.ENV_STREAMS_TABLE_NAME],
                model.ENV_APIGW_MANAGEMENT_ENDPOINT: "https://a.execute-api.r.amazonaws.com/v1",
                model.ENV_FANOUT_POST_THREADS: variables[model.ENV_FANOUT_POST_THREADS],
                model.ENV_FANOUT_SUBSCRIBER_BUDGET_MS: variables[
                    model.ENV_FANOUT_SUBSCRIBER_BUDGET_MS
                ],
                "AWS_REGION": stack.region,
            }
        )
        assert config.post_threads == fanout_runtime.DEFAULT_POST_THREADS
        assert config.subscriber_budget_ms == fanout_runtime.DEFAULT_SUBSCRIBER_BUDGET_MS
        # Posting stops this long before the timeout: a subscriber still gets its budget.
        room_ms = function["Timeout"] * 1000 - fanout_runtime.INVOCATION_MARGIN_MS
        assert room_ms > config.subscriber_budget_ms
        # Readers are checked at every delivery: the fleet's lease table, read only.
        assert config.streams_table == model.DEFAULT_LEASE_TABLE_NAME
        grants = role_grants(template, logical_id(stack, fanout.role))
        assert grants[table_arn(stack.region, model.DEFAULT_LEASE_TABLE_NAME)] == {
            "dynamodb:GetItem"
        }


def test_the_fanout_alarms_watch_lag_errors_failed_posts_and_lost_batches(built):
    for stack, template in stacks_of(built):
        fanout = stack.fanout
        alarms = template.to_json()["Resources"]
        by_name = {
            name: alarms[logical_id(stack, alarm)]["Properties"]
            for name, alarm in (
                ("age", fanout.iterator_age_alarm),
                ("posts", fanout.failed_posts_alarm),
                ("records", fanout.failed_records_alarm),
            )
        }
        age = by_name["age"]
        assert (age["MetricName"], age["Namespace"], age["Statistic"]) == (
            "IteratorAge",
            "AWS/Lambda",
            "Maximum",
        )
        assert (age["Threshold"], age["EvaluationPeriods"], age["Period"]) == (30_000, 2, 60)
        posts = by_name["posts"]
        assert (posts["Namespace"], posts["MetricName"]) == (
            model.METRIC_NAMESPACE,
            model.METRIC_FANOUT_FAILED_POSTS,
        )
        # The alarm counts by the dimension the function is told to publish under.
        function = alarms[logical_id(stack, fanout.function)]["Properties"]
        published = function["Environment"]["Variables"][model.ENV_SERVICE_NAME]
        assert published == model.FANOUT_SERVICE_NAME  # the app's stacks keep the package's name
        assert posts["Dimensions"] == [{"Name": model.METRIC_DIMENSION_SERVICE, "Value": published}]
        assert by_name["records"]["MetricName"] == "ApproximateNumberOfMessagesVisible"
        watched = {
            alarms[logical_id(stack, alarm)]["Properties"]["MetricName"] for alarm in fanout.alarms
        }
        assert watched == {
            "Errors",
            "Throttles",
            "IteratorAge",
            model.METRIC_FANOUT_FAILED_POSTS,
            "ApproximateNumberOfMessagesVisible",
        }
        for alarm in fanout.alarms:  # every one reaches the Region's alarm topic
            properties = alarms[logical_id(stack, alarm)]["Properties"]
            assert properties["AlarmActions"] and properties["OKActions"]


def test_no_unacknowledged_finding_and_every_live_acknowledgment_is_needed(monkeypatch):
    app = build_websocket_app().app
    assert AwsSolutionsChecks().validate_scope(app).violations == []
    monkeypatch.setattr(live_delivery, "acknowledge", lambda *args, **kwargs: None)
    report = AwsSolutionsChecks().validate_scope(build_websocket_app().app)
    reported = {v.rule_name.split("::arn")[0] for v in report.violations}
    assert reported == {
        f"{AWS_SOLUTIONS}-SQS3",
        f"{AWS_SOLUTIONS}-IAM5[Resource::*]",
        f"{AWS_SOLUTIONS}-IAM5[Resource",
    }
    connections = [v.rule_name for v in report.violations if "@connections" in v.rule_name]
    assert {rule.split("/")[-3] for rule in connections} == {"DELETE", "POST"}


def test_reader_claims_reach_the_authorizer_and_settings_are_validated():
    built = build_websocket_app(
        {
            context_key("jwt_reader_claims"): "groups,cognito:groups",
            context_key("fanout_reserved_concurrency"): "none",
            context_key("fanout_batching_window_seconds"): "1",
        }
    )
    stack = built.primary
    template = built.template(stack)
    (mapping,) = template.find_resources("AWS::Lambda::EventSourceMapping").values()
    assert mapping["Properties"]["MaximumBatchingWindowInSeconds"] == 1
    authorizer = variables_of(function_of(template, stack, stack.websocket.authorizer_function))
    config = authorizer_runtime.AuthorizerConfig.from_env(authorizer)
    assert config.reader_claims == ("groups", "cognito:groups")
    fanout = function_of(template, stack, stack.fanout.function)
    assert "ReservedConcurrentExecutions" not in fanout
    for key, value, message in (
        ("jwt_reader_claims", "user", "reserved"),
        ("jwt_reader_claims", ["a b"], "claim name"),
        ("ws_subscriptions_table_name", model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME, "differ"),
        ("fanout_reserved_concurrency", 0, "at least 1"),
        ("fanout_batching_window_seconds", -1, "at least 0"),
        ("fanout_batching_window_seconds", 301, "at most 300"),
        ("max_subscribers_per_stream", 0, "at least 1"),
        ("max_subscribers_per_stream", 10_001, "at most 10000"),
        ("max_user_connections_per_stream", 101, "at most 100"),
    ):
        with pytest.raises(ValueError, match=f"{context_key(key)}.*{message}"):
            AppConfig(
                **{
                    key: value
                    if not isinstance(value, str) or key != "jwt_reader_claims"
                    else (value,)
                }
            )


def test_live_props_are_validated(built):
    stack = built.primary
    tables = {
        "streams_table": stack.subscriptions_table,
        "messages_table": stack.subscriptions_table,
        "subscriptions_table": stack.subscriptions_table,
    }
    with pytest.raises(ValueError, match="newest_messages"):
        LiveDeliveryTables(**tables, newest_messages=3000)
    with pytest.raises(ValueError, match="replay_max_messages"):
        LiveDeliveryTables(**tables, replay_max_messages=0)
    common = {
        "stream_arn": "arn",
        "subscriptions_table": stack.subscriptions_table,
        "streams_table": stack.subscriptions_table,
        "api": stack.websocket.api,
        "stage": stack.websocket.stage,
    }
    for field, value in (
        ("batch_size", 0),
        ("parallelization_factor", 11),
        ("post_threads", 65),
        ("reserved_concurrency", 0),
        ("subscriber_budget", Duration.seconds(31)),
        ("timeout", Duration.seconds(5)),  # posting would stop before it started
    ):
        with pytest.raises(ValueError, match=field):
            StreamFanoutProps(**common, **{field: value})


def test_the_live_tables_grant_subscribe_as_a_grant_to_any_grantee():
    """A platform team's own function gets what subscribe needs, as CDK's grants do: a Grant
    that reports success, on exactly the three tables."""
    stack = Stack(App(), "Grants")
    tables = LiveDeliveryTables(
        streams_table=dynamodb.TableV2.from_table_name(stack, "Streams", "streams"),
        messages_table=dynamodb.TableV2.from_table_name(stack, "Messages", "messages"),
        subscriptions_table=dynamodb.TableV2.from_table_name(stack, "Subs", "subscriptions"),
    )
    role = iam.Role(stack, "Mine", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    grant = tables.grant_subscribe(role)
    assert grant.success
    policies = Template.from_stack(stack).find_resources("AWS::IAM::Policy")
    granted = {
        action
        for policy in policies.values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        for action in (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
    }
    assert granted == {a for actions in HANDLER_LIVE_ACTIONS.values() for a in actions}


def test_the_fanout_and_the_canary_offer_the_metrics_their_alarms_watch(built):
    for stack, _ in stacks_of(built):
        for method, alarm in (
            (stack.fanout.metric_failed_posts, stack.fanout.failed_posts_alarm),
            (stack.canary.metric_health, stack.canary.alarm),
        ):
            metric = method()
            assert (metric.namespace, metric.metric_name, metric.statistic) == (
                alarm.metric.namespace,
                alarm.metric.metric_name,
                alarm.metric.statistic,
            )
            assert stack.resolve(metric.dimensions) == stack.resolve(alarm.metric.dimensions)
            assert metric.period.to_seconds() == alarm.metric.period.to_seconds()
