"""The app as the CDK CLI builds it (cdk.json context, feature flags), and its configuration.

Built by :mod:`tests.app_support`, as ``cdk synth`` builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

import app as app_module
from streamfleet_cdk.config import CONTEXT_PREFIX, AppConfig, ContextError, context_key
from tests.app_support import cdk_json_context, default_app

# --- cdk.json and app.py ---


def test_cdk_json_sets_only_known_settings_and_they_are_valid():
    settings = {
        key.removeprefix(CONTEXT_PREFIX)
        for key in cdk_json_context()
        if key.startswith(CONTEXT_PREFIX)
    }
    assert settings <= {spec.name for spec in fields(AppConfig)}
    config = AppConfig.from_context(cdk.App(context=cdk_json_context()).node)
    assert config.allowed_upstreams  # synth works out of the box, with a placeholder


def test_synth_needs_no_context_lookup():
    # A lookup (for example the VPC's Availability Zones) would make `cdk synth` call AWS.
    manifest = json.loads((Path(default_app().assembly.directory) / "manifest.json").read_text())
    assert not manifest.get("missing")


def test_app_py_registers_cdk_nag_so_synth_fails_on_an_unacknowledged_finding(monkeypatch):
    plugins: list[Any] = []
    synthesized: list[cdk.App] = []
    real_of = cdk.Validations.of

    class Spy:
        """``Validations.of`` that records the plugins added to the app."""

        def __init__(self, scope: Any) -> None:
            self._validations = real_of(scope)

        def add_plugins(self, *added: Any) -> None:
            plugins.extend(added)
            self._validations.add_plugins(*added)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._validations, name)

    monkeypatch.setattr(cdk.Validations, "of", Spy)
    monkeypatch.setattr(cdk.App, "synth", lambda self, *args, **kwargs: synthesized.append(self))
    app_module.main()
    assert [type(plugin).__name__ for plugin in plugins] == ["AwsSolutionsChecks"]
    assert len(synthesized) == 1


@pytest.mark.parametrize(
    ("context", "first_words"),
    [
        ({"worker_cpu": "300"}, "error: streamfleet:worker_cpu: expected one of"),
        (
            {"canary_signing_key_secret_name": "streamfleet/canary-key"},
            "error: streamfleet:canary_public_keys: required",
        ),
    ],
)
def test_a_wrong_setting_fails_synth_in_one_line_naming_its_key(context, first_words):
    """A bad setting printed a stack trace of 8 to 15 lines before the message that names it."""
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({context_key(k): v for k, v in context.items()}),
        "CDK_OUTDIR": "/nonexistent/never-written",  # it must fail before writing anything
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",  # as the Makefile sets them
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    done = subprocess.run(
        [sys.executable, "app.py"],
        cwd=Path(app_module.__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(first_words), done.stderr


# --- Configuration of the fleet ---


def config_from(context: dict[str, Any]) -> AppConfig:
    return AppConfig.from_context(cdk.App(context=context).node)


def test_fleet_defaults():
    config = config_from({})
    assert config.allowed_upstreams == ("wss://*.example.com",)
    assert (config.worker_cpu, config.worker_memory_mib) == (512, 1024)
    assert (config.min_tasks, config.max_tasks) == (1, 10)
    assert config.target_connections_per_task == 700
    assert (config.scale_out_cooldown_seconds, config.scale_in_cooldown_seconds) == (120, 900)
    assert config.max_connections == 1000
    assert (config.lease_seconds, config.heartbeat_seconds, config.reconcile_seconds) == (
        20.0,
        5.0,
        10.0,
    )
    assert config.stop_timeout_seconds == 30
    assert config.nat_gateways == 2  # one per AZ
    assert config.message_retention_days == 7
    assert config.secondary_active is False
    assert config.multi_region_strong_consistency is False
    assert config.witness_region is None


def test_operations_defaults():
    config = config_from({})
    assert config.account is None  # account-agnostic: never a made-up account
    assert config.api_gateway_cloudwatch_role is True
    assert config.invoke_principals == ()
    assert (
        config.router_reserved_concurrency,
        config.ws_handler_reserved_concurrency,
        config.authorizer_reserved_concurrency,
        config.canary_reserved_concurrency,
    ) == (100, 200, 100, 2)
    assert config.lambda_log_level == "INFO"
    assert config.alarm_email is None


def test_operations_settings_accept_cli_strings_and_json_types():
    config = config_from(
        {
            context_key("api_gateway_cloudwatch_role"): "false",
            context_key("invoke_principals"): (
                "arn:aws:iam::123456789012:role/producer-*, 210987654321"
            ),
            context_key("router_reserved_concurrency"): "none",
            context_key("authorizer_reserved_concurrency"): "50",
            context_key("canary_reserved_concurrency"): 3,
            context_key("lambda_log_level"): "DEBUG",
            context_key("alarm_email"): "oncall@example.com",
            context_key("nat_gateways"): "1",
            context_key("message_retention_days"): 30,
        }
    )
    assert config.api_gateway_cloudwatch_role is False
    assert config.invoke_principals == (
        "arn:aws:iam::123456789012:role/producer-*",
        "210987654321",
    )
    assert config.router_reserved_concurrency is None  # unreserved
    assert (config.authorizer_reserved_concurrency, config.canary_reserved_concurrency) == (50, 3)
    assert config.lambda_log_level == "DEBUG"
    assert config.alarm_email == "oncall@example.com"
    assert (config.nat_gateways, config.message_retention_days) == (1, 30)


def test_fleet_settings_accept_cli_strings_and_json_types():
    config = config_from(
        {
            context_key("allowed_upstreams"): "wss://*.feeds.example.com, ws://127.0.0.1:8765",
            context_key("worker_cpu"): "1024",
            context_key("worker_memory_mib"): 2048,
            context_key("lease_seconds"): "30",
            context_key("heartbeat_seconds"): 2.5,
            context_key("secondary_active"): "true",
        }
    )
    assert config.allowed_upstreams == ("wss://*.feeds.example.com", "ws://127.0.0.1:8765")
    assert (config.worker_cpu, config.worker_memory_mib) == (1024, 2048)
    assert (config.lease_seconds, config.heartbeat_seconds) == (30.0, 2.5)
    assert config.secondary_active is True
    assert config_from({context_key("allowed_upstreams"): ["wss://a.example.com"]}) == AppConfig(
        account=config.account, allowed_upstreams=("wss://a.example.com",)
    )


def test_strong_consistency_with_a_witness_in_the_same_region_set():
    config = config_from(
        {
            context_key("multi_region_strong_consistency"): True,
            context_key("witness_region"): "us-east-2",
        }
    )
    assert config.witness_region == "us-east-2"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("allowed_upstreams", "", "at least one"),
        ("allowed_upstreams", [], "at least one"),
        ("allowed_upstreams", "https://example.com", "not scheme://host"),
        ("allowed_upstreams", "wss://a.example.com/path", "not scheme://host"),
        ("allowed_upstreams", "wss://a.example.com:99999", "invalid port"),
        ("allowed_upstreams", [1], "list of strings"),
        ("worker_cpu", "300", "expected one of"),
        ("worker_cpu", "many", "whole number"),
        ("worker_memory_mib", 3000, "not valid with streamfleet:worker_cpu"),
        ("min_tasks", 0, "at least 1"),
        ("max_tasks", 0, "at least 1"),
        ("target_connections_per_task", 1001, None),
        ("max_connections", 699, "at least 700"),
        ("scale_in_cooldown_seconds", -1, "at least 0"),
        ("lease_seconds", "abc", "expected a number"),
        ("lease_seconds", 0, "at least"),
        ("heartbeat_seconds", 10, "well below the lease"),
        ("stop_timeout_seconds", 10, "shutdown budget"),
        ("stop_timeout_seconds", 121, "at most 120"),
        ("api_rate_limit", 0, "at least 1"),
        ("log_retention_days", 31, "expected one of"),
        ("secondary_active", "maybe", "true or false"),
        ("witness_region", "us-east-2", "only used with"),
        ("multi_region_strong_consistency", True, None),
        ("nat_gateways", 0, "at least 1"),
        ("nat_gateways", 3, "at most 2"),
        ("message_retention_days", 0, "at least 1"),
        ("message_retention_days", "a week", "whole number"),
        ("router_reserved_concurrency", 0, "at least 1"),
        ("ws_handler_reserved_concurrency", -5, "at least 1"),
        ("authorizer_reserved_concurrency", "lots", "whole number or 'none'"),
        ("canary_reserved_concurrency", 1.5, "whole number"),
        ("lambda_log_level", "VERBOSE", "expected one of TRACE, DEBUG, INFO"),
        ("alarm_email", "oncall", "an e-mail address"),
        ("invoke_principals", "arn:aws:iam::123456789012:group/ops", "not an IAM role"),
        ("invoke_principals", "1234", "not an IAM role"),
        ("invoke_principals", "123456789012,123456789012", "duplicate"),
        ("api_gateway_cloudwatch_role", "maybe", "true or false"),
        ("account", "1234", "12 digits"),
    ],
)
def test_fleet_settings_are_validated_naming_the_context_key(key, value, message):
    expected_key = {
        # Cross-field rules name the setting that has to change with the one given.
        "target_connections_per_task": "max_connections",
        "multi_region_strong_consistency": "witness_region",
    }.get(key, key)
    pattern = rf"^{context_key(expected_key)}: " + (f".*{message}" if message else "")
    with pytest.raises(ContextError, match=pattern):
        config_from({context_key(key): value})


def test_strong_consistency_needs_one_region_set():
    with pytest.raises(ContextError, match=r"^streamfleet:multi_region_strong_consistency: .*set"):
        config_from(
            {
                context_key("multi_region_strong_consistency"): True,
                context_key("witness_region"): "eu-west-1",
            }
        )
    with pytest.raises(ContextError, match=r"^streamfleet:witness_region: must differ"):
        config_from(
            {
                context_key("multi_region_strong_consistency"): True,
                context_key("witness_region"): "us-west-2",
            }
        )


@pytest.mark.parametrize("field_name", [spec.name for spec in fields(AppConfig)])
def test_every_setting_refuses_a_value_of_the_wrong_kind_naming_its_key(field_name):
    """No setting takes a JSON object: each one refuses it with the error ``app.py`` prints as
    its one line, naming the key, and nothing gets as far as a construct."""
    with pytest.raises(ContextError) as refused:
        config_from({context_key(field_name): {"not": "a setting"}})
    assert str(refused.value).startswith(f"{context_key(field_name)}: "), refused.value
    assert "\n" not in str(refused.value)
