"""Live delivery on loopback, from the synthesized assembly: one Region's fan-out function run from
its asset (:mod:`~streamfleet_dev.emulator.lambda_runner`), fed by the event source mapping stand-in
(:mod:`~streamfleet_dev.emulator.event_source`) reading that Region's messages table's real change
stream.

What the template says is what runs: the function's handler, runtime and environment come from
the WebSocket stack of the Region; the environment's references are made local (the
subscriptions table's local name, the local gateway's Management API instead of the stage's
``https://<api>.execute-api...`` endpoint, which is the one override, by name); the event
source's batch size and retry count are the template's ``AWS::Lambda::EventSourceMapping``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfleet import model
from streamfleet_dev.assembly import AssemblyError, Stack, local_environment, reference_of
from streamfleet_dev.emulator.event_source import EventSourceSettings
from streamfleet_dev.emulator.lambda_runner import (
    LambdaProcess,
    LambdaSpec,
    host_twin,
    native_mismatches,
)

FANOUT_HANDLER = "streamfleet.wsapi.fanout.handler"


@dataclass(frozen=True)
class FanoutArtifact:
    """The fan-out of one Region's WebSocket stack, as synthesized."""

    stack: Stack
    spec_environment: Mapping[str, Any]
    settings: EventSourceSettings
    subscriptions_table_id: str

    @classmethod
    def of(cls, stack: Stack) -> FanoutArtifact:
        function = stack.function_with_handler(FANOUT_HANDLER)
        table_ref = function.environment.get(model.ENV_SUBSCRIPTIONS_TABLE_NAME)
        table_id = reference_of(table_ref)
        if table_id is None:
            raise AssemblyError(f"{function.label}: SUBSCRIPTIONS_TABLE_NAME names no table")
        return cls(stack, function.environment, event_source_settings(stack), table_id)


def event_source_settings(stack: Stack) -> EventSourceSettings:
    """The template's event source mapping of the fan-out, as local settings."""
    mappings = stack.of_type("AWS::Lambda::EventSourceMapping")
    if len(mappings) != 1:
        raise AssemblyError(
            f"{stack.name}: expected one event source mapping, found {len(mappings)}"
        )
    (mapping,) = mappings.values()
    props = mapping.get("Properties", {})
    return EventSourceSettings(
        batch_size=int(props.get("BatchSize", 100)),
        max_retries=int(props.get("MaximumRetryAttempts", -1)),  # Lambda's default: no limit
        starting_position=str(props.get("StartingPosition", "LATEST")),
        max_batching_window=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        report_batch_item_failures="ReportBatchItemFailures"
        in (props.get("FunctionResponseTypes") or []),
        bisect_on_error=bool(props.get("BisectBatchOnFunctionError", False)),
        max_record_age=(
            float(props["MaximumRecordAgeInSeconds"])
            if "MaximumRecordAgeInSeconds" in props
            else None
        ),
        parallelization_factor=int(props.get("ParallelizationFactor", 1)),
        on_failure_destination=bool(
            ((props.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
        ),
    )


def fanout_process(
    stack: Stack,
    *,
    subscriptions_table: str,
    streams_table: str,
    management_endpoint: str,
    endpoint_url: str,
    log_path: Path,
    credentials: tuple[str, str] = ("fanout", "local"),
    sdk_dir: Path | None = None,
) -> LambdaProcess:
    """The Region's fan-out function, started from its asset with a local environment."""
    function = stack.function_with_handler(FANOUT_HANDLER)
    artifact = FanoutArtifact.of(stack)
    environment = local_environment(
        function.environment,
        stack,
        refs={artifact.subscriptions_table_id: subscriptions_table},
        overrides={
            model.ENV_APIGW_MANAGEMENT_ENDPOINT: management_endpoint,
            model.ENV_STREAMS_TABLE_NAME: streams_table,  # the fleet's, by name in the template
        },
    )
    spec = LambdaSpec.for_function(
        function, environment, region=stack.region, credentials=credentials
    )
    code_dir = host_twin(function.asset_dir) if native_mismatches(spec) else None
    return LambdaProcess(
        spec,
        sdk_dir=sdk_dir,
        extra_env={"AWS_ENDPOINT_URL": endpoint_url},
        log_path=log_path,
        code_dir=code_dir,
    ).start()
