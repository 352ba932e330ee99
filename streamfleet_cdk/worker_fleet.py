"""The worker fleet: ECS Fargate tasks that hold the upstream WebSocket connections.

Each task runs ``python -m streamfleet.worker`` from an image built from this same runtime code
(:func:`streamfleet_cdk.assets.stage_worker_image_context`). Tasks hold leases in the lease table,
store messages in the messages table and take claim notifications from the queue; the service
scales on the workers' own ``ActiveConnections`` metric (Embedded Metric Format on stdout, so no
``cloudwatch:PutMetricData`` permission), read from :mod:`streamfleet.model`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jsii
from aws_cdk import Duration, Names, RemovalPolicy, Size, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from streamfleet import buffering, model
from streamfleet.lease.timing import LeaseTiming
from streamfleet.validation import MAX_SERVICE_NAME_CHARS, check_service_name
from streamfleet.worker.fleet import SHUTDOWN_BUDGET_SECONDS
from streamfleet_cdk import at_rest
from streamfleet_cdk.assets import stage_worker_image_context
from streamfleet_cdk.nag import acknowledge, skip_checkov
from streamfleet_cdk.task_events import TaskStoppedHandler, TaskStoppedHandlerProps
from streamfleet_cdk.upstreams import allowed_upstreams_env, check_allowed_upstreams

HEALTH_PORT = 8080
HEALTH_PATH = "/health"
METRICS_EVERY_SECONDS = 60
# ECS allows a container at most 120 s between SIGTERM and SIGKILL on Fargate.
MAX_STOP_TIMEOUT_SECONDS = 120
VPC_AZS = 2  # a created VPC spans two AZs (one may fail), each with its own NAT gateway by default
# CDK's own Lambda behind a created VPC's RestrictDefaultSecurityGroup custom resource (the
# @aws-cdk/aws-ec2:restrictDefaultSecurityGroup flag, which strips the default security group of
# its rules): one per stack, at the stack's root, judged here for checkov.
RESTRICT_DEFAULT_SG_PROVIDER = "Custom::VpcRestrictDefaultSGCustomResourceProvider"
RESTRICT_DEFAULT_SG_SKIPS = {
    "CKV_AWS_115": (
        "CDK's provider of the VPC's RestrictDefaultSecurityGroup custom resource runs only when "
        "CloudFormation creates, updates or deletes that resource, a few invocations in a "
        "deployment; it needs no concurrency reserved or capped, and CDK builds it without one."
    ),
    "CKV_AWS_116": (
        "CDK's provider of the RestrictDefaultSecurityGroup custom resource is invoked by "
        "CloudFormation only, and answers it through the pre-signed response URL, failures "
        "included, so a failure fails the deployment; a kept event could only be replayed into "
        "a deployment that has already failed."
    ),
    "CKV_AWS_117": (
        "CDK's provider of the RestrictDefaultSecurityGroup custom resource calls only the EC2 "
        "API (revoking the default security group's rules), at deployments; nothing it needs is "
        "inside a VPC."
    ),
}

# Fargate's valid (cpu units -> memory MiB) combinations for the sizes a worker may sensibly use.
FARGATE_MEMORY = {
    256: range(512, 2048 + 1, 512),
    512: range(1024, 4096 + 1, 1024),
    1024: range(2048, 8192 + 1, 1024),
    2048: range(4096, 16384 + 1, 1024),
    4096: range(8192, 30720 + 1, 1024),
}

TASK_ACTIONS = {
    "lease_table": (
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
    ),
    "messages_table": ("dynamodb:BatchWriteItem", "dynamodb:Query"),
    # SendMessageBatch, DeleteMessageBatch and ChangeMessageVisibilityBatch are authorized as
    # SendMessage, DeleteMessage and ChangeMessageVisibility (a notification a worker cannot act
    # on now is made visible again at once instead of after the visibility timeout).
    "queue": (
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:SendMessage",
        "sqs:ChangeMessageVisibility",
    ),
}


def _seconds(value: float) -> str:
    """A duration as the worker parses it: ``20`` rather than ``20.0``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, kw_only=True)
class WorkerFleetProps:
    """How :class:`WorkerFleet` is built.

    Attributes:
        lease_table: the lease table (or its local replica) with the model's indexes.
        messages_table: the messages table (or its local replica).
        queue: the claim-notification queue the workers poll and publish handoffs to.
        allowed_upstreams: ``scheme://host[:port]`` entries a worker may dial.
        vpc: where the tasks run; ``None`` creates one (2 AZs, ``nat_gateways``, flow logs).
        nat_gateways: NAT gateways of a created VPC; ``None`` means one per AZ, so losing an AZ
            does not take the other AZ's outbound connections with it. ``1`` saves one NAT's
            hourly charge at that risk.
        availability_zones: AZs of a created VPC; ``None`` means the stack's first two
            ``availability_zones``. (An environment-specific stack looks its AZs up with AWS
            credentials unless it overrides ``Stack.availability_zones``, as ``FleetStack``
            does with ``Fn::GetAZs``.)
        subnets: the tasks' subnets; ``None`` means the VPC's private subnets with egress.
        service_name: the worker's ``SERVICE_NAME``, which is also the value of the
            ``model.METRIC_DIMENSION_SERVICE`` dimension the scaling policy and the alarms
            track; ``None`` derives one from the construct's path in the app, so two fleets in
            one account and Region never scale on, or alarm on, each other's tasks. Name it to
            keep dashboards across a rename of the stack.
        cpu: Fargate CPU units per task; 512 by default.
        memory_limit_mib: memory per task; must be a valid Fargate pairing with ``cpu``; 1024
            MiB by default.
        desired_count: tasks at creation; ``None`` leaves the count to auto scaling (a
            deployment then never resets it), ``0`` keeps a standby Region empty.
        min_capacity: fewest tasks auto scaling keeps (``0`` for a standby Region); 1 by
            default.
        max_capacity: most tasks auto scaling starts; 10 by default.
        target_connections_per_task: the average ``ActiveConnections`` per task to hold; 700
            by default.
        scale_out_cooldown: wait after a scale-out before the next one; 2 minutes by default.
        scale_in_cooldown: wait after a scale-in; long, since each scale-in hands connections
            off: 15 minutes by default.
        max_connections: connections one worker holds at most (``MAX_CONNECTIONS``); at least
            the target, or the fleet could never reach it and never scale out; 1000 by default.
        lease_seconds: ``LEASE_SECONDS``: how long a session vouches for its connections; 20
            by default.
        heartbeat_seconds: ``HEARTBEAT_EVERY``: session renewal interval; 5 by default.
        reconcile_seconds: ``RECONCILE_EVERY``: orphan scan interval; 10 by default.
        stop_timeout: SIGTERM to SIGKILL; must exceed the worker's shutdown budget (handoff);
            30 s by default.
        message_retention_days: how long stored messages are kept (the worker writes each
            message's TTL attribute, ``expires_at``, that far ahead: ``MESSAGE_RETENTION_DAYS``);
            7 by default.
        log_retention: how long worker logs (and the created VPC's flow logs) are kept; one
            month by default.
        log_removal_policy: what happens to those log groups when they leave the stack or the
            stack is deleted; ``RemovalPolicy.RETAIN`` by default (CloudWatch Logs keeps them,
            for ``log_retention``).
    """

    lease_table: dynamodb.ITableV2
    messages_table: dynamodb.ITableV2
    queue: sqs.IQueue
    allowed_upstreams: tuple[str, ...]
    vpc: ec2.IVpc | None = None
    nat_gateways: int | None = None
    availability_zones: tuple[str, ...] | None = None
    subnets: ec2.SubnetSelection | None = None
    service_name: str | None = None
    cpu: int = 512
    memory_limit_mib: int = 1024
    desired_count: int | None = None
    min_capacity: int = 1
    max_capacity: int = 10
    target_connections_per_task: int = 700
    scale_out_cooldown: Duration = field(default_factory=lambda: Duration.minutes(2))
    scale_in_cooldown: Duration = field(default_factory=lambda: Duration.minutes(15))
    max_connections: int = 1000
    lease_seconds: float = 20.0
    heartbeat_seconds: float = 5.0
    reconcile_seconds: float = 10.0
    stop_timeout: Duration = field(default_factory=lambda: Duration.seconds(30))
    message_retention_days: int = model.DEFAULT_MESSAGE_RETENTION_DAYS
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    log_removal_policy: RemovalPolicy = RemovalPolicy.RETAIN

    def __post_init__(self) -> None:
        check_allowed_upstreams("allowed_upstreams", self.allowed_upstreams)
        if isinstance(self.availability_zones, str):
            raise ValueError("availability_zones: expected a tuple of AZ names, got a string")
        if self.availability_zones is not None and len(self.availability_zones) < 2:
            raise ValueError("availability_zones: at least two, so one AZ can fail")
        if self.service_name is not None:
            check_service_name("service_name", self.service_name)
        if self.nat_gateways is not None:
            zones = len(self.availability_zones or ()) or VPC_AZS
            _check_whole("nat_gateways", self.nat_gateways, minimum=1)
            if self.nat_gateways > zones:
                raise ValueError(
                    f"nat_gateways: {self.nat_gateways} is more than the VPC's {zones} AZs"
                )
        _check_whole("message_retention_days", self.message_retention_days, minimum=1)
        at_rest.check_removal_policy("log_removal_policy", self.log_removal_policy)
        self._check_size()
        self._check_capacity()
        self._check_timing()

    def _check_size(self) -> None:
        if self.cpu not in FARGATE_MEMORY:
            raise ValueError(f"cpu: expected one of {sorted(FARGATE_MEMORY)}, got {self.cpu!r}")
        allowed = FARGATE_MEMORY[self.cpu]
        if self.memory_limit_mib not in allowed:
            raise ValueError(
                f"memory_limit_mib: {self.memory_limit_mib!r} is not valid with cpu {self.cpu} "
                f"(Fargate allows {allowed.start}-{allowed.stop - 1} in steps of {allowed.step})"
            )
        # The worker checks the same at start (MEMORY_LIMIT_MIB); here a deployment that could
        # only crash-loop fails at synth instead.
        buffering.check_fits_memory(
            memory_limit_mib=self.memory_limit_mib,
            max_connections=self.max_connections,
            max_message_bytes=buffering.DEFAULT_MAX_MESSAGE_BYTES,
            max_worker_buffered_bytes=buffering.DEFAULT_MAX_WORKER_BUFFERED_BYTES,
            fields="max_connections, memory_limit_mib",
        )

    def _check_capacity(self) -> None:
        _check_whole("min_capacity", self.min_capacity, minimum=0)
        _check_whole("max_capacity", self.max_capacity, minimum=max(1, self.min_capacity))
        if self.desired_count is not None:
            _check_whole("desired_count", self.desired_count, minimum=self.min_capacity)
            if self.desired_count > self.max_capacity:
                raise ValueError(
                    f"desired_count: {self.desired_count} exceeds max_capacity {self.max_capacity}"
                )
        _check_whole("target_connections_per_task", self.target_connections_per_task, minimum=1)
        _check_whole(
            "max_connections", self.max_connections, minimum=self.target_connections_per_task
        )
        for name in ("scale_out_cooldown", "scale_in_cooldown"):
            if getattr(self, name).to_seconds() < 0:
                raise ValueError(f"{name}: must not be negative")

    def _check_timing(self) -> None:
        # The worker's own rule (same defaults for skew and margin as WorkerConfig.from_env).
        try:
            LeaseTiming(
                lease_seconds=self.lease_seconds,
                heartbeat_seconds=self.heartbeat_seconds,
                max_clock_skew_seconds=min(1.0, self.lease_seconds / 8),
                safety_margin_seconds=min(0.5, self.lease_seconds / 8),
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        if isinstance(self.reconcile_seconds, bool) or not self.reconcile_seconds > 0:
            raise ValueError("reconcile_seconds: must be greater than zero")
        stop = self.stop_timeout.to_seconds()
        if not SHUTDOWN_BUDGET_SECONDS < stop <= MAX_STOP_TIMEOUT_SECONDS:
            raise ValueError(
                f"stop_timeout: {stop} s must exceed the worker's {SHUTDOWN_BUDGET_SECONDS:g} s "
                f"shutdown budget and be at most {MAX_STOP_TIMEOUT_SECONDS} s"
            )


def _check_whole(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected at least {minimum}, got {value}")


@jsii.implements(ec2.IConnectable)
class WorkerFleet(Construct):
    """An ECS Fargate service of workers, scaled on their average ``ActiveConnections``.

    Why these settings:

    * **ARM64** Fargate: the worker is I/O-bound Python; Graviton is cheaper per task.
    * **min healthy 100 %, max 200 %**: a deployment starts new tasks before stopping old ones,
      so capacity never dips while connections are handed over.
    * **circuit breaker with rollback**: a broken image (failing health checks) rolls back
      instead of replacing the whole fleet with tasks that cannot hold connections.
    * **stop timeout** above the worker's shutdown budget: SIGTERM starts the handoff (release
      each lease, notify a peer); SIGKILL must not cut it short.
    * **target tracking on the per-task average**: connections, not CPU, are what a worker runs
      out of; a long scale-in cooldown keeps the fleet from shuffling connections back and forth.
    * **least privilege**: the task role gets exactly :data:`TASK_ACTIONS` on the tables (and
      the lease table's own indexes, by name) and the queue; ``Scan`` and ``dynamodb:*`` never.

    Attributes:
        vpc: the VPC the tasks run in.
        cluster: the ECS cluster (Container Insights on).
        task_role: the workers' role.
        log_group: the workers' logs (and their EMF metrics).
        task_definition: the Fargate task definition.
        container: the worker container.
        service: the Fargate service.
        scaling: the service's scalable task count.
        active_connections: the metric the scaling policy tracks.
        leases_lost_alarm: in ALARM when workers lost leases in the last five minutes.
        running_tasks_alarm: in ALARM when fewer tasks than ``min_capacity`` ran for five
            minutes (``None`` for a standby fleet, whose minimum is 0).
        connections: the tasks' network connections (``ec2.IConnectable``): open a port of a
            team's own resource to the workers with ``fleet.connections`` as the peer.
        security_groups: the tasks' security groups.
        service_name: the value of the workers' service dimension: ``props.service_name``, or
            one unique to this construct's path in the app.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: WorkerFleetProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.service_name: str = props.service_name or Names.unique_resource_name(
            self, max_length=MAX_SERVICE_NAME_CHARS, separator="-"
        )
        self.log_group = at_rest.log_group(
            self, "Logs", retention=props.log_retention, removal_policy=props.log_removal_policy
        )
        self.vpc: ec2.IVpc = props.vpc or self._build_vpc()
        self.cluster = self._build_cluster()
        self.task_role = self._build_task_role()
        self.task_definition = self._build_task_definition()
        self.container = self._build_container()
        self.service = self._build_service()
        self.active_connections = self._build_active_connections_metric()
        self.scaling = self._build_scaling()
        self.leases_lost_alarm = self._build_leases_lost_alarm()
        self.running_tasks_alarm = self._build_running_tasks_alarm()
        self.security_groups: list[ec2.ISecurityGroup] = list(
            self.service.connections.security_groups
        )
        self._acknowledge_findings()
        self._skip_checkov_findings()

    @property
    def connections(self) -> ec2.Connections:
        return self.service.connections

    def add_task_stopped_handler(
        self, construct_id: str = "TaskStopped", **options: object
    ) -> TaskStoppedHandler:
        """End a dead task's sessions as soon as ECS reports it STOPPED, instead of after a
        lease (:class:`~streamfleet_cdk.task_events.TaskStoppedHandler`, for this fleet's
        cluster, service, lease table and queue). ``options``: the other fields of
        :class:`~streamfleet_cdk.task_events.TaskStoppedHandlerProps`."""
        return TaskStoppedHandler(
            self,
            construct_id,
            props=TaskStoppedHandlerProps(
                cluster=self.cluster,
                service_name=self.service.service_name,
                lease_table=self._props.lease_table,
                queue=self._props.queue,
                **options,  # type: ignore[arg-type]
            ),
        )

    # --- Network and cluster ---

    def _build_vpc(self) -> ec2.Vpc:
        """Two AZs, private subnets behind NAT gateways (workers dial out, nothing dials in).

        A DynamoDB gateway endpoint keeps lease and message traffic off the NAT gateway (it is
        free, the NAT's per-GB charge is not); flow logs record every flow for investigations.
        """
        zones = self._props.availability_zones
        flow_logs = at_rest.log_group(
            self,
            "FlowLogs",
            retention=self._props.log_retention,
            removal_policy=self._props.log_removal_policy,
        )
        return ec2.Vpc(
            self,
            "Vpc",
            availability_zones=list(zones) if zones else None,
            max_azs=None if zones else VPC_AZS,
            nat_gateways=self._props.nat_gateways or len(zones or ()) or VPC_AZS,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24
                ),
                ec2.SubnetConfiguration(
                    name="Workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            gateway_endpoints={
                "DynamoDb": ec2.GatewayVpcEndpointOptions(
                    service=ec2.GatewayVpcEndpointAwsService.DYNAMODB
                )
            },
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
        )

    def _build_cluster(self) -> ecs.Cluster:
        return ecs.Cluster(
            self,
            "Cluster",
            vpc=self.vpc,
            container_insights_v2=ecs.ContainerInsights.ENABLED,
        )

    # --- Task ---

    def _build_task_role(self) -> iam.Role:
        """Exactly :data:`TASK_ACTIONS`; the indexes the workers query are named one by one."""
        props = self._props
        role = iam.Role(
            self,
            "TaskRole",
            assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
            description="StreamFleet worker: leases, messages and claim notifications",
        )
        lease_arn = props.lease_table.table_arn
        resources = {
            "lease_table": [
                lease_arn,
                *(f"{lease_arn}/index/{index.name}" for index in model.WORKER_INDEXES),
            ],
            "messages_table": [props.messages_table.table_arn],
            "queue": [props.queue.queue_arn],
        }
        for name, actions in TASK_ACTIONS.items():
            role.add_to_policy(
                iam.PolicyStatement(actions=list(actions), resources=resources[name])
            )
        at_rest.grant_queue_key(props.queue, role)
        return role

    def _build_task_definition(self) -> ecs.FargateTaskDefinition:
        return ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            cpu=self._props.cpu,
            memory_limit_mib=self._props.memory_limit_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
            task_role=self.task_role,
        )

    def _build_container(self) -> ecs.ContainerDefinition:
        """The worker container: the image from this runtime, health check, environment.

        Logs use the non-blocking driver mode: a worker whose stdout blocks would stall its
        event loop and miss session renewals, which costs every connection it holds; a lost
        log line (or one EMF datapoint) costs far less.
        """
        return self.task_definition.add_container(
            "Worker",
            image=ecs.ContainerImage.from_asset(
                str(stage_worker_image_context()), platform=ecr_assets.Platform.LINUX_ARM64
            ),
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix="worker",
                log_group=self.log_group,
                mode=ecs.AwsLogDriverMode.NON_BLOCKING,
                max_buffer_size=Size.mebibytes(25),
            ),
            environment=self._build_environment(),
            health_check=ecs.HealthCheck(
                command=[
                    "CMD-SHELL",
                    'python -c "import urllib.request; urllib.request.urlopen('
                    f"'http://127.0.0.1:{HEALTH_PORT}{HEALTH_PATH}', timeout=3)\" || exit 1",
                ],
                interval=Duration.seconds(30),
                timeout=Duration.seconds(5),
                retries=3,
                start_period=Duration.seconds(30),
            ),
            stop_timeout=self._props.stop_timeout,
            essential=True,
        )

    def _build_environment(self) -> dict[str, str]:
        """What :meth:`streamfleet.worker.config.WorkerConfig.from_env` reads."""
        props = self._props
        return {
            model.ENV_TABLE_NAME: props.lease_table.table_name,
            model.ENV_MESSAGES_TABLE_NAME: props.messages_table.table_name,
            model.ENV_QUEUE_URL: props.queue.queue_url,
            model.ENV_ALLOWED_UPSTREAMS: allowed_upstreams_env(props.allowed_upstreams),
            model.ENV_SERVICE_NAME: self.service_name,
            "HEALTH_PORT": str(HEALTH_PORT),
            "LEASE_SECONDS": _seconds(props.lease_seconds),
            "HEARTBEAT_EVERY": _seconds(props.heartbeat_seconds),
            "RECONCILE_EVERY": _seconds(props.reconcile_seconds),
            "MAX_CONNECTIONS": str(props.max_connections),
            model.ENV_MEMORY_LIMIT_MIB: str(props.memory_limit_mib),
            "METRICS_EVERY": str(METRICS_EVERY_SECONDS),
            model.ENV_MESSAGE_RETENTION_DAYS: str(props.message_retention_days),
        }

    # --- Service and scaling ---

    def _build_service(self) -> ecs.FargateService:
        props = self._props
        return ecs.FargateService(
            self,
            "Service",
            cluster=self.cluster,
            task_definition=self.task_definition,
            desired_count=props.desired_count,
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            vpc_subnets=props.subnets
            or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            assign_public_ip=False,
        )

    def _build_active_connections_metric(self) -> cloudwatch.Metric:
        return self.metric_active_connections()

    def metric_active_connections(
        self, *, period: Duration | None = None, statistic: str = "Average"
    ) -> cloudwatch.Metric:
        """The fleet's connections per task, as the workers publish them (EMF): what the
        service scales on. Default: the average over 1 minute."""
        return cloudwatch.Metric(
            namespace=model.METRIC_NAMESPACE,
            metric_name=model.METRIC_ACTIVE_CONNECTIONS,
            dimensions_map={model.METRIC_DIMENSION_SERVICE: self.service_name},
            statistic=statistic,
            period=period or Duration.minutes(1),
        )

    def metric_leases_lost(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """Leases the workers lost (sessions lapsed), summed; default over 5 minutes. A healthy
        fleet hands leases over and never loses one."""
        return cloudwatch.Metric(
            namespace=model.METRIC_NAMESPACE,
            metric_name=model.METRIC_LEASES_LOST,
            dimensions_map={model.METRIC_DIMENSION_SERVICE: self.service_name},
            statistic="Sum",
            period=period or Duration.minutes(5),
        )

    def metric_running_tasks(self, *, period: Duration | None = None) -> cloudwatch.Metric:
        """The service's running tasks (Container Insights), the minimum; default over 1
        minute."""
        return cloudwatch.Metric(
            namespace="ECS/ContainerInsights",
            metric_name="RunningTaskCount",
            dimensions_map={
                "ClusterName": self.cluster.cluster_name,
                "ServiceName": self.service.service_name,
            },
            statistic="Minimum",
            period=period or Duration.minutes(1),
        )

    def _build_leases_lost_alarm(self) -> cloudwatch.Alarm:
        """A healthy fleet hands leases over; it never loses them. A loss means a worker's
        session lapsed: DynamoDB slow or throttled, a CPU-starved task, or clocks further apart
        than the skew allowance. Each loss already closed the connection safely, so this is a
        ticket, not a page."""
        return cloudwatch.Alarm(
            self,
            "LeasesLostAlarm",
            alarm_description=(
                "StreamFleet: workers lost leases (sessions lapsed); "
                "see docs/operations.md, What each alarm means"
            ),
            metric=self.metric_leases_lost(),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _build_running_tasks_alarm(self) -> cloudwatch.Alarm | None:
        """Fewer running workers than the minimum for five minutes: tasks keep failing to start
        (image, permissions, capacity) or keep dying. Missing data is breaching: Container
        Insights stops reporting a service that runs nothing."""
        minimum = self._props.min_capacity
        if minimum < 1:
            return None
        return cloudwatch.Alarm(
            self,
            "RunningTasksAlarm",
            alarm_description=(
                f"StreamFleet: fewer than {minimum} worker task(s) running for 5 minutes"
            ),
            metric=self.metric_running_tasks(),
            threshold=minimum,
            evaluation_periods=5,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )

    def _build_scaling(self) -> ecs.ScalableTaskCount:
        props = self._props
        scaling = self.service.auto_scale_task_count(
            min_capacity=props.min_capacity, max_capacity=props.max_capacity
        )
        scaling.scale_to_track_custom_metric(
            model.METRIC_ACTIVE_CONNECTIONS,
            metric=self.active_connections,
            target_value=props.target_connections_per_task,
            scale_out_cooldown=props.scale_out_cooldown,
            scale_in_cooldown=props.scale_in_cooldown,
        )
        return scaling

    # --- cdk-nag ---

    def _acknowledge_findings(self) -> None:
        """Each acknowledgment says why the finding does not apply to the worker."""
        acknowledge(
            self.task_definition,
            "ECS2",
            "The environment holds only names, URLs and timings (table names, queue URL, "
            "upstream allow-list, lease durations), no secrets; the worker gets credentials "
            "from its task role.",
        )
        acknowledge(
            self.task_definition.obtain_execution_role(),
            "IAM5[Resource::*]",
            "ecr:GetAuthorizationToken, which CDK grants the execution role to pull the "
            "worker image, supports no resource-level permissions; the pull actions "
            "themselves are limited to the image's repository.",
        )

    # --- checkov ---

    def _skip_checkov_findings(self) -> None:
        """CDK's provider of the created VPC's default-security-group cleanup (none for a VPC
        the caller gives, or with the flag off)."""
        provider = Stack.of(self).node.try_find_child(RESTRICT_DEFAULT_SG_PROVIDER)
        if provider is None:
            return
        handler = provider.node.find_child("Handler")
        for check, reason in RESTRICT_DEFAULT_SG_SKIPS.items():
            skip_checkov(handler, check, reason)
