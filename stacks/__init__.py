"""Stacks of the resilient streaming fleet: thin, they only wire constructs together."""

from stacks.fleet_stack import (
    PRIMARY_STACK_NAME,
    SECONDARY_STACK_NAME,
    FleetStack,
    Role,
    add_fleet_stacks,
)
from stacks.websocket_stack import (
    PRIMARY_WS_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
    WebSocketApiStack,
    add_websocket_stacks,
)

__all__ = [
    "PRIMARY_STACK_NAME",
    "PRIMARY_WS_STACK_NAME",
    "SECONDARY_STACK_NAME",
    "SECONDARY_WS_STACK_NAME",
    "FleetStack",
    "Role",
    "WebSocketApiStack",
    "add_fleet_stacks",
    "add_websocket_stacks",
]
