"""Infrastructure tests: the client-facing WebSocket API, its canary and its failover DNS.

The WebSocket stacks are built as ``app.py`` builds them (``cdk.json``'s context), once without
a custom domain (the default) and once with every domain setting. Names come from where the
runtime reads them (:mod:`streamfleet.model`, the handlers, the authorizer, the canary), and the
environment the constructs give each Lambda is fed to that Lambda's own configuration parser.

The Lambda assets themselves (each function's own, what it holds, that its handler imports from
it in a clean interpreter, compiled for the app's one target) are checked in
``tests/artifact/test_assets.py``, from the synthesized assembly.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_route53 as route53
from aws_cdk.assertions import Annotations, Match, Template
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint_file
from syrupy.extensions.json import JSONSnapshotExtension

import app as app_module
from stacks import (
    PRIMARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
)
from stacks.regional import Role
from streamfleet import model
from streamfleet.wsapi import authorizer as authorizer_runtime
from streamfleet.wsapi.canary import config as canary_config
from streamfleet.wsapi.canary import tokens as canary_tokens
from streamfleet.wsapi.handlers import config as handlers_config
from streamfleet_auction import names as auction_names
from streamfleet_auction_cdk import BID_RECORD_ACTIONS, PACKAGE_DIR, PACKAGE_NAME
from streamfleet_cdk import assets, live_delivery, websocket_api
from streamfleet_cdk import canary as canary_construct
from streamfleet_cdk.canary import (
    ALARM_DATAPOINTS,
    CANARY_ACTIONS,
    WebSocketCanaryProps,
)
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.failover_dns import (
    FailoverRecords,
    FailoverRecordsProps,
    FailoverTarget,
    RecordKind,
)
from streamfleet_cdk.live_delivery import HANDLER_LIVE_ACTIONS
from streamfleet_cdk.nag import AWS_SOLUTIONS, MIN_REASON_CHARS
from streamfleet_cdk.websocket_api import (
    AUTHORIZER_ACTIONS,
    HANDLER_ACTIONS,
    CustomDomain,
    HandlerExtension,
    JwtSettings,
    WebSocketApi,
    WebSocketApiProps,
    WebSocketTables,
    WebSocketTablesProps,
)
from streamfleet_dev.emulator.failover import FailoverResolver
from tests.app_support import (
    TEST_ACCOUNT,
    arn_text,
    as_list,
    deployed,
    flatten,
    logical_id,
    mask_asset_hashes,
    role_grants,
    role_statements,
)
from tests.wsapi_app_support import (
    CANARY_PUBLIC_KEYS,
    CERT_PRIMARY,
    CERT_SECONDARY,
    DOMAIN,
    DOMAIN_CONTEXT,
    PRIMARY_REGION,
    SECONDARY_REGION,
    SECRET_NAME,
    ZONE_ID,
    ZONE_NAME,
    BuiltWebSocketApp,
    build_websocket_app,
    default_websocket_app,
    domain_websocket_app,
    function_of,
    resources,
    stacks_of,
    variables_of,
)

# What CloudFormation resolves at deploy time, as the runtime would see it.
DEPLOYED_API_ID = "a1b2c3d4e5"

# The default app adds the demo auction's route to the core's.
ROUTE_KEYS = {"$connect", "$disconnect", "$default", *model.WS_ROUTES, auction_names.WS_ROUTE_BID}
LOG_ACTIONS = {"logs:CreateLogStream", "logs:PutLogEvents"}

# Every acknowledgment per WebSocket stack: a new one fails this list on purpose.
EXPECTED_ACKNOWLEDGMENTS = {
    f"{AWS_SOLUTIONS}-APIG4",  # WebSocket APIs authorize on $connect only
    f"{AWS_SOLUTIONS}-IAM5[Resource::*]",  # cloudwatch:PutMetricData has no resource scope
    # The handler's execute-api:ManageConnections on POST @connections/* (one stage's);
    # the full finding id names the API, see test_every_acknowledgment_is_specific.
    f"{AWS_SOLUTIONS}-IAM5[Resource::arn:aws:execute-api:...]",
    # The fan-out's queue of given-up batches is itself a dead-letter destination.
    f"{AWS_SOLUTIONS}-SQS3",
}


# --- Building the stacks ---


@pytest.fixture(scope="module")
def built() -> BuiltWebSocketApp:
    return default_websocket_app()


@pytest.fixture(scope="module")
def with_domain() -> BuiltWebSocketApp:
    return domain_websocket_app()


def only(template: Template, resource_type: str) -> tuple[str, dict[str, Any]]:
    found = resources(template, resource_type)
    assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
    return next(iter(found.items()))


# --- API, routes, authorizer, stage ---


def test_routes_and_route_selection_come_from_the_runtime(built):
    for stack, template in stacks_of(built):
        _, api = only(template, "AWS::ApiGatewayV2::Api")
        assert api["ProtocolType"] == "WEBSOCKET"
        assert api["RouteSelectionExpression"] == "$request.body.action"
        assert model.WS_ROUTE_SELECTION_FIELD == "action"
        routes = resources(template, "AWS::ApiGatewayV2::Route")
        assert sorted(route["RouteKey"] for route in routes.values()) == sorted(ROUTE_KEYS)
        integration_id, integration = only(template, "AWS::ApiGatewayV2::Integration")
        assert integration["IntegrationType"] == "AWS_PROXY"
        handler_id = logical_id(stack, stack.websocket.handler)
        assert f"<{handler_id}.Arn>" in flatten(integration["IntegrationUri"])
        for route in routes.values():
            assert route["Target"] == {"Fn::Join": ["", ["integrations/", {"Ref": integration_id}]]}


def test_the_authorizer_guards_connect_only_and_reads_both_token_transports(built):
    for stack, template in stacks_of(built):
        authorizer_id, authorizer = only(template, "AWS::ApiGatewayV2::Authorizer")
        assert authorizer["AuthorizerType"] == "REQUEST"
        function_id = logical_id(stack, stack.websocket.authorizer_function)
        assert f"<{function_id}.Arn>" in flatten(authorizer["AuthorizerUri"])
        # API Gateway requires *every* identity source: naming the query parameter would turn
        # away clients that send the token as a subprotocol, and vice versa.
        assert "IdentitySource" not in authorizer
        for route in resources(template, "AWS::ApiGatewayV2::Route").values():
            if route["RouteKey"] == "$connect":
                assert route["AuthorizationType"] == "CUSTOM"
                assert route["AuthorizerId"] == {"Ref": authorizer_id}
            else:
                assert route["AuthorizationType"] == "NONE", route["RouteKey"]
                assert "AuthorizerId" not in route


def test_the_authorizer_really_accepts_both_transports_it_is_deployed_for():
    # The runtime half of the identity-source decision: with no identity source, API Gateway
    # hands every $connect to the authorizer, which finds the token in either place.
    token = "a.b.c"
    query = {"queryStringParameters": {model.WS_TOKEN_QUERY_PARAMETER: token}}
    protocol = {
        "headers": {
            "Sec-WebSocket-Protocol": (
                f"{model.WS_APP_SUBPROTOCOL}, {model.WS_BEARER_SUBPROTOCOL_PREFIX}{token}"
            )
        }
    }
    assert authorizer_runtime.extract_token(query) == ("query", token)
    assert authorizer_runtime.extract_token(protocol) == ("subprotocol", token)
    with pytest.raises(authorizer_runtime.Unauthorized):
        authorizer_runtime.extract_token({})


def test_identity_sources_can_be_named_for_a_single_transport():
    stack = construct_stack()
    tables = WebSocketTables(stack, "Tables", props=WebSocketTablesProps())
    WebSocketApi(
        stack,
        "Ws",
        props=websocket_props(tables, identity_source=("route.request.querystring.token",)),
    )
    _, authorizer = only(Template.from_stack(stack), "AWS::ApiGatewayV2::Authorizer")
    assert authorizer["IdentitySource"] == ["route.request.querystring.token"]


def test_stage_is_auto_deployed_throttled_and_access_logged(built):
    for stack, template in stacks_of(built):
        _, stage = only(template, "AWS::ApiGatewayV2::Stage")
        assert stage["StageName"] == "v1"
        assert stage["AutoDeploy"] is True
        assert stage["DefaultRouteSettings"] == {
            "ThrottlingBurstLimit": 1000,
            "ThrottlingRateLimit": 500,
        }
        log_group_id = logical_id(stack, stack.websocket.access_log_group)
        assert stage["AccessLogSettings"]["DestinationArn"] == {"Fn::GetAtt": [log_group_id, "Arn"]}
        log_format = json.loads(stage["AccessLogSettings"]["Format"])
        assert log_format["requestId"] == "$context.requestId"
        assert log_format["routeKey"] == "$context.routeKey"
        assert log_format["status"] == "$context.status"
        assert not any("querystring" in value.lower() for value in log_format.values())
        retention = resources(template, "AWS::Logs::LogGroup")[log_group_id]["RetentionInDays"]
        assert retention == 30


def test_stage_throttling_follows_the_configuration():
    built = build_websocket_app(
        {context_key("ws_api_rate_limit"): 20, context_key("ws_api_burst_limit"): "40"}
    )
    _, stage = only(built.template(built.primary), "AWS::ApiGatewayV2::Stage")
    assert stage["DefaultRouteSettings"] == {"ThrottlingBurstLimit": 40, "ThrottlingRateLimit": 20}


def test_lambda_permissions_are_scoped_to_this_api(built):
    for stack, template in stacks_of(built):
        api_id = logical_id(stack, stack.websocket.api)
        permissions = resources(template, "AWS::Lambda::Permission")
        # One per route for the handler, one for the authorizer, one for the schedule.
        assert len(permissions) == len(ROUTE_KEYS) + 2
        for permission in permissions.values():
            source = flatten(permission["SourceArn"])
            if permission["Principal"] == "apigateway.amazonaws.com":
                assert f":execute-api:{stack.region}:{TEST_ACCOUNT}:<{api_id}>/" in source
            else:
                assert permission["Principal"] == "events.amazonaws.com"
                rule_id = logical_id(stack, stack.canary.rule)
                assert source == f"<{rule_id}.Arn>"


# --- Lambdas and their environment ---


TARGET = (assets.LAMBDA_TARGET.runtime.name, [assets.LAMBDA_TARGET.architecture.name])


def test_every_function_runs_on_the_app_target_with_json_logs_and_reserved_concurrency(built):
    # streamfleet:*_reserved_concurrency defaults: handler 200, authorizer 100, canary 2.
    for stack, template in stacks_of(built):
        for function, log_group, reserved in (
            (stack.websocket.handler, stack.websocket.handler_log_group, 200),
            (stack.websocket.authorizer_function, stack.websocket.authorizer_log_group, 100),
            (stack.canary.function, stack.canary.log_group, 2),
        ):
            properties = function_of(template, stack, function)
            assert (properties["Runtime"], properties["Architectures"]) == TARGET
            assert TARGET == ("python3.14", ["arm64"])
            assert properties["LoggingConfig"] == {
                "LogGroup": {"Ref": logical_id(stack, log_group)},
                "LogFormat": "JSON",
                "ApplicationLogLevel": "INFO",
                "SystemLogLevel": "WARN",
            }
            assert properties["ReservedConcurrentExecutions"] == reserved


def test_reserved_concurrency_and_log_level_follow_the_configuration():
    built = build_websocket_app(
        {
            context_key("ws_handler_reserved_concurrency"): "none",
            context_key("authorizer_reserved_concurrency"): 30,
            context_key("canary_reserved_concurrency"): 5,
            context_key("lambda_log_level"): "WARN",
        }
    )
    stack = built.primary
    template = built.template(stack)
    handler = function_of(template, stack, stack.websocket.handler)
    assert "ReservedConcurrentExecutions" not in handler
    authorizer = function_of(template, stack, stack.websocket.authorizer_function)
    canary = function_of(template, stack, stack.canary.function)
    assert (authorizer["ReservedConcurrentExecutions"], canary["ReservedConcurrentExecutions"]) == (
        30,
        5,
    )
    for properties in (handler, authorizer, canary):
        assert properties["LoggingConfig"]["ApplicationLogLevel"] == "WARN"


def _watched_metric(alarm: dict) -> dict:
    """The alarm's own metric, or the ``errors`` metric of an errors-minus-expected formula."""
    if "MetricName" in alarm:
        return alarm
    queries = {query["Id"]: query for query in alarm["Metrics"]}
    return queries["errors"]["MetricStat"]["Metric"]


def test_the_authorizers_errors_alarm_leaves_out_connects_without_a_token(built):
    """A 401 is raised (Lambda counts it in ``Errors``): the alarm subtracts the authorizer's
    own count of them, for the same function, and only for the authorizer."""
    for stack, template in stacks_of(built):
        resources = template.to_json()["Resources"]
        authorizer = logical_id(stack, stack.websocket.authorizer_function)
        formulas = 0
        for alarm in (*stack.websocket.alarms, *stack.canary.function_alarms):
            properties = resources[logical_id(stack, alarm)]["Properties"]
            if "Metrics" not in properties:
                assert properties["Dimensions"][0]["Value"]["Ref"] != authorizer or (
                    properties["MetricName"] == "Throttles"
                )
                continue
            queries = {query["Id"]: query for query in properties["Metrics"]}
            expected = queries["expected"]["MetricStat"]["Metric"]
            (formula,) = [q for q in queries.values() if "Expression" in q]
            assert formula["Expression"] == "errors - FILL(expected, 0)"
            assert formula.get("ReturnData", True) is True
            assert expected == {
                "Namespace": model.METRIC_NAMESPACE,
                "MetricName": model.METRIC_AUTHORIZER_MISSING_TOKEN,
                "Dimensions": [
                    {"Name": model.METRIC_DIMENSION_FUNCTION, "Value": {"Ref": authorizer}}
                ],
            }
            assert _watched_metric(properties)["Dimensions"][0]["Value"] == {"Ref": authorizer}
            assert properties["Threshold"] == 1
            formulas += 1
        assert formulas == 1


def test_every_function_has_an_errors_and_a_throttles_alarm(built):
    for stack, template in stacks_of(built):
        alarms = [
            template.to_json()["Resources"][logical_id(stack, alarm)]["Properties"]
            for alarm in (*stack.websocket.alarms, *stack.canary.function_alarms)
        ]
        watched = sorted(
            (metric["Dimensions"][0]["Value"]["Ref"], metric["MetricName"])
            for metric in map(_watched_metric, alarms)
        )
        functions = (stack.websocket.handler, stack.websocket.authorizer_function)
        expected = [
            (logical_id(stack, function), metric)
            for function in (*functions, stack.canary.function)
            for metric in ("Errors", "Throttles")
        ]
        assert watched == sorted(expected)


def test_handler_runs_the_runtime_entry_with_its_config(built):
    for stack, template in stacks_of(built):
        handler = function_of(template, stack, stack.websocket.handler)
        assert handler["Handler"] == auction_names.HANDLER_ENTRY  # the core's, plus the demo
        assert handler["Timeout"] <= 29
        variables = variables_of(handler)
        state = deployed(
            variables[model.ENV_STATE_TABLE_NAME], model.DEFAULT_WSAPI_STATE_TABLE_NAME
        )
        connections = deployed(
            variables[model.ENV_CONNECTIONS_TABLE_NAME], model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME
        )
        config = handlers_config.HandlerConfig.from_env(
            {
                model.ENV_STATE_TABLE_NAME: state,
                model.ENV_CONNECTIONS_TABLE_NAME: connections,
                "AWS_REGION": stack.region,
            }
        )
        # No management endpoint override: replies go to the API's own regional endpoint.
        assert config.management_endpoint is None
        assert (config.state_table, config.connections_table) == (
            model.DEFAULT_WSAPI_STATE_TABLE_NAME,
            model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME,
        )


def test_secondary_handler_uses_the_state_replica_by_name(built):
    handler = function_of(
        built.template(built.secondary), built.secondary, built.secondary.websocket.handler
    )
    assert variables_of(handler)[model.ENV_STATE_TABLE_NAME] == (
        model.DEFAULT_WSAPI_STATE_TABLE_NAME
    )


def test_authorizer_environment_is_what_the_authorizer_accepts(with_domain):
    for stack, template in stacks_of(with_domain):
        function = function_of(template, stack, stack.websocket.authorizer_function)
        assert function["Handler"] == "streamfleet.wsapi.authorizer.handler"
        config = authorizer_runtime.AuthorizerConfig.from_env(variables_of(function))
        assert config.issuer == "https://login.example.org/"
        assert config.audience == "auction-clients"
        assert config.jwks_url == "https://login.example.org/.well-known/jwks.json"
        assert config.keys is None
        # The canary's own identity: its public key, for canary tokens only.
        assert config.canary_keys == CANARY_PUBLIC_KEYS
        assert authorizer_runtime.StaticKeys.parse(config.canary_keys).keys


def test_canary_environment_is_what_the_canary_accepts(with_domain):
    for stack, template in stacks_of(with_domain):
        function = function_of(template, stack, stack.canary.function)
        assert function["Handler"] == "streamfleet.wsapi.canary.handler"
        variables = variables_of(function)
        api_id = logical_id(stack, stack.websocket.api)
        # The custom domain, as users dial it, but connected through this Region's regional
        # domain name, never through the failover name's DNS: the canary judges this Region,
        # the domain's certificate and mapping included.
        domain_id = logical_id(stack, stack.websocket.domain_name)
        assert variables["CANARY_ENDPOINT_URL"] == {
            "Fn::Join": ["", ["wss://", {"Ref": domain_id}]]  # Ref: the domain's name
        }
        assert variables[model.ENV_CANARY_CONNECT_HOST] == {
            "Fn::GetAtt": [domain_id, "RegionalDomainName"]
        }
        # Not before the domain maps to the stage: a probe before that would trip the Region.
        resource = template.to_json()["Resources"][logical_id(stack, stack.canary.function)]
        assert logical_id(stack, stack.websocket.api_mapping) in resource["DependsOn"]
        # Closing clients goes to the stage's own Management API.
        assert flatten(variables[model.ENV_CANARY_MANAGEMENT_ENDPOINT]) == (
            f"https://<{api_id}>.execute-api.{stack.region}.<AWS::URLSuffix>/v1"
        )
        assert variables["CANARY_API_ID"] == {"Ref": api_id}
        connections_id = logical_id(stack, stack.connections_table)
        assert variables["CANARY_STATE_TABLE_NAME"] == {"Ref": connections_id}
        # The alarm its own metric feeds, which it reads each run (fail-back after any ALARM).
        alarm_id = logical_id(stack, stack.canary.alarm)
        assert variables[model.ENV_CANARY_ALARM_NAME] == {"Ref": alarm_id}
        env = {
            **variables,
            "CANARY_ENDPOINT_URL": f"wss://{DOMAIN}",
            model.ENV_CANARY_CONNECT_HOST: f"d-abc123.execute-api.{stack.region}.amazonaws.com",
            model.ENV_CANARY_MANAGEMENT_ENDPOINT: (
                f"https://{DEPLOYED_API_ID}.execute-api.{stack.region}.amazonaws.com/v1"
            ),
            "CANARY_API_ID": DEPLOYED_API_ID,
            "CANARY_STATE_TABLE_NAME": model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME,
            model.ENV_CANARY_ALARM_NAME: "streamfleet-health",
        }
        config = canary_config.CanaryConfig.from_env(env)
        assert config.alarm_name == "streamfleet-health"
        assert config.connect_host == f"d-abc123.execute-api.{stack.region}.amazonaws.com"
        assert config.management_url().startswith(f"https://{DEPLOYED_API_ID}.execute-api.")
        assert config.healthy_runs_to_recover == 7  # K, from streamfleet:canary_...recover
        assert config.failures_to_trip == ALARM_DATAPOINTS
        assert config.state_table == model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME
        source = canary_tokens.token_source_from_env(env, secrets=object())
        assert isinstance(source, canary_tokens.SecretToken)
        assert variables["CANARY_SIGNING_KEY_SECRET_ARN"] == SECRET_NAME
        assert variables["JWT_AUDIENCE"] == "auction-clients"
        # The keys its authorizer accepts, the same text: a key of its own outside them pages
        # as the canary's fault instead of failing the Region over.
        authorizer = variables_of(function_of(template, stack, stack.websocket.authorizer_function))
        assert variables[model.ENV_JWT_CANARY_KEYS] == authorizer[model.ENV_JWT_CANARY_KEYS]
        assert config.accepted_keys is not None and len(config.accepted_keys) == 1
        # A canary never closes the connections of the Region the failover name answers
        # with: the secondary's record has no health check, so only the primary sweeps.
        assert config.disconnect_when_unhealthy is (stack.role is Role.PRIMARY)
        # Every variable the canary is given is one it reads (its issuer is its own, fixed).
        assert set(variables) <= set(model.CANARY_ENV), set(variables) - set(model.CANARY_ENV)


def test_canary_without_a_custom_domain_dials_the_regional_stage_url(built):
    for stack, template in stacks_of(built):
        variables = variables_of(function_of(template, stack, stack.canary.function))
        api_id = logical_id(stack, stack.websocket.api)
        assert flatten(variables["CANARY_ENDPOINT_URL"]) == (
            f"wss://<{api_id}>.execute-api.{stack.region}.<AWS::URLSuffix>/v1"
        )
        assert model.ENV_CANARY_CONNECT_HOST not in variables


def test_canary_without_a_signing_key_connects_without_a_token(built):
    for stack, template in stacks_of(built):
        variables = variables_of(function_of(template, stack, stack.canary.function))
        assert "CANARY_SIGNING_KEY_SECRET_ARN" not in variables
        source = canary_tokens.token_source_from_env(
            {key: value for key, value in variables.items() if isinstance(value, str)}
        )
        assert source == canary_tokens.StaticToken(None)
        assert variables["CANARY_HEALTHY_RUNS_TO_RECOVER"] == str(
            canary_config.DEFAULT_HEALTHY_RUNS_TO_RECOVER
        )


# --- IAM: exactly the calls each function makes ---


def test_the_auctions_home_moves_to_the_secondary_in_both_regions_at_once():
    built = build_websocket_app({context_key("ws_state_home_region"): SECONDARY_REGION})
    for stack, template in stacks_of(built):
        handler_env = variables_of(function_of(template, stack, stack.websocket.handler))
        assert handler_env[auction_names.ENV_STATE_HOME_REGION] == SECONDARY_REGION
        statements = role_statements(template, logical_id(stack, stack.websocket.handler_role))
        across = [s["Resource"] for s in statements if "dynamodb:LeadingKeys" in str(s)]
        # Only the primary, no longer the home, writes across Regions: the secondary's replica
        # of its own table (the same name).
        expected = f"arn:aws:dynamodb:{SECONDARY_REGION}:{TEST_ACCOUNT}:table/"
        if stack.region == PRIMARY_REGION:
            (resource,) = across
            assert resource == expected + f"<{logical_id(stack, stack.state_table)}>"
        else:
            assert across == []


def test_handler_role_has_exactly_its_table_and_reply_grants(built):
    for stack, template in stacks_of(built):
        websocket = stack.websocket
        grants = role_grants(template, logical_id(stack, websocket.handler_role))
        connections_arn = arn_text(stack, websocket.management_connections_arn)
        api_id = logical_id(stack, websocket.api)
        assert connections_arn == (
            f"arn:aws:execute-api:{stack.region}:{TEST_ACCOUNT}:<{api_id}>/v1/POST/@connections/*"
        )
        # Bids are decided in the primary's replica: the secondary may write its auctions and
        # bid records there, by name, and only its users' items in its own.
        bids = {*HANDLER_ACTIONS["state_table"], *BID_RECORD_ACTIONS}
        home, local_state = {}, bids
        if stack.region != PRIMARY_REGION:
            home_arn = (
                f"arn:aws:dynamodb:{PRIMARY_REGION}:{TEST_ACCOUNT}:table/streamfleet-wsapi-state"
            )
            home = {home_arn: bids}
            local_state = set(HANDLER_ACTIONS["state_table"])
            (statement,) = [
                s
                for s in role_statements(template, logical_id(stack, websocket.handler_role))
                if s["Resource"] == home_arn
            ]
            assert statement["Condition"] == {
                "ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["AUCTION#*", "BID#*"]}
            }
        handler_env = variables_of(function_of(template, stack, websocket.handler))
        assert handler_env[auction_names.ENV_STATE_HOME_REGION] == PRIMARY_REGION
        assert grants == {
            **home,
            arn_text(stack, stack.state_table.table_arn): local_state,
            arn_text(stack, stack.connections_table.table_arn): set(
                HANDLER_ACTIONS["connections_table"]
            ),
            connections_arn: {"execute-api:ManageConnections"},
            arn_text(stack, websocket.handler_log_group.log_group_arn): LOG_ACTIONS,
            # Live delivery: a stream's readers (lease table), replays (messages table), the
            # connection's subscriptions; both fleet tables by name, this Region's replica.
            **{
                arn_text(stack, table.table_arn): set(HANDLER_LIVE_ACTIONS[name])
                for name, table in (
                    ("streams_table", stack.live.streams_table),
                    ("messages_table", stack.live.messages_table),
                    ("subscriptions_table", stack.subscriptions_table),
                )
            },
        }
    assert set(HANDLER_LIVE_ACTIONS["streams_table"]) == {"dynamodb:GetItem"}
    assert set(HANDLER_LIVE_ACTIONS["messages_table"]) == {"dynamodb:Query"}
    assert set(HANDLER_ACTIONS["state_table"]) == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
    assert set(BID_RECORD_ACTIONS) == {"dynamodb:PutItem"}
    assert set(HANDLER_ACTIONS["connections_table"]) == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
    }


def test_secondary_handler_grants_name_the_local_replica(built):
    stack = built.secondary
    grants = role_grants(built.template(stack), logical_id(stack, stack.websocket.handler_role))
    state_arn = (
        f"arn:aws:dynamodb:{SECONDARY_REGION}:{TEST_ACCOUNT}:table/"
        f"{model.DEFAULT_WSAPI_STATE_TABLE_NAME}"
    )
    # Its users' items only: auctions and bid records are written in the home's replica.
    assert grants[state_arn] == set(HANDLER_ACTIONS["state_table"])


def test_authorizer_role_may_only_write_its_logs(built):
    for stack, template in stacks_of(built):
        websocket = stack.websocket
        grants = role_grants(template, logical_id(stack, websocket.authorizer_role))
        assert grants == {
            arn_text(stack, websocket.authorizer_log_group.log_group_arn): LOG_ACTIONS
        }
    assert set(AUTHORIZER_ACTIONS) == {"log_group"}
    assert set(AUTHORIZER_ACTIONS["log_group"]) == LOG_ACTIONS


def test_canary_role_has_exactly_its_grants(with_domain, built):
    for app, with_key in ((with_domain, True), (built, False)):
        for stack, template in stacks_of(app):
            canary = stack.canary
            grants = role_grants(template, logical_id(stack, canary.role))
            api_id = logical_id(stack, stack.websocket.api)
            state = {"dynamodb:GetItem", "dynamodb:PutItem"}
            expected = {
                arn_text(stack, stack.connections_table.table_arn): state,
                "*": {"cloudwatch:PutMetricData"},
                arn_text(stack, canary.log_group.log_group_arn): LOG_ACTIONS,
                # Its own alarm only: fail-back waits for a healthy streak after any ALARM.
                arn_text(stack, canary.alarm.alarm_arn): {"cloudwatch:DescribeAlarms"},
            }
            if stack.role is Role.PRIMARY:  # closing this Region's clients while unhealthy
                state |= {"dynamodb:Scan", "dynamodb:DeleteItem"}
                expected[
                    f"arn:aws:execute-api:{stack.region}:{TEST_ACCOUNT}:<{api_id}>"
                    "/v1/DELETE/@connections/*"
                ] = {"execute-api:ManageConnections"}
            if with_key:
                secret = (
                    f"arn:aws:secretsmanager:{stack.region}:{TEST_ACCOUNT}:secret:{SECRET_NAME}"
                )
                expected[f"{secret}-??????"] = {"secretsmanager:GetSecretValue"}
            assert grants == expected
            # The one wildcard resource is bounded by the metric namespace.
            policy = template.to_json()["Resources"][
                logical_id(stack, canary.role.node.find_child("DefaultPolicy"))
            ]
            (metrics,) = [
                s
                for s in policy["Properties"]["PolicyDocument"]["Statement"]
                if s["Resource"] == "*"
            ]
            assert metrics["Condition"] == {
                "StringEquals": {"cloudwatch:namespace": model.HEALTH_METRIC_NAMESPACE}
            }
    assert set(CANARY_ACTIONS["metrics"]) == {"cloudwatch:PutMetricData"}


def test_no_policy_allows_wildcard_actions_and_only_the_canary_scans(built, with_domain):
    # The one Scan: the canary's, of this Region's connections table, to find the clients it
    # closes while the Region is unhealthy (API Gateway cannot list connections).
    for app in (built, with_domain):
        for stack, template in stacks_of(app):
            canary_role = {"Ref": logical_id(stack, stack.canary.role)}
            connections = stack.resolve(stack.connections_table.table_arn)
            for policy in resources(template, "AWS::IAM::Policy").values():
                for statement in policy["PolicyDocument"]["Statement"]:
                    for action in as_list(statement["Action"]):
                        assert "*" not in action, action
                        if action == "dynamodb:Scan":
                            assert policy["Roles"] == [canary_role], policy["Roles"]
                            assert as_list(statement["Resource"]) == [connections]
            for role in resources(template, "AWS::IAM::Role").values():
                assert not role.get("ManagedPolicyArns")


# --- Tables ---


def test_state_table_is_a_global_table_replicated_to_the_secondary(built):
    template = built.template(built.primary)
    tables = {
        t["Properties"]["TableName"]: t
        for t in template.find_resources("AWS::DynamoDB::GlobalTable").values()
    }
    state = tables[model.DEFAULT_WSAPI_STATE_TABLE_NAME]
    assert state["DeletionPolicy"] == "Retain"
    properties = state["Properties"]
    assert properties["KeySchema"] == [
        {"AttributeName": model.WSAPI_STATE_TABLE.partition_key, "KeyType": "HASH"}
    ]
    assert {r["Region"] for r in properties["Replicas"]} == {PRIMARY_REGION, SECONDARY_REGION}
    for replica in properties["Replicas"]:
        assert replica["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert replica["DeletionProtectionEnabled"] is True


def test_each_region_has_its_own_connections_table_with_the_model_ttl(built):
    for stack, template in stacks_of(built):
        tables = template.find_resources(
            "AWS::DynamoDB::GlobalTable",
            {"Properties": {"TableName": model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME}},
        )
        assert len(tables) == 1
        properties = next(iter(tables.values()))["Properties"]
        assert [r["Region"] for r in properties["Replicas"]] == [stack.region]  # not replicated
        assert properties["TimeToLiveSpecification"] == {
            "AttributeName": model.WSAPI_CONNECTIONS_TABLE.ttl_attribute,
            "Enabled": True,
        }
    # The secondary declares only its own Region's tables: the state table is a replica.
    assert declared_table_names(built.template(built.secondary)) == {
        model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME,
        model.DEFAULT_WSAPI_SUBSCRIPTIONS_TABLE_NAME,
    }


def declared_table_names(template: Template) -> set[str]:
    tables = template.find_resources("AWS::DynamoDB::GlobalTable")
    return {table["Properties"]["TableName"] for table in tables.values()}


def test_secondary_stack_deploys_after_the_primary(built):
    assert built.primary in built.secondary.dependencies
    assert (built.primary.stack_name, built.primary.region) == (
        PRIMARY_WS_STACK_NAME,
        PRIMARY_REGION,
    )
    assert (built.secondary.stack_name, built.secondary.region) == (
        SECONDARY_WS_STACK_NAME,
        SECONDARY_REGION,
    )


# --- Canary: schedule, alarm, health check ---


def test_canary_runs_every_minute_without_retries(built):
    for stack, template in stacks_of(built):
        _, rule = only(template, "AWS::Events::Rule")
        assert rule["ScheduleExpression"] == "rate(1 minute)"
        (target,) = rule["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [logical_id(stack, stack.canary.function), "Arn"]}
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60}
        _, invoke = only(template, "AWS::Lambda::EventInvokeConfig")
        assert invoke["MaximumRetryAttempts"] == 0


def test_alarm_is_two_of_two_minutes_on_the_canary_metric_with_missing_data_breaching(built):
    for stack, template in stacks_of(built):
        alarm = template.to_json()["Resources"][logical_id(stack, stack.canary.alarm)]["Properties"]
        assert alarm["Namespace"] == model.HEALTH_METRIC_NAMESPACE == "App"
        assert alarm["MetricName"] == model.HEALTH_METRIC_NAME == "WebSocketHealth"
        assert alarm["Dimensions"] == [
            {
                "Name": model.HEALTH_METRIC_DIMENSION_API_ID,
                "Value": {"Ref": logical_id(stack, stack.websocket.api)},
            }
        ]
        assert alarm["Period"] == 60
        assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 2
        assert alarm["TreatMissingData"] == "breaching"
        assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 1)
        # What Route 53 can evaluate: a plain statistic, no metric math, no extended statistic.
        assert alarm["Statistic"] in {"Minimum", "Average"}
        assert "Metrics" not in alarm and "ExtendedStatistic" not in alarm


def test_health_check_follows_the_alarm_and_is_unhealthy_without_data(built):
    for stack, template in stacks_of(built):
        _, check = only(template, "AWS::Route53::HealthCheck")
        config = check["HealthCheckConfig"]
        assert config["Type"] == "CLOUDWATCH_METRIC"
        assert config["AlarmIdentifier"] == {
            "Name": {"Ref": logical_id(stack, stack.canary.alarm)},
            "Region": stack.region,
        }
        assert config["InsufficientDataHealthStatus"] == "Unhealthy"
        assert config.get("Inverted", False) is False


def test_fail_back_runs_are_configurable_and_validated():
    built = build_websocket_app({context_key("canary_healthy_runs_to_recover"): "9"})
    function = function_of(
        built.template(built.primary), built.primary, built.primary.canary.function
    )
    assert variables_of(function)["CANARY_HEALTHY_RUNS_TO_RECOVER"] == "9"
    with pytest.raises(ValueError, match=r"^streamfleet:canary_healthy_runs_to_recover: "):
        config_from({context_key("canary_healthy_runs_to_recover"): 0})


# --- Failover DNS ---


def test_failover_records_primary_with_health_check_and_secondary(with_domain):
    records = {}
    for stack, template in stacks_of(with_domain):
        _, record = only(template, "AWS::Route53::RecordSet")
        records[stack.role.value] = record
        assert record["Name"] == f"{DOMAIN}."
        assert record["Type"] == "A"
        assert record["HostedZoneId"] == ZONE_ID
        domain_id = logical_id(stack, stack.websocket.domain_name)
        assert record["AliasTarget"] == {
            "DNSName": {"Fn::GetAtt": [domain_id, "RegionalDomainName"]},
            "HostedZoneId": {"Fn::GetAtt": [domain_id, "RegionalHostedZoneId"]},
            "EvaluateTargetHealth": True,
        }
    primary, secondary = records["primary"], records["secondary"]
    assert primary["Failover"] == "PRIMARY"
    assert primary["SetIdentifier"] == f"{PRIMARY_REGION}-primary"
    check_id = logical_id(with_domain.primary, with_domain.primary.canary.health_check)
    assert primary["HealthCheckId"] == {"Ref": check_id}
    assert secondary["Failover"] == "SECONDARY"
    assert secondary["SetIdentifier"] == f"{SECONDARY_REGION}-secondary"
    assert "HealthCheckId" not in secondary
    # The local failover model (the drills, local mode) follows the records as synthesized.
    modelled = dataclasses.fields(FailoverResolver)
    (checked,) = [f.default for f in modelled if f.name == "secondary_health_checked"]
    assert checked is ("HealthCheckId" in secondary)


def test_each_region_maps_the_domain_with_its_own_certificate(with_domain):
    for stack, template in stacks_of(with_domain):
        _, domain = only(template, "AWS::ApiGatewayV2::DomainName")
        assert domain["DomainName"] == DOMAIN
        (configuration,) = domain["DomainNameConfigurations"]
        expected = CERT_PRIMARY if stack is with_domain.primary else CERT_SECONDARY
        assert configuration["CertificateArn"] == expected
        assert configuration["EndpointType"] == "REGIONAL"
        assert configuration["SecurityPolicy"] == "TLS_1_2"
        _, mapping = only(template, "AWS::ApiGatewayV2::ApiMapping")
        assert mapping["ApiId"] == {"Ref": logical_id(stack, stack.websocket.api)}
        assert mapping["Stage"] == "v1"
        assert mapping["DomainName"] == {"Ref": logical_id(stack, stack.websocket.domain_name)}
        template.has_output("WebSocketUrl", Match.any_value())
    assert not Annotations.from_stack(with_domain.primary).find_info(
        "*", Match.string_like_regexp("No custom domain")
    )


def test_without_domain_settings_no_records_and_an_annotation_says_what_is_missing(built):
    for stack, template in stacks_of(built):
        for resource_type in (
            "AWS::Route53::RecordSet",
            "AWS::ApiGatewayV2::DomainName",
            "AWS::ApiGatewayV2::ApiMapping",
        ):
            template.resource_count_is(resource_type, 0)
        assert stack.failover is None
        infos = Annotations.from_stack(stack).find_info(
            "*", Match.string_like_regexp("No custom domain")
        )
        assert len(infos) == 1
        text = infos[0].entry.data
        for key in ("ws_domain_name", "hosted_zone_id", "ws_certificate_arn_secondary"):
            assert context_key(key) in text
        warnings = Annotations.from_stack(stack).find_warning(
            "*", Match.string_like_regexp("canary_signing_key_secret_name")
        )
        assert len(warnings) == 1


def test_cname_records_have_a_60_second_ttl():
    stack = construct_stack()
    zone = route53.HostedZone.from_hosted_zone_attributes(
        stack, "Zone", hosted_zone_id=ZONE_ID, zone_name=ZONE_NAME
    )
    check = route53.HealthCheck(
        stack, "Check", type=route53.HealthCheckType.HTTPS, fqdn="health.example.com"
    )
    records = FailoverRecords(
        stack,
        "Dns",
        props=FailoverRecordsProps(
            zone=zone,
            record_name=DOMAIN,
            kind=RecordKind.CNAME,
            primary=FailoverTarget(
                regional_domain_name="d-1.execute-api.eu-west-1.amazonaws.com",
                regional_hosted_zone_id="ZREGIONAL1",
                set_identifier="eu-west-1-primary",
                health_check=check,
            ),
            secondary=FailoverTarget(
                regional_domain_name="d-2.execute-api.eu-central-1.amazonaws.com",
                regional_hosted_zone_id="ZREGIONAL2",
                set_identifier="eu-central-1-secondary",
            ),
        ),
    )
    assert len(records.records) == 2
    found = resources(Template.from_stack(stack), "AWS::Route53::RecordSet")
    by_role = {record["Failover"]: record for record in found.values()}
    assert by_role["PRIMARY"]["Type"] == by_role["SECONDARY"]["Type"] == "CNAME"
    assert by_role["PRIMARY"]["TTL"] == by_role["SECONDARY"]["TTL"] == "60"
    assert by_role["PRIMARY"]["ResourceRecords"] == ["d-1.execute-api.eu-west-1.amazonaws.com"]
    assert "HealthCheckId" in by_role["PRIMARY"] and "HealthCheckId" not in by_role["SECONDARY"]


@pytest.mark.parametrize(
    ("primary", "secondary", "message"),
    [
        (None, None, "^primary, secondary: at least one"),
        ({"health_check": None}, None, "^primary: health_check is required"),
        ({}, {"set_identifier": "same"}, "^secondary: set_identifier must differ"),
        ({"set_identifier": ""}, None, "^set_identifier: 1-128"),
    ],
)
def test_failover_props_are_validated(primary, secondary, message):
    stack = construct_stack()
    zone = route53.HostedZone.from_hosted_zone_attributes(
        stack, "Zone", hosted_zone_id=ZONE_ID, zone_name=ZONE_NAME
    )
    check = route53.HealthCheck(
        stack, "Check", type=route53.HealthCheckType.HTTPS, fqdn="health.example.com"
    )

    def target(overrides: dict[str, Any] | None) -> FailoverTarget | None:
        if overrides is None:
            return None
        values = {
            "regional_domain_name": "d-1.execute-api.eu-west-1.amazonaws.com",
            "regional_hosted_zone_id": "ZREGIONAL1",
            "set_identifier": "same",
            "health_check": check,
            **overrides,
        }
        return FailoverTarget(**values)

    with pytest.raises(ValueError, match=message):
        FailoverRecordsProps(
            zone=zone, record_name=DOMAIN, primary=target(primary), secondary=target(secondary)
        )


# --- Configuration ---


def config_from(context: dict[str, Any]) -> AppConfig:
    return AppConfig.from_context(cdk.App(context=context).node)


def test_websocket_defaults_synth_without_a_domain():
    config = config_from({})
    assert config.ws_custom_domain is False
    assert config.jwt_placeholders == ("jwt_issuer", "jwt_jwks_url")
    assert config.canary_signing_key_secret_name is None
    assert config.canary_healthy_runs_to_recover == 5
    assert (config.ws_state_table_name, config.ws_connections_table_name) == (
        model.DEFAULT_WSAPI_STATE_TABLE_NAME,
        model.DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME,
    )


def test_every_domain_setting_is_read_from_context():
    config = config_from(DOMAIN_CONTEXT)
    assert config.ws_custom_domain is True
    assert (config.ws_domain_name, config.hosted_zone_id, config.hosted_zone_name) == (
        DOMAIN,
        ZONE_ID,
        ZONE_NAME,
    )
    assert config.ws_certificate_arn_secondary == CERT_SECONDARY
    assert config.jwt_placeholders == ()


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        ({"ws_domain_name": None}, "ws_domain_name", "required with"),
        ({"ws_certificate_arn_secondary": None}, "ws_certificate_arn_secondary", "required"),
        ({"ws_domain_name": "ws.example.net"}, "ws_domain_name", "not in the hosted zone"),
        ({"ws_domain_name": "WS.example.com"}, "ws_domain_name", "lower-case DNS name"),
        ({"hosted_zone_id": "abc"}, "hosted_zone_id", "Z"),
        ({"ws_certificate_arn_primary": "arn:x"}, "ws_certificate_arn_primary", "ACM"),
        ({"ws_certificate_arn_primary": CERT_SECONDARY}, "ws_certificate_arn_primary", "own"),
        (
            {"canary_signing_key_secret_name": None, "canary_public_keys": None},
            "canary_signing_key_secret_name",
            "never",
        ),
        ({"canary_public_keys": None}, "canary_public_keys", "required with"),
        (
            {"canary_public_keys": '{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}'},
            "canary_public_keys",
            "public keys only",
        ),
        ({"canary_public_keys": "not a key"}, "canary_public_keys", "public keys only"),
        ({"canary_signing_key_secret_name": None}, "canary_public_keys", "only used with"),
        (
            {"canary_signing_key_secret_name": "arn:aws:secretsmanager:x"},
            "canary_signing_key_secret_name",
            "not an ARN",
        ),
        ({"canary_token_transport": "header"}, "canary_token_transport", "subprotocol, query"),
        ({"jwt_jwks_url": "http://login.example.org/jwks"}, "jwt_jwks_url", "https"),
        ({"jwt_issuer": " "}, "jwt_issuer", "required"),
        ({"ws_api_burst_limit": 0}, "ws_api_burst_limit", "at least 1"),
        ({"ws_state_home_region": "eu-west-1"}, "ws_state_home_region", "must be the primary"),
        (
            {"ws_state_home_region": "us-east-1", "demo_auction": False},
            "ws_state_home_region",
            "only used with streamfleet:demo_auction",
        ),
        ({"demo_auction": "maybe"}, "demo_auction", "expected true or false"),
        (
            {"ws_state_table_name": model.DEFAULT_LEASE_TABLE_NAME},
            "ws_state_table_name",
            "must differ from streamfleet:lease_table_name",
        ),
    ],
)
def test_websocket_settings_are_validated_naming_the_context_key(overrides, key, message):
    context = {**DOMAIN_CONTEXT, **{context_key(k): v for k, v in overrides.items()}}
    context = {k: v for k, v in context.items() if v is not None}
    with pytest.raises(ValueError, match=rf"^{context_key(key)}: .*{message}"):
        config_from(context)


# --- Props validation ---


def construct_stack() -> cdk.Stack:
    return cdk.Stack(cdk.App(), "T", env=cdk.Environment(account=TEST_ACCOUNT, region="eu-west-1"))


def jwt_settings(**overrides: Any) -> JwtSettings:
    values = {"issuer": "https://i.example.com/", "audience": "a", "jwks_url": None, **overrides}
    if values["jwks_url"] is None and "keys" not in overrides:
        values["jwks_url"] = "https://i.example.com/jwks.json"
    return JwtSettings(**values)


def websocket_props(tables: WebSocketTables, **overrides: Any) -> WebSocketApiProps:
    return WebSocketApiProps(
        state_table=tables.state_table,
        connections_table=tables.connections_table,
        jwt=jwt_settings(),
        **overrides,
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"jwks_url": "https://i.example.com/j", "keys": "{}"}, "exactly one"),
        ({"issuer": ""}, "JWT_ISSUER"),
        ({"jwks_url": "http://i.example.com/j"}, "https"),
        ({"leeway_seconds": 301.0}, "JWT_LEEWAY_SECONDS"),
    ],
)
def test_jwt_settings_are_checked_by_the_authorizers_own_rules(overrides, message):
    with pytest.raises(ValueError, match=f"^jwt: .*{message}"):
        jwt_settings(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stage_name": "v-1"}, "^stage_name: "),
        ({"throttling_rate_limit": 0}, "^throttling_rate_limit: "),
        ({"identity_source": "route.request.querystring.token"}, "^identity_source: .*string"),
        ({"identity_source": ("$request.header.Auth",)}, "^identity_source: "),
        ({"handler_timeout": cdk.Duration.seconds(30)}, "^handler_timeout: "),
        ({"connection_ttl_seconds": 0}, "^connection_ttl_seconds: "),
    ],
)
def test_websocket_api_props_are_validated(overrides, message):
    stack = construct_stack()
    tables = WebSocketTables(stack, "Tables", props=WebSocketTablesProps())
    with pytest.raises(ValueError, match=message):
        websocket_props(tables, **overrides)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"entry": "handler"}, "entry: expected module.function"),
        ({"routes": "bid"}, "routes: expected a tuple"),
        ({"routes": ("subscribe",)}, "routes: 'subscribe' is a core route"),
        ({"routes": ("$default",)}, "routes: '$default' is a core route"),
        ({"routes": ("x", "x")}, "routes: a route appears twice"),
        ({"environment": {"STATE_TABLE_NAME": "t"}}, "environment: STATE_TABLE_NAME is the core's"),
    ],
)
def test_a_handler_extension_is_validated(spec, message):
    with pytest.raises(ValueError, match=f"^handler_extension: {re.escape(message)}"):
        HandlerExtension(**{"entry": "mine.handler.handler", **spec})


def test_an_extension_adds_its_routes_environment_and_grants_and_nothing_else():
    stack = construct_stack()
    tables = WebSocketTables(stack, "Tables", props=WebSocketTablesProps())
    granted = []
    extension = HandlerExtension(
        entry=auction_names.HANDLER_ENTRY,
        packages={PACKAGE_NAME: PACKAGE_DIR},
        routes=("vote",),
        environment={"VOTES": "on"},
        grant=granted.append,
    )
    api = WebSocketApi(
        stack, "WebSocket", props=websocket_props(tables, handler_extension=extension)
    )
    assert granted == [api]
    assert set(api.routes) == {"$connect", "$disconnect", "$default", *model.WS_ROUTES, "vote"}
    handler = Template.from_stack(stack).to_json()["Resources"][logical_id(stack, api.handler)]
    assert handler["Properties"]["Handler"] == auction_names.HANDLER_ENTRY
    assert handler["Properties"]["Environment"]["Variables"]["VOTES"] == "on"
    # Without one: the core's entry point and routes.
    core_stack = construct_stack()
    core_tables = WebSocketTables(core_stack, "Tables", props=WebSocketTablesProps())
    core = WebSocketApi(core_stack, "WebSocket", props=websocket_props(core_tables))
    assert set(core.routes) == {"$connect", "$disconnect", "$default", *model.WS_ROUTES}
    core_handler = Template.from_stack(core_stack).to_json()["Resources"][
        logical_id(core_stack, core.handler)
    ]
    assert core_handler["Properties"]["Handler"] == websocket_api.HANDLER_ENTRY


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"token_transport": "cookie"}, "^token_transport: "),
        ({"healthy_runs_to_recover": 0}, "^healthy_runs_to_recover: "),
        ({"probe_timeout": cdk.Duration.seconds(60)}, "^probe_timeout: "),
    ],
)
def test_canary_props_are_validated(overrides, message):
    stack = construct_stack()
    tables = WebSocketTables(stack, "Tables", props=WebSocketTablesProps())
    websocket = WebSocketApi(stack, "Ws", props=websocket_props(tables))
    with pytest.raises(ValueError, match=message):
        WebSocketCanaryProps(
            api=websocket.api,
            stage=websocket.stage,
            state_table=tables.connections_table,
            jwt_audience="a",
            **overrides,
        )


def test_the_canary_may_leave_the_regions_clients_connected():
    stack = construct_stack()
    tables = WebSocketTables(stack, "Tables", props=WebSocketTablesProps())
    websocket = WebSocketApi(stack, "Ws", props=websocket_props(tables))
    canary = canary_construct.WebSocketCanary(
        stack,
        "Canary",
        props=WebSocketCanaryProps(
            api=websocket.api,
            stage=websocket.stage,
            state_table=tables.connections_table,
            jwt_audience="a",
            disconnect_when_unhealthy=False,
        ),
    )
    template = Template.from_stack(stack)
    variables = variables_of(function_of(template, stack, canary.function))
    assert variables[model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY] == "false"
    grants = role_grants(template, logical_id(stack, canary.role))
    assert "dynamodb:Scan" not in set().union(*grants.values())
    assert not any("DELETE/@connections" in resource for resource in grants)


def test_canary_public_keys_must_be_public():
    with pytest.raises(ValueError, match=r"^jwt: JWT_CANARY_KEYS: .*public keys only"):
        jwt_settings(canary_keys='{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}')
    assert jwt_settings(canary_keys=CANARY_PUBLIC_KEYS).environment()["JWT_CANARY_KEYS"] == (
        CANARY_PUBLIC_KEYS
    )


def test_static_keys_must_be_public():
    # The authorizer takes a shared secret in JWT_KEYS for local use; a stack never holds one.
    with pytest.raises(ValueError, match=r"^jwt: JWT_KEYS: .*public keys only"):
        jwt_settings(keys='{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}')
    assert jwt_settings(keys=CANARY_PUBLIC_KEYS).environment()["JWT_KEYS"] == CANARY_PUBLIC_KEYS


def test_tables_props_are_validated():
    with pytest.raises(ValueError, match=r"^replica_regions: only the stack"):
        WebSocketTablesProps(declare_state_table=False, replica_regions=("us-west-2",))
    with pytest.raises(ValueError, match=r"^connections_table_name: must differ"):
        WebSocketTablesProps(state_table_name="same", connections_table_name="same")
    with pytest.raises(ValueError, match=r"^subscriptions_table_name: must differ"):
        WebSocketTablesProps(connections_table_name="same", subscriptions_table_name="same")
    # Another Region finds the replica by the name the primary gave it: no name, no replica.
    with pytest.raises(ValueError, match=r"^state_table_name: required where"):
        WebSocketTablesProps(declare_state_table=False)


def test_a_custom_domain_is_validated():
    stack = construct_stack()
    certificate = acm.Certificate.from_certificate_arn(
        stack, "Certificate", "arn:aws:acm:us-east-1:123456789012:certificate/abc"
    )
    with pytest.raises(ValueError, match=r"^certificate: expected an ACM certificate"):
        CustomDomain(domain_name="ws.example.org", certificate=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^domain_name: expected a DNS name"):
        CustomDomain(domain_name="", certificate=certificate)


def test_tables_reference_the_state_replica_by_name():
    stack = construct_stack()
    tables = WebSocketTables(
        stack,
        "Tables",
        props=WebSocketTablesProps(
            declare_state_table=False,
            state_table_name="ws-state",
            connections_table_name="ws-connections",
            subscriptions_table_name="ws-subscriptions",
        ),
    )
    assert stack.resolve(tables.state_table.table_name) == "ws-state"
    assert declared_table_names(Template.from_stack(stack)) == {
        "ws-connections",
        "ws-subscriptions",
    }


# --- The app ---


def test_app_py_adds_the_fleet_and_the_websocket_stacks(monkeypatch):
    synthesized: list[cdk.App] = []
    monkeypatch.setattr(cdk.App, "synth", lambda self, *args, **kwargs: synthesized.append(self))
    app_module.main()
    (app,) = synthesized
    names = sorted(child.stack_name for child in app.node.children if isinstance(child, cdk.Stack))
    assert names == sorted(
        [PRIMARY_STACK_NAME, SECONDARY_STACK_NAME, PRIMARY_WS_STACK_NAME, SECONDARY_WS_STACK_NAME]
    )


# --- cdk-nag and cfn-lint ---


def violations(report: Any) -> list[str]:
    return [
        f"{violation.rule_name} at {resource.construct_path}"
        for violation in report.violations
        for resource in violation.violating_resources
    ]


def acknowledgments(stack: cdk.Stack) -> dict[str, str]:
    found: dict[str, str] = {}
    for construct in stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for key, reason in entry.data.items():
                    rule = key.split("::", 1)[-1]
                    if rule.startswith(f"{AWS_SOLUTIONS}-"):
                        found[rule] = reason
    return found


def generalized(rule: str) -> str:
    """An IAM5 finding on an execute-api ARN, without the ARN's Region, account and API."""
    prefix = f"{AWS_SOLUTIONS}-IAM5[Resource::arn:aws:execute-api:"
    return f"{prefix}...]" if rule.startswith(prefix) else rule


@pytest.mark.parametrize("which", ["default", "domain"])
def test_no_unacknowledged_aws_solutions_finding(which):
    app = (default_websocket_app() if which == "default" else domain_websocket_app()).app
    report = AwsSolutionsChecks().validate_scope(app)
    assert violations(report) == []
    assert report.success is True


def test_every_acknowledgment_is_expected_and_gives_a_specific_reason(built, with_domain):
    for app in (built, with_domain):
        for stack in app.stacks:
            acknowledged = acknowledgments(stack)
            assert {generalized(rule) for rule in acknowledged} == EXPECTED_ACKNOWLEDGMENTS
            for rule, reason in acknowledged.items():
                assert len(reason) >= MIN_REASON_CHARS, (rule, reason)


def test_every_acknowledgment_is_specific(built):
    # The ManageConnections acknowledgment names this API's stage ARN, nothing broader.
    for stack in built.stacks:
        api_id = logical_id(stack, stack.websocket.api)
        stage = f"arn:aws:execute-api:{stack.region}:{TEST_ACCOUNT}:<{api_id}>/v1"
        for method in ("POST", "DELETE"):  # the handler's replies, the canary's disconnects
            arn = f"{stage}/{method}/@connections/*"
            assert f"{AWS_SOLUTIONS}-IAM5[Resource::{arn}]" in acknowledgments(stack)
        assert f"{AWS_SOLUTIONS}-IAM5" not in acknowledgments(stack)


def test_every_acknowledgment_is_still_needed(monkeypatch):
    """Without the acknowledgments, exactly the acknowledged rules are reported."""
    for module in (websocket_api, canary_construct, live_delivery):
        monkeypatch.setattr(module, "acknowledge", lambda *args, **kwargs: None)
    report = AwsSolutionsChecks().validate_scope(build_websocket_app(DOMAIN_CONTEXT).app)
    reported = {generalized(violation.rule_name) for violation in report.violations}
    assert reported == EXPECTED_ACKNOWLEDGMENTS


@pytest.mark.parametrize("which", ["default", "domain"])
@pytest.mark.parametrize("role", ["primary", "secondary"])
def test_cfn_lint_is_clean(which, role):
    built = default_websocket_app() if which == "default" else domain_websocket_app()
    stack = getattr(built, role)
    matches = lint_file(
        built.template_file(stack),
        # W3005: CDK's explicit DependsOn on a Lambda's role next to the GetAtt (see the fleet's).
        ManualArgs(regions=[stack.region], ignore_checks=["W3005"]),
    )
    assert [str(match) for match in matches] == []


# --- Snapshots ---


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("which", ["default", "domain"])
@pytest.mark.parametrize("role", ["primary", "secondary"])
def test_template_matches_snapshot(which, role, snapshot_json):
    built = default_websocket_app() if which == "default" else domain_websocket_app()
    template = built.template(getattr(built, role)).to_json()
    assert mask_asset_hashes(template) == snapshot_json


# --- The Lambda target's wheel tags ---


@pytest.mark.parametrize(
    ("tags", "accepted"),
    [
        (("cp311-abi3-manylinux_2_34_aarch64",), True),  # abi3 from 3.11 loads on 3.14
        (("cp311-abi3-manylinux_2_34_x86_64",), False),  # the synth venv's: wrong CPU
        (("cp314-cp314-manylinux_2_35_aarch64",), False),  # needs glibc 2.35; AL2023 has 2.34
        (("cp314-cp314-manylinux2014_aarch64.manylinux_2_17_aarch64",), True),
        (("cp311-cp311-manylinux_2_17_aarch64",), False),  # a cp311-only extension
        (("cp314-cp314-linux_aarch64",), False),  # not a manylinux wheel
        (("py3-none-any",), True),
        (("cp314-cp314-manylinux_2_39_aarch64", "cp314-cp314-manylinux_2_28_aarch64"), True),
    ],
)
def test_the_lambda_target_accepts_only_wheels_it_can_load(tags, accepted):
    assert assets.LAMBDA_TARGET.accepts(tags) is accepted
