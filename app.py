#!/usr/bin/env python3
"""CDK app of the resilient streaming fleet: ``cdk synth`` / ``cdk deploy`` run this file.

Settings come from CDK context (``cdk.json`` or ``-c streamfleet:<key>=<value>``), see
:mod:`streamfleet_cdk.config`. cdk-nag's AwsSolutions pack runs as a CDK validation plugin: an
unacknowledged finding fails the synth (acknowledgments, each with its reason, live next to the
resources in the constructs).
"""

import sys
from pathlib import Path

# The constructs import names from the runtime's data model (runtime/streamfleet/model.py), and
# the stacks add the demo auction (examples/auction). `cdk synth` runs `python3 app.py` without
# PYTHONPATH, so put both on the path here.
_HERE = Path(__file__).resolve().parent
for _root in (str(_HERE / "examples" / "auction"), str(_HERE / "runtime")):
    if _root not in sys.path:
        sys.path.insert(0, _root)

import aws_cdk as cdk  # noqa: E402
from cdk_nag import AwsSolutionsChecks  # noqa: E402

from stacks import FleetStack, WebSocketApiStack, add_fleet_stacks, add_websocket_stacks  # noqa: E402
from streamfleet_cdk.config import AppConfig, ContextError  # noqa: E402


def add_stacks(
    app: cdk.App,
) -> tuple[tuple[FleetStack, FleetStack], tuple[WebSocketApiStack, WebSocketApiStack]]:
    """Every stack of the app, from ``app``'s context: each Region's fleet stack (which owns the
    Region's API Gateway CloudWatch role and alarm topic), then its WebSocket API stack.
    Returns ``(primary, secondary)`` of each kind (the integration test asserts on them)."""
    config = AppConfig.from_context(app.node)
    fleet = add_fleet_stacks(app, config)
    return fleet, add_websocket_stacks(app, config, region_owners=fleet)


def main() -> int:
    app = cdk.App()
    try:
        add_stacks(app)
    except ContextError as exc:
        # A setting is wrong: the key and what is wrong with it, not a stack trace.
        print(f"error: {exc}", file=sys.stderr)
        return 1
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
