"""The construct library as a platform team gets it: built into a wheel, installed with exactly
what the wheel declares, and used from a throw-away CDK app that has never seen this repository.

"Exactly what it declares": the interpreter runs with ``-S`` (no site-packages at all) and sees
only the installed wheel and, next to it, the distributions its ``Requires-Dist`` names (and
theirs, and the ``cli`` extra's where asked), linked from this virtualenv's installed copies. A
dependency the code imports but the wheel does not declare fails here, as it would in a fresh
virtualenv after ``pip install``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"

THROWAWAY_APP = f"""
import json, sys
import aws_cdk as cdk
from aws_cdk import aws_certificatemanager as acm, aws_iam as iam, aws_route53 as route53
import streamfleet, streamfleet_cdk, streamfleet_client  # the client: only websockets
from streamfleet_cdk.alarms import AlarmNotifications, AlarmTopic
from streamfleet_cdk.api_gateway_account import ApiGatewayAccount
from streamfleet_cdk.canary import WebSocketCanary, WebSocketCanaryProps
from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.failover_dns import FailoverRecords, FailoverRecordsProps, FailoverTarget
from streamfleet_cdk.tables import FleetTableReplicas, FleetTables, FleetTablesProps
from streamfleet_cdk.websocket_api import (
    CustomDomain, JwtSettings, WebSocketApi, WebSocketApiProps, WebSocketTables,
    WebSocketTablesProps,
)
from streamfleet_cdk.worker_fleet import WorkerFleet, WorkerFleetProps

app = cdk.App(outdir=sys.argv[1])
env = cdk.Environment(account="{ACCOUNT}", region="eu-west-1")
stack = cdk.Stack(app, "PlatformTeam", env=env)
topic = AlarmTopic(stack, "Alarms", email="oncall@example.com").topic
ApiGatewayAccount(stack, "ApiGatewayAccount")
tables = FleetTables(stack, "Tables", props=FleetTablesProps(deletion_protection=False))
FleetTableReplicas(stack, "Replicas", lease_table_name="other-leases",
                   messages_table_name="other-messages")
upstreams = ("wss://*.feeds.example.com",)
ingestion = EventIngestion(stack, "Ingestion", props=EventIngestionProps(
    lease_table=tables.lease_table, allowed_upstreams=upstreams,
    invoke_principals=("arn:aws:iam::{ACCOUNT}:role/producer",)))
ingestion.grant_invoke(iam.Role(stack, "Scheduler",
                                assumed_by=iam.ServicePrincipal("lambda.amazonaws.com")))
WorkerFleet(stack, "Fleet", props=WorkerFleetProps(
    lease_table=tables.lease_table, messages_table=tables.messages_table,
    queue=ingestion.queue, allowed_upstreams=upstreams,
    availability_zones=("eu-west-1a", "eu-west-1b")))
ws_tables = WebSocketTables(stack, "WsTables", props=WebSocketTablesProps(
    state_table_name="ws-state", connections_table_name="ws-connections"))
certificate = acm.Certificate.from_certificate_arn(
    stack, "Certificate", "arn:aws:acm:eu-west-1:{ACCOUNT}:certificate/abc")
websocket = WebSocketApi(stack, "WebSocket", props=WebSocketApiProps(
    state_table=ws_tables.state_table, connections_table=ws_tables.connections_table,
    jwt=JwtSettings(issuer="https://login.example.org/", audience="clients",
                    jwks_url="https://login.example.org/.well-known/jwks.json"),
    custom_domain=CustomDomain(domain_name="ws.example.org", certificate=certificate)))
canary = WebSocketCanary(stack, "Canary", props=WebSocketCanaryProps(
    api=websocket.api, stage=websocket.stage, state_table=ws_tables.connections_table,
    jwt_audience="clients", signing_key_secret_name="canary-key"))
zone = route53.HostedZone.from_hosted_zone_attributes(
    stack, "Zone", hosted_zone_id="Z0123456789ABCDEFGHIJ", zone_name="example.org")
FailoverRecords(stack, "Failover", props=FailoverRecordsProps(
    zone=zone, record_name="ws.example.org",
    primary=FailoverTarget.of_domain(websocket.domain_name, set_identifier="eu-primary",
                                     health_check=canary.health_check)))
AlarmNotifications.apply(stack, topic)
app.synth()
print(json.dumps({{"streamfleet": streamfleet.__file__, "cdk": streamfleet_cdk.__file__}}))
"""

# Every construct the library offers, by the resource that proves it was synthesized.
EXPECTED_TYPES = {
    "AWS::SNS::Topic",  # AlarmTopic
    "AWS::ApiGateway::Account",  # ApiGatewayAccount
    "AWS::DynamoDB::GlobalTable",  # FleetTables, WebSocketTables
    "AWS::ApiGateway::RestApi",  # EventIngestion
    "AWS::ECS::Service",  # WorkerFleet
    "AWS::ApplicationAutoScaling::ScalingPolicy",
    "AWS::ApiGatewayV2::Api",  # WebSocketApi
    "AWS::ApiGatewayV2::DomainName",
    "AWS::Route53::HealthCheck",  # WebSocketCanary
    "AWS::Route53::RecordSet",  # FailoverRecords
    "AWS::Lambda::Function",
}


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    result = run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)])
    assert result.returncode == 0, result.stderr[-3000:]
    [built] = wheels.glob("resilient_streaming_fleet-*.whl")
    return built


def wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def declared_closure(wheel: Path, extras: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The wheel's requirements (with ``extras``) and theirs, as installed in this venv."""
    environment = {"extra": ""}
    pending = [
        (Requirement(text), "") for text in wheel_metadata(wheel).get_all("Requires-Dist") or ()
    ]
    found: dict[str, importlib.metadata.Distribution] = {}
    while pending:
        requirement, _ = pending.pop()
        wanted_by_extra = requirement.marker is not None and "extra" in str(requirement.marker)
        if wanted_by_extra:
            if not any(requirement.marker.evaluate({"extra": e}) for e in extras):
                continue
        elif requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = str(canonicalize_name(requirement.name))
        if name in found:
            continue
        distribution = importlib.metadata.distribution(name)
        assert requirement.specifier.contains(distribution.version, prereleases=True), (
            f"{requirement} is declared, but this venv has {distribution.version}"
        )
        found[name] = distribution
        pending.extend((Requirement(text), name) for text in distribution.requires or ())
    return list(found.values())


def install(wheel: Path, root: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The wheel (``root/site``) and what it declares (``root/deps``, linked file by file):
    the ``PYTHONPATH`` entries of an interpreter that has nothing else."""
    site, deps = root / "site", root / "deps"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    result = run([*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)])
    assert result.returncode == 0, result.stderr[-3000:]
    for distribution in declared_closure(wheel, extras):
        for record in distribution.files or ():
            relative = record.as_posix()
            if relative.startswith("..") or "__pycache__" in relative:
                continue
            source = Path(str(distribution.locate_file(record)))
            if source.is_file():
                target = deps / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    target.symlink_to(source)
    return [str(site), str(deps)]


def isolated_env(paths: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def test_the_wheel_declares_what_the_constructs_and_the_cli_need(wheel):
    requires = {
        str(canonicalize_name(Requirement(text).name)): Requirement(text)
        for text in wheel_metadata(wheel).get_all("Requires-Dist") or ()
    }
    # The WebSocket constructs bundle PyJWT and cryptography (the authorizer and the canary
    # verify and mint tokens) and websockets (the canary): the synth must have them.
    for name in ("aws-cdk-lib", "constructs", "cryptography", "pyjwt", "websockets", "packaging"):
        assert name in requires and requires[name].marker is None, name
        assert requires[name].specifier, f"{name}: a range, not any version"
    for name in ("typer", "rich"):  # python -m streamfleet_ops.cli, an extra
        assert str(requires[name].marker) == 'extra == "cli"', name


def test_the_wheel_carries_no_development_tools(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    packages = {name.split("/", 1)[0] for name in names if "/" in name}
    shipped = {"streamfleet", "streamfleet_cdk", "streamfleet_client", "streamfleet_ops"}
    assert shipped <= packages
    assert (
        not packages
        - shipped
        - {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    )
    assert not [n for n in names if "streamfleet_dev" in n or n.startswith(("devtools", "tests"))]
    assert "streamfleet/_image/Dockerfile" in names
    assert "streamfleet/_image/requirements.txt" in names


@pytest.mark.slow
def test_the_installed_library_synthesizes_every_construct_in_a_throwaway_app(wheel, tmp_path):
    paths = install(wheel, tmp_path / "install")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "app.py").write_text(THROWAWAY_APP)
    # -S: no site-packages, only the wheel and what it declares (PYTHONPATH).
    result = run(
        [sys.executable, "-S", "app.py", str(app_dir / "cdk.out")],
        cwd=app_dir,
        env=isolated_env(paths),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    origins = json.loads(result.stdout.strip().splitlines()[-1])
    site = Path(paths[0])
    assert all(Path(path).is_relative_to(site) for path in origins.values()), origins
    template = json.loads((app_dir / "cdk.out" / "PlatformTeam.template.json").read_text())
    types = {resource["Type"] for resource in template["Resources"].values()}
    assert types >= EXPECTED_TYPES, EXPECTED_TYPES - types
    assets = json.loads((app_dir / "cdk.out" / "PlatformTeam.assets.json").read_text())
    assert assets["dockerImages"], "the worker image is built from the installed package"
    canary = [
        r
        for r in template["Resources"].values()
        if r["Type"] == "AWS::Lambda::Function"
        and r["Properties"].get("Handler") == "streamfleet.wsapi.canary.handler"
    ]
    [key] = [c["Properties"]["Code"]["S3Key"].removesuffix(".zip") for c in canary]
    assert (app_dir / "cdk.out" / f"asset.{key}" / "websockets").is_dir()


@pytest.mark.slow
def test_the_cli_runs_from_the_installed_wheel_with_its_extra(wheel, tmp_path):
    command = [sys.executable, "-S", "-m", "streamfleet_ops.cli", "--help"]
    with_extra = run(
        command,
        env=isolated_env(install(wheel, tmp_path / "cli", ("cli",))),
        cwd=tmp_path,
        timeout=120,
    )
    assert with_extra.returncode == 0, with_extra.stderr[-3000:]
    assert "Usage" in with_extra.stdout
    # Not vacuous: without the extra the CLI's own dependencies are missing.
    without = run(
        command, env=isolated_env(install(wheel, tmp_path / "bare")), cwd=tmp_path, timeout=120
    )
    assert without.returncode != 0
    assert "No module named 'typer'" in without.stderr or "No module named 'rich'" in (
        without.stderr
    )
