"""The integration test on a real account (integ/, ``make integ``) synthesizes in the gate.

``make integ`` cannot run here (it deploys both Regions). What it deploys can be checked: the
integ app is run as integ-runner and ``make integ`` run it (``python3 integ_streamfleet.py``
from integ/, no ``PYTHONPATH``), with no AWS credentials and a settings file of placeholders
that names a custom domain (so every assertion is there), and a CLI context that tries to move
the primary Region (integ-runner passes its own context; ``cdk.json``'s and the file's win).
Then: the manifest's test case, the stacks under test (the app's, deleted with their stacks),
the probe and its permissions, and the assertions, their order and what each one expects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stacks import (
    PRIMARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
)
from streamfleet.wsapi import jwt
from streamfleet_integ import preflight
from streamfleet_integ.settings import (
    ASSERTIONS_STACK_NAME,
    CONTEXT_FILE_VARIABLE,
    EXAMPLE_CONTEXT_FILE,
    INTEG_FORCED,
    IntegSettings,
    IntegSettingsError,
)

REPO = Path(__file__).resolve().parents[2]
INTEG = REPO / "integ"

UNDER_TEST = [
    PRIMARY_STACK_NAME,
    SECONDARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
]
DOMAIN = "ws.integ.example.net"
UPSTREAM = "wss://feed.test.example.net:8443/stream"
DEPLOY_ASSERT = "Custom::DeployAssert@"
# The assertions, in the order they run (each depends on the one before).
ORDER = [
    "HttpCall",
    "SdkCallLambdainvoke",  # START
    "SdkCallDynamoDBquery",
    "SdkCallLambdainvoke",  # subscribed through the primary
    "SdkCallCloudWatchdescribeAlarms",  # OK
    "SdkCallRoute53getHealthCheckStatus",  # healthy
    "SdkCallLambdaputFunctionConcurrency",  # 0
    "SdkCallCloudWatchdescribeAlarms",  # ALARM
    "SdkCallRoute53getHealthCheckStatus",  # unhealthy
    "SdkCallLambdainvoke",  # through the failover name
    "SdkCallLambdaputFunctionConcurrency",  # given back
    "SdkCallRoute53getHealthCheckStatus",  # healthy again
]


def settings_document() -> dict[str, Any]:
    canary = jwt.generate_signing_key(jwt.ES256, "integ-canary")
    account = "123456789012"
    return {
        "streamfleet-integ:upstream_url": UPSTREAM,
        "streamfleet-integ:user_key_secret_name": "streamfleet-integ/user-key",
        "streamfleet-integ:user_key_id": "integ-user-1",
        "streamfleet:jwt_issuer": "https://idp.test.example.net/",
        "streamfleet:jwt_jwks_url": "https://idp.test.example.net/.well-known/jwks.json",
        "streamfleet:canary_signing_key_secret_name": "streamfleet-integ/canary-key",
        "streamfleet:canary_public_keys": json.dumps(jwt.jwks_document([canary])),
        "streamfleet:deletion_protection": True,  # forced off: the run must be deletable
        "streamfleet:ws_domain_name": DOMAIN,
        "streamfleet:hosted_zone_id": "Z0123456789ABCDEFGHIJ",
        "streamfleet:hosted_zone_name": "integ.example.net",
        "streamfleet:ws_certificate_arn_primary": (
            f"arn:aws:acm:us-east-1:{account}:certificate/00000000-0000-0000-0000-000000000001"
        ),
        "streamfleet:ws_certificate_arn_secondary": (
            f"arn:aws:acm:us-west-2:{account}:certificate/00000000-0000-0000-0000-000000000002"
        ),
    }


def no_aws(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``env`` without any AWS credential source: no variables, files or instance metadata."""
    clean = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    missing = str(tmp_path / "no-such-file")
    return {
        **clean,
        "AWS_CONFIG_FILE": missing,
        "AWS_SHARED_CREDENTIALS_FILE": missing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def run_integ_app(tmp_path: Path, settings: Path, **env: str) -> subprocess.CompletedProcess:
    # As the CDK CLI (or integ-runner) runs it: from integ/, none of the repository's import
    # roots on PYTHONPATH (the file puts them on its path), installed packages as they are.
    outside = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(REPO)
    ]
    return subprocess.run(
        [sys.executable, str(INTEG / "integ_streamfleet.py")],
        cwd=INTEG,
        env={
            **no_aws(dict(os.environ), tmp_path),
            "PYTHONPATH": os.pathsep.join(outside),
            CONTEXT_FILE_VARIABLE: str(settings),
            # As the Makefile sets them: jsii's Node version banner is not the app's output.
            "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
            "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=280,
    )


@pytest.fixture(scope="module")
def assembly(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("integ")
    settings = tmp / "context.json"
    settings.write_text(json.dumps(settings_document()))
    out = tmp / "cdk.out"
    result = run_integ_app(
        tmp,
        settings,
        CDK_OUTDIR=str(out),
        CDK_CONTEXT_JSON=json.dumps({"streamfleet:primary_region": "eu-west-1"}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def template(assembly: Path, stack: str) -> dict[str, Any]:
    return json.loads((assembly / f"{stack}.template.json").read_text())


def custom_resources(assembly: Path) -> dict[str, dict[str, Any]]:
    resources = template(assembly, ASSERTIONS_STACK_NAME)["Resources"]
    return {k: r for k, r in resources.items() if r["Type"].startswith(DEPLOY_ASSERT)}


def in_order(assembly: Path) -> list[tuple[str, dict[str, Any]]]:
    """The assertion resources, following their ``DependsOn`` chain from the first."""
    found = custom_resources(assembly)
    before = {
        logical_id: [d for d in resource.get("DependsOn", []) if d in found]
        for logical_id, resource in found.items()
    }
    assert all(len(deps) <= 1 for deps in before.values()), before
    (first,) = [k for k, deps in before.items() if not deps]
    chain = [first]
    while nexts := [k for k, deps in before.items() if deps == [chain[-1]]]:
        (following,) = nexts
        chain.append(following)
    assert len(chain) == len(found), "an assertion outside the chain"
    return [(k, found[k]) for k in chain]


def text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def deployed(value: Any) -> str:
    """A parameter as CloudFormation will hand it to the provider, each intrinsic that is not a
    join read as ``<value>`` (what it resolves to holds no quote or backslash: names, ids)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(deployed(part) for part in parts)
    return "<value>"


# --- the manifest and the stacks under test ---


def test_the_test_case_deploys_the_apps_four_stacks_then_its_assertions(assembly):
    manifest = json.loads((assembly / "integ.json").read_text())
    (case,) = manifest["testCases"].values()
    assert case["stacks"] == UNDER_TEST
    assert case["assertionStackName"] == ASSERTIONS_STACK_NAME
    assert case["stackUpdateWorkflow"] is False


def test_the_stacks_keep_the_files_regions_over_the_clis_context(assembly):
    artifacts = json.loads((assembly / "manifest.json").read_text())["artifacts"]
    regions = {name: artifacts[name]["environment"].rsplit("/", 1)[1] for name in UNDER_TEST}
    assert regions == {
        PRIMARY_STACK_NAME: "us-east-1",
        PRIMARY_WS_STACK_NAME: "us-east-1",
        SECONDARY_STACK_NAME: "us-west-2",
        SECONDARY_WS_STACK_NAME: "us-west-2",
    }
    assert artifacts[ASSERTIONS_STACK_NAME]["environment"].endswith("/us-east-1")


def test_nothing_under_test_outlives_its_stack_but_the_api_gateway_logging_role(assembly):
    for stack in UNDER_TEST:
        retained = []
        for logical_id, resource in template(assembly, stack)["Resources"].items():
            if resource.get("DeletionPolicy", "Delete") != "Delete":
                retained.append(logical_id)
            props = resource.get("Properties", {})
            assert props.get("DeletionProtectionEnabled") is not True, (stack, logical_id)
            for replica in props.get("Replicas", []):
                assert replica.get("DeletionProtectionEnabled") is not True, (stack, logical_id)
        # The account setting outlives the stack and points at it (the fleet stacks own it).
        owns_it = stack in (PRIMARY_STACK_NAME, SECONDARY_STACK_NAME)
        assert [r.startswith("ApiGatewayAccountCloudWatchRole") for r in retained] == (
            [True] if owns_it else []
        ), (stack, retained)


def test_the_upstream_is_the_one_allowed(assembly):
    router = [
        r
        for r in template(assembly, PRIMARY_STACK_NAME)["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
        and "ALLOWED_UPSTREAMS" in r["Properties"].get("Environment", {}).get("Variables", {})
    ]
    assert router
    for function in router:
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables["ALLOWED_UPSTREAMS"] == "wss://feed.test.example.net:8443"


# --- the probe ---


def probe_function(assembly: Path) -> dict[str, Any]:
    resources = template(assembly, ASSERTIONS_STACK_NAME)["Resources"]
    (function,) = [
        r
        for k, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function" and k.startswith("ProbeFunction")
    ]
    return function["Properties"]


def test_the_probe_may_start_on_the_primarys_events_route_and_read_its_key_only(assembly):
    resources = template(assembly, ASSERTIONS_STACK_NAME)["Resources"]
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for k, r in resources.items()
        if r["Type"] == "AWS::IAM::Policy" and k.startswith("ProbeRole")
    ]
    actions = {text(s["Action"]): text(s["Resource"]) for s in policy["Statement"]}
    invoke = actions.pop(text("execute-api:Invoke"))
    assert invoke.endswith('/POST/events"]]}') and PRIMARY_STACK_NAME in invoke
    secret = actions.pop(text(["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"]))
    assert ":secret:streamfleet-integ/user-key-??????" in secret
    assert list(actions) == [text(["logs:CreateLogStream", "logs:PutLogEvents"])]


def test_the_probe_is_configured_and_carries_its_code(assembly):
    function = probe_function(assembly)
    variables = function["Environment"]["Variables"]
    assert variables["UPSTREAM_URL"] == UPSTREAM
    assert variables["USER_KEY_ID"] == "integ-user-1"
    assert variables["JWT_ISSUER"] == "https://idp.test.example.net/"
    assert function["Handler"] == "streamfleet_integ.probe.handler"
    asset = assembly / f"asset.{function['Code']['S3Key'].removesuffix('.zip')}"
    for carried in ("streamfleet_integ/probe.py", "streamfleet/wsapi/jwt.py", "websockets", "jwt"):
        assert (asset / carried).exists(), carried
    assert list(asset.glob("cryptography*")), "cryptography"
    assert not (asset / "streamfleet_integ/build.py").exists()  # the handler's imports only


# --- the assertions ---


def test_the_assertions_run_in_order(assembly):
    kinds = [r["Type"].removeprefix(DEPLOY_ASSERT) for _, r in in_order(assembly)]
    assert kinds == ORDER


def test_each_assertion_expects_what_it_proves(assembly):
    steps = [r["Properties"] for _, r in in_order(assembly)]
    unsigned, start, stored, primary, ok, healthy, failed, alarm, unhealthy, by_name = steps[:10]
    restored, healthy_again = steps[10:]

    assert unsigned["parameters"]["fetchOptions"]["method"] == "POST"
    assert "/events" in text(unsigned["parameters"]["url"])
    assert "Authorization" not in text(unsigned["parameters"])
    assert json.loads(unsigned["expected"]) == {"$ObjectLike": {"status": 403}}

    # The provider JSON-decodes each parameter: the probe gets this text, a JSON object.
    assert json.loads(json.loads(start["parameters"]["Payload"])) == {"action": "start"}
    assert '"accepted":true' in start["expected"]

    assert json.loads(stored["parameters"]["ExpressionAttributeValues"]) == {
        ":pk": {"S": "CONN#integ-streamfleet"}
    }
    assert "MessagesTable" in text(stored["parameters"]["TableName"])
    assert json.loads(stored["expected"]) == {"$ObjectLike": {"Count": 1}}

    assert PRIMARY_WS_STACK_NAME in text(primary["parameters"]["Payload"])
    assert json.loads(json.loads(deployed(primary["parameters"]["Payload"]))) == {
        "action": "subscribe",
        "url": "wss://<value>.execute-api.us-east-1.<value>/v1",
    }
    expected = json.loads(primary["expected"])["$ObjectLike"]["Payload"]["$SerializedJson"]
    assert expected == {
        "$ObjectLike": {"subscribed": True, "replayed": True, "live": True, "region": "us-east-1"}
    }

    for step, state in ((ok, "OK"), (alarm, "ALARM")):
        assert json.loads(step["parameters"]["StateValue"]) == state
        assert "CanaryAlarm" in text(step["parameters"]["AlarmNames"])
        assert json.loads(step["expected"]) == {
            "$ObjectLike": {"MetricAlarms": [{"StateValue": state}]}
        }
    for step, status in ((healthy, "Success"), (unhealthy, "Failure"), (healthy_again, "Success")):
        assert "CanaryHealthCheck" in text(step["parameters"]["HealthCheckId"])
        assert step["actualPath"] == "HealthCheckObservations.0.StatusReport.Status"
        assert json.loads(step["expected"]) == {"$StringLike": f"^{status}"}

    # The primary's WebSocket handler, throttled to nothing, then given its reservation back.
    for step, concurrency in ((failed, "0"), (restored, "200")):
        assert "WebSocketHandler" in text(step["parameters"]["FunctionName"])
        assert PRIMARY_WS_STACK_NAME in text(step["parameters"]["FunctionName"])
        assert step["parameters"]["ReservedConcurrentExecutions"] == concurrency

    assert json.loads(json.loads(by_name["parameters"]["Payload"])) == {
        "action": "subscribe",
        "url": f"wss://{DOMAIN}",
    }
    assert '"region":"us-west-2"' in by_name["expected"]


def test_every_waiting_assertion_has_a_deadline(assembly):
    waiting = [r for _, r in in_order(assembly) if "stateMachineArn" in r["Properties"]]
    # Every one but the unsigned call and the two concurrency changes polls until it holds.
    assert len(waiting) == len(ORDER) - 3


# --- settings and preflight, without a synth ---


def test_the_example_settings_name_every_required_key():
    settings = IntegSettings.from_file(EXAMPLE_CONTEXT_FILE)
    assert settings.upstream_url.startswith("wss://")
    context = settings.context({})
    for key, value in INTEG_FORCED.items():
        assert context[key] == value


@pytest.mark.parametrize(
    ("change", "first_words"),
    [
        ({"streamfleet-integ:upstream_url": None}, "streamfleet-integ:upstream_url: required"),
        ({"streamfleet:canary_public_keys": None}, "streamfleet:canary_public_keys: required"),
        ({"streamfleet-integ:upstream_url": "https://x.example.net"}, "streamfleet-integ:upstream"),
        ({"streamfleet-integ:typo": "x"}, "streamfleet-integ:typo: not a setting"),
    ],
)
def test_a_wrong_settings_file_is_refused_naming_the_key(change, first_words):
    document = {k: v for k, v in {**settings_document(), **change}.items() if v is not None}
    with pytest.raises(IntegSettingsError) as refused:
        IntegSettings.from_context(document, source="context.json")
    assert str(refused.value).startswith(first_words)


def test_a_missing_settings_file_stops_the_integ_app_in_one_line(tmp_path):
    result = run_integ_app(tmp_path, tmp_path / "absent.json")
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {CONTEXT_FILE_VARIABLE}: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_without_credentials_make_integ_says_how_and_stops_in_one_error_line(tmp_path):
    settings = tmp_path / "context.json"
    settings.write_text(json.dumps(settings_document()))
    result = subprocess.run(
        [sys.executable, "-m", "streamfleet_integ.run"],
        cwd=INTEG,
        env={**no_aws(dict(os.environ), tmp_path), CONTEXT_FILE_VARIABLE: str(settings)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # nothing synthesized, no CLI started
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [result.stderr.strip().splitlines()[-1]]
    assert errors[0].startswith("error: no AWS credentials: set AWS_PROFILE")
    assert preflight.HOW_TO_RUN.splitlines()[0] in result.stderr
