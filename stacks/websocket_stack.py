"""One stack per Region for the client-facing WebSocket API: its tables, the API, the canary
with its alarm and health check, (with a custom domain) this Region's failover record, and the
live delivery of the fleet's streams (the fan-out of this Region's messages-table stream to the
API's subscribed clients; the fleet's tables are referenced by name, as in the fleet's own
secondary stack), and, with ``streamfleet:demo_auction`` (the default), the demo auction's
routes on the API's handler (``examples/auction``).

These are stacks of their own, next to the fleet's: the two halves of the product share the
Regions and the account, and each Region's singletons, which the fleet stack of that Region owns
(the API Gateway CloudWatch role the stage's access logs need, and the alarm topic, addressed by
name). So each WebSocket stack deploys after its Region's fleet stack.
Both Regions' stacks are built alike; the primary declares the state global table (the secondary
references its replica) and the PRIMARY failover record, the secondary the SECONDARY record. The
records share one name in one hosted zone, so neither stack needs a value from the other Region.
"""

from __future__ import annotations

from aws_cdk import Annotations, App, CfnOutput, Duration, Stack
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_route53 as route53
from constructs import Construct

from stacks.regional import RegionalStack, Role
from streamfleet import model
from streamfleet_auction_cdk import auction_extension
from streamfleet_cdk.alarms import AlarmNotifications, topic_by_name
from streamfleet_cdk.canary import WebSocketCanary, WebSocketCanaryProps
from streamfleet_cdk.config import WS_DOMAIN_SETTINGS, AppConfig, context_key
from streamfleet_cdk.failover_dns import FailoverRecords, FailoverRecordsProps, FailoverTarget
from streamfleet_cdk.live_delivery import (
    LiveDeliveryTables,
    MessagesStream,
    StreamFanout,
    StreamFanoutProps,
)
from streamfleet_cdk.websocket_api import (
    CustomDomain,
    JwtSettings,
    WebSocketApi,
    WebSocketApiProps,
    WebSocketTables,
    WebSocketTablesProps,
)

PRIMARY_WS_STACK_NAME = "StreamFleet-WebSocket-Primary"
SECONDARY_WS_STACK_NAME = "StreamFleet-WebSocket-Secondary"

NO_DOMAIN = "streamfleet:ws-no-custom-domain"
PLACEHOLDER_JWT = "streamfleet:ws-placeholder-jwt"
NO_CANARY_TOKEN = "streamfleet:ws-canary-without-token"


class WebSocketApiStack(RegionalStack):
    """The WebSocket API's resources in one Region.

    Attributes:
        role: :class:`~stacks.fleet_stack.Role` of this stack.
        state_table: the state table (declared here in the primary, the replica otherwise).
        connections_table: this Region's connections table.
        websocket: this Region's :class:`WebSocketApi`.
        canary: this Region's :class:`WebSocketCanary` (alarm and health check).
        failover: this Region's :class:`FailoverRecords` (``None`` without a custom domain).
        alarm_topic: the Region's alarm topic (declared by the fleet stack); every alarm of
            this stack notifies it.
        subscriptions_table: this Region's subscriptions table.
        live: the tables live delivery reads and writes (:class:`LiveDeliveryTables`).
        messages_stream: this Region's stream of the fleet's messages table.
        fanout: this Region's :class:`StreamFanout`.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: AppConfig, role: str
    ) -> None:
        super().__init__(
            scope, construct_id, config=config, role=role, purpose="client-facing WebSocket API"
        )
        primary = self.primary
        tables = WebSocketTables(
            self,
            "Tables",
            props=WebSocketTablesProps(
                declare_state_table=primary,
                replica_regions=config.replica_regions if primary else (),
                deletion_protection=config.deletion_protection,
                state_table_name=config.ws_state_table_name,
                connections_table_name=config.ws_connections_table_name,
                subscriptions_table_name=config.ws_subscriptions_table_name,
            ),
        )
        self.state_table = tables.state_table
        self.connections_table = tables.connections_table
        self.subscriptions_table = tables.subscriptions_table
        # The fleet's tables (declared by the primary fleet stack, replicated here).
        messages_table = dynamodb.TableV2.from_table_name(
            self, "MessagesTable", config.messages_table_name
        )
        self.live = live = LiveDeliveryTables(
            streams_table=dynamodb.TableV2.from_table_name(
                self, "StreamsTable", config.lease_table_name
            ),
            messages_table=messages_table,
            subscriptions_table=self.subscriptions_table,
            max_subscribers_per_stream=config.max_subscribers_per_stream,
            max_user_connections_per_stream=config.max_user_connections_per_stream,
        )
        self.websocket = WebSocketApi(
            self,
            "WebSocket",
            props=WebSocketApiProps(
                state_table=self.state_table,
                connections_table=self.connections_table,
                jwt=JwtSettings(
                    issuer=config.jwt_issuer,
                    audience=config.jwt_audience,
                    jwks_url=config.jwt_jwks_url,
                    canary_keys=config.canary_public_keys,
                    reader_claims=config.jwt_reader_claims,
                ),
                custom_domain=self._custom_domain(config),
                throttling_rate_limit=config.ws_api_rate_limit,
                throttling_burst_limit=config.ws_api_burst_limit,
                reserved_concurrency=config.ws_handler_reserved_concurrency,
                authorizer_reserved_concurrency=config.authorizer_reserved_concurrency,
                log_level=config.lambda_log_level,
                log_retention=config.log_retention,
                live=live,
                handler_extension=(
                    auction_extension(config.ws_state_home_region or config.primary_region)
                    if config.demo_auction
                    else None
                ),
            ),
        )
        self.messages_stream = MessagesStream(
            self,
            "MessagesStream",
            table=messages_table,
            log_level=config.lambda_log_level,
            log_retention=config.log_retention,
        )
        self.fanout = StreamFanout(
            self,
            "Fanout",
            props=StreamFanoutProps(
                stream_arn=self.messages_stream.stream_arn,
                subscriptions_table=self.subscriptions_table,
                streams_table=live.streams_table,
                api=self.websocket.api,
                stage=self.websocket.stage,
                reserved_concurrency=config.fanout_reserved_concurrency,
                max_batching_window=Duration.seconds(config.fanout_batching_window_seconds),
                log_level=config.lambda_log_level,
                log_retention=config.log_retention,
                service_name=model.FANOUT_SERVICE_NAME,
            ),
        )
        self.canary = WebSocketCanary(
            self,
            "Canary",
            props=WebSocketCanaryProps(
                api=self.websocket.api,
                stage=self.websocket.stage,
                domain_name=self.websocket.domain_name,
                domain_mapping=self.websocket.api_mapping,
                state_table=self.connections_table,
                jwt_audience=config.jwt_audience,
                signing_key_secret_name=config.canary_signing_key_secret_name,
                public_keys=config.canary_public_keys,
                token_transport=config.canary_token_transport,
                healthy_runs_to_recover=config.canary_healthy_runs_to_recover,
                # Only the primary sweeps. The SECONDARY record has no health check: while the
                # primary is unhealthy the name answers with the secondary whatever its own
                # canary says, so a sweep there would only send its clients straight back.
                disconnect_when_unhealthy=self.role is Role.PRIMARY,
                reserved_concurrency=config.canary_reserved_concurrency,
                log_level=config.lambda_log_level,
                log_retention=config.log_retention,
            ),
        )
        self.alarm_topic = topic_by_name(self, "AlarmTopic")
        AlarmNotifications.apply(self, self.alarm_topic)
        self.failover = self._build_failover(config)
        self._annotate(config)
        self._build_outputs()

    def _custom_domain(self, config: AppConfig) -> CustomDomain | None:
        if not config.ws_custom_domain:
            return None
        arn = (
            config.ws_certificate_arn_primary
            if self.role is Role.PRIMARY
            else config.ws_certificate_arn_secondary
        )
        return CustomDomain(
            domain_name=str(config.ws_domain_name),
            certificate=acm.Certificate.from_certificate_arn(self, "Certificate", str(arn)),
        )

    def _build_failover(self, config: AppConfig) -> FailoverRecords | None:
        """This Region's half of the pair: PRIMARY (with the health check) or SECONDARY."""
        domain = self.websocket.domain_name
        if domain is None:
            return None
        zone = route53.HostedZone.from_hosted_zone_attributes(
            self,
            "HostedZone",
            hosted_zone_id=str(config.hosted_zone_id),
            zone_name=str(config.hosted_zone_name).removesuffix("."),
        )
        primary = self.role is Role.PRIMARY
        target = FailoverTarget.of_domain(
            domain,
            set_identifier=f"{self.region}-{self.role.value}",
            health_check=self.canary.health_check if primary else None,
        )
        return FailoverRecords(
            self,
            "Failover",
            props=FailoverRecordsProps(
                zone=zone,
                record_name=str(config.ws_domain_name),
                primary=target if primary else None,
                secondary=None if primary else target,
            ),
        )

    def _annotate(self, config: AppConfig) -> None:
        """Say what is missing for a deployment that clients can use and that fails over."""
        annotations = Annotations.of(self)
        if not config.ws_custom_domain:
            keys = ", ".join(context_key(name) for name in WS_DOMAIN_SETTINGS)
            annotations.add_info(
                f"[{NO_DOMAIN}] No custom domain: clients reach this Region's API only at its "
                f"regional URL, and there are no failover records. Set {keys} (and "
                f"{context_key('canary_signing_key_secret_name')}) for DNS failover."
            )
        if config.jwt_placeholders:
            keys = ", ".join(context_key(name) for name in config.jwt_placeholders)
            annotations.add_warning_v2(
                PLACEHOLDER_JWT,
                f"{keys} still name the example.com placeholder: the authorizer will refuse "
                "every client until they name your identity provider.",
            )
        if config.canary_signing_key_secret_name is None:
            annotations.add_warning_v2(
                NO_CANARY_TOKEN,
                f"{context_key('canary_signing_key_secret_name')} is not set: the canary "
                "connects without a token, the authorizer refuses it, and the health alarm "
                "stays in ALARM.",
            )

    def _build_outputs(self) -> None:
        websocket = self.websocket
        CfnOutput(self, "WebSocketApiId", value=websocket.api.api_id)
        CfnOutput(self, "WebSocketRegionalUrl", value=websocket.stage.url)
        if websocket.domain_name is not None:
            CfnOutput(self, "WebSocketUrl", value=f"wss://{websocket.domain_name.name}")
        CfnOutput(self, "StateTableName", value=self.state_table.table_name)
        CfnOutput(self, "ConnectionsTableName", value=self.connections_table.table_name)
        CfnOutput(self, "SubscriptionsTableName", value=self.subscriptions_table.table_name)
        CfnOutput(self, "FanoutFunctionName", value=self.fanout.function.function_name)
        CfnOutput(self, "HealthAlarmName", value=self.canary.alarm.alarm_name)
        CfnOutput(self, "HealthCheckId", value=self.canary.health_check.health_check_id)


def add_websocket_stacks(
    app: App, config: AppConfig, *, region_owners: tuple[Stack, Stack] | None = None
) -> tuple[WebSocketApiStack, WebSocketApiStack]:
    """Add the primary and the secondary WebSocket API stack; the secondary deploys second
    (its state table is the replica of the global table the primary declares).

    ``region_owners``: the ``(primary, secondary)`` stacks that own each Region's API Gateway
    CloudWatch role and alarm topic (the fleet stacks, as ``app.py`` passes them); each
    WebSocket stack deploys after its Region's. ``None`` (tests of these stacks alone): the
    Region's role and topic are assumed to exist already.
    """
    primary = WebSocketApiStack(app, PRIMARY_WS_STACK_NAME, config=config, role=Role.PRIMARY)
    secondary = WebSocketApiStack(app, SECONDARY_WS_STACK_NAME, config=config, role=Role.SECONDARY)
    secondary.add_stack_dependency(primary, "the state global table and its replica are there")
    if region_owners is not None:
        for stack, owner in zip((primary, secondary), region_owners, strict=True):
            if owner.region != stack.region:
                raise ValueError(
                    f"region_owners: {owner.stack_name} is in {owner.region}, "
                    f"{stack.stack_name} in {stack.region}"
                )
            stack.add_stack_dependency(
                owner, "the Region's API Gateway CloudWatch role and alarm topic are there"
            )
    return primary, secondary
