"""Live delivery of ingested streams in one Region: the messages table's change stream, fanned
out to the subscribed clients of this Region's WebSocket API.

* :class:`LiveDeliveryTables` tells :class:`~streamfleet_cdk.websocket_api.WebSocketApi` where
  its ``subscribe`` route reads and writes: the fleet's lease table (a stream's readers and
  origin), the messages table (this Region's replica: the replay) and the Region's
  subscriptions table.
* :class:`MessagesStream` is this Region's stream of the messages table. A global table's
  replica has its own stream, whose ARN CloudFormation cannot give a stack outside the declaring
  one (nor for another Region), so a custom resource reads it at deploy time
  (:mod:`streamfleet.wsapi.stream_lookup`: ``DescribeTable`` on this Region's replica, nothing
  else).
* :class:`StreamFanout` is the fan-out: a Lambda (:mod:`streamfleet.wsapi.fanout`) behind an
  event source mapping on that stream (ordered per shard, batches of ``batch_size``, retried,
  then recorded on an SQS queue), posting through this Region's Management API; alarms on the
  stream's iterator age, the function's errors and throttles, posts that failed, and records
  given up on.

Why a change stream and not polling, a queue or a topic: the write that stores a message is
the trigger, in each Region for that Region's replica (replicated writes included), in order per
item, with no extra write per message; see docs/live-delivery.md for the
latency, cost and slow-subscriber reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jsii
from aws_cdk import CustomResource, Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from streamfleet import model
from streamfleet.validation import MAX_SERVICE_NAME_CHARS, check_service_name
from streamfleet.wsapi import fanout as fanout_runtime
from streamfleet.wsapi import stream_lookup as lookup_runtime
from streamfleet.wsapi.handlers import config as handlers_config
from streamfleet_cdk import at_rest
from streamfleet_cdk.functions import (
    ALARM_PERIOD,
    DEFAULT_LOG_LEVEL,
    INVOKED_BY_STREAM,
    check_log_level,
    check_reserved_concurrency,
    function_alarms,
    python_function,
)
from streamfleet_cdk.nag import acknowledge, nag_text

FANOUT_ENTRY = f"{fanout_runtime.handler.__module__}.{fanout_runtime.handler.__name__}"
LOOKUP_ENTRY = f"{lookup_runtime.handler.__module__}.{lookup_runtime.handler.__name__}"
LOOKUP_RESOURCE_TYPE = "Custom::StreamFleetTableStream"
# CloudFormation invokes the lookup asynchronously, at deployments of its stack only: one at a
# time is plenty (Lambda retries a throttled asynchronous invocation), and a flood elsewhere in
# the account cannot throttle a deployment.
LOOKUP_RESERVED_CONCURRENCY = 1
LOOKUP_NO_DEAD_LETTER_QUEUE = (
    "Invoked by CloudFormation only, at deployments of this stack. The handler answers every "
    "request, failures included, through CloudFormation's pre-signed response URL, so a failed "
    "lookup fails the deployment with its reason; a kept event could only be replayed into a "
    "deployment that has already failed or timed out."
)

# Exactly the calls each function makes, and what Lambda's event source mapping needs to read
# the stream on the fan-out's behalf (ListStreams has no resource-level permission) and to
# record a batch it gives up on (sqs:SendMessage only: AWS's documented permission for an SQS
# on-failure destination; CDK's SqsDlq would add GetQueueAttributes and GetQueueUrl, which
# nothing calls).
FANOUT_ACTIONS = {
    "stream": ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"),
    "list_streams": ("dynamodb:ListStreams",),
    "subscriptions_table": ("dynamodb:Query", "dynamodb:DeleteItem"),
    # Each stream's readers, read at every delivery (revoked readers get nothing).
    "streams_table": ("dynamodb:GetItem",),
    "connections": ("execute-api:ManageConnections",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "failed_records": ("sqs:SendMessage",),
}
LOOKUP_ACTIONS = {
    "table": ("dynamodb:DescribeTable",),
    "log_group": ("logs:CreateLogStream", "logs:PutLogEvents"),
}
# What the WebSocket handler's subscribe, unsubscribe, getState and $disconnect add.
HANDLER_LIVE_ACTIONS = {
    "streams_table": ("dynamodb:GetItem",),
    "messages_table": ("dynamodb:Query",),
    "subscriptions_table": (
        "dynamodb:Query",  # a stream's subscribers counted against its bounds
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:BatchWriteItem",
    ),
}
# The fan-out posts replies (POST) and closes subscribers that cannot take them (DELETE).
FANOUT_MANAGEMENT_METHODS = ("POST", "DELETE")


@dataclass(frozen=True, kw_only=True)
class LiveDeliveryTables:
    """Where the WebSocket handler's ``subscribe`` route reads and writes.

    Attributes:
        streams_table: the fleet's lease table (its replica here): a stream's ``readers``
            (written by START) and ``origin_seq``; read only.
        messages_table: the fleet's messages table (its replica here): the replay; read only.
        subscriptions_table: this Region's subscriptions table.
        newest_messages: replayed to a subscribe with ``after`` null.
        replay_max_messages: replayed by one subscribe at most (the reply's ``more`` tells the
            client to continue); every message of a replay is posted within API Gateway's 29 s.
        max_subscribers_per_stream: subscribers of one stream in this Region, at most (a
            subscribe past it is refused with ``too_many_subscribers``).
        max_user_connections_per_stream: connections of one user subscribed to one stream, at
            most (``too_many_connections``).
    """

    streams_table: dynamodb.ITableV2
    messages_table: dynamodb.ITableV2
    subscriptions_table: dynamodb.ITableV2
    newest_messages: int = handlers_config.DEFAULT_SUBSCRIBE_NEWEST
    replay_max_messages: int = handlers_config.DEFAULT_REPLAY_MAX_MESSAGES
    max_subscribers_per_stream: int = model.DEFAULT_MAX_SUBSCRIBERS_PER_STREAM
    max_user_connections_per_stream: int = model.DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM

    def __post_init__(self) -> None:
        maximum = handlers_config.MAX_REPLAY_MESSAGES
        _check_whole("replay_max_messages", self.replay_max_messages, 1, maximum)
        _check_whole("newest_messages", self.newest_messages, 1, self.replay_max_messages)
        _check_whole(
            "max_subscribers_per_stream",
            self.max_subscribers_per_stream,
            1,
            handlers_config.MAX_SUBSCRIBERS_PER_STREAM,
        )
        _check_whole(
            "max_user_connections_per_stream",
            self.max_user_connections_per_stream,
            1,
            handlers_config.MAX_USER_CONNECTIONS_PER_STREAM,
        )

    def environment(self) -> dict[str, str]:
        """The handler's live-delivery variables (what ``HandlerConfig.from_env`` reads)."""
        return {
            model.ENV_STREAMS_TABLE_NAME: self.streams_table.table_name,
            model.ENV_MESSAGES_TABLE_NAME: self.messages_table.table_name,
            model.ENV_SUBSCRIPTIONS_TABLE_NAME: self.subscriptions_table.table_name,
            model.ENV_SUBSCRIBE_NEWEST_MESSAGES: str(self.newest_messages),
            model.ENV_REPLAY_MAX_MESSAGES: str(self.replay_max_messages),
            model.ENV_MAX_SUBSCRIBERS_PER_STREAM: str(self.max_subscribers_per_stream),
            model.ENV_MAX_USER_CONNECTIONS_PER_STREAM: str(self.max_user_connections_per_stream),
        }

    def grant_subscribe(self, grantee: iam.IGrantable) -> iam.Grant:
        """Exactly :data:`HANDLER_LIVE_ACTIONS` on these tables: what the WebSocket handler's
        subscribe, replay and unsubscribe call."""
        resources = {
            "streams_table": self.streams_table.table_arn,
            "messages_table": self.messages_table.table_arn,
            "subscriptions_table": self.subscriptions_table.table_arn,
        }
        grants = [
            iam.Grant.add_to_principal(
                grantee=grantee, actions=list(actions), resource_arns=[resources[name]]
            )
            for name, actions in HANDLER_LIVE_ACTIONS.items()
        ]
        combined = grants[0]
        for grant in grants[1:]:
            combined = combined.combine(grant)
        return combined


def _check_whole(name: str, value: object, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected a whole number from {minimum} to {maximum}")


class MessagesStream(Construct):
    """This Region's stream of a table (a global table's replica here), read at deploy time.

    Attributes:
        function: the custom resource's Lambda (``DescribeTable`` on ``table`` only).
        role: its execution role.
        log_group: its log group.
        resource: the custom resource.
        stream_arn: the stream's ARN (a deploy-time token).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        table: dynamodb.ITableV2,
        log_level: str = DEFAULT_LOG_LEVEL,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        log_removal_policy: RemovalPolicy = RemovalPolicy.DESTROY,
    ) -> None:
        """``log_removal_policy``: what happens to the lookup's log group when it leaves the
        stack or the stack is deleted (``DESTROY`` by default: it only records deployments)."""
        super().__init__(scope, construct_id)
        self.log_group = at_rest.log_group(
            self,
            "LookupLogs",
            retention=log_retention,
            removal_policy=at_rest.check_removal_policy("log_removal_policy", log_removal_policy),
        )
        self.role = iam.Role(
            self,
            "LookupRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="StreamFleet: reads the stream ARN of the messages table's replica",
        )
        resources = {"table": table.table_arn, "log_group": self.log_group.log_group_arn}
        for name, actions in LOOKUP_ACTIONS.items():
            self.role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=[resources[name]])
            )
        self.function = python_function(
            self,
            "Lookup",
            description="StreamFleet: the messages table's stream ARN in this Region (deploy time)",
            handler=LOOKUP_ENTRY,
            role=self.role,
            log_group=self.log_group,
            timeout=Duration.seconds(30),
            memory_size=128,
            reserved_concurrency=LOOKUP_RESERVED_CONCURRENCY,
            log_level=check_log_level("log_level", log_level),
            environment={},
            no_dead_letter_queue=LOOKUP_NO_DEAD_LETTER_QUEUE,
        )
        self.resource = CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type=LOOKUP_RESOURCE_TYPE,
            properties={"TableName": table.table_name},
        )
        self.resource.node.add_dependency(self.role)
        self.stream_arn: str = self.resource.get_att_string(lookup_runtime.ATTRIBUTE)


@jsii.implements(lambda_.IEventSourceDlq)
class _QueueDestination:
    """An SQS queue as an event source mapping's on-failure destination, granting nothing:
    :class:`StreamFanout` grants the one action Lambda needs (``sqs:SendMessage``)."""

    def __init__(self, queue: sqs.IQueue) -> None:
        # A KMS-encrypted queue would also need kms:GenerateDataKey and kms:Decrypt for Lambda;
        # the queue StreamFanout builds uses SSE-SQS, which needs no KMS permission.
        if queue.encryption_master_key is not None:
            raise ValueError(
                "failed_records: a KMS-encrypted queue needs KMS grants this does not make"
            )
        self._queue = queue

    def bind(
        self, target: lambda_.IEventSourceMapping, target_handler: lambda_.IFunction
    ) -> lambda_.DlqDestinationConfig:
        return lambda_.DlqDestinationConfig(destination=self._queue.queue_arn)


@dataclass(frozen=True, kw_only=True)
class StreamFanoutProps:
    """How :class:`StreamFanout` is built.

    Attributes:
        stream_arn: the messages table's stream in this Region (:class:`MessagesStream`).
        subscriptions_table: this Region's subscriptions table.
        streams_table: the fleet's lease table (its replica here): each stream's ``readers``,
            checked at every delivery; read only.
        api: this Region's WebSocket API; stage: its stage (the Management API endpoint).
        batch_size: records per invocation at most (100 by default). A batch of one shard's
            records goes out in a few posts per subscriber and stream, so bigger batches mean
            fewer posts.
        max_batching_window: how long Lambda may wait to fill a batch (latency added to every
            message; zero by default: a live feed).
        parallelization_factor: concurrent batches per shard, 1 by default (order is kept per
            item either way; the client reorders anything else).
        retry_attempts: retries of a failing batch before its records are given up on (and
            recorded on the on-failure queue), 10 by default; subscribers then repair the gap
            from the log.
        max_record_age: records older than this are given up on (they are in the table); one
            hour by default.
        post_threads: concurrent posts in one invocation; 16 by default.
        subscriber_budget: how long one subscriber's posts of a batch may take, plus
            ``FRAME_ALLOWANCE_MS`` per frame, before it is closed to resume from the log: with
            the post timeouts, what bounds how long one slow reader holds its shard; 1 s by
            default.
        memory_mib / timeout: the function's (512 MiB and 60 s by default).
        reserved_concurrency: reserved (and the cap of) the fan-out's concurrency, 10 by
            default (``None``: unreserved): a shard runs one batch at a time (times
            ``parallelization_factor``), so this bounds shards.
        iterator_age_alarm: the alarm threshold on the stream's ``IteratorAge`` (maximum, one
            minute, 2 of 2): delivery is this far behind the writes; 30 s by default.
        log_level / log_retention: the function's logs (``INFO``, one month by default).
        log_removal_policy: what happens to its log group when it leaves the stack or the
            stack is deleted; ``RemovalPolicy.DESTROY`` by default (the group goes with the
            fan-out).
        service_name: the service dimension of the fan-out's metrics (``SERVICE_NAME``) and of
            the alarm on them; ``None`` derives one from the construct's path in the app, so two
            fan-outs in one account and Region never alarm on each other's posts.
    """

    stream_arn: str
    subscriptions_table: dynamodb.ITableV2
    streams_table: dynamodb.ITableV2
    api: apigwv2.IWebSocketApi
    stage: apigwv2.IWebSocketStage
    batch_size: int = 100
    max_batching_window: Duration = field(default_factory=lambda: Duration.seconds(0))
    parallelization_factor: int = 1
    retry_attempts: int = 10
    max_record_age: Duration = field(default_factory=lambda: Duration.hours(1))
    post_threads: int = fanout_runtime.DEFAULT_POST_THREADS
    subscriber_budget: Duration = field(
        default_factory=lambda: Duration.millis(fanout_runtime.DEFAULT_SUBSCRIBER_BUDGET_MS)
    )
    memory_mib: int = 512
    timeout: Duration = field(default_factory=lambda: Duration.seconds(60))
    reserved_concurrency: int | None = 10
    iterator_age_alarm: Duration = field(default_factory=lambda: Duration.seconds(30))
    log_level: str = DEFAULT_LOG_LEVEL
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.DESTROY
    service_name: str | None = None

    def __post_init__(self) -> None:
        if self.service_name is not None:
            check_service_name("service_name", self.service_name)
        _check_whole("batch_size", self.batch_size, 1, 10_000)
        _check_whole("parallelization_factor", self.parallelization_factor, 1, 10)
        _check_whole("retry_attempts", self.retry_attempts, 0, 10_000)
        _check_whole("post_threads", self.post_threads, 1, fanout_runtime.MAX_POST_THREADS)
        _check_whole("memory_mib", self.memory_mib, 128, 10_240)
        budget_ms = self.subscriber_budget.to_milliseconds()
        if not 1 <= budget_ms <= fanout_runtime.MAX_SUBSCRIBER_BUDGET_MS:
            raise ValueError(
                f"subscriber_budget: 1 ms to {fanout_runtime.MAX_SUBSCRIBER_BUDGET_MS} ms"
            )
        if not 0 <= self.max_batching_window.to_seconds() <= 300:
            raise ValueError("max_batching_window: 0 to 300 seconds")
        if not 60 <= self.max_record_age.to_seconds() <= 604_800:
            raise ValueError("max_record_age: 60 seconds to 7 days (Lambda's bounds)")
        # Posting stops INVOCATION_MARGIN_MS before the timeout: a subscriber needs its budget
        # before that, or every batch would close every subscriber.
        shortest_ms = fanout_runtime.INVOCATION_MARGIN_MS + budget_ms
        if not shortest_ms < self.timeout.to_milliseconds() <= 900_000:
            raise ValueError(
                f"timeout: more than {shortest_ms / 1000:g} seconds (the subscriber budget and "
                "the time posts in flight may take), at most 900"
            )
        if not self.iterator_age_alarm.to_seconds() >= 1:
            raise ValueError("iterator_age_alarm: at least one second")
        check_reserved_concurrency("reserved_concurrency", self.reserved_concurrency)
        check_log_level("log_level", self.log_level)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)


class StreamFanout(Construct):
    """The fan-out of one Region (see the module docstring).

    Attributes:
        function: the fan-out Lambda.
        role: its execution role.
        log_group: its log group.
        event_source: the event source mapping on the messages table's stream.
        failed_records: the on-failure destination (records of batches given up on).
        alarms: errors, throttles, iterator age, failed posts, records given up on.
        iterator_age_alarm, failed_posts_alarm, failed_records_alarm: those three, by name.
        service_name: the value of its metrics' service dimension.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: StreamFanoutProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.service_name: str = props.service_name or Names.unique_resource_name(
            self, max_length=MAX_SERVICE_NAME_CHARS, separator="-"
        )
        self.log_group = at_rest.log_group(
            self, "Logs", retention=props.log_retention, removal_policy=props.log_removal_policy
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="StreamFleet: posts stored messages to this Region's subscribers",
        )
        self.failed_records = at_rest.queue(
            self, "FailedRecords", retention_period=Duration.days(14)
        )
        self._grant()
        self.function = python_function(
            self,
            "Function",
            description="StreamFleet: messages table stream -> subscribed WebSocket clients",
            handler=FANOUT_ENTRY,
            role=self.role,
            log_group=self.log_group,
            memory_size=props.memory_mib,
            timeout=props.timeout,
            reserved_concurrency=props.reserved_concurrency,
            log_level=props.log_level,
            no_dead_letter_queue=INVOKED_BY_STREAM,
            environment={
                model.ENV_SUBSCRIPTIONS_TABLE_NAME: props.subscriptions_table.table_name,
                model.ENV_STREAMS_TABLE_NAME: props.streams_table.table_name,
                model.ENV_APIGW_MANAGEMENT_ENDPOINT: self.management_endpoint,
                model.ENV_FANOUT_POST_THREADS: str(props.post_threads),
                model.ENV_FANOUT_SUBSCRIBER_BUDGET_MS: str(
                    int(props.subscriber_budget.to_milliseconds())
                ),
                model.ENV_SERVICE_NAME: self.service_name,
            },
        )
        self.event_source = lambda_.EventSourceMapping(
            self,
            "EventSource",
            target=self.function,
            event_source_arn=props.stream_arn,
            starting_position=lambda_.StartingPosition.LATEST,
            batch_size=props.batch_size,
            max_batching_window=props.max_batching_window,
            parallelization_factor=props.parallelization_factor,
            retry_attempts=props.retry_attempts,
            max_record_age=props.max_record_age,
            report_batch_item_failures=True,
            on_failure=_QueueDestination(self.failed_records),  # SendMessage: see _grant
        )
        # The mapping reads the stream with the function's role, which must exist first.
        self.event_source.node.add_dependency(self.role)
        errors, throttles = function_alarms(self, self.function, what="the stream fan-out")
        self.iterator_age_alarm = self._build_iterator_age_alarm()
        self.failed_posts_alarm = self._build_failed_posts_alarm()
        self.failed_records_alarm = self._build_failed_records_alarm()
        self.alarms = (
            errors,
            throttles,
            self.iterator_age_alarm,
            self.failed_posts_alarm,
            self.failed_records_alarm,
        )
        self._acknowledge_findings()

    @property
    def management_endpoint(self) -> str:
        """The stage's regional Management API endpoint (never the failover name)."""
        stack = Stack.of(self)
        return (
            f"https://{self._props.api.api_id}.execute-api.{stack.region}.{stack.url_suffix}/"
            f"{self._props.stage.stage_name}"
        )

    def management_arn(self, method: str) -> str:
        return Stack.of(self).format_arn(
            service="execute-api",
            resource=self._props.api.api_id,
            resource_name=f"{self._props.stage.stage_name}/{method}/@connections/*",
        )

    def _grant(self) -> None:
        props = self._props
        resources = {
            "stream": [props.stream_arn],
            "list_streams": ["*"],
            "subscriptions_table": [props.subscriptions_table.table_arn],
            "streams_table": [props.streams_table.table_arn],
            "connections": [self.management_arn(m) for m in FANOUT_MANAGEMENT_METHODS],
            "log_group": [self.log_group.log_group_arn],
            "failed_records": [self.failed_records.queue_arn],
        }
        for name, actions in FANOUT_ACTIONS.items():
            self.role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=resources[name])
            )

    def _build_iterator_age_alarm(self) -> cloudwatch.Alarm:
        threshold = self._props.iterator_age_alarm.to_milliseconds()
        return cloudwatch.Alarm(
            self,
            "IteratorAgeAlarm",
            alarm_description=(
                "StreamFleet: live delivery is behind the stored messages (the fan-out's "
                f"IteratorAge is above {threshold:g} ms)"
            ),
            metric=self.metric_iterator_age(),
            threshold=threshold,
            evaluation_periods=2,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def metric_iterator_age(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """How far live delivery is behind the stored messages: the age of the newest record
        the fan-out read (Lambda's ``IteratorAge``), the maximum; default over 1 minute."""
        return self.function.metric(
            "IteratorAge", statistic="Maximum", period=period or Duration.minutes(1)
        )

    def metric_failed_records(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """Records of batches the fan-out gave up on after its retries (in the FailedRecords
        queue), the maximum; default over the alarm's period."""
        return self.failed_records.metric_approximate_number_of_messages_visible(
            period=period or ALARM_PERIOD, statistic="Maximum"
        )

    def metric_failed_posts(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """Posts to subscribers that failed for a reason other than a gone connection (their
        subscribers were disconnected to resume from the stored log), summed; default over
        the alarm's period."""
        return cloudwatch.Metric(
            namespace=model.METRIC_NAMESPACE,
            metric_name=model.METRIC_FANOUT_FAILED_POSTS,
            dimensions_map={model.METRIC_DIMENSION_SERVICE: self.service_name},
            statistic="Sum",
            period=period or ALARM_PERIOD,
        )

    def _build_failed_posts_alarm(self) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            "FailedPostsAlarm",
            alarm_description=(
                "StreamFleet: the fan-out could not post to subscribers (other than gone "
                "ones); they were disconnected to resume from the stored log"
            ),
            metric=self.metric_failed_posts(),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _build_failed_records_alarm(self) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            "FailedRecordsAlarm",
            alarm_description=(
                "StreamFleet: the fan-out gave up on a batch of stored messages after its "
                "retries (see the FailedRecords queue); subscribers repair it from the log"
            ),
            metric=self.metric_failed_records(),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _acknowledge_findings(self) -> None:
        stack = Stack.of(self)
        acknowledge(
            self.failed_records,
            "SQS3",
            "This queue is itself the dead-letter destination of the fan-out's event source "
            "mapping (records of batches given up on); nothing consumes it but an operator, so "
            "a dead-letter queue of its own would have nothing to catch.",
        )
        acknowledge(
            self.role,
            "IAM5[Resource::*]",
            "dynamodb:ListStreams, which Lambda's event source mapping needs for a DynamoDB "
            "stream, supports no resource-level permission; every other stream action is "
            "limited to this Region's stream of the messages table.",
        )
        for method in FANOUT_MANAGEMENT_METHODS:
            acknowledge(
                self.role,
                f"IAM5[Resource::{nag_text(stack, self.management_arn(method))}]",
                "execute-api:ManageConnections is limited to this API's stage and to "
                f"{method} @connections/*: subscribers' connection ids exist only at run time.",
            )
