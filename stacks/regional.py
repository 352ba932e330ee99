"""What every regional stack of this app shares: its role, and the Region that role means."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from aws_cdk import Environment, Stack
from constructs import Construct

from streamfleet_cdk.config import AppConfig


class Role(StrEnum):
    """A Region's part: the primary declares global tables, the secondary references them."""

    PRIMARY = "primary"  # declares them, with a replica in the secondary Region
    SECONDARY = "secondary"  # references its local replica by name


@dataclass(frozen=True)
class Placement:
    """A stack's role and its environment: always a Region; the account only if configured
    (otherwise the stack is account-agnostic and deploys into the credentials' account)."""

    role: Role
    env: Environment

    @property
    def primary(self) -> bool:
        return self.role is Role.PRIMARY

    @classmethod
    def of(cls, config: AppConfig, role: str) -> Placement:
        """``ValueError`` naming ``role`` if it is neither primary nor secondary."""
        try:
            parsed = Role(role)
        except ValueError:
            choices = ", ".join(repr(r.value) for r in Role)
            raise ValueError(f"role: expected one of {choices}, got {role!r}") from None
        region = config.primary_region if parsed is Role.PRIMARY else config.secondary_region
        if config.account is None:
            return cls(parsed, Environment(region=region))
        return cls(parsed, Environment(account=config.account, region=region))


class RegionalStack(Stack):
    """A stack in the primary or the secondary Region, always with an explicit Region: global
    table replicas need a concrete Region at synth time. The account may stay unresolved."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: AppConfig, role: str, purpose: str
    ) -> None:
        placement = Placement.of(config, role)
        self.role = placement.role
        super().__init__(
            scope,
            construct_id,
            env=placement.env,
            description=f"StreamFleet ({self.role.value} Region): {purpose}",
        )

    @property
    def primary(self) -> bool:
        return self.role is Role.PRIMARY
