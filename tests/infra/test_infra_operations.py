"""Operations across the whole app (all four stacks, as ``app.py`` builds them): where alarms
go, who owns each Region's singletons, and which account the assembly is for.

These are read from the synthesized cloud assembly (templates, manifest, asset manifests), the
files ``cdk deploy`` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stacks import (
    PRIMARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
)
from streamfleet_cdk.alarms import ALARM_TOPIC_NAME
from streamfleet_cdk.config import context_key
from tests.app_support import synthesize

REGIONS = {
    PRIMARY_STACK_NAME: "us-east-1",
    PRIMARY_WS_STACK_NAME: "us-east-1",
    SECONDARY_STACK_NAME: "us-west-2",
    SECONDARY_WS_STACK_NAME: "us-west-2",
}
FLEET_OF = {
    PRIMARY_WS_STACK_NAME: PRIMARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME: SECONDARY_STACK_NAME,
}
EMAIL = "oncall@example.com"


@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> Path:
    return synthesize(
        tmp_path_factory.mktemp("operations") / "cdk.out",
        {context_key("alarm_email"): EMAIL},
    )


def manifest(assembly: Path) -> dict[str, Any]:
    return json.loads((assembly / "manifest.json").read_text())


def templates(assembly: Path) -> dict[str, dict[str, Any]]:
    return {
        name: json.loads((assembly / artifact["properties"]["templateFile"]).read_text())
        for name, artifact in manifest(assembly)["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    }


def of_type(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def topic_arn_text(value: Any, template: dict[str, Any], region: str) -> str:
    """An alarm action as ``arn:aws:sns:<region>:<account>:<name>``, following a ``Ref`` to the
    stack's own topic."""
    if isinstance(value, dict) and "Ref" in value:
        topic = template["Resources"][value["Ref"]]
        assert topic["Type"] == "AWS::SNS::Topic"
        return f"arn:aws:sns:{region}:<AWS::AccountId>:{topic['Properties']['TopicName']}"
    assert value == {
        "Fn::Join": [
            "",
            [f"arn:aws:sns:{region}:", {"Ref": "AWS::AccountId"}, f":{ALARM_TOPIC_NAME}"],
        ]
    }
    return f"arn:aws:sns:{region}:<AWS::AccountId>:{ALARM_TOPIC_NAME}"


def test_no_alarm_in_any_template_lacks_an_action(assembly):
    found = 0
    for stack, template in templates(assembly).items():
        region = REGIONS[stack]
        expected = f"arn:aws:sns:{region}:<AWS::AccountId>:{ALARM_TOPIC_NAME}"
        for alarm_id, alarm in of_type(template, "AWS::CloudWatch::Alarm").items():
            found += 1
            properties = alarm["Properties"]
            for key in ("AlarmActions", "OKActions"):
                actions = properties.get(key, [])
                assert len(actions) == 1, (stack, alarm_id, key, actions)
                assert topic_arn_text(actions[0], template, region) == expected, (stack, alarm_id)
    assert found >= 20  # DLQ, leases lost, running tasks, 5XX, health, each function's two


def test_each_region_has_one_alarm_topic_encrypted_for_cloudwatch_with_the_email(assembly):
    every = templates(assembly)
    for fleet in (PRIMARY_STACK_NAME, SECONDARY_STACK_NAME):
        template = every[fleet]
        ((_, topic),) = of_type(template, "AWS::SNS::Topic").items()
        assert topic["Properties"]["TopicName"] == ALARM_TOPIC_NAME
        key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
        key = template["Resources"][key_id]["Properties"]
        assert key["EnableKeyRotation"] is True
        cloudwatch = [
            s
            for s in key["KeyPolicy"]["Statement"]
            if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
        ]
        assert cloudwatch == [
            {
                "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                "Effect": "Allow",
                "Principal": {"Service": "cloudwatch.amazonaws.com"},
                "Resource": "*",
            }
        ]
        ((_, policy),) = of_type(template, "AWS::SNS::TopicPolicy").items()
        (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert deny["Effect"] == "Deny"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        ((_, subscription),) = of_type(template, "AWS::SNS::Subscription").items()
        assert (subscription["Properties"]["Protocol"], subscription["Properties"]["Endpoint"]) == (
            "email",
            EMAIL,
        )
    for websocket in (PRIMARY_WS_STACK_NAME, SECONDARY_WS_STACK_NAME):
        assert of_type(every[websocket], "AWS::SNS::Topic") == {}  # the fleet stack's, by name


def test_exactly_one_stack_per_region_sets_the_api_gateway_cloudwatch_role(assembly):
    owners: dict[str, list[str]] = {}
    for stack, template in templates(assembly).items():
        for _ in of_type(template, "AWS::ApiGateway::Account"):
            owners.setdefault(REGIONS[stack], []).append(stack)
    assert owners == {"us-east-1": [PRIMARY_STACK_NAME], "us-west-2": [SECONDARY_STACK_NAME]}


def test_each_websocket_stack_deploys_after_its_regions_fleet_stack(assembly):
    artifacts = manifest(assembly)["artifacts"]
    for websocket, fleet in FLEET_OF.items():
        assert fleet in artifacts[websocket]["dependencies"], websocket


def test_without_an_account_the_assembly_is_account_agnostic(assembly, monkeypatch, tmp_path):
    # Neither the synth without credentials nor one with CDK_DEFAULT_ACCOUNT set (which the CLI
    # sets from ambient credentials) names an account: `cdk deploy` uses its credentials' own,
    # and nothing is ever synthesized for a made-up one.
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "210987654321")
    with_credentials = synthesize(tmp_path / "cdk.out")
    for directory in (assembly, with_credentials):
        artifacts = manifest(directory)["artifacts"]
        for stack, region in REGIONS.items():
            assert artifacts[stack]["environment"] == f"aws://unknown-account/{region}"
        for path in directory.glob("*.json"):
            text = path.read_text()
            assert "111111111111" not in text, path.name
            assert "210987654321" not in text, path.name
        assets = json.loads((directory / f"{PRIMARY_STACK_NAME}.assets.json").read_text())
        for entry in (*assets["files"].values(), *assets["dockerImages"].values()):
            for destination in entry["destinations"].values():
                assert "${AWS::AccountId}" in destination["assumeRoleArn"]


def test_a_configured_account_pins_every_stack(tmp_path):
    directory = synthesize(tmp_path / "cdk.out", {context_key("account"): "123456789012"})
    artifacts = manifest(directory)["artifacts"]
    for stack, region in REGIONS.items():
        assert artifacts[stack]["environment"] == f"aws://123456789012/{region}"
