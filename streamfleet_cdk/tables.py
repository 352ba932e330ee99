"""The fleet's two DynamoDB global tables, declared from the runtime's data model.

The lease table and the messages table are built from :data:`streamfleet.model.LEASE_TABLE` and
:data:`streamfleet.model.MESSAGES_TABLE`: key schema, key types, every global secondary index and
the TTL attribute are read from those specs, never retyped. A name changed in the model changes
the deployed table with it; a typo cannot make the worker query an index that does not exist.

A global table is declared exactly once, in the primary Region's stack, with a replica in each
other Region (:class:`FleetTables`). Stacks in the other Regions only *reference* their local
replica by name (:class:`FleetTableReplicas`); declaring the table again there would make
CloudFormation try to create a second table of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from streamfleet import model
from streamfleet_cdk.at_rest import check_removal_policy

# The model spells DynamoDB scalar types as their wire letters; CDK wants its own enum.
_ATTRIBUTE_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}

_PROJECTION_TYPES = {
    model.Projection.KEYS_ONLY: dynamodb.ProjectionType.KEYS_ONLY,
    model.Projection.INCLUDE: dynamodb.ProjectionType.INCLUDE,
    model.Projection.ALL: dynamodb.ProjectionType.ALL,
}


# What reading a table takes, and nothing that writes: ``grant_read``'s actions.
TABLE_READ_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:Scan",
)


@dataclass(frozen=True, kw_only=True)
class FleetTablesProps:
    """How :class:`FleetTables` declares the tables.

    Attributes:
        replica_regions: Regions that get a replica besides the stack's own Region. Empty (the
            default) means a single-Region table (still a global table, so replicas can be
            added later without replacing it).
        deletion_protection: DynamoDB's own guard against ``DeleteTable``, on every replica. A
            lost lease table means every connection loses its owner at once, so it defaults on.
        message_ttl: enable TTL on the messages table's ``model.MESSAGES_TABLE.ttl_attribute``,
            so stored messages expire instead of growing the table forever (the workers write
            it from ``MESSAGE_RETENTION_DAYS``); on by default. Every other table gets its
            spec's TTL attribute, if it has one (the lease table: ended sessions).
        lease_table_name: physical name of the lease table; ``None`` lets CloudFormation
            generate one from the stack's name, so two sets in one account never claim the same
            table. Name it when a stack in another Region must find the replicas
            (:class:`FleetTableReplicas`): CloudFormation has no cross-Region reference.
        messages_table_name: physical name of the messages table; ``None``: generated, as above.
        removal_policy: what happens to the tables (and their replicas) when they leave the
            stack or the stack is deleted; ``RemovalPolicy.RETAIN`` (the default) keeps them.
            ``DESTROY`` only for throw-away deployments (``deletion_protection`` must then be
            off too, or CloudFormation cannot delete them). ``SNAPSHOT`` is refused: DynamoDB
            has none.
        strong_consistency: declare the *lease* table with multi-Region strong consistency
            (MRSC), so a conditional write is atomic across Regions and both Regions' fleets may
            claim leases. MRSC needs three Regions of one Region set: the stack's, one replica
            and ``witness_region`` (or two replicas and no witness). The messages table stays
            eventually consistent: its writes are idempotent (``(pk, seq)``) and MRSC would only
            add latency to them. CDK checks the Region set at synth. Off by default.
        witness_region: the MRSC witness Region (holds no replica, only votes); ``None`` by
            default.
    """

    replica_regions: tuple[str, ...] = ()
    deletion_protection: bool = True
    message_ttl: bool = True
    lease_table_name: str | None = None
    messages_table_name: str | None = None
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    strong_consistency: bool = False
    witness_region: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.replica_regions, str):
            # A bare string would be iterated letter by letter into one-character "Regions".
            raise ValueError("replica_regions: expected a tuple of Region names, got a string")
        if len(set(self.replica_regions)) != len(self.replica_regions):
            raise ValueError(f"replica_regions: duplicate Region in {self.replica_regions!r}")
        check_removal_policy("removal_policy", self.removal_policy)
        if self.witness_region and not self.strong_consistency:
            raise ValueError("witness_region: only meaningful with strong_consistency")
        if self.strong_consistency:
            self._check_strong_consistency()

    def _check_strong_consistency(self) -> None:
        replicas = len(self.replica_regions)
        if self.witness_region:
            if replicas != 1:
                raise ValueError(
                    f"replica_regions: strong consistency with a witness needs exactly one "
                    f"replica Region, got {replicas}"
                )
            if self.witness_region in self.replica_regions:
                raise ValueError("witness_region: must differ from the replica Regions")
        elif replicas != 2:
            raise ValueError(
                "witness_region: strong consistency needs a witness Region with one replica "
                f"(or two replicas and no witness); got {replicas} replica(s) and no witness"
            )


class FleetTables(Construct):
    """The lease table and the messages table, as DynamoDB global tables (``TableV2``).

    Both tables bill on demand (lease traffic follows the number of workers and START/STOP
    bursts, not a steady rate), keep point-in-time recovery on (the lease table *is* the fleet's
    state), and are replicated to ``props.replica_regions`` so a secondary Region's fleet can take
    over with the leases and the resume positions (``last_seq``) already there.

    Replication is eventually consistent by default: a conditional write is atomic only within
    one Region, which is why only one Region's fleet may claim leases at a time (see the design).
    ``strong_consistency`` makes the lease table MRSC, where the same writes are safe across
    Regions.

    The stack that holds this construct needs an explicit ``env``: replicas are per Region and
    CDK must know which Region is the primary.

    Attributes:
        lease_table: connection items and session items, with every index of
            ``model.LEASE_TABLE.indexes``.
        messages_table: upstream messages under ``(pk, seq)``.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: FleetTablesProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.lease_table: dynamodb.TableV2 = self._build_table(
            "LeaseTable",
            spec=model.LEASE_TABLE,
            table_name=props.lease_table_name,
            strong=props.strong_consistency,
        )
        self.messages_table: dynamodb.TableV2 = self._build_table(
            "MessagesTable",
            spec=model.MESSAGES_TABLE,
            table_name=props.messages_table_name,
            ttl=props.message_ttl,
        )

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read both tables and the lease table's indexes (``GetItem``,
        ``BatchGetItem``, ``Query``, ``Scan``): what the operator CLI reads, and a dashboard's
        or an audit's view. No write, so it can never take or end a lease."""
        lease_arn = self.lease_table.table_arn
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=list(TABLE_READ_ACTIONS),
            resource_arns=[
                lease_arn,
                f"{lease_arn}/index/*",
                self.messages_table.table_arn,
            ],
        )

    def _build_table(
        self,
        construct_id: str,
        *,
        spec: model.TableSpec,
        table_name: str | None,
        ttl: bool = True,
        strong: bool = False,
    ) -> dynamodb.TableV2:
        """One global table from its spec (keys, indexes, TTL attribute); everything else is
        shared policy. ``ttl=False`` leaves the spec's TTL attribute off."""
        return dynamodb.TableV2(
            self,
            construct_id,
            table_name=table_name,
            partition_key=self._build_attribute(spec.partition_key, "S"),
            sort_key=(
                self._build_attribute(spec.sort_key, spec.sort_key_type) if spec.sort_key else None
            ),
            global_secondary_indexes=[self._build_index(index) for index in spec.indexes] or None,
            billing=dynamodb.Billing.on_demand(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            deletion_protection=self._props.deletion_protection,
            time_to_live_attribute=spec.ttl_attribute if ttl else None,
            replicas=self._build_replicas(),
            removal_policy=self._props.removal_policy,
            multi_region_consistency=dynamodb.MultiRegionConsistency.STRONG if strong else None,
            witness_region=self._props.witness_region if strong else None,
        )

    @staticmethod
    def _build_attribute(name: str, type_letter: str) -> dynamodb.Attribute:
        """A key attribute; ``type_letter`` is DynamoDB's scalar type letter, as in the model."""
        try:
            attribute_type = _ATTRIBUTE_TYPES[type_letter]
        except KeyError:
            raise ValueError(f"{name}: unknown DynamoDB key type {type_letter!r}") from None
        return dynamodb.Attribute(name=name, type=attribute_type)

    @classmethod
    def _build_index(cls, index: model.IndexSpec) -> dynamodb.GlobalSecondaryIndexPropsV2:
        """A GSI from an :class:`~streamfleet.model.IndexSpec` (index keys are strings)."""
        return dynamodb.GlobalSecondaryIndexPropsV2(
            index_name=index.name,
            partition_key=cls._build_attribute(index.partition_key, "S"),
            sort_key=cls._build_attribute(index.sort_key, "S") if index.sort_key else None,
            projection_type=_PROJECTION_TYPES[index.projection],
            non_key_attributes=list(index.non_key_attributes) or None,
        )

    def _build_replicas(self) -> list[dynamodb.ReplicaTableProps]:
        """One replica per extra Region; each inherits the table's PITR and deletion guard."""
        return [dynamodb.ReplicaTableProps(region=region) for region in self._props.replica_regions]


class FleetTableReplicas(Construct):
    """The fleet tables' replicas in this stack's Region, referenced by name.

    A stack in a replica Region uses this instead of :class:`FleetTables`: the global table is
    declared once, by the primary Region's stack, and each replica is a table of the same name in
    its own Region. Referencing by name needs no cross-Region reference (CloudFormation has none)
    and yields ARNs in this stack's Region, which is what its grants and environment need.

    Attributes:
        lease_table: the local replica of the lease table.
        messages_table: the local replica of the messages table.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        lease_table_name: str,
        messages_table_name: str,
    ) -> None:
        """The names are those the primary Region's :class:`FleetTables` was given: a generated
        name cannot be known here without a cross-Region reference."""
        super().__init__(scope, construct_id)
        for key, value in (
            ("lease_table_name", lease_table_name),
            ("messages_table_name", messages_table_name),
        ):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{key}: required, the primary Region's table name")
        self.lease_table: dynamodb.ITableV2 = dynamodb.TableV2.from_table_name(
            self, "LeaseTable", lease_table_name
        )
        self.messages_table: dynamodb.ITableV2 = dynamodb.TableV2.from_table_name(
            self, "MessagesTable", messages_table_name
        )
