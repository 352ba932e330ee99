"""What the bill needs from the synthesized assembly: the deployment as ``cdk deploy`` would
make it, not as the code's defaults say it should be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamfleet import model
from streamfleet_dev.assembly import CloudAssembly, Stack
from streamfleet_dev.cost.bill import Deployment

# A function's role in the bill, by the end of its construct path.
FUNCTION_ROLES = {
    "/Fanout/Function": "fanout",
    "/WebSocket/Handler": "handler",
    "/WebSocket/AuthorizerFunction": "authorizer",
    "/Canary/Function": "canary",
}
# Which replicated tables the bill counts, by their default names.
REPLICATED_TABLES = {
    model.DEFAULT_MESSAGES_TABLE_NAME: "messages",
    model.DEFAULT_LEASE_TABLE_NAME: "connections",
}


def _resources(stack: Stack, kind: str) -> list[Mapping[str, Any]]:
    return [resource.get("Properties", {}) for resource in stack.of_type(kind).values()]


def read_deployment(assembly: CloudAssembly) -> Deployment:
    """The deployment's facts, from its first fleet stack (the primary's: the active fleet)."""
    fleets = [s for s in assembly.stacks if _resources(s, "AWS::ECS::TaskDefinition")]
    if not fleets:
        raise ValueError("assembly: no worker fleet (no ECS task definition) in any stack")
    fleet = fleets[0]
    (task,) = _resources(fleet, "AWS::ECS::TaskDefinition")
    platform = task.get("RuntimePlatform", {}).get("CpuArchitecture", "X86_64")
    (scaling,) = _resources(fleet, "AWS::ApplicationAutoScaling::ScalingPolicy")
    (target,) = _resources(fleet, "AWS::ApplicationAutoScaling::ScalableTarget")
    endpoints = _resources(fleet, "AWS::EC2::VPCEndpoint")
    replicated = frozenset(
        REPLICATED_TABLES[table["TableName"]]
        for stack in assembly.stacks
        for table in _resources(stack, "AWS::DynamoDB::GlobalTable")
        if table.get("TableName") in REPLICATED_TABLES and len(table.get("Replicas", ())) > 1
    )
    functions: dict[str, tuple[int, str]] = {}
    for function in assembly.functions():
        for suffix, role in FUNCTION_ROLES.items():
            if function.label.endswith(suffix) and role not in functions:
                functions[role] = (function.memory_mb, function.architecture)
    missing = sorted(set(FUNCTION_ROLES.values()) - set(functions))
    if missing:
        raise ValueError(f"assembly: no function for {', '.join(missing)}")
    return Deployment(
        task_vcpu=int(task["Cpu"]) / 1024,
        task_gb=int(task["Memory"]) / 1024,
        task_architecture="arm64" if platform == "ARM64" else "x86_64",
        connections_per_task=int(
            scaling["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
        ),
        min_tasks=int(target["MinCapacity"]),
        nat_gateways_per_region=len(_resources(fleet, "AWS::EC2::NatGateway")),
        dynamodb_endpoint=any(
            "dynamodb" in str(endpoint.get("ServiceName")) for endpoint in endpoints
        ),
        replicated_tables=replicated,
        alarms=sum(len(_resources(s, "AWS::CloudWatch::Alarm")) for s in assembly.stacks),
        health_checks=sum(len(_resources(s, "AWS::Route53::HealthCheck")) for s in assembly.stacks),
        functions=functions,
    )


def retention_seconds(assembly: CloudAssembly) -> int:
    """How long stored messages are kept, from the worker's environment in the template."""
    for stack in assembly.stacks:
        for container in stack.containers():
            value = container.environment.get(model.ENV_MESSAGE_RETENTION_DAYS)
            if value is not None:
                return int(value) * 24 * 3600
    raise ValueError(f"assembly: no worker sets {model.ENV_MESSAGE_RETENTION_DAYS}")
