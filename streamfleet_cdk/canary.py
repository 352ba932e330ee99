"""The WebSocket API's health, as Route 53 sees it: canary -> metric -> alarm -> health check.

Every minute an EventBridge rule runs the canary (:mod:`streamfleet.wsapi.canary`). It dials the
stage's *regional* URL (never the failover name: it must judge this Region whatever DNS says),
sends a heartbeat, and publishes ``App/WebSocketHealth`` (dimension ``ApiId``): 1 healthy, 0 not.
A CloudWatch alarm watches that metric and a Route 53 health check of type
``CLOUDWATCH_METRIC`` follows the alarm; the PRIMARY failover record carries that health check.

Route 53 evaluates only plain alarms: standard resolution, no M-of-N, no metric math. So the
alarm is 2 of 2 one-minute datapoints, and missing data is *breaching* (a canary that stopped
running, or a Region that cannot publish, must fail over too); the health check treats an alarm
with insufficient data as unhealthy (CDK's default would keep the last known status).

Failing back is slower than failing over, and that asymmetry lives in the canary itself: once
it has failed ``ALARM_DATAPOINTS`` times in a row it keeps reporting 0 until
``healthy_runs_to_recover`` consecutive probes succeeded (``CANARY_HEALTHY_RUNS_TO_RECOVER``),
keeping its streaks in the Region's connections table (``CANARY#<api id>``).

The canary authenticates like a client, with a short-lived token it mints from a signing key in
Secrets Manager; the authorizer must trust the matching public key (publish it in the JWKS).
Its bundle holds ``websockets``, and ``PyJWT`` with ``cryptography`` to sign RS256/ES256
tokens, built (like every function's) for Python 3.14 on arm64.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_route53 as route53
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from streamfleet import model
from streamfleet.wsapi import canary as canary_runtime
from streamfleet.wsapi.canary import config as canary_config
from streamfleet.wsapi.canary import sweeper as canary_sweeper
from streamfleet.wsapi.handshake import TokenTransport
from streamfleet_cdk import at_rest
from streamfleet_cdk.functions import (
    DEFAULT_LOG_LEVEL,
    check_log_level,
    check_reserved_concurrency,
    function_alarms,
    python_function,
)
from streamfleet_cdk.nag import acknowledge, nag_text
from streamfleet_cdk.websocket_api import check_public_keys

CANARY_DISTRIBUTIONS = ("websockets", "PyJWT", "cryptography")
CANARY_ENTRY = f"{canary_runtime.handler.__module__}.{canary_runtime.handler.__name__}"

SCHEDULE_RATE = Duration.minutes(1)
ALARM_PERIOD = Duration.minutes(1)  # standard resolution, as Route 53 requires
ALARM_DATAPOINTS = 2  # 2 of 2: Route 53 ignores M-of-N alarms
ALARM_STATISTIC = "Minimum"  # one datapoint a minute; a retried run's 0 still counts
HEALTHY_THRESHOLD = 1  # the metric is 1 (healthy) or 0: alarm when below 1
# checkov CKV_AWS_116.
NO_DEAD_LETTER_QUEUE = (
    "Invoked by a one-minute EventBridge schedule, with EventBridge's and Lambda's retries off "
    "on purpose: a probe judges the Region in its own minute, so a failed run kept for later "
    "would report into the wrong datapoint. A run that fails leaves its datapoint missing, which "
    "the health alarm counts as unhealthy, and the canary's errors alarm says it was the canary."
)

CANARY_ACTIONS = {
    "state_table": ("dynamodb:GetItem", "dynamodb:PutItem"),
    # While the Region reports unhealthy, every run closes its client connections: the ids come
    # from a Scan of the connections table (API Gateway cannot list connections), each is
    # closed with DeleteConnection and its record deleted.
    "sweep": ("dynamodb:Scan", "dynamodb:DeleteItem"),
    "disconnect": ("execute-api:ManageConnections",),
    "metrics": ("cloudwatch:PutMetricData",),
    # Its own alarm's state, each run: fail-back waits for a healthy streak after any ALARM.
    "alarm": ("cloudwatch:DescribeAlarms",),
    "signing_key": ("secretsmanager:GetSecretValue",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
}


@dataclass(frozen=True, kw_only=True)
class WebSocketCanaryProps:
    """How :class:`WebSocketCanary` is built.

    Attributes:
        api: the WebSocket API to judge (its id is the metric's ``ApiId``).
        stage: its stage; the canary dials the stage's regional URL.
        domain_name: the API's custom domain in this Region, if it has one (``None`` by
            default: the stage's regional URL is dialled): the canary then dials the domain's
            URL, as users do, but connects to this Region's regional domain name
            (``CANARY_CONNECT_HOST``), so the domain's certificate and mapping are probed here
            whatever DNS answers.
        domain_mapping: the domain's mapping to the stage (``None`` by default); given, the
            canary's function is created after it, so a first deploy never probes a domain not
            yet mapped (and reports its Region unhealthy).
        state_table: where the canary keeps its hysteresis streaks: the Region's connections
            table (per-Region state that must not be replicated), whose client records it also
            reads to close them while the Region is unhealthy.
        jwt_audience: ``aud`` of the tokens the canary mints (its ``iss`` is always
            :data:`streamfleet.model.CANARY_TOKEN_ISSUER`: the canary's own identity).
        signing_key_secret_name: a Secrets Manager secret *in this Region* (a replica, for a
            secret shared by both Regions) holding the canary's private key (PEM or JWK); the
            authorizer must hold its public key (``JwtSettings.canary_keys``). ``None``: the
            canary connects without a token, which the authorizer refuses, so it always reports
            unhealthy: fine for a synth, never for a deployment with failover.
        public_keys: the public key(s) the authorizer accepts for the canary (the same text as
            ``JwtSettings.canary_keys``), given to the canary as ``JWT_CANARY_KEYS``: a signing
            key outside them is then the canary's own fault (it pages and moves no traffic),
            not a failed probe. ``None``: the Region's refusal is the canary's only evidence.
        disconnect_when_unhealthy: while the Region reports unhealthy, close every client
            connection of it each run, so clients that take any frame for "alive" reconnect
            through the failover name (``CANARY_DISCONNECT_WHEN_UNHEALTHY``); on by default.
        token_transport: how the canary presents its token (``subprotocol``, the default, or
            ``query``).
        healthy_runs_to_recover: consecutive healthy probes needed before a failed-over Region
            reports healthy again (fail-back hysteresis, K in the design); 5 by default.
        probe_timeout: how long one probe may take, handshake to pong; 5 s by default.
        reserved_concurrency: concurrency reserved for the canary, so a flood elsewhere in the
            account cannot throttle the probe (which would read as unhealthy and fail the Region
            over). It runs once a minute, so 2 leaves room for a late run overlapping the next
            (``None``: unreserved).
        log_level: application log level (JSON logs); ``INFO`` by default.
        log_retention: retention of the canary's logs; one month by default.
        log_removal_policy: what happens to its log group when it leaves the stack or the
            stack is deleted; ``RemovalPolicy.RETAIN`` by default (CloudWatch Logs keeps it,
            for ``log_retention``).
    """

    api: apigwv2.IWebSocketApi
    stage: apigwv2.WebSocketStage
    state_table: dynamodb.ITableV2
    domain_name: apigwv2.IDomainName | None = None
    domain_mapping: apigwv2.ApiMapping | None = None
    jwt_audience: str
    signing_key_secret_name: str | None = None
    public_keys: str | None = None
    disconnect_when_unhealthy: bool = True
    token_transport: str = TokenTransport.SUBPROTOCOL.value
    healthy_runs_to_recover: int = canary_config.DEFAULT_HEALTHY_RUNS_TO_RECOVER
    probe_timeout: Duration = field(
        default_factory=lambda: Duration.seconds(canary_config.DEFAULT_TIMEOUT_SECONDS)
    )
    reserved_concurrency: int | None = None
    log_level: str = DEFAULT_LOG_LEVEL
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN

    def __post_init__(self) -> None:
        check_reserved_concurrency("reserved_concurrency", self.reserved_concurrency)
        check_log_level("log_level", self.log_level)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)
        if self.token_transport not in tuple(TokenTransport):
            choices = ", ".join(t.value for t in TokenTransport)
            raise ValueError(f"token_transport: expected one of {choices}")
        runs = self.healthy_runs_to_recover
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"healthy_runs_to_recover: expected a whole number >= 1, got {runs!r}")
        timeout = self.probe_timeout.to_seconds()
        if not 1 <= timeout <= 30:
            raise ValueError(f"probe_timeout: {timeout} s is outside 1-30 s")
        if self.signing_key_secret_name is not None and not self.signing_key_secret_name.strip():
            raise ValueError("signing_key_secret_name: must not be empty")
        if self.public_keys is not None:
            check_public_keys("public_keys", self.public_keys)


class WebSocketCanary(Construct):
    """The canary Lambda, its schedule, the health metric, the alarm and the health check.

    The canary's role may ``GetItem``/``PutItem`` its state table, ``PutMetricData`` only into
    the ``App`` namespace (PutMetricData has no resource-level permissions; the
    ``cloudwatch:namespace`` condition bounds it), read the signing key and write its log group;
    with ``disconnect_when_unhealthy``, also ``Scan``/``DeleteItem`` that table and
    ``execute-api:ManageConnections`` on this stage's ``DELETE @connections/*``.

    Attributes:
        function: the canary Lambda.
        role: its execution role.
        log_group: its log group.
        rule: the EventBridge rule that runs it every minute.
        metric: ``App/WebSocketHealth`` for this API (Minimum, 1 minute).
        alarm: in ALARM after 2 of 2 unhealthy or missing datapoints.
        health_check: the Route 53 health check following the alarm.
        signing_key: the secret the canary's token key is read from (``None`` without one).
        function_alarms: the canary function's own errors and throttles alarms (a canary that
            cannot run reads as an unhealthy Region; these say it is the canary).
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: WebSocketCanaryProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.log_group = at_rest.log_group(
            self, "Logs", retention=props.log_retention, removal_policy=props.log_removal_policy
        )
        self.signing_key = self._build_signing_key()
        # The alarm first: the canary reads its state (the alarm does not depend on the canary).
        self.metric = self._build_metric()
        self.alarm = self._build_alarm()
        self.role = self._build_role()
        self.function = self._build_function()
        # A late or retried probe would report into a later minute: Lambda's own asynchronous
        # retries are off too (overlapping runs are safe: the state item is version-checked).
        self.function.configure_async_invoke(retry_attempts=0, max_event_age=Duration.minutes(1))
        if props.domain_mapping is not None:
            # Probes through the domain before its mapping exists would fail, and trip a
            # healthy Region during its first deploy.
            self.function.node.add_dependency(props.domain_mapping)
        self.rule = self._build_rule()
        self.health_check = self._build_health_check()
        self.function_alarms = function_alarms(self, self.function, what="the WebSocket canary")
        self._acknowledge_findings()

    # --- Canary ---

    def _build_signing_key(self) -> secretsmanager.ISecret | None:
        name = self._props.signing_key_secret_name
        if name is None:
            return None
        return secretsmanager.Secret.from_secret_name_v2(self, "SigningKey", name)

    def _build_role(self) -> iam.Role:
        """Exactly :data:`CANARY_ACTIONS` (the signing key's only when there is one)."""
        props = self._props
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="StreamFleet WebSocket canary: probe, hysteresis state, health metric",
        )
        statements = {
            "state_table": iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["state_table"]),
                resources=[props.state_table.table_arn],
            ),
            "metrics": iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["metrics"]),
                resources=["*"],
                conditions={
                    "StringEquals": {"cloudwatch:namespace": model.HEALTH_METRIC_NAMESPACE}
                },
            ),
            "log_group": iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["log_group"]),
                resources=[self.log_group.log_group_arn],
            ),
            "alarm": iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["alarm"]), resources=[self.alarm.alarm_arn]
            ),
        }
        if props.disconnect_when_unhealthy:
            statements["sweep"] = iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["sweep"]), resources=[props.state_table.table_arn]
            )
            statements["disconnect"] = iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["disconnect"]),
                resources=[self.management_disconnect_arn],
            )
        if self.signing_key is not None:
            # A secret named without its random suffix: Secrets Manager appends six characters.
            statements["signing_key"] = iam.PolicyStatement(
                actions=list(CANARY_ACTIONS["signing_key"]),
                resources=[f"{self.signing_key.secret_arn}-??????"],
            )
        for statement in statements.values():
            role.add_to_policy(statement)
        return role

    @property
    def management_disconnect_arn(self) -> str:
        """``execute-api`` ARN of this stage's ``DELETE @connections/*`` (closing clients)."""
        return Stack.of(self).format_arn(
            service="execute-api",
            resource=self._props.api.api_id,
            resource_name=f"{self._props.stage.stage_name}/DELETE/@connections/*",
        )

    def _build_environment(self) -> dict[str, str]:
        """What :func:`streamfleet.wsapi.canary.canary_from_env` reads."""
        props = self._props
        env = {
            "CANARY_ENDPOINT_URL": props.stage.url,
            "CANARY_API_ID": props.api.api_id,
            "CANARY_TIMEOUT_SECONDS": f"{props.probe_timeout.to_seconds():g}",
            "CANARY_HEALTHY_RUNS_TO_RECOVER": str(props.healthy_runs_to_recover),
            "CANARY_FAILURES_TO_TRIP": str(ALARM_DATAPOINTS),
            "CANARY_STATE_TABLE_NAME": props.state_table.table_name,
            "CANARY_TOKEN_TRANSPORT": props.token_transport,
            model.ENV_CANARY_ALARM_NAME: self.alarm.alarm_name,
            **self._domain_environment(),
            model.ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY: (
                "true" if props.disconnect_when_unhealthy else "false"
            ),
        }
        if props.signing_key_secret_name is not None:
            env.update(
                {
                    # The runtime passes it to GetSecretValue as SecretId: a name is resolved
                    # in the canary's own Region, so each Region reads its own replica.
                    "CANARY_SIGNING_KEY_SECRET_ARN": props.signing_key_secret_name,
                    model.ENV_JWT_AUDIENCE: props.jwt_audience,
                }
            )
        if props.public_keys is not None:
            env[model.ENV_JWT_CANARY_KEYS] = props.public_keys
        return env

    def _domain_environment(self) -> dict[str, str]:
        """With a custom domain: its URL, the regional name to connect to, and the stage's own
        Management API (closing clients goes through the API, not the domain)."""
        domain = self._props.domain_name
        if domain is None:
            return {}
        return {
            "CANARY_ENDPOINT_URL": f"wss://{domain.name}",
            model.ENV_CANARY_CONNECT_HOST: domain.regional_domain_name,
            model.ENV_CANARY_MANAGEMENT_ENDPOINT: self._props.stage.callback_url,
        }

    def _build_function(self) -> lambda_.Function:
        props = self._props
        # Token, probe, state, metric, and (while unhealthy) the sweep's own budget.
        sweep = canary_sweeper.DEFAULT_DISCONNECT_BUDGET_SECONDS
        timeout = props.probe_timeout.to_seconds() * 2 + 10 + sweep
        return python_function(
            self,
            "Function",
            description="StreamFleet WebSocket canary: heartbeat probe of the regional endpoint",
            handler=CANARY_ENTRY,
            distributions=CANARY_DISTRIBUTIONS,
            role=self.role,
            log_group=self.log_group,
            timeout=Duration.seconds(timeout),
            reserved_concurrency=props.reserved_concurrency,
            log_level=props.log_level,
            environment=self._build_environment(),
            no_dead_letter_queue=NO_DEAD_LETTER_QUEUE,
        )

    def _build_rule(self) -> events.Rule:
        return events.Rule(
            self,
            "Schedule",
            description="StreamFleet WebSocket canary, every minute",
            schedule=events.Schedule.rate(SCHEDULE_RATE),
            targets=[
                # A late or retried probe would land in the next minute's datapoint: never retry.
                targets.LambdaFunction(
                    self.function, retry_attempts=0, max_event_age=Duration.minutes(1)
                )
            ],
        )

    # --- Metric, alarm, health check ---

    def _build_metric(self) -> cloudwatch.Metric:
        return self.metric_health()

    def metric_health(self) -> cloudwatch.Metric:
        """The Region's health as the canary reports it (1 or 0 after hysteresis), the minimum
        per minute: the metric its alarm, and so the failover record, watch."""
        return cloudwatch.Metric(
            namespace=model.HEALTH_METRIC_NAMESPACE,
            metric_name=model.HEALTH_METRIC_NAME,
            dimensions_map={model.HEALTH_METRIC_DIMENSION_API_ID: self._props.api.api_id},
            statistic=ALARM_STATISTIC,
            period=ALARM_PERIOD,
        )

    def _build_alarm(self) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            "Alarm",
            alarm_description=(
                "StreamFleet WebSocket API unhealthy (canary): drives the Route 53 health check "
                "of the failover record"
            ),
            metric=self.metric,
            threshold=HEALTHY_THRESHOLD,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=ALARM_DATAPOINTS,
            datapoints_to_alarm=ALARM_DATAPOINTS,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )

    def _build_health_check(self) -> route53.HealthCheck:
        return route53.HealthCheck(
            self,
            "HealthCheck",
            type=route53.HealthCheckType.CLOUDWATCH_METRIC,
            alarm_identifier=route53.AlarmIdentifier(
                name=self.alarm.alarm_name, region=Stack.of(self).region
            ),
            insufficient_data_health_status=route53.InsufficientDataHealthStatusEnum.UNHEALTHY,
        )

    # --- cdk-nag ---

    def _acknowledge_findings(self) -> None:
        acknowledge(
            self.role,
            "IAM5[Resource::*]",
            "cloudwatch:PutMetricData supports no resource-level permissions; the statement "
            "is limited to the App namespace by the cloudwatch:namespace condition.",
        )
        if self._props.disconnect_when_unhealthy:
            acknowledge(
                self.role,
                f"IAM5[Resource::{nag_text(Stack.of(self), self.management_disconnect_arn)}]",
                "execute-api:ManageConnections is scoped to this API's stage and to DELETE "
                "@connections/* (closing clients while the Region is unhealthy); connection "
                "ids are created per client at run time, so they cannot be listed.",
            )
