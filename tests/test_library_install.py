"""The construct library as a platform team gets it: built into a wheel, installed on its own,
and used from a throw-away CDK app that has never seen this repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

THROWAWAY_APP = """
import json, sys
import aws_cdk as cdk
import streamfleet, streamfleet_cdk
from streamfleet_cdk.tables import FleetTables, FleetTablesProps
from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
from streamfleet_cdk.worker_fleet import WorkerFleet, WorkerFleetProps

app = cdk.App(outdir=sys.argv[1])
env = cdk.Environment(account="111111111111", region="eu-west-1")
stack = cdk.Stack(app, "PlatformTeam", env=env)
tables = FleetTables(stack, "Tables", props=FleetTablesProps(deletion_protection=False))
ingestion = EventIngestion(stack, "Ingestion", props=EventIngestionProps(
    lease_table=tables.lease_table, allowed_upstreams=("wss://*.feeds.example.com",)))
WorkerFleet(stack, "Fleet", props=WorkerFleetProps(
    lease_table=tables.lease_table, messages_table=tables.messages_table,
    queue=ingestion.queue, allowed_upstreams=("wss://*.feeds.example.com",),
    availability_zones=("eu-west-1a", "eu-west-1b")))
app.synth()
print(json.dumps({"streamfleet": streamfleet.__file__, "cdk": streamfleet_cdk.__file__}))
"""


@pytest.mark.slow
def test_the_installed_library_builds_a_stack_in_a_throwaway_app(tmp_path: Path):
    wheels, site, app_dir = tmp_path / "wheels", tmp_path / "site", tmp_path / "app"
    app_dir.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = wheels.glob("resilient_streaming_fleet-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    (app_dir / "app.py").write_text(THROWAWAY_APP)
    # Only the installed copy and the venv's third-party packages: no repository on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run(
        [sys.executable, "app.py", str(app_dir / "cdk.out")],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    origins = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(Path(path).is_relative_to(site) for path in origins.values()), origins
    template = json.loads((app_dir / "cdk.out" / "PlatformTeam.template.json").read_text())
    types = {resource["Type"] for resource in template["Resources"].values()}
    assert {
        "AWS::DynamoDB::GlobalTable",
        "AWS::ApiGateway::RestApi",
        "AWS::Lambda::Function",
        "AWS::SQS::Queue",
        "AWS::ECS::Service",
        "AWS::ApplicationAutoScaling::ScalingPolicy",
    } <= types
    assets = json.loads((app_dir / "cdk.out" / "PlatformTeam.assets.json").read_text())
    assert assets["dockerImages"], "the worker image is built from the installed package"
