"""One stack per Region: the primary declares the global tables, the secondary references them.

Both stacks expose the same attributes (``lease_table``, ``messages_table``), so what later
slices add to a Region (the worker service, the API) is wired the same way in either role.
"""

from __future__ import annotations

from enum import StrEnum

from aws_cdk import Acknowledgment, App, CfnOutput, Environment, Stack, Validations
from constructs import Construct

from streamfleet_cdk.config import AppConfig
from streamfleet_cdk.tables import FleetTableReplicas, FleetTables, FleetTablesProps

PRIMARY_STACK_NAME = "StreamFleet-Primary"
SECONDARY_STACK_NAME = "StreamFleet-Secondary"


class Role(StrEnum):
    """What a Region's stack does with the global tables."""

    PRIMARY = "primary"  # declares them, with a replica in the secondary Region
    SECONDARY = "secondary"  # references its local replica by name


class FleetStack(Stack):
    """The fleet's resources in one Region.

    The ``env`` is always explicit (``config.account`` and the role's Region): global table
    replicas and, later, cross-Region wiring need a concrete Region at synth time.

    Attributes:
        role: :class:`Role` of this stack.
        lease_table: the lease table (declared here in the primary, the local replica otherwise).
        messages_table: the messages table, likewise.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: AppConfig, role: str
    ) -> None:
        try:
            self.role = Role(role)
        except ValueError:
            choices = ", ".join(repr(r.value) for r in Role)
            raise ValueError(f"role: expected one of {choices}, got {role!r}") from None
        region = config.primary_region if self.role is Role.PRIMARY else config.secondary_region
        super().__init__(
            scope,
            construct_id,
            env=Environment(account=config.account, region=region),
            description=f"StreamFleet ({self.role.value} Region): leased WebSocket worker fleet",
        )

        if self.role is Role.PRIMARY:
            tables: FleetTables | FleetTableReplicas = FleetTables(
                self,
                "Tables",
                props=FleetTablesProps(
                    replica_regions=config.replica_regions,
                    deletion_protection=config.deletion_protection,
                    lease_table_name=config.lease_table_name,
                    messages_table_name=config.messages_table_name,
                ),
            )
        else:
            tables = FleetTableReplicas(
                self,
                "Tables",
                lease_table_name=config.lease_table_name,
                messages_table_name=config.messages_table_name,
            )
            self._acknowledge_empty_template()
        self.lease_table = tables.lease_table
        self.messages_table = tables.messages_table

        CfnOutput(self, "LeaseTableName", value=self.lease_table.table_name)
        CfnOutput(self, "MessagesTableName", value=self.messages_table.table_name)

    def _acknowledge_empty_template(self) -> None:
        """Let synth pass while the secondary stack holds only references (no resources yet).

        With ``@aws-cdk/core:validateAgainstDefaultRules`` on, an empty ``Resources`` section is
        a synth error unless the CLI adds its ``CDKMetadata`` resource (it does not with
        ``--no-version-reporting``). ``cdk deploy`` skips a stack without resources, so the
        acknowledgment is harmless, and moot once this stack holds the Region's worker service.
        """
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="CloudFormation-Validate::F0001",
                reason="the secondary Region only references the global tables' replicas so far",
            )
        )


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
