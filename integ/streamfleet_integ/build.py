"""The stacks under test and the assertions that run against them once deployed.

The four stacks come from ``app.py``'s :func:`add_stacks`, the code ``cdk deploy`` runs, with
the run's context (:mod:`streamfleet_integ.settings`); the only change to them is that every
resource is deleted with its stack (tables, log groups), so that the destroy leaves nothing
behind and the next run can create the same names: all but each Region's API Gateway
CloudWatch role, which the app retains on purpose. One more stack, in the primary
Region, holds the probe (:mod:`streamfleet_integ.probe`) and integ-tests' assertion resources.

cdk-nag is not applied here, unlike ``app.py``: the stacks under test are built by the app's
own code, which the gate's nag tests hold to zero unacknowledged findings (this run's settings
change sizes and removal policies, not what nag checks for, though that is not tested on this
app), and the assertion stack is integ-tests' scaffolding (a provider allowed each API it calls
on ``*``, by its design), where nag could only add suppressions for a test account.

The assertions, in order (each waits for the one before):

1. an unsigned ``POST /events`` is refused (403): the API takes signed requests only;
2. the probe STARTs the run's stream through the REST API, signed (a START is idempotent, so
   it is retried while the API or the probe's permissions are not yet in place);
3. the primary's messages table holds a message of that stream (the fleet claimed the START,
   dialled the upstream and stored what it sent);
4. the probe, subscribed through the primary's regional WebSocket URL, receives that stream's
   messages: the replay from the table and a frame the fan-out sent live;
5. the primary's canary alarm is OK and its Route 53 health check healthy (the precondition of
   a failover that means something);
6. the primary's WebSocket handler is throttled to nothing (reserved concurrency 0, as the
   drill does): the canary's heartbeats go unanswered as a client's would;
7. the alarm goes to ALARM and the health check to unhealthy (the PRIMARY record's health);
8. with a custom domain only: the probe, dialling the failover name, is served by the
   secondary Region (its frames say so), live frames included;
9. the handler's concurrency is given back, and the health check is healthy again (fail-back,
   after the canary's healthy streak).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import Duration, RemovalPolicies
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk.integ_tests_alpha import ExpectedResult, IApiCall, IntegTest, Match
from constructs import Construct

from app import add_stacks
from stacks import FleetStack, WebSocketApiStack
from streamfleet import model
from streamfleet_cdk.canary import CANARY_DISTRIBUTIONS
from streamfleet_cdk.config import AppConfig
from streamfleet_cdk.functions import python_function
from streamfleet_integ.settings import ASSERTIONS_STACK_NAME, IntegSettings, check_config

INTEG_TEST_ID = "StreamFleetInteg"
RETAINED_ROLE_TYPE = "AWS::IAM::Role"
PACKAGE_NAME = "streamfleet_integ"
PACKAGE_DIR = Path(__file__).resolve().parent
PROBE_HANDLER = f"{PACKAGE_NAME}.probe.handler"
# The probe listens for a live frame this long; integ-tests' provider gives an invoke 2 minutes.
PROBE_LISTEN_SECONDS = 45
PROBE_TIMEOUT = Duration.seconds(90)

# How long each waiting assertion may take. A first deploy's canary needs its datapoints and,
# after the failures of its first minutes, its healthy streak; DNS needs the record's TTL.
WAIT_INTERVAL = Duration.seconds(30)
# The probe's role and the API's first deployment may need a moment after the stacks are up.
STARTED_WITHIN = Duration.minutes(5)
STORED_WITHIN = Duration.minutes(10)
DELIVERED_WITHIN = Duration.minutes(10)
HEALTHY_WITHIN = Duration.minutes(25)
FAILED_OVER_WITHIN = Duration.minutes(10)
SERVED_BY_SECONDARY_WITHIN = Duration.minutes(15)
FAILED_BACK_WITHIN = Duration.minutes(20)

STATUS_PATH = "HealthCheckObservations.0.StatusReport.Status"


@dataclass(frozen=True)
class IntegApp:
    """What :func:`build` added to the app."""

    config: AppConfig
    fleet: tuple[FleetStack, FleetStack]
    websocket: tuple[WebSocketApiStack, WebSocketApiStack]
    assertions_stack: cdk.Stack
    probe: Probe
    test: IntegTest

    @property
    def stacks_under_test(self) -> list[cdk.Stack]:
        return [*self.fleet, *self.websocket]


class Probe(Construct):
    """The probe function, allowed to START on the primary's API and to read the user key."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: IntegSettings,
        config: AppConfig,
        fleet: FleetStack,
    ) -> None:
        super().__init__(scope, construct_id)
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        log_group = logs.LogGroup(
            self, "Logs", retention=config.log_retention, removal_policy=cdk.RemovalPolicy.DESTROY
        )
        log_group.grant_write(role)
        # IAM only, one way: naming this role in the API's resource policy would make the fleet
        # stack depend on this one, which already depends on it for the API's URL.
        api = fleet.ingestion.api
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["execute-api:Invoke"],
                resources=[
                    api.arn_for_execute_api("POST", "/events", api.deployment_stage.stage_name)
                ],
            )
        )
        secretsmanager.Secret.from_secret_name_v2(
            self, "UserKey", settings.user_key_secret_name
        ).grant_read(role)
        environment = {
            "API_URL": api.url,
            "CONNECTION_ID": settings.connection_id,
            "UPSTREAM_URL": settings.upstream_url,
            "SUBJECT": settings.subject,
            "USER_KEY_SECRET_NAME": settings.user_key_secret_name,
            "JWT_ISSUER": config.jwt_issuer,
            "JWT_AUDIENCE": config.jwt_audience,
            "LISTEN_SECONDS": str(PROBE_LISTEN_SECONDS),
        }
        if settings.user_key_id is not None:
            environment["USER_KEY_ID"] = settings.user_key_id
        self.function = python_function(
            self,
            "Function",
            description="StreamFleet integration test: STARTs a stream, subscribes to it",
            handler=PROBE_HANDLER,
            role=role,
            log_group=log_group,
            environment=environment,
            timeout=PROBE_TIMEOUT,
            no_dead_letter_queue=(
                "Invoked synchronously only, by the integration test's assertions, which read "
                "its answer; there is no asynchronous invocation to keep."
            ),
            # What the canary carries to mint and present a token: websockets, PyJWT, cryptography.
            distributions=CANARY_DISTRIBUTIONS,
            packages={PACKAGE_NAME: PACKAGE_DIR},
        )


def build(app: cdk.App, settings: IntegSettings) -> IntegApp:
    """The app's four stacks, the probe's stack and the :class:`IntegTest` with its assertions."""
    config = AppConfig.from_context(app.node)
    check_config(config)
    fleet, websocket = add_stacks(app)
    under_test = [*fleet, *websocket]
    for stack in under_test:
        # Roles keep their own policy: every role is deleted with its stack but each Region's
        # API Gateway CloudWatch role, which the account setting goes on pointing at (the app
        # retains it on purpose; deleting it would break the logging of every other stage).
        RemovalPolicies.of(stack).destroy(exclude_resource_types=[RETAINED_ROLE_TYPE])
    stack = cdk.Stack(
        app,
        ASSERTIONS_STACK_NAME,
        env=cdk.Environment(account=config.account, region=config.primary_region),
        description="StreamFleet integration test: the probe and the assertions",
    )
    probe = Probe(stack, "Probe", settings=settings, config=config, fleet=fleet[0])
    test = IntegTest(
        app,
        INTEG_TEST_ID,
        test_cases=under_test,
        assertion_stack=stack,
        # No committed snapshot to deploy first (it would hold the tester's own settings), and
        # a second full deployment would double a run that already takes most of an hour.
        stack_update_workflow=False,
    )
    built = IntegApp(config, fleet, websocket, stack, probe, test)
    _chain(_assertions(built, settings))
    return built


def _chain(calls: list[IApiCall]) -> None:
    for before, after in itertools.pairwise(calls):
        before.next(after)


def _payload(**fields: str) -> str:
    """The probe's event as JSON text. Not ``Stack.to_json_string``: the provider JSON-encodes
    each parameter at synth, and a token standing for a whole JSON document would be inserted
    into those quotes unescaped; a token inside this text (a URL) is only a string."""
    return json.dumps(fields, separators=(",", ":"))


def _probe_answer(**expected: object) -> ExpectedResult:
    """The probe's JSON answer (Lambda's ``Payload``, a string) holds ``expected``."""
    return ExpectedResult.object_like(
        {"Payload": Match.serialized_json(Match.object_like(expected))}
    )


def _assertions(built: IntegApp, settings: IntegSettings) -> list[IApiCall]:
    config, assertions = built.config, built.test.assertions
    primary_fleet, _ = built.fleet
    primary_ws, _ = built.websocket
    probe = built.probe.function.function_name
    handler = primary_ws.websocket.handler.function_name
    health_check = primary_ws.canary.health_check.health_check_id
    alarm = primary_ws.canary.alarm.alarm_name

    def wait(call: IApiCall, within: Duration) -> IApiCall:
        return call.wait_for_assertions(total_timeout=within, interval=WAIT_INTERVAL)

    def health(status: str, within: Duration) -> IApiCall:
        call = assertions.aws_api_call(
            "Route53", "getHealthCheckStatus", {"HealthCheckId": health_check}
        )
        call.assert_at_path(STATUS_PATH, ExpectedResult.string_like_regexp(f"^{status}"))
        return wait(call, within)

    def alarm_in(state: str, within: Duration) -> IApiCall:
        call = assertions.aws_api_call(
            "CloudWatch", "describeAlarms", {"AlarmNames": [alarm], "StateValue": state}
        )
        # One alarm is named: the list holds it, in that state, or nothing.
        call.expect(ExpectedResult.object_like({"MetricAlarms": [{"StateValue": state}]}))
        return wait(call, within)

    unsigned = assertions.http_api_call(
        f"{primary_fleet.ingestion.api.url}events",
        method="POST",
        headers={"Content-Type": "application/json"},
        body='{"event_type": "STOP", "connection_id": "unsigned"}',
    )
    unsigned.expect(ExpectedResult.object_like({"status": 403}))

    started = assertions.invoke_function(function_name=probe, payload=_payload(action="start"))
    started.expect(_probe_answer(accepted=True))

    stored = assertions.aws_api_call(
        "DynamoDB",
        "query",
        {
            "TableName": primary_fleet.messages_table.table_name,
            "KeyConditionExpression": f"{model.PK} = :pk",
            "ExpressionAttributeValues": {
                ":pk": {"S": model.connection_pk(settings.connection_id)}
            },
            "Limit": 1,
        },
    )
    stored.expect(ExpectedResult.object_like({"Count": 1}))

    delivered = assertions.invoke_function(
        function_name=probe,
        payload=_payload(action="subscribe", url=primary_ws.websocket.stage.url),
    )
    delivered.expect(
        _probe_answer(subscribed=True, replayed=True, live=True, region=config.primary_region)
    )

    throttled = assertions.aws_api_call(
        "Lambda",
        "putFunctionConcurrency",
        {"FunctionName": handler, "ReservedConcurrentExecutions": 0},
    )
    restored = (
        assertions.aws_api_call("Lambda", "deleteFunctionConcurrency", {"FunctionName": handler})
        if config.ws_handler_reserved_concurrency is None
        else assertions.aws_api_call(
            "Lambda",
            "putFunctionConcurrency",
            {
                "FunctionName": handler,
                "ReservedConcurrentExecutions": config.ws_handler_reserved_concurrency,
            },
        )
    )

    calls = [
        unsigned,
        wait(started, STARTED_WITHIN),
        wait(stored, STORED_WITHIN),
        wait(delivered, DELIVERED_WITHIN),
        alarm_in("OK", HEALTHY_WITHIN),
        health("Success", HEALTHY_WITHIN),
        throttled,
        alarm_in("ALARM", FAILED_OVER_WITHIN),
        health("Failure", FAILED_OVER_WITHIN),
    ]
    if config.ws_custom_domain:
        by_name = assertions.invoke_function(
            function_name=probe,
            payload=_payload(action="subscribe", url=f"wss://{config.ws_domain_name}"),
        )
        by_name.expect(_probe_answer(subscribed=True, live=True, region=config.secondary_region))
        calls.append(wait(by_name, SERVED_BY_SECONDARY_WITHIN))
    calls += [restored, health("Success", FAILED_BACK_WITHIN)]
    return calls
