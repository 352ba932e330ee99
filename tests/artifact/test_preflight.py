"""``make preflight``: what a deploy needs that synth cannot see, checked against an account.

The account is a moto server, set up with every prerequisite present, then with each one
missing in turn; Docker is a command runner the test controls. What is checked comes from the
synthesized assembly (the real app with a custom domain and a canary signing key in context).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from streamfleet_dev.assembly import LOCAL_ACCOUNT
from streamfleet_ops import preflight
from tests.assembly_support import (
    CERTIFICATES,
    DOMAIN,
    SECRET_NAME,
    ZONE_ID,
    artifact_assembly,
)

REPO = Path(__file__).resolve().parents[2]
# Each test gets Regions of its own on the shared moto server: state never leaks between them.
_FRESH_REGIONS = itertools.cycle(
    [
        ("eu-west-1", "eu-west-2"),
        ("eu-west-3", "eu-central-1"),
        ("eu-north-1", "ap-south-1"),
        ("ap-northeast-1", "ap-northeast-2"),
        ("ap-southeast-1", "ap-southeast-2"),
        ("ca-central-1", "sa-east-1"),
        ("us-east-2", "us-west-1"),
        ("eu-south-1", "ap-east-1"),
        ("me-south-1", "af-south-1"),
        ("ap-northeast-3", "eu-central-2"),
        ("ap-southeast-3", "eu-south-2"),
    ]
)
BUILDX_ARM64 = (
    "Name: default\nDriver: docker\nNodes:\nPlatforms: linux/amd64, linux/arm64, linux/386\n"
)
BUILDX_NATIVE = "Name: default\nDriver: docker\nNodes:\nPlatforms: linux/amd64, linux/386\n"


@pytest.fixture
def aws(moto, monkeypatch):
    """Every service on the moto server, as with real credentials in one account."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    return moto


def _client(service: str, region: str):
    return boto3.client(service, region_name=region)


def _certificate_pem(domain: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, domain)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(domain)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def docker(platforms: str = BUILDX_ARM64, *, installed: bool = True, engine: bool = True):
    """A command runner standing in for the docker CLI."""

    def run(command):
        if not installed:
            raise FileNotFoundError(2, "No such file or directory", command[0])
        if command[:2] == ["docker", "info"]:
            if not engine:
                return subprocess.CompletedProcess(
                    command, 1, "", "Cannot connect to the Docker daemon. Is it running?"
                )
            return subprocess.CompletedProcess(command, 0, "27.3.1\n", "")
        if command[:3] == ["docker", "buildx", "inspect"]:
            return subprocess.CompletedProcess(command, 0, platforms, "")
        raise AssertionError(f"unexpected command {command}")

    return run


@dataclasses.dataclass
class Account:
    """The target account on moto, with every prerequisite of ``target`` present."""

    target: preflight.DeployTarget
    regions: tuple[str, str]
    zone_id: str

    @classmethod
    def ready(cls) -> Account:
        synthesized = preflight.target_from_assembly(artifact_assembly().directory)
        regions = next(_FRESH_REGIONS)
        zone = _client("route53", "us-east-1").create_hosted_zone(
            Name=DOMAIN.split(".", 1)[1], CallerReference=uuid.uuid4().hex
        )
        zone_id = zone["HostedZone"]["Id"].rsplit("/", 1)[-1]
        needs = []
        for original, region in zip(synthesized.regions, regions, strict=True):
            _client("ssm", region).put_parameter(
                Name=original.bootstrap_parameter, Value="30", Type="String", Overwrite=True
            )
            _client("apigateway", region).update_account(
                patchOperations=[
                    {
                        "op": "replace",
                        "path": "/cloudwatchRoleArn",
                        "value": f"arn:aws:iam::{LOCAL_ACCOUNT}:role/apigw-logs",
                    }
                ]
            )
            certificate, key = _certificate_pem(DOMAIN)
            arn = _client("acm", region).import_certificate(
                Certificate=certificate, PrivateKey=key
            )["CertificateArn"]
            secrets = _client("secretsmanager", region)
            for _, secret in original.secrets:
                try:
                    secrets.create_secret(Name=secret, SecretString="pem")
                except secrets.exceptions.ResourceExistsException:
                    secrets.put_secret_value(SecretId=secret, SecretString="pem")
            needs.append(
                dataclasses.replace(
                    original,
                    region=region,
                    # The API call path: as if no stack declared the account settings.
                    creates_api_gateway_account=None,
                    certificates=tuple((domain, arn) for domain, _ in original.certificates),
                )
            )
        target = dataclasses.replace(
            synthesized,
            regions=tuple(needs),
            hosted_zones=tuple((zone_id, record) for _, record in synthesized.hosted_zones),
        )
        return cls(target, regions, zone_id)

    def run(self, target: preflight.DeployTarget | None = None, runner=None):
        return preflight.run_checks(target or self.target, runner=runner or docker())


def _by_check(results):
    return {result.check: result for result in results}


def test_what_to_check_is_read_from_the_synthesized_assembly():
    assembly = artifact_assembly()
    target = preflight.target_from_assembly(assembly.directory)
    assert target.account == LOCAL_ACCOUNT
    primary, secondary = target.regions
    assert (primary.region, secondary.region) == ("us-east-1", "us-west-2")
    for needs in target.regions:
        stacks = [s for s in assembly.stacks if s.region == needs.region]
        assert needs.bootstrap_version == max(s.bootstrap_version for s in stacks) >= 6
        assert needs.certificates == ((DOMAIN, CERTIFICATES[needs.region]),)
        assert [secret for _, secret in needs.secrets] == [SECRET_NAME]
        declares = [s.name for s in stacks if s.has_resource_type("AWS::ApiGateway::Account")]
        assert needs.creates_api_gateway_account == (declares[0] if declares else None)
        assert needs.logging_stages
    assert target.hosted_zones == ((ZONE_ID, DOMAIN),)
    assert target.image_platforms == ("linux/arm64",)


def test_an_account_with_every_prerequisite_passes(aws):
    account = Account.ready()
    results = account.run()
    assert [r.line() for r in results if r.status != preflight.PASS] == []
    checks = {r.check for r in results}
    for region in account.regions:
        for name in ("bootstrap", "API Gateway CloudWatch role", "certificate", "secret"):
            assert f"{name} {region}" in checks
    assert {"credentials", "docker", f"hosted zone {account.zone_id}"} <= checks
    assert not preflight.failed(results)


def _missing_bootstrap(account):
    _client("ssm", account.regions[1]).delete_parameter(Name=preflight.DEFAULT_BOOTSTRAP_PARAMETER)
    return f"bootstrap {account.regions[1]}", "not bootstrapped", "npx cdk bootstrap aws://"


def _old_bootstrap(account):
    _client("ssm", account.regions[0]).put_parameter(
        Name=preflight.DEFAULT_BOOTSTRAP_PARAMETER, Value="5", Type="String", Overwrite=True
    )
    return f"bootstrap {account.regions[0]}", "version 5", "npx cdk bootstrap aws://"


def _unset_cloudwatch_role(region: str) -> None:
    _client("apigateway", region).update_account(
        patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": ""}]
    )


def _no_cloudwatch_role(account):
    _unset_cloudwatch_role(account.regions[0])
    return f"API Gateway CloudWatch role {account.regions[0]}", "not set", "update-account"


def _no_zone(account):
    account.target = dataclasses.replace(account.target, hosted_zones=((ZONE_ID, DOMAIN),))
    return f"hosted zone {ZONE_ID}", "not found", "streamfleet:hosted_zone_id"


def _pending_certificate(account):
    region = account.regions[0]
    arn = _client("acm", region).request_certificate(DomainName=DOMAIN)["CertificateArn"]
    needs = dataclasses.replace(account.target.regions[0], certificates=((DOMAIN, arn),))
    account.target = dataclasses.replace(
        account.target, regions=(needs, *account.target.regions[1:])
    )
    return f"certificate {region}", "PENDING_VALIDATION", "complete the validation"


def _certificate_elsewhere(account):
    needs = dataclasses.replace(
        account.target.regions[1], certificates=((DOMAIN, CERTIFICATES["us-east-1"]),)
    )
    account.target = dataclasses.replace(account.target, regions=(account.target.regions[0], needs))
    return f"certificate {account.regions[1]}", "is in us-east-1", "request a certificate"


def _no_secret(account):
    _client("secretsmanager", account.regions[1]).delete_secret(
        SecretId=SECRET_NAME, ForceDeleteWithoutRecovery=True
    )
    return f"secret {account.regions[1]}", "not found", "aws secretsmanager create-secret"


def _placeholder_account(account):
    account.target = dataclasses.replace(account.target, account=preflight.PLACEHOLDER_ACCOUNT)
    return "credentials", "placeholder account", "-c streamfleet:account="


def test_an_account_agnostic_assembly_deploys_into_the_credentials_account(aws):
    account = Account.ready()
    target = dataclasses.replace(account.target, account=preflight.AGNOSTIC_ACCOUNT)
    result = _by_check(account.run(target))["credentials"]
    assert result.status == preflight.PASS and LOCAL_ACCOUNT in result.detail


MISSING = {
    "bootstrap stack": (_missing_bootstrap, None),
    "bootstrap too old": (_old_bootstrap, None),
    "API Gateway CloudWatch role": (_no_cloudwatch_role, None),
    "hosted zone": (_no_zone, None),
    "certificate not issued": (_pending_certificate, None),
    "certificate in another Region": (_certificate_elsewhere, None),
    "canary secret": (_no_secret, None),
    "placeholder account": (_placeholder_account, None),
    "docker not installed": (None, docker(installed=False)),
    "docker engine not running": (None, docker(engine=False)),
    "docker cannot build arm64": (None, docker(BUILDX_NATIVE)),
}
DOCKER_EXPECTATIONS = {
    "docker not installed": ("cannot run here", "install Docker"),
    "docker engine not running": ("no Docker engine reachable", "start Docker"),
    "docker cannot build arm64": ("cannot build linux/arm64", "tonistiigi/binfmt"),
}


@pytest.mark.parametrize("missing", list(MISSING))
def test_each_missing_prerequisite_is_one_failed_line_with_its_fix(aws, missing):
    account = Account.ready()
    breaker, runner = MISSING[missing]
    if breaker is not None:
        check, detail, fix = breaker(account)
    else:
        check, (detail, fix) = "docker", DOCKER_EXPECTATIONS[missing]
    results = account.run(runner=runner)
    failures = [r for r in results if r.status == preflight.FAIL]
    assert [r.check for r in failures] == [check], [r.line() for r in results]
    (failure,) = failures
    assert detail in failure.detail and fix in failure.fix, failure.line()
    assert "-> fix:" in failure.line() and "\n" not in failure.line()
    assert preflight.failed(results)


def test_stacks_that_create_the_cloudwatch_role_need_no_account_setting(aws):
    account = Account.ready()
    region = account.regions[0]
    _unset_cloudwatch_role(region)
    needs = dataclasses.replace(
        account.target.regions[0], creates_api_gateway_account="StreamFleet-Primary"
    )
    target = dataclasses.replace(account.target, regions=(needs, *account.target.regions[1:]))
    result = _by_check(account.run(target))[f"API Gateway CloudWatch role {region}"]
    assert result.status == preflight.PASS and "StreamFleet-Primary" in result.detail


def test_a_canary_without_a_signing_key_is_a_warning(aws):
    account = Account.ready()
    needs = dataclasses.replace(account.target.regions[0], secrets=())
    target = dataclasses.replace(account.target, regions=(needs, *account.target.regions[1:]))
    result = _by_check(account.run(target))[f"canary signing key {needs.region}"]
    assert result.status == preflight.WARN and preflight.CANARY_SECRET_CONTEXT in result.fix


def test_cli_preflight_prints_one_line_per_check_and_fails_without_docker(aws, tmp_path):
    """The command as a person runs it, on this machine (which has no Docker engine)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO)]),
        "PATH": str(tmp_path),  # no docker on PATH, whatever this machine has
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamfleet_ops.cli",
            "preflight",
            "--assembly",
            str(artifact_assembly().directory),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(
        line.split(" ", 1)[0] in ("PASS", "FAIL", "WARN", "SKIP") for line in lines
    )
    docker_line = next(line for line in lines if line.startswith("FAIL docker:"))
    assert "-> fix: install Docker" in docker_line
    assert "Traceback" not in result.stderr


def test_cli_preflight_without_an_assembly_says_so(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "streamfleet_ops.cli", "preflight", "--assembly", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO)])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--assembly" in result.stderr and "make synth" in result.stderr
    assert "Traceback" not in result.stderr
