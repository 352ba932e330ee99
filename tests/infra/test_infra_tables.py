"""Infrastructure tests: the synthesized tables match the runtime's data model.

Every expectation about names is read from :mod:`streamfleet.model`, as the constructs do, so
these tests check the wiring (keys, types, projections, replicas, protection), not a second
copy of the names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from stacks import (
    PRIMARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
    FleetStack,
    add_fleet_stacks,
)
from streamfleet import model
from streamfleet_cdk.config import (
    DEFAULT_PRIMARY_REGION,
    DEFAULT_SECONDARY_REGION,
    AppConfig,
    context_key,
)
from streamfleet_cdk.tables import FleetTables, FleetTablesProps

REPO_ROOT = Path(__file__).resolve().parents[2]
CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
GLOBAL_TABLE = "AWS::DynamoDB::GlobalTable"
TEST_ACCOUNT = "123456789012"


def synth(context: dict[str, Any] | None = None) -> tuple[Template, Template]:
    """Templates of the primary and the secondary stack, built exactly as app.py builds them."""
    app = cdk.App(context={context_key("account"): TEST_ACCOUNT, **(context or {})})
    primary, secondary = add_fleet_stacks(app, AppConfig.from_context(app.node))
    return Template.from_stack(primary), Template.from_stack(secondary)


@pytest.fixture(scope="module")
def templates() -> tuple[Template, Template]:
    return synth()


@pytest.fixture(scope="module")
def primary(templates: tuple[Template, Template]) -> Template:
    return templates[0]


def table_of(template: Template, spec: model.TableSpec) -> dict[str, Any]:
    """The properties of the one global table whose name is ``spec``'s default name."""
    tables = template.find_resources(GLOBAL_TABLE, {"Properties": {"TableName": spec.default_name}})
    assert len(tables) == 1, f"expected one {GLOBAL_TABLE} named {spec.default_name}: {tables}"
    return next(iter(tables.values()))["Properties"]


def attribute_types(properties: dict[str, Any]) -> dict[str, str]:
    return {a["AttributeName"]: a["AttributeType"] for a in properties["AttributeDefinitions"]}


def key_schema(partition_key: str, sort_key: str | None) -> list[dict[str, str]]:
    keys = [{"AttributeName": partition_key, "KeyType": "HASH"}]
    if sort_key:
        keys.append({"AttributeName": sort_key, "KeyType": "RANGE"})
    return keys


# --- Tables ---


def test_both_tables_are_global_tables_replicated_to_the_secondary_region(primary):
    primary.resource_count_is(GLOBAL_TABLE, 2)
    for spec in (model.LEASE_TABLE, model.MESSAGES_TABLE):
        regions = {replica["Region"] for replica in table_of(primary, spec)["Replicas"]}
        assert regions == {DEFAULT_PRIMARY_REGION, DEFAULT_SECONDARY_REGION}, spec.default_name


@pytest.mark.parametrize("spec", [model.LEASE_TABLE, model.MESSAGES_TABLE])
def test_key_schema_and_key_types_come_from_the_model(primary, spec):
    properties = table_of(primary, spec)
    assert properties["KeySchema"] == key_schema(spec.partition_key, spec.sort_key)
    types = attribute_types(properties)
    assert types[spec.partition_key] == "S"
    if spec.sort_key:
        assert types[spec.sort_key] == spec.sort_key_type


@pytest.mark.parametrize("spec", [model.LEASE_TABLE, model.MESSAGES_TABLE])
def test_tables_bill_on_demand_and_are_retained(primary, spec):
    properties = table_of(primary, spec)
    assert properties["BillingMode"] == "PAY_PER_REQUEST"
    primary.has_resource(
        GLOBAL_TABLE,
        {
            "Properties": {"TableName": spec.default_name},
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
        },
    )


def test_every_lease_index_of_the_model_is_deployed_with_its_keys_and_projection(primary):
    properties = table_of(primary, model.LEASE_TABLE)
    deployed = {index["IndexName"]: index for index in properties["GlobalSecondaryIndexes"]}
    assert set(deployed) == {index.name for index in model.LEASE_TABLE.indexes}
    types = attribute_types(properties)
    for index in model.LEASE_TABLE.indexes:
        gsi = deployed[index.name]
        assert gsi["KeySchema"] == key_schema(index.partition_key, index.sort_key), index.name
        assert types[index.partition_key] == "S", index.name
        if index.sort_key:
            assert types[index.sort_key] == "S", index.name
        assert gsi["Projection"]["ProjectionType"] == index.projection.value, index.name
        assert tuple(gsi["Projection"].get("NonKeyAttributes", ())) == index.non_key_attributes


def test_the_model_exercises_every_projection_kind_the_construct_maps():
    # Guards the loop above against a model that silently stopped covering INCLUDE.
    assert any(i.projection is model.Projection.INCLUDE for i in model.LEASE_TABLE.indexes)
    assert any(i.projection is model.Projection.KEYS_ONLY for i in model.LEASE_TABLE.indexes)


@pytest.mark.parametrize("spec", [model.LEASE_TABLE, model.MESSAGES_TABLE])
def test_point_in_time_recovery_and_deletion_protection_on_every_replica_by_default(primary, spec):
    for replica in table_of(primary, spec)["Replicas"]:
        assert replica["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert replica["DeletionProtectionEnabled"] is True, replica["Region"]


def test_replicas_follow_the_configured_regions():
    primary, _ = synth(
        {
            context_key("primary_region"): "eu-west-1",
            context_key("secondary_region"): "eu-central-1",
        }
    )
    for spec in (model.LEASE_TABLE, model.MESSAGES_TABLE):
        regions = {replica["Region"] for replica in table_of(primary, spec)["Replicas"]}
        assert regions == {"eu-west-1", "eu-central-1"}, spec.default_name


def test_deletion_protection_off_when_configured():
    primary, _ = synth({context_key("deletion_protection"): "false"})
    for spec in (model.LEASE_TABLE, model.MESSAGES_TABLE):
        for replica in table_of(primary, spec)["Replicas"]:
            assert replica["DeletionProtectionEnabled"] is False, replica["Region"]


@pytest.mark.parametrize("spec", [model.LEASE_TABLE, model.MESSAGES_TABLE])
def test_every_table_expires_items_through_its_model_ttl_attribute(primary, spec):
    # Messages after MESSAGE_RETENTION_DAYS; ended sessions of the lease table after a day.
    assert spec.ttl_attribute
    assert table_of(primary, spec)["TimeToLiveSpecification"] == {
        "AttributeName": spec.ttl_attribute,
        "Enabled": True,
    }


def test_a_ttl_attribute_added_to_the_model_needs_no_construct_change(monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(model, "LEASE_TABLE", replace(model.LEASE_TABLE, ttl_attribute="gone_at"))
    stack = cdk.Stack(cdk.App(), "T", env=cdk.Environment(region="eu-west-1"))
    tables = FleetTables(stack, "Tables", props=FleetTablesProps())
    lease = Template.from_stack(stack).to_json()["Resources"][
        stack.get_logical_id(tables.lease_table.node.default_child)
    ]
    assert lease["Properties"]["TimeToLiveSpecification"] == {
        "AttributeName": "gone_at",
        "Enabled": True,
    }


def test_construct_props_turn_off_ttl_and_retention_and_rename_tables():
    stack = cdk.Stack(cdk.App(), "T", env=cdk.Environment(account=TEST_ACCOUNT, region="eu-west-1"))
    tables = FleetTables(
        stack,
        "Tables",
        props=FleetTablesProps(
            message_ttl=False,
            removal_policy=cdk.RemovalPolicy.DESTROY,
            deletion_protection=False,
            lease_table_name="leases-test",
            messages_table_name="messages-test",
        ),
    )
    template = Template.from_stack(stack)
    for name in ("leases-test", "messages-test"):
        template.has_resource(
            GLOBAL_TABLE,
            {
                "Properties": {"TableName": name},
                "DeletionPolicy": "Delete",
                "UpdateReplacePolicy": "Delete",
            },
        )
    template.has_resource_properties(
        GLOBAL_TABLE,
        {
            "TableName": "messages-test",
            "TimeToLiveSpecification": Match.absent(),
            "Replicas": [Match.object_like({"Region": "eu-west-1"})],
        },
    )
    lease_id = stack.get_logical_id(tables.lease_table.node.default_child)
    assert stack.resolve(tables.lease_table.table_name) == {"Ref": lease_id}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replica_regions": "us-west-2"}, "^replica_regions: .*string"),
        ({"replica_regions": ("us-west-2", "us-west-2")}, "^replica_regions: duplicate"),
        ({"removal_policy": False}, "^removal_policy: expected an aws_cdk.RemovalPolicy"),
        ({"removal_policy": "RETAIN"}, "^removal_policy: expected an aws_cdk.RemovalPolicy"),
        ({"removal_policy": cdk.RemovalPolicy.SNAPSHOT}, "^removal_policy: SNAPSHOT"),
    ],
)
def test_construct_props_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FleetTablesProps(**kwargs)


# --- Stacks ---


def test_secondary_stack_declares_no_table_and_references_the_replicas_by_name(templates):
    _, secondary = templates
    secondary.resource_count_is(GLOBAL_TABLE, 0)
    secondary.resource_count_is("AWS::DynamoDB::Table", 0)
    secondary.has_output("LeaseTableName", {"Value": model.LEASE_TABLE.default_name})
    secondary.has_output("MessagesTableName", {"Value": model.MESSAGES_TABLE.default_name})


def test_primary_stack_outputs_the_table_names(primary):
    for output, spec in (
        ("LeaseTableName", model.LEASE_TABLE),
        ("MessagesTableName", model.MESSAGES_TABLE),
    ):
        logical_id = next(
            iter(
                primary.find_resources(
                    GLOBAL_TABLE, {"Properties": {"TableName": spec.default_name}}
                )
            )
        )
        primary.has_output(output, {"Value": {"Ref": logical_id}})


def test_stacks_have_explicit_regions_and_deploy_in_order():
    app = cdk.App(context={context_key("account"): TEST_ACCOUNT})
    primary, secondary = add_fleet_stacks(app, AppConfig.from_context(app.node))
    assert (primary.stack_name, primary.region) == (PRIMARY_STACK_NAME, DEFAULT_PRIMARY_REGION)
    assert (secondary.stack_name, secondary.region) == (
        SECONDARY_STACK_NAME,
        DEFAULT_SECONDARY_REGION,
    )
    assert primary.account == secondary.account == TEST_ACCOUNT
    assert primary in secondary.dependencies
    # Both roles expose the same attributes, so later constructs wire either the same way.
    assert secondary.resolve(secondary.lease_table.table_name) == model.LEASE_TABLE.default_name
    assert secondary.resolve(secondary.messages_table.table_name) == (
        model.MESSAGES_TABLE.default_name
    )


def test_unknown_role_is_refused():
    with pytest.raises(ValueError, match=r"^role: .*'tertiary'"):
        FleetStack(cdk.App(), "X", config=AppConfig(account=TEST_ACCOUNT), role="tertiary")


# --- Configuration ---


def config_from(context: dict[str, Any]) -> AppConfig:
    return AppConfig.from_context(cdk.App(context=context).node)


def test_config_defaults_without_context_or_credentials():
    config = config_from({})
    assert config.account is None
    assert (config.primary_region, config.secondary_region) == ("us-east-1", "us-west-2")
    assert config.deletion_protection is True
    assert config.lease_table_name == model.LEASE_TABLE.default_name
    assert config.messages_table_name == model.MESSAGES_TABLE.default_name


def test_config_never_takes_the_account_from_the_environment(monkeypatch):
    # The same synth gives the same templates with or without credentials.
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "210987654321")
    assert config_from({}).account is None
    assert config_from({context_key("account"): TEST_ACCOUNT}).account == TEST_ACCOUNT


def test_config_reads_every_key_from_context():
    config = config_from(
        {
            context_key("account"): TEST_ACCOUNT,
            context_key("primary_region"): "eu-west-1",
            context_key("secondary_region"): "eu-central-1",
            context_key("deletion_protection"): False,
        }
    )
    assert config == AppConfig(
        account=TEST_ACCOUNT,
        primary_region="eu-west-1",
        secondary_region="eu-central-1",
        deletion_protection=False,
    )
    assert config.replica_regions == ("eu-central-1",)


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("False", False), (True, True)])
def test_config_booleans_accept_cli_strings(raw, expected):
    assert config_from({context_key("deletion_protection"): raw}).deletion_protection is expected


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("account", "12345", "12 digits"),
        ("account", "12345678901a", "12 digits"),
        ("account", 123456789012, "expected a string"),
        ("primary_region", "US-EAST-1", "a Region like us-east-1"),
        ("primary_region", "useast1", "a Region like us-east-1"),
        ("secondary_region", "us-west", "a Region like us-east-1"),
        ("secondary_region", "us-east-1", "must differ from streamfleet:primary_region"),
        ("deletion_protection", "maybe", "expected true or false"),
        ("deletion_protection", 1, "expected true or false"),
        ("lease_table_name", "x", "3-255"),
        ("messages_table_name", "has space", "3-255"),
        ("messages_table_name", model.DEFAULT_LEASE_TABLE_NAME, "must differ"),
    ],
)
def test_config_rejects_bad_context_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=rf"^{context_key(key)}: .*{message}"):
        config_from({context_key(key): value})


# --- The CLI, end to end ---


def test_cdk_cli_synthesizes_both_stacks_without_aws_credentials(tmp_path):
    if not CDK_CLI.exists():
        pytest.fail(f"CDK CLI not found at {CDK_CLI}: run `npm ci` (or `make setup`) first")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "CDK_")) and name != "PYTHONPATH"
    }
    env.update(
        # app.py must find runtime/ by itself, and `python3` must be this interpreter.
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        # No credentials anywhere: no ambient files, no instance metadata.
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
    )
    assert shutil.which("python3", path=env["PATH"]), "python3 is not on PATH"
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [str(CDK_CLI), "synth", "--quiet", "--no-notices", "-o", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, f"cdk synth failed:\n{result.stdout}\n{result.stderr}"
    manifest = json.loads((out / "manifest.json").read_text())
    stacks = {
        name: artifact
        for name, artifact in manifest["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    }
    assert set(stacks) == {
        PRIMARY_STACK_NAME,
        SECONDARY_STACK_NAME,
        PRIMARY_WS_STACK_NAME,
        SECONDARY_WS_STACK_NAME,
    }
    for name, artifact in stacks.items():
        assert (out / f"{name}.template.json").is_file(), f"{name} was not synthesized"
        # No credentials, no made-up account: deployable into whichever account deploys it.
        assert artifact["environment"].startswith("aws://unknown-account/"), name
    assert not [p.name for p in out.glob("*.json") if "111111111111" in p.read_text()]
