"""The local Lambda runtime keeps Lambda's limits: an answer that comes after the timeout is a
failure, a function that does not answer is killed (its environment is not reused), a function
that uses more than its memory size is killed, and payloads are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamfleet_dev.emulator.lambda_runner import LambdaFunctionError, LambdaProcess, LambdaSpec

HANDLER = """
import time


def handler(event, context):
    if event.get("hold_mb"):
        held = bytearray(event["hold_mb"] * 1024 * 1024)  # zeroed: every page touched
        time.sleep(0.5)
        return {"held": len(held)}
    if event.get("sleep"):
        time.sleep(event["sleep"])
    if event.get("answer_bytes"):
        return {"data": "x" * event["answer_bytes"]}
    return {"remaining_ms": context.get_remaining_time_in_millis()}
"""


def test_an_answer_after_the_functions_timeout_is_a_failure(tmp_path: Path) -> None:
    """A 1 s-timeout function that ran for 1.5 s returned success: the runner waited 10 s more
    for any answer. Lambda ends the invocation at the timeout."""
    asset = tmp_path / "asset"
    asset.mkdir()
    (asset / "slow.py").write_text(HANDLER)
    spec = LambdaSpec(name="slow", asset_dir=asset, handler="slow.handler", timeout_seconds=1.0)
    with LambdaProcess(spec, log_path=tmp_path / "slow.log") as process:
        answer = process.invoke({})
        assert 0 < answer["remaining_ms"] <= 1000  # the context counts down from the timeout
        with pytest.raises(LambdaFunctionError, match="timed out"):
            process.invoke({"sleep": 1.5})  # answered late: a failure
        assert process.invoke({})["remaining_ms"] > 0  # the next invocation runs normally
        with pytest.raises(LambdaFunctionError, match="timed out") as hung:
            process.invoke({"sleep": 60})  # never answers: killed at the timeout's slack
        assert hung.value.error_type == "Sandbox.Timedout"
        assert process.invoke({})["remaining_ms"] > 0  # in a new environment


def test_lambdas_payload_limits_hold(tmp_path: Path) -> None:
    """An event over 6 MB (256 KB for an asynchronous invocation) never reaches the function;
    a result over 6 MB fails the invocation, as Lambda's limits make them."""
    asset = tmp_path / "asset"
    asset.mkdir()
    (asset / "fn.py").write_text(HANDLER)
    spec = LambdaSpec(name="fn", asset_dir=asset, handler="fn.handler", timeout_seconds=10.0)
    with LambdaProcess(spec, log_path=tmp_path / "fn.log") as process:
        with pytest.raises(LambdaFunctionError) as large:
            process.invoke({"pad": "x" * (6 * 1024 * 1024)})
        assert large.value.error_type == "RequestEntityTooLargeException"
        with pytest.raises(LambdaFunctionError) as large_async:
            process.invoke({"pad": "x" * (256 * 1024)}, asynchronous=True)
        assert large_async.value.error_type == "RequestEntityTooLargeException"
        assert process.invocations == 0  # refused before the function ran
        assert "remaining_ms" in process.invoke({"pad": "x" * (200 * 1024)}, asynchronous=True)
        with pytest.raises(LambdaFunctionError) as answer:
            process.invoke({"answer_bytes": 6 * 1024 * 1024})
        assert answer.value.error_type == "Function.ResponseSizeTooLarge"


def test_a_function_over_its_memory_size_is_killed(tmp_path: Path) -> None:
    """Lambda ends an environment that uses more than the function's memory size; the next
    invocation runs in a new one."""
    asset = tmp_path / "asset"
    asset.mkdir()
    (asset / "fn.py").write_text(HANDLER)
    spec = LambdaSpec(name="fn", asset_dir=asset, handler="fn.handler", memory_mb=128)
    with LambdaProcess(spec, log_path=tmp_path / "fn.log") as process:
        assert process.invoke({"hold_mb": 16})["held"] == 16 * 1024 * 1024
        with pytest.raises(LambdaFunctionError) as killed:
            process.invoke({"hold_mb": 256})
        assert killed.value.error_type == "Runtime.OutOfMemory"
        assert not process.running
        assert "remaining_ms" in process.invoke({})  # in a new environment
        assert (process.peak_memory_mb() or 0) <= spec.memory_mb
