"""Route 53 failover records: one client-facing name, the primary Region while it is healthy.

Both Regions' records share one name in one hosted zone and differ by ``set_identifier`` and
role: the PRIMARY record carries the health check that follows the primary Region's canary alarm
(:class:`~streamfleet_cdk.canary.WebSocketCanary`); the SECONDARY record is answered whenever the
primary is unhealthy. Each Region's stack declares its own record, pointing at its own API
Gateway custom domain, so no stack needs a value from the other Region (CloudFormation has no
cross-Region references). :class:`FailoverRecords` accepts both halves too, for a single stack.

Records are aliases (A) to the API Gateway regional domain name by default: free to query and
answered with the target's own TTL. ``RecordKind.CNAME`` writes CNAMEs with a 60 s TTL instead
(short enough for a failover to propagate fast, long enough to bound the query volume).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import jsii
from aws_cdk import Duration, Token
from aws_cdk import aws_apigatewayv2 as apigwv2
from aws_cdk import aws_route53 as route53
from constructs import Construct

DEFAULT_CNAME_TTL = Duration.seconds(60)
MAX_SET_IDENTIFIER_CHARS = 128


class RecordKind(StrEnum):
    """How the name points at API Gateway."""

    ALIAS = "alias"  # A alias record to the regional domain name
    CNAME = "cname"  # CNAME to the regional domain name, with a TTL


@dataclass(frozen=True, kw_only=True)
class FailoverTarget:
    """One Region's half of the failover pair.

    Attributes:
        regional_domain_name: the API Gateway custom domain's regional domain name
            (``d-....execute-api.<region>.amazonaws.com``).
        regional_hosted_zone_id: the hosted zone of that regional domain name (for aliases).
        set_identifier: distinguishes this record from the other Region's (same name, same
            type); unique within the name.
        health_check: the health check Route 53 evaluates before answering with this record
            (required on the PRIMARY: without one it would never fail over).
    """

    regional_domain_name: str
    regional_hosted_zone_id: str
    set_identifier: str
    health_check: route53.IHealthCheck | None = None

    def __post_init__(self) -> None:
        identifier = self.set_identifier
        if not Token.is_unresolved(identifier) and not (
            1 <= len(identifier) <= MAX_SET_IDENTIFIER_CHARS
        ):
            raise ValueError(
                f"set_identifier: 1-{MAX_SET_IDENTIFIER_CHARS} characters, got {identifier!r}"
            )

    @classmethod
    def of_domain(
        cls,
        domain: apigwv2.IDomainName,
        *,
        set_identifier: str,
        health_check: route53.IHealthCheck | None = None,
    ) -> FailoverTarget:
        """The target for an API Gateway (v2) custom domain."""
        return cls(
            regional_domain_name=domain.regional_domain_name,
            regional_hosted_zone_id=domain.regional_hosted_zone_id,
            set_identifier=set_identifier,
            health_check=health_check,
        )


@dataclass(frozen=True, kw_only=True)
class FailoverRecordsProps:
    """How :class:`FailoverRecords` is built.

    Attributes:
        zone: the public hosted zone holding the name.
        record_name: the client-facing name (the custom domain of both Regions' APIs).
        primary: the PRIMARY half (``None``: declared by another stack).
        secondary: the SECONDARY half (``None``: declared by another stack).
        kind: alias (A) records (``RecordKind.ALIAS``, the default) or CNAMEs.
        cname_ttl: the CNAMEs' TTL, 60 s by default (aliases take the target's).
    """

    zone: route53.IHostedZone
    record_name: str
    primary: FailoverTarget | None = None
    secondary: FailoverTarget | None = None
    kind: RecordKind = RecordKind.ALIAS
    cname_ttl: Duration = field(default_factory=lambda: DEFAULT_CNAME_TTL)

    def __post_init__(self) -> None:
        if self.primary is None and self.secondary is None:
            raise ValueError("primary, secondary: at least one half of the pair is required")
        if self.primary is not None and self.primary.health_check is None:
            raise ValueError(
                "primary: health_check is required (a PRIMARY record without one never fails over)"
            )
        if (
            self.primary is not None
            and self.secondary is not None
            and self.primary.set_identifier == self.secondary.set_identifier
        ):
            raise ValueError("secondary: set_identifier must differ from the primary's")
        if not self.record_name:
            raise ValueError("record_name: required")
        if self.kind not in tuple(RecordKind):
            kinds = ", ".join(kind.value for kind in RecordKind)
            raise ValueError(f"kind: expected one of {kinds}, got {self.kind!r}")


@jsii.implements(route53.IAliasRecordTarget)
class RegionalDomainAlias:
    """An alias target for an API Gateway regional domain name that *evaluates target health*.

    Route 53 (and CDK, which refuses anything else) wants failover aliases to evaluate their
    target's health; CDK's ``ApiGatewayv2DomainProperties`` leaves it unset. For an API Gateway
    target it adds API Gateway's own view of the Region to the canary's health check.
    """

    def __init__(self, regional_domain_name: str, regional_hosted_zone_id: str) -> None:
        self.regional_domain_name = regional_domain_name
        self.regional_hosted_zone_id = regional_hosted_zone_id

    def bind(
        self, record: route53.IRecordSet, zone: route53.IHostedZone | None = None
    ) -> route53.AliasRecordTargetConfig:
        return route53.AliasRecordTargetConfig(
            dns_name=self.regional_domain_name,
            hosted_zone_id=self.regional_hosted_zone_id,
            evaluate_target_health=True,
        )


class FailoverRecords(Construct):
    """The failover records of one name: the halves given in the props.

    Attributes:
        primary_record: the PRIMARY record (``None`` when another stack declares it).
        secondary_record: the SECONDARY record (``None`` when another stack declares it).
        records: the records this construct declared.
    """

    def __init__(self, scope: Construct, construct_id: str, *, props: FailoverRecordsProps) -> None:
        super().__init__(scope, construct_id)
        self._props = props
        self.primary_record = self._build_record("Primary", props.primary, route53.Failover.PRIMARY)
        self.secondary_record = self._build_record(
            "Secondary", props.secondary, route53.Failover.SECONDARY
        )
        self.records = tuple(
            record for record in (self.primary_record, self.secondary_record) if record
        )

    def _build_record(
        self, construct_id: str, target: FailoverTarget | None, failover: route53.Failover
    ) -> route53.RecordSet | None:
        if target is None:
            return None
        props = self._props
        common = {
            "zone": props.zone,
            "record_name": props.record_name,
            "failover": failover,
            "set_identifier": target.set_identifier,
            "health_check": target.health_check,
            "comment": f"StreamFleet WebSocket API, {failover.value.lower()} Region",
        }
        if props.kind is RecordKind.CNAME:
            return route53.CnameRecord(
                self,
                construct_id,
                domain_name=target.regional_domain_name,
                ttl=props.cname_ttl,
                **common,
            )
        return route53.ARecord(
            self,
            construct_id,
            target=route53.RecordTarget.from_alias(
                RegionalDomainAlias(target.regional_domain_name, target.regional_hosted_zone_id)
            ),
            **common,
        )
