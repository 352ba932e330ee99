"""One stack per Region: tables (declared in the primary, referenced in the secondary), the
event ingestion (API, router, queue) and the worker fleet.

The fleet stack also owns its Region's singletons, which the WebSocket API stack of the same
Region uses too (and so deploys after it): the API Gateway CloudWatch role (the account setting
every stage's logs need; ``streamfleet:api_gateway_cloudwatch_role=false`` leaves it to the
account's baseline) and the alarm topic every alarm of both stacks notifies.

Both stacks expose the same attributes, so a Region's stack is wired the same way in either
role. Stacks only wire constructs; every decision with a reason lives in a construct.
"""

from __future__ import annotations

from aws_cdk import Annotations, App, CfnOutput, Duration, Fn
from constructs import Construct

from stacks.regional import RegionalStack, Role
from streamfleet import model
from streamfleet_cdk.alarms import AlarmNotifications, AlarmTopic
from streamfleet_cdk.api_gateway_account import ApiGatewayAccount
from streamfleet_cdk.config import AppConfig, context_key
from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.tables import FleetTableReplicas, FleetTables, FleetTablesProps
from streamfleet_cdk.worker_fleet import VPC_AZS, WorkerFleet, WorkerFleetProps

PRIMARY_STACK_NAME = "StreamFleet-Primary"
SECONDARY_STACK_NAME = "StreamFleet-Secondary"

OPEN_TO_ACCOUNT = "streamfleet:invoke-open-to-account"


class FleetStack(RegionalStack):
    """The fleet's resources in one Region.

    The Region is always explicit (global table replicas need a concrete Region at synth time);
    the account is ``config.account``, or the deploying credentials' when that is unset.

    Attributes:
        role: :class:`Role` of this stack.
        alarm_topic: the Region's alarm topic; every alarm of this stack notifies it.
        api_gateway_account: the Region's API Gateway CloudWatch role and account setting
            (``None`` when the account's baseline manages it).
        lease_table: the lease table (declared here in the primary, the local replica otherwise).
        messages_table: the messages table, likewise.
        ingestion: this Region's :class:`EventIngestion` (API, router, queue).
        fleet: this Region's :class:`WorkerFleet`.
        task_stopped: the rule and Lambda that end a STOPPED task's sessions at once
            (:class:`~streamfleet_cdk.task_events.TaskStoppedHandler`; ``None`` when
            ``streamfleet:task_stopped_handler`` is off).
        active: whether this Region's fleet claims leases (``False``: a standby scaled to zero).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: AppConfig, role: str
    ) -> None:
        super().__init__(
            scope, construct_id, config=config, role=role, purpose="leased WebSocket worker fleet"
        )
        primary = self.primary
        self.active = primary or config.secondary_active
        self.alarm_topic = AlarmTopic(self, "Alarms", email=config.alarm_email).topic
        self.api_gateway_account = (
            ApiGatewayAccount(self, "ApiGatewayAccount")
            if config.api_gateway_cloudwatch_role
            else None
        )
        tables = self._build_tables(config)
        self.lease_table = tables.lease_table
        self.messages_table = tables.messages_table
        retention = config.log_retention
        self.ingestion = EventIngestion(
            self,
            "Ingestion",
            props=EventIngestionProps(
                lease_table=self.lease_table,
                allowed_upstreams=config.allowed_upstreams,
                throttling_rate_limit=config.api_rate_limit,
                throttling_burst_limit=config.api_burst_limit,
                invoke_principals=config.invoke_principals,
                reserved_concurrency=config.router_reserved_concurrency,
                log_level=config.lambda_log_level,
                log_retention=retention,
            ),
        )
        if self.api_gateway_account is not None:
            # The stage writes logs from its first deployment: the role must be set by then.
            self.ingestion.api.deployment_stage.node.add_dependency(
                self.api_gateway_account.account
            )
        self.fleet = WorkerFleet(
            self,
            "Workers",
            props=WorkerFleetProps(
                lease_table=self.lease_table,
                messages_table=self.messages_table,
                queue=self.ingestion.queue,
                allowed_upstreams=config.allowed_upstreams,
                service_name=model.DEFAULT_WORKER_SERVICE_NAME,
                cpu=config.worker_cpu,
                memory_limit_mib=config.worker_memory_mib,
                desired_count=None if self.active else 0,
                min_capacity=config.min_tasks if self.active else 0,
                max_capacity=config.max_tasks,
                target_connections_per_task=config.target_connections_per_task,
                scale_out_cooldown=Duration.seconds(config.scale_out_cooldown_seconds),
                scale_in_cooldown=Duration.seconds(config.scale_in_cooldown_seconds),
                max_connections=config.max_connections,
                lease_seconds=config.lease_seconds,
                heartbeat_seconds=config.heartbeat_seconds,
                reconcile_seconds=config.reconcile_seconds,
                stop_timeout=Duration.seconds(config.stop_timeout_seconds),
                nat_gateways=config.nat_gateways,
                message_retention_days=config.message_retention_days,
                log_retention=retention,
            ),
        )
        # Both Regions: each acts only on its own tasks' events and its own sessions, so the
        # standby's never fires until its fleet runs (a promotion needs no redeploy of it).
        self.task_stopped = (
            self.fleet.add_task_stopped_handler(
                reserved_concurrency=config.task_stopped_reserved_concurrency,
                log_level=config.lambda_log_level,
                log_retention=retention,
            )
            if config.task_stopped_handler
            else None
        )
        AlarmNotifications.apply(self, self.alarm_topic)
        self._warn_about_two_active_regions(config)
        self._warn_about_an_open_api(config)
        self._build_outputs()

    @property
    def availability_zones(self) -> list[str]:
        """The Region's first AZs as ``Fn::GetAZs`` tokens, resolved at deploy time.

        CDK's default for a stack with an explicit ``env`` is a context lookup, which needs AWS
        credentials at synth; ``cdk synth`` must work without any.
        """
        return [Fn.select(index, Fn.get_azs()) for index in range(VPC_AZS)]

    def _build_tables(self, config: AppConfig) -> FleetTables | FleetTableReplicas:
        """Declare the global tables in the primary; reference the replicas elsewhere."""
        if self.role is Role.PRIMARY:
            return FleetTables(
                self,
                "Tables",
                props=FleetTablesProps(
                    replica_regions=config.replica_regions,
                    deletion_protection=config.deletion_protection,
                    lease_table_name=config.lease_table_name,
                    messages_table_name=config.messages_table_name,
                    strong_consistency=config.multi_region_strong_consistency,
                    witness_region=config.witness_region,
                ),
            )
        return FleetTableReplicas(
            self,
            "Tables",
            lease_table_name=config.lease_table_name,
            messages_table_name=config.messages_table_name,
        )

    def _warn_about_two_active_regions(self, config: AppConfig) -> None:
        """Both fleets claiming leases is safe only on a strongly consistent lease table."""
        if (
            self.role is Role.SECONDARY
            and self.active
            and not config.multi_region_strong_consistency
        ):
            Annotations.of(self).add_warning_v2(
                "streamfleet:secondary-active-eventual",
                "streamfleet:secondary_active is on with eventually consistent tables: both "
                "Regions' fleets may claim the same lease. Do this only for a failover, with "
                "the primary fleet stopped.",
            )

    def _warn_about_an_open_api(self, config: AppConfig) -> None:
        """Without named principals, IAM policies alone decide who may START and STOP."""
        if not config.invoke_principals:
            Annotations.of(self).add_warning_v2(
                OPEN_TO_ACCOUNT,
                f"{context_key('invoke_principals')} is not set: every principal of this "
                "account whose IAM policy allows execute-api:Invoke on this API may START and "
                "STOP any stream. Name the producers' roles to allow them and deny everyone else.",
            )

    def _build_outputs(self) -> None:
        CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn)
        CfnOutput(self, "LeaseTableName", value=self.lease_table.table_name)
        CfnOutput(self, "MessagesTableName", value=self.messages_table.table_name)
        CfnOutput(self, "ApiUrl", value=self.ingestion.api.url)
        CfnOutput(self, "QueueUrl", value=self.ingestion.queue.queue_url)
        CfnOutput(self, "ClusterName", value=self.fleet.cluster.cluster_name)
        CfnOutput(self, "ServiceName", value=self.fleet.service.service_name)


def add_fleet_stacks(app: App, config: AppConfig) -> tuple[FleetStack, FleetStack]:
    """Add the primary and the secondary stack to ``app``; the secondary deploys second.

    The order matters on a first deployment: the secondary Region's replica exists only once the
    primary stack has created the global table.
    """
    primary = FleetStack(app, PRIMARY_STACK_NAME, config=config, role=Role.PRIMARY)
    secondary = FleetStack(app, SECONDARY_STACK_NAME, config=config, role=Role.SECONDARY)
    secondary.add_stack_dependency(
        primary, "the global tables and their replicas are declared there"
    )
    return primary, secondary
