"""Stacks of the resilient streaming fleet: thin, they only wire constructs together."""

from stacks.fleet_stack import (
    PRIMARY_STACK_NAME,
    SECONDARY_STACK_NAME,
    FleetStack,
    Role,
    add_fleet_stacks,
)

__all__ = ["PRIMARY_STACK_NAME", "SECONDARY_STACK_NAME", "FleetStack", "Role", "add_fleet_stacks"]
