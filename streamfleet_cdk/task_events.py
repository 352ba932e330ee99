"""Crash recovery in about a second: end a dead worker task's sessions from ECS's own events.

An EventBridge rule matches exactly this service's ``ECS Task State Change`` events with
``lastStatus: STOPPED`` (source ``aws.ecs``, this cluster's ARN, group ``service:<name>``) and
invokes the task-events Lambda (:mod:`streamfleet.task_events`). It ends the task's sessions
with the taker's fencing write and notifies the fleet of every STARTED connection they held,
so live peers claim them through intake at once instead of after a lease.

Only STOPPED is matched: a task that got SIGTERM passes through DEACTIVATING and STOPPING while
it is still handing its connections over, and is left alone until every container has exited.
A task that is running but partitioned or frozen sends no such event: the lease handles it.

Both Regions get the rule and the function. Each acts on its own Region's events only, and the
handler ends a session only if the session item names this Region (the lease table is a global
table: the standby's replica holds the primary's sessions too). A standby fleet scaled to zero
runs no task, so its rule never fires until the fleet is promoted; promotion needs no redeploy
of this construct.

Delivery: EventBridge retries an invocation it could not deliver (``retry_attempts`` within
``max_event_age``) and Lambda retries a failed one twice; the rule's ``FailedInvocations`` and
the function's errors and throttles raise alarms. No dead-letter queue: an event is worth
something for one lease only (after that, the lease has done the same work), so a kept event
would be one nobody can act on; the alarms say that something needs a look.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from streamfleet import model
from streamfleet import task_events as task_events_runtime
from streamfleet_cdk import at_rest
from streamfleet_cdk.functions import (
    ALARM_PERIOD,
    DEFAULT_LOG_LEVEL,
    check_log_level,
    check_reserved_concurrency,
    function_alarms,
    python_function,
)

TASK_EVENTS_HANDLER = (
    f"{task_events_runtime.handler.__module__}.{task_events_runtime.handler.__name__}"
)
# Enough for every task of a default fleet (max 10) to stop at once, an AZ's worth; more events
# than this wait in Lambda's queue for a moment (the throttles alarm says so), none is lost.
DEFAULT_RESERVED_CONCURRENCY = 10
# Lambda and EventBridge both accept 60 s to 24 h. Five minutes covers a throttled or retried
# delivery; beyond a lease (20 s by default) a late event changes nothing anyway.
DEFAULT_MAX_EVENT_AGE = Duration.minutes(5)
FUNCTION_RETRY_ATTEMPTS = 2
# checkov CKV_AWS_116, as the module docstring says.
NO_DEAD_LETTER_QUEUE = (
    "Invoked asynchronously by EventBridge with STOPPED task events, retried by EventBridge and "
    "by Lambda within max_event_age. An event is worth acting on for one lease only (after that "
    "the lease has done the same work), so a kept event would be one nobody can act on; the "
    "FailedInvocations, errors and throttles alarms say that something needs a look."
)

# The indexes the handler queries: "which sessions did task T run?" and "what did session S
# hold?". Never Scan, never the table's other indexes.
QUERIED_INDEXES = (model.TASK_INDEX, model.OWNER_INDEX)
TASK_EVENTS_ACTIONS = {
    "lease_table": ("dynamodb:GetItem", "dynamodb:UpdateItem"),
    "lease_indexes": ("dynamodb:Query",),
    # SendMessageBatch is authorized as SendMessage.
    "queue": ("sqs:SendMessage",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
}


@dataclass(frozen=True, kw_only=True)
class TaskStoppedHandlerProps:
    """How :class:`TaskStoppedHandler` is built.

    Attributes:
        cluster: the ECS cluster the workers' service runs in.
        service_name: the ECS service of the workers (its tasks' ``group`` is
            ``service:<name>``); a token such as ``FargateService.service_name`` is fine.
        lease_table: the lease table (or its Region's replica) with the model's indexes.
        queue: the intake queue the workers poll (the handler announces connections there).
        reserved_concurrency: concurrency reserved for (and the cap of) the handler, 10 by
            default (``None``: unreserved).
        log_level: the handler's application log level (JSON logs); ``INFO`` by default.
        log_retention: how long its logs are kept; one month by default.
        log_removal_policy: what happens to its log group when it leaves the stack or the
            stack is deleted; ``RemovalPolicy.RETAIN`` by default (CloudWatch Logs keeps it,
            for ``log_retention``).
        memory_mib: its memory (and so its CPU share); 256 MiB by default.
        timeout: its timeout; 30 s by default.
        retry_attempts: how often EventBridge retries an invocation it could not deliver; 3 by
            default.
        max_event_age: how long EventBridge and Lambda keep trying with one event; 5 minutes by
            default.
    """

    cluster: ecs.ICluster
    service_name: str
    lease_table: dynamodb.ITableV2
    queue: sqs.IQueue
    reserved_concurrency: int | None = DEFAULT_RESERVED_CONCURRENCY
    log_level: str = DEFAULT_LOG_LEVEL
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    memory_mib: int = 256
    timeout: Duration = field(default_factory=lambda: Duration.seconds(30))
    retry_attempts: int = 3
    max_event_age: Duration = field(default_factory=lambda: DEFAULT_MAX_EVENT_AGE)

    def __post_init__(self) -> None:
        check_reserved_concurrency("reserved_concurrency", self.reserved_concurrency)
        check_log_level("log_level", self.log_level)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)
        _check_whole("memory_mib", self.memory_mib, minimum=128, maximum=10240)
        _check_whole("retry_attempts", self.retry_attempts, minimum=0, maximum=185)
        timeout = self.timeout.to_seconds()
        if not 5 <= timeout <= 900:
            raise ValueError(f"timeout: {timeout} s is outside 5-900 s")
        age = self.max_event_age.to_seconds()
        if not 60 <= age <= 24 * 3600:
            raise ValueError(f"max_event_age: {age} s is outside 60 s to 24 h")
        if not isinstance(self.service_name, str) or not self.service_name:
            raise ValueError("service_name: required, the ECS service's name")


def _check_whole(name: str, value: object, *, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected a whole number, got {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected {minimum}-{maximum}, got {value}")


class TaskStoppedHandler(Construct):
    """The rule for this service's STOPPED tasks, the handler, its role and its alarms.

    Least privilege, written out: the handler's role may ``Query`` the lease table's
    ``by-task`` and ``by-owner`` indexes (no other index, never ``Scan``), ``GetItem`` and
    ``UpdateItem`` the table (it ends sessions; it never creates or deletes an item),
    ``SendMessage`` to the intake queue and write its own log group. Nothing else.

    Attributes:
        log_group: the handler's log group.
        role: its execution role.
        function: the task-events Lambda.
        rule: the EventBridge rule (this cluster, this service, STOPPED only).
        function_alarms: the handler's errors and throttles alarms.
        failed_invocations_alarm: in ALARM when EventBridge could not invoke the handler.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, props: TaskStoppedHandlerProps
    ) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.log_group = at_rest.log_group(
            self, "Logs", retention=props.log_retention, removal_policy=props.log_removal_policy
        )
        self.role = self._build_role()
        self.function = self._build_function()
        self.function.configure_async_invoke(
            retry_attempts=FUNCTION_RETRY_ATTEMPTS, max_event_age=props.max_event_age
        )
        self.rule = self._build_rule()
        self.function_alarms = function_alarms(
            self, self.function, what="the task-events handler (ECS STOPPED tasks)"
        )
        self.failed_invocations_alarm = self._build_failed_invocations_alarm()

    @property
    def event_pattern(self) -> events.EventPattern:
        """What the rule matches: this service's tasks in this cluster, once STOPPED."""
        props = self._props
        return events.EventPattern(
            source=[model.ECS_EVENT_SOURCE],
            detail_type=[model.ECS_TASK_STATE_CHANGE],
            detail={
                "clusterArn": [props.cluster.cluster_arn],
                "group": [model.ecs_service_group(props.service_name)],
                "lastStatus": [model.ECS_TASK_STOPPED],
            },
        )

    def _build_role(self) -> iam.Role:
        """Exactly :data:`TASK_EVENTS_ACTIONS`; the two indexes are named one by one."""
        props = self._props
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="StreamFleet task events: end a STOPPED task's sessions, notify the fleet",
        )
        table_arn = props.lease_table.table_arn
        resources = {
            "lease_table": [table_arn],
            "lease_indexes": [f"{table_arn}/index/{index.name}" for index in QUERIED_INDEXES],
            "queue": [props.queue.queue_arn],
            "log_group": [self.log_group.log_group_arn],
        }
        for name, actions in TASK_EVENTS_ACTIONS.items():
            role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=resources[name])
            )
        at_rest.grant_queue_key(props.queue, role)
        return role

    def _build_function(self) -> lambda_.Function:
        props = self._props
        return python_function(
            self,
            "Function",
            description="StreamFleet task events: end a STOPPED worker task's sessions at once",
            handler=TASK_EVENTS_HANDLER,
            role=self.role,
            log_group=self.log_group,
            memory_size=props.memory_mib,
            timeout=props.timeout,
            reserved_concurrency=props.reserved_concurrency,
            log_level=props.log_level,
            no_dead_letter_queue=NO_DEAD_LETTER_QUEUE,
            environment={
                model.ENV_TABLE_NAME: props.lease_table.table_name,
                model.ENV_QUEUE_URL: props.queue.queue_url,
                model.ENV_ECS_CLUSTER_ARN: props.cluster.cluster_arn,
                model.ENV_ECS_SERVICE_NAME: props.service_name,
            },
        )

    def _build_rule(self) -> events.Rule:
        props = self._props
        return events.Rule(
            self,
            "Rule",
            description="StreamFleet: this service's worker tasks, once STOPPED",
            event_pattern=self.event_pattern,
            targets=[
                targets.LambdaFunction(
                    self.function,
                    retry_attempts=props.retry_attempts,
                    max_event_age=props.max_event_age,
                )
            ],
        )

    def _build_failed_invocations_alarm(self) -> cloudwatch.Alarm:
        """EventBridge could not invoke the handler (after its retries): those crashes recover
        through the lease instead, in about a lease; worth a look, not a page."""
        return cloudwatch.Alarm(
            self,
            "FailedInvocationsAlarm",
            alarm_description=(
                "StreamFleet: EventBridge could not deliver STOPPED task events to the "
                "task-events handler (crashes recover through the lease meanwhile)"
            ),
            metric=cloudwatch.Metric(
                namespace="AWS/Events",
                metric_name="FailedInvocations",
                dimensions_map={"RuleName": self.rule.rule_name},
                statistic="Sum",
                period=ALARM_PERIOD,
            ),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
