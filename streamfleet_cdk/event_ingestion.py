"""START/STOP events in: a REST API, the event router Lambda and the fleet's notification queue.

``POST /events`` and ``GET /connections/{connection_id}`` (paths, fields and the handler are read
from :mod:`streamfleet.event_router`, the code that serves them) reach one Lambda, the only
writer of ``desired_state``. When a START makes a connection claimable, the router sends one
notification (:func:`streamfleet.model.notification_body`) to the queue the workers poll, so a
peer claims it within a second instead of at its next orphan scan.

Who may call the API is decided twice: IAM (SigV4) authorization on every method, and a resource
policy that names the principals allowed to invoke it (``invoke_principals``, plus whoever
:meth:`EventIngestion.grant_invoke` is given) and denies everyone else, so a principal of the
account whose own IAM policy happens to allow ``execute-api:Invoke`` on ``*`` still cannot
START or STOP streams unless it is named here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import jsii
from aws_cdk import Duration, IStableListProducer, Lazy, Names, RemovalPolicy, Stack, Token
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from streamfleet import event_router, model, validation
from streamfleet_cdk import at_rest
from streamfleet_cdk.functions import (
    DEFAULT_LOG_LEVEL,
    INVOKED_SYNCHRONOUSLY,
    check_log_level,
    check_reserved_concurrency,
    function_alarms,
    python_function,
)
from streamfleet_cdk.nag import acknowledge, skip_checkov
from streamfleet_cdk.upstreams import allowed_upstreams_env, check_allowed_upstreams

ROUTER_HANDLER = f"{event_router.handler.__module__}.{event_router.handler.__name__}"

# API Gateway gives up on an integration after 29 s; the router must answer before that.
MAX_ROUTER_TIMEOUT_SECONDS = 29
REST_API_NAME_MAX_CHARS = 128  # the derived name's length, well within API Gateway's limit
# Fleet notifications are claimed within a second or two; 30 s leaves room for a slow receive.
QUEUE_VISIBILITY_TIMEOUT = Duration.seconds(30)
DEAD_LETTER_RETENTION = Duration.days(14)

JSON_CONTENT_TYPE = "application/json"
# The router's own rule for connection ids (validation.check_id), as a JSON-schema pattern.
# Ids are ASCII, so characters and bytes count alike.
CONNECTION_ID_SCHEMA_PATTERN = (
    f"^{validation.ID_PATTERN.pattern.removesuffix('+')}{{1,{validation.MAX_ID_BYTES}}}$"
)

INVOKE_ACTION = "execute-api:Invoke"
# An IAM role or user ARN (``*`` allowed in the name: ``role/producer-*``), an account's root
# ARN, or a 12-digit account id (every principal of that account).
PRINCIPAL_ARN_PATTERN = re.compile(
    r"arn:aws[a-z-]*:iam::(?P<account>\d{12}):(?P<name>root|(role|user)/[\w+=,.@/*-]+)"
)
ACCOUNT_ID_PATTERN = re.compile(r"\d{12}")

ROUTER_ACTIONS = {
    "lease_table": ("dynamodb:GetItem", "dynamodb:UpdateItem"),
    "queue": ("sqs:SendMessage",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
}


@dataclass(frozen=True, kw_only=True)
class EventIngestionProps:
    """How :class:`EventIngestion` is built.

    Attributes:
        lease_table: the lease table (or its local replica); the router reads and updates
            connection rows in it, nothing else.
        allowed_upstreams: ``scheme://host[:port]`` entries the router accepts in a START's
            ``ws_url`` (``*.`` prefixes a domain wildcard); the workers enforce the same list.
        iam_auth: require IAM (SigV4) authorization on every method (on by default). Turning it
            off leaves the API open to anyone who knows its URL; cdk-nag then reports APIG4 (on
            purpose).
        throttling_rate_limit: stage-wide steady-state requests per second; 50 by default.
        throttling_burst_limit: stage-wide burst, in requests; 100 by default.
        stage_name: the API's stage (the first path segment of its URL); ``v1`` by default.
        tracing: X-Ray active tracing of the router too (off by default). The stage itself
            always traces: with X-Ray's default sampling rule, the first request of each second
            and 5% of the rest, so the stage's throttle bounds what its traces can cost.
        execution_logging_level: API Gateway execution logging (``ERROR``, the default, or
            ``INFO``; ``None`` turns it off). Like the access logs (always on), it is written
            through the Region's API Gateway CloudWatch role (see
            :class:`~streamfleet_cdk.api_gateway_account.ApiGatewayAccount`). Request and
            response bodies are never logged (no data trace).
        invoke_principals: who may call the API: IAM role or user ARNs (``*`` allowed in the
            name), account root ARNs or account ids. Empty (the default): this account's
            principals, as their IAM policies allow. Named: those principals (and whoever
            :meth:`EventIngestion.grant_invoke` is given) and nobody else, whatever their IAM
            policies say.
        web_acl_arn: a WAFv2 web ACL (REGIONAL scope) to associate with the stage (``None`` by
            default: none).
        log_retention: how long the router's logs and the API's access logs are kept; one month
            by default.
        log_removal_policy: what happens to those two log groups when they leave the stack or
            the stack is deleted; ``RemovalPolicy.RETAIN`` by default (CloudWatch Logs keeps
            them, for ``log_retention``).
        reserved_concurrency: concurrency reserved for (and the cap of) the router
            (``None``: unreserved).
        log_level: the router's application log level (JSON logs); ``INFO`` by default.
        router_memory_mib: the router's memory (and so its CPU share); 256 MiB by default.
        router_timeout: the router's timeout; at most 29 s (API Gateway's integration limit),
            15 s by default.
        queue: the notification queue to send to, brought by the team (its own dead-letter
            queue, retention and alarms are then the team's); ``None`` (the default) builds
            one, with a dead-letter queue and its alarm. A queue encrypted with a KMS key of
            its own gets the router ``kms:GenerateDataKey`` and ``kms:Decrypt`` on that key.
        queue_retention: how long an unclaimed notification stays in the queue built here
            (1 day by default; not used with a brought ``queue``). Notifications only shorten
            the wait (workers also scan for orphans), so a short retention is safe.
        max_receive_count: receives before a notification moves to the dead-letter queue
            (5 by default; not used with a brought ``queue``).
            A worker that cannot take a notification (full, or stopping) hands it back,
            and that is a receive too: keep it above the number of workers that may stop
            at once (a deployment's batch) plus one, or a notification can reach the DLQ
            (its alarm fires, and the stream waits for a reconcile).
    """

    lease_table: dynamodb.ITableV2
    allowed_upstreams: tuple[str, ...]
    iam_auth: bool = True
    throttling_rate_limit: float = 50.0
    throttling_burst_limit: int = 100
    stage_name: str = "v1"
    tracing: bool = False
    execution_logging_level: apigateway.MethodLoggingLevel | None = (
        apigateway.MethodLoggingLevel.ERROR
    )
    invoke_principals: tuple[str, ...] = ()
    web_acl_arn: str | None = None
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    reserved_concurrency: int | None = None
    log_level: str = DEFAULT_LOG_LEVEL
    router_memory_mib: int = 256
    router_timeout: Duration = field(default_factory=lambda: Duration.seconds(15))
    queue: sqs.IQueue | None = None
    queue_retention: Duration = field(default_factory=lambda: Duration.days(1))
    max_receive_count: int = 5

    def __post_init__(self) -> None:
        check_allowed_upstreams("allowed_upstreams", self.allowed_upstreams)
        if self.throttling_rate_limit <= 0:
            raise ValueError("throttling_rate_limit: must be greater than zero")
        _check_whole("throttling_burst_limit", self.throttling_burst_limit, minimum=1)
        if not self.stage_name or not self.stage_name.replace("_", "").isalnum():
            raise ValueError(f"stage_name: letters, digits and _ only, got {self.stage_name!r}")
        check_invoke_principals("invoke_principals", self.invoke_principals)
        check_reserved_concurrency("reserved_concurrency", self.reserved_concurrency)
        check_log_level("log_level", self.log_level)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)
        _check_whole("router_memory_mib", self.router_memory_mib, minimum=128, maximum=10240)
        timeout = self.router_timeout.to_seconds()
        if not 1 <= timeout <= MAX_ROUTER_TIMEOUT_SECONDS:
            raise ValueError(
                f"router_timeout: {timeout} s is outside 1-{MAX_ROUTER_TIMEOUT_SECONDS} s "
                "(API Gateway stops waiting after 29 s)"
            )
        retention = self.queue_retention.to_seconds()
        if not 60 <= retention <= 14 * 24 * 3600:
            raise ValueError(f"queue_retention: {retention} s is outside SQS's 60 s to 14 days")
        _check_whole("max_receive_count", self.max_receive_count, minimum=1, maximum=1000)


def check_invoke_principals(field: str, value: object) -> tuple[str, ...]:
    """A tuple of IAM role/user ARNs, account root ARNs or account ids; ``ValueError`` naming
    ``field`` otherwise."""
    if isinstance(value, str) or not isinstance(value, tuple):
        raise ValueError(f"{field}: expected a tuple of IAM principal ARNs or account ids")
    for entry in value:
        if not isinstance(entry, str) or not (
            PRINCIPAL_ARN_PATTERN.fullmatch(entry) or ACCOUNT_ID_PATTERN.fullmatch(entry)
        ):
            raise ValueError(
                f"{field}: {entry!r} is not an IAM role or user ARN "
                "(arn:aws:iam::<account>:role/<name>), an account root ARN or an account id"
            )
    if len(set(value)) != len(value):
        raise ValueError(f"{field}: duplicate entry in {value!r}")
    return value


@jsii.implements(IStableListProducer)
class _ArnList:
    """A list that may still grow until synth (``grant_invoke``), rendered when resolved."""

    def __init__(self, values: list[str]) -> None:
        self.values = values

    def produce(self) -> list[str]:
        return list(self.values)


def _check_whole(name: str, value: object, *, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected a whole number, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"at least {minimum}" if maximum is None else f"{minimum}-{maximum}"
        raise ValueError(f"{name}: expected {bounds}, got {value}")


class EventIngestion(Construct):
    """The fleet's front door in one Region: API -> event router -> lease table + queue.

    Every Region gets its own: a START in the standby Region lands in that Region's replica and
    queue, so failing over needs no change to the callers but the API's URL.

    Least privilege is written out, not granted by helpers: the router's role may
    ``GetItem``/``UpdateItem`` on the lease table (not its indexes, not ``Scan``),
    ``SendMessage`` to the queue and write its own log group. Nothing else.

    Attributes:
        queue: the fleet's notification queue: the one built here (SSE-SQS, TLS only), or
            :attr:`EventIngestionProps.queue`.
        dead_letter_queue: where notifications land after ``max_receive_count`` receives;
            ``None`` with a brought queue (its dead-letter queue, if any, is the team's).
        dlq_alarm: in ALARM as soon as one message is in the dead-letter queue; ``None`` with
            a brought queue.
        function: the event router Lambda.
        function_role: the router's execution role.
        function_log_group: the router's log group.
        function_alarms: the router's errors and throttles alarms.
        api: the REST API (with its resource policy).
        server_error_alarm: in ALARM when the API answered 5XX in the last five minutes.
        access_log_group: the API stage's access logs.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: EventIngestionProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.dead_letter_queue: sqs.Queue | None = None
        self.dlq_alarm: cloudwatch.Alarm | None = None
        self.queue: sqs.IQueue
        if props.queue is None:
            self.dead_letter_queue = self._build_dead_letter_queue()
            self.queue = self._build_queue(self.dead_letter_queue)
            self.dlq_alarm = self._build_dlq_alarm()
        else:
            self.queue = props.queue
        self.function_log_group = self._build_log_group("RouterLogs")
        self.function_role = self._build_function_role()
        self.function = self._build_function()
        self.access_log_group = self._build_log_group("AccessLogs")
        self._invoke_arns: list[str] = []
        self.api = self._build_api()
        self._build_resource_policy()
        self._build_routes()
        self._build_web_acl_association()
        self.function_alarms = function_alarms(self, self.function, what="the event router")
        self.server_error_alarm = self._build_server_error_alarm()
        self._acknowledge_findings()
        self._skip_checkov_findings()

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (an IAM role or user) call every method of the API.

        Adds ``execute-api:Invoke`` to the grantee's policy and, when the API is limited to
        named principals, names the grantee in the resource policy too.
        """
        principal = grantee.grant_principal
        arn = getattr(principal, "role_arn", None) or getattr(principal, "user_arn", None)
        if arn is None:
            raise ValueError(
                "grantee: only an IAM role or user can be named in the API's resource policy"
            )
        if self._props.invoke_principals:
            self._invoke_arns.append(self._arn_to_name(principal, arn))
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=[INVOKE_ACTION],
            resource_arns=[self.api.arn_for_execute_api()],
        )

    def _arn_to_name(self, principal: iam.IPrincipal, arn: str) -> str:
        """The grantee's ARN as the resource policy can name it. A role or user of another
        stack is named by the ARN its literal name gives: its ARN attribute would make this
        stack depend on that one, which already depends on this one for the API's ARN in the
        grantee's policy, and CloudFormation refuses the cycle."""
        if not isinstance(principal, Construct) or Stack.of(principal) is Stack.of(self):
            return arn
        kind = "role" if hasattr(principal, "role_arn") else "user"
        resource = principal.node.default_child  # its CfnRole or CfnUser
        name = getattr(resource, f"{kind}_name", None)
        if not isinstance(name, str) or Token.is_unresolved(name):
            raise ValueError(
                f"grantee: {principal.node.path} is in another stack and has no literal name; "
                "give it one (role_name=...) so the API's resource policy can name it"
            )
        path = getattr(resource, "path", None) or "/"
        account = Stack.of(principal).account
        return f"arn:{Stack.of(self).partition}:iam::{account}:{kind}{path}{name}"

    # --- Queue ---

    def _build_dead_letter_queue(self) -> sqs.Queue:
        """Keeps notifications no worker could handle, for 14 days, for inspection."""
        return at_rest.queue(self, "DeadLetterQueue", retention_period=DEAD_LETTER_RETENTION)

    def _build_queue(self, dead_letter_queue: sqs.Queue) -> sqs.Queue:
        """The notification queue; SSE-SQS, so neither the router nor the workers need KMS."""
        return at_rest.queue(
            self,
            "Queue",
            visibility_timeout=QUEUE_VISIBILITY_TIMEOUT,
            retention_period=self._props.queue_retention,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=dead_letter_queue, max_receive_count=self._props.max_receive_count
            ),
        )

    def metric_dead_lettered(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """Notifications in the dead-letter queue (no worker could handle them), the maximum;
        default over 1 minute, as its alarm watches it. Only for the queue built here: a
        brought queue's dead-letter queue is not known to this construct."""
        if self.dead_letter_queue is None:
            raise ValueError("queue: brought by the team; its dead-letter queue is not known here")
        return self.dead_letter_queue.metric_approximate_number_of_messages_visible(
            period=period or Duration.minutes(1), statistic="Maximum"
        )

    def metric_server_errors(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """The API's 5XX answers (a START or STOP may not have been recorded), summed; default
        over 5 minutes, as its alarm watches it."""
        return self.api.metric_server_error(period=period or Duration.minutes(5), statistic="Sum")

    def _build_dlq_alarm(self) -> cloudwatch.Alarm:
        """A dead-lettered notification means workers keep failing on one: worth a look."""
        return cloudwatch.Alarm(
            self,
            "DeadLetterAlarm",
            alarm_description="StreamFleet: notifications reached the dead-letter queue",
            metric=self.metric_dead_lettered(),
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    # --- Router ---

    def _build_log_group(self, construct_id: str) -> logs.LogGroup:
        return at_rest.log_group(
            self,
            construct_id,
            retention=self._props.log_retention,
            removal_policy=self._props.log_removal_policy,
        )

    def _build_function_role(self) -> iam.Role:
        """The router's role with exactly :data:`ROUTER_ACTIONS` (no managed policy)."""
        role = iam.Role(
            self,
            "RouterRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="StreamFleet event router: START/STOP rows and notify the fleet",
        )
        resources = {
            "lease_table": self._props.lease_table.table_arn,
            "queue": self.queue.queue_arn,
            "log_group": self.function_log_group.log_group_arn,
        }
        for name, actions in ROUTER_ACTIONS.items():
            role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=[resources[name]])
            )
        at_rest.grant_queue_key(self.queue, role)
        return role

    def _build_function(self) -> lambda_.Function:
        props = self._props
        return python_function(
            self,
            "Router",
            description="StreamFleet event router: POST /events, GET /connections/{id}",
            handler=ROUTER_HANDLER,
            role=self.function_role,
            log_group=self.function_log_group,
            memory_size=props.router_memory_mib,
            timeout=props.router_timeout,
            reserved_concurrency=props.reserved_concurrency,
            log_level=props.log_level,
            tracing=props.tracing,
            no_dead_letter_queue=INVOKED_SYNCHRONOUSLY,
            environment={
                model.ENV_TABLE_NAME: props.lease_table.table_name,
                model.ENV_QUEUE_URL: self.queue.queue_url,
                model.ENV_ALLOWED_UPSTREAMS: allowed_upstreams_env(props.allowed_upstreams),
            },
        )

    # --- API ---

    def _build_api(self) -> apigateway.RestApi:
        props = self._props
        authorization = (
            apigateway.AuthorizationType.IAM
            if props.iam_auth
            else apigateway.AuthorizationType.NONE
        )
        return apigateway.RestApi(
            self,
            "Api",
            # Unique in the app: the server-error alarm's ApiName dimension then counts this
            # API's errors only, not those of every API of the same name in the Region.
            rest_api_name=Names.unique_resource_name(self, max_length=REST_API_NAME_MAX_CHARS),
            description="StreamFleet: START/STOP upstream connections",
            endpoint_configuration=apigateway.EndpointConfiguration(
                types=[apigateway.EndpointType.REGIONAL]
            ),
            cloud_watch_role=False,
            default_method_options=apigateway.MethodOptions(authorization_type=authorization),
            deploy_options=apigateway.StageOptions(
                stage_name=props.stage_name,
                throttling_rate_limit=props.throttling_rate_limit,
                throttling_burst_limit=props.throttling_burst_limit,
                tracing_enabled=True,
                logging_level=props.execution_logging_level,
                access_log_destination=apigateway.LogGroupLogDestination(self.access_log_group),
                access_log_format=apigateway.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
            ),
        )

    def _build_resource_policy(self) -> None:
        """This account's principals by default; else exactly the named ones (see the props).

        Named principals are matched on ``aws:PrincipalArn`` (a role's sessions carry the role's
        ARN there), in an Allow and in a Deny for everyone else: in the API's own account an
        identity policy alone would otherwise be enough to call it. The account's root user is
        always on the list (nothing can lock it out of its own account anyway).
        """
        props = self._props
        every_method = "execute-api:/*"
        if not props.invoke_principals:
            self.api.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="InvokeFromThisAccount",
                    principals=[iam.AccountRootPrincipal()],
                    actions=[INVOKE_ACTION],
                    resources=[every_method],
                )
            )
            return
        stack = Stack.of(self)
        accounts: list[str] = []
        self._invoke_arns.append(f"arn:{stack.partition}:iam::{stack.account}:root")
        for entry in props.invoke_principals:
            match = PRINCIPAL_ARN_PATTERN.fullmatch(entry)
            if match is None:
                accounts.append(entry)
            elif match["name"] == "root":
                accounts.append(match["account"])
            else:
                self._invoke_arns.append(entry)
        arns = Lazy.list(_ArnList(self._invoke_arns))
        self.api.add_to_resource_policy(
            iam.PolicyStatement(
                sid="InvokeByNamedPrincipals",
                principals=[iam.AnyPrincipal()],
                actions=[INVOKE_ACTION],
                resources=[every_method],
                conditions={"ArnLike": {"aws:PrincipalArn": arns}},
            )
        )
        deny_unless: dict[str, dict[str, object]] = {"ArnNotLike": {"aws:PrincipalArn": arns}}
        if accounts:
            self.api.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="InvokeByNamedAccounts",
                    principals=[iam.AccountPrincipal(account) for account in accounts],
                    actions=[INVOKE_ACTION],
                    resources=[every_method],
                )
            )
            deny_unless["StringNotEquals"] = {"aws:PrincipalAccount": accounts}
        self.api.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyEveryoneElse",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=[INVOKE_ACTION],
                resources=[every_method],
                conditions=deny_unless,
            )
        )

    def _build_server_error_alarm(self) -> cloudwatch.Alarm:
        """A 5XX from the control plane means a START or STOP may not have been recorded."""
        return cloudwatch.Alarm(
            self,
            "ServerErrorAlarm",
            alarm_description="StreamFleet: the events API answered 5XX (router or DynamoDB)",
            metric=self.metric_server_errors(),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _build_event_model(self) -> apigateway.Model:
        """The START/STOP body as JSON schema (draft 4), mirroring the router's own checks.

        API Gateway rejects a malformed body with a 400 before it costs an invocation; the
        router still validates everything (allow-list, URL syntax), the schema is only a filter.
        """
        string = apigateway.JsonSchemaType.STRING
        return self.api.add_model(
            "EventModel",
            content_type=JSON_CONTENT_TYPE,
            description="A START or STOP event",
            schema=apigateway.JsonSchema(
                schema=apigateway.JsonSchemaVersion.DRAFT4,
                title="StreamFleetEvent",
                type=apigateway.JsonSchemaType.OBJECT,
                required=[event_router.EVENT_TYPE, event_router.CONNECTION_ID],
                additional_properties=False,
                properties={
                    event_router.EVENT_TYPE: apigateway.JsonSchema(
                        type=string, enum=[event_router.START, event_router.STOP]
                    ),
                    event_router.CONNECTION_ID: apigateway.JsonSchema(
                        type=string, pattern=CONNECTION_ID_SCHEMA_PATTERN
                    ),
                    event_router.WS_URL: apigateway.JsonSchema(
                        type=string, min_length=1, max_length=validation.MAX_URL_BYTES
                    ),
                    # Each entry's syntax is the router's to check (and name in its 400).
                    event_router.READERS: apigateway.JsonSchema(
                        type=apigateway.JsonSchemaType.ARRAY,
                        max_items=model.MAX_READERS,
                        items=apigateway.JsonSchema(
                            type=string, min_length=1, max_length=model.MAX_READER_CHARS
                        ),
                    ),
                },
                # START needs ws_url; STOP carries neither ws_url nor readers.
                one_of=[
                    apigateway.JsonSchema(
                        properties={
                            event_router.EVENT_TYPE: apigateway.JsonSchema(
                                enum=[event_router.START]
                            )
                        },
                        required=[event_router.WS_URL],
                    ),
                    apigateway.JsonSchema(
                        properties={
                            event_router.EVENT_TYPE: apigateway.JsonSchema(enum=[event_router.STOP])
                        },
                        not_=apigateway.JsonSchema(
                            any_of=[
                                apigateway.JsonSchema(required=[event_router.WS_URL]),
                                apigateway.JsonSchema(required=[event_router.READERS]),
                            ]
                        ),
                    ),
                ],
            ),
        )

    def _build_routes(self) -> None:
        """``POST /events`` (body validated) and ``GET /connections/{connection_id}``."""
        validator = self.api.add_request_validator(
            "RequestValidator", validate_request_body=True, validate_request_parameters=True
        )
        # One permission per method, for the deployed stage only (no test-invoke permission).
        integration = apigateway.LambdaIntegration(self.function, allow_test_invoke=False)
        events = self.api.root.resource_for_path(event_router.EVENTS_RESOURCE)
        events.add_method(
            "POST",
            integration,
            request_validator=validator,
            request_models={JSON_CONTENT_TYPE: self._build_event_model()},
        )
        connection = self.api.root.resource_for_path(event_router.CONNECTION_RESOURCE)
        connection.add_method(
            "GET",
            integration,
            request_validator=validator,
            request_parameters={f"method.request.path.{event_router.CONNECTION_ID}": True},
        )

    def _build_web_acl_association(self) -> None:
        if self._props.web_acl_arn:
            wafv2.CfnWebACLAssociation(
                self,
                "WebAclAssociation",
                resource_arn=self.api.deployment_stage.stage_arn,
                web_acl_arn=self._props.web_acl_arn,
            )

    # --- cdk-nag ---

    def _acknowledge_findings(self) -> None:
        """Each acknowledgment says why the finding does not apply to this API."""
        props = self._props
        if props.iam_auth:
            acknowledge(
                self.api,
                "COG4",
                "Callers are AWS principals (backend services that start and stop streams), "
                "authorized with IAM SigV4 on every method; there are no Cognito end users.",
            )
        if not props.web_acl_arn:
            acknowledge(
                self.api,
                "APIG3",
                "Every method requires IAM SigV4 authorization, so unsigned requests are refused "
                "before any integration runs, and stage throttling bounds signed traffic; pass "
                "web_acl_arn to attach a WAF web ACL where policy requires one.",
            )
        if props.execution_logging_level is None:
            acknowledge(
                self.api,
                "APIG6",
                "Execution logging was turned off by the caller (execution_logging_level=None); "
                "access logs of every request still go to a dedicated log group.",
            )
        if props.tracing:
            acknowledge(
                self.function_role,
                "IAM5[Resource::*]",
                "X-Ray's PutTraceSegments and PutTelemetryRecords support no resource-level "
                "permissions; CDK adds exactly these two actions when tracing is on.",
            )

    # --- checkov ---

    def _skip_checkov_findings(self) -> None:
        skip_checkov(
            self.api.deployment_stage,
            "CKV_AWS_120",
            "No response cache: POST /events is never cached, and GET /connections/{connection_id} "
            "reports a connection's current state, which a cache would serve stale to a caller "
            "checking that its START or STOP took effect. A cache cluster is also billed by the "
            "hour, for a control-plane API that sees few requests.",
        )
